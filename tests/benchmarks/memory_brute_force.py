"""The search under a memory capacity against brute force over every assignment (not a
test module).

    python tests/benchmarks/memory_brute_force.py [--quick]

Small networks (a four-layer MLP, a three-layer convolution network, a one-block
transformer with its head tied to the embedding and without), two clusters of H100s
(4 nodes of 4 on 300 GB/s and 100 Gbit/s; 8 nodes of 2 on 300 GB/s and 10 Gbit/s),
overlapped gradients, the shipped kernel models. Each question's assignments are all
evaluated once; for 11 capacities evenly spaced from the leanest assignment's peak to
the fastest's (plus a byte), the search's plan is compared with the fastest assignment
that fits. Prints, per question, the capacities where the search is slower and by how
much, and a summary line. ``--quick`` leaves out the two questions of 43,520
assignments (about 3 minutes each on 2 cores). The README's figures under *Search*
come from here.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner.cli_plan import load_question
from planner.costs.layer import Context
from planner.errors import NoFeasiblePlan
from planner.evaluate import EvalCache, evaluate, make_context
from planner.search import Space, search

MLP4 = """kind: network
name: mlp4
input: [512]
layers:
  - {name: fc1, type: linear, out_features: 2048}
  - {name: relu1, type: relu}
  - {name: fc2, type: linear, out_features: 256}
  - {name: fc3, type: linear, out_features: 8192}
  - {name: relu3, type: relu}
  - {name: fc4, type: linear, out_features: 10}
"""

CONV3 = """kind: network
name: conv3
input: [3, 64, 64]
layers:
  - {name: conv1, type: conv2d, out_channels: 32, kernel: 3, padding: 1}
  - {name: relu1, type: relu}
  - {name: conv2, type: conv2d, out_channels: 64, kernel: 3, padding: 1}
  - {name: relu2, type: relu}
  - {name: pool, type: maxpool, kernel: 2}
  - {name: flat, type: flatten}
  - {name: fc, type: linear, out_features: 100}
"""

TF1 = """kind: network
name: {name}
input: [128]
layers:
  - {{name: wte, type: embedding, vocab: 4096, dim: 256}}
  - {{name: wpe, type: positional_embedding, positions: 128}}
  - repeat: 1
    name: h
    layers:
      - name: attn
        type: residual
        body:
          - {{name: ln_1, type: layernorm}}
          - {{name: attn, type: attention, heads: 8, causal: true}}
      - name: mlp
        type: residual
        body:
          - {{name: ln_2, type: layernorm}}
          - {{name: c_fc, type: linear, out_features: 1024}}
          - {{name: gelu, type: gelu}}
          - {{name: c_proj, type: linear, out_features: 256}}
  - {{name: ln_f, type: layernorm}}
  - {{name: lm_head, type: linear, out_features: 4096, bias: false{tie}}}
"""

CLUSTER = """kind: cluster
name: {name}
nodes: {nodes}
devices_per_node: {per_node}
device: H100-SXM
network:
  intra_node: {{name: nvl, latency: 3 us, bandwidth: 300 GB/s}}
  inter_node: {{name: ib, latency: 10 us, bandwidth: {inter}}}
"""

NETWORKS = {"mlp4": MLP4, "conv3": CONV3,
            "tf1": TF1.format(name="tf1", tie=", tie: wte"),
            "tf1u": TF1.format(name="tf1u", tie="")}
CLUSTERS = {"4x4": CLUSTER.format(name="c4x4", nodes=4, per_node=4, inter="100 Gbit/s"),
            "8x2": CLUSTER.format(name="c8x2", nodes=8, per_node=2, inter="10 Gbit/s")}
#: network, cluster, devices, batch, optimizer, whether --quick leaves it out
QUESTIONS = (
    ("mlp4", "4x4", 4, 32, "momentum", False),
    ("mlp4", "8x2", 4, 32, "momentum", False),
    ("conv3", "4x4", 16, 32, "momentum", False),
    ("conv3", "4x4", 8, 8, "adam", False),
    ("tf1", "4x4", 4, 8, "adam", True),
    ("tf1", "8x2", 4, 8, "momentum", True),
    ("tf1u", "4x4", 2, 8, "momentum", False),
    ("mlp4", "4x4", 8, 64, "momentum", False),
)
CAPACITIES = 11


def question(folder: Path, net: str, cluster: str, p: int, b: int,
             optimizer: str = "momentum") -> Any:
    """The question as `planner plan` loads it (overlapped gradients, the shipped kernel
    models), its network and cluster written to ``folder``."""
    (folder / "n.yaml").write_text(NETWORKS[net])
    (folder / "c.yaml").write_text(CLUSTERS[cluster])
    return load_question(str(folder / "n.yaml"), str(folder / "c.yaml"), p, b, "exact",
                         "gradients", "25MiB", optimizer, None, None, "auto", None)


def at_capacity(q: Any, capacity: float) -> Context:
    """The question's context with ``capacity`` bytes of each device left to the plan."""
    cl = dataclasses.replace(q.cluster,
                             reserved_memory=q.cluster.device.memory_bytes - capacity)
    return make_context(q.network, cl, q.options, q.ctx.estimator)


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    slower, total, searched = [], 0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for net, cl, p, b, optimizer, big in QUESTIONS:
            if quick and big:
                continue
            q = question(Path(tmp), net, cl, p, b, optimizer)
            space = Space(q.ctx, q.options, {})
            tied = {t: g[0] for g in space.ties for t in g[1:]}
            free = [lay.index for lay in q.network.layers
                    if lay.has_weights and lay.index not in tied]
            cache, times, peaks = EvalCache(), [], []
            for combo in itertools.product(*(range(len(space.candidates[i])) for i in free)):
                # a tied layer takes the layout at its owner's position (their candidates
                # are aligned: the embedding's model-sp is the head's column-sp)
                pos = dict(zip(free, combo, strict=True))
                pos.update({t: pos[o] for t, o in tied.items()})
                a = {i: space.candidates[i][j] for i, j in pos.items()}
                ev = evaluate(q.ctx, q.options, a, cache)
                times.append(ev.time_s)
                peaks.append(ev.memory.peak)
            fastest = min(range(len(times)), key=times.__getitem__)
            lean = min(peaks)
            print(f"{net} on {cl}, {p} devices, batch {b}, {optimizer}: {len(times):,} "
                  f"assignments, peaks {lean / 2**20:.2f}-{peaks[fastest] / 2**20:.2f} MiB",
                  flush=True)
            for k in range(CAPACITIES):
                capacity = lean + k * (peaks[fastest] - lean) / CAPACITIES + 1.0
                ctx = at_capacity(q, capacity)
                best = min(t for t, m in zip(times, peaks, strict=True)
                           if m <= ctx.cluster.capacity_bytes)
                start = time.perf_counter()
                try:
                    found = search(ctx, q.options).best.evaluation.time_s
                except NoFeasiblePlan:
                    found = float("inf")
                searched += time.perf_counter() - start
                total += 1
                if found > best * (1 + 1e-9):
                    gap = found / best - 1
                    slower.append(gap)
                    print(f"  capacity {capacity / 2**20:.2f} MiB: search {found * 1e6:.1f} us, "
                          f"best {best * 1e6:.1f} us (+{100 * gap:.2f}%)", flush=True)
    worst = max(slower, default=0.0)
    print(f"slower than the best at {len(slower)} of {total} capacities (worst "
          f"+{100 * worst:.2f}%, mean over all +{100 * sum(slower) / max(total, 1):.2f}%); "
          f"search {searched:.1f} s in all")


if __name__ == "__main__":
    main()
