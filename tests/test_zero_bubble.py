"""The ZB-H1 pipeline schedule (``--schedule zb-h1``).

Qi, Wan, Huang and Lin, "Zero bubble (almost) pipeline parallelism", ICLR 2024: each
backward pass is split into B (the input gradients, which the stage before waits for)
and W (the weight gradients, which nobody waits for); ZB-H1 keeps 1F1B's order of F and
B passes and runs the W passes where 1F1B leaves the stage idle, holding no more
microbatches than 1F1B's first stage. The paper's Table 2 (all stages alike): 1F1B's
bubble ``(S − 1)·(F + B + W)``, ZB-H1's ``(S − 1)·(F + B − W)``. The figures below are
worked out by hand from those definitions; a reference list scheduler written here
(not the planner's) gives 1F1B's own step for the property test.
"""

from __future__ import annotations

import functools
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as hs

from planner.cli_plan import run_search
from planner.pipeline import price_pipeline, search_pipeline, zero_bubble_finish
from planner.schedules import ZERO_BUBBLE

from .conftest import EXAMPLES, invoke
from .test_pipeline import _context, _net, _question

CL = str(EXAMPLES / "clusters" / "dgx-h100.yaml")


# -- the schedule --------------------------------------------------------------------------

def test_two_stages_two_microbatches_by_hand():
    """F = B = W = 1 on two stages, two microbatches.

    Stage 1: F0 [1, 2], B0 [2, 3], F1 [3, 4] (its input was ready at 2), B1 [4, 5], then
    W0 [5, 6] and W1 [6, 7]. Stage 0: F0 [0, 1], F1 [1, 2], idle to B0 [3, 4] (stage 1's
    B0 ends at 3; no W is pending yet), W0 [4, 5] while it waits for stage 1's B1 (ends
    at 5), B1 [5, 6], W1 [6, 7]. Both end at 7 = 2·3 + 1·(1 + 1 − 1); 1F1B takes 9."""
    assert zero_bubble_finish([(1.0, 1.0, 1.0)] * 2, 2) == [7.0, 7.0]


def test_unequal_stages_by_hand():
    """Stage 0 (1, 1, 1), stage 1 (2, 2, 2), two microbatches.

    Stage 1: F0 [1, 3], B0 [3, 5], F1 [5, 7], B1 [7, 9], W0 [9, 11], W1 [11, 13].
    Stage 0: F0 [0, 1], F1 [1, 2], B0 [5, 6] (after stage 1's B0), W0 [6, 7] while
    waiting for stage 1's B1, B1 [9, 10], W1 [10, 11]. 1F1B: stage 1 runs B and W
    together, F0 [1, 3], BW0 [3, 7], F1 [7, 9], BW1 [9, 13]; stage 0's BW1 waits
    for 13 and ends at 15 (Σ t + (M − 1)·max t = 3 + 6 + 6)."""
    assert zero_bubble_finish([(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)], 2) == [11.0, 13.0]


def test_one_microbatch_by_hand():
    """M = 1 < S = 4, F = B = W = 1: the forward passes end at 1, 2, 3, 4; the backward
    passes at 5 (stage 3), 6, 7, 8 (stage 0); each stage's W follows its B, so the stages
    end at 9, 8, 7, 6. 1F1B (B and W together) would end at 4 + 4·2 = 12."""
    assert zero_bubble_finish([(1.0, 1.0, 1.0)] * 4, 1) == [9.0, 8.0, 7.0, 6.0]


def test_the_sooner_of_two_ways_to_fill_a_wait():
    """Stage 0 (F, B, W) = (3, 1, 3), stage 1 (1, 3, 2), three microbatches; both
    stages' orders are F0 F1 B0 F2 B1 B2 (stage 0) and F0 B0 F1 B1 F2 B2 (stage 1),
    and at most two microbatches are held short of their W.

    Up to stage 1's B1 [8, 11] and stage 0's B1 [14, 15] the two ways agree (stage 0
    ran W0 [8, 11] before F2 [11, 14], at its cap). Then stage 1 waits from 11 for
    stage 0's F2 (ends 14) with W0 and W1 pending. Running a W whenever it would wait:
    W0 [11, 13], W1 [13, 15], F2 [15, 16], B2 [16, 19], W2 [19, 21]; stage 0 runs W1
    [15, 18] while waiting for B2, then B2 [19, 20], W2 [20, 23]: a step of 23. Only a
    W that ends in the wait: W0 [11, 13], F2 [14, 15], B2 [15, 18], W1 and W2 to 22;
    stage 0: W1 [15, 18], B2 [18, 19], W2 [19, 22]: 22, kept."""
    passes = [(3.0, 1.0, 3.0), (1.0, 3.0, 2.0)]
    assert zero_bubble_finish(passes, 3) == [22.0, 22.0]


@pytest.mark.parametrize("passes", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5),
                                    (2.0, 1.0, 1.0), (3.0, 2.5, 0.25)])
@pytest.mark.parametrize("stages, microbatches", [(2, 2), (2, 7), (3, 3), (4, 4), (4, 9),
                                                  (4, 16), (8, 8), (8, 32)])
def test_equal_stages_give_the_papers_bubble(passes, stages, microbatches):
    """With every stage alike, W ≤ F and M ≥ S: a step of M·(F + B + W) + (S − 1)·(F +
    B − W) (the paper's Table 2), to the last bit of the sums."""
    f, b, w = passes
    span = max(zero_bubble_finish([passes] * stages, microbatches))
    assert span == pytest.approx(microbatches * (f + b + w) + (stages - 1) * (f + b - w),
                                 rel=1e-12)


def one_f_one_b(passes: list[tuple[float, float, float]], m: int) -> float:
    """1F1B's step from its definition, independently of the planner: stage s runs
    min(S − s − 1, M) forwards, then a forward and a backward (B and W together) until
    the forwards run out, then the backwards; a pass starts when the stage's previous
    pass and its input (the stage before's forward, the stage after's backward, the
    last stage's own forward) have ended."""
    count = len(passes)
    orders = []
    for s in range(count):
        warm = min(count - s - 1, m)
        order = [("F", k) for k in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k), ("B", k)]
        order += [("B", k) for k in range(m - warm, m)]
        orders.append(order)
    place = {(s, op): i for s in range(count) for i, op in enumerate(orders[s])}

    @functools.cache
    def end(s: int, i: int) -> float:
        kind, k = orders[s][i]
        start = end(s, i - 1) if i else 0.0
        if kind == "F" and s > 0:
            start = max(start, end(s - 1, place[(s - 1, ("F", k))]))
        if kind == "B":
            t = s if s == count - 1 else s + 1
            start = max(start, end(t, place[(t, ("F" if t == s else "B", k))]))
        f, b, w = passes[s]
        return start + (f if kind == "F" else b + w)

    return max(end(s, len(orders[s]) - 1) for s in range(count))


def test_the_reference_1f1b_by_hand():
    assert one_f_one_b([(1.0, 1.0, 1.0)] * 2, 2) == 9.0
    assert one_f_one_b([(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)], 2) == 15.0


_pass = hs.floats(0.01, 2.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(hs.lists(hs.tuples(_pass, _pass, _pass), min_size=1, max_size=6),
       hs.integers(1, 12))
def test_never_slower_than_1f1b_and_no_faster_than_the_busiest_stage(passes, m):
    """Running a W while the stage would wait, never in place of a pass that is ready
    (unless the memory cap asks), ZB-H1 ends no later than 1F1B on the same stages, and
    no step is shorter than the busiest stage's M·(F + B + W)."""
    span = max(zero_bubble_finish(passes, m))
    assert span <= one_f_one_b(passes, m) * (1 + 1e-12)
    assert span >= m * max(f + b + w for f, b, w in passes) * (1 - 1e-12)


# -- planning ------------------------------------------------------------------------------

def _weight_kernels(layer) -> int:
    """The weight-gradient kernels of a layer of the test network (planner.network's
    layer_kernels): a linear's one GEMM dW = dYᵀ·X (the tied head's too), an
    attention's two, for the fused QKV and the output projections, the token table's
    scatter-add; norms, activations and adds have no weights to differentiate."""
    return {"linear": 1, "attention": 2, "embedding": 1}.get(layer.type, 0)


def _zb(microbatches=4):
    net = _net(blocks=4)
    q = _question(net, microbatches=microbatches)
    return net, q, search_pipeline(q, 2, "time", (), run_search, _context(q),
                                   schedule=ZERO_BUBBLE)


def test_zb_h1_step_composes_the_stage_passes():
    """Every kernel takes 10 µs (the test estimator), so a stage's W is 10 µs per
    weight-gradient kernel of its layers; F and B split the rest of its microbatch,
    each with one of its two sends. The step is the schedule's span plus the slowest
    tail and the tied weights' all-reduce; every stage holds min(S, M) microbatches."""
    net, _, res = _zb()
    m, s = 4, 2
    assert res.schedule == ZERO_BUBBLE
    assert [st.inflight for st in res.stages] == [min(s, m)] * s
    for st in res.stages:
        kernels = sum(_weight_kernels(layer) for layer in net.layers[st.lo:st.hi])
        assert kernels > 0
        assert st.weight_pass_s == pytest.approx(kernels * 1e-5, rel=1e-12)
        assert st.forward_pass_s == pytest.approx(st.evaluation.forward_s + st.send_s / 2,
                                                  rel=1e-12)
        assert st.forward_pass_s + st.backward_pass_s + st.weight_pass_s == \
            pytest.approx(st.microbatch_s, rel=1e-12)
    passes = [(st.forward_pass_s, st.backward_pass_s, st.weight_pass_s)
              for st in res.stages]
    span = max(zero_bubble_finish(passes, m))
    busiest = max(st.microbatch_s for st in res.stages)
    assert res.bubble_s == pytest.approx(span - m * busiest, rel=1e-12)
    assert res.time_s == pytest.approx(span + max(st.tail_s for st in res.stages)
                                       + res.ties_s, rel=1e-12)


def test_zb_h1_beats_1f1b_on_the_same_layouts():
    """The 1F1B plan's own stages and layouts, priced under ZB-H1: the same stage
    times, a shorter step (its W passes fill 1F1B's fill and drain)."""
    net = _net(blocks=4)
    q = _question(net)
    plain = search_pipeline(q, 2, "time", (), run_search, _context(q))
    layouts = {st.lo + i: lay for st in plain.stages
               for i, lay in st.result.best.assignment.items()}
    bounds = [st.lo for st in plain.stages] + [len(net.layers)]
    from planner.evaluate import evaluate

    zb = price_pipeline(_question(net), 2, layouts,
                        lambda sq, a: evaluate(sq.ctx, sq.options, a), _context(q), bounds,
                        schedule=ZERO_BUBBLE)
    assert [st.microbatch_s for st in zb.stages] == \
        pytest.approx([st.microbatch_s for st in plain.stages], rel=1e-12)
    assert zb.time_s < plain.time_s
    # the later stage holds two microbatches where 1F1B held one
    assert [st.inflight for st in plain.stages] == [2, 1]
    assert [st.inflight for st in zb.stages] == [2, 2]
    assert zb.memories[1].activations > plain.memories[1].activations


# -- the command line ----------------------------------------------------------------------

PLAN = ("-p", "16", "-b", "32", "--microbatches", "8", "--pipeline", "2",
        "--estimator", "roofline")


def test_zb_h1_plan_document_table_and_launch(runner, net_file, tmp_path):
    args = ("plan", net_file, CL, *PLAN, "--schedule", "zb-h1", "--format", "yaml")
    first = invoke(runner, *args)
    assert first.exit_code == 0, first.output
    assert invoke(runner, *args).output == first.output  # byte-identical
    doc = yaml.safe_load(first.stdout)
    assert doc["problem"]["pipeline"] == {"stages": 2, "schedule": "zb-h1"}
    pipe = doc["pipeline"]
    assert pipe["schedule"] == "zb-h1"
    recs = pipe["stage_plans"]
    assert [r["inflight"] for r in recs] == [2, 2]
    for r in recs:
        p = r["passes_s"]
        assert p["forward"] + p["input_grad"] + p["weight_grad"] == \
            pytest.approx(r["microbatch_s"], rel=1e-3)  # 4 digits kept
        assert p["weight_grad"] > 0
    passes = [(r["passes_s"]["forward"], r["passes_s"]["input_grad"],
               r["passes_s"]["weight_grad"]) for r in recs]
    span = max(zero_bubble_finish(passes, 8))
    assert doc["iteration"]["time_s"] == pytest.approx(
        span + max(r["tail_s"] for r in recs) + pipe["tied_allreduce_s"], rel=1e-3)
    plain = yaml.safe_load(invoke(runner, *args[:-4], "--format", "yaml").stdout)
    for r in plain["pipeline"]["stage_plans"]:  # 1F1B's: a forward and a backward pass
        assert set(r["passes_s"]) == {"forward", "backward"}
        assert r["passes_s"]["forward"] + r["passes_s"]["backward"] == \
            pytest.approx(r["microbatch_s"], rel=1e-3)
    assert doc["iteration"]["time_s"] < plain["iteration"]["time_s"]
    table = invoke(runner, *args[:-2])
    assert table.exit_code == 0
    assert "pipeline 2 stages, 8 microbatches (zb-h1)" in table.output
    assert "F / B / W" in table.output
    plan = tmp_path / "plan.yaml"
    plan.write_text(first.stdout)
    env = invoke(runner, "launch", str(plan), "--emit", "env")
    assert env.exit_code == 0, env.output
    assert "PLANNER_PIPELINE_SCHEDULE=zb-h1" in env.output
    # the header names the schedule too (it said 1F1B; found by an audit)
    assert ", ZB-H1 (zero-bubble 1F1B, the weight gradients deferred);" in env.output
    assert "1F1B;" not in env.output.replace("zero-bubble 1F1B", "")


def test_cost_and_check_price_a_zb_h1_grid_alike(runner, net_file, tmp_path):
    from .test_pipeline_check import _check, _config

    cost = json.loads(invoke(runner, "cost", net_file, CL, *PLAN, "--grid", "2x4",
                             "--mode", "megatron", "--schedule", "zb-h1",
                             "--format", "json").stdout)
    assert cost["pipeline"]["schedule"] == "zb-h1"
    plain = json.loads(invoke(runner, "cost", net_file, CL, *PLAN, "--grid", "2x4",
                              "--mode", "megatron", "--format", "json").stdout)
    assert cost["iteration"]["time_s"] < plain["iteration"]["time_s"]
    cfg = _config(tmp_path, net_file, ["grid: 2x4", "mode: megatron"], microbatches=8,
                  pipeline=2, schedule="zb-h1")
    out, data = _check(runner, cfg)
    assert out.exit_code in (0, 1), out.output
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert checks["speed"]["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)
    assert "with 2 pipeline stages under zb-h1" in checks["speed"]["message"]
    optimum = json.loads(invoke(runner, "plan", net_file, CL, *PLAN, "--schedule", "zb-h1",
                                "--format", "json").stdout)
    assert checks["speed"]["optimum_s"] == pytest.approx(optimum["iteration"]["time_s"],
                                                         rel=1e-3)


def test_check_a_zb_h1_plan_and_a_stale_schedule(runner, net_file, tmp_path):
    from .test_pipeline_check import _check, _config

    plan = invoke(runner, "plan", net_file, CL, *PLAN, "--schedule", "zb-h1", "--format",
                  "yaml")
    assert plan.exit_code == 0, plan.output
    (tmp_path / "plan.yaml").write_text(plan.stdout)
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2,
                  schedule="zb-h1")
    out, data = _check(runner, cfg)
    assert out.exit_code == 0, out.output
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert checks["speed"]["ratio"] == pytest.approx(1.0, abs=1e-12)
    # the configuration with the default schedule: the plan is stale
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 1
    assert "the plan is for schedule=zb-h1, the configuration says 1f1b" in \
        data["configs"][0]["checks"][0]["message"]


@pytest.mark.parametrize("extra, words", [
    (("--schedule", "zb-h1"), "--schedule zb-h1 schedules the stages of a pipeline"),
    (("--pipeline", "2", "--virtual-stages", "2", "--microbatches", "2", "--schedule",
      "zb-h1"), "--schedule zb-h1 runs one model chunk a stage; drop --virtual-stages 2"),
    (("--pipeline", "2", "--schedule", "zb-h2"), "Invalid value for '--schedule'"),
])
@pytest.mark.parametrize("command", ["plan", "cost"])
def test_bad_schedule_exits_2(runner, net_file, extra, words, command):
    from .test_interleaved import command_exits_2

    command_exits_2(runner, command, net_file, extra, words)


@pytest.mark.parametrize("keys, strategy, line, words", [
    ({"schedule": "zb-h1"}, "grid: 1x16", 6,
     "schedule zb-h1 schedules the stages of a pipeline"),
    ({"pipeline": 2, "microbatches": 2, "virtual_stages": 2, "schedule": "zb-h1"},
     "grid: 1x8", 9, "schedule zb-h1 runs one model chunk a stage"),
    ({"pipeline": 2, "schedule": "zb-h2"}, "grid: 1x8", 7, "zb-h2"),
])
def test_bad_schedule_configs_exit_2_at_the_key(runner, net_file, tmp_path, keys, strategy,
                                               line, words):
    from .test_pipeline_check import _config, config_exits_2_at

    config_exits_2_at(runner, _config(tmp_path, net_file, [strategy], **keys), line, words)
