"""Learned hardware models: kernel times from real measurements (numpy inference).

The model predicts the achieved fraction of a kernel's roofline bound from its shape and
the GPU's datasheet specs, so it is bounded by the roofline by construction and carries
over to GPUs it has not seen (NeuSight, Lee et al., ASPLOS'25; Habitat, Yu et al.,
ATC'21; roofline: Williams, Waterman & Patterson, CACM 2009). Modules:

* :mod:`.data` — the CSV layouts (NeuSight, DeepBench, the profiler's) and held-out split;
* :mod:`.features` — shape and GPU features, the roofline bound;
* :mod:`.mlp`, :mod:`.model` — numpy inference; :mod:`.train` — numpy/scipy fitting;
* :mod:`.store` — model files, manifest, checksums, lookup;
* :mod:`.estimator` — :class:`LearnedEstimator` for the cost model;
* :mod:`.evaluate`, :mod:`.pipeline` — accuracy and the ``planner kernels`` commands;
* :mod:`.profile` — measuring kernels with PyTorch (optional).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ModelDataError
from .estimator import LearnedEstimator
from .store import ModelSet, find_models_dir, load_models


def learned_estimator(models_dir: str | os.PathLike[str] | None = None,
                      required: bool = False) -> Any:
    """The learned estimator, or the roofline when no models are installed at all.

    Models that exist but fail their checks (checksum, features) always raise
    :class:`~planner.errors.ModelDataError`; so does a missing model directory when
    ``required`` or when ``models_dir`` names one.
    """
    try:
        find_models_dir(models_dir)
    except ModelDataError:
        if required or models_dir is not None or os.environ.get("PLANNER_MODELS"):
            raise
        from ..costs.compute import Roofline

        return Roofline()
    return LearnedEstimator(models_dir=models_dir)


__all__ = ["LearnedEstimator", "ModelSet", "find_models_dir", "learned_estimator",
           "load_models"]
