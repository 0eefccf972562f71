"""``--jobs``: wall time of whole commands with one job and with more (not a test module).

    python tests/benchmarks/jobs.py [--jobs 2] [--repeat 2] [--long]

Runs each question with ``--jobs 1`` and with ``--jobs N`` alternately, each in a fresh
process, one at a time, and checks that the two write the same bytes (the plan, the
sweep, the check report). Prints each run's wall time, for the README's *Speed* table.
``--long`` adds Llama 3 70B on 64 GPUs with its pipeline, ZeRO stage and recomputation
chosen (minutes a run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NET = ROOT / "examples" / "networks"
DGX = str(ROOT / "examples" / "clusters" / "dgx-h100.yaml")


def questions(long: bool) -> list[tuple[str, list[str]]]:
    plan = [sys.executable, "-m", "planner", "plan"]
    out = [
        ("Llama 3 8B, -p 64 -b 64, pipeline, microbatches, ZeRO, recompute auto",
         [*plan, str(NET / "llama3-8b.yaml"), DGX, "-p", "64", "-b", "64", "--optimizer",
          "adam", "--pipeline", "auto", "--microbatches", "auto", "--zero", "auto",
          "--recompute", "auto", "--format", "json"]),
        ("GPT-2 small, -p 16 -b 32, pipeline and microbatches auto",
         [*plan, str(NET / "gpt2-small.yaml"), DGX, "-p", "16", "-b", "32", "--optimizer",
          "adam", "--pipeline", "auto", "--microbatches", "auto", "--format", "json"]),
        ("sweep Llama 3 8B, -p 8,16,32,64 -b 64,256, ZeRO auto",
         [sys.executable, "-m", "planner", "sweep", str(NET / "llama3-8b.yaml"), DGX,
          "-p", "8,16,32,64", "-b", "64,256", "--optimizer", "adam", "--zero", "auto",
          "--format", "json"]),
        ("check, the five examples/ci configurations",
         [sys.executable, "-m", "planner", "check", "--format", "json",
          *(f"examples/ci/{c}.yaml" for c in ("resnet50-dgx", "gpt2-does-not-fit",
                                              "broken", "alexnet-too-slow",
                                              "llama3-8b-megatron"))]),
    ]
    if long:
        out.insert(0, (
            "Llama 3 70B, -p 64 -b 256, 8 microbatches, pipeline, ZeRO, recompute auto",
            [*plan, str(NET / "llama3-70b.yaml"), DGX, "-p", "64", "-b", "256",
             "--optimizer", "adam", "--microbatches", "8", "--pipeline", "auto", "--zero",
             "auto", "--recompute", "auto", "--format", "json"]))
    return out


def run(cmd: list[str], jobs: int) -> tuple[float, bytes]:
    """Wall seconds and standard output of one run with ``jobs`` jobs."""
    start = time.perf_counter()
    proc = subprocess.run([*cmd, "--jobs", str(jobs)], cwd=ROOT, capture_output=True,
                          check=False)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1, 2):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                         f"{proc.stderr.decode()}")
    return wall, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--long", action="store_true")
    args = ap.parse_args()
    print(f"| question | --jobs 1 | --jobs {args.jobs} |\n|---|---|---|")
    for label, cmd in questions(args.long):
        one, many = [], []
        for _ in range(args.repeat):
            t1, out1 = run(cmd, 1)
            tn, outn = run(cmd, args.jobs)
            if out1 != outn:
                raise SystemExit(f"{label}: --jobs 1 and --jobs {args.jobs} differ")
            one.append(t1)
            many.append(tn)
        print(f"| {label} | {' / '.join(f'{t:.2f} s' for t in one)} | "
              f"{' / '.join(f'{t:.2f} s' for t in many)} |", flush=True)


if __name__ == "__main__":
    main()
