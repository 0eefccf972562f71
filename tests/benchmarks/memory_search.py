"""The memory search on questions where memory binds (not a test module).

    python tests/benchmarks/memory_search.py

When the fastest plan does not fit, the search raises a Lagrangian weight on memory
until the dynamic program's answer fits; it steers by the program's memory per layer.
For each question: the program's unconstrained optimum (no overlap weight: κ = 1), its
time and peak; the plan the search returned (time, peak, and the time against that
optimum: the search also tries other gradient weights and a local search on the
timeline, so it can be faster); how many times the search ran the dynamic program
(``solve``); and its wall time, kernel times memoised by a first search. Questions
(transformers from ``generate.py``, bf16, Adam): 6.6 B parameters
(32 blocks, width 4,096, 2,048 tokens) on one DGX H100 node, and 1.3 B (24 blocks,
width 2,048, 1,024 tokens) on the 8-P100 PCIe node (16 GiB), with and without
recomputation.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner import search as search_module
from planner.cli_plan import make_estimator
from planner.errors import NoFeasiblePlan
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_cluster, load_network_text
from planner.search import Space, Weights, solve

sys.path.insert(0, str(Path(__file__).parent))
from generate import transformer

ROOT = Path(__file__).resolve().parents[2]


def row(label: str, net, cl, opts: Options) -> None:
    ctx = make_context(net, cl, opts, make_estimator("auto", None, cl.device))
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    fastest = evaluate(ctx, opts, solve(space, Weights())[1], space.cache)
    with contextlib.suppress(NoFeasiblePlan):  # kernel times memoised, as in a sweep
        search_module.search(ctx, opts)
    solves = 0
    original = search_module.solve

    def counted(*args: object) -> object:
        nonlocal solves
        solves += 1
        return original(*args)  # type: ignore[arg-type]

    search_module.solve = counted  # type: ignore[assignment]
    t0 = time.perf_counter()
    try:
        ev = search_module.search(ctx, opts).best.evaluation
        found = (f"{ev.time_s * 1e3:.1f} ms, {ev.memory.peak / 2**30:.1f} GiB "
                 f"({(ev.time_s / fastest.time_s - 1) * 100:+.1f}%)")
    except NoFeasiblePlan as exc:
        short = exc.shortfall.needed_bytes / 2**30 if exc.shortfall else float("nan")
        found = f"none fits (leanest {short:.1f} GiB)"
    finally:
        search_module.solve = original  # type: ignore[assignment]
    t1 = time.perf_counter()
    print(f"| {label} | {fastest.time_s * 1e3:.1f} ms, {fastest.memory.peak / 2**30:.1f} GiB "
          f"| {found} | {solves} | {t1 - t0:.2f} s |")


def main() -> None:
    print("| question | unconstrained optimum | plan | program runs | search |")
    print("|---|---|---|---|---|")
    big = load_network_text(transformer(324, width=4096, heads=32, seq=2048))
    dgx = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100.yaml")
    for p, b, rec in ((8, 16, "none"), (8, 24, "none"), (8, 24, "blocks"), (8, 32, "none"),
                      (8, 32, "blocks"), (64, 256, "none"), (64, 256, "blocks")):
        row(f"6.6 B, {p} H100, batch {b}" + (", recompute" if rec != "none" else ""),
            big, dgx, Options(gpus=p, batch=b, optimizer="adam", recompute=rec))
    mid = load_network_text(transformer(244, width=2048, heads=16, seq=1024))
    pcie = load_cluster(ROOT / "examples" / "clusters" / "pcie-8gpu.yaml")
    for b, rec in ((8, "none"), (16, "none"), (16, "blocks"), (32, "blocks")):
        row(f"1.3 B, 8 P100, batch {b}" + (", recompute" if rec != "none" else ""),
            mid, pcie, Options(gpus=8, batch=b, optimizer="adam", recompute=rec))


if __name__ == "__main__":
    main()
