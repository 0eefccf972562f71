"""The planner against torchtitan's published FSDP throughput on 64 A100s (not a test
module).

    python tests/benchmarks/torchtitan_fsdp.py [--network-bandwidth "50 Gbit/s"] [--h100]

torchtitan (PyTorch's reference for large-model pre-training) published the tokens a
second a GPU it sustained training Llama 2 13B and 70B and Llama 3 8B and 70B with FSDP2
alone (ZeRO stage 3 over all 64 ranks) on 64 A100 80GB GPUs, bf16 weights with fp32
gradient reduction, AdamW, at 1 or 2 sequences a GPU (4,096 tokens for Llama 2, 8,192 for
Llama 3), with several activation-checkpointing settings (torchtitan, docs/performance.md,
"Llama 3 performance numbers" and "Llama 2 performance numbers", 2024). This prices each
run with ``planner cost`` (`--grid 1x64 --mode data --zero 3 --optimizer adam
--grad-precision fp32 --recompute-unit layers --cross-entropy eager`: torchtitan wraps
each transformer block, attention and MLP, in one checkpoint, and its loss is PyTorch's
``cross_entropy`` on the logits cast to fp32) on ``examples/clusters/dgx-a100.yaml`` and
prints a Markdown table of both. torchtitan's settings map to the planner's as:

* ``full``: every layer recomputed (``--recompute blocks``);
* ``selective layer``: every second transformer layer (torchtitan's default
  ``selective_ac_option`` of 2): ``--recompute N`` for N half the layers (the planner
  recomputes the first N, which costs the same);
* ``selective op``: torchtitan's policy keeps every operator's output except every
  second matrix product's, so it recomputes about half the forward GEMMs: priced as
  half the layers too, the same recomputed work (the memory it holds differs);
* ``no``: nothing recomputed.

torchtitan does not describe the network between its nodes; ``--network-bandwidth``
replaces the cluster file's 200 Gbit/s a GPU to show how much it matters.

``--h100`` prices instead torchtitan's later Llama 3.1 8B runs on H100s (docs/performance.md
of December 2024, Tables 1 and 3: 8 and 128 GPUs, 2 sequences a GPU, selective
checkpointing, FSDP alone, eager and with ``torch.compile``) on Meta's Grand Teton
hosts as that page describes them: 8 H100s a host on NVLink, 400 Gbit/s of RDMA a GPU,
96 GB of HBM2e at 2.4 TB/s, a 500 W power limit. The page says the peak of these cards
lies between the SXM's and the NVL's and is not known; the cluster file below starts from
the catalog's H100 SXM with those four figures changed.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NETS = ROOT / "examples" / "networks"
CLUSTER = ROOT / "examples" / "clusters" / "dgx-a100.yaml"
GPUS = 64
#: tokens a sequence (the networks' input), as torchtitan ran them
SEQUENCE = {"llama2": 4096, "llama3": 8192}
#: network file, transformer layers, sequences a GPU, torchtitan's activation checkpointing,
#: its tokens a second a GPU (WPS)
RUNS = (("llama3-8b", 32, 1, "selective layer", 2904),
        ("llama3-8b", 32, 1, "selective op", 2973),
        ("llama3-70b", 80, 1, "full", 331),
        ("llama2-13b", 40, 2, "no", 2162),
        ("llama2-13b", 40, 2, "selective layer", 1914),
        ("llama2-13b", 40, 2, "selective op", 1904),
        ("llama2-70b", 80, 1, "selective op", 355),
        ("llama2-70b", 80, 2, "full", 353))


#: GPUs, its tokens a second a GPU eager and compiled (Tables 1 and 3)
H100_RUNS = ((8, 5762, 6667), (128, 5605, 6514))
GRAND_TETON = """kind: cluster
name: grand-teton-h100-500w
nodes: 16
devices_per_node: 8
device: {name: H100-HBM2e-500W, base: H100-SXM, memory: 96 GB,
         memory_bandwidth: 2.4 TB/s, tdp: 500 W}
network:
  intra_node: {name: NVLink 4 / NVSwitch, latency: 2.756 us, bandwidth: 351.3 GB/s,
               nvls: {algbw: 261.4 GB/s, latency: 55.13 us, min_bytes: 2 MiB}}
  inter_node: {name: RoCE, latency: 9.6 us, bandwidth: 400 Gbit/s}
reserved_memory: 1 GiB
"""


def recompute(setting: str, layers: int) -> str:
    """The planner's ``--recompute`` for torchtitan's activation checkpointing."""
    return {"full": "blocks", "no": "none"}.get(setting, str(layers // 2))


def price(net: str, layers: int, per_gpu: int, setting: str, cluster: Path,
          gpus: int = GPUS) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "planner", "cost", str(NETS / f"{net}.yaml"), str(cluster),
         "-p", str(gpus), "-b", str(gpus * per_gpu), "--grid", f"1x{gpus}", "--mode",
         "data", "--zero", "3", "--optimizer", "adam", "--grad-precision", "fp32",
         "--recompute", recompute(setting, layers), "--recompute-unit", "layers",
         "--cross-entropy", "eager", "--format", "json"],
        cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):  # 1: priced, but it does not fit
        raise SystemExit(out.stderr)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _file(text: str) -> Path:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tmp:
        tmp.write(text)
    return Path(tmp.name)


def h100() -> None:
    cluster = _file(GRAND_TETON)
    print("| GPUs | torchtitan tokens/s a GPU, eager / compiled | planner | planner / "
          "compiled | planner's memory |")
    print("|---|---|---|---|---|")
    for gpus, eager, compiled in H100_RUNS:
        doc = price("llama3-8b", 32, 2, "selective op", cluster, gpus)
        mine = 2 * SEQUENCE["llama3"] / doc["iteration"]["time_s"]
        print(f"| {gpus} | {eager:,} / {compiled:,} | {mine:,.0f} | {mine / compiled:.3f} | "
              f"{doc['memory']['peak_bytes'] / 2**30:.1f} GiB |", flush=True)


def main(argv: list[str]) -> None:
    if argv == ["--h100"]:
        return h100()
    cluster = CLUSTER
    if argv[:1] == ["--network-bandwidth"] and len(argv) == 2:
        cluster = _file(re.sub(r"200 Gbit/s", argv[1], CLUSTER.read_text()))
    elif argv:
        raise SystemExit(__doc__)
    print("| network | sequences a GPU | torchtitan's checkpointing | planner's --recompute "
          "| torchtitan tokens/s a GPU | planner | planner / torchtitan | planner's memory |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for net, layers, per_gpu, setting, wps in RUNS:
        doc = price(net, layers, per_gpu, setting, cluster)
        mine = per_gpu * SEQUENCE[net[:6]] / doc["iteration"]["time_s"]
        ratios.append(mine / wps)
        mem = doc["memory"]
        print(f"| {net} | {per_gpu} | {setting} | {recompute(setting, layers)} | {wps:,} | "
              f"{mine:,.0f} | {mine / wps:.3f} | {mem['peak_bytes'] / 2**30:.1f} GiB"
              + ("" if mem["fits"] else " (does not fit)") + " |", flush=True)
    ratios.sort()
    print(f"\nplanner / torchtitan: median {statistics.median(ratios):.3f} "
          f"(from {ratios[0]:.3f} to {ratios[-1]:.3f})")


if __name__ == "__main__":
    main(sys.argv[1:])
