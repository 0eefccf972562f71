"""``planner check`` on the shipped CI examples, its formats, stale plans; ``launch``."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import CLUSTERS, EXAMPLES, NETWORKS, ROOT, invoke

CI = EXAMPLES / "ci"


def _config(plan: str, gpus: int = 64) -> str:
    """A training configuration of ResNet-50 on the DGX cluster (absolute paths) whose
    strategy is the plan file ``plan`` (relative to the configuration)."""
    return (f"kind: training\nnetwork: {EXAMPLES / 'networks/resnet50.yaml'}\n"
            f"cluster: {EXAMPLES / 'clusters/dgx-h100.yaml'}\ngpus: {gpus}\nbatch: 2048\n"
            f"strategy: {{plan: {plan}}}\n")


@pytest.mark.parametrize(("config", "code"), [
    ("resnet50-dgx.yaml", 0),
    ("llama3-8b-megatron.yaml", 0),
    ("gpt2-does-not-fit.yaml", 1),
    ("alexnet-too-slow.yaml", 1),
    ("broken.yaml", 2),
])
def test_examples_exit_codes(runner, config, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "check", f"examples/ci/{config}")
    assert result.exit_code == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_megatron_example_quotes_what_check_says(runner, monkeypatch):
    """The comment of examples/ci/llama3-8b-megatron.yaml quotes the searched optimum
    and this layout's step as `check` prints them (a refit had left them stale: found by
    an audit, 2026-12-07)."""
    monkeypatch.chdir(ROOT)
    path = "examples/ci/llama3-8b-megatron.yaml"
    text = " ".join(line.lstrip("# ") for line in
                    (ROOT / path).read_text(encoding="utf-8").splitlines())
    quoted = re.search(r"\(([\d.]+ m?s) a step against\s+this layout's ([\d.]+ m?s);", text)
    assert quoted, text
    result = invoke(runner, "check", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert (f"predicted iteration {quoted[2]} is " in result.stdout
            and f"the searched optimum with 2 pipeline stages {quoted[1]} " in result.stdout), \
        result.stdout


def test_text_lines_point_at_the_strategy(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "check", "examples/ci/alexnet-too-slow.yaml")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "examples/ci/alexnet-too-slow.yaml:11:1: ok: [memory]" in lines[0]
    assert lines[1].startswith("examples/ci/alexnet-too-slow.yaml:11:1: FAIL: [speed] "
                               "predicted iteration")
    assert "allowed: 1.1x" in lines[1]


def test_github_annotations(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "check", "--format", "github", "examples/ci/alexnet-too-slow.yaml",
                    "examples/ci/broken.yaml")
    assert result.exit_code == 2  # an invalid input outranks a failed check
    lines = result.stdout.splitlines()
    speed = next(x for x in lines if "speed" in x)
    assert speed.startswith("::error file=examples/ci/alexnet-too-slow.yaml,line=11,col=1,"
                            "title=planner check%3A speed::predicted iteration")
    broken = [x for x in lines if "broken.yaml" in x]
    assert "::error file=examples/ci/broken.yaml,line=8,col=1,title=planner%3A invalid "\
           "input::unknown key 'bacth' in a training configuration; did you mean 'batch'?" \
           in broken
    assert any("line=10" in x and "grid 16x16 has 256 devices" in x for x in broken)


def test_a_missing_file_has_no_position(runner, tmp_path):
    """An error about a file itself (here, it does not exist) points at no line: the
    text says ``FILE: error: ...``, JSON gives null line and column, and the GitHub
    annotation is on the file, with no line (``line=1,col=1`` pointed at nothing)."""
    missing = tmp_path / "missing.yaml"
    text = invoke(runner, "check", missing)
    assert text.exit_code == 2 and text.stderr == f"{missing}: error: no such file\n"
    data = json.loads(invoke(runner, "check", missing, "--format", "json").stdout)
    assert data["errors"] == [{"file": str(missing), "line": None, "column": None,
                               "message": "no such file", "path": "$"}]
    gh = invoke(runner, "check", missing, "--format", "github")
    assert gh.exit_code == 2
    assert gh.stdout == (f"::error file={missing},title=planner%3A invalid input::no such "
                         "file\n")


def test_json_format(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "check", "--format", "json", "examples/ci/resnet50-dgx.yaml",
                    "examples/ci/gpt2-does-not-fit.yaml")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False
    by_name = {c["name"]: c for c in data["configs"]}
    assert by_name["resnet50-dgx"]["ok"] is True
    assert {c["check"] for c in by_name["resnet50-dgx"]["checks"]} == {"plan", "memory",
                                                                        "speed"}
    mem = next(c for c in by_name["gpt2-oom"]["checks"] if c["check"] == "memory")
    assert mem["ok"] is False and mem["peak_bytes"] > mem["capacity_bytes"]
    # the advice names the configuration's keys, not plan's options (batch: 1080, not
    # --batch 1080), recompute: auto among them
    speed = next(c for c in by_name["gpt2-oom"]["checks"] if c["check"] == "speed")
    assert "(recompute: auto: as few of the 24 as memory needs)" in speed["message"]
    assert "about batch: 472," in speed["message"]
    # searched: the leanest layout on 32 devices still needs 83.77 GiB, on 64 one fits
    assert "more devices (gpus: 64: a plan fits there; on 32 the leanest layout needs " \
           "83.77 GiB)" in speed["message"]
    assert "--" not in speed["message"]
    # the keys of a speed finding that compares, null where no plan fits (an audit)
    assert (speed["optimum_s"], speed["ratio"], speed["max_slowdown"]) == (None, None, 1.1)
    assert speed["time_s"] > 0


def test_max_slowdown_option(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "check", "examples/ci/alexnet-too-slow.yaml", "--max-slowdown",
                    "100")
    assert result.exit_code == 0


def test_stale_plan_fails(runner, tmp_path):
    for sub in ("networks", "clusters"):
        shutil.copytree(EXAMPLES / sub, tmp_path / sub)
    (tmp_path / "ci" / "plans").mkdir(parents=True)
    shutil.copy(CI / "resnet50-dgx.yaml", tmp_path / "ci")
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", tmp_path / "ci" / "plans")
    cfg = tmp_path / "ci" / "resnet50-dgx.yaml"
    assert invoke(runner, "check", cfg).exit_code == 0
    net = tmp_path / "networks" / "resnet50.yaml"
    net.write_text(net.read_text() + "\n# edited\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert "the plan is stale: the network file ../networks/resnet50.yaml changed" in \
        result.stdout


def test_stale_plan_names_an_absolute_path_as_given(runner, tmp_path):
    """A configuration naming its network by an absolute path outside its folder is told
    of that path, not of ``../../../..`` climbing to it (noticed in session 49)."""
    shutil.copytree(EXAMPLES / "clusters", tmp_path / "clusters")
    deep = tmp_path / "a" / "b" / "c" / "ci"
    (deep / "plans").mkdir(parents=True)
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", deep / "plans")
    outside = tmp_path / "x" / "resnet50.yaml"
    outside.parent.mkdir()
    shutil.copy(EXAMPLES / "networks" / "resnet50.yaml", outside)
    text = (CI / "resnet50-dgx.yaml").read_text()
    text = text.replace("../networks/resnet50.yaml", str(outside))
    text = text.replace("../clusters/", str(tmp_path / "clusters") + "/")
    cfg = deep / "resnet50-dgx.yaml"
    cfg.write_text(text)
    assert invoke(runner, "check", cfg).exit_code == 0
    outside.write_text(outside.read_text() + "\n# edited\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert f"the plan is stale: the network file {outside} changed" in result.stdout
    assert "../.." not in result.stdout


def test_a_plan_priced_with_other_kernel_models_is_stale(runner, tmp_path):
    """A plan records the digest of the kernel models that timed it (inputs.models); check
    prices with the same ones or calls the plan stale (found by an audit: check passed or
    failed by which PLANNER_MODELS the CI job happened to set). The digest is of what
    predicts, not of where it lies: a copy of the shipped models is the same models."""
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    (tmp_path / "plans").mkdir()
    plan = tmp_path / "plans" / "p.yaml"
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", plan)
    cfg.write_text(_config("../plans/p.yaml"))
    assert "models:\n    sha256: " in plan.read_text()
    assert invoke(runner, "check", cfg).exit_code == 0
    copy = tmp_path / "models"
    shutil.copytree(ROOT / "models", copy, ignore=shutil.ignore_patterns("data"))
    assert invoke(runner, "check", cfg, "--models-dir", copy).exit_code == 0
    r = invoke(runner, "check", cfg, "--estimator", "roofline")
    assert r.exit_code == 1
    assert "the plan was priced with the kernel models " in r.stdout
    assert "and check prices with the roofline: give check the plan's models" in r.stdout
    # a roofline plan, checked with the models
    r = invoke(runner, "plan", EXAMPLES / "networks/resnet50.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "64", "-b", "2048",
               "--estimator", "roofline", "-o", plan)
    assert r.exit_code == 0 and "models:" not in plan.read_text()
    assert invoke(runner, "check", cfg, "--estimator", "roofline").exit_code == 0
    r = invoke(runner, "check", cfg)
    assert r.exit_code == 1
    assert "the plan was priced with the roofline and check prices with the kernel models" \
        in r.stdout


def test_plan_for_another_question_fails(runner, tmp_path):
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    (tmp_path / "plans").mkdir()
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", tmp_path / "plans" / "p.yaml")
    cfg.write_text(_config("../plans/p.yaml", gpus=32))
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert "the plan is for gpus=64, the configuration says 32" in result.stdout


@pytest.mark.parametrize(("setting", "said"), [
    ("optimizer: adam", "the plan is for optimizer=momentum, the configuration says adam"),
    ("precision: bfloat16", "the plan is for dtype=float32, the configuration says bfloat16"),
    ("cost_model: gholami2018", "the plan is for cost_model=exact, the configuration says "
                                "gholami2018"),
    ("bucket_size: 0 B", "the plan is for bucket_bytes=26214400, the configuration says "
                         "0"),
    ("overlap: none", "the plan is for overlap=gradients, the configuration says none"),
    ("algorithm: tree", "the plan is for algorithm=auto, the configuration says tree"),
    ("cross_entropy: eager", "the plan is for cross_entropy=fused, the configuration says "
                             "eager"),
])
def test_plan_for_another_training_setup_is_stale(runner, tmp_path, setting, said):
    """The committed plan answers the defaults (momentum, the network's float32, exact,
    25 MiB buckets, overlapped gradients, no master weights); a configuration that asks
    otherwise must not be told the plan matches."""
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    (tmp_path / "plans").mkdir()
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", tmp_path / "plans" / "p.yaml")
    text = _config("../plans/p.yaml")
    cfg.write_text(text)
    assert invoke(runner, "check", cfg).exit_code == 0
    cfg.write_text(text + setting + "\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert said in result.stdout


def test_master_weights_of_fp32_weights_are_refused(runner, tmp_path):
    """Master weights are fp32 copies of 16-bit weights: asked for a float32 network
    (ResNet-50's), a configuration is refused at the key (exit 2), as `plan
    --master-weights` is; they had been priced, 4 bytes a parameter for nothing (an
    audit; with fp64 weights they had held Adam's state in fp32, less than without)."""
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    (tmp_path / "plans").mkdir()
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", tmp_path / "plans" / "p.yaml")
    text = _config("../plans/p.yaml") + "master_weights: true\n"
    cfg.write_text(text)
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 2
    line = text.splitlines().index("master_weights: true") + 1
    assert f"c.yaml:{line}:17: error: master weights are fp32 copies of 16-bit weights, " \
           "and the network's are float32; drop 'master_weights', or set 'precision: " \
           "bfloat16'" in result.stdout + result.stderr
    cfg.write_text(text + "precision: bfloat16\n")
    assert invoke(runner, "check", cfg).exit_code == 1  # valid; the plan is stale
    for dtype in ("float32", "float64"):
        r = invoke(runner, "plan", NETWORKS / "gpt2-small.yaml", CLUSTERS / "dgx-h100.yaml",
                   "-p", "8", "-b", "8", "--master-weights", "--precision", dtype)
        assert r.exit_code == 2 and f"the network's are {dtype}; drop --master-weights" \
            in r.stderr, r.stderr


def test_plan_made_with_another_algorithm(runner, tmp_path):
    """A plan made with `--algorithm ring` answers another question than the cluster's
    default (auto): stale for a configuration that does not say ring, current for one
    that does; and check then prices with ring: the strategy's time is the plan's."""
    (tmp_path / "ci").mkdir()
    plan = tmp_path / "p.yaml"
    net, cl = EXAMPLES / "networks/alexnet.yaml", EXAMPLES / "clusters/dgx-h100.yaml"
    made = invoke(runner, "plan", net, cl, "-p", "16", "-b", "512", "--algorithm", "ring",
                  "--format", "yaml", "-o", plan)
    assert made.exit_code == 0, made.stderr
    cfg = tmp_path / "ci" / "c.yaml"
    text = (f"kind: training\nnetwork: {net}\ncluster: {cl}\ngpus: 16\nbatch: 512\n"
            "strategy: {plan: ../p.yaml}\n")
    cfg.write_text(text)
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert "the plan is for algorithm=ring, the configuration says auto (the cluster's; " \
           "set 'algorithm' to choose)" in result.stdout
    cfg.write_text(text + "algorithm: ring\n")
    result = invoke(runner, "check", "--format", "json", cfg)
    assert result.exit_code == 0, result.stdout
    speed = next(c for c in json.loads(result.stdout)["configs"][0]["checks"]
                 if c["check"] == "speed")
    import yaml

    recorded = yaml.safe_load(plan.read_text())["iteration"]["time_s"]
    assert speed["time_s"] == pytest.approx(recorded, rel=1e-3)  # the plan rounds to 4 digits
    cfg.write_text(text + "algorithm: tree\n")
    result = invoke(runner, "check", cfg)
    assert "the plan is for algorithm=ring, the configuration says tree" in result.stdout
    assert "the cluster's" not in result.stdout


def test_sizes_of_older_plans_still_match(runner, tmp_path):
    """Plans made before sizes were written in whole bytes kept 4 significant digits
    (``bucket_bytes: 26210000.0`` for 25 MiB): such a plan still matches its question;
    another size does not."""
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    (tmp_path / "plans").mkdir()
    plan = (CI / "plans" / "resnet50-dgx-64.yaml").read_text()
    assert "  bucket_bytes: 26214400\n" in plan
    cfg.write_text(_config("../plans/p.yaml"))
    for old, code in (("26210000.0", 0), ("26200000.0", 1)):
        (tmp_path / "plans" / "p.yaml").write_text(
            plan.replace("  bucket_bytes: 26214400\n", f"  bucket_bytes: {old}\n"))
        assert invoke(runner, "check", cfg).exit_code == code, old


@pytest.mark.parametrize(("layer", "said"), [
    ("mode: data\n  grid: [3, 3]", ":4:9: error: grid 3x3 has 9 devices; the configuration "
                                   "has gpus=64"),
    ("mode: banana\n  grid: [1, 64]", ":3:9: error: expected mode one of data, model, "
                                      "domain, column, row, column-sp, row-sp, model-sp, "
                                      "ulysses, expert, expert-sp, got 'banana'"),
    ("mode: data\n  grid: [1, 64.5]", ":4:9: error: expected grid: [P_r, P_c], two whole "
                                      "numbers >= 1"),
    ("mode: domain\n  grid: [2, 32]", ":4:9: error: layer fc cannot use domain 2x32: "
                                      "domain parallelism splits the height"),
])
def test_a_plan_with_an_impossible_layer_is_an_input_error(runner, tmp_path, layer, said):
    """`check` reads the layouts of a plan file; one that cannot run is an error at its
    line (exit 2), not a plan priced as if it could."""
    plans = tmp_path / "plans"
    plans.mkdir()
    text = (CI / "plans" / "resnet50-dgx-64.yaml").read_text()
    # the classifier (a linear layer, no height to split), in whatever layout the plan has
    found = re.search(r"- name: fc\n  type: linear\n((?:  (?:in|out)_features: \d+\n)*)"
                      r"  mode: [a-z-]+\n  grid: \[\d+, \d+\]\n", text)
    assert found is not None and found.group(1)  # the features the plan records
    entry = found.group(0)
    # the line numbers of `said` count from the layer's layout, as if right after its type
    first = text[:text.index(entry)].count("\n") + found.group(1).count("\n")
    (plans / "p.yaml").write_text(text.replace(entry, "- name: fc\n  type: linear\n"
                                                      f"{found.group(1)}  {layer}\n"))
    said = re.sub(r"^:(\d+):", lambda m: f":{first + int(m.group(1))}:", said)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_config("plans/p.yaml"))
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 2, result.stdout
    line = result.stderr.splitlines()[0]
    assert line.startswith(str(plans / "p.yaml") + said), line


def test_committed_plan_is_current(tmp_path, update_golden):
    """The committed example plan is what `planner plan` makes today."""
    committed = CI / "plans" / "resnet50-dgx-64.yaml"
    out = tmp_path / "plan.yaml"
    subprocess.run([sys.executable, "-m", "planner", "plan", "examples/networks/resnet50.yaml",
                    "examples/clusters/dgx-h100.yaml", "--gpus", "64", "--batch", "2048",
                    "--format", "yaml", "-o", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    if update_golden:
        committed.write_bytes(out.read_bytes())
    assert out.read_bytes() == committed.read_bytes()


def test_validate_accepts_training_configs(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "validate", "examples/ci/resnet50-dgx.yaml")
    assert result.exit_code == 0 and "ok (training" in result.stdout


@pytest.mark.parametrize("command", ["validate", "check"])
def test_training_pin_errors_name_the_file_key(runner, tmp_path, command):
    """A pin's grid is checked when the configuration is read (so `validate` finds what
    `check` would), at the pin's line, against the file's `gpus:` (not `--gpus`)."""
    cfg = tmp_path / "pins.yaml"
    cfg.write_text("kind: training\n"
                   f"network: {EXAMPLES / 'networks' / 'alexnet.yaml'}\n"
                   f"cluster: {EXAMPLES / 'clusters' / 'dgx-h100.yaml'}\n"
                   "gpus: 16\nbatch: 256\nstrategy:\n  pins:\n"
                   "    - 'conv*=data'\n"
                   "    - 'fc*=model:4x2'\n"
                   "    - 'fc8=sideways'\n"
                   "    - 'fc7=model:8x2:sideways'\n")
    result = invoke(runner, command, str(cfg))
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = [x for x in result.stderr.splitlines() if ": error: " in x]
    assert lines == [
        f"{cfg}:9:7: error: grid 4x2 has 8 devices but gpus is 16; P_r × P_c must equal the "
        "device count (at $.strategy.pins[1])",
        f"{cfg}:10:7: error: invalid pin 'fc8=sideways': mode must be one of data, model, "
        "domain, column, row, column-sp, row-sp, model-sp, ulysses, expert, expert-sp (at "
        "$.strategy.pins[2])",
        f"{cfg}:11:7: error: invalid pin 'fc7=model:8x2:sideways': placement 'sideways' must "
        "be rows or cols (GLOB=MODE[:PRxPC[:rows|cols]]) (at $.strategy.pins[3])"],\
        result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["torchrun", "slurm", "env"])
def test_launch(runner, kind, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    script = () if kind == "env" else ("--script", "examples/launch/train.py")
    result = invoke(runner, "launch", "examples/ci/plans/resnet50-dgx-64.yaml", "--emit", kind,
                    *script)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "rank k runs on node k // 8, local device k % 8" in out
    if kind == "torchrun":
        assert "torchrun --nnodes=8 --nproc-per-node=8" in out
        assert "examples/launch/train.py --plan examples/ci/plans/resnet50-dgx-64.yaml" in out
    elif kind == "slurm":
        assert "#SBATCH --nodes=8" in out and "#SBATCH --ntasks-per-node=8" in out
        assert "SLURM_PROCID" in out
    else:
        assert "PLANNER_WORLD_SIZE=64" in out and "PLANNER_NODES=8" in out
        assert 'MASTER_PORT="${MASTER_PORT:-29500}"' in out.splitlines()
    if kind != "env":  # a script bash can run
        script = tmp_path / "run.sh"
        script.write_text(out)
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def _fake_slurm(folder, nodes: int, per_node: int) -> dict[str, str]:
    """srun, scontrol and python stand-ins: srun starts its tasks as Slurm's block
    distribution does with the same count on every node (task i on node i // per_node,
    local id i % per_node); python prints the rank variables it was started with."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n" 'if [ -n "${SRUN_LOG:-}" ]; then echo "$@" >> "$SRUN_LOG"; fi\n'
        "while [[ $1 == --* ]]; do shift; done\n"
        "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
        f"  SLURM_PROCID=$i SLURM_LOCALID=$((i % {per_node})) SLURM_NODEID=$((i / {per_node}))"
        ' "$@" || exit 1\ndone\n')
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\n" + "".join(f"echo node{n}\n" for n in range(nodes)))
    (bin_dir / "python").write_text(
        '#!/bin/bash\necho "rank=$RANK local=$LOCAL_RANK node=$SLURM_NODEID '
        'world=$WORLD_SIZE $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_JOB_NODELIST": "node[0-9]"}


def _alexnet_plan(runner, tmp_path, gpus: int, batch: int):
    """AlexNet planned on the DGX H100 cluster, written to ``tmp_path/p.yaml``."""
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", str(gpus), "-b", str(batch),
               "-o", plan)
    assert r.exit_code == 0, r.stderr
    return plan


def _run_job(tmp_path, text: str, nodes: int, per_node: int, env: dict[str, str],
             *args: str):
    """Run a Slurm script under the stand-ins of :func:`_fake_slurm`, srun's arguments
    logged: (the finished process, the log's text)."""
    script = tmp_path / "job.sh"
    script.write_text(text)
    log = tmp_path / "srun.log"
    ran = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                         env={**_fake_slurm(tmp_path, nodes, per_node), **env,
                              "SRUN_LOG": str(log)})
    assert ran.returncode == 0, ran.stderr
    return ran, log.read_text()


def test_slurm_uneven_plan_keeps_ranks_on_their_nodes(runner, tmp_path):
    """12 ranks on 8-GPU nodes: Slurm's block distribution would balance 12 tasks as
    6 + 6, putting ranks 6-7 on the second node and splitting the plan's 4x3 row group
    [4..7] across nodes. The script asks for 8 + 8 tasks and the 4 surplus ranks exit;
    run with stand-ins, ranks 0-11 start with WORLD_SIZE 12, rank k on node k // 8 (and
    srun does not end the job when the surplus tasks exit: --wait=0)."""
    plan = _alexnet_plan(runner, tmp_path, 12, 384)
    out = invoke(runner, "launch", plan, "--emit", "slurm")
    assert out.exit_code == 0, out.stderr
    assert "#SBATCH --ntasks=16\n#SBATCH --ntasks-per-node=8\n" in out.stdout
    # srun ends the job a site's WaitTime after the first task exits; the surplus
    # tasks exit at once, so the script waits for every task
    assert "srun --kill-on-bad-exit=1 --wait=0 --cpus-per-task=" in out.stdout
    # whole nodes, their CPUs shared by the tasks (srun's default is one CPU a task)
    assert "#SBATCH --exclusive\n" in out.stdout
    # the script's own arguments reach the program (an operator's --device, --out)
    ran, log = _run_job(tmp_path, out.stdout, 2, 8,
                        {"SLURM_NTASKS": "16", "SLURM_CPUS_ON_NODE": "112"}, "--out", "a dir")
    lines = ran.stdout.splitlines()
    assert lines == [f"rank={k} local={k % 8} node={k // 8} world=12 train.py --plan {plan} "
                     "--out a dir" for k in range(12)]
    assert log.startswith("--kill-on-bad-exit=1 --wait=0 --cpus-per-task=14 ")


def test_slurm_cpus_per_task(runner, tmp_path):
    """A job of part of a node (4 of a DGX's 8 GPUs) shares the node with other jobs and
    is not --exclusive, so SLURM_CPUS_ON_NODE counts the CPUs Slurm gave it, by default
    one a task: the script says so, launch notes it (advice: --strict does not fail on it,
found by an audit), and --cpus-per-task N asks sbatch and
    srun for N. Given for whole nodes it replaces the equal share; other emitters refuse
    it (exit 2), since they have nowhere to put it."""
    plan = _alexnet_plan(runner, tmp_path, 4, 128)
    out = invoke(runner, "launch", plan, "--emit", "slurm")
    assert out.exit_code == 0, out.stderr
    assert "#SBATCH --exclusive" not in out.stdout
    assert "#SBATCH --cpus-per-task" not in out.stdout
    assert "# part of a node: each task gets Slurm's default CPUs" in out.stdout
    assert out.stderr == (f"planner: note: {plan}: the job takes part of each node (4 "
                          "of 8 devices), so each task gets Slurm's default CPUs, often "
                          "one, for its data loading; --cpus-per-task N asks for N\n")
    assert invoke(runner, "launch", plan, "--emit", "slurm", "--strict").exit_code == 0
    out = invoke(runner, "launch", plan, "--emit", "slurm", "--cpus-per-task", "12")
    assert out.exit_code == 0 and out.stderr == "", out.stderr
    assert "#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n" \
        "#SBATCH --cpus-per-task=12\n" in out.stdout
    assert "default CPUs" not in out.stdout
    # the job holds 56 CPUs here, more than the 48 asked (a site that allocates whole
    # cores rounds up): srun asks for the 12 given, not a share of SLURM_CPUS_ON_NODE
    ran, log = _run_job(tmp_path, out.stdout, 1, 4, {
        "SLURM_NTASKS": "4", "SLURM_CPUS_ON_NODE": "56", "SLURM_JOB_ID": "7"})
    assert log.startswith("--kill-on-bad-exit=1 --cpus-per-task=12 bash -c ")
    assert len(ran.stdout.splitlines()) == 4
    whole = invoke(runner, "launch", CI / "plans" / "resnet50-dgx-64.yaml", "--emit",
                   "slurm", "--cpus-per-task", "14")
    assert whole.exit_code == 0 and whole.stderr == ""
    assert "#SBATCH --exclusive\n#SBATCH --cpus-per-task=14\n" in whole.stdout
    assert "\nCPUS=14\n" in whole.stdout and "SLURM_CPUS_ON_NODE" not in whole.stdout
    for kind in ("torchrun", "env", "megatron"):
        bad = invoke(runner, "launch", plan, "--emit", kind, "--cpus-per-task", "8")
        assert bad.exit_code == 2 and "--emit " + kind + " has no place" in bad.stderr
    bad = invoke(runner, "launch", plan, "--emit", "slurm", "--cpus-per-task", "0")
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr


def test_slurm_on_cpus_asks_for_no_gpus_and_a_plan_that_does_not_fit_warns(runner,
                                                                          tmp_path):
    """sbatch refuses --gpus-per-node on a partition without GPUs (Cori's KNL nodes);
    a plan written by `cost` for a layout that does not fit launches with a warning."""
    knl, dgx = tmp_path / "knl.yaml", tmp_path / "dgx.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/cori-knl.yaml", "-p", "4", "-b", "64", "-o", knl)
    assert r.exit_code == 0, r.stderr
    assert yaml.safe_load(knl.read_text())["placement"]["device_kind"] == "cpu"
    out = invoke(runner, "launch", knl, "--emit", "slurm")
    assert out.exit_code == 0 and "--gpus-per-node" not in out.stdout
    assert "#SBATCH --ntasks-per-node=1\n" in out.stdout and out.stderr == ""
    r = invoke(runner, "cost", EXAMPLES / "networks/gpt2-small.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "8", "-b", "4096", "-o", dgx)
    assert r.exit_code == 1, r.stderr  # does not fit
    out = invoke(runner, "launch", dgx, "--emit", "slurm")
    assert out.exit_code == 0 and "#SBATCH --gpus-per-node=8\n" in out.stdout
    assert out.stderr == (f"planner: warning: {dgx}: the plan does not fit in memory "
                          "(memory.fits: false): its ranks will run out of device memory; "
                          "`planner plan` finds one that fits\n")
    out = invoke(runner, "launch", dgx, "--emit", "slurm", "--strict")
    assert out.exit_code == 1 and not out.stdout
    assert out.stderr.startswith(f"planner: error: {dgx}: the plan does not fit in memory")


def test_launch_does_not_overwrite_the_program(runner, tmp_path, monkeypatch):
    """-o naming the training program (the --script default is train.py) is refused, and
    the program is kept; an empty --script or -o is a usage error."""
    monkeypatch.chdir(tmp_path)
    program = tmp_path / "train.py"
    program.write_text("print(1)\n")
    plan = CI / "plans" / "resnet50-dgx-64.yaml"
    result = invoke(runner, "launch", plan, "-o", "train.py")
    assert result.exit_code == 2
    assert "refusing to write train.py: it is one of this command's inputs" in result.stderr
    assert program.read_text() == "print(1)\n"
    result = invoke(runner, "launch", plan, "--script", "")
    assert result.exit_code == 2 and "the training program is empty" in result.stderr
    result = invoke(runner, "launch", plan, "-o", "")
    assert result.exit_code == 2 and "the output file name is empty" in result.stderr


def test_plan_of_another_network_says_so(runner, tmp_path):
    """A configuration pointing at a plan made for another network: the finding names
    both networks, not 'the network file changed'."""
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "64", "-b", "2048", "-o", plan)
    assert r.exit_code == 0, r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_config("p.yaml"))
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert "the plan was made for the network 'alexnet'" in result.stdout
    assert "not 'resnet50'" in result.stdout and "changed since" not in result.stdout


def test_launch_rejects_non_plans(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = invoke(runner, "launch", "examples/networks/alexnet.yaml")
    assert result.exit_code == 2
    assert result.stderr.startswith("examples/networks/alexnet.yaml:5:1: error: not a plan "
                                    "with a placement")


@pytest.mark.parametrize(("old", "new", "said"), [
    ("  devices: 64\n", "  devices: 64.5\n", "expected a whole number from 1 to 2^30, got "
                                             "64.5"),
    ("  nodes: 8\n", "  nodes: 9\n", "64 devices at 8 a node take 8 nodes, not 9"),
    ("  devices: 64\n", "  devices: 60\n", "60 here, but the problem says gpus: 64: the "
                                           "plan was edited"),
    ("  - grid: [1, 64]\n", "  - grid: [3, 5]\n", "grid 3x5 has 15 devices, the plan 64"),
    ("  - grid: [1, 64]\n", "  - grid: 1x64\n", "expected the grid as [P_r, P_c], two whole "
                                                "numbers >= 1, got '1x64'"),
    ("    placement: rows\n", "    placement: diagonal\n", "expected placement rows or "
                                                          "cols, got 'diagonal'"),
    ("  grids:\n", "  grids: 5\n  old_grids:\n", "expected a list of grids, got int"),
])
def test_launch_points_at_a_bad_placement(runner, tmp_path, old, new, said):
    text = (CI / "plans" / "resnet50-dgx-64.yaml").read_text()
    start = text.index("placement:\n")
    at = text.index(old, start)
    bad = tmp_path / "p.yaml"
    bad.write_text(text[:at] + new + text[at + len(old):])
    result = invoke(runner, "launch", bad)
    assert result.exit_code == 2
    line = text[:at].count("\n") + 1
    assert result.stderr.startswith(f"{bad}:{line}:"), result.stderr
    assert said in result.stderr.splitlines()[0]


def test_launch_checks_the_layers_against_the_placement(runner, tmp_path):
    """The ranks build their groups from the placement, Megatron-LM's arguments from the
    layers: an edit to one and not the other launched one layout and priced another.
    A layer's grid that its placement grid does not say, a grid of another device
    count (five shown, then how many more), an unknown mode, a stage's first rank and
    a stage without a grid are input errors at their line (exit 2), from `launch` and
    `validate` alike."""
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "cost", EXAMPLES / "networks/gpt2-small.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "16", "-b", "64", "--grid", "2x8",
               "--mode", "megatron", "-o", plan)
    assert r.exit_code == 0, r.stderr
    text = plan.read_text()
    layers = text.index("\nlayers:\n")

    def refused(new_text, *said):
        bad = tmp_path / "bad.yaml"
        bad.write_text(new_text)
        for cmd in (("launch", bad), ("validate", bad)):
            out = invoke(runner, *cmd)
            assert out.exit_code == 2 and "Traceback" not in out.output, out.output
            for words in said:
                assert words in out.stderr, out.stderr
        return out.stderr

    # one layer (the first weighted one after the placement) edited
    at = text.index("  grid: [2, 8]\n", layers)
    line = text[:at].count("\n") + 1
    said = refused(text[:at] + "  grid: [4, 4]\n" + text[at + 15:],
                   "layer 'wte' is 4x4 rows here but 2x8 rows in $.placement.grids[0]")
    assert said.startswith(f"{tmp_path / 'bad.yaml'}:{line}:"), said
    said = refused(text[:layers] + text[layers:].replace("  grid: [2, 8]\n",
                                                         "  grid: [3, 3]\n"),
                   "grid 3x3 has 9 devices, a stage 16",
                   "and 120 more layers like these, from this one on")
    assert said.count("error:") == 6
    at = text.index("  mode: column\n", layers)
    refused(text[:at] + "  mode: colum\n" + text[at + 15:], "got 'colum'")
    refused(text.replace("  batch: 64\n", "  batch: 0\n", 1),
            "expected the step's samples, a whole number >= 1, got 0")
    group = "    row_groups:\n      count: 8\n      size: 2\n"
    refused(text.replace(group, group.replace("size: 2", "size: 3"), 1),
            "grid 2x8 has 2 for row_groups.size, not 3")
    at = text.index("    layers:\n", text.index("\nplacement:\n"))
    end = text.index("    row_groups:\n", at)
    refused(text[:at] + "    layers: []\n" + text[end:],
            "expected the names of the grid's layers, got none")
    assert invoke(runner, "launch", plan).exit_code == 0
    piped = tmp_path / "piped.yaml"
    r = invoke(runner, "cost", EXAMPLES / "networks/gpt2-small.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "16", "-b", "64", "--grid", "2x4",
               "--mode", "megatron", "--pipeline", "2", "--microbatches", "4", "-o", piped)
    assert r.exit_code == 0, r.stderr
    text = piped.read_text()
    refused(text.replace("first_rank: 8\n", "first_rank: 3\n"),
            "stage 1 starts at rank 8 (8 ranks a stage), not 3")
    refused(text.replace("- stage: 1\n", "- stage: 0\n").replace("first_rank: 8\n",
                                                                  "first_rank: 0\n"),
            "no grid for pipeline stage 1")
    # found by an audit of bad inputs: a layer's name that is a list crashed validate,
    # launch and check (exit 3); problem settings edited to anything were called stale
    # by check (exit 1) or printed into Megatron-LM's refusal
    at = text.index("  name: wte\n", text.index("\nlayers:\n"))
    refused(text[:at] + "  name: [1, 2]\n" + text[at + 12:],
            "expected the layer's name as text, got [1, 2]")
    for key, said in (("recompute", "expected none, auto, blocks or a number of blocks, "
                                    "got 'banana'"),
                      ("algorithm", "expected cluster default or one of auto, ring, tree, "
                                    "recursive, hierarchical, got 'banana'"),
                      ("estimator", "expected mlp or roofline (what timed the kernels), "
                                    "got 'banana'"),
                      ("gpus", "expected a whole number >= 1, got 'banana'")):
        edited = re.sub(rf"\n  {key}: [^\n]*\n", f"\n  {key}: banana\n", text, count=1)
        assert edited != text, key
        said_at = refused(edited, said, f"(at $.problem.{key})")
        line = edited[:edited.index(f"\n  {key}: banana\n") + 1].count("\n") + 1
        assert f"bad.yaml:{line}:" in said_at, (key, said_at)
    searched = tmp_path / "searched.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "8", "-b", "64", "-o", searched)
    assert r.exit_code == 0, r.stderr
    plan_text = searched.read_text()
    assert "\nobjective: time\n" in plan_text
    refused(plan_text.replace("\nobjective: time\n", "\nobjective: banana\n"),
            "expected time or comm (what the search minimised), got 'banana'")
    # found by an audit of the launch path, each accepted before:
    # the priced pipeline's microbatches edited apart from the question's
    at = text.index("  microbatches: 4\n", text.index("\npipeline:\n"))
    refused(text[:at] + "  microbatches: 8\n" + text[at + 18:],
            "8 here, but the problem says microbatches: 4")
    # a layer's grid removed (every layer's: validated ok, and torchrun emitted)
    refused(re.sub(r"\n  grid: \[\d+, \d+\]", "", text[layers:]).join(
        (text[:layers], "")), "layer 'wte' has no grid, where $.placement.grids[0] lists it")
    # nodes of another size, edited with a node count to match: the groups were priced
    # on 8-GPU nodes, as their counts say (a 2x4 grid by rows: column group r is ranks
    # r, r+2, r+4, r+6, all on one 8-GPU node, two a node on 4-GPU nodes)
    half = text.replace("  devices_per_node: 8\n", "  devices_per_node: 4\n")
    half = re.sub(r"\n  nodes: 2\n", "\n  nodes: 4\n", half)
    refused(half, "grid 2x4 (rows) on nodes of 4 devices has 2 for col_groups.per_node, "
                  "not 4")


@pytest.mark.parametrize("gpus", [1, 4])
def test_launch_one_partly_used_node(runner, tmp_path, gpus):
    """4 ranks of an 8-GPU node: torchrun starts 4 processes on 1 node; Slurm asks for
    4 tasks and 4 GPUs on it."""
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", str(gpus), "-b", "64", "-o", plan)
    assert r.exit_code == 0, r.stderr
    out = invoke(runner, "launch", plan, "--emit", "torchrun").stdout
    assert f"torchrun --standalone --nnodes=1 --nproc-per-node={gpus} " in out
    assert "NODE_RANK" not in out and "MASTER_ADDR" not in out  # one node: nothing to set
    out = invoke(runner, "launch", plan, "--emit", "slurm").stdout
    assert f"#SBATCH --ntasks={gpus}\n#SBATCH --ntasks-per-node={gpus}\n" \
           f"#SBATCH --gpus-per-node={gpus}\n" in out
    # a job of part of a node shares it: its rank 0 listened on 29500 as every other
    # such job's did (an audit); the default port comes from the job's id
    assert "--exclusive" not in out
    assert 'export MASTER_PORT="${MASTER_PORT:-$(( 15000 + SLURM_JOB_ID % 17000 ))}"\n' in out
    ran = subprocess.run(["bash", "-c", out.split("export MASTER_PORT=")[1].split("\n")[0]
                          .join(("export MASTER_PORT=", '\necho "$MASTER_PORT"'))],
                         capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "123456"})
    assert ran.stdout == f"{15000 + 123456 % 17000}\n", ran.stderr
    # --master-port on one node: --standalone took a free port whatever was asked
    out = invoke(runner, "launch", plan, "--emit", "torchrun", "--master-port", "1234").stdout
    assert "--standalone" not in out
    assert f"exec torchrun --nnodes=1 --nproc-per-node={gpus} --node-rank=0 \\\n" \
           "  --master-addr=localhost --master-port=1234 \\\n" in out


def test_torchrun_uneven_plan_runs_fewer_processes_on_the_last_node(runner, tmp_path):
    """12 ranks on 8-GPU nodes under torchrun: node 0 starts 8 processes and node 1
    starts 4. torchrun's elastic agent numbers a node's workers from the running total
    of the process counts of the nodes before it (``_assign_worker_ranks``: "cumulative
    sum of the local_world_size for all workers in front of it"), so ranks 8-11 land on
    node 1 as the plan places them; its identical-workers shortcut, which assumes equal
    counts, is unset. Run with a torchrun stand-in on each node."""
    plan = tmp_path / "p.yaml"
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "12", "-b", "384", "-o", plan)
    assert r.exit_code == 0, r.stderr
    out = invoke(runner, "launch", plan, "--emit", "torchrun")
    assert out.exit_code == 0, out.stderr
    assert "# the last node runs 4 processes" in out.stdout
    script = tmp_path / "run.sh"
    script.write_text(out.stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/bash\necho "identical=${TORCH_ELASTIC_WORKER_IDENTICAL:-unset} '
                    '$*"\n')
    fake.chmod(0o755)
    seen = []
    for node in (0, 1):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "NODE_RANK": str(node), "MASTER_ADDR": "node0",
               "TORCH_ELASTIC_WORKER_IDENTICAL": "1"}
        env.pop("MASTER_PORT", None)
        ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
        assert ran.returncode == 0, ran.stderr
        seen.append(ran.stdout.strip())
    assert seen == [f"identical=unset --nnodes=2 --nproc-per-node={n} --node-rank={node} "
                    f"--master-addr=node0 --master-port=29500 train.py --plan {plan}"
                    for node, n in ((0, 8), (1, 4))]
    # a node rank that is no node's (found by an audit: 'abc' ran 8 processes after a
    # shell error) stops the script, as does one of 20 digits, which overflowed test's
    # integers into a false comparison and started torchrun on it (an audit); the
    # script's arguments reach the program
    for bad in ("abc", "2", "-1", "99999999999999999999"):
        env["NODE_RANK"] = bad
        ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
        assert ran.returncode == 2 and ran.stdout == ""
        assert f"NODE_RANK must be a node index, 0..1; got {bad}" in ran.stderr
    env["NODE_RANK"] = "1"
    ran = subprocess.run(["bash", str(script), "--device", "cpu"], capture_output=True,
                         text=True, env=env)
    assert ran.stdout.strip().endswith(f"train.py --plan {plan} --device cpu")


def test_an_explicit_master_port_is_kept(runner, tmp_path, monkeypatch):
    """Left out, --master-port is a default that MASTER_PORT where the script runs
    overrides; given, it is written as it is (torchrun, Slurm)."""
    monkeypatch.chdir(ROOT)
    plan = "examples/ci/plans/resnet50-dgx-64.yaml"
    out = invoke(runner, "launch", plan).stdout
    assert '--master-port="${MASTER_PORT:-29500}"' in out
    out = invoke(runner, "launch", plan, "--master-port", "12345").stdout
    assert '--master-port="12345"' in out and "MASTER_PORT:-" not in out
    out = invoke(runner, "launch", plan, "--emit", "slurm", "--master-port", "12345").stdout
    assert "export MASTER_PORT=12345\n" in out


def test_the_env_file_keeps_a_master_port_set_where_it_is_read(runner, tmp_path, monkeypatch):
    """`env`'s MASTER_PORT, as torchrun's and Slurm's: a default that the environment
    where the file is sourced overrides, unless --master-port named it (the env file
    replaced a port the job had chosen; found by the launch audit)."""
    monkeypatch.chdir(ROOT)
    plan = "examples/ci/plans/resnet50-dgx-64.yaml"

    def sourced(text: str, port: str | None) -> str:
        path = tmp_path / "plan.env"
        path.write_text(text)
        env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
        if port is not None:
            env["MASTER_PORT"] = port
        ran = subprocess.run(["bash", "-c", f'set -a; . {path}; set +a; echo "$MASTER_PORT"'],
                             capture_output=True, text=True, env=env, check=True)
        return ran.stdout.strip()

    out = invoke(runner, "launch", plan, "--emit", "env").stdout
    assert sourced(out, None) == "29500" and sourced(out, "23456") == "23456"
    out = invoke(runner, "launch", plan, "--emit", "env", "--master-port", "12345").stdout
    assert sourced(out, None) == "12345" and sourced(out, "23456") == "12345"


def test_launch_scripts_cannot_be_injected_through_names(runner, tmp_path):
    """A newline in the network's name or the plan's path ended a comment line of the
    script and made the rest a command (between #SBATCH lines, so sbatch ignored the
    ones after it)."""
    net = tmp_path / "net.yaml"
    text = (EXAMPLES / "networks" / "alexnet.yaml").read_text()
    net.write_text(re.sub(r"(?m)^name: .*$", 'name: "alex\\\\necho INJECTED"', text, count=1))
    plan = tmp_path / "plan\necho PWNED.yaml"
    r = invoke(runner, "plan", net, EXAMPLES / "clusters" / "dgx-h100.yaml", "-p", "16",
               "-b", "64", "-o", plan, "--estimator", "roofline")
    assert r.exit_code == 0, r.stderr
    for emit in ("slurm", "torchrun", "env"):
        r = invoke(runner, "launch", plan, "--emit", emit)
        assert r.exit_code == 0, r.stderr
        # the path may appear shell-quoted (a newline inside quotes is data); elsewhere
        # no line may start a command of its own
        rest = r.stdout.replace(shlex.quote(str(plan)), "'PLAN'")
        for line in rest.splitlines():
            assert not line.startswith("echo"), (emit, line)
        if emit == "slurm":
            assert "#SBATCH --job-name=planner-alex_echo_INJECTED\n" in r.stdout


@pytest.mark.parametrize(("old", "new", "said"), [
    ("\ninputs:\n", "\ninputs: 5\nold_inputs:\n", "expected the files the plan was made "
                                                    "from (a mapping: network and cluster"),
    # launch -o wrote over the network file of a plan whose inputs were edited so, and
    # validate passed it (an audit)
    ("    file: ", "    file: [a, b]\n    old: ",
     "expected the network's file as text, got ['a', 'b']"),
    ("    file: ", "    file: 5\n    old: ", "expected the network's file as text, got 5"),
    ("  network:\n", "  network: 5\n  old_network:\n",
     "expected the network file the plan was made from (a mapping with its file, name and "
     "sha256), got 5"),
    ("    sha256: ", "    old: ", "the network entry lacks its sha256"),
    ("\nlayers:\n", "\nlayers: 5\nold_layers:\n", "expected the plan's layers (a list of "
                                                    "mappings), got 5"),
    ("\nlayers:\n", "\nlayers:\n- null\n", "expected a layer (a mapping), got null"),
    ("  - grid: [1, 64]\n", "  - grid: []\n", "expected the grid as [P_r, P_c]"),
    # the problem's settings, each of its kind (check called them a stale plan, exit 1;
    # validate and launch passed them: found by an audit)
    ("  optimizer: momentum\n", "  optimizer: adamw\n",
     "expected one of sgd, momentum, adam, got 'adamw'"),
    ("  overlap: gradients\n", "  overlap: bogus\n", "expected one of none, gradients"),
    ("  master_weights: false\n", "  master_weights: 'no'\n", "expected true or false"),
    ("  batch: 2048\n", "  batch: 2048\n  microbatches: 3\n",
     "3 microbatches do not divide the batch of 2048"),
    ("\nproblem:\n", "\nproblem: []\nold_problem:\n", "expected the plan's problem"),
    ("  fits: true\n", "  fits: 'false'\n", "expected true or false, got 'false'"),
    ("  models:\n    sha256: ", "  models:\n    sha256: null\n    old: ",
     "expected the kernel models' digest, {sha256: <64 hex digits>}, got a mapping"),
    ("  batch: 2048\n", "  batch: 2048\n  pipeline: 2\n",
     "expected the pipeline as a mapping (stages: S, ...), got 2"),
    ("  - grid: [1, 64]\n", "  - grid: [1.5, 64]\n", "two whole numbers >= 1, got [1.5, 64]"),
    ("    layers:\n    - conv1\n", "    layers:\n    - nope\n    - conv1\n",
     "lists 'nope', which is not among the plan's layers"),
    ("\nlayers:\n- name: conv1\n", "\nlayers:\n- name: conv1\n  type: conv2d\n"
     "  mode: data\n  grid: [1, 64]\n  placement: rows\n- name: conv1\n",
     "layer 'conv1' is listed twice"),
    ("  grid: [1, 64]\n", "  grid: [1, 64]\n  follows: nothing\n",
     "has weights of its own: the plan gives it a layout, not a neighbour's"),
])
def test_malformed_plans_are_input_errors(runner, tmp_path, old, new, said):
    """check, validate and launch on an edited plan: exit 2 at the line, never an
    internal error (they were TypeError / AttributeError / IndexError, exit 3), and never
    a pass or a stale plan (exit 1) for a value that is not of its kind."""
    text = (CI / "plans" / "resnet50-dgx-64.yaml").read_text()
    at = text.index(old)
    (tmp_path / "plans").mkdir()
    bad = tmp_path / "plans" / "resnet50-dgx-64.yaml"
    bad.write_text(text[:at] + new + text[at + len(old):])
    config = tmp_path / "ci.yaml"
    config.write_text((CI / "resnet50-dgx.yaml").read_text().replace(
        "../networks/", f"{EXAMPLES}/networks/").replace("../clusters/",
                                                        f"{EXAMPLES}/clusters/"))
    commands = [["check", config]] + ([["validate", bad], ["launch", bad]]
                                      if "follows" not in new else [])
    for args in commands:
        r = invoke(runner, *args)
        assert r.exit_code == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith(f"{bad}:") and said in r.stderr, (args, r.stderr)


def test_a_plan_that_parts_tied_layers_fails(runner, tmp_path):
    """A plan made before tied layers kept one layout could give GPT-2's lm_head another
    layout than the wte table it shares: check says so (exit 1) rather than pass it."""
    plan = tmp_path / "plans" / "gpt2.yaml"
    plan.parent.mkdir()
    gpt2 = [EXAMPLES / "networks/gpt2-small.yaml", EXAMPLES / "clusters/dgx-h100.yaml"]
    assert invoke(runner, "plan", *gpt2, "-p", "64", "-b", "64", "-o", plan).exit_code == 0
    cfg = tmp_path / "ci" / "c.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"kind: training\nnetwork: {gpt2[0]}\ncluster: {gpt2[1]}\ngpus: 64\n"
                   "batch: 64\nstrategy: {plan: ../plans/gpt2.yaml}\n")
    assert invoke(runner, "check", cfg).exit_code == 0
    text = plan.read_text()
    # the plan splits the table by vocabulary rows and the head alike (model, column) on
    # one grid of at least two rows
    found = re.search(r"- name: lm_head\n  type: linear\n  in_features: 768\n"
                      r"  out_features: 50257\n  mode: column\n"
                      r"  grid: \[(\d+), (\d+)\]\n", text)
    assert found and int(found[1]) >= 2
    pr, pc = found[1], found[2]
    head = found[0]
    assert text.count(f"- name: wte\n  type: embedding\n  mode: model\n  grid: [{pr}, {pc}]\n") == 1
    plan.write_text(text.replace(head, head.replace(f"mode: column\n  grid: [{pr}, {pc}]",
                                                    "mode: data\n  grid: [1, 64]")))
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert ("layer 'lm_head' shares its weights with 'wte' (tie), so one layout serves both, "
            f"but the plan gives it data 1x64 and 'wte' model {pr}x{pc}") in result.stdout


def test_launch_names_the_zero_setting(runner, tmp_path):
    """A plan's ZeRO setting reaches the launch text: a comment naming FSDP's sharding
    strategy where it has one, and PLANNER_ZERO / PLANNER_ZERO_SHARD for the script; a
    stage the planner does not know is an error at its line."""
    net, cl = EXAMPLES / "networks" / "gpt2-small.yaml", EXAMPLES / "clusters" / "dgx-h100.yaml"
    plan = tmp_path / "p.yaml"
    for zero, shard, fsdp in (("3", "node", "HYBRID_SHARD"), ("2", "all", "SHARD_GRAD_OP"),
                              ("1", "node", None)):
        r = invoke(runner, "plan", net, cl, "-p", "16", "-b", "16", "--optimizer", "adam",
                   "--zero", zero, "--zero-shard", shard, "-o", plan, "--format", "yaml")
        assert r.exit_code == 0, r.stderr
        out = invoke(runner, "launch", plan, "--emit", "env").stdout
        assert f"PLANNER_ZERO={zero}\nPLANNER_ZERO_SHARD={shard}\n" in out
        where = "within each node" if shard == "node" else "over all replicas"
        line = next(x for x in out.splitlines() if x.startswith("# ZeRO"))
        assert line == f"# ZeRO stage {zero} {where}" + (
            f" (PyTorch FSDP: ShardingStrategy.{fsdp})" if fsdp else "")
    text = plan.read_text()
    plan.write_text(text.replace("  zero: 1\n", "  zero: 7\n"))
    r = invoke(runner, "launch", plan)
    line = text[:text.index("  zero: 1\n")].count("\n") + 1
    assert r.exit_code == 2 and r.stderr.startswith(f"{plan}:{line}:"), r.stderr
    assert "expected a ZeRO stage 0-3, got 7" in r.stderr


def test_check_on_a_network_or_cluster_file_says_what_it_is(runner):
    """Given a network or cluster file instead of a training configuration, check says
    so at its kind (exit 2), not that the configuration's keys are missing."""
    for path, kind, other in ((EXAMPLES / "networks" / "alexnet.yaml", "network", "cluster"),
                              (EXAMPLES / "clusters" / "dgx-h100.yaml", "cluster", "network")):
        r = invoke(runner, "check", path)
        assert r.exit_code == 2
        assert (f"this is a {kind} file, not a training configuration; a configuration "
                f"names it as '{kind}: FILE', with '{other}', 'gpus' and 'batch'") in r.stderr
        assert "missing required key" not in r.stderr


def test_training_non_string_pins_and_a_fraction_of_a_byte(runner, tmp_path):
    """Each entry of ``strategy.pins`` that is not a string is reported at its own line
    (it was reported once, at the list's first line); a bucket of less than one byte is
    refused (it would mean one bucket per collective and read back as 0 or 1)."""
    cfg = tmp_path / "pins.yaml"
    cfg.write_text("kind: training\n"
                   f"network: {EXAMPLES / 'networks' / 'alexnet.yaml'}\n"
                   f"cluster: {EXAMPLES / 'clusters' / 'dgx-h100.yaml'}\n"
                   "gpus: 16\nbatch: 256\nbucket_size: 0.4 B\nstrategy:\n  pins:\n"
                   "    - 'conv*=data'\n"
                   "    - 5\n"
                   "    - {fc: model}\n")
    result = invoke(runner, "validate", str(cfg))
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = [x for x in result.stderr.splitlines() if ": error: " in x]
    assert lines == [
        f"{cfg}:6:14: error: '0.4 B' is less than one byte; use 0 for one bucket per layer, "
        "or a size such as '25 MiB' (at $.bucket_size)",
        f"{cfg}:10:7: error: expected a pin string 'GLOB=MODE[:PRxPC[:rows|cols]]', got 5 (at "
        "$.strategy.pins[1])",
        f"{cfg}:11:7: error: expected a pin string 'GLOB=MODE[:PRxPC[:rows|cols]]', got a "
        "mapping (at $.strategy.pins[2])"], result.stderr


def test_training_paths_that_are_directories(runner, tmp_path):
    """A folder where a file belongs is said to be one (it was reported 'not found')."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "plans").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"kind: training\nnetwork: nets\ncluster: {EXAMPLES / 'clusters'}\n"
                   "gpus: 8\nbatch: 8\nstrategy: {plan: plans}\n")
    result = invoke(runner, "check", str(cfg))
    assert result.exit_code == 2
    lines = [x for x in result.stderr.splitlines() if ": error: " in x]
    assert lines == [
        f"{cfg}:2:10: error: network 'nets' is a directory; name the network YAML file in it "
        f"(paths are relative to the configuration's folder, {tmp_path}) (at $.network)",
        f"{cfg}:3:10: error: cluster '{EXAMPLES / 'clusters'}' is a directory; name the "
        f"cluster YAML file in it (paths are relative to the configuration's folder, "
        f"{tmp_path}) (at $.cluster)",
        f"{cfg}:6:18: error: plan 'plans' is a directory; name the plan file in it (at "
        "$.strategy.plan)"], result.stderr
    # a device or a named pipe exists: it is not 'not found' either (an audit)
    os.mkfifo(tmp_path / "pipe")
    cfg.write_text("kind: training\nnetwork: /dev/null\ncluster: pipe\n"
                   "gpus: 8\nbatch: 8\nstrategy: {plan: /dev/null}\n")
    result = invoke(runner, "check", str(cfg))
    assert result.exit_code == 2
    assert [x for x in result.stderr.splitlines() if ": error: " in x] == [
        f"{cfg}:2:10: error: network file '/dev/null' is not a regular file; name the network "
        "YAML file (at $.network)",
        f"{cfg}:3:10: error: cluster file 'pipe' is not a regular file; name the cluster YAML "
        "file (at $.cluster)",
        f"{cfg}:6:18: error: plan file '/dev/null' is not a regular file; name the plan's "
        "YAML file (at $.strategy.plan)"], result.stderr


@pytest.mark.parametrize(("edit", "said"), [
    (("gpus: 16", "gpus: 16"), None),
    (("conv*=data", "nomatch*=data"), ":6:19: error: pin 'nomatch*=data' matches no layer "
                                      "of 'alexnet' (at $.strategy.pins[0])"),
    (("gpus: 16", "gpus: 2048"), ":4:7: error: gpus=2048 is more than the cluster has (1024) "
                                 "(at $.gpus)"),
    (("network: NET", "network: bad.yaml"), "bad.yaml:5:5: error: duplicate layer name 'fc'"),
])
def test_validate_finds_what_check_would(runner, tmp_path, edit, said):
    """``validate`` on a training configuration loads the network, cluster and plan it
    names and resolves its strategy, so an input error ``check`` would stop at (exit 2)
    is found there too; it said "ok" to all three of these."""
    (tmp_path / "bad.yaml").write_text(
        "kind: network\ninput: [8]\nlayers:\n  - {name: fc, type: linear, out_features: 8}\n"
        "  - {name: fc, type: linear, out_features: 8}\n")
    text = ("kind: training\nnetwork: NET\ncluster: "
            f"{EXAMPLES / 'clusters' / 'dgx-h100.yaml'}\ngpus: 16\nbatch: 256\n"
            "strategy: {pins: ['conv*=data']}\n")
    text = text.replace(*edit).replace("NET", str(EXAMPLES / "networks" / "alexnet.yaml"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    for command in ("validate", "check"):
        result = invoke(runner, command, str(cfg))
        if said is None:
            assert result.exit_code in (0, 1), result.stderr  # valid: check may fail it
            continue
        assert result.exit_code == 2, (command, result.stdout)
        assert said in result.stderr, (command, result.stderr)


def test_min_mfu(runner, tmp_path):
    """``min_mfu``: the strategy's predicted model FLOPs utilisation, as its plan
    reports it (the network's FLOPs over the devices' peak), must reach it. ResNet-50's
    committed plan predicts the MFU its iteration records; a floor just under passes,
    one just over fails (exit 1, annotated at the key's line), and one outside (0, 1]
    is an input error at its file, line and column (exit 2)."""
    (tmp_path / "plans").mkdir()
    shutil.copy(CI / "plans" / "resnet50-dgx-64.yaml", tmp_path / "plans" / "p.yaml")
    recorded = yaml.safe_load((CI / "plans" / "resnet50-dgx-64.yaml").read_text())
    mfu = recorded["iteration"]["mfu"]  # rounded to 4 digits
    cfg = tmp_path / "c.yaml"
    text = _config("plans/p.yaml")
    cfg.write_text(text + f"min_mfu: {mfu * 0.999:.5f}\n")
    result = invoke(runner, "check", cfg, "--format", "json")
    assert result.exit_code == 0, result.stdout
    found = {c["check"]: c for c in json.loads(result.stdout)["configs"][0]["checks"]}
    assert found["efficiency"]["ok"] and found["efficiency"]["line"] == 7
    # the column too, as the text and github formats give it (an audit found JSON gave
    # only the line)
    assert found["efficiency"]["column"] == 1 and found["plan"]["column"] == 12  # {plan: ...
    assert found["efficiency"]["mfu"] == pytest.approx(mfu, rel=1e-3)
    cfg.write_text(text + f"min_mfu: {mfu * 1.001:.5f}\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    # 0.1% apart: shown with the decimals that tell them apart (34.56% under 34.59%)
    shown = re.search(r"predicted MFU (\d+\.\d\d)% .* under the (\d+\.\d\d)% required",
                      result.stdout)
    assert shown and float(shown[1]) == pytest.approx(mfu * 100, abs=0.01), result.stdout
    assert float(shown[2]) == pytest.approx(mfu * 100.1, abs=0.006)
    cfg.write_text(text + "min_mfu: 1.5\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 2 and "c.yaml:7:10" in result.stderr, result.stderr


def test_launch_warns_when_the_plan_s_inputs_changed(runner, tmp_path, monkeypatch):
    """A plan whose network file was edited after planning was launched silently (found
    by an audit); `check` re-prices it, and launch now says so on standard error. A file
    the plan names that is not found where launch runs is not judged."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLES / "networks/alexnet.yaml", "net.yaml")
    r = invoke(runner, "plan", "net.yaml", EXAMPLES / "clusters/dgx-h100.yaml", "-p", "8",
               "-b", "256", "-o", "plan.yaml")
    assert r.exit_code == 0, r.stderr
    r = invoke(runner, "launch", "plan.yaml")
    assert r.exit_code == 0 and "warning" not in r.stderr
    with open("net.yaml", "a") as fh:
        fh.write("# edited\n")
    r = invoke(runner, "launch", "plan.yaml")
    assert r.exit_code == 0 and r.stdout.startswith("#!/usr/bin/env bash")
    assert ("planner: warning: plan.yaml: its network file net.yaml has changed since the "
            "plan was made") in r.stderr
    os.remove("net.yaml")
    r = invoke(runner, "launch", "plan.yaml")
    assert r.exit_code == 0 and "warning" not in r.stderr
    # not judged, and said so (an audit found the silence read as a pass)
    assert ("planner: note: plan.yaml: its network file net.yaml is not found here or "
            "beside the plan, so whether it changed since the plan was made is not "
            "checked") in r.stderr
    # launched from elsewhere, the file beside the plan is found and judged
    (tmp_path / "sub").mkdir()
    shutil.copy(EXAMPLES / "networks/alexnet.yaml", tmp_path / "sub" / "net.yaml")
    shutil.move("plan.yaml", tmp_path / "sub" / "plan.yaml")
    r = invoke(runner, "launch", "sub/plan.yaml")
    assert r.exit_code == 0 and "warning" not in r.stderr and "note" not in r.stderr
    with open(tmp_path / "sub" / "net.yaml", "a") as fh:
        fh.write("# edited\n")
    r = invoke(runner, "launch", "sub/plan.yaml")
    assert "its network file sub/net.yaml has changed since the plan was made" in r.stderr
    # --strict: an error, exit 1, and nothing written (for CI and wrappers)
    r = invoke(runner, "launch", "sub/plan.yaml", "--strict", "-o", "run.sh")
    assert r.exit_code == 1 and not r.stdout and not os.path.exists("run.sh")
    assert "planner: error: sub/plan.yaml: its network file sub/net.yaml has changed" \
        in r.stderr
    shutil.copy(EXAMPLES / "networks/alexnet.yaml", tmp_path / "sub" / "net.yaml")
    r = invoke(runner, "launch", "sub/plan.yaml", "--strict", "-o", "run.sh")
    assert r.exit_code == 0 and os.path.exists("run.sh") and "warning" not in r.stderr


def test_launch_without_the_plan_argument(runner, tmp_path, monkeypatch):
    """``--no-plan-arg``: the training program is not given ``--plan PLAN`` (Megatron-LM's
    ``pretrain_gpt.py`` exits on an argument it does not know; found by an audit); the
    plan's path is still exported as PLANNER_PLAN."""
    monkeypatch.chdir(tmp_path)
    r = invoke(runner, "plan", EXAMPLES / "networks/alexnet.yaml",
               EXAMPLES / "clusters/dgx-h100.yaml", "-p", "16", "-b", "256", "-o", "plan.yaml")
    assert r.exit_code == 0, r.stderr
    for kind in ("torchrun", "slurm"):
        with_arg = invoke(runner, "launch", "plan.yaml", "--emit", kind, "--script", "p.py")
        without = invoke(runner, "launch", "plan.yaml", "--emit", kind, "--script", "p.py",
                         "--no-plan-arg")
        assert with_arg.exit_code == without.exit_code == 0
        assert "p.py --plan plan.yaml" in with_arg.stdout
        assert "--plan" not in without.stdout.replace("--plan-arg", "")
        assert "export PLANNER_PLAN=plan.yaml" in without.stdout
        assert with_arg.stdout.replace(" --plan plan.yaml", "") == without.stdout
    r = invoke(runner, "launch", "plan.yaml", "--emit", "env", "--no-plan-arg")
    assert r.exit_code == 2 and "--emit env starts no training program" in r.stderr


def test_launch_paths_a_training_program_or_a_file_system_would_misread(runner, tmp_path,
                                                                         monkeypatch):
    """Found by an audit: a plan path starting with '-' was written as ``--plan -p.yaml``,
    which the training program's parser reads as an option (argparse: "expected one
    argument"), so every rank failed; it is written ``./-p.yaml``. A path that is not
    UTF-8 (the file system's bytes, \\xff) made ``-o`` fail with an internal error; the
    script names the file by its bytes. Options an emitter has no place for are refused,
    as ``--cpus-per-task`` and ``--no-plan-arg`` are, not dropped."""
    monkeypatch.chdir(tmp_path)
    plan = _alexnet_plan(runner, tmp_path, 16, 256)
    shutil.copy(plan, "-p.yaml")
    for kind in ("torchrun", "slurm", "env"):
        r = invoke(runner, "launch", "--emit", kind, "--", "-p.yaml")
        assert r.exit_code == 0, r.stderr
        assert "PLANNER_PLAN=./-p.yaml\n" in r.stdout and " -p.yaml" not in r.stdout
    out = invoke(runner, "launch", "--", "-p.yaml").stdout
    assert "train.py --plan ./-p.yaml \"$@\"" in out
    odd = os.fsdecode(b"pl\xffan.yaml")
    shutil.copy(plan, odd)
    r = invoke(runner, "launch", odd, "-o", "run.sh")
    assert r.exit_code == 0, r.stderr
    written = Path("run.sh").read_bytes()
    assert b"export PLANNER_PLAN='pl\xffan.yaml'\n" in written
    assert written.startswith(b"#!/usr/bin/env bash\n")
    assert subprocess.run(["bash", "-n", "run.sh"]).returncode == 0
    for args, option in ((("--emit", "env", "--script", "p.py"), "'--script'"),
                         (("--emit", "megatron", "--script", "p.py"), "'--script'"),
                         (("--emit", "megatron", "--master-port", "1234"),
                          "'--master-port'")):
        r = invoke(runner, "launch", "p.yaml", *args)
        assert r.exit_code == 2 and f"Invalid value for {option}" in r.stderr, r.stderr
        assert not r.stdout


def test_a_document_without_a_plan_is_named_so(runner, tmp_path, monkeypatch):
    """What ``plan --format yaml`` prints when nothing fits (``plan: null``, exit 1) was
    refused by validate and launch as "not a plan with a placement (make one with
    `planner plan ...`)", advice that had just failed (found by an audit)."""
    monkeypatch.chdir(ROOT)
    r = invoke(runner, "plan", "examples/networks/llama3-70b.yaml",
               "examples/clusters/dgx-h100.yaml", "-p", "8", "-b", "64", "--format", "yaml")
    assert r.exit_code == 1 and "plan: null" in r.stdout
    doc = tmp_path / "none.yaml"
    doc.write_text(r.stdout)
    line = r.stdout.splitlines().index("plan: null") + 1
    for command in ("validate", "launch"):
        out = invoke(runner, command, doc)
        assert out.exit_code == 2, out.output
        assert f"none.yaml:{line}:7: error: the document records that no plan was found " \
               "(no plan fits in memory" in out.stderr
        assert "nothing to launch until `planner plan` finds one" in out.stderr
        assert "Traceback" not in out.output


def test_a_figure_at_its_gate_shows_the_digits_that_fail_it(runner, tmp_path, monkeypatch):
    """Found by an audit: the plan document's MFU (4 digits) copied into min_mfu failed
    with "MFU 53.6% ... under the 53.6% required": the figure is shown with as many
    decimals as it takes to tell it from the limit. And a cluster file's errors, found
    while choosing the estimator, named it by its absolute path, which GitHub cannot
    attach to a repository file; they name it as the configuration does."""
    monkeypatch.chdir(tmp_path)
    plan = _alexnet_plan(runner, tmp_path, 8, 256)
    mfu = yaml.safe_load(plan.read_text())["iteration"]["mfu"]
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"kind: training\nnetwork: {EXAMPLES / 'networks/alexnet.yaml'}\n"
                   f"cluster: {EXAMPLES / 'clusters/dgx-h100.yaml'}\ngpus: 8\nbatch: 256\n"
                   f"min_mfu: {mfu}\nstrategy: {{plan: p.yaml}}\n")
    r = invoke(runner, "check", cfg, "--format", "json")
    got = next(f for f in json.loads(r.stdout)["configs"][0]["checks"]
               if f["check"] == "efficiency")
    text = invoke(runner, "check", cfg).stdout
    line = next(ln for ln in text.splitlines() if "[efficiency]" in ln)
    shown = re.search(r"predicted MFU ([\d.]+)% .* the ([\d.]+)% required", line)
    assert shown, line
    if got["ok"]:
        assert float(shown[1]) >= float(shown[2])
    else:  # under the limit: the two figures shown differ, and in the right order
        assert float(shown[1]) < float(shown[2]), line
    assert float(shown[1]) == pytest.approx(got["mfu"] * 100, abs=0.01)  # JSON: 4 digits
    from planner.training import _apart

    assert _apart(1.08105, 1.081, 3) == ("1.0811", "1.0810")  # the audit's slowdown
    assert _apart(1.2, 1.1, 3) == ("1.200", "1.100") and _apart(1.1, 1.1, 3)[0] == "1.100"
    # the cluster's errors, relative to here
    bad = tmp_path / "badcl.yaml"
    bad.write_text((EXAMPLES / "clusters/dgx-h100.yaml").read_text().replace(
        "bandwidth: 351.3", "bandwith: 351.3"))
    cbc = tmp_path / "cbc.yaml"
    cbc.write_text(f"kind: training\nnetwork: {EXAMPLES / 'networks/alexnet.yaml'}\n"
                   "cluster: badcl.yaml\ngpus: 8\nbatch: 8\nstrategy: {grid: 8x1}\n")
    r = invoke(runner, "check", "cbc.yaml", "--format", "github")
    assert r.exit_code == 2
    assert r.stdout.startswith("::error file=badcl.yaml,line=17,col=3,"), r.stdout


def test_the_summary_counts_the_invalid_too(runner, monkeypatch):
    """Found by an audit: with an invalid configuration among them, the text report left
    out its summary line; it counts the failed and the invalid ones (exit 2)."""
    monkeypatch.chdir(ROOT)
    r = invoke(runner, "check", "examples/ci/resnet50-dgx.yaml",
               "examples/ci/gpt2-does-not-fit.yaml", "examples/ci/broken.yaml")
    assert r.exit_code == 2
    assert r.stderr.endswith("planner check: 1 of 3 configurations failed, 1 invalid\n")


def test_a_plan_of_another_file_is_not_called_this_one_changed(runner, tmp_path,
                                                                monkeypatch):
    """Found by an audit: a plan made from mlpcopy.yaml, checked against mlp.yaml (the
    same network name, other bytes), was reported as "the network file mlp.yaml changed
    since the plan was made"; it names the file the plan was made from. An edit of the
    file the plan names is still "changed"."""
    monkeypatch.chdir(tmp_path)
    text = (EXAMPLES / "networks/alexnet.yaml").read_text()
    Path("copy.yaml").write_text(text + "# a copy\n")
    Path("net.yaml").write_text(text)
    r = invoke(runner, "plan", "copy.yaml", EXAMPLES / "clusters/dgx-h100.yaml", "-p", "8",
               "-b", "256", "-o", "p.yaml")
    assert r.exit_code == 0, r.stderr
    cfg = Path("c.yaml")
    cfg.write_text(f"kind: training\nnetwork: net.yaml\ncluster: "
                   f"{EXAMPLES / 'clusters/dgx-h100.yaml'}\ngpus: 8\nbatch: 256\n"
                   "strategy: {plan: p.yaml}\n")
    r = invoke(runner, "check", cfg)
    assert r.exit_code == 1
    assert "the plan was made from the network file copy.yaml, and net.yaml is not its " \
        "bytes" in r.stdout, r.stdout
    assert "changed since" not in r.stdout
    Path("copy.yaml").write_text(text + "# edited\n")
    cfg.write_text(cfg.read_text().replace("network: net.yaml", "network: copy.yaml"))
    r = invoke(runner, "check", cfg)
    assert r.exit_code == 1 and "the network file copy.yaml changed since the plan was " \
        "made" in r.stdout, r.stdout


def test_a_cluster_the_learned_models_do_not_cover_is_that_configuration_s_error(
        runner, monkeypatch):
    """``--estimator learned`` with a CPU cluster (AlexNet's on Cori KNL) is an error of
    that configuration, at its cluster key, reported after the other configuration's
    outcome (exit 2): it had stopped the check of both, nothing on standard output, no
    annotation (an audit)."""
    monkeypatch.chdir(ROOT)
    args = ("check", "examples/ci/resnet50-dgx.yaml", "examples/ci/alexnet-too-slow.yaml",
            "--estimator", "learned")
    r = invoke(runner, *args, "--format", "json")
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert [c["name"] for c in data["configs"]] == ["resnet50-dgx"]
    assert data["configs"][0]["ok"] is True
    [err] = data["errors"]
    assert err["file"] == "examples/ci/alexnet-too-slow.yaml" and err["line"] == 7
    assert "cori-knl is a cpu and the kernel models have no measurements of it" in \
        err["message"]
    r = invoke(runner, *args, "--format", "github")
    assert r.exit_code == 2
    assert "::error file=examples/ci/alexnet-too-slow.yaml,line=7,col=10," in r.stdout
