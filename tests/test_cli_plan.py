"""``planner plan``, ``compare`` and ``sweep`` from the command line."""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest
import yaml

from planner.units import format_bytes

from .conftest import CLUSTERS, NETWORKS, ROOT, invoke

ALEX = NETWORKS / "alexnet.yaml"
KNL = CLUSTERS / "cori-knl.yaml"
DGX = CLUSTERS / "dgx-h100.yaml"
PAPER = ["--cost-model", "gholami2018", "--objective", "comm", "--overlap", "none",
         "-p", "512", "-b", "2048", "--estimator", "roofline"]


def test_plan_paper_grids(runner):
    result = invoke(runner, "plan", ALEX, KNL, *PAPER, "--pin", "conv*=data", "--format",
                    "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    grids = {r["name"]: (r["mode"], r["grid"]) for r in doc["layers"] if "follows" not in r}
    assert grids["conv1"] == ("data", [1, 512])
    assert grids["fc6"] == grids["fc7"] == grids["fc8"] == ("model", [32, 16])
    names = [b["name"] for b in doc["baselines"]]
    assert names == ["data", "model", "single-grid", "gholami"]  # no column/row here
    data = doc["baselines"][0]
    assert data["speedup"] > 5  # the plan beats data parallelism on communication
    for b in doc["baselines"]:
        if b["applicable"] and b["fits"]:
            assert doc["iteration"]["comm_s"] <= b["comm_s"] * 1.0001


def test_plan_document_has_placement_and_is_deterministic(runner, tmp_path):
    outs = []
    for name in ("a.yaml", "b.yaml"):
        out = tmp_path / name
        result = invoke(runner, "plan", NETWORKS / "resnet50.yaml", DGX, "-p", "64", "-b",
                        "2048", "-o", out, "--format", "yaml", "--estimator", "roofline")
        assert result.exit_code == 0, result.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    doc = yaml.safe_load(outs[0])
    assert doc["command"] == "plan"
    place = doc["placement"]
    assert place["devices"] == 64 and place["nodes"] == 8
    assert place["grids"] and "rule" in place["grids"][0]["row_groups"]
    assert "ranks" not in place["grids"][0]["row_groups"]


def test_large_images_are_split_by_domain_and_timed_by_the_scaled_models(runner):
    # 4 images of 2048x2048 on 16 GPUs: data parallelism cannot use them all, domain
    # parallelism can. The first four convolutions' pieces (2048/8 x 2048 and 1024/8 x
    # 1024) are beyond the measured image sizes, so they are timed by the learned models
    # on stacked bands of rows; the last two are in range. None is roofline-timed.
    result = invoke(runner, "plan", NETWORKS / "segmentation-2048.yaml", DGX, "-p", "16",
                    "-b", "4", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    convs = [layer for layer in doc["layers"] if layer["type"] == "conv2d"]
    assert len(convs) == 6
    for layer in convs:
        assert layer["mode"] == "domain", layer["name"]
        sources = layer["compute"]["estimator"].split(", ")
        scaled = not layer["name"].startswith("conv3")
        assert len(sources) >= 2 and all(  # the first layer has no backward-data
            s.startswith("mlp:conv_") and s.endswith("(scaled)") == scaled
            for s in sources), (layer["name"], sources)
    data = next(b for b in doc["baselines"] if b["name"] == "data")
    assert data["applicable"] is False and "larger than the batch 4" in data["reason"]


def test_expand_ranks(runner):
    result = invoke(runner, "plan", ALEX, CLUSTERS / "pcie-8gpu.yaml", "-p", "8", "-b", "64",
                    "--pin", "fc*=model:2x4", "--expand-ranks", "--format", "json",
                    "--estimator", "roofline")
    assert result.exit_code == 0, result.stderr
    grids = json.loads(result.stdout)["placement"]["grids"]
    fc = next(g for g in grids if g["grid"] == [2, 4])
    ranks = sorted(r for grp in fc["row_groups"]["ranks"] for r in grp)
    assert ranks == list(range(8))
    assert len(fc["col_groups"]["ranks"]) == 2


def test_plan_table_shows_speedups(runner):
    result = invoke(runner, "plan", ALEX, KNL, *PAPER, "--pin", "conv*=data")
    assert result.exit_code == 0
    assert "baselines" in result.stdout and "speedup" in result.stdout
    assert "model 32x16" in result.stdout


def test_no_plan_exits_1(runner, tmp_path):
    huge = tmp_path / "huge.yaml"
    huge.write_text("kind: network\nname: huge\ninput: [200000]\nlayers:\n"
                    "  - {type: linear, out_features: 200000}\n")
    result = invoke(runner, "plan", huge, CLUSTERS / "pcie-8gpu.yaml", "-p", "2", "-b", "4",
                    "--estimator", "roofline")
    assert result.exit_code == 1
    assert result.stderr.startswith("planner: no plan fits in memory")
    # searched on 4 and 8 devices (111.8 and 55.89 GiB), all the one node holds: 55.89 GiB
    # on 15.5 is 3.6x → 4 × 8 devices, more than the cluster holds
    assert "more devices (a larger cluster: about 32 devices, if memory per device keeps " \
           "falling in proportion; on all 8 devices of this cluster the leanest layout " \
           "needs 55.89 GiB)" in result.stderr
    assert "--pipeline" not in result.stderr  # one layer: no stages to cut it into


def test_no_plan_as_json_or_yaml_is_a_document(runner, tmp_path):
    """Asked for JSON or YAML on standard output, a plan that does not fit is still a
    document a program parses (plan: null, the leanest peak, the reason; it printed
    nothing, 2026-12-07 audit), with exit 1; an -o file is left as it was (it may hold
    the last plan that fitted), and the table prints nothing on stdout."""
    huge = tmp_path / "huge.yaml"
    huge.write_text("kind: network\nname: huge\ninput: [200000]\nlayers:\n"
                    "  - {type: linear, out_features: 200000}\n")
    args = ("plan", huge, CLUSTERS / "pcie-8gpu.yaml", "-p", "2", "-b", "4", "--estimator",
            "roofline")
    r = invoke(runner, *args, "--format", "json")
    assert r.exit_code == 1 and r.stderr.startswith("planner: no plan fits in memory")
    data = json.loads(r.stdout)
    assert data["plan"] is None and data["problem"]["gpus"] == 2
    assert data["inputs"]["network"]["name"] == "huge"
    assert data["error"] == r.stderr.strip().removeprefix("planner: ")
    # the one linear layer's 200,000² float32 weights, gradients and momentum alone are
    # 3 × 160 GB = 447 GiB unsplit; its leanest layout needs less, but more than 15.5 GiB
    assert 15.5 * 2**30 < data["leanest_peak_bytes"] < 3 * 4 * 200000**2
    y = invoke(runner, *args, "--format", "yaml")
    assert y.exit_code == 1 and yaml.safe_load(y.stdout) == data
    kept = tmp_path / "plan.json"
    kept.write_text("{}\n")
    r = invoke(runner, *args, "-o", kept)
    assert r.exit_code == 1 and kept.read_text() == "{}\n" and r.stdout == ""
    r = invoke(runner, *args)
    assert r.exit_code == 1 and r.stdout == ""


def test_compare(runner):
    result = invoke(runner, "compare", ALEX, KNL, *PAPER, "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"plan", "baselines"} <= set(data)
    assert data["plan"]["layouts"]
    table = invoke(runner, "compare", ALEX, KNL, *PAPER)
    assert "plan (searched)" in table.stdout


def test_a_transformer_on_the_defaults_is_told_so(runner):
    """A transformer planned on the optimizer's default (momentum) and with 16-bit
    gradients accumulated over microbatches gets a note each on stderr, once a command
    (a plausibility audit found a Llama 3 8B plan that fit on these defaults and would
    not as Megatron-LM trains it); given explicitly, or for a network without attention,
    nothing is said."""
    gpt2 = ("plan", NETWORKS / "gpt2-small.yaml", DGX, "-p", "8", "-b", "16")
    r = invoke(runner, *gpt2, "--precision", "bf16", "--microbatches", "2")
    assert r.exit_code == 0, r.stderr
    assert "planner: note: --optimizer not given: momentum's state is priced" in r.stderr
    assert "gradients accumulate over 2 microbatches in bfloat16" in r.stderr
    r = invoke(runner, *gpt2, "--precision", "bf16", "--microbatches", "2", "--optimizer",
               "momentum", "--grad-precision", "bf16")
    assert r.exit_code == 0 and "note" not in r.stderr, r.stderr
    r = invoke(runner, *gpt2, "--precision", "bf16", "--optimizer", "adam",
               "--microbatches", "auto")
    assert "gradients accumulate over the microbatches the plan takes in bfloat16" \
        in r.stderr, r.stderr  # found by a review: the note was lost under auto
    r = invoke(runner, "sweep", NETWORKS / "gpt2-small.yaml", DGX, "-p", "8,16", "-b", "16,32")
    assert r.stderr.count("--optimizer not given") == 1
    r = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64")
    assert "note" not in r.stderr


def test_no_plan_advice_counts_the_step_batch(runner):
    """With --microbatches, --batch is the step's: the advice's microbatches divide it
    and its smaller batch is a step's (a review found both read the microbatch's batch:
    "the same batch of 16" for -b 48 in 3 microbatches). GPT-2 small in fp32 on 8 H100s,
    batch 4,096 in 2 microbatches: the leanest layout needs 574.7 GiB, 573.1 of them
    activations and workspace, 78.65 available, so room 77.05 GiB; by hand
    ceil(2 · 573.1 / 77.05) = 15 microbatches, 4,096's next divisor 16; a microbatch of
    floor(2,048 · 77.05 / 573.1) = 275 samples, 272 on 8 devices, a step of 544."""
    r = invoke(runner, "plan", NETWORKS / "gpt2-small.yaml", DGX, "-p", "8", "-b", "4096",
               "--microbatches", "2", "--optimizer", "momentum")
    assert r.exit_code == 1
    assert "more microbatches (about --microbatches 16: the same batch of 4,096 in 16 " \
           "passes" in r.stderr, r.stderr
    assert "a smaller batch (about --batch 544," in r.stderr


def test_more_devices_advice_is_searched(runner):
    """Mixtral 8x7B on 24 A100s at batch 32 needs 110.5 GiB of 79. Memory per device
    does not fall in proportion to the devices: the advice had said --gpus 48 (an audit),
    where the leanest layout still needs 90.19 GiB. The search runs again on 48, then 96,
    where a plan fits, and the advice names 96 with what 48 needs; planning at 48 and
    96 gives the same verdicts (the figures are those plan prints there)."""
    mixtral = NETWORKS / "mixtral-8x7b.yaml"
    a100 = CLUSTERS / "dgx-a100.yaml"
    r = invoke(runner, "plan", mixtral, a100, "-p", "24", "-b", "32")
    assert r.exit_code == 1
    assert "needs 110.5 GiB per device, 79 GiB is available" in r.stderr, r.stderr
    assert "try more devices (--gpus 96: a plan fits there; on 48 the leanest layout " \
           "needs 90.19 GiB) or --zero 1" in r.stderr, r.stderr
    r = invoke(runner, "plan", mixtral, a100, "-p", "48", "-b", "32")
    assert r.exit_code == 1
    assert "the leanest layout found needs 90.19 GiB per device" in r.stderr
    assert "try more devices (--gpus 96: a plan fits there) or" in r.stderr, r.stderr
    assert invoke(runner, "plan", mixtral, a100, "-p", "96", "-b", "32").exit_code == 0
    # compare says the same (an audit found its advice was the estimate's, --gpus 48)
    r = invoke(runner, "compare", mixtral, a100, "-p", "24", "-b", "32", "--format", "json")
    assert r.exit_code == 1
    assert "more devices (--gpus 96: a plan fits there; on 48 the leanest layout needs " \
           "90.19 GiB)" in json.loads(r.stdout)["error"]


def test_no_plan_advice_in_a_pipeline_stage_counts_the_run_s_devices(runner):
    """A stage that does not fit is searched on its share of the devices (16 of 64 in 4
    stages), but the advice's --gpus is the run's: Llama 3 8B in bf16 on 64 H100s at
    batch 512 in 8 microbatches and 4 stages needs 148.6 GiB a device in stage 0 on
    78.65 available (156.7 before the baselines' grids counted toward the leanest), under
    twice as many devices, so --gpus 2 · 64 = 128 (a session found it said --gpus 32,
    fewer than the 64 asked for), and there it plans."""
    cmd = ("plan", NETWORKS / "llama3-8b.yaml", DGX, "-b", "512", "--microbatches", "8",
           "--pipeline", "4", "--optimizer", "momentum", "--grad-precision", "bf16")
    r = invoke(runner, *cmd, "-p", "64")
    assert r.exit_code == 1
    assert "no feasible plan for pipeline stage 0" in r.stderr, r.stderr
    assert "needs 148.6 GiB per device, 78.65 GiB is available" in r.stderr
    assert r.stderr.rstrip().endswith("or more devices (about --gpus 128, if memory per "
                                      "device falls in proportion)"), r.stderr
    assert invoke(runner, *cmd, "-p", "128").exit_code == 0


def test_no_plan_advice_names_what_shrinks_the_model_state(runner):
    """Llama 3 70B in bf16 with Adam on 64 H100s at batch 256: activations are most of the
    leanest layout's 831.1 GiB (a baseline's grid; 1.194 TiB, 526.7 GiB of it what no
    batch changes, before those counted), but what no batch changes, 135.5 GiB, is
    beyond the 78.65 GiB too, so neither recomputation nor a smaller batch fits it alone. The advice
    also names ZeRO, a lighter optimizer and pipeline stages (an audit found it named
    none of them: only recomputation and more devices)."""
    r = invoke(runner, "plan", NETWORKS / "llama3-70b.yaml", DGX, "-p", "64", "-b", "256",
               "--optimizer", "adam", "--precision", "bf16")
    assert r.exit_code == 1
    assert "a smaller batch alone cannot fit: the peak less its activations and workspace " \
           "is 135.5 GiB" in r.stderr, r.stderr
    for tip in ("or --zero 1 (shards the optimizer state over the data-parallel replicas)",
                "or a lighter optimizer (--optimizer momentum or sgd)",
                "or pipeline stages (--pipeline auto: "):
        assert tip in r.stderr, r.stderr
    # compare advises the same; at ZeRO stage 3 (714.1 GiB, 695.6 of them activations
    # and workspace) no ZeRO stage is left to name
    r = invoke(runner, "compare", NETWORKS / "llama3-70b.yaml", DGX, "-p", "64", "-b", "256",
               "--optimizer", "adam", "--precision", "bf16", "--zero", "3")
    assert r.exit_code == 1 and "or pipeline stages (--pipeline auto: " in r.stderr
    assert "--zero" not in r.stderr and "about --microbatches 16" in r.stderr, r.stderr


def test_compare_when_nothing_fits(runner, tmp_path):
    """GPT-2 small in fp32 on 8 H100s at batch 4,096: no layout fits. compare still shows
    what it compared, every baseline marked as not fitting and the leanest layout's
    memory, and exits 1 with the reason and the advice on stderr."""
    net = NETWORKS / "gpt2-small.yaml"
    args = ("compare", net, DGX, "-p", "8", "-b", "4096", "--optimizer", "momentum")
    table = invoke(runner, *args)
    assert table.exit_code == 1
    assert "plan (searched): no layout fits" in table.stdout
    assert "(does not fit)" in table.stdout and "(leanest)" in table.stdout
    assert table.stderr.startswith("planner: no plan fits in memory")
    out = tmp_path / "c.json"
    result = invoke(runner, *args, "-o", out)
    assert result.exit_code == 1
    data = json.loads(out.read_text())
    assert data["plan"] is None
    wrote, said = result.stderr.strip().split("\n")
    assert wrote == f"wrote {out}"
    assert data["error"] == said.removeprefix("planner: ")
    applied = [b for b in data["baselines"] if b["applicable"]]
    assert [b["name"] for b in data["baselines"]] == ["data", "model", "single-grid",
                                                      "gholami", "megatron", "megatron-sp",
                                                      "megatron-cp"]
    assert applied and not any(b["fits"] for b in applied)
    # the leanest layout found is no larger than any baseline
    assert data["leanest_peak_bytes"] <= min(b["peak_bytes"] for b in applied)
    assert data["problem"]["gpus"] == 8 and data["problem"]["batch"] == 4096


def test_sweep_table_json_and_plot(runner, tmp_path, monkeypatch):
    png = tmp_path / "sweep.png"
    # a device count beyond the cluster (128 nodes of 8) is an error, as it is for plan,
    # before anything is planned or written
    result = invoke(runner, "sweep", ALEX, DGX, "--gpus", "8,2048,4096", "--batch", "256",
                    "-o", tmp_path / "out.json", "--plot", png)
    assert result.exit_code == 2 and not png.exists() and not (tmp_path / "out.json").exists()
    assert result.stderr == (
        "planner: error: --gpus 2048, 4096 are more than the cluster has (128 nodes × 8 = "
        "1024); drop them from the sweep, or raise 'nodes' in the cluster file or remove "
        "it\n")
    result = invoke(runner, "sweep", ALEX, DGX, "--gpus", "8,16,1024", "--batch", "256,1024",
                    "--format", "json", "--plot", png, "--estimator", "roofline")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["results"]
    assert [(r["gpus"], r["batch"]) for r in rows] == [
        (8, 256), (16, 256), (1024, 256), (8, 1024), (16, 1024), (1024, 1024)]
    assert all(r["feasible"] for r in rows if r["gpus"] <= 16)
    # every feasible row has the same keys: null where data parallelism cannot run (a
    # batch of 256 on 1,024 devices); the key was left out there
    assert len({tuple(sorted(r)) for r in rows if r["feasible"]}) == 1
    assert [r["speedup_vs_data"] is None for r in rows] == [
        False, False, True, False, False, False]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setenv("COLUMNS", "160")  # wide enough for every column
    table = invoke(runner, "sweep", ALEX, DGX, "-p", "8,16", "-b", "256",
                   "--estimator", "roofline")
    assert table.exit_code == 0 and "samples/s" in table.stdout and "MFU" in table.stdout


def test_sweep_table_at_80_columns(runner, monkeypatch):
    """At 80 columns the sweep table fits: one layout a line (never "2× data" / "1x8"),
    samples/s and MFU left out, a no-plan reason wrapped. One device exposes no communication
    (the iteration minus the compute once read 9.7e-17 s: the same sum in two orders)."""
    monkeypatch.setenv("COLUMNS", "80")
    result = invoke(runner, "sweep", NETWORKS / "gpt2-small.yaml", DGX, "-p", "1,8",
                    "-b", "4,256")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    assert "samples/s" not in result.stdout and "MFU" not in result.stdout
    assert "…" not in result.stdout
    layouts = [line.rstrip().split("  ")[-1].strip() for line in lines if "×" in line]
    assert len(layouts) >= 3
    assert all(re.fullmatch(r"\d+× (data|model|domain|column|row|ulysses)(-sp)? \d+x\d+", x)
               for x in layouts), layouts
    one = next(line.split() for line in lines if line.split()[:2] == ["1", "4"])
    assert one[4:6] == ["0", "s"], one  # devices, batch, iteration (2 words), exposed
    assert any(line.split()[:3] == ["1", "256", "no"] for line in lines)


def test_sweep_plot_is_a_png(runner, tmp_path, monkeypatch):
    """--plot x.pdf wrote PNG bytes under that name; a bad $MPLBACKEND was an internal
    error (the plot is drawn off screen whatever it says)."""
    r = invoke(runner, "sweep", ALEX, DGX, "-p", "8", "-b", "64", "--plot", tmp_path / "x.pdf",
               "--estimator", "roofline")
    assert r.exit_code == 2 and "name the file *.png" in r.stderr
    assert not (tmp_path / "x.pdf").exists()
    monkeypatch.setenv("MPLBACKEND", "nonexistent")
    r = invoke(runner, "sweep", ALEX, DGX, "-p", "8", "-b", "64", "--plot", tmp_path / "x.png",
               "--estimator", "roofline")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_bad_list(runner):
    result = invoke(runner, "sweep", ALEX, DGX, "--gpus", "8,x", "--batch", "256")
    assert result.exit_code == 2
    assert "expected comma-separated integers" in result.stderr


def test_sweep_weak_scaling(runner, tmp_path, monkeypatch):
    """``--batch-per-device`` (weak scaling): each device count is planned at that many
    samples a device, row for row the plans of ``--batch`` at those totals; the rows,
    the table (a column of its own), the CSV and the plot (a line a per-device batch)
    say it, and the document says ``scaling: weak``. One of --batch and
    --batch-per-device is required (exit 2 on neither and on both)."""
    gpt2 = NETWORKS / "gpt2-small.yaml"
    common = ("sweep", gpt2, DGX, "-p", "8,16", "--optimizer", "adam", "--format", "json")
    weak = json.loads(invoke(runner, *common, "--batch-per-device", "4,8").stdout)
    assert weak["scaling"] == "weak"
    got = [(r["gpus"], r["batch_per_device"], r["batch"]) for r in weak["results"]]
    assert got == [(8, 4, 32), (16, 4, 64), (8, 8, 64), (16, 8, 128)]
    strong = json.loads(invoke(runner, *common, "-b", "32,64,128").stdout)
    assert strong["scaling"] == "strong"
    by = {(r["gpus"], r["batch"]): r for r in strong["results"]}
    for r in weak["results"]:
        twin = by[(r["gpus"], r["batch"])]
        assert "batch_per_device" not in twin
        assert {k: v for k, v in r.items() if k != "batch_per_device"} == twin
    monkeypatch.setenv("COLUMNS", "160")
    table = invoke(runner, *common[:-2], "--batch-per-device", "4").stdout
    assert table.split("\n")[0].split()[:3] == ["devices", "batch/device", "batch"]
    csv_text = invoke(runner, *common[:-2], "--batch-per-device", "4", "--format",
                      "csv").stdout.splitlines()
    assert csv_text[1].startswith("8,32,4,true,") and csv_text[2].startswith("16,64,4,true,")
    png = tmp_path / "weak.png"
    r = invoke(runner, *common[:-2], "--batch-per-device", "4", "--plot", png)
    assert r.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    # neither: which to give; both: that they exclude each other (it said the same as
    # for neither; an audit, 2026-12-07)
    for extra, said in (((), "sweep needs --batch"),
                        (("-b", "32", "--batch-per-device", "4"),
                         "--batch and --batch-per-device exclude each other")):
        r = invoke(runner, *common[:-2], *extra)
        assert r.exit_code == 2 and said in r.stderr, r.output
    r = invoke(runner, *common[:-2], "--batch-per-device", str(2**37))
    assert r.exit_code == 2 and "is a batch of 2,199,023,255,552" in r.stderr


def test_sweep_plans_stages_and_microbatches_as_plan_does(runner, monkeypatch):
    """``sweep --pipeline S|auto --microbatches auto`` plans each row as ``plan`` does
    with the same options: its time, memory, MFU and layouts are the plan's, and the row
    says the stages and microbatches chosen (columns in the table and the CSV). Before,
    sweep had neither option (a scaling study of a model that needs stages could not be
    swept). --virtual-stages without --pipeline is refused as plan refuses it."""
    gpt2 = NETWORKS / "gpt2-small.yaml"
    common = (gpt2, DGX, "--optimizer", "adam", "--format", "json")
    for extra in (("--pipeline", "2", "--microbatches", "4"),
                  ("--pipeline", "auto", "--microbatches", "auto")):
        swept = json.loads(invoke(runner, "sweep", *common, "-p", "8,16", "-b", "32",
                                  *extra).stdout)
        assert swept["problem"]["pipeline"] == {"stages": int(extra[1]) if extra[1] != "auto"
                                                else "auto", "virtual_stages": 1,
                                                "schedule": "1f1b"}
        for row in swept["results"]:
            doc = json.loads(invoke(runner, "plan", *common, "-p", str(row["gpus"]), "-b",
                                    "32", *extra).stdout)
            pipe = doc["problem"].get("pipeline") or {}
            assert row["pipeline"] == pipe.get("stages", 1)
            if extra[-1] == "auto":
                assert row["microbatches"] == doc["problem"].get("microbatches", 1)
                assert [t["microbatches"] for t in doc["microbatches_auto"]][:2] == [1, 2]
            else:
                assert "microbatches" not in row and pipe["stages"] == 2
            assert (row["time_s"], row["peak_bytes"], row["mfu"]) == (
                doc["iteration"]["time_s"], doc["memory"]["peak_bytes"],
                doc["iteration"]["mfu"])
    monkeypatch.setenv("COLUMNS", "200")
    table = invoke(runner, "sweep", gpt2, DGX, "-p", "8", "-b", "32", "--pipeline", "2",
                   "--microbatches", "auto").stdout
    assert "stages" in table.split("\n")[0] and "micro" in table.split("\n")[0]
    r = invoke(runner, "sweep", gpt2, DGX, "-p", "8", "-b", "32", "--virtual-stages", "2")
    assert r.exit_code == 2 and "give --pipeline 2 or more" in r.stderr
    # what auto chose is in each row (found by an audit: three schedules read alike)
    row = json.loads(invoke(runner, "sweep", *common, "-p", "8", "-b", "64", "--pipeline",
                            "2", "--microbatches", "4", "--schedule", "auto",
                            "--virtual-stages", "auto").stdout)["results"][0]
    doc = json.loads(invoke(runner, "plan", *common, "-p", "8", "-b", "64", "--pipeline",
                            "2", "--microbatches", "4", "--schedule", "auto",
                            "--virtual-stages", "auto").stdout)
    pipe = doc["problem"]["pipeline"]
    assert (row["virtual_stages"], row["schedule"], row["time_s"]) == (
        pipe.get("virtual_stages", 1), pipe.get("schedule", "1f1b"), doc["iteration"]["time_s"])


def test_help_for_every_command(runner):
    for cmd in ("plan", "compare", "sweep", "cost"):
        result = invoke(runner, cmd, "--help")
        assert result.exit_code == 0 and "Usage:" in result.stdout


def test_tables_on_narrow_terminals_cut_no_numbers(runner, monkeypatch, tmp_path):
    """At 60 and 80 columns the per-layer breakdown gives way to one communication
    column, every layer keeps its name and no figure is cut short ("2.16…"); a table
    that cannot be narrowed is printed wider than the terminal rather than cut."""
    wide = invoke(runner, "plan", ALEX, DGX, "-p", "64", "-b", "1024", "--format", "json")
    doc = json.loads(wide.stdout)
    shown = [r["name"] for r in doc["layers"] if "follows" not in r]
    for columns in ("60", "80", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        result = invoke(runner, "plan", ALEX, DGX, "-p", "64", "-b", "1024")
        assert result.exit_code == 0, result.stderr
        out = result.stdout
        assert "…" not in out
        names = [line.split()[0] for line in out.splitlines() if line.strip()]
        assert all(name in names for name in shown), (columns, names)
        narrow = columns != "200"
        assert bool(re.search(r"communication +total", out)) == narrow
        assert ("weight grad" in out) != narrow
    # a table written to a file: 140 columns whatever the terminal, no padding
    out = tmp_path / "plan.txt"
    result = invoke(runner, "plan", ALEX, DGX, "-p", "64", "-b", "1024", "-o", out)
    assert result.exit_code == 0, result.stderr
    lines = out.read_text().splitlines()
    assert "weight grad" in out.read_text() and all(line == line.rstrip() for line in lines)
    # a table printed wider than the terminal does so alone: the summary above it
    # still wraps at the terminal's 50 columns
    monkeypatch.setenv("COLUMNS", "50")
    result = invoke(runner, "plan", ALEX, DGX, "-p", "64", "-b", "1024")
    lines = result.stdout.splitlines()
    table_at = next(i for i, line in enumerate(lines) if "layout" in line)
    assert max(len(line) for line in lines[table_at:]) > 50
    assert lines[0].startswith("alexnet on dgx-h100") and table_at > 3
    assert all(len(line) <= 50 for line in lines[:table_at - 1]), lines[:table_at]
    monkeypatch.setenv("COLUMNS", "40")
    result = invoke(runner, "devices")
    assert result.exit_code == 0
    assert " 66.9 " in result.stdout and "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) > 40


def test_plan_pin_shadowed_by_an_earlier_pin(runner):
    result = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64", "--pin", "fc*=model",
                    "--pin", "fc7=data", "--pin", "conv1=data")
    assert result.exit_code == 2
    assert result.stderr == ("planner: error: --pin 'fc7=data' matches only layers an "
                             "earlier pin sets (fc7 by 'fc*=model'); the first pin that "
                             "matches a layer wins: put the narrower pin first\n")


def test_counts_are_plain_digits(runner):
    # Python's int() takes "1_000" and full-width digits; a count is typed in 0-9
    for args, said in (
            (("plan", ALEX, DGX, "-p", "1_000", "-b", "64"),
             "Invalid value for '--gpus' / '-p': '1_000' is not a whole number (digits 0-9)"),
            (("plan", ALEX, DGX, "-p", "8", "-b", "６４"),
             "Invalid value for '--batch' / '-b': '６４' is not a whole number (digits 0-9)"),
            (("sweep", ALEX, DGX, "-p", "8,1_6", "-b", "64"),
             "Invalid value for '--gpus': expected comma-separated integers, got '8,1_6'")):
        r = invoke(runner, *args)
        assert r.exit_code == 2 and said in r.stderr, r.stderr
    r = invoke(runner, "plan", ALEX, DGX, "-p", " 8", "-b", "+64", "--estimator", "roofline")
    assert r.exit_code == 0, r.stderr


def test_columns_that_is_not_a_width_is_ignored(runner, monkeypatch):
    """$COLUMNS=abc (or 0) is not a width: the output is what it is with $COLUMNS unset
    (120 columns when captured), not rich's 80-column fallback."""
    monkeypatch.delenv("COLUMNS", raising=False)
    plain = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64").stdout
    assert max(len(line) for line in plain.splitlines()) > 80
    for bad in ("abc", "0", "-5", "８０"):
        monkeypatch.setenv("COLUMNS", bad)
        assert invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64").stdout == plain, bad


def test_plan_numbers_have_one_type_each(runner):
    """Sizes are whole bytes (25 MiB is 26214400, not 4 digits of it) and times are
    floats, even where nothing was summed (a layer with no communication), in YAML and
    JSON alike."""
    args = [NETWORKS / "gpt2-small.yaml", DGX, "-p", "16", "-b", "16", "--optimizer",
            "adam", "--zero", "1"]
    docs = [json.loads(invoke(runner, "plan", *args, "--format", "json").stdout),
            yaml.safe_load(invoke(runner, "plan", *args, "--format", "yaml").stdout)]
    assert docs[0] == docs[1]
    sizes, times = [], []

    def walk(node, under_breakdown=False):
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    walk(v, k == "breakdown")
                elif k == "bytes" or k.endswith("_bytes") or under_breakdown:
                    sizes.append((k, v))
                elif k.endswith("_s"):
                    times.append((k, v))
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(docs[0])
    assert docs[0]["problem"]["bucket_bytes"] == 26214400
    assert len(sizes) > 100 and all(type(v) is int for _, v in sizes if v is not None)
    assert len(times) > 100 and all(type(v) is float for _, v in times if v is not None)
    assert any(v == 0.0 for _, v in times)


def test_baselines_keep_pins_alike_at_every_device_count(runner):
    """A baseline under --pin is its strategy with the pinned layers as pinned, said in
    its label, whatever the device count (it used to take the pin only where the pin
    allowed one layout, and be 'not applicable' where it allowed several)."""
    mlp4 = ROOT / "examples" / "launch" / "mlp4.yaml"
    for p in ("2", "4"):
        doc = json.loads(invoke(runner, "plan", mlp4, DGX, "-p", p, "-b", "8", "--pin",
                                "fc1=model", "--format", "json").stdout)
        data = next(b for b in doc["baselines"] if b["name"] == "data")
        assert data["applicable"] and data["description"] == f"data 1x{p}, pins kept", data
        unpinned = json.loads(invoke(runner, "plan", mlp4, DGX, "-p", p, "-b", "8",
                                     "--format", "json").stdout)
        plain = next(b for b in unpinned["baselines"] if b["name"] == "data")
        assert plain["description"] == f"data 1x{p}"


def test_precision_option_is_the_network_in_that_dtype(runner, tmp_path):
    """``--precision bf16`` answers what editing the network's ``dtype`` would: the same
    plan bar the network file's name and digest, and ``check`` takes it as the plan of a
    configuration that says ``precision: bfloat16``."""
    edited = tmp_path / "alexnet-bf16.yaml"
    edited.write_text(ALEX.read_text().replace("dtype: float32", "dtype: bfloat16"))
    docs = []
    for net, extra in ((ALEX, ["--precision", "bf16"]), (edited, [])):
        result = invoke(runner, "plan", net, DGX, "-p", "16", "-b", "512", "--format",
                        "json", *extra)
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        del doc["inputs"]["network"]
        docs.append(doc)
    assert docs[0] == docs[1]
    assert docs[0]["problem"]["dtype"] == "bfloat16"
    assert docs[0]["problem"]["master_weights"] is True  # 16-bit: fp32 master copy
    plain = invoke(runner, "plan", ALEX, DGX, "-p", "16", "-b", "512", "--format", "json")
    assert json.loads(plain.stdout)["problem"]["dtype"] == "float32"
    assert json.loads(plain.stdout)["iteration"]["time_s"] > docs[0]["iteration"]["time_s"]

    plan = tmp_path / "plan.yaml"
    assert invoke(runner, "plan", ALEX, DGX, "-p", "16", "-b", "512", "--precision",
                  "bfloat16", "-o", plan).exit_code == 0
    cfg = tmp_path / "c.yaml"
    text = (f"kind: training\nnetwork: {ALEX}\ncluster: {DGX}\ngpus: 16\nbatch: 512\n"
            "strategy: {plan: plan.yaml}\n")
    cfg.write_text(text + "precision: bfloat16\n")
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 0, result.stdout
    cfg.write_text(text)
    result = invoke(runner, "check", cfg)
    assert result.exit_code == 1
    assert "the plan is for dtype=bfloat16, the configuration says float32" in result.stdout


def test_precision_option_rejects_an_unknown_dtype(runner):
    result = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64", "--precision", "int8")
    assert result.exit_code == 2
    assert "Invalid value for '--precision'" in result.stderr and "bf16" in result.stderr


def test_bucket_size_of_a_fraction_of_a_byte_is_refused(runner):
    result = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64", "--bucket-size", "0.4B")
    assert result.exit_code == 2
    assert "'0.4B' is less than one byte; use 0 for one bucket per layer" in result.stderr
    result = invoke(runner, "plan", ALEX, DGX, "-p", "8", "-b", "64", "--bucket-size",
                    "0.1 MiB", "--format", "json")
    assert json.loads(result.stdout)["problem"]["bucket_bytes"] == 104858  # 104,857.6


def test_pin_with_a_one_row_grid_is_data_parallelism(runner):
    """``--pin fc6=model:1x8`` is data parallelism (one row of the grid), as ``cost``
    takes it; plan refused it ('cannot use data 1x8: no grid allows it')."""
    for pin in ("fc6=model:1x8", "fc6=column:1x8", "conv1=domain:1x8"):
        layers = {}
        for command in ("plan", "cost"):
            result = invoke(runner, command, ALEX, DGX, "-p", "8", "-b", "64", "--pin", pin,
                            "--format", "json")
            assert result.exit_code == 0, (pin, command, result.stderr)
            layers[command] = {r["name"]: (r["mode"], r["grid"])
                               for r in json.loads(result.stdout)["layers"]}
        name = pin.split("=")[0]
        assert layers["plan"][name] == layers["cost"][name] == ("data", [1, 8])


def test_sweep_reason_is_the_message_alone(runner):
    """A row short of memory says why in full in JSON, with what the leanest layout needs
    and the capacity (the numbers its message gives); the table shows the need under
    memory and the shortfall in a line, not the sentence folded down the layouts column
    (ten lines a row, where the CSV keeps all three)."""
    args = ("sweep", NETWORKS / "gpt2-small.yaml", DGX, "-p", "1", "-b", "256",
            "--estimator", "roofline")
    result = invoke(runner, *args, "--format", "json")
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)["results"]
    assert row["feasible"] is False and row["reason"].startswith("no plan fits in memory")
    need, cap = row["needed_bytes"], row["capacity_bytes"]
    assert f"needs {format_bytes(need)} per device, {format_bytes(cap)} is available" in \
        row["reason"] and need > cap
    table = invoke(runner, *args)
    (line,) = [x for x in table.stdout.splitlines() if x.split()[:2] == ["1", "256"]]
    assert line.split()[2:] == ["no", "plan", *format_bytes(need).split(), "leanest",
                                "short", "by", *format_bytes(need - cap).split()]
    csv_rows = invoke(runner, *args, "--format", "csv").stdout.splitlines()
    (cells,) = list(csv.DictReader(csv_rows))
    assert float(cells["needed_bytes"]) == need and float(cells["capacity_bytes"]) == cap


def _as_pins(doc):
    """A plan's layouts as pins, one a layer with weights: GLOB=MODE:PRxPC:PLACEMENT."""
    return [arg for r in doc["layers"] if "follows" not in r and r["type"] != "input"
            for arg in ("--pin", f"{r['name']}={r['mode']}:{r['grid'][0]}x{r['grid'][1]}"
                        + (f":{r['placement']}" if 1 not in r["grid"] else ""))]


def test_searched_placement_is_kept_by_pins_and_priced_again_by_cost(runner):
    """A pin with a placement constrains the search to it; a plan whose layers differ in
    placement, written back as pins, prices to the same iteration time in ``cost``
    (before pins had a placement, ``cost`` could only give every layer the same one)."""
    args = [ALEX, DGX, "-p", "16", "-b", "128", "--format", "json"]
    result = invoke(runner, "plan", *args, "--pin", "fc6=model:8x2:cols",
                    "--pin", "fc7=model:8x2:rows")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    placed = {r["name"]: (r["mode"], r["grid"], r["placement"]) for r in doc["layers"]}
    assert placed["fc6"] == ("model", [8, 2], "cols")
    assert placed["fc7"] == ("model", [8, 2], "rows")
    # with a mode and grid alone, the search picks the placement
    free = invoke(runner, "plan", *args, "--pin", "fc6=model:8x2")
    assert free.exit_code == 0, free.stderr
    assert json.loads(free.stdout)["iteration"]["time_s"] <= doc["iteration"]["time_s"]
    pins = _as_pins(doc)
    assert "fc6=model:8x2:cols" in pins and "fc7=model:8x2:rows" in pins
    again = invoke(runner, "cost", *args, *pins)
    assert again.exit_code == 0, again.stderr
    priced = json.loads(again.stdout)
    assert priced["iteration"] == doc["iteration"]
    assert [r["placement"] for r in priced["layers"]] == [r["placement"] for r in doc["layers"]]


def test_a_table_too_wide_anyway_breaks_no_name(runner, monkeypatch):
    """At 60 columns `show`'s table cannot fit whatever its names fold to, so it prints at
    its natural width with every name whole (it broke "h.0.attn.resid_drop" after 16
    characters and still printed wider than 60); at 88 columns folding a few names makes it
    fit, and it does. The same holds with the twelve alike blocks shown once (their names
    a range, ``h.0-11.attn.resid_drop``) and with every layer listed."""
    net = NETWORKS / "gpt2-small.yaml"
    for name, every in ((" h.0-11.attn.resid_drop ", ()), (" h.0.attn.resid_drop ",
                                                             ("--all-layers",))):
        monkeypatch.setenv("COLUMNS", "60")
        out = invoke(runner, "show", net, *every).stdout
        assert name in out and "\n rop " not in out
        monkeypatch.setenv("COLUMNS", "88")
        out = invoke(runner, "show", net, *every).stdout
        assert max(len(line) for line in out.splitlines()) <= 88


def test_sweep_for_a_scaling_study(runner, tmp_path, monkeypatch):
    """What a scaling study asked of sweep (found by an audit): no speedup over a data
    parallelism that does not fit (Llama 3 8B on 64 GPUs at batch 64 with Adam: data
    parallel needs 170 GB a GPU, and the row said 0.862x, as if it were faster);
    samples/s and MFU at 120 columns (they were dropped with the one-line layouts);
    tokens/s and TFLOP/s a device in the results; CSV for a spreadsheet, by --format or
    the -o suffix; a --plot without matplotlib refused before anything is planned; the
    planner's version and the device in the JSON."""
    llama = ("sweep", NETWORKS / "llama3-8b.yaml", DGX, "-p", "64", "-b", "64",
             "--optimizer", "adam")
    r = invoke(runner, *llama, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"] == "H100-SXM" and doc["planner"]
    row = doc["results"][0]
    c = invoke(runner, "compare", *llama[1:], "--format", "json")
    data = next(b for b in json.loads(c.stdout)["baselines"] if b["name"] == "data")
    assert not data["fits"] and row["speedup_vs_data"] is None
    assert row["tokens_per_s"] == pytest.approx(64 * 8192 / row["time_s"], rel=1e-3)
    assert row["tflops_per_device"] == pytest.approx(row["mfu"] * 989.4, rel=2e-3)
    gpt2 = NETWORKS / "gpt2-small.yaml"
    args = ("sweep", gpt2, DGX, "-p", "16,32", "-b", "512", "--optimizer", "adam",
            "--precision", "bf16")
    monkeypatch.setenv("COLUMNS", "120")
    table = invoke(runner, *args)
    assert "samples/s" in table.stdout and "MFU" in table.stdout
    csv_out = tmp_path / "s.csv"
    r = invoke(runner, *args, "-o", csv_out)
    assert r.exit_code == 0, r.stderr
    lines = csv_out.read_text().splitlines()
    assert lines[0].startswith("gpus,batch,batch_per_device,feasible,time_s,samples_per_s,"
                               "tokens_per_s,")
    assert lines[1].startswith("16,512,,true,") and len(lines) == 3
    assert invoke(runner, *args, "--format", "csv").stdout == csv_out.read_text()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    import planner.cli_plan as cli_plan

    def never(*a, **k):
        raise AssertionError("planned before refusing the plot")

    monkeypatch.setattr(cli_plan, "run_search", never)
    r = invoke(runner, *args, "--plot", tmp_path / "s.png")
    assert r.exit_code == 2 and "--plot needs matplotlib" in r.stderr


def test_a_long_search_says_so_on_a_terminal_only(capsys):
    """A search shows on a terminal's stderr that it runs, for how long and what its
    auto options try (a plan with --pipeline auto --recompute auto takes minutes), and
    removes the line at the end; on a pipe or a log, nothing."""
    import io
    import time

    from planner.cli_plan import searching

    term = io.StringIO()
    with searching(term, after_s=0.0) as tell:
        tell("microbatches", "16")
        tell("pipeline stages", "4")
        time.sleep(0.6)
    shown = term.getvalue()
    assert "planning: 16 microbatches, 4 pipeline stages · 0:00" in shown
    assert shown.endswith("\r\x1b[1A\x1b[2K")  # the cursor back up, the line erased
    quick = io.StringIO()
    with searching(quick, after_s=5.0):
        pass  # over before the line is due: nothing shown
    assert quick.getvalue() == ""
    with searching() as tell:  # stderr captured by pytest: not a terminal
        tell("microbatches", "2")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("env", ["FORCE_COLOR", "TTY_COMPATIBLE"])
def test_no_progress_line_on_a_log_whatever_rich_is_told(monkeypatch, capsys, env):
    """FORCE_COLOR (or TTY_COMPATIBLE) makes rich treat any stream as a terminal; set in
    a CI job, the search's progress line had put its cursor moves in the job's log (an
    audit). It is drawn only where a person watches: stderr a terminal."""
    import time

    from planner.cli import console, watched
    from planner.cli_plan import searching

    monkeypatch.setenv(env, "1")
    assert console(stderr=True).is_terminal and not watched()
    with searching(after_s=0.0) as tell:
        tell("microbatches", "2")
        time.sleep(0.3)
    assert capsys.readouterr().err == ""


def _rows(*spec):
    from planner.tables import Row

    return [Row(name, (cell,), dim) for name, cell, dim in spec]


def test_alike_consecutive_copies_are_one_row_each_layer():
    """A run of two or more consecutive copies whose rows read alike shows once, the copy
    number a range; a copy that differs (or a gap in the numbers, another prefix, a
    name without a copy number) ends the run, and nothing else changes."""
    from planner.tables import collapse_copies

    rows = _rows(("embed", "a", False),
                 *((f"layers.{k}.{part}", cell, False) for k in range(5)
                   for part, cell in (("attn", "x"), ("mlp", "y"))),
                 ("layers.5.attn", "x", False), ("layers.5.mlp", "z", False),  # differs
                 ("layers.6.attn", "x", False), ("layers.6.mlp", "z", False),
                 ("layers.8.attn", "x", False), ("layers.8.mlp", "z", False),  # a gap
                 ("other.9.attn", "x", False), ("other.10.attn", "x", True),  # dim differs
                 ("b.01.f", "v", False), ("b.02.f", "v", False),  # not copy numbers
                 ("blocks.0.layers.0.f", "w", False), ("blocks.0.layers.1.f", "w", False),
                 ("blocks.1.layers.0.f", "w", False), ("blocks.1.layers.1.f", "w", False),
                 ("head", "a", False))
    out = collapse_copies(rows)
    assert [(r.name, r.cells[0]) for r in out] == [
        ("embed", "a"), ("layers.0-4.attn", "x"), ("layers.0-4.mlp", "y"),
        ("layers.5-6.attn", "x"), ("layers.5-6.mlp", "z"),
        ("layers.8.attn", "x"), ("layers.8.mlp", "z"),
        ("other.9.attn", "x"), ("other.10.attn", "x"), ("b.01.f", "v"), ("b.02.f", "v"),
        ("blocks.0-1.layers.0.f", "w"), ("blocks.0-1.layers.1.f", "w"), ("head", "a")]
    assert collapse_copies(rows[:3]) == rows[:3]  # one copy: as it was
    assert collapse_copies([]) == []


def test_the_table_shows_a_repeat_group_once_for_each_run_of_alike_copies(runner):
    """Llama 3 8B with its first five residual blocks recomputed (copies 0 and 1 whole,
    copy 2's attention block) and every layer data parallel: copies 0-1, 2 and 3-31
    read differently (a recomputed block's layers run their forward twice), so the table
    has three rows for each of the copy's layers; --all-layers lists all 32."""
    args = ("plan", NETWORKS / "llama3-8b.yaml", DGX, "-p", "64", "-b", "64", "--optimizer",
            "adam", "--zero", "1", "--recompute", "5", "--pin", "*=data:1x64")
    result = invoke(runner, *args)
    assert result.exit_code == 0, result.stderr
    names = re.findall(r"^ (layers\.\S+)", result.stdout, re.M)
    assert names == [f"layers.{k}.{part}" for k in ("0-1", "2", "3-31")
                     for part in ("attn.self_attn", "mlp.gate_up_proj", "mlp.down_proj")]
    assert "N-M in a name: one row stands for copies N to M of a repeat group" in \
        " ".join(result.stdout.split())
    doc = json.loads(invoke(runner, *args, "--format", "json").stdout)
    def compute(part):
        return [rec["compute_s"] for rec in doc["layers"]
                if re.fullmatch(rf"layers\.\d+\.{part}", rec["name"])]

    attn, down = compute(r"attn\.self_attn"), compute(r"mlp\.down_proj")
    assert len(attn) == len(down) == 32
    assert attn[0] == attn[1] == attn[2] > attn[3] == attn[31]
    assert down[0] == down[1] > down[2] == down[3] == down[31]
    every = invoke(runner, *args, "--all-layers")
    listed = re.findall(r"^ (layers\.\S+)", every.stdout, re.M)
    assert "layers.17.mlp.down_proj" in listed and not any("-" in n for n in listed)


def test_a_pipelined_table_says_each_rows_stage_and_runs_stop_at_a_stage(runner):
    """With stages, the table has a stage column, and a collapsed row stands only for
    copies on its stage: every copy its range names runs on the stage it shows, as the
    plan document says."""
    args = ("plan", NETWORKS / "llama3-8b.yaml", DGX, "-p", "64", "-b", "64", "--optimizer",
            "adam", "--pipeline", "2", "--microbatches", "8")
    result = invoke(runner, *args)
    assert result.exit_code == 0, result.stderr
    assert re.search(r"^ layer .* total +stage$", result.stdout, re.M)
    doc = json.loads(invoke(runner, *args, "--format", "json").stdout)
    stage = {rec["name"]: rec["stage"] for rec in doc["layers"]}
    ranges = re.findall(r"^ layers\.(\d+)-(\d+)(\.\S+) .* (\d+)$", result.stdout, re.M)
    assert {s for *_, s in ranges} == {"0", "1"}
    for lo, hi, suffix, shown in ranges:
        assert {stage[f"layers.{k}{suffix}"] for k in range(int(lo), int(hi) + 1)} == \
            {int(shown)}


def test_a_long_reason_a_baseline_does_not_apply_is_said_under_the_table(runner):
    """GPT-2 on 5 devices: no model split divides its 12 heads. The reasons (80-110
    characters) used to fold the strategy column into a dozen lines; the rows now say
    "(below)" and each reason follows the table whole, as the plan document has it."""
    args = ("plan", NETWORKS / "gpt2-small.yaml", DGX, "-p", "5", "-b", "10")
    result = invoke(runner, *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(invoke(runner, *args, "--format", "json").stdout)
    skipped = [b for b in doc["baselines"] if not b["applicable"]]
    assert {b["name"] for b in skipped} == {"model", "megatron", "megatron-sp"}
    flat = " ".join(result.stdout.split())
    for b in skipped:
        assert len(b["reason"]) > 60
        assert f"{b['name']}: not applicable (below)" in flat
        assert f"{b['name']} is not applicable: {b['reason']}" in flat
    assert flat.index("megatron-cp: context parallel") < flat.index("model is not applicable")


def test_an_mfu_over_100_percent_says_why(runner):
    """VGG-16 in FP32 on one A100 runs its 3×3 convolutions, as measured, faster than
    their direct multiply count allows at the peak (the roofline divides them by
    Winograd's saving), so its MFU is over 1; the table says why (a review read 129%
    as a bug; 129.1% since the GEMM refit of 2026-12-07, 129.3% before). AlexNet on
    H100s, at 40.8%, gets no such note."""
    r = invoke(runner, "cost", NETWORKS / "vgg16.yaml", CLUSTERS / "dgx-a100.yaml",
               "-p", "1", "-b", "32")
    assert r.exit_code == 0, r.stderr
    assert "MFU 129.1% of the float32 peak (over 100%: convolutions are counted as a " \
        "direct convolution does them, and Winograd's and FFT convolutions multiply less; " \
        "the network's FLOPs count its first layer's input gradient, which is not " \
        "computed)" in " ".join(r.stdout.split()), r.stdout
    doc = json.loads(invoke(runner, "cost", NETWORKS / "vgg16.yaml",
                            CLUSTERS / "dgx-a100.yaml", "-p", "1", "-b", "32",
                            "--format", "json").stdout)
    assert doc["iteration"]["mfu"] == pytest.approx(1.291, abs=5e-4)
    r = invoke(runner, "plan", ALEX, DGX, "-p", "64", "-b", "1024")
    assert "MFU 40.8% of the float32 peak\n" in r.stdout


def test_one_linear_layers_mfu_over_100_percent_is_not_blamed_on_convolutions(runner,
                                                                              tmp_path):
    """Found by an audit: one 8192² linear layer at batch 8,192 in FP32 on an H100 read
    MFU 107.7% "over 100%: ... Winograd's and FFT convolutions multiply less", in a
    network without convolutions. The count (3× the forward) includes the first layer's
    input gradient, which no kernel computes: the two GEMMs that run take 45.3 ms, 2 ×
    2 · 8192³ FLOPs at 48.6 TFLOP/s, 73% of the 66.9 TFLOP/s peak."""
    net = tmp_path / "one.yaml"
    net.write_text("kind: network\nname: one\ninput: [8192]\nlayers:\n"
                   "  - {type: linear, out_features: 8192}\n")
    r = invoke(runner, "cost", net, DGX, "-p", "1", "-b", "8192", "--grid", "1x1",
               "--mode", "data")
    assert r.exit_code == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert re.search(r"MFU 10\d\.\d% of the float32 peak \(over 100%: the network's FLOPs "
                     r"count its first layer's input gradient, which is not computed\)",
                     flat), flat
    assert "Winograd" not in flat


def test_the_leanest_layout_counts_the_baselines_grids(runner):
    """Llama 3 70B on 64 H100s at batch 32 with Adam and ZeRO 1: nothing fits. The
    leanest layout the message quotes is no heavier than Megatron-LM's sequence-parallel
    layout on 8 × 8, a grid of a baseline family none of whose grids fits (the message
    said 171 GiB, and that a smaller batch alone could not fit, where 8 × 8 needs 132.7
    GiB and batch 16 has a plan; found by an audit, 2026-12-07)."""
    args = (NETWORKS / "llama3-70b.yaml", DGX, "-p", "64", "-b", "32", "--optimizer", "adam",
            "--zero", "1")
    r = invoke(runner, "plan", *args)
    assert r.exit_code == 1
    need = re.search(r"the leanest layout found needs ([\d.]+) GiB", r.stderr)
    sp = json.loads(invoke(runner, "cost", *args, "--grid", "8x8", "--mode", "megatron-sp",
                           "--format", "json").stdout)
    assert need and float(need[1]) <= sp["memory"]["peak_bytes"] / 2**30 + 0.05, r.stderr
    assert "a smaller batch (about --batch" in r.stderr
    assert "a smaller batch alone cannot fit" not in r.stderr


def test_microbatches_auto_searches_no_count_whose_parameters_alone_do_not_fit(
        runner, tmp_path, monkeypatch):
    """A question no count of microbatches can fit (a 16,384² linear layer, 3.2 GB of
    FP32 weights, gradients and momentum, on two devices with 1 GiB free: 1.6 GB each
    however it is split) ran one failing search per divisor of the batch (Llama 3 405B on 8 H100s
    at batch 1,024: 11 searches, 10.4 s of CPU, now 1.8 s). The first count is searched,
    for its error's tips; the others are not, since their parameter state alone is over
    the capacity. The error is the first count's, as before."""
    import planner.cli_plan as cli_plan

    net = tmp_path / "wide.yaml"
    net.write_text("kind: network\nname: wide\ninput: [16384]\nlayers:\n"
                   "  - {type: linear, out_features: 16384}\n")
    small = tmp_path / "small.yaml"
    small.write_text((CLUSTERS / "dgx-h100.yaml").read_text().replace(
        "device: H100-SXM", "device: {base: H100-SXM, memory: 2 GiB}"))
    searched = []
    plan_for = cli_plan.plan_for
    monkeypatch.setattr(cli_plan, "plan_for", lambda q, *a: searched.append(
        q.options.microbatches) or plan_for(q, *a))
    args = ("plan", net, small, "-p", "2", "-b", "64", "--optimizer", "momentum")
    auto = invoke(runner, *args, "--microbatches", "auto", "--jobs", "1")
    assert auto.exit_code == 1
    assert searched == [1]
    one = invoke(runner, *args)
    # the same shortfall, said of the one count searched of the 7 divisors of 64
    lead = "planner: no plan fits in memory: "
    head = one.stderr.splitlines()[-1].split("; try ")[0]
    assert one.exit_code == 1 and head.startswith(lead)
    assert auto.stderr.splitlines()[-1].startswith(
        "planner: no plan fits in memory with any of the 7 microbatch counts tried; the "
        "nearest, 1: " + head.removeprefix(lead) + "; try ")
    from planner.evaluate import Options, make_context
    from planner.inputs import load_cluster, load_network
    from planner.search import least_state_bytes

    opts = Options(gpus=2, batch=32, microbatches=2, optimizer="momentum")
    ctx = make_context(load_network(net), load_cluster(small), opts)
    # by hand: 16,384 · 16,384 + 16,384 parameters, half each (8,192 output features),
    # 4 + 4 + 4 bytes (weights, gradients, momentum)
    assert least_state_bytes(ctx, opts) == pytest.approx((16384 * 8192 + 8192) * 12,
                                                         rel=1e-11)


def test_microbatches_auto_with_nothing_fitting_names_the_nearest_count(runner, tmp_path):
    """Where no count of microbatches fits, the error is the count's that came nearest
    (the fewer on a tie), said as such, and a JSON document on standard output lists
    every count tried: it was the first count's (Mixtral 8x7B on 8 H100s at batch 128,
    ZeRO 1: "short by 557.2 GiB" and "about --gpus 128", where 128 microbatches are
    short by 12.65 GiB and 16 GPUs fit; an audit). Two 3 × 3 convolutions on 2,048²
    images, 2 GPUs with 1 GiB free, batch 8: activations shrink with the microbatch, and
    even one sample a device does not fit."""
    net = tmp_path / "tall.yaml"
    net.write_text("kind: network\nname: tall\ninput: [3, 2048, 2048]\nlayers:\n"
                   "  - {type: conv2d, out_channels: 64, kernel: 3, padding: 1}\n"
                   "  - {type: relu}\n"
                   "  - {type: conv2d, out_channels: 64, kernel: 3, padding: 1}\n"
                   "  - {type: relu}\n  - {type: global_avgpool}\n  - {type: flatten}\n"
                   "  - {type: linear, out_features: 10}\n")
    small = tmp_path / "small.yaml"
    small.write_text((CLUSTERS / "dgx-h100.yaml").read_text().replace(
        "device: H100-SXM", "device: {base: H100-SXM, memory: 2 GiB}"))
    args = ("plan", net, small, "-p", "2", "-b", "8", "--optimizer", "momentum",
            "--format", "json")
    auto = invoke(runner, *args, "--microbatches", "auto", "--jobs", "1")
    assert auto.exit_code == 1, auto.stderr
    doc = json.loads(auto.stdout)
    assert doc["plan"] is None
    assert [(t["microbatches"], t["time_s"]) for t in doc["microbatches_auto"]] == [
        (1, None), (2, None), (4, None), (8, None)]
    need = {}
    for m in (1, 2, 4, 8):
        each = invoke(runner, *args, "--microbatches", str(m))
        assert each.exit_code == 1, each.stderr
        need[m] = json.loads(each.stdout)["leanest_peak_bytes"]
        if m == 8:
            last = each.stderr.splitlines()[-1]
    assert need[1] > need[2] > need[4] > need[8]
    assert doc["leanest_peak_bytes"] == need[8]
    lead = "planner: no plan fits in memory: "
    head = last.split("; try ")[0]
    assert head.startswith(lead)
    assert auto.stderr.splitlines()[-1].startswith(
        "planner: no plan fits in memory with any of the 4 microbatch counts tried; the "
        "nearest, 8: " + head.removeprefix(lead) + "; try ")
    assert doc["error"] == auto.stderr.splitlines()[-1].removeprefix("planner: ")


def test_microbatch_counts_are_the_divisors_found_by_their_square_root():
    """``--microbatches auto`` tries the divisors of the batch; they were found by
    scanning 1..batch, which for a batch of 2^40 (accepted) ran for hours before the
    first search (an audit). Checked against the scan where it is cheap."""
    from planner.cli_plan import divisors

    for n in range(1, 600):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(2**40) == [2**k for k in range(41)]
    assert len(divisors(720720)) == 240  # 2^4·3^2·5·7·11·13: 5·3·2·2·2·2 divisors


def test_auto_times_a_cpu_by_the_roofline_whatever_models_are_named(runner):
    """``--estimator auto`` times a CPU by the roofline; named by --models-dir, the
    shipped GPU models timed it instead (an audit), while ``kernels predict`` and
    ``eval`` refuse them that device. The same plan either way."""
    args = (NETWORKS / "alexnet.yaml", CLUSTERS / "cori-knl.yaml", "-p", "4", "-b", "64",
            "--grid", "1x4", "--mode", "data", "--format", "json")
    plain = json.loads(invoke(runner, "cost", *args).stdout)
    named = json.loads(invoke(runner, "cost", *args, "--models-dir",
                              str(ROOT / "models")).stdout)
    assert plain["problem"]["estimator"] == named["problem"]["estimator"] == "roofline"
    assert named["iteration"] == plain["iteration"]


def test_a_sweep_without_a_plan_leaves_an_existing_plot_alone(runner, tmp_path):
    """Found by an audit: a sweep in which no row has a plan (AlexNet at batch 2,048 on
    one GPU of 1 GiB) exits 1, and replaced the PNG named by --plot with empty axes;
    the file is left as it was, and a note says why."""
    pytest.importorskip("matplotlib")  # the test extra installs it: CI runs this
    small = tmp_path / "small.yaml"
    small.write_text((CLUSTERS / "dgx-h100.yaml").read_text().replace(
        "device: H100-SXM", "device: {base: H100-SXM, memory: 2 GiB}"))
    keep = tmp_path / "keep.png"
    keep.write_bytes(b"\x89PNG mine")
    r = invoke(runner, "sweep", ALEX, small, "-p", "1", "-b", "2048", "--plot", keep)
    assert r.exit_code == 1, r.stderr
    assert keep.read_bytes() == b"\x89PNG mine"
    assert f"planner: note: {keep} is not written: no row of the sweep has a plan" \
        in r.stderr


def test_compare_says_the_zero_stage_its_baselines_are_priced_at(runner):
    """Found by an audit: ``compare --zero auto`` priced every baseline at the stage the
    search chose for the plan (3 for AlexNet on 8 H100s: data parallelism 4.829 ms, not
    its 4.216 ms at stage 0) and said nothing of it; the table's title says it, and the
    JSON carries the stages tried (``zero_auto``)."""
    args = (ALEX, DGX, "-p", "8", "-b", "256", "--zero", "auto")
    r = invoke(runner, "compare", *args)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("baselines (each at ZeRO stage 3, the stage --zero auto "
                               "chose for the plan)\n"), r.stdout
    doc = json.loads(invoke(runner, "compare", *args, "--format", "json").stdout)
    assert doc["problem"]["zero"] == 3 and [z["stage"] for z in doc["zero_auto"]] == \
        [0, 1, 2, 3]
    plain = invoke(runner, "compare", ALEX, DGX, "-p", "8", "-b", "256")
    assert plain.stdout.startswith("baselines\n")


def test_a_faster_board_of_a_measured_die_is_told_why_it_is_not_faster(runner, tmp_path):
    """An audit: a cluster file with ``base: H100-SXM`` and twice its peak, bandwidth,
    SMs and L2 was timed 7% faster than an H100, since it keeps the base's chip and the
    kernel models hold an unmeasured board of a measured die to that die's sustained
    FLOP/s (README, *Kernel times*). The rule stays; a note says so, once, and not for a
    device that names a chip of its own, nor for the catalog's boards."""
    base = (CLUSTERS / "dgx-h100.yaml").read_text()
    fast = "{base: H100-SXM, name: H100-x2, peak_flops: {fp32: 133.8 TFLOPS}}"
    cases = {"x2": (fast, True),
             "new": (fast.replace("}}", "}, chip: GX100}"), False),
             "stock": ("H100-SXM", False)}
    for name, (device, noted) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(base.replace("device: H100-SXM", f"device: {device}"))
        r = invoke(runner, "cost", NETWORKS / "gpt2-small.yaml", path, "-p", "8", "-b", "64",
                   "--optimizer", "adam")
        assert r.exit_code == 0, r.stderr
        notes = [line for line in r.stderr.splitlines() if "chip of its own" in line]
        assert len(notes) == (1 if noted else 0), (name, r.stderr)
        if noted:
            assert notes[0] == (
                "planner: note: device 'H100-x2' is a GH100 (its chip) with fp32 peak 2.00× "
                "the H100-SXM's: the kernel models hold a board of a measured die to that "
                "die's sustained FLOP/s, so its compute-bound kernels are timed about as fast "
                "as the H100-SXM's; give it a chip of its own (chip: NAME) if it is a new die")
