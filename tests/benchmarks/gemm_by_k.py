"""Held-out GEMM error of one GPU split at a reduction length (not a test module).

    python tests/benchmarks/gemm_by_k.py DEVICE [--models-dir DIR] [--k 16384]

Prints the MAPE, median APE, the geometric mean of predicted over measured time and the
5th, 50th and 95th percentiles of measured over predicted time of the NeuSight linear
*test* rows of DEVICE, all of them and with K below and at or above ``--k`` (the
README's breakdown of the leave-one-GPU-out P100, and the spread of every held-out
GPU's errors under "Error bands": fit with ``--leave-out DEVICE`` into DIR first).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from planner.cluster import lookup_device
from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.pipeline import select
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
LINEAR = ROOT / "models" / "data" / "neusight" / "neusight_linear_fp32.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--k", type=int, default=16384)
    args = ap.parse_args()
    name = lookup_device(args.device).name
    tab = select(read_files([str(LINEAR)]), "test").gemm
    pred, _ = predict_table(load_models(args.models_dir).get("gemm"), tab)
    meas = np.asarray(tab.seconds)
    ape = np.abs(pred / meas - 1.0) * 100.0
    mine = np.array([d == name for d in tab.device])
    long_k = tab.shape_array()[:, 2] >= args.k  # rows (m, n, k, batch): k is the reduction
    for label, rows in (("all", mine), (f"K < {args.k:,}", mine & ~long_k),
                        (f"K >= {args.k:,}", mine & long_k)):
        if not rows.any():
            continue
        ratio = float(np.exp(np.mean(np.log(pred[rows] / meas[rows]))))
        lo, mid, hi = np.quantile(meas[rows] / pred[rows], (0.05, 0.5, 0.95))
        print(f"{name} {label:>12}: n = {int(rows.sum()):4d}  MAPE {ape[rows].mean():5.1f}%  "
              f"median {np.median(ape[rows]):5.1f}%  predicted/measured {ratio:.2f}  "
              f"measured/predicted 5th/50th/95th percentile {lo:.2f} / {mid:.2f} / {hi:.2f}")


if __name__ == "__main__":
    main()
