"""The command line: every command, exit codes, formats."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from planner import __version__

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke

ROOT_EXAMPLES = NETWORKS.parent


def test_version(runner):
    result = invoke(runner, "--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"planner, version {__version__}"


@pytest.mark.parametrize("cmd", [[], ["validate"], ["show"], ["devices"]])
def test_help_everywhere(runner, cmd):
    result = invoke(runner, *cmd, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.stdout


def test_validate_examples(runner):
    files = sorted(NETWORKS.glob("*.yaml")) + sorted(CLUSTERS.glob("*.yaml"))
    result = invoke(runner, "validate", *files)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count(": ok (") == len(files)


def test_validate_mixed_reports_all_and_fails(runner, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: network\ninput: [3, 8, 8]\nlayers:\n  - {type: nope}\n")
    result = invoke(runner, "validate", NETWORKS / "alexnet.yaml", bad)
    assert result.exit_code == 2
    assert "alexnet.yaml: ok" in result.stdout
    assert f"{bad}:4:12: error: unknown layer type 'nope'" in result.stderr


def test_plan_files_are_recognised(runner, tmp_path):
    """A plan given to validate is checked as a plan (its placement, as launch reads it);
    given where a network, cluster or training file belongs, one error says what it is
    instead of a hundred unknown keys."""
    plan = tmp_path / "plan.yaml"
    made = invoke(runner, "plan", NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml",
                  "-p", "12", "-b", "96", "-o", plan, "--estimator", "roofline")
    assert made.exit_code == 0, made.stderr
    result = invoke(runner, "validate", plan)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{plan}: ok (plan for 'alexnet', 12 devices on 2 nodes)\n"
    broken = tmp_path / "broken.yaml"
    text = plan.read_text()
    assert "  nodes: 2\n" in text
    broken.write_text(text.replace("  nodes: 2\n", "  nodes: 3\n"))
    result = invoke(runner, "validate", broken)
    assert result.exit_code == 2
    assert "error: 12 devices at 8 a node take 2 nodes, not 3" in result.stderr
    broken.write_text(text.replace("  nodes: 2\n", "  nodes: true\n"))
    result = invoke(runner, "validate", broken)
    assert result.exit_code == 2  # spelled as YAML spells it, not Python's True
    assert "error: expected a whole number from 1 to 2^30, got true" in result.stderr
    for args, what in (([plan, CLUSTERS / "dgx-h100.yaml"], "network"),
                       ([NETWORKS / "alexnet.yaml", plan], "cluster")):
        result = invoke(runner, "plan", *args, "-p", "8", "-b", "8")
        assert result.exit_code == 2
        assert result.stderr.count("error:") == 1
        assert f"{plan}:1:1: error: this is a plan written by planner, not a {what} file" \
            in result.stderr
    result = invoke(runner, "check", plan)
    assert result.exit_code == 2
    assert result.stderr.count("error:") == 1
    assert "this is a plan, not a training configuration" in result.stderr
    # an edited plan (a kind added, its version line gone) is still a plan
    edited = tmp_path / "edited.yaml"
    edited.write_text("kind: network\n" + text.split("\n", 1)[1])
    result = invoke(runner, "validate", edited)
    assert result.exit_code == 0 and "ok (plan for 'alexnet'" in result.stdout
    result = invoke(runner, "show", edited)
    assert result.exit_code == 2 and result.stderr.count("error:") == 1


def test_validate_missing_file(runner, tmp_path):
    result = invoke(runner, "validate", tmp_path / "missing.yaml")
    assert result.exit_code == 2
    # about the file itself: no line or column, no YAML path
    assert result.stderr == f"{tmp_path / 'missing.yaml'}: error: no such file\n"


def test_show_json(runner):
    result = invoke(runner, "show", NETWORKS / "resnet50.yaml", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["totals"]["params"] == 25_557_032
    assert data["totals"]["flops_forward"] >= 2 * data["totals"]["macs_forward"]
    for rec in data["layers"]:
        assert {"name", "type", "output_shape", "params", "flops_forward"} <= set(rec)
    assert sum(r["params"] for r in data["layers"]) == data["totals"]["params"]


def test_show_yaml_with_batch(runner):
    result = invoke(runner, "show", NETWORKS / "alexnet.yaml", "--format", "yaml", "-b", "16")
    assert result.exit_code == 0
    data = yaml.safe_load(result.stdout)
    fc6 = next(r for r in data["layers"] if r["name"] == "fc6")
    assert fc6["products"]["forward"] == [{"op": "gemm", "m": 16, "n": 4096, "k": 9216}]
    assert data["batch"] == 16


def test_show_table(runner):
    result = invoke(runner, "show", NETWORKS / "alexnet.yaml")
    assert result.exit_code == 0
    out = result.stdout
    assert "conv1" in out and "fc8" in out and "60,965,224" in out


def test_show_table_shows_alike_copies_once(runner):
    """ResNet-50's bottlenecks: in each stage the first copy (which downsamples) reads
    differently from the rest, which read alike and show once; --all-layers lists them,
    and the total counts every layer either way."""
    result = invoke(runner, "show", NETWORKS / "resnet50.yaml")
    assert result.exit_code == 0
    names = re.findall(r"^ (layer\d\.\S+)\.conv1 ", result.stdout, re.M)
    assert names == ["layer1.0", "layer1.1-2", "layer2.0", "layer2.1-3", "layer3.0",
                     "layer3.1-5", "layer4.0", "layer4.1-2"]
    every = invoke(runner, "show", NETWORKS / "resnet50.yaml", "--all-layers")
    listed = re.findall(r"^ (layer\d\.\S+)\.conv1 ", every.stdout, re.M)
    assert len(listed) == 16 and listed[-1] == "layer4.2"
    for out in (result.stdout, every.stdout):
        assert re.search(r"^ total\s+(\d+) layers", out, re.M).group(1) == \
            str(len(json.loads(invoke(runner, "show", NETWORKS / "resnet50.yaml",
                                      "--format", "json").stdout)["layers"]))


def test_show_to_file_and_refuse_overwriting_input(runner, tmp_path):
    out = tmp_path / "show.json"
    result = invoke(runner, "show", NETWORKS / "alexnet.yaml", "--format", "json", "-o", out)
    assert result.exit_code == 0
    assert json.loads(out.read_text())["network"] == "alexnet"
    net_copy = tmp_path / "net.yaml"
    net_copy.write_text((NETWORKS / "alexnet.yaml").read_text())
    before = net_copy.read_text()
    result = invoke(runner, "show", net_copy, "--format", "json", "-o", net_copy)
    assert result.exit_code == 2
    assert "it is one of this command's inputs" in result.stderr
    assert net_copy.read_text() == before


def test_show_bad_batch(runner):
    result = invoke(runner, "show", NETWORKS / "alexnet.yaml", "--batch", "0")
    assert result.exit_code == 2


def test_show_cluster_file_is_wrong_kind(runner):
    result = invoke(runner, "show", CLUSTERS / "dgx-h100.yaml")
    assert result.exit_code == 2
    assert "expected a network file, got 'kind: cluster'" in result.stderr
    # the two files swapped: the message says which order the commands take
    swapped = invoke(runner, "plan", CLUSTERS / "dgx-h100.yaml", NETWORKS / "alexnet.yaml",
                     "-p", "8", "-b", "64")
    assert swapped.exit_code == 2
    assert ("expected a network file, got 'kind: cluster'; is it the cluster file? (plan, "
            "cost, compare and sweep take NETWORK, then CLUSTER)") in swapped.stderr


def test_validate_says_what_kinds_there_are(runner, tmp_path):
    """An empty file names every kind validate reads (it named two of three); a kind in
    the wrong case gets a suggestion, as a misspelt key does (found by an audit)."""
    empty, upper = tmp_path / "e.yaml", tmp_path / "k.yaml"
    empty.write_text("")
    upper.write_text("kind: Network\nlayers: []\n")
    r = invoke(runner, "validate", empty)
    assert r.exit_code == 2 and "with 'kind: network', 'kind: cluster' or 'kind: " \
                                "training'" in r.stderr, r.stderr
    r = invoke(runner, "validate", upper)
    assert r.exit_code == 2 and f"{upper}:1:7: error: unknown kind 'Network'; expected one " \
        "of network, cluster, training; did you mean 'network'?" in r.stderr, r.stderr


def test_devices(runner, tmp_path):
    result = invoke(runner, "devices", "--format", "json")
    assert result.exit_code == 0
    names = [d["name"] for d in json.loads(result.stdout)["devices"]]
    assert "H100-SXM" in names and "cori-knl" in names
    table = invoke(runner, "devices")
    assert table.exit_code == 0 and "H100-SXM" in table.stdout
    # captured (piped) at 120 columns: the table fits them (it was 185 wide, the aliases
    # one line), one alias a line, each whole but the one longer than the column
    lines = table.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    ends = {line.split("   ")[-1].strip() for line in lines}
    h100 = next(d for d in json.loads(result.stdout)["devices"] if d["name"] == "H100-SXM")
    assert set(h100["aliases"]) <= ends and "NVIDIA H100 80GB HBM3" in ends
    out = tmp_path / "catalog.yaml"  # -o, as its --format help says; YAML by the suffix
    assert invoke(runner, "devices", "-o", out).exit_code == 0
    assert [d["name"] for d in yaml.safe_load(out.read_text())["devices"]] == names


@pytest.mark.parametrize("preset", [None, "OMP_NUM_THREADS=4"])
def test_the_command_line_loads_blas_with_one_thread_unless_told(preset):
    """``planner`` sets the BLAS thread variables to 1 before numpy loads, unless the user
    set any of them (then it leaves all three alone)."""
    import os
    import subprocess
    import sys

    from planner.cli import BLAS_THREAD_VARS

    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARS}
    if preset:
        key, value = preset.split("=")
        env[key] = value
    probe = ("import json, os; from planner import cli; cli._one_blas_thread(); "
             "import numpy; print(json.dumps({k: os.environ.get(k) "
             "for k in cli.BLAS_THREAD_VARS}))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out)
    if preset:
        assert got == {"MKL_NUM_THREADS": None, "OMP_NUM_THREADS": "4",
                       "OPENBLAS_NUM_THREADS": None}
    else:
        assert got == dict.fromkeys(BLAS_THREAD_VARS, "1")


def _process(args, **kw):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "planner", *map(str, args)], env=env,
                            **kw)


def test_a_closed_pipe_and_ctrl_c_are_not_a_no(tmp_path):
    """Exit 1 means "a valid question whose answer is no" (it does not fit). The reader
    of a pipe going away (`planner plan ... | head`) and Ctrl-C exited 1 too (click's
    "Aborted!"), which a CI job under `pipefail` reads as that answer. Now the process
    ends by SIGPIPE (141 in the shell) as Unix tools do, and with 130 after Ctrl-C,
    leaving no temporary file beside the -o target."""
    import signal
    import subprocess
    import time

    dgx = CLUSTERS / "dgx-h100.yaml"
    proc = _process(["plan", NETWORKS / "alexnet.yaml", dgx, "-p", "8", "-b", "64"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the table is written
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGPIPE, proc.stderr.read()
    proc.stderr.close()
    net = tmp_path / "deep.yaml"
    net.write_text("kind: network\nname: deep\ninput: [256]\nlayers:\n  - repeat: 10000\n"
                   "    name: g\n    layers:\n      - {type: linear, out_features: 256}\n"
                   "      - {type: relu}\n")
    proc = _process(["plan", net, dgx, "-p", "16", "-b", "256", "-o", tmp_path / "p.yaml"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(4)  # past start-up, into the search (which takes about 30 s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.yaml"]


def test_debug_shows_the_traceback_and_keeps_the_exit_code(runner, tmp_path, monkeypatch):
    """--debug (or PLANNER_DEBUG=1) prints the traceback; the exit code stays the
    error's (2 for bad input, 3 for a bug), where re-raising made Python exit 1, which
    planner means as "the answer is no"."""
    bad = tmp_path / "tab.yaml"
    bad.write_text("kind: network\n\tname: x\n")
    # after the subcommand too (where people add it; it was "No such option"), and
    # inside a group's subcommand; after `--` it is an argument, not the option
    for args in (("--debug", "show", bad), ("--debug", "show", tmp_path / "none.yaml"),
                 ("show", bad, "--debug"),
                 ("kernels", "predict", "--device", "T4", "--gemm", "0,1,1", "--debug")):
        result = invoke(runner, *args)
        assert result.exit_code == 2, result.output
        assert "Traceback (most recent call last)" in result.stderr
    result = invoke(runner, "show", "--", "--debug")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "--debug" in result.stderr
    import planner.inputs

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(planner.inputs, "load_network", broken)
    net = NETWORKS / "alexnet.yaml"
    result = invoke(runner, "show", net)
    assert result.exit_code == 3 and "planner: internal error: ZeroDivisionError" in \
        result.stderr and "Traceback" not in result.stderr
    monkeypatch.setenv("PLANNER_DEBUG", "1")
    result = invoke(runner, "show", net)
    assert result.exit_code == 3 and "ZeroDivisionError: a bug" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr


def test_piped_tables_have_no_trailing_spaces(runner, tmp_path):
    """rich pads every line of a table to the console's width; a piped table (as a CI
    log or `diff` sees it) is the text a file written with -o gets, without the padding."""
    args = ["plan", NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "64", "-b",
            "1024"]
    piped = invoke(runner, *args)
    assert piped.exit_code == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert len(lines) > 20 and all(line == line.rstrip() for line in lines)
    assert max(len(line) for line in lines) <= 120 < 140
    assert any(line.startswith(" fc6 ") for line in lines)


def _fed(args, data: bytes, timeout: int = 120):
    """Run the planner with ``data`` on its standard input: (exit code, stdout, stderr)."""
    import subprocess

    proc = _process(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    out, err = proc.communicate(data, timeout=timeout)
    return proc.returncode, out, err


def _piped(args, data: bytes):
    """Run the planner with ``data`` in a pipe named last on its command line, as bash's
    ``<(cat FILE)`` gives: (exit code, stdout, stderr)."""
    import subprocess

    rd, wr = os.pipe()
    os.write(wr, data)
    os.close(wr)
    try:
        proc = _process([*args, f"/dev/fd/{rd}"], pass_fds=(rd,), stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(rd)
    return proc.returncode, out, err


def test_inputs_from_standard_input_and_pipes(tmp_path):
    """A generator's output goes straight in: `-` reads standard input and `<(command)`
    (a pipe) is read as a file is; the plan records the digest of what was read, so that
    `check` finds it current against the file with the same bytes. Errors name
    `<stdin>`; both inputs from `-` and `launch -` are refused; a named pipe nobody writes
    to is an error, not a wait forever."""
    import hashlib
    import subprocess

    net, dgx = NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml"
    text = net.read_bytes()
    code, out, err = _fed(["plan", "-", dgx, "-p", "8", "-b", "256", "--format", "json"], text)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["inputs"]["network"]["file"] == "-"
    assert doc["inputs"]["network"]["sha256"] == hashlib.sha256(text).hexdigest()
    plan = tmp_path / "plan.json"
    plan.write_bytes(out)
    config = tmp_path / "train.yaml"
    config.write_text(f"kind: training\nnetwork: {net}\ncluster: {dgx}\ngpus: 8\nbatch: 256\n"
                      f"strategy: {{plan: {plan}}}\nmax_slowdown: 1.0\n")
    code, out, err = _fed(["check", "-"], config.read_bytes())
    assert code == 0, out + err
    assert b"<stdin>:6:12: ok: [plan] the plan matches its network" in out, out
    # GitHub cannot place an annotation on standard input: it gets none
    code, out, err = _fed(["check", "-", "--format", "github"], config.read_bytes())
    assert code == 0 and out.startswith(b"::notice title=planner check%3A plan::")
    assert b"file=" not in out
    code, _, err = _fed(["check", "-"], b"", timeout=60)
    assert code == 2 and b"<stdin>: error: the file is empty" in err, err
    # a pipe, as bash's <(cat network.yaml) gives
    code, out, err = _piped(["validate"], text)
    assert code == 0 and b": ok (network 'alexnet'" in out, err
    bad = b"kind: network\nname: x\ninput: [8]\nlayers:\n  - {type: linear, out_feature: 4}\n"
    code, _, err = _fed(["show", "-"], bad, timeout=60)
    assert code == 2 and b"<stdin>:5:20: error: unknown key 'out_feature'" in err
    for args, message in ((["plan", "-", "-", "-p", "2", "-b", "8"], b"cannot both come from"),
                          (["launch", "-"], b"launch needs the plan as a file"),
                          (["validate", "-", "-"], b"is given more than once"),
                          (["check", "-", "-"], b"is given more than once")):
        code, _, err = _fed(args, text, timeout=60)
        assert code == 2 and message in err, err
    # -o never replaces the file standard input is redirected from, nor may launch
    # name a pipe in the scripts it writes
    copy = tmp_path / "net.yaml"
    copy.write_bytes(text)
    with copy.open("rb") as fh:
        proc = _process(["cost", "-", dgx, "-p", "8", "-b", "256", "-o", copy], stdin=fh,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and b"it is one of this command's inputs" in err, err
    assert copy.read_bytes() == text
    code, _, err = _piped(["launch"], plan.read_bytes())
    assert code == 2 and b"launch needs the plan as a file" in err, err
    # /dev/stdin redirected from a file stats as that file, but every node would read
    # its own standard input (found by an audit: exit 0, PLANNER_PLAN=/dev/stdin)
    with plan.open("rb") as fh:
        proc = _process(["launch", "/dev/stdin"], stdin=fh, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and b"launch needs the plan as a file" in err, err
    assert out == b""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    proc = _process(["validate", fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and b"is a pipe that nothing writes to" in err, err


def test_measurement_files_get_the_checks_yaml_inputs_get(runner, tmp_path):
    """An audit of bad inputs found the measurement readers (`comm fit`, `kernels
    eval` / `fit` / `profile --shapes`) waited forever on a named pipe nobody writes to,
    read /dev/zero until memory ran out, and read an nccl-tests file of any size (106 MB:
    17 s and 750 MB before an error). Now each is an exit-2 error naming the file, and a
    pipe with a writer (bash's <(cat FILE)) is still read."""
    import subprocess

    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    for args, kind in ((["comm", "fit", fifo], b"nccl-tests or CSV"),
                       (["kernels", "eval", fifo], b"CSV"),
                       (["kernels", "fit", fifo, "-o", tmp_path / "m"], b"CSV"),
                       (["kernels", "profile", "-o", tmp_path / "p.csv", "--device", "cpu",
                         "--shapes", fifo], b"CSV")):
        proc = _process(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        assert err == f"{fifo}: error: is a pipe that nothing writes to, expected ".encode() \
            + kind + b"\n", err
    assert not (tmp_path / "m").exists() and not (tmp_path / "p.csv").exists()
    r = invoke(runner, "comm", "fit", "/dev/zero")
    assert r.exit_code == 2
    assert r.stderr == "/dev/zero: error: is not a regular file or a pipe, expected a " \
                       "nccl-tests or CSV file\n", r.stderr
    r = invoke(runner, "kernels", "eval", "/dev/zero")
    assert r.exit_code == 2 and "expected a CSV file" in r.stderr, r.stderr
    big = tmp_path / "all_reduce_perf.txt"
    with big.open("wb") as fh:
        fh.truncate(16 * 2**20 + 1)  # sparse: the size alone refuses it
    r = invoke(runner, "comm", "fit", big)
    assert r.exit_code == 2
    assert r.stderr == f"{big}: error: file is too large (16,777,217 bytes); measurement " \
                       "files are limited to 16 MiB\n", r.stderr
    code, out, err = _piped(["comm", "fit"],
                            (ROOT / "tests" / "data" / "nccl" /
                             "all_reduce_perf_8xh100.txt").read_bytes())
    assert code == 0 and b"latency" in out, err


def test_small_messages_say_what_the_user_wrote(runner, tmp_path):
    """From an audit of bad inputs: --mode megatron-cp's refusal names the mode (it said
    only 'domain'); predict titles its kernel as a person reads it and shows sub-ns
    bounds (an fp64 8³ GEMM's bound, 0.51 ns, printed as 0.00 µs); one layer is '1
    layer'; an empty item in a sweep list is an error; a training file's `zero: auto` is
    refused with what to write; a pin that is a layer's whole name matches it even when
    the name holds glob characters (`fc[1]`)."""
    mlp = ROOT_EXAMPLES / "launch" / "mlp4.yaml"
    dgx = CLUSTERS / "dgx-h100.yaml"
    r = invoke(runner, "cost", mlp, dgx, "-p", "8", "-b", "64", "--grid", "2x4", "--mode",
               "megatron-cp")
    assert r.exit_code == 2 and "cannot use domain 2x4 (--mode megatron-cp's layout for it)" \
        in r.stderr, r.stderr
    r = invoke(runner, "kernels", "predict", "--device", "H100", "--gemm", "8,8,8", "--dtype",
               "fp64")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("GEMM 8 x 8 x 8 (M x N x K) on H100-SXM (float64)")
    as_json = invoke(runner, "kernels", "predict", "--device", "H100", "--gemm", "8,8,8",
                     "--dtype", "fp64", "--format", "json")
    bound = json.loads(as_json.stdout)["bound_s"]
    assert 0 < bound < 1e-9  # under 1 ns: two decimals of µs showed 0.00
    shown = re.search(r"roofline bound \(datasheet\)\s*│\s*([0-9.]+) ps", r.stdout)
    assert shown and shown[1] == f"{bound * 1e12:.4g}", r.stdout
    one = tmp_path / "one.yaml"
    one.write_text("kind: network\nname: one\ninput: [4]\nlayers:\n"
                   "  - {type: linear, out_features: 1, bias: false, name: 'fc[1]'}\n")
    r = invoke(runner, "validate", one)
    assert r.stdout == f"{one}: ok (network 'one', 1 layer, 4 parameters)\n"
    r = invoke(runner, "cost", one, dgx, "-p", "8", "-b", "64", "--pin", "fc[1]=data")
    assert r.exit_code == 0, r.stderr
    r = invoke(runner, "sweep", mlp, dgx, "-p", "8,,16", "-b", "64")
    assert r.exit_code == 2 and "an empty item in '8,,16'" in r.stderr
    cfg = tmp_path / "za.yaml"
    cfg.write_text(f"kind: training\nnetwork: {mlp}\ncluster: {dgx}\ngpus: 8\nbatch: 64\n"
                   "zero: auto\nstrategy: {grid: 1x8, mode: model}\n")
    r = invoke(runner, "validate", cfg)
    assert r.exit_code == 2 and r.stderr.startswith(
        f"{cfg}:6:7: error: 'zero: auto' is for `planner plan`, which searches the setting")


def test_more_small_messages(runner, tmp_path):
    """An empty file name said 'is a directory' (Path('') is the current folder); 'gbps'
    was taken for 'bps' (the unit spelled the same but for case comes first); a --script
    starting with '-' would be read by torchrun as an option."""
    r = invoke(runner, "show", "")
    assert r.exit_code == 2 and r.stderr == ("planner: error: a file name is empty ('' was "
                                             "given); give the file's path\n")
    cl = tmp_path / "c.yaml"
    cl.write_text("kind: cluster\nname: c\ndevices_per_node: 8\ndevice: H100-SXM\nnetwork:\n"
                  "  intra_node: {latency: 3 us, bandwidth: 351.3 gbps}\n"
                  "  inter_node: {latency: 9 us, bandwidth: 400 Gbit/s}\n")
    r = invoke(runner, "validate", cl)
    assert r.exit_code == 2 and "did you mean 'Gbps'?" in r.stderr, r.stderr
    plan = ROOT_EXAMPLES / "ci" / "plans" / "resnet50-dgx-64.yaml"
    r = invoke(runner, "launch", plan, "--script", "-x")
    assert r.exit_code == 2 and "name the program as ./-x" in r.stderr


def test_messages_an_input_audit_found(runner, tmp_path, monkeypatch):
    """Found by an audit of bad inputs (2026-12-07), none of them a crash: each command
    names the file order it takes; PLANNER_JOBS out of range is named as the variable,
    with the range; -o naming an image is refused where --plot draws one; a
    configuration from standard input has its paths relative to the current folder; a
    `--only` that leaves every row out says so; comm fit refuses a --cluster file that
    is not a cluster before printing its report."""
    alexnet, dgx = NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml"
    r = invoke(runner, "show", dgx)
    assert r.exit_code == 2 and "is it the cluster file? (show takes a NETWORK file)" \
        in r.stderr
    r = invoke(runner, "plan", dgx, alexnet, "-p", "8", "-b", "8")
    assert r.exit_code == 2 and "(plan, cost, compare and sweep take NETWORK, then " \
        "CLUSTER)" in r.stderr
    monkeypatch.setenv("PLANNER_JOBS", "100000")
    r = invoke(runner, "plan", alexnet, dgx, "-p", "8", "-b", "8")
    assert r.exit_code == 2
    assert "PLANNER_JOBS=100000: give the number of searches to run at once, 1 to 1,024, " \
           "or auto" in r.stderr
    monkeypatch.delenv("PLANNER_JOBS")
    r = invoke(runner, "plan", alexnet, dgx, "-p", "8", "-b", "8", "-j", "4097")
    assert r.exit_code == 2 and "'4097': give the number of searches to run at once, 1 to " \
        "1,024, or auto" in r.stderr
    png = tmp_path / "x.png"
    r = invoke(runner, "sweep", alexnet, dgx, "--gpus", "8", "--batch", "64", "-o", png)
    assert r.exit_code == 2 and not png.exists()
    assert "names an image, and -o writes the sweep's table, CSV, YAML or JSON; --plot " \
           "FILE.png draws the plot" in r.stderr
    monkeypatch.chdir(tmp_path)
    cfg = "kind: training\nnetwork: nope.yaml\ncluster: c.yaml\ngpus: 8\nbatch: 8\n" \
          "strategy: {grid: 1x8}\n"
    from planner.cli import cli

    r = runner.invoke(cli, ["check", "-"], input=cfg)
    assert r.exit_code == 2
    assert f"network file 'nope.yaml' not found (paths are relative to the current " \
           f"folder, {tmp_path})" in r.stderr
    gemm = tmp_path / "g.csv"
    rows = (ROOT / "models" / "data" / "neusight" / "neusight_linear_fp32.csv").read_text()
    gemm.write_text("\n".join(rows.splitlines()[:40]) + "\n")
    r = invoke(runner, "kernels", "fit", gemm, "--only", "conv", "-o", tmp_path / "m")
    assert r.exit_code == 2
    assert "(the data have gemm rows, which --only conv leaves out)" in r.stderr
    sweep = ROOT / "tests" / "data"
    nccl = next(iter(sorted(sweep.rglob("*all_reduce*.txt"))), None)
    assert nccl is not None
    r = invoke(runner, "comm", "fit", nccl, "--cluster", alexnet)
    assert r.exit_code == 2 and not r.stdout
    assert "expected a cluster file, got 'kind: network'; is it the network file? " \
           "(--cluster takes a CLUSTER file)" in r.stderr


def test_a_plan_too_large_to_read_back_is_not_written(runner, tmp_path, monkeypatch):
    """`plan --expand-ranks` on 524,288 devices wrote 44.6 MB, which validate, launch and
    check refuse to read (32 MiB; found by an audit): the plan is refused instead (exit
    2, nothing written), naming --expand-ranks. Here the limit is lowered to 20 KiB,
    between AlexNet's plan on 64 devices with its ranks listed (about 22 KiB) and without
    (about 17 KiB)."""
    import planner.loading

    out = tmp_path / "p.yaml"
    args = ("plan", NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "64", "-b",
            "256", "-o", out)
    monkeypatch.setattr(planner.loading, "MAX_PLAN_FILE_BYTES", 20 * 2**10)
    r = invoke(runner, *args, "--expand-ranks")
    assert r.exit_code == 2 and not out.exists()
    assert "over the 20 KiB that validate, launch and check read; --expand-ranks lists " \
           "every rank of every group: leave it out" in r.stderr
    r = invoke(runner, *args)  # the rules alone fit
    assert r.exit_code == 0 and out.exists()


def test_the_planners_own_outputs_are_named_when_read_as_inputs(runner, tmp_path):
    """What `sweep` and `show` write, given where an input goes, is named as that (an
    audit found a sweep read as a cluster file, for its `device:`, and show's YAML as a
    network missing its `input`)."""
    alexnet, dgx = NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml"
    sweep, shown = tmp_path / "sw.yaml", tmp_path / "show.yaml"
    assert invoke(runner, "sweep", alexnet, dgx, "--gpus", "8", "--batch", "64", "-o",
                  sweep).exit_code == 0
    assert invoke(runner, "show", alexnet, "-o", shown).exit_code == 0
    r = invoke(runner, "validate", sweep, shown)
    assert r.exit_code == 2
    assert f"{sweep}:1:1: error: this is the output of `planner sweep`, not an input" \
        in r.stderr
    assert f"{shown}:1:1: error: this is the output of `planner show`, not an input" \
        in r.stderr
    r = invoke(runner, "plan", shown, sweep, "-p", "8", "-b", "8")
    assert r.exit_code == 2
    assert "this is the output of `planner show`, not a network file" in r.stderr


def _full(args, stream: str):
    """``planner ARGS`` in a fresh interpreter with ``stream`` (stdout or stderr) on
    /dev/full, where every write fails with ENOSPC; the other is captured."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "planner", *map(str, args)], env=env, cwd=ROOT,
            timeout=120, stdout=full if stream == "stdout" else subprocess.PIPE,
            stderr=full if stream == "stderr" else subprocess.PIPE)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_stderr_does_not_change_the_exit_code(tmp_path):
    """A failed write to stderr (``2>/dev/full``) was an uncaught OSError: every command
    exited 1, "the answer is no", which a CI gate misreads (found by an audit). What
    cannot be said is dropped; the exit code is the command's."""
    r = _full(["validate", tmp_path / "missing.yaml"], "stderr")
    assert r.returncode == 2, r.stdout
    out = tmp_path / "shown.yaml"
    r = _full(["show", NETWORKS / "alexnet.yaml", "-o", out], "stderr")  # "wrote ..."
    assert r.returncode == 0 and out.read_text().startswith("network:")
    r = _full(["validate", NETWORKS / "alexnet.yaml"], "stderr")
    assert r.returncode == 0 and b": ok (network 'alexnet'" in r.stdout
    r = _full(["show", NETWORKS / "alexnet.yaml", "--batch", "0"], "stderr")  # click's usage
    assert r.returncode == 2 and r.stdout == b""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_top_level_help_and_version_to_a_full_stdout_are_a_message(tmp_path):
    """``planner --help >/dev/full`` and ``planner -V >/dev/full`` printed a traceback and
    exited 1; a subcommand's --help says it cannot write, exit 2, as they now do."""
    said = b"planner: error: cannot write to standard output: No space left on device\n"
    for args in (["--help"], ["-V"], ["--version"], ["validate", "--help"]):
        r = _full(args, "stdout")
        assert (r.returncode, r.stderr) == (2, said), args


def test_a_negative_bucket_size_suggests_a_size_that_is_valid(runner, tmp_path):
    """``bucket_size: -5`` was told "such as '-5 MiB'", which is refused in turn."""
    cfg = tmp_path / "train.yaml"
    text = (ROOT_EXAMPLES / "ci" / "resnet50-dgx.yaml").read_text().replace(
        "../", f"{ROOT_EXAMPLES}/").replace("plans/", f"{ROOT_EXAMPLES}/ci/plans/")
    for value in ("-5", ".nan", "-.inf"):
        cfg.write_text(text + f"bucket_size: {value}\n")
        r = invoke(runner, "validate", cfg)
        assert r.exit_code == 2
        assert f"{cfg}:14:14: error: expected a size of 0 or more with its unit, such as " \
               "'25 MiB' (PyTorch DDP's default)" in r.stderr, r.stderr
        assert "'-5 MiB'" not in r.stderr and "nan MiB" not in r.stderr
    cfg.write_text(text + "bucket_size: '25 MiB'\n")
    assert invoke(runner, "validate", cfg).exit_code == 0


def test_the_device_catalogs_figures_are_as_its_file_gives_them(runner):
    """Found by an audit: ``devices --format json`` printed the H100's FP32 peak as
    66900000000000.01, the float product of the catalog's 66.9 and 10^12, and its
    memory as 85520809984.0: 12 significant digits, whole numbers as integers."""
    import json

    r = invoke(runner, "devices", "--format", "json")
    assert r.exit_code == 0, r.stderr
    h100 = next(d for d in json.loads(r.stdout)["devices"] if d["name"] == "H100-SXM")
    assert h100["peak_flops"]["fp32"] == 66_900_000_000_000
    assert type(h100["peak_flops"]["fp32"]) is int
    assert h100["memory_bytes"] == 85_520_809_984 and type(h100["memory_bytes"]) is int
    assert ".01" not in r.stdout and ".0," not in r.stdout
