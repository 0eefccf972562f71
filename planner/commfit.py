"""Collective calibration: fit the network tiers of a cluster file to measured collectives.

Inputs (several files at once; each row is one measured collective):

* the text output of NVIDIA's nccl-tests (``all_reduce_perf``, ``all_gather_perf``,
  ``reduce_scatter_perf``): the table of size / count / type / redop / root / time /
  algbw / busbw for out-of-place and in-place runs. The out-of-place time is used. The
  rank count is the number of ``#  Rank`` lines (else ``nThread × nGpus``); the node
  count is the number of distinct host names on those lines; the collective is named
  by the ``# Collective test starting:`` line, else by the file name, else by the
  ``count``/``size`` relation (nccl-tests prints the per-rank count for all-gather and
  reduce-scatter, the full count for all-reduce);
* DeepBench's all-reduce CSV (``gpu, bytes, n_gpus, n_nodes, mean_time_ms``) and the
  8×H200 sweep CSV (``gpu, n_gpus, n_nodes, bytes, time_us_derived, nccl_algo_note``).

Model (REFERENCES §3, the planner's :mod:`planner.costs.comm`): NCCL's ring, e.g. for
all-reduce ``t = 2(p−1)α + 2(p−1)/p · S β``, one ``(α, 1/β)`` per tier — single-node rows
fit the intra-node tier; rows that span nodes fit the inter-node tier with NCCL's ring
across nodes (:func:`~planner.costs.comm.nccl_ring_time`: the steps inside a node at the
fitted intra-node α, the ``2(m−1)`` between nodes at the network's, the bytes through
the ``q`` NICs of a node, ``1/q`` each), so the fitted bandwidth is per device: a node
whose devices share one NIC gets its share. The fit is a non-negative least-squares
problem on the *relative* error, ``Σ ((t̂ − t)/t)²``, which is linear in ``(α, β)``
(scipy ``nnls``).

NVLS: on NVSwitch systems NCCL reduces inside the switch from about 2 MiB on (NVLink
SHARP); the time then follows ``t = α_nvls + S / algbw_nvls``, with an algorithm
bandwidth that NCCL's tuning model holds at every group size (its bus bandwidth times
5/6, where a ring's is times ``p/(2(p−1))``), above what a ring reaches on eight
ranks. Rows marked NVLS (the H200 CSV's note column) fit that model and its smallest
message size becomes ``min_bytes``; without notes, a single-node
all-reduce sweep is split at the breakpoint that minimises the error of ring-below /
NVLS-above, and NVLS is kept only when it clearly beats one ring line. The result is
the ``nvls:`` sub-section of ``intra_node``, which :func:`planner.costs.comm.collective_time`
uses for one-node all-reduces of at least ``min_bytes``.

Across nodes a cluster file prices a collective with its ``collectives.algorithm``, by
default ``auto``: the fastest of the ring, NCCL's tree and the hierarchical all-reduce.
The network tier is therefore refitted from the ring's solution to minimise the error of
that choice (:func:`refit_inter`), and the reported error is that of the planner's own
:func:`~planner.costs.comm.collective_time` with the fitted tiers and the cluster's
algorithm, per (system, collective, ranks, nodes): what a plan would be off by. Bus
bandwidth follows nccl-tests: ``busbw = algbw · 2(n−1)/n`` for all-reduce, ``(n−1)/n``
for all-gather and reduce-scatter.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .cluster import Cluster, Device, Link
from .costs.comm import (
    Collective,
    Group,
    collective_time,
    flat_time,
    ring_steps,
)
from .errors import InputError, Located, UsageError, whole_file
from .loading import STDIN_CSV, decode, read_checked
from .units import MAX_GPUS

OPS: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s.*?\son\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$")
#: what launchers put before each line: mpirun's ``--tag-output`` (``[1,0]<stdout>:``)
#: and Slurm's ``srun -l`` (``0: ``)
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+: )")
#: a line of nccl-tests' output header (its title, or its table's column names)
_NCCL_TABLE = re.compile(r"^(?:\S*:)?\s*#\s*(?:nccl-tests|size\s+count\s+type)",
                         re.MULTILINE)
_NTHREAD = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_TEST = re.compile(r"Collective test starting:\s*(\w+)")
#: the other nccl-tests programs, by the name their output file is likely to carry
_PERF_NAME = re.compile(r"(broadcast|alltoall|sendrecv|hypercube|scatter|gather|reduce)_perf")
_NOT_MODELLED = "is a collective planner does not model"
_MODELLED = "give all_reduce_perf, all_gather_perf or reduce_scatter_perf output"
MIN_NVLS_GAIN = 0.5  # NVLS kept when it removes at least half the squared error
#: ... and when its algorithm bandwidth beats the ring's below it on those ranks by this
#: much: a ring sweep's noise can halve a small squared error, and a line fitted to its
#: top sizes is then the ring again (an A100's 300 GB/s ring read as NVLS at 170 GB/s)
MIN_NVLS_SPEEDUP = 1.1
#: ... and only where one ring line misses the sweep by more than this (root mean square
#: relative error): measurement noise (a few percent) is not a second algorithm
MIN_RING_MISS = 0.02
#: the fewest ranks on which NVLS can beat a ring, so that a sweep shows it: at an
#: algorithm bandwidth constant in the ranks, the H200's 261 GB/s against its ring's
#: 351·p/(2(p−1)) GB/s ties at 3 ranks and wins from 4 (on 2 the ring's is 351)
NVLS_MIN_RANKS = 4
#: the GPU architectures with NVLink SHARP (NVLS): NVSwitch 3 and later
NVLS_ARCHITECTURES = ("Hopper", "Blackwell")
#: a measured collective time outside these is not a measurement (a unit slip, a typo):
#: no collective completes in under half a microsecond (NCCL's own latency is several:
#: the shipped measurements' shortest is 8.1 µs; an audit found 0.001 µs rows fitted as
#: "latency-bound")
MIN_TIME_S, MAX_TIME_S = 5e-7, 86400.0


@dataclass(frozen=True)
class Sample:
    """One measured collective."""

    system: str
    op: Collective
    nbytes: float
    ranks: int
    nodes: int
    seconds: float
    algo: str | None  #: "ring" / "nvls" when the source says which NCCL used
    file: str
    line: int


#: the least share of a row's fitted time its bytes must take somewhere in a tier's rows
#: for its bandwidth to count as measured (:attr:`TierFit.bandwidth_share`)
LATENCY_BOUND = 0.5

#: a tier's path in a ``network:`` section
TIER_PATH = {"intra": ("intra_node",), "inter": ("inter_node",), "nvls": ("intra_node", "nvls")}


@dataclass(frozen=True)
class TierFit:
    """Fitted α and bandwidth of one tier (``intra``, ``inter`` or ``nvls``)."""

    tier: str
    latency_s: float
    bandwidth: float  #: bytes/s per device one way; for nvls the algorithm bandwidth
    rows: int
    min_bytes: float | None = None
    by_group: tuple[tuple[int, float], ...] = ()  #: bandwidth per group size, if it varies
    #: the largest share of a row's fitted time that its bytes take (the rest: latency);
    #: near 0, every size measured was latency-bound and the bandwidth is not determined
    bandwidth_share: float = 1.0

    @property
    def latency_bound(self) -> bool:
        """Whether every row was latency-bound: the bandwidth is not determined."""
        return self.bandwidth_share < LATENCY_BOUND

    def record(self) -> dict[str, Any]:
        """Plain data (SI)."""
        out: dict[str, Any] = {"tier": self.tier, "latency_s": self.latency_s,
                               "bandwidth": self.bandwidth, "rows": self.rows}
        if self.min_bytes is not None:
            out["min_bytes"] = self.min_bytes
        if self.by_group:
            out["bandwidth_by_group"] = {str(n): bw for n, bw in self.by_group}
        return out


@dataclass(frozen=True)
class ErrorRow:
    """The planner's error with the fitted tiers on one (collective, ranks, nodes) group."""

    system: str
    op: str
    ranks: int
    nodes: int
    n: int
    mape: float
    max_ape: float

    def record(self) -> dict[str, Any]:
        """Plain data, percentages rounded to 0.01."""
        return {"system": self.system, "op": self.op, "ranks": self.ranks,
                "nodes": self.nodes, "n": self.n, "mape": round(self.mape, 2),
                "max_ape": round(self.max_ape, 2)}


@dataclass
class SystemFit:
    """Everything fitted for one system (one GPU model / machine)."""

    system: str
    intra: TierFit | None = None
    inter: TierFit | None = None
    nvls: TierFit | None = None
    errors: list[ErrorRow] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: the largest single-node all-reduce measured on :data:`NVLS_MIN_RANKS` ranks or more
    #: (bytes; 0: none): an NVLS section from a larger size on is one the fit could not
    #: have seen
    largest_single_all_reduce: float = 0.0
    #: what the reader should know of this fit (printed, and in the JSON report)
    notes: list[str] = field(default_factory=list)

    def network(self) -> dict[str, Any]:
        """The fitted ``network:`` section (unit strings, as a cluster file has them)."""
        out: dict[str, Any] = {}
        if self.intra is not None:
            tier: dict[str, Any] = {"name": f"fitted: {self.system}",
                                    "latency": fmt_time(self.intra.latency_s),
                                    "bandwidth": fmt_bw(self.intra.bandwidth)}
            if self.intra.by_group:
                tier["bandwidth_by_group"] = {n: fmt_bw(bw) for n, bw in self.intra.by_group}
            if self.nvls is not None:
                tier["nvls"] = {"algbw": fmt_bw(self.nvls.bandwidth),
                                "latency": fmt_time(self.nvls.latency_s),
                                "min_bytes": fmt_bytes(self.nvls.min_bytes or 0.0)}
            out["intra_node"] = tier
        if self.inter is not None:
            out["inter_node"] = {"name": f"fitted: {self.system}",
                                 "latency": fmt_time(self.inter.latency_s),
                                 "bandwidth": fmt_bw(self.inter.bandwidth)}
        return out

    def record(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {"system": self.system, "files": self.files,
                "tiers": [t.record() for t in (self.intra, self.nvls, self.inter)
                          if t is not None],
                "network": self.network(), "errors": [e.record() for e in self.errors],
                "notes": self.notes}


def _sig(v: float, digits: int = 4) -> str:
    return f"{v:.{digits}g}"


def fmt_time(seconds: float) -> str:
    """``"9.17 us"``."""
    return f"{_sig(seconds * 1e6)} us"


def fmt_bw(bytes_per_s: float) -> str:
    """``"5.73 GB/s"``."""
    return f"{_sig(bytes_per_s / 1e9)} GB/s"


def fmt_bytes(n: float) -> str:
    """``"2 MiB"`` for powers of two, else bytes."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and (n / size).is_integer():
            return f"{int(n // size)} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------
# Reading


def _fail(file: str, line: int, message: str, src: str | None = None,
          column: int = 1) -> InputError:
    return InputError([Located(file, line, column, message, "$", src)])


def _op_from_name(name: str) -> Collective | None:
    low = name.lower().replace("-", "_")
    for op, keys in (("all_reduce", ("all_reduce", "allreduce")),
                     ("all_gather", ("all_gather", "allgather")),
                     ("reduce_scatter", ("reduce_scatter", "reducescatter"))):
        if any(k in low for k in keys):
            return op  # type: ignore[return-value]
    return None


def parse_nccl_tests(text: str, display: str, notes: list[str] | None = None
                     ) -> list[Sample]:
    """Rows of an nccl-tests output (see the module docstring). Several runs written to
    one file (``for n in 2 4 8; do mpirun ... all_reduce_perf ...; done >> log``) are
    read one by one: each ``# nThread`` line (or ``# Collective test starting`` line)
    after a result table starts a new run, with its own ranks and collective."""
    lines = [_PREFIX.sub("", ln) for ln in text.splitlines()]
    starts = [0]
    seen_rows = False  # result rows, or '#  Rank' lines: a header after them is a new run
    for i, ln in enumerate(lines):
        s = ln.strip()
        if (_NTHREAD.search(s) or _TEST.search(s)) and seen_rows:
            starts.append(i)
            seen_rows = False
        elif s and (s[0].isdigit() or _RANK.match(s)):
            seen_rows = True
    out: list[Sample] = []
    for a, b in zip(starts, [*starts[1:], len(lines)], strict=True):
        out.extend(_parse_run(lines, a, b, display, len(starts) > 1, notes))
    return out


def _parse_run(lines: list[str], first: int, end: int, display: str,
               several: bool, notes: list[str] | None = None) -> list[Sample]:
    """One run of an nccl-tests output: ``lines[first:end]``."""
    where = f" (the run starting at line {first + 1})" if several else ""
    op: Collective | None = None
    nthread = ngpus = None
    hosts: list[str] = []
    ranks_seen: set[int] = set()
    devices: list[str] = []
    header: list[str] | None = None
    unit = 1e-6
    samples: list[tuple[int, int, int, float]] = []  # line, size, count, seconds
    dropped: list[int] = []  # lines of rows with wrong results
    for i in range(first + 1, end + 1):
        raw = lines[i - 1]
        s = raw.strip()
        if not s:
            continue
        m = _TEST.search(s)
        if m:
            op = _op_from_name(m.group(1))
            if op is None:
                raise _fail(display, i, f"{m.group(1)} {_NOT_MODELLED}{where}; "
                                        f"{_MODELLED}")
        m = _NTHREAD.search(s)
        if m and nthread is None:
            nthread, ngpus = int(m.group(1)), int(m.group(2))
        m = _RANK.match(s)
        if m:
            rank = int(m.group(1))
            if rank in ranks_seen:
                raise _fail(display, i, f"rank {rank} is listed twice: the processes did "
                                        "not form one communicator (nccl-tests built "
                                        "without MPI, started by mpirun: each process ran "
                                        f"its own test){where}; build it with MPI=1", raw)
            ranks_seen.add(rank)
            hosts.append(m.group(2))
            devices.append(m.group(3).strip())
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if "size" in toks and "time" in toks and "count" in toks:
                header = toks
            elif header is not None and "(us)" in toks:
                unit = 1e-6
            elif header is not None and "(ms)" in toks:
                unit = 1e-3
            continue
        if header is None:
            continue
        toks = s.split()
        if toks and not toks[0].isdigit() and (_NUMERAL_LIKE.fullmatch(toks[0]) or (
                len(toks) == len(header) and "type" in header
                and toks[header.index("type")] in _TYPE_BYTES
                and toks[header.index("count")].isdigit())):
            # a result row whose size is not a whole number of bytes (an edited or
            # garbled row), not a line of text (NCCL INFO lines begin with host names)
            raise _fail(display, i, "expected a whole number of bytes in the size column, "
                                    f"got {toks[0]!r}", raw, raw.index(toks[0]) + 1)
        if not toks or not toks[0].isdigit():
            continue
        starts = [tok.start() + 1 for tok in re.finditer(r"\S+", raw)]
        if len(toks) != len(header):
            # more fields than the header names shift nothing it reads, but say the row
            # is not the table's (two ranks' lines run together, a note pasted in): an
            # audit found them read in silence, where fewer were refused
            raise _fail(display, i, f"expected {len(header)} columns as in the nccl-tests "
                        f"header, found {len(toks)}", raw,
                        starts[len(header)] if len(toks) > len(header) else 1)
        t_idx = header.index("time")
        values: list[float] = []
        for name, k, kind in (("size", header.index("size"), int),
                              ("count", header.index("count"), int), ("time", t_idx, float)):
            try:
                values.append(kind(toks[k]))
            except ValueError:
                raise _fail(display, i, f"expected a number in the {name} column, got "
                                        f"{toks[k]!r}", raw, starts[k]) from None
        size, count, secs = int(values[0]), int(values[1]), values[2] * unit
        if size > 0 and not (math.isfinite(secs) and MIN_TIME_S <= secs <= MAX_TIME_S):
            raise _fail(display, i, "expected a time between 0.5 µs (no collective is "
                        f"faster) and 1 day, got {toks[t_idx]} µs", raw, starts[t_idx])
        # out-of-place and in-place results each have their count of wrong results
        # (#wrong); older nccl-tests printed the largest deviation instead (error: 1e-06
        # on a correct float sum), wrong only when it is large
        wrong = [j for j in range(t_idx, len(header)) if header[j] == "#wrong"]
        deviation = [j for j in range(t_idx, len(header)) if header[j] == "error"]
        if any(toks[j] not in ("0", "N/A", "0e+00") and not toks[j].startswith("0")
               for j in wrong) or any(_deviation(toks[j]) > MAX_DEVIATION
                                      for j in deviation):
            dropped.append(i)  # the run reported wrong results: not a measurement to trust
            continue
        if size > 0:
            samples.append((i, size, count, secs))
    if dropped and notes is not None:
        notes.append(f"{display}:{dropped[0]}: {len(dropped)} row"
                     f"{'s' if len(dropped) > 1 else ''} with wrong results (#wrong not 0) "
                     "left out of the fit")
    if (header is None or (not samples and not dropped)) and several and notes is not None:
        # a run that died before its table (a rerun appended after it is read)
        notes.append(f"{display}:{first + 1}: a run with no result table (it failed "
                     "before one?) left out")
        return []
    if header is None:
        raise _fail(display, first + 1, "no nccl-tests result table (a '#  size  count  "
                                        f"type ... time  algbw  busbw' header) found{where}")
    if not samples:
        raise _fail(display, first + 1, "the nccl-tests table has no rows with a positive "
                                        f"size and no wrong results{where}")
    if not hosts and nthread is None:
        raise _fail(display, first + 1, "cannot tell how many ranks ran: the '#  Rank ...' "
                                        "lines and the '# nThread N nGpus G' line of the "
                                        f"nccl-tests output are missing{where}; keep the "
                                        "whole output")
    ranks = len(hosts) if hosts else (nthread or 1) * (ngpus or 1)
    nodes = len(set(hosts)) if hosts else 1
    per_host = sorted({hosts.count(h) for h in set(hosts)})
    if len(per_host) > 1 and notes is not None:
        # the tiers are fitted as if every node ran ranks / nodes; a job of 7 + 1 ranks
        # times its one rank's NIC, not the node's (found by an audit: no word of it)
        notes.append(f"{display}:{first + 1}: its {ranks} ranks run unevenly on "
                     f"{nodes} nodes ({' to '.join(map(str, (per_host[0], per_host[-1])))} "
                     "a node): the fit prices them as "
                     f"{ranks // nodes} a node; measure whole nodes for a cluster's tiers")
    if op is None:
        op = _op_from_name(Path(display).name)
        other = _PERF_NAME.search(Path(display).name.lower())
        if op is None and other:
            raise _fail(display, first + 1, f"{other.group(0)} {_NOT_MODELLED}; {_MODELLED}")
    if op is None:
        type_bytes = _TYPE_BYTES
        line, size, count, _ = samples[-1]
        row = lines[line - 1].split()
        tb = type_bytes.get(row[2], 0) if len(row) > 2 else 0
        redop = row[3] if "redop" in (header or []) and len(row) > 3 else ""
        root = row[4] if "root" in (header or []) and len(row) > 4 else "-1"
        if tb and count * tb == size and (redop == "none" or root not in ("-1", "")):
            raise _fail(display, line, "a collective with a root or no reduction (root "
                        f"{root}, redop {redop or 'none'}: broadcast_perf or reduce_perf "
                        f"output) {_NOT_MODELLED}{where}; {_MODELLED}", lines[line - 1])
        if tb and count * tb == size:
            op = "all_reduce"
            if notes is not None:
                notes.append(f"{display}:{first + 1}: read as all_reduce_perf output from "
                             "its table (no 'Collective test starting' line, and the file "
                             "name does not say); sendrecv_perf's looks the same: name the "
                             "file after its program if it is not")
        elif tb and count * tb * ranks == size:
            op = "all_gather" if redop == "none" else "reduce_scatter"
    if op is None:
        raise _fail(display, first + 1, "cannot tell which collective this nccl-tests "
                                        f"output is{where}; name the file after it (e.g. "
                                        "all_reduce_perf.txt)")
    system = devices[0] if devices and devices[0] else Path(display).stem
    return [Sample(system, op, float(size), ranks, nodes, secs, None, display, line)
            for line, size, _, secs in samples]


#: the largest deviation from the expected result (older nccl-tests' ``error`` column)
#: that is rounding, not a wrong result
MAX_DEVIATION = 1e-2


def _deviation(text: str) -> float:
    try:
        return abs(float(text))
    except ValueError:
        return 0.0  # N/A (validation off)


def _field_column(raw: str, k: int) -> int:
    """The 1-based column where field ``k`` of the CSV line ``raw`` starts (a comma inside
    double quotes does not end a field)."""
    field, quoted = 0, False
    for i, ch in enumerate(raw):
        if field == k:
            return i + 1
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            field += 1
    return len(raw) + 1 if field == k else 1


def _csv_samples(text: str, display: str) -> list[Sample]:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader)]
    col = {h: i for i, h in enumerate(header)}
    time_col = next((c for c in ("mean_time_ms", "time_ms", "time_us_derived", "time_us")
                     if c in col), None)
    system_col = next((c for c in ("gpu", "system", "device") if c in col), None)
    ranks_col = next((c for c in ("n_gpus", "ranks") if c in col), None)
    if time_col is None or system_col is None or ranks_col is None or "bytes" not in col:
        raise _fail(display, 1, "unrecognised collective CSV header; expected the columns "
                                "gpu, bytes, n_gpus, n_nodes and mean_time_ms (DeepBench) or "
                                "time_us_derived (the 8×H200 sweep)", text.splitlines()[0])
    scale = 1e-3 if time_col.endswith("_ms") else 1e-6
    lines = text.splitlines()  # to place an error's column
    out: list[Sample] = []
    problems: list[Located] = []
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            problems.append(Located(display, line, 1, f"expected {len(header)} fields as in "
                                    f"the header, found {len(row)}", "$"))
            continue
        raw = lines[line - 1] if line <= len(lines) else ""
        cells: dict[str, float] = {}
        for name in ("bytes", ranks_col, *(["n_nodes"] if "n_nodes" in col else []),
                     time_col):
            text = row[col[name]].strip()
            try:
                cells[name] = float(text) if text or name != "n_nodes" else 1.0
            except ValueError:
                cells[name] = math.nan
        nbytes, secs = cells["bytes"], cells[time_col] * scale
        ranks_f, nodes_f = cells[ranks_col], cells.get("n_nodes", 1.0)
        ranks_ok = math.isfinite(ranks_f) and 1 <= ranks_f <= MAX_GPUS and \
            ranks_f.is_integer()
        wrong = [(name, message) for name, ok, message in (
            (system_col, bool(row[col[system_col]].strip()), "expected the system's name"),
            ("bytes", math.isfinite(nbytes) and 0 < nbytes <= MAX_COMM_BYTES,
             "expected a positive message size in bytes, at most 2^50"),
            (ranks_col, ranks_ok, "expected a whole number of ranks from 1 to 2^30"),
            # (against the ranks only where they are right: one mistake, one message)
            ("n_nodes", math.isfinite(nodes_f) and nodes_f >= 1 and nodes_f.is_integer()
             and (not ranks_ok or nodes_f <= ranks_f),
             "expected a whole number of nodes from 1 to the ranks"),
            (time_col, math.isfinite(secs) and MIN_TIME_S <= secs <= MAX_TIME_S,
             f"expected a time between 0.5 µs (no collective is faster) and 1 day "
             f"({'milli' if scale == 1e-3 else 'micro'}seconds)")) if not ok]
        for name, message in wrong:
            problems.append(Located(display, line, _field_column(raw, col[name]),
                                    f"{message} in column '{name}', got "
                                    f"{row[col[name]].strip()!r}", "$", raw))
        if wrong:
            continue
        ranks, nodes = int(ranks_f), int(nodes_f)
        note = row[col["nccl_algo_note"]].lower() if "nccl_algo_note" in col else ""
        algo = "nvls" if note.startswith("nvls") else "ring" if note.startswith("ring") \
            else None
        op_txt = row[col["op"]].strip() if "op" in col else "all_reduce"
        found = _op_from_name(op_txt)
        if found is None:
            problems.append(Located(display, line, _field_column(raw, col["op"]),
                                    f"op {op_txt!r} {_NOT_MODELLED}; expected all_reduce, "
                                    "all_gather or reduce_scatter", "$"))
            continue
        op = found
        out.append(Sample(row[col[system_col]].strip(), op, nbytes, ranks, nodes, secs,
                          algo, display, line))
    if problems:
        raise InputError(problems)
    if not out:
        raise _fail(display, 1, "no measurement rows after the header")
    return out


#: the largest message a measurement may give (1 PiB; nccl-tests' sweeps stop at GiBs)
MAX_COMM_BYTES = 2.0**50

#: nccl-tests' data types (its `type` column) and their bytes
_TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1,
               "int32": 4, "int": 4, "int64": 8, "uint64": 8}

#: what reads as a number someone meant as a row's size: 1e3, -1024, 1048576.5, 1024x
_NUMERAL_LIKE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[A-Za-z]?")

#: a measurement file's most bytes (a whole nccl-tests sweep is about 10 kB, the
#: DeepBench and 8×H200 CSVs under 100 kB)
MAX_COMM_FILE_BYTES = 16 * 2**20


def _comm_limit(head: bytes) -> tuple[int, str]:
    return MAX_COMM_FILE_BYTES, (f"measurement files are limited to "
                                 f"{MAX_COMM_FILE_BYTES // 2**20} MiB")


def read_samples(paths: Sequence[str | Path], notes: list[str] | None = None
                 ) -> list[Sample]:
    """Every measured collective in the files (CSV or nccl-tests text, told apart by
    content); all files' problems are reported together, and what was left out (rows
    with wrong results) goes to ``notes``."""
    out: list[Sample] = []
    problems: list[Located] = []
    for p in paths:
        display = str(p)
        if display == "-":
            problems.append(whole_file(display, STDIN_CSV))
            continue
        kind = "CSV" if display.lower().endswith(".csv") else "nccl-tests or CSV"
        try:
            text = decode(read_checked(p, display, kind, _comm_limit), display, kind)
            first = next((ln for ln in text.splitlines() if ln.strip()), "")
            # nccl-tests' own header lines first: a pasted launch command
            # (`mpirun -H a:8,b:8 ...`) or OpenMPI's `[1,0]<stdout>:` tags put a comma
            # on the first line of a run's output
            if "," in first and not first.lstrip().startswith("#") \
                    and not _NCCL_TABLE.search(text):
                out.extend(_csv_samples(text, display))
            else:
                out.extend(parse_nccl_tests(text, display, notes))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return out


# ---------------------------------------------------------------------------------------
# Fitting


def _nnls_relative(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any],
                   t: np.ndarray[Any, Any], c: np.ndarray[Any, Any] | None = None
                   ) -> tuple[float, float]:
    """Non-negative (x, y) minimising Σ((c + a·x + b·y − t)/t)² (c: known parts, 0)."""
    from scipy.optimize import nnls

    rest = np.ones_like(t) if c is None else 1.0 - c / t
    sol, _ = nnls(np.column_stack([a / t, b / t]), rest)
    return float(sol[0]), float(sol[1])


def _ring_parts(rows: Sequence[Sample]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Coefficients of α and β in the ring time of each row (planner.costs.comm)."""
    a = np.array([flat_time(r.op, "ring", r.nbytes, r.ranks, 1.0, 0.0) for r in rows])
    b = np.array([flat_time(r.op, "ring", r.nbytes, r.ranks, 0.0, 1.0) for r in rows])
    return a, b


def fit_ring(rows: Sequence[Sample], tier: str) -> TierFit | None:
    """α and bandwidth of the ring model on ``rows`` (None without two sizes)."""
    rows = [r for r in rows if r.ranks > 1]
    if len(rows) < 2 or len({r.nbytes for r in rows}) < 2:
        return None
    a, b = _ring_parts(rows)
    t = np.array([r.seconds for r in rows])
    alpha, beta = _nnls_relative(a, b, t)
    bw = 1.0 / beta if beta > 0 else float("inf")
    return TierFit(tier, alpha, bw, len(rows), bandwidth_share=_share(a * alpha, b * beta))


def _share(latency: np.ndarray[Any, Any], transfer: np.ndarray[Any, Any]) -> float:
    """The largest share of a row's fitted time its transfer takes."""
    total = latency + transfer
    ok = total > 0
    return float(np.max(transfer[ok] / total[ok])) if ok.any() else 0.0


def fit_ring_net(rows: Sequence[Sample], intra: TierFit | None) -> TierFit | None:
    """α and per-device bandwidth of the network from rows that span nodes, with NCCL's
    ring as :func:`planner.costs.comm.nccl_ring_time` prices it: the steps inside a node
    at the intra-node α (0 without an intra-node fit), the ``2(m−1)`` (all-reduce; ``m−1``
    otherwise) between nodes at the network's, and the bytes through the NICs of the
    ``q`` ranks a node, each carrying ``1/q`` of the ring's traffic."""
    rows = [r for r in rows if r.ranks > 1 and r.nodes > 1]
    if len(rows) < 2 or len({r.nbytes for r in rows}) < 2:
        return None
    a_in = intra.latency_s if intra is not None else 0.0
    const, a, b = [], [], []
    for r in rows:
        steps, net, volume = ring_steps(r.op, r.ranks, r.nodes)
        const.append((steps - net) * a_in)
        a.append(net)
        b.append(volume * r.nbytes / max(1, r.ranks // r.nodes))
    t = np.array([r.seconds for r in rows])
    alpha, beta = _nnls_relative(np.array(a), np.array(b), t, np.array(const))
    bw = 1.0 / beta if beta > 0 else float("inf")
    return TierFit("inter", alpha, bw, len(rows), bandwidth_share=_share(
        np.array(const) + np.array(a) * alpha, np.array(b) * beta))


def fit_ring_by_group(rows: Sequence[Sample], single: TierFit) -> TierFit:
    """One α and a bandwidth per group size, when the sizes really differ.

    On trees of PCIe switches a ring of devices behind one switch runs faster than one
    that crosses switches (DeepBench's 10-GPU boxes: about 12 GB/s for 2 GPUs, 9 GB/s for
    8). The table is kept when it removes at least half the squared relative error of one
    bandwidth and its bandwidths differ by at least 10%; otherwise ``single`` stands.
    """
    rows = [r for r in rows if r.ranks > 1]
    sizes = sorted({r.ranks for r in rows})
    if len(sizes) < 2 or any(len({r.nbytes for r in rows if r.ranks == p}) < 2
                             for p in sizes):
        return single
    a, b = _ring_parts(rows)
    t = np.array([r.seconds for r in rows])
    cols = [a] + [np.where(np.array([r.ranks for r in rows]) == p, b, 0.0) for p in sizes]
    from scipy.optimize import nnls

    sol, _ = nnls(np.column_stack([c / t for c in cols]), np.ones_like(t))
    if np.any(sol[1:] <= 0):
        return single
    alpha = float(sol[0])
    table = tuple((p, 1.0 / float(x)) for p, x in zip(sizes, sol[1:], strict=True))
    bws = [bw for _, bw in table]
    pred = a * alpha + sum(c * x for c, x in zip(cols[1:], sol[1:], strict=True))
    sse = float(np.sum(((pred - t) / t) ** 2))
    if not (sse < MIN_NVLS_GAIN * _sse(single, rows, False) and max(bws) >= 1.1 * min(bws)):
        return single
    return TierFit(single.tier, alpha, table[-1][1], len(rows), by_group=table,
                   bandwidth_share=single.bandwidth_share)


def fit_nvls(rows: Sequence[Sample]) -> TierFit | None:
    """``α_nvls`` and algorithm bandwidth of ``t = α + S / algbw``."""
    if len(rows) < 2:
        return None
    t = np.array([r.seconds for r in rows])
    a = np.ones_like(t)
    b = np.array([float(r.nbytes) for r in rows])
    alpha, inv = _nnls_relative(a, b, t)
    if inv <= 0:
        return None
    return TierFit("nvls", alpha, 1.0 / inv, len(rows), min(r.nbytes for r in rows))


def _sse(fit: TierFit | None, rows: Sequence[Sample], nvls: bool) -> float:
    if fit is None or not rows:
        return 0.0 if not rows else float("inf")
    t = np.array([r.seconds for r in rows])
    if nvls:
        pred = fit.latency_s + np.array([float(r.nbytes) for r in rows]) / fit.bandwidth
    else:
        a, b = _ring_parts(rows)
        pred = a * fit.latency_s + b / fit.bandwidth
    return float(np.sum(((pred - t) / t) ** 2))


def _may_show_nvls(r: Sample) -> bool:
    """Whether a single-node row could be NVLS: an all-reduce on enough ranks for NVLS to
    beat the ring (:data:`NVLS_MIN_RANKS`)."""
    return r.op == "all_reduce" and r.ranks >= NVLS_MIN_RANKS


def _breakpoint(rows: list[Sample]) -> tuple[list[Sample], list[Sample]] | None:
    """Split a single-node all-reduce sweep into ring-below / NVLS-above, if that helps:
    on a GPU the catalog does not know to lack NVLS, where the ring below has a bandwidth
    and NVLS above is clearly faster than that ring on the same ranks."""
    from .cluster import lookup_device

    ar = sorted(filter(_may_show_nvls, rows), key=lambda r: r.nbytes)
    sizes = sorted({r.nbytes for r in ar})
    if len(sizes) < 8:
        return None
    dev = lookup_device(ar[0].system)
    if dev is not None and dev.architecture and dev.architecture not in NVLS_ARCHITECTURES:
        return None  # an A100 or older has no in-switch reduction
    one = _sse(fit_ring(ar, "intra"), ar, False)
    if one < len(ar) * MIN_RING_MISS**2:
        return None  # one ring line fits the sweep to its noise: nothing to explain
    best: tuple[float, float] | None = None
    for cut in sizes[3:-2]:
        lo = [r for r in ar if r.nbytes < cut]
        hi = [r for r in ar if r.nbytes >= cut]
        ring, nvls = fit_ring(lo, "intra"), fit_nvls(hi)
        if ring is None or nvls is None or not 0 < ring.bandwidth < math.inf:
            continue  # the ring below needs sizes large enough to show its bandwidth
        p = max(r.ranks for r in hi)
        if nvls.bandwidth < MIN_NVLS_SPEEDUP * ring.bandwidth * p / (2 * (p - 1)):
            continue
        err = _sse(ring, lo, False) + _sse(nvls, hi, True)
        if best is None or err < best[0]:
            best = (err, cut)
    if best is None or not best[0] < MIN_NVLS_GAIN * one:
        return None
    cut = best[1]
    hi_ids = {id(r) for r in ar if r.nbytes >= cut}
    return [r for r in rows if id(r) not in hi_ids], [r for r in ar if id(r) in hi_ids]


def _link(fit: TierFit | None, nvls: TierFit | None) -> Link:
    if fit is None:
        return Link(0.0, float("inf"))
    return Link(fit.latency_s, fit.bandwidth, "", nvls.bandwidth if nvls else None,
                nvls.latency_s if nvls else None, nvls.min_bytes if nvls else None,
                fit.by_group)


def predict(fit: SystemFit, sample: Sample, algorithm: str = "auto",
            library: str | None = None) -> float:
    """Seconds the planner predicts for ``sample`` with the fitted tiers, priced as a
    cluster file with them and ``collectives: {algorithm, library}`` prices it (``auto``
    on NCCL: a ring or, inside one node, NVLS; across nodes a ring, NCCL's tree or the
    hierarchical all-reduce, the fastest)."""
    intra = _link(fit.intra, fit.nvls)
    inter = _link(fit.inter, None) if fit.inter is not None else intra
    per_node = max(1, sample.ranks // sample.nodes)
    dev = Device("fit", {"fp32": 1.0}, 1.0, 1.0, 1, 1.0)
    cluster = Cluster("fit", per_node, dev, intra, inter, algorithm=algorithm,
                      library=library)
    t, _ = collective_time(sample.op, float(sample.nbytes), Group(sample.ranks, per_node),
                           cluster)
    return float(t)


#: a ring-only fit whose squared relative error is under this share of the fastest
#: algorithm's marks runs that used a ring alone
RING_ONLY = 0.5


def _relative_errors(fit: SystemFit, rows: Sequence[Sample], algorithm: str,
                     library: str | None) -> np.ndarray[Any, Any]:
    """(predicted − measured) / measured of each row."""
    return np.array([(predict(fit, r, algorithm, library) - r.seconds) / r.seconds
                     for r in rows])


def _relative_sse(fit: SystemFit, rows: Sequence[Sample], algorithm: str,
                  library: str | None) -> float:
    return float(np.sum(_relative_errors(fit, rows, algorithm, library) ** 2))


def refit_inter(fit: SystemFit, rows: Sequence[Sample], algorithm: str,
                library: str | None) -> TierFit | None:
    """The network tier that minimises the relative error of the planner's own prices of
    the multi-node ``rows`` under ``algorithm``, from the ring's fit on.

    The ring's fit is exact for the ring (a linear least-squares problem), but a cluster
    file prices a collective across nodes with its ``collectives.algorithm``, by default
    ``auto``: the fastest of the ring, NCCL's tree and the hierarchical all-reduce. With
    the ring's α and bandwidth the tree is priced faster than the ring measured, and the
    error printed was not what a plan is off by (an audit: 0.6% printed, 21% priced).
    The fastest of several linear models is piecewise linear in (α, 1/bandwidth), so it
    is minimised numerically (Nelder-Mead over their square roots, which keeps both
    non-negative), deterministically, from the ring's solution; the result is kept only
    where it prices the rows better."""
    from scipy.optimize import minimize

    ring = fit.inter
    multi = [r for r in rows if r.ranks > 1 and r.nodes > 1]
    if ring is None or not multi or algorithm == "ring" \
            or not (math.isfinite(ring.bandwidth) and ring.bandwidth > 0):
        return ring
    # scales: the ring's values, or where its α is 0 the intra-node α (else 1 µs)
    a0 = ring.latency_s or (fit.intra.latency_s if fit.intra is not None else 0.0) or 1e-6
    b0 = 1.0 / ring.bandwidth

    def tier(x: np.ndarray[Any, Any]) -> TierFit:
        return replace(ring, latency_s=float(a0 * x[0] ** 2),
                       bandwidth=float(1.0 / (b0 * x[1] ** 2)) if x[1] != 0 else math.inf)

    def cost(x: np.ndarray[Any, Any]) -> float:
        if x[1] == 0:
            return math.inf
        return _relative_sse(replace(fit, inter=tier(x)), multi, algorithm, library)

    start = np.array([math.sqrt(ring.latency_s / a0), 1.0])
    res = minimize(cost, start, method="Nelder-Mead",
                   options={"xatol": 1e-6, "fatol": 1e-12, "maxiter": 2000})
    if not (np.isfinite(res.fun) and res.fun < cost(start)):
        return ring
    return tier(res.x)


def fit_system(system: str, rows: Sequence[Sample], algorithm: str = "auto",
               library: str | None = None) -> SystemFit:
    """Fit the tiers of one system and measure the planner's error with them, priced as
    a cluster file with ``collectives: {algorithm, library}`` prices collectives."""
    single = [r for r in rows if r.nodes == 1]
    multi = [r for r in rows if r.nodes > 1]
    nvls_rows = [r for r in single if r.algo == "nvls" and r.op == "all_reduce"]
    ring_rows = [r for r in single if r.algo != "nvls"]
    if not nvls_rows and not any(r.algo for r in single):
        split = _breakpoint(single)
        if split is not None:
            ring_rows, nvls_rows = split
    out = SystemFit(system, files=sorted({r.file for r in rows}),
                    largest_single_all_reduce=max(
                        (r.nbytes for r in single if _may_show_nvls(r)), default=0.0))
    out.intra = fit_ring(ring_rows, "intra")
    if out.intra is not None:
        out.intra = fit_ring_by_group(ring_rows, out.intra)
    out.nvls = fit_nvls(nvls_rows) if nvls_rows else None
    ring = out.inter = fit_ring_net(multi, out.intra)
    out.inter = refit_inter(out, multi, algorithm, library)
    if ring is not None and out.inter is not ring:
        # rows a ring alone prices far better than the fastest algorithm does came from
        # a ring alone (NCCL_ALGO=Ring, or a library without trees): say so, since the
        # cluster file must then name it
        as_ring = _relative_errors(replace(out, inter=ring), multi, "ring", library)
        if float(np.sum(as_ring ** 2)) < RING_ONLY * _relative_sse(out, multi, algorithm,
                                                                  library):
            mape = 100.0 * float(np.mean(np.abs(as_ring)))
            out.notes.append(
                f"{system}: the runs across nodes follow a ring alone (NCCL_ALGO=Ring, or "
                f"a library without trees?), which prices them within {mape:.1f}% (MAPE) "
                f"where the {algorithm} choice of algorithm does not; if the jobs run so, "
                "put `collectives: {algorithm: ring}` in the cluster file and fit with it "
                "(--cluster)")
    if out.inter is not None and out.intra is None:
        out.notes.append(f"{system}: no single-node run, so the steps inside the nodes of "
                         "the multi-node runs are charged to the network's latency; measure "
                         "a single-node sweep too (all_reduce_perf on one node's GPUs)")
    out.notes += _disagreements(system, rows)
    if out.intra is None and out.inter is None:
        return out
    groups: dict[tuple[str, int, int], list[float]] = {}
    for r in rows:
        if r.ranks <= 1:
            continue
        pred = predict(out, r, algorithm, library)
        groups.setdefault((r.op, r.ranks, r.nodes), []).append(
            abs(pred - r.seconds) / r.seconds * 100.0)
    for (op, ranks, nodes), errs in sorted(groups.items()):
        e = np.asarray(errs)
        out.errors.append(ErrorRow(system, op, ranks, nodes, int(e.size), float(e.mean()),
                                   float(e.max())))
    return out


#: files whose times for the same collective, ranks, nodes and size differ by more than
#: this factor (median over the sizes both measured) are likely two machines
DISAGREE = 1.5


def _disagreements(system: str, rows: Sequence[Sample]) -> list[str]:
    """A note for each pair of files that measured the same (collective, ranks, nodes,
    size) on ``system`` and disagree by more than :data:`DISAGREE` (two clusters of one
    GPU model read as one system, found by the GPU's name alone)."""
    by: dict[str, dict[tuple[str, int, int, float], float]] = {}
    for r in rows:
        by.setdefault(r.file, {})[(r.op, r.ranks, r.nodes, r.nbytes)] = r.seconds
    files = sorted(by)
    out = []
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            both = sorted(set(by[a]) & set(by[b]))
            if not both:
                continue
            ratio = float(np.median([by[a][k] / by[b][k] for k in both]))
            if max(ratio, 1 / ratio) > DISAGREE:
                out.append(f"{system}: {a} and {b} measured the same collectives "
                           f"{max(ratio, 1 / ratio):.2g}x apart (median over {len(both)} "
                           "sizes): two machines with one GPU model? fit them one at a time")
    return out


def fit_all(samples: Sequence[Sample], algorithm: str = "auto",
            library: str | None = None) -> list[SystemFit]:
    """One :class:`SystemFit` per system, in order of appearance."""
    systems: dict[str, list[Sample]] = {}
    for s in samples:
        systems.setdefault(s.system, []).append(s)
    return [fit_system(name, rows, algorithm, library) for name, rows in systems.items()]


def choose(fits: Sequence[SystemFit], name: str | None) -> SystemFit:
    """The fit of system ``name`` (its whole name, else a substring; case-insensitive),
    or the only one."""
    if name is None:
        if len(fits) == 1:
            return fits[0]
        raise UsageError("planner: error: the files hold several systems ("
                         + ", ".join(repr(f.system) for f in fits)
                         + "); choose one with --system")
    exact = [f for f in fits if f.system.lower() == name.lower()]
    hits = exact or [f for f in fits if name.lower() in f.system.lower()]
    if len(hits) != 1:
        raise UsageError(f"planner: error: --system {name!r} matches "
                         f"{'no' if not hits else len(hits)} systems; the files hold "
                         + ", ".join(repr(f.system) for f in fits))
    return hits[0]


def fitted_tiers(original: dict[str, Any], fit: SystemFit,
                 ) -> tuple[dict[str, Any], list[str]]:
    """The tiers to write over ``original`` (a cluster file's ``network`` mapping), and
    notes on what of the original is not kept. A fitted tier replaces the file's tier
    whole, with one exception: an ``nvls`` section the fit could not have seen (no
    single-node all-reduce on :data:`NVLS_MIN_RANKS` ranks or more among its
    measurements as large as the section's ``min_bytes``) is kept, since all-gather,
    multi-node, 2-rank or small all-reduce data say nothing about in-switch reduction."""
    from .units import UnitError, parse_quantity

    tiers = fit.network()
    notes = []
    for name, tier in tiers.items():
        old = original.get(name)
        if not isinstance(old, dict):
            continue
        if "nvls" in old and "nvls" not in tier:
            since = old["nvls"].get("min_bytes", 0) if isinstance(old["nvls"], dict) else 0
            try:
                since = parse_quantity(since, "bytes", positive=False)
            except UnitError:
                since = 0.0
            if fit.largest_single_all_reduce < max(since, 1.0):
                tier["nvls"] = old["nvls"]
        lost = sorted(str(k) for k in old if k not in tier and k != "name")
        if lost:
            notes.append(f"network.{name}: {', '.join(lost)} not in the fit, dropped")
    return tiers, notes


@dataclass(frozen=True)
class MergedCluster:
    """A cluster file with its network tiers replaced by a fit."""

    data: dict[str, Any]  #: the file's data with the fitted tiers (:func:`fitted_tiers`)
    text: str  #: the file edited in place, or written from ``data`` (``in_place`` False)
    in_place: bool  #: whether comments, key order, line ends and style survived
    notes: list[str]  #: what of the file's tiers is not kept
    newline: str = "\n"  #: the file's line end (``text`` has it)


#: The first line of what ``comm fit`` writes (a file fitted again loses the old one).
FIT_HEADER = "# Fitted by `planner comm fit"


def merge_cluster(cluster_path: str, fit: SystemFit) -> MergedCluster:
    """The cluster file with its fitted tiers replaced: as data, and as text edited in
    place so that its comments, key order, line endings and style survive. Where the
    file's layout does not allow an edit in place (flow-style ``network``, anchors the
    tiers share), the text is written from the data (comments lost)."""
    from .inputs import cluster_from_document
    from .loading import load_file, parse_text
    from .output import to_yaml

    doc = load_file(cluster_path)
    try:
        cluster_from_document(doc)  # validates the original (InputError with positions)
        invalid = None
    except InputError as exc:
        invalid = exc
    if invalid is not None and not (isinstance(doc.data, dict)
                                    and isinstance(doc.data.get("network"), dict)):
        raise invalid
    data = dict(doc.data)
    network = dict(data.get("network") or {})
    tiers, notes = fitted_tiers(network, fit)
    data["network"] = {**network, **tiers}
    if invalid is not None:
        # a tier the fit supplies may be what the file lacks (a two-node cluster without
        # its inter_node yet): the merged cluster must be valid, the original need not be
        try:
            cluster_from_document(parse_text(to_yaml(data), cluster_path))
        except InputError:
            raise invalid from None
    newline = "\r\n" if "\r\n" in doc.text else "\r" if "\r" in doc.text else "\n"
    lines = doc.text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[0].startswith(FIT_HEADER):  # written by an earlier fit
        lines = lines[2:] if len(lines) > 1 and lines[1].startswith("# from ") else lines[1:]
    lines = [ln for ln in lines if not _MARK.match(ln)]  # an earlier fit's marks
    try:
        text = _replace_tiers("\n".join(lines), tiers)
        in_place = parse_text(text, cluster_path).data == data
    except (yaml.YAMLError, ValueError, InputError):
        in_place = False
    if not in_place:
        return MergedCluster(data, to_yaml(data), False, notes)
    return MergedCluster(data, text.replace("\n", newline), True, notes, newline)


def _replace_tiers(text: str, tiers: dict[str, Any]) -> str:
    """``text`` (LF line ends) with the value of each ``network.<tier>`` key replaced by
    ``tiers``' (added at the end of the section where missing), in the file's indent
    step. Comments on the replaced lines go with them; those after stay. ValueError
    when the file has no block-style ``network:``."""
    from .loading import yaml_loader

    root = yaml.compose(text, Loader=yaml_loader())
    if not isinstance(root, yaml.MappingNode):
        raise ValueError("not a mapping")
    net = next((v for k, v in root.value if k.value == "network"), None)
    if not isinstance(net, yaml.MappingNode) or net.flow_style or not net.value:
        raise ValueError("no block-style network section")
    indent = net.value[0][0].start_mark.column
    step = indent or 2
    for _, value in net.value:  # the file's step: a block tier's keys under its name
        if isinstance(value, yaml.MappingNode) and not value.flow_style and value.value:
            step = max(1, value.value[0][0].start_mark.column - indent)
            break
    spans: list[tuple[int, int, str]] = []
    for key, value in net.value:
        if key.value in tiers:
            spans.append((key.start_mark.index, _line_rest(text, _content_end(
                text, value.end_mark.index)), key.value))
    edits = [(a, b, _block({k: tiers[k]}, indent, step, first=False)) for a, b, k in spans]
    missing = {k: v for k, v in tiers.items() if k not in {name for *_, name in spans}}
    if missing:
        at = _line_rest(text, _content_end(text, net.end_mark.index))
        edits.append((at, at, "\n" + _block(missing, indent, step, first=True)))
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def _content_end(text: str, end: int) -> int:
    """The end of the last line before ``end`` with content other than a comment (a block
    node ends where the next key starts, after the comments between them)."""
    lines = text[:end].split("\n")
    while len(lines) > 1 and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
        lines.pop()
    return len("\n".join(lines))


def _line_rest(text: str, at: int) -> int:
    """``at``, or the end of its line where only spaces and a comment follow (a comment
    on a replaced line goes with it)."""
    end = text.find("\n", at)
    end = len(text) if end < 0 else end
    rest = text[at:end].strip()
    return end if not rest or rest.startswith("#") else at


def _block(data: dict[str, Any], indent: int, step: int, first: bool) -> str:
    """``data`` as block YAML indented by ``indent`` and nested by ``step`` (the first
    line indented too when ``first``), without a trailing newline."""
    from .output import to_yaml

    out = []
    for i, line in enumerate(to_yaml(data).rstrip("\n").split("\n")):
        body = line.lstrip(" ")
        lead = (len(line) - len(body)) // 2 * step
        out.append(" " * (indent if i or first else 0) + " " * lead + body)
    return "\n".join(out)


def undetermined_comment(tier: TierFit) -> str:
    """The comment written above a latency-bound tier (:attr:`TierFit.latency_bound`)."""
    key = {"intra": "intra_node bandwidth", "inter": "inter_node bandwidth",
           "nvls": "nvls algbw"}[tier.tier]
    return (f"{key} not determined: every size measured was latency-bound (the bytes "
            f"take at most {tier.bandwidth_share:.0%} of a row's fitted time)")


#: a comment :func:`mark_tiers` wrote (a file fitted again loses it, and gets its own)
_MARK = re.compile(r"^[ \t]*# (intra_node bandwidth|inter_node bandwidth|nvls algbw) not "
                   r"determined: every size measured was latency-bound \(.*\)[ \t]*$")


def mark_tiers(text: str, fit: SystemFit, under: tuple[str, ...] = ()) -> str:
    """``text`` (YAML) with a comment line above each of ``fit``'s latency-bound tiers
    (:func:`undetermined_comment`) in the ``network`` section at ``under``
    (``("systems", NAME)`` for several systems' sections), so that a reader of the file
    sees its bandwidth is not determined; above the section where a tier's key does not
    start its line, and at the top where not even that does. The data are unchanged."""
    marks = [((*under, "network", *TIER_PATH[t.tier]), undetermined_comment(t))
             for t in (fit.intra, fit.nvls, fit.inter) if t is not None and t.latency_bound]
    if not marks:
        return text
    return _comment_above(text, marks)


def _comment_above(text: str, marks: Sequence[tuple[tuple[str, ...], str]]) -> str:
    """``text`` with ``# comment`` lines above the keys at the given paths (see
    :func:`mark_tiers`), in the text's line ends."""
    from .loading import yaml_loader

    newline = "\r\n" if "\r\n" in text else "\r" if "\r" in text else "\n"
    lf = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = lf.split("\n")
    try:
        root = yaml.compose(lf, Loader=yaml_loader())
        before = yaml.load(lf, Loader=yaml_loader())
    except yaml.YAMLError:
        root, before = None, None
    inserts: list[tuple[int, str]] = []  # (line index, comment line)
    top: list[str] = []
    for path, comment in marks:
        at = None
        for depth in range(len(path), 0, -1):  # the key, else the nearest section above
            key = _key_node(root, path[:depth])
            if key is None:
                continue
            line, col = key.start_mark.line, key.start_mark.column
            if line < len(lines) and not lines[line][:col].strip():
                at = (line, " " * col + "# " + comment)
                break
        if at is None:
            top.append("# " + comment)
        else:
            inserts.append(at)
    for line, new in sorted(inserts, key=lambda x: x[0], reverse=True):
        lines.insert(line, new)
    out = "\n".join([*top, *lines])
    try:
        same = yaml.load(out, Loader=yaml_loader()) == before
    except yaml.YAMLError:
        same = False
    if not same:  # a comment that changed what the file says: at the top instead
        out = "\n".join([*("# " + c for _, c in marks), lf])
    return out.replace("\n", newline)


def _key_node(root: Any, path: tuple[str, ...]) -> Any:
    """The key node at ``path`` in a composed YAML tree (None where there is none)."""
    node, key = root, None
    for name in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        hit = next(((k, v) for k, v in node.value
                    if isinstance(k, yaml.ScalarNode) and k.value == name), None)
        if hit is None:
            return None
        key, node = hit
    return key


def validate_network(data: dict[str, Any], name: str) -> None:
    """Raise if the merged cluster data is not a valid cluster (a bug guard)."""
    from .cluster import cluster_from_data
    from .errors import Issue

    issues: list[Issue] = []
    if cluster_from_data(data, issues) is None:
        raise UsageError(f"planner: error: the fitted network does not make a valid cluster "
                         f"for {name}: " + "; ".join(i.message for i in issues))


def with_system(fit: SystemFit, system: str) -> SystemFit:
    """A copy under another name (for messages)."""
    return replace(fit, system=system)


__all__ = ["LATENCY_BOUND", "ErrorRow", "Sample", "SystemFit", "TierFit", "choose", "fit_all",
           "fit_system", "mark_tiers", "merge_cluster", "parse_nccl_tests", "predict",
           "read_samples"]
