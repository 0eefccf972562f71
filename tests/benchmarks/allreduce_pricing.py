"""What a plan charges for a one-node all-reduce against the measurements (not a test
module).

    python tests/benchmarks/allreduce_pricing.py

For the shipped clusters fitted to measurements (``dgx-h100.yaml`` to the 8×H200 NVSwitch
sweep, ``pcie-8gpu.yaml`` to DeepBench's Tesla P100 box), prices every measured one-node
all-reduce with ``collective_time`` under ``algorithm: auto`` (the path every plan takes)
with the cluster's collective library as NCCL and as MPI, and prints the mean absolute
percentage error per rank count: the table of the README's *Collectives on a two-tier
network*.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

import planner.cli  # noqa: F401  (loads the command modules in their order)
from planner.commfit import read_samples
from planner.costs.comm import Group, collective_time
from planner.inputs import load_cluster

ROOT = Path(__file__).resolve().parents[2]
CASES = (
    ("dgx-h100.yaml", "ml-engineering-allreduce/allreduce_8xH200_nvswitch.csv", None),
    ("pcie-8gpu.yaml", "deepbench/deepbench_allreduce.csv", "Tesla P100"),
)


def main() -> None:
    print("| cluster | measurements | library | MAPE per rank count |")
    print("|---|---|---|---|")
    for example, data, system in CASES:
        base = load_cluster(ROOT / "examples" / "clusters" / example)
        samples = [s for s in read_samples([ROOT / "models" / "data" / data])
                   if (system is None or s.system == system) and s.nodes == 1
                   and s.op == "all_reduce"]
        for library in ("mpi", "nccl"):
            cl = dataclasses.replace(base, library=library)
            errors: dict[int, list[float]] = {}
            for s in samples:
                t, _ = collective_time("all_reduce", float(s.nbytes),
                                       Group(s.ranks, s.ranks), cl)
                errors.setdefault(s.ranks, []).append(abs(t - s.seconds) / s.seconds)
            cells = " / ".join(f"{k}: {100 * np.mean(v):.1f}%" for k, v in
                               sorted(errors.items()))
            print(f"| {example} | {data.split('/')[-1]} ({system or 'all'}) | {library} | "
                  f"{cells} |")


if __name__ == "__main__":
    main()
