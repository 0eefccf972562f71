"""Which cuBLAS kernel ran NeuSight's GEMMs, and what each reached (not a test module).

    python tests/benchmarks/kernel_names.py [--upstream DIR] [--models-dir DIR]

The copies in ``models/data/neusight`` drop NeuSight's ``matched_kernel`` column (the
kernel its profiler matched to each call); the shared reference copies beside the
repository keep it (``--upstream``, default ``../shared/data/measured/neusight``). Two
questions about two of the README's misses, answered from it:

1. **The P100's long reductions** (the leave-one-GPU-out P100): for each GPU and kernel of
   the linear sweep (both splits, GEMMs of at least 10 GFLOP), the median achieved fraction
   of the datasheet FP32 peak by reduction length ``K``. If the P100's slowdown at
   ``K ≥ 16,384`` came with another kernel, a kernel choice would explain it; if the same
   kernel slows down, it is the memory system's.
2. **The T4's bmm spread**: for each GPU and kernel of the bmm sweep, its rows and the
   shipped model's MAPE on them (held-out rows and all rows). If one kernel has the
   error, a kernel choice would explain it.
3. **How far the bmm measurements agree with themselves**, from the project's copies
   alone: a bmm of at least 1 ms fills the GPU, so the same matrices with ``f`` times the
   batch (``f`` = 2, 4, 5, 8 or 10, where the sweep measured both) should take ``f``
   times as long. The MAPE of that rule per GPU is a floor under what any model of
   the shape can reach there: the rule uses the GPU's own measurement of the smaller
   kernel.
4. **What ran just before**: NeuSight ran the bmm sweep in file order (on the T4 a
   call's error correlates with the previous call's time and not with the one before it:
   last column). Per GPU, for
   calls of 0.3-10 ms, the share measured 25% or more faster than the model predicts, and
   the median measured / predicted, by the time of the call before it; then the held-out
   MAPE once each call is divided by the mean ratio of its previous-call bin (fitted on
   the training rows): how much of a GPU's error the previous call can explain.

Rows are matched to the project's copies by position (the same files, columns dropped).
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from planner.cluster import lookup_device
from planner.kernels.data import Table, read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
OURS = ROOT / "models" / "data" / "neusight"
K_EDGES = (8192, 16384, 32768)
MIN_FLOP = 1e10
MIN_MS = 1.0
BATCH_FACTORS = (2, 4, 5, 8, 10)
PREV_EDGES_MS = (0.3, 1.0, 3.0, 10.0)
FAST = 0.75  #: measured / predicted at or under this: the fast mode


def _k_bin(k: int) -> str:
    lo = 0
    for edge in K_EDGES:
        if k < edge:
            return f"{lo:,}-{edge - 1:,}"
        lo = edge
    return f">={lo:,}"


def linear(upstream: Path) -> None:
    rows = list(csv.DictReader((upstream / "neusight_linear_fp32.csv").open()))
    fractions: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        dev = lookup_device(r["device"])
        assert dev is not None, r["device"]
        # torch.nn.Linear(N, K) on (B, M, N): the reduction is N
        m, red, out = int(r["B"]) * int(r["M"]), int(r["N"]), int(r["K"])
        flop = 2.0 * m * red * out
        if flop < MIN_FLOP:
            continue
        achieved = flop / (float(r["latency_ms"]) * 1e-3) / dev.peak("fp32")
        fractions[(dev.name, r["matched_kernel"], _k_bin(red))].append(achieved)
    bins = [_k_bin(k) for k in (0, *K_EDGES)]
    print(f"linear sweep, GEMMs >= {MIN_FLOP:.0e} FLOP: median fraction of the FP32 peak "
          "(rows) by reduction K")
    print(f"{'device':<16} {'kernel':<36} " + " ".join(f"{b:>18}" for b in bins))
    for dev, kernel in sorted({(d, k) for d, k, _ in fractions}):
        cells = []
        for b in bins:
            v = fractions.get((dev, kernel, b))
            cells.append(f"{np.median(v):.2f} ({len(v):4d})" if v else "")
        print(f"{dev:<16} {kernel:<36} " + " ".join(f"{c:>18}" for c in cells))


def bmm(upstream: Path, models_dir: str | None, table: Table) -> None:
    names = [r["matched_kernel"]
             for r in csv.DictReader((upstream / "neusight_bmm_fp32_test.csv").open())]
    assert len(names) == len(table), "the copies differ in rows"
    pred, _ = predict_table(load_models(models_dir).get("gemm"), table)
    ape = np.abs(pred / np.asarray(table.seconds) - 1.0) * 100.0
    held = np.asarray(table.holdout)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (dev, kernel) in enumerate(zip(table.device, names, strict=True)):
        groups[(dev, kernel)].append(i)
    print("\nbmm sweep: rows and MAPE of the model, by kernel")
    print(f"{'device':<16} {'kernel':<36} {'rows':>6} {'held out':>9} {'MAPE held out':>14} "
          f"{'MAPE all':>9}")
    for (dev, kernel), idx in sorted(groups.items()):
        i = np.asarray(idx)
        h = i[held[i]]
        print(f"{dev:<16} {kernel:<36} {len(i):6d} {len(h):9d} "
              f"{ape[h].mean() if len(h) else float('nan'):13.1f}% {ape[i].mean():8.1f}%")


def batch_rule(table: Table) -> None:
    shapes, secs = table.shape_array(), np.asarray(table.seconds)
    print(f"\nbmm sweep: t(f x batch) predicted as f x t(batch), kernels >= {MIN_MS} ms")
    print(f"{'device':<16} {'pairs':>6} {'MAPE':>6} {'median':>7} {'p90':>6}")
    for dev in sorted(set(table.device)):
        times = {tuple(int(v) for v in shapes[i]): float(secs[i])
                 for i, d in enumerate(table.device) if d == dev}
        ape = [abs(f * t - times[(m, k, n, f * b)]) / times[(m, k, n, f * b)] * 100.0
               for (m, k, n, b), t in times.items() if t >= MIN_MS * 1e-3
               for f in BATCH_FACTORS if (m, k, n, f * b) in times]
        if ape:
            print(f"{dev:<16} {len(ape):6d} {np.mean(ape):5.1f}% {np.median(ape):6.1f}% "
                  f"{np.percentile(ape, 90):5.1f}%")


def previous_call(models_dir: str | None, table: Table) -> None:
    pred, _ = predict_table(load_models(models_dir).get("gemm"), table)
    secs = np.asarray(table.seconds)
    held = np.asarray(table.holdout)
    labels = [f"<{PREV_EDGES_MS[0]:g}"] + [f">={e:g}" for e in PREV_EDGES_MS]
    print("\nbmm sweep, calls of 0.3-10 ms: fast share (measured/predicted <= "
          f"{FAST}) and median measured/predicted, by the previous call's time (ms)")
    print(f"{'device':<16} " + " ".join(f"{lab:>17}" for lab in labels)
          + f" {'held-out MAPE':>14} {'corrected':>10} {'corr lag 1/2/3':>18}")
    for dev in sorted(set(table.device)):
        i = np.asarray([j for j, d in enumerate(table.device) if d == dev])
        if len(i) < 500:
            continue
        ratio = secs[i] / pred[i]
        prev = np.r_[secs[i][0], secs[i][:-1]] * 1e3
        b = np.digitize(prev, PREV_EDGES_MS)
        mid = (secs[i] >= 0.3e-3) & (secs[i] < 10e-3)
        cells = []
        for k in range(len(labels)):
            m = mid & (b == k)
            cells.append(f"{(ratio[m] <= FAST).mean():4.2f} {np.median(ratio[m]):4.2f} "
                         f"({m.sum():4d})" if m.any() else "")
        h = held[i]
        fix = np.ones(len(i))
        for k in range(len(labels)):
            m = b == k
            if (m & ~h).any():
                fix[m] = np.exp(np.mean(np.log(ratio[m & ~h])))
        before = np.mean(np.abs(1.0 / ratio[h] - 1.0)) * 100.0
        after = np.mean(np.abs(fix[h] / ratio[h] - 1.0)) * 100.0
        # the error's correlation with the log time of the call 1, 2, 3 calls before
        err = np.log(ratio)
        lags = [np.corrcoef(err[lag:], np.log(secs[i][:-lag]))[0, 1] for lag in (1, 2, 3)]
        print(f"{dev:<16} " + " ".join(f"{c:>17}" for c in cells)
              + f" {before:13.1f}% {after:9.1f}% " + " / ".join(f"{v:+.2f}" for v in lags))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=Path,
                    default=ROOT.parent / "shared" / "data" / "measured" / "neusight")
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    linear(args.upstream)
    table = read_files([OURS / "neusight_bmm_fp32_test.csv"]).gemm
    bmm(args.upstream, args.models_dir, table)
    batch_rule(table)
    previous_call(args.models_dir, table)


if __name__ == "__main__":
    main()
