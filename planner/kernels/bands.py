"""Error bands: how far from the prediction held-out measurements fell, for kernels like
the one predicted.

A prediction alone does not say how much to trust it. When a model is fitted, its
held-out rows (the ``test`` split, never used to fit) give, per kernel op (``gemm``,
``bmm``, ``conv_fwd``, ``conv_bwd_data``, ``conv_bwd_filter``) and dtype the model was
fitted on (:func:`band_key`: ``gemm`` is FP32, ``gemm-float16`` the half-precision rows, which
bfloat16 kernels are timed with; GPUs pooled), an interval of measured over predicted
time that holds 90% of them (the 5th and 95th percentiles, at the ranks split conformal
prediction uses). They are kept in bands of a variable that says how hard a kernel is
to predict:

* for an ensemble (several networks), the spread of its members' predictions, the
  standard deviation of their log times: where networks from different random starts
  disagree the data did not pin the answer down (DeepBench convolutions: MAPE 12% on
  the half of held-out rows with the least spread, 41% on the 5% with the most);
* for a single network, the roofline bound of the kernel: small kernels are the least
  predictable (launch and host overheads; held-out NeuSight and DeepBench GEMMs: 19% on
  the 20% with the smallest bound, 5-10% above).

Band edges are quantiles of the variable over the held-out rows (:data:`SPREAD_CUTS`,
:data:`BOUND_CUTS`); a band with fewer than :data:`MIN_ROWS` rows is merged into its
neighbour, and an op and dtype with fewer rows gets none. This is split conformal
prediction (Vovk et al., *Algorithmic Learning in a Random World*, 2005): on kernels
drawn like the held-out ones, at least 90% of measured times fall in ``[low, high] ×
predicted``. On a GPU
the model has not seen, fewer do (README, "Error bands").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ManifestValueError
from .model import Ensemble

FloatArray = NDArray[np.float64]

#: the interval: these quantiles of measured / predicted time
INTERVAL = (0.05, 0.95)
#: quantiles of the members' spread where an ensemble's bands are cut (the tail is
#: where the errors are)
SPREAD_CUTS = (0.5, 0.8, 0.95)
#: quantiles of the roofline bound where a single network's bands are cut
BOUND_CUTS = (0.05, 0.2, 0.5)
#: what bands are cut on → where
CUTS = {"member_spread": SPREAD_CUTS, "bound_s": BOUND_CUTS}
#: fewest held-out rows a band is made of
MIN_ROWS = 30


@dataclass(frozen=True)
class Band:
    """Measured over predicted time of the held-out rows of one band."""

    n: int
    low: float  #: lower end (5th percentile, :func:`conformal_ranks`)
    high: float  #: upper end (95th percentile)


@dataclass(frozen=True)
class OpBands:
    """The bands of one op: ``bands[i]`` holds values from ``edges[i-1]`` (inclusive) up
    to ``edges[i]`` (exclusive); the first and last are open."""

    by: str
    edges: tuple[float, ...]
    bands: tuple[Band, ...]

    def band_of(self, values: FloatArray) -> NDArray[np.int64]:
        """Band index of each value."""
        out: NDArray[np.int64] = np.searchsorted(np.asarray(self.edges), values,
                                                 side="right").astype(np.int64)
        return out

    def band(self, value: float) -> Band:
        """The band of one value."""
        return self.bands[int(self.band_of(np.array([value]))[0])]

    def limits(self, values: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(low, high) ratio of each value's band."""
        idx = self.band_of(values)
        low = np.array([b.low for b in self.bands])[idx]
        high = np.array([b.high for b in self.bands])[idx]
        return low, high

    def record(self) -> dict[str, Any]:
        """Plain data for the manifest."""
        return {"by": self.by, "edges": list(self.edges),
                "bands": [{"n": b.n, "low": b.low, "high": b.high} for b in self.bands]}

    @staticmethod
    def from_record(rec: Any, where: str) -> OpBands:
        """Parse and check a manifest record (ModelDataError naming ``where``)."""
        if not isinstance(rec, dict) or rec.get("by") not in CUTS:
            raise ManifestValueError(where, f"expected a mapping with 'by' one of {list(CUTS)}")
        edges, bands = rec.get("edges"), rec.get("bands")
        try:
            e = tuple(float(x) for x in edges)  # type: ignore[union-attr]
            b = tuple(Band(int(x["n"]), float(x["low"]), float(x["high"]))
                      for x in bands)  # type: ignore[union-attr]
        except (TypeError, KeyError, ValueError):
            raise ManifestValueError(where, "expected 'edges' (numbers) and 'bands' "
                                            "(mappings with n, low and high)") from None
        if len(b) != len(e) + 1 or any(x >= y for x, y in itertools.pairwise(e)):
            raise ManifestValueError(where, "expected ascending edges and one band more "
                                            f"than edges (got {len(e)} edges, {len(b)} bands)")
        if any(not 0.0 < x.low <= x.high or x.n < 1 for x in b):
            raise ManifestValueError(where, "a band needs 0 < low <= high and n >= 1")
        return OpBands(str(rec["by"]), e, b)


def band_key(op: str, dtype: str) -> str:
    """The name of the bands of an op's kernels in one of the model's dtypes (as ``kernels
    eval`` labels its rows): ``conv_fwd``, ``conv_fwd-float16``."""
    return op if dtype == "float32" else f"{op}-{dtype}"


def bands_for(bands: Mapping[str, OpBands], op: str, dtype: str) -> OpBands | None:
    """The bands that judge an op's kernels in one of the model's dtypes: its own, or for
    bf16 without enough held-out rows of its own (the H100's 15 convolution shapes a
    pass), FP16's: the same tensor-core rate (bf16 / fp16 time 0.99-1.01 on the H100)."""
    own = bands.get(band_key(op, dtype))
    if own is None and dtype == "bfloat16":
        return bands.get(band_key(op, "float16"))
    return own


def band_variable(by: str, member_times: Sequence[FloatArray], bound: FloatArray) -> FloatArray:
    """The variable the bands are cut on, per kernel."""
    if by == "member_spread":
        out: FloatArray = np.std(np.log(np.asarray(member_times)), axis=0)
        return out
    return np.asarray(bound, dtype=np.float64)


def variable_for(model: Ensemble) -> str:
    """What an ensemble's bands are cut on."""
    return "member_spread" if len(model.members) > 1 else "bound_s"


def cut_bands(values: FloatArray, ratios: FloatArray, quantiles: Sequence[float],
              by: str) -> OpBands:
    """Bands of ``values`` cut at their ``quantiles`` (merged until each has
    :data:`MIN_ROWS` rows), each bounded by the ``ratios`` (measured / predicted) of its
    rows at the ranks :func:`conformal_ranks` gives: edges to 6 significant digits and
    ratios to 4 decimals (rounded outward), as the manifest keeps them."""
    # stored as the manifest writes them, so a reloaded band is the band that was cut
    edges = sorted({float(f"{e:.6g}") for e in np.quantile(values, quantiles)})
    while True:
        idx = np.searchsorted(np.asarray(edges), values, side="right")
        counts = np.bincount(idx, minlength=len(edges) + 1)
        small = [i for i in range(len(counts)) if counts[i] < MIN_ROWS]
        if not small or not edges:
            break
        i = small[0]  # merge into the neighbour: drop the edge between them
        del edges[min(i, len(edges) - 1)]
    idx = np.searchsorted(np.asarray(edges), values, side="right")
    bands = []
    for i in range(len(edges) + 1):
        r = np.sort(ratios[idx == i])
        lo, hi = conformal_ranks(r.size)
        # rounded outward, so the rows at the ranks stay inside
        bands.append(Band(int(r.size), math.floor(float(r[lo - 1]) * 1e4) / 1e4,
                          math.ceil(float(r[hi - 1]) * 1e4) / 1e4))
    return OpBands(by, tuple(edges), tuple(bands))


def conformal_ranks(n: int) -> tuple[int, int]:
    """1-based ranks of the sorted ratios of ``n`` held-out rows that bound a band:
    ``⌊(n + 1)·0.05⌋`` and ``⌈(n + 1)·0.95⌉`` (clipped to 1..n). A new kernel exchangeable
    with the ``n`` falls below the ``k``-th smallest with probability ``k / (n + 1)``, so
    the interval holds it with probability at least 90% whatever ``n`` (split conformal
    prediction's finite-sample rule; Vovk et al. 2005, Lei et al., JASA 2018). Empirical
    percentiles would cover less on small bands: 86% in-sample on 43 rows."""
    lo, hi = INTERVAL
    return (max(1, math.floor((n + 1) * lo)), min(n, math.ceil((n + 1) * hi)))


def bands_record(bands: Mapping[str, OpBands], command: str) -> dict[str, Any]:
    """The manifest's ``error_bands`` section."""
    lo, hi = INTERVAL
    return {"what": f"{lo * 100:g}th and {hi * 100:g}th percentiles (conformal ranks) of "
                    "measured over predicted time on the held-out rows (split test), per "
                    "op and dtype, in bands of the members' spread (std of log time) or "
                    "of the roofline bound (s)",
            "command": command,
            "ops": {op: b.record() for op, b in sorted(bands.items())}}


def parse_bands(section: Any, where: str) -> dict[str, OpBands]:
    """The ``error_bands`` section of a manifest (absent: no bands)."""
    if section is None:
        return {}
    ops = section.get("ops") if isinstance(section, dict) else None
    if not isinstance(ops, dict):
        raise ManifestValueError(where, "expected a mapping with 'ops'")
    return {str(op): OpBands.from_record(rec, f"{where}.ops.{op}") for op, rec in ops.items()}


__all__ = ["BOUND_CUTS", "CUTS", "INTERVAL", "MIN_ROWS", "SPREAD_CUTS", "Band", "OpBands",
           "band_key", "band_variable", "bands_for", "bands_record", "conformal_ranks", "cut_bands",
           "parse_bands", "variable_for"]
