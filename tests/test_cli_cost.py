"""``planner cost``: layouts from options, the plan document, exit codes."""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import CLUSTERS, NETWORKS, invoke

ALEX = NETWORKS / "alexnet.yaml"
KNL = CLUSTERS / "cori-knl.yaml"
DGX = CLUSTERS / "dgx-h100.yaml"
PAPER = ["--cost-model", "gholami2018", "--overlap", "none", "-p", "512", "-b", "2048",
         "--estimator", "roofline"]


def cost_json(runner, *args):
    result = invoke(runner, "cost", *args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_default_is_data_parallel_and_schema(runner):
    doc = cost_json(runner, ALEX, KNL, *PAPER)
    assert doc["iteration"]["weight_grad_s"] == pytest.approx(0.0814, rel=0.005)
    assert set(doc["iteration"]) >= {"time_s", "compute_s", "comm_s", "exposed_comm_s"}
    assert set(doc["memory"]) >= {"peak_bytes", "capacity_bytes", "fits"}
    for rec in doc["layers"]:
        assert set(rec) >= {"name", "type", "mode", "grid", "compute_s", "comm"}
        assert set(rec["comm"]) >= {"forward_s", "backward_data_s", "weight_grad_s",
                                    "redistribute_s"}
        if rec["type"] in ("conv2d", "linear"):
            assert (rec["mode"], rec["grid"]) == ("data", [1, 512])
    assert doc["inputs"]["network"]["sha256"]


def test_pins_and_grid(runner):
    doc = cost_json(runner, ALEX, KNL, *PAPER, "--pin", "conv*=data", "--pin",
                    "fc*=model:32x16")
    layouts = {r["name"]: (r["mode"], r["grid"]) for r in doc["layers"]}
    assert layouts["conv3"] == ("data", [1, 512])
    assert layouts["fc7"] == ("model", [32, 16])
    assert layouts["relu7"] == ("model", [32, 16])
    relu7 = next(r for r in doc["layers"] if r["name"] == "relu7")
    assert relu7["follows"] == "fc7"
    data_only = cost_json(runner, ALEX, KNL, *PAPER)
    # the paper's 32×16 FC grid cuts communication almost tenfold (REFERENCES §1: 9.7×)
    ratio = data_only["iteration"]["comm_s"] / doc["iteration"]["comm_s"]
    assert 8.5 < ratio < 10.5


def test_one_grid_domain(runner):
    doc = cost_json(runner, ALEX, KNL, *PAPER, "--grid", "16x32", "--mode", "domain")
    modes = {r["name"]: r["mode"] for r in doc["layers"]}
    assert modes["conv1"] == "domain" and modes["fc6"] == "model"


@pytest.mark.parametrize(("args", "message"), [
    (["--grid", "16x16"], "grid 16x16 has 256 devices but --gpus is 512"),
    (["--grid", "banana"], "invalid grid 'banana'"),
    (["--pin", "nothing*=data"], "--pin 'nothing*=data' matches no layer"),
    (["--pin", "relu*=model"], "matches only layers without weights"),
    (["--pin", "fc*=model", "--pin", "fc6=data"], "--pin 'fc6=data' matches only layers an "
     "earlier pin sets (fc6 by 'fc*=model'); the first pin that matches a layer wins"),
    (["--pin", "fc*=model", "--pin", "f*=data"], "--pin 'f*=data' matches only layers an "
     "earlier pin sets (fc6 by 'fc*=model', fc7 by 'fc*=model', fc8 by 'fc*=model') and "
     "layers without weights;"),
    (["--pin", "fc6=model", "--pin", "fc6=data"], "--pin 'fc6=data' matches the same layers "
     "as the earlier pin 'fc6=model'; the first pin that matches a layer wins: give one"),
    (["--pin", "*relu*=data"], "matches only layers without weights (relu1, relu2, relu3, "
     "relu4, relu5 and 2 more)"),
    (["--pin", "conv1=model:512x1"], "layer 'conv1' cannot use model 512x1: it has 96 "
     "output channels, fewer than P_r=512 (--pin 'conv1=model:512x1')"),
    (["--pin", "fc*=sideways"], "mode must be one of data, model, domain, column, row"),
    (["--pin", "fc*=model:32x16:diagonal"], "placement 'diagonal' must be rows or cols"),
    (["--pin", "fc*=model::cols"], "a placement needs the grid it places, e.g. "
     "'fc*=model:4x2:cols'"),
    (["--grid", "16x32", "--mode", "data"], "--mode data is the grid 1x512; --grid 16x32 "
                                            "needs --mode model, domain, megatron, megatron-sp "
                                            "or megatron-cp"),
])
def test_usage_errors(runner, args, message):
    result = invoke(runner, "cost", ALEX, KNL, *PAPER, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_exact_domain_needs_rows(runner):
    result = invoke(runner, "cost", ALEX, KNL, "-p", "512", "-b", "2048", "--grid", "16x32",
                    "--mode", "domain", "--estimator", "roofline")
    assert result.exit_code == 2
    assert "layer 'conv3' cannot use domain 16x32" in result.stderr
    assert "13 rows" in result.stderr


def test_does_not_fit_exits_1(runner, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("kind: network\nname: big\ninput: [60000]\nlayers:\n"
                   "  - {type: linear, out_features: 60000}\n"
                   "  - {type: linear, out_features: 60000}\n")
    result = invoke(runner, "cost", big, DGX, "-p", "8", "-b", "8", "--estimator", "roofline")
    assert result.exit_code == 1
    assert "does not fit" in result.stderr
    assert "DOES NOT FIT" in result.stdout


def test_yaml_output_is_deterministic(runner, tmp_path):
    out1, out2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for out in (out1, out2):
        result = invoke(runner, "cost", NETWORKS / "resnet50.yaml", DGX, "-p", "64", "-b",
                        "1024", "--format", "yaml", "-o", out, "--estimator", "roofline")
        assert result.exit_code == 0
    assert out1.read_bytes() == out2.read_bytes()
    doc = yaml.safe_load(out1.read_text())
    assert doc["command"] == "cost"


def test_more_gpus_than_cluster(runner):
    result = invoke(runner, "cost", ALEX, CLUSTERS / "pcie-8gpu.yaml", "-p", "16", "-b", "64")
    assert result.exit_code == 2
    assert "more than the cluster has (1 node × 8 = 8)" in result.stderr


def test_table(runner):
    result = invoke(runner, "cost", ALEX, KNL, *PAPER, "--pin", "fc*=model:32x16")
    assert result.exit_code == 0
    assert "model 32x16" in result.stdout and "iteration" in result.stdout


def test_bucket_size_zero_needs_no_unit(runner):
    """--help says '0: one per layer'; a bare 0 is that, the same as '0 B'."""
    bare = cost_json(runner, ALEX, DGX, "-p", "8", "-b", "64", "--bucket-size", "0")
    unit = cost_json(runner, ALEX, DGX, "-p", "8", "-b", "64", "--bucket-size", "0 B")
    assert bare == unit and bare["problem"]["bucket_bytes"] == 0
    r = invoke(runner, "cost", ALEX, DGX, "-p", "8", "-b", "64", "--bucket-size", "25")
    assert r.exit_code == 2 and "a unit is needed" in r.stderr


def test_cost_expands_ranks(runner):
    """``cost --expand-ranks`` lists each group's ranks, as ``plan`` does: model 4x4 on
    16 GPUs puts row groups on consecutive ranks and column groups 4 apart."""
    args = [NETWORKS / "alexnet.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "16", "-b", "64",
            "--grid", "4x4", "--mode", "model", "--format", "json"]
    doc = json.loads(invoke(runner, "cost", *args, "--expand-ranks").stdout)
    (grid,) = [g for g in doc["placement"]["grids"] if g["grid"] == [4, 4]]
    assert grid["row_groups"]["ranks"] == [[4 * c + r for r in range(4)] for c in range(4)]
    assert grid["col_groups"]["ranks"] == [[r + 4 * c for c in range(4)] for r in range(4)]
    plain = json.loads(invoke(runner, "cost", *args).stdout)
    assert all("ranks" not in g["row_groups"] for g in plain["placement"]["grids"])


def test_edited_rank_lists_are_input_errors(runner, tmp_path):
    """launch starts the groups of a grid's rule, so an expanded rank list edited into
    another (or a pipeline stage's lists moved off its first rank) is an input error at
    the list, for validate and launch alike: before, it was accepted and ignored (found
    by an audit)."""
    plan = tmp_path / "p.json"
    invoke(runner, "cost", NETWORKS / "gpt2-small.yaml", DGX, "-p", "8", "-b", "16", "--grid",
           "2x2", "--mode", "megatron", "--pipeline", "2", "--microbatches", "2",
           "--expand-ranks", "-o", plan)
    doc = json.loads(plan.read_text())
    stage1 = next(i for i, g in enumerate(doc["placement"]["grids"]) if g.get("stage") == 1)
    assert doc["placement"]["grids"][stage1]["row_groups"]["ranks"] == [[4, 5], [6, 7]]
    assert invoke(runner, "validate", plan).exit_code == 0
    for edit in ([[4, 5], [7, 6]], [[0, 1], [2, 3]]):
        doc["placement"]["grids"][stage1]["row_groups"]["ranks"] = edit
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        for args in (["validate", bad], ["launch", bad]):
            r = invoke(runner, *args)
            assert r.exit_code == 2, r.output
            assert f"$.placement.grids[{stage1}].row_groups.ranks" in r.stderr
            assert "these are not the row groups of grid 2x2 placed by rows from rank 4" \
                in r.stderr


def test_pin_places_its_own_layers(runner):
    """A pin's placement applies to its layers, ahead of --placement (which places the
    pins without one): a plan whose layers differ in placement can be priced again."""
    args = [ALEX, DGX, "-p", "8", "-b", "64"]
    doc = cost_json(runner, *args, "--pin", "fc6=model:4x2:cols", "--pin", "fc7=model:4x2",
                    "--pin", "*=data")
    placed = {r["name"]: r["placement"] for r in doc["layers"]}
    assert (placed["fc6"], placed["fc7"]) == ("cols", "rows")
    # --placement sets pins without one of their own, never one that has
    doc2 = cost_json(runner, *args, "--pin", "fc6=model:4x2:cols", "--pin", "fc7=model:4x2",
                     "--pin", "*=data", "--placement", "cols")
    placed2 = {r["name"]: r["placement"] for r in doc2["layers"]}
    assert (placed2["fc6"], placed2["fc7"]) == ("cols", "cols")
    doc3 = cost_json(runner, *args, "--pin", "fc6=model:4x2:rows", "--pin", "fc7=model:4x2",
                     "--pin", "*=data", "--placement", "cols")
    placed3 = {r["name"]: r["placement"] for r in doc3["layers"]}
    assert (placed3["fc6"], placed3["fc7"]) == ("rows", "cols")


def test_chunks_without_grids_are_input_errors(runner, tmp_path):
    """A pipeline edited to two model chunks a stage whose placement has grids for one:
    the chunks launch would start have no groups (found by an audit: accepted)."""
    plan = tmp_path / "p.yaml"
    invoke(runner, "cost", NETWORKS / "gpt2-small.yaml", DGX, "-p", "8", "-b", "16",
           "--grid", "2x2", "--mode", "megatron", "--pipeline", "2", "--microbatches", "2",
           "-o", plan)
    assert invoke(runner, "validate", plan).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(plan.read_text().replace("    schedule: 1f1b\n",
                                            "    virtual_stages: 2\n    schedule: 1f1b\n", 1))
    for args in (["validate", bad], ["launch", bad]):
        r = invoke(runner, *args)
        assert r.exit_code == 2 and "no grid for model chunk 1 of the 2 a stage" in r.stderr


def test_a_plans_layouts_read_back_as_pins(runner):
    """Every layer's layout as the plan writes it (mode, grid and placement, `rows` on a
    grid of one dimension too) is a pin `cost` takes, and prices the plan's step: an
    audit found `--pin wte=data:1x8:rows`, copied from a plan, refused (exit 2) for
    placing a grid of one dimension."""
    import json

    gpt2 = NETWORKS / "gpt2-small.yaml"
    dgx = CLUSTERS / "dgx-h100.yaml"
    args = (gpt2, dgx, "-p", "8", "-b", "16", "--format", "json")
    plan = json.loads(invoke(runner, "plan", *args).stdout)
    pins = []
    for rec in plan["layers"]:
        if "follows" in rec:
            continue
        pr, pc = rec["grid"]
        pins += ["--pin", f"{rec['name']}={rec['mode']}:{pr}x{pc}:{rec['placement']}"]
    assert any(p.endswith(":1x8:rows") for p in pins)
    cost = invoke(runner, "cost", *args, *pins)
    assert cost.exit_code == 0, cost.stderr
    assert json.loads(cost.stdout)["iteration"]["time_s"] == plan["iteration"]["time_s"]
