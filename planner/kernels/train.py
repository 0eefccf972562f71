"""Fitting the kernel-time models with numpy and scipy (deterministic, no PyTorch).

For one kernel family the fit minimises, over the network's weights ``θ`` and a few
per-GPU and per-harness parameters, the weighted mean squared error of log time::

    L = Σ_i w_i (log t̂_i − log t_i)² / Σ_i w_i  +  λ Σ ‖W‖²
    t̂_i = c[h_i, d_i] + φ[s_i, d_i] · max(t_flop,i / e[d_i], t_byte,i) · (1 + exp(−z_θ(x_i)))

* ``e[d]`` ∈ (0, 1): the fraction of its datasheet peak GPU ``d`` sustains on large
  kernels in that dtype (sigmoid-parametrised, so the bound is never beaten). GPUs differ
  here for reasons no datasheet states — power caps, sustained clocks: the same V100 chip
  sustains 95% of the PCIe card's peak and 86% of the SXM2's, a 70 W T4 half of its
  boost-clock peak. A GPU the model has not seen gets the median ``e`` of its class
  (:func:`~.model.level_class`); its own specs enter through the bound and the features.
* ``c[h, d]``: host time a harness adds per call on device ``d`` (NeuSight's CUDA-event
  timing around a Python call; zero for DeepBench's and the profiler's back-to-back
  launches). Fitted per device, with the median over devices kept for unseen ones.
* ``φ[s, d]``: a per-device time factor of a sweep ``s`` that ran at other clocks than
  the rest of that device's data: NeuSight's linear *train* sweep is 5-70% slower than
  its *test* sweep on the same GPUs for the same kind of shapes, which looks like
  sustained-load throttling of passively cooled cards. The factor lets the sweep teach
  the shape dependence without dragging the level; it is reported, never used to
  predict. A sweep more than :attr:`FitOptions.sweep_limit` times slower than the rest of
  its device's data is dropped (NeuSight's P4 train sweep: 2.9×, drifting along the file).
* ``t_0``: a launch floor shared by every GPU (a kernel takes a few microseconds however
  small), so ``t̂_i = c + t_0 + φ · ...``; mostly set by DeepBench's smallest kernels.
* Drifts along a long sweep (:data:`DRIFT_MIN_ROWS` rows or more on a device, in file
  order): the kernel-time term is multiplied by ``exp(δ[s, d](p_i))`` and, for the sweeps
  of :data:`OVERHEAD_DRIFT_SWEEPS`, the overhead ``c`` by ``exp(ψ[s, d](p_i))``, each a
  piecewise-linear curve over the row's position ``p_i`` ∈ [0, 1] with
  :data:`DRIFT_KNOTS` knots, centred to zero mean over the sweep (so the levels keep the
  sweep's average). Along NeuSight's conv sweep the per-call overhead grows about 4-8×
  while the kernel time barely moves; fitting only ``δ`` read that as a slowdown of every
  call. Like ``c`` and ``φ`` they describe a measurement, never a prediction.
* ``w_i``: every (device, harness, op, sweep) group gets total weight ∝ ``n_g^0.5`` so
  that a GPU with thousands of rows does not drown one with a hundred.
* A monotonicity penalty ``μ · mean_j max(0, log u(a_j) − log u(b_j))²`` over pairs of
  kernels where ``a_j`` is the measured kernel ``b_j`` with its batch, a channel or GEMM
  dimension, or its height halved (:class:`_Pairs`): less work is never slower. The
  measurements agree (none of NeuSight's 3,039 GEMM pairs and 0.3-1.3% of DeepBench's
  convolution batch pairs are 5% slower at half the batch), but an unconstrained
  network is not: one V100 GEMM in ten was at least 5% slower than at twice the rows.
  A planner that divides the batch among GPUs must not be rewarded for a wiggle. For
  GEMM a second mean, weighted ``μ_x``, runs over pairs drawn across the answered range
  on every GPU, dtype and source of the fit (:attr:`FitOptions.mono_cross_pairs`): with pairs
  of its own kernels alone, a GPU measured only on large kernels (the P4 from 512 rows)
  was neither monotone nor near its roofline below them.

The optimiser is L-BFGS-B (scipy) on the exact gradient, from weights drawn with a fixed
seed: the same data give the same weights on every run with the same BLAS thread count
(:func:`~.pipeline.fit_models` fits in workers with one; a product summed by more threads
differs in its last bits, and a thousand iterations carry them into the weights).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from ..cluster import lookup_device
from ..errors import UsageError
from .data import Table
from .features import FEATURES, DeviceSpecs, features, gpu_features
from .mlp import Mlp
from .model import SHAPE_FEATURES, KernelModel, level_class

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

GROUP_POWER = 0.5
E_INIT = 0.8
DRIFT_KNOTS = 6
DRIFT_MIN_ROWS = 3000
#: sweeps whose harness overhead (the host's time per call, outside the kernel) also
#: drifts along the file, as a second curve: NeuSight's conv sweep, whose short calls
#: grow slower along it and long ones less (README *Hardware models*); its linear train
#: sweep shows no such growth (fitted with one, its curves wander by ±0.5 in log and the
#: held-out NeuSight GEMMs do not improve: 6.8% mean over the five GPUs, 6.9% with it)
OVERHEAD_DRIFT_SWEEPS = frozenset({"neusight-conv"})


@dataclass(frozen=True)
class FitOptions:
    """Hyper-parameters of a fit (the defaults are what the shipped models use)."""

    #: hidden layer widths (None: the family's default, :data:`FAMILY_DEFAULTS`)
    hidden: tuple[int, ...] | None = None
    #: networks fitted from different random starts (seeds ``seed``, ``seed + 1``, …)
    #: whose times are averaged in log (None: the family's default)
    members: int | None = None
    l2: float = 1e-4
    max_iter: int = 1000
    seed: int = 0
    group_power: float = GROUP_POWER
    #: weight of a sweep with its own time factor, relative to the device's other rows
    sweep_weight: float = 0.5
    #: a sweep more than this many times slower than the device's other rows is dropped
    sweep_limit: float = 2.0
    #: weight decay of the drift coefficients
    drift_l2: float = 1e-4
    #: weight of the monotonicity penalty (0: none; None: the family's default); see
    #: :class:`_Pairs`
    mono_weight: float | None = None
    #: kernel pairs the penalty is evaluated on: measured kernels on their own GPU
    mono_pairs: int = 20000
    #: further pairs across the range the model answers for, each on a level of the fit
    #: (GPU, dtype, measurement source) drawn uniformly, so a GPU whose measurements are
    #: all large is regularised below them too (None: the family's default); see
    #: :func:`_mono_pairs`
    mono_cross_pairs: int | None = None
    #: weight of the mean penalty over those pairs (None: the family's default)
    mono_cross_weight: float | None = None


    def pair_counts(self) -> tuple[int, int]:
        """Monotonicity pairs of each kind these (resolved) options fit with: measured
        kernels', and across the range; none of a kind whose weight is 0."""
        return (self.mono_pairs if self.mono_weight else 0,
                (self.mono_cross_pairs or 0) if self.mono_cross_weight else 0)

    def for_family(self, family: str) -> FitOptions:
        """These options with the family's defaults filled in."""
        hidden, members, mono = FAMILY_DEFAULTS[family]
        return replace(self, hidden=self.hidden if self.hidden is not None else hidden,
                       members=self.members if self.members is not None else members,
                       mono_weight=self.mono_weight if self.mono_weight is not None
                       else mono,
                       mono_cross_pairs=self.mono_cross_pairs
                       if self.mono_cross_pairs is not None else CROSS_PAIRS[family][0],
                       mono_cross_weight=self.mono_cross_weight
                       if self.mono_cross_weight is not None else CROSS_PAIRS[family][1])


#: family → (hidden widths, ensemble members, monotonicity weight). GEMM: 26,000 rows of thousands
#: of shapes on 13 GPUs; its held-out error barely moves with the random start (NeuSight test rows
#: 7.1% and 6.8% mean over the five GPUs for seeds 0 and 1), so one 2×32 network. Conv: DeepBench
#: gives about 66 training shapes a GPU for each pass, and one 2×32 network's held-out error on them
#: swung from 18% to 51% (backward-filter, FP32, mean over GPUs) with the seed; 2×16 networks
#: averaged cancel most of it. Five were enough before the H100's rows (ten gave the same); with
#: them, five gave DeepBench backward-data / backward-filter 18.9 / 15.8% (seeds 0-4) and 18.2 /
#: 15.6% (5-9), ten 17.8 / 14.9% (0-9) and 16.3 / 14.7% (10-19): ten (README "Why ten networks" has
#: the commands). The monotonicity weights are the strongest that cost no held-out accuracy beyond
#: the seed-to-seed noise: for GEMM, 10 took V100 GEMMs slower than at twice the rows from 10% to
#: none (with the H100's rows, whose graph-timed floor took the launch floor from 6.8 to 2.2 µs, 30
#: would keep the T4's 64³ GEMM from being 7% slower than with twice the columns, but it took the
#: leave-one-GPU-out T4 and P100 to 20.1% and 20.6%, over issue 4's 20%: 10 is kept); for
#: convolutions, 10 cost DeepBench backward-data 3.6 points of MAPE, 1 costs 0.6.
FAMILY_DEFAULTS: dict[str, tuple[tuple[int, ...], int, float]] = {
    "gemm": ((32, 32), 1, 10.0),
    "conv": ((16, 16), 10, 1.0),
}

#: family → (pairs, weight) of the monotonicity penalty across the answered range on
#: every GPU of the fit (:attr:`FitOptions.mono_cross_pairs`). GEMM: the P4's
#: measurements start at 512 rows and the M40's are DeepBench's few, and with pairs of
#: their own kernels alone the model was neither monotone nor near the roofline below
#: them (the P4's 202 × 42 × 170 GEMM 188.1 µs, twice its columns 38.9 µs; README
#: "Monotone in the work"). Convolutions: the
#: audit found none of that (every GPU's convolutions span DeepBench's or NeuSight's
#: shapes), and their ten networks are fitted without them. μ_x = 10 took the random
#: doubled GEMMs predicted over 20% faster on the P4 from 112 of 1,500 to 9 and improved
#: leave-one-GPU-out on all seven GPUs; 100 did little better on monotonicity at up to
#: 1.7 points of held-out MAPE, 60,000 pairs no better than 20,000.
CROSS_PAIRS: dict[str, tuple[int, float]] = {"gemm": (20000, 10.0), "conv": (20000, 0.0)}


@dataclass
class FitReport:
    """What a fit did: rows, iterations, final loss, seconds, nuisance parameters."""

    family: str
    rows: int
    iterations: int
    loss: float
    seconds: float
    devices: list[str] = field(default_factory=list)
    dropped: dict[str, float] = field(default_factory=dict)  #: sweep → slowdown
    members: int = 1  #: networks in the ensemble (iterations: the most; seconds: summed)


def _group_weights(keys: Sequence[tuple[str, ...]], power: float) -> FloatArray:
    index: dict[tuple[str, ...], int] = {}
    ids = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64,
                      count=len(keys))
    counts = np.bincount(ids).astype(np.float64)
    w = counts[ids] ** (power - 1.0)
    out: FloatArray = w / w.mean()
    return out


def _index(keys: Sequence[tuple[str, str] | None]) -> tuple[IntArray, list[tuple[str, str]]]:
    """Integer ids of the non-None keys in first-seen order (-1 for None)."""
    seen: dict[tuple[str, str], int] = {}
    ids = np.array([-1 if k is None else seen.setdefault(k, len(seen)) for k in keys],
                   dtype=np.int64)
    return ids, list(seen)


def _index3(keys: Sequence[tuple[str, str, str]]) -> tuple[IntArray,
                                                           list[tuple[str, str, str]]]:
    seen: dict[tuple[str, str, str], int] = {}
    ids = np.array([seen.setdefault(k, len(seen)) for k in keys], dtype=np.int64)
    return ids, list(seen)


def hat_basis(u: FloatArray, knots: int = DRIFT_KNOTS) -> FloatArray:
    """Piecewise-linear hat functions on [0, 1] (``rows × knots``)."""
    centres = np.linspace(0.0, 1.0, knots)
    width = 1.0 / (knots - 1)
    out: FloatArray = np.maximum(0.0, 1.0 - np.abs(u[:, None] - centres[None, :]) / width)
    return out


def drift_of(theta: FloatArray, u: FloatArray) -> FloatArray:
    """Log time factor of a sweep at positions ``u`` (its mean over the sweep is zero)."""
    out: FloatArray = hat_basis(u, len(theta)) @ theta
    return out


def _curve(idx: IntArray, theta: FloatArray, basis: FloatArray) -> FloatArray:
    """Each row's value of its sweep's curve (``basis`` · the curve's knots; 0 for rows
    of no sweep, ``idx`` -1)."""
    out: FloatArray = np.where(idx >= 0, np.sum(basis * theta[np.maximum(idx, 0)], axis=1),
                               0.0)
    return out


def _curve_grad(idx: IntArray, g_log: FloatArray, basis: FloatArray, n: int) -> FloatArray:
    """Gradient of the loss with respect to the knots of ``n`` curves given that with
    respect to the log term each multiplies (``rows``), as :func:`_curve` spreads them."""
    out = np.zeros((n, basis.shape[1]))
    has = idx >= 0
    for j in range(basis.shape[1]):
        out[:, j] = np.bincount(idx[has], weights=(g_log * basis[:, j])[has], minlength=n)
    return out


def _gather(values: FloatArray, idx: IntArray, default: float) -> FloatArray:
    if values.size == 0:
        return np.full(idx.shape, default)
    out: FloatArray = np.where(idx >= 0, values[np.maximum(idx, 0)], default)
    return out


def _scatter(idx: IntArray, weights: FloatArray, size: int) -> FloatArray:
    mask = idx >= 0
    if not size:
        return np.zeros(0)
    out: FloatArray = np.bincount(idx[mask], weights=weights[mask],
                                  minlength=size).astype(np.float64)
    return out


def _effective_bound(log_flop: FloatArray, log_byte: FloatArray,
                     eta: FloatArray) -> tuple[FloatArray, NDArray[np.bool_], FloatArray]:
    """``log sigmoid(η)``, the compute-bound mask and ``log max(t_flop / e, t_byte)``.
    On compute-bound rows ``d log bound / dη = −(1 − e)``; elsewhere zero."""
    log_e = -np.logaddexp(0.0, -eta)  # log sigmoid(eta)
    log_comp = log_flop - log_e
    comp = log_comp >= log_byte
    return log_e, comp, np.where(comp, log_comp, log_byte)


def _through_slowdown(g: FloatArray, z: FloatArray) -> FloatArray:
    """``g · d log(1 + e^−z) / dz = −g · sigmoid(−z)``: a gradient in the log slowdown
    carried to the network's output."""
    out: FloatArray = -g / (1.0 + np.exp(np.clip(z, -50.0, 50.0)))
    return out


#: shape columns whose halving must not make a kernel slower: GEMM M, N, K and batch;
#: convolution batch, input and output channels, and height (what the planner's data,
#: model and domain splits divide)
MONO_DIMS = {"gemm": (0, 1, 2, 3), "conv": (0, 1, 4, 2)}


@dataclass
class _Pairs:
    """Kernel pairs ``(a, b)`` where ``a`` is ``b`` with one dimension halved: the
    penalty ``μ · mean(max(0, log u_a − log u_b)²)`` on the kernel times above the floor
    teaches the network that less work is never slower, between the measured shapes as
    well as at them."""

    xa: FloatArray  #: normalised features of the halved kernels
    xb: FloatArray
    log_flop: FloatArray  #: ``rows × 2`` (a, b)
    log_byte: FloatArray
    lvl_idx: IntArray  #: the efficiency logit of each pair's GPU
    weight: float
    #: the last ``n_cross`` pairs are drawn across the answered range on every GPU
    #: (:attr:`FitOptions.mono_cross_pairs`); their mean has its own weight
    n_cross: int = 0
    cross_weight: float = 0.0

    def penalty(self, z: FloatArray, eta: FloatArray) -> tuple[float, FloatArray, FloatArray,
                                                              FloatArray]:
        """Penalty and its gradients in ``z_a``, ``z_b`` and, per pair, its GPU's
        efficiency logit."""
        n = len(self.xa)
        za, zb = z[:n], z[n:]
        log_e, comp, log_bound = _effective_bound(self.log_flop, self.log_byte,
                                                  eta[self.lvl_idx][:, None])
        d = (log_bound[:, 0] + np.logaddexp(0.0, -za)) - (log_bound[:, 1]
                                                           + np.logaddexp(0.0, -zb))
        v = np.maximum(d, 0.0)
        pen, parts = 0.0, []
        for part, weight in ((v[:n - self.n_cross], self.weight),
                             (v[n - self.n_cross:], self.cross_weight)):
            if len(part):  # weight · mean(part²), and its gradient
                pen += weight * float(np.mean(part * part))
            parts.append(2.0 * weight * part / max(len(part), 1))
        g_d = np.concatenate(parts)
        slope = -(1.0 - np.exp(log_e[:, 0]))
        g_eta: FloatArray = g_d * slope * (comp[:, 0].astype(np.float64) - comp[:, 1])
        return pen, _through_slowdown(g_d, za), _through_slowdown(-g_d, zb), g_eta


def _mono_pairs(table: Table, spec: DeviceSpecs, lvl_idx: IntArray, mean: FloatArray,
                std: FloatArray, opts: FitOptions, lo: FloatArray,
                hi: FloatArray) -> _Pairs | None:
    """Pairs for the monotonicity penalty, drawn with the fit's seed: (``mono_pairs``,
    where ``mono_weight`` is not 0) measured kernels on their own GPU with one of
    :data:`MONO_DIMS` halved, then (``mono_cross_pairs``, where ``mono_cross_weight``
    is not 0) kernels across the answered range, each on a level of the fit (a GPU,
    dtype and measurement source: a GPU two sources measured gets twice the pairs)
    drawn uniformly, halved the same way: for GEMM, M, N and K log-uniform between the
    least and the largest measured (batch and op a measured kernel's), for
    convolutions measured shapes of any GPU; kept where their shape features lie
    within the training range ``lo``-``hi`` (not the tolerance beyond it that
    :meth:`~.model.KernelModel.in_range` also answers), the GPU's features clipped to
    it as :meth:`~.model.KernelModel.predict_raw` clips them. Without the second kind a
    GPU is regularised only where it was measured."""
    n_own, n_cross = opts.pair_counts()
    if n_own + n_cross <= 0:
        return None
    rng = np.random.default_rng(10_000 + opts.seed)
    shape = table.shape_array()
    dims = np.asarray(MONO_DIMS[table.family])
    pick = rng.integers(0, len(shape), n_own)  # a measured kernel, its GPU
    dim = dims[rng.integers(0, len(dims), n_own)]
    on = pick  # the row whose GPU, dtype and level time the pair
    own = np.ones(len(pick), dtype=bool)
    b = shape[pick]
    if n_cross > 0:
        # kernels across the answered range on a GPU and dtype of the fit drawn
        # uniformly, so each is held monotone there, not only where it was measured
        cross = np.random.default_rng(20_000 + opts.seed)
        first = np.unique(lvl_idx, return_index=True)[1]  # a row of each level
        rows = cross.integers(0, len(shape), n_cross)  # a measured kernel (op, batch)
        b_cross = shape[rows].copy()
        if table.family == "gemm":  # M, N and K log-uniform over the measured ones
            for col in (0, 1, 2):
                least, most = np.log(shape[:, col].min()), np.log(shape[:, col].max())
                b_cross[:, col] = np.round(np.exp(cross.uniform(least, most, n_cross)))
        pick = np.concatenate([pick, rows])
        b = np.concatenate([b, b_cross])
        dim = np.concatenate([dim, dims[cross.integers(0, len(dims), n_cross)]])
        on = np.concatenate([on, first[cross.integers(0, len(first), n_cross)]])
        own = np.concatenate([own, np.zeros(n_cross, dtype=bool)])
    size = b[np.arange(len(b)), dim]
    ok = size >= 2
    if table.family == "conv":  # grouped: channels stay divisible by the groups
        ok &= (b[:, 13] == 1) | ~np.isin(dim, (1, 4))
    pick, dim, b, on, own = pick[ok], dim[ok], b[ok], on[ok], own[ok]
    a = b.copy()
    a[np.arange(len(a)), dim] = size[ok] // 2
    ops = [table.op[int(i)] for i in pick]
    sub = spec.rows(on)
    xa, fa, ba = features(table.family, a, ops, sub)
    xb, fb, bb = features(table.family, b, ops, sub)
    fine = (np.all(np.isfinite(xa), axis=1) & np.all(np.isfinite(xb), axis=1)
            & (np.minimum(fa, ba) > 0) & (np.minimum(fb, bb) > 0))
    if n_cross > 0:
        # as the model answers them: shape features within the training range (a drawn
        # kernel beyond it, its FLOPs say, is timed scaled, never by the network), the
        # GPU's clipped to it
        shp = np.array([f in SHAPE_FEATURES for f in FEATURES[table.family]])
        for xs in (xa, xb):
            fine &= own | np.all((xs[:, shp] >= lo[shp]) & (xs[:, shp] <= hi[shp]), axis=1)
            xs[np.ix_(~own, ~shp)] = np.clip(xs[np.ix_(~own, ~shp)], lo[~shp], hi[~shp])
    if not np.any(fine):
        return None
    return _Pairs((xa[fine] - mean) / std, (xb[fine] - mean) / std,
                  np.log(np.column_stack([fa, fb])[fine]),
                  np.log(np.column_stack([ba, bb])[fine]), lvl_idx[on][fine],
                  opts.mono_weight or 0.0, int(np.sum(~own[fine])),
                  opts.mono_cross_weight or 0.0)


class _Problem:
    """The objective and its gradient over one flat parameter vector."""

    def __init__(self, x: FloatArray, t_flop: FloatArray, t_byte: FloatArray, y: FloatArray,
                 w: FloatArray, opts: FitOptions, oh_idx: IntArray, n_oh: int,
                 fac_idx: IntArray, n_fac: int, lvl_idx: IntArray, n_lvl: int,
                 drift_idx: IntArray, n_drift: int, basis: FloatArray,
                 pairs: _Pairs | None = None, od_idx: IntArray | None = None,
                 n_od: int = 0) -> None:
        self.x = x if pairs is None else np.concatenate([x, pairs.xa, pairs.xb])
        self.n_rows = len(x)
        self.pairs = pairs
        self.log_flop, self.log_byte = np.log(t_flop), np.log(t_byte)
        self.log_y = np.log(y)
        self.w = w / w.sum()
        assert opts.hidden is not None, "resolve the options with FitOptions.for_family"
        self.sizes = [x.shape[1], *opts.hidden, 1]
        self.l2 = opts.l2
        self.oh_idx, self.n_oh = oh_idx, n_oh
        self.fac_idx, self.n_fac = fac_idx, n_fac
        self.lvl_idx, self.n_lvl = lvl_idx, n_lvl
        # drift: centred hat basis per row (zero mean within each sweep)
        self.drift_idx, self.n_drift = drift_idx, n_drift
        # overhead drift: the same basis, its own curves (rows of a sweep of
        # OVERHEAD_DRIFT_SWEEPS; -1 elsewhere)
        self.od_idx = od_idx if od_idx is not None else np.full(len(x), -1, dtype=np.int64)
        self.n_od = n_od
        self.basis = basis
        self.drift_l2 = opts.drift_l2
        self.shapes: list[tuple[int, ...]] = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            self.shapes += [(a, b), (b,)]
        self.n_net = sum(int(np.prod(s)) for s in self.shapes)

    def unpack(self, p: FloatArray) -> tuple[list[FloatArray], FloatArray, FloatArray,
                                             FloatArray, FloatArray, FloatArray, float]:
        """Network arrays, log overheads, log sweep factors, efficiency logits, kernel
        drift, overhead drift, log launch floor."""
        arrays: list[FloatArray] = []
        pos = 0
        for s in self.shapes:
            n = int(np.prod(s))
            arrays.append(p[pos:pos + n].reshape(s))
            pos += n
        log_c = p[pos:pos + self.n_oh]
        pos += self.n_oh
        log_f = p[pos:pos + self.n_fac]
        pos += self.n_fac
        eta = p[pos:pos + self.n_lvl]
        pos += self.n_lvl
        theta = p[pos:pos + self.n_drift * DRIFT_KNOTS].reshape(self.n_drift, DRIFT_KNOTS)
        pos += self.n_drift * DRIFT_KNOTS
        phi = p[pos:pos + self.n_od * DRIFT_KNOTS].reshape(self.n_od, DRIFT_KNOTS)
        return arrays, log_c, log_f, eta, theta, phi, p[-1]

    def __call__(self, p: FloatArray) -> tuple[float, FloatArray]:
        arrays, log_c, log_f, eta, theta, phi, log_floor = self.unpack(p)
        floor = float(np.exp(log_floor))
        ws, bs = arrays[0::2], arrays[1::2]
        acts = [self.x]
        h = self.x
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + b
            if i < len(ws) - 1:
                h = np.tanh(h)
            acts.append(h)
        z = h[:, 0]
        z_all, z = z, z[:self.n_rows]
        sl = np.logaddexp(0.0, -z)  # log slowdown over the effective bound
        log_e, comp_bound, log_bound = _effective_bound(self.log_flop, self.log_byte,
                                                        eta[self.lvl_idx])
        lf = _gather(log_f, self.fac_idx, 0.0)
        if self.n_drift:
            lf = lf + _curve(self.drift_idx, theta, self.basis)
        u = np.exp(log_bound + lf + sl)  # kernel time above the launch floor
        lc = _gather(log_c, self.oh_idx, 0.0)
        if self.n_od:
            lc = lc + _curve(self.od_idx, phi, self.basis)
        c = np.where(self.oh_idx >= 0, np.exp(lc), 0.0)
        t = c + floor + u
        r = np.log(t) - self.log_y
        loss = float(np.sum(self.w * r * r)) + self.l2 * float(sum(np.sum(w * w) for w in ws)) \
            + self.drift_l2 * float(np.sum(theta * theta) + np.sum(phi * phi))
        g_logt = 2.0 * self.w * r
        g_logu = g_logt * u / t
        g_logc = g_logt * c / t
        g_floor = float(np.sum(g_logt * floor / t))
        g_z = _through_slowdown(g_logu, z)
        g_eta = np.where(comp_bound, -g_logu * (1.0 - np.exp(log_e)), 0.0)
        g_eta_all: FloatArray = np.bincount(self.lvl_idx, weights=g_eta,
                                            minlength=self.n_lvl).astype(np.float64)
        if self.pairs is not None:
            pen, g_za, g_zb, g_eta_p = self.pairs.penalty(z_all[self.n_rows:], eta)
            loss += pen
            g_z = np.concatenate([g_z, g_za, g_zb])
            g_eta_all = g_eta_all + np.bincount(self.pairs.lvl_idx, weights=g_eta_p,
                                                minlength=self.n_lvl)
        grads: list[FloatArray] = [np.zeros(0)] * len(arrays)
        delta = g_z[:, None]
        for i in range(len(ws) - 1, -1, -1):
            grads[2 * i] = acts[i].T @ delta + 2.0 * self.l2 * ws[i]
            grads[2 * i + 1] = delta.sum(axis=0)
            if i > 0:
                delta = (delta @ ws[i].T) * (1.0 - acts[i] ** 2)
        g_theta = _curve_grad(self.drift_idx, g_logu, self.basis, self.n_drift) \
            + 2.0 * self.drift_l2 * theta
        g_phi = _curve_grad(self.od_idx, g_logc, self.basis, self.n_od) \
            + 2.0 * self.drift_l2 * phi
        grad = np.concatenate([g.ravel() for g in grads] + [
            _scatter(self.oh_idx, g_logc, self.n_oh),
            _scatter(self.fac_idx, g_logu, self.n_fac),
            g_eta_all, g_theta.ravel(), g_phi.ravel(), np.array([g_floor])])
        return loss, grad

    def init(self, seed: int, slowdown: FloatArray) -> FloatArray:
        """Weights drawn with ``seed``; the output bias at the median slowdown."""
        rng = np.random.default_rng(seed)
        parts: list[FloatArray] = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            parts.append(rng.normal(0.0, 1.0 / np.sqrt(a), size=(a, b)).ravel())
            parts.append(np.zeros(b))
        med = float(np.median(np.maximum(slowdown, 1.0 + 1e-3)))
        parts[-1] = np.array([-np.log(med - 1.0)])
        parts.append(np.full(self.n_oh, np.log(50e-6)))
        parts.append(np.zeros(self.n_fac))
        parts.append(np.full(self.n_lvl, np.log(E_INIT / (1.0 - E_INIT))))
        parts.append(np.zeros(self.n_drift * DRIFT_KNOTS))
        parts.append(np.zeros(self.n_od * DRIFT_KNOTS))
        parts.append(np.array([np.log(2e-6)]))
        return np.concatenate(parts)


def _drop_throttled(bound: FloatArray, y: FloatArray, table: Table,
                    limit: float) -> tuple[NDArray[np.bool_], dict[str, float]]:
    """Rows to keep: sweeps that ran ``limit``× slower than the rest of a device go.

    Compares the median ``log(t / t_bound)`` of kernels with a bound of at least 100 µs
    (launch overhead negligible) between the sweep and the device's other rows.
    """
    coll = np.asarray(table.collection)
    dev = np.asarray(table.device)
    ratio = np.log(y / bound)
    big = bound >= 100e-6
    keep = np.ones(len(y), dtype=bool)
    dropped: dict[str, float] = {}
    for c, d in sorted({(c, d) for c, d in zip(coll, dev, strict=True) if c}):
        mine = (coll == c) & (dev == d) & big
        rest = (coll == "") & (dev == d) & big
        if mine.sum() < 20 or rest.sum() < 20:
            continue
        slow = float(np.exp(np.median(ratio[mine]) - np.median(ratio[rest])))
        if slow > limit:
            keep &= ~((coll == c) & (dev == d))
            dropped[f"{c}/{d}"] = round(slow, 3)
    return keep, dropped


def unseen_levels(levels: dict[str, float],
                  specs: dict[str, list[float]]) -> dict[str, float]:
    """Median sustained fraction per class (:func:`~.model.level_class`), for GPUs the
    model has not seen: the honest guess when the differences between GPUs are not in
    their datasheets."""
    groups: dict[str, list[float]] = {}
    for key, value in levels.items():
        if key.count("|") != 1:
            continue  # per-source entries; the device's median is counted once
        dtype = key.split("|", 1)[1]
        ratio = float(2.0 ** specs[key][-1])
        groups.setdefault(level_class(dtype, ratio), []).append(value)
    return {cls: float(np.median(v)) for cls, v in sorted(groups.items())}


def unseen_energy(levels: dict[str, float],
                  specs: dict[str, list[float]]) -> dict[str, float]:
    """Least energy per FLOP (J) per class over the seen GPUs with a board power in the
    catalog: ``TDP / (e · peak)`` at each GPU's sustained level ``e``."""
    groups: dict[str, list[float]] = {}
    for key, value in levels.items():
        if key.count("|") != 1:
            continue
        name, dtype = key.split("|", 1)
        dev = lookup_device(name)
        if dev is None or not dev.tdp_w:
            continue
        peak = float(2.0 ** specs[key][0])
        ratio = float(2.0 ** specs[key][-1])
        groups.setdefault(level_class(dtype, ratio), []).append(dev.tdp_w / (value * peak))
    return {cls: float(min(v)) for cls, v in sorted(groups.items())}


def fit_family(table: Table, options: FitOptions | None = None) -> tuple[KernelModel,
                                                                         FitReport]:
    """Fit one family's model on every row of ``table`` (callers select the rows)."""
    from scipy.optimize import minimize

    opts = (options or FitOptions()).for_family(table.family)
    start = time.perf_counter()
    if len(table) < 10:
        raise UsageError(f"planner: error: too few {table.family} measurements to fit a "
                         f"model ({len(table)} in the training split, where about 30% of "
                         "the shapes are held out to judge it; at least 10): measure more "
                         "(planner kernels profile without --quick), or fit beside the "
                         "shipped data (--shipped-data)")
    spec = DeviceSpecs.build(table.devices(), table.dtype)
    x, t_flop, t_byte = features(table.family, table.shape_array(), table.op, spec)
    y = np.asarray(table.seconds, dtype=np.float64)
    bound = np.maximum(t_flop, t_byte)
    keep = np.all(np.isfinite(x), axis=1) & (bound > 0) & (y > 0)
    keep2, dropped = _drop_throttled(bound, y, table, opts.sweep_limit)
    keep &= keep2
    if not np.all(keep):
        x, t_flop, t_byte, y, bound = x[keep], t_flop[keep], t_byte[keep], y[keep], bound[keep]
        table = table.select(keep)
        spec = DeviceSpecs.build(table.devices(), table.dtype)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    xn = (x - mean) / std

    oh_idx, oh_keys = _index([(h, d) if h == "neusight" else None
                              for h, d in zip(table.harness, table.device, strict=True)])
    # a sweep factor is identifiable only where the device also has other rows
    plain = {d for c, d in zip(table.collection, table.device, strict=True) if not c}
    fac_idx, fac_keys = _index([(c, d) if c and d in plain else None
                                for c, d in zip(table.collection, table.device, strict=True)])
    lvl_idx, lvl_keys3 = _index3(list(zip(table.device, table.dtype, table.harness,
                                          strict=True)))
    sweep_rows: dict[tuple[str, str], int] = {}
    for sw, d in zip(table.sweep, table.device, strict=True):
        if sw:
            sweep_rows[(sw, d)] = sweep_rows.get((sw, d), 0) + 1
    drift_idx, drift_keys = _index([(sw, d) if sw and sweep_rows[(sw, d)] >= DRIFT_MIN_ROWS
                                    else None
                                    for sw, d in zip(table.sweep, table.device, strict=True)])
    od_slot = [g for g, (sw, _) in enumerate(drift_keys) if sw in OVERHEAD_DRIFT_SWEEPS]
    od_of = np.full(len(drift_keys) + 1, -1, dtype=np.int64)  # drift group → its curve
    od_of[od_slot] = np.arange(len(od_slot))
    od_idx = od_of[drift_idx]  # drift_idx -1 picks the trailing -1
    basis = hat_basis(np.asarray(table.position, dtype=np.float64))
    for g in range(len(drift_keys)):  # centre: a drift moves time within a sweep, not its mean
        rows = drift_idx == g
        basis[rows] -= basis[rows].mean(axis=0)
    groups = list(zip(table.device, table.harness, table.op, table.collection, strict=True))
    w = _group_weights(groups, opts.group_power)
    w = np.where(fac_idx >= 0, w * opts.sweep_weight, w)
    pairs = _mono_pairs(table, spec, lvl_idx, mean, std, opts, x.min(axis=0), x.max(axis=0))
    prob = _Problem(xn, t_flop, t_byte, y, w, opts, oh_idx, len(oh_keys), fac_idx,
                    len(fac_keys), lvl_idx, len(lvl_keys3), drift_idx, len(drift_keys), basis,
                    pairs, od_idx, len(od_slot))
    p0 = prob.init(opts.seed, y / bound / E_INIT)
    res = minimize(prob, p0, jac=True, method="L-BFGS-B",
                   options={"maxiter": opts.max_iter, "maxfun": opts.max_iter * 2,
                            "ftol": 1e-12, "gtol": 1e-8})
    arrays, log_c, log_f, eta, theta, phi, log_floor = prob.unpack(res.x)
    mlp = Mlp(tuple(arrays[0::2]), tuple(arrays[1::2]), mean, std)
    overhead: dict[str, dict[str, float]] = {}
    for (h, d), v in sorted(zip(oh_keys, np.exp(log_c), strict=True)):
        overhead.setdefault(h, {})[d] = float(v)
    for per_dev in overhead.values():
        per_dev["*"] = float(np.median(list(per_dev.values())))
    factors: dict[str, dict[str, float]] = {}
    for (c, d), v in sorted(zip(fac_keys, np.exp(log_f), strict=True)):
        factors.setdefault(c, {})[d] = float(v)
    drift: dict[str, dict[str, list[float]]] = {}
    overhead_drift: dict[str, dict[str, list[float]]] = {}
    for g, (sw, d) in enumerate(drift_keys):
        raw = hat_basis(np.asarray(table.position)[drift_idx == g])
        curves = [(drift, theta[g])]
        if od_of[g] >= 0:
            curves.append((overhead_drift, phi[od_of[g]]))
        for out, th in curves:
            # store the curve itself: θ minus the sweep mean of the basis·θ
            offset = float(np.mean(raw @ th))
            out.setdefault(sw, {})[d] = [float(v - offset) for v in th]
    # one level per (GPU, dtype, harness): each source measured its own machine
    per_source = {f"{d}|{t}|{h}": float(1.0 / (1.0 + np.exp(-v)))
                  for (d, t, h), v in sorted(zip(lvl_keys3, eta, strict=True))}
    levels = dict(per_source)
    for d, t in sorted({(d, t) for d, t, _ in lvl_keys3}):
        vals = [v for k, v in per_source.items() if k.startswith(f"{d}|{t}|")]
        levels[f"{d}|{t}"] = float(np.median(vals))
    level_specs: dict[str, list[float]] = {}
    for d, t in sorted({(d, t) for d, t, _ in lvl_keys3}):
        dev = lookup_device(d)
        assert dev is not None
        level_specs[f"{d}|{t}"] = [float(v) for v in gpu_features(
            DeviceSpecs.single(dev, t, 1))[0]]
    model = KernelModel(
        family=table.family, features=FEATURES[table.family], mlp=mlp,
        lo=x.min(axis=0), hi=x.max(axis=0), dtypes=tuple(sorted(set(table.dtype))),
        ops=tuple(sorted(set(table.op))), overhead_s=overhead, collection_factor=factors,
        levels=levels, level_specs=level_specs,
        unseen_levels=unseen_levels(levels, level_specs),
        unseen_energy=unseen_energy(levels, level_specs),
        chips={d: dev.chip for d in sorted({k.split("|", 1)[0] for k in level_specs})
               if (dev := lookup_device(d)) is not None and dev.chip},
        drift=drift, overhead_drift=overhead_drift,
        floor_s=float(np.exp(log_floor)))
    report = FitReport(table.family, len(table), int(res.nit), float(res.fun),
                       time.perf_counter() - start, sorted(set(table.device)), dropped)
    return model, report


__all__ = ["FitOptions", "FitReport", "fit_family", "unseen_energy", "unseen_levels"]
