"""The planner against Meta's published Llama 3 405B pre-training throughput (not a test
module).

    python tests/benchmarks/llama3_405b.py [--search] [--tp-comm-overlap]
        [--overlap-param-gather] [--stage-boundaries=layers]

Meta ("The Llama 3 Herd of Models", 2024, Table 4) trained Llama 3 405B on 8,192 and
16,384 H100 GPUs with tensor parallelism 8, pipeline parallelism 16 and data
parallelism 64 and 128, 8,192-token sequences, 16M tokens (2,048 sequences) a step, and
measured 430 and 400 TFLOP/s a GPU (43% and 41% BF16 MFU). This prices that layout with
``planner cost`` (Megatron-LM's tensor and sequence parallelism at 8 × DP in every stage,
one sequence a microbatch, so 32 and 16 microbatches; Adam) for 1, 2 and 4 model chunks
a stage (Meta does not give theirs), with ``--recompute auto`` (none where it fits), on
``examples/clusters/h100-roce-16k.yaml``, with the optimizer state sharded over the
data-parallel replicas (ZeRO stage 1, Megatron-LM's distributed optimizer: one
reduce-scatter a step) and with the gradients too (stage 2, as Meta describes its FSDP:
each microbatch reduce-scatters its gradients). With ``--search`` it also runs ``planner
plan`` (ZeRO stage 1) on the same stages and microbatches for each chunk count: the
layouts the planner would pick itself (2 to 12 minutes each on the 2-core development
machine, 2026-11-27: ``--recompute auto`` searches every count it tries). With
``--tp-comm-overlap`` every command overlaps the sequence-parallel collectives with
their GEMMs (Megatron-LM's flag of that name), and with ``--overlap-param-gather`` the
gathers of the updated parameters run under the next step's forward passes (that flag);
with ``--stage-boundaries=layers`` the stages hold whole transformer layers, as
Megatron-LM's do.
Prints a Markdown table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from planner.units import count

ROOT = Path(__file__).resolve().parents[2]
NET = ROOT / "examples" / "networks" / "llama3-405b.yaml"
CL = ROOT / "examples" / "clusters" / "h100-roce-16k.yaml"
#: GPUs, data-parallel replicas, microbatches, Meta's TFLOP/s a GPU (Table 4)
RUNS = ((8192, 64, 32, 430), (16384, 128, 16, 400))


def _run(*args: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "planner", *args, "--format", "json"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(out.stderr)
    return json.loads(out.stdout), time.perf_counter() - t0


#: the command-line flags passed on to every planner command
FLAGS = ("--tp-comm-overlap", "--overlap-param-gather", "--stage-boundaries=layers")


def main(search: bool, flags: list[str]) -> None:
    print("| GPUs | Meta (Table 4) | what is priced | ZeRO | chunks a stage | step "
          "| TFLOP/s a GPU | MFU | fill and drain | memory | run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for gpus, dp, micro, meta in RUNS:
        common = [str(NET), str(CL), "-p", str(gpus), "-b", "2048", "--optimizer", "adam",
                  "--pipeline", "16", "--microbatches", str(micro), "--recompute", "auto",
                  *flags]
        rows = [("Meta's layout (cost)", "cost", zero, ["--grid", f"8x{dp}", "--mode",
                                                        "megatron-sp"]) for zero in (1, 2)]
        if search:
            rows.append(("the planner's (plan)", "plan", 1, []))
        for what, command, zero, extra in rows:
            for v in (1, 2, 4):
                doc, secs = _run(command, *common, "--zero", str(zero), "--virtual-stages",
                                 str(v), *extra)
                it, mem = doc["iteration"], doc["memory"]
                # under a pipeline each stage (chunk) recomputes the blocks it needs
                rec = max((int(st["recompute"]) for st in doc["pipeline"]["stage_plans"]
                           if st.get("recompute", "none").isdigit()), default=0)
                print(f"| {gpus:,} | {meta} TFLOP/s | {what} | {zero} | {v} | "
                      f"{it['time_s']:.2f} s | {it['tflops_per_device']:.1f} | "
                      f"{it['mfu']:.1%} | {doc['pipeline']['bubble_fraction']:.1%} | "
                      f"{mem['peak_bytes'] / 2**30:.1f} GiB"
                      + ("" if mem["fits"] else " (does not fit)")
                      + (f", recomputing up to {count(rec, 'block')} a chunk" if rec else "")
                      + f" | {secs:.0f} s |", flush=True)


if __name__ == "__main__":
    main("--search" in sys.argv[1:], [f for f in FLAGS if f in sys.argv[1:]])
