"""The memory search on questions where memory binds (not a test module).

    python tests/benchmarks/memory_search.py

When the fastest plan does not fit, the search raises a Lagrangian weight on memory
until the dynamic program's answer fits; it steers by the program's memory per layer.
For each question: the fastest plan's time and peak (it does not fit), the plan the
search returned (time, peak, and the time given up against the fastest), and the search's
wall time. Questions (transformers from ``generate.py``, bf16, Adam): 6.6 B parameters
(32 blocks, width 4,096, 2,048 tokens) on one DGX H100 node, and 1.3 B (24 blocks,
width 2,048, 1,024 tokens) on the 8-P100 PCIe node (16 GiB), with and without
recomputation.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner.cli_plan import make_estimator
from planner.errors import NoFeasiblePlan
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_cluster, load_network_text
from planner.search import Space, Weights, search, solve

sys.path.insert(0, str(Path(__file__).parent))
from generate import transformer

ROOT = Path(__file__).resolve().parents[2]


def row(label: str, net, cl, opts: Options) -> None:
    ctx = make_context(net, cl, opts, make_estimator("auto", None, cl.device))
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    fastest = evaluate(ctx, opts, solve(space, Weights())[1], space.cache)
    t0 = time.perf_counter()
    try:
        ev = search(ctx, opts).best.evaluation
        found = (f"{ev.time_s * 1e3:.1f} ms, {ev.memory.peak / 2**30:.1f} GiB "
                 f"({(ev.time_s / fastest.time_s - 1) * 100:+.1f}%)")
    except NoFeasiblePlan as exc:
        short = exc.shortfall.needed_bytes / 2**30 if exc.shortfall else float("nan")
        found = f"no plan (leanest {short:.1f} GiB)"
    t1 = time.perf_counter()
    print(f"| {label} | {fastest.time_s * 1e3:.1f} ms, {fastest.memory.peak / 2**30:.1f} GiB "
          f"| {found} | {t1 - t0:.2f} s |")


def main() -> None:
    print("| question | fastest plan | plan found | search |")
    print("|---|---|---|---|")
    big = load_network_text(transformer(324, width=4096, heads=32, seq=2048))
    dgx = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100.yaml")
    for b in (8, 32, 64):
        row(f"6.6 B transformer, 8 H100, batch {b}", big, dgx,
            Options(gpus=8, batch=b, optimizer="adam"))
    mid = load_network_text(transformer(244, width=2048, heads=16, seq=1024))
    pcie = load_cluster(ROOT / "examples" / "clusters" / "pcie-8gpu.yaml")
    for rec in ("none", "blocks"):
        for b in (8, 32):
            row(f"1.3 B transformer, 8 P100, batch {b}, recompute {rec}", mid, pcie,
                Options(gpus=8, batch=b, optimizer="adam", recompute=rec))


if __name__ == "__main__":
    main()
