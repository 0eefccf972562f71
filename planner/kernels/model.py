"""A fitted kernel-time model: network, feature order, training range, harness overheads.

Prediction (numpy only)::

    t_kernel = t_bound · (1 + exp(−z(x)))            (seconds; never below t_bound)

and, only when comparing with a measurement harness that adds host time (NeuSight's
CUDA-event timing of a Python call), ``t_measured = overhead[harness][device] + t_kernel``.

Range handling: the *shape* features (log dimensions, pass, element size, groups,
dilation) must lie within the training range widened by :data:`RANGE_TOLERANCE_LOG2` (a
factor of 2 on each dimension; no widening for a feature that never varied in training);
outside it the estimator refuses and the caller falls back to the roofline.
Features that depend on the device (its specs, the bound time, intensity relative to the
ridge point, wave counts) are clipped to the training range instead, so an unseen GPU is
predicted from the nearest conditions the model was fitted on while its own specs enter
exactly through the bound and the wave quantisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .features import FEATURES, DeviceSpecs, features, gpu_features
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
    "log2_out_hw", "log2_flops", "log2_bytes", "log2_groups", "log2_dilation",
})


def level_class(dtype: str, peak_over_fp32: float) -> str:
    """The group whose median level an unseen GPU gets: FP32, or half precision on tensor
    cores (peak at least 4× FP32) or without them (P100-style half2 or FP32-rate units)."""
    if dtype in ("float16", "bfloat16"):
        return "half-tensor" if peak_over_fp32 >= 4.0 else "half"
    return dtype


@dataclass(frozen=True)
class LevelRows:
    """Rows grouped by (device, dtype, harness): each group has one sustained level."""

    keys: tuple[tuple[str, str, str], ...]  #: the distinct groups, first-seen order
    first: IntArray  #: a row of each group
    inverse: IntArray | None  #: group of every row (None: all rows in one group)
    n: int  #: rows

    @staticmethod
    def of(names: Sequence[str], dtypes: Sequence[str],
           harnesses: Sequence[str] | None = None) -> LevelRows:
        """Group rows (one device, dtype and harness for all rows is the fast case)."""
        n = len(names)
        hs: Sequence[str] = harnesses if harnesses is not None else ("",) * n
        if not n:
            return LevelRows((), np.zeros(0, dtype=np.int64), None, 0)
        if len(set(names)) == 1 and len(set(dtypes)) == 1 and len(set(hs)) == 1:
            return LevelRows(((names[0], dtypes[0], hs[0]),), np.zeros(1, dtype=np.int64),
                             None, n)
        index: dict[tuple[str, str, str], int] = {}
        inverse = np.fromiter((index.setdefault(k, len(index))
                               for k in zip(names, dtypes, hs, strict=True)),
                              dtype=np.int64, count=n)
        _, first = np.unique(inverse, return_index=True)
        return LevelRows(tuple(index), first.astype(np.int64), inverse, n)

    def spread(self, values: NDArray[Any]) -> NDArray[Any]:
        """Per-group values to per-row values."""
        if self.inverse is None:
            return np.full(self.n, values[0], dtype=values.dtype)
        return values[self.inverse]


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
    #: ``device|dtype`` → sustained fraction of the datasheet peak, ``e`` in (0, 1)
    levels: Mapping[str, float] = field(default_factory=dict)
    #: ``device|dtype`` → the GPU spec features it was fitted with
    level_specs: Mapping[str, Sequence[float]] = field(default_factory=dict)
    #: sweep → device → log-time drift at evenly spaced positions 0…1 of the sweep
    #: (a measurement condition, like the harness overhead: applied to compare with that
    #: sweep's rows, never to predict)
    drift: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    #: sweep → device → log drift of the harness overhead (the host's time per call) at
    #: the same positions (also a measurement condition, never used to predict)
    overhead_drift: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    #: level class (:func:`level_class`) → level an unseen GPU gets (median of the class)
    unseen_levels: Mapping[str, float] = field(default_factory=dict)
    #: level class → the least energy per FLOP (J) any GPU of the class the model has seen
    #: spent at its sustained rate, ``TDP / (e · peak)``: what caps an unseen GPU's level
    unseen_energy: Mapping[str, float] = field(default_factory=dict)
    #: device → its GPU die, for the devices with levels
    chips: Mapping[str, str] = field(default_factory=dict)
    #: launch floor added to every kernel (seconds)
    floor_s: float = 0.0

    def level(self, spec: DeviceSpecs, names: Sequence[str], dtypes: Sequence[str],
              harnesses: Sequence[str] | None = None) -> tuple[FloatArray, NDArray[np.bool_]]:
        """Level of each row, and whether its GPU was seen in training (else the median
        level of GPUs of its class, :func:`level_class`)."""
        return self.level_of(spec, LevelRows.of(names, dtypes, harnesses))

    def level_of(self, spec: DeviceSpecs, rows: LevelRows) -> tuple[FloatArray, BoolArray]:
        """:meth:`level` of rows already grouped by (device, dtype, harness)."""
        if not rows.keys:
            return np.ones(0), np.zeros(0, dtype=bool)
        sub = spec.rows(rows.first)
        g = gpu_features(sub)
        values = np.ones(len(rows.keys))
        seen = np.zeros(len(rows.keys), dtype=bool)
        for j, (name, dt, h) in enumerate(rows.keys):
            k = f"{name}|{dt}"
            ref = self.level_specs.get(k)
            if k in self.levels and ref is not None and np.allclose(
                    np.asarray(ref), g[j], rtol=1e-9, atol=1e-9):
                # the harness's own machine when it was measured, else the median
                values[j], seen[j] = float(self.levels.get(f"{k}|{h}", self.levels[k])), True
            else:
                cls = level_class(dt, float(2.0 ** g[j, -1]))
                values[j] = self.unseen_level(cls, sub, j, dt)
        return rows.spread(values), rows.spread(seen)

    def unseen_level(self, cls: str, spec: DeviceSpecs, i: int, dtype: str = "") -> float:
        """Sustained fraction of peak for a GPU the model has no measurements of (row ``i``
        of ``spec``), from its datasheet alone::

            e = max(min(e_0, TDP / (E_min · peak)), min(base / boost, e_0))

        ``e_0``: where the model has measured another board of the same die in the same
        dtype, that board's sustained FLOP/s over this one's peak (the median over such
        boards, at most 1); otherwise the median level of the seen GPUs of its class.
        ``E_min``: the least energy per FLOP a seen GPU of the class spent at its sustained
        rate; a card whose power limit cannot pay for its peak at that energy (the 70 W T4
        for A100-era silicon) is capped there. Newer silicon spends less energy per FLOP
        than any GPU measured, which makes that cap too low for it, so the vendor's
        guaranteed clock (base over boost) is a floor: within its TDP a card runs at least
        at base clock.
        """
        e_0 = float(self.unseen_levels.get(cls, self.unseen_levels.get("float32", 1.0)))
        chip = spec.chips[i] if spec.chips is not None else ""
        peak = float(spec.peak[i])
        if chip and peak > 0 and dtype:
            rates = [self.levels[k] * 2.0 ** self.level_specs[k][0]
                     for k in self.levels
                     if k.count("|") == 1 and k.endswith(f"|{dtype}")
                     and self.chips.get(k.split("|", 1)[0]) == chip and k in self.level_specs]
            if rates:
                e_0 = min(float(np.median(rates)) / peak, 1.0)
        value = e_0
        energy = self.unseen_energy.get(cls)
        tdp = float(spec.tdp_w[i]) if spec.tdp_w is not None else float("nan")
        if energy and np.isfinite(tdp) and tdp > 0 and peak > 0:
            value = min(value, tdp / (energy * peak))
        ratio = float(spec.base_ratio[i]) if spec.base_ratio is not None else float("nan")
        if np.isfinite(ratio) and ratio > 0:
            value = max(value, min(ratio, e_0))
        return float(min(max(value, 1e-3), 1.0))

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

    def tolerance(self) -> FloatArray:
        """How far beyond its training range each feature is still answered for:
        :data:`RANGE_TOLERANCE_LOG2` for a log feature that varied in training, none
        (up to rounding) for the rest (groups, dilation never varied)."""
        _, logf = self._masks()
        out: FloatArray = np.where(logf & (self.hi > self.lo), RANGE_TOLERANCE_LOG2, 1e-9)
        return out

    def in_range(self, x: FloatArray) -> BoolArray:
        """Rows whose shape features lie within the widened training range
        (:meth:`tolerance`)."""
        shape, _ = self._masks()
        tol = self.tolerance()[shape]
        xs = x[:, shape]
        ok: BoolArray = np.all((xs >= self.lo[shape] - tol) & (xs <= self.hi[shape] + tol),
                               axis=1)
        return ok

    def clip(self, x: FloatArray) -> FloatArray:
        """Device-dependent features clipped to the training range."""
        shape, _ = self._masks()
        out: FloatArray = x.copy()
        dev = ~shape
        out[:, dev] = np.clip(out[:, dev], self.lo[dev], self.hi[dev])
        return out

    def predict_raw(self, shape: IntArray, ops: Sequence[str], spec: DeviceSpecs,
                    devices: Sequence[str], dtypes: Sequence[str],
                    harnesses: Sequence[str] | None = None,
                    ) -> tuple[FloatArray, FloatArray, BoolArray]:
        """(kernel seconds, roofline bound seconds, in range) for rows of this family.

        ``t = t_0 + max(t_flop / e, t_byte) · (1 + exp(−z))`` with ``e`` ≤ 1 the GPU's
        sustained fraction of peak and ``t_0`` ≥ 0 a launch floor, so ``t ≥ max(t_flop,
        t_byte)`` (the roofline) always.
        """
        return Ensemble((self,)).predict_raw(shape, ops, spec, devices, dtypes, harnesses)

    def time_from(self, z: FloatArray, e: FloatArray, t_flop: FloatArray,
                  t_byte: FloatArray) -> FloatArray:
        """``t_0 + max(t_flop / e, t_byte) · (1 + exp(−z))``, never below the bound."""
        t = self.floor_s + np.maximum(t_flop / e, t_byte) * np.exp(log_slowdown(z))
        out: FloatArray = np.maximum(t, np.maximum(t_flop, t_byte))
        return out

    def drift_factor(self, sweep: str, device: str, position: FloatArray,
                     overhead: bool = False) -> FloatArray:
        """Kernel-time factor of rows of a sweep at ``position`` (with ``overhead``: the
        factor of the harness overhead); 1 where no drift was fitted.

        A GPU the model has no measurements of (no level) gets the knot-wise median of
        the curves fitted for the sweep's other GPUs: they ran the same sweep, and its
        drift is the harness's as much as the GPU's (NeuSight's conv sweep ran in one
        order on all four GPUs, and the host's time per call grew 3.9-7.9x along it on
        each). Without it a leave-one-GPU-out comparison counts that growth as error."""
        curves = self.overhead_drift if overhead else self.drift
        per = curves.get(sweep, {}) if sweep else {}
        theta = per.get(device)
        if not theta and per and not any(k.split("|", 1)[0] == device for k in self.levels):
            theta = [float(v) for v in np.median(np.asarray(list(per.values()),
                                                            dtype=np.float64), axis=0)]
        if not theta:
            return np.ones_like(position)
        knots = np.linspace(0.0, 1.0, len(theta))
        out: FloatArray = np.exp(np.interp(position, knots, np.asarray(theta, dtype=np.float64)))
        return out

    def overhead(self, harness: str, device: str) -> float:
        """Seconds the harness adds to a call on ``device`` (0 for back-to-back timing)."""
        table = self.overhead_s.get(harness)
        if not table:
            return 0.0
        return float(table.get(device, table.get("*", 0.0)))


@dataclass(frozen=True)
class Ensemble:
    """The fitted model of one kernel family: one or more :class:`KernelModel` members
    fitted on the same rows from different random starts, whose kernel times are
    combined by their geometric mean (averaging log time, the quantity each was fitted
    on). With few distinct shapes (DeepBench's convolutions: about 66 training shapes a
    GPU) one network's error on unseen shapes depends on its random start; the mean of
    several does not, nearly. The members share features, normalisation and training
    range; levels, overheads, drifts and the launch floor are each member's own."""

    members: tuple[KernelModel, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("an ensemble needs at least one member")

    @property
    def first(self) -> KernelModel:
        """The first member (what the members share is read from it)."""
        return self.members[0]

    @property
    def family(self) -> str:
        """Kernel family (``gemm`` or ``conv``)."""
        return self.first.family

    @property
    def features(self) -> tuple[str, ...]:
        """Feature order."""
        return self.first.features

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Dtypes with training data."""
        return self.first.dtypes

    @property
    def ops(self) -> tuple[str, ...]:
        """Ops with training data."""
        return self.first.ops

    @property
    def n_params(self) -> int:
        """Fitted network weights over all members."""
        return sum(m.mlp.n_params for m in self.members)

    def check(self) -> str | None:
        """A problem with any member, or with what members must share, or None."""
        for i, m in enumerate(self.members):
            problem = m.check()
            if problem is not None:
                return problem if len(self.members) == 1 else f"member {i}: {problem}"
            if i and (m.family != self.family or m.features != self.features
                      or not np.array_equal(m.lo, self.first.lo)
                      or not np.array_equal(m.hi, self.first.hi)):
                return f"member {i}: features or training range differ from member 0"
        return None

    def predict_raw(self, shape: IntArray, ops: Sequence[str], spec: DeviceSpecs,
                    devices: Sequence[str], dtypes: Sequence[str],
                    harnesses: Sequence[str] | None = None,
                    ) -> tuple[FloatArray, FloatArray, BoolArray]:
        """(kernel seconds, roofline bound seconds, in range): the geometric mean of the
        members' times (:meth:`member_times`)."""
        times, bound, ok = self.member_times(shape, ops, spec, devices, dtypes, harnesses)
        if len(times) == 1:
            return times[0], bound, ok
        # each member is at or above the bound, so their geometric mean is too
        t: FloatArray = np.maximum(np.exp(np.mean(np.log(times), axis=0)), bound)
        return t, bound, ok

    def member_times(self, shape: IntArray, ops: Sequence[str], spec: DeviceSpecs,
                     devices: Sequence[str], dtypes: Sequence[str],
                     harnesses: Sequence[str] | None = None,
                     ) -> tuple[list[FloatArray], FloatArray, BoolArray]:
        """(each member's kernel seconds, roofline bound seconds, in range), with the
        features, the level grouping and the first layers computed once for all::

            t = t_0 + max(t_flop / e, t_byte) · (1 + exp(−z))

        with ``e`` ≤ 1 the GPU's sustained fraction of peak and ``t_0`` ≥ 0 a launch
        floor, so ``t ≥ max(t_flop, t_byte)`` (the roofline) always."""
        first = self.first
        x, t_flop, t_byte = features(first.family, shape, ops, spec)
        ok = first.in_range(x) & np.all(np.isfinite(x), axis=1)
        bound = np.maximum(t_flop, t_byte)
        xc = first.clip(np.where(np.isfinite(x), x, 0.0))
        rows = LevelRows.of(devices, dtypes, harnesses)
        a1 = xc @ self.first_layer[0] + self.first_layer[1]  # every member's first layer
        times = []
        pos = 0
        for m in self.members:
            width = m.mlp.weights[0].shape[1]
            z = m.mlp.rest(a1[:, pos:pos + width])
            pos += width
            e, _ = m.level_of(spec, rows)
            times.append(m.time_from(z, e, t_flop, t_byte))
        return times, bound, ok

    @cached_property
    def first_layer(self) -> tuple[FloatArray, FloatArray]:
        """The members' first layers (normalisation folded in) side by side: one
        matrix product for all of them."""
        parts = [m.mlp.first_layer for m in self.members]
        return np.hstack([w for w, _ in parts]), np.concatenate([b for _, b in parts])

    def level(self, spec: DeviceSpecs, names: Sequence[str], dtypes: Sequence[str],
              harnesses: Sequence[str] | None = None) -> tuple[FloatArray, BoolArray]:
        """Geometric mean of the members' sustained fractions, and whether seen."""
        rows = LevelRows.of(names, dtypes, harnesses)
        got = [m.level_of(spec, rows) for m in self.members]
        e: FloatArray = np.exp(np.mean([np.log(g[0]) for g in got], axis=0))
        return e, got[0][1]


__all__ = ["RANGE_TOLERANCE_LOG2", "SHAPE_FEATURES", "Ensemble", "KernelModel"]
