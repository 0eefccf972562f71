"""Speed and memory benchmarks of whole commands (not a test module).

    python tests/benchmarks/bench.py [--repeat 5] [--scale]

Runs each command in a fresh process (start-up included, as a user would see it),
``--repeat`` times, and prints the median and worst wall time, the CPU time and the peak
resident memory of the process (from ``wait4``). The README's speed table comes from
this script; ``--scale`` runs the scale cases instead (10,000-layer networks, P = 2^20),
whose figures are in the README's reliability section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import mlp, transformer  # noqa: E402

CLUSTER = """kind: cluster
name: large-h100
devices_per_node: 8
device: H100-SXM
network:
  intra_node: {latency: 3.4 us, bandwidth: 450 GB/s}
  inter_node: {latency: 9.6 us, bandwidth: 400 Gbit/s}
"""


def run(cmd: list[str], expect: int = 0) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one run of ``cmd`` (which must exit ``expect``)."""
    wall, _, rss = run_cpu(cmd, expect)
    return wall, rss


def run_cpu(cmd: list[str], expect: int = 0) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def scale_cases(tmp: Path) -> list[tuple[str, list[str], int]]:
    """10,000-layer networks and 2^20 devices: (label, command, expected exit code)."""
    (tmp / "t10000.yaml").write_text(transformer(10_000))
    (tmp / "m10000.yaml").write_text(mlp(10_000))
    (tmp / "t1000.yaml").write_text(transformer(1000))
    (tmp / "cluster.yaml").write_text(CLUSTER)
    planner = [sys.executable, "-m", "planner"]
    net = ROOT / "examples" / "networks"
    cl = str(tmp / "cluster.yaml")

    def plan(path: Path | str, p: int, b: int) -> list[str]:
        return [*planner, "plan", str(path), cl, "-p", str(p), "-b", str(b), "--format",
                "yaml"]

    return [
        ("plan 10,000-layer transformer, P=1,024, B=128", plan(tmp / "t10000.yaml", 1024, 128),
         0),
        ("plan 10,000-layer MLP (97 widths), P=64, B=512", plan(tmp / "m10000.yaml", 64, 512),
         0),
        ("plan 10,000-layer transformer, P=1,024, B=4,096 (nothing fits: exit 1 after the "
         "memory search)", plan(tmp / "t10000.yaml", 1024, 4096), 1),
        ("show 10,000-layer transformer", [*planner, "show", str(tmp / "t10000.yaml"),
                                           "--format", "yaml"], 0),
        ("plan resnet50, P=2^20, B=2^21", plan(net / "resnet50.yaml", 2**20, 2**21), 0),
        ("plan gpt2-small, P=2^20, B=2^21", plan(net / "gpt2-small.yaml", 2**20, 2**21), 0),
        ("plan 1,000-layer transformer, P=2^20, B=2^21", plan(tmp / "t1000.yaml", 2**20, 2**21),
         0),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", action="store_true",
                    help="the scale cases: 10,000 layers, 2^20 devices")
    args = ap.parse_args()
    # byte-compile the package first, as `pip install` does: where PYTHONDONTWRITEBYTECODE
    # is set (as on the development machines) every run would otherwise compile ~0.1 s
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "planner")],
                   check=True, stdout=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="planner-bench-"))
    if args.scale:
        print("| command | median wall | worst wall | worst CPU | peak memory |\n"
              "|---|---|---|---|---|")
        for label, cmd, expect in scale_cases(tmp):
            runs = [run_cpu(cmd, expect) for _ in range(args.repeat)]
            print(f"| {label} | {statistics.median(r[0] for r in runs):.2f} s "
                  f"| {max(r[0] for r in runs):.2f} s | {max(r[1] for r in runs):.2f} s "
                  f"| {max(r[2] for r in runs):.0f} MiB |", flush=True)
        return
    (tmp / "t1000.yaml").write_text(transformer(1000))
    (tmp / "m1000.yaml").write_text(mlp(1000))
    (tmp / "cluster.yaml").write_text(CLUSTER)
    planner = [sys.executable, "-m", "planner"]
    ex = ROOT / "examples"
    cases = [
        ("plan resnet50, dgx-h100, P=1,024, B=32,768",
         [*planner, "plan", str(ex / "networks/resnet50.yaml"),
          str(ex / "clusters/dgx-h100.yaml"), "-p", "1024", "-b", "32768", "--format",
          "yaml"]),
        ("plan alexnet, cori-knl, P=512, B=2,048 (paper)",
         [*planner, "plan", str(ex / "networks/alexnet.yaml"),
          str(ex / "clusters/cori-knl.yaml"), "-p", "512", "-b", "2048", "--cost-model",
          "gholami2018", "--objective", "comm", "--format", "yaml"]),
        ("plan 1,000-layer transformer, P=65,536, B=131,072",
         [*planner, "plan", str(tmp / "t1000.yaml"), str(tmp / "cluster.yaml"), "-p", "65536",
          "-b", "131072", "--format", "yaml"]),
        ("plan 1,000-layer MLP (500 distinct shapes), P=65,536, B=131,072",
         [*planner, "plan", str(tmp / "m1000.yaml"), str(tmp / "cluster.yaml"), "-p", "65536",
          "-b", "131072", "--format", "yaml"]),
    ]
    print("| command | median | worst | peak memory |\n|---|---|---|---|")
    for label, cmd in cases:
        results = [run(cmd) for _ in range(args.repeat)]
        walls = [w for w, _ in results]
        rss = max(m for _, m in results)
        print(f"| {label} | {statistics.median(walls):.2f} s | {max(walls):.2f} s "
              f"| {rss:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
