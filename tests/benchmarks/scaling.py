"""How well scaling by the work predicts a bigger kernel, on the measurements alone
(not a test module).

    python tests/benchmarks/scaling.py

The learned estimator times a kernel beyond the models' batch range as
``t(N) = (N / N_max) · t(N_max)``. This checks the rule where both sizes were measured:
pairs of kernels on one GPU that differ only in a doubled batch (DeepBench fp32
convolutions: N = 8 → 16 and 16 → 32) or doubled rows (NeuSight's linear test sweep, M
→ 2M, kernels of 0.1 ms and more), and prints the distribution of ``2·t(N) / t(2N)``:
above 1, scaling over-predicts the bigger kernel.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "models" / "data"
CONV_KEY = ("gpu", "W", "H", "C", "K", "filter_w_S", "filter_h_R", "pad_w", "pad_h",
            "stride_w", "stride_h")


def _ratios(times: dict[tuple[str, ...], dict[int, float]], least: int,
            min_ms: float) -> list[float]:
    out = []
    for sizes in times.values():
        for n, t in sizes.items():
            t2 = sizes.get(2 * n)
            if n >= least and t2 and t >= min_ms:
                out.append(2.0 * t / t2)
    return out


def _line(label: str, r: list[float]) -> str:
    a = np.asarray(r)
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return (f"{label:28s} pairs {len(a):5d}  median {p50:.3f}  p10 {p10:.3f}  p90 {p90:.3f}  "
            f"under 0.95: {np.mean(a < 0.95) * 100:4.1f}%")


def main() -> None:
    with open(DATA / "deepbench" / "deepbench_conv.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["precision"] == "fp32"]
    for col in ("fwd_ms", "bwd_data_ms", "bwd_filter_ms"):
        times: dict[tuple[str, ...], dict[int, float]] = defaultdict(dict)
        for r in rows:
            if r[col]:
                key = tuple(r[k] for k in CONV_KEY)
                n, t = int(r["N"]), float(r[col])
                times[key][n] = min(t, times[key].get(n, t))
        print(_line(f"DeepBench conv {col[:-3]}", _ratios(times, 8, 0.0)))
    with open(DATA / "neusight" / "neusight_linear_fp32.csv", newline="") as f:
        lin = [r for r in csv.DictReader(f) if r["split"] == "test"]
    gemm: dict[tuple[str, ...], dict[int, float]] = defaultdict(dict)
    for r in lin:
        key = (r["device"], r["N"], r["K"])
        m, t = int(r["B"]) * int(r["M"]), float(r["latency_ms"])
        gemm[key][m] = min(t, gemm[key].get(m, t))
    print(_line("NeuSight linear rows M", _ratios(gemm, 1, 0.1)))


if __name__ == "__main__":
    main()
