"""Whether one factor per pass would bring the convolution and T4 bmm misses in (not a
test module).

    python tests/benchmarks/scale_oracle.py [--models-dir DIR]

Multiplies every prediction of a pass (DeepBench FP32 convolutions, NeuSight bmm per GPU)
by each factor from 0.80 to 1.05 in steps of 0.01 and prints, per pass, the held-out MAPE
at factor 1 and at the best factor: an oracle, the factor chosen on the held-out rows
themselves, so no fitted scale could do better. A log-loss fit predicts the geometric
mean of a shape's times; the MAPE-optimal prediction of a scattered time is lower (the
``1/t``-weighted median), so this bounds what retargeting the fit to MAPE would gain.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "models" / "data"
FACTORS = np.round(np.arange(0.80, 1.0501, 0.01), 2)


def _mean_mape(pred, actual, groups, factor):
    return float(np.mean([np.mean(np.abs(factor * pred[g] / actual[g] - 1.0)) * 100.0
                          for g in groups]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    models = load_models(args.models_dir)
    conv = read_files([str(DATA / "deepbench" / "deepbench_conv.csv")]).conv
    bmm = read_files([str(DATA / "neusight" / "neusight_bmm_fp32_test.csv")]).gemm
    print(f"{'pass':<38} {'MAPE at 1':>10} {'best factor':>12} {'MAPE there':>11}")
    for table, family, label in ((conv, "conv", "mean over the GPUs"), (bmm, "gemm", "")):
        pred, _ = predict_table(models.get(family), table)
        actual = np.asarray(table.seconds)
        held = np.asarray(table.holdout)
        op, dt, dev = (np.asarray(x) for x in (table.op, table.dtype, table.device))
        for o in sorted(set(op)):
            rows = held & (op == o) & (dt == "float32")
            devices = sorted(set(dev[rows]))
            cases = [(f"{o} ({label})", [rows & (dev == d) for d in devices])] if label \
                else [(f"{o} {d}", [rows & (dev == d)]) for d in devices]
            for name, groups in cases:
                at = [_mean_mape(pred, actual, groups, f) for f in FACTORS]
                k = int(np.argmin(at))
                print(f"{name:<38} {_mean_mape(pred, actual, groups, 1.0):>10.2f} "
                      f"{FACTORS[k]:>12.2f} {at[k]:>11.2f}")


if __name__ == "__main__":
    main()
