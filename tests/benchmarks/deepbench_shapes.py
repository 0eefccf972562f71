"""Whether DeepBench's convolution misses are noise or the shape's (not a test module).

    python tests/benchmarks/deepbench_shapes.py [--models-dir DIR]

DeepBench measured the same 90 convolution shapes on eight GPUs, four of them two boards
of one die each (M40 and TITAN X (Maxwell): GM200; TITAN Xp, TITAN X (Pascal) and GTX 1080
Ti: GP102). For FP32 and each pass:

1. **Twins**: one board's times times the median ratio of the two boards (over the
   training shapes), against the other board's held-out rows. If each measurement
   carried much noise of its own, this would be far off; it is the floor of scatter
   under any model of the shape.
2. **The same shape on other GPUs**: the shipped model's held-out MAPE per GPU, and the
   same once each held-out row is divided by the median ratio measured / predicted of its
   shape on the other GPUs (held-out there too, so the model never saw the shape). If the
   misses are the shape's (a library's choice of algorithm for it), the other GPUs know
   them and this falls; a GPU whose library chose otherwise gains nothing. A shape
   DeepBench lists twice for a GPU counts once (its last row), so the MAPE before the
   correction is within a few tenths of ``kernels eval``'s, not equal to it.

3. **How far the held-out figures can be trusted**: about 29 held-out shapes a GPU and
   pass, so a GPU's MAPE has a standard error (the spread of its rows' errors over the
   root of their number), and the mean over the eight GPUs a 90% interval from 2,000
   resamplings of the held-out shapes (all GPUs' rows of a shape drawn together; seed 0).

The README's paragraph on the DeepBench misses quotes these figures.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "models" / "data" / "deepbench" / "deepbench_conv.csv"
PASSES = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")
TWINS = (("M40", "TITAN-X-Maxwell"), ("TITAN-Xp", "GTX-1080-Ti"),
         ("TITAN-Xp", "TITAN-X-Pascal"), ("TITAN-X-Pascal", "GTX-1080-Ti"))
MIN_OTHERS = 3


def _mape(ratio: np.ndarray) -> float:
    """MAPE (%) of predictions that are ``1 / ratio`` times the measurement."""
    return float(np.mean(np.abs(1.0 / ratio - 1.0)) * 100.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    table = read_files([CONV]).conv
    pred, _ = predict_table(load_models(args.models_dir).get("conv"), table)
    meas = np.asarray(table.seconds)
    held = np.asarray(table.holdout)
    # (op, device) -> shape -> (measured s, measured / predicted, held out), FP32 only
    rows: dict[tuple[str, str], dict[tuple[int, ...], tuple[float, float, bool]]] = \
        defaultdict(dict)
    for i, (op, dev, dt) in enumerate(zip(table.op, table.device, table.dtype, strict=True)):
        if dt == "float32":
            rows[(op, dev)][table.shape[i]] = (meas[i], meas[i] / pred[i], bool(held[i]))

    print("twins: MAPE of one board's time x the boards' median ratio, held-out shapes "
          "(shapes)")
    print(f"{'from -> to':<32} " + " ".join(f"{p:>18}" for p in PASSES))
    for a, b in TWINS:
        cells = []
        for op in PASSES:
            src, dst = rows[(op, a)], rows[(op, b)]
            common = sorted(set(src) & set(dst))
            ratio = np.array([dst[k][0] / src[k][0] for k in common])
            hold = np.array([dst[k][2] for k in common])
            scale = float(np.median(ratio[~hold]))
            cells.append(f"{_mape(ratio[hold] / scale):5.1f}% ({hold.sum():3d})")
        print(f"{a + ' -> ' + b:<32} " + " ".join(f"{c:>18}" for c in cells))

    print("\nheld-out MAPE of the model, and corrected by the same shape's median "
          "measured / predicted on the other GPUs")
    devices = sorted({d for _, d in rows})
    print(f"{'device':<16} " + " ".join(f"{p:>20}" for p in PASSES))
    for dev in devices:
        cells = []
        for op in PASSES:
            before, after = [], []
            for shape, (_, ratio, hold) in rows[(op, dev)].items():
                if not hold:
                    continue
                others = [rows[(op, d)][shape][1] for d in devices
                          if d != dev and shape in rows[(op, d)]]
                if len(others) < MIN_OTHERS:
                    continue
                before.append(ratio)
                after.append(ratio / float(np.exp(np.median(np.log(others)))))
            cells.append(f"{_mape(np.array(before)):5.1f} -> {_mape(np.array(after)):5.1f}%"
                         if before else "")
        print(f"{dev:<16} " + " ".join(f"{c:>20}" for c in cells))


    print("\nsampling error of the held-out MAPE: per-GPU standard error; mean of the GPUs "
          "and its 90% bootstrap interval over shapes")
    rng = np.random.default_rng(0)
    for op in PASSES:
        ape = {dev: {k: abs(1.0 / r - 1.0) * 100.0 for k, (_, r, h) in rows[(op, dev)].items()
                     if h} for dev in devices}
        se = [float(np.std(list(a.values()), ddof=1) / np.sqrt(len(a))) for a in ape.values()]
        shapes = sorted(set().union(*ape.values()))
        means = []
        for _ in range(2000):
            draw = np.bincount(rng.integers(0, len(shapes), len(shapes)), minlength=len(shapes))
            weight = dict(zip(shapes, draw, strict=True))
            per_gpu = [sum(weight[k] * e for k, e in a.items()) / max(sum(weight[k] for k in a), 1)
                       for a in ape.values()]
            means.append(float(np.mean(per_gpu)))
        mean = float(np.mean([np.mean(list(a.values())) for a in ape.values()]))
        lo, hi = np.percentile(means, [5, 95])
        print(f"{op:<16} standard error {min(se):.1f}-{max(se):.1f} points; mean {mean:.1f}% "
              f"(90%: {lo:.1f}-{hi:.1f}%)")


if __name__ == "__main__":
    main()
