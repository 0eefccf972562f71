"""What the H100 profiles in ``models/data/h100/`` show (not a test module).

    python tests/benchmarks/h100_profile.py [--models-dir DIR]

Prints, per op and dtype: the run-to-run spread of the graph-timed sweep (the file
against ``repeat/``), the loop-timed first run over the graph-timed one (``loop/``), the
bf16 / fp16 ratio, the sustained fraction of the catalog peak of the large GEMMs, and
measured over predicted time by size of kernel for the models in DIR (the shipped ones by
default; a fit with ``--leave-out H100-SXM`` shows what the model made of the H100 before
it saw one). The figures of ``models/data/h100/README.md`` and of the README's
"Kernel times" section.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from planner.cluster import lookup_device
from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.features import gemm_work
from planner.kernels.store import load_models

DATA = Path(__file__).resolve().parents[2] / "models" / "data" / "h100"
OPS = ("gemm", "bmm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter")


Times = dict[tuple[object, ...], float]


def times(path: Path) -> Times:
    """(op, shape) → milliseconds, as `planner kernels fit` reads the file."""
    data = read_files([str(path)])
    return {(op, shape): sec * 1e3 for tab in (data.gemm, data.conv)
            for op, shape, sec in zip(tab.op, tab.shape, tab.seconds, strict=True)}


def spread(a: Times, b: Times, op: str) -> str:
    """Absolute difference of the same shape's times in two runs (percent of ``b``'s)."""
    d = np.array([abs(a[k] - b[k]) / b[k] for k in a if k[0] == op and k in b]) * 100
    if not len(d):
        return "no rows"
    return (f"mean {d.mean():.2f}%, median {np.median(d):.2f}%, p90 "
            f"{np.percentile(d, 90):.2f}%, max {d.max():.1f}% (n={len(d)})")


def ratio(a: Times, b: Times, op: str, min_ms: float = 0.0) -> str:
    r = np.array([a[k] / b[k] for k in a if k[0] == op and k in b and b[k] >= min_ms])
    if not len(r):
        return "no rows"
    return (f"median {np.median(r):.3f} (10th-90th {np.percentile(r, 10):.3f}-"
            f"{np.percentile(r, 90):.3f}, max {r.max():.2f}; n={len(r)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    for dt in ("fp32", "bf16"):
        run1, run2 = times(DATA / f"h100_{dt}.csv"), times(DATA / "repeat" / f"h100_{dt}.csv")
        loop = times(DATA / "loop" / f"h100_{dt}.csv")
        loop2 = times(DATA / "loop" / f"h100_{dt}_run2.csv")
        for op in OPS:
            print(f"{dt} {op:16s} graph run to run: {spread(run1, run2, op)}; "
                  f"loop run to run: {spread(loop, loop2, op)}")
            print(f"{'':21s} loop / graph: {ratio(loop, run1, op)}; "
                  f"calls ≥ 0.2 ms: {ratio(loop, run1, op, 0.2)}")
    bf16, fp16 = times(DATA / "h100_bf16.csv"), times(DATA / "h100_fp16.csv")
    for op in OPS:
        print(f"bf16 / fp16 {op:16s} {ratio(bf16, fp16, op)}")
    dev = lookup_device("H100-SXM")
    for dt in ("fp32", "bf16"):
        tab = read_files([str(DATA / f"h100_{dt}.csv")]).gemm
        flops, _ = gemm_work(tab.shape_array(), np.full(len(tab), 4.0))
        big = (np.asarray(tab.op) == "gemm") & (flops >= 1e11)
        frac = flops[big] / np.asarray(tab.seconds)[big] / dev.peak(dt)
        print(f"{dt} GEMMs of ≥ 100 GFLOP: {len(frac)}, fraction of the catalog peak "
              f"median {np.median(frac):.3f}, 95th percentile {np.percentile(frac, 95):.3f}")
    models = load_models(args.models_dir)
    data = read_files([str(DATA / "h100_fp32.csv"), str(DATA / "h100_bf16.csv")])
    for fam, tab in (("gemm", data.gemm), ("conv", data.conv)):
        model = models.get(fam)
        if model is None:
            continue
        pred, _ = predict_table(model, tab)
        meas = np.asarray(tab.seconds)
        ops, dts = np.asarray(tab.op), np.asarray(tab.dtype)
        for op in sorted(set(tab.op)):
            for dt in sorted(set(tab.dtype)):
                for lo, hi in ((0, 20e-6), (20e-6, 100e-6), (100e-6, 1e-3), (1e-3, np.inf)):
                    m = (ops == op) & (dts == dt) & (meas >= lo) & (meas < hi)
                    if m.any():
                        r = meas[m] / pred[m]
                        print(f"{op:16s} {dt:9s} {lo * 1e6:>6,.0f}-{hi * 1e6:<7,.0f} µs "
                              f"n={int(m.sum()):3d}  measured / predicted median "
                              f"{np.median(r):.2f} (10th-90th {np.percentile(r, 10):.2f}-"
                              f"{np.percentile(r, 90):.2f})")


if __name__ == "__main__":
    main()
