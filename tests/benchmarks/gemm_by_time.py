"""Held-out FP32 GEMM error of the Hopper GPUs by measured time (not a test module).

    python tests/benchmarks/gemm_by_time.py [--models-dir DIR]

Prints, for the held-out FP32 GEMM rows of the project's H100 and H200 profiles, the row
count, the median of measured over predicted time and the MAPE per band of measured
time (under 30 µs, 30-300 µs, 0.3-3 ms, 3 ms and more): the README's breakdown of the
leave-one-GPU-out H200 (fit with ``--leave-out H100-SXM --leave-out H200`` into DIR
first, README loop (2)).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.pipeline import select
from planner.kernels.store import load_models

DATA = Path(__file__).resolve().parents[2] / "models" / "data"
FILES = (DATA / "h100" / "h100_fp32.csv", DATA / "h200" / "h200_fp32.csv")
BANDS = ((0.0, 30e-6), (30e-6, 300e-6), (300e-6, 3e-3), (3e-3, float("inf")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    tab = select(read_files([str(f) for f in FILES]), "test").gemm
    pred, _ = predict_table(load_models(args.models_dir).get("gemm"), tab)
    meas = np.asarray(tab.seconds)
    ratio = meas / pred
    dev, op = np.asarray(tab.device), np.asarray(tab.op)
    for name in sorted(set(tab.device)):
        for lo, hi in BANDS:
            rows = (dev == name) & (op == "gemm") & (meas >= lo) & (meas < hi)
            if not rows.any():
                continue
            ape = np.abs(1.0 / ratio[rows] - 1.0) * 100.0
            print(f"{name:>8} {lo * 1e6:7.0f}-{hi * 1e6:<7.0f} µs: n = {int(rows.sum()):3d}  "
                  f"measured/predicted median {np.median(ratio[rows]):.2f}  "
                  f"MAPE {ape.mean():5.1f}%")


if __name__ == "__main__":
    main()
