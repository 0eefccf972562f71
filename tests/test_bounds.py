"""Lower bounds on a step (``planner.bounds``), which let ``--pipeline auto``,
``--virtual-stages auto``, ``--schedule auto`` and ``--microbatches auto`` skip the
searches that cannot beat the best plan found.

The formulas are checked by hand; the 1F1B bound is checked to be the least of its
chain over every set of stage times (hypothesis), and every bound against the
schedules as the planner simulates them. The skipping is checked end to end: the plan
with it is the plan without it, key for key, the skipped counts' records apart, and
each skipped count's searched step is at least its bound.
"""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.bounds import Floor, beaten, compute_floor, step_floor
from planner.pipeline import one_f_one_b_finish, zero_bubble_finish

from .conftest import EXAMPLES, invoke

CL = str(EXAMPLES / "clusters" / "dgx-h100.yaml")
GPT2 = str(EXAMPLES / "networks" / "gpt2-small.yaml")
RESNET = str(EXAMPLES / "networks" / "resnet50.yaml")

times = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False)


def test_step_floor_by_hand():
    """``T = 1`` s, ``T_FB = 0.75`` s (module docstring's formulas, worked here)."""
    f = Floor(1.0, 0.75)
    assert step_floor(f, 1, 4) == 4.0  # no pipeline: M·T
    assert step_floor(f, 2, 1) == 1.0  # one microbatch: the stages in turn
    assert step_floor(f, 2, 2) == pytest.approx(4 / 3, rel=1e-15)  # 1 / (1 − 1/4)
    # S = 4, M = 8: 1 / (1 − (7/8)^4) = 4096 / 1695 (equal stages: 11/4)
    assert step_floor(f, 4, 8) == pytest.approx(4096 / 1695, rel=1e-15)
    # ZB-H1: max(M·T/S = 2, T_FB·4096/1695 = 1.8124)
    assert step_floor(f, 4, 8, schedule="zb-h1") == 2.0
    assert step_floor(Floor(1.0, 1.0), 4, 8, schedule="zb-h1") == pytest.approx(
        4096 / 1695, rel=1e-15)
    # interleaved: max(M·T/S, T)
    assert step_floor(f, 4, 8, virtual=2, schedule="interleaved-1f1b") == 2.0
    assert step_floor(f, 4, 2, virtual=3, schedule="interleaved-1f1b") == 1.0
    # large M: T·(M + (S − 1)/2)/S to first order, half the bubble of equal stages
    assert step_floor(f, 4, 1000) == pytest.approx((1000 + 1.5) / 4, rel=1e-5)


def test_beaten_needs_the_margin():
    assert not beaten(1.0, None)
    assert beaten(2.0, 1.0) and not beaten(1.0, 2.0)
    assert not beaten(1.0, 1.0)  # a tie: the sums' last bits may go either way
    assert beaten(1.0 + 2e-9, 1.0)


def _chain(t: list[float], m: int) -> float:
    return max(sum(t[:k]) + m * t[k] for k in range(len(t)))


@settings(max_examples=300, deadline=None)
@given(st.lists(times, min_size=1, max_size=12), st.integers(1, 64))
def test_1f1b_bound_is_the_least_chain(t, m):
    """For any stage times, ``max_k (Σ_{s<k} t_s + M·t_k) ≥ T / (1 − (1 − 1/M)^S)``,
    and the equalising times of the derivation reach it."""
    total, s = math.fsum(t), len(t)
    bound = step_floor(Floor(total, total), s, m)
    assert _chain(t, m) >= bound * (1 - 1e-12)
    # the equal bounds L: t_k = (L − Σ_{s<k} t_s) / M
    lean, done = [], 0.0
    for _ in range(s):
        lean.append((bound - done) / m)
        done += lean[-1]
    assert math.fsum(lean) == pytest.approx(total, rel=1e-9)
    assert _chain(lean, m) == pytest.approx(bound, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(times, times, times), min_size=2, max_size=8),
       st.integers(1, 24))
def test_simulated_schedules_never_beat_their_floor(passes, m):
    """The planner's simulations of 1F1B and ZB-H1 (``pipeline.one_f_one_b_finish``,
    ``zero_bubble_finish``) end no sooner than the bounds, with ``T`` and ``T_FB`` the
    stages' own sums."""
    s = len(passes)
    fb = [(f, b + w) for f, b, w in passes]
    total = math.fsum(f + b + w for f, b, w in passes)
    chained = math.fsum(f + b for f, b, _ in passes)
    floor = Floor(total, chained)
    assert max(one_f_one_b_finish(fb, s, 1, m)) >= step_floor(floor, s, m) * (1 - 1e-12)
    assert max(zero_bubble_finish(passes, m)) >= \
        step_floor(floor, s, m, schedule="zb-h1") * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 4), st.integers(2, 3), st.integers(1, 4), st.data())
def test_interleaved_never_beats_its_floor(s, v, k, data):
    m = s * k  # the interleaved schedule's condition: a multiple of the stages
    chunks = data.draw(st.lists(st.tuples(times, times), min_size=s * v, max_size=s * v))
    total = math.fsum(f + b for f, b in chunks)
    end = max(one_f_one_b_finish(chunks, s, v, m))
    assert end >= step_floor(Floor(total, total), s, m, v, "interleaved-1f1b") * (1 - 1e-12)


def _plan(runner, *args):
    out = invoke(runner, "plan", *args, "--format", "yaml")
    assert out.exit_code == 0, out.output
    return yaml.safe_load(out.stdout)


AUTO = ("pipeline_auto", "microbatches_auto", "virtual_auto", "schedule_auto")


def _keyed(trials):
    keys = ("microbatches", "stages", "virtual_stages", "schedule")
    return {tuple(t.get(k) for k in keys): t for t in trials}


@pytest.mark.parametrize("args", [
    (GPT2, CL, "-p", "16", "-b", "32", "--pipeline", "auto", "--microbatches", "auto"),
    (RESNET, CL, "-p", "16", "-b", "64", "--pipeline", "auto", "--microbatches", "auto"),
    (GPT2, CL, "-p", "16", "-b", "32", "--pipeline", "auto", "--microbatches", "4",
     "--schedule", "auto", "--virtual-stages", "auto"),
], ids=["gpt2-micro-auto", "resnet50-micro-auto", "gpt2-schedule-virtual-auto"])
def test_skipping_keeps_the_plan(runner, monkeypatch, args):
    """The plan with the bounds is the plan that searching every count gives, key for
    key, but for the records of the counts skipped; each of those was searched to a
    step no faster than its bound (or to no plan), and at least one count was
    skipped (else this test would test nothing)."""
    args = (*args, "--optimizer", "adam")
    fast = _plan(runner, *args)
    monkeypatch.setattr("planner.bounds.beaten", lambda bound, best: False)
    full = _plan(runner, *args)
    assert {k: v for k, v in fast.items() if k not in AUTO} == \
        {k: v for k, v in full.items() if k not in AUTO}
    skipped = 0
    for key in AUTO:
        if key not in full:
            assert key not in fast
            continue
        searched = _keyed(full[key])
        for name, t in _keyed(fast[key]).items():
            if t["outcome"] != "bound":
                assert t == searched[name]
                continue
            skipped += 1
            other = searched.get(name)
            if other is not None and other["time_s"] is not None:  # the patience may
                assert other["time_s"] >= t["bound_s"] * (1 - 1e-3)  # stop before it
    assert skipped


def test_floor_is_below_every_plan_the_search_prices():
    """The floor of a network (ResNet-50 on 8 H100s, batch 64, with the learned models)
    is below the compute of the layers with weights of the search's plan and of every
    baseline, layer by layer summed."""
    from planner.cli_plan import load_question, run_search

    q = load_question(RESNET, CL, 8, 64, cost_model="exact", overlap="gradients",
                      bucket="25MiB", optimizer="adam", master_weights=None,
                      algorithm=None, estimator="auto", models_dir=None)
    floor = compute_floor(q.ctx)
    res = run_search(q, "time", ())
    evaluations = [res.best.evaluation, *(b.candidate.evaluation for b in res.baselines
                                          if b.candidate is not None)]
    assert len(evaluations) >= 4
    for ev in evaluations:
        spent = math.fsum(r.cost.forward_s + r.cost.backward_s for r in ev.layers
                          if r.layer.has_weights)
        assert floor.total_s <= spent * (1 + 1e-9)
    assert floor.chained_s < floor.total_s
    # and not vacuous: within a factor two of the best plan's compute
    best = math.fsum(r.cost.forward_s + r.cost.backward_s for r in res.best.evaluation.layers
                     if r.layer.has_weights)
    assert floor.total_s > 0.5 * best


def test_table_shows_the_bound(runner):
    out = invoke(runner, "plan", GPT2, CL, "-p", "16", "-b", "32", "--pipeline", "auto",
                 "--optimizer", "adam")
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("pipeline auto"))
    assert "1 stage: " in line and "(chosen)" in line
    assert "2 stages: ≥ " in line and " (bound)" in line
