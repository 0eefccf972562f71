"""How often the kernel models predict less work to be slower (not a test module).

    python tests/benchmarks/monotone.py [--models-dir DIR] [--devices V100-SXM2,H100-SXM]

For random kernels it compares the predicted time with that of the same kernel with one
dimension doubled, and prints, per GPU, kernel and dimension, the share of pairs where
the smaller kernel is predicted over 5% slower and the worst ratio (smaller / larger).
GEMMs: M, N and K drawn log-uniformly from 1 to 16,384. Convolutions (FP32, each pass):
batch 1-32, channels 3-1,024 in, 16-1,024 out, square maps 7-224, 1x1 or 3x3 with
"same" padding; the doubled dimension is the batch N, the input channels C, the output
channels K or the height H. The README's "Monotone in the work" figures come from here.
The draws are seeded: the same models print the same figures.
"""

from __future__ import annotations

import argparse

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--devices", default="V100-SXM2,H100-SXM")
    args = ap.parse_args()
    est = LearnedEstimator(load_models(args.models_dir))
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
