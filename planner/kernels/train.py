"""Fitting the kernel-time models with numpy and scipy (deterministic, no PyTorch).

For one kernel family the fit minimises, over the network's weights ``θ`` and a few
nuisance parameters, the weighted mean squared error of log time::

    L = Σ_i w_i (log t̂_i − log t_i)² / Σ_i w_i  +  λ Σ ‖W‖²
    t̂_i = c[h_i, d_i] + φ[s_i, d_i] · t_bound,i · (1 + exp(−z_θ(x_i)))

* ``c[h, d]``: host time a harness adds per call on device ``d`` (NeuSight's CUDA-event
  timing around a Python call; zero for DeepBench's and the profiler's back-to-back
  launches). Fitted per device, with the median over devices kept for unseen ones.
* ``φ[s, d]``: a per-device time factor of a sweep ``s`` that ran at other clocks than
  the rest of that device's data: NeuSight's linear *train* sweep is 5-70% slower than
  its *test* sweep on the same GPUs for the same kind of shapes (the P4 reaches 21% of
  its FP32 peak in one and 77% in the other), which looks like sustained-load
  throttling of passively cooled cards. The factor lets the sweep teach the shape
  dependence without dragging the level; it is reported, never used to predict.
* ``w_i``: every (device, harness, op) group gets total weight ∝ ``n_g^GROUP_POWER`` so
  that a GPU with thousands of rows does not drown one with a hundred.

The optimiser is L-BFGS-B (scipy) on the exact gradient, from weights drawn with a fixed
seed: the same data give the same weights on every run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..cluster import lookup_device
from ..errors import UsageError
from .data import Table
from .features import FEATURES, DeviceSpecs, features
from .mlp import Mlp
from .model import KernelModel

FloatArray = NDArray[np.float64]

GROUP_POWER = 0.5


@dataclass(frozen=True)
class FitOptions:
    """Hyper-parameters of a fit (the defaults are what the shipped models use)."""

    hidden: tuple[int, ...] = (32, 32)
    l2: float = 1e-4
    max_iter: int = 3000
    seed: int = 0
    group_power: float = GROUP_POWER


@dataclass
class FitReport:
    """What a fit did: rows, iterations, final loss, seconds, nuisance parameters."""

    family: str
    rows: int
    iterations: int
    loss: float
    seconds: float
    devices: list[str] = field(default_factory=list)


def _group_weights(keys: Sequence[tuple[str, ...]], power: float) -> FloatArray:
    index: dict[tuple[str, ...], int] = {}
    ids = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64,
                      count=len(keys))
    counts = np.bincount(ids).astype(np.float64)
    w = counts[ids] ** (power - 1.0)
    out: FloatArray = w / w.mean()
    return out


class _Problem:
    """The objective and its gradient over one flat parameter vector."""

    def __init__(self, x: FloatArray, bound: FloatArray, y: FloatArray, w: FloatArray,
                 hidden: tuple[int, ...], l2: float, oh_idx: NDArray[np.int64], n_oh: int,
                 fac_idx: NDArray[np.int64], n_fac: int) -> None:
        self.x, self.log_bound, self.log_y, self.w = x, np.log(bound), np.log(y), w / w.sum()
        self.sizes = [x.shape[1], *hidden, 1]
        self.l2 = l2
        self.oh_idx, self.n_oh = oh_idx, n_oh  # -1: no overhead
        self.fac_idx, self.n_fac = fac_idx, n_fac  # -1: factor 1
        self.shapes: list[tuple[int, ...]] = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            self.shapes += [(a, b), (b,)]
        self.n_net = sum(int(np.prod(s)) for s in self.shapes)

    def unpack(self, p: FloatArray) -> tuple[list[FloatArray], FloatArray, FloatArray]:
        arrays: list[FloatArray] = []
        pos = 0
        for s in self.shapes:
            n = int(np.prod(s))
            arrays.append(p[pos:pos + n].reshape(s))
            pos += n
        log_c = p[pos:pos + self.n_oh]
        log_f = p[pos + self.n_oh:pos + self.n_oh + self.n_fac]
        return arrays, log_c, log_f

    def __call__(self, p: FloatArray) -> tuple[float, FloatArray]:
        arrays, log_c, log_f = self.unpack(p)
        ws, bs = arrays[0::2], arrays[1::2]
        acts = [self.x]
        h = self.x
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + b
            if i < len(ws) - 1:
                h = np.tanh(h)
            acts.append(h)
        z = h[:, 0]
        sl = np.logaddexp(0.0, -z)  # log slowdown
        has_f = self.fac_idx >= 0
        lf = np.where(has_f, log_f[np.maximum(self.fac_idx, 0)] if self.n_fac else 0.0, 0.0)
        log_u = self.log_bound + lf + sl  # log kernel time
        has_c = self.oh_idx >= 0
        c = np.where(has_c, np.exp(log_c[np.maximum(self.oh_idx, 0)]) if self.n_oh else 0.0,
                     0.0)
        u = np.exp(log_u)
        t = c + u
        log_t = np.log(t)
        r = log_t - self.log_y
        loss = float(np.sum(self.w * r * r))
        reg = self.l2 * float(sum(np.sum(w * w) for w in ws))
        g_logt = 2.0 * self.w * r
        g_u = g_logt * u / t  # d/d log u
        g_c = g_logt * c / t  # d/d log c
        # d log u / dz = d sl/dz = −sigmoid(−z)
        g_z = -g_u / (1.0 + np.exp(np.clip(z, -50, 50)))
        grads: list[FloatArray] = [np.zeros(0)] * len(arrays)
        delta = g_z[:, None]
        for i in range(len(ws) - 1, -1, -1):
            a_in = acts[i]
            grads[2 * i] = a_in.T @ delta + 2.0 * self.l2 * ws[i]
            grads[2 * i + 1] = delta.sum(axis=0)
            if i > 0:
                delta = (delta @ ws[i].T) * (1.0 - acts[i] ** 2)
        gc = np.bincount(self.oh_idx[has_c], weights=g_c[has_c], minlength=self.n_oh) \
            if self.n_oh else np.zeros(0)
        gf = np.bincount(self.fac_idx[has_f], weights=g_u[has_f], minlength=self.n_fac) \
            if self.n_fac else np.zeros(0)
        grad = np.concatenate([g.ravel() for g in grads] + [gc, gf])
        return loss + reg, grad

    def init(self, seed: int, y_over_bound: FloatArray) -> FloatArray:
        rng = np.random.default_rng(seed)
        parts: list[FloatArray] = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            parts.append(rng.normal(0.0, 1.0 / np.sqrt(a), size=(a, b)).ravel())
            parts.append(np.zeros(b))
        # start the output at the median slowdown: sigmoid(z0) = 1 / median(t / bound)
        med = float(np.median(np.maximum(y_over_bound, 1.0 + 1e-6)))
        parts[-1] = np.array([-np.log(med - 1.0) if med > 1.0 + 1e-6 else 5.0])
        parts.append(np.full(self.n_oh, np.log(50e-6)))
        parts.append(np.zeros(self.n_fac))
        return np.concatenate(parts)


def fit_family(table: Table, options: FitOptions | None = None) -> tuple[KernelModel,
                                                                         FitReport]:
    """Fit one family's model on every row of ``table`` (callers select the rows)."""
    from scipy.optimize import minimize

    opts = options or FitOptions()
    start = time.perf_counter()
    if len(table) < 10:
        raise UsageError(f"planner: error: too few {table.family} measurements to fit a "
                         f"model ({len(table)}; at least 10)")
    devices = [lookup_device(d) for d in table.device]
    if any(d is None for d in devices):
        raise UsageError("planner: error: unknown device in the training data")
    spec = DeviceSpecs.build([d for d in devices if d is not None], table.dtype)
    x, bound = features(table.family, table.shape_array(), table.op, spec)
    y = np.asarray(table.seconds, dtype=np.float64)
    finite = np.all(np.isfinite(x), axis=1) & np.isfinite(bound) & (bound > 0) & (y > 0)
    if not np.all(finite):
        keep = finite
        x, bound, y = x[keep], bound[keep], y[keep]
        table = table.select(keep)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    xn = (x - mean) / std

    # nuisance parameters: harness overhead per (harness, device), sweep factor
    oh_keys: dict[tuple[str, str], int] = {}
    oh_idx = np.array([oh_keys.setdefault((h, d), len(oh_keys)) if h == "neusight" else -1
                       for h, d in zip(table.harness, table.device, strict=True)],
                      dtype=np.int64)
    fac_keys: dict[tuple[str, str], int] = {}
    fac_idx = np.array([fac_keys.setdefault((c, d), len(fac_keys)) if c else -1
                        for c, d in zip(table.collection, table.device, strict=True)],
                       dtype=np.int64)
    # a sweep factor is identifiable only where the device also has other rows
    plain = {d for c, d in zip(table.collection, table.device, strict=True) if not c}
    for (c, d), i in list(fac_keys.items()):
        if d not in plain:
            fac_idx[fac_idx == i] = -1
            del fac_keys[(c, d)]
    remap = {old: new for new, old in enumerate(sorted(fac_keys.values()))}
    fac_idx = np.array([remap[i] if i >= 0 else -1 for i in fac_idx], dtype=np.int64)
    fac_keys = {k: remap[v] for k, v in fac_keys.items()}

    groups = [(d, h, o, c) for d, h, o, c in zip(table.device, table.harness, table.op,
                                                  table.collection, strict=True)]
    w = _group_weights(groups, opts.group_power)
    prob = _Problem(xn, bound, y, w, opts.hidden, opts.l2, oh_idx, len(oh_keys), fac_idx,
                    len(fac_keys))
    p0 = prob.init(opts.seed, y / bound)
    res = minimize(prob, p0, jac=True, method="L-BFGS-B",
                   options={"maxiter": opts.max_iter, "maxfun": opts.max_iter * 2,
                            "ftol": 1e-12, "gtol": 1e-8})
    arrays, log_c, log_f = prob.unpack(res.x)
    mlp = Mlp(tuple(arrays[0::2]), tuple(arrays[1::2]), mean, std)
    overhead: dict[str, dict[str, float]] = {}
    for (h, d), i in sorted(oh_keys.items()):
        overhead.setdefault(h, {})[d] = float(np.exp(log_c[i]))
    for table_h in overhead.values():
        table_h["*"] = float(np.median(list(table_h.values())))
    factors: dict[str, dict[str, float]] = {}
    for (c, d), i in sorted(fac_keys.items()):
        factors.setdefault(c, {})[d] = float(np.exp(log_f[i]))
    model = KernelModel(
        family=table.family, features=FEATURES[table.family], mlp=mlp,
        lo=x.min(axis=0), hi=x.max(axis=0), dtypes=tuple(sorted(set(table.dtype))),
        ops=tuple(sorted(set(table.op))), overhead_s=overhead, collection_factor=factors)
    report = FitReport(table.family, len(table), int(res.nit), float(res.fun),
                       time.perf_counter() - start, sorted(set(table.device)))
    return model, report


__all__ = ["FitOptions", "FitReport", "fit_family"]
