"""Small builders shared by the cost and search tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.cluster import Cluster, Link, lookup_device
from planner.costs.compute import KernelTimes
from planner.inputs import load_network_text


def cluster(per_node: int = 8, nodes: int | None = None, intra=(2e-6, 100e9),
            inter=(5e-6, 10e9), device: str = "H100-SXM", algorithm: str = "auto",
            **link_extra) -> Cluster:
    """A two-tier cluster with round numbers."""
    return Cluster(name="test", devices_per_node=per_node, device=lookup_device(device),
                   intra=Link(intra[0], intra[1], "intra", **link_extra),
                   inter=Link(inter[0], inter[1], "inter"), nodes=nodes,
                   algorithm=algorithm)


def mlp(widths: Sequence[int], bias: bool = True, dtype: str = "float32", extra: str = "",
        relu: bool = True):
    """An MLP: linear layers of the given widths (with ReLU between them)."""
    lines = ["kind: network", "name: mlp", f"input: [{widths[0]}]", f"dtype: {dtype}",
             "layers:"]
    for i, w in enumerate(widths[1:]):
        lines.append(f"  - {{name: fc{i + 1}, type: linear, out_features: {w}, "
                     f"bias: {str(bias).lower()}}}")
        if relu and i < len(widths) - 2:
            lines.append(f"  - {{name: relu{i + 1}, type: relu}}")
    return load_network_text("\n".join(lines) + "\n" + extra)


class FixedEstimator:
    """Every kernel takes the same time (to check timelines by hand)."""

    name = "fixed"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def estimate(self, kernels, device, dtype) -> KernelTimes:
        return KernelTimes(np.full(len(kernels), self.seconds), ("fixed",) * len(kernels))


class RateEstimator:
    """A GEMM takes its FLOPs over ``rate``; anything else its bytes over ``rate``; each
    kernel ``launch`` seconds more (to check overlaps by hand)."""

    name = "rate"

    def __init__(self, rate: float, launch: float = 0.0) -> None:
        self.rate, self.launch = rate, launch

    def seconds(self, k) -> float:
        from planner.ops import Gemm

        work = k.flops if isinstance(k, Gemm) else k.bytes_moved(4)
        return work / self.rate + self.launch

    def estimate(self, kernels, device, dtype) -> KernelTimes:
        return KernelTimes(np.array([self.seconds(k) for k in kernels]),
                           ("rate",) * len(kernels))


def program_and_evaluation(net, cl, opts):
    """The search's dynamic program on a question (no memory weight) and the evaluation
    of its answer: ``(program value, Evaluation)``, which tests hold equal."""
    from planner.evaluate import make_context

    value, _, ev = solved(make_context(net, cl, opts), opts)
    return value, ev


def solved(ctx, opts, pins=None):
    """The search's dynamic program on a context (no memory weight; ``pins``: layer
    index → the layouts it may take) and the evaluation of its answer: ``(program value,
    assignment, Evaluation)``, which tests hold equal."""
    from planner.evaluate import evaluate
    from planner.search import Space, Weights, solve

    space = Space(ctx, opts, pins or {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    return value, assignment, evaluate(ctx, opts, assignment)
