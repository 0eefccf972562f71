"""Memory per device: parameters, gradients, optimizer state, activations kept for
backward, communication buffers and the working set of the busiest layer.

Bytes per parameter (``e`` = bytes of the network dtype):

==========================  ========  =========  =================================
setting                     weights   gradients  optimizer state
==========================  ========  =========  =================================
sgd                         e         g          0
momentum (SGD)              e         g          e            (one buffer)
adam                        e         g          2e           (first and second moments)
… with master weights       e         g          4 + n·4      (fp32 copy + fp32 states)
==========================  ========  =========  =================================

``g`` = ``e`` unless the gradients are kept in another dtype.

So fp32 Adam is 16 bytes per parameter and bf16 Adam with fp32 master weights is
2 + 2 + 12 = 16 (Rajbhandari et al., ZeRO, SC'20, §3.1). Master weights are the default
for 16-bit dtypes. Gradients may be accumulated and reduced in a wider dtype than the
weights (``--grad-precision``): Megatron-LM keeps a bf16 model's gradients in fp32,
2 + 4 + 12 = 18 bytes for Adam, and 6 + 12/d under its distributed optimizer, ZeRO stage 1
over ``d`` replicas (the Megatron Core developer guide, "Distributed Optimizer", its
table of bytes per parameter). ZeRO divides columns by the ``R`` devices that hold the
same parameters (:func:`sharded`): stage 1 the optimizer state (with master weights, the
fp32 copy is part of it, as in the paper), stage 2 the gradients too, stage 3 the weights
too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPTIMIZERS = ("sgd", "momentum", "adam")
_STATES = {"sgd": 0, "momentum": 1, "adam": 2}


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter element for weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """All bytes per parameter."""
        return self.weights + self.gradients + self.optimizer

    @property
    def update_traffic(self) -> float:
        """Bytes the optimizer step moves per parameter: read and write the weights and
        states, read the gradient."""
        return 2 * self.weights + self.gradients + 2 * self.optimizer


def sharded(pb: ParamBytes, zero: int, replicas: float) -> ParamBytes:
    """The bytes per parameter element one device keeps when ZeRO stage ``zero`` shards
    them over the ``replicas`` devices that hold the same parameters (Rajbhandari et al.,
    SC'20, §5): stage 1 the optimizer state, stage 2 the gradients too, stage 3 the
    weights too."""
    r = float(max(replicas, 1))
    return ParamBytes(pb.weights / (r if zero >= 3 else 1.0),
                      pb.gradients / (r if zero >= 2 else 1.0),
                      pb.optimizer / (r if zero >= 1 else 1.0))


def param_bytes(optimizer: str, elem_bytes: int, master_weights: bool | None = None,
                grad_bytes: int | None = None) -> ParamBytes:
    """Bytes per parameter for an optimizer and dtype (see the module table); gradients
    of ``grad_bytes`` (default: the weights' ``elem_bytes``)."""
    if optimizer not in _STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    master = uses_master_weights(elem_bytes, master_weights)
    n = _STATES[optimizer]
    state = 4.0 + 4.0 * n if master else float(elem_bytes * n)
    return ParamBytes(float(elem_bytes), float(grad_bytes or elem_bytes), state)


@dataclass(frozen=True)
class MemoryReport:
    """Peak memory of the busiest device, by part, against its capacity."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    comm_buffers: float
    workspace: float
    capacity: float
    #: under recomputation, each recomputed block's working set when it is rebuilt, and
    #: the activations kept at the start of the backward pass (``activations`` is the
    #: larger of those and each rebuild's moment); not in the plan document
    rebuilt: tuple[float, ...] = ()
    kept: float = 0.0

    @property
    def peak(self) -> float:
        """The sum of the parts: everything is live at the start of the backward pass."""
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.comm_buffers + self.workspace)

    @property
    def per_batch(self) -> float:
        """What falls with the batch: the activations kept and the workspace (the busiest
        layer's gradients in flight, as large as the logits' gradient for a language
        model)."""
        return self.activations + self.workspace

    @property
    def fits(self) -> bool:
        """Whether the peak fits in the capacity."""
        return self.peak <= self.capacity

    def to_data(self) -> dict[str, object]:
        """Plain data for the plan document (with recomputation, what the activations'
        peak is made of: what is kept at the start of the backward pass and the
        largest working set a rebuilt block adds)."""
        names = ("weights", "gradients", "optimizer", "activations", "comm_buffers",
                 "workspace")
        parts = whole_parts([getattr(self, n) for n in names])
        data: dict[str, object] = {
            "peak_bytes": sum(parts),
            "capacity_bytes": self.capacity,
            "fits": self.fits,
            "breakdown": dict(zip(names, parts, strict=True)),
        }
        if self.rebuilt:
            data["recompute"] = {"kept_bytes": self.kept,
                                 "largest_rebuild_bytes": max(self.rebuilt),
                                 "blocks": len(self.rebuilt)}
        return data


def whole_parts(values: list[float]) -> list[int]:
    """Whole bytes for parts that may hold fractions (a ZeRO shard of an odd count),
    summing to their total rounded: each part rounded down, and the bytes left over
    given to the largest fractions (earliest first on ties). Rounded one at a time, the
    parts were 1-2 bytes off the peak (an audit)."""
    floors = [math.floor(v) for v in values]
    left = round(sum(values)) - sum(floors)
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    for i in order[:max(0, left)]:
        floors[i] += 1
    return floors


def uses_master_weights(elem_bytes: int, master_weights: bool | None) -> bool:
    """Whether fp32 master weights are kept (default: for 16-bit dtypes)."""
    return (elem_bytes < 4) if master_weights is None else master_weights
