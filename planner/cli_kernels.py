"""Commands for the hardware models: ``planner kernels ...`` and ``planner comm ...``."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from .cli import READ_META, Finite, Whole, check_output, emit, render_data
from .errors import UsageError, printable
from .loading import file_digest

TABLE_JSON = ("table", "json")
models_dir_option = click.option(
    "--models-dir", type=click.Path(file_okay=False), default=None,
    help="Model directory (default: $PLANNER_MODELS, else the models shipped with planner).")


def _register_clusters(ctx: click.Context, param: click.Parameter,
                       value: tuple[str, ...]) -> tuple[str, ...]:
    """Load each cluster file and make its device known by name to this command."""
    from .cluster import register_devices
    from .inputs import load_cluster

    register_devices(load_cluster(path).device for path in value)
    ctx.meta[READ_META] = (*ctx.meta.get(READ_META, ()), *value)  # not to be replaced by -o
    return value


cluster_option = click.option(
    "--cluster", "clusters", multiple=True, type=click.Path(dir_okay=False),
    callback=_register_clusters, expose_value=False, is_eager=True, metavar="CLUSTER.yaml",
    help="A cluster file whose device the measurements may name (repeatable): a GPU the "
         "catalog lacks, defined by its specs there, as `plan` will read it.")


def _kernel_label(kernel: Any) -> str:
    """A kernel as a person reads it: ``GEMM 8 x 8 x 8 (M x N x K)``, ``bmm of 4 ...``,
    ``convolution backward-data, batch 8, 64 -> 128 channels, 56 x 56, 3 x 3 filters,
    stride 1, padding 1``."""
    from .ops import Gemm

    if isinstance(kernel, Gemm):
        dims = f"{kernel.m:,} x {kernel.n:,} x {kernel.k:,} (M x N x K)"
        return f"bmm of {kernel.batch:,} GEMMs {dims}" if kernel.batch > 1 else f"GEMM {dims}"
    phase = {"fwd": "forward", "bwd_data": "backward-data",
             "bwd_filter": "backward-filter"}.get(kernel.phase, kernel.phase)
    return (f"convolution {phase}, batch {kernel.n:,}, {kernel.c:,} -> {kernel.k:,} "
            f"channels, {kernel.h:,} x {kernel.w:,}, {kernel.r} x {kernel.s} filters, stride "
            f"{kernel.stride_h}, padding {kernel.pad_h}")


def _span(lo: float, hi: float) -> str:
    """A range of times in the unit :func:`~planner.units.format_time` gives its upper
    end, four significant digits each: ``2.561–3.237 ms``."""
    from planner.units import format_time

    number, unit = format_time(hi).split(" ")
    scale = {"ps": 1e12, "ns": 1e9, "µs": 1e6, "ms": 1e3}.get(unit, 1.0)
    return f"{lo * scale:.4g}–{number} {unit}"


def _results_table(results: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    banded = any(r.get("in_band") is not None for r in results)
    table = Table(title=title, title_justify="left")
    names = ["device", "op", "n", "MAPE %", "median %", "p90 %", "out of range"]
    for name in names + (["in 90% band %"] if banded else []):
        table.add_column(name, justify="left" if name in ("device", "op") else "right")
    for r in results:
        cells = [r["device"], r["op"], str(r["n"]), f"{r['mape']:.1f}",
                 f"{r['median_ape']:.1f}", f"{r['p90_ape']:.1f}", str(r["out_of_range"])]
        if banded:
            cells.append("" if r.get("in_band") is None else f"{r['in_band']:.1f}")
        table.add_row(*cells)
    return table


def _widths(ctx: click.Context, param: click.Parameter,
            value: str | None) -> tuple[int, ...] | None:
    """``--hidden 32,32`` → (32, 32); each width 1 to 1,024, one to four layers."""
    if value is None:
        return None
    try:
        widths = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected widths separated by commas, e.g. "
                                 "32,32") from None
    if not 1 <= len(widths) <= 4 or not all(1 <= w <= 1024 for w in widths):
        raise click.BadParameter(f"{value!r}: one to four widths, each 1 to 1024")
    return widths


@click.group()
def kernels() -> None:
    """Kernel-time models: fit, eval, predict, profile, achieved.

    The models predict the achieved fraction of the roofline bound of GEMMs, batched
    GEMMs and convolutions (forward, backward-data, backward-filter) from the shape and
    the GPU's datasheet specs; see the README section 'Hardware models'.
    """


shipped_option = click.option(
    "--shipped-data", "shipped", is_flag=True,
    help="Also read the measurements the shipped models were fitted on (NeuSight, DeepBench "
         "and the H100 and H200 profiles; they ship with planner), before DATA.")


def _with_shipped(data: tuple[str, ...], shipped: bool,
                  ) -> tuple[list[tuple[str, Path]], tuple[str, ...]]:
    """The shipped training files (when asked for) and the user's files not among them."""
    from .kernels.store import shipped_training_data

    if not data and not shipped:
        raise UsageError("planner: error: give measurement CSV files (DATA...), "
                         "--shipped-data, or both")
    files = shipped_training_data() if shipped else []
    rest = tuple(d for d in data if not any(
        os.path.exists(d) and os.path.samefile(d, path) for _, path in files))
    return files, rest


def _all_files(data: tuple[str, ...], shipped: bool) -> tuple[str, ...]:
    """The files a reading command reads: the shipped ones (when asked for), then DATA."""
    files, rest = _with_shipped(data, shipped)
    return (*(str(p) for _, p in files), *rest)


@kernels.command("fit")
@click.argument("data", nargs=-1, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write manifest.yaml and the weights into.")
@shipped_option
@cluster_option
@click.option("--leave-out", multiple=True, metavar="DEVICE",
              help="Fit without any row of this GPU (repeatable): leave-one-GPU-out.")
@click.option("--max-iter", type=Whole(1, 100_000), default=None,
              help="L-BFGS iterations per model (default 1000).")
@click.option("--seed", type=Whole(0, 2**32 - 1), default=0, show_default=True,
              help="Weight init seed.")
@click.option("--only", type=click.Choice(("gemm", "conv")), default=None,
              help="Fit one family only (GEMM and bmm, or the convolution passes).")
@click.option("--members", type=Whole(1, 64), default=None,
              help="Networks per family, averaged (default: 1 for GEMM, 10 for "
                   "convolutions; more cost fit time, not accuracy on plenty of shapes).")
@click.option("--hidden", callback=_widths, default=None, metavar="W[,W...]",
              help="Hidden layer widths of each network, e.g. 32,32 (default: 32,32 for "
                   "GEMM, 16,16 for convolutions).")
@click.option("--monotone-weight", type=Finite(0.0, 1e6), default=None,
              help="Weight of the penalty on kernels predicted slower than the same "
                   "kernel with one dimension doubled (0: none; default 10 for GEMM, 1 "
                   "for convolutions).")
@click.option("--monotone-cross-weight", type=Finite(0.0, 1e6), default=None,
              help="Weight of the same penalty on kernels drawn across the range the "
                   "model answers for (GEMM: M, N, K log-uniform; convolutions: measured "
                   "shapes), on every GPU of the fit, so a GPU measured only on large "
                   "kernels is regularised below them too; independent of "
                   "--monotone-weight (0: none; default 10 for GEMM, 0 for convolutions).")
@click.option("--format", "fmt", type=click.Choice(TABLE_JSON), default="table",
              show_default=True, help="How to print the held-out accuracy.")
@click.option("--replace-shipped", is_flag=True,
              help="Allow -o to name the models planner ships with (a checkout's models/), "
                   "which time every plan: how the project rebuilds them.")
def kernels_fit(data: tuple[str, ...], out_dir: str, shipped: bool,
                leave_out: tuple[str, ...], max_iter: int | None, seed: int, only: str | None,
                members: int | None, hidden: tuple[int, ...] | None,
                monotone_weight: float | None, monotone_cross_weight: float | None,
                fmt: str, replace_shipped: bool) -> None:
    """Fit the kernel-time models on measurement CSVs and write them to a directory.

    Rows of each file's held-out split (30% of shapes by CRC-32; NeuSight's own 'train'
    rows are never held out) are not used for fitting: their accuracy is printed and
    recorded in the manifest. Deterministic: the same files give the same weights.
    To calibrate to your GPU: `planner kernels profile -o mine.csv`, then
    `planner kernels fit --shipped-data mine.csv -o mymodels`.
    """
    from .kernels.pipeline import fit_models
    from .kernels.store import shipped_dir
    from .kernels.train import FitOptions

    files, data = _with_shipped(data, shipped)
    into_shipped = bool(out_dir) and Path(out_dir).is_dir() and \
        os.path.samefile(out_dir, shipped_dir())
    if into_shipped and files:
        raise UsageError(f"planner: error: refusing to write into {out_dir}: it holds the "
                         "shipped models that --shipped-data reads; choose another folder")
    if into_shipped and not replace_shipped:
        raise UsageError(f"planner: error: refusing to write into {out_dir}: it holds the "
                         "models planner ships with, which time every plan; choose another "
                         "folder (and give it to plan as --models-dir or $PLANNER_MODELS), "
                         "or pass --replace-shipped to rebuild them")
    _check_model_dir(out_dir, (*data, *(str(p) for _, p in files)))
    if only is not None:
        from .kernels.pipeline import keep_families

        # refused before minutes of fitting
        keep_families(out_dir, {only}, only)
    opts = FitOptions(seed=seed, members=members, hidden=hidden, mono_weight=monotone_weight,
                      mono_cross_weight=monotone_cross_weight)
    if max_iter is not None:
        opts = replace(opts, max_iter=max_iter)
    outcome = fit_models(data, out_dir, leave_out, opts,
                         (only,) if only else ("gemm", "conv"), files,
                         lambda line: click.echo(line, err=True),
                         click.get_current_context().meta.get(READ_META, ()))
    for rep in outcome.reports:
        nets = f"{rep.members} networks, " if rep.members > 1 else ""
        click.echo(f"fitted {rep.family}: {rep.rows} rows, {nets}{rep.iterations} iterations, "
                   f"loss {rep.loss:.4f}, {rep.seconds:.1f} s"
                   + (f"; dropped sweeps {rep.dropped}" if rep.dropped else ""), err=True)
    click.echo(f"wrote {', '.join(str(p) for p in outcome.files)} "
               f"({outcome.seconds:.1f} s in all)", err=True)
    results = [r.record() for r in outcome.accuracy]
    render_data({"results": results}, fmt, None,
                lambda: _results_table(results, "held-out accuracy (split test)") if results
                else "held-out accuracy: no held-out rows (every row of these files was "
                     "used for fitting, as in NeuSight's 'train' split)")


def _check_model_dir(out_dir: str, data: tuple[str, ...]) -> None:
    """Refuse, before fitting, an output folder that cannot be one (empty, a file, under
    a file) or whose model files would replace a training file."""
    from .kernels.store import MANIFEST

    if not out_dir.strip():
        raise click.BadParameter("needs a folder name", param_hint="'-o'")
    path = Path(out_dir)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise click.BadParameter(f"{part} is not a folder; -o names the folder the "
                                     "models are written to", param_hint="'-o'")
    for name in (MANIFEST, "gemm.npz", "conv.npz"):
        target = path / name
        if target.exists() and any(os.path.exists(d) and os.path.samefile(target, d)
                                   for d in data):
            raise UsageError(f"planner: error: refusing to write {target}: it is one of the "
                             "training files; choose another output folder")
    manifest = path / MANIFEST
    if manifest.is_file() and not _is_model_manifest(manifest):
        # a folder's manifest.yaml of something else: the fit would replace it
        raise UsageError(f"planner: error: refusing to write {manifest}: it is not the "
                         "manifest of a planner model set (kind: planner-kernel-models), "
                         "and the fit would replace it; choose another output folder")


def _is_model_manifest(path: Path) -> bool:
    """Whether a manifest.yaml is planner's (its kind line near the top; a damaged one
    of planner's may be refitted over)."""
    import re

    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return re.search(rb"^kind:\s*['\"]?planner-kernel-models", head, re.M) is not None


@kernels.command("eval")
@click.argument("data", nargs=-1, type=click.Path(dir_okay=False))
@shipped_option
@cluster_option
@models_dir_option
@click.option("--split", type=click.Choice(("all", "train", "test")), default="all",
              show_default=True, help="test: the held-out rows; train: the others.")
@click.option("--device", "devices", multiple=True, metavar="DEVICE",
              help="Only rows of this GPU (repeatable).")
@click.option("--exclude", multiple=True, metavar="DEVICE",
              help="Leave out rows of this GPU (repeatable).")
@click.option("--format", "fmt", type=click.Choice((*TABLE_JSON, "yaml")), default=None,
              help="table for a person; json or yaml for programs. Default: what the -o "
                   "file's suffix says (.json, .yaml, .yml), else table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, help="Write to this file instead of stdout.")
def kernels_eval(data: tuple[str, ...], shipped: bool, models_dir: str | None, split: str,
                 devices: tuple[str, ...], exclude: tuple[str, ...], fmt: str | None,
                 output: str | None) -> None:
    """Accuracy of the models on measurement CSVs, per device and op.

    Prints the row count, the mean absolute percentage error (MAPE), the median and
    90th-percentile absolute percentage errors, and the share of rows whose measured time
    is within the error band the models recorded for kernels like it (about 90% on data
    like the held-out rows they were cut from). Rows of a device the models have no
    measurements of and do not time (a CPU) are timed by the roofline, as plans on it
    are; rows of a family the models lack are left out; both are said in notes. JSON:
    {"results": [{"device", "op", "n", "mape", "median_ape", "p90_ape", "out_of_range",
    "in_band"}, ...], "skipped": {FAMILY: ROWS}, "roofline_devices": [...], "notes": [...]}.
    """
    from .cluster import lookup_device
    from .kernels.pipeline import evaluate_report
    from .kernels.store import load_models

    data = _all_files(data, shipped)
    models = load_models(models_dir)
    # the models read are inputs too: -o must not replace their manifest or weights
    protect = (*data, *(str(p) for p in sorted(Path(models.directory).iterdir())
                        if p.is_file()))
    check_output(output, protect)
    report = evaluate_report(data, models, split, devices, exclude)
    results = [r.record() for r in report.results]
    have = ", ".join(sorted(models.models)) or "no"
    if not results:
        raise UsageError(f"planner: error: the models in {models.directory} time none of "
                         f"these rows (they have {have} models); fit the missing family "
                         "with `planner kernels fit`")
    notes: list[str] = []
    for family, rows in sorted(report.skipped.items()):
        what = "GEMM and bmm" if family == "gemm" else "convolution"
        notes.append(f"{rows:,} {what} row{'s' if rows > 1 else ''} left out: the models in "
                     f"{models.directory} have no {family} model (they have {have}); fit "
                     "it with `planner kernels fit` to judge them")
    for name in report.roofline:
        dev = lookup_device(name)
        kind = dev.kind if dev is not None else "device"
        notes.append(f"{name} is a {kind} the models have no measurements of: its rows are "
                     "timed by the roofline at its achievable fractions of peak and "
                     "bandwidth, as plans on it are (fit a model on its measurements to "
                     "time it)")
    for line in notes:
        click.echo(f"planner: note: {line}", err=True)
    render_data({"results": results, "skipped": dict(sorted(report.skipped.items())),
                 "roofline_devices": report.roofline, "notes": notes}, fmt, output,
                lambda: _results_table(results, f"kernel-time error (split {split}, models "
                                                f"{models.directory})"), protect)


def _ints(text: str, n_min: int, n_max: int, what: str) -> list[int]:
    hint = "--gemm" if what.startswith("M,") else "--conv"
    try:
        vals = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected {what}, comma-separated integers",
                                 param_hint=hint) from None
    if not n_min <= len(vals) <= n_max:
        raise click.BadParameter(f"expected {what}: {n_min} to {n_max} numbers, got "
                                 f"{len(vals)}", param_hint=hint)
    if max(vals) > 2**40:
        raise click.BadParameter(f"{max(vals):,} is too large (at most 2^40 = {2**40:,})",
                                 param_hint=hint)
    return vals


@kernels.command("predict")
@click.option("--device", "device_name", required=True, help="A catalog GPU (see `planner "
              "devices`), or the device of a --cluster file.")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(("float32", "float16", "bfloat16", "float64", "fp32", "fp16",
                                 "bf16", "fp64")))
@click.option("--gemm", "gemm", default=None, metavar="M,N,K[,BATCH]",
              help="A GEMM C[M,N] = A[M,K]·B[K,N], BATCH products (bmm).")
@click.option("--conv", "conv", default=None, metavar="N,C,H,W,K,R,S[,STRIDE[,PAD]]",
              help="A convolution: batch N, C×H×W input, K filters R×S.")
@click.option("--phase", type=click.Choice(("fwd", "bwd_data", "bwd_filter")),
              default=None, help="The convolution pass (default: fwd; --conv only).")
@cluster_option
@models_dir_option
@click.option("--format", "fmt", type=click.Choice(("table", "json", "yaml")),
              default="table", show_default=True)
def kernels_predict(device_name: str, dtype: str, gemm: str | None, conv: str | None,
                    phase: str | None, models_dir: str | None, fmt: str) -> None:
    """Predict the time of one GEMM or convolution on one GPU."""
    from .cluster import lookup_device, suggest_device
    from .kernels.data import DTYPE_NAMES
    from .kernels.estimator import LearnedEstimator
    from .ops import Conv, Gemm

    dev = lookup_device(device_name)
    if dev is None:
        hint = suggest_device(device_name)
        raise UsageError(f"planner: error: unknown device {device_name!r}"
                         + (f"; did you mean '{hint}'?" if hint else "")
                         + " (`planner devices` lists the catalog; a GPU it lacks is "
                           "defined in a cluster file and given with --cluster)")
    if (gemm is None) == (conv is None):
        raise UsageError("planner: error: give exactly one of --gemm M,N,K[,BATCH] and "
                         "--conv N,C,H,W,K,R,S[,STRIDE[,PAD]]")
    kernel: Gemm | Conv
    if gemm is not None and phase is not None:
        raise UsageError("planner: error: --phase is a convolution's pass; a GEMM has none "
                         "(its backward products are GEMMs too: predict them with --gemm)")
    if gemm is not None:
        g = _ints(gemm, 3, 4, "M,N,K[,BATCH]")
        if min(g) < 1:
            raise UsageError("planner: error: GEMM dimensions must be at least 1")
        kernel = Gemm(g[0], g[1], g[2], g[3] if len(g) > 3 else 1)
    else:
        assert conv is not None
        c = _ints(conv, 7, 9, "N,C,H,W,K,R,S[,STRIDE[,PAD]]")
        stride = c[7] if len(c) > 7 else 1
        pad = c[8] if len(c) > 8 else 0
        if min(c[:7]) < 1 or stride < 1:
            raise UsageError("planner: error: convolution sizes and stride must be at least 1")
        if pad < 0:
            raise UsageError("planner: error: convolution padding must be 0 or more")
        kernel = Conv(c[0], c[1], c[2], c[3], c[4], c[5], c[6], stride, stride, pad, pad,
                      phase=phase or "fwd")  # type: ignore[arg-type]
        if kernel.out_h < 1 or kernel.out_w < 1:
            raise UsageError("planner: error: the filter is larger than the padded input")
    dt = DTYPE_NAMES[dtype]
    est = LearnedEstimator(models_dir=models_dir)
    if not est.covers(dev):
        raise UsageError(f"planner: error: {dev.name} is a {dev.kind}; the kernel models were "
                         "fitted on GPU measurements and have none of it (plans on it use "
                         "the roofline; fit a model on its measurements to time it)")
    pred = est.explain(kernel, dev, dt)
    rec = {"device": dev.name, "dtype": dt, "kernel": kernel.op, **pred.record()}

    def table() -> Any:
        from rich.table import Table

        from planner.units import format_time

        t = Table(show_header=False, title=f"{_kernel_label(kernel)} on {dev.name} ({dt})",
                  title_justify="left")
        t.add_column("what")
        t.add_column("value", justify="right")
        t.add_row("predicted time", format_time(pred.seconds))
        t.add_row("timed by", pred.source)
        t.add_row("roofline bound (datasheet)", format_time(pred.bound_s))
        t.add_row("achieved fraction of the bound", f"{pred.bound_s / pred.seconds:.3g}")
        if pred.sustained_fraction is not None:
            t.add_row("GPU's sustained fraction of peak",
                      f"{pred.sustained_fraction:.3f} ("
                      + ("the achievable fraction the roofline used"
                         if pred.by_roofline else "fitted on its measurements"
                         if pred.gpu_seen else "from its datasheet: unseen GPU") + ")")
        if pred.interval_s is not None:
            lo, hi = pred.interval_s
            t.add_row("90% of held-out kernels like it",
                      f"{_span(lo, hi)} ({pred.interval_rows:,} rows"
                      + ("" if pred.gpu_seen else "; seen GPUs only") + ")")
        t.add_row("within training range", "yes" if pred.in_range else "no")
        if pred.scale > 1.0:
            t.add_row("scaled", f"timed on 1/{pred.scale:,.4g} of its work, × {pred.scale:,.4g}")
        elif pred.scale < 1.0:
            t.add_row("padded", f"timed as a kernel with {1 / pred.scale:,.4g}× its work, the "
                                "smallest the model answers for (launch-bound: not scaled "
                                "down)")
        return t

    render_data(rec, fmt, None, table)


@kernels.command("profile")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="CSV file to write (the layout `kernels fit` and `eval` read).")
@click.option("--device", "device", type=click.Choice(("cuda", "cpu")), default="cuda",
              show_default=True, help="Where to run the kernels.")
@click.option("--dtype", type=click.Choice(("float32", "float16", "bfloat16")),
              default="float32", show_default=True)
@click.option("--quick", is_flag=True, help="A small sweep (seconds; for trying it out).")
@click.option("--repeats", type=Whole(1, 100_000), default=None,
              help="Timed calls per shape (default 50 on a GPU, 3 on a CPU).")
@click.option("--name", default=None, help="Device name written to the CSV (default: what "
              "PyTorch reports); fit and eval read a catalog name or alias, or the "
              "device name of a cluster file they are given with --cluster.")
@click.option("--shapes", "shape_files", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="Time the kernels of this CSV instead of the built-in "
              "sweep (repeatable): any layout `fit` reads (NeuSight, DeepBench, a profile), "
              "its devices, dtypes and times ignored, or the profile layout's `op` and "
              "shape columns alone.")
@click.option("--only", type=click.Choice(("gemm", "conv")), default=None,
              help="Time one family only (GEMM and bmm, or the convolution passes).")
@click.option("--max-kernels", type=Whole(1, 10**7), default=None,
              help="Time at most this many kernels (the first ones).")
def kernels_profile(output: str, device: str, dtype: str, quick: bool, repeats: int | None,
                    name: str | None, shape_files: tuple[str, ...], only: str | None,
                    max_kernels: int | None) -> None:
    """Measure GEMM, bmm and convolution times with PyTorch over a shape sweep.

    Needs PyTorch (`pip install 'planner[torch]'`). Then calibrate the models to your
    hardware: `planner kernels fit FILE.csv ... -o mymodels`. With `--shapes
    models/data/deepbench/deepbench_conv.csv` it times DeepBench's convolutions (all
    three passes), so your GPU can be compared with DeepBench's row for row.
    """
    from .kernels.data import read_shapes
    from .kernels.profile import profile_rows, shapes_of, sweep, to_csv

    if quick and shape_files:
        raise UsageError("planner: error: --quick and --shapes choose the shapes two ways; "
                         "give one")
    check_output(output, shape_files)  # before minutes of measuring
    if shape_files:
        shapes = shapes_of(read_shapes(shape_files), only)
        if not shapes:
            raise UsageError(f"planner: error: no {only} kernels in "
                             f"{', '.join(shape_files)}")
    else:
        shapes = sweep(quick, only)
    shapes = shapes[:max_kernels] if max_kernels is not None else shapes

    def progress(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            click.echo(f"profiled {done}/{total} shapes", err=True)

    from .cluster import lookup_device

    notes: list[str] = []
    rows = list(profile_rows(device, dtype, quick, repeats, name, progress, notes, shapes))
    emit(to_csv(rows), output, shape_files)
    for unknown in sorted({r["device"] for r in rows}):  # the one name the rows carry
        if lookup_device(unknown) is None:
            notes.append(f"'{unknown}' is not in the device catalog: define it in a cluster "
                         f"file (a `device:` mapping of its specs, with `aliases: "
                         f"[{unknown}]`) and give that file to `kernels fit` and `eval` "
                         "with --cluster")
    for line in notes:
        click.echo(f"planner: note: {line}", err=True)


@kernels.command("achieved")
@click.argument("data", nargs=-1, type=click.Path(dir_okay=False))
@shipped_option
@cluster_option
@click.option("--min-gflop", type=Finite(0, None), default=1.0, show_default=True,
              help="Only GEMMs of at least this many GFLOP.")
@click.option("--format", "fmt", type=click.Choice(TABLE_JSON), default="table",
              show_default=True)
def kernels_achieved(data: tuple[str, ...], shipped: bool, min_gflop: float,
                     fmt: str) -> None:
    """Per device, the 95th percentile of achieved FP32 GEMM FLOP/s over the catalog peak.

    Pools every file and split; bmm rows are not counted. This is the figure the device
    catalog's `achievable.compute` cites.
    """
    from .kernels.pipeline import achieved_fractions

    data = _all_files(data, shipped)
    recs = [a.record() for a in achieved_fractions(data, min_gflop * 1e9)]
    if not recs:
        raise UsageError(f"planner: error: no FP32 GEMM (bmm rows are not counted) of at "
                         f"least {min_gflop:g} GFLOP in {', '.join(data)}")

    def table() -> Any:
        from rich.table import Table

        t = Table(title=f"FP32 GEMMs of ≥ {min_gflop:g} GFLOP: achieved / catalog peak",
                  title_justify="left")
        for col in ("device", "n", "p95", "median", "peak TFLOP/s"):
            t.add_column(col, justify="left" if col == "device" else "right")
        for r in recs:
            t.add_row(r["device"], str(r["n"]), f"{r['p95_fraction']:.3f}",
                      f"{r['median_fraction']:.3f}", f"{r['peak_flops'] / 1e12:.1f}")
        return t

    render_data({"devices": recs}, fmt, None, table)


@click.group()
def comm() -> None:
    """Collective-communication calibration."""


def _once(files: tuple[str, ...], notes: list[str]) -> tuple[str, ...]:
    """The files, each read once: the same file named twice (by any path) would count
    its rows twice in the fit."""
    kept: list[str] = []
    digests: dict[str, str] = {}  # sha256 of a file's bytes -> the first file with them
    for f in files:
        twin = next((k for k in kept if f != "-" and k != "-" and Path(f).exists()
                     and Path(k).exists() and os.path.samefile(f, k)), None)
        if twin is not None:
            notes.append(f"{f} is named twice, read once" if f == twin else
                         f"{f} is {twin}, read once")
            continue
        digest = _digest(f)
        if digest is not None and digest in digests:
            notes.append(f"{f} has the same contents as {digests[digest]}, read once")
            continue
        if digest is not None:
            digests[digest] = f
        kept.append(f)
    return tuple(kept)


def _digest(path: str) -> str | None:
    """The sha256 of a regular, non-empty file's bytes; None for standard input and for
    what cannot be read (the reader reports that at its line)."""
    p = Path(path)
    try:
        if path == "-" or not p.is_file() or not p.stat().st_size:
            return None
        return file_digest(path)
    except OSError:
        return None


def _warn_other_machine(fit: Any, data: dict[str, Any], cluster_path: str) -> None:
    """A warning when the measurements ran more ranks in one node than the cluster file
    has devices a node (or several nodes with another count a node): its tiers would be
    another machine's."""
    from .cluster import lookup_device

    # the GPU measured (nccl-tests' device name, a catalog alias) against the file's
    # device: H100 NVLink tiers written into a P100 PCIe cluster file said nothing (an
    # audit, 2026-12-07); a name the catalog lacks, or an inline device, is not judged
    measured = lookup_device(str(fit.system))
    named = data.get("device")
    listed = lookup_device(named) if isinstance(named, str) else None
    if measured is not None and listed is not None and measured.name != listed.name:
        click.echo(f"planner: warning: the measurements ran on {measured.name} "
                   f"({printable(str(fit.system))}); {cluster_path}'s device is "
                   f"{listed.name}: its tiers are fitted to another machine", err=True)
    per_node = data.get("devices_per_node")
    if not isinstance(per_node, int) or isinstance(per_node, bool):
        return
    one = [e.ranks for e in fit.errors if e.nodes == 1]
    many = {e.ranks // e.nodes for e in fit.errors if e.nodes > 1 and e.ranks % e.nodes == 0}
    if one and max(one) > per_node:
        click.echo(f"planner: warning: the measurements ran {max(one)} ranks in one node; "
                   f"{cluster_path} has {per_node} device{'s' if per_node > 1 else ''} a "
                   "node: its intra-node tier is fitted to another machine", err=True)
    elif many and many != {per_node}:
        click.echo(f"planner: warning: the measurements ran "
                   f"{'/'.join(str(n) for n in sorted(many))} ranks a node across nodes; "
                   f"{cluster_path} has {per_node} devices a node: its tiers are fitted to "
                   "another machine", err=True)


@comm.command("fit")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False), default=None,
              help="Write this cluster file (to -o or standard output; the file itself is "
                   "not changed) with its network tiers replaced by the fit.")
@click.option("--system", default=None, help="Which system of the files to write (a "
              "substring of its name) when they hold several.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, help="Write the YAML here instead of stdout (never an input).")
@click.option("--format", "fmt", type=click.Choice(("yaml", "json")), default=None,
              help="yaml: the network section (or cluster file); json: the whole fit "
                   "report. Default: json for an -o file ending in .json, else yaml.")
def comm_fit(files: tuple[str, ...], cluster_path: str | None, system: str | None,
             output: str | None, fmt: str | None) -> None:
    """Fit network latency and bandwidth to measured collectives.

    Reads nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf),
    DeepBench's all-reduce CSV and the 8×H200 sweep CSV. Single-node rows fit the
    intra-node tier (NCCL's ring), multi-node rows the inter-node tier as a plan prices
    them (the cluster's collectives.algorithm, by default the fastest of NCCL's ring and
    tree and the hierarchical all-reduce); NVLS rows fit the intra-node `nvls:`
    sub-section. Prints the fit and its error per (system,
    collective, ranks) on stderr; writes the fitted `network:` section as YAML, or with
    --cluster the cluster file with its fitted tiers replaced in place.
    """
    from .cli import format_for
    from .cluster import PLAUSIBLE
    from .commfit import (
        choose,
        fit_all,
        mark_tiers,
        merge_cluster,
        read_samples,
        validate_network,
    )
    from .output import to_json, to_yaml

    if fmt is None:
        fmt = "json" if format_for(output) == "json" else "yaml"
    if fmt == "json" and cluster_path is not None:
        raise UsageError("planner: error: --cluster writes a cluster file (YAML); --format "
                         "json is the fit report: give one of them")
    protect = (*files, *([cluster_path] if cluster_path else []))
    check_output(output, protect)
    algorithm, library = "auto", None
    if cluster_path is not None:
        # a file that is not a cluster is refused before the fit's report is printed
        # (found by an audit); its network section is checked once the fit fills it
        from .cluster import ALGORITHMS, LIBRARIES
        from .inputs import cluster_kind_issue
        from .loading import load_file

        doc = load_file(cluster_path)
        issue = cluster_kind_issue(doc)
        if issue is not None:
            raise doc.error([issue])
        # the fit is judged, and across nodes made, as the file prices collectives
        # (its `collectives:`; an invalid one is reported once the file is checked)
        coll = doc.data.get("collectives") if isinstance(doc.data, dict) else None
        if isinstance(coll, dict):
            if coll.get("algorithm") in ALGORITHMS:
                algorithm = coll["algorithm"]
            if coll.get("library") in LIBRARIES:
                library = coll["library"]
    notes: list[str] = []
    files = _once(files, notes)
    fits = fit_all(read_samples(files, notes), algorithm, library)
    for note in notes:
        click.echo(f"planner: note: {note}", err=True)
    warned: dict[int, list[str]] = {}  # id of a fit -> its warnings, for the JSON notes
    for f in fits:
        where = f"{f.system!r} in {', '.join(f.files)}"
        if f.intra is None and f.inter is None:
            raise UsageError(f"planner: error: nothing to fit for {where}: a tier needs "
                             "measurements over more than one rank at two message sizes "
                             "or more")
        for tier in (f.intra, f.inter, f.nvls):
            if tier is None:
                continue
            bws = [tier.bandwidth, *(bw for _, bw in tier.by_group)]
            if not all(math.isfinite(bw) and bw > 0 for bw in bws):
                raise UsageError(
                    f"planner: error: no bandwidth fits the {tier.tier} tier of {where}: "
                    "its times do not grow with the message size (measure a wider range "
                    "of sizes, from a few KiB to a few hundred MiB)")
            if tier.latency_bound:
                # a sweep cut short, or an all-reduce sweep NCCL ran as NVLS from 1 MiB
                # up: every ring size is latency-bound, and the bandwidth is whatever the
                # noise makes it (8e15 GB/s from 1-16 KiB on NVLink)
                why = (f"the {tier.tier} tier of {where} is latency-bound at every size "
                       f"measured (the bytes take at most {tier.bandwidth_share:.0%} of a "
                       "row's fitted time), so its bandwidth is not determined: measure "
                       "larger messages, up to a few hundred MiB (nccl-tests -e 512M); on "
                       "NVSwitch systems, where NCCL runs large all-reduces as NVLS, "
                       "all_gather_perf or reduce_scatter_perf, whose rings it keeps")
                if max(bws) > PLAUSIBLE["bandwidth"][2]:
                    raise UsageError(f"planner: error: {why}")
                click.echo(f"planner: warning: {why}", err=True)
                warned.setdefault(id(f), []).append(why)  # and a mark in the YAML written
    if system is not None or cluster_path is not None:
        # one system for a cluster file: refused here, before the report is printed
        fits = [choose(fits, system)]
    for f in fits:
        for note in f.notes:
            click.echo(f"planner: note: {note}", err=True)
    _print_comm(fits, algorithm)
    if fmt == "json":
        # the reader's notes too (rows with wrong results left out, a run with no table):
        # a report written to a file would otherwise lose them to the terminal
        systems = [f.record() for f in fits]
        for f, rec in zip(fits, systems, strict=True):  # the warnings too (an audit)
            rec["notes"] = [*rec["notes"], *warned.get(id(f), [])]
        emit(to_json({"systems": systems, "notes": notes}), output, protect)
        return
    # the command that writes this file again (its --system and --cluster too)
    again = [shlex.quote(printable(f)) for f in files]
    if system is not None:
        again += ["--system", shlex.quote(printable(system))]
    if cluster_path is not None:
        again += ["--cluster", shlex.quote(printable(cluster_path))]
    header = "# Fitted by `planner comm fit " + " ".join(again) + "`\n"
    if cluster_path is not None:
        fit = choose(fits, system)
        merged = merge_cluster(cluster_path, fit)
        validate_network(merged.data, cluster_path)
        _warn_other_machine(fit, merged.data, cluster_path)
        for note in merged.notes:
            click.echo(f"planner: note: {note}", err=True)
        if not merged.in_place:
            click.echo(f"planner: note: {cluster_path} is written from its data (its "
                       "comments are not kept): its network section cannot be edited in "
                       "place", err=True)
        emit((header + f"# from {printable(cluster_path)}, network tiers fitted to "
              f"'{printable(fit.system)}'\n").replace("\n", merged.newline)
             + mark_tiers(merged.text, fit), output, protect)
        return
    # a latency-bound tier is marked where it is written: its bandwidth is not determined
    if len(fits) == 1:
        emit(header + f"# system: {printable(fits[0].system)}\n"
             + mark_tiers(to_yaml({"network": fits[0].network()}), fits[0]), output, protect)
        return
    text = to_yaml({"systems": {f.system: {"network": f.network()} for f in fits}})
    for f in fits:
        text = mark_tiers(text, f, ("systems", f.system))
    emit(header + text, output, protect)


def _print_comm(fits: list[Any], algorithm: str) -> None:
    from rich.table import Table

    from .cli import console, print_fitted

    across = ("NCCL's ring" if algorithm == "ring" else
              f"the planner's '{algorithm}' choice of algorithm")
    tiers = Table(title="fitted tiers (intra: NCCL's ring; inter: " + across
                        + "; NVLS: in-switch all-reduce, its algorithm bandwidth)",
                  title_justify="left")
    for col in ("system", "tier", "latency", "bandwidth", "rows", "from"):
        tiers.add_column(col, justify="right" if col in ("rows", "latency", "bandwidth")
                         else "left")
    errs = Table(title=f"planner's error with the fitted tiers (collectives: {{algorithm: "
                       f"{algorithm}}}, as a plan prices them)", title_justify="left")
    for col in ("system", "collective", "ranks", "nodes", "n", "MAPE %", "max %"):
        errs.add_column(col, justify="left" if col in ("system", "collective") else "right")
    for f in fits:
        for t in (f.intra, f.nvls, f.inter):
            if t is None:
                continue
            since = f"≥ {t.min_bytes / 2**20:g} MiB" if t.min_bytes else ""
            if t.by_group:
                since = "by group size: " + ", ".join(
                    f"{n}: {bw / 1e9:.2f}" for n, bw in t.by_group) + " GB/s"
            tiers.add_row(f.system, t.tier, f"{t.latency_s * 1e6:.2f} µs",
                          f"{t.bandwidth / 1e9:.2f} GB/s", str(t.rows), since)
        for e in f.errors:
            errs.add_row(e.system, e.op, str(e.ranks), str(e.nodes), str(e.n),
                         f"{e.mape:.1f}", f"{e.max_ape:.1f}")
    con = console(stderr=True)
    print_fitted(con, tiers)
    print_fitted(con, errs)
