"""The search: one layout per layer with weights, by dynamic programming over the layer
sequence, with residual blocks, redistribution on every transition and shortcut, pins,
baselines and the memory constraint.

**The dynamic program.** A state is the distribution of the current activation (which
device holds which samples and rows, :class:`~planner.layout.Dist`). A layer with weights
moves every state to the output distribution of each of its candidate layouts, paying
the redistribution from the state to the layout's input distribution plus the layout's
own cost; a layer without weights maps each state to the distribution it leaves behind,
paying what that distribution needs (halos, a gather). Inside a residual block the state
is a pair: the distribution at the block's entry travels along with the current one (and
the body's output along the shortcut), so the add pays the shortcut's real
redistribution. The optimum over these states is exact for any objective that is a sum
over layers: iteration time or communication time (``--objective comm``) without
overlap (with it, gradient buckets fuse neighbouring layers' all-reduces); the
brute-force tests check it against every combination of layouts.

**Overlap and memory.** With ``overlap: gradients`` the iteration time is not a sum over
layers (gradient all-reduces queue on one channel behind the backward pass). The search
then solves the additive problem for weights ``κ`` of the gradient term (1: no hiding,
0: perfect hiding; and 0.5, 0.25 when those two disagree), scores each answer with the
real timeline (:mod:`planner.evaluate`) and keeps the best, which a local search on the
timeline then improves a layer, or a run of layers, at a time (:func:`improve`); the
optimum at κ = 0 is a lower bound on every assignment's time, recorded in the plan.
Memory per device is a constraint: when the optimum does not fit, the weight of a
Lagrangian memory term is set by walking the convex hull of time against memory
(:func:`_fit_memory`), and the fastest answers that do not fit are moved one layer at a
time until they do (:func:`repair`). The baselines (pure data, pure model, the best
single grid, Gholami's scheme) are scored the same way, and the plan returned is never
slower than a baseline that fits.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from .costs.layer import (
    CommTerm,
    Context,
    cost_signature,
    follower_kernels,
    follower_terms,
    held,
    local_params,
    loss_cost,
    optimizer_kernel,
    recompute_value,
    recomputed,
    redistribute_key,
    redistribute_seconds,
    stepped,
    weighted_kernels,
    weighted_terms,
)
from .costs.memory import MemoryReport, sharded
from .errors import NoFeasiblePlan, Shortfall, UsageError
from .evaluate import (
    ZERO_STAGES,
    EvalCache,
    Evaluation,
    Options,
    evaluate,
    evaluate_fitting,
    kept_input_bytes,
    local_elems,
    memory_of,
    own_kept_bytes,
    prefetches,
    question_param_bytes,
    sharded_gradients,
    time_and_comm,
    zero_label,
)
from .layout import (
    SEQUENCE_MODES,
    Dist,
    Layout,
    divisors,
    holds_alike,
    input_dist,
    make_layout,
)
from .network import Layer
from .ops import Elementwise, Kernel
from .strategies import CONTEXT_MODE, candidate_layouts, grid_layout, megatron_modes, why_invalid
from .units import MAX_GPUS, format_bytes, format_time

T = TypeVar("T")
INF = math.inf
OBJECTIVES = ("time", "comm")


@dataclass(frozen=True)
class Weights:
    """Weights of the parts of the additive objective the dynamic program minimises."""

    compute: float = 1.0
    activation: float = 1.0  #: forward, backward-data, halo and redistribution traffic
    #: weight-gradient all-reduces, and ZeRO stage 3's prefetched parameter gathers:
    #: what may overlap compute
    gradient: float = 1.0
    memory: float = 0.0  #: seconds per byte (a Lagrange multiplier)
    #: the largest collective buffer a layer with weights may hold (bytes; the memory
    #: search's bound on the peak's transient part, which is not additive)
    buffer_cap: float = INF
    #: the share of the optimizer step a microbatch carries, within its compute: the parts
    #: are one microbatch's and the step runs once a step, so under gradient
    #: accumulation 1/M (counted whole in every microbatch, it weighed M times against
    #: layouts that hold their weights whole)
    step_share: float = 1.0
    #: what runs once a step after it (ZeRO 1-2's gather of the updated parameters, the
    #: sequence-parallel norms' gradient all-reduce): ``gradient``'s weight where None;
    #: under ZeRO 2-3 with microbatches the gradients are reduced every microbatch
    #: (``gradient`` 1) and these once a step (1/M)
    update: float | None = None


# Columns of a part vector: compute, activation comm, gradient comm, memory bytes, the
# optimizer step's compute, the communication after the step
_C, _A, _G, _M, _U, _S = 0, 1, 2, 3, 4, 5
_PARTS = 6


def _score(parts: np.ndarray, w: Weights) -> np.ndarray:
    score: np.ndarray = (parts[..., _C] * w.compute + parts[..., _A] * w.activation
                         + parts[..., _G] * w.gradient + parts[..., _M] * w.memory
                         + parts[..., _U] * (w.compute * w.step_share)
                         + parts[..., _S] * (w.gradient if w.update is None else w.update))
    return score


class Space:
    """Every cost the dynamic program needs, computed once per search."""

    def __init__(self, ctx: Context, options: Options, pins: dict[int, list[Layout]],
                 objective: str = "time") -> None:
        self.ctx = ctx
        self.options = options
        self.objective = objective
        self.pinned = set(pins)
        self.cache = EvalCache()
        net = ctx.network
        self._sig = self.cache.signature_ids(ctx)
        self.layers = net.layers
        paper = ctx.paper
        p, b = options.gpus, options.batch
        self.candidates: dict[int, list[Layout]] = {}
        for layer in self.layers:
            if not layer.has_weights:
                continue
            if layer.index in pins:
                self.candidates[layer.index] = list(pins[layer.index])
            else:
                self.candidates[layer.index] = list(candidate_layouts(layer, p, b, paper))
        # layers that share a weight hold it alike: each group's candidate lists are
        # aligned, position j of every member one way of holding it (valid and pinned
        # for all), so the owner may repeat a layout (a model-split embedding goes with
        # a model or a column head, see holds_alike)
        self.ties: list[tuple[int, ...]] = []
        for owner, tied in net.ties.items():
            group = (owner, *(t for t in tied if t in self.candidates))
            if owner not in self.candidates or len(group) < 2:
                continue
            common = [(o, *combo) for o in self.candidates[owner]
                      for combo in itertools.product(*(
                          [m for m in self.candidates[t] if holds_alike(o, m)]
                          for t in group[1:]))]
            if not common:
                names = ", ".join(f"'{self.layers[t].name}'" for t in group[1:])
                raise UsageError(
                    f"planner: error: {names} "
                    f"{'shares' if len(group) == 2 else 'share'} the weights of "
                    f"'{self.layers[owner].name}' (tie) and so its layout, but no layout "
                    "is allowed for all of them; pin them alike (or not at all)")
            for k, t in enumerate(group):
                self.candidates[t] = [row[k] for row in common]
            self.ties.append(group)
        empty = [self.layers[i].name for i, c in self.candidates.items() if not c]
        if empty:
            prime = f"; {p} is prime, so the only grids are 1x{p} and {p}x1" if len(
                divisors(p)) == 2 else ""
            raise NoFeasiblePlan(
                f"planner: no feasible plan: no layout applies to layer '{empty[0]}' with "
                f"{p} devices and batch {b} "
                "(a batch smaller than the device count leaves only model and domain "
                f"splits, and this layer allows none{prime}); use fewer devices or a larger "
                "batch", None)
        # distributions: the layouts' own, and what followers turn them into
        self.dists: list[Dist] = []
        self.index: dict[Dist, int] = {}
        for lays in self.candidates.values():
            for lay in lays:
                self._dist(input_dist(lay))
                self._dist(lay.output_dist())
        for d in list(self.dists):
            self._dist(Dist(d.p, d.batch, None))
        self.pb = question_param_bytes(ctx.network, options)
        self.prefetch = prefetches(ctx, options)
        self._weighted: dict[tuple[Any, ...], np.ndarray] = {}
        #: per weighted key: each candidate's largest collective buffer (bytes)
        self._buffers: dict[tuple[Any, ...], np.ndarray] = {}
        self._follow: dict[tuple[Any, ...], tuple[np.ndarray, int]] = {}
        self._trans: dict[float, np.ndarray] = {}
        self._trans_fwd: dict[float, np.ndarray] = {}  # forward moves only (recomputation)
        self._moves: dict[int, np.ndarray] = {}
        self._follow_arrays: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
        self._by_layer: dict[int, np.ndarray] = {}
        self._io: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._entry: dict[int, np.ndarray] = {}
        self._entry_shared: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        self._entry_mem: dict[int, np.ndarray] = {}
        self._ckpt: dict[str, np.ndarray] = {}
        self._mem_terms: dict[int, tuple[Any, ...]] = {}
        self._out_groups: dict[int, _Groups] = {}
        self._map_groups: dict[bytes, _Groups] = {}
        self._own: dict[tuple[int, Weights], np.ndarray] = {}
        self._positions: dict[int, dict[Layout, int]] = {}
        self._kinds: list[int] | None = None
        self._loss_parts: np.ndarray | None = None
        self._terminal: dict[Weights, np.ndarray] = {}
        self._precompute()

    @functools.cached_property
    def structure(self) -> tuple[dict[int, list[tuple[str, Any]]], dict[int, Any], int]:
        """What the dynamic program's runs share: the block events before each layer,
        the blocks by their closing add, the first layer with weights."""
        net = self.ctx.network
        return (_events(self), {blk.add: blk for blk in net.blocks},
                next(lay.index for lay in self.layers if lay.has_weights))

    def _dist(self, d: Dist) -> int:
        if d not in self.index:
            self.index[d] = len(self.dists)
            self.dists.append(d)
        return self.index[d]

    # -- costs ---------------------------------------------------------------------

    def _precompute(self) -> None:
        """Per weighted layer and layout: compute, activation comm, gradient comm, memory;
        compute kernels are timed in one batch per search."""
        ctx = self.ctx
        todo: list[tuple[tuple[Any, ...], Layer, list[Layout]]] = []
        for idx, lays in self.candidates.items():
            layer = self.layers[idx]
            key = (cost_signature(layer, ctx), tuple(lays))
            if key not in self._weighted:
                self._weighted[key] = np.zeros((len(lays), _PARTS))
                self._buffers[key] = np.zeros(len(lays))
                todo.append((key, layer, lays))
        kernels: list[Kernel] = []
        owners: list[tuple[tuple[Any, ...], int, int]] = []  # (key, layout, column)
        for key, layer, lays in todo:
            arr = self._weighted[key]
            seen: dict[tuple[str, int, int], list[Kernel]] = {}
            for j, lay in enumerate(lays):
                comm_a = comm_g = comm_s = 0.0
                terms = weighted_terms(layer, lay, ctx)
                self._buffers[key][j] = max((t.bytes for t in terms), default=0.0)
                for t in terms:
                    if t.when == "update":
                        comm_s += t.seconds
                    elif self._hideable(t):
                        comm_g += t.seconds
                    else:
                        comm_a += t.critical_s
                arr[j, _A] = comm_a
                arr[j, _G] = comm_g
                arr[j, _S] = comm_s
                params_local = local_params(layer, lay)
                share = held(self.pb, self.options.zero, terms)
                arr[j, _M] = params_local * share.total + self._own_saved(layer, lay)
                shape_key = (lay.mode, lay.pr, lay.pc)
                if shape_key not in seen:
                    prods = weighted_kernels(layer, lay, ctx)
                    seen[shape_key] = (prods["forward"] + prods["backward_data"]
                                       + prods["backward_weight"])
                ks = seen[shape_key]
                kernels.extend(ks)
                owners.extend([(key, j, _C)] * len(ks))
                if params_local > 0:  # as the evaluation: a tied head updates nothing
                    kernels.append(self._optimizer_kernel(params_local, terms))
                    owners.append((key, j, _U))
        if kernels:
            secs = ctx.estimator.estimate(kernels, ctx.cluster.device, ctx.network.dtype).seconds
            for (key, j, col), s in zip(owners, secs, strict=True):
                self._weighted[key][j, col] += float(s)

    def _hideable(self, t: CommTerm) -> bool:
        """Whether a term is weighed with ``Weights.gradient``: a weight-gradient reduction
        or a prefetched ZeRO stage-3 gather, which may overlap compute; or ZeRO stages
        1-2's gather after the step, which does not, but which the timeline fuses into
        buckets as it does the gradients (with gradients overlapped), so that summed per
        layer it costs more than it does. At κ = 0 the program then leaves out all that
        its per-layer sum may overstate, and its optimum is a lower bound still."""
        return t.when in ("gradient", "update") or (self.prefetch and t.phase == "parameters")

    def _optimizer_kernel(self, params_local: float, terms: list[CommTerm]) -> Elementwise:
        """The step over this device's parameters, as the evaluation times it."""
        return optimizer_kernel(stepped(params_local, self.options.zero, terms), self.pb)

    # -- memory: what the evaluation's memory report adds up, per layer -------------------
    # A tensor two layers keep in one distribution counts once there (a ReLU's output
    # that the next convolution keeps as its input): the consumer's copy is free when the
    # state (where its producer left the input) is where it keeps it and the producer
    # keeps its output there, or, under recomputation, when the input is its block's
    # checkpoint. Through a view, or between two consumers (a block's body and its
    # shortcut), the program counts it twice. What recomputation rebuilds is live one
    # block at a time (the evaluation's peak is a maximum over the moments the backward
    # pass rebuilds a block): the program counts each block's share divided by the
    # number of recomputed blocks, their mean, on top of everything kept, which
    # overstates the peak by what the backward pass has freed by then. Communication
    # buffers and the busiest layer's workspace (maxima as well) are left out.

    @functools.cached_property
    def _units(self) -> dict[str, Any]:
        """The recomputation units by name (each residual block, or with
        ``--recompute-unit layers`` a repeat group's copy)."""
        return {unit.name: unit for unit in self.ctx.network.recompute_units}

    @functools.cached_property
    def _checkpointed(self) -> frozenset[int]:
        """The layers whose output a recomputed unit keeps as its input (checkpoint)."""
        return frozenset(u.input for u in self.ctx.rebuilt_units)

    def _rebuilt_share(self, layer: Layer) -> float:
        """The weight of what a layer keeps: 1, or for a recomputed layer the inverse
        of the number of recomputed blocks."""
        return 1.0 / len(self.ctx.rebuilt_units) if recomputed(layer, self.ctx) else 1.0

    def _input_share(self, layer: Layer) -> float:
        """The weight of the input a layer keeps (the network input stays kept)."""
        return 1.0 if self.ctx.network.storage_of(layer.inputs[0]) < 0 else \
            self._rebuilt_share(layer)

    def _output_share(self, layer: Layer) -> float:
        """The weight of the output a layer keeps (none when recomputation checkpoints
        it: :meth:`checkpoint_memory` counts it)."""
        if recomputed(layer, self.ctx) and layer.index in self._checkpointed:
            return 0.0
        return self._rebuilt_share(layer)

    def _keeps_output(self, index: int, block: str | None = None) -> bool:
        """Whether layer ``index`` keeps its own output (not a view of another's) where it
        leaves it: not rebuilt by recomputation, or rebuilt with ``block``."""
        producer = self.layers[index]
        return self.ctx.network.storage_of(index) == index and producer.saves_output and (
            not recomputed(producer, self.ctx)
            or self.ctx.unit(producer.block) == self.ctx.unit(block))

    def _input_kept(self, layer: Layer) -> str | None:
        """Who keeps the layer's input where its producer left it anyway: "producer"
        (its output, unless rebuilt in another block), "checkpoint" (under
        recomputation, the block's input), or None."""
        src = layer.inputs[0]
        if src < 0:
            return None
        if self._keeps_output(src, layer.block):
            return "producer"
        if layer.block is not None and recomputed(layer, self.ctx) and \
                self._units[self.ctx.network.unit_of[layer.block]].input == src:
            return "checkpoint"
        return None

    def _memory_terms(self, layer: Layer) -> tuple[Any, ...]:
        """What a layer's memory depends on besides its signature, once per layer:
        :meth:`_input_kept`, then the input, output and rebuilt shares."""
        hit = self._mem_terms.get(layer.index)
        if hit is None:
            hit = self._mem_terms[layer.index] = (
                self._input_kept(layer), self._input_share(layer),
                self._output_share(layer), self._rebuilt_share(layer))
        return hit

    def _own_saved(self, layer: Layer, lay: Layout) -> float:
        """What a layer with weights keeps besides its input (priced on the entry, see
        :meth:`entry_memory`): internal tensors, masks, the loss's output."""
        batch, e = self.options.batch, self.ctx.elem_bytes
        kept = own_kept_bytes(layer, lay, input_dist(lay), batch, e) * \
            self._rebuilt_share(layer)
        if layer.saves_output:
            kept += local_elems(layer.out_elems, lay.output_dist(), batch,
                                layer.out_rows) * \
                self.ctx.network.output_bytes(layer) * self._output_share(layer)
        return kept * self.options.inflight

    def entry_memory(self, layer: Layer) -> np.ndarray:
        """``M[src, j]``: bytes of its input candidate ``j`` keeps when the input
        arrives in distribution ``src`` (none where its producer already keeps it
        there)."""
        hit = self._entry_mem.get(layer.index)
        if hit is None or hit.shape[0] != len(self.dists):
            lays = self.candidates[layer.index]
            n = len(self.dists)
            hit = np.zeros((n, len(lays)))
            if layer.saves_input:
                batch, e = self.options.batch, self.ctx.elem_bytes
                ins = self.dist_indices(layer)[0]
                share = self._input_share(layer)
                kept = self._input_kept(layer)
                for j, lay in enumerate(lays):
                    dist = self.dists[ins[j]]
                    hit[:, j] = kept_input_bytes(layer, lay, dist, batch, e) * share
                    if kept is not None:
                        # kept there anyway (by its producer, or as the recomputed
                        # block's checkpoint): only the halo rows of a domain split on
                        # top, the evaluation keeping the tensor at its largest
                        hit[ins[j], j] -= local_elems(layer.in_elems, dist, batch,
                                                      layer.in_rows) * e * \
                            share
                hit *= self.options.inflight
            self._entry_mem[layer.index] = hit
        return hit

    def checkpoint_memory(self, blk: Any) -> np.ndarray | None:
        """Under recomputation, the bytes of a block's input it keeps in each state
        (None: nothing to add: no recomputation, the network input, or a producer
        that keeps it anyway)."""
        if blk.name not in self.ctx.rebuilt or blk.input < 0 or \
                self._units[self.ctx.network.unit_of[blk.name]].input != blk.input:
            return None  # (the unit's input is its first block's: the one it keeps)
        hit = self._ckpt.get(blk.name)
        if hit is None or len(hit) != len(self.dists):
            if self._keeps_output(blk.input):
                hit = np.zeros(len(self.dists))
            else:
                producer = self.layers[blk.input]
                batch, e = self.options.batch, self.ctx.elem_bytes
                hit = np.array([local_elems(producer.out_elems, d, batch,
                                            producer.out_rows) * e
                                for d in self.dists]) * self.options.inflight
            self._ckpt[blk.name] = hit
        return hit

    def weighted(self, layer: Layer) -> np.ndarray:
        """Part vectors ``(n_layouts, 4)`` of a layer with weights."""
        hit = self._by_layer.get(layer.index)
        if hit is None:
            hit = self._weighted[(cost_signature(layer, self.ctx),
                                  tuple(self.candidates[layer.index]))]
            self._by_layer[layer.index] = hit
        return hit

    def dist_indices(self, layer: Layer) -> tuple[np.ndarray, np.ndarray]:
        """Input and output distribution indices of each candidate layout."""
        hit = self._io.get(layer.index)
        if hit is None:
            lays = self.candidates[layer.index]
            hit = (np.array([self.index[input_dist(lay)] for lay in lays]),
                   np.array([self.index[lay.output_dist()] for lay in lays]))
            self._io[layer.index] = hit
        return hit

    def entry_transitions(self, layer: Layer) -> np.ndarray:
        """``T[src, in_j]``: moving the layer's input from every distribution into the
        input distribution of each candidate layout ``j``."""
        hit = self._entry.get(layer.index)
        if hit is None:
            # layers alike (the same moves, the same candidates: the same parts array)
            # share one array: a 10,000-layer transformer's take 100 MB one a layer
            moves, parts = self.moves(layer), self.weighted(layer)
            shared = self._entry_shared.get((id(moves), id(parts)))
            # the arrays are kept with it, so their ids stay theirs
            if shared is None or shared[0] is not moves or shared[1] is not parts:
                shared = (moves, parts, moves[:, self.dist_indices(layer)[0]])
                self._entry_shared[(id(moves), id(parts))] = shared
            hit = self._entry[layer.index] = shared[2]
        return hit

    def entry_costs(self, layer: Layer, w: Weights) -> np.ndarray:
        """The weighted entry: moves, and with a memory weight the input kept."""
        trans = self.entry_transitions(layer) * w.activation
        if w.memory:
            trans = trans + self.entry_memory(layer) * w.memory
        return trans

    def out_groups(self, layer: Layer) -> _Groups:
        """The candidate layouts of a layer with weights grouped by output distribution."""
        hit = self._out_groups.get(layer.index)
        if hit is None:
            hit = _group(self.dist_indices(layer)[1])
            self._out_groups[layer.index] = hit
        return hit

    def buffers(self, layer: Layer) -> np.ndarray:
        """Each candidate layout's largest collective buffer (bytes)."""
        return self._buffers[(cost_signature(layer, self.ctx),
                              tuple(self.candidates[layer.index]))]

    def weighted_own(self, layer: Layer, w: Weights) -> np.ndarray:
        """The weighted score of each candidate layout of a layer with weights (INF where
        its largest collective buffer is over ``w.buffer_cap``)."""
        parts = self.weighted(layer)
        key = (id(parts), w)  # layers with the same costs share one parts array
        hit = self._own.get(key)
        if hit is None:
            hit = _score(parts, w)
            if w.buffer_cap < INF:
                hit = np.where(self.buffers(layer) > w.buffer_cap, INF, hit)
            hit = self._own[key] = hit
        return hit

    def fewest_buffer_bytes(self) -> float:
        """The smallest cap on collective buffers every layer with weights can keep."""
        return max((float(b.min()) for b in self._buffers.values() if len(b)), default=0.0)

    def map_groups(self, out_map: np.ndarray) -> _Groups:
        """Distributions grouped by where a layer without weights leaves them."""
        key = out_map.tobytes()
        hit = self._map_groups.get(key)
        if hit is None:
            hit = _group(out_map)
            self._map_groups[key] = hit
        return hit

    def follower(self, layer: Layer, d: int) -> tuple[np.ndarray, int]:
        """Part vector of a layer without weights on distribution ``d``, and the
        distribution it leaves."""
        shared, in_share, out_share, own_share = self._memory_terms(layer)
        key = (self._sig[layer.index], d, shared, in_share, out_share, own_share)
        hit = self._follow.get(key)
        if hit is not None:
            return hit
        ctx = self.ctx
        dist = self.dists[d]
        parts = np.zeros(_PARTS)
        terms: list[CommTerm]
        if layer.type == "add":  # the add itself; the shortcut is priced by the caller
            terms, work, out = [], dist, dist
        else:
            terms, work, out = follower_terms(layer, dist, ctx)
        for t in terms:
            parts[_S if t.when == "update" else _G if self._hideable(t) else _A] += \
                t.critical_s
        prods = follower_kernels(layer, work, ctx)
        ks = prods["forward"] + prods["backward_data"] + prods["backward_weight"]
        if layer.params:
            ks.append(self._optimizer_kernel(float(layer.params), terms))
        if ks:
            secs = ctx.estimator.estimate(ks, ctx.cluster.device, ctx.network.dtype).seconds
            n_work = len(secs) - (1 if layer.params else 0)  # the step is the last kernel
            parts[_C] = float(secs[:n_work].sum())
            parts[_U] = float(secs[n_work:].sum())
        batch, e = self.options.batch, ctx.elem_bytes
        kept = own_kept_bytes(layer, None, work, batch, e) * own_share
        if layer.saves_input:
            inp = kept_input_bytes(layer, None, work, batch, e)
            if shared and work == dist:  # its producer keeps it: a pool's halo rows alone
                inp -= local_elems(layer.in_elems, work, batch, layer.in_rows) * e
            kept += inp * in_share
        if layer.saves_output:
            kept += local_elems(layer.out_elems, out, batch, layer.out_rows) * \
                ctx.network.output_bytes(layer) * out_share
        parts[_M] = layer.params * held(self.pb, self.options.zero, terms).total + \
            kept * self.options.inflight
        result = (parts, self._dist(out))
        self._follow[key] = result
        return result

    def follower_arrays(self, layer: Layer, w: Weights) -> tuple[np.ndarray, np.ndarray]:
        """For every distribution: where a layer without weights leaves it, and its
        weighted cost there."""
        key = (self._sig[layer.index], self._memory_terms(layer), w)
        hit = self._follow_arrays.get(key)
        if hit is None:
            n = len(self.dists)
            out_map = np.arange(n)
            own = np.zeros(n)
            parts = np.zeros((n, _PARTS))
            for d in range(n):
                parts[d], out_map[d] = self.follower(layer, d)
            own = _score(parts, w)
            hit = (out_map, own)
            self._follow_arrays[key] = hit
        return hit

    def terminal(self, w: Weights) -> np.ndarray:
        """The loss's weighted cost on each distribution the last layer may leave (see
        :func:`loss_cost`); the evaluation books it on the last layer."""
        if self._loss_parts is None:
            last = self.layers[-1]
            n = len(self.dists)
            parts = np.zeros((n, _PARTS))
            kernels: list[Kernel] = []
            owners: list[int] = []
            for d, dist in enumerate(self.dists if self.ctx.network.loss else ()):
                ks, terms = loss_cost(last, dist, self.ctx)
                for t in terms:
                    parts[d, _A] += t.seconds
                flat = ks["forward"] + ks["backward_data"] + ks["backward_weight"]
                kernels.extend(flat)
                owners.extend([d] * len(flat))
            secs: Any = self.ctx.estimator.estimate(
                kernels, self.ctx.cluster.device, self.ctx.network.dtype).seconds \
                if kernels else []
            for d, sec in zip(owners, secs, strict=True):
                parts[d, _C] += float(sec)
            self._loss_parts = parts
        hit = self._terminal.get(w)
        if hit is None:
            hit = self._terminal[w] = _score(self._loss_parts, w)
        return hit

    def moves(self, layer: Layer) -> np.ndarray:
        """``T[src, dst]`` for the layer's input: :meth:`transitions`, and for a
        recomputed layer the forward moves once more."""
        hit = self._moves.get(layer.index)
        if hit is None or hit.shape[0] != len(self.dists):
            hit = self.transitions(layer.in_elems)
            if recomputed(layer, self.ctx):
                hit = hit + self.transitions(layer.in_elems, forward_only=True)
            self._moves[layer.index] = hit
        return hit

    def transitions(self, elems: int, forward_only: bool = False) -> np.ndarray:
        """Seconds to move an activation of ``elems`` per sample between every pair of
        distributions: ``T[src, dst]``."""
        total = float(self.options.batch) * elems * self.ctx.elem_bytes
        store = self._trans_fwd if forward_only else self._trans
        hit = store.get(total)
        if hit is not None and hit.shape[0] == len(self.dists):
            return hit
        n = len(self.dists)
        t = np.zeros((n, n))
        arr = np.array([total])
        for i, a in enumerate(self.dists):
            for j, z in enumerate(self.dists):
                if i != j:
                    t[i, j] = redistribute_seconds(a, z, arr, self.ctx, forward_only)[0]
        store[total] = t
        return t

    def prepare_transitions(self) -> None:
        """All transition matrices at once, vectorised over activation sizes."""
        sizes = sorted({float(self.options.batch) * lay.in_elems * self.ctx.elem_bytes
                        for lay in self.layers if lay.has_weights or lay.type == "add"})
        n = len(self.dists)
        arr = np.array(sizes)
        cube = np.zeros((len(sizes), n, n))
        priced: dict[tuple[object, ...], np.ndarray] = {}  # most pairs share their moves
        for i, a in enumerate(self.dists):
            for j, z in enumerate(self.dists):
                if i != j:
                    key = redistribute_key(a, z, self.ctx)
                    hit = priced.get(key)
                    if hit is None:
                        hit = priced[key] = redistribute_seconds(a, z, arr, self.ctx)
                    cube[:, i, j] = hit
        for k, s in enumerate(sizes):
            self._trans[s] = cube[k]


    def score(self, assignment: dict[int, Layout], w: Weights) -> float:
        """The dynamic program's objective for one assignment (to rank many quickly).

        The sum runs over the layers in order with the same terms as the dynamic program,
        so equal assignments score equally to the last bit."""
        if self._kinds is None:
            self._kinds = [0 if lay.has_weights else 1 if lay.type == "add" else 2
                           for lay in self.layers]
        first = next(lay for lay in self.layers if lay.has_weights)
        index = self.index
        state: dict[int, int] = {-1: index[input_dist(assignment[first.index])]}
        events = self.structure[0] if w.memory else {}
        shared = self.ctx.network.shared_entries
        seconds = {blk.shortcut[0] for blk in shared.values() if blk.shortcut}
        copy: dict[int, int] = {}  # a block input as its body's first layer moved it
        total = 0.0
        for layer, kind in zip(self.layers, self._kinds, strict=True):
            for what, blk in events.get(layer.index, []):
                ckpt = self.checkpoint_memory(blk) if what == "begin" else None
                if ckpt is not None:
                    total += ckpt[state[blk.input]] * w.memory
            d = state[layer.inputs[0]]
            if kind == 0:
                lay = assignment[layer.index]
                j = self.position(layer.index)[lay]
                total += float(self.weighted_own(layer, w)[j])
                dst = index[input_dist(lay)]
                if layer.index in seconds and layer.inputs[0] in copy:
                    # a shortcut's first layer reads the cheaper copy of the block
                    # input, as the program's carry does
                    other = copy[layer.inputs[0]]
                    parts = [self.moves(layer)[x, dst] * w.activation + (
                        self.entry_memory(layer)[x, j] * w.memory if w.memory else 0.0)
                        for x in (d, other)]
                    if parts[1] < parts[0]:
                        d = other
                total += self.moves(layer)[d, dst] * w.activation
                if w.memory:
                    total += self.entry_memory(layer)[d, j] * w.memory
                if layer.index in shared:
                    copy[layer.inputs[0]] = dst
                state[layer.index] = index[lay.output_dist()]
            elif kind == 1:
                sc = state[layer.inputs[1]]
                trans = self.moves(layer)
                total += min(trans[sc, d], trans[copy[sc_in], d]) * w.activation if \
                    (sc_in := layer.inputs[1]) in copy else trans[sc, d] * w.activation
                total += float(self.follower_arrays(layer, w)[1][d])
                state[layer.index] = d
            else:
                out_map, own = self.follower_arrays(layer, w)
                total += float(own[d])
                state[layer.index] = int(out_map[d])
        return total + float(self.terminal(w)[state[self.layers[-1].index]])

    def position(self, index: int) -> dict[Layout, int]:
        """Where each candidate layout of layer ``index`` sits in its list (the first
        place, as ``list.index`` finds it)."""
        hit = self._positions.get(index)
        if hit is None:
            hit = {}
            for j, lay in enumerate(self.candidates[index]):
                hit.setdefault(lay, j)
            self._positions[index] = hit
        return hit


# ---------------------------------------------------------------------------------------
# The dynamic program


@dataclass
class _Step:
    """One layer's (or block event's) back-pointers. The arrays are kept in the
    narrowest integer type that holds them: a 10,000-layer network keeps one state
    matrix of each a layer, and in int64 they were most of a search's memory."""

    kind: str
    layer: int = -1
    prev_carry: np.ndarray | None = None
    prev_cur: np.ndarray | None = None
    layout: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prev_carry = _narrow(self.prev_carry)
        self.prev_cur = _narrow(self.prev_cur)
        self.layout = _narrow(self.layout)


def _narrow(a: np.ndarray | None) -> np.ndarray | None:
    """``a`` (indices, and −1 for none) in the narrowest signed type that holds it."""
    if a is None or a.size == 0:
        return a
    hi = int(a.max())
    for dtype in (np.int8, np.int16, np.int32):
        if hi <= np.iinfo(dtype).max:
            return a.astype(dtype)
    return a


class _Unkept(list):  # type: ignore[type-arg]
    """Back-pointers nobody follows (a bound's run of the program): not kept."""

    def append(self, step: object) -> None:
        """Drop ``step``: nothing follows a bound's back-pointers."""


def _events(space: Space) -> dict[int, list[tuple[str, Any]]]:
    """Block structure: what happens before each layer index."""
    ev: dict[int, list[tuple[str, Any]]] = {}
    for blk in space.ctx.network.blocks:
        ev.setdefault(blk.body[0], []).append(("begin", blk))
        if blk.shortcut:
            ev.setdefault(blk.shortcut[0], []).append(("swap", blk))
    return ev


def dynamic_program(space: Space, w: Weights, origin: int | None = None,
                    fixed: dict[int, int] | None = None, probe: int | None = None,
                    probe_state: list[np.ndarray] | None = None,
                    ) -> tuple[float, dict[int, Layout]]:
    """Minimise the weighted sum of the parts over the whole network.

    ``origin`` fixes the input distribution (the data loader delivers the input in the
    first weighted layer's input distribution); None lets the first layer choose.
    ``fixed`` holds layers to one candidate (layer index → its position). Returns the
    optimum and the layout of every layer with weights. With ``probe`` (a layer index),
    the state before that layer is appended to ``probe_state``.
    """
    steps: list[_Step] = []
    fixed = fixed or {}
    end = len(space.layers)
    pos = probe if probe is not None and probe_state is not None else end  # index = place
    cost = _advance(space, w, _start(space, origin), 0, pos, steps, origin, fixed)
    if pos < end and probe_state is not None:  # the state before ``probe``
        probe_state.append(cost)
    cost = _advance(space, w, cost, pos, end, steps, origin, fixed)
    cost = cost + space.terminal(w)[None, :]  # the loss
    best = int(np.argmin(cost[0]))
    value = float(cost[0, best])
    if not math.isfinite(value):
        return INF, {}
    return value, _backtrack(space, steps, best)


def _start(space: Space, origin: int | None) -> np.ndarray:
    cost = np.full((1, len(space.dists)), INF)
    if origin is None:
        cost[0, :] = 0.0
    elif origin == BY_ENTRY:  # every input distribution of the first layer with weights
        cost[0, _input_dists(space, space.structure[2])] = 0.0
    else:
        cost[0, origin] = 0.0
    return cost


def _advance(space: Space, w: Weights, cost: np.ndarray, lo: int, hi: int,
             steps: list[_Step], origin: int | None, fixed: dict[int, int],
             unpriced: frozenset[int] = frozenset()) -> np.ndarray:
    """Run the layers ``space.layers[lo:hi]`` (and the block events before each) from the
    state ``cost``, appending their back-pointers to ``steps``; the layers in
    ``unpriced`` pay their moves but not their own costs."""
    n = len(space.dists)
    events, blocks, first_weighted = space.structure
    for layer in space.layers[lo:hi]:
        for kind, blk in events.get(layer.index, []):
            if kind == "begin":
                new = np.full((n, n), INF)
                idx = np.arange(n)
                ckpt = space.checkpoint_memory(blk) if w.memory else None
                new[idx, idx] = cost[0] if ckpt is None else cost[0] + ckpt * w.memory
                steps.append(_Step("begin"))
                cost = new
            else:
                steps.append(_Step("swap"))
                cost = cost.T.copy()
        if layer.has_weights:
            cost = _weighted_step(space, layer, cost, w, steps,
                                  restrict=origin if layer.index == first_weighted else None,
                                  only=fixed.get(layer.index),
                                  unpriced=layer.index in unpriced,
                                  copy=layer.index in space.ctx.network.shared_entries)
        elif layer.type == "add":
            cost = _add_step(space, layer, cost, w, steps, blocks[layer.index])
        else:
            cost = _follower_step(space, layer, cost, w, steps)
    return cost


def _member_bounds(space: Space, w: Weights, origin: int | None, fixed: dict[int, int],
                   group: tuple[int, ...], head: np.ndarray | None = None) -> np.ndarray:
    """For every common layout ``j`` of a tied group, a lower bound of the optimum with
    the group held to ``j`` (and ``fixed``), the larger of two relaxations:

    * only the group's last member held to ``j``, the others free: exact in floating
      point as well (a path's cost is summed in the same order in both, and the
      relaxation only minimises over more paths);
    * the last member held to ``j``, the others free and their own costs left out, plus
      their own costs at ``j`` (a table parted from its head is cheap alone: this one
      counts what holding it alike costs it; less a relative 1e-12, as it sums in
      another order).

    One run up to the last member for each (the first from the state ``head`` of a run
    already made), then one run of the layers from it on per layout and relaxation."""
    member = max(group)
    pos = member  # a layer's index is its place in the network
    others = frozenset(group) - {member}
    if head is None:
        head = _advance(space, w, _start(space, origin), 0, pos, _Unkept(), origin, fixed)
    bare = _advance(space, w, _start(space, origin), 0, pos, _Unkept(), origin, fixed, others)
    own = [space.weighted_own(space.layers[t], w) for t in sorted(others)]
    out = np.full(len(space.candidates[member]), INF)
    for j in range(len(out)):
        tail = _advance(space, w, head, pos, len(space.layers), _Unkept(), origin,
                        {**fixed, member: j})
        out[j] = float((tail[0] + space.terminal(w)).min())
        if not math.isfinite(out[j]):
            continue
        tail = _advance(space, w, bare, pos, len(space.layers), _Unkept(), origin,
                        {**fixed, member: j})
        alike = float((tail[0] + space.terminal(w)).min()) + sum(float(o[j]) for o in own)
        out[j] = max(out[j], alike * (1 - 1e-12))
    return out


def _weighted_step(space: Space, layer: Layer, cost: np.ndarray, w: Weights,
                   steps: list[_Step], restrict: int | None,
                   only: int | None = None, unpriced: bool = False,
                   copy: bool = False) -> np.ndarray:
    """A layer with weights: every state to each candidate's output distribution. With
    ``copy`` (a block's body's first layer, :attr:`Network.shared_entries`), the carry
    may also become the candidate's input distribution: the block input's copy the layer
    moved, which the block's other consumer may read instead (the state after it keeps
    the cheaper carry of the two; ``prev_carry`` of the step points back)."""
    own = space.weighted_own(layer, w)
    if unpriced:
        own = np.where(np.isfinite(own), 0.0, own)
    in_idx = space.dist_indices(layer)[0]
    k, n = cost.shape
    if only is not None:
        own = np.where(np.arange(len(own)) == only, own, INF)
    if restrict == BY_ENTRY:  # the state's carry (its row) is its input distribution
        assert k == n, "BY_ENTRY needs the block the network opens with"
        own_rows = np.where(in_idx[None, :] == np.arange(k)[:, None], own[None, :], INF)
    else:
        if restrict is not None:
            own = np.where(in_idx == restrict, own, INF)
        own_rows = own[None, :]
    trans = space.entry_costs(layer, w)  # (D, J)
    # only the distributions some state holds (a norm gathers split features, so after
    # it they are out of reach), and only the states that hold one (inside a block the
    # entry's distributions the network can reach): the same minima, the first of the
    # cheapest as before; a state no path reaches stays infinite and is never followed
    fin = np.isfinite(cost)
    live = np.flatnonzero(fin.any(axis=0))
    rows = np.flatnonzero(fin.any(axis=1))
    part = 0 < len(rows) < k
    held = cost[rows] if part else cost
    if 0 < len(live) < n:
        total = held[:, live, None] + trans[None, live, :]  # (K', D', J)
        pick = np.argmin(total, axis=1)
        prev = live[pick]
    else:
        total = held[:, :, None] + trans[None, :, :]  # (K', D, J)
        pick = prev = np.argmin(total, axis=1)  # (K', J)
    # the minimum read at its argmin (one pass over ``total``, not two)
    kk = len(held)
    best = total[np.arange(kk)[:, None], pick, np.arange(total.shape[2])[None, :]] \
        + (own_rows[rows] if part and len(own_rows) > 1 else own_rows)
    new_h = np.full((kk, n), INF)
    cur_h = np.zeros((kk, n), dtype=np.int64)
    lay_h = np.full((kk, n), -1, dtype=np.int64)
    _scatter_min(best, prev, space.out_groups(layer), new_h, cur_h, lay_h)
    if part:
        new = np.full((k, n), INF)
        bp_cur = np.zeros((k, n), dtype=np.int64)
        bp_lay = np.full((k, n), -1, dtype=np.int64)
        new[rows], bp_cur[rows], bp_lay[rows] = new_h, cur_h, lay_h
    else:
        new, bp_cur, bp_lay = new_h, cur_h, lay_h
    bp_carry = None
    if copy and k == n:
        # the copy as the carry: for each candidate, its best state over the carries
        # (rows), at (its input distribution, its output distribution); kept where
        # strictly cheaper than the carry unchanged (which wins ties)
        in_idx, out_idx = space.dist_indices(layer)
        src = np.argmin(best, axis=0)  # (J,): the best row of each candidate
        val = best[src, np.arange(best.shape[1])]
        bp_carry = np.broadcast_to(np.arange(k)[:, None], (k, n)).copy()
        for j in range(len(val)):  # in order: the first of the cheapest, as elsewhere
            r, c = int(in_idx[j]), int(out_idx[j])
            if not val[j] < new[r, c]:
                continue
            row = int(rows[src[j]]) if part else int(src[j])
            new[r, c] = val[j]
            bp_carry[r, c] = row
            bp_cur[r, c] = int(prev[src[j], j])
            bp_lay[r, c] = j
    steps.append(_Step("weighted", layer.index, bp_carry, bp_cur, bp_lay))
    return new


@dataclass(frozen=True)
class _Groups:
    """Columns of a step grouped by the state they lead to: ``single_src → single_dst``
    where one column reaches a state, and ``(dst, srcs)`` where several compete (the
    first of the cheapest wins, as in a scan in column order)."""

    single_src: np.ndarray
    single_dst: np.ndarray
    #: per group size ``s``: the targets ``(G,)`` and their columns ``(G, s)``, ascending
    multi: tuple[tuple[np.ndarray, np.ndarray], ...]
    identity: bool  #: every column leads to the state of the same index


def _group(targets: np.ndarray) -> _Groups:
    by_dst: dict[int, list[int]] = {}
    for src, dst in enumerate(targets.tolist()):
        by_dst.setdefault(dst, []).append(src)
    singles = [(srcs[0], dst) for dst, srcs in by_dst.items() if len(srcs) == 1]
    by_size: dict[int, list[tuple[int, list[int]]]] = {}
    for dst, srcs in by_dst.items():
        if len(srcs) > 1:
            by_size.setdefault(len(srcs), []).append((dst, srcs))
    multi = tuple((np.array([d for d, _ in groups], dtype=np.int64),
                   np.array([srcs for _, srcs in groups], dtype=np.int64))
                  for _, groups in sorted(by_size.items()))
    identity = all(src == dst for src, dst in enumerate(targets.tolist()))
    return _Groups(np.array([s for s, _ in singles], dtype=np.int64),
                   np.array([d for _, d in singles], dtype=np.int64), multi, identity)


def _scatter_min(values: np.ndarray, prev: np.ndarray | None, groups: _Groups,
                 new: np.ndarray, bp_prev: np.ndarray, bp_src: np.ndarray | None) -> None:
    """``new[:, dst] = min over the columns src leading to dst of values[:, src]``, with
    back-pointers: ``bp_src`` the winning column, ``bp_prev`` its ``prev`` entry (or the
    column itself when ``prev`` is None). Ties go to the first column, and entries that
    stay infinite are never followed back, so this equals a scan over the columns that
    keeps strict improvements."""
    rows = np.arange(values.shape[0])
    if len(groups.single_src):
        src, dst = groups.single_src, groups.single_dst
        new[:, dst] = values[:, src]
        bp_prev[:, dst] = src[None, :] if prev is None else prev[:, src]
        if bp_src is not None:
            bp_src[:, dst] = src[None, :]
    for target, srcs in groups.multi:  # every group of one size at once
        sub = values[:, srcs]  # (K, G, s)
        pick = np.argmin(sub, axis=2)  # (K, G): the first of the cheapest
        cols = np.arange(len(target))[None, :]
        won = srcs[cols, pick]  # (K, G), read at the argmin (plain indexing: cheaper
        new[:, target] = sub[rows[:, None], cols, pick]  # than take_along_axis's set-up)
        bp_prev[:, target] = won if prev is None else prev[rows[:, None], won]
        if bp_src is not None:
            bp_src[:, target] = won


def _follower_step(space: Space, layer: Layer, cost: np.ndarray, w: Weights,
                   steps: list[_Step]) -> np.ndarray:
    k, n = cost.shape
    out_map, own = space.follower_arrays(layer, w)
    if len(out_map) != n:
        raise AssertionError("follower distributions must be registered up front")
    moved: np.ndarray = cost + own[None, :]
    groups = space.map_groups(out_map)
    if groups.identity or np.array_equal(
            out_map[live := np.flatnonzero(np.isfinite(cost).any(axis=0))], live):
        # the layer keeps every distribution (that the states hold)
        steps.append(_Step("follower", layer.index, None, None, None))
        return moved
    new = np.full((k, n), INF)
    bp_cur = np.zeros((k, n), dtype=np.int64)
    _scatter_min(moved, None, groups, new, bp_cur, None)
    steps.append(_Step("follower", layer.index, None, bp_cur, None))
    return new


def _add_step(space: Space, layer: Layer, cost: np.ndarray, w: Weights, steps: list[_Step],
              blk: Any) -> np.ndarray:
    """Close a block: ``cost[entry, body]`` (identity shortcut) or ``cost[body, sc]``."""
    n = cost.shape[1]
    trans = space.moves(layer) * w.activation  # [src, dst]
    add_parts = space.follower_arrays(layer, w)[1]
    if blk.shortcut:
        total = cost + trans.T  # [body, sc] + T[sc, body]
        choice = np.argmin(total, axis=1)  # best sc per body
        best = total[np.arange(n), choice]
    else:
        total = cost + trans  # [entry, body] + T[entry, body]
        choice = np.argmin(total, axis=0)  # best entry per body
        best = total[choice, np.arange(n)]
    new: np.ndarray = (best + add_parts)[None, :]
    steps.append(_Step("add", layer.index, choice, None,
                       np.array([1 if blk.shortcut else 0])))
    return new


def _backtrack(space: Space, steps: list[_Step], final: int) -> dict[int, Layout]:
    out: dict[int, Layout] = {}
    carry, cur = 0, final
    for st in reversed(steps):
        if st.kind == "weighted":
            assert st.prev_cur is not None and st.layout is not None
            j = int(st.layout[carry, cur])
            out[st.layer] = space.candidates[st.layer][j]
            cur, carry = int(st.prev_cur[carry, cur]), (
                carry if st.prev_carry is None else int(st.prev_carry[carry, cur]))
        elif st.kind == "follower":
            if st.prev_cur is not None:  # None: the layer kept every distribution
                cur = int(st.prev_cur[carry, cur])
        elif st.kind == "add":
            assert st.prev_carry is not None and st.layout is not None
            other = int(st.prev_carry[cur])
            if int(st.layout[0]):  # projection: state was [body, sc]
                carry, cur = cur, other
            else:  # identity: state was [entry, body]
                carry, cur = other, cur
        elif st.kind == "swap":
            carry, cur = cur, carry
        elif st.kind == "begin":
            carry = 0
    return out


# ---------------------------------------------------------------------------------------
# Baselines, the driver and the result


@dataclass
class Candidate:
    """A complete assignment with its evaluation."""

    name: str
    assignment: dict[int, Layout]
    evaluation: Evaluation
    description: str = ""

    def score(self, objective: str) -> float:
        """What the objective minimises."""
        ev = self.evaluation
        return ev.comm_s if objective == "comm" else ev.time_s


@dataclass
class Unfitted:
    """A baseline family none of whose grids fits in memory, its grids not yet timed:
    the baseline is the fastest of them, found when it is first shown
    (:meth:`fastest`). Whether any of them is faster than a plan, which the search
    asks of each family, is answered by timing them in order until one is
    (:meth:`any_below`): a search short of memory asked that of every family, and
    timed every grid of each to answer it."""

    name: str
    #: (description, assignment) of each grid, ranked by the additive objective
    grids: list[tuple[str, dict[int, Layout]]]
    ctx: Context
    options: Options
    cache: EvalCache
    objective: str
    scores: dict[int, float] = field(default_factory=dict)

    def any_below(self, score: float) -> bool:
        """Whether one of the grids scores below ``score`` (as fast as the fastest of
        them being below it)."""
        return any(self._score(i) < score for i in range(len(self.grids)))

    def _score(self, i: int) -> float:
        """Grid ``i``'s score (timed once, without its memory report)."""
        if i not in self.scores:
            t, c = time_and_comm(self.ctx, self.options, self.grids[i][1], self.cache)
            self.scores[i] = c if self.objective == "comm" else t
        return self.scores[i]

    def _candidate(self, i: int) -> Candidate:
        description, assignment = self.grids[i]
        return Candidate(self.name, assignment,
                         evaluate(self.ctx, self.options, assignment, self.cache),
                         description)

    def _order(self, i: int) -> tuple[float, bool, str]:
        """:func:`_baseline_order` of grid ``i`` from its score alone."""
        return _grid_order(self._score(i), self.grids[i][0])

    def fastest(self) -> Candidate:
        """The grid the baseline shows: the fastest (on a tie rows before cols, then by
        description). The grids are timed one at a time and only the fastest is
        evaluated in full: a whole evaluation of each, kept at once, held hundreds of
        MiB on a 10,000-layer network."""
        found: Candidate | None = self.__dict__.get("_fastest")
        if found is None:
            found = self._candidate(min(range(len(self.grids)), key=self._order))
            self.__dict__["_fastest"] = found
        return found

    def leanest(self) -> Candidate:
        """The grid that needs the least memory (on a tie the fastest): what a search
        short of memory says the leanest layout needs may be one of them. Each grid's
        memory report is made alone, one grid at a time, and only the leanest is
        evaluated in full."""
        found: Candidate | None = self.__dict__.get("_leanest")
        if found is None:
            peaks = [memory_of(self.ctx, self.options, assignment, self.cache).peak
                     for _, assignment in self.grids]
            least = min(peaks)
            found = self._candidate(min((i for i, peak in enumerate(peaks) if peak == least),
                                        key=self._order))
            self.__dict__["_leanest"] = found
        return found


def _baseline_order(c: Candidate, objective: str) -> tuple[float, bool, str]:
    return _grid_order(c.score(objective), c.description)


def _grid_order(score: float, description: str) -> tuple[float, bool, str]:
    """A baseline's grids in order: the faster, then rows before cols, then by
    description."""
    return score, "(cols)" in description, description


@dataclass
class Baseline:
    """A reference strategy, scored like the plan (or why it does not apply)."""

    name: str
    description: str
    chosen: Candidate | None = None
    reason: str = ""
    #: none of the family's grids fits: the one to show is found when first asked for
    unfitted: Unfitted | None = None

    @property
    def candidate(self) -> Candidate | None:
        """The grid the baseline stands for (None: no grid applies)."""
        if self.unfitted is not None:
            self.chosen, self.unfitted = self.unfitted.fastest(), None
        return self.chosen

    @property
    def fits(self) -> bool:
        """It applies and fits in memory (without timing the grids that do not)."""
        return self.unfitted is None and self.chosen is not None and \
            self.chosen.evaluation.memory.fits

    def faster_unfitting(self, score: float, objective: str) -> bool:
        """It does not fit and scores below ``score``."""
        if self.unfitted is not None:
            return self.unfitted.any_below(score)
        c = self.chosen
        return c is not None and not c.evaluation.memory.fits and c.score(objective) < score

    def to_data(self) -> dict[str, Any]:
        """Plain data for the plan document."""
        cand = self.candidate
        if cand is None:
            return {"name": self.name, "description": self.description, "applicable": False,
                    "reason": self.reason}
        ev = cand.evaluation
        return {"name": self.name, "description": cand.description or
                self.description, "applicable": True, "time_s": ev.time_s,
                "comm_s": ev.comm_s, "exposed_comm_s": ev.exposed_comm_s,
                "peak_bytes": ev.memory.peak, "fits": ev.memory.fits}


@dataclass(frozen=True)
class ZeroTrial:
    """One ZeRO setting as ``--zero auto`` (or ``--zero-shard auto``) tried it."""

    stage: int
    #: "plan": searched, with a plan; "no plan": searched, nothing fits; "same as N"
    #: (stage 2), "not faster than N" (stage 3): not searched, since stage N's plan fits
    #: unconstrained. ``cost --zero auto`` prices one layout: "fits", "does not fit"
    outcome: str
    time_s: float | None = None
    comm_s: float | None = None
    peak_bytes: float | None = None
    shard: str = "all"  #: over all replicas, or within nodes (hybrid sharding)

    def to_data(self) -> dict[str, Any]:
        """Plain data for the plan document."""
        return {"stage": self.stage, "shard": self.shard, "outcome": self.outcome,
                "time_s": self.time_s, "comm_s": self.comm_s, "peak_bytes": self.peak_bytes}


def zero_settings(stages: tuple[int, ...], shards: tuple[str, ...]) -> list[tuple[int, str]]:
    """The (stage, shard) pairs to try, stage by stage within each shard; stage 0 shards
    nothing, so it is tried once."""
    return [(stage, shard) for shard in shards for stage in stages
            if not (stage == 0 and shard != shards[0])]


@dataclass
class SearchResult:
    """The chosen plan and everything it was compared with."""

    best: Candidate
    baselines: list[Baseline]
    objective: str
    explored: int = 0
    notes: list[str] = field(default_factory=list)
    #: no assignment is faster: the critical path's least (``overlap: gradients``,
    #: objective time; None otherwise)
    lower_bound_s: float | None = None
    #: the unconstrained optimum did not fit: the plan trades time for memory
    constrained: bool = False
    #: something faster than the plan was found and did not fit (an answer of the
    #: program, a baseline or a move of the local search): a setting that keeps less may
    #: give a faster plan (``constrained`` implies it)
    memory_bound: bool = False
    #: ``--zero auto``: every stage tried (see :func:`search_zero`); empty otherwise
    zero_trials: list[ZeroTrial] = field(default_factory=list)
    #: ``--recompute auto``: every count of blocks tried (:func:`search_recompute`)
    recompute_trials: list[RecomputeTrial] = field(default_factory=list)


@dataclass
class RecomputeTrial:
    """One count of recomputed blocks (the first ones) as ``--recompute auto`` tried it."""

    blocks: int
    #: "plan": its optimum fits; "traded": it fits only trading time for memory (the
    #: memory search); "no plan": nothing fits. ``cost --recompute auto`` prices one
    #: layout: "fits", "does not fit"
    outcome: str
    time_s: float | None = None
    peak_bytes: float | None = None

    def to_data(self) -> dict[str, Any]:
        """Plain data for the plan document."""
        return {"blocks": self.blocks, "outcome": self.outcome, "time_s": self.time_s,
                "peak_bytes": self.peak_bytes}


def _assign(space: Space, choose: Any) -> dict[int, Layout] | str:
    """An assignment from a per-layer rule; a string says why it is invalid. Pins win: a
    pinned layer the rule would give another layout takes the one its pin allows that
    is nearest the rule (the rule's grid in another mode, else the same mode, else the
    first allowed), so that a baseline is the strategy its name says under the same
    constraints as the plan (its label says so)."""
    ctx = space.ctx
    out: dict[int, Layout] = {}
    for idx, lays in space.candidates.items():
        layer = space.layers[idx]
        lay = choose(layer)
        if idx in space.pinned and lay not in lays:
            out[idx] = min(lays, key=lambda x: ((x.pr, x.pc) != (lay.pr, lay.pc),
                                                x.mode != lay.mode))
            continue
        reason = why_invalid(layer, lay, space.options.batch, ctx.paper,
                             space.options.microbatches > 1)
        if reason is not None:
            return f"layer '{layer.name}' cannot use {lay.label()}: {reason}"
        out[idx] = lay
    for owner, tied in space.ctx.network.ties.items():
        for t in tied:
            if owner in out and t in out and not holds_alike(out[owner], out[t]):
                return (f"layers '{space.layers[owner].name}' and '{space.layers[t].name}' "
                        "share weights but are pinned to layouts that hold them differently")
    return out


def _grids(p: int) -> Iterable[tuple[int, int]]:
    return ((pr, p // pr) for pr in divisors(p))


def baselines(space: Space, objective: str, weights: Weights) -> list[Baseline]:
    """Pure data, pure model, the best single grid, and Gholami's scheme (each family's
    options ranked by the additive objective ``weights``; the best few are scored with
    the full timeline)."""
    ctx, opts = space.ctx, space.options
    p = opts.gpus
    result: list[Baseline] = []

    def best_of(name: str, desc: str, options: list[tuple[str, dict[int, Layout] | str]],
                ) -> Baseline:
        valid = [(label, a) for label, a in options if not isinstance(a, str)]
        if not valid:
            return Baseline(name, desc, None, _no_grid(
                [a for _, a in options if isinstance(a, str)]))
        # rank by the additive objective, score the most promising with the timeline:
        # the grids in order until three are known and one of them fits, the fastest
        # that fits kept (the grids that do not are timed only if ever asked for:
        # Unfitted)
        ranked = sorted(valid, key=lambda x: (space.score(x[1], weights), x[0]))
        known: list[tuple[str, dict[int, Layout]]] = []
        fitting: list[Candidate] = []
        pinned = ", pins kept" if space.pinned else ""
        for label, a in ranked:
            known.append((label + pinned, a))
            if _state_floor(space, a) <= ctx.cluster.capacity_bytes:
                _, ev = evaluate_fitting(ctx, opts, a, space.cache)
                if ev is not None:
                    fitting.append(Candidate(name, a, ev, label + pinned))
            if len(known) >= 3 and fitting:
                break
        if fitting:
            return Baseline(name, desc, min(fitting,
                                            key=lambda c: _baseline_order(c, objective)))
        return Baseline(name, desc, unfitted=Unfitted(name, known, ctx, opts, space.cache,
                                                      objective))

    data = _assign(space, lambda layer: make_layout("data", 1, p))
    result.append(best_of("data", f"every layer data parallel (1x{p})", [(f"data 1x{p}", data)]))
    model = _assign(space, lambda layer: make_layout("model", p, 1))
    result.append(best_of("model", f"every layer model parallel ({p}x1)",
                          [(f"model {p}x1", model)]))
    grid_opts: list[tuple[str, dict[int, Layout] | str]] = []
    for pr, pc in _grids(p):
        for pl in (("rows", "cols") if pr > 1 and pc > 1 else ("rows",)):
            lay = make_layout("model", pr, pc, pl)
            grid_opts.append((f"{lay.label()} for every layer",
                              _assign(space, lambda layer, lay=lay: lay)))
            if pr > 1 and any(lay2.conv is not None for lay2 in space.layers):
                dom = make_layout("domain", pr, pc, pl)
                grid_opts.append((f"{dom.label()} for convolutions, model elsewhere",
                                  _assign(space, lambda layer, lay=lay, dom=dom:
                                          dom if layer.conv is not None else lay)))
    result.append(best_of("single-grid", "the best single P_r x P_c grid for every layer",
                          grid_opts))
    gh_opts: list[tuple[str, dict[int, Layout] | str]] = []
    convs = any(layer.conv is not None for layer in space.layers)
    for pr, pc in _grids(p):
        for pl in (("rows", "cols") if pr > 1 and pc > 1 else ("rows",)):
            lay = make_layout("model", pr, pc, pl)
            # a network without convolutions: the single grid's answer, said as such
            gh_opts.append((f"convolutions data 1x{p}, other layers {lay.label()}" if convs
                            else f"{lay.label()} for every layer (no convolutions)",
                            _assign(space, lambda layer, lay=lay: make_layout("data", 1, p)
                                    if layer.conv is not None else lay)))
    result.append(best_of("gholami", "Gholami et al.: convolutions data parallel, the other "
                                     "layers on the best grid", gh_opts))
    def megatron_options(modes: dict[int, str], label: str, placements: tuple[str, ...]
                         ) -> list[tuple[str, dict[int, Layout] | str]]:
        """Megatron-LM's ``modes`` (the other layers model-split) on every grid."""
        return [(f"{label}, {pr}x{pc}{' (cols)' if pl == 'cols' else ''}",
                 _assign(space, lambda layer, pr=pr, pc=pc, pl=pl: make_layout(
                     modes.get(layer.index, "model"), pr, pc, pl)))
                for pr, pc in _grids(p) if pr > 1
                for pl in (placements if pc > 1 else ("rows",))]

    pairs = megatron_modes(space.ctx.network)
    megatron_desc = ("Megatron-LM: linear layers in column/row pairs, the other layers "
                     "model-split, on the best grid")
    if pairs and not ctx.paper:
        # no pair, only the output head: Megatron-LM splits it by columns all the same
        label = "column/row pairs" if "row" in pairs.values() else "column-split head"
        result.append(best_of("megatron", megatron_desc,
                              megatron_options(pairs, f"{label}, model elsewhere",
                                               ("rows", "cols"))))
    elif any(layer.linear is not None for layer in space.layers) and not ctx.paper:
        result.append(Baseline("megatron", megatron_desc, None, reason=(
            "no linear layer feeds another one through feature-wise layers only, and the "
            "last layer is not a linear output head: there is nothing for Megatron-LM's "
            "column/row pairs to split")))
    sp = megatron_modes(space.ctx.network, sequence=True)
    if any(m.endswith("-sp") for m in sp.values()) and not ctx.paper:
        # rows only, as the search places sequence parallelism
        result.append(best_of("megatron-sp", "Megatron-LM with sequence parallelism: the "
                                             "pairs column-sp/row-sp, attention and "
                                             "embeddings model-sp, on the best grid",
                              megatron_options(sp, "sequence parallel", ("rows",))))
    if any(layer.attention is not None for layer in space.layers) and not ctx.paper:
        # Megatron-LM's context parallelism without tensor parallelism: its groups on
        # consecutive ranks (tp-cp-dp order), as --emit megatron writes it
        result.append(best_of(CONTEXT_MODE, "Megatron-LM with context parallelism: every "
                                            "layer split along the sequence (P_r) and the "
                                            "batch (P_c), on the best grid",
                              [(f"context parallel, {pr}x{pc}",
                                _assign(space, lambda layer, pr=pr, pc=pc: grid_layout(
                                    layer, p, pr, pc, CONTEXT_MODE, "rows")))
                               for pr, pc in _grids(p) if pr > 1]))
    return result


def least_state_bytes(ctx: Context, options: Options, zero: int | None = None) -> float:
    """Bytes of parameter state every assignment of the question surely holds on its
    busiest device: :func:`_state_floor` of the layers' leanest candidate layouts, each
    taken on its own (whatever ties or pins allow can only hold more). No batch, count
    of microbatches or recomputation makes a plan hold less, so a question whose floor is
    over the capacity has no plan at any of them. ``zero``: the highest ZeRO stage tried
    (default: the question's)."""
    stage = options.zero if zero is None else zero
    per = sharded(question_param_bytes(ctx.network, options), stage, math.inf).total
    p, b = options.gpus, options.batch
    least = math.fsum(min((local_params(layer, lay)
                           for lay in candidate_layouts(layer, p, b, ctx.paper)), default=0.0)
                      for layer in ctx.network.layers if layer.has_weights)
    return per * least / (1.0 + 1e-12)


def _state_floor(space: Space, assignment: dict[int, Layout]) -> float:
    """Bytes of parameter state a device surely holds under ``assignment``: its
    parameter elements of the layers with weights times the bytes per element the ZeRO
    stage does not shard. Every other part of the memory report (the parameters of the
    layers without weights, what ZeRO's shards keep, activations, buffers, workspace)
    is non-negative, so an assignment whose floor is over the capacity does not fit, and
    the baselines skip its memory check (which builds every layer's result)."""
    # ZeRO's shards over ever more replicas: what it leaves whole
    per = sharded(space.pb, space.options.zero, math.inf).total
    layers = space.layers
    # the margin keeps a floor equal to the capacity (in another order of rounding) checked
    return per * math.fsum(local_params(layers[i], lay) for i, lay in assignment.items()) \
        / (1.0 + 1e-12)


def _no_grid(reasons: list[str]) -> str:
    """Why no grid of a baseline applies, from each grid's reason in grid order: the
    small ``P_r`` fail alike (their batch split is larger than the batch), so past them
    the reasons of the larger grids, where the layers themselves refuse (the heads a
    split needs), are the ones that say what would have to change."""
    distinct = list(dict.fromkeys(r.replace(" (cols)", "") for r in reasons))
    if not distinct:
        return "no grid applies"
    other = [r for r in distinct if "batch split P_c=" not in r]
    if len(distinct) == 1 or not other:
        return distinct[0]
    shown = other if len(other) <= 3 else [*other[:2], f"... ({len(other) - 3} more)",
                                           other[-1]]
    said: set[str] = set()  # a hint in parentheses once, not after every grid's reason
    for i, r in enumerate(shown):
        cut = r.rfind(" (")
        hint = r[cut:] if cut > 0 and r.endswith(")") else ""
        if hint and hint in said:
            shown[i] = r[:cut]
        said.add(hint)
    batch = "" if len(other) == len(distinct) else \
        f"on the {len(distinct) - len(other)} of smaller P_r the batch split is larger than " \
        "the batch; "
    return f"no grid applies: {batch}" + "; ".join(shown)


#: an origin standing for every input distribution at once (:func:`_origins`)
BY_ENTRY = -1


def _origins(space: Space, merged: bool = True) -> Sequence[int | None]:
    """Input distributions to try: one run suffices when the first layer has weights and
    opens no block (then its input distribution is free by construction). When the
    network opens with a block holding the first layer with weights, before any
    shortcut (a pipeline stage of a transformer: norm, attention), the block's carried
    entry is the input distribution until that layer reads it, so one run
    (:data:`BY_ENTRY`) holds each state to the origin in its carry instead of one run
    per origin (``merged=False``): the same optimum, at a fraction of the runs (the
    later stages of Llama 3 70B's pipeline on 32 H100s had eight)."""
    first = next(lay for lay in space.layers if lay.has_weights)
    starts_block = any(blk.body[0] <= first.index for blk in space.ctx.network.blocks)
    if first.index == 0 and not starts_block:
        return [None]
    if merged and _entry_carries_origin(space, first.index):
        return [BY_ENTRY]
    return _input_dists(space, first.index)


def _input_dists(space: Space, first: int) -> list[int]:
    """The input distributions of layer ``first``'s candidates, by index."""
    return sorted({space.index[input_dist(lay)] for lay in space.candidates[first]})


def _entry_carries_origin(space: Space, first: int) -> bool:
    """Whether the network's first layer opens a block whose body holds layer ``first``
    with no shortcut begun before it (the carry, the block's entry distribution, is
    then the network's input distribution when ``first`` reads its input)."""
    events = space.structure[0]
    opening = events.get(0, [])
    if len(opening) != 1 or opening[0][0] != "begin":
        return False
    blk = opening[0][1]
    return first in blk.body and not any(
        kind == "swap" for i in range(1, first + 1) for kind, _ in events.get(i, []))


def solve(space: Space, w: Weights) -> tuple[float, dict[int, Layout]]:
    """The dynamic program over every input distribution that matters. Layers that share
    a weight (a tied embedding and output head) are far apart in the sequence, so their
    common layout is not a state: each candidate of the group is tried in turn, one
    dynamic program each (exact for one group; several groups are fixed one after the
    other, the later ones free while the earlier are chosen)."""
    if not space.ties:
        return _solve_origins(space, w, {})
    # the problem without the ties first: if its optimum keeps every tied group on one
    # layout, it is the optimum with them (one dynamic program, where trying every
    # common layout takes one each: 21 for a transformer on 65,536 devices, and the
    # memory search solves twenty times)
    heads: list[np.ndarray] = []
    free = _solve_origins(space, w, {}, probe=max(space.ties[0]), probe_state=heads)
    if all(holds_alike(free[1][g[0]], free[1][t]) for g in space.ties for t in g[1:]):
        return free
    fixed: dict[int, int] = {}
    best: tuple[float, dict[int, Layout]] = (INF, {})
    for g, group in enumerate(space.ties):
        # a lower bound per common layout (the last member held alone: one run of the
        # network, for the first group the free run above, and one of its tail each):
        # layouts are tried best bound first, and the search stops at a bound above the
        # best found. The answer is the one trying every layout in order gives (ties: the
        # first layout), at a few dynamic programs
        bounds = np.min([_member_bounds(space, w, origin, fixed, group,
                                        heads[k] if g == 0 else None)
                         for k, origin in enumerate(_origins(space))], axis=0)
        best = (INF, {})
        choice = 0
        for j in sorted(range(len(bounds)), key=lambda k: (bounds[k], k)):
            if bounds[j] > best[0] or not math.isfinite(bounds[j]):
                break
            value, assignment = _solve_origins(space, w, {**fixed, **dict.fromkeys(group, j)})
            if value < best[0] or (value == best[0] and math.isfinite(value) and j < choice):
                best, choice = (value, assignment), j
        fixed.update(dict.fromkeys(group, choice))
    return best


def _solve_origins(space: Space, w: Weights, fixed: dict[int, int], probe: int | None = None,
                   probe_state: list[np.ndarray] | None = None,
                   ) -> tuple[float, dict[int, Layout]]:
    best: tuple[float, dict[int, Layout]] = (INF, {})
    for origin in _origins(space):
        value, assignment = dynamic_program(space, w, origin, fixed, probe, probe_state)
        if value < best[0]:
            best = (value, assignment)
    return best


def search(ctx: Context, options: Options, objective: str = "time",
           pins: dict[int, list[Layout]] | None = None) -> SearchResult:
    """The best plan for the question, or :class:`NoFeasiblePlan`."""
    pins = pins or {}
    space = Space(ctx, options, pins, objective)
    space.prepare_transitions()
    # the program's parts are one microbatch's: its gradients are reduced once a step
    # (every microbatch with ZeRO 2 and 3), its optimizer step runs once a step, its
    # compute and activation traffic run once a microbatch
    per = 1.0 if sharded_gradients(ctx, options) else 1.0 / options.microbatches
    step = 1.0 / options.microbatches
    if objective == "comm":
        variants = [Weights(0.0, 1.0, per, update=step)]
    elif options.overlap == "none":
        variants = [Weights(gradient=per, step_share=step, update=step)]
    else:
        variants = [Weights(gradient=k * per, step_share=step, update=k * step)
                    for k in (1.0, 0.0)]
    cands: list[Candidate] = []
    seen: dict[tuple[tuple[int, Layout], ...], Candidate] = {}

    def consider(name: str, assignment: dict[int, Layout]) -> Candidate | None:
        """Evaluate an assignment once (None: no assignment); seen before, the same
        candidate."""
        if not assignment:
            return None
        key = tuple(sorted(assignment.items()))
        cand = seen.get(key)
        if cand is None:
            cand = Candidate(name, assignment, evaluate(ctx, options, assignment, space.cache))
            seen[key] = cand
            cands.append(cand)
        return cand

    solved = [solve(space, w) for w in variants]
    answers = [a for _, a in solved]
    # with gradients overlapped, no assignment takes less than its critical path: the
    # compute and activation traffic, the dynamic program's objective at κ = 0
    # (one microbatch: with several, the program's parts are one microbatch's with a
    # share of the step, and its value is no bound on the step)
    lower = solved[1][0] if objective == "time" and len(solved) == 2 and \
        options.microbatches == 1 else None
    for a in answers:
        consider("search", a)
    if len(answers) == 2 and answers[0] != answers[1]:
        # full hiding and no hiding disagree: try the weights in between
        for k in (0.5, 0.25):
            consider("search", solve(space, Weights(gradient=k * per, step_share=step,
                                                    update=k * step))[1])
    bases = baselines(space, objective, variants[0])
    fitting = [c for c in cands if c.evaluation.memory.fits]
    notes: list[str] = []
    constrained = not fitting
    if not fitting:
        fitting = _fit_memory(space, variants[0], answers[0], consider)
        if fitting:
            notes.append("the unconstrained optimum does not fit in memory; the plan trades "
                         "time for memory (Lagrangian search)")
    pool = fitting + [b.chosen for b in bases if b.fits and b.chosen is not None]
    moves = 0

    def repair_from(starts: list[Candidate]) -> int:
        """Repair the first :data:`REPAIRS` distinct ``starts``, the plans that fit into
        ``pool``; the assignments priced."""
        priced = 0
        for c in _distinct(starts, REPAIRS):
            fixed, spent = repair(space, c, objective)
            priced += spent
            if fixed is not None:
                kept = consider("search", fixed.assignment)
                if kept is not None and kept.evaluation.memory.fits:
                    pool.append(kept)
        return priced

    if pool:
        # the fastest answers that do not fit, moved one layer at a time until they do
        bar = min(c.score(objective) for c in pool)
        moves += repair_from(sorted((c for c in cands if not c.evaluation.memory.fits
                                     and c.score(objective) < bar),
                                    key=lambda c: (c.score(objective), c.name)))
    if not pool:
        # nothing fits: the leanest answers whose sum over layers fits and whose maxima
        # (the collective buffers, the workspace, which the walk's memory leaves out)
        # do not, moved a layer at a time (an audit: a plan 4% under the capacity was
        # one move from the leanest answer at 101%)
        moves += repair_from(sorted((c for c in cands if (m := c.evaluation.memory).peak
                                     - m.comm_buffers - m.workspace <= m.capacity),
                                    key=lambda c: (c.evaluation.memory.peak, c.name)))
    if not pool:
        # why, when asked: of the many settings the auto options search, most fail
        raise NoFeasiblePlan.deferred(lambda: _no_plan(space, cands, bases))
    rank = sorted(pool, key=lambda c: (c.score(objective), c.name != "search", c.name))
    best = rank[0]
    blocked = False
    if options.overlap != "none" or constrained:
        # from the best few distinct plans, not the best alone: one layer's move at a
        # time from one start missed plans 2-11% faster that two moves reach, or that
        # start from another answer (found by an audit against brute force); with
        # overlap none the program is exact unless memory constrained it
        starts = _distinct(rank, LOCAL_STARTS)
        # the windows' guides: the best answers whatever their memory
        every = cands + [b.chosen for b in bases if b.chosen is not None]
        guides = [c.assignment for c in _distinct(
            sorted(every, key=lambda c: (c.score(objective), c.name)), GUIDES)]
        first = best
        for start in starts:
            if lower is not None and best.score(objective) - lower <= \
                    LOCAL_GAP * best.score(objective):
                break  # the plan is within LOCAL_GAP of the bound: no start can beat it
            better, spent, turned = improve(space, start, objective, lower, guides)
            moves += spent
            blocked = blocked or turned
            if better.score(objective) < best.score(objective) * (1 - 1e-12):
                best = better
        if best is not first:
            consider("search", best.assignment)
            notes.append("a local search on the overlapped timeline improved the dynamic "
                         "program's plan")
    if best.name != "search":
        notes.append(f"the {best.name} baseline was best; the plan uses it")
    score = best.score(objective)
    blocked = blocked or constrained or any(
        not c.evaluation.memory.fits and c.score(objective) < score for c in cands) or any(
        b.faster_unfitting(score, objective) for b in bases)
    return SearchResult(best, bases, objective, len(cands) + moves, notes, lower,
                        constrained, blocked)


def search_zero(ctx: Context, options: Options, objective: str = "time",
                pins: dict[int, list[Layout]] | None = None,
                stages: tuple[int, ...] = ZERO_STAGES, shards: tuple[str, ...] = ("all",),
                recomputed: int = 0, no_plan: NoPlanAt | None = None,
                ) -> tuple[SearchResult, Context, Options]:
    """``--zero auto`` (and ``--zero-shard auto``): the best plan over the ZeRO stages
    (and over sharding across all replicas or within nodes), with the context and
    options of the setting it uses.

    Stages 0 and 1 are always searched: stage 1 trades the gradient all-reduce for a
    reduce-scatter plus a gather of the updated parameters, and steps 1/R of the
    optimizer state, so either may be faster. Stage 2 prices every layout exactly as
    stage 1 does (it only keeps less), so it is searched only when stage 1 had no plan
    within memory or turned down something faster for memory
    (:attr:`SearchResult.memory_bound`). Stage 3 gathers each layer's
    parameters before its forward and its backward instead of after the step: on the
    critical path (``overlap: none``) that is never faster than stage 2, and it is
    searched by the same rule; prefetched behind compute (``overlap: gradients``) it can
    be, and it is always searched. Each way of sharding runs through the stages alone.
    The fastest plan wins (on a tie the lower stage, then sharding over all replicas,
    which keeps less); when no setting fits, the error is the last one's.

    Under ``--recompute auto`` (``recomputed`` blocks, ``no_plan`` shared by the counts
    it searches, and filled in here), a setting that had no plan with more blocks
    recomputed is not searched: recomputing fewer keeps more, and memory falls as the
    count grows (the rule the count's bisection itself follows). Its trial says
    ``no plan with N recomputed`` (the count is kept, not the error, which holds its
    search's space).
    """
    import dataclasses

    trials: list[ZeroTrial] = []
    found: list[tuple[SearchResult, Context, Options]] = []
    failure: NoFeasiblePlan | None = None
    prefetch = prefetches(dataclasses.replace(ctx, zero=3), options)
    for stage, shard in zero_settings(stages, shards):
        prev = trials[-1] if trials and trials[-1].shard == shard and \
            trials[-1].stage == stage - 1 else None
        more = no_plan.get((stage, shard)) if no_plan is not None else None
        if more is not None and more > recomputed:
            trials.append(ZeroTrial(stage, f"no plan with {more} recomputed", shard=shard))
            continue
        if stage >= 2 and not (stage == 3 and prefetch) and prev is not None \
                and not prev.outcome.startswith("no plan") \
                and not (prev.outcome == "plan" and found[-1][0].memory_bound):
            # the stage before had nothing faster that did not fit (or was itself
            # skipped): keeping less would find the same plan
            base = prev.stage if prev.outcome == "plan" else 1
            # (stage 2 reduces the gradients every microbatch where there are several:
            # then not the same plan, and not a faster one)
            trials.append(ZeroTrial(stage, f"same as {base}" if stage == 2 and
                                    options.microbatches == 1
                                    else f"not faster than {base}", shard=shard))
            continue
        opts = dataclasses.replace(options, zero=stage, zero_shard=shard)
        sctx = dataclasses.replace(ctx, zero=stage, zero_shard=shard)
        try:
            res = search(sctx, opts, objective, pins)
        except NoFeasiblePlan as exc:
            failure = exc
            trials.append(ZeroTrial(stage, "no plan", shard=shard))
            if no_plan is not None:  # searched: no count above this one left it without
                no_plan[(stage, shard)] = recomputed
            continue
        ev = res.best.evaluation
        trials.append(ZeroTrial(stage, "plan", ev.time_s, ev.comm_s, ev.memory.peak, shard))
        found.append((res, sctx, opts))
    if not found:
        # (every setting skipped: the bisection met this count after fewer and more,
        # and says no plan of it; the question's error comes from a count searched)
        raise failure or NoFeasiblePlan(
            f"planner: no plan fits in memory with {recomputed} blocks recomputed: no ZeRO "
            "stage had one with more")
    res, sctx, opts = min(found, key=lambda f: (f[0].best.score(objective), f[2].zero,
                                                f[2].zero_shard != "all"))
    res.zero_trials = trials
    chosen = zero_label(opts.zero, opts.zero_shard)
    scored = [f"{zero_label(t.stage, t.shard)} {format_time(t.time_s)}" for t in trials
              if t.outcome == "plan" and zero_label(t.stage, t.shard) != chosen
              and t.time_s is not None]
    asked = "--zero auto" if len(set(stages)) > 1 else "--zero-shard auto"
    res.notes.append(f"{asked} chose {chosen}"
                     + (f" (searched: {', '.join(scored)})" if scored else ""))
    return res, sctx, opts


def with_recompute(ctx: Context, options: Options, count: int
                   ) -> tuple[Context, Options]:
    """The question recomputing the first ``count`` residual blocks."""
    import dataclasses

    value = recompute_value(count, len(ctx.network.recompute_units))
    return (dataclasses.replace(ctx, recompute=value),
            dataclasses.replace(options, recompute=value))


#: ``--zero auto`` under ``--recompute auto``: each ZeRO setting ``(stage, shard)`` that
#: had no plan, and the most blocks recomputed with which it had none
NoPlanAt = dict[tuple[int, str], int]
#: one question searched with ``count`` blocks recomputed (the context and options say
#: so too), told what :data:`NoPlanAt` the counts before found, and filling it in
Searcher = Callable[[Context, Options, int, NoPlanAt],
                    tuple[SearchResult, Context, Options]]


def least_recomputed(blocks: int, fits: Callable[[int], bool]) -> int | None:
    """The least count of blocks (the first ones) to recompute for ``fits``: 0 if it
    fits; else, if recomputing all of them fits, the least by bisection (``fits`` is
    taken to hold from some count on); None when nothing does. Calls ``fits`` on 0,
    then ``blocks``, then the bisection's counts."""
    if fits(0):
        return 0
    if not blocks or not fits(blocks):
        return None
    lo, hi = 0, blocks  # lo: does not fit; hi: fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def price_least_recomputed(ctx: Context, options: Options,
                           price: Callable[[Context, Options], T],
                           fits: Callable[[T], bool]) -> tuple[T, dict[int, T]]:
    """A given layout under ``--recompute auto``: ``price`` at the fewest blocks (the
    first ones) recomputed with which ``fits`` holds (:func:`least_recomputed`), or at
    every block when none does; with every count priced on the way, by count."""
    blocks = len(ctx.network.recompute_units)
    priced: dict[int, T] = {}

    def holds(count: int) -> bool:
        priced[count] = price(*with_recompute(ctx, options, count))
        return fits(priced[count])

    count = least_recomputed(blocks, holds)
    return priced[blocks if count is None else count], priced


def unimodal_least(lo: int, hi: int, cost: Callable[[int], float]) -> int:
    """The integer in ``[lo, hi]`` of least ``cost`` (the lower on a tie), for a cost
    that falls then rises: ternary search, ``cost`` at about ``2·log_1.5(hi − lo)``
    points (the caller memoises it)."""
    while hi - lo > 2:
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if cost(a) <= cost(b):
            hi = b
        else:
            lo = a
    return min(range(lo, hi + 1), key=lambda n: (cost(n), n))


def search_recompute(ctx: Context, options: Options, inner: Searcher
                     ) -> tuple[SearchResult, Context, Options]:
    """``--recompute auto``: recompute as few residual blocks as the memory needs (the
    first N, whose activations are the largest in a CNN and alike in a transformer).

    Recomputation only adds time to a layout, so none is searched first and kept when
    its optimum fits. Otherwise every block is tried; when its optimum fits, the least N
    whose optimum fits is found by bisection (memory falls as N grows). The fastest plan
    of all counts searched wins (fewer blocks on a tie: a plan that trades time for
    memory at a smaller N may beat recomputing more); when nothing fits, the error is
    that of recomputing every block. When even recomputing every block leaves the
    optimum too large (both ends trade time for memory), a count between them may beat
    both, recomputing a little and trading a little (a pipeline chunk of Llama 3 405B
    on 1,024 H100s: 1.414 s with no block recomputed, 1.284 s with 1 of 4, 1.326 s
    with 2): the counts between are searched for the fastest, taken to fall then rise
    with the count (:func:`unimodal_least`). ``inner`` searches one question (plain, or
    over the ZeRO stages) and returns the context and options it chose."""
    blocks = len(ctx.network.recompute_units)
    trials: dict[int, RecomputeTrial] = {}
    found: dict[int, tuple[SearchResult, Context, Options]] = {}
    failure: NoFeasiblePlan | None = None
    no_plan: NoPlanAt = {}

    def run(count: int) -> bool:
        """Search with ``count`` blocks recomputed; whether its optimum fits."""
        nonlocal failure
        try:
            res, c, o = inner(*with_recompute(ctx, options, count), count, no_plan)
        except NoFeasiblePlan as exc:
            failure = exc
            trials[count] = RecomputeTrial(count, "no plan")
            return False
        ev = res.best.evaluation
        trials[count] = RecomputeTrial(count, "traded" if res.constrained else "plan",
                                       ev.time_s, ev.memory.peak)
        found[count] = (res, c, o)
        return not res.constrained

    least = least_recomputed(blocks, run)
    if least is None and found and blocks > 1:  # every count trades: the best between

        def seconds(count: int) -> float:
            if count not in trials:
                run(count)
            hit = found.get(count)
            return hit[0].best.score(hit[0].objective) if hit else math.inf

        unimodal_least(0, blocks, seconds)
    if not found:
        assert failure is not None
        raise failure
    count = min(found, key=lambda n: (found[n][0].best.score(found[n][0].objective), n))
    res, c, o = found[count]
    res.recompute_trials = [trials[n] for n in sorted(trials)]
    what = "residual blocks" if ctx.network.recompute_unit == "blocks" else "layers"
    res.notes.append(f"--recompute auto chose {count} of {blocks} {what}")
    return res, c, o


#: how much evaluation the local search may spend from each start: layers evaluated in
#: all (a network of 20 layers may try 500 assignments a start, one of 1,000 layers 10)
LOCAL_BUDGET = 10_000
#: the local search is skipped when the plan is this close to the lower bound (relative)
LOCAL_GAP = 1e-2
#: the distinct plans the local search starts from, best first
LOCAL_STARTS = 3
#: the longest run of consecutive layers the local search sets to a guide's layouts at once
WINDOW = 4
#: the distinct answers (fitting or not) the local search takes windows from
GUIDES = 6
#: the fastest answers that do not fit which the search moves toward memory that fits
REPAIRS = 2
#: the most steps of one such repair
REPAIR_STEPS = 4


def _move_groups(space: Space) -> tuple[list[tuple[int, ...]],
                                         dict[tuple[int, ...], list[int]]]:
    """The layers a local move changes together (tied layers; layers with one candidate
    left out), and each group's candidate positions in order of their own cost with the
    gradient term halved."""
    tied = {i for g in space.ties for i in g}
    groups = [*space.ties, *((i,) for i, lays in space.candidates.items()
                             if i not in tied and len(lays) > 1)]
    half = Weights(gradient=0.5, step_share=1.0 / space.options.microbatches)
    order: dict[tuple[int, ...], list[int]] = {}  # positions in the (aligned) candidates
    for g in groups:
        own = np.sum([space.weighted_own(space.layers[i], half) for i in g], axis=0)
        order[g] = sorted(range(len(own)), key=lambda j: (own[j], j))
    return groups, order


def _moved(space: Space, current: dict[int, Layout],
           moves: Iterable[tuple[tuple[int, ...], int]]) -> dict[int, Layout]:
    """``current`` with each group of ``moves`` at its candidate position."""
    trial = dict(current)
    for g, j in moves:
        for i in g:
            trial[i] = space.candidates[i][j]
    return trial


def _one_layer_moves(space: Space, groups: list[tuple[int, ...]],
                     order: dict[tuple[int, ...], list[int]],
                     current: dict[int, Layout] | Callable[[], dict[int, Layout]]
                     ) -> Iterable[dict[int, Layout]]:
    """Every one-group change of ``current``, groups in order, each group's layouts in
    ``order``. ``current`` may be a callable, read afresh for each move, so that a
    consumer that keeps a move moves on from it."""
    for g in groups:
        for j in order[g]:
            now = current() if callable(current) else current
            if any(now[i] != space.candidates[i][j] for i in g):
                yield _moved(space, now, [(g, j)])


def _distinct(cands: Iterable[Candidate], n: int) -> list[Candidate]:
    """The first ``n`` candidates with distinct assignments."""
    out: list[Candidate] = []
    for c in cands:
        if len(out) == n:
            break
        if all(c.assignment != o.assignment for o in out):
            out.append(c)
    return out


def repair(space: Space, start: Candidate, objective: str) -> tuple[Candidate | None, int]:
    """From an answer that does not fit, one layer's move at a time toward one that
    does: each step prices every one-layer change (tied layers together) that lowers
    the peak, and takes the best-scoring one that fits (and ends), or else the one that
    adds the least time per byte of peak it removes (gaining time counts as best), for
    at most :data:`REPAIR_STEPS` steps and :data:`LOCAL_BUDGET` layer evaluations (not
    tried where one step's moves are over that budget: a network of many layers).

    The memory walk steers by the program's per-layer memory, which leaves out the
    collective buffers and the workspace (maxima, not sums), and by its additive time,
    which does not see the overlapped timeline; plans that fit a few MiB under a tight
    capacity and are as fast as the fastest plan can be on none of its hulls (the
    audit's brute force, 2026-12-07: a one-block transformer 13% faster than the
    search's plan, one layer's move from the fastest plan). Returns the plan that fits
    (None if none was reached) and the assignments priced."""
    ctx, options = space.ctx, space.options
    groups, order = _move_groups(space)
    budget = LOCAL_BUDGET // max(len(space.layers), 1)
    if sum(len(order[g]) - 1 for g in groups) > budget:
        return None, 0  # not one step's moves within the budget: a partial step is blind
    current, peak = start.assignment, start.evaluation.memory.peak
    score, spent = start.score(objective), 0
    for _ in range(REPAIR_STEPS):
        fit: tuple[float, dict[int, Layout]] | None = None
        step: tuple[float, float, float, dict[int, Layout]] | None = None
        for trial in _one_layer_moves(space, groups, order, current):
            if spent >= budget:
                break
            spent += 1
            memory, ev = evaluate_fitting(ctx, options, trial, space.cache)
            if memory.peak >= peak:
                continue
            if ev is not None:
                value = ev.comm_s if objective == "comm" else ev.time_s
                if fit is None or value < fit[0]:
                    fit = (value, trial)
            elif fit is None:
                time_s, comm_s = time_and_comm(ctx, options, trial, space.cache)
                value = comm_s if objective == "comm" else time_s
                rate = (value - score) / (peak - memory.peak)
                if step is None or rate < step[0]:
                    step = (rate, memory.peak, value, trial)
        if fit is not None:
            trial = fit[1]
            return Candidate("search", trial, evaluate(ctx, options, trial, space.cache)), spent
        if step is None or spent >= budget:
            break
        _, peak, score, current = step
    return None, spent


def improve(space: Space, start: Candidate, objective: str, lower: float | None,
            guides: Sequence[dict[int, Layout]] = ()) -> tuple[Candidate, int, bool]:
    """Improve a plan on the real timeline by changing one layer's layout at a time
    (layers that share a weight together), keeping a change when the plan still fits and
    scores better, until no change helps or :data:`LOCAL_BUDGET` is spent.

    Under ``overlap: gradients`` the dynamic program's additive objective cannot see
    what the timeline does with gradient buckets (a bucket leaves when its last gradient
    is ready; layers in another process group start another bucket), so it is solved for
    a few fixed weights of the gradient term and the best answer scored. This pass
    starts from that answer. It is skipped when the plan is within :data:`LOCAL_GAP` of
    ``lower`` (no assignment is faster than its compute and activation traffic). Passes
    visit the layers from the output back, then forward, alternating, each layer's
    layouts in order of their own cost with the gradient term halved; every order is
    fixed, so the result is deterministic. When neither direction helps, runs of 2 to
    :data:`WINDOW` consecutive layers (by index) move together: onto one grid and
    placement (each layer its cheapest layout there), with the sequence split turned
    off or on in the whole run (Ulysses attention's off being the heads split; a tied
    head with the embedding or keeping its own), onto one layout they all have, and
    onto the layouts of each of ``guides`` (other answers, fitting or not); a
    move that helps starts the one-layer passes again. A single layer's move cannot
    drop the redistribution between two layers that must change together (the audit's
    three-layer convolution network under a tight capacity: both convolutions to domain
    8x2 at once, 6-8% faster). With overlap ``none`` it runs only where memory
    constrained the program (otherwise exact). Returns the best candidate (``start``
    itself if nothing helped), the assignments evaluated, and whether a better one was
    turned down for memory."""
    if not start.evaluation.memory.fits:
        return start, 0, False
    score = start.score(objective)
    if lower is not None and score - lower <= LOCAL_GAP * score:
        return start, 0, False
    ctx, options = space.ctx, space.options
    groups, order = _move_groups(space)
    budget = LOCAL_BUDGET // max(len(space.layers), 1)
    # no step is shorter than M microbatches of compute and activation traffic plus the
    # optimizer step: M times the program's objective with the gradient term at zero
    # and the step's share 1/M (a hypothesis test checks it against the timeline), and
    # a move whose bound is over the score is skipped unpriced: the same moves, the same
    # result, at a fifth to a half of the timelines (0.2-0.9 ms against 1.3-5.8 ms each)
    timed, m = objective == "time", options.microbatches
    path = Weights(gradient=0.0, step_share=1.0 / m)
    # passes alternate direction, from the output back first (the order in which the
    # backward pass readies gradients), until a pass each way changes nothing
    groups.sort(key=lambda g: -g[0])
    quiet = 0
    best, spent, blocked = start, 0, False

    def attempt(trial: dict[int, Layout]) -> bool:
        """Price ``trial``; keep it when it fits and scores better."""
        nonlocal best, score, spent, blocked
        spent += 1
        if timed and m * space.score(trial, path) >= score:
            return False  # its critical path alone is no faster than the plan
        time_s, comm_s = time_and_comm(ctx, options, trial, space.cache)
        if (comm_s if objective == "comm" else time_s) >= score * (1 - 1e-9):
            return False
        cand = Candidate("search", trial, evaluate(ctx, options, trial, space.cache))
        if not cand.evaluation.memory.fits:
            blocked = True
            return False
        best, score = cand, cand.score(objective)
        return True

    # the guides' windows: runs of consecutive layers set to another answer's layouts
    # together (one layer at a time, a run of layers that must change together to
    # drop a redistribution between them is out of reach; the audit's brute force found
    # plans 5-13% faster that way under a tight memory capacity)
    ranked = sorted(groups, key=lambda g: g[0])
    windows: list[tuple[tuple[int, ...], ...]] = [
        tuple(ranked[a:a + w]) for w in range(2, WINDOW + 1)
        for a in range(len(ranked) - w + 1)]

    @functools.cache
    def on_grid(g: tuple[int, ...]) -> dict[tuple[int, int, str], int]:
        """The group's cheapest layout (by its own cost, as the moves are ordered) on
        each grid and placement."""
        firsts: dict[tuple[int, int, str], int] = {}
        for j in order[g]:
            lay = space.candidates[g[0]][j]
            firsts.setdefault((lay.pr, lay.pc, lay.placement), j)
        return firsts

    @functools.cache
    def position(g: tuple[int, ...]) -> dict[Layout, tuple[int, int]]:
        """The group's layouts by value (its first layer's; of tied layouts alike there,
        the cheapest): their position, and their rank in its order."""
        out: dict[Layout, tuple[int, int]] = {}
        for r, j in enumerate(order[g]):
            out.setdefault(space.candidates[g[0]][j], (j, r))
        return out

    @functools.cache
    def where(g: tuple[int, ...]) -> dict[tuple[Layout, ...], int]:
        """The group's positions by its layers' layouts."""
        return {tuple(space.candidates[i][j] for i in g): j for j in order[g]}

    @functools.cache
    def by_modes(g: tuple[int, ...]) -> dict[tuple[str, ...], int]:
        """The group's positions by its layers' modes and the first one's grid and
        placement (the first in the group's order where several match)."""
        out: dict[tuple[str, ...], int] = {}
        for j in order[g]:
            lays = [space.candidates[i][j] for i in g]
            out.setdefault((*(x.mode for x in lays), str(lays[0].grid),
                            lays[0].placement), j)
        return out

    def switch(mode: str, on: bool) -> str:
        """A mode with its sequence split turned on or off (Ulysses attention's off is
        the heads split); the mode itself where it has no such twin."""
        if on:
            return f"{mode}-sp" if f"{mode}-sp" in SEQUENCE_MODES else mode
        return "model" if mode == "ulysses" else mode.removesuffix("-sp")

    def toggled(g: tuple[int, ...], j: int, on: bool, alone: bool) -> int:
        """Position of the group's layouts ``j`` with the sequence split turned on or
        off on the same grid, in every layer of the group or (``alone``) its first
        (a tied head may keep its split): ``j`` itself where there is no such layout."""
        lays = [space.candidates[i][j] for i in g]
        rest = [x.mode if alone else switch(x.mode, on) for x in lays[1:]]
        key = (switch(lays[0].mode, on), *rest, str(lays[0].grid), lays[0].placement)
        return by_modes(g).get(key, j)

    def picks(win: tuple[tuple[int, ...], ...]) -> list[list[int]]:
        """The run's moves onto one grid, then with the sequence split turned off and
        on for the whole run, then onto one layout, cheapest first."""
        out = [[on_grid(g)[key] for g in win] for key in
               sorted(set.intersection(*(set(on_grid(g)) for g in win)))]
        current = best.assignment
        now = [where(g).get(tuple(current[i] for i in g), -1) for g in win]
        if min(now) >= 0:
            for on, alone in itertools.product((False, True), (False, True)):
                pick = [toggled(g, j, on, alone) for g, j in zip(win, now, strict=True)]
                if pick not in out:
                    out.append(pick)
        common = set.intersection(*(set(position(g)) for g in win))
        out += [[position(g)[lay][0] for g in win] for lay in sorted(
            common, key=lambda lay: (sum(position(g)[lay][1] for g in win), lay.label()))]
        return out

    while spent < budget:
        while quiet < 2 and spent < budget:
            improved = False
            for trial in _one_layer_moves(space, groups, order, lambda: best.assignment):
                if spent >= budget:
                    break
                improved = attempt(trial) or improved
            quiet = 0 if improved else quiet + 1
            groups.reverse()
        moved = False
        for win in windows:  # a run of layers moved onto one grid or layout together
            if spent >= budget:
                break
            current = best.assignment
            for pick in picks(win):
                if spent >= budget:
                    break
                trial = _moved(space, current, zip(win, pick, strict=True))
                if trial[win[0][0]] == current[win[0][0]] or \
                        trial[win[-1][0]] == current[win[-1][0]]:
                    continue  # a shorter window's move, or a single layer's
                if attempt(trial):
                    moved = True
                    current = best.assignment
        for guide in guides:
            for win in windows:
                current = best.assignment
                if spent >= budget:
                    break
                ends = [any(current[i] != guide[i] for i in g) for g in (win[0], win[-1])]
                if not all(ends):
                    continue  # a shorter window's move, or a single layer's
                trial = dict(current)
                for g in win:
                    for i in g:
                        trial[i] = guide[i]
                moved = attempt(trial) or moved
        if not moved:
            break
        quiet = 0
    return best, spent, blocked


#: most answers of the program the memory search tries (each a full dynamic program)
FIT_BUDGET = 24
#: bounds on the collective buffers tried when the leanest answer does not fit
CAP_TRIES = 4


def _fit_memory(space: Space, base: Weights, fastest: dict[int, Layout],
                consider: Any) -> list[Candidate]:
    """Assignments that fit, from the Lagrangian relaxation of the memory constraint:
    minimise time + λ · memory (the program's additive parts) for weights λ chosen by
    walking the lower convex hull of (time, memory) over assignments. Between an answer
    that does not fit (``A``, first the fastest) and one that does (``B``, first the
    leanest), λ = (t_B − t_A) / (m_A − m_B) scores the two alike; the program's answer at
    that λ is either on the segment AB (no assignment scores below it: the hull edge,
    stop) or a new vertex, which replaces ``A`` or ``B`` by whether it fits (the
    evaluation's peak decides). The last ``B`` is the hull vertex nearest the constraint
    on the side that fits (Handler & Zang, "A dual algorithm for the constrained shortest
    path problem", Networks 10, 1980). That would be the answer if fitting were monotone
    in the program's memory; it is not (the evaluation's peak adds the largest buffer and
    counts some tensors once that the program counts twice), so a vertex with more of the
    program's memory than one that does not fit can fit. After the walk, the segments
    between two answers that do not fit are split the same way, the one nearest the
    constraint first, while their faster end is faster than the best answer that fits
    (every vertex between is slower than that end), within :data:`FIT_BUDGET` runs of the
    program. When even the leanest answer does not fit, no
    weight is tried: the program's memory is the evaluation's up to what the module's
    memory notes list, and the transient collective buffers: the program's memory is a
    sum over layers, the evaluation's peak adds the largest buffer. Where the leanest
    answer does not fit, the layouts whose buffers are over what its other parts leave
    room for are left out (halving that bound while the answer still does not fit), and
    the hull is walked with them left out."""
    found: list[Candidate] = []
    timed = Weights(base.compute, base.activation, base.gradient, 0.0,
                    step_share=base.step_share, update=base.update)
    memory = Weights(0.0, 0.0, 0.0, 1.0)

    def point(assignment: dict[int, Layout]) -> tuple[float, float]:
        return space.score(assignment, timed), space.score(assignment, memory)

    lean = solve(space, memory)[1]
    leanest = consider("search", lean)
    cap = INF
    if leanest is not None and not leanest.evaluation.memory.fits:
        mem = leanest.evaluation.memory
        cap = mem.capacity - (mem.peak - mem.comm_buffers)
        floor = space.fewest_buffer_bytes()
        for _ in range(CAP_TRIES):
            if cap < floor:
                break
            lean = solve(space, Weights(0.0, 0.0, 0.0, 1.0, buffer_cap=cap))[1]
            leanest = consider("search", lean)
            if leanest is None or leanest.evaluation.memory.fits:
                break
            cap /= 2
    if leanest is None or not leanest.evaluation.memory.fits:
        return found
    found.append(leanest)
    # segments of the hull still to split, as (priority, order, faster end, leaner end);
    # an end is (time, memory, fits). Priority 0: the faster end does not fit and the
    # leaner does (the walk); 1: neither fits (explored after the walk, the leanest
    # first, while faster than the best that fits: "fits" is the evaluation's peak,
    # which is not monotone in the program's memory)
    t_f, m_f = point(fastest)
    t_l, m_l = point(lean)
    best_t = t_l
    heap: list[tuple[int, float, int, tuple[float, float, bool], tuple[float, float, bool]]]
    heap = [(0, 0.0, 0, (t_f, m_f, False), (t_l, m_l, True))]
    order = itertools.count(1)
    runs = 0
    while heap and runs < FIT_BUDGET:
        _, _, _, (t_a, m_a, _fa), (t_b, m_b, fits_b) = heapq.heappop(heap)
        if m_a <= m_b or t_a >= best_t * (1 - 1e-12):
            continue  # nothing in between, or nothing in between faster than a fit
        lam = max((t_b - t_a) / (m_a - m_b), 0.0)
        runs += 1
        mid = solve(space, Weights(base.compute, base.activation, base.gradient, lam,
                                   buffer_cap=cap, step_share=base.step_share,
                                   update=base.update))[1]
        t_c, m_c = point(mid)
        if t_c + lam * m_c >= (t_a + lam * m_a) * (1 - 1e-12):
            continue  # on the segment: the hull edge between the two
        cand = consider("search", mid)
        if cand is None:
            continue
        fits = cand.evaluation.memory.fits
        c = (t_c, m_c, fits)
        if fits:
            found.append(cand)
            best_t = min(best_t, t_c)
        # the half on the fitting side of a fit is slower than it: left out
        for lo, hi in (((t_a, m_a, False), c), (c, (t_b, m_b, fits_b))):
            if lo[2]:
                continue
            prio = 0 if hi[2] else 1
            heapq.heappush(heap, (prio, -lo[0] if prio else 0.0, next(order), lo, hi))
    return found


def _batch_that_fits(batch: int, gpus: int, mem: MemoryReport) -> int | None:
    """The batch at which the activations and the workspace, falling in proportion to it,
    leave the rest of the peak room (rounded down to a multiple of the device count where
    that leaves at least one sample a device), or None where no smaller batch can fit."""
    room = mem.capacity - (mem.peak - mem.per_batch)
    if room <= 0 or mem.per_batch <= 0 or batch <= 1:
        return None
    fits = math.floor(batch * room / mem.per_batch)
    if fits < 1:  # not even one sample's activations fit (an audit: "about --batch 1")
        return None
    if fits >= gpus:
        fits -= fits % gpus
    return max(1, min(fits, batch - 1))


def _microbatches_that_fit(batch: int, microbatches: int, mem: MemoryReport) -> int | None:
    """The fewest microbatches, a divisor of the step's ``batch``, at which the
    activations and the workspace (``mem``'s, at ``microbatches``), falling in proportion
    to a microbatch's samples, leave the rest of the peak room (gradient accumulation
    keeps the step's batch); None where none can."""
    room = mem.capacity - (mem.peak - mem.per_batch)
    if room <= 0 or mem.per_batch <= 0:
        return None
    need = math.ceil(microbatches * mem.per_batch / room)
    return next((m for m in range(max(need, microbatches + 1), batch + 1) if batch % m == 0),
                None) if need <= batch else None


def _state_tips(space: Space) -> list[str]:
    """What shrinks the parameters, gradients and optimizer state a device keeps: ZeRO's
    next stage or sharding over all replicas, a lighter optimizer."""
    opts, tips = space.options, []
    if opts.zero and opts.zero_shard == "node" and space.ctx.gpus > space.ctx.per_node:
        tips.append("--zero-shard all (shards over all the data-parallel replicas, not "
                    "those in one node)")
    if opts.zero < 3 and opts.cost_model == "exact" and space.ctx.gpus > 1:
        what = ("the optimizer state", "the gradients too", "the weights too")[opts.zero]
        tips.append(f"--zero {opts.zero + 1} (shards {what} over the data-parallel "
                    "replicas)")
    if opts.optimizer == "adam":
        tips.append("a lighter optimizer (--optimizer momentum or sgd)")
    return tips


def _no_plan(space: Space, cands: list[Candidate], bases: list[Baseline]) -> NoFeasiblePlan:
    # a baseline family none of whose grids fits shows its fastest grid; its leanest may
    # need less than anything the search found (Llama 3 70B on 64 H100s at batch 32:
    # the search's leanest 171 GiB, megatron-sp on 8 x 8 132.7 GiB; found by an audit)
    leanest = [b.unfitted.leanest() for b in bases if b.unfitted is not None]
    everything = cands + leanest + [b.candidate for b in bases if b.candidate is not None]
    least = min(everything, key=lambda c: c.evaluation.memory.peak)
    mem = least.evaluation.memory
    short = mem.peak - mem.capacity
    opts = space.options
    tips: list[str] = []
    params = mem.weights + mem.gradients + mem.optimizer
    # if memory per device shrank in proportion to the device count, this many would do
    # (a power-of-two multiple of --gpus, at least twice it)
    factor = 2
    while factor < 2**40 and mem.peak > mem.capacity * factor:
        factor *= 2
    most = space.ctx.cluster.max_devices()
    run = opts.run_gpus or opts.gpus  # the user's --gpus (a pipeline stage has a share)
    if run * factor > MAX_GPUS:  # the most --gpus takes
        more = ("more than the 2^30 devices planner plans for, if memory per device "
                "falls in proportion")
    elif most is not None and run * factor > most:  # more than the cluster holds
        more = (f"a larger cluster: about {run * factor:,} devices, if memory per "
                f"device falls in proportion; this one holds {most:,}")
    else:  # an estimate: plan, compare and check search it (more_devices_checked)
        more = f"about --gpus {run * factor}, if memory per device falls in proportion"
    net = space.ctx.network
    # --batch is the step's; a microbatch holds 1/M of it, and its activations are the peak's
    per_micro = _batch_that_fits(opts.batch, opts.gpus, mem)
    smaller = per_micro * opts.microbatches if per_micro is not None else None
    per_batch = mem.per_batch
    if per_batch > params:
        units = len(net.recompute_units)
        if len(space.ctx.rebuilt_units) < units and opts.cost_model == "exact":
            what = "residual blocks" if net.recompute_unit == "blocks" else "layers"
            tips.append(f"recomputing {what} (--recompute auto: as few of the "
                        f"{units:,} as memory needs)")
        passes = _microbatches_that_fit(opts.step_batch, opts.microbatches, mem)
        if passes is not None:
            tips.append(f"more microbatches (about --microbatches {passes}: the same batch "
                        f"of {opts.step_batch:,} in {passes} passes, if activations fall in "
                        "proportion)")
        if smaller is not None:
            tips.append(f"a smaller batch (about --batch {smaller}, if activations fall in "
                        f"proportion: they and the workspace are {format_bytes(per_batch)} "
                        "of the peak)")
        rest = mem.peak - per_batch
        alone = "" if smaller is not None else (
            "; a smaller batch alone cannot fit: the peak less its activations and "
            f"workspace is {format_bytes(rest)}") if rest > mem.capacity else (
            "; a smaller batch alone cannot fit: the peak less its activations and "
            f"workspace is {format_bytes(rest)}, and one sample's, about "
            f"{format_bytes(per_batch / max(1, opts.batch))}, do not fit beside it")
        tips.append(f"more devices ({more}{alone})")
        if mem.peak - per_batch > mem.capacity:
            # what no batch changes does not fit either: what shrinks it helps too
            tips += _state_tips(space)
    else:
        tips.append(f"more devices ({more}; parameters, gradients and optimizer state "
                    f"take {format_bytes(params)})")
        tips += _state_tips(space)
        if smaller is not None:
            tips.append(f"a smaller batch (about --batch {smaller})")
    ctx = space.ctx
    if ctx.grad_bytes > ctx.elem_bytes:
        saved = mem.gradients * (1 - ctx.elem_bytes / ctx.grad_bytes)
        tips.append(f"gradients in the weights' dtype (--grad-precision "
                    f"{ctx.network.dtype}: {format_bytes(saved)} less)")
    shortfall = Shortfall(mem.peak, mem.capacity, tips, head=(
        f"planner: no plan fits in memory: the leanest layout found needs "
        f"{format_bytes(mem.peak)} per device, {format_bytes(mem.capacity)} is "
        f"available (short by {format_bytes(short)})"))
    return NoFeasiblePlan(shortfall.message(), shortfall, [b.to_data() for b in bases])


#: doublings of ``--gpus`` a plan that does not fit searches before it says how many
#: devices would do (2x to 256x)
DEVICE_PROBES = 8


def leanest_fits(ctx: Context, options: Options) -> bool:
    """Whether the program's leanest answer (memory alone weighed) fits: then the search
    of the same question finds a plan (its memory walk starts from that answer), which
    is all the "more devices" probe needs to know, at a fraction of a search that has
    to walk to its plan (an audit: 163 s for a 10,000-layer question whose probe at
    twice the devices fitted only through the walk). False says nothing: search it.
    Raises :class:`NoFeasiblePlan` where no layout applies."""
    space = Space(ctx, options, {}, "time")
    space.prepare_transitions()
    lean = solve(space, Weights(0.0, 0.0, 0.0, 1.0))[1]
    return bool(lean) and evaluate_fitting(ctx, options, lean, space.cache)[0].fits


def more_devices_checked(exc: NoFeasiblePlan, gpus: int, batch: int, most: int | None,
                         search_at: Callable[[int], Any]) -> NoFeasiblePlan:
    """``exc`` (a question on ``gpus`` devices that does not fit) with its "more devices"
    advice checked: ``search_at`` searches the same question at twice the devices, four
    times, ... (at most :data:`DEVICE_PROBES` doublings, no more than the ``most`` the
    cluster holds) until a plan fits, and the advice names that count (with what the
    leanest layout needs at half of it), or says that more devices alone do not fit and
    what the leanest layout needs at each count tried. Memory per device does not fall
    in proportion to the devices (a layer's split is bounded by its heads, channels and
    the batch; data parallelism keeps the weights whole), so :func:`_no_plan`'s
    proportional estimate sent Mixtral 8x7B on 24 A100s to 48, where the leanest layout
    still needs 90.19 GiB of 79 (an audit); 96 fit. Where no count could be tried (twice
    the devices is more than the cluster holds), ``exc`` as it is."""
    short = exc.shortfall
    # the failed search's frames (its space: 445 MiB for 10,000 layers) are not kept
    # through the probes' searches
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    old = None if short is None else next(
        (t for t in short.suggestions if t.startswith("more devices (")), None)
    if short is None or old is None:
        return exc
    # what the estimate's tip says of a smaller batch stays with the checked one
    at = old.find("; a smaller batch alone")
    aside = old[at:-1] if at >= 0 else ""
    top = min(MAX_GPUS, most or MAX_GPUS)
    n = gpus
    tried: list[tuple[int, float]] = []
    fits: int | None = None
    ended = False  # a count no layout applies to: more devices cannot help
    stop = f"more than {gpus * 2**DEVICE_PROBES:,} were not tried"
    for _ in range(DEVICE_PROBES):
        n *= 2
        if n > top:
            stop = f"this cluster holds {top:,}" if most is not None and most < MAX_GPUS \
                else "planner plans for at most 2^30"
            break
        try:
            search_at(n)
        except NoFeasiblePlan as failed:
            if failed.shortfall is None:  # no layout applies: nor with more devices
                stop = f"on {n:,} no layout applies to a batch of {batch:,}"
                ended = True
                break
            tried.append((n, failed.shortfall.needed_bytes))
            continue
        fits = n
        break
    if fits is None and not tried:
        return exc  # nothing could be tried: the estimate stands
    tip: str | None = None  # the checked tip in the estimate's place (None: dropped)
    tail = short.tail
    if fits is not None:
        last = (f"; on {tried[-1][0]:,} the leanest layout needs "
                f"{format_bytes(tried[-1][1])}") if tried else ""
        tip = f"more devices (--gpus {fits}: a plan fits there{last}{aside})"
    elif not ended and (beyond := _beyond(tried, short.needed_bytes,
                                          short.capacity_bytes)) is not None:
        last_n, peak = tried[-1]
        where = f"on all {last_n:,} devices of this cluster" if most is not None and \
            last_n * 2 > most else f"on {last_n:,}"
        said = f"a larger cluster: about {beyond:,} devices" if most is not None and \
            beyond > most else f"about --gpus {beyond}"
        tip = (f"more devices ({said}, if memory per device keeps falling in proportion; "
               f"{where} the leanest layout needs {format_bytes(peak)}{aside})")
    else:
        each = [f"{format_bytes(b)} on {m:,}" for m, b in tried]
        each[0] += " devices"
        needs = each[0] if len(each) == 1 else ", ".join(each[:-1]) + " and " + each[-1]
        tail += (f"; more devices alone do not fit: the leanest layout needs {needs} "
                 f"({stop})" + aside.replace("; a smaller batch alone cannot fit",
                                             "; nor does a smaller batch alone"))
    tips = [t for t in short.suggestions if t != old] if tip is None else \
        [tip if t == old else t for t in short.suggestions]
    checked = replace(short, suggestions=tips, tail=tail)
    return NoFeasiblePlan(checked.message(), checked, exc.baselines)


def _beyond(tried: list[tuple[int, float]], first: float, capacity: float) -> int | None:
    """Past the counts ``tried`` (device count, the leanest layout's peak), where none
    fit: the power-of-two multiple of the last at which its peak, falling in proportion,
    would fit, while the peak still falls (the last below the one before, or below
    ``first``, the question's own) and the count stays within what planner plans for;
    else None."""
    n, peak = tried[-1]
    before = tried[-2][1] if len(tried) > 1 else first
    if peak >= before:
        return None
    factor = 2
    while peak > capacity * factor:
        factor *= 2
    return n * factor if n * factor <= MAX_GPUS else None
