"""``--jobs``: independent searches of a loop run ahead in forked workers
(:mod:`planner.parallel`), and the output is the same bytes with any number of them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from planner import parallel
from planner.errors import (
    InputError,
    Located,
    ManifestValueError,
    NoFeasiblePlan,
    Shortfall,
    UsageError,
)
from planner.parallel import Ahead, WorkerCrashed

from .conftest import CLUSTERS, NETWORKS, invoke

pytestmark = pytest.mark.skipif(not parallel.can_fork(), reason="workers are not forked here")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _read_pid(path: Path) -> int:
    for _ in range(2000):  # the child writes it first thing
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.005)
    raise AssertionError(f"no pid in {path}")


def test_results_come_back_in_the_loops_order_from_other_processes():
    with parallel.running(3), Ahead(6, lambda i: lambda: (i * i, os.getpid(),
                                                          parallel.jobs())) as ahead:
        got = [ahead.get(i) for i in range(6)]
    assert [g[0] for g in got] == [0, 1, 4, 9, 16, 25]
    assert all(pid != os.getpid() for _, pid, _ in got)  # each in a worker
    assert {j for _, _, j in got} == {1}  # a worker runs its own loops serially
    assert parallel.jobs() == 1  # restored after the block


def test_one_job_runs_the_items_in_the_loop_itself():
    with parallel.running(1), Ahead(3, lambda i: lambda: os.getpid()) as ahead:
        assert [ahead.get(i) for i in range(3)] == [os.getpid()] * 3


def test_an_items_exception_is_raised_in_the_loop_with_its_type_and_parts():
    short = Shortfall(3e9, 2e9, ["more devices"])

    def prepare(i: int):
        if i == 0:
            def fail() -> None:
                raise NoFeasiblePlan("planner: nothing fits", short, [{"name": "data"}])
            return fail
        if i == 1:
            def usage() -> None:
                raise UsageError("planner: error: bad count")
            return usage
        if i == 2:
            # a failure worked out when first read (as the searches defer saying why)
            def deferred() -> None:
                raise NoFeasiblePlan.deferred(lambda: NoFeasiblePlan("planner: late", short))
            return deferred
        if i == 3:
            def bad_input() -> None:
                raise InputError([Located("net.yaml", 3, 5, "not a number", "$.layers[0]",
                                          "  out: many")], truncated=True)
            return bad_input
        if i == 4:
            def bad_manifest() -> None:
                raise ManifestValueError("models.gemm.file", "missing")
            return bad_manifest
        return lambda: "ok"

    with parallel.running(2), Ahead(6, prepare) as ahead:
        with pytest.raises(NoFeasiblePlan) as first:
            ahead.get(0)
        assert str(first.value) == "planner: nothing fits"
        assert first.value.shortfall == short
        assert first.value.baselines == [{"name": "data"}]
        with pytest.raises(UsageError, match="bad count"):
            ahead.get(1)
        with pytest.raises(NoFeasiblePlan) as third:
            ahead.get(2)
        assert str(third.value) == "planner: late" and third.value.shortfall == short
        with pytest.raises(InputError) as fourth:
            ahead.get(3)
        here = InputError([Located("net.yaml", 3, 5, "not a number", "$.layers[0]",
                                   "  out: many")], truncated=True)
        assert fourth.value.problems == here.problems and fourth.value.truncated
        assert fourth.value.render() == here.render() == str(fourth.value)
        assert "net.yaml:3:5: error: not a number" in str(fourth.value)
        with pytest.raises(ManifestValueError) as fifth:
            ahead.get(4)
        assert (fifth.value.key, fifth.value.message) == ("models.gemm.file", "missing")
        assert ahead.get(5) == "ok"  # the loop goes on after its items' failures


def test_what_prepare_raises_is_the_items_result_and_prepare_runs_in_order(tmp_path):
    order: list[int] = []

    def prepare(i: int):
        order.append(i)
        if i == 1:
            raise UsageError("planner: error: count 1 cannot be asked")
        return lambda: i

    with parallel.running(2), Ahead(4, prepare) as ahead:
        assert ahead.get(0) == 0
        with pytest.raises(UsageError, match="count 1"):
            ahead.get(1)
        assert ahead.get(2) == 2
        assert ahead.get(3) == 3
    assert order == [0, 1, 2, 3]  # once each, in order (notes are said in order)


def test_a_skipped_item_running_ahead_is_killed(tmp_path):
    pid_file = tmp_path / "pid"

    def prepare(i: int):
        if i == 1:
            def slow() -> None:
                pid_file.write_text(str(os.getpid()))
                time.sleep(600)
            return slow
        return lambda: i

    with parallel.running(2), Ahead(3, prepare) as ahead:
        assert ahead.get(0) == 0  # item 1 starts ahead meanwhile
        pid = _read_pid(pid_file)
        assert _alive(pid)
        ahead.skip(1)
        assert not _alive(pid)  # killed and reaped
        assert ahead.get(2) == 2


def test_a_loop_that_stops_early_kills_what_runs_ahead(tmp_path):
    pids = [tmp_path / f"pid{i}" for i in range(3)]

    def prepare(i: int):
        def slow() -> None:
            pids[i].write_text(str(os.getpid()))
            time.sleep(600)
        return slow if i else (lambda: 0)

    with parallel.running(3), Ahead(3, prepare) as ahead:
        assert ahead.get(0) == 0
        running = [_read_pid(pids[1]), _read_pid(pids[2])]
        assert all(_alive(p) for p in running)
    assert not any(_alive(p) for p in running)


def test_an_item_the_loop_will_skip_is_not_started_ahead(tmp_path):
    ran = tmp_path / "ran"

    def prepare(i: int):
        def mark() -> int:
            with open(ran, "a") as f:
                f.write(f"{i}\n")
            return i
        return mark

    with parallel.running(4), Ahead(4, prepare, may_run=lambda i: i != 2) as ahead:
        assert ahead.get(0) == 0
        assert ahead.get(1) == 1
        ahead.skip(2)
        assert ahead.get(3) == 3
    assert sorted(ran.read_text().split()) == ["0", "1", "3"]


def test_the_loop_may_still_read_an_item_not_started_ahead():
    # may_run said no (the loop was expected to skip it) with every worker busy: the
    # item the loop waits for gets a worker, the one furthest ahead gives it up and runs
    # again when the loop reaches it
    with parallel.running(2), Ahead(5, lambda i: lambda: i * 10,
                                    may_run=lambda i: i != 1) as ahead:
        assert [ahead.get(i) for i in range(5)] == [0, 10, 20, 30, 40]


def test_a_worker_that_dies_or_cannot_send_its_result_is_reported():
    def prepare(i: int):
        if i == 0:
            return lambda: os._exit(3)
        return lambda: (lambda: None)  # a function cannot be pickled

    with parallel.running(2), Ahead(2, prepare) as ahead:
        with pytest.raises(WorkerCrashed, match=r"ended .* without sending its result"):
            ahead.get(0)
        with pytest.raises(WorkerCrashed, match="could not be sent back"):
            ahead.get(1)


def test_without_a_process_to_be_had_the_loop_runs_the_items_itself(monkeypatch):
    real_fork = os.fork
    forks = {"left": 1}  # one worker, then EAGAIN (a process limit reached)

    def fork() -> int:
        if forks["left"] == 0:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        forks["left"] -= 1
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    with parallel.running(3), Ahead(5, lambda i: lambda: (i, os.getpid())) as ahead:
        got = [ahead.get(i) for i in range(5)]
    assert [i for i, _ in got] == list(range(5))
    where = [pid == os.getpid() for _, pid in got]
    assert where.count(False) == 1 and where.count(True) == 4, where


def test_a_result_larger_than_a_pipe_comes_back_whole():
    big = bytes(range(256)) * 40_000  # 10 MB: the pipe holds 64 KiB
    with parallel.running(2), Ahead(3, lambda i: lambda: big[i:]) as ahead:
        for i in range(3):
            assert ahead.get(i) == big[i:]


def test_jobs_auto_is_the_usable_cpus_within_the_cgroups_quota(tmp_path, monkeypatch):
    n = parallel.resolve_jobs("auto")
    assert 1 <= n <= parallel.MAX_AUTO_JOBS
    assert n == min(parallel.usable_cpus(), parallel.MAX_AUTO_JOBS)
    assert parallel.resolve_jobs(5) == 5
    cpu_max = tmp_path / "cpu.max"
    for text, want in (("max 100000\n", None), ("200000 100000\n", 2),
                       ("150000 100000\n", 2), ("50000 100000\n", 1), ("junk\n", None)):
        cpu_max.write_text(text)
        assert parallel._cgroup_quota(str(cpu_max)) == want, text
    assert parallel._cgroup_quota(str(tmp_path / "missing")) is None
    monkeypatch.setattr(parallel, "_cgroup_quota", lambda: 1)
    assert parallel.usable_cpus() == 1
    monkeypatch.setattr(parallel.sys, "platform", "darwin")  # no forking there
    assert not parallel.can_fork() and parallel.resolve_jobs(8) == 1


# -- the commands: the same bytes with any number of jobs ---------------------------------

GPT2 = str(NETWORKS / "gpt2-small.yaml")
DGX = str(CLUSTERS / "dgx-h100.yaml")


def _out(runner, *args: str) -> tuple[int, str, str]:
    res = invoke(runner, *args)
    return res.exit_code, res.stdout, res.stderr


def test_plan_microbatches_auto_is_the_same_bytes_with_any_number_of_jobs(runner):
    args = ("plan", GPT2, DGX, "-p", "16", "-b", "32", "--optimizer", "adam",
            "--pipeline", "auto", "--microbatches", "auto", "--format", "json")
    serial = _out(runner, *args, "--jobs", "1")
    assert serial[0] == 0
    doc = json.loads(serial[1])
    # the counts searched and those the bounds skipped: the loop's decisions, kept
    outcomes = [t["outcome"] for t in doc["microbatches_auto"]]
    assert "plan" in outcomes and "bound" in outcomes, outcomes
    for jobs in ("2", "3", "auto"):
        assert _out(runner, *args, "--jobs", jobs) == serial, jobs


def test_sweep_is_the_same_bytes_with_any_number_of_jobs(runner, monkeypatch):
    # rows with plans and rows without (too few devices for the batch), and a note
    # said once
    args = ("sweep", GPT2, DGX, "-p", "1,2,8,16", "-b", "64,512", "--format", "json")
    serial = _out(runner, *args, "--jobs", "1")
    assert serial[0] == 0
    rows = json.loads(serial[1])["results"]
    assert len(rows) == 8
    assert {r["feasible"] for r in rows} == {True, False}
    assert serial[2].count("planner: note:") == len(set(serial[2].splitlines()))
    for jobs in ("3", "8"):
        assert _out(runner, *args, "--jobs", jobs) == serial, jobs
    monkeypatch.setenv("PLANNER_JOBS", "2")
    assert _out(runner, *args) == serial


def test_a_bad_jobs_count_is_a_usage_error(runner, monkeypatch):
    res = invoke(runner, "plan", GPT2, DGX, "-p", "8", "-b", "32", "--jobs", "0")
    assert res.exit_code == 2
    assert "--jobs" in res.stderr and "searches to run at once" in res.stderr
    monkeypatch.setenv("PLANNER_JOBS", "many")
    res = invoke(runner, "sweep", GPT2, DGX, "-p", "8", "-b", "32")
    # the variable named, as what to fix (an audit found it named --jobs)
    assert res.exit_code == 2 and "PLANNER_JOBS=many: give the number" in res.stderr


def _tight_cluster(tmp_path: Path, mib: int) -> str:
    """The DGX H100 cluster with ``mib`` MiB of each GPU left to the plan."""
    from .test_schedule_auto import H100_BYTES

    text = (CLUSTERS / "dgx-h100.yaml").read_text()
    old = next(line for line in text.splitlines() if line.startswith("reserved_memory:"))
    path = tmp_path / f"tight-{mib}.yaml"
    path.write_text(text.replace(old, f"reserved_memory: {H100_BYTES - mib * 2**20} B"))
    return str(path)


@pytest.mark.parametrize("extra", [
    # two stages of two chunks: four questions, each of its own (another first rank)
    ("-b", "32", "--microbatches", "8", "--pipeline", "2", "--virtual-stages", "2"),
    # every stage count, the ZeRO stage and the blocks recomputed chosen per stage
    ("-b", "512", "--microbatches", "8", "--pipeline", "auto", "--zero", "auto",
     "--recompute", "auto"),
])
def test_a_pipelines_chunks_in_workers_give_the_same_bytes(runner, net_file, extra,
                                                           monkeypatch, tmp_path):
    from planner import cli_plan

    args = ("plan", net_file, str(CLUSTERS / "dgx-h100.yaml"), "-p", "16",
            "--estimator", "roofline", "--optimizer", "adam", *extra, "--format", "json")
    serial = _out(runner, *args, "--jobs", "1")
    assert serial[0] == 0, serial[2]
    # the searches ran in workers: each writes its process id to a file
    log = tmp_path / "pids"
    search = cli_plan.run_search

    def spy(q, objective, pins):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return search(q, objective, pins)

    monkeypatch.setattr(cli_plan, "run_search", spy)
    assert _out(runner, *args, "--jobs", "4") == serial
    pids = set(log.read_text().split())
    assert str(os.getpid()) in pids  # the search without stages, in the loop itself
    assert len(pids - {str(os.getpid())}) >= 2  # and chunks in at least two workers


def test_a_stage_that_does_not_fit_fails_the_same_with_workers(runner, net_file, tmp_path):
    # 10 MiB a GPU: no stage count fits; the error names the first stage that failed
    args = ("plan", net_file, _tight_cluster(tmp_path, 10), "-p", "16", "-b", "512",
            "--estimator", "roofline", "--microbatches", "8", "--pipeline", "2",
            "--virtual-stages", "2")
    serial = _out(runner, *args, "--jobs", "1")
    assert serial[0] == 1 and "no feasible plan for pipeline stage" in serial[2], serial
    assert _out(runner, *args, "--jobs", "3") == serial


def test_check_of_several_configurations_is_the_same_with_workers(runner, monkeypatch):
    # a pass, a plan that does not fit, one too slow and an input error, in every format
    from .conftest import ROOT

    monkeypatch.chdir(ROOT)
    configs = [f"examples/ci/{c}.yaml" for c in
               ("resnet50-dgx", "gpt2-does-not-fit", "broken", "alexnet-too-slow",
                "llama3-8b-megatron")]
    for fmt in ("text", "json", "github"):
        serial = _out(runner, "check", "--format", fmt, *configs, "--jobs", "1")
        assert serial[0] == 2, serial  # the input error decides the exit code
        assert "Traceback" not in serial[2]
        assert _out(runner, "check", "--format", fmt, *configs, "--jobs", "4") == serial


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_ctrl_c_stops_the_workers_too(tmp_path):
    import signal
    import subprocess

    from .test_cli import _process

    net = tmp_path / "deep.yaml"  # each row's search takes tens of seconds
    net.write_text("kind: network\nname: deep\ninput: [256]\nlayers:\n  - repeat: 10000\n"
                   "    name: g\n    layers:\n      - {type: linear, out_features: 256}\n"
                   "      - {type: relu}\n")
    proc = _process(["sweep", net, DGX, "-p", "16,32", "-b", "256", "--jobs", "2",
                     "-o", tmp_path / "sweep.json"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: set[int] = set()
    for _ in range(600):  # the two rows start in workers after loading (a few seconds)
        workers = _children(proc.pid)
        if len(workers) == 2:
            break
        time.sleep(0.05)
    assert len(workers) == 2, workers
    proc.send_signal(signal.SIGINT)  # to the command alone, not its process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    assert not any(_alive(w) for w in workers)  # killed and reaped, none left running
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.yaml"]



def test_ctrl_c_between_a_fork_and_its_registration_kills_that_child(monkeypatch):
    """An interrupt that lands after a worker's fork, before the parent records the
    child, left the child unknown to the clean-up, running after the command (a CI
    run saw one outlive `sweep`). Blocking SIGINT in the main thread did not hold it:
    the kernel gives a process's signal to any thread that does not block it (a
    timer's, the test runner's), and Python raises KeyboardInterrupt in the main thread
    at its next instruction. Here the signal goes to such a thread at the worst moment,
    as the parent closes its end of the child's pipe, and the main thread then runs
    Python code for up to a second; the child must be killed with the rest. (On the
    code that only blocked SIGINT, KeyboardInterrupt is raised in that second, before
    the registration, and the child lives on.)"""
    import signal
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,), daemon=True)
    other.start()  # created while SIGINT is not blocked: it takes the signal

    def prepare(i: int):
        return lambda: time.sleep(600)

    real_close, real_fork = os.close, os.fork
    parent = os.getpid()
    children: list[int] = []
    sent: list[bool] = []

    def fork() -> int:
        pid = real_fork()
        if pid:
            children.append(pid)
        return pid

    def close(fd: int) -> None:
        real_close(fd)
        if os.getpid() == parent and children and not sent:
            sent.append(True)
            assert other.ident is not None
            signal.pthread_kill(other.ident, signal.SIGINT)
            for _ in range(100):  # Python code runs: a pending handler runs here
                time.sleep(0.01)

    try:
        with pytest.raises(KeyboardInterrupt), parallel.running(2), \
                Ahead(2, prepare) as ahead:
            monkeypatch.setattr(os, "fork", fork)
            monkeypatch.setattr(os, "close", close)
            ahead.get(0)
    finally:
        monkeypatch.setattr(os, "close", real_close)
        monkeypatch.setattr(os, "fork", real_fork)
        stop.set()
        other.join()
    assert sent, "the signal was never sent"
    child = children[0]
    alive = _alive(child)
    if alive:  # leave nothing running behind the test
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert not alive, "the child forked before the interrupt outlived the clean-up"
