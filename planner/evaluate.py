"""Evaluating a complete assignment of layouts: per-layer costs, redistribution between
layouts, memory per device and the iteration timeline.

:func:`evaluate` is what ``planner cost`` prints and what every plan and baseline is
scored with, so the search's answer and ``cost`` of the same layout agree by
construction.

The timeline (Lee et al., MLHPC 2018, REFERENCES §2): the forward pass runs every layer's
compute and its activation traffic in order; the backward pass walks the layers back, each
layer's backward compute and activation traffic (backward-data all-reduces, halos,
gradient redistribution) on the critical path. With ``overlap: gradients`` each layer's
weight gradient joins a bucket (consecutive layers reducing over the same group, up to
``bucket_bytes``); a bucket's all-reduce starts when its last gradient is ready and the
previous all-reduce has finished (one communication channel). The iteration ends at
``max(end of backward compute, end of the last all-reduce)`` plus the optimizer step.
With ``overlap: none`` every all-reduce waits for the end of the backward pass.

ZeRO stage 3 with ``overlap: gradients`` prefetches each layer's parameter gather
(:class:`_Prefetcher`): issued when an earlier layer starts, up to a bucket of gathered
parameters ahead, on a channel of its own in the forward pass and on the gradient
buckets' channel in the backward pass (first come, first served); a layer waits for its
gather. Communication and compute do not slow each other (no contention for SMs or
memory bandwidth), as for the gradient buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .cluster import Cluster
from .costs.comm import Collective, Group, collective_time, paper_all_reduce
from .costs.compute import Estimator, Roofline
from .costs.layer import (
    CommTerm,
    Context,
    LayerCost,
    cost_signature,
    follower_kernels,
    follower_terms,
    held,
    local_params,
    loss_cost,
    optimizer_kernel,
    recompute_error,
    recomputed,
    redistribute_terms,
    rerun_terms,
    stepped,
    time_kernels,
    weighted_kernels,
    weighted_terms,
)
from .costs.memory import MemoryReport, ParamBytes, param_bytes
from .errors import UsageError
from .layout import EXPERT_MODES, WHOLE_MODES, Dist, Layout, base_mode, input_dist
from .network import DTYPE_BYTES, VIEW_TYPES, Layer, Network, busiest_rows

ZERO_STAGES = (0, 1, 2, 3)
#: how the loss's softmax cross-entropy runs (``--cross-entropy``; :attr:`Options.cross_entropy`)
CROSS_ENTROPY = ("fused", "eager", "eager-no-upcast")
#: over whom ZeRO shards: all of a layer's data-parallel replicas, or those inside one
#: node, replicated across nodes (hybrid sharding)
ZERO_SHARDS = ("all", "node")


def zero_label(stage: int, shard: str) -> str:
    """A ZeRO setting as a person reads it: ``stage 3``, ``stage 3 within nodes``."""
    return f"stage {stage}" + (" within nodes" if stage and shard == "node" else "")

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb = 25


@dataclass(frozen=True)
class Options:
    """The question besides the network and cluster."""

    gpus: int
    batch: int
    cost_model: str = "exact"
    overlap: str = "gradients"
    bucket_bytes: float = DEFAULT_BUCKET_BYTES
    optimizer: str = "momentum"
    master_weights: bool | None = None
    algorithm: str | None = None
    zero: int = 0  #: ZeRO stage (0: none; 1: optimizer state, 2: + gradients, 3: + weights)
    zero_shard: str = "all"  #: ZeRO shards over all replicas, or those in a "node"
    recompute: str = "none"  #: "blocks": residual blocks re-run their forward in backward
    #: the dtype gradients are accumulated and reduced in (None: the weights')
    grad_dtype: str | None = None
    #: gradient accumulation: forward and backward passes per step, each over ``batch``
    #: samples (the step's batch is ``batch * microbatches``); weight gradients are
    #: reduced once, in the last one's backward pass
    microbatches: int = 1
    #: microbatches whose activations are kept at once (a pipeline stage under 1F1B keeps
    #: those it has run forward and not yet backward; gradient accumulation alone, one)
    inflight: int = 1
    #: sequence-parallel collectives overlap the GEMMs they feed or drain
    #: (Megatron-LM's ``--tp-comm-overlap``; :func:`~planner.costs.layer.overlap_tp`)
    tp_comm_overlap: bool = False
    #: the weight gradients' GEMMs run later in a pass of their own (ZB-H1's W)
    wgrad_deferred: bool = False
    #: ZeRO stages 1-2's gathers of the updated parameters run under the next step's
    #: first forward pass, a bucket ahead (Megatron-LM's ``--overlap-param-gather``)
    overlap_param_gather: bool = False
    #: how context parallelism moves the keys and values: a ring of point-to-point sends
    #: overlapped with attention, or an all-gather before it (Megatron-LM's
    #: ``--cp-comm-type``; :func:`~planner.costs.layer.overlap_context`)
    cp_comm_type: str = "p2p"
    #: how the loss's softmax cross-entropy runs (:data:`CROSS_ENTROPY`): "fused" keeps
    #: its fp32 probabilities and writes their gradient over them; "eager" is PyTorch's
    #: ``log_softmax`` and ``nll_loss`` on fp32 logits, whose backward holds three
    #: logits-sized tensors; "eager-no-upcast" the same on 16-bit logits as they come
    #: (the network's :meth:`~planner.network.Network.with_cross_entropy` says which)
    cross_entropy: str = "fused"
    #: the rank of the first device: a pipeline stage's (its groups cross nodes where
    #: that rank does not begin a node; :attr:`~planner.costs.layer.Context.rank_offset`)
    first_rank: int = 0
    #: the run's ``--gpus`` where this question is part of the run (a pipeline stage's
    #: devices are one stage's share of them); None: ``gpus``
    run_gpus: int | None = None

    @property
    def step_batch(self) -> int:
        """Samples per optimizer step."""
        return self.batch * self.microbatches


@dataclass
class LayerResult:
    """One layer as evaluated."""

    layer: Layer
    layout: Layout  #: its own layout, or the one it follows
    follows: str | None  #: the layer whose layout a weightless layer follows
    cost: LayerCost
    activation_bytes: float = 0.0
    dist_in: Dist | None = None
    dist_out: Dist | None = None


@dataclass
class Evaluation:
    """A whole assignment evaluated."""

    layers: list[LayerResult]
    time_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    weight_grad_s: float
    memory: MemoryReport
    buckets: list[dict[str, Any]] = field(default_factory=list)
    parameters_s: float = 0.0  #: ZeRO's all-gathers of parameters (all on the critical path)
    #: activation recomputation: the forward compute and collectives run again in backward
    recompute_s: float = 0.0
    #: one microbatch's forward and backward passes without the weight-gradient
    #: reductions (with one microbatch: the forward and backward, reductions apart)
    microbatch_s: float = 0.0
    #: the part of one microbatch's backward compute that computes weight gradients
    #: (the W passes of a zero-bubble pipeline schedule)
    weight_compute_s: float = 0.0

    #: activation traffic (everything but weight gradients and ZeRO's parameter
    #: gathers), all on the critical path, over every microbatch of the step
    activation_comm_s: float = 0.0
    #: weight-gradient reductions a step (of ``weight_grad_s`` each): one, or one a
    #: microbatch where the gradients are sharded (ZeRO stages 2 and 3)
    reductions: int = 1


def grad_dtype(network: Network, options: Options) -> str:
    """The dtype the gradients are accumulated and reduced in: ``--grad-precision``, else
    the weights'."""
    return options.grad_dtype or network.dtype


def question_param_bytes(network: Network, options: Options) -> ParamBytes:
    """Bytes per parameter of a question (before ZeRO): its optimizer, the network's
    dtype, master weights and the gradients' dtype."""
    return param_bytes(options.optimizer, network.elem_bytes, options.master_weights,
                       DTYPE_BYTES[grad_dtype(network, options)])


def make_context(network: Network, cluster: Cluster, options: Options,
                 estimator: Estimator | None = None) -> Context:
    """The cost context of a question."""
    _check_settings(options, network)
    # the loss's dtype follows the setting however the network was loaded
    network = network.with_cross_entropy(options.cross_entropy)
    return Context(network=network, cluster=cluster, gpus=options.gpus, batch=options.batch,
                   estimator=estimator or Roofline(), cost_model=options.cost_model,
                   algorithm=options.algorithm, zero=options.zero,
                   zero_shard=options.zero_shard, recompute=options.recompute,
                   grad_dtype=options.grad_dtype, tp_comm_overlap=options.tp_comm_overlap,
                   wgrad_deferred=options.wgrad_deferred, cp_comm_type=options.cp_comm_type,
                   rank_offset=options.first_rank % cluster.devices_per_node)


def master_weights_error(network: Network, options: Options) -> str | None:
    """Why master weights cannot be asked of this network (None: they can): they are
    fp32 copies of 16-bit weights. Of fp32 weights they cost 4 bytes a parameter for
    nothing, and of fp64 ones would hold Adam's state in fp32 (an audit)."""
    if options.master_weights and network.elem_bytes >= 4:
        return (f"master weights are fp32 copies of 16-bit weights, and the network's are "
                f"{network.dtype}")
    return None


def check_question(network: Network, cluster: Cluster, options: Options) -> None:
    """Usage problems of the question itself (exit 2)."""
    if options.gpus < 1:
        raise UsageError("planner: error: --gpus must be at least 1")
    _check_settings(options, network)
    beyond_cluster(cluster, [options.gpus])


def _check_settings(options: Options, network: Network | None = None) -> None:
    """A ZeRO stage and a recomputation that exist, under an accounting that can price
    them."""
    if options.zero not in ZERO_STAGES:
        raise UsageError(f"planner: error: ZeRO stage {options.zero} does not exist; use "
                         "0, 1, 2 or 3")
    if options.zero_shard not in ZERO_SHARDS:
        raise UsageError(f"planner: error: ZeRO cannot shard over {options.zero_shard!r}; "
                         "use all or node")
    if options.cross_entropy not in CROSS_ENTROPY:
        raise UsageError(f"planner: error: no cross-entropy {options.cross_entropy!r}; use "
                         + ", ".join(CROSS_ENTROPY))
    wrong = recompute_error(options.recompute,
                            None if network is None else len(network.recompute_units),
                            "blocks" if network is None else network.recompute_unit)
    if wrong:
        raise UsageError(f"planner: error: {wrong}")
    if options.recompute != "none" and options.cost_model == "gholami2018":
        raise UsageError("planner: error: --recompute needs --cost-model exact: the paper's "
                         "accounting (Gholami et al. 2018) keeps every activation; drop "
                         "--recompute or the cost model")
    if options.zero and options.cost_model == "gholami2018":
        raise UsageError("planner: error: --zero needs --cost-model exact: the paper's "
                         "accounting (Gholami et al. 2018) has no sharded optimizer; drop "
                         "--zero or the cost model")
    wrong = None if network is None else master_weights_error(network, options)
    if wrong:
        raise UsageError(f"planner: error: {wrong}; drop --master-weights (master_weights), "
                         "or train in 16 bits (--precision bf16)")
    if options.grad_dtype is not None and options.grad_dtype not in DTYPE_BYTES:
        raise UsageError(f"planner: error: unknown gradient precision "
                         f"{options.grad_dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    if options.grad_dtype is not None and options.cost_model == "gholami2018":
        raise UsageError("planner: error: --grad-precision needs --cost-model exact: the "
                         "paper's accounting (Gholami et al. 2018) moves every word in the "
                         "network's dtype; drop --grad-precision or the cost model")


def beyond_cluster(cluster: Cluster, counts: list[int], sweep: bool = False) -> None:
    """Raise the usage error for device counts the cluster cannot hold (a sweep's may
    also be dropped from it)."""
    limit = cluster.max_devices()
    beyond = [p for p in counts if limit is not None and p > limit]
    if beyond:
        drop = f"drop {'it' if len(beyond) == 1 else 'them'} from the sweep, or " if sweep \
            else ""
        raise UsageError(f"planner: error: --gpus {', '.join(map(str, beyond))} "
                         f"{'is' if len(beyond) == 1 else 'are'} more than the cluster has "
                         f"({cluster.nodes} node{'s' if cluster.nodes != 1 else ''} × "
                         f"{cluster.devices_per_node} = {limit}); {drop}"
                         "raise 'nodes' in the cluster file or remove it")


@dataclass
class EvalCache:
    """Per-layer results reused across evaluations of one question (the search scores
    many assignments that share most layers)."""

    weighted: dict[Any, tuple[tuple[CommTerm, ...], float, float, str, float]] = field(
        default_factory=dict)
    follower: dict[Any, tuple[tuple[CommTerm, ...], Dist, Dist, float, float, str, float]] \
        = field(default_factory=dict)
    moves: dict[Any, tuple[CommTerm, ...]] = field(default_factory=dict)
    buckets: dict[tuple[Collective, float, Group], float] = field(default_factory=dict)
    #: a small integer per distinct cost signature of ``network``'s layers (cheap keys)
    signatures: list[int] = field(default_factory=list)
    network: tuple[Network, frozenset[str]] | None = None

    def signature_ids(self, ctx: Context) -> list[int]:
        """The signature id of every layer of the context's network (computed once per
        network and recomputed blocks; a cache serves one question, and meeting another
        network empties it)."""
        key = (ctx.network, ctx.rebuilt)
        if self.network is None or self.network[0] is not key[0] or \
                self.network[1] != key[1]:
            if self.network is not None:
                self.weighted.clear()
                self.follower.clear()
            ids: dict[tuple[object, ...], int] = {}
            self.signatures = [ids.setdefault(cost_signature(layer, ctx), len(ids))
                               for layer in ctx.network.layers]
            self.network = key
        return self.signatures


def evaluate(ctx: Context, options: Options, assignment: dict[int, Layout],
             cache: EvalCache | None = None) -> Evaluation:
    """Evaluate layouts for every layer with weights (``assignment``: layer index →
    layout); layers without weights follow the distribution they receive."""
    cache = cache if cache is not None else EvalCache()
    results = _layer_results(ctx, assignment, cache)
    memory = memory_report(ctx, options, results)
    return _timeline(ctx, options, results, memory, cache)


def time_and_comm(ctx: Context, options: Options, assignment: dict[int, Layout],
                  cache: EvalCache) -> tuple[float, float]:
    """``(time_s, comm_s)`` of :func:`evaluate` without its memory report (a local
    search ranks many assignments and reports few)."""
    results = _layer_results(ctx, assignment, cache)
    ev = _timeline(ctx, options, results, _UNREPORTED, cache)
    return ev.time_s, ev.comm_s


def evaluate_fitting(ctx: Context, options: Options, assignment: dict[int, Layout],
                     cache: EvalCache) -> tuple[MemoryReport, Evaluation | None]:
    """The memory report of :func:`evaluate`, and the evaluation itself only when the
    assignment fits (the baselines time their grids that fit; of those that do not, only
    the few that are ever shown or compared)."""
    results = _layer_results(ctx, assignment, cache)
    memory = memory_report(ctx, options, results)
    return memory, _timeline(ctx, options, results, memory, cache) if memory.fits else None


def memory_of(ctx: Context, options: Options, assignment: dict[int, Layout],
              cache: EvalCache) -> MemoryReport:
    """The memory report of :func:`evaluate` alone."""
    return memory_report(ctx, options, _layer_results(ctx, assignment, cache))


#: stands in for the memory report where only times are wanted (never shown)
_UNREPORTED = MemoryReport(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _layer_results(ctx: Context, assignment: dict[int, Layout],
                   cache: EvalCache) -> list[LayerResult]:
    net = ctx.network
    results: list[LayerResult] = []
    first = next((layer for layer in net.layers if layer.has_weights), None)
    if first is None:
        raise UsageError("planner: error: the network has no layer with weights")
    first_layout = assignment[first.index]
    current: tuple[Layout, str] = (first_layout, first.name)
    # The data loader delivers the input in the distribution the first layer with
    # weights needs, for free; any other consumer of the input pays to move it.
    default_in = input_dist(first_layout)
    out_dist: dict[int, Dist] = {-1: default_in}

    def moves(src: Dist, dst: Dist, elems: int, note: str, layer: Layer) -> list[CommTerm]:
        again = recomputed(layer, ctx)
        key = (src, dst, elems, note, again)
        hit = cache.moves.get(key)
        if hit is None:
            terms = redistribute_terms(src, dst, elems, ctx, note)
            hit = tuple(terms + rerun_terms(layer, ctx, terms)) if again else tuple(terms)
            cache.moves[key] = hit
        return list(hit)

    def cheaper(terms: list[CommTerm], src: Dist | None, dst: Dist, elems: int, note: str,
                layer: Layer) -> list[CommTerm]:
        """The move from ``src``, a copy of the same tensor, where it takes less time."""
        if src is None:
            return terms
        other = moves(src, dst, elems, note, layer)
        return other if math.fsum(t.seconds for t in other) < math.fsum(
            t.seconds for t in terms) else terms

    # a block's input as its body's first layer moved it (Network.shared_entries): the
    # other consumer reads whichever copy is cheaper to move, as the search does
    shared = net.shared_entries
    seconds = {blk.shortcut[0]: blk for blk in shared.values() if blk.shortcut}
    copy: dict[int, Dist] = {}  # by block input
    signatures = cache.signature_ids(ctx)
    for layer in net.layers:
        src = out_dist[layer.inputs[0]]
        sig = signatures[layer.index]
        if layer.has_weights:
            layout = assignment[layer.index]
            current = (layout, layer.name)
            dst = input_dist(layout)
            key = (sig, layout)
            hit = cache.weighted.get(key)
            if hit is None:
                fwd, bwd, est, wgt = time_kernels(weighted_kernels(layer, layout, ctx), ctx)
                hit = (tuple(weighted_terms(layer, layout, ctx)), fwd, bwd, est, wgt)
                cache.weighted[key] = hit
            entry = moves(src, dst, layer.in_elems, "input", layer)
            if layer.index in shared:
                copy[shared[layer.index].input] = dst
            elif layer.index in seconds:
                entry = cheaper(entry, copy.get(seconds[layer.index].input), dst,
                                layer.in_elems, "input", layer)
            cost = LayerCost(hit[1], hit[2], hit[3], entry + list(hit[0]),
                             local_params(layer, layout), hit[4])
            out = layout.output_dist()
            results.append(LayerResult(layer, layout, None, cost, dist_in=dst, dist_out=out))
            out_dist[layer.index] = out
            continue
        if layer.type == "add":
            body_d = out_dist[layer.inputs[0]]
            sc_d = out_dist[layer.inputs[1]]
            fkey = (sig, body_d)
            fhit = cache.follower.get(fkey)
            if fhit is None:
                fwd, bwd, est, wgt = time_kernels(follower_kernels(layer, body_d, ctx), ctx)
                fhit = ((), body_d, body_d, fwd, bwd, est, wgt)
                cache.follower[fkey] = fhit
            short = moves(sc_d, body_d, layer.in_elems, "shortcut", layer)
            if layer.inputs[1] in copy:  # an identity shortcut (its input the block's)
                short = cheaper(short, copy[layer.inputs[1]], body_d, layer.in_elems,
                                "shortcut", layer)
            cost = LayerCost(fhit[3], fhit[4], fhit[5], short, weight_s=fhit[6])
            results.append(LayerResult(layer, current[0], current[1], cost, dist_in=body_d,
                                       dist_out=body_d))
            out_dist[layer.index] = body_d
            continue
        fkey = (sig, src)
        fhit = cache.follower.get(fkey)
        if fhit is None:
            terms, work, out = follower_terms(layer, src, ctx)
            fwd, bwd, est, wgt = time_kernels(follower_kernels(layer, work, ctx), ctx)
            fhit = (tuple(terms), work, out, fwd, bwd, est, wgt)
            cache.follower[fkey] = fhit
        cost = LayerCost(fhit[3], fhit[4], fhit[5], list(fhit[0]), float(layer.params),
                         fhit[6])
        results.append(LayerResult(layer, current[0], current[1], cost, dist_in=fhit[1],
                                   dist_out=fhit[2]))
        out_dist[layer.index] = fhit[2]
    # the loss, on the last layer's output where it lives: its own line in the last
    # layer's costs (not on a pipeline stage before the last: it sends its output on)
    if not ctx.network.loss:
        return results
    last = results[-1]
    assert last.dist_out is not None
    lkey = ("loss", last.dist_out)
    lhit = cache.follower.get(lkey)
    if lhit is None:
        kernels, terms = loss_cost(last.layer, last.dist_out, ctx)
        fwd, bwd, est, wgt = time_kernels(kernels, ctx)
        lhit = (tuple(terms), last.dist_out, last.dist_out, fwd, bwd, est, wgt)
        cache.follower[lkey] = lhit
    c = last.cost
    labels = ", ".join(sorted({*c.estimator.split(", "), *lhit[5].split(", ")} - {""}))
    last.cost = LayerCost(c.forward_s + lhit[3], c.backward_s + lhit[4], labels,
                          c.terms + list(lhit[0]), c.params_local, c.weight_s + lhit[6])
    return results


def local_elems(elems: int, dist: Dist | None, batch: int, rows: int = 0) -> float:
    """Elements of a tensor of ``elems`` a sample that the busiest device holds on
    ``dist``: its largest batch block, and, split by height, its largest block of the
    tensor's ``rows`` (balanced blocks: ``⌈rows/n⌉``; an audit found memory counted
    with the mean ``rows/n``, where compute takes the busiest device's rows)."""
    if dist is None:
        return float(elems * batch)
    b = -(-batch // dist.batch[1])
    if dist.height is not None and dist.height[1] > 1 and rows > 0:
        f = dist.feature[1] if dist.feature is not None else 1
        return elems * b * busiest_rows(rows, dist.height[1]) / f
    return elems * b / dist.split


def kept_input_bytes(layer: Layer, layout: Layout | None, dist: Dist | None, batch: int,
                     e: int) -> float:
    """Bytes of its input a layer keeps for backward on one device, as it computes on
    ``dist`` (a domain-split convolution keeps its halo rows too)."""
    size = local_elems(layer.in_elems, dist, batch, layer.in_rows) * e
    if dist is not None and dist.height is not None and dist.height[1] > 1 and \
            _exchanges_halo(layer, layout, dist.height[1]):
        # the device that keeps the most rows, its own and its halo
        n = dist.height[1]
        size *= max(r for r, _ in layer.split_reads(n)) / -(-layer.in_rows // n)
    return size


def _exchanges_halo(layer: Layer, layout: Layout | None, n: int) -> bool:
    """Whether the layer keeps halo rows of its input split ``n`` ways by height: a
    domain-split convolution, or a max or average pool that exchanges them (an audit
    found the pools' halo sent and not kept)."""
    if layer.conv is not None:
        return layout is not None and layout.mode == "domain"
    return layer.pool_halo(n)


def own_kept_bytes(layer: Layer, layout: Layout | None, dist: Dist | None, batch: int,
                   e: int) -> float:
    """Bytes a layer keeps for backward besides its input and output (attention's Q, K,
    V and scores, those of the busiest device's heads under a model split; masks and
    indices)."""
    internal, extra = layer.saved_internal, layer.saved_bytes_extra
    a = layer.attention
    if layout is not None and layout.mode == "model-sp" and dist is not None:
        # the layer gathers its input's tokens and keeps what it computed on all of
        # them (its heads' Q, K, V; an embedding's token ids), not a token split's share
        dist = Dist(dist.p, dist.batch, None)
    if a is not None and layout is not None and base_mode(layout.mode) == "model" and \
            layout.pr > 1:
        internal, extra = a.saved(*a.held(layout.pr))
    elif a is not None and layout is not None and layout.mode == "ulysses" and \
            dist is not None:
        # the core's heads over every token (after the all-to-all), not the input's tokens
        internal, extra = a.saved(*a.held(layout.pr))
        dist = Dist(dist.p, dist.batch, None)
    m = layer.moe
    if m is not None and layout is not None and base_mode(layout.mode) == "model" and \
            layout.pr > 1:  # every expert's share of the hidden features
        internal = m.saved(-(-m.ffn // layout.pr), shared_split=layout.pr)
    elif m is not None and layout is not None and layout.mode in EXPERT_MODES:
        # the busiest device keeps its experts' rows (more than its own under imbalance)
        internal = m.saved(busiest=m.busiest(m.experts // layout.pr))
    return (local_elems(internal, dist, batch, layer.in_rows) * e
            + local_elems(1, dist, batch, layer.in_rows) * extra)


def _recomputed(ctx: Context, results: list[LayerResult],
                kept: dict[tuple[int, Dist | None], float],
                consumer: dict[tuple[int, Dist | None], str | None],
                first: dict[tuple[int, Dist | None], int],
                per_layer: dict[int, float], batch: int
                ) -> tuple[dict[tuple[int, Dist | None], float], dict[int, float],
                           tuple[float, ...], tuple[float, ...]]:
    """Activation memory with residual blocks recomputed (Chen et al., "Training deep
    nets with sublinear memory cost", 2016): between the passes such a block keeps only
    its input, as its producer left it; what its layers would keep is rebuilt, one block
    at a time, in the backward pass. ``consumer`` names the recomputed block of a
    tensor's keepers (None: kept outside them), ``first`` the position of its first
    keeper.

    The backward pass frees a kept tensor once it has passed the first layer that keeps
    it, so when it reaches a recomputed block (and rebuilds it) what layers after the
    block keep is gone: the logits, the head's input, the blocks not recomputed after it.
    Returns what stays kept, each layer's own share (zero in recomputed blocks), and per
    recomputed block, in the network's order, its working set and what is still kept
    when it is rebuilt."""
    net, e = ctx.network, ctx.elem_bytes
    blocks = ctx.rebuilt_units  # residual blocks, or repeat copies (--recompute-unit)
    dist_out = {r.layer.index: r.dist_out for r in results}
    checkpoints: dict[tuple[int, Dist | None], float] = {}
    for blk in blocks:
        src = net.storage_of(blk.input)
        if src < 0:
            continue  # the network input: kept as it is (below)
        key = (src, dist_out[blk.input])
        checkpoints[key] = local_elems(net.layers[blk.input].out_elems, key[1], batch,
                                       net.layers[blk.input].out_rows) * e
    work: dict[str, float] = {}
    staying: dict[tuple[int, Dist | None], float] = {}
    for key, size in kept.items():
        block = consumer[key]
        if key in checkpoints and block is not None:
            # a block's first layer keeps its checkpoint: the checkpoint stays, and the
            # halo rows a domain-split convolution adds to it are rebuilt with the block
            staying[key] = checkpoints[key]
            if size > checkpoints[key]:
                work[block] = work.get(block, 0.0) + size - checkpoints[key]
        elif block is None or key in checkpoints or key[0] < 0:
            staying[key] = size
        else:
            work[block] = work.get(block, 0.0) + size
    for key, size in checkpoints.items():
        staying.setdefault(key, size)
    own = dict(per_layer)
    for r in results:
        if recomputed(r.layer, ctx):
            unit = ctx.unit(r.layer.block)
            assert unit is not None
            work[unit] = work.get(unit, 0.0) + own[r.layer.index]
            own[r.layer.index] = 0.0
    # where the backward pass frees each tensor kept: past its first keeper (a checkpoint
    # is kept for its block's whole backward, down to its first layer)
    release = {key: first.get(key, len(results)) for key in staying}
    for blk in blocks:
        src = net.storage_of(blk.input)
        if src >= 0:
            key = (src, dist_out[blk.input])
            release[key] = min(release[key], *blk.body, *blk.shortcut)
    adds = [blk.add for blk in blocks]
    live = tuple(a + b for a, b in zip(
        _sums_up_to(adds, [(release[key], size) for key, size in staying.items()]),
        _sums_up_to(adds, list(own.items())), strict=True))
    return staying, own, tuple(work.get(blk.name, 0.0) for blk in blocks), live


def _sums_up_to(points: list[int], items: list[tuple[int, float]]) -> list[float]:
    """For each point, the sum of the sizes of the items at or before it (positions,
    sizes): one pass over both sorted, where summing every item for every point took
    a 70B network's 160 recomputed blocks 41 thousand steps an evaluation. The sizes
    are whole bytes (below 2⁵³), so the order they are added in does not change the
    sums: the plans are the bytes they were."""
    ordered = sorted(items, key=lambda item: item[0])
    at: dict[int, float] = {}
    total, k = 0.0, 0
    for point in sorted(set(points)):
        while k < len(ordered) and ordered[k][0] <= point:
            total += ordered[k][1]
            k += 1
        at[point] = total
    return [at[point] for point in points]


def eager_loss_workspace(net: Network, last: LayerResult, batch: int) -> float:
    """What an eager softmax cross-entropy holds besides what is kept, at the moment its
    backward runs: PyTorch's ``cross_entropy`` is ``log_softmax`` then ``nll_loss``;
    ``log_softmax`` keeps its output (the kept log-probabilities,
    :meth:`~planner.network.Network.output_bytes`), ``nll_loss``'s backward writes their
    dense gradient, and ``log_softmax``'s backward reads both and writes the logits'
    gradient: two more tensors of the logits' size, in the loss's dtype (fp32 at least:
    the logits are upcast as torchtitan, Hugging Face's models and autocast do, except
    under ``eager-no-upcast``: :meth:`~planner.network.Network.output_bytes`). A fused
    loss (Megatron-LM's vocabulary-parallel cross-entropy) writes the gradient over its
    kept probabilities instead, and the busiest layer's gradients in flight are all it
    adds. (The logits themselves, if the training script still holds them, are on top:
    ``tests/benchmarks/train_step.py``'s step does.)"""
    return 2.0 * local_elems(last.layer.out_elems, last.dist_out, batch,
                             last.layer.out_rows) * \
        net.output_bytes(last.layer)


def sharded_gradients(ctx: Context, options: Options) -> bool:
    """Whether each microbatch of a step reduces its weight gradients (ZeRO stages 2
    and 3 under gradient accumulation: a device keeps only its shard of them)."""
    return ctx.zero >= 2 and options.microbatches > 1


def memory_report(ctx: Context, options: Options, results: list[LayerResult]) -> MemoryReport:
    """Peak memory of the busiest device for an evaluated assignment."""
    e = ctx.elem_bytes
    pb = question_param_bytes(ctx.network, options)
    params = sum(r.cost.params_local for r in results)
    grads = params * pb.gradients
    if options.zero:
        shares = [(r.cost.params_local, held(pb, options.zero, r.cost.terms)) for r in results]
        owned = (sum(n * s.weights for n, s in shares), sum(n * s.gradients for n, s in shares),
                 sum(n * s.optimizer for n, s in shares))
    else:
        owned = (params * pb.weights, grads, params * pb.optimizer)
    kept: dict[tuple[int, Dist | None], float] = {}
    consumer: dict[tuple[int, Dist | None], str | None] = {}  # its first keeper's unit
    first: dict[tuple[int, Dist | None], int] = {}  # the position of its first keeper
    kept_output: dict[tuple[int, Dist | None], Layer] = {}  # a tensor its producer keeps
    per_layer: dict[int, float] = {}
    batch = ctx.batch
    net = ctx.network
    for r in results:
        layer = r.layer
        halo = 0.0
        if layer.saves_input:
            src = net.storage_of(layer.inputs[0])
            key = (src, r.dist_in)
            size = kept_input_bytes(layer, r.layout if layer.has_weights else None,
                                    r.dist_in, batch, e)
            if key not in kept:
                kept[key] = size
                consumer[key] = ctx.unit(layer.block) if recomputed(layer, ctx) else None
                first[key] = layer.index
            else:
                maker = kept_output.get(key)
                if maker is not None and (not recomputed(maker, ctx) or ctx.unit(
                        maker.block) == ctx.unit(layer.block)):
                    # its producer keeps it for this layer: a domain-split convolution's
                    # halo rows are the layer's own on top (an audit: they were dropped
                    # where a ReLU before it kept the tensor), rebuilt with its block
                    # where it is recomputed, as the search's program counts them
                    halo = size - local_elems(layer.in_elems, r.dist_in, batch,
                                              layer.in_rows) * e
                if not recomputed(layer, ctx):
                    consumer[key] = None  # a keeper outside recomputed blocks: it stays
        if layer.saves_output:
            key = (net.storage_of(layer.index), r.dist_out)
            size = local_elems(layer.out_elems, r.dist_out, batch, layer.out_rows) * \
                net.output_bytes(layer)
            if key not in kept:
                kept[key] = size
                kept_output[key] = layer
                consumer[key] = ctx.unit(layer.block) if recomputed(layer, ctx) else None
                first[key] = layer.index
            elif not recomputed(layer, ctx):
                consumer[key] = None
        per_layer[layer.index] = own_kept_bytes(
            layer, r.layout if layer.has_weights else None, r.dist_in, batch, e) + halo
    rebuilt: tuple[float, ...] = ()
    live: tuple[float, ...] = ()
    if ctx.rebuilt:
        kept, per_layer, rebuilt, live = _recomputed(ctx, results, kept, consumer, first,
                                                     per_layer, batch)
    for (src, _), size in kept.items():
        if src in per_layer:
            per_layer[src] += size
        else:
            per_layer[src] = size
    # at the start of the backward pass everything kept is live; later, a rebuilt block
    # adds its working set to what is still kept then
    kept_total = sum(per_layer.values())
    # the microbatches in flight besides the one running keep all they keep (a rebuilt
    # block's working set is one microbatch's: one runs backward at a time)
    others = (options.inflight - 1) * kept_total
    activations = others + max([kept_total] + [k + w for k, w in zip(live, rebuilt,
                                                                        strict=True)])
    for r in results:
        r.activation_bytes = per_layer.get(r.layer.index, 0.0)
    # the busiest layer's gradients in flight: its output gradient and input gradient
    # (one tensor for a flatten or identity that keeps the distribution: a view)
    workspace = max((local_elems(r.layer.out_elems, r.dist_out, batch, r.layer.out_rows)
                     + (0 if r.layer.type in VIEW_TYPES and r.dist_in == r.dist_out
                        else local_elems(r.layer.in_elems, r.dist_in, batch,
                                         r.layer.in_rows))) * e
                    for r in results)
    if net.loss and options.cross_entropy != "fused" and results and \
            results[-1].layer.index == len(net.layers) - 1:
        workspace = max(workspace, eager_loss_workspace(net, results[-1], batch))
    largest = max((t.bytes for r in results for t in r.cost.terms), default=0.0)
    if prefetches(ctx, options):
        # prefetched gathers land while a layer holds its own: under a bucket of them,
        # plus the one issued last
        gathers = sorted((t.bytes for r in results for t in r.cost.terms
                          if _prefetched(t, "forward")), reverse=True)
        if len(gathers) > 1:
            largest += min(sum(gathers[1:]), options.bucket_bytes + gathers[1])
    # buckets fill with whole gradients before they are reduced (or reduce-scattered):
    # only gradients that have replicas to be summed with (none on one device)
    reduced = sum(t.bytes for r in results for t in r.cost.terms if t.phase == "weight_grad")
    buckets = min(grads, reduced, 2 * options.bucket_bytes) \
        if options.overlap == "gradients" else 0.0
    return MemoryReport(
        weights=owned[0],
        gradients=owned[1],
        optimizer=owned[2],
        activations=activations,
        comm_buffers=largest + buckets,
        workspace=workspace,
        capacity=ctx.cluster.capacity_bytes,
        rebuilt=rebuilt,
        kept=kept_total,
    )


def _bucket_time(ctx: Context, op: Collective, nbytes: float, group: Group,
                 cache: dict[tuple[Collective, float, Group], float] | None = None) -> float:
    if cache is not None:
        hit = cache.get((op, nbytes, group))
        if hit is None:
            hit = cache[(op, nbytes, group)] = _bucket_time(ctx, op, nbytes, group)
        return hit
    if ctx.paper:
        link = ctx.cluster.inter if group.spans_nodes else ctx.cluster.intra
        e = ctx.elem_bytes
        return float(paper_all_reduce(nbytes / e, group.size, link.latency_s,
                                      e / link.bandwidth))
    return float(collective_time(op, nbytes, group, ctx.cluster, ctx.algorithm)[0])


def communicator(layout: Layout, group_size: int | None = None) -> tuple[int, int]:
    """Which devices reduce a layer's weight gradient (and, with ZeRO, gather its
    parameters) together, as the digit ``(stride, count)`` that varies among them: all
    ``P`` for data and domain layouts (weights replicated everywhere), the column group
    otherwise. Row and column placements of one grid give groups of the same shape but
    other members (``4x2`` rows: ``{0, 4}``; cols: ``{0, 1}``), which DDP and FSDP reduce
    in separate process groups, so never in one bucket. A term over ``group_size`` = all
    ``P`` devices (a mixture of experts' router under expert parallelism) is over all."""
    if layout.mode in WHOLE_MODES or group_size == layout.p:
        return (1, layout.p)
    return layout.c_digit


def _bucketed(ctx: Context, results: list[LayerResult], items: list[tuple[int, int]],
              bucket_bytes: float | None, cache: EvalCache,
              ) -> list[tuple[list[tuple[int, int]], float, float]]:
    """Collectives joined into buckets: consecutive terms (``(layer position, term
    position)`` in ``items``) over the same communicator (the same devices, not only a
    group of the same shape: :func:`communicator`), until a bucket holds ``bucket_bytes``
    (PyTorch DDP's rule); ``None``: each term alone. Returns ``(members, bytes,
    seconds)`` per bucket, and gives each member its share of its bucket's time (by
    bytes) in place of its own."""
    runs: list[tuple[list[tuple[int, int]], float, float]] = []
    pending: list[tuple[int, int]] = []
    pending_bytes = 0.0

    def at(item: tuple[int, int]) -> CommTerm:
        return results[item[0]].cost.terms[item[1]]

    def flush() -> None:
        nonlocal pending_bytes
        if not pending:
            return
        first = at(pending[0])
        secs = _bucket_time(ctx, first.collective, pending_bytes, first.group,  # type: ignore[arg-type]
                            cache.buckets) if len(pending) > 1 else first.seconds
        runs.append((list(pending), pending_bytes, secs))
        if bucket_bytes is not None:  # each layer carries its share of its bucket (by bytes)
            for x in pending:
                t = at(x)
                share = secs * t.bytes / pending_bytes if pending_bytes else 0.0
                results[x[0]].cost.terms[x[1]] = replace(
                    t, seconds=share, note=(t.note + " bucketed").strip(), exposed_s=None)
        pending.clear()
        pending_bytes = 0.0

    for item in items:
        t = at(item)
        if bucket_bytes is None:
            runs.append(([item], t.bytes, t.seconds))
            continue
        if pending and (t.group != at(pending[0]).group
                        or communicator(results[item[0]].layout, t.group.size)
                        != communicator(results[pending[0][0]].layout,
                                        at(pending[0]).group.size)
                        or pending_bytes >= bucket_bytes):
            flush()
        pending.append(item)
        pending_bytes += t.bytes
        if pending_bytes >= bucket_bytes:
            flush()
    flush()
    return runs


def prefetches(ctx: Context, options: Options) -> bool:
    """Whether ZeRO stage 3's parameter gathers run ahead of the compute that needs
    them (with ``overlap: gradients``, as FSDP and DeepSpeed prefetch)."""
    return ctx.zero >= 3 and options.overlap == "gradients"


def _prefetched(t: CommTerm, when: str) -> bool:
    return t.phase == "parameters" and t.when == when


class _Prefetcher:
    """ZeRO stage 3's parameter gathers (and, with ``--overlap-param-gather``, stages
    1-2's gathers after the step) issued ahead of the layers that need them, in
    the order those run, on one channel: whenever a layer starts, the gathers after it
    are issued one by one while the gathered parameters not yet in use are under
    ``window`` bytes (so at least the next layer's; FSDP prefetches one unit ahead,
    DeepSpeed a number of parameters, ``stage3_prefetch_bucket_size``)."""

    def __init__(self, seconds: list[float], nbytes: list[float], order: list[int],
                 window: float, channel: float) -> None:
        self.seconds, self.nbytes, self.order, self.window = seconds, nbytes, order, window
        self.channel = channel  #: when the channel is free
        self.arrive: dict[int, float] = {}
        self.ahead = 0.0  #: bytes issued for layers not started
        self.next = 0

    def fill(self, at: float) -> None:
        while self.next < len(self.order):
            pos = self.order[self.next]
            if self.ahead > 0 and self.ahead >= self.window:  # the next layer's at least
                return
            self.channel = max(self.channel, at) + self.seconds[pos]
            self.arrive[pos] = self.channel
            self.ahead += self.nbytes[pos]
            self.next += 1

    def start(self, pos: int, clock: float) -> float:
        """Layer ``pos`` is ready to start at ``clock``: when it starts (its gather
        arrived), having issued what the window then allows."""
        if pos not in self.arrive:
            return clock
        clock = max(clock, self.arrive[pos])
        self.ahead -= self.nbytes[pos]
        self.fill(clock)
        return clock


def _gathers(count: int, runs: list[tuple[list[tuple[int, int]], float, float]]
             ) -> tuple[list[float], list[float]]:
    """Per layer position, the seconds and bytes of the gathers it waits for: each run
    of gathers fused into one collective (:func:`_bucketed`, in the order the layers
    need them) arrives whole before the first layer of the run starts."""
    seconds, nbytes = [0.0] * count, [0.0] * count
    for members, run_bytes, run_seconds in runs:
        seconds[members[0][0]] += run_seconds
        nbytes[members[0][0]] += run_bytes
    return seconds, nbytes


def _prefetched_forward(results: list[LayerResult],
                        runs: list[tuple[list[tuple[int, int]], float, float]],
                        window: float) -> float:
    """The forward pass with ``runs`` of gathers prefetched (:class:`_Prefetcher`; ZeRO
    stage 3's, or stages 1-2's under ``--overlap-param-gather``): a layer starts when
    the one before it has finished and its gather has arrived."""
    seconds, nbytes = _gathers(len(results), runs)
    pre = _Prefetcher(seconds, nbytes, [p for p, g in enumerate(seconds) if g], window, 0.0)
    pre.fill(0.0)
    clock = 0.0
    for pos, r in enumerate(results):
        clock = pre.start(pos, clock)
        clock += r.cost.forward_s + sum(t.critical_s for t in r.cost.terms
                                        if t.when == "forward" and not _prefetched(t, "forward"))
    return clock


def _overlapped_backward(results: list[LayerResult],
                         grad_runs: list[tuple[list[tuple[int, int]], float, float]],
                         start: float, window: float, prefetch: bool,
                         buckets: list[dict[str, Any]],
                         gather_runs: list[tuple[list[tuple[int, int]], float, float]],
                         ) -> tuple[float, float, float]:
    """The backward pass with the gradient buckets on one channel, each issued when its
    last gradient is ready (after the previous one), and with ``prefetch`` ZeRO stage
    3's gathers prefetched (:class:`_Prefetcher`) on the same channel, first come first
    served. Returns the end of the backward compute, of the channel, and the buckets'
    seconds; appends the buckets."""
    seconds, nbytes = _gathers(len(results), gather_runs) if prefetch else ([], [])
    order = [pos for pos in range(len(results) - 1, -1, -1) if seconds[pos]] \
        if prefetch else []
    closing: dict[int, list[int]] = {}  # layer position → buckets its gradients close
    for k, (members, _, _) in enumerate(grad_runs):
        closing.setdefault(members[-1][0], []).append(k)
    pre = _Prefetcher(seconds, nbytes, order, window, start)
    pre.fill(start)
    clock = start
    weight_grad_s = 0.0
    for pos in range(len(results) - 1, -1, -1):
        r = results[pos]
        clock = pre.start(pos, clock)
        clock += r.cost.backward_s + sum(t.critical_s for t in r.cost.terms
                                         if t.when == "backward"
                                         and not (prefetch and _prefetched(t, "backward")))
        for run in closing.get(pos, []):
            members, nbytes_run, secs = grad_runs[run]
            begin = max(pre.channel, clock)
            pre.channel = begin + secs
            weight_grad_s += secs
            group = results[members[0][0]].cost.terms[members[0][1]].group.size
            buckets.append({"index": len(buckets), "layers": len(members),
                            "bytes": nbytes_run, "group": group, "ready_s": clock,
                            "start_s": begin, "end_s": pre.channel})
    return clock, max(clock, pre.channel), weight_grad_s


def _timeline(ctx: Context, options: Options, results: list[LayerResult],
              memory: MemoryReport, cache: EvalCache) -> Evaluation:
    fwd_compute = sum(r.cost.forward_s for r in results)
    bwd_compute = sum(r.cost.backward_s for r in results)
    prefetch = prefetches(ctx, options)
    # ZeRO stage 3's prefetched gathers fuse as the gradients do, consecutive layers over
    # one group up to a bucket, in the order the layers need them: FSDP gathers a
    # wrapped unit (a transformer block) at once, DeepSpeed coalesces its prefetches
    # (stage3_prefetch_bucket_size); one gather per layer paid a LayerNorm's 3 kB the
    # latency of a collective over every node. Each layer carries its share (by bytes).
    gather_runs: dict[str, list[tuple[list[tuple[int, int]], float, float]]] = {}
    if prefetch:
        for when, positions in (("forward", range(len(results))),
                                ("backward", range(len(results) - 1, -1, -1))):
            gathers = [(pos, j) for pos in positions
                       for j, t in enumerate(results[pos].cost.terms) if _prefetched(t, when)]
            gather_runs[when] = _bucketed(ctx, results, gathers, options.bucket_bytes, cache)
    # one pass over the terms: the critical path's collectives forward and backward, and
    # of those ZeRO stage 3's parameter gathers, each summed in term order
    # (all their seconds, and what the critical path pays of them where tensor-parallel
    # collectives overlap their GEMMs)
    fwd_comm = bwd_comm = act_comm = passes_gathers = fwd_crit = 0.0
    for r in results:
        for t in r.cost.terms:
            when, gather = t.when, t.phase == "parameters"
            if when in ("gradient", "update"):
                continue
            if when == "forward":
                fwd_comm += t.seconds
                fwd_crit += t.critical_s
            else:
                bwd_comm += t.seconds
            if gather:
                passes_gathers += t.seconds
            else:
                act_comm += t.seconds
    pb = question_param_bytes(ctx.network, options)
    # the optimizer step: one memory-bound pass over each layer's parameter shard (with
    # ZeRO, over the 1/R of it whose optimizer state this device keeps)
    updates = [optimizer_kernel(stepped(r.cost.params_local, ctx.zero, r.cost.terms), pb)
               for r in results if r.cost.params_local > 0]
    optimizer_s = float(ctx.estimator.estimate(updates, ctx.cluster.device,
                                               ctx.network.dtype).seconds.sum()) if updates \
        else 0.0
    forward = _prefetched_forward(results, gather_runs["forward"], options.bucket_bytes) \
        if prefetch else \
        fwd_compute + fwd_crit
    bucketing = options.overlap == "gradients"
    # every weight-gradient term, from the output back: (layer position, term position)
    items = [(pos, j) for pos in range(len(results) - 1, -1, -1)
             for j, t in enumerate(results[pos].cost.terms) if t.when == "gradient"]
    grad_runs = _bucketed(ctx, results, items, options.bucket_bytes if bucketing else None,
                          cache)
    buckets: list[dict[str, Any]] = []
    if bucketing:
        end_backward, finish, weight_grad_s = _overlapped_backward(
            results, grad_runs, forward, options.bucket_bytes, prefetch, buckets,
            gather_runs.get("backward", []))
    else:  # every reduction after the backward pass, gathers on the critical path
        end_backward = forward
        for r in reversed(results):
            end_backward += r.cost.backward_s + sum(t.critical_s for t in r.cost.terms
                                                    if t.when == "backward")
        weight_grad_s = sum(run[2] for run in grad_runs)
        finish = end_backward + weight_grad_s
    # ZeRO stages 1-2: the updated parameters all-gathered after the step, in buckets
    # as the gradients were
    # and sequence-parallel norms' gradients summed over the tensor group after the
    # backward pass, in buckets as the gradients are (Megatron-LM's finalize_model_grads:
    # one all-reduce of them all): on the critical path, never hidden
    upd_items: list[tuple[int, int]] = []
    sync_items: list[tuple[int, int]] = []
    for p, r in enumerate(results):
        for j, t in enumerate(r.cost.terms):
            if t.when == "update":
                (upd_items if t.phase == "parameters" else sync_items).append((p, j))
    bucket = options.bucket_bytes if bucketing else None
    upd_runs = _bucketed(ctx, results, upd_items, bucket, cache)
    upd_comm = sum(run[2] for run in upd_runs)
    sync_s = sum(run[2] for run in _bucketed(ctx, results, sync_items, bucket, cache))
    # Megatron-LM's --overlap-param-gather: the gathers run under the next step's first
    # forward pass, each bucket issued a bucket ahead of the layers that need it; the
    # step pays what that forward waits for
    upd_paid = upd_comm
    if options.overlap_param_gather and upd_runs:
        upd_paid = _prefetched_forward(results, upd_runs, options.bucket_bytes) \
            - _prefetched_forward(results, [], options.bucket_bytes)
    # one microbatch without reductions; under gradient accumulation the microbatches
    # before the last run so (DDP's no_sync), and the last one as above. Sharded
    # gradients (ZeRO 2 and 3) have nowhere to accumulate unreduced: every microbatch
    # reduce-scatters its gradients into the shard, as the last one does (DeepSpeed's
    # ZeRO-2/3 each micro-step; FSDP's sharded strategies outside no_sync)
    more = options.microbatches - 1
    if sharded_gradients(ctx, options):
        plain = finish
        reductions = more + 1
    else:
        plain = forward + sum(r.cost.backward_s + sum(t.critical_s for t in r.cost.terms
                                                      if t.when == "backward")
                              for r in results)
        reductions = 1
    time_s = more * plain + finish + sync_s + optimizer_s + upd_paid
    compute_s = (more + 1) * (fwd_compute + bwd_compute) + optimizer_s
    comm_s = (more + 1) * (fwd_comm + bwd_comm) + reductions * weight_grad_s + upd_comm \
        + sync_s
    # what the step waits for besides its compute: time_s = compute_s + exposed_comm_s.
    # Not capped at comm_s: ring attention's steps can cost more than its traffic takes
    # (its n steps' kernels, each 1/n of the core, run below the whole core's rate;
    # costs.layer.overlap_context), and capping lost that time from the accounting (an
    # audit: 283 ms of Llama 3 8B's 3.62 s step on 64 GPUs at 128k tokens). The same
    # compute summed in two orders differs in its last bits: on one device the
    # difference read as 1e-17 s of exposed communication
    exposed = max(0.0, time_s - compute_s)
    if exposed <= 1e-12 * time_s:
        exposed = 0.0
    return Evaluation(
        layers=results,
        time_s=time_s,
        forward_s=forward,
        backward_s=end_backward - forward,
        optimizer_s=optimizer_s,
        compute_s=compute_s,
        comm_s=comm_s,
        exposed_comm_s=exposed,
        weight_grad_s=weight_grad_s,
        memory=memory,
        buckets=buckets,
        # every microbatch runs its forward and backward collectives (ZeRO stage 3's
        # gathers among them); the update's gathers run once
        parameters_s=(more + 1) * passes_gathers
        + sum(t.seconds for r in results for t in r.cost.terms  # bucketed above
              if t.phase == "parameters" and t.when == "update") if ctx.zero else 0,
        reductions=reductions,
        activation_comm_s=(more + 1) * act_comm,
        # every microbatch re-runs the recomputed blocks' forward
        recompute_s=(more + 1) * sum(r.cost.forward_s + r.cost.comm("recompute")
                                     for r in results if recomputed(r.layer, ctx))
        if ctx.rebuilt else 0,
        microbatch_s=plain,
        weight_compute_s=sum(r.cost.weight_s for r in results),
    )
