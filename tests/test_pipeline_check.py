"""Given layouts in pipeline stages: ``planner cost --pipeline`` and training
configurations with ``microbatches`` and ``pipeline`` (``planner check``, ``validate``).

A given strategy is priced by the same composition as the search's plans
(:mod:`planner.pipeline`): the tests check that pricing a searched plan's own layouts and
stages gives back its time exactly, that ``cost`` and ``check`` price one strategy alike,
and that a stale or edited pipelined plan is caught.
"""

from __future__ import annotations

import json

import pytest
import yaml

from planner.cli_plan import run_search
from planner.evaluate import evaluate
from planner.pipeline import one_f_one_b_finish, price_pipeline, search_pipeline

from .conftest import EXAMPLES, invoke
from .test_pipeline import _context, _net, _question

CL = str(EXAMPLES / "clusters" / "dgx-h100.yaml")


@pytest.mark.parametrize("tie", [True, False])
def test_pricing_a_searched_pipeline_gives_back_its_time(tie):
    """The search's layouts and stages, priced as given layouts, cost what the search
    said, stage by stage (the layer indices of each stage map back to the network's)."""
    net = _net(blocks=4, tie=tie)
    q = _question(net)
    res = search_pipeline(q, 2, "time", (), run_search, _context(q))
    layouts = {st.lo + i: lay for st in res.stages
               for i, lay in st.result.best.assignment.items()}
    assert sorted(layouts) == [layer.index for layer in net.layers if layer.has_weights]
    bounds = [st.lo for st in res.stages] + [len(net.layers)]
    priced = price_pipeline(q, 2, layouts, lambda sq, a: evaluate(sq.ctx, sq.options, a),
                            _context(q), bounds)
    assert [(st.lo, st.hi) for st in priced.stages] == [(st.lo, st.hi) for st in res.stages]
    for got, want in zip(priced.stages, res.stages, strict=True):
        assert got.microbatch_s == pytest.approx(want.microbatch_s, rel=1e-12)
        assert got.tail_s == pytest.approx(want.tail_s, rel=1e-12, abs=1e-15)
        assert got.evaluation.memory.peak == want.evaluation.memory.peak
    assert priced.time_s == pytest.approx(res.time_s, rel=1e-12)
    assert priced.partitions == [{"bounds": bounds, "time_s": priced.time_s,
                                  "outcome": "plan"}]


COST = ("-p", "16", "-b", "32", "--microbatches", "8", "--pipeline", "2", "--grid", "2x4",
        "--mode", "megatron", "--estimator", "roofline")


def test_cost_pipeline_prices_the_grid_in_every_stage(runner, net_file):
    args = ("cost", net_file, CL, *COST, "--format", "json")
    out = invoke(runner, *args)
    assert out.exit_code == 0, out.output
    assert invoke(runner, *args).output == out.output  # byte-identical
    doc = json.loads(out.stdout)
    assert doc["command"] == "cost"
    assert doc["problem"]["pipeline"] == {"stages": 2, "schedule": "1f1b"}
    assert "baselines" not in doc and "search" not in doc
    stages = doc["pipeline"]["stage_plans"]
    assert [s["ranks"] for s in stages] == [[0, 7], [8, 15]]
    weighted = [r for r in doc["layers"] if "follows" not in r]
    # the grid is a stage's: 2 x 4 on 16 / 2 devices; Megatron's pairs on the MLPs
    assert {tuple(r["grid"]) for r in weighted} == {(2, 4)}
    assert {r["mode"] for r in weighted if r["name"].endswith(".up")} == {"column"}
    assert {r["mode"] for r in weighted if r["name"].endswith(".down")} == {"row"}
    t = [s["microbatch_s"] for s in stages]
    step = sum(t) + 7 * max(t) + max(s["tail_s"] for s in stages) + \
        doc["pipeline"]["tied_allreduce_s"]
    assert doc["iteration"]["time_s"] == pytest.approx(step, rel=1e-3)  # 4 digits kept
    table = invoke(runner, "cost", net_file, CL, *COST)
    assert table.exit_code == 0 and "pipeline 2 stages, 8 microbatches" in table.output


def test_cost_pipeline_that_does_not_fit_exits_1():
    from click.testing import CliRunner

    out = invoke(CliRunner(), "cost", str(EXAMPLES / "networks" / "llama3-8b.yaml"), CL,
                 "-p", "16", "-b", "64", "--pipeline", "2", "--grid", "1x8",
                 "--estimator", "roofline", "--format", "json")
    assert out.exit_code == 1, out.output
    assert "the layout does not fit: pipeline stage " in out.stderr
    doc = json.loads(out.stdout)
    assert not all(s["fits"] for s in doc["pipeline"]["stage_plans"])


@pytest.mark.parametrize("extra, words", [
    (("--pipeline", "2", "--grid", "4x4"),
     "grid 4x4 has 16 devices but a stage's device count (--gpus 16 / --pipeline 2) is 8"),
    (("--pipeline", "3"), "does not divide the 16 devices"),
    (("--pipeline", "2", "--cost-model", "gholami2018"), "--cost-model exact"),
    # a stage may start at each of the 8 residual blocks and at the head: 10 stages
    (("--pipeline", "16"), "at most 10 stages"),
    (("--microbatches", "8", "--grid", "1x16"),
     "its batch split P_c=16 is larger than the microbatch 4"),
])
def test_bad_cost_pipelines_exit_2(runner, net_file, extra, words):
    out = invoke(runner, "cost", net_file, CL, "-p", "16", "-b", "32", *extra,
                 "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert "Traceback" not in out.output


# -- training configurations --------------------------------------------------------------

def _config(tmp_path, net_file, strategy, **keys):
    lines = ["kind: training", f"network: {net_file}", f"cluster: {CL}", "gpus: 16",
             "batch: 32", *(f"{k}: {v}" for k, v in keys.items()), "strategy:",
             *(f"  {line}" for line in strategy), "max_slowdown: 1.0"]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def config_exits_2_at(runner, cfg, line, words):
    """``check`` refuses the configuration: exit 2, ``words`` in the message, which names
    the key's line, and no traceback."""
    out = invoke(runner, "check", str(cfg), "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert f"c.yaml:{line}:" in out.output
    assert "Traceback" not in out.output


def _check(runner, cfg):
    out = invoke(runner, "check", str(cfg), "--estimator", "roofline", "--format", "json")
    return out, json.loads(out.stdout) if out.stdout.startswith("{") else None


def test_check_a_pipelined_plan_prices_it_as_planned(runner, net_file, tmp_path):
    plan = invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32", "--microbatches",
                  "8", "--pipeline", "2", "--estimator", "roofline", "--format", "yaml")
    assert plan.exit_code == 0, plan.output
    (tmp_path / "plan.yaml").write_text(plan.stdout)
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 0, out.output
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert all(c["ok"] for c in checks.values())
    doc = yaml.safe_load(plan.stdout)
    # re-priced from the plan's layouts and stages: the plan's own time, and the optimum
    # (the search with as many stages) is the plan
    assert checks["speed"]["time_s"] == pytest.approx(doc["iteration"]["time_s"], rel=1e-3)
    assert checks["speed"]["ratio"] == pytest.approx(1.0, abs=1e-12)
    assert checks["memory"]["peak_bytes"] == pytest.approx(doc["memory"]["peak_bytes"],
                                                           rel=1e-3)
    assert "pipeline stage" in checks["memory"]["message"]
    # validate reads it too
    assert invoke(runner, "validate", str(cfg)).exit_code == 0

    # stale: another count of microbatches or of stages (either way round)
    for keys, words in (({"microbatches": 4, "pipeline": 2},
                         "the plan is for microbatches=8, the configuration says 4"),
                        ({"microbatches": 8, "pipeline": 4},
                         "the plan is for pipeline=2, the configuration says 4"),
                        ({"microbatches": 8}, "the plan is for pipeline=2, the "
                                              "configuration says 1")):
        cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], **keys)
        out, data = _check(runner, cfg)
        assert out.exit_code == 1, out.output
        assert words in data["configs"][0]["checks"][0]["message"]

    # an edited plan: a layer moved to the other stage, out of order
    edited = yaml.safe_load(plan.stdout)
    edited["layers"][0]["stage"] = 1
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 1, out.output
    assert "do not cut 'tiny-lm' into 2 stages" in data["configs"][0]["checks"][0]["message"]
    edited["layers"][0]["stage"] = "first"
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    out, _ = _check(runner, cfg)
    assert out.exit_code == 2 and "expected the layer's pipeline stage, 0 to 1" in out.output


def test_check_a_plan_with_microbatches_against_a_config_without(runner, net_file,
                                                                  tmp_path):
    plan = invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32", "--microbatches",
                  "4", "--estimator", "roofline", "--format", "yaml")
    (tmp_path / "plan.yaml").write_text(plan.stdout)
    out, data = _check(runner, _config(tmp_path, net_file, ["plan: plan.yaml"]))
    assert out.exit_code == 1, out.output
    assert "the plan is for microbatches=4, the configuration says 1" in \
        data["configs"][0]["checks"][0]["message"]
    out, data = _check(runner, _config(tmp_path, net_file, ["plan: plan.yaml"],
                                       microbatches=4))
    assert out.exit_code == 0, out.output


def test_check_a_grid_in_stages_prices_as_cost_does(runner, net_file, tmp_path):
    cfg = _config(tmp_path, net_file, ["grid: 2x4", "mode: megatron"], microbatches=8,
                  pipeline=2)
    out, data = _check(runner, cfg)
    cost = json.loads(invoke(runner, "cost", net_file, CL, *COST, "--format", "json").stdout)
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert checks["speed"]["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)
    assert checks["memory"]["peak_bytes"] == pytest.approx(cost["memory"]["peak_bytes"],
                                                           rel=1e-3)
    optimum = json.loads(invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32",
                                "--microbatches", "8", "--pipeline", "2", "--estimator",
                                "roofline", "--format", "json").stdout)
    assert checks["speed"]["optimum_s"] == pytest.approx(optimum["iteration"]["time_s"],
                                                         rel=1e-3)
    assert out.exit_code == (0 if checks["speed"]["ratio"] <= 1.0 + 1e-9 else 1)
    assert "with 2 pipeline stages" in checks["speed"]["message"]


def test_gradient_accumulation_in_a_config_is_the_command_lines(runner, net_file, tmp_path):
    cfg = _config(tmp_path, net_file, ["grid: 1x16"], microbatches=2)
    out, data = _check(runner, cfg)
    assert out.exit_code in (0, 1), out.output
    cost = json.loads(invoke(runner, "cost", net_file, CL, "-p", "16", "-b", "32",
                             "--microbatches", "2", "--grid", "1x16", "--estimator",
                             "roofline", "--format", "json").stdout)
    speed = data["configs"][0]["checks"][1]
    assert speed["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)


@pytest.mark.parametrize("keys, strategy, line, words", [
    ({"pipeline": 3}, ["grid: 1x16"], 6,
     "3 stages do not split gpus 16 into equal stages"),
    ({"pipeline": 2}, ["grid: 4x4"], 8,
     "grid 4x4 has 16 devices but a stage's devices (gpus 16 / pipeline 2) is 8"),
    ({"pipeline": 2}, ["pins: ['blk*=model:16x1']"], 8,
     "a stage's devices (gpus 16 / pipeline 2) is 8"),
    ({"microbatches": 5}, ["grid: 1x16"], 6,
     "batch 32 does not split into 5 equal microbatches"),
    ({"pipeline": 2, "cost_model": "gholami2018"}, ["grid: 1x8"], 6,
     "pipeline: 2 needs 'cost_model: exact'"),
    ({"pipeline": 16}, ["grid: 1x1"], 6, "'tiny-lm' can be cut into at most 10 stages"),
    ({"microbatches": 8}, ["grid: 1x16"], 8,
     "its batch split P_c=16 is larger than the microbatch 4"),
])
def test_bad_pipeline_configs_exit_2_at_the_key(runner, net_file, tmp_path, keys, strategy,
                                                line, words):
    cfg = _config(tmp_path, net_file, strategy, **keys)
    out = invoke(runner, "check", str(cfg), "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert f"c.yaml:{line}:" in out.output
    assert "Traceback" not in out.output


# -- stage boundaries given by hand --------------------------------------------------------

def test_cost_with_stage_starts_runs_the_stages_given(runner, net_file):
    """tiny-lm's stages may start at each residual block and at the head: starting the
    second stage at the head puts all 8 blocks in the first."""
    args = ("cost", net_file, CL, *COST, "--format", "json")
    given = invoke(runner, *args, "--stage-starts", "head")
    assert given.exit_code == 0, given.output
    doc = json.loads(given.stdout)
    stages = doc["pipeline"]["stage_plans"]
    assert [s["layers"] for s in stages] == [["wte", "blk.3.mlp.add"], ["head", "head"]]
    assert [p["bounds"] for p in doc["pipeline"]["partitions"]] == [["wte", "head"]]
    span = max(one_f_one_b_finish([(s["passes_s"]["forward"], s["passes_s"]["backward"])
                                   for s in stages], 2, 1, 8))
    assert doc["iteration"]["time_s"] == pytest.approx(
        span + max(s["tail_s"] for s in stages) + doc["pipeline"]["tied_allreduce_s"],
        rel=1e-3)
    # the balanced stages, given by hand, price as the balanced run does
    balanced = json.loads(invoke(runner, *args).stdout)
    start = balanced["pipeline"]["stage_plans"][1]["layers"][0]
    same = json.loads(invoke(runner, *args, "--stage-starts", start).stdout)
    assert same["iteration"] == balanced["iteration"]
    assert same["pipeline"]["stage_plans"] == balanced["pipeline"]["stage_plans"]
    # interleaved: 4 chunks need 3 starts
    four = invoke(runner, *args, "--virtual-stages", "2", "--stage-starts",
                  "blk.1.attn.ln,blk.2.attn.ln,blk.3.attn.ln")
    assert four.exit_code == 0, four.output
    recs = json.loads(four.stdout)["pipeline"]["stage_plans"]
    assert [r["layers"][0] for r in recs] == ["wte", "blk.1.attn.ln", "blk.2.attn.ln",
                                              "blk.3.attn.ln"]


@pytest.mark.parametrize("extra, words", [
    (("--stage-starts", "nope"), "--stage-starts: 'nope' is not a layer of 'tiny-lm'\n"),
    # a block's name, or a near miss, says which layer was meant (an audit)
    (("--stage-starts", "blk.1.attn"), "--stage-starts: 'blk.1.attn' is not a layer of "
     "'tiny-lm'; its first layer a stage may start at is 'blk.1.attn.ln'"),
    (("--stage-starts", "blk.1.attn.lnx"), "'blk.1.attn.lnx' is not a layer of 'tiny-lm'; "
     "did you mean 'blk.1.attn.ln'?"),
    (("--stage-starts", "blk.1.attn.sa"),
     "a stage cannot start at 'blk.1.attn.sa': a stage starts where one tensor alone "
     "crosses"),
    (("--stage-starts", "blk.1.attn.ln,blk.2.attn.ln"),
     "2 stages need 1 start (the first stage starts at the network's first layer), got 2"),
    (("--virtual-stages", "2", "--stage-starts", "blk.2.attn.ln,blk.1.attn.ln,head"),
     "'blk.1.attn.ln' comes before or at the previous stage's start"),
])
def test_bad_stage_starts_exit_2(runner, net_file, extra, words):
    out = invoke(runner, "cost", net_file, CL, *COST, *extra)
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert "Traceback" not in out.output
    out = invoke(runner, "cost", net_file, CL, "-p", "16", "-b", "32", "--stage-starts",
                 "head", "--estimator", "roofline")
    assert out.exit_code == 2
    assert "--stage-starts places the stages of a pipeline" in out.output


def test_config_stage_starts_price_as_cost_does(runner, net_file, tmp_path):
    cfg = _config(tmp_path, net_file, ["grid: 2x4", "mode: megatron"], microbatches=8,
                  pipeline=2, stage_starts="[blk.2.attn.ln]")
    out, data = _check(runner, cfg)
    assert out.exit_code in (0, 1), out.output
    cost = json.loads(invoke(runner, "cost", net_file, CL, *COST, "--stage-starts",
                             "blk.2.attn.ln", "--format", "json").stdout)
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert checks["speed"]["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)
    assert checks["memory"]["peak_bytes"] == pytest.approx(cost["memory"]["peak_bytes"],
                                                           rel=1e-3)
    assert invoke(runner, "validate", str(cfg)).exit_code == 0


@pytest.mark.parametrize("keys, strategy, line, words", [
    ({"pipeline": 2, "microbatches": 8, "stage_starts": "[blk.1.attn.sa]"}, "grid: 2x4", 8,
     "a stage cannot start at 'blk.1.attn.sa'"),
    ({"pipeline": 2, "microbatches": 8, "stage_starts": "[blk.1.attn.ln, head]"},
     "grid: 2x4", 8, "2 stages need 1 start (the first stage starts at the network's"),
    ({"pipeline": 2, "microbatches": 8, "stage_starts": "[head, blk.1.attn.ln]"},
     "grid: 2x4", 8, "'blk.1.attn.ln' comes before or at the previous stage's start"),
    ({"stage_starts": "[head]"}, "grid: 1x16", 6,
     "stage_starts places the stages of a pipeline"),
    ({"pipeline": 2, "microbatches": 8, "stage_starts": "[head]"}, "plan: plan.yaml", 8,
     "a plan carries its own stages"),
    ({"pipeline": 2, "microbatches": 8, "stage_starts": "[1, 2]"}, "grid: 2x4", 8,
     "expected a list of layer names"),
])
def test_bad_config_stage_starts_exit_2_at_the_key(runner, net_file, tmp_path, keys,
                                                   strategy, line, words):
    (tmp_path / "plan.yaml").write_text("kind: plan\n")
    config_exits_2_at(runner, _config(tmp_path, net_file, [strategy], **keys), line, words)
