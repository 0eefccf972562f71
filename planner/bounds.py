"""Lower bounds on a step, to skip the searches that cannot beat a plan in hand.

``--pipeline auto`` searches every stage count, ``--virtual-stages auto`` every chunk
count and ``--schedule auto`` both schedules, each a search per stage (per ZeRO stage
and recomputed block count, with those ``auto`` too). Most of them lose by far: Llama 3
8B on 64 H100s at batch 64 in one microbatch takes 0.936 s without stages, 1.561 s in 2
and 6.018 s in 8. A bound that costs a few milliseconds proves that before the seconds
of search are spent.

**Compute floor.** Every layout of a layer runs its kernels on each device of its
grid, and a device runs its kernels one after another, so no plan on ``P′`` devices at
``b`` samples computes a layer in less than the least, over every layout that applies
at ``P′`` and ``b`` (the search's candidates and every other mode and grid
:func:`~planner.strategies.why_invalid` accepts, which a baseline or a pin may use), of
its kernels' time on one device, timed by the estimator the search uses. The floor
``T`` of a network is the sum over its layers with weights (the layers without weights,
the optimizer step and every collective only add to a plan, and are left out). It is
taken again without the weight-gradient kernels (``T_FB``, for ZB-H1, whose W passes
nobody waits for).

**Step floor.** A pipeline of ``S`` stages on ``P/S`` devices each, ``M`` microbatches
of ``B/M``: stage ``s`` takes ``t_s`` a microbatch, forward and backward, and
``Σ_s t_s ≥ T`` (``T`` at ``P/S`` devices and ``B/M`` samples: cutting the network
into stages only parts its layers). Under 1F1B stage ``k`` cannot begin before the
first microbatch's forward passes through the stages before it, runs ``M·t_k`` of
passes one after another, and its last backward pass (of the last microbatch) still
has to go back through those stages, so the step is at least
``max_k (Σ_{s<k} t_s + M·t_k)``. The stage times that make that least are equal bounds
``L``: ``L − Σ_{s≤k} t_s = (L − Σ_{s<k} t_s)·(1 − 1/M)``, so
``L = T / (1 − (1 − 1/M)^S)`` (with ``M = 1``: ``T``, the stages in turn; as ``M``
grows, ``T·(M + (S − 1)/2)/S``: half the bubble of equal stages,
``T·(M + S − 1)/S``). Any stage times below ``L`` everywhere would sum below ``T``.
ZB-H1 defers each W, so its chain counts ``F + B`` only: ``T_FB / (1 − (1 − 1/M)^S)``,
and never less than a stage's work, ``M·T/S``. Interleaved stages: a microbatch
crosses every chunk, ``T``, and the busiest stage does ``M·T/S``. No pipeline: ``M·T``.
Each bound leaves out the sends, the gradient reductions, the optimizer step and the
tied weights' all-reduce, which only add.

A count is skipped when its bound is at least the best step found so far at the same
microbatch count (``1 + 10⁻⁹`` of it: sums in another order differ in the last bits),
so the plan and every step recorded for a count searched are what searching every
count gives; the skipped ones are recorded with their bound (outcome ``bound``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .costs.layer import cost_signature, weighted_kernels
from .layout import MODES, Layout, divisors, make_layout
from .schedules import SCHEDULE, ZERO_BUBBLE
from .strategies import candidate_layouts, why_invalid

#: a bound must exceed the best by this share to skip a search (sums of the same times
#: in another order differ in their last bits)
SKIP_MARGIN = 1e-9


@dataclass(frozen=True)
class Floor:
    """The least compute of one microbatch through a network on ``P′`` devices."""

    total_s: float  #: every kernel of every layer with weights (``T``)
    chained_s: float  #: the same without the weight-gradient kernels (``T_FB``)


def layouts_that_apply(layer: Any, gpus: int, batch: int, paper: bool) -> list[Layout]:
    """Every layout of ``layer`` at ``gpus`` devices and ``batch`` samples, one per
    mode and grid (placements compute alike): the search's candidates and every mode
    on every grid that :func:`why_invalid` accepts."""
    shapes: dict[tuple[str, int, int], Layout] = {}
    for lay in candidate_layouts(layer, gpus, batch, paper):
        shapes.setdefault((lay.mode, lay.pr, lay.pc), lay)
    for pr in divisors(gpus):
        for mode in MODES if pr > 1 else ("data",):
            lay = make_layout(mode, pr, gpus // pr)
            key = (lay.mode, lay.pr, lay.pc)
            if key not in shapes and why_invalid(layer, lay, batch, paper) is None:
                shapes[key] = lay
    return list(shapes.values())


def compute_floor(ctx: Any) -> Floor:
    """:class:`Floor` of ``ctx``'s network at its devices and batch (the microbatch)."""
    kernels: list[Any] = []
    owners: list[tuple[int, int, bool]] = []  # (signature, layout, weight-gradient)
    counts: list[int] = []
    signatures: dict[tuple[object, ...], int] = {}
    layouts: list[int] = []
    for layer in ctx.network.layers:
        if not layer.has_weights:
            continue
        sig = cost_signature(layer, ctx)
        if sig in signatures:
            counts[signatures[sig]] += 1
            continue
        k = signatures[sig] = len(counts)
        counts.append(1)
        lays = layouts_that_apply(layer, ctx.gpus, ctx.batch, ctx.paper)
        layouts.append(len(lays))
        for j, lay in enumerate(lays):
            prods = weighted_kernels(layer, lay, ctx)
            for part in ("forward", "backward_data", "backward_weight"):
                kernels.extend(prods[part])
                owners.extend([(k, j, part == "backward_weight")] * len(prods[part]))
    if not kernels:
        return Floor(0.0, 0.0)
    secs = ctx.estimator.estimate(kernels, ctx.cluster.device, ctx.network.dtype).seconds
    total = [[0.0] * n for n in layouts]
    chained = [[0.0] * n for n in layouts]
    for (k, j, weight), s in zip(owners, secs, strict=True):
        total[k][j] += float(s)
        if not weight:
            chained[k][j] += float(s)
    return Floor(sum(n * min(t) for n, t in zip(counts, total, strict=True) if t),
                 sum(n * min(c) for n, c in zip(counts, chained, strict=True) if c))


def step_floor(floor: Floor, stages: int, microbatches: int, virtual: int = 1,
               schedule: str = SCHEDULE) -> float:
    """No step of ``stages`` stages (``virtual`` chunks each) under ``schedule`` with
    ``microbatches`` is faster than this, ``floor`` being the network's at the stage's
    devices and the microbatch (the module's derivation)."""
    t, m, s = floor.total_s, microbatches, stages
    if s == 1:
        return m * t
    work = m * t / s
    if virtual > 1:
        return max(work, t)
    chain = 1.0 - (1.0 - 1.0 / m) ** s
    if schedule == ZERO_BUBBLE:
        return max(work, floor.chained_s / chain)
    return t / chain


def beaten(bound: float, best: float | None) -> bool:
    """Whether a search whose step is at least ``bound`` cannot beat ``best``."""
    return best is not None and bound >= best * (1.0 + SKIP_MARGIN)
