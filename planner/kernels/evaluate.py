"""Accuracy of a model on measurements: MAPE, median and 90th-percentile error.

The absolute percentage error of a row is ``|t̂ − t| / t · 100``; per (device, op) the
report gives the row count, the mean (MAPE), the median and the 90th percentile. The
predicted time of a row includes its harness's per-call overhead (see
:mod:`planner.kernels.train`); rows out of the model's training range are predicted by
the roofline bound (what the estimator would do) and counted. Given the models' error
bands (:mod:`.bands`), it also gives the share of rows whose measured time fell within
their band: about 90% on rows like the held-out ones the bands were cut from, fewer on a
GPU or shapes unlike them. :func:`fit_bands` cuts the bands. Rows of a device the models
do not time (:func:`covers`: a CPU they have no measurements of) are judged by the
roofline that prices plans on it; rows of a family the models lack are counted, not
judged (:func:`evaluate_all`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device, lookup_device
from .bands import (
    CUTS,
    MIN_ROWS,
    OpBands,
    band_key,
    band_variable,
    bands_for,
    cut_bands,
    variable_for,
)
from .data import Dataset, Table
from .features import DeviceSpecs
from .model import Ensemble

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Result:
    """Errors of one (device, op) group."""

    device: str
    op: str
    n: int
    mape: float
    median_ape: float
    p90_ape: float
    out_of_range: int
    #: percentage of the rows the model answers for whose measured time fell in their
    #: error band (:mod:`.bands`); None where the models record no bands for the op
    in_band: float | None = None

    def record(self) -> dict[str, Any]:
        """Plain data for JSON/YAML (percentages rounded to 0.01)."""
        return {"device": self.device, "op": self.op, "n": self.n,
                "mape": round(self.mape, 2), "median_ape": round(self.median_ape, 2),
                "p90_ape": round(self.p90_ape, 2), "out_of_range": self.out_of_range,
                "in_band": None if self.in_band is None else round(self.in_band, 2)}


def predict_table(model: Ensemble, table: Table) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Predicted measured time of every row (harness overhead included), and in-range.

    Each member of the ensemble predicts what the harness measured (its own overheads
    and drifts); the prediction is the geometric mean of theirs."""
    pred, ok, _ = _predict(model, table)
    return pred, ok


def _predict(model: Ensemble, table: Table,
             ) -> tuple[FloatArray, NDArray[np.bool_], FloatArray]:
    """:func:`predict_table` and each row's error-band variable (:mod:`.bands`)."""
    logs, ok, times, bound = _member_logs(model, table)
    out: FloatArray = np.exp(np.mean(logs, axis=0))
    return out, ok, band_variable(variable_for(model), times, bound)


def member_log_times(model: Ensemble, table: Table) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Each member's log of the predicted measured time of every row (members × rows,
    harness overhead and drift included), and in-range: what :func:`predict_table`
    averages."""
    logs, ok, _, _ = _member_logs(model, table)
    return logs, ok


def _member_logs(model: Ensemble, table: Table,
                 ) -> tuple[FloatArray, NDArray[np.bool_], list[FloatArray], FloatArray]:
    spec = DeviceSpecs.build(table.devices(), table.dtype)
    times, bound, ok = model.member_times(table.shape_array(), table.op, spec, table.device,
                                          table.dtype, table.harness)
    pos = np.asarray(table.position, dtype=np.float64)
    sweeps = np.asarray(table.sweep, dtype=object)
    devs = np.asarray(table.device, dtype=object)
    drifting = sorted({(s, d) for s, d in zip(table.sweep, table.device, strict=True) if s})
    logs = []
    for member, kernel in zip(model.members, times, strict=True):
        secs = np.where(ok, kernel, bound)
        over = np.array([member.overhead(h, d)
                         for h, d in zip(table.harness, table.device, strict=True)])
        for sw, d in drifting:
            rows = (sweeps == sw) & (devs == d)
            secs[rows] = secs[rows] * member.drift_factor(sw, d, pos[rows])
            over[rows] = over[rows] * member.drift_factor(sw, d, pos[rows], overhead=True)
        logs.append(np.log(secs + over))
    return np.asarray(logs), ok, times, bound


def ape(pred: FloatArray, actual: FloatArray) -> FloatArray:
    """Absolute percentage errors."""
    out: FloatArray = np.abs(pred - actual) / actual * 100.0
    return out


def summarise(device: str, op: str, errors: FloatArray, out_of_range: int,
              in_band: float | None = None) -> Result:
    """One result row from a group's errors."""
    return Result(device, op, int(errors.size), float(np.mean(errors)),
                  float(np.median(errors)), float(np.percentile(errors, 90)), out_of_range,
                  in_band)


@dataclass
class Evaluation:
    """What :func:`evaluate_all` found: the results, and the rows it could not judge."""

    results: list[Result] = field(default_factory=list)
    #: family → rows of it that no model of the set times (a GEMM-only set's
    #: convolution rows): left out of the results
    skipped: dict[str, int] = field(default_factory=dict)
    #: devices whose rows the roofline timed, as plans on them are: the models were
    #: fitted on none of their measurements and are not used for them (a CPU)
    roofline: list[str] = field(default_factory=list)


def covers(models: Mapping[str, Ensemble], device: Device) -> bool:
    """Whether the models time ``device`` (as :meth:`.estimator.LearnedEstimator.covers`
    decides for plans): any GPU (an unseen one from its datasheet), another kind only
    where a model was fitted on its measurements."""
    prefix = f"{device.name}|"
    return device.kind == "gpu" or any(
        k.startswith(prefix) for m in models.values() for k in m.first.levels)


def evaluate(models: Mapping[str, Ensemble], data: Dataset,
             bands: Mapping[str, OpBands] | None = None) -> list[Result]:
    """Per (device, op) errors of ``models`` (by family) on every row of ``data``, and
    with ``bands`` the share of rows within their error band (:func:`evaluate_all`'s
    results)."""
    return evaluate_all(models, data, bands).results


def evaluate_all(models: Mapping[str, Ensemble], data: Dataset,
                 bands: Mapping[str, OpBands] | None = None) -> Evaluation:
    """Per (device, op) errors on every row of ``data``, timed as plans time them: by
    ``models`` (by family), with ``bands`` the share of rows within their error band;
    rows of a device the models do not cover (:func:`covers`: a CPU they have no
    measurements of) by the roofline of :class:`planner.costs.compute.Roofline`, every
    such row counted out of range; rows of a family the models lack are counted in
    ``skipped``, not judged."""
    out = Evaluation()
    roofline: set[str] = set()
    for table in data.tables():
        model = models.get(table.family)
        known: dict[str, bool] = {}
        for name in set(table.device):
            found = lookup_device(name)
            known[name] = found is None or covers(models, found)  # None: Table.devices says
        outside = np.array([not known[d] for d in table.device], dtype=bool)
        if outside.any():
            part = table.select(outside)
            out.results += _roofline_results(part)
            roofline.update(part.device)
            table = table.select(~outside)
        if not len(table):
            continue
        if model is None:
            out.skipped[table.family] = out.skipped.get(table.family, 0) + len(table)
            continue
        pred, ok, value = _predict(model, table)
        actual = np.asarray(table.seconds)
        err = ape(pred, actual)
        inside = _inside(bands or {}, table.op, table.dtype, actual / pred, value, ok)
        keys = sorted(set(zip(table.device, table.op, table.dtype, strict=True)))
        dev_arr = np.asarray(table.device)
        op_arr = np.asarray(table.op)
        dt_arr = np.asarray(table.dtype)
        for dev, op, dt in keys:
            m = (dev_arr == dev) & (op_arr == op) & (dt_arr == dt)
            label = band_key(op, dt)
            judged = m & ~np.isnan(inside)
            share = float(np.mean(inside[judged]) * 100.0) if judged.any() else None
            out.results.append(summarise(dev, label, err[m], int(np.sum(~ok[m])), share))
    out.results.sort(key=lambda r: (r.device, r.op))
    out.roofline = sorted(roofline)
    return out


def _roofline_results(table: Table) -> list[Result]:
    """Per (device, op) errors of the roofline estimator plans use on a device the
    models do not cover (:class:`planner.costs.compute.Roofline`: the catalog's
    achievable fractions of peak and bandwidth); every row is out of the models' range,
    and none has an error band."""
    from ..costs.compute import Roofline
    from ..ops import Conv, Gemm, Kernel

    rows = table.shape_array()
    pred = np.empty(len(table))
    devices = table.devices()
    kernels: list[Kernel] = [
        Gemm(*[int(v) for v in row]) if table.family == "gemm" else  # type: ignore[arg-type]
        Conv(*[int(v) for v in row], phase=op.removeprefix("conv_"))  # type: ignore[misc, arg-type]
        for row, op in zip(rows, table.op, strict=True)]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (dev, dt) in enumerate(zip(table.device, table.dtype, strict=True)):
        groups.setdefault((dev, dt), []).append(i)
    for (_, dt), idx in groups.items():
        times = Roofline().estimate([kernels[i] for i in idx], devices[idx[0]], dt)
        pred[idx] = times.seconds
    err = ape(pred, np.asarray(table.seconds))
    dev_arr, op_arr, dt_arr = (np.asarray(c) for c in (table.device, table.op, table.dtype))
    results: list[Result] = []
    for dev, op, dt in sorted(set(zip(table.device, table.op, table.dtype, strict=True))):
        m = (dev_arr == dev) & (op_arr == op) & (dt_arr == dt)
        results.append(summarise(dev, band_key(op, dt), err[m], int(m.sum())))
    return results


def _inside(bands: Mapping[str, OpBands], ops: Sequence[str], dtypes: Sequence[str],
            ratio: FloatArray, value: FloatArray, ok: NDArray[np.bool_]) -> FloatArray:
    """1 where a row's measured / predicted time is within its band, 0 outside, NaN
    where it has none (no bands for its op and dtype, or out of range: timed by the
    roofline). bf16 rows without bands of their own are judged by FP16's
    (:func:`.bands.bands_for`), as `kernels predict` and the planner read them."""
    out = np.full(len(ratio), np.nan)
    pairs = list(zip(ops, dtypes, strict=True))
    keys = np.asarray([band_key(o, d) for o, d in pairs])
    for op, dt in sorted(set(pairs)):
        b = bands_for(bands, op, dt)
        rows = np.flatnonzero((keys == band_key(op, dt)) & ok)
        if b is not None and len(rows):
            low, high = b.limits(value[rows])
            out[rows] = ((ratio[rows] >= low) & (ratio[rows] <= high)).astype(np.float64)
    return out


def fit_bands(models: Mapping[str, Ensemble], data: Dataset) -> dict[str, OpBands]:
    """Error bands per op and dtype (:mod:`.bands`, named by :func:`.bands.band_key`)
    from held-out rows: the rows the model answers for (out-of-range rows are timed by
    the roofline, which has no band)."""
    out: dict[str, OpBands] = {}
    for table in data.tables():
        model = models.get(table.family)
        if model is None or not len(table):
            continue
        pred, ok, value = _predict(model, table)
        ratio = np.asarray(table.seconds) / pred
        by = variable_for(model)
        ops, dts = np.asarray(table.op), np.asarray(table.dtype)
        for op, dt in sorted(set(zip(table.op, table.dtype, strict=True))):
            rows = (ops == op) & (dts == dt) & ok
            if int(rows.sum()) >= MIN_ROWS:
                out[band_key(op, dt)] = cut_bands(value[rows], ratio[rows], CUTS[by], by)
    return out


__all__ = ["Evaluation", "Result", "ape", "covers", "evaluate", "evaluate_all", "fit_bands",
           "predict_table", "summarise"]
