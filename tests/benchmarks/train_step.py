"""A whole training step on one GPU, measured, against what ``planner cost`` predicts for it
(not a test module).

    python tests/benchmarks/train_step.py measure -o steps.csv [--quick] [--device cuda]
    python tests/benchmarks/train_step.py compare steps.csv [--memory-accounting]

``measure`` (PyTorch, a GPU) trains the two example networks the README plans most, in
PyTorch written here to match their network files layer for layer:
``examples/networks/resnet50.yaml`` (torchvision's ResNet-50 v1.5, SGD with momentum) and
``examples/networks/gpt2-small.yaml`` (GPT-2 small at 1,024 tokens, unfused attention with
its softmax and dropout, Adam), the latter also with a fused causal attention kernel
(``scaled_dot_product_attention``, priced as ``flash: true``). Each in FP32 (TF32 off, as the
kernel profiler times FP32) and in bf16 (the whole model, weights included, in bf16, as
``--precision bf16`` prices it), at two batch sizes. A step is ``zero_grad``, forward,
cross-entropy loss, backward and the optimizer's step; after 5 warm-up steps, 20 steps are
timed one by one between CUDA events. It writes each configuration's median and 10th / 90th
percentile step time and ``torch.cuda.max_memory_allocated`` over the timed steps.

``compare`` prices each measured configuration with ``planner cost`` on one GPU of the
device the file names (``--grid 1x1``, the optimizer and precision above, no FP32 master
weights: the optimizer's state is in the weights' dtype, as PyTorch keeps it) and prints
measured over predicted time and memory, as a Markdown table. The planner counts weights,
gradients, optimizer state and the activations autograd keeps; PyTorch's peak also holds
the allocator's rounding and the temporaries of the step.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NETWORKS = ROOT / "examples" / "networks"
COLUMNS = ("device", "network", "attention", "dtype", "batch", "optimizer", "params",
           "step_ms", "step_ms_p10", "step_ms_p90", "peak_bytes", "torch", "cudnn")


# --- the networks, in PyTorch ------------------------------------------------------------

def _resnet50(nn: Any) -> Any:
    """torchvision's ResNet-50 (v1.5: the stride sits on the 3x3 convolution), as in
    examples/networks/resnet50.yaml."""

    class Bottleneck(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(True), nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
            self.short = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False),
                                        nn.BatchNorm2d(out))
                          if stride != 1 or cin != out else nn.Identity())
            self.act = nn.ReLU(True)

        def forward(self, x: Any) -> Any:
            return self.act(self.body(x) + self.short(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def _gpt2(nn: Any, F: Any, fused: bool, seq: int = 1024) -> Any:
    """GPT-2 small as in examples/networks/gpt2-small.yaml: pre-norm blocks, 12 heads,
    dropout 0.1, the output head tied to the token embedding."""
    import torch

    dim, heads, vocab = 768, 12, 50257

    class Attention(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.drop = nn.Dropout(0.1)
            self.register_buffer("mask", ~torch.ones(seq, seq, dtype=torch.bool).tril(),
                                 persistent=False)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = (t.view(b, s, heads, dim // heads).transpose(1, 2)
                       for t in self.qkv(x).split(dim, dim=2))
            if fused:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            else:
                a = (q @ k.transpose(-2, -1)) * (dim // heads) ** -0.5
                a = self.drop(a.masked_fill(self.mask[:s, :s], float("-inf")).softmax(-1))
                y = a @ v
            return self.proj(y.transpose(1, 2).reshape(b, s, dim))

    class Block(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn, self.drop1 = nn.LayerNorm(dim), Attention(), nn.Dropout(0.1)
            self.ln_2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                     nn.Linear(4 * dim, dim), nn.Dropout(0.1))

        def forward(self, x: Any) -> Any:
            x = x + self.drop1(self.attn(self.ln_1(x)))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            self.drop = nn.Dropout(0.1)
            self.h = nn.Sequential(*(Block() for _ in range(12)))
            self.ln_f = nn.LayerNorm(dim)

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.h(self.drop(self.wte(idx) + self.wpe(pos)))
            return self.ln_f(x) @ self.wte.weight.t()  # tied head

    return GPT2()


# --- measure -----------------------------------------------------------------------------

def _configs(quick: bool) -> list[tuple[str, str, str, int]]:
    """(network, attention, dtype, batch) to measure."""
    if quick:
        return [("resnet50", "", "float32", 2), ("gpt2-small", "unfused", "float32", 1),
                ("gpt2-small", "fused", "bfloat16", 1)]
    out = []
    for dt in ("float32", "bfloat16"):
        out += [("resnet50", "", dt, b) for b in (64, 256)]
        out += [("gpt2-small", att, dt, b) for att in ("unfused", "fused") for b in (8, 16)]
    return out


def _setup(torch: Any, dev: Any, net: str, att: str, dt: str, batch: int, quick: bool,
           ) -> tuple[Any, Any, str]:
    """(model, step function, optimizer name) of one configuration on ``dev``."""
    from torch import nn
    from torch.nn import functional as F  # noqa: N812 - PyTorch's own spelling

    torch.manual_seed(0)
    dtype = getattr(torch, dt)
    seq = 64 if quick else 1024
    if net == "resnet50":
        model = _resnet50(nn)
        x = torch.randn(batch, 3, 224 if not quick else 64, 224 if not quick else 64)
        y = torch.randint(0, 1000, (batch,))
    else:
        model = _gpt2(nn, F, att == "fused", seq)
        x = torch.randint(0, 50257, (batch, seq))
        y = torch.randint(0, 50257, (batch, seq))
    model = model.to(dev, dtype).train()
    x = x.to(dev, dtype) if x.is_floating_point() else x.to(dev)
    y = y.to(dev)
    if net == "resnet50":
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        optimizer = "momentum"
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        optimizer = "adam"

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()

    return model, step, optimizer


def _torch(device: str) -> tuple[Any, Any, bool, str]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    return torch, dev, cuda, torch.cuda.get_device_name(dev) if cuda else "cpu"


def measure(path: Path, device: str, quick: bool) -> None:
    torch, dev, cuda, name = _torch(device)
    rows = []
    for net, att, dt, batch in _configs(quick):
        model, step, optimizer = _setup(torch, dev, net, att, dt, batch, quick)
        for _ in range(1 if quick else 5):
            step()
        times = []
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
        for _ in range(2 if quick else 20):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
        peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
        times.sort()
        q = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
        rows.append({"device": name, "network": net, "attention": att, "dtype": dt,
                     "batch": batch, "optimizer": optimizer,
                     "params": sum(p.numel() for p in model.parameters()),
                     "step_ms": f"{statistics.median(times):.4f}",
                     "step_ms_p10": f"{q[0]:.4f}", "step_ms_p90": f"{q[-1]:.4f}",
                     "peak_bytes": peak, "torch": torch.__version__,
                     "cudnn": torch.backends.cudnn.version()})
        print(rows[-1], flush=True)
        del model, step
        if cuda:
            torch.cuda.empty_cache()
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


# --- where the GPU's time goes ------------------------------------------------------------

#: kernel-name fragments of the matrix products and convolutions (cuBLAS, cuDNN, CUTLASS,
#: flash attention); every other kernel is elementwise, a reduction or the optimizer's
PRODUCTS = ("gemm", "sm90_", "sm80_", "cutlass", "xmma", "nvjet", "conv", "cudnn", "wgrad",
            "dgrad", "fprop", "implicit", "winograd", "fmha", "flash", "attention")


def where(path: Path, device: str, quick: bool) -> None:
    """Per configuration: the step's time, the GPU's busy time (the union of its kernels'
    intervals) split into matrix products / convolutions and the rest, the kernel count,
    and the ten kernels that took longest, from PyTorch's profiler over 3 steps."""
    from torch.profiler import ProfilerActivity, profile

    torch, dev, cuda, _ = _torch(device)
    out = []
    configs = ([("resnet50", "", "bfloat16", 256), ("resnet50", "", "float32", 256),
                ("gpt2-small", "fused", "bfloat16", 8), ("gpt2-small", "unfused", "bfloat16", 8),
                ("gpt2-small", "fused", "float32", 8)] if not quick else _configs(True)[:1])
    steps = 3
    for net, att, dt, batch in configs:
        model, step, _ = _setup(torch, dev, net, att, dt, batch, quick)
        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            if cuda:
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / steps
        kernels = [e for e in prof.events()
                   if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
        spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
        busy, end = 0.0, float("-inf")
        for a, b in spans:  # union of the intervals, microseconds
            if b > end:
                busy += b - max(a, end)
                end = b
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
        prod = sum(t for n, t in by_name.items() if any(f in n.lower() for f in PRODUCTS))
        total = sum(by_name.values())
        rec = {"network": net, "attention": att, "dtype": dt, "batch": batch,
               "step_ms": wall * 1e3, "gpu_busy_ms": busy / steps / 1e3,
               "kernel_ms": total / steps / 1e3, "products_ms": prod / steps / 1e3,
               "kernels_per_step": len(kernels) / steps,
               "top": [[n[:120], t / steps / 1e3] for n, t in
                       sorted(by_name.items(), key=lambda kv: -kv[1])[:10]]}
        print(json.dumps(rec), flush=True)
        if cuda and not kernels:  # the profiler's own summary instead
            for key in ("device_time_total", "cuda_time_total"):
                try:
                    print(prof.key_averages().table(sort_by=key, row_limit=15))
                    break
                except Exception as err:  # a diagnostic only
                    print(f"key_averages by {key}: {err}")
        out.append(rec)
        del model, step
        if cuda:
            torch.cuda.empty_cache()
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


# --- compare -----------------------------------------------------------------------------

def _network(net: str, attention: str, folder: Path) -> Path:
    """The network file of a row: the example's, or with fused attention a copy in
    ``folder`` whose attention is ``flash: true`` (written once)."""
    path = NETWORKS / f"{net}.yaml"
    if attention != "fused":
        return path
    tmp = folder / f"{net}-flash.yaml"
    if not tmp.exists():
        text = path.read_text().replace("causal: true,", "causal: true, flash: true,")
        assert "flash: true" in text
        tmp.write_text(text)
    return tmp


def _cluster(device: str, folder: Path) -> Path:
    """One GPU of ``device``, as a cluster file in ``folder`` (written once)."""
    tmp = folder / f"one-{device.replace(' ', '_')}.yaml"
    if not tmp.exists():
        tmp.write_text(f"kind: cluster\nname: one-{device}\nnodes: 1\ndevices_per_node: 1\n"
                       f"device: {device}\nnetwork:\n  intra_node: {{latency: 1 us, "
                       f"bandwidth: 100 GB/s}}\n  inter_node: {{latency: 1 us, bandwidth: "
                       f"100 GB/s}}\n")
    return tmp


def predict(row: dict[str, str], folder: Path) -> dict[str, Any]:
    """``planner cost`` of a measured row on one GPU (its input files go in ``folder``)."""
    cmd = [sys.executable, "-m", "planner", "cost",
           str(_network(row["network"], row["attention"], folder)),
           str(_cluster(row["device"], folder)), "-p", "1", "-b", row["batch"], "--grid", "1x1",
           "--optimizer", row["optimizer"], "--precision", row["dtype"],
           "--no-master-weights",  # PyTorch's pure bf16: no fp32 copy
           # the step's F.cross_entropy on the logits as they come (bf16 in bf16)
           "--cross-entropy", "eager-no-upcast",
           "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: {res.stderr}")
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _priced(path: Path, network: str | None = None) -> Iterator[tuple[dict[str, str],
                                                                     dict[str, Any]]]:
    """Each measured row of ``path`` (of ``network`` only, if given) with its ``planner
    cost`` document, the inputs written once to one temporary folder."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if network in (None, r["network"])]
    with tempfile.TemporaryDirectory() as folder:
        for row in rows:
            yield row, predict(row, Path(folder))


def table(path: Path) -> str:
    """The Markdown table ``compare`` prints: each measured step against ``planner cost``."""
    out = ["| network | attention | dtype | batch | measured step | planner | measured / "
           "planner | measured peak | planner's memory | measured / planner |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row, doc in _priced(path):
        t = float(doc["iteration"]["time_s"]) * 1e3
        mem = float(doc["memory"]["peak_bytes"])
        ms, peak = float(row["step_ms"]), float(row["peak_bytes"])
        out.append(f"| {row['network']} | {row['attention'] or '—'} | {row['dtype']} | "
                   f"{row['batch']} | {ms:,.1f} ms | {t:,.1f} ms | {ms / t:.3f} | "
                   f"{peak / 2**30:.2f} GiB | {mem / 2**30:.2f} GiB | {peak / mem:.3f} |")
    return "\n".join(out)


#: GPT-2's vocabulary and sequence: the logits of one sequence
VOCAB, SEQ = 50257, 1024


def memory_accounting(path: Path) -> str:
    """GPT-2's measured peaks against the planner's memory adjusted for what the step
    does that a training framework need not: it keeps its own reference to the logits
    (``out``) through the backward pass (one logits tensor in the step's dtype, 1,024 ·
    50,257 elements a sequence) and has no gradient yet when the loss's backward runs
    (``zero_grad(set_to_none=True)``), where the planner counts them all."""
    from planner.network import DTYPE_BYTES

    out = ["| attention | dtype | batch | planner's memory | + the step's logits − gradients "
           "| measured peak | measured / adjusted |", "|---|---|---:|---:|---:|---:|---:|"]
    for row, doc in _priced(path, "gpt2-small"):
        mem = doc["memory"]
        logits = int(row["batch"]) * SEQ * VOCAB * DTYPE_BYTES[row["dtype"]]
        adjusted = mem["peak_bytes"] + logits - mem["breakdown"]["gradients"]
        peak = float(row["peak_bytes"])
        out.append(f"| {row['attention']} | {row['dtype']} | {row['batch']} | "
                   f"{mem['peak_bytes'] / 2**30:.2f} GiB | {adjusted / 2**30:.2f} GiB | "
                   f"{peak / 2**30:.2f} GiB | {peak / adjusted:.3f} |")
    return "\n".join(out)


def compare(path: Path, accounting: bool = False) -> None:
    print(memory_accounting(path) if accounting else table(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("-o", "--output", type=Path, required=True)
    m.add_argument("--device", default="cuda")
    m.add_argument("--quick", action="store_true")
    w = sub.add_parser("where")
    w.add_argument("-o", "--output", type=Path, required=True)
    w.add_argument("--device", default="cuda")
    w.add_argument("--quick", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("file", type=Path)
    c.add_argument("--memory-accounting", action="store_true",
                   help="GPT-2's peaks against the planner's memory with the step's own "
                        "logits reference added and its not-yet-allocated gradients taken "
                        "away")
    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args.output, args.device, args.quick)
    elif args.cmd == "where":
        where(args.output, args.device, args.quick)
    else:
        compare(args.file, args.memory_accounting)


if __name__ == "__main__":
    main()
