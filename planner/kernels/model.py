"""A fitted kernel-time model: network, feature order, training range, harness overheads.

Prediction (numpy only)::

    t_kernel = t_bound · (1 + exp(−z(x)))            (seconds; never below t_bound)

and, only when comparing with a measurement harness that adds host time (NeuSight's
CUDA-event timing of a Python call), ``t_measured = overhead[harness][device] + t_kernel``.

Range handling: the *shape* features (log dimensions, pass, element size) must lie within
the training range widened by :data:`RANGE_TOLERANCE_LOG2` (a factor of 2 on each
dimension); outside it the estimator refuses and the caller falls back to the roofline.
Features that depend on the device (its specs, the bound time, intensity relative to the
ridge point, wave counts) are clipped to the training range instead, so an unseen GPU is
predicted from the nearest conditions the model was fitted on while its own specs enter
exactly through the bound and the wave quantisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .features import FEATURES, DeviceSpecs, features
from .mlp import Mlp, log_slowdown

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

RANGE_TOLERANCE_LOG2 = 1.0
#: Features checked against the training range (shape and element size); the rest clip.
SHAPE_FEATURES = frozenset({
    "log2_m", "log2_n", "log2_k", "log2_batch", "log2_c", "log2_hw", "log2_rs",
    "log2_stride", "pad_fraction", "phase_fwd", "phase_bwd_data", "phase_bwd_filter",
    "elem_bytes", "log2_winograd_saving", "log2_gemm_m", "log2_gemm_n", "log2_gemm_k",
    "log2_out_hw", "log2_flops", "log2_bytes",
})


@dataclass(frozen=True)
class KernelModel:
    """One fitted model of a kernel family (``gemm``: gemm and bmm; ``conv``: 3 passes)."""

    family: str
    features: tuple[str, ...]
    mlp: Mlp
    lo: FloatArray  #: training minimum of each feature
    hi: FloatArray  #: training maximum of each feature
    dtypes: tuple[str, ...]  #: dtypes with training data
    ops: tuple[str, ...]  #: ops with training data
    #: harness → device → seconds added to each measured call (``*``: other devices)
    overhead_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: collection → device → time factor of a sweep run at other clocks (reported only)
    collection_factor: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def check(self) -> str | None:
        """A problem with the model's structure, or None."""
        want = FEATURES.get(self.family)
        if want is None:
            return f"unknown kernel family {self.family!r}"
        if tuple(self.features) != want:
            return (f"feature order {list(self.features)} does not match what this version "
                    f"of planner computes {list(want)}; refit the model")
        n = len(want)
        if self.mlp.weights[0].shape[0] != n or self.mlp.mean.shape != (n,) or \
                self.mlp.std.shape != (n,) or self.lo.shape != (n,) or self.hi.shape != (n,):
            return "weight and normalisation shapes do not match the feature count"
        prev = n
        for w, b in zip(self.mlp.weights, self.mlp.biases, strict=True):
            if w.ndim != 2 or w.shape[0] != prev or b.shape != (w.shape[1],):
                return "layer shapes do not chain"
            prev = w.shape[1]
        if prev != 1:
            return "the last layer must have one output"
        if not all(np.all(np.isfinite(a)) for a in (*self.mlp.weights, *self.mlp.biases)):
            return "non-finite weights"
        return None

    def _masks(self) -> tuple[BoolArray, BoolArray]:
        shape = np.array([f in SHAPE_FEATURES for f in self.features])
        logf = np.array([f.startswith("log2_") for f in self.features])
        return shape, logf

    def in_range(self, x: FloatArray) -> BoolArray:
        """Rows whose shape features lie within the (widened) training range."""
        shape, logf = self._masks()
        tol = np.where(logf, RANGE_TOLERANCE_LOG2, 1e-9)[shape]
        xs = x[:, shape]
        ok: BoolArray = np.all((xs >= self.lo[shape] - tol) & (xs <= self.hi[shape] + tol),
                               axis=1)
        return ok

    def clip(self, x: FloatArray) -> FloatArray:
        """Device-dependent features clipped to the training range."""
        shape, _ = self._masks()
        out = x.copy()
        dev = ~shape
        out[:, dev] = np.clip(out[:, dev], self.lo[dev], self.hi[dev])
        return out

    def predict_raw(self, shape: IntArray, ops: Sequence[str],
                    spec: DeviceSpecs) -> tuple[FloatArray, FloatArray, BoolArray]:
        """(kernel seconds, bound seconds, in range) for rows of this family."""
        x, bound = features(self.family, shape, ops, spec)
        ok = self.in_range(x) & np.all(np.isfinite(x), axis=1)
        z = self.mlp.logit(self.clip(np.where(np.isfinite(x), x, 0.0)))
        return bound * np.exp(log_slowdown(z)), bound, ok

    def overhead(self, harness: str, device: str) -> float:
        """Seconds the harness adds to a call on ``device`` (0 for back-to-back timing)."""
        table = self.overhead_s.get(harness)
        if not table:
            return 0.0
        return float(table.get(device, table.get("*", 0.0)))


__all__ = ["RANGE_TOLERANCE_LOG2", "SHAPE_FEATURES", "KernelModel"]
