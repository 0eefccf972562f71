"""Kernel-time estimators: how long one device takes for a list of kernels.

An estimator is anything with a ``name`` and an ``estimate(kernels, device, dtype)``
method returning a :class:`KernelTimes` (seconds per kernel and which estimator timed
each one). Estimators are vectorised: the search asks for thousands of kernels at once.

:class:`Roofline` is the analytical bound of Williams et al. (CACM 2009),
``t = max(FLOPs / (peak · e_c), bytes / (bandwidth · e_m))``, with the catalog's
achievable fractions ``e_c`` and ``e_m``; elementwise, normalisation and pooling work is
memory-bound by construction (few FLOPs per byte). The learned estimator of
:mod:`planner.kernels` predicts the achieved fraction of this bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device
from ..network import DTYPE_BYTES, DTYPE_PEAK_KEY
from ..ops import Kernel

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class KernelTimes:
    """Seconds per kernel, and the estimator that timed each (``roofline``, ``mlp``, or
    ``roofline (out of range)`` when a learned model fell back)."""

    seconds: FloatArray
    source: tuple[str, ...]


class Estimator(Protocol):
    """The interface the cost model uses to time kernels on a device."""

    name: str

    def estimate(self, kernels: Sequence[Kernel], device: Device, dtype: str) -> KernelTimes:
        """Seconds for each kernel on ``device`` in ``dtype`` (a network dtype name)."""
        ...


def kernel_arrays(kernels: Sequence[Kernel], elem_bytes: int) -> tuple[FloatArray, FloatArray]:
    """FLOPs and bytes moved of each kernel, as arrays."""
    flops = np.fromiter((k.flops for k in kernels), dtype=np.float64, count=len(kernels))
    nbytes = np.fromiter((k.bytes_moved(elem_bytes) for k in kernels), dtype=np.float64,
                         count=len(kernels))
    return flops, nbytes


def roofline_seconds(flops: FloatArray, nbytes: FloatArray, device: Device,
                     dtype: str) -> FloatArray:
    """``max(flops / (peak · e_c), bytes / (bandwidth · e_m))`` elementwise."""
    peak = device.peak(DTYPE_PEAK_KEY[dtype]) * device.compute_efficiency
    bw = device.memory_bandwidth * device.memory_efficiency
    return np.maximum(flops / peak, nbytes / bw)


class Roofline:
    """The roofline estimator (see the module docstring)."""

    name = "roofline"

    def estimate(self, kernels: Sequence[Kernel], device: Device, dtype: str) -> KernelTimes:
        """Roofline time of each kernel."""
        flops, nbytes = kernel_arrays(kernels, DTYPE_BYTES[dtype])
        secs = roofline_seconds(flops, nbytes, device, dtype)
        return KernelTimes(secs, ("roofline",) * len(kernels))
