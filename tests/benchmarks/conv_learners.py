"""Off-the-shelf learners against the shipped convolution model (not a test module).

    pip install scikit-learn        # not a dependency of the planner; this script only
    OMP_NUM_THREADS=1 python tests/benchmarks/conv_learners.py [conv_bwd_data conv_bwd_filter]

Whether DeepBench's backward-pass misses (README, *What the misses are*) are the shipped
model's or the data's: trees, forests and nearest neighbours get the same inputs the
model gets, the 33 convolution features of ``planner/kernels/features.py``, plus each
(GPU, dtype) one-hot in place of the model's fitted sustained level. Each learns
``log(t / roofline bound)``, as the model does, from the same training rows (DeepBench's
and the H100 profile's convolutions not held out by the CRC-32 shape split; NeuSight's
forward-only rows, with their per-call overhead, left out), and is judged on DeepBench's
held-out FP32 shapes per GPU, as ``planner kernels eval --split test`` judges the model.
Hyperparameters are chosen by five-fold cross-validation on the training rows grouped by
shape (no held-out row is seen); fixed seeds. About three minutes a pass on 2 cores.
``OMP_NUM_THREADS=1`` keeps gradient boosting from slowing twentyfold when the cores are
shared.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.ensemble import (
    ExtraTreesRegressor,
    HistGradientBoostingRegressor,
    RandomForestRegressor,
)
from sklearn.model_selection import GroupKFold
from sklearn.neighbors import KNeighborsRegressor

from planner.cluster import lookup_device
from planner.kernels.data import read_files
from planner.kernels.evaluate import predict_table
from planner.kernels.features import CONV_FEATURES, DeviceSpecs, features
from planner.kernels.store import load_models, shipped_training_data

GRIDS: dict[str, list[dict[str, Any]]] = {
    "gradient boosting": [
        {"learning_rate": 0.05, "max_leaf_nodes": leaves, "min_samples_leaf": leaf,
         "max_iter": it, "l2_regularization": 1.0}
        for leaves, leaf, it in itertools.product((7, 15), (5, 20), (200, 600))],
    "random forest": [{"min_samples_leaf": leaf, "max_features": f}
                      for leaf in (1, 3) for f in (0.66, 1.0)],
    "extra trees": [{"min_samples_leaf": leaf, "max_features": f}
                    for leaf in (1, 3) for f in (0.66, 1.0)],
}
MAKERS: dict[str, Callable[..., Any]] = {
    "gradient boosting": lambda **k: HistGradientBoostingRegressor(random_state=0, **k),
    "random forest": lambda **k: RandomForestRegressor(n_estimators=300, random_state=0,
                                                       n_jobs=2, **k),
    "extra trees": lambda **k: ExtraTreesRegressor(n_estimators=300, random_state=0,
                                                   n_jobs=2, **k),
}


def main(passes: list[str]) -> None:
    table = read_files([path for _, path in shipped_training_data()]).conv
    spec = DeviceSpecs.build([lookup_device(n) for n in table.device], table.dtype)
    x, t_flop, t_byte = features("conv", table.shape_array(), table.op, spec)
    bound = np.maximum(t_flop, t_byte)
    seconds = np.asarray(table.seconds)
    target = np.log(seconds / bound)
    device = np.asarray(table.device, dtype=object)
    op = np.asarray(table.op, dtype=object)
    harness = np.asarray(table.harness, dtype=object)
    held = np.asarray(table.holdout, dtype=bool)
    fp32 = np.asarray(table.dtype, dtype=object) == "float32"
    key = np.array([f"{d}|{t}" for d, t in zip(table.device, table.dtype, strict=True)])
    used = np.isin(harness, ["deepbench", "profile"])
    onehot = np.column_stack([key == k for k in sorted(set(key[used]))]).astype(float)
    inputs = np.column_stack([x, onehot])
    shape_id = np.unique([str(s) for s in table.shape], return_inverse=True)[1]
    deepbench = harness == "deepbench"
    train = used & ~held
    shipped, _ = predict_table(load_models().get("conv"), table)

    def per_gpu(pred: np.ndarray, which: str) -> dict[str, float]:
        judged = deepbench & held & fp32 & (op == which)
        ape = np.abs(pred - seconds) / seconds * 100.0
        return {g: float(ape[judged & (device == g)].mean())
                for g in sorted(set(device[judged]))}

    def cv(name: str, params: dict[str, Any], rows: np.ndarray, which: str) -> float:
        idx = np.flatnonzero(rows)
        errors = []
        for fit, val in GroupKFold(5).split(idx, groups=shape_id[idx]):
            model = MAKERS[name](**params).fit(inputs[idx[fit]], target[idx[fit]])
            v = idx[val]
            v = v[deepbench[v] & fp32[v] & (op[v] == which)]
            pred = bound[v] * np.exp(model.predict(inputs[v]))
            errors.append(np.abs(pred - seconds[v]) / seconds[v])
        return float(np.mean(np.concatenate(errors)) * 100.0)

    for which in passes:
        results = {"shipped model (ten MLPs)": per_gpu(shipped, which)}
        for scope in ("per pass", "all passes"):
            rows = train & (op == which) if scope == "per pass" else train
            for name, grid in GRIDS.items():
                scores = [cv(name, params, rows, which) for params in grid]
                best = grid[int(np.argmin(scores))]
                model = MAKERS[name](**best).fit(inputs[rows], target[rows])
                results[f"{name}, {scope}"] = per_gpu(bound * np.exp(model.predict(inputs)),
                                                      which)
        shape_cols = [i for i, f in enumerate(CONV_FEATURES) if not f.startswith(("phase_",
                                                                                  "elem"))]
        pred = np.full(len(target), np.nan)
        for k in sorted(set(key[deepbench])):  # the nearest training shape, same GPU
            fit = train & (key == k) & (op == which)
            test = deepbench & held & (key == k) & (op == which)
            if fit.any() and test.any():
                z = x[:, shape_cols]
                mu, sd = z[fit].mean(0), z[fit].std(0) + 1e-9
                knn = KNeighborsRegressor(n_neighbors=1).fit((z[fit] - mu) / sd, target[fit])
                pred[test] = bound[test] * np.exp(knn.predict((z[test] - mu) / sd))
        results["nearest shape, same GPU"] = per_gpu(pred, which)
        gpus = list(results["shipped model (ten MLPs)"])
        print(f"\n{which}: held-out FP32 MAPE per GPU (%)")
        width = max(map(len, gpus)) + 1
        print(f"{'learner':<30}" + "".join(f"{g:>{width}}" for g in gpus)
              + f"{'mean':>7}{'<=15':>6}")
        for name, r in results.items():
            cells = [r[g] for g in gpus]
            print(f"{name:<30}" + "".join(f"{c:{width}.1f}" for c in cells)
                  + f"{np.mean(cells):7.1f}{sum(c <= 15.0 for c in cells):6d}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["conv_bwd_data", "conv_bwd_filter"])
