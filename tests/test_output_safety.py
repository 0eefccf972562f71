"""``-o FILE`` is atomic and safe: a failure or an interrupt at any point (while rendering,
while writing, before the rename) leaves the old file byte for byte and no temporary
file behind; a command never overwrites its own inputs, however they are named (another
relative path, a symlink, a hard link), and says so before doing the work; the YAML the
planner writes is the bytes PyYAML's own representer would write."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.output
from planner.output import _to_yaml_pyyaml, to_yaml

from .conftest import CLUSTERS, NETWORKS, invoke

NET = NETWORKS / "alexnet.yaml"
CL = CLUSTERS / "dgx-h100.yaml"
PLAN = ["plan", str(NET), str(CL), "-p", "8", "-b", "256", "--format", "yaml", "--estimator",
        "roofline"]
OLD = b"old: plan\n"


def _old_file(tmp_path: Path) -> Path:
    out = tmp_path / "plan.yaml"
    out.write_bytes(OLD)
    out.chmod(0o640)
    return out


def _untouched(out: Path) -> None:
    assert out.read_bytes() == OLD
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.yaml"], "temporary left"


def test_success_writes_what_stdout_would_show(runner, tmp_path):
    out = _old_file(tmp_path)
    to_stdout = invoke(runner, *PLAN)
    result = invoke(runner, *PLAN, "-o", out)
    assert result.exit_code == 0
    assert result.stderr == f"wrote {out}\n"
    assert out.read_text(encoding="utf-8") == to_stdout.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # the file keeps its permissions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_new_file_gets_the_umask_permissions(runner, tmp_path):
    old = os.umask(0o027)
    try:
        result = invoke(runner, *PLAN, "-o", tmp_path / "new.yaml")
    finally:
        os.umask(old)
    assert result.exit_code == 0
    assert stat.S_IMODE((tmp_path / "new.yaml").stat().st_mode) == 0o640


@pytest.mark.parametrize("where", ["render", "write", "fsync", "rename"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_failure_or_interrupt_leaves_the_old_file(runner, tmp_path, monkeypatch, where, error):
    out = _old_file(tmp_path)
    if where == "render":
        def fail(*a, **k):
            raise error("during render")

        monkeypatch.setattr(planner.output, "to_yaml", fail)
    elif where == "write":
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, fh):
                self.fh = fh

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

            def write(self, data):
                self.fh.write(data[: len(data) // 2])  # half of it reaches the disk
                raise error("during write")

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))
    elif where == "fsync":
        def fail_sync(fd):
            raise error("during fsync")

        monkeypatch.setattr(os, "fsync", fail_sync)
    else:
        def fail_replace(src, dst):
            raise error("during rename")

        monkeypatch.setattr(os, "replace", fail_replace)
    from click.testing import CliRunner

    from planner.cli import cli

    result = CliRunner().invoke(cli, [*map(str, PLAN), "-o", str(out)])
    # an interrupt is "Aborted!" (exit 1); any other failure is reported, never half-done
    assert result.exit_code == (1 if error is KeyboardInterrupt else 3), result.output
    assert "Traceback" not in result.stderr
    _untouched(out)


def test_disk_full_is_a_message_not_a_crash(runner, tmp_path, monkeypatch):
    out = _old_file(tmp_path)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    result = invoke(runner, *PLAN, "-o", out)
    assert result.exit_code == 2
    assert result.stderr == f"planner: error: cannot write {out}: No space left on device\n"
    _untouched(out)


def _run_closed(args: list[str], close: tuple[int, ...], stdout: object = None):
    """``planner ARGS`` in a fresh interpreter with the given descriptors closed (as the
    shell's ``>&-`` leaves them); the real binary, not a shim that would reuse fd 2."""
    import subprocess
    import sys

    def closing() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run([sys.executable, "-m", "planner", *args], preexec_fn=closing,
                          stdout=stdout, stderr=None if 2 in close else subprocess.PIPE,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_closed_or_full_stdout_is_an_error_not_a_silent_success(tmp_path):
    """`plan >&-` used to crash (exit 3: no isatty on None) and `--format yaml >&-` to
    exit 0 having written nothing; a full disk under stdout was an internal error. Each
    is exit 2 with a message. A closed stderr does not change the exit code: a plan
    written with -o is a success (exit 0, not 1), an invalid input still exit 2."""
    alex = [str(NETWORKS / "alexnet.yaml"), str(CLUSTERS / "dgx-h100.yaml"), "-p", "8",
            "-b", "64"]
    for extra in ([], ["--format", "yaml"]):
        r = _run_closed(["plan", *alex, *extra], close=(1,))
        assert r.returncode == 2, r.stderr
        assert r.stderr == b"planner: error: cannot write to standard output: it is closed\n"
    with open("/dev/full", "w") as full:
        r = _run_closed(["devices"], close=(), stdout=full)
    assert r.returncode == 2
    assert r.stderr == b"planner: error: cannot write to standard output: No space left on " \
                       b"device\n"
    out = tmp_path / "plan.yaml"
    r = _run_closed(["plan", *alex, "-o", str(out)], close=(2,))
    assert r.returncode == 0 and out.read_text().startswith("planner: ")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: cluster\n")
    assert _run_closed(["validate", str(bad)], close=(2,)).returncode == 2


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_machine_output_on_stdout_is_utf8_whatever_the_locale(tmp_path, encoding):
    """JSON and YAML on standard output are UTF-8, as -o files are: under a Latin-1
    locale a network file's path with "ü" and "✓" had gone out as Latin-1 bytes and as
    ``\\u2713`` text (an audit). The same bytes as with a UTF-8 stdout."""
    import subprocess
    import sys

    folder = tmp_path / "netz-ü-✓"
    folder.mkdir()
    net = folder / "alexnet.yaml"
    net.write_bytes((NETWORKS / "alexnet.yaml").read_bytes())
    args = [sys.executable, "-m", "planner", "plan", str(net), str(CLUSTERS / "dgx-h100.yaml"),
            "-p", "8", "-b", "64", "--format"]
    for fmt in ("json", "yaml"):
        outs = [subprocess.run([*args, fmt], capture_output=True, check=True,
                               env={**os.environ, "PYTHONIOENCODING": enc}).stdout
                for enc in (encoding, "utf-8")]
        assert outs[0] == outs[1]
        assert "netz-ü-✓".encode() in outs[0]


def test_unwritable_folder_is_a_message(runner, tmp_path, monkeypatch):
    import tempfile

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    result = invoke(runner, *PLAN, "-o", tmp_path / "plan.yaml")
    assert result.exit_code == 2
    assert result.stderr.endswith("plan.yaml: Permission denied\n")
    assert list(tmp_path.iterdir()) == []


def test_kernel_model_files_are_inputs_too(runner, tmp_path, monkeypatch):
    """A plan, a cost, a comparison or a sweep plot written over the kernel models it
    reads (models/manifest.yaml) broke every later run; they are inputs like the
    network and cluster, whichever way the models were chosen."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(Path(__file__).resolve().parents[1] / "models", models,
                    ignore=shutil.ignore_patterns("data"))
    before = {f.name: f.read_bytes() for f in models.iterdir() if f.is_file()}
    alex = [NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "8", "-b", "64"]
    for cmd, extra in (("plan", ["-o", models / "manifest.yaml"]),
                       ("cost", ["-o", models / "conv.npz"]),
                       ("compare", ["-o", models / "gemm.npz"]),
                       ("sweep", ["--plot", models / "gemm.npz"])):
        r = invoke(runner, cmd, *alex, "--models-dir", models, *extra)
        assert r.exit_code == 2 and "it is one of this command's inputs" in r.stderr, cmd
    monkeypatch.setenv("PLANNER_MODELS", str(models))
    r = invoke(runner, "plan", *alex, "-o", models / "manifest.yaml")
    assert r.exit_code == 2 and "it is one of this command's inputs" in r.stderr
    assert {f.name: f.read_bytes() for f in models.iterdir() if f.is_file()} == before
    # the roofline reads no models: writing beside them is allowed
    r = invoke(runner, "cost", *alex, "--estimator", "roofline", "-o", models / "x.yaml")
    assert r.exit_code == 0, r.stderr


def test_kernels_cluster_and_shape_files_are_inputs_too(runner, tmp_path):
    """`kernels eval --cluster C -o C` replaced the cluster file with the accuracy table,
    and `kernels profile --shapes S -o S` the shapes with the measurements (found by an
    audit); each is refused before any work, and the file is as it was."""
    cluster = tmp_path / "c.yaml"
    cluster.write_bytes((CLUSTERS / "dgx-h100.yaml").read_bytes())
    shapes = tmp_path / "s.csv"
    shapes.write_text("m,n,k,batch,time_ms,device,dtype,op\n256,256,256,1,0.01,H100-SXM,"
                      "float32,gemm\n")
    before = cluster.read_bytes(), shapes.read_bytes()
    data = Path(__file__).resolve().parents[1] / "models/data/neusight/neusight_bmm_fp32_test.csv"
    for args in (["kernels", "eval", data, "--cluster", cluster, "-o", cluster],
                 ["kernels", "predict", "--device", "H100-SXM", "--gemm", "64,64,64",
                  "--cluster", cluster],
                 ["kernels", "profile", "--device", "cpu", "--shapes", shapes, "-o", shapes]):
        r = invoke(runner, *args)
        if "-o" in args:
            assert r.exit_code == 2 and "it is one of this command's inputs" in r.stderr, \
                (args, r.output)
        else:
            assert r.exit_code == 0, r.output
    assert (cluster.read_bytes(), shapes.read_bytes()) == before


def _other_names(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ways to name ``path`` without its plain spelling."""
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    hard = tmp_path / "hard.yaml"
    os.link(path, hard)
    monkeypatch.chdir(path.parent)
    relative = os.path.relpath(path, tmp_path)
    return [str(path), path.name, f"./{path.name}", str(tmp_path / relative), str(link),
            str(hard), f"../{path.parent.name}/{path.name}"]


@pytest.mark.parametrize("which", ["network", "cluster"])
def test_refuses_to_overwrite_an_input_under_any_name(runner, tmp_path, monkeypatch, which):
    net, cl = tmp_path / "net" / "alexnet.yaml", tmp_path / "net" / "cluster.yaml"
    net.parent.mkdir()
    net.write_bytes(NET.read_bytes())
    cl.write_bytes(CL.read_bytes())
    target = net if which == "network" else cl
    before = (target.read_bytes(), target.stat().st_mtime_ns)
    for name in _other_names(target, tmp_path, monkeypatch):
        for cmd in (["plan", str(net), str(cl), "-p", "8", "-b", "256"],
                    ["cost", str(net), str(cl), "-p", "8", "-b", "256"],
                    ["compare", str(net), str(cl), "-p", "8", "-b", "256"],
                    ["sweep", str(net), str(cl), "--gpus", "8", "-b", "256"]):
            result = invoke(runner, *cmd, "--format", "yaml", "-o", name)
            assert result.exit_code == 2, (cmd, name, result.stderr)
            assert result.stderr == (f"planner: error: refusing to write {name}: it is one of "
                                     "this command's inputs; choose another output file\n")
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before


def test_show_and_plot_refuse_their_inputs_too(runner, tmp_path):
    net = tmp_path / "alexnet.yaml"
    net.write_bytes(NET.read_bytes())
    result = invoke(runner, "show", net, "--format", "yaml", "-o", net)
    assert result.exit_code == 2 and "refusing to write" in result.stderr
    result = invoke(runner, "sweep", net, CL, "--gpus", "8", "-b", "256", "--plot", net)
    assert result.exit_code == 2 and "refusing to write" in result.stderr
    assert net.read_bytes() == NET.read_bytes()


def test_refusal_comes_before_the_work(runner, monkeypatch):
    """A bad -o is caught before the search runs (a long plan is not thrown away)."""
    import planner.search

    def no_search(*a, **k):
        raise AssertionError("searched although the output was refused")

    monkeypatch.setattr(planner.search, "search", no_search)
    result = invoke(runner, "plan", NET, CL, "-p", "8", "-b", "256", "-o", NET)
    assert result.exit_code == 2 and "refusing to write" in result.stderr


def test_symlink_output_is_written_through(runner, tmp_path):
    real = tmp_path / "real.yaml"
    real.write_bytes(OLD)
    link = tmp_path / "plan.yaml"
    link.symlink_to(real)
    result = invoke(runner, *PLAN, "-o", link)
    assert result.exit_code == 0
    assert link.is_symlink() and real.read_text(encoding="utf-8").startswith("planner:")


def test_devices_and_pipes_are_written_into_not_replaced(runner, tmp_path):
    """`-o /dev/null` and `-o FIFO` must not swap the node for a regular file (a rename
    over /dev/null, as root, replaces the device for every program on the machine)."""
    import threading

    r = invoke(runner, *PLAN, "-o", os.devnull)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = invoke(runner, *PLAN, "-o", str(fifo))
    reader.join(timeout=30)
    assert r.exit_code == 0, r.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert got == [invoke(runner, *PLAN).stdout_bytes]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"], "temporary left"


def test_directory_or_missing_folder_is_refused(runner, tmp_path):
    result = invoke(runner, *PLAN, "-o", tmp_path / "nope" / "plan.yaml")
    assert result.exit_code == 2
    assert result.stderr == (f"planner: error: cannot write {tmp_path}/nope/plan.yaml: "
                             f"folder {tmp_path}/nope does not exist\n")


def test_a_name_ending_in_a_slash_never_replaces_the_file_it_would_name(runner, tmp_path):
    """`-o keep.txt/` names a folder; Path() drops the slash, and the file keep.txt was
    replaced with the plan (exit 0). A file used as a folder is named as one."""
    keep = tmp_path / "keep.txt"
    keep.write_text("precious\n")
    for target in (f"{keep}/", f"{keep}/."):
        result = invoke(runner, *PLAN, "-o", target)
        assert result.exit_code == 2, target
        assert "names a folder; give the file's name" in result.stderr
    result = invoke(runner, *PLAN, "-o", f"{keep}/plan.yaml")
    assert result.exit_code == 2
    assert result.stderr == (f"planner: error: cannot write {keep}/plan.yaml: {keep} is a "
                             "file, not a folder\n")
    assert keep.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


# ---------------------------------------------------------------------------------------
# The fast YAML writer gives PyYAML's bytes

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=130),
    st.sampled_from(["yes", "no", "null", "~", "1e3", "0x1f", "-", "", " x", "a: b", "#c",
                     "- x", "1.5", ".inf", "2001-12-14", "=", "<<", "?", "'q'", '"d"', "a\nb",
                     "\t", "é", "\u2028", "x" * 120, "y " * 60]))
def _nested(depth: int) -> st.SearchStrategy:
    """Scalars, and lists, mappings and pairs of them nested up to ``depth`` deep (built
    level by level: st.recursive's check that its extension recurses failed at random
    in a full run with hypothesis 6.155, "doesn't use its argument")."""
    inner = _SCALARS
    for _ in range(depth):
        inner = st.one_of(
            _SCALARS,
            st.lists(inner, max_size=6),
            st.dictionaries(st.one_of(st.text(max_size=20), st.integers(), st.booleans()),
                            inner, max_size=5),
            st.tuples(inner, inner))
    return inner


_DATA = _nested(3)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_DATA)
def test_yaml_writer_matches_pyyaml(data):
    assert to_yaml(data) == _to_yaml_pyyaml(data)


@pytest.mark.parametrize("network", sorted(NETWORKS.glob("*.yaml")), ids=lambda p: p.stem)
def test_yaml_writer_matches_pyyaml_on_real_documents(runner, network):
    import json

    # 2,048 images of 2048x2048 do not fit 64 GPUs (exit 1, no document): 64 images do;
    # nor do 2,048 sequences of 8,192 tokens for Llama 3 8B: 64 do (for 70B, 8; for
    # Mixtral 8x7B and DeepSeekMoE 16B 64 of 4,096 tokens, with ZeRO stage 1; for Llama
    # 3 8B at 131,072 tokens, 4 with Adam and ZeRO stage 1; Llama 2 13B 64, 70B 8;
    # Mistral 7B and Gemma 2 9B 64)
    batch = "64" if network.stem in ("segmentation-2048", "llama3-8b", "mixtral-8x7b",
                                     "deepseek-moe-16b", "llama2-13b", "qwen2-7b",
                                     "mistral-7b", "gemma2-9b") \
        else "8" if network.stem in ("llama3-70b", "llama2-70b") \
        else "4" if network.stem == "llama3-8b-128k" else "2048"
    extra = ["--optimizer", "adam", "--zero", "1"] if network.stem in (
        "mixtral-8x7b", "deepseek-moe-16b", "llama3-8b-128k") else []
    priced = ["plan", network, CL, "-p", "64", "-b", batch, "--estimator", "roofline", *extra]
    if network.stem == "llama3-405b":  # no 64 GPUs hold it: Meta's layout on 8,192 (cost)
        priced = ["cost", network, CLUSTERS / "h100-roce-16k.yaml", "-p", "8192", "-b",
                  "2048", "--optimizer", "adam", "--zero", "2", "--pipeline", "16",
                  "--microbatches", "32", "--grid", "8x64", "--mode", "megatron-sp"]
    for args in (priced, ["show", network]):
        result = invoke(runner, *args, "--format", "json")
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert to_yaml(data) == _to_yaml_pyyaml(data)


def test_yaml_one_letter_booleans_are_quoted():
    """YAML 1.1 reads y, Y, n and N as booleans (https://yaml.org/type/bool.html) though
    PyYAML does not: layer names "y" and "n" were written plain, which Go's yaml.v2 and
    yaml-cpp read as true and false (an audit). Quoted, in both writers; words are not."""
    data = {"layers": [{"name": n} for n in ("y", "Y", "n", "N", "yy", "x")], "y": "n"}
    text = to_yaml(data)
    assert text == _to_yaml_pyyaml(data)
    for n in ("y", "Y", "n", "N"):
        assert f"- name: '{n}'\n" in text
    assert "- name: yy\n" in text and "- name: x\n" in text and "'y': 'n'\n" in text
    import yaml
    assert yaml.safe_load(text) == data


def test_yaml_writer_keeps_aliases_and_odd_types_to_pyyaml():
    shared = [1, 2]
    data = {"a": shared, "b": shared, "c": {1, 2}.__class__.__name__}
    assert to_yaml(data) == _to_yaml_pyyaml(data)
    assert "&id001" in to_yaml(data)


def test_a_read_only_file_is_not_replaced(runner, tmp_path):
    """The rename would replace a file its owner made read-only (even for root, who may
    write anything): refused, exit 2, the file and its mode kept."""
    out = _old_file(tmp_path)
    out.chmod(0o444)
    result = invoke(runner, *PLAN, "-o", out)
    assert result.exit_code == 2
    assert result.stderr == (f"planner: error: refusing to replace {out}: it is read-only; "
                             "make it writable or choose another output file\n")
    assert out.read_bytes() == OLD and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_launch_scripts_are_executable_and_the_plans_inputs_kept(runner, tmp_path,
                                                                 monkeypatch):
    """`launch -o run.sh` writes a script bash can run as ./run.sh (rwx less the umask;
    the env lines stay rw-); the network and cluster files a plan records are inputs too,
    so -o cannot replace them."""
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "net.yaml"
    net.write_bytes(NET.read_bytes())
    assert invoke(runner, "plan", "net.yaml", CL, "-p", "8", "-b", "256", "-o",
                  "p.yaml").exit_code == 0
    umask = os.umask(0o022)
    try:
        assert invoke(runner, "launch", "p.yaml", "-o", "run.sh").exit_code == 0
        assert invoke(runner, "launch", "p.yaml", "--emit", "env", "-o",
                      "env.txt").exit_code == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "env.txt").stat().st_mode) == 0o644
    before = net.read_bytes()
    result = invoke(runner, "launch", "p.yaml", "-o", "net.yaml")
    assert result.exit_code == 2 and "it is one of this command's inputs" in result.stderr
    assert net.read_bytes() == before


def test_a_narrow_terminal_still_gets_a_table(monkeypatch):
    """COLUMNS=1 drew a table one character a line; the console is at least 40 wide,
    and a width above that is kept."""
    from planner.cli import MIN_WIDTH, console

    monkeypatch.setenv("COLUMNS", "1")
    assert console().width == MIN_WIDTH == 40
    monkeypatch.setenv("COLUMNS", "97")
    assert console().width == 97


def test_strings_yaml_12_reads_as_numbers_are_quoted_so_planner_reads_its_plans_back(
        runner, tmp_path):
    """`1e3` and `0o17` are strings to YAML 1.1 (PyYAML's resolver) but numbers to the
    1.2 core schema planner reads by: a network named "1e3" came back from its own plan
    as 1000.0, and validate and launch refused the plan (exit 2)."""
    from planner.loading import parse_text

    words = ["1e3", "1E+3", "-1e-3", "0o17", "5e61234", ".5", "1.", "0x1f", "yes", "abc"]
    text = to_yaml({"names": words})
    assert parse_text(text, "t.yaml").data == {"names": words}
    assert "- '1e3'" in text and "- abc" in text
    assert to_yaml({"names": words}) == _to_yaml_pyyaml({"names": words})
    net = tmp_path / "n.yaml"
    net.write_text((NETWORKS / "alexnet.yaml").read_text().replace(
        "name: alexnet", 'name: "1e3"', 1))
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "plan", net, CL, "-p", "8", "-b", "256", "--estimator", "roofline",
               "-o", plan)
    assert r.exit_code == 0, r.stderr
    assert "name: '1e3'" in plan.read_text()
    r = invoke(runner, "validate", plan)
    assert r.exit_code == 0, r.stderr
