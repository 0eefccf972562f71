"""What ZeRO stages cost and save on a 6.6 B-parameter transformer (not a test module).

    python tests/benchmarks/zero.py [--grad-precision float32]

A generated transformer (32 blocks, width 4,096, 32 heads, 2,048 tokens, bf16; see
``generate.py``), Adam, the batch equal to the device count, on the example DGX H100
cluster, planned with ZeRO stages 0, 1 and 3 on one node and on eight (stage 1 also with
``--overlap-param-gather``, its gathers under the next step's forward; stage 3 also with
``overlap: none``, its gathers on the critical path; on eight nodes stages 1 and 3 also
sharded within each node and replicated across nodes, ``--zero-shard node``). Prints the
tables
of the README's *Compute, memory, overlap*: the layouts the search chose, the iteration
time, the weight-gradient and parameter communication and the peak memory per device;
then what ``--zero auto`` (and ``--zero auto --zero-shard auto`` on eight nodes) chose,
and its search time against one stage's (wall clock, kernel times memoised for both).
With ``--grad-precision float32`` (Megatron-LM's fp32 gradients for a bf16 model), the
first table only, with the gradients accumulated and reduced in fp32.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner.cli_plan import make_estimator
from planner.evaluate import Options, make_context, zero_label
from planner.inputs import load_cluster, load_network_text
from planner.search import search, search_zero

sys.path.insert(0, str(Path(__file__).parent))
from generate import transformer

ROOT = Path(__file__).resolve().parents[2]


def main(grad_dtype: str | None = None) -> None:
    net = load_network_text(transformer(324, width=4096, heads=32, seq=2048))
    cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100.yaml")
    print("| GPUs | stage | plan | iteration | gradient / parameter comm | peak memory |")
    print("|---|---|---|---|---|---|")
    for p in (8, 64):
        settings = [(0, "gradients", "all", False), (1, "gradients", "all", False),
                    (1, "gradients", "all", True), (3, "gradients", "all", False),
                    (3, "none", "all", False)]
        if p > cl.devices_per_node:
            settings += [(1, "gradients", "node", False), (1, "gradients", "node", True),
                         (3, "gradients", "node", False), (3, "none", "node", False)]
        for zero, overlap, shard, gather in settings:
            opts = Options(gpus=p, batch=p, optimizer="adam", zero=zero, overlap=overlap,
                           zero_shard=shard, grad_dtype=grad_dtype,
                           overlap_param_gather=gather)
            ctx = make_context(net, cl, opts, make_estimator("auto", None, cl.device))
            ev = search(ctx, opts).best.evaluation
            grids = collections.Counter(f"{r.layout.pr}×{r.layout.pc}" for r in ev.layers
                                        if r.follows is None)
            split = [r.layout.mode for r in ev.layers if r.follows is None]
            modes = sorted(set(split))
            bases = {m.removesuffix("-sp") for m in modes}
            sp = sum(m.endswith("-sp") for m in split)
            # Megatron's pairs, with how many of the layers are sequence-parallel
            plan = ("Megatron" + (f" ({sp} of {len(split)} SP)" if sp else "") + " "
                    if {"column", "row"} <= bases else "/".join(modes) + " ") + ", ".join(grids)
            label = f"{zero}" + (" within nodes" if shard == "node" else "") + (
                ", gathers not prefetched (overlap none)" if overlap == "none" else "") + (
                ", gathers under the next forward (--overlap-param-gather)" if gather else "")
            print(f"| {p} | {label} | {plan} | {ev.time_s * 1e3:.1f} ms | "
                  f"{ev.weight_grad_s * 1e3:.1f} / {ev.parameters_s * 1e3:.1f} ms | "
                  f"{ev.memory.peak / 2**30:.1f} GiB |")
    if grad_dtype is not None:
        return
    print()
    print("| GPUs | shards tried | --zero auto | iteration | stages searched "
          "| search, auto / stage 0 |")
    print("|---|---|---|---|---|---|")
    for p, shards in ((8, ("all",)), (64, ("all",)), (64, ("all", "node"))):
        opts = Options(gpus=p, batch=p, optimizer="adam")
        ctx = make_context(net, cl, opts, make_estimator("auto", None, cl.device))
        search(ctx, opts)  # the kernel times memoised, as after the first plan of a sweep
        t0 = time.perf_counter()
        search(ctx, opts)
        t1 = time.perf_counter()
        res, _, chosen = search_zero(ctx, opts, shards=shards)
        t2 = time.perf_counter()
        searched = [str(t.stage) + (" node" if t.shard == "node" else "")
                    for t in res.zero_trials if t.outcome in ("plan", "no plan")]
        print(f"| {p} | {' and '.join(shards)} | {zero_label(chosen.zero, chosen.zero_shard)} "
              f"| {res.best.evaluation.time_s * 1e3:.1f} ms | "
              f"{', '.join(searched)} | {t2 - t1:.2f} / {t1 - t0:.2f} s |")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args not in ([], ["--grad-precision", "float32"], ["--grad-precision", "bfloat16"]):
        sys.exit("usage: zero.py [--grad-precision float32|bfloat16]")
    main(args[1] if args else None)
