"""1F1B and interleaved 1F1B priced by simulating their order of passes
(:func:`planner.pipeline.one_f_one_b_finish`).

Each stage runs Megatron-LM's order (:func:`planner.pipeline.schedule`); a forward pass
waits for the chunk before's forward of the same microbatch, a backward pass for the
chunk after's backward (the last chunk's for its own forward). The figures below are
worked out pass by pass by hand, or are the bubbles of Narayanan et al., SC 2021, §2.2
for equal stages: ``(M + S − 1)·(F + B)``, and interleaved ``M·V·(F + B) +
(S − 1)·(F + B)`` per chunk (``(1/V)·(S − 1)/M`` of the step's work); for one chunk a
stage the step must equal ``one_f_one_b``, the reference scheduler written in
``tests/test_zero_bubble.py`` from 1F1B's definition, not from the planner's code.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from planner.pipeline import one_f_one_b_finish

from .test_zero_bubble import one_f_one_b


def test_a_slow_first_stage_by_hand():
    """S = 2, M = 2; stage 0 F = 2, B = 4, stage 1 F = B = 1.
    Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1:
      stage 0: F0 0–2, F1 2–4;   stage 1: F0 2–3, B0 3–4, F1 4–5, B1 5–6;
      stage 0: B0 4–8 (its input at 4), B1 8–12.
    The slow stage never waits: 12 = M·(F + B) of stage 0. Alpa's expression
    Σ t + (M − 1)·max t, which priced 1F1B before, says (6 + 2) + 6 = 14."""
    assert one_f_one_b_finish([(2.0, 4.0), (1.0, 1.0)], 2, 1, 2) == [12.0, 6.0]


def test_a_slow_last_stage_by_hand():
    """S = 2, M = 2; stage 0 F = B = 1, stage 1 F = 2, B = 3.
      stage 0: F0 0–1, F1 1–2;   stage 1: F0 1–3, B0 3–6, F1 6–8, B1 8–11;
      stage 0: B0 6–7, B1 11–12."""
    assert one_f_one_b_finish([(1.0, 1.0), (2.0, 3.0)], 2, 1, 2) == [12.0, 11.0]


def test_two_stages_of_two_chunks_by_hand():
    """S = 2, V = 2, M = 2: chunks c0, c2 on stage 0 (F = B = 1), c1, c3 on stage 1
    (F = B = 2). Orders (chunk, microbatch):
      stage 0: F(0,0) F(0,1) F(2,0) F(2,1) B(2,0) B(2,1) B(0,0) B(0,1)
      stage 1: F(1,0) F(1,1) F(3,0) B(3,0) F(3,1) B(3,1) B(1,0) B(1,1)
    stage 0: F(0,0) 0–1, F(0,1) 1–2;  stage 1: F(1,0) 1–3, F(1,1) 3–5;
    stage 0: F(2,0) 3–4, F(2,1) 5–6;  stage 1: F(3,0) 5–7, B(3,0) 7–9, F(3,1) 9–11,
    B(3,1) 11–13;  stage 0: B(2,0) 9–10, B(2,1) 13–14;  stage 1: B(1,0) 13–15,
    B(1,1) 15–17;  stage 0: B(0,0) 15–16, B(0,1) 17–18."""
    passes = [(1.0, 1.0), (2.0, 2.0), (1.0, 1.0), (2.0, 2.0)]
    assert one_f_one_b_finish(passes, 2, 2, 2) == [18.0, 17.0]


@pytest.mark.parametrize("f, b", [(1.0, 1.0), (1.0, 2.0), (0.3, 0.7)])
@pytest.mark.parametrize("stages, virtual, microbatches", [
    (1, 1, 1), (2, 1, 1), (2, 1, 5), (4, 1, 3), (4, 1, 16), (8, 1, 8),
    (2, 2, 2), (2, 2, 8), (2, 4, 6), (4, 2, 4), (4, 2, 12), (4, 3, 8), (8, 2, 16),
])
def test_equal_stages_give_the_papers_bubble(f, b, stages, virtual, microbatches):
    ends = one_f_one_b_finish([(f, b)] * (stages * virtual), stages, virtual,
                              microbatches)
    work = microbatches * virtual * (f + b)
    assert max(ends) == pytest.approx(work + (stages - 1) * (f + b), rel=1e-12)
    # the bubble over the step's work: (1/V)·(S − 1)/M of a stage's (F + B)·V
    assert (max(ends) - work) / (virtual * (f + b)) == pytest.approx(
        (stages - 1) / virtual, rel=1e-12)


_pass = hs.floats(0.01, 2.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(hs.lists(hs.tuples(_pass, _pass), min_size=1, max_size=6), hs.integers(1, 12))
def test_one_chunk_is_the_reference_1f1b(passes, m):
    ends = one_f_one_b_finish(passes, len(passes), 1, m)
    assert max(ends) == pytest.approx(one_f_one_b([(f, b, 0.0) for f, b in passes], m),
                                      rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(hs.integers(1, 4), hs.integers(1, 4), hs.integers(1, 4), hs.data())
def test_interleaved_never_beats_the_busiest_stage_nor_waits_forever(s, v, groups, data):
    """Any chunk times, ``M`` a multiple of ``S``: the orders never wait on each other
    (the simulation ends), and no stage ends before its own work is done."""
    m = s * groups
    passes = data.draw(hs.lists(hs.tuples(_pass, _pass), min_size=s * v, max_size=s * v))
    ends = one_f_one_b_finish(passes, s, v, m)
    for stage in range(s):
        own = sum(f + b for c, (f, b) in enumerate(passes) if c % s == stage)
        assert ends[stage] >= m * own * (1 - 1e-12)


def test_gpipe_equals_1f1b_for_equal_stages_only_the_readmes_example():
    """README, *What it does not model*: GPipe (every forward, then every backward) takes
    1F1B's step with equal stages and longer with unequal ones. By hand, 4 stages, 8
    microbatches, (F, B) = (1, 2), (2, 4), (1, 2), (1, 2): the slow stage's forwards end
    at 1 + 8·2 = 17, its first backward waits for the last stages' (17 + 1 + 1 = 19,
    then 19 + 2 + 2 = 23 for microbatch 7's gradient), runs 8·4 to 55, and stage 0's
    last backward ends at 57; 1F1B's order ends at 53."""

    def gpipe(st, m):
        s_n = len(st)
        fend = [[0.0] * m for _ in range(s_n)]
        for s in range(s_n):
            t = 0.0
            for i in range(m):
                t = fend[s][i] = max(t, fend[s - 1][i] if s else 0.0) + st[s][0]
        bend = [[0.0] * m for _ in range(s_n)]
        for s in reversed(range(s_n)):
            t = fend[s][m - 1]
            for i in reversed(range(m)):
                dep = bend[s + 1][i] if s < s_n - 1 else fend[s][i]
                t = bend[s][i] = max(t, dep) + st[s][1]
        return max(bend[0])

    uneven = [(1.0, 2.0), (2.0, 4.0), (1.0, 2.0), (1.0, 2.0)]
    assert gpipe(uneven, 8) == 57.0
    assert max(one_f_one_b_finish(uneven, 4, 1, 8)) == 53.0
    even = [(1.0, 2.0)] * 4
    assert gpipe(even, 8) == max(one_f_one_b_finish(even, 4, 1, 8)) == (8 + 4 - 1) * 3.0
