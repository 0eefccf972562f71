"""Accuracy of a model on measurements: MAPE, median and 90th-percentile error.

The absolute percentage error of a row is ``|t̂ − t| / t · 100``; per (device, op) the
report gives the row count, the mean (MAPE), the median and the 90th percentile. The
predicted time of a row includes its harness's per-call overhead (see
:mod:`planner.kernels.train`); rows out of the model's training range are predicted by
the roofline bound (what the estimator would do) and counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device, lookup_device
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

    def record(self) -> dict[str, Any]:
        """Plain data for JSON/YAML (percentages rounded to 0.01)."""
        return {"device": self.device, "op": self.op, "n": self.n,
                "mape": round(self.mape, 2), "median_ape": round(self.median_ape, 2),
                "p90_ape": round(self.p90_ape, 2), "out_of_range": self.out_of_range}


def predict_table(model: Ensemble, table: Table) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Predicted measured time of every row (harness overhead included), and in-range.

    Each member of the ensemble predicts what the harness measured (its own overheads
    and drifts); the prediction is the geometric mean of theirs."""
    devices: list[Device] = []
    for name in table.device:
        dev = lookup_device(name)
        assert dev is not None  # rows were validated when read
        devices.append(dev)
    spec = DeviceSpecs.build(devices, table.dtype)
    times, bound, ok = model.member_times(table.shape_array(), table.op, spec, table.device,
                                          table.dtype, table.harness)
    pos = np.asarray(table.position, dtype=np.float64)
    sweeps = np.asarray(table.sweep, dtype=object)
    devs = np.asarray(table.device, dtype=object)
    drifting = sorted({(s, d) for s, d in zip(table.sweep, table.device, strict=True) if s})
    logs = []
    for member, kernel in zip(model.members, times, strict=True):
        secs = np.where(ok, kernel, bound)
        for sw, d in drifting:
            rows = (sweeps == sw) & (devs == d)
            secs[rows] = secs[rows] * member.drift_factor(sw, d, pos[rows])
        over = np.array([member.overhead(h, d)
                         for h, d in zip(table.harness, table.device, strict=True)])
        logs.append(np.log(secs + over))
    out: FloatArray = np.exp(np.mean(logs, axis=0))
    return out, ok


def ape(pred: FloatArray, actual: FloatArray) -> FloatArray:
    """Absolute percentage errors."""
    out: FloatArray = np.abs(pred - actual) / actual * 100.0
    return out


def summarise(device: str, op: str, errors: FloatArray, out_of_range: int) -> Result:
    """One result row from a group's errors."""
    return Result(device, op, int(errors.size), float(np.mean(errors)),
                  float(np.median(errors)), float(np.percentile(errors, 90)), out_of_range)


def evaluate(models: Mapping[str, Ensemble], data: Dataset) -> list[Result]:
    """Per (device, op) errors of ``models`` (by family) on every row of ``data``."""
    results: list[Result] = []
    for table in data.tables():
        model = models.get(table.family)
        if model is None or not len(table):
            continue
        pred, ok = predict_table(model, table)
        actual = np.asarray(table.seconds)
        err = ape(pred, actual)
        keys = sorted(set(zip(table.device, table.op, table.dtype, strict=True)))
        dev_arr = np.asarray(table.device)
        op_arr = np.asarray(table.op)
        dt_arr = np.asarray(table.dtype)
        for dev, op, dt in keys:
            m = (dev_arr == dev) & (op_arr == op) & (dt_arr == dt)
            label = op if dt == "float32" else f"{op}-{dt}"
            results.append(summarise(dev, label, err[m], int(np.sum(~ok[m]))))
    results.sort(key=lambda r: (r.device, r.op))
    return results


__all__ = ["Result", "ape", "evaluate", "predict_table", "summarise"]
