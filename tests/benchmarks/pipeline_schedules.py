"""How the pipeline schedules' step times compare on random stage times (not a test
module).

    python tests/benchmarks/pipeline_schedules.py [--cases N] [--seed S]

For N random pipelines (1-8 stages, 1-20 microbatches, each stage's F, B and W drawn
from 0.01-2) it prints, against 1F1B's own order of passes (the reference scheduler of
tests/test_zero_bubble.py, B and W together), the spread of

* 1F1B as the planner simulates it (:func:`planner.pipeline.one_f_one_b_finish`):
  nothing, unless the two schedulers disagree;
* Alpa's expression ``Σ_s t_s + (M − 1)·max_s t_s``, which priced 1F1B before
  2026-11-24, and
* ZB-H1 as the planner simulates it (:func:`planner.pipeline.zero_bubble_finish`);

and for N random interleaved pipelines (2-8 stages, 2-4 chunks a stage, M a multiple of
S up to 24, each chunk's F and B from 0.01-2), against the interleaved order simulated,
the expression ``M·max_s T_s + (Σ_s T_s − max_s T_s)/V`` that priced it before.

With equal stages the expressions are the simulated steps; with unequal ones they are
not.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.pipeline import one_f_one_b_finish, zero_bubble_finish
from tests.test_zero_bubble import one_f_one_b


def _spread(name: str, xs: list[float], against: str) -> None:
    xs.sort()
    pct = [xs[int(q * (len(xs) - 1))] * 100 for q in (0.0, 0.1, 0.5, 0.9, 1.0)]
    print(f"{name:22s} vs {against}, {len(xs)} cases: min {pct[0]:+.1f}%, "
          f"10th {pct[1]:+.1f}%, median {pct[2]:+.1f}%, 90th {pct[3]:+.1f}%, "
          f"max {pct[4]:+.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    planner, alpa, zb = [], [], []
    for _ in range(args.cases):
        s, m = rng.randint(1, 8), rng.randint(1, 20)
        passes = [(rng.uniform(0.01, 2), rng.uniform(0.01, 2), rng.uniform(0.01, 2))
                  for _ in range(s)]
        ref = one_f_one_b(passes, m)
        t = [f + b + w for f, b, w in passes]
        planner.append(max(one_f_one_b_finish([(f, b + w) for f, b, w in passes], s, 1, m))
                       / ref - 1)
        alpa.append((sum(t) + (m - 1) * max(t)) / ref - 1)
        zb.append(max(zero_bubble_finish(passes, m)) / ref - 1)
    _spread("1F1B simulated", planner, "1F1B's order")
    _spread("Alpa's expression", alpa, "1F1B's order")
    _spread("ZB-H1", zb, "1F1B's order")
    inter = []
    for _ in range(args.cases):
        s, v = rng.randint(2, 8), rng.randint(2, 4)
        m = s * rng.randint(1, max(1, 24 // s))
        chunks = [(rng.uniform(0.01, 2), rng.uniform(0.01, 2)) for _ in range(s * v)]
        sim = max(one_f_one_b_finish(chunks, s, v, m))
        t = [sum(f + b for c, (f, b) in enumerate(chunks) if c % s == k) for k in range(s)]
        inter.append((m * max(t) + (sum(t) - max(t)) / v) / sim - 1)
    _spread("interleaved expression", inter, "the interleaved order")


if __name__ == "__main__":
    main()
