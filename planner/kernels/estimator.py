"""The learned kernel-time estimator (the :class:`~planner.costs.compute.Estimator` protocol).

GEMMs, batched GEMMs and the three passes of a convolution are timed by the fitted
models of :mod:`planner.kernels` (numpy only); every other kernel, and any kernel the
models cannot answer for, by the roofline estimator of :mod:`planner.costs.compute`.
Each kernel's ``source`` says which:

* ``mlp:<op>-<dtype>``, e.g. ``mlp:gemm-fp32``, ``mlp:conv_bwd_filter-fp16``;
* ``roofline`` for elementwise work (memory-bound by construction);
* ``mlp:<op>-<dtype> (scaled)`` for a kernel too large for the model along a dimension
  it splits along into independent kernels (a convolution's batch ``N``; a GEMM's rows
  ``M``, columns ``N`` or batch count): it is timed at the largest size the model
  answers for, and the time scaled by the work, ``t(N) = (N / N_max) · t(N_max)``: the
  throughput of a kernel that already fills the GPU, held constant (the convolution
  data stop at ``N`` = 64, answered up to 128: a per-GPU batch of 256 is timed as twice
  the model's ``N`` = 128 time rather than by the roofline). Where both sizes were
  measured, ``2·t(N)`` over-predicts ``t(2N)`` of a convolution by a median 11-15% and
  matches a GEMM's doubled rows (median 1.00, 10th-90th percentile 0.92-1.10):
  ``tests/benchmarks/scaling.py``. A convolution whose image is too large (one
  4,096 × 4,096 image: the data's largest map is 700 × 161) is first cut into bands of
  output rows, as domain parallelism cuts it, and the bands stacked into the batch
  (:func:`_fold_images`);
* ``mlp:<op>-<dtype> (padded)`` for a kernel smaller than any measured (a GEMM with one
  row, as a per-GPU batch of 1 makes; a convolution too small in FLOPs or bytes): it is
  timed as the smallest kernel the model answers for that contains it, its dimensions
  raised to the least the model answers for and its batch-like dimension grown until
  its FLOPs and bytes are in range too (:func:`pad_rows`), without scaling back: such
  kernels are launch-bound, and a kernel is not faster than the launch floor every
  measured kernel paid;
* ``... (groups as batch)`` for a grouped convolution, timed as its groups stacked
  into the batch (:func:`ungroup_rows`);
* ``... (as a batch split)`` for a band of an image cut by height (domain parallelism)
  that the models time faster than the batch split of the same work, which it is held
  to (:meth:`planner.ops.Conv.batch_split`);
* ``roofline (out of range)`` for a shape outside the model's training range that
  neither scaling nor padding brings in (for example a dilated or depthwise
  convolution, which no training data covers), plus the model's launch floor ``t_0``
  (a kernel launch is never free);
* ``roofline (no <dtype> data)`` for a dtype with no measurements (``float64``);
* ``roofline`` for elementwise, normalisation and pooling passes (memory-bound, no
  measurements of their own), plus the least launch floor ``t_0`` fitted to any
  measured kernels (1.5 µs in the shipped models, a convolution pass's).

``bfloat16`` is timed with its own measurements where the model has them (the H100's),
else with the ``float16`` ones (tensor-core kernels with the same rate on every GPU that
has both: bf16 / fp16 time 0.99 on the H100) at the device's bf16 peak.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device
from ..costs.compute import KernelTimes, kernel_arrays, roofline_seconds
from ..memo import IdentityMemo
from ..network import DTYPE_BYTES, DTYPE_PEAK_KEY
from ..ops import Conv, Gemm, Kernel
from .bands import band_variable, bands_for
from .features import DeviceSpecs, conv_out, features
from .model import SHAPE_FEATURES, Ensemble, KernelModel
from .store import ModelSet, load_models

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
CHUNK = 16384  #: kernels per vectorised batch (features are ~40 floats per kernel)


def model_dtype(dtype: str, trained: Sequence[str]) -> str | None:
    """The dtype whose measurements time ``dtype`` (None: none do)."""
    if dtype in trained:
        return dtype
    if dtype == "bfloat16" and "float16" in trained:
        return "float16"
    return None


def gemm_rows(kernels: Sequence[Gemm]) -> NDArray[np.int64]:
    """``(m, n, k, batch)`` rows."""
    return np.array([(k.m, k.n, k.k, k.batch) for k in kernels], dtype=np.int64).reshape(-1, 4)


def conv_rows(kernels: Sequence[Conv]) -> NDArray[np.int64]:
    """:data:`~.data.CONV_DIMS` rows."""
    return np.array([(k.n, k.c, k.h, k.w, k.k, k.r, k.s, k.stride_h, k.stride_w, k.pad_h,
                      k.pad_w, k.dil_h, k.dil_w, k.groups) for k in kernels],
                    dtype=np.int64).reshape(-1, 14)


def ungroup_rows(model: Ensemble, rows: IntArray) -> tuple[IntArray, NDArray[np.bool_]]:
    """(rows, grouped): grouped convolutions (``groups`` = g > 1, both channel counts
    divisible by g) as the ungrouped convolution of their groups stacked into the
    batch, ``g·N`` images of ``C/g → K/g`` channels, where the model was fitted on no
    grouped convolution (none of the shipped data is). The g groups are g independent
    convolutions of that size; stacked, they are one kernel with the grouped one's
    FLOPs, images and outputs (its filters are ``1/g`` of the grouped one's, which
    holds one set a group): a grouped convolution in one launch, as cuDNN's are. The
    roofline would otherwise time them, without the Winograd and tensor-core rates the
    model has learnt (AlexNet's grouped conv2 on an A100 priced slower than the same
    layer ungrouped, with twice its FLOPs). A depthwise convolution (``C/g = K/g = 1``)
    comes out beyond the data and stays with the roofline, where its memory traffic
    bounds it."""
    grouped = np.zeros(len(rows), dtype=bool)
    first = model.first
    if first.family != "conv" or "log2_groups" not in first.features:
        return rows, grouped
    at = first.features.index("log2_groups")
    if first.hi[at] + first.tolerance()[at] >= 1.0:  # fitted on groups of 2 or more
        return rows, grouped
    g = np.maximum(rows[:, 13], 1)
    grouped = (g > 1) & (rows[:, 1] % g == 0) & (rows[:, 4] % g == 0)
    if not grouped.any():
        return rows, grouped
    out = rows.copy()
    gg = g[grouped]
    out[grouped, 0] = rows[grouped, 0] * gg
    out[grouped, 1] = rows[grouped, 1] // gg
    out[grouped, 4] = rows[grouped, 4] // gg
    out[grouped, 13] = 1
    return out, grouped


#: family → (column of the shape rows, feature) of the dimensions a kernel splits along
#: into independent kernels of proportionally less work: a convolution's batch; a GEMM's
#: rows, columns and batch count
BATCH_DIMS: dict[str, tuple[tuple[int, str], ...]] = {
    "conv": ((0, "log2_n"),),
    "gemm": ((0, "log2_m"), (1, "log2_n"), (3, "log2_batch")),
}
#: family → (column, feature) of the dimensions a kernel splits along into kernels of
#: proportionally less work whose results are summed: a convolution's input channels
#: (the reduction of its forward and backward-filter passes, the independent outputs of
#: its backward-data pass) and output channels (the reverse), a GEMM's reduction ``k``.
#: The partial sums cost an elementwise add over the output, which is left out: it is
#: the output's bytes once per part, against the part's full kernel.
SPLIT_DIMS: dict[str, tuple[tuple[int, str], ...]] = {
    "conv": ((1, "log2_c"), (4, "log2_k")),
    "gemm": ((2, "log2_k"),),
}
#: range-checked features that grow with those dimensions (the implicit-GEMM rows of a
#: convolution's forward and backward-data pass and the reduction of its backward-filter
#: pass are ``N·P·Q`` or ``N·H·W``)
_GROWING = ("log2_flops", "log2_bytes", "log2_gemm_m", "log2_gemm_k")


def scale_rows(model: Ensemble, rows: IntArray, ops: Sequence[str],
               spec: DeviceSpecs) -> tuple[FloatArray, IntArray]:
    """(factor, part rows): each kernel's batch-like and reduction dimensions
    (:data:`BATCH_DIMS`, :data:`SPLIT_DIMS`) reduced to the largest the model answers
    for (the training maximum widened by :meth:`~.model.KernelModel.tolerance`), the
    batch-like ones further until the features that grow with them (FLOPs, bytes, a
    convolution's implicit-GEMM sizes) are in range too (a convolution's image is first
    cut into bands stacked into the batch, :func:`_fold_images`; what is still too large
    is cut further, :func:`_split_rows`), with the factor by which the work was reduced
    (1 where nothing was). Whether a part is then in range is the model's call: a
    feature no split changes (a convolution's filter size, groups, dilation) may still
    be out of it."""
    first = model.first
    names = first.features
    cap = first.hi + first.tolerance()
    out = rows.copy()
    factor = np.ones(len(rows))
    if first.family == "conv":
        _fold_images(out, factor, first, cap)
    dims = BATCH_DIMS[first.family]
    for col, feat in dims + SPLIT_DIMS[first.family]:
        part = np.minimum(out[:, col], max(int(np.floor(2.0 ** cap[names.index(feat)]
                                                        + 1e-6)), 1))
        factor *= out[:, col] / np.maximum(part, 1)
        out[:, col] = part
    # reduce the largest of those dimensions by the excess of the growing features
    # (bytes do not always grow in proportion: a GEMM's weights do not; hence a loop)
    grow = [names.index(f) for f in _GROWING if f in names]
    cols = np.array([c for c, _ in dims])
    for _ in range(6):
        excess, over = _excess(first.family, out, ops, spec, grow, cap)
        if not len(over):
            break
        col = cols[np.argmax(out[over][:, cols], axis=1)]
        old = out[over, col]
        new = np.maximum(np.floor(old / 2.0 ** excess[over]), 1).astype(np.int64)
        factor[over] *= old / new
        out[over, col] = new
    if first.family == "conv":
        _split_channels(out, factor, ops, spec, first, cap)
        _split_rows(out, factor, ops, spec, first, cap)
    return factor, out


#: features of a convolution's implicit GEMM that only its channels (and filter) drive:
#: the forward pass's ``K`` and ``C·R·S``, the backward-data pass's ``C`` and ``K·R·S``,
#: the backward-filter pass's ``C·R·S`` (its other sizes grow with the batch and image)
_CHANNEL_GROWING = ("log2_gemm_n", "log2_gemm_k")


def _split_channels(out: IntArray, factor: FloatArray, ops: Sequence[str], spec: DeviceSpecs,
                    first: KernelModel, cap: FloatArray) -> None:
    """Convolutions whose implicit-GEMM sizes are beyond the data once each channel count
    is in range (1,024 input channels of a 7 × 7 backward-filter pass: ``C·R·S`` = 50,176
    against 41,600 answered), timed on a part of their input or output channels
    (:data:`SPLIT_DIMS`), whichever brings them furthest in, and scaled by the channels
    left out: ``out`` and ``factor`` are updated in place."""
    names = first.features
    grow = [names.index(f) for f in _CHANNEL_GROWING if f in names]
    for _ in range(6):
        excess, over = _excess("conv", out, ops, spec, grow, cap)
        if not len(over):
            return
        best = excess[over].copy()
        pick = np.full(len(over), -1)
        parts = []
        for j, (col, _) in enumerate(SPLIT_DIMS["conv"]):
            trial = out[over].copy()
            trial[:, col] = np.maximum(np.floor(trial[:, col] / 2.0 ** excess[over]), 1)
            parts.append(trial[:, col])
            xt, _, _ = features("conv", trial, [ops[i] for i in over.tolist()],
                                spec.rows(over))
            left = np.max(xt[:, grow] - cap[grow], axis=1)
            better = left < best - 1e-9
            best[better] = left[better]
            pick[better] = j
        moved = np.flatnonzero(pick >= 0)
        if not len(moved):
            return  # what is left over is not the channels' (the filter's size)
        for i in moved.tolist():
            col = SPLIT_DIMS["conv"][pick[i]][0]
            row = over[i]
            factor[row] *= out[row, col] / parts[pick[i]][i]
            out[row, col] = parts[pick[i]][i]


def _excess(family: str, rows: IntArray, ops: Sequence[str], spec: DeviceSpecs,
            grow: list[int], cap: FloatArray) -> tuple[FloatArray, IntArray]:
    """How far (log2) each kernel's features ``grow`` are beyond ``cap`` at most, and the
    rows where that is positive."""
    x, _, _ = features(family, rows, ops, spec)
    excess: FloatArray = np.max(x[:, grow] - cap[grow], axis=1)
    return excess, np.flatnonzero(np.isfinite(excess) & (excess > 0))


#: family → (column, feature) of the dimensions :func:`pad_rows` raises to the least the
#: model answers for
_PAD_DIMS: dict[str, tuple[tuple[int, str], ...]] = {
    "conv": ((0, "log2_n"),),
    "gemm": ((0, "log2_m"), (1, "log2_n"), (2, "log2_k"), (3, "log2_batch")),
}


def pad_rows(model: Ensemble, rows: IntArray, ops: Sequence[str],
             spec: DeviceSpecs) -> tuple[FloatArray, IntArray]:
    """(factor, padded rows): kernels smaller than the data grown to the smallest kernel
    the model answers for that contains them: each dimension of :data:`_PAD_DIMS` raised
    to the least in range (the training minimum widened by
    :meth:`~.model.KernelModel.tolerance`), then the first batch-like dimension
    (:data:`BATCH_DIMS`) multiplied until the FLOPs, bytes and implicit-GEMM sizes are in
    range too. ``factor`` is the kernel's work over the padded kernel's (1 where nothing
    was raised)."""
    first = model.first
    names = first.features
    low = first.lo - first.tolerance()
    high = first.hi + first.tolerance()
    out = rows.copy()
    # a kernel beyond the data in some feature is not made answerable by growing it
    x, _, _ = features(first.family, out, ops, spec)
    shape = np.array([f in SHAPE_FEATURES for f in names])
    small = ~np.any(x[:, shape] > high[shape], axis=1)
    for col, feat in _PAD_DIMS[first.family]:
        least = max(int(np.ceil(2.0 ** low[names.index(feat)] - 1e-6)), 1)
        out[small, col] = np.maximum(out[small, col], least)
    grow = [names.index(f) for f in _GROWING if f in names]
    col = BATCH_DIMS[first.family][0][0]
    for _ in range(6):
        x, _, _ = features(first.family, out, ops, spec)
        deficit = np.max(low[grow] - x[:, grow], axis=1)
        under = np.flatnonzero(small & np.isfinite(deficit) & (deficit > 0) & (deficit < 40))
        if not len(under):
            break
        out[under, col] = np.ceil(out[under, col] * 2.0 ** deficit[under]).astype(np.int64)
    cols = [c for c, _ in _PAD_DIMS[first.family]]  # the only columns raised
    factor: FloatArray = np.prod(rows[:, cols].astype(np.float64) / out[:, cols], axis=1)
    return factor, out


@dataclass(frozen=True)
class _Bands:
    """Geometry of cutting convolutions' outputs into bands along their longer side."""

    size: FloatArray  #: output rows (or columns) along the cut side
    other_out: FloatArray  #: output extent of the other side
    other_in: FloatArray  #: input extent of the other side
    col: IntArray  #: shape column of the cut side's input extent (2: H, 3: W)
    stride: FloatArray
    pad: FloatArray
    reach: FloatArray  #: input rows one output row reads, ``dilation·(r − 1) + 1``

    @staticmethod
    def of(rows: IntArray) -> _Bands:
        p, q = conv_out(rows)
        along = p >= q
        f = rows.astype(np.float64)

        def pick(a: int, b: int) -> FloatArray:
            out: FloatArray = np.where(along, f[:, a], f[:, b])
            return out

        return _Bands(np.where(along, p, q), np.where(along, q, p), pick(3, 2),
                      np.where(along, 2, 3), pick(7, 8), pick(9, 10),
                      np.where(along, f[:, 11] * (f[:, 5] - 1), f[:, 12] * (f[:, 6] - 1)) + 1)

    def input_rows(self, band: FloatArray) -> FloatArray:
        """Input rows a band of ``band`` output rows reads, with the layer's padding."""
        out: FloatArray = (band - 1) * self.stride + self.reach - 2 * self.pad
        return out


def _cut(out: IntArray, factor: FloatArray, rows: IntArray, geo: _Bands, band: FloatArray,
         stack: bool) -> None:
    """Cut rows ``rows`` (geometry ``geo``, one entry each) into bands of ``band`` output
    rows where that makes progress, stacked into the batch or not, updating ``out`` and
    ``factor`` in place: the factor is the output rows over those timed."""
    band_in = geo.input_rows(band)
    ok = (band >= 1) & (band < geo.size) & (band_in >= 1)
    rows, size, band = rows[ok], geo.size[ok], band[ok]
    out[rows, geo.col[ok]] = band_in[ok].astype(np.int64)
    if stack:
        bands = np.floor(size / band)
        out[rows, 0] = out[rows, 0] * bands.astype(np.int64)
        band = band * bands
    factor[rows] *= size / band


def _fold_images(out: IntArray, factor: FloatArray, first: KernelModel,
                 cap: FloatArray) -> None:
    """Convolutions whose image is beyond the data: the output cut into bands of rows
    (or columns, whichever side is longer) as large as the model answers for, the bands
    stacked into the batch (``N·bands`` images of one band each, every band reading the
    input rows its outputs need with the layer's padding), ``out`` and ``factor``
    updated in place. Stacking keeps the kernel as large as the original, so it fills
    the GPU as the original does; the batch is then reduced like any other."""
    names = first.features
    max_out = 2.0 ** cap[names.index("log2_out_hw")]
    max_in = 2.0 ** cap[names.index("log2_hw")]
    p, q = conv_out(out)
    over = np.flatnonzero((p * q > max_out)
                          | (out[:, 2].astype(np.float64) * out[:, 3] > max_in))
    if not len(over):
        return
    geo = _Bands.of(out[over])
    band = np.floor(np.minimum(max_out / geo.other_out,
                               (max_in / geo.other_in - geo.reach + 2 * geo.pad) / geo.stride
                               + 1))
    _cut(out, factor, over, geo, band, stack=True)


#: range-checked features of a convolution that grow with its image
_SPATIAL_GROWING = ("log2_hw", "log2_out_hw", *_GROWING)


def _split_rows(out: IntArray, factor: FloatArray, ops: Sequence[str], spec: DeviceSpecs,
                first: KernelModel, cap: FloatArray) -> None:
    """Convolutions still too large once their batch is down to what the model answers
    for, timed on a band of output rows (or columns, whichever is longer) and scaled by
    the number of bands, as domain parallelism splits them: ``out`` and ``factor`` are
    updated in place. A band reads ``(P_band − 1)·stride + dilation·(r − 1) + 1`` input
    rows with the layer's padding, so its work per output row is the layer's."""
    names = first.features
    grow = [names.index(f) for f in _SPATIAL_GROWING if f in names]
    for _ in range(8):
        excess, over = _excess("conv", out, ops, spec, grow, cap)
        if not len(over):
            return
        geo = _Bands.of(out[over])
        before = factor[over].copy()
        _cut(out, factor, over, geo, np.maximum(np.floor(geo.size / 2.0 ** excess[over]), 1.0),
             stack=False)
        if np.array_equal(before, factor[over]):
            return  # no band made progress


@dataclass(frozen=True)
class Prediction:
    """One kernel's prediction with its parts (for ``planner kernels predict``)."""

    seconds: float
    source: str
    bound_s: float
    roofline_s: float
    sustained_fraction: float | None
    gpu_seen: bool | None
    in_range: bool
    #: work of the kernel over the work of the kernel the model timed (1: neither scaled
    #: nor padded; > 1: scaled, the time multiplied by it; < 1: padded, the time kept)
    scale: float = 1.0
    #: where 90% of held-out kernels like it were measured, relative to this prediction
    #: (:mod:`.bands`; None: the roofline timed it, or the models record no bands)
    interval_s: tuple[float, float] | None = None
    #: held-out rows the interval comes from
    interval_rows: int | None = None

    @property
    def by_roofline(self) -> bool:
        """Whether the roofline timed it (its :attr:`sustained_fraction` is then the
        device's achievable fraction of peak from the catalog or cluster file)."""
        return self.source.startswith("roofline")

    def record(self) -> dict[str, Any]:
        """Plain data."""
        return {"seconds": self.seconds, "source": self.source, "bound_s": self.bound_s,
                "roofline_s": self.roofline_s,
                "achieved_fraction_of_bound": self.bound_s / self.seconds
                if self.seconds > 0 else None,
                "sustained_fraction": self.sustained_fraction, "gpu_seen": self.gpu_seen,
                "in_range": self.in_range, "scale": self.scale,
                "interval_s": None if self.interval_s is None else list(self.interval_s),
                "interval_rows": self.interval_rows}


_MEMO_ENTRIES = 1 << 20
#: significant bits a kernel time keeps (:func:`reproducible`): a float32's
TIME_BITS = 24


def reproducible(seconds: FloatArray) -> FloatArray:
    """Kernel times rounded up to :data:`TIME_BITS` significant bits (less than 1.2 parts
    in 10⁷ added; never below the roofline, which they were at or above).

    The networks' matrix products (BLAS) and ``tanh``/``exp`` (numpy's SIMD loops) round
    their last bits differently on different CPUs, and two layouts that run the same
    kernels can tie exactly: a search that compared the unrounded times chose between
    them by those bits, so the same inputs gave another plan on another machine (Llama 3
    8B on 64 H100s at batch 16: OpenBLAS's Haswell, SkylakeX and Sandybridge kernels gave
    three plans). Rounded, two machines' times differ only where a rounding step falls
    between them: about one time in 10⁷ (their last bits differ by some 10⁻¹⁵)."""
    mantissa, exponent = np.frexp(seconds)
    out: FloatArray = np.ldexp(np.ceil(mantissa * 2.0 ** TIME_BITS), exponent - TIME_BITS)
    return out


class LearnedEstimator:
    """Kernel times from the fitted models, roofline where they do not apply."""

    name = "mlp"

    def __init__(self, models: ModelSet | None = None,
                 models_dir: str | os.PathLike[str] | None = None) -> None:
        self.models = models if models is not None else load_models(models_dir)
        #: elementwise, normalisation and pooling passes pay the least launch floor
        #: fitted to any measured kernels (a launch is never free)
        self._pass_floor = min((m.floor_s for model in self.models.models.values()
                                for m in model.members), default=0.0)
        #: per (device, dtype): kernel -> (seconds, source)
        self._memo: IdentityMemo[Kernel, tuple[float, str]] = IdentityMemo()

    def covers(self, device: Device) -> bool:
        """Whether the models may time ``device``: any GPU (an unseen one from its
        datasheet), another kind only where a model was fitted on its measurements."""
        from .evaluate import covers

        return covers(self.models.models, device)

    def estimate(self, kernels: Sequence[Kernel], device: Device, dtype: str) -> KernelTimes:
        """Seconds for each kernel on ``device`` in ``dtype`` (a network dtype name).

        Kernels already timed for this device and dtype come from a memo (a search asks
        for the same shapes many times); only new ones go through the models, together.
        """
        memo = self._memo.table(device, dtype)
        new = [k for k in dict.fromkeys(kernels) if k not in memo]
        if new:
            if len(memo) + len(new) > _MEMO_ENTRIES:
                memo.clear()
            fresh = self._estimate(new, device, dtype)
            for k, sec, src in zip(new, fresh.seconds.tolist(), fresh.source, strict=True):
                memo[k] = (sec, src)
        got = [memo[k] for k in kernels]
        return KernelTimes(np.array([g[0] for g in got], dtype=np.float64),
                           tuple(g[1] for g in got))

    def _estimate(self, kernels: Sequence[Kernel], device: Device, dtype: str) -> KernelTimes:
        n = len(kernels)
        secs = np.zeros(n)
        floor = np.zeros(n)  # launch floor added to an out-of-range kernel's roofline
        source: list[str] = [""] * n
        key = DTYPE_PEAK_KEY[dtype]
        fallback: list[int] = []
        for family, kind in (("gemm", Gemm), ("conv", Conv)):
            idx = [i for i, k in enumerate(kernels) if type(k) is kind]
            if not idx:
                continue
            model = self.models.get(family)
            mdt = model_dtype(dtype, model.dtypes) if model is not None else None
            if model is None or mdt is None:
                fallback += idx
                why = f"no {family} model" if model is None else f"no {dtype} data"
                for i in idx:
                    source[i] = f"roofline ({why})"
                    if model is not None:  # a float64 kernel launches like any other
                        floor[i] = min(m.floor_s for m in model.members)
                continue
            sub = [kernels[i] for i in idx]
            ops = [k.op for k in sub]
            t = np.empty(len(sub))
            scaled = np.ones(len(sub))
            ok = np.empty(len(sub), dtype=bool)
            grouped = np.zeros(len(sub), dtype=bool)
            for lo in range(0, len(sub), CHUNK):  # bounded memory for huge searches
                part = sub[lo:lo + CHUNK]
                rows = gemm_rows(part) if family == "gemm" else conv_rows(part)  # type: ignore[arg-type]
                rows, grouped[lo:lo + CHUNK] = ungroup_rows(model, rows)
                t[lo:lo + CHUNK], _, scaled[lo:lo + CHUNK], ok[lo:lo + CHUNK] = _time_rows(
                    model, rows, ops[lo:lo + CHUNK], device, dtype, mdt)
            where = np.asarray(idx)
            secs[where] = t
            labels = {op: f"mlp:{op}-{key}" for op in set(ops)}
            launch = min(m.floor_s for m in model.members)
            for i, op, good, f, grp in zip(idx, ops, ok.tolist(), scaled.tolist(),
                                           grouped.tolist(), strict=True):
                if good:
                    source[i] = labels[op] if f == 1.0 else (
                        f"{labels[op]} (scaled)" if f > 1.0 else f"{labels[op]} (padded)")
                    if grp:
                        source[i] += " (groups as batch)"
                else:
                    source[i] = "roofline (out of range)"
                    fallback.append(i)
                    floor[i] = launch
        rest = [i for i, s in enumerate(source) if not s]
        for i in rest:
            source[i] = "roofline"
            floor[i] = self._pass_floor
        fallback += rest
        if fallback:
            sub_k = [kernels[i] for i in fallback]
            flops, nbytes = kernel_arrays(sub_k, DTYPE_BYTES[dtype])
            where = np.asarray(fallback)
            secs[where] = roofline_seconds(flops, nbytes, device, dtype) + floor[where]
        secs = reproducible(secs)
        # a band of an image cut by height computes no faster than the batch split of the
        # same work (Conv.batch_split): the same implicit GEMM, which the models may time
        # apart by shape alone
        banded = [(i, pair) for i, k in enumerate(kernels)
                  if type(k) is Conv and (pair := k.batch_split()) is not None]
        if banded:
            at = np.array([i for i, _ in banded])
            whole = self.estimate([pair[0] for _, pair in banded], device, dtype)
            held = reproducible(np.array([work for _, (_, work) in banded]) * whole.seconds)
            for j in np.flatnonzero(held > secs[at]).tolist():
                secs[at[j]] = held[j]
                source[at[j]] = f"{whole.source[j]} (as a batch split)"
        return KernelTimes(secs, tuple(source))

    def explain(self, kernel: Gemm | Conv, device: Device, dtype: str) -> Prediction:
        """One kernel's time with the parts that made it."""
        times = self.estimate([kernel], device, dtype)
        flops, nbytes = kernel_arrays([kernel], DTYPE_BYTES[dtype])
        roof = float(roofline_seconds(flops, nbytes, device, dtype)[0])
        family = "gemm" if isinstance(kernel, Gemm) else "conv"
        model = self.models.get(family)
        mdt = model_dtype(dtype, model.dtypes) if model is not None else None
        # the datasheet's roofline (no model: the fallback's own is at the catalog's
        # achievable fraction of it)
        bound = max(float(flops[0]) / device.peak(DTYPE_PEAK_KEY[dtype]),
                    float(nbytes[0]) / device.memory_bandwidth)
        frac: float | None = None
        seen: bool | None = None
        ok = False
        scale = 1.0
        seconds = float(times.seconds[0])
        interval: tuple[float, float] | None = None
        interval_rows: int | None = None
        if model is not None and mdt is not None:
            rows = gemm_rows([kernel]) if isinstance(kernel, Gemm) else conv_rows([kernel])
            rows, _ = ungroup_rows(model, rows)
            _, b, f, answered = _time_rows(model, rows, [kernel.op], device, dtype, mdt)
            spec = DeviceSpecs.single(device, dtype, 1)
            e, seenv = model.level(spec, [device.name], [mdt])
            bound, frac, seen, scale = float(b[0]), float(e[0]), bool(seenv[0]), float(f[0])
            ok = bool(answered[0]) and scale == 1.0  # a scaled kernel was out of range
            bands = bands_for(self.models.error_bands, kernel.op, mdt)
            if bands is not None and answered[0]:
                timed = rows if scale == 1.0 else (
                    scale_rows if scale > 1.0 else pad_rows)(model, rows, [kernel.op], spec)[1]
                member, timed_bound, _ = model.member_times(timed, [kernel.op], spec,
                                                            [device.name], [mdt])
                band = bands.band(float(band_variable(bands.by, member, timed_bound)[0]))
                interval = (seconds * band.low, seconds * band.high)
                interval_rows = band.n
        if times.source[0].startswith("roofline"):
            # the roofline timed it at the catalog's achievable fraction of peak, not at
            # the model's fitted level (an audit: predict showed the fitted one)
            frac = device.compute_efficiency
        return Prediction(seconds, times.source[0], bound, roof, frac, seen, ok, scale,
                          interval, interval_rows)


def _time_rows(model: Ensemble, rows: IntArray, ops: Sequence[str], device: Device,
               dtype: str, mdt: str,
               ) -> tuple[FloatArray, FloatArray, FloatArray, NDArray[np.bool_]]:
    """(seconds, roofline bound seconds, scale factor, answered) for kernels of one
    family on one device: the model's time where the kernel is in range, else, where
    reducing its batch-like dimensions brings it in (:func:`scale_rows`), the reduced
    kernel's time times the factor by which its work was reduced (factor 1: not
    scaled), else, where growing it brings it in (:func:`pad_rows`), the padded kernel's
    time (factor < 1: its work over the padded kernel's)."""
    n = len(rows)
    spec = DeviceSpecs.single(device, dtype, n)
    names, dts = [device.name] * n, [mdt] * n
    t, bound, ok = model.predict_raw(rows, ops, spec, names, dts)
    factor = np.ones(n)
    # scaled kernels: time × factor (factor > 1); padded ones: the time kept (factor < 1,
    # launch-bound, see pad_rows)
    for reshape, applies, scaled in ((scale_rows, np.greater, True),
                                     (pad_rows, np.less, False)):
        miss = np.flatnonzero(~ok)
        if not len(miss):
            break
        f, sub = reshape(model, rows[miss], [ops[i] for i in miss.tolist()],
                         spec.rows(miss))
        sel = np.flatnonzero(applies(f, 1.0))
        if not len(sel):
            continue
        pick = miss[sel]
        k = len(pick)
        part_ops = [ops[i] for i in pick.tolist()]
        t_part, _, ok_part = model.predict_raw(sub[sel], part_ops, spec.rows(pick),
                                               names[:k], dts[:k])
        if scaled and not ok_part.all():
            # a part too small in what the split left alone (4,096 channels of a 4 × 4
            # image): each part padded, as a small kernel is, and the parts summed
            _pad_parts(model, sub[sel], part_ops, spec.rows(pick), names[:k], dts[:k],
                       t_part, ok_part)
        good = pick[ok_part]
        t[good] = (f[sel][ok_part] if scaled else 1.0) * t_part[ok_part]
        factor[good] = f[sel][ok_part]
        ok[good] = True
    return t, bound, factor, ok


def _pad_parts(model: Ensemble, parts: IntArray, ops: Sequence[str], spec: DeviceSpecs,
               names: list[str], dts: list[str], t: FloatArray,
               ok: NDArray[np.bool_]) -> None:
    """Time the parts of scaled kernels the model does not answer for by padding them
    (:func:`pad_rows`), updating ``t`` and ``ok`` in place."""
    miss = np.flatnonzero(~ok)
    f, padded = pad_rows(model, parts[miss], [ops[i] for i in miss.tolist()],
                         spec.rows(miss))
    sel = np.flatnonzero(f < 1.0)
    if not len(sel):
        return
    pick = miss[sel]
    k = len(pick)
    t_pad, _, ok_pad = model.predict_raw(padded[sel], [ops[i] for i in pick.tolist()],
                                         spec.rows(pick), names[:k], dts[:k])
    t[pick[ok_pad]] = t_pad[ok_pad]
    ok[pick[ok_pad]] = True


__all__ = ["BATCH_DIMS", "SPLIT_DIMS", "LearnedEstimator", "Prediction", "model_dtype", "pad_rows",
           "scale_rows", "ungroup_rows"]
