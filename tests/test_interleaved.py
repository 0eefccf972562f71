"""Interleaved pipeline stages (``--virtual-stages V``, Megatron-LM's interleaved 1F1B).

The figures are derived by hand from the definitions in :mod:`planner.pipeline`:

* the order of passes on a stage (Narayanan et al., "Efficient large-scale language
  model training on GPU clusters using Megatron-LM", SC 2021, §2.2.2, and the warm-up
  count of Megatron-LM's interleaved schedule: ``2·(S − s − 1) + (V − 1)·S`` chunk
  forwards, ``S`` microbatches of a chunk at a time), written out pass by pass below
  for two stages of two chunks and four microbatches;
* the step ``M·max_s T_s + (Σ_s T_s − max_s T_s)/V`` (with equal stages the paper's
  bubble ``(1/V)·(S − 1)/M`` of the step's ideal time);
* the first stage keeping ``S·V + S − 1`` chunk-microbatches at once, ``1 + (S − 1)/(S·V)``
  times 1F1B's (Korthikanti et al., "Reducing activation recomputation in large
  transformer models", MLSys 2023, §4.2.3).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from planner.cli_plan import run_search
from planner.evaluate import evaluate, make_context
from planner.inputs import load_network_text
from planner.pipeline import (
    REBALANCE,
    by_count,
    in_flight,
    one_f_one_b_finish,
    price_pipeline,
    schedule,
    search_pipeline,
    stage_starts,
)

from .conftest import EXAMPLES, invoke
from .test_pipeline import NET, _context, _net, _question, check_sends_and_tail

CL = str(EXAMPLES / "clusters" / "dgx-h100.yaml")


# -- the schedule --------------------------------------------------------------------------

def test_interleaved_order_of_passes_by_hand():
    """S = 2 stages, V = 2 chunks, M = 4 microbatches. Stage 0 warms up with
    2·(2 − 0 − 1) + (2 − 1)·2 = 4 forwards (microbatches 0-1 of chunk 0, then of
    chunk 1); each later forward k runs chunk (k mod 4) // 2 and each backward k chunk
    1 − (k mod 4) // 2. Stage 1 warms up with 0 + 2 = 2."""
    assert schedule(2, 2, 4, 0) == [
        ("F", 0), ("F", 0), ("F", 1), ("F", 1),
        ("F", 0), ("B", 1), ("F", 0), ("B", 1), ("F", 1), ("B", 0), ("F", 1), ("B", 0),
        ("B", 1), ("B", 1), ("B", 0), ("B", 0)]
    assert schedule(2, 2, 4, 1) == [
        ("F", 0), ("F", 0),
        ("F", 1), ("B", 1), ("F", 1), ("B", 1), ("F", 0), ("B", 0), ("F", 0), ("B", 0),
        ("F", 1), ("B", 1), ("F", 1), ("B", 1),
        ("B", 0), ("B", 0)]
    # what each chunk holds after each forward pass
    assert in_flight(2, 2, 4, 0) == [(1, 0), (2, 0), (2, 1), (2, 2), (3, 2), (4, 1),
                                     (4, 1), (3, 2)]
    assert in_flight(2, 2, 4, 1) == [(1, 0), (2, 0), (2, 1), (2, 1), (3, 0), (3, 0),
                                     (2, 1), (2, 1)]


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 8, 16])
def test_without_interleaving_a_stage_keeps_min_s_minus_stage_m(stages, microbatches):
    """1F1B (PipeDream-Flush, Narayanan et al. ICML 2021): stage s holds
    min(S − s, M) microbatches at most, every forward and backward once."""
    for s in range(stages):
        order = schedule(stages, 1, microbatches, s)
        assert sorted(order) == [("B", 0)] * microbatches + [("F", 0)] * microbatches
        assert max(n for (n,) in in_flight(stages, 1, microbatches, s)) == \
            min(stages - s, microbatches)


@pytest.mark.parametrize("stages, virtual", [(2, 2), (2, 3), (4, 2), (4, 4), (8, 2)])
def test_interleaved_stages_keep_the_warm_up_and_one_more(stages, virtual):
    """Every pass once, no backward before its forward, and at most the warm-up plus
    one chunk-microbatches held; the first stage S·V + S − 1 (Korthikanti et al.'s
    1 + (S − 1)/(S·V) of 1F1B's S·V)."""
    m = 2 * stages
    for s in range(stages):
        order = schedule(stages, virtual, m, s)
        for c in range(virtual):
            assert order.count(("F", c)) == order.count(("B", c)) == m
        held = [0] * virtual
        for kind, c in order:
            held[c] += 1 if kind == "F" else -1
            assert held[c] >= 0
        warm = min(2 * (stages - s - 1) + (virtual - 1) * stages, m * virtual)
        assert max(sum(st) for st in in_flight(stages, virtual, m, s)) == \
            min(warm + 1, m * virtual)
    first = max(sum(st) for st in in_flight(stages, virtual, m, 0))
    assert first == stages * virtual + stages - 1
    assert first / (stages * virtual) == pytest.approx(
        1 + (stages - 1) / (stages * virtual), rel=1e-12)


# -- the search ----------------------------------------------------------------------------

def _interleaved(tie=True, microbatches=4):
    net = _net(blocks=4, tie=tie)
    q = _question(net, microbatches=microbatches)
    return net, q, search_pipeline(q, 2, "time", (), run_search, _context(q), virtual=2)


def test_interleaved_step_composes_the_chunk_times_by_hand():
    """Two stages of 4 devices (4 a node), two chunks each: chunk c on stage c mod 2;
    each sends its activation on (and takes its gradient back) to the next chunk's
    stage, the last of stage 1 back to stage 0: across the nodes every time."""
    net, _, res = _interleaved()
    m, s, v = 4, 2, 2
    assert res.virtual == v and len(res.stages) == s * v
    assert [(st.index, st.chunk) for st in res.stages] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [st.first_rank for st in res.stages] == [0, 4, 0, 4]
    assert res.stages[0].lo == 0 and res.stages[-1].hi == len(net.layers)
    for a, b in zip(res.stages, res.stages[1:], strict=False):
        assert a.hi == b.lo
    # each chunk keeps its own most microbatches at once: stage 0 (4, 2), stage 1 (3, 1)
    assert [st.inflight for st in res.stages] == [4, 3, 2, 1]
    for st in res.stages:
        check_sends_and_tail(st, net, m)
    t = [sum(c.microbatch_s for c in res.stages if c.index == k) for k in range(s)]
    tails = [sum(c.tail_s for c in res.stages if c.index == k) for k in range(s)]
    # the tied head is in stage 1's last chunk, wte in stage 0's first
    assert res.ties_s > 0
    # the interleaved order simulated (worked by hand in tests/test_schedule_1f1b.py)
    # from each chunk's forward pass (with its activation's send) and the rest
    passes = [(c.evaluation.forward_s + c.send_s / 2,
               c.evaluation.microbatch_s + c.send_s / 2 - c.evaluation.forward_s)
              for c in res.stages]
    span = max(one_f_one_b_finish(passes, s, v, m))
    assert res.bubble_s == pytest.approx(span - m * max(t), rel=1e-12)
    assert res.time_s == pytest.approx(span + max(tails) + res.ties_s, rel=1e-12)


def test_interleaved_stage_memory_adds_its_chunks_at_the_fullest_moment():
    """A stage's memory: its chunks' weights, gradients and optimizer state added, and
    their activations at the moment of the schedule when they hold most (each chunk's
    one-microbatch activations priced alone, no recomputation); each chunk was planned
    with half the device."""
    _, q, res = _interleaved(tie=False, microbatches=4)
    cap = q.cluster.capacity_bytes
    for s, mem in enumerate(res.memories):
        chunks = [st for st in res.stages if st.index == s]
        one = []
        for st in chunks:
            assert st.evaluation.memory.capacity == pytest.approx(cap / 2, rel=1e-12)
            o = dataclasses.replace(st.question.options, inflight=1)
            ev1 = evaluate(make_context(st.question.network, st.question.cluster, o,
                                        q.ctx.estimator), o, st.result.best.assignment)
            one.append(ev1.memory.activations)
        held = max(n0 * one[0] + n1 * one[1] for n0, n1 in in_flight(2, 2, 4, s))
        assert mem.activations == pytest.approx(held, rel=1e-12)
        for part in ("weights", "gradients", "optimizer"):
            assert getattr(mem, part) == pytest.approx(
                sum(getattr(st.evaluation.memory, part) for st in chunks), rel=1e-12)
        assert mem.workspace == max(st.evaluation.memory.workspace for st in chunks)
        assert mem.capacity == cap
        assert mem.fits
    assert res.fits and res.peak_bytes == max(m.peak for m in res.memories)


def test_pricing_an_interleaved_plan_gives_back_its_time():
    net, q, res = _interleaved()
    layouts = {st.lo + i: lay for st in res.stages
               for i, lay in st.result.best.assignment.items()}
    bounds = [st.lo for st in res.stages] + [len(net.layers)]
    priced = price_pipeline(q, 2, layouts, lambda sq, a: evaluate(sq.ctx, sq.options, a),
                            _context(q), bounds, virtual=2)
    assert [(st.index, st.chunk, st.lo, st.hi) for st in priced.stages] == \
        [(st.index, st.chunk, st.lo, st.hi) for st in res.stages]
    assert priced.time_s == pytest.approx(res.time_s, rel=1e-12)
    assert [m.peak for m in priced.memories] == [m.peak for m in res.memories]


def test_even_split_by_hand():
    """Megatron-LM's even split (:func:`by_count`): 6 segments of 2 layers (cuts at 2,
    4, 6, 8, 10 of 12) over 4 chunks are 1, 2, 2, 1 segments, the short ones at the ends
    where the embedding and the head are: bounds 0, 2, 6, 10, 12; 7 segments over 3
    chunks are 2, 3, 2; fewer segments than chunks, none."""
    assert by_count([2, 4, 6, 8, 10], 12, 4) == [0, 2, 6, 10, 12]
    assert by_count([1, 2, 3, 4, 5, 6], 7, 3) == [0, 2, 5, 7]
    assert by_count([2, 4, 6, 8, 10], 12, 6) == [0, 2, 4, 6, 8, 10, 12]
    assert by_count([2], 4, 3) is None


def test_interleaved_search_tries_the_even_split_last():
    """With chunks a stage the balancing rounds are followed by the even split (tried
    unless a round found it already); the step is the fastest partition that fits. One
    chunk a stage does without it: at most the balancing rounds' partitions."""
    net, q, res = _interleaved()
    cuts = stage_starts(net)
    even = by_count(cuts, len(net.layers), 4)
    tried = [t["bounds"] for t in res.partitions]
    best = min(t["time_s"] for t in res.partitions if t["outcome"] == "plan")
    assert res.time_s == best
    assert even in tried
    plain = search_pipeline(_question(net), 2, "time", (), run_search, _context(q))
    assert len(plain.partitions) <= REBALANCE + 1


def test_one_chunk_is_1f1b():
    """virtual=1 is the plain schedule: the same stages, time and memory."""
    net = _net(blocks=4)
    q = _question(net)
    plain = search_pipeline(q, 2, "time", (), run_search, _context(q))
    one = search_pipeline(_question(net), 2, "time", (), run_search, _context(q),
                          virtual=1)
    assert one.time_s == plain.time_s and one.virtual == 1
    assert [m.peak for m in one.memories] == [st.evaluation.memory.peak
                                              for st in plain.stages]


# -- the command line ----------------------------------------------------------------------

PLAN = ("-p", "16", "-b", "32", "--microbatches", "8", "--pipeline", "2",
        "--virtual-stages", "2", "--estimator", "roofline")


def test_interleaved_plan_document_table_and_launch(runner, net_file, tmp_path):
    args = ("plan", net_file, CL, *PLAN, "--format", "yaml")
    first = invoke(runner, *args)
    assert first.exit_code == 0, first.output
    assert invoke(runner, *args).output == first.output  # byte-identical
    doc = yaml.safe_load(first.stdout)
    assert doc["problem"]["pipeline"] == {"stages": 2, "virtual_stages": 2,
                                          "schedule": "interleaved-1f1b"}
    pipe = doc["pipeline"]
    assert pipe["virtual_stages"] == 2
    recs = pipe["stage_plans"]
    assert [(r["stage"], r["chunk"]) for r in recs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [r["ranks"] for r in recs] == [[0, 7], [8, 15], [0, 7], [8, 15]]
    # M = 8, S = 2: stage 0 warms up with 2 + 2 = 4 chunk forwards, stage 1 with 2,
    # and the steady state holds no more of a chunk than with M = 4 (the search test)
    assert [r["inflight"] for r in recs] == [4, 3, 2, 1]
    # every layer once, in order, its place in the chunks' order never going back
    assert [r["name"] for r in doc["layers"]] == [
        layer.name for layer in load_network_text(NET).layers]
    places = [r["chunk"] * 2 + r["stage"] for r in doc["layers"]]
    assert places == sorted(places) and set(places) == {0, 1, 2, 3}
    t = [sum(r["microbatch_s"] for r in recs if r["stage"] == s) for s in range(2)]
    tails = [sum(r["tail_s"] for r in recs if r["stage"] == s) for s in range(2)]
    span = max(one_f_one_b_finish([(r["passes_s"]["forward"], r["passes_s"]["backward"])
                                   for r in recs], 2, 2, 8))
    # 4 digits kept: the bubble, a difference of two such figures, to their last digit
    assert pipe["bubble_s"] == pytest.approx(span - 8 * max(t), abs=1e-3 * span)
    assert doc["iteration"]["time_s"] == pytest.approx(
        span + max(tails) + pipe["tied_allreduce_s"], rel=1e-3)
    # a stage's peak is the same in each of its chunks' records, and the plan's is the
    # fullest stage's
    for s in range(2):
        assert len({r["peak_bytes"] for r in recs if r["stage"] == s}) == 1
    assert doc["memory"]["peak_bytes"] == max(r["peak_bytes"] for r in recs)
    assert {(g["stage"], g["chunk"]) for g in doc["placement"]["grids"]} <= \
        {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert doc["search"]["notes"] == ["2 pipeline stages of 2 model chunks"]
    table = invoke(runner, *args[:-2])
    assert table.exit_code == 0
    assert "pipeline 2 stages of 2 model chunks, 8 microbatches (interleaved-1f1b)" in \
        table.output
    plan = tmp_path / "plan.yaml"
    plan.write_text(first.stdout)
    env = invoke(runner, "launch", str(plan), "--emit", "env")
    assert env.exit_code == 0, env.output
    assert "PLANNER_VIRTUAL_STAGES=2" in env.output
    assert "interleaved 1F1B with 2 model chunks a stage" in env.output
    assert "#   stage 1 chunk 1 grid " in env.output


def test_cost_interleaved_prices_the_grid_in_every_chunk(runner, net_file):
    args = ("cost", net_file, CL, "-p", "16", "-b", "32", "--microbatches", "8",
            "--pipeline", "2", "--virtual-stages", "2", "--grid", "2x4", "--mode",
            "megatron", "--estimator", "roofline", "--format", "json")
    out = invoke(runner, *args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["problem"]["pipeline"]["virtual_stages"] == 2
    assert len(doc["pipeline"]["stage_plans"]) == 4
    weighted = [r for r in doc["layers"] if "follows" not in r]
    assert {tuple(r["grid"]) for r in weighted} == {(2, 4)}


def test_check_an_interleaved_plan(runner, net_file, tmp_path):
    from .test_pipeline_check import _check, _config

    plan = invoke(runner, "plan", net_file, CL, *PLAN, "--format", "yaml")
    assert plan.exit_code == 0, plan.output
    (tmp_path / "plan.yaml").write_text(plan.stdout)
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2,
                  virtual_stages=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 0, out.output
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    doc = yaml.safe_load(plan.stdout)
    assert checks["speed"]["time_s"] == pytest.approx(doc["iteration"]["time_s"], rel=1e-3)
    assert checks["speed"]["ratio"] == pytest.approx(1.0, abs=1e-12)
    assert "with 2 pipeline stages of 2 model chunks" in checks["speed"]["message"]
    assert checks["memory"]["peak_bytes"] == pytest.approx(doc["memory"]["peak_bytes"],
                                                           rel=1e-3)
    # the configuration without interleaving: stale
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 1
    assert "the plan is for virtual_stages=2, the configuration says 1" in \
        data["configs"][0]["checks"][0]["message"]
    # an edited plan: the first layer moved to another chunk
    edited = yaml.safe_load(plan.stdout)
    edited["layers"][0]["chunk"] = 1
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    cfg = _config(tmp_path, net_file, ["plan: plan.yaml"], microbatches=8, pipeline=2,
                  virtual_stages=2)
    out, data = _check(runner, cfg)
    assert out.exit_code == 1, out.output
    assert "do not cut 'tiny-lm' into 4 chunks" in data["configs"][0]["checks"][0]["message"]
    edited["layers"][0]["chunk"] = 2
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    out, _ = _check(runner, cfg)
    assert out.exit_code == 2 and "expected the layer's model chunk, 0 to 1" in out.output


def test_check_a_grid_interleaved_prices_as_cost_does(runner, net_file, tmp_path):
    from .test_pipeline_check import _check, _config

    cfg = _config(tmp_path, net_file, ["grid: 2x4", "mode: megatron"], microbatches=8,
                  pipeline=2, virtual_stages=2)
    out, data = _check(runner, cfg)
    assert out.exit_code in (0, 1), out.output
    cost = json.loads(invoke(runner, "cost", net_file, CL, "-p", "16", "-b", "32",
                             "--microbatches", "8", "--pipeline", "2", "--virtual-stages",
                             "2", "--grid", "2x4", "--mode", "megatron", "--estimator",
                             "roofline", "--format", "json").stdout)
    checks = {c["check"]: c for c in data["configs"][0]["checks"]}
    assert checks["speed"]["time_s"] == pytest.approx(cost["iteration"]["time_s"], rel=1e-3)
    assert checks["memory"]["peak_bytes"] == pytest.approx(cost["memory"]["peak_bytes"],
                                                           rel=1e-3)
    optimum = json.loads(invoke(runner, "plan", net_file, CL, *PLAN, "--format",
                                "json").stdout)
    assert checks["speed"]["optimum_s"] == pytest.approx(optimum["iteration"]["time_s"],
                                                         rel=1e-3)


@pytest.mark.parametrize("extra, words", [
    (("--virtual-stages", "2"), "interleaves the stages of a pipeline; give --pipeline 2"),
    (("--pipeline", "4", "--virtual-stages", "2", "--microbatches", "2"),
     "--microbatches must be a multiple of the 4 stages (got 2)"),
    # a chunk may start at each of the 8 residual blocks and at the head: 10 chunks
    (("--pipeline", "4", "--virtual-stages", "3", "--microbatches", "4"),
     "4 stages of 3 chunks are 12 chunks, and 'tiny-lm' can be cut into at most 10"),
    (("--pipeline", "2", "--virtual-stages", "0"), "Invalid value for '--virtual-stages'"),
])
@pytest.mark.parametrize("command", ["plan", "cost"])
def test_bad_interleaving_exits_2(runner, net_file, extra, words, command):
    command_exits_2(runner, command, net_file, extra, words)


def command_exits_2(runner, command, net_file, extra, words):
    """``command`` on the test network, 16 devices and a batch of 32, with ``extra``
    options: exit 2, ``words`` in the message, no traceback."""
    out = invoke(runner, command, net_file, CL, "-p", "16", "-b", "32", *extra,
                 "--estimator", "roofline")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize("keys, strategy, line, words", [
    ({"virtual_stages": 2}, "grid: 1x16", 6,
     "virtual_stages 2 interleaves the stages of a pipeline"),
    ({"pipeline": 4, "microbatches": 2, "virtual_stages": 2}, "grid: 1x4", 8,
     "'microbatches' (2) must be a multiple of the 4 stages"),
    ({"pipeline": 4, "microbatches": 4, "virtual_stages": 3}, "grid: 1x4", 8,
     "4 stages of 3 chunks are 12 chunks, and 'tiny-lm' can be cut into at most 10"),
])
def test_bad_interleaved_configs_exit_2_at_the_key(runner, net_file, tmp_path, keys,
                                                   strategy, line, words):
    from .test_pipeline_check import _config, config_exits_2_at

    config_exits_2_at(runner, _config(tmp_path, net_file, [strategy], **keys), line, words)


def test_microbatches_auto_with_interleaving_tries_multiples_of_the_stages(runner,
                                                                          net_file):
    out = invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32", "--pipeline", "2",
                 "--virtual-stages", "2", "--microbatches", "auto", "--estimator",
                 "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    tried = [t["microbatches"] for t in doc["microbatches_auto"]]
    assert tried and all(m % 2 == 0 for m in tried) and tried == sorted(tried)
    assert doc["problem"]["microbatches"] % 2 == 0
    assert doc["problem"]["pipeline"]["virtual_stages"] == 2


def test_pipeline_auto_with_interleaving_tries_the_counts_it_allows(runner, net_file):
    """16 devices, 4 microbatches, 2 chunks a stage, 10 places to start a chunk: 1 (no
    pipeline), 2 and 4 stages (8 would need 16 chunks and 8 microbatches)."""
    out = invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32", "--microbatches",
                 "4", "--pipeline", "auto", "--virtual-stages", "2", "--estimator",
                 "roofline", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    trials = doc["pipeline_auto"]
    assert [t["stages"] for t in trials] == [1, 2, 4]
    done = [t["time_s"] for t in trials if t["time_s"] is not None]
    assert doc["iteration"]["time_s"] == pytest.approx(min(done), rel=1e-3)


def test_virtual_stages_auto_keeps_the_fastest_count(runner, net_file):
    """``--virtual-stages auto`` with 2 stages: 1, 2, … chunks a stage (at most 10 // 2
    = 5: the places to start a chunk), each as ``--virtual-stages V`` plans it, until 2
    counts in a row are slower than the best; the fastest is the plan."""
    from planner.cli_plan import VIRTUAL_PATIENCE

    base = ("plan", net_file, CL, "-p", "16", "-b", "32", "--microbatches", "8",
            "--pipeline", "2", "--estimator", "roofline")
    out = invoke(runner, *base, "--virtual-stages", "auto", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    trials = doc["virtual_auto"]
    tried = [t["virtual_stages"] for t in trials]
    assert tried == list(range(1, len(tried) + 1)) and len(tried) <= 5
    times = [t["time_s"] for t in trials]
    best = min(times)
    assert doc["iteration"]["time_s"] == best
    chosen = tried[times.index(best)]
    assert doc["problem"]["pipeline"].get("virtual_stages", 1) == chosen
    # it stopped after VIRTUAL_PATIENCE slower counts, or ran out of counts
    after = times[times.index(best) + 1:]
    assert len(tried) == 5 or (len(after) == VIRTUAL_PATIENCE and
                               all(t > best for t in after))
    # each trial is that count planned alone
    for v, t in zip(tried, times, strict=True):
        alone = json.loads(invoke(runner, *base, "--virtual-stages", str(v), "--format",
                                  "json").stdout)
        assert alone["iteration"]["time_s"] == t
    table = invoke(runner, *base, "--virtual-stages", "auto")
    assert "virtual stages auto 1: " in table.output and "(chosen)" in table.output


def test_virtual_stages_auto_needs_a_pipeline(runner, net_file):
    out = invoke(runner, "plan", net_file, CL, "-p", "16", "-b", "32", "--virtual-stages",
                 "auto", "--estimator", "roofline")
    assert out.exit_code == 2
    assert "--virtual-stages auto interleaves the stages of a pipeline" in out.output
    out = invoke(runner, "cost", net_file, CL, "-p", "16", "-b", "32", "--pipeline", "2",
                 "--virtual-stages", "auto", "--estimator", "roofline")
    assert out.exit_code == 2 and "Traceback" not in out.output


@pytest.mark.parametrize("key, value, words", [
    ("stage", 2, "expected the grid's pipeline stage, 0 to 1, got 2"),
    ("chunk", "one", "expected the grid's model chunk, 0 to 1, got 'one'"),
    ("chunk", True, "expected the grid's model chunk, 0 to 1, got true"),
])
def test_launch_refuses_an_edited_grid_stage_or_chunk(runner, net_file, tmp_path, key,
                                                      value, words):
    plan = invoke(runner, "plan", net_file, CL, *PLAN, "--format", "yaml")
    doc = yaml.safe_load(plan.stdout)
    doc["placement"]["grids"][0][key] = value
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = invoke(runner, "launch", str(path), "--emit", "env")
    assert out.exit_code == 2, out.output
    assert words in out.output
    assert f"(at $.placement.grids[0].{key})" in out.output
    assert "Traceback" not in out.output


def test_a_stage_s_memory_adds_its_chunks_state_and_takes_their_largest_buffers():
    """An audit of the tests found the stage's buffers and workspace unchecked (the
    first or last chunk's in place of the largest passed). By hand, two chunks whose
    reports are made up: the state adds (1 + 10, 2 + 20, 3 + 30), the activations are
    the fullest moment's kept tensors (states (2, 0), (1, 1), (2, 1): 8, 7 and 2·4 + 3 =
    11) plus the larger working set one chunk adds beyond what it keeps (10 − 2·4 = 2
    and 7 − 2·3 = 1: 2), 13; the buffers and the workspace are the larger chunk's (5 of
    the first, 6 of the second)."""
    from types import SimpleNamespace

    from planner.costs.memory import MemoryReport
    from planner.pipeline import stage_memory

    a = MemoryReport(1.0, 2.0, 3.0, 10.0, 5.0, 1.0, 100.0, kept=4.0)
    b = MemoryReport(10.0, 20.0, 30.0, 7.0, 2.0, 6.0, 100.0, kept=3.0)
    chunks = [SimpleNamespace(evaluation=SimpleNamespace(memory=m), inflight=2)
              for m in (a, b)]
    got = stage_memory(chunks, [(2, 0), (1, 1), (2, 1)], 100.0)
    assert (got.weights, got.gradients, got.optimizer) == (11.0, 22.0, 33.0)
    assert got.activations == 13.0
    assert (got.comm_buffers, got.workspace, got.kept, got.capacity) == (5.0, 6.0, 7.0, 100.0)
