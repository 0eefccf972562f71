"""Where the NeuSight forward-convolution error is, and whether shape can explain it
(not a test module).

    python tests/benchmarks/conv_residuals.py [--models-dir DIR] [--neighbours 20]

For the held-out (``test``) rows of NeuSight's 3x3 forward sweep, per GPU:

1. the MAPE of calls measured under and over 1 ms;
2. the correlation, between two GPUs, of the log error log(predicted / measured) of the
   same shape, over the shapes under 1 ms on both (all rows), and the correlation of the
   same shape's position in the two sweeps: the four GPUs ran the shapes in one and the
   same random order, so an error shared by the GPUs can be the moment's as well as the
   shape's;
3. the held-out MAPE after correcting each held-out row by the mean log error of its
   ``--neighbours`` nearest *training* shapes on the same GPU (Euclidean in log2 of
   batch, input channels, image size and output channels). If the shared error were a
   smooth function of the shape, its neighbours would predict it and this would fall;
4. the mean log error (%, measured over predicted) of all rows by tenth of the sweep,
   for calls predicted under and over 1 ms: what a drift of the kernel time alone
   leaves (short calls measured ever slower than predicted, long ones ever faster) and
   the harness overhead's own drift takes away.

The README's paragraph on the convolution misses quotes these figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.pipeline import select
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "models" / "data" / "neusight" / "neusight_conv2d_fwd_fp32.csv"
SHORT_S = 1e-3


class _Rows(NamedTuple):
    """One split's rows: shapes, measured seconds, devices, log(predicted / measured),
    positions in the sweep and predicted seconds."""

    shape: np.ndarray
    meas: np.ndarray
    dev: np.ndarray
    err: np.ndarray
    pos: np.ndarray
    pred: np.ndarray


def _mape(log_err: np.ndarray) -> float:
    return float(np.mean(np.abs(np.expm1(log_err))) * 100.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--neighbours", type=int, default=20)
    args = ap.parse_args()
    model = load_models(args.models_dir).get("conv")
    data = read_files([str(CONV)])
    parts = {}
    for split in ("train", "test"):
        tab = select(data, split).conv
        pred, _ = predict_table(model, tab)
        meas = np.asarray(tab.seconds)
        parts[split] = _Rows(tab.shape_array(), meas, np.array(tab.device),
                             np.log(pred / meas), np.asarray(tab.position), pred)
    shape, meas, dev, err = parts["test"].shape, parts["test"].meas, parts["test"].dev, \
        parts["test"].err
    devices = sorted(set(dev.tolist()))
    print("held-out MAPE by measured time")
    for d in devices:
        mine = dev == d
        short, long_ = mine & (meas < SHORT_S), mine & (meas >= SHORT_S)
        print(f"  {d:10s} all {_mape(err[mine]):5.1f}% (n = {int(mine.sum())})   "
              f"< 1 ms {_mape(err[short]):5.1f}% (n = {int(short.sum())})   "
              f">= 1 ms {_mape(err[long_]):5.1f}% (n = {int(long_.sum())})")

    print("correlation of the log error of the same shape on two GPUs (< 1 ms on both)")
    by_shape: dict[str, dict[tuple[int, ...], tuple[float, float, float]]] = {
        d: {} for d in devices}
    for split in ("train", "test"):
        rows = parts[split]
        for i in range(len(rows.meas)):
            by_shape[str(rows.dev[i])][tuple(int(v) for v in rows.shape[i])] = (
                float(rows.err[i]), float(rows.meas[i]), float(rows.pos[i]))
    for a in devices:
        cells = []
        for b in devices:
            pairs = [(va[0], by_shape[b][k][0]) for k, va in by_shape[a].items()
                     if k in by_shape[b] and va[1] < SHORT_S and by_shape[b][k][1] < SHORT_S]
            x = np.asarray(pairs)
            cells.append(f"{np.corrcoef(x.T)[0, 1]:5.2f} ({len(x)})")
        print(f"  {a:10s} " + "  ".join(cells))
    print("correlation of the same shape's position in the two sweeps")
    for a in devices:
        cells = []
        for b in devices:
            x = np.asarray([(va[2], by_shape[b][k][2]) for k, va in by_shape[a].items()
                            if k in by_shape[b]])
            cells.append(f"{np.corrcoef(x.T)[0, 1]:6.3f}")
        print(f"  {a:10s} " + "  ".join(cells))

    print(f"held-out MAPE corrected by the {args.neighbours} nearest training shapes")
    tr_shape, tr_dev, tr_err = parts["train"].shape, parts["train"].dev, parts["train"].err
    cols = [0, 1, 2, 4]  # batch, input channels, image height (= width), output channels
    for d in devices:
        a, b = tr_dev == d, dev == d
        xa = np.log2(tr_shape[a][:, cols].astype(float))
        xb = np.log2(shape[b][:, cols].astype(float))
        dist = ((xb[:, None, :] - xa[None, :, :]) ** 2).sum(-1)
        near = np.argsort(dist, axis=1, kind="stable")[:, :args.neighbours]
        corrected = err[b] - tr_err[a][near].mean(axis=1)
        print(f"  {d:10s} {_mape(err[b]):5.1f}% -> {_mape(corrected):5.1f}%")

    print("mean error (%, measured / predicted - 1) by tenth of the sweep, all rows")
    every = _Rows(*(np.concatenate(col) for col in zip(parts["train"], parts["test"],
                                                         strict=True)))
    a_dev, a_err, a_pos, a_pred = every.dev, every.err, every.pos, every.pred
    tenth = np.minimum((a_pos * 10).astype(int), 9)
    for d in devices:
        for name, sel in (("predicted < 1 ms", a_pred < SHORT_S),
                          ("predicted >= 1 ms", a_pred >= SHORT_S)):
            mine = (a_dev == d) & sel
            mean = [float(np.mean(-a_err[mine & (tenth == j)])) if np.any(mine & (tenth == j))
                    else float("nan") for j in range(10)]
            print(f"  {d:10s} {name:18s}" + "".join(f"{np.expm1(v) * 100:+5.0f}" for v in mean))


if __name__ == "__main__":
    main()
