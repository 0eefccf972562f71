"""planner: a parallelization planner for training deep neural networks on many GPUs.

The library API (the CLI is a thin layer on top of it)::

    from planner import load_network, load_cluster
    net = load_network("examples/networks/resnet50.yaml")
    print(net.params)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .cluster import Cluster, Device, Link
from .errors import InputError, ModelDataError, NoFeasiblePlan, PlannerError
from .inputs import load_cluster, load_network
from .network import Layer, Network

__all__ = [
    "Cluster",
    "Device",
    "InputError",
    "Layer",
    "Link",
    "ModelDataError",
    "Network",
    "NoFeasiblePlan",
    "PlannerError",
    "__version__",
    "load_cluster",
    "load_network",
]
