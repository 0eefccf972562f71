"""How the pipeline schedules' step times compare on random stage times (not a test
module).

    python tests/benchmarks/pipeline_schedules.py [--cases N] [--seed S]

For N random pipelines (1-8 stages, 1-20 microbatches, each stage's F, B and W drawn
from 0.01-2) it prints, against 1F1B's own order of passes (the reference scheduler of
tests/test_zero_bubble.py, B and W together), the spread of

* Alpa's expression ``Σ_s t_s + (M − 1)·max_s t_s``, which prices 1F1B, and
* ZB-H1 as the planner simulates it (:func:`planner.pipeline.zero_bubble_finish`).

With equal stages Alpa's expression is 1F1B's step; with unequal ones it is not.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.pipeline import zero_bubble_finish
from tests.test_zero_bubble import one_f_one_b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    alpa, zb = [], []
    for _ in range(args.cases):
        s, m = rng.randint(1, 8), rng.randint(1, 20)
        passes = [(rng.uniform(0.01, 2), rng.uniform(0.01, 2), rng.uniform(0.01, 2))
                  for _ in range(s)]
        ref = one_f_one_b(passes, m)
        t = [f + b + w for f, b, w in passes]
        alpa.append((sum(t) + (m - 1) * max(t)) / ref - 1)
        zb.append(max(zero_bubble_finish(passes, m)) / ref - 1)
    for name, xs in (("Alpa's expression", alpa), ("ZB-H1", zb)):
        xs.sort()
        pct = [xs[int(q * (len(xs) - 1))] * 100 for q in (0.0, 0.1, 0.5, 0.9, 1.0)]
        print(f"{name:18s} vs 1F1B's order, {len(xs)} cases: min {pct[0]:+.1f}%, "
              f"10th {pct[1]:+.1f}%, median {pct[2]:+.1f}%, 90th {pct[3]:+.1f}%, "
              f"max {pct[4]:+.1f}%")


if __name__ == "__main__":
    main()
