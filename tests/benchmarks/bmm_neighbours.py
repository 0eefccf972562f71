"""Whether a held-out bmm's error is its neighbours' (not a test module).

    python tests/benchmarks/bmm_neighbours.py [--models-dir DIR]

For the held-out (``test``) rows of NeuSight's bmm sweep, per GPU with at least 500 of
them (the A100, the P100 and the T4): the MAPE of the models, and the MAPE after
correcting each held-out row by the mean log error, log(measured / predicted), of its
``k`` nearest *training* shapes on the same GPU (L1 distance in log2 of the batch, M, N
and K; k = 1, 3, 5, 10). Where the error is a smooth function of the shape, as a kernel
choice or a tile quantisation the model missed would be, the neighbours predict it and
the corrected MAPE falls; where it is the moment's (the T4's clocks, which change with
the load under its 70 W cap), it does not. The README's paragraph on the T4's bmm
quotes these figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.store import load_models

BMM = Path(__file__).resolve().parents[2] / "models" / "data" / "neusight" / \
    "neusight_bmm_fp32_test.csv"
NEIGHBOURS = (1, 3, 5, 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    tab = read_files([str(BMM)]).gemm
    pred, _ = predict_table(load_models(args.models_dir).get("gemm"), tab)
    meas = np.asarray(tab.seconds)
    err = np.log(meas / pred)
    dev = np.asarray(tab.device)
    hold = np.asarray(tab.holdout, dtype=bool)
    shape = np.log2(tab.shape_array().astype(np.float64))
    print("| GPU | held-out rows | MAPE | " + " | ".join(
        f"corrected by {k} nearest" for k in NEIGHBOURS) + " |")
    print("|---|---:|---:|" + "---:|" * len(NEIGHBOURS))
    for name in sorted(set(tab.device)):
        train = np.flatnonzero((dev == name) & ~hold)
        test = np.flatnonzero((dev == name) & hold)
        if len(test) < 500:
            continue
        dist = np.abs(shape[test][:, None, :] - shape[train][None, :, :]).sum(axis=2)
        order = np.argsort(dist, axis=1, kind="stable")
        cells = []
        for k in NEIGHBOURS:
            fixed = pred[test] * np.exp(err[train][order[:, :k]].mean(axis=1))
            cells.append(f"{np.mean(np.abs(fixed / meas[test] - 1.0)) * 100:.1f}%")
        base = np.mean(np.abs(pred[test] / meas[test] - 1.0)) * 100
        print(f"| {name} | {len(test)} | {base:.1f}% | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
