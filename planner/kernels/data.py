"""Measured kernel times: reading the CSV layouts the models are fitted and judged on.

Four layouts are recognised from the header row (column order does not matter, extra
columns are ignored):

``neusight``
    NeuSight (Lee et al., ASPLOS'25) ``torch.nn.Linear`` / ``torch.bmm`` sweeps: ``device``,
    ``B``, ``M``, ``N``, ``K``, ``latency_ms`` and optionally ``split``. A linear row is the
    GEMM ``(B·M × N)·(N × K)``; a bmm row is ``B`` products ``(M × N)·(N × K)``. The two
    files share one header, so a row with ``B > 1`` is a bmm unless the file name says
    ``linear``.
``neusight-conv``
    NeuSight ``torch.nn.Conv2d`` forward sweep: ``device``, ``batch``, ``in_channels``,
    ``out_channels``, ``kernel_size``, ``input_size``, ``stride``, ``padding``,
    ``latency_ms`` (square images and filters).
``deepbench-gemm`` / ``deepbench-conv``
    Baidu DeepBench training results: ``gpu``, ``precision``, ``M``, ``N``, ``K``,
    ``time_ms``; or ``W``, ``H``, ``C``, ``N``, ``K``, ``filter_w_S``, ``filter_h_R``,
    ``pad_w``, ``pad_h``, ``stride_w``, ``stride_h`` with ``fwd_ms``, ``bwd_data_ms``,
    ``bwd_filter_ms`` (each non-empty time is one measurement).
``profile``
    What ``planner kernels profile`` writes (:data:`PROFILE_COLUMNS`): one row per
    kernel with an explicit ``op`` and ``dtype``.

Every row's device must name a catalog GPU (aliases included: NeuSight's and DeepBench's
exact names are aliases). Problems are reported as ``FILE:LINE:COL: error: ...`` and
exit with code 2, like every other input error.

**Harness overhead.** NeuSight timed each call with CUDA events around the Python op
call, so its times include the host's dispatch time (about 55-100 µs: the smallest
GEMMs of every GPU take that long). DeepBench averaged 400 back-to-back launches and the
profiler does the same, so there the time is the kernel's. Rows carry their ``harness``
so that the fit can separate the overhead from the kernel time.

**Held-out rows.** Accuracy is judged on shapes the model was not fitted on. A row is
held out when its shape's CRC-32 falls in the lowest :data:`HOLDOUT_PERCENT` percent
(the same shape is held out on every GPU and, for convolutions, in every pass); rows of
NeuSight's own ``train`` split are never held out, so the held-out linear rows are a
subset of NeuSight's ``test`` split.
"""

from __future__ import annotations

import csv
import hashlib
import io
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ..cluster import Device, lookup_device, suggest_device
from ..errors import InputError, Located, whole_file
from ..loading import STDIN_CSV, decode, read_checked
from ..units import count

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Columns of a GEMM shape: ``C[m, n] = A[m, k] · B[k, n]``, ``batch`` products.
GEMM_DIMS = ("m", "n", "k", "batch")
#: Columns of a convolution shape (NCHW input ``n × c × h × w``, ``k`` filters ``r × s``).
CONV_DIMS = ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w", "pad_h", "pad_w",
             "dil_h", "dil_w", "groups")
GEMM_OPS = ("gemm", "bmm")
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")
HARNESSES = ("neusight", "deepbench", "profile")
HOLDOUT_PERCENT = 30
MAX_CSV_BYTES = 64 * 2**20
#: the longest time a row may give for one kernel (1,000 s; the data's longest is 12 s,
#: a NeuSight GEMM)
MAX_KERNEL_MS = 1e6

#: sha256 of NeuSight's own measurement runs as copied into ``models/data/neusight``.
#: Their rows carry the nuisances of those runs (the per-call overhead growing along the
#: conv sweep, the slower linear train sweep; see the README's *Hardware models*), facts about
#: when and how those files were measured. A file in NeuSight's layout that is not one of
#: them (a user's own run, or a shuffled or truncated copy) is read without them.
NEUSIGHT_RUNS = {
    "a17f94dff866fa7dd5826f90f439f95b6ba20b46962455bc61f65851267a37ad":
        "neusight_linear_fp32.csv",
    "0573bd17222d49033e6f6a97401c5dfaef4007c4bb2a65bef7ea05b42ba9ace2":
        "neusight_bmm_fp32_test.csv",
    "c80209bf5d0a756edfdd74c2dcc7b879955d5e970b5b5d6ee051af14bf059100":
        "neusight_conv2d_fwd_fp32.csv",
}

#: The layout ``planner kernels profile`` writes.
PROFILE_COLUMNS = ("device", "dtype", "op", "m", "n", "k", "batch", "conv_n", "conv_c",
                   "conv_h", "conv_w", "conv_k", "conv_r", "conv_s", "stride_h", "stride_w",
                   "pad_h", "pad_w", "dil_h", "dil_w", "groups", "time_ms", "repeats",
                   "harness")

#: The profile layout's columns of a convolution shape (:data:`CONV_DIMS`, in order).
PROFILE_CONV_DIMS = ("conv_n", "conv_c", "conv_h", "conv_w", "conv_k", "conv_r", "conv_s",
                     "stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups")

_DEEPBENCH_GEMM = ("gpu", "precision", "M", "N", "K", "time_ms")
_DEEPBENCH_CONV = ("gpu", "precision", "W", "H", "C", "N", "K", "filter_w_S", "filter_h_R",
                   "pad_w", "pad_h", "stride_w", "stride_h", "fwd_ms", "bwd_data_ms",
                   "bwd_filter_ms")
_NEUSIGHT_CONV = ("device", "batch", "in_channels", "out_channels", "kernel_size",
                  "input_size", "stride", "padding", "latency_ms")
_NEUSIGHT = ("device", "B", "M", "N", "K", "latency_ms")
_PROFILE_REQUIRED = ("device", "dtype", "op", "time_ms")
LAYOUTS: dict[str, tuple[str, ...]] = {
    "deepbench-conv": _DEEPBENCH_CONV,
    "deepbench-gemm": _DEEPBENCH_GEMM,
    "neusight-conv": _NEUSIGHT_CONV,
    "neusight": _NEUSIGHT,
    "profile": _PROFILE_REQUIRED,
}
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16",
               "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
               "bf16": "bfloat16", "float64": "float64", "fp64": "float64"}


@dataclass
class Table:
    """Measurements of one kernel family (``gemm`` or ``conv``), one row per kernel.

    ``shape`` holds :data:`GEMM_DIMS` or :data:`CONV_DIMS` columns; ``seconds`` is the
    measured time as the harness reported it (overhead included).
    """

    family: str
    op: list[str] = field(default_factory=list)
    shape: list[tuple[int, ...]] = field(default_factory=list)
    device: list[str] = field(default_factory=list)  #: catalog names
    dtype: list[str] = field(default_factory=list)  #: network dtype names
    seconds: list[float] = field(default_factory=list)
    harness: list[str] = field(default_factory=list)
    collection: list[str] = field(default_factory=list)  #: e.g. ``neusight-linear-train``
    holdout: list[bool] = field(default_factory=list)
    #: long sweep the row belongs to (``neusight-conv``, ``neusight-linear-train``; else "")
    sweep: list[str] = field(default_factory=list)
    #: the row's position in its sweep on its device, 0 (first) to 1 (last)
    position: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.op)

    def add(self, op: str, shape: tuple[int, ...], device: str, dtype: str, seconds: float,
            harness: str, collection: str, holdout: bool, sweep: str = "") -> None:
        """Append one measurement (its position is set by :meth:`set_positions`)."""
        self.op.append(op)
        self.shape.append(shape)
        self.device.append(device)
        self.dtype.append(dtype)
        self.seconds.append(seconds)
        self.harness.append(harness)
        self.collection.append(collection)
        self.holdout.append(holdout)
        self.sweep.append(sweep)
        self.position.append(0.0)

    def set_positions(self, start: int) -> None:
        """Positions of rows ``start:`` in their sweep, per device, in file order."""
        per: dict[tuple[str, str], list[int]] = {}
        for i in range(start, len(self.op)):
            per.setdefault((self.sweep[i], self.device[i]), []).append(i)
        for idx in per.values():
            n = len(idx)
            for j, i in enumerate(idx):
                self.position[i] = j / (n - 1) if n > 1 else 0.0

    def extend(self, other: Table) -> None:
        """Append every row of ``other`` (same family)."""
        for name in _COLUMNS:
            getattr(self, name).extend(getattr(other, name))

    def select(self, mask: Sequence[bool] | NDArray[np.bool_]) -> Table:
        """The rows where ``mask`` is true."""
        keep = [i for i, m in enumerate(mask) if m]
        out = Table(self.family)
        for name in _COLUMNS:
            col = getattr(self, name)
            getattr(out, name).extend(col[i] for i in keep)
        return out

    def devices(self) -> list[Device]:
        """Each row's catalog device (rows name known devices: :func:`parse_csv` checks)."""
        out: list[Device] = []
        for name in self.device:
            dev = lookup_device(name)
            if dev is None:  # a table built by hand, not read
                raise ValueError(f"unknown device {name!r} in a kernel table")
            out.append(dev)
        return out

    def shape_array(self) -> IntArray:
        """``shape`` as an ``(rows, dims)`` integer array."""
        width = len(GEMM_DIMS) if self.family == "gemm" else len(CONV_DIMS)
        if not self.shape:
            return np.zeros((0, width), dtype=np.int64)
        return np.asarray(self.shape, dtype=np.int64)


_COLUMNS = ("op", "shape", "device", "dtype", "seconds", "harness", "collection", "holdout",
            "sweep", "position")


@dataclass
class Dataset:
    """Measurements read from one or more files, by family."""

    gemm: Table = field(default_factory=lambda: Table("gemm"))
    conv: Table = field(default_factory=lambda: Table("conv"))
    files: list[str] = field(default_factory=list)

    def tables(self) -> list[Table]:
        """The non-empty tables."""
        return [t for t in (self.gemm, self.conv) if len(t)]

    def __len__(self) -> int:
        return len(self.gemm) + len(self.conv)


def shape_holdout(family: str, shape: tuple[int, ...]) -> bool:
    """Whether a shape is in the held-out part (CRC-32 of its dimensions)."""
    key = f"{family}:" + ",".join(str(v) for v in shape)
    return zlib.crc32(key.encode("ascii")) % 100 < HOLDOUT_PERCENT


def _header_issue(display: str, header: list[str], first: str,
                  shapes_only: bool) -> Located:
    """A header of no layout: the closest layout's missing columns, each with the
    header's near spelling of it where there is one (and the first such column pointed
    at), then every layout's columns. An audit found the header cut short at 120
    characters, hiding the column that was wrong (``time_us`` for ``time_ms``)."""
    import difflib

    # the nearest: the fewest of its columns missing (the profile layout's four before
    # DeepBench's sixteen)
    name, cols = min(LAYOUTS.items(), key=lambda kv: sum(c not in header for c in kv[1]))
    missing = [c for c in cols if c not in header]
    extra = [h for h in header if h not in cols]
    col, hints = 1, []
    for c in missing:
        near = difflib.get_close_matches(c, extra, n=1, cutoff=0.6) or \
            [h for h in extra if h.lower() == c.lower()]
        hints.append(f"{c!r}" + (f" (the header has {near[0]!r})" if near else ""))
        if near and col == 1:
            at = header.index(near[0])
            col = len(",".join(first.split(",")[:at])) + (2 if at else 1)
    want = "; ".join(f"{n}: {', '.join(c)}" for n, c in LAYOUTS.items())
    if shapes_only:
        want += "; or for shapes alone: op and the profile layout's shape columns"
    return Located(display, 1, col, f"unrecognised CSV header: the nearest layout, {name}, "
                                    f"needs {', '.join(hints)}; the layouts' columns are "
                                    f"{want}", "$", first[:160])


def detect_layout(header: Sequence[str], shapes_only: bool = False) -> str | None:
    """The layout whose required columns the header has (None if none matches). Read for
    its shapes only, a header with an ``op`` column is the profile layout without the
    device, dtype and time columns."""
    cols = set(header)
    if set(PROFILE_COLUMNS) <= cols:
        return "profile"
    for name, required in LAYOUTS.items():
        if set(required) <= cols:
            return name
    if shapes_only and "op" in cols:
        return "profile"
    return None


class _Reader:
    """One CSV file: typed access to a row's cells with file:line:column errors."""

    def __init__(self, display: str, text: str, header: list[str], layout: str,
                 shapes_only: bool = False) -> None:
        self.display = display
        #: read for the kernel shapes alone: devices, dtypes and times are not checked
        #: (and their columns may be missing from the profile layout)
        self.shapes_only = shapes_only
        self.lines = text.splitlines()
        self.index = {name: i for i, name in enumerate(header)}
        self.layout = layout
        self.problems: list[Located] = []
        self.line = 0
        self.row: list[str] = []
        self._devices: dict[str, Device | None] = {}
        #: an unknown device's error (its index in ``problems``), reported once, at its
        #: first row, with how many rows name it
        self._unknown_at: dict[str, int] = {}
        self._unknown_rows: Counter[str] = Counter()
        #: columns the header lacks that rows need (by the columns missing: their error's
        #: index in ``problems``, at the header, and the rows that need them)
        self._missing_at: dict[tuple[str, ...], int] = {}
        self._missing_rows: Counter[tuple[str, ...]] = Counter()
        self._missing_ops: dict[tuple[str, ...], list[str]] = {}
        self._missing_line: dict[tuple[str, ...], int] = {}  #: the first row's line

    def _col(self, name: str) -> int:
        """1-based column of the cell (characters), for the message."""
        src = self.lines[self.line - 1] if 0 < self.line <= len(self.lines) else ""
        pos = 0
        idx = self.index[name]
        for _ in range(idx):
            nxt = src.find(",", pos)
            if nxt < 0:
                break
            pos = nxt + 1
        return pos + 1

    def error(self, name: str, message: str) -> None:
        src = self.lines[self.line - 1] if 0 < self.line <= len(self.lines) else None
        self.problems.append(Located(self.display, self.line, self._col(name), message,
                                     f"column '{name}'", src))

    def raw(self, name: str) -> str:
        return self.row[self.index[name]].strip()

    def integer(self, name: str, lo: int = 1) -> int | None:
        text = self.raw(name)
        try:
            value = float(text)
        except ValueError:
            self.error(name, f"expected an integer, got {text!r}")
            return None
        if not value.is_integer() or value < lo or value > 2**40:
            self.error(name, f"expected an integer from {lo} to 2^40, got {text!r}")
            return None
        return int(value)

    def time_ms(self, name: str, optional: bool = False) -> float | None:
        if self.shapes_only:  # every pass of a shape is wanted, measured or not
            return float("nan")
        text = self.raw(name)
        if optional and text == "":
            return None
        try:
            value = float(text)
        except ValueError:
            self.error(name, f"expected a time in milliseconds, got {text!r}")
            return None
        if not np.isfinite(value) or value <= 0 or value > MAX_KERNEL_MS:
            self.error(name, f"expected a positive time in milliseconds up to "
                             f"{MAX_KERNEL_MS:,.0f} (one kernel), got {text!r}")
            return None
        return value * 1e-3

    def device(self, name: str) -> str | None:
        if self.shapes_only:
            return self.raw(name) if name in self.index else ""
        text = self.raw(name)
        if text not in self._devices:
            self._devices[text] = lookup_device(text) if text else None
        dev = self._devices[text]
        if dev is None:
            self._unknown_rows[text] += 1
        if dev is None and text in self._unknown_at:  # said at its first row
            return None
        if dev is None:
            self._unknown_at[text] = len(self.problems)
            hint = suggest_device(text) if text else None
            extra = f"; did you mean '{hint}'?" if hint else ""
            self.error(name, f"unknown device {text!r}{extra} (`planner devices` lists the "
                             "catalog and its aliases; a GPU it lacks can be defined in a "
                             "cluster file and given with --cluster)")
            return None
        return dev.name

    def missing(self, op: str, columns: list[str]) -> None:
        """A row whose op needs ``columns`` the header lacks: said once, at the header
        (line 1), with the ops and the number of rows that need them (not once a row)."""
        key = tuple(columns)
        self._missing_rows[key] += 1
        ops = self._missing_ops.setdefault(key, [])
        if op not in ops:
            ops.append(op)
        if key in self._missing_at:
            return
        self._missing_at[key] = len(self.problems)
        first = self.lines[0] if self.lines else None
        self.problems.append(Located(self.display, 1, 1, "", "$",
                                     first[:160] if first is not None else None))
        self._missing_line[key] = self.line

    def finish(self) -> list[Located]:
        """The problems, each unknown device's first error saying how many more rows
        name it (one message a device, not one a row), each missing column's error its
        ops and rows."""
        out = list(self.problems)
        for text, i in self._unknown_at.items():
            if (n := self._unknown_rows[text]) > 1:
                out[i] = replace(out[i], message=f"{out[i].message}; "
                                                 f"{count(n - 1, 'more row')} name it")
        for key, i in self._missing_at.items():
            n = self._missing_rows[key]
            ops = self._missing_ops[key]
            out[i] = replace(out[i], message=(
                f"the header lacks the column{'s' if len(key) > 1 else ''} "
                f"{', '.join(key)}, which {' and '.join(ops)} rows need "
                f"({count(n, 'row')} here, the first at line {self._missing_line[key]}; "
                f"the layout `planner kernels profile` writes: {','.join(PROFILE_COLUMNS)})"))
        return out

    def dtype(self, name: str) -> str | None:
        if self.shapes_only:
            return "float32"
        text = self.raw(name)
        if name == "precision":
            if text.lower() == "fp32":
                return "float32"
            if text.startswith("16 bit inputs"):
                return "float16"
            self.error(name, f"unknown precision {text!r} (expected 'fp32' or DeepBench's "
                             "'16 bit inputs, ...')")
            return None
        dt = DTYPE_NAMES.get(text.lower())
        if dt is None:
            self.error(name, f"unknown dtype {text!r}; expected one of float32, float16, "
                             "bfloat16, float64")
        return dt


def _csv_limit(head: bytes) -> tuple[int, str]:
    return MAX_CSV_BYTES, f"CSV files are limited to {MAX_CSV_BYTES // 2**20} MiB"


def _open_csv(path: str | Path) -> tuple[str, str]:
    display = str(path)
    if display == "-":
        raise InputError([whole_file(display, STDIN_CSV)])
    return display, decode(read_checked(path, display, "CSV", _csv_limit), display)


def read_csv(path: str | Path, shapes_only: bool = False) -> Dataset:
    """Read one measurement CSV in any of the known layouts (see the module docstring);
    ``shapes_only``: for its kernel shapes (:func:`read_shapes`)."""
    display, text = _open_csv(path)
    return parse_csv(text, display, shapes_only)


def parse_csv(text: str, display: str, shapes_only: bool = False) -> Dataset:
    """Parse CSV text (``display`` names it in messages)."""
    rows = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(rows)]
    except StopIteration:
        raise InputError([whole_file(display, "empty file, expected a CSV header row")]) \
            from None
    except csv.Error as exc:
        raise InputError([Located(display, 1, 1, f"not valid CSV: {exc}", "$")]) from None
    seen: set[str] = set()
    for i, name in enumerate(header):
        if name in seen:  # which copy a row's value came from would be a guess
            first = text.splitlines()[0]
            col = len(",".join(first.split(",")[:i])) + 2 if i else 1
            raise InputError([Located(
                display, 1, col, f"column {name!r} appears twice in the header; keep one",
                "$", first[:160])])
        seen.add(name)
    layout = detect_layout(header, shapes_only)
    if layout is None:
        raise InputError([_header_issue(display, header, text.splitlines()[0], shapes_only)])
    reader = _Reader(display, text, header, layout, shapes_only)
    out = Dataset(files=[display])
    is_linear = "linear" in Path(display).name.lower()
    lines_of: dict[str, list[int]] = {"gemm": [], "conv": []}  # each row's line
    try:
        for row in rows:
            reader.line = rows.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                reader.problems.append(Located(
                    display, reader.line, 1, f"expected {len(header)} fields as in the "
                    f"header, found {len(row)}", "$", reader.lines[reader.line - 1]
                    if reader.line <= len(reader.lines) else None))
                continue
            if [c.strip() for c in row] == header:
                # a second file appended to this one, its header too: its cells read as
                # an unknown device 'device', a dtype 'dtype', ... (an audit)
                reader.problems.append(Located(
                    display, reader.line, 1, "repeated header row (a file appended to "
                    "another?); remove it", "$", reader.lines[reader.line - 1][:160]
                    if reader.line <= len(reader.lines) else None))
                continue
            reader.row = row
            before = len(out.gemm), len(out.conv)
            _PARSERS[layout](reader, out, is_linear)
            lines_of["gemm"] += [reader.line] * (len(out.gemm) - before[0])
            lines_of["conv"] += [reader.line] * (len(out.conv) - before[1])
            if len(reader.problems) >= 50:
                break
    except csv.Error as exc:
        reader.problems.append(Located(display, rows.line_num, 1, f"not valid CSV: {exc}",
                                       "$"))
    if not reader.problems and not shapes_only:
        _faster_than_the_roofline(reader, out, lines_of)
    if reader.problems:
        raise InputError(reader.finish())
    if layout in ("neusight", "neusight-conv") and \
            hashlib.sha256(text.encode("utf-8")).hexdigest() not in NEUSIGHT_RUNS:
        for table in (out.gemm, out.conv):  # another run in NeuSight's layout
            table.sweep[:] = [""] * len(table)
            table.collection[:] = [""] * len(table)
    out.gemm.set_positions(0)
    out.conv.set_positions(0)
    if not len(out):
        what = "kernel shapes" if shapes_only else "measurement rows"
        if reader.line > 1 and not shapes_only:
            # rows there were, none with a time (a DeepBench row's three passes all
            # empty): said at the first (found by an audit: it was said at the header)
            row_at = next(i for i, line in enumerate(reader.lines[1:], start=2)
                          if line.strip())
            raise InputError([Located(display, row_at, 1, "no row gives a time (this one "
                                      "and any after it have every time column empty)",
                                      "$", reader.lines[row_at - 1][:160])])
        raise InputError([Located(display, 1, 1, f"no {what} after the header", "$")])
    return out


#: a measured time this many times under the roofline bound is not a measurement: a
#: unit slip (seconds written as milliseconds) or a device's specs. The shipped data
#: reach 1.71 at most (a T4's fp16 convolutions); the bound counts Winograd's saving,
#: and FP32 rows are bounded at the TF32 rate where the GPU has one (measured with TF32
#: on, as PyTorch's cuDNN convolutions are by default)
MAX_OVER_ROOFLINE = 4.0
#: the time column a row's op was read from, per layout
_TIME_COLUMN = {"neusight": "latency_ms", "neusight-conv": "latency_ms",
                "deepbench-gemm": "time_ms", "profile": "time_ms"}
_DEEPBENCH_CONV_TIME = {"conv_fwd": "fwd_ms", "conv_bwd_data": "bwd_data_ms",
                        "conv_bwd_filter": "bwd_filter_ms"}


def _faster_than_the_roofline(r: _Reader, out: Dataset,
                              lines_of: dict[str, list[int]]) -> None:
    """An error at each row (the first five) whose time is under the device's roofline
    bound by more than :data:`MAX_OVER_ROOFLINE`: ``fit`` would learn it, ``eval`` judge
    the models by it."""
    from .features import DeviceSpecs, features

    found: list[tuple[int, str, str]] = []
    for family, table in (("gemm", out.gemm), ("conv", out.conv)):
        if not len(table):
            continue
        devices = table.devices()
        spec = DeviceSpecs.build(devices, table.dtype)
        _, t_c, t_m = features(family, table.shape_array(), table.op, spec)
        # FP32 measured with TF32 on (PyTorch's cuDNN default; matmuls at 'high'
        # precision) runs at the TF32 rate: bound FP32 rows by it where the GPU has one
        peak = np.array([max(p, d.peak("tf32")) if dt == "float32" else p for p, d, dt
                         in zip(spec.peak.tolist(), devices, table.dtype, strict=True)])
        t_c = t_c * spec.peak / peak
        over = np.maximum(t_c, t_m) / np.asarray(table.seconds, dtype=np.float64)
        for i in np.nonzero(over > MAX_OVER_ROOFLINE)[0]:
            op = table.op[i]
            column = _DEEPBENCH_CONV_TIME[op] if r.layout == "deepbench-conv" else \
                _TIME_COLUMN[r.layout]
            found.append((lines_of[family][i], column,
                          f"{op} {'x'.join(map(str, table.shape[i]))} in "
                          f"{table.seconds[i] * 1e3:.3g} ms is {over[i]:.3g}x faster than "
                          f"the {table.device[i]}'s roofline allows at its datasheet peak "
                          f"({peak[i] / 1e12:.3g} TFLOP/s in {table.dtype[i]}"
                          + (", TF32 counted" if peak[i] > spec.peak[i] else "")
                          + f", {spec.bandwidth[i] / 1e9:.4g} GB/s): a time in another "
                          "unit (the column is milliseconds), a dtype other than the row "
                          "says, or the device's specs (its catalog entry or cluster "
                          "file)"))
    found.sort()
    for line, column, message in found[:5]:
        r.line = line
        r.error(column, message)
    if len(found) > 5:
        r.line = found[5][0]
        r.error(found[5][1], f"and {len(found) - 5} more rows as fast, from this one on")


def _neusight(r: _Reader, out: Dataset, is_linear: bool) -> None:
    dev = r.device("device")
    b, m, n, k = (r.integer(c) for c in ("B", "M", "N", "K"))
    t = r.time_ms("latency_ms")
    if dev is None or b is None or m is None or n is None or k is None or t is None:
        return
    split = r.raw("split").lower() if "split" in r.index else ""
    if split not in ("", "train", "test"):
        r.error("split", f"expected 'train' or 'test' (NeuSight's sweeps), got "
                         f"{r.raw('split')!r}")
        return
    if b == 1 or is_linear:
        shape: tuple[int, ...] = (b * m, k, n, 1)
        op = "gemm"
    else:
        shape = (m, k, n, b)
        op = "bmm"
    coll = "neusight-linear-train" if split == "train" and op == "gemm" else ""
    hold = split != "train" and shape_holdout("gemm", shape)
    out.gemm.add(op, shape, dev, "float32", t, "neusight", coll, hold, coll)


def _neusight_conv(r: _Reader, out: Dataset, is_linear: bool) -> None:
    dev = r.device("device")
    vals = [r.integer(c) for c in ("batch", "in_channels", "out_channels", "kernel_size",
                                   "input_size", "stride")]
    pad = r.integer("padding", lo=0)
    t = r.time_ms("latency_ms")
    if dev is None or t is None or pad is None or any(v is None for v in vals):
        return
    n, c, k, ks, size, stride = (int(v) for v in vals)  # type: ignore[arg-type]
    shape = (n, c, size, size, k, ks, ks, stride, stride, pad, pad, 1, 1, 1)
    if not _conv_fits(r, shape, "input_size"):
        return
    out.conv.add("conv_fwd", shape, dev, "float32", t, "neusight", "",
                 shape_holdout("conv", shape), "neusight-conv")


def _deepbench_gemm(r: _Reader, out: Dataset, is_linear: bool) -> None:
    dev = r.device("gpu")
    dt = r.dtype("precision")
    m, n, k = (r.integer(c) for c in ("M", "N", "K"))
    t = r.time_ms("time_ms")
    if dev is None or dt is None or m is None or n is None or k is None or t is None:
        return
    shape = (m, n, k, 1)
    out.gemm.add("gemm", shape, dev, dt, t, "deepbench", "", shape_holdout("gemm", shape))


def _deepbench_conv(r: _Reader, out: Dataset, is_linear: bool) -> None:
    dev = r.device("gpu")
    dt = r.dtype("precision")
    names = ("N", "C", "H", "W", "K", "filter_h_R", "filter_w_S", "stride_h", "stride_w")
    vals = [r.integer(c) for c in names]
    pads = [r.integer(c, lo=0) for c in ("pad_h", "pad_w")]
    times = [r.time_ms(c, optional=True) for c in ("fwd_ms", "bwd_data_ms", "bwd_filter_ms")]
    if dev is None or dt is None or any(v is None for v in (*vals, *pads)):
        return
    n, c, h, w, k, rr, ss, sh, sw = (int(v) for v in vals)  # type: ignore[arg-type]
    ph, pw = (int(v) for v in pads)  # type: ignore[arg-type]
    shape = (n, c, h, w, k, rr, ss, sh, sw, ph, pw, 1, 1, 1)
    if not _conv_fits(r, shape, "W"):
        return
    hold = shape_holdout("conv", shape)
    for op, t in zip(CONV_OPS, times, strict=True):
        if t is not None:
            out.conv.add(op, shape, dev, dt, t, "deepbench", "", hold)


def _conv_fits(r: _Reader, shape: tuple[int, ...], col: str) -> bool:
    _, c, h, w, k, rr, ss, _, _, ph, pw, dh, dw, g = shape
    if h + 2 * ph < dh * (rr - 1) + 1 or w + 2 * pw < dw * (ss - 1) + 1:
        r.error(col, "the filter is larger than the padded input")
        return False
    if c % g or k % g:
        r.error("groups" if "groups" in r.index else col,
                f"{c} input and {k} output channels are not both divisible by {g} groups")
        return False
    return True


def _profile(r: _Reader, out: Dataset, is_linear: bool) -> None:
    dev = r.device("device")
    dt = r.dtype("dtype")
    op = r.raw("op")
    t = r.time_ms("time_ms")
    harness = r.raw("harness") if "harness" in r.index else "profile"
    if harness not in HARNESSES and not r.shapes_only:
        r.error("harness", f"unknown harness {harness!r}; expected one of "
                           f"{', '.join(HARNESSES)}")
        return
    need = GEMM_DIMS if op in GEMM_OPS else PROFILE_CONV_DIMS if op in CONV_OPS else ()
    missing = [c for c in need if c not in r.index]
    if missing:
        r.missing(op, missing)  # said once, at the header
        return
    if op in GEMM_OPS:
        dims = [r.integer(c) for c in GEMM_DIMS]
        if dev is None or dt is None or t is None or any(v is None for v in dims):
            return
        shape = tuple(int(v) for v in dims)  # type: ignore[arg-type]
        out.gemm.add(op, shape, dev, dt, t, harness, "", shape_holdout("gemm", shape))
    elif op in CONV_OPS:
        dims = [r.integer(c, lo=0 if c.startswith("pad") else 1) for c in PROFILE_CONV_DIMS]
        if dev is None or dt is None or t is None or any(v is None for v in dims):
            return
        shape = tuple(int(v) for v in dims)  # type: ignore[arg-type]
        if not _conv_fits(r, shape, "conv_h"):
            return
        out.conv.add(op, shape, dev, dt, t, harness, "", shape_holdout("conv", shape))
    else:
        r.error("op", f"unknown op {op!r}; expected one of "
                      f"{', '.join(GEMM_OPS + CONV_OPS)}")


_PARSERS = {
    "neusight": _neusight,
    "neusight-conv": _neusight_conv,
    "deepbench-gemm": _deepbench_gemm,
    "deepbench-conv": _deepbench_conv,
    "profile": _profile,
}


def read_files(paths: Iterable[str | Path], shapes_only: bool = False) -> Dataset:
    """Read several CSV files into one dataset; all files' problems are reported at once.
    ``shapes_only``: see :func:`read_shapes`."""
    out = Dataset()
    problems: list[Located] = []
    given: set[Path] = set()
    contents: dict[str, str] = {}  # sha256 of a file's rows -> the first file that had them
    for p in paths:
        where = Path(p).resolve()
        if where in given:  # its rows would count twice in the fit and the errors
            problems.append(whole_file(str(p), "this file is named twice; name it once"))
            continue
        given.add(where)
        try:
            display, text = _open_csv(p)
            body = text.strip()
            if "\n" in body:  # a copy (or a file concatenated into another's name)
                digest = hashlib.sha256(body.encode()).hexdigest()
                if digest in contents:
                    problems.append(whole_file(display, "has the same contents as "
                                               f"{contents[digest]}: its rows would count "
                                               "twice; name one of them"))
                    continue
                contents[digest] = display
            ds = parse_csv(text, display, shapes_only)
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        out.gemm.extend(ds.gemm)
        out.conv.extend(ds.conv)
        out.files.extend(ds.files)
    if problems:
        raise InputError(problems)
    return out


def read_shapes(paths: Iterable[str | Path]) -> Dataset:
    """The kernel shapes of files in any layout :func:`read_files` reads, for
    ``planner kernels profile --shapes``: their devices, dtypes and times are neither
    checked nor kept (``seconds`` is NaN), every convolution pass of a DeepBench row is
    taken whether it was measured or not, and a file in the profile layout needs only
    the ``op`` column and the shape columns of its rows."""
    return read_files(paths, shapes_only=True)


__all__ = ["CONV_DIMS", "CONV_OPS", "GEMM_DIMS", "GEMM_OPS", "HOLDOUT_PERCENT",
           "PROFILE_COLUMNS", "Dataset", "Table", "detect_layout", "parse_csv", "read_csv",
           "read_files", "read_shapes", "shape_holdout"]
