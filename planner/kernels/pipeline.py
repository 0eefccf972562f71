"""What the ``planner kernels`` commands do, as library functions (no printing).

* :func:`fit_models`: read measurement CSVs, fit one model per kernel family on the rows
  that are not held out, measure the held-out accuracy, write the model directory.
* :func:`evaluate_files`: the per (device, op) accuracy of a model set on CSVs.
* :func:`achieved_fractions`: per device, the 95th percentile of achieved FP32 GEMM
  FLOP/s over the catalog peak, for GEMMs of at least 1 GFLOP (what the device catalog's
  ``achievable.compute`` cites).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..cluster import lookup_device, register_devices, registered_devices
from ..errors import UsageError
from ..threads import BLAS_THREAD_VARS
from .bands import bands_record
from .data import Dataset, Table, read_files
from .evaluate import Evaluation, Result, evaluate, evaluate_all, fit_bands
from .features import gemm_work
from .model import Ensemble
from .store import (
    MANIFEST,
    Extra,
    ModelSet,
    existing_families,
    save_models,
    sha256_file,
)
from .train import FitOptions, FitReport, fit_family

SPLITS = ("all", "train", "test")


@dataclass
class FitOutcome:
    """A finished fit: the models, what each fit did, and the held-out accuracy."""

    models: dict[str, Ensemble]
    reports: list[FitReport]
    accuracy: list[Result]
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def select(data: Dataset, split: str = "all", devices: Sequence[str] = (),
           exclude: Sequence[str] = ()) -> Dataset:
    """Rows of a split (``test``: held out; ``train``: the rest), of some devices, or
    without some devices (catalog names)."""
    if split not in SPLITS:
        raise UsageError(f"planner: error: unknown split {split!r}; expected one of "
                         f"{', '.join(SPLITS)}")
    out = Dataset(files=list(data.files))
    for table in (data.gemm, data.conv):
        mask = np.ones(len(table), dtype=bool)
        hold = np.asarray(table.holdout, dtype=bool)
        if split == "test":
            mask &= hold
        elif split == "train":
            mask &= ~hold
        dev = np.asarray(table.device, dtype=object)
        if devices:
            mask &= np.isin(dev, list(devices))
        if exclude:
            mask &= ~np.isin(dev, list(exclude))
        picked = table.select(mask)
        if table.family == "gemm":
            out.gemm = picked
        else:
            out.conv = picked
    return out


def canonical_devices(names: Iterable[str]) -> list[str]:
    """Catalog names of user-given device names (UsageError for unknown ones)."""
    out = []
    for name in names:
        dev = lookup_device(name)
        if dev is None:
            raise UsageError(f"planner: error: unknown device {name!r} (`planner devices` "
                             "lists the catalog)")
        out.append(dev.name)
    return out


def _provenance(paths: Sequence[str | Path],
                shipped: Sequence[tuple[str, Path]] = ()) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"file": name, "sha256": sha256_file(path), "shipped": True}
                                 for name, path in shipped]
    for p in paths:
        path = Path(p)
        shown = str(p)
        with contextlib.suppress(ValueError):
            shown = str(path.resolve().relative_to(Path.cwd().resolve()))
        out.append({"file": shown, "sha256": sha256_file(path)})
    return out


def fit_models(paths: Sequence[str | Path], out_dir: str | Path | None,
               leave_out: Sequence[str] = (), options: FitOptions | None = None,
               families: Sequence[str] = ("gemm", "conv"),
               shipped: Sequence[tuple[str, Path]] = (),
               progress: Callable[[str], None] | None = None,
               clusters: Sequence[str] = ()) -> FitOutcome:
    """Fit on the rows that are not held out; measure on the held-out rows; write.

    ``shipped``: the shipped models' training files (:func:`.store.shipped_training_data`),
    read before ``paths``; the manifest records them by their shipped names and the
    commands it records say ``--shipped-data``. ``clusters``: the cluster files whose
    devices the data name (``--cluster``), which the recorded commands repeat and the
    manifest records with their sha256."""
    start = time.perf_counter()
    data = read_files([*(path for _, path in shipped), *paths])
    left = canonical_devices(leave_out)
    measured = {d for t in data.tables() for d in t.device}
    absent = [d for d in left if d not in measured]
    if absent:  # the manifest would record a leave-one-GPU-out that left nothing out
        raise UsageError(f"planner: error: --leave-out {', '.join(absent)}: the data have no "
                         f"rows of it (they measure {', '.join(sorted(measured))})")
    train = select(data, "train", exclude=left)
    test = select(data, "test", exclude=left)
    opts = options or FitOptions()
    models: dict[str, Ensemble] = {}
    reports: list[FitReport] = []
    tables = [t for t in (train.gemm, train.conv) if t.family in families and len(t)]
    if out_dir is not None and tables:
        keep_families(out_dir, {t.family for t in tables})
    for model, report in fit_tables(tables, opts, progress):
        models[model.family] = model
        reports.append(report)
    if not models:
        have = [t.family for t in (train.gemm, train.conv) if len(t)]
        raise UsageError("planner: error: no GEMM or convolution measurements to fit"
                         + (f" (the data have {' and '.join(have)} rows, which --only "
                            f"{', '.join(sorted(families))} leaves out)" if have else ""))
    bands = fit_bands(models, test)
    accuracy = evaluate(models, test, bands)
    seconds = time.perf_counter() - start
    outcome = FitOutcome(models, reports, accuracy, seconds=seconds)
    if out_dir is not None:
        files = " ".join([*(["--shipped-data"] if shipped else []), *(str(p) for p in paths),
                          *(f"--cluster {c}" for c in clusters)])
        extra = Extra(
            data=_provenance(paths, shipped),
            fit={"options": {"families": {f: _family_options(opts, f) for f in sorted(models)},
                             "l2": opts.l2,
                             "max_iter": opts.max_iter, "seed": opts.seed,
                             "group_power": opts.group_power,
                             "sweep_weight": opts.sweep_weight,
                             "sweep_limit": opts.sweep_limit},
                 "left_out_devices": left,
                 **({"clusters": [{"file": str(c), "sha256": sha256_file(c)}
                                  for c in clusters]} if clusters else {}),
                 "reports": [{"family": r.family, "rows": r.rows, "members": r.members,
                              "iterations": r.iterations,
                              "loss": round(r.loss, 6),
                              "devices": r.devices, "dropped_sweeps": r.dropped}
                             for r in reports],
                 # no wall times: the same files on the same machine give the same bytes
                 # (the fit prints its times)
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, numpy "
                            f"{np.__version__}"},
            accuracy={"what": "absolute percentage error on the held-out rows (split test) "
                              "of the training files",
                      "command": "planner kernels eval " + files
                                 + " --split test" + "".join(f" --exclude {d}" for d in left),
                      "results": [r.record() for r in accuracy]},
            error_bands=bands_record(bands, "planner kernels fit " + files
                                     + "".join(f" --leave-out {d}" for d in left)))
        outcome.files = save_models(out_dir, models, extra)
    return outcome


def keep_families(out_dir: str | Path, fitted: set[str], only: str | None = None) -> None:
    """Refuse, before fitting, to write over a model set with a family this fit does not
    write (``--only`` the other, or data without its rows): the new manifest would list
    only the families fitted, and the others' models would be lost."""
    others = sorted(existing_families(out_dir) - fitted)
    if not others:
        return
    head = f"planner: error: {Path(out_dir) / MANIFEST} has {' and '.join(others)} models that "
    if only is not None:
        raise UsageError(head + f"--only {only} would drop from it; write to another "
                         "directory (and fit both families to replace the set)")
    what = " and ".join({"gemm": "GEMM", "conv": "convolution"}.get(f, f) for f in others)
    raise UsageError(head + f"this fit would drop from it (the data give no {what} rows to "
                     "fit); write to another directory, or fit both families to replace the "
                     f"set (add {what} measurements, e.g. --shipped-data)")


def _family_options(opts: FitOptions, family: str) -> dict[str, Any]:
    resolved = opts.for_family(family)
    own, cross = resolved.pair_counts()
    return {"hidden": list(resolved.hidden or ()), "members": resolved.members,
            "monotone_weight": resolved.mono_weight, "monotone_pairs": own,
            "monotone_cross_pairs": cross,
            "monotone_cross_weight": resolved.mono_cross_weight}


def _worker_start(parent: int, devices: list[Any]) -> None:
    """A fit worker's start: it dies with the command that started it (Linux: a
    ``planner kernels fit`` killed by a signal it cannot catch left its workers fitting
    for minutes), and knows the devices a cluster file gave."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            # PR_SET_PDEATHSIG: SIGTERM this process when its parent exits
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it exited while this one started: nothing to fit for
        os._exit(1)
    register_devices(devices)


@contextlib.contextmanager
def _stopped_on_interrupt(pool: Any) -> Iterator[None]:
    """Stop ``pool``'s workers when the fit is interrupted (Ctrl-C sent to the command
    alone, not its process group, waited for the running fits: minutes)."""
    try:
        yield
    except BaseException:
        import signal

        # the pool's thread may still write to a stopped worker's pipe: that must not end
        # the command by SIGPIPE (the CLI restores its default action) before it exits
        if hasattr(signal, "SIGPIPE"):
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        raise


def fit_tables(tables: list[Table], opts: FitOptions,
               progress: Callable[[str], None] | None = None,
               ) -> list[tuple[Ensemble, FitReport]]:
    """Fit each table's ensemble, every member in a worker process with one BLAS thread
    (OpenBLAS's threads only slow these small matrix products down: 6× on two cores),
    members and families in parallel. Each fit is deterministic (member ``j`` starts
    from seed ``seed + j``), so the weights do not depend on the worker count.
    ``progress`` is told of each network as it finishes (in the order they finish)."""
    if not tables:
        return []
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    jobs: list[tuple[int, FitOptions]] = []
    for i, table in enumerate(tables):
        resolved = opts.for_family(table.family)
        assert resolved.members is not None
        jobs += [(i, replace(resolved, seed=resolved.seed + j))
                 for j in range(max(1, resolved.members))]
    # the longest fits first (GEMM: most rows), so the pool's tail is short
    order = sorted(range(len(jobs)), key=lambda j: -len(tables[jobs[j][0]]))
    saved = {k: os.environ.get(k) for k in BLAS_THREAD_VARS}
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARS, "1"))  # inherited by the workers
    try:
        ctx = multiprocessing.get_context("spawn")
        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        # the devices a cluster file gave (a GPU the catalog lacks), known in each worker
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                 initializer=_worker_start,
                                 initargs=(os.getpid(), registered_devices())) as pool, \
                _stopped_on_interrupt(pool):
            futures = {j: pool.submit(fit_family, tables[jobs[j][0]], jobs[j][1])
                       for j in order}
            if progress is not None:
                which = {f: j for j, f in futures.items()}
                count: dict[int, int] = {}
                for fut in as_completed(futures.values()):
                    i = jobs[which[fut]][0]
                    count[i] = count.get(i, 0) + 1
                    total = sum(1 for t, _ in jobs if t == i)
                    _, rep = fut.result()
                    progress(f"{tables[i].family}: network {count[i]} of {total} fitted "
                             f"({rep.iterations} iterations, {rep.seconds:.0f} s)")
            done = [futures[j].result() for j in range(len(jobs))]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out: list[tuple[Ensemble, FitReport]] = []
    for i in range(len(tables)):
        got = [done[j] for j in range(len(jobs)) if jobs[j][0] == i]
        members = tuple(m for m, _ in got)
        reports = [r for _, r in got]
        first = reports[0]
        out.append((Ensemble(members), FitReport(
            first.family, first.rows, max(r.iterations for r in reports),
            float(np.mean([r.loss for r in reports])), sum(r.seconds for r in reports),
            first.devices, first.dropped, members=len(members))))
    return out


def evaluate_files(paths: Sequence[str | Path], models: ModelSet,
                   split: str = "all", devices: Sequence[str] = (),
                   exclude: Sequence[str] = ()) -> list[Result]:
    """Per (device, op) errors of ``models`` on the CSV files."""
    return evaluate_report(paths, models, split, devices, exclude).results


def evaluate_report(paths: Sequence[str | Path], models: ModelSet,
                    split: str = "all", devices: Sequence[str] = (),
                    exclude: Sequence[str] = ()) -> Evaluation:
    """:func:`evaluate_files` with the rows it could not judge and the devices the
    roofline timed (:class:`.evaluate.Evaluation`)."""
    data = select(read_files(paths), split, canonical_devices(devices),
                  canonical_devices(exclude))
    if not len(data):
        raise UsageError("planner: error: no rows left to evaluate (check --split, "
                         "--device and --exclude)")
    return evaluate_all(dict(models.models), data, models.error_bands)


@dataclass(frozen=True)
class Achieved:
    """Achieved FP32 GEMM throughput of one device."""

    device: str
    n: int
    p95_fraction: float
    median_fraction: float
    peak_flops: float

    def record(self) -> dict[str, Any]:
        """Plain data."""
        return {"device": self.device, "n": self.n, "p95_fraction": round(self.p95_fraction, 3),
                "median_fraction": round(self.median_fraction, 3),
                "peak_flops": self.peak_flops}


def achieved_fractions(paths: Sequence[str | Path],
                       min_flops: float = 1e9) -> list[Achieved]:
    """Per device: FP32 GEMMs (not bmm) of at least ``min_flops``, every split pooled."""
    table: Table = read_files(paths).gemm
    out: list[Achieved] = []
    if not len(table):
        return out
    shape = table.shape_array()
    flops, _ = gemm_work(shape, np.full(len(table), 4.0))
    secs = np.asarray(table.seconds)
    dev = np.asarray(table.device, dtype=object)
    ok = (np.asarray(table.op, dtype=object) == "gemm") & \
        (np.asarray(table.dtype, dtype=object) == "float32") & (flops >= min_flops)
    for name in sorted(set(dev[ok])):
        sel = ok & (dev == name)
        device = lookup_device(name)
        assert device is not None
        peak = device.peak("fp32")
        frac = flops[sel] / secs[sel] / peak
        out.append(Achieved(name, int(sel.sum()), float(np.percentile(frac, 95)),
                            float(np.median(frac)), peak))
    return out


__all__ = ["SPLITS", "Achieved", "FitOutcome", "achieved_fractions", "evaluate_files",
           "evaluate_report", "fit_models", "fit_tables", "keep_families", "select"]
