"""Whether the convolution ensemble's misses are a few members' outliers (not a test module).

    python tests/benchmarks/conv_combiners.py [--models-dir DIR] [CSV ...]

The shipped convolution model averages ten networks' log times (their geometric mean).
If a held-out shape were missed because one or two members predicted it far off (as
single networks do: *Why ten networks for convolutions* in the README), a robust
combination would miss it less: the median of the ten log times, or their mean with
the highest and lowest one (``trim 1``) or two (``trim 2``) left out. This prints, per
pass and dtype, the mean over the GPUs of each GPU's MAPE on the held-out and on the
training shapes for the four combinations (by default on DeepBench's convolutions; the
rows' harness overheads and drifts are applied per member, as ``kernels eval`` does).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from planner.kernels.data import read_files
from planner.kernels.evaluate import member_log_times
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2]
CONV = ROOT / "models" / "data" / "deepbench" / "deepbench_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=[str(CONV)])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    table = read_files(args.files).conv
    logs, _ = member_log_times(load_models(args.models_dir).get("conv"), table)
    ranked = np.sort(logs, axis=0)
    combined = {"mean": logs.mean(axis=0), "median": np.median(logs, axis=0),
                "trim 1": ranked[1:-1].mean(axis=0), "trim 2": ranked[2:-2].mean(axis=0)}
    measured = np.asarray(table.seconds)
    held = np.asarray(table.holdout)
    groups = sorted({(op, dt) for op, dt in zip(table.op, table.dtype, strict=True)})
    print("mean over GPUs of each GPU's MAPE (%), by pass and dtype")
    print(f"{'split':<6} {'combined':<8} " + " ".join(f"{op[5:] + ' ' + dt:>24}"
                                                       for op, dt in groups))
    for split, mask in (("test", held), ("train", ~held)):
        for name, log_t in combined.items():
            ape = np.abs(np.exp(log_t) / measured - 1.0) * 100.0
            per: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
                lambda: defaultdict(list))
            for i in np.flatnonzero(mask):
                per[(table.op[i], table.dtype[i])][table.device[i]].append(float(ape[i]))
            cells = [np.mean([np.mean(v) for v in per[g].values()]) if per[g] else np.nan
                     for g in groups]
            print(f"{split:<6} {name:<8} " + " ".join(f"{c:>24.2f}" for c in cells))


if __name__ == "__main__":
    main()
