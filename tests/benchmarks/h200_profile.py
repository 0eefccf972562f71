"""What the H200 profiles in ``models/data/h200/`` show (not a test module).

    python tests/benchmarks/h200_profile.py [--models-dir DIR]

Prints the run-to-run spread of each file against its repeat in ``repeat/``, the H200's
time over the H100's for the profiler's sweep (the same 444 shapes, the same driver, CUDA,
PyTorch and cuDNN, ``models/data/h100/``), and, for the models in DIR (the shipped ones by
default), the error on every H200 row: MAPE, median absolute percentage error and the median
of measured over predicted time, per op and dtype. A fit with ``--leave-out H200`` shows
what the models made of the H200 before they saw one. The figures of
``models/data/h200/README.md`` and of the README's "Kernel times" section.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from h100_profile import ratio, spread, times  # one reading of a profile (run as a script)

from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.store import load_models

ROOT = Path(__file__).resolve().parents[2] / "models" / "data"
H200, H100 = ROOT / "h200", ROOT / "h100"
OPS = ("gemm", "bmm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter")
FILES = ("h200_fp32.csv", "h200_bf16.csv", "h200_deepbench_conv_fp32.csv",
         "h200_deepbench_conv_bf16.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    print("run to run (file against repeat/):")
    for name in FILES:
        a, b = times(H200 / name), times(H200 / "repeat" / name)
        for op in OPS:
            if any(k[0] == op for k in a):
                print(f"  {name:30s} {op:16s} {spread(a, b, op)}")
    print("H200 / H100 time, the profiler's sweep:")
    for dt in ("fp32", "bf16"):
        a, b = times(H200 / f"h200_{dt}.csv"), times(H100 / f"h100_{dt}.csv")
        for op in OPS:
            print(f"  {dt} {op:16s} {ratio(a, b, op)}")
    models = load_models(args.models_dir)
    print(f"models {args.models_dir or '(shipped)'} on the H200's rows:")
    for name in FILES:
        data = read_files([str(H200 / name)])
        for fam, tab in (("gemm", data.gemm), ("conv", data.conv)):
            model = models.get(fam)
            if model is None or not len(tab):
                continue
            pred, _ = predict_table(model, tab)
            meas = np.asarray(tab.seconds)
            ops = np.asarray(tab.op)
            for op in OPS:
                m = ops == op
                if not m.any():
                    continue
                ape = np.abs(pred[m] - meas[m]) / meas[m] * 100
                r = meas[m] / pred[m]
                print(f"  {name:30s} {op:16s} n={int(m.sum()):3d}  MAPE {ape.mean():5.1f}%  "
                      f"median APE {np.median(ape):5.1f}%  measured / predicted median "
                      f"{np.median(r):.2f} (10th-90th {np.percentile(r, 10):.2f}-"
                      f"{np.percentile(r, 90):.2f})")


if __name__ == "__main__":
    main()
