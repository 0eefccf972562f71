"""Features of a kernel on a device, and the roofline bound the learned model divides.

The model predicts how far below the roofline a kernel runs, never the time itself, so
a GPU it has not seen is timed from its specs (NeuSight, Lee et al., ASPLOS'25: bounding
by the roofline is what lets a learned model carry over to new GPUs)::

    t = t_0 + max(t_flop / e, t_byte) · (1 + exp(−z(x)))
    t_flop = FLOPs_min / peak,  t_byte = bytes / bandwidth

``max(t_flop, t_byte)`` is the roofline of Williams, Waterman & Patterson (CACM 2009) at
the device's **datasheet** peak and bandwidth (not the catalog's achievable fractions),
``e`` ≤ 1 the GPU's sustained fraction of peak (:mod:`.train`), ``t_0`` a launch floor and
``z`` the network's output, so the prediction is never below the roofline. ``FLOPs_min``
is the direct count, except for stride-1 convolutions with a filter larger than 1×1,
which Winograd's minimal filtering (Lavin & Gray, CVPR 2016) computes with fewer
multiplications: there the bound divides by the multiplication saving of the
``F(4×4, r×s)`` algorithm, ``16·r·s / ((4+r−1)(4+s−1))`` (4 for 3×3). DeepBench and
NeuSight 3×3 convolutions reach up to 2.5× the direct-count peak, so a direct-count
bound would be wrong.

Network inputs (``x``) are logs of the dimensions, of the FLOPs and bytes, of the
arithmetic intensity relative to the device's ridge point, of the bound time itself
(small kernels are dominated by launch latency), and the wave quantisation of output
tiles over the SMs for tile edges 32 to 256 (how many waves of tiles, and how full the
last wave is; Habitat, Yu et al., ATC'21, used the same GPU quantities). Forward
convolutions also get the work wasted by square 4, 8 and 16 output tiles on their
``P × Q`` map (:func:`_spatial_waste`): cuDNN's Winograd and implicit-GEMM kernels tile
the output plane, and without it the NeuSight forward sweep's error rose and fell with
the image size modulo 16 (predicted 11% too slow at multiples of 16, 8% too fast just
above). They are zero for the backward passes, whose ~66 training shapes a GPU are too
few to learn them from: fed to all three passes they cost DeepBench's backward passes
1.3-1.7 points of MAPE (two ensembles, seeds 0-4 and 5-9). The GPU's
datasheet specs (:data:`GPU_FEATURES`) are recorded with each fitted GPU's ``e`` to
recognise it; they are not network inputs: with a dozen GPUs in the data they would only
identify each GPU, and a network fed them extrapolated 40-100% off on a held-out one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device, catalog
from ..network import DTYPE_BYTES, DTYPE_PEAK_KEY

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

TILES = (32, 64, 128, 256)
WINOGRAD_TILE = 4
FAMILIES = ("gemm", "conv")

GPU_FEATURES = ("log2_peak_flops", "log2_bandwidth", "log2_sm_count", "log2_l2_bytes",
                "log2_memory_bytes", "log2_ridge", "log2_peak_over_fp32")
_COMMON = ("log2_flops", "log2_bytes", "log2_intensity_over_ridge", "log2_bound_us",
           "elem_bytes")
#: edges of the square output tiles whose waste is a forward-convolution feature
SPATIAL_TILES = (4, 8, 16)
_SPATIAL = tuple(f"log2_spatial_waste_{t}" for t in SPATIAL_TILES)
_WAVES = tuple(f for t in TILES for f in (f"log2_waves_{t}", f"last_wave_fill_{t}"))
GEMM_FEATURES = ("log2_m", "log2_n", "log2_k", "log2_batch", *_COMMON, *_WAVES)
CONV_FEATURES = ("log2_n", "log2_c", "log2_hw", "log2_k", "log2_rs", "log2_stride",
                 "pad_fraction", "log2_out_hw", "phase_fwd", "phase_bwd_data",
                 "phase_bwd_filter", "log2_winograd_saving", "log2_gemm_m", "log2_gemm_n",
                 "log2_gemm_k", "log2_groups", "log2_dilation", *_SPATIAL, *_COMMON, *_WAVES)
FEATURES = {"gemm": GEMM_FEATURES, "conv": CONV_FEATURES}


@dataclass(frozen=True)
class DeviceSpecs:
    """Per-row device specs (arrays) for one dtype each."""

    peak: FloatArray  #: FLOP/s for the row's dtype (datasheet)
    peak_fp32: FloatArray
    bandwidth: FloatArray  #: bytes/s
    sm_count: FloatArray
    l2_bytes: FloatArray
    memory_bytes: FloatArray
    elem_bytes: FloatArray
    #: board power limit (W), NaN where the catalog has none: bounds what an unseen GPU
    #: sustains (:meth:`~.model.KernelModel.level`), never a feature of the network
    tdp_w: FloatArray | None = None
    #: base over boost clock, NaN where unknown: the clock the vendor guarantees at TDP
    base_ratio: FloatArray | None = None
    #: the GPU die of each row ("" where unknown)
    chips: tuple[str, ...] | None = None

    @staticmethod
    def build(devices: Sequence[Device], dtypes: Sequence[str]) -> DeviceSpecs:
        """Specs of row ``i`` on ``devices[i]`` in ``dtypes[i]``."""
        cache: dict[tuple[str, str], tuple[float, ...]] = {}
        rows = []
        for dev, dt in zip(devices, dtypes, strict=True):
            key = (dev.name, dt)
            if key not in cache:
                cache[key] = spec_row(dev, dt)
            rows.append(cache[key])
        arr = np.asarray(rows, dtype=np.float64).reshape(len(rows), 9)
        return DeviceSpecs._of([arr[:, i].copy() for i in range(9)],
                               tuple(dev.chip for dev in devices))

    @staticmethod
    def single(device: Device, dtype: str, rows: int) -> DeviceSpecs:
        """Specs of ``rows`` kernels on one device in one dtype."""
        vals = spec_row(device, dtype)
        return DeviceSpecs._of([np.full(rows, v) for v in vals], (device.chip,) * rows)

    def rows(self, idx: IntArray) -> DeviceSpecs:
        """The specs of rows ``idx`` only."""
        def pick(a: FloatArray | None) -> FloatArray | None:
            return None if a is None else a[idx]

        return DeviceSpecs(self.peak[idx], self.peak_fp32[idx], self.bandwidth[idx],
                           self.sm_count[idx], self.l2_bytes[idx], self.memory_bytes[idx],
                           self.elem_bytes[idx], pick(self.tdp_w), pick(self.base_ratio),
                           None if self.chips is None
                           else tuple(self.chips[int(i)] for i in idx))

    @staticmethod
    def _of(cols: list[FloatArray], chips: tuple[str, ...]) -> DeviceSpecs:
        (peak, peak_fp32, bandwidth, sm_count, l2_bytes, memory_bytes, elem_bytes, tdp_w,
         base_ratio) = cols
        return DeviceSpecs(peak, peak_fp32, bandwidth, sm_count, l2_bytes, memory_bytes,
                           elem_bytes, tdp_w, base_ratio, chips)


def spec_row(device: Device, dtype: str) -> tuple[float, ...]:
    """(peak, peak_fp32, bandwidth, SMs, L2, memory, element bytes, TDP, base/boost) of a
    device (NaN for the last two where the catalog does not say)."""
    nan = float("nan")
    return (device.peak(DTYPE_PEAK_KEY[dtype]), device.peak("fp32"), device.memory_bandwidth,
            float(device.sm_count), max(device.l2_bytes, 1.0), max(device.memory_bytes, 1.0),
            float(DTYPE_BYTES[dtype]), float(device.tdp_w) if device.tdp_w else nan,
            clock_ratio(device))


def clock_ratio(device: Device) -> float:
    """Base over boost clock of a device (at most 1), NaN where unknown.

    A board without a base clock takes the lowest ratio of the catalog's boards of the same
    die at the same boost clock and no higher power limit, which run the same silicon at
    the same clock on no more power (the H200 SXM: the H100 SXM's 1,590 / 1,980 MHz at
    700 W). An inference, not a datasheet figure: where the catalog has two such boards
    with their own base clocks, the later one's is as high or higher (A100 SXM4 40 and
    80 GB, 1,095 and 1,275 MHz, both 1,410 MHz boost at 400 W)."""
    if device.base_clock_hz and device.clock_hz:
        return min(device.base_clock_hz / device.clock_hz, 1.0)
    if not (device.chip and device.clock_hz and device.tdp_w):
        return float("nan")
    ratios = [d.base_clock_hz / d.clock_hz for d in catalog().values()
              if d.chip == device.chip and d.base_clock_hz and d.clock_hz == device.clock_hz
              and d.tdp_w and d.tdp_w <= device.tdp_w]
    return min(min(ratios), 1.0) if ratios else float("nan")


def _log2(x: FloatArray) -> FloatArray:
    return np.log2(np.maximum(x, 1e-30))


def _waves(tiles_m: FloatArray, tiles_n: FloatArray, batch: FloatArray,
           sm: FloatArray) -> list[FloatArray]:
    """log2(waves) and last-wave fill for each tile edge in :data:`TILES`."""
    cols: list[FloatArray] = []
    for t in TILES:
        tiles = np.ceil(tiles_m / t) * np.ceil(tiles_n / t) * batch
        waves = tiles / sm
        cols.append(_log2(waves))
        # an empty kernel (a zero dimension) has no waves: fill 1, out of range anyway
        cols.append(waves / np.maximum(np.ceil(waves), 1.0) + (waves <= 0))
    return cols


def _spatial_waste(p: FloatArray, q: FloatArray) -> list[FloatArray]:
    """``log2(⌈P/t⌉·⌈Q/t⌉·t² / (P·Q))`` for each edge ``t`` in :data:`SPATIAL_TILES`: the
    work a kernel that covers the ``P × Q`` output with ``t × t`` tiles computes in vain."""
    return [_log2(np.ceil(p / t) * np.ceil(q / t) * t * t / np.maximum(p * q, 1.0))
            for t in SPATIAL_TILES]


def _common(flops: FloatArray, nbytes: FloatArray, bound: FloatArray,
            spec: DeviceSpecs) -> list[FloatArray]:
    ridge = spec.peak / spec.bandwidth
    intensity = flops / np.maximum(nbytes, 1.0)  # an empty kernel moves no bytes
    return [_log2(flops), _log2(nbytes), _log2(intensity / ridge), _log2(bound / 1e-6),
            spec.elem_bytes]


def gpu_features(spec: DeviceSpecs) -> FloatArray:
    """GPU spec features (:data:`GPU_FEATURES` order), one row per kernel."""
    return np.column_stack(_gpu(spec))


def _gpu(spec: DeviceSpecs) -> list[FloatArray]:
    return [_log2(spec.peak), _log2(spec.bandwidth), _log2(spec.sm_count),
            _log2(spec.l2_bytes), _log2(spec.memory_bytes), _log2(spec.peak / spec.bandwidth),
            _log2(spec.peak / spec.peak_fp32)]


def gemm_work(shape: IntArray, elem_bytes: FloatArray) -> tuple[FloatArray, FloatArray]:
    """FLOPs and bytes of GEMMs (``m, n, k, batch`` columns)."""
    s = shape.astype(np.float64)
    m, n, k, b = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
    return 2.0 * m * n * k * b, elem_bytes * b * (m * k + k * n + m * n)


Bounds = tuple[FloatArray, FloatArray, FloatArray]


def gemm_features(shape: IntArray, spec: DeviceSpecs) -> Bounds:
    """Feature matrix (:data:`GEMM_FEATURES` order) and the compute and memory times of
    the roofline bound (seconds; the bound is their maximum)."""
    s = shape.astype(np.float64)
    m, n, k, b = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
    flops, nbytes = gemm_work(shape, spec.elem_bytes)
    t_c, t_m = flops / spec.peak, nbytes / spec.bandwidth
    bound = np.maximum(t_c, t_m)
    cols = [_log2(m), _log2(n), _log2(k), _log2(b), *_common(flops, nbytes, bound, spec),
            *_waves(m, n, b, spec.sm_count)]
    return np.column_stack(cols), t_c, t_m


def conv_out(shape: IntArray) -> tuple[FloatArray, FloatArray]:
    """Output height and width of convolutions (:data:`~.data.CONV_DIMS` columns)."""
    s = shape.astype(np.float64)
    h, w, r, ss = s[:, 2], s[:, 3], s[:, 5], s[:, 6]
    sh, sw, ph, pw, dh, dw = s[:, 7], s[:, 8], s[:, 9], s[:, 10], s[:, 11], s[:, 12]
    oh = np.floor((h + 2 * ph - dh * (r - 1) - 1) / sh) + 1
    ow = np.floor((w + 2 * pw - dw * (ss - 1) - 1) / sw) + 1
    return oh, ow


def winograd_saving(shape: IntArray) -> FloatArray:
    """Multiplication saving of Winograd ``F(4×4, r×s)`` where it applies, else 1."""
    s = shape.astype(np.float64)
    r, ss = s[:, 5], s[:, 6]
    ok = (s[:, 7] == 1) & (s[:, 8] == 1) & (s[:, 11] == 1) & (s[:, 12] == 1) & \
        (r * ss > 1) & (r <= 7) & (ss <= 7)
    t = WINOGRAD_TILE
    saving = t * t * r * ss / ((t + r - 1) * (t + ss - 1))
    return np.where(ok, np.maximum(saving, 1.0), 1.0)


def conv_work(shape: IntArray, elem_bytes: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Direct-convolution FLOPs and bytes (input, filter, output each once)."""
    s = shape.astype(np.float64)
    n, c, h, w, k, r, ss, g = s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4], s[:, 5], \
        s[:, 6], s[:, 13]
    oh, ow = conv_out(shape)
    flops = 2.0 * n * k * oh * ow * (c / g) * r * ss
    nbytes = elem_bytes * (n * c * h * w + k * (c / g) * r * ss + n * k * oh * ow)
    return flops, nbytes


def _implicit_gemm(shape: IntArray, phase: IntArray) -> tuple[FloatArray, ...]:
    """(M, N, K, groups) of the implicit GEMM of each pass (see :class:`planner.ops.Conv`)."""
    s = shape.astype(np.float64)
    n, c, h, w, k, r, ss, g = s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4], s[:, 5], \
        s[:, 6], s[:, 13]
    oh, ow = conv_out(shape)
    npq = n * oh * ow
    crs = (c / g) * r * ss
    gm = np.select([phase == 0, phase == 1], [npq, n * h * w], k / g)
    gn = np.select([phase == 0, phase == 1], [k / g, c / g], crs)
    gk = np.select([phase == 0, phase == 1], [crs, (k / g) * r * ss], npq)
    return gm, gn, gk, g


def conv_features(shape: IntArray, phase: IntArray, spec: DeviceSpecs) -> Bounds:
    """Feature matrix (:data:`CONV_FEATURES` order) and the compute and memory times of
    the roofline bound (seconds).

    ``phase`` is 0 forward, 1 backward-data, 2 backward-filter.
    """
    s = shape.astype(np.float64)
    n, c, h, w, k, r, ss = (s[:, i] for i in range(7))
    sh, ph, pw, dil = s[:, 7], s[:, 9], s[:, 10], s[:, 11] * s[:, 12]
    flops, nbytes = conv_work(shape, spec.elem_bytes)
    saving = winograd_saving(shape)
    t_c, t_m = flops / saving / spec.peak, nbytes / spec.bandwidth
    bound = np.maximum(t_c, t_m)
    oh, ow = conv_out(shape)
    gm, gn, gk, g = _implicit_gemm(shape, phase)
    pad = (ph + pw) / np.maximum(h + w, 1.0)
    cols = [_log2(n), _log2(c), _log2(h * w), _log2(k), _log2(r * ss), _log2(sh), pad,
            _log2(oh * ow), (phase == 0).astype(np.float64), (phase == 1).astype(np.float64),
            (phase == 2).astype(np.float64), _log2(saving), _log2(gm), _log2(gn), _log2(gk),
            _log2(g), _log2(dil),
            *(np.where(phase == 0, v, 0.0) for v in _spatial_waste(oh, ow)),
            *_common(flops, nbytes, bound, spec),
            *_waves(gm, gn, g, spec.sm_count)]
    return np.column_stack(cols), t_c, t_m


PHASES = {"conv_fwd": 0, "conv_bwd_data": 1, "conv_bwd_filter": 2}


def features(family: str, shape: IntArray, ops: Sequence[str], spec: DeviceSpecs) -> Bounds:
    """Features and bound times for one family (``ops`` gives the conv pass of each row).

    Degenerate kernels (a zero dimension) give non-finite or extreme features, which the
    range check sends to the roofline; no floating-point warning escapes.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if family == "gemm":
            return gemm_features(shape, spec)
        phase = np.fromiter((PHASES[o] for o in ops), dtype=np.int64, count=len(ops))
        return conv_features(shape, phase, spec)


__all__ = ["CONV_FEATURES", "FEATURES", "GEMM_FEATURES", "GPU_FEATURES", "DeviceSpecs",
           "conv_features", "features", "gemm_features", "winograd_saving"]
