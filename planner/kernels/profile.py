"""Measuring GEMM, bmm and convolution times with PyTorch (``planner kernels profile``).

PyTorch is an optional extra (``pip install 'planner[torch]'``) and imported only here.
Each shape is timed the way DeepBench timed its kernels: a few warm-up calls, then
``repeats`` back-to-back calls between two synchronisations (CUDA events on a GPU,
``time.perf_counter`` on a CPU), and the mean per call is reported — the kernel's own
time with launches overlapped. On a GPU the ``repeats`` calls are captured once in a
CUDA graph and the graph is replayed: called from Python one by one, a fast GPU waits
for the host (an H100 ran ``torch.nn.grad.conv2d_weight`` of 0.5-7 GFLOP in bf16 at a
flat 50-90 µs a call, PyTorch's dispatch, and small GEMMs differed up to 2.4× between
two runs), so the loop timed the host, not the kernel. A shape whose capture fails is
timed with the plain loop. Before the sweep the GPU runs large GEMMs for about a second,
so that the first shapes are not timed at idle clocks. FP32 is measured
with TF32 off (``torch.backends.*.allow_tf32 = False``), so it matches the catalog's
non-tensor-core FP32 peak; cuDNN picks its algorithms (``cudnn.benchmark = True``).

``planner kernels profile --shapes FILE`` times the kernels of a file instead of the
sweep (:func:`shapes_of` of :func:`~.data.read_shapes`).

Passes: ``conv_fwd`` is ``conv2d``; ``conv_bwd_data`` and ``conv_bwd_filter`` are the
gradients with respect to the input and to the weight (``torch.nn.grad``), as cuDNN's
dgrad and wgrad kernels.

The rows are written in the ``profile`` layout of :mod:`planner.kernels.data`, so the
file can be given to ``planner kernels fit`` and ``eval`` directly.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .data import CONV_OPS, GEMM_DIMS, GEMM_OPS, PROFILE_COLUMNS, PROFILE_CONV_DIMS, Dataset

TORCH_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Shape:
    """One shape to time: a GEMM/bmm or a convolution pass."""

    op: str
    #: gemm and bmm: :data:`~.data.GEMM_DIMS`; convolutions: :data:`~.data.CONV_DIMS`
    dims: tuple[int, ...]


def shapes_of(data: Dataset, only: str | None = None) -> list[Shape]:
    """The distinct (op, shape) kernels of ``data`` in first-seen order, GEMMs and bmm
    first (``only``: one family, ``gemm`` or ``conv``)."""
    out: dict[Shape, None] = {}
    for table in (data.gemm, data.conv):
        if only is None or table.family == only:
            for op, dims in zip(table.op, table.shape, strict=True):
                out.setdefault(Shape(op, dims), None)
    return list(out)


def sweep(quick: bool, only: str | None = None) -> list[Shape]:
    """The shapes to time (``quick``: a handful of small ones, seconds on a CPU; ``only``:
    one family, ``gemm`` (with bmm) or ``conv``)."""
    out: list[Shape] = []
    if quick:
        gemm = [(64, 64, 64), (128, 256, 64), (256, 128, 512), (96, 200, 72)]
        bmm = [(4, 64, 64, 32), (8, 32, 128, 64)]
        conv = [(2, 8, 16, 16, 8, 3, 3, 1, 1), (2, 16, 8, 8, 32, 1, 1, 1, 0),
                (1, 8, 16, 16, 16, 3, 3, 2, 1)]
    else:
        sizes = (128, 256, 512, 1024, 2048, 4096, 8192)
        odd = (96, 200, 384, 768, 1000, 1536, 3000, 5120)
        gemm = [(m, n, k) for m in sizes for n in sizes for k in (256, 1024, 4096)]
        gemm += [(m, n, k) for m in odd for n in odd[::2] for k in (512, 2048)]
        gemm += [(m, n, k) for m in (16, 32, 64) for n in (1024, 4096) for k in (1024, 4096)]
        # transformer shapes: tokens × hidden × {hidden, MLP width, fused QKV} (Llama-like
        # widths whole and split 2, 4 and 8 ways by tensor parallelism), both ways round
        for m in (2048, 8192, 16384):
            for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096),
                         (1792, 4096), (4096, 1792), (3584, 4096), (4096, 3584)):
                gemm.append((m, n, k))
        bmm = [(b, m, n, k) for b in (8, 32, 128, 512) for m in (64, 128, 512, 1024)
               for n in (64, 128, 512, 1024) for k in (64, 128)]
        # attention: (batch · heads) products of scores Q·Kᵀ (s × s × d) and of A·V (s × d × s)
        for b in (32, 128):
            for s_ in (1024, 2048, 4096):
                for d in (64, 128):
                    bmm += [(b, s_, s_, d), (b, s_, d, s_)]
        conv = []
        for n, c, hw, k, r, stride in (
                (32, 64, 56, 64, 3, 1), (32, 64, 56, 256, 1, 1), (32, 128, 28, 128, 3, 1),
                (32, 256, 14, 256, 3, 1), (32, 512, 7, 512, 3, 1), (32, 3, 224, 64, 7, 2),
                (64, 256, 56, 64, 1, 1), (64, 128, 56, 128, 3, 2), (16, 512, 14, 1024, 1, 2),
                (8, 64, 112, 64, 3, 1), (128, 64, 28, 64, 3, 1), (32, 1024, 14, 256, 1, 1),
                (16, 32, 128, 32, 5, 1), (64, 192, 28, 96, 1, 1), (32, 96, 28, 128, 3, 1)):
            conv.append((n, c, hw, hw, k, r, r, stride, r // 2))
    if only in (None, "gemm"):
        out += [Shape("gemm", (m, n, k, 1)) for m, n, k in gemm]
        out += [Shape("bmm", (m, n, k, b)) for b, m, n, k in bmm]
    if only in (None, "conv"):
        for n, c, h, w, k, r, s, stride, pad in conv:
            for phase in CONV_OPS:
                out.append(Shape(phase, (n, c, h, w, k, r, s, stride, stride, pad, pad,
                                         1, 1, 1)))
    return out


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError("planner: error: `planner kernels profile` needs PyTorch; install "
                         "it with `pip install 'planner[torch]'` (or `pip install torch`)") \
            from None
    return torch


def _cuda_events(torch: Any, run: Callable[[], Any], calls: int) -> float:
    """Milliseconds per call of ``run`` (which makes ``calls`` calls), by CUDA events."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / calls


def _graph_time(torch: Any, fn: Callable[[], Any], repeats: int) -> float | None:
    """Milliseconds per call of ``fn`` replayed from one CUDA graph of ``repeats`` calls
    (None if the capture fails: the caller falls back to the plain loop)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    graph.replay()  # the first replay uploads the graph
    ms = _cuda_events(torch, graph.replay, repeats)
    del graph
    return ms


def _timer(torch: Any, device: str, loops: list[int]
           ) -> Callable[[Callable[[], Any], int], float]:
    """A timer of ``fn`` over ``repeats`` calls; ``loops`` counts the GPU shapes that
    could not be captured in a graph and were timed with the plain loop."""
    if device == "cuda":
        def cuda_time(fn: Callable[[], Any], repeats: int) -> float:
            ms = _graph_time(torch, fn, repeats)
            if ms is not None:
                return ms
            loops[0] += 1

            def loop() -> None:
                for _ in range(repeats):
                    fn()
            return _cuda_events(torch, loop, repeats)
        return cuda_time

    def cpu_time(fn: Callable[[], Any], repeats: int) -> float:
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) * 1e3 / repeats
    return cpu_time


def _spin_up(torch: Any, dev: Any, dt: Any, seconds: float = 1.0) -> None:
    """Run large GEMMs for about ``seconds`` so the GPU leaves its idle clocks."""
    a = torch.randn(4096, 4096, device=dev, dtype=dt)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            torch.mm(a, a)
        torch.cuda.synchronize()


def _call(torch: Any, shape: Shape, dev: Any, dt: Any) -> Callable[[], Any]:
    f = torch.nn.functional
    if shape.op in GEMM_OPS:
        m, n, k, b = shape.dims
        if shape.op == "gemm":
            a = torch.randn(m, k, device=dev, dtype=dt)
            w = torch.randn(k, n, device=dev, dtype=dt)
            c = torch.empty(m, n, device=dev, dtype=dt)  # one output for every call
            return lambda: torch.mm(a, w, out=c)
        a = torch.randn(b, m, k, device=dev, dtype=dt)
        w = torch.randn(b, k, n, device=dev, dtype=dt)
        c = torch.empty(b, m, n, device=dev, dtype=dt)
        return lambda: torch.bmm(a, w, out=c)
    n, c, h, w_, k, r, s, sh, sw, ph, pw, dh, dw, g = shape.dims
    x = torch.randn(n, c, h, w_, device=dev, dtype=dt)
    wt = torch.randn(k, c // g, r, s, device=dev, dtype=dt)
    kw = {"stride": (sh, sw), "padding": (ph, pw), "dilation": (dh, dw), "groups": g}
    if shape.op == "conv_fwd":
        return lambda: f.conv2d(x, wt, **kw)
    gy = torch.randn_like(f.conv2d(x, wt, **kw))
    if shape.op == "conv_bwd_data":
        return lambda: torch.nn.grad.conv2d_input(x.shape, wt, gy, **kw)
    return lambda: torch.nn.grad.conv2d_weight(x, wt.shape, gy, **kw)


def profile_rows(device: str = "cuda", dtype: str = "float32", quick: bool = False,
                 repeats: int | None = None, name: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 notes: list[str] | None = None,
                 shapes: list[Shape] | None = None) -> Iterator[dict[str, Any]]:
    """Time every shape of ``shapes`` (default: :func:`sweep`); yields rows in the
    ``profile`` layout.

    ``notes`` (if given) receives a line when some GPU shapes were timed with the plain
    loop because their CUDA graph capture failed."""
    torch = _import_torch()
    if dtype not in TORCH_DTYPES:
        raise UsageError(f"planner: error: unknown dtype {dtype!r}; expected one of "
                         f"{', '.join(TORCH_DTYPES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("planner: error: no CUDA device is available to PyTorch; use "
                         "--device cpu to try the profiler on the CPU")
    if device not in ("cuda", "cpu"):
        raise UsageError(f"planner: error: unknown device {device!r}; expected cuda or cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dt = getattr(torch, dtype)
    dev = torch.device(device)
    if name is None:
        import platform

        name = torch.cuda.get_device_name(dev) if device == "cuda" else (
            platform.processor() or "cpu")
    reps = repeats if repeats is not None else (3 if device == "cpu" else 50)
    loops = [0]
    timer = _timer(torch, device, loops)
    if shapes is None:
        shapes = sweep(quick)
    with torch.no_grad():
        if device == "cuda":
            _spin_up(torch, dev, dt)
        for i, shape in enumerate(shapes):
            fn = _call(torch, shape, dev, dt)
            for _ in range(max(1, reps // 5)):  # warm-up: cuDNN's algorithm search, caches
                fn()
            ms = timer(fn, reps)
            row: dict[str, Any] = dict.fromkeys(PROFILE_COLUMNS, "")
            row.update(device=name, dtype=dtype, op=shape.op, time_ms=f"{ms:.6g}",
                       repeats=reps, harness="profile")
            if shape.op in GEMM_OPS:
                row.update(zip(GEMM_DIMS, shape.dims, strict=True))
            else:
                row.update(zip(PROFILE_CONV_DIMS, shape.dims, strict=True))
            if progress is not None:
                progress(i + 1, len(shapes))
            yield row
    if loops[0] and notes is not None:
        notes.append(f"{loops[0]} of {len(shapes)} shapes could not be captured in a CUDA "
                     "graph and were timed with a plain loop of calls (host time included)")


def to_csv(rows: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> str:
    """CSV text in the ``profile`` layout."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(PROFILE_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buf.getvalue()


__all__ = ["Shape", "profile_rows", "shapes_of", "sweep", "to_csv"]
