"""How often the kernel models predict less work to be slower (not a test module).

    python tests/benchmarks/monotone.py [--models-dir DIR] [--devices V100-SXM2,H100-SXM]

For random kernels it compares the predicted time with that of the same kernel with one
dimension doubled, and prints, per GPU, kernel and dimension, the share of pairs where
the smaller kernel is predicted over 5% slower and the worst ratio (smaller / larger).
GEMMs: M, N and K drawn log-uniformly from 1 to 16,384. Convolutions (FP32, each pass):
batch 1-32, channels 3-1,024 in, 16-1,024 out, square maps 7-224, 1x1 or 3x3 with
"same" padding; the doubled dimension is the batch N, the input channels C, the output
channels K or the height H. The README's "Monotone in the work" figures come from here.

With ``--wide`` it draws instead across and beyond the data's range (powers of two:
batch 1-256, channels 1-4,096 in, 2-4,096 out, square maps 4-256, filters 1, 3, 5 or
7 with "same" padding, the pass drawn), on the H100, T4, A100 and V100 in FP32 and
BF16, doubles each of N, C, K and the image (height and width) in turn, and counts the
doublings predicted more than 30% faster (1.3×), by where each side of the pair was
timed (in the model, scaled, padded or on the roofline); the README's figures on
channels beyond the data come from here.
With ``--every-gpu`` it draws, for each GPU the GEMM model was fitted on, 1,500 random
FP32 GEMMs (M, N and K log-uniform from 1 to 16,384) predicted at 20 µs or more, doubles
one dimension of each (M, N or K in turn), and counts the doubled GEMMs predicted more
than 20% faster than the original (ratio doubled / original under 0.8), with the worst
ratio: the README's figures on GPUs measured only at large sizes (the P4, the M40) come
from here.
With ``--bmm`` it draws 3,000 batched GEMMs (M, N and K log-uniform from 16 to 8,192,
the batch from 2 to 512: attention's products), doubles each of M, N, K and the batch in
turn, and counts, per GPU and dtype (the H100, H200, A100 and V100 in FP32 and BF16),
the doublings predicted more than 10% faster where the model timed both sides (not
scaled or on the roofline), with the worst ratio (smaller / larger): the README's
figures on the bmm model's monotonicity come from here.
The draws are seeded: the same models print the same figures.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from planner.cluster import lookup_device
from planner.kernels import LearnedEstimator, load_models
from planner.ops import Conv, Gemm

PAIRS = 3000
CHANNELS_IN = (3, 16, 32, 64, 128, 256, 512, 1024)
CHANNELS_OUT = (16, 32, 64, 128, 256, 512, 1024)
MAPS = (7, 14, 28, 56, 112, 224)


def _row(device: str, kind: str, dim: str, small: np.ndarray, big: np.ndarray) -> None:
    ratio = small / big
    print(f"{device:12s} {kind:15s} {dim}  {np.mean(ratio > 1.05) * 100:5.1f}%  "
          f"worst {ratio.max():.2f}")


def _how(source: str) -> str:
    if source.startswith("roofline"):
        return "roofline"
    return next((w for w in ("scaled", "padded") if w in source), "model")


def wide(est: LearnedEstimator) -> None:
    """Doublings across and beyond the data's range (``--wide``)."""
    rng = np.random.default_rng(0)
    total, faster, worst = 0, Counter[tuple[str, str, str]](), 0.0
    for name in ("H100-SXM", "T4", "A100-SXM4-80GB", "V100-SXM2"):
        dev = lookup_device(name)
        for dtype in ("float32", "bfloat16"):
            small, big, dims = [], [], []
            for _ in range(400):
                r = int(rng.choice([1, 3, 5, 7]))
                kw = {"n": int(2 ** rng.integers(0, 9)), "c": int(2 ** rng.integers(0, 13)),
                      "h": int(2 ** rng.integers(2, 9)), "k": int(2 ** rng.integers(1, 13)),
                      "r": r, "s": r, "pad_h": r // 2, "pad_w": r // 2,
                      "phase": str(rng.choice(["fwd", "bwd_data", "bwd_filter"]))}
                kw["w"] = kw["h"]
                for dim in "nchk":
                    twice = dict(kw, **{dim: kw[dim] * 2})
                    if dim == "h":
                        twice["w"] = twice["h"]
                    small.append(Conv(**kw))  # type: ignore[arg-type]
                    big.append(Conv(**twice))  # type: ignore[arg-type]
                    dims.append(dim.upper())
            a, b = est.estimate(small, dev, dtype), est.estimate(big, dev, dtype)
            total += len(small)
            for i, ratio in enumerate((a.seconds / b.seconds).tolist()):
                worst = max(worst, ratio)
                if ratio > 1.3:
                    faster[(dims[i], _how(a.source[i]), _how(b.source[i]))] += 1
    print(f"{sum(faster.values())} of {total} doublings predicted more than 30% faster, "
          f"the worst {worst:.2f}x")
    print("count  dim  smaller kernel timed  doubled kernel timed")
    for (dim, how_a, how_b), count in sorted(faster.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{count:5d}  {dim:3s}  {how_a:20s}  {how_b}")


def doubled_faster(est: LearnedEstimator, count: int = 1500) -> dict[str, tuple[int, float]]:
    """For each GPU the GEMM model was fitted on: how many of ``count`` random FP32
    GEMMs predicted at 20 µs or more are predicted over 20% faster with one dimension
    doubled (M, N and K in turn), and the least ratio doubled / original."""
    gemm = est.models.get("gemm")
    assert gemm is not None, "no GEMM model"
    out = {}
    for name in sorted({k.split("|", 1)[0] for k in gemm.first.levels}):
        dev = lookup_device(name)
        rng = np.random.default_rng(0)
        small: list[Gemm] = []
        while len(small) < count:
            draw = [Gemm(*(int(x) for x in 2 ** rng.uniform(0, 14, 3))) for _ in range(count)]
            t = est.estimate(draw, dev, "float32").seconds
            small += [g for g, s in zip(draw, t.tolist(), strict=True) if s >= 20e-6]
        small = small[:count]
        big = [Gemm(g.m * (2 if i % 3 == 0 else 1), g.n * (2 if i % 3 == 1 else 1),
                    g.k * (2 if i % 3 == 2 else 1)) for i, g in enumerate(small)]
        t = est.estimate(small + big, dev, "float32").seconds
        ratio = t[count:] / t[:count]
        out[name] = (int(np.sum(ratio < 0.8)), float(ratio.min()))
    return out


def every_gpu(est: LearnedEstimator) -> None:
    """``--every-gpu``: :func:`doubled_faster`, printed."""
    print(f"{'device':16s} doubled >20% faster   worst doubled / original")
    for name, (faster, worst) in doubled_faster(est).items():
        print(f"{name:16s} {faster:5d} of 1500      {worst:.2f}")


def bmm(est: LearnedEstimator) -> None:
    """``--bmm``: doubled batched GEMMs predicted over 10% faster (see the module text)."""
    rng = np.random.default_rng(0)

    def draw(lo: float, hi: float) -> int:
        return round(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    ks = [Gemm(draw(16, 8192), draw(16, 8192), draw(16, 8192), draw(2, 512))
          for _ in range(PAIRS)]
    print(f"{'device':16s} {'dtype':9s} doubled >10% faster, of pairs timed by the model; "
          "worst ratio")
    for name in ("H100-SXM", "H200-SXM", "A100-SXM-80GB", "V100-SXM2"):
        dev = lookup_device(name)
        for dtype in ("float32", "bfloat16"):
            base = est.estimate(ks, dev, dtype)
            bad = pairs = 0
            worst = 1.0
            for dim in ("m", "n", "k", "batch"):
                big = [Gemm(**{"m": k.m, "n": k.n, "k": k.k, "batch": k.batch,
                               dim: getattr(k, dim) * 2}) for k in ks]
                t = est.estimate(big, dev, dtype)
                ok = np.array([a.startswith("mlp") and "(" not in a and b.startswith("mlp")
                               and "(" not in b for a, b in zip(base.source, t.source,
                                                                 strict=True)])
                ratio = base.seconds[ok] / t.seconds[ok]
                pairs += int(ok.sum())
                bad += int(np.sum(ratio > 1.1))
                worst = max(worst, float(ratio.max()))
            print(f"{dev.name:16s} {dtype:9s} {bad:5d} of {pairs:6d}  {worst:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--devices", default="V100-SXM2,H100-SXM")
    ap.add_argument("--wide", action="store_true",
                    help="draw across and beyond the data's range (see the module text)")
    ap.add_argument("--every-gpu", action="store_true",
                    help="doubled GEMMs predicted over 20%% faster on each fitted GPU")
    ap.add_argument("--bmm", action="store_true",
                    help="doubled batched GEMMs predicted over 10%% faster, per GPU and dtype")
    args = ap.parse_args()
    est = LearnedEstimator(load_models(args.models_dir))
    if args.bmm:
        bmm(est)
        return
    if args.every_gpu:
        every_gpu(est)
        return
    if args.wide:
        wide(est)
        return
    print(f"{'device':12s} {'kernel':15s} dim  >5% slower at half, worst ratio")
    for name in args.devices.split(","):
        dev = lookup_device(name)
        rng = np.random.default_rng(0)
        for axis, dim in enumerate("MNK"):
            a, b = [], []
            for _ in range(PAIRS):
                v = [int(x) for x in 2 ** rng.uniform(0, 14, 3)]
                w = list(v)
                w[axis] *= 2
                a.append(Gemm(*v))
                b.append(Gemm(*w))
            t = est.estimate(a + b, dev, "float32").seconds
            _row(dev.name, "gemm", dim, t[:PAIRS], t[PAIRS:])
        for phase in ("fwd", "bwd_data", "bwd_filter"):
            for dim in "NCKH":
                a, b = [], []
                for _ in range(PAIRS):
                    c, k = int(rng.choice(CHANNELS_IN)), int(rng.choice(CHANNELS_OUT))
                    hw, r = int(rng.choice(MAPS)), int(rng.choice((1, 3)))
                    n = int(rng.choice((1, 2, 4, 8, 16, 32)))
                    a.append(Conv(n, c, hw, hw, k, r, r, 1, 1, r // 2, r // 2, phase=phase))
                    b.append(Conv(n * (1 + (dim == "N")), c * (1 + (dim == "C")),
                                  hw * (1 + (dim == "H")), hw, k * (1 + (dim == "K")), r, r,
                                  1, 1, r // 2, r // 2, phase=phase))
                t = est.estimate(a + b, dev, "float32").seconds
                _row(dev.name, f"conv {phase}", dim, t[:PAIRS], t[PAIRS:])


if __name__ == "__main__":
    main()
