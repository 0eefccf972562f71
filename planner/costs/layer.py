"""The cost of one layer under one layout: its collectives, its kernels, its shard.

Two accountings:

* ``exact`` (default): what the integrated algorithm really moves. For a layer with
  weights in layout ``model P_r × P_c`` (``b = B/P_c`` samples per batch block, ``e`` bytes
  per element): the forward all-gather of ``Y`` over the row group (``b·d_i·e`` bytes);
  the backward-data all-reduce of ``ΔX`` over the row group (``b·d_{i−1}·e``: the paper
  charges ``d_i``, REFERENCES §1); the weight-gradient all-reduce of the ``1/P_r`` shard
  over the column group (``|W|/P_r·e``). Attention in model mode splits heads
  Megatron-style (Shoeybi et al. 2019): an all-reduce of the output forward and of the
  input gradient backward. ``domain``: halo rows exchanged with the neighbours forward
  (input rows, exact for stride and padding) and backward (output-gradient rows), the
  weight gradient all-reduced over all ``P``. ``data``: the weight gradient over all ``P``.
  Collectives use the cluster's algorithm on the tier their group crosses.
* ``gholami2018``: the paper's Eq. 3/4/6/7/8/9 as printed: ``d_i`` for the
  backward-data term, ``⌈log2 p⌉`` latencies, words of the network dtype, halos of
  ``⌊k/2⌋`` rows, the redistribution of Eq. 6 charged once, forward only.

Layers without weights follow the distribution they receive and pay only what it needs
(:func:`follower_terms`): halo rows for pooling over a split height, a statistics
all-reduce for batch norm, an all-reduce for a global pool; anything that cannot work on
a split height (layer norm, softmax, a pool with fewer output rows than the split)
gathers first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from ..cluster import Cluster
from ..layout import (
    EXPERT_MODES,
    SEQUENCE_MODES,
    Dist,
    Layout,
    base_mode,
    node_group,
    redistribution,
)
from ..network import DTYPE_BYTES, GATED, Block, Layer, Network, layer_kernels
from ..ops import Elementwise, Gemm, Kernel
from .comm import Collective, Group, collective_time, paper_all_gather, paper_all_reduce, paper_halo
from .compute import Estimator, FloatArray
from .memory import ParamBytes, sharded

ELEMENTWISE = ("relu", "gelu", "silu", "tanh", "sigmoid", "identity", "dropout", "add", "lrn",
               "flatten", *GATED)
#: layers that work on each feature alone, so on features split by a column layout; a
#: gated unit pairs feature ``i`` of its gate half with feature ``i`` of its value half,
#: which a column layer's shard holds together when its weight's rows are stored
#: interleaved per shard, as Megatron-LM stores its fused gate and up projection
FEATURE_WISE = ("relu", "gelu", "silu", "tanh", "sigmoid", "identity", "dropout", *GATED)
#: layers that work on each token of a sequence alone, so on a sequence split by tokens
#: (a learned position embedding adds the rows of its own tokens)
TOKEN_WISE = ("layernorm", "rmsnorm", "softmax", "positional_embedding")


@dataclass(frozen=True)
class CommTerm:
    """One collective of a layer: phase, collective, group, bytes and seconds."""

    phase: str  #: forward | backward_data | weight_grad | redistribute
    collective: str
    group: Group
    bytes: float
    seconds: float
    algorithm: str
    note: str = ""
    #: the seconds it adds to the critical path when it overlaps its layer's GEMM
    #: (``--tp-comm-overlap``; None: all of them)
    exposed_s: float | None = None
    #: it reduces (or gathers) parameters beside the layer's bulk: a mixture of experts'
    #: router and shared experts, which every device holds whole, where its routed
    #: experts are reduced over their replicas (:func:`shards` goes by the bulk's)
    aside: bool = False

    @property
    def critical_s(self) -> float:
        """The seconds it adds to its pass: all of them, or what its overlap leaves."""
        return self.seconds if self.exposed_s is None else self.exposed_s

    @functools.cached_property
    def when(self) -> str:
        """Where it sits in the timeline: ``forward``, ``backward`` (on the critical path),
        ``gradient`` (a weight-gradient reduction that may overlap) or ``update`` (after
        the optimizer step: ZeRO's all-gather of the updated parameters). Cached: the
        timeline asks for every term of every evaluation."""
        note = self.note.removesuffix(" bucketed")  # fused with others, still where it was
        if note.endswith("(update)"):  # ZeRO's gathers; sequence parallelism's norm sync
            return "update"
        if self.phase == "weight_grad":
            return "gradient"
        if self.phase == "forward" or note.endswith("(forward)"):
            return "forward"
        return "backward"


@dataclass(frozen=True)
class Context:
    """Everything a layer's cost depends on besides the layer and its layout."""

    network: Network
    cluster: Cluster
    gpus: int
    batch: int
    estimator: Estimator
    cost_model: str = "exact"
    algorithm: str | None = None
    zero: int = 0  #: ZeRO stage: parameters, gradients, optimizer state sharded
    #: over whom ZeRO shards: "all" of a layer's data-parallel replicas, or those in one
    #: "node" (replicated across nodes: hybrid sharding)
    zero_shard: str = "all"
    #: "none", "blocks" (every residual block re-runs its forward in backward) or a count
    #: of blocks, the first ones in the network
    recompute: str = "none"
    #: the dtype gradients are accumulated and reduced in (None: the weights')
    grad_dtype: str | None = None
    #: tensor-parallel collectives overlap the GEMMs they feed or drain
    #: (:func:`overlap_tp`; Megatron-LM's ``--tp-comm-overlap``)
    tp_comm_overlap: bool = False
    #: the weight gradients' GEMMs run in a pass of their own, later (ZB-H1's W), so
    #: nothing of the backward pass overlaps them
    wgrad_deferred: bool = False
    #: how context parallelism moves the keys and values (:data:`CP_COMM_TYPES`)
    cp_comm_type: str = "p2p"
    #: device 0's position in its node: a pipeline stage whose first rank does not begin
    #: a node (6 on 8-GPU nodes for ranks 6-11) has groups that cross nodes where the
    #: same grid on ranks 0-5 would not (:func:`planner.layout.node_group`)
    rank_offset: int = 0

    @functools.cached_property
    def rebuilt(self) -> frozenset[str]:
        """The names of the blocks recomputed (:func:`rebuilt_blocks`); kept on the
        instance: every layer's cost asks."""
        return rebuilt_blocks(self.network, self.recompute)

    @functools.cached_property
    def rebuilt_units(self) -> tuple[Block, ...]:
        """The recomputation units re-run (:attr:`Network.recompute_units`), in order."""
        chosen = {self.network.unit_of[b] for b in self.rebuilt}
        return tuple(u for u in self.network.recompute_units if u.name in chosen)

    def unit(self, block: str | None) -> str | None:
        """The recomputation unit of a residual block (None: outside every block)."""
        return None if block is None else self.network.unit_of[block]

    @property
    def elem_bytes(self) -> int:
        """Bytes per activation / weight element."""
        return self.network.elem_bytes

    @property
    def grad_bytes(self) -> int:
        """Bytes per weight-gradient element, as accumulated and reduced."""
        return DTYPE_BYTES[self.grad_dtype] if self.grad_dtype else self.network.elem_bytes

    @property
    def per_node(self) -> int:
        """Devices per node."""
        return self.cluster.devices_per_node

    @property
    def paper(self) -> bool:
        """Whether the gholami2018 accounting is in force."""
        return self.cost_model == "gholami2018"


@dataclass
class LayerCost:
    """The cost of one layer as evaluated: compute, communication terms, shard."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    estimator: str = ""
    terms: list[CommTerm] = field(default_factory=list)
    params_local: float = 0.0  #: parameter elements this device holds for the layer
    #: the part of ``backward_s`` that computes weight gradients (the W pass a
    #: zero-bubble pipeline schedule defers; the rest is the input gradient's B pass)
    weight_s: float = 0.0

    def comm(self, phase: str) -> float:
        """Seconds of the terms of one phase."""
        return sum(t.seconds for t in self.terms if t.phase == phase)

    @property
    def comm_s(self) -> float:
        """All communication seconds."""
        return sum(t.seconds for t in self.terms)

    @property
    def compute_s(self) -> float:
        """Forward plus backward compute seconds."""
        return self.forward_s + self.backward_s


#: activation recomputation: none, or every residual block (its input kept, its forward
#: re-run before its backward); also a number N: the first N residual blocks
RECOMPUTE = ("none", "blocks")


def recompute_error(value: str, blocks: int | None = None, unit: str = "blocks"
                    ) -> str | None:
    """What is wrong with a recomputation setting (None: nothing); with ``blocks``, the
    network's count of recomputation units (residual blocks, or under ``unit``
    "layers" its transformer layers), a count above it is wrong too."""
    if value == "none" or (value.isdigit() and int(value) == 0):
        return None
    if value not in RECOMPUTE and not value.isdigit():
        return f"unknown recomputation {value!r}; use none, blocks or a number of blocks"
    if blocks == 0:
        return (f"cannot recompute {value if value == 'blocks' else value + ' blocks'}: the "
                "network has no residual blocks (an 'add' layer summing a body and its "
                "shortcut), which is what recomputation re-runs; use none")
    if value in RECOMPUTE:
        return None
    if blocks is not None and int(value) > blocks:
        if unit == "blocks":
            what, have = "residual blocks", "residual blocks"
        else:
            what, have = "layers", "layers (an attention block and the blocks after "\
                "it, which --recompute-unit layers recomputes as one)"
        return (f"cannot recompute {int(value)} {what}: the network has {blocks} {have}; "
                f"use at most {blocks} (or blocks)")
    return None


def recompute_value(count: int, blocks: int) -> str:
    """The setting that recomputes the first ``count`` of ``blocks`` residual blocks."""
    return "none" if count == 0 else "blocks" if count == blocks else str(count)


def canonical_recompute(value: str, blocks: int) -> str:
    """A count of blocks as the setting it amounts to: 0 is none, all of them blocks (so
    a plan records one name for one choice); other values as they are."""
    if value.isdigit() and int(value) in (0, blocks):
        return recompute_value(int(value), blocks)
    return str(int(value)) if value.isdigit() else value


def rebuilt_blocks(network: Network, value: str) -> frozenset[str]:
    """The names of the blocks a recomputation setting re-runs: all, none, or those of
    the first ``N`` recomputation units (:attr:`Network.recompute_units`: residual
    blocks, or with ``--recompute-unit layers`` transformer layers)."""
    if value == "none":
        return frozenset()
    units = network.recompute_units
    chosen = {u.name for u in (units if value == "blocks" else units[:int(value)])}
    return frozenset(b.name for b in network.blocks if network.unit_of[b.name] in chosen)


def recomputed(layer: Layer, ctx: Context) -> bool:
    """Whether the layer's forward runs again in the backward pass (and keeps nothing)."""
    return layer.block is not None and layer.block in ctx.rebuilt


def rerun_terms(layer: Layer, ctx: Context, terms: list[CommTerm]) -> list[CommTerm]:
    """A recomputed layer's forward collectives once more, before its backward: its own,
    and the forward moves of its input into its layout (ZeRO stage 3's parameter gather
    is not repeated: the backward's own gather serves)."""
    if not recomputed(layer, ctx):
        return []
    return [CommTerm("recompute", t.collective, t.group, t.bytes, t.seconds, t.algorithm,
                     (t.note.replace("(forward)", "").strip() + " (recompute)").strip(),
                     t.exposed_s, t.aside)
            for t in terms if t.when == "forward" and t.phase != "parameters"]


def _with_rerun(layer: Layer, ctx: Context, kernels: dict[str, list[Kernel]]
                ) -> dict[str, list[Kernel]]:
    """A recomputed layer's forward kernels once more, counted in its backward."""
    if not recomputed(layer, ctx):
        return kernels
    return {**kernels, "backward_data": kernels["backward_data"] + kernels["forward"]}


def cost_signature(layer: Layer, ctx: Context) -> tuple[object, ...]:
    """What a layer's costs depend on: two layers with the same signature cost the same
    under the same layout (names and positions do not matter; whether it is recomputed
    does)."""
    return (layer.type, layer.input_shape, layer.output_shape, layer.params,
            layer.weight_elems, layer.conv, layer.pool, layer.linear, layer.attention,
            layer.embedding, layer.moe, layer.inputs == (-1,), layer.stage_input,
            # its input's gradient is computed (not where only parameter-free layers
            # lead to it: a linear after a first ReLU costs less than one after a linear)
            layer.input_grad, layer.saves_input,
            layer.saves_output, layer.saved_internal, layer.saved_bytes_extra,
            # an embedding's forward depends on whether a head shares its table (few
            # embeddings: none shares another's costs)
            layer.index if layer.embedding is not None else None, recomputed(layer, ctx))


def _alpha_beta(ctx: Context, group: Group) -> tuple[float, float]:
    """The paper's single (α, β) for a group: the tier it crosses."""
    link = ctx.cluster.inter if group.spans_nodes else ctx.cluster.intra
    return link.latency_s, 1.0 / link.bandwidth


def price(ctx: Context, op: Collective, group: Group, nbytes: FloatArray,
          ) -> tuple[FloatArray, str]:
    """Seconds of collective ``op`` over ``group`` for each size in ``nbytes`` (an array),
    with the context's accounting, and the algorithm's name."""
    if group.size <= 1:
        return nbytes * 0.0, "none"
    if ctx.paper:
        alpha, beta = _alpha_beta(ctx, group)
        words = nbytes / ctx.elem_bytes
        beta_w = beta * ctx.elem_bytes
        if op == "all_gather":
            return paper_all_gather(words, group.size, alpha, beta_w), "paper"
        if op == "all_reduce":
            return paper_all_reduce(words, group.size, alpha, beta_w), "paper"
        return paper_halo(words, alpha, beta_w), "paper"
    return collective_time(op, nbytes, group, ctx.cluster, ctx.algorithm)


def term(ctx: Context, phase: str, op: Collective, group: Group, nbytes: float,
         note: str = "", aside: bool = False) -> CommTerm | None:
    """A collective priced with the context's accounting; None when it moves nothing."""
    if group.size <= 1 or nbytes <= 0:
        return None
    secs, alg = price(ctx, op, group, np.array([float(nbytes)]))
    return CommTerm(phase, op, group, nbytes, float(secs[0]), alg, note, aside=aside)


def _halo_group(layout_row: Group) -> Group:
    """Neighbours of a split height: in one node unless the row group spans nodes."""
    return Group(2, 1 if layout_row.spans_nodes else 2)


def _halo_rows(sides: tuple[tuple[int, int], ...], layout_row: Group) -> int:
    """Rows of a halo the busiest device receives on the link :func:`_halo_group`
    prices, of the devices' (above, below) rows ``sides``
    (:meth:`planner.network.Layer.split_halos`): both sides, unless the row group spans
    nodes with at least two of its devices on every node, where a device at a node's
    edge has one neighbour across (on its NIC) and the other inside (on NVLink, at the
    same time, and sooner): the larger side (an audit: two 1 MiB rows over the NIC
    where one crosses)."""
    if layout_row.spans_nodes and layout_row.per_node >= 2:
        return max((max(top, bottom) for top, bottom in sides), default=0)
    return max((top + bottom for top, bottom in sides), default=0)


def _add(terms: list[CommTerm], t: CommTerm | None) -> None:
    if t is not None:
        terms.append(t)


def _needs_input_grad(layer: Layer) -> bool:
    return layer.input_grad and layer.embedding is None


def weighted_terms(layer: Layer, layout: Layout, ctx: Context) -> list[CommTerm]:
    """Forward, backward-data and weight-gradient collectives of a layer with weights
    (and, recomputed, its forward ones again)."""
    terms = _weighted_terms(layer, layout, ctx)
    if ctx.tp_comm_overlap and layout.mode in SEQUENCE_MODES:
        terms = overlap_tp(layer, layout, ctx, terms)
    elif layout.mode == "domain" and layer.attention is not None and not ctx.paper:
        terms = overlap_context(layer, layout, ctx, terms)
    return terms + rerun_terms(layer, ctx, terms)


#: how each sequence-parallel collective overlaps a GEMM of its layer under
#: Megatron-LM's ``--tp-comm-overlap``: Transformer Engine's userbuffers with their
#: default method per GEMM (``transformer_engine.pytorch.module.base.initialize_ub``):
#: (phase, collective, note) → (the GEMM's role, whether on attention's output
#: projection, method).
#:
#: * ``ring``: the all-gather feeding a GEMM (the QKV and first MLP projections
#:   forward, the output projections' input gradient) as ``P_r`` ring steps, each
#:   chunk of rows multiplied while the next arrives, on copy engines (no SMs taken);
#: * ``pipeline``: the reduce-scatter draining a GEMM (the output projections
#:   forward) in 4 chunks of rows, each reduce-scattered while the next is computed;
#: * ``bulk``: the collective beside an independent GEMM of the same backward pass (the
#:   input's all-gather for the weight gradient beside the input gradient's GEMM; the
#:   input gradient's reduce-scatter beside the weight gradient's GEMM).
#:
#: ``pipeline`` and ``bulk`` communicate on 16 SMs, which the GEMM gives up.
TP_OVERLAPS: dict[tuple[str, str, str], tuple[str, bool, str]] = {
    ("forward", "all_gather", "tokens"): ("fprop", False, "ring"),
    ("forward", "reduce_scatter", "tokens"): ("fprop", True, "pipeline"),
    ("backward_data", "all_gather", "tokens"): ("dgrad", True, "ring"),
    ("backward_data", "all_gather", "tokens again"): ("dgrad", False, "bulk"),
    ("backward_data", "reduce_scatter", "tokens"): ("wgrad", False, "bulk"),
}
#: the chunks of a pipelined reduce-scatter, and the SMs its and a bulk collective's
#: kernels take (Transformer Engine's defaults: ``num_splits``, ``num_sm``)
TP_PIPELINE_SPLITS = 4
TP_COMM_SMS = 16


def _overlaps(layer: Layer, layout: Layout, ctx: Context) -> bool:
    """Whether a sequence-parallel layout's collectives overlap its GEMMs: a linear
    layer's or attention's, over a tensor-parallel group within a node (userbuffers
    overlap within a node's NVLink)."""
    return (layer.linear is not None or layer.attention is not None) \
        and not layout.row_group(ctx.per_node, ctx.rank_offset).spans_nodes


def overlap_tp(layer: Layer, layout: Layout, ctx: Context,
               terms: list[CommTerm]) -> list[CommTerm]:
    """Terms with the exposed seconds of the collectives that overlap the layer's GEMMs
    (:data:`TP_OVERLAPS`), for a GEMM of ``C`` seconds and a collective of ``S``:

    * ``ring`` over ``n = P_r`` devices: ``n`` chunks of ``⌈m/n⌉`` rows, ``c`` seconds
      each (timed by the estimator: a chunk runs below the whole GEMM's rate), against
      ``n − 1`` ring steps of ``S/(n − 1)``: ``c + (n − 1)·max(c, S/(n − 1))`` in all;
    * ``pipeline``: 4 chunks of ``⌈m/4⌉`` rows, each ``c`` on the SMs the collective
      leaves (``c·SMs/(SMs − 16)``), and each chunk's reduce-scatter (``s``, priced at a
      quarter of the bytes): ``c' + 3·max(c', s) + s``;
    * ``bulk``: ``max(C·SMs/(SMs − 16), S)``; the weight gradient's GEMM is no partner
      where it is deferred (ZB-H1's W pass).

    What exceeds ``C`` is exposed (it may exceed ``S`` where chunking or the SMs given
    up cost more than the collective). A GEMM gives up SMs in proportion to its time
    (a compute-bound kernel's, an upper bound on a memory-bound one's); the copy
    engines' traffic does not slow it."""
    if not _overlaps(layer, layout, ctx):
        return terms
    n = layout.row_group(ctx.per_node, ctx.rank_offset).size
    if n <= 1:
        return terms
    kernels = _weighted_kernels(layer, layout, ctx)
    gemms = {k.role: k for phase in kernels.values() for k in phase
             if isinstance(k, Gemm) and k.role}
    wanted: list[tuple[int, Gemm, str]] = []
    for i, t in enumerate(terms):
        pair = TP_OVERLAPS.get((t.phase, t.collective, t.note))
        if pair is None:
            continue
        role, output_side, method = pair
        if output_side and layer.attention is not None:
            role += "-out"
        g = gemms.get(role)
        if g is None or (role.startswith("wgrad") and ctx.wgrad_deferred):
            continue
        wanted.append((i, g, method))
    if not wanted:
        return terms
    splits = {"ring": n, "pipeline": TP_PIPELINE_SPLITS, "bulk": 1}
    asked = [g for _, g, _ in wanted] + [replace(g, m=-(-g.m // splits[m]))
                                         for _, g, m in wanted]
    times = ctx.estimator.estimate(asked, ctx.cluster.device, ctx.network.dtype).seconds
    sms = ctx.cluster.device.sm_count
    slower = sms / max(1, sms - TP_COMM_SMS)
    out = list(terms)
    for j, (i, _, method) in enumerate(wanted):
        t, whole, chunk = terms[i], float(times[j]), float(times[len(wanted) + j])
        if method == "ring":
            total = chunk + (n - 1) * max(chunk, t.seconds / (n - 1))
        elif method == "pipeline":
            k = TP_PIPELINE_SPLITS
            step, _ = price(ctx, "reduce_scatter", t.group, np.array([t.bytes / k]))
            c, s_k = chunk * slower, float(step[0])
            total = c + (k - 1) * max(c, s_k) + s_k
        else:
            total = max(whole * slower, t.seconds)
        out[i] = replace(t, exposed_s=max(0.0, total - whole))
    return out


#: how context parallelism moves attention's keys and values (Megatron-LM's
#: ``--cp-comm-type``): ``p2p`` passes them around a ring of point-to-point sends, each
#: step's attention computed while the next device's block arrives (Transformer
#: Engine's ``AttnFuncWithCPAndKVP2P``, Megatron-LM's default; Liu et al.'s ring
#: attention, ICLR 2024); ``allgather`` gathers them whole before the attention and
#: reduce-scatters their gradients after it (Llama 3's, Dubey et al. 2024 §3.3.2), on
#: the critical path; ``auto``, whichever of the two costs a layer less (Megatron-LM
#: takes a list, one a layer)
CP_COMM_TYPES = ("p2p", "allgather", "auto")


def overlap_context(layer: Layer, layout: Layout, ctx: Context,
                    terms: list[CommTerm]) -> list[CommTerm]:
    """Terms of context parallelism's keys and values as its ring (``p2p``) moves them,
    as Transformer Engine's ``AttnFuncWithCPAndKVP2P`` does: over ``n = P_r`` devices
    each pass runs attention's core as ``n`` steps, each meeting one device's keys
    (``⌈k/n⌉`` of the ``k`` keys a query meets, ``c`` seconds timed by the estimator: a
    step runs below the whole core's rate) while the block the next step needs
    travels one hop, and a step starts when its block is in. A hop of a block of ``B``
    bytes (``1/n`` of a collective's) is ``h(B) = α + B/β`` on the node's links, or on
    the nodes' network where the ring spans nodes: every rank sends at once, and the
    pair across a node boundary shares one NIC (an NCCL all-gather spreads that over a
    channel a GPU, so a ring of sends across nodes is slower than the collective).
    Forward, the keys and values (``B``), sent in every step but the last: ``c + (n −
    1)·max(c, h(B))``. Backward, the steps run in the reverse order, ending on the
    device's own keys: the keys and values (``B₁``) are sent in every step but the
    last, and with them in one message, from the second step, the partial sums of
    their gradients (``B₂``), which arrive home during the last step: ``max(c, h(B₁))
    + (n − 2)·max(c, h(B₁ + B₂)) + max(c, h(B₂))``. What exceeds the whole core's ``C``
    is exposed (more than the collective's seconds where the steps' kernels lose more,
    or the hops cost more, than it), the backward's split between its two terms by
    their seconds; the terms' algorithm reads ``p2p``. Under ``auto`` the
    layer keeps the all-gather where that exposes less, forward and backward together.
    Ring attention needs a flash kernel's online softmax: an unfused attention
    gathers."""
    a = layer.attention
    n = layout.pr
    if a is None or not a.flash or ctx.cp_comm_type == "allgather" or n <= 1:
        return terms
    b = _ceil_div(ctx.batch, layout.pc)

    def core(key_split: int) -> list[list[Kernel]]:
        ks = layer_kernels(layer, b, ctx.elem_bytes, height_split=n, key_split=key_split)
        return [[k for k in ks[phase] if isinstance(k, Gemm) and not k.role]
                for phase in ("forward", "backward_data")]

    parts = core(1) + core(n)
    times = ctx.estimator.estimate([k for part in parts for k in part], ctx.cluster.device,
                                   ctx.network.dtype).seconds
    ends = np.cumsum([len(part) for part in parts])
    whole_f, whole_b, c_f, c_b = (float(times[e - len(p):e].sum())
                                  for e, p in zip(ends, parts, strict=True))
    ring = [i for i, t in enumerate(terms) if t.phase in ("forward", "backward_data")]
    exposed: dict[int, float] = {}
    # a hop: every rank sends its block to its neighbour at once; across nodes the
    # boundary's pair on one NIC, which paces the ring
    link = ctx.cluster.inter if layout.row_group(ctx.per_node, ctx.rank_offset).spans_nodes \
        else ctx.cluster.intra

    def hop(nbytes: float) -> float:
        return float(link.latency_s) + nbytes / n / float(link.bandwidth) if nbytes else 0.0

    b_kv, b_grad = (sum(terms[i].bytes for i in ring if terms[i].phase == "backward_data"
                        and terms[i].collective == op)
                    for op in ("all_gather", "reduce_scatter"))
    back = max(c_b, hop(b_kv)) + (n - 2) * max(c_b, hop(b_kv + b_grad)) \
        + max(c_b, hop(b_grad))
    both = max(sum(terms[i].seconds for i in ring if terms[i].phase == "backward_data"),
               1e-30)
    for i in ring:
        t = terms[i]
        exposed[i] = max(0.0, c_f + (n - 1) * max(c_f, hop(t.bytes)) - whole_f) \
            if t.phase == "forward" else max(0.0, back - whole_b) * t.seconds / both
    if ctx.cp_comm_type == "auto" and sum(exposed.values()) >= sum(terms[i].seconds
                                                                   for i in ring):
        return terms
    return [replace(t, algorithm="p2p", exposed_s=exposed[i]) if i in exposed else t
            for i, t in enumerate(terms)]


def _weighted_terms(layer: Layer, layout: Layout, ctx: Context) -> list[CommTerm]:
    g = ctx.per_node
    e = ctx.elem_bytes
    # the busiest batch block where P_c does not divide the batch (the paper: B / P_c)
    b = ctx.batch / layout.pc if ctx.paper else _ceil_div(ctx.batch, layout.pc)
    o = ctx.rank_offset
    row, col, allg = layout.row_group(g, o), layout.col_group(g, o), layout.all_group(g, o)
    terms: list[CommTerm] = []
    own = layer.params  # a tied head's shared weight is reduced once, by its embedding
    if layout.mode == "data":
        # the paper's Eq. 4 reduces |W_i| without biases, as its Eq. 8 does (P_r = 1
        # gives Eq. 4): the biases were in one and not the other (an audit)
        terms += gradient_terms(ctx, allg, _paper_weights(layer, ctx) if ctx.paper else own)
        return terms
    if layout.mode == "column":
        # Megatron's column-parallel linear: the output stays split by features; the
        # input gradient's partial sums are all-reduced over the row group
        if _needs_input_grad(layer):
            _add(terms, term(ctx, "backward_data", "all_reduce", row, b * layer.in_elems * e))
        terms += gradient_terms(ctx, col, local_params(layer, layout))
        return terms
    if layout.mode == "row":
        # Megatron's row-parallel linear: partial outputs all-reduced; the input gradient
        # is split by features as the input is; the bias is whole on every device
        _add(terms, term(ctx, "forward", "all_reduce", row, b * layer.out_elems * e))
        terms += gradient_terms(ctx, col, local_params(layer, layout))
        return terms
    if layout.mode in SEQUENCE_MODES:
        return terms + _sequence_terms(layer, layout, ctx, b)
    if layout.mode == "ulysses":
        return terms + ulysses_terms(layer, layout, ctx, b) + gradient_terms(ctx, allg, own)
    if layout.mode in EXPERT_MODES:
        return expert_terms(layer, layout, ctx)
    if layout.mode == "model":
        if ctx.paper:
            d_i = layer.out_elems * b * e
            _add(terms, term(ctx, "forward", "all_gather", row, d_i))
            _add(terms, term(ctx, "backward_data", "all_reduce", row, d_i))
            _add(terms, term(ctx, "weight_grad", "all_reduce", col,
                             _paper_weights(layer, ctx) / layout.pr * ctx.grad_bytes))
            return terms
        # attention sums its heads' projections; an embedding whose table an output
        # head shares is split by vocabulary rows, as the head splits it (Megatron's
        # vocabulary-parallel embedding), and sums the rows each device looked up
        tied_table = layer.embedding is not None and layer.index in ctx.network.ties
        # so does a mixture of experts with each expert split by hidden features
        fwd_op: Collective = "all_reduce" if layer.attention is not None or tied_table \
            or layer.moe is not None else "all_gather"
        _add(terms, term(ctx, "forward", fwd_op, row, b * layer.out_elems * e))
        if _needs_input_grad(layer):
            # a grouped convolution whose groups split evenly over P_r: each device's
            # groups read only their own 1/P_r of the input channels, so the input
            # gradient's blocks are disjoint and are gathered, not summed
            conv = layer.conv
            bwd_op: Collective = "all_gather" if conv is not None and conv.groups > 1 \
                and conv.groups % layout.pr == 0 else "all_reduce"
            _add(terms, term(ctx, "backward_data", bwd_op, row, b * layer.in_elems * e))
        terms += gradient_terms(ctx, col, local_params(layer, layout))
        return terms
    # domain: halo rows (a sequence's tokens: none; attention gathers the keys and
    # values), weights replicated on all P
    if layer.conv is not None or ctx.paper:
        terms += halo_terms(layer, layout, ctx, b)
    elif layer.attention is not None:
        terms += context_terms(layer, layout, ctx, b)
    wg = _paper_weights(layer, ctx) if ctx.paper else own
    terms += gradient_terms(ctx, allg, wg)
    return terms


def _paper_weights(layer: Layer, ctx: Context) -> float:
    """The paper's ``|W_i|`` of a layer: its weight matrix (biases left out, as Eq. 4
    and 8 write it), none for a layer that shares another's (a tied output head: the
    one weight is reduced once, by its embedding, as the exact accounting does)."""
    if any(layer.index in tied for tied in ctx.network.ties.values()):
        return 0.0
    # REFERENCES §1: |W_i| = k_h k_w X_C Y_C (a convolution), d_i d_{i-1} (a linear layer)
    bias = (layer.conv.out_channels if layer.conv is not None and layer.conv.bias else
            layer.linear.out_features if layer.linear is not None and layer.linear.bias
            else 0)
    return float(layer.weight_elems - bias)


def _sequence_terms(layer: Layer, layout: Layout, ctx: Context, b: float) -> list[CommTerm]:
    """Megatron-LM's tensor parallelism with sequence parallelism (Korthikanti et al.,
    MLSys 2023, §4.2.2 and Fig. 6): the all-reduce of a ``row`` (or a head-split
    attention's) output becomes a reduce-scatter by tokens, and its backward an
    all-gather of the output gradient; a ``column`` (or attention) layer all-gathers its
    input's tokens, keeps only its own share, so all-gathers them again backward for its
    weight gradient, and reduce-scatters its input gradient where ``column``
    all-reduces it. Per pair the traffic is a ``column`` and ``row`` pair's, plus the
    backward all-gather (which Megatron-LM overlaps with the input gradient's GEMM;
    here it is on the critical path). A mixture of experts keeps its routed rows of
    every token, and its router runs on the device's own tokens (Megatron-Core routes
    before its all-gather dispatcher): it gathers the tokens again only for shared
    experts, a tensor-parallel MLP whose column layer keeps its share."""
    g, o = ctx.per_node, ctx.rank_offset
    row, col = layout.row_group(g, o), layout.col_group(g, o)
    e = ctx.elem_bytes
    terms: list[CommTerm] = []
    x, y = b * layer.in_elems * e, b * layer.out_elems * e
    if layer.embedding is not None:
        # Megatron-LM's vocabulary-parallel embedding under sequence parallelism: each
        # device looks up every token of its batch block in its rows of the table (the
        # others read zero), and the partial sums are reduce-scattered by tokens where
        # tensor parallelism alone all-reduces them; the token ids (int64) are gathered
        return _terms_on(ctx, row, [
            ("forward", "all_gather", b * layer.in_elems * 8, "token ids"),
            ("forward", "reduce_scatter", y, "tokens"),
            ("backward_data", "all_gather", y, "tokens"),
        ]) + gradient_terms(ctx, col, local_params(layer, layout))
    if layout.mode in ("column-sp", "model-sp"):
        _add(terms, term(ctx, "forward", "all_gather", row, x, "tokens"))
    if layout.mode in ("row-sp", "model-sp"):
        _add(terms, term(ctx, "forward", "reduce_scatter", row, y, "tokens"))
        _add(terms, term(ctx, "backward_data", "all_gather", row, y, "tokens"))
    if layout.mode in ("column-sp", "model-sp"):
        m = layer.moe
        if m is None or m.shared_hidden:
            # the weight gradient reads the gathered input, of which the layer keeps its
            # share; a mixture of experts keeps its routed rows of every token
            # (MoeGeom.saved) and its router reads the device's own tokens
            _add(terms, term(ctx, "backward_data", "all_gather", row, x, "tokens again"))
        if _needs_input_grad(layer):
            _add(terms, term(ctx, "backward_data", "reduce_scatter", row, x, "tokens"))
    lin = layer.linear
    if layout.mode == "row-sp" and lin is not None and lin.bias:
        # the bias is added to each device's tokens: its gradient is summed over the row
        # group first (Megatron-LM's sequence-parallel parameters), then with the rest
        _add(terms, term(ctx, "backward_data", "all_reduce", row,
                         lin.out_features * ctx.grad_bytes, "token-split bias"))
    terms += gradient_terms(ctx, col, local_params(layer, layout))
    return terms


def context_terms(layer: Layer, layout: Layout, ctx: Context, b: float) -> list[CommTerm]:
    """Attention over a sequence split by tokens (``domain`` on a sequence: context
    parallelism, Megatron-LM's ``--context-parallel-size``; Liu et al.'s ring attention,
    ICLR 2024): each device projects its own tokens' queries, keys and values, and its
    queries meet every key, so the keys and values (``2 · kv_heads · head_dim`` a
    token) are all-gathered over the row group forward; backward they are gathered
    again (each device keeps only its own) and their gradients reduce-scattered back.
    Megatron-LM passes them around a ring of point-to-point sends, the bytes of the
    gather's ring, overlapped with the attention kernels (:func:`overlap_context`)."""
    a = layer.attention
    assert a is not None
    kv = b * a.seq * 2 * a.kv_heads * a.head_dim * ctx.elem_bytes
    return _terms_on(ctx, layout.row_group(ctx.per_node, ctx.rank_offset), [
        ("forward", "all_gather", kv, "keys and values"),
        ("backward_data", "all_gather", kv, "keys and values again"),
        ("backward_data", "reduce_scatter", kv, "key and value gradients")])


def ulysses_terms(layer: Layer, layout: Layout, ctx: Context, b: float) -> list[CommTerm]:
    """DeepSpeed-Ulysses (Jacobs et al., arXiv 2309.14509, 2023): the projections on each
    device's tokens with the whole weights; an all-to-all over the row group turns the
    queries, keys and values from a token split into a head split (every token of
    ``1/P_r`` of the heads), the core runs on those, and another all-to-all turns its
    output back into a token split; backward, the same two, reversed. Each rank's
    buffer is what it holds: its tokens' queries of every head, and of the keys and
    values a head for each device where there are fewer than ``P_r`` (replicated, as
    grouped-query attention needs), and its tokens' output of every head."""
    a = layer.attention
    assert a is not None
    tokens = b * -(-a.seq // layout.pr)
    kv = layout.pr * a.held(layout.pr)[1]  # key/value heads sent, replicas included
    qkv = tokens * (a.heads + 2 * kv) * a.head_dim * ctx.elem_bytes
    out = tokens * a.heads * a.head_dim * ctx.elem_bytes
    return _terms_on(ctx, layout.row_group(ctx.per_node, ctx.rank_offset), [
        ("forward", "all_to_all", qkv, "queries, keys, values"),
        ("forward", "all_to_all", out, "context"),
        ("backward_data", "all_to_all", out, "context gradient"),
        ("backward_data", "all_to_all", qkv, "query, key, value gradients")])


def _expert_share(layout: Layout, batch: int) -> tuple[int, int]:
    """One device's samples and the split of their tokens under an expert-parallel
    layout: ``⌈B/P⌉`` whole samples (``expert``), or ``⌈B/P_c⌉`` samples split by tokens
    over the row group (``expert-sp``)."""
    if layout.mode == "expert":
        return _ceil_div(batch, layout.p), 1
    return _ceil_div(batch, layout.pc), layout.pr


def expert_terms(layer: Layer, layout: Layout, ctx: Context) -> list[CommTerm]:
    """Expert parallelism (GShard, Lepikhin et al., ICLR 2021; DeepSpeed-MoE, Rajbhandari
    et al., ICML 2022; Megatron-LM's ``--expert-model-parallel-size``): each device of
    a row group holds ``1/P_r`` of the experts, routes its own tokens, and an all-to-all
    over the group sends each routed row (a token for each of its ``top_k`` experts,
    in buffers of the capacity factor's size) to its expert's device; a second brings
    the outputs back for the weighted sum. Backward, the same two, reversed. Each rank's
    buffer is its ``t · top_k · capacity_factor`` rows of ``dim``, times
    :meth:`MoeGeom.busiest` under a load imbalance. The experts' weight
    gradients are summed over their ``P_c`` replicas (the column group), the router's
    and the shared experts', held whole by every device, over all ``P``."""
    m = layer.moe
    assert m is not None
    samples, split = _expert_share(layout, ctx.batch)
    # the busiest device receives its experts' rows (under imbalance, more than it
    # sends), and an all-to-all ends when it has
    buf = samples * _ceil_div(m.tokens, split) * m.fill * m.dim * ctx.elem_bytes \
        * m.busiest(m.experts // layout.pr)
    terms = _terms_on(ctx, layout.row_group(ctx.per_node, ctx.rank_offset), [
        ("forward", "all_to_all", buf, "dispatch"),
        ("forward", "all_to_all", buf, "combine"),
        ("backward_data", "all_to_all", buf, "combine gradient"),
        ("backward_data", "all_to_all", buf, "dispatch gradient")])
    whole = m.router_weights + m.shared_weights()  # on every device
    experts = local_params(layer, layout) - whole
    return (terms + gradient_terms(ctx, layout.col_group(ctx.per_node, ctx.rank_offset), experts)
            + gradient_terms(ctx, layout.all_group(ctx.per_node, ctx.rank_offset), whole,
                             aside=True))


def _terms_on(ctx: Context, group: Group,
              specs: list[tuple[str, Collective, float, str]]) -> list[CommTerm]:
    """The terms ``(phase, collective, bytes, note)`` over one group, in order."""
    terms: list[CommTerm] = []
    for phase, op, nbytes, note in specs:
        _add(terms, term(ctx, phase, op, group, nbytes, note))
    return terms


def halo_terms(layer: Layer, layout: Layout, ctx: Context, b: float) -> list[CommTerm]:
    """Halo exchanges of a windowed layer (convolution, pooling) over a split height."""
    terms: list[CommTerm] = []
    c_in, _, w_in = layer.input_shape
    c_out, _, w_out = layer.output_shape
    group = _halo_group(layout.row_group(ctx.per_node, ctx.rank_offset))
    e = ctx.elem_bytes
    if ctx.paper:
        if layer.conv is None:
            return terms
        kh, kw = layer.conv.kernel
        if kh // 2:
            _add(terms, term(ctx, "forward", "p2p", group, b * w_in * c_in * (kh // 2) * e,
                             "halo"))
        if kw // 2:
            _add(terms, term(ctx, "backward_data", "p2p", group,
                             b * w_out * c_out * (kw // 2) * e, "halo"))
        return terms
    row = layout.row_group(ctx.per_node, ctx.rank_offset)
    fwd, bwd = layer.split_halos(layout.pr)
    rows = _halo_rows(fwd, row)
    _add(terms, term(ctx, "forward", "p2p", group, b * rows * w_in * c_in * e, "halo"))
    if _needs_input_grad(layer):
        rows_b = _halo_rows(bwd, row)
        _add(terms, term(ctx, "backward_data", "p2p", group,
                         b * rows_b * w_out * c_out * e, "halo"))
    return terms


@dataclass(frozen=True)
class _Part:
    direction: str  # forward | backward
    kind: str  # gather | exchange
    group: Group
    share: float  # bytes = share × B × d × e
    sources: int = 0
    tiered: bool = False
    blocks: int = 1  # batch blocks of the distribution that receives
    whole: float = 0.0  # a tiered exchange's alternative: all-gather this share

    def nbytes(self, totals: FloatArray, batch: int, share: float | None = None
               ) -> FloatArray:
        """Bytes the busiest device receives, of activations of ``totals`` bytes: its
        share, for the largest batch block where the blocks do not divide the batch."""
        return (self.share if share is None else share) * totals * (
            _ceil_div(batch, self.blocks) * self.blocks / batch)


@functools.lru_cache(maxsize=131072)
def _parts(src: Dist, dst: Dist, per_node: int, paper: bool,
           offset: int = 0) -> tuple[_Part, ...]:
    """The movements of a redistribution and of its gradient on the way back (the
    paper's Eq. 6: one all-gather, forward only)."""
    parts: list[_Part] = []
    if src == dst:
        return ()
    for direction, a, z in (("forward", src, dst), ("backward", dst, src)):
        if paper and direction == "backward":
            break
        r = redistribution(a, z, per_node, offset)
        if r.kind == "none" or r.received <= 0 or r.group is None:
            continue
        blocks = 1 if paper else z.batch[1]
        if paper or r.kind == "gather":
            parts.append(_Part(direction, "gather", r.group, r.need, blocks=blocks))
        else:
            parts.append(_Part(direction, "exchange", r.group, r.received, r.sources,
                               r.tiered, blocks, r.whole))
    return tuple(parts)


def _exchange_seconds(ctx: Context, part: _Part, nbytes: FloatArray) -> FloatArray:
    """A personalised exchange: ``sources`` messages, the bytes through the device's link
    on the tier the group crosses. A tiered one (each of the ``size − 1`` peers sends an
    equal part) receives from its ``per_node − 1`` peers in the node over the intra-node
    links and from the others, on other nodes, over its own inter-node link, both at
    once, each message paying its tier's latency: as NCCL's grouped sends run, and as
    :func:`planner.costs.comm.nccl_ring_time` prices the pairwise all-to-all."""
    group = part.group
    if part.tiered and group.spans_nodes and group.size > 1:
        near = group.per_node - 1
        far = group.size - group.per_node
        each = nbytes / (group.size - 1)
        intra, inter = ctx.cluster.intra, ctx.cluster.inter
        return (near * intra.latency_s + far * inter.latency_s
                + np.maximum(near * each / intra.bandwidth, far * each / inter.bandwidth))
    link = ctx.cluster.inter if group.spans_nodes else ctx.cluster.intra
    return part.sources * link.latency_s + nbytes / link.bandwidth


def redistribute_terms(src: Dist, dst: Dist, elems_per_sample: int, ctx: Context,
                       note: str) -> list[CommTerm]:
    """Moving an activation of ``elems_per_sample`` from ``src`` to ``dst`` forward, and
    its gradient back from ``dst`` to ``src`` (the paper: forward only, Eq. 6)."""
    total = ctx.batch * elems_per_sample * ctx.elem_bytes
    terms: list[CommTerm] = []
    for part in _parts(src, dst, ctx.per_node, ctx.paper, ctx.rank_offset):
        label = f"{note} ({part.direction})"
        nbytes = float(part.nbytes(np.array([total]), ctx.batch)[0])
        if part.kind == "gather":
            _add(terms, term(ctx, "redistribute", "all_gather", part.group, nbytes, label))
            continue
        secs = float(_exchange_seconds(ctx, part, np.array([nbytes]))[0])
        if part.whole:
            # or all-gather the members' whole blocks and keep this device's part
            whole = float(part.nbytes(np.array([total]), ctx.batch, part.whole)[0])
            gathered = term(ctx, "redistribute", "all_gather", part.group, whole, label)
            if gathered is not None and gathered.seconds < secs:
                terms.append(gathered)
                continue
        terms.append(CommTerm("redistribute", "exchange", part.group, nbytes, secs, "p2p",
                              label))
    return terms


def redistribute_key(src: Dist, dst: Dist, ctx: Context) -> tuple[object, ...]:
    """What :func:`redistribute_seconds` depends on besides the sizes: pairs of
    distributions with the same key cost the same (the search prices each key once)."""
    return tuple(replace(part, direction="")
                 for part in _parts(src, dst, ctx.per_node, ctx.paper, ctx.rank_offset))


def redistribute_seconds(src: Dist, dst: Dist, totals: FloatArray, ctx: Context,
                         forward_only: bool = False) -> FloatArray:
    """Seconds of :func:`redistribute_terms` for many activation sizes at once
    (``totals``: bytes of the whole activation, ``B × d × e``); ``forward_only``: the
    activation's move without its gradient's (what recomputation runs again)."""
    out = np.zeros_like(totals)
    for part in _parts(src, dst, ctx.per_node, ctx.paper, ctx.rank_offset):
        if forward_only and part.direction != "forward":
            continue
        nbytes = part.nbytes(totals, ctx.batch)
        if part.kind == "gather":
            secs, _ = price(ctx, "all_gather", part.group, nbytes)
            out += np.where(nbytes > 0, secs, 0.0)
            continue
        secs = _exchange_seconds(ctx, part, nbytes)
        if part.whole:
            gathered, _ = price(ctx, "all_gather", part.group,
                                part.nbytes(totals, ctx.batch, part.whole))
            secs = np.minimum(secs, gathered)
        out += secs
    return out


def follower_terms(layer: Layer, dist: Dist, ctx: Context) -> tuple[list[CommTerm], Dist, Dist]:
    """A layer without weights on the distribution it receives.

    Returns its collectives (recomputed: its forward ones again), the distribution it
    computes on (after any gather, which is among the terms) and the distribution of its
    output.
    """
    terms, work, out = _follower_terms(layer, dist, ctx)
    return terms + rerun_terms(layer, ctx, terms), work, out


def _follower_terms(layer: Layer, dist: Dist, ctx: Context
                    ) -> tuple[list[CommTerm], Dist, Dist]:
    terms: list[CommTerm] = []
    g = ctx.per_node
    e = ctx.elem_bytes
    b = _ceil_div(ctx.batch, dist.batch[1])  # the busiest batch block
    if ctx.paper:
        return terms, dist, dist
    if dist.feature is not None:
        if layer.type in FEATURE_WISE:  # between a column and a row layer
            return terms, dist, dist
        # anything else needs whole features (a norm, a softmax, a shortcut's add)
        whole = Dist(dist.p, dist.batch, dist.height, tensor=dist.tensor)
        terms += redistribute_terms(dist, whole, layer.in_elems, ctx, "gather features")
        dist = whole
    work = dist
    h = dist.height
    if h is not None and h[1] > 1:
        n_h = h[1]
        row = node_group((h,), dist.p, g, ctx.rank_offset)
        spatial_in = layer.is_spatial and layer.input_shape[1] >= n_h
        if layer.type in ("global_avgpool", "adaptive_avgpool") and layer.is_spatial:
            # partial sums of each device's rows, all-reduced over the height split
            _add(terms, term(ctx, "forward", "all_reduce", row, b * layer.out_elems * e,
                             "pool"))
            out = Dist(dist.p, dist.batch, None)
            terms += _params_terms(layer, dist, ctx)
            return terms, work, out
        if layer.pool_halo(n_h):
            layout_row = row
            c, _, w_in = layer.input_shape
            _, _, w_out = layer.output_shape
            fwd, bwd = layer.split_halos(n_h)
            rows = _halo_rows(fwd, layout_row)
            rows_b = _halo_rows(bwd, layout_row)
            grp = _halo_group(layout_row)
            _add(terms, term(ctx, "forward", "p2p", grp, b * rows * w_in * c * e, "halo"))
            _add(terms, term(ctx, "backward_data", "p2p", grp, b * rows_b * w_out * c * e,
                             "halo"))
            return terms, work, dist
        if spatial_in and layer.type == "batchnorm":
            stats = 2 * layer.input_shape[0] * 4
            _add(terms, term(ctx, "forward", "all_reduce", row, stats, "statistics"))
            _add(terms, term(ctx, "backward_data", "all_reduce", row, stats, "statistics"))
            terms += _params_terms(layer, dist, ctx)
            return terms, work, dist
        if layer.type in ELEMENTWISE and (spatial_in or not layer.is_spatial):
            return terms, work, dist
        if layer.type in TOKEN_WISE and len(layer.input_shape) == 2:
            # a sequence split by tokens (sequence parallelism): each token alone
            terms += _params_terms(layer, dist, ctx)
            return terms, work, dist
        # cannot compute on a split height: gather the height first
        work = Dist(dist.p, dist.batch, None)
        terms += redistribute_terms(dist, work, layer.in_elems, ctx, "gather height")
    terms += _params_terms(layer, work, ctx)
    return terms, work, work


def loss_cost(layer: Layer, dist: Dist, ctx: Context,
              ) -> tuple[dict[str, list[Kernel]], list[CommTerm]]:
    """The loss over the network's output (``layer``, the last, on ``dist``): a softmax
    cross-entropy over its last dimension, two memory-bound passes forward (read the
    logits, write their log-softmax, in fp32 at least: :meth:`Network.output_bytes`) and
    four backward (the loss's dense gradient, then the log-softmax's: read it and the
    saved output, write the input gradient in the network's dtype), on the elements
    this device holds. Logits split by features (a column layer last, as
    Megatron's vocabulary-parallel cross-entropy) need each token's maximum, target
    logit and sum of exponentials from the whole row: three all-reduces of one fp32
    number per token over the feature group, forward (three calls: the maximum is needed
    before the exponentials are taken)."""
    b = _ceil_div(ctx.batch, dist.batch[1])
    elems = layer.out_elems * b / dist.split
    e, kept = ctx.elem_bytes, ctx.network.output_bytes(layer)
    kernels: dict[str, list[Kernel]] = {
        "forward": [Elementwise(elems * (e + kept), 5.0 * elems, "loss")],
        "backward_data": [Elementwise(elems * (3 * kept + e), 2.0 * elems, "loss")],
        "backward_weight": []}
    terms: list[CommTerm] = []
    if dist.feature is not None and not ctx.paper:
        tokens = layer.out_elems // layer.output_shape[-1]
        group = node_group((dist.feature,), dist.p, ctx.per_node, ctx.rank_offset)
        for what in ("maximum", "target logit", "sum of exponentials"):  # in this order
            _add(terms, term(ctx, "forward", "all_reduce", group, 4.0 * b * tokens,
                             f"loss: {what}"))
    return kernels, terms


def _params_terms(layer: Layer, dist: Dist, ctx: Context) -> list[CommTerm]:
    """Weight-gradient reduction of a follower's own parameters (norm scales, learned
    positions) over the devices that hold different samples or rows of them.

    Under sequence parallelism (:attr:`Dist.tensor`) the rows are split over the
    tensor-parallel group, and the parameters are reduced as Megatron-LM reduces them:
    over the data-parallel replicas with the other layers' gradients (in their buckets,
    which a reduction over every device broke at each norm), and over the tensor group
    once after the backward pass, all the norms' gradients in one all-reduce
    (``finalize_model_grads``): a term that runs at the end of the step (``(update)``)
    and is fused with the other norms' there. It was one all-reduce over every device a
    norm (GPT-2 small on 64 H100s at 4 × 16: 96 µs each, and the linear layers'
    buckets split at every norm; found by an expert audit, 2026-12-07)."""
    if layer.params <= 0:
        return []
    if dist.tensor and dist.height is not None and dist.height[1] > 1:
        dp = node_group((dist.batch,), dist.p, ctx.per_node, ctx.rank_offset)
        tp = node_group((dist.height,), dist.p, ctx.per_node, ctx.rank_offset)
        terms = gradient_terms(ctx, dp, layer.params)
        _add(terms, term(ctx, "weight_grad", "all_reduce", tp,
                         layer.params * ctx.grad_bytes, "sequence-parallel sync (update)"))
        return terms
    digits = (dist.batch,) + ((dist.height,) if dist.height else ())
    grp = node_group(digits, dist.p, ctx.per_node, ctx.rank_offset)
    return gradient_terms(ctx, grp, layer.params)


def gradient_terms(ctx: Context, group: Group, elems: float, aside: bool = False
                   ) -> list[CommTerm]:
    """The collectives of ``elems`` weight-gradient elements summed over ``group``, the
    devices that hold the same parameters (its data-parallel replicas). Gradients move
    in :attr:`Context.grad_bytes` a element, parameters in the weights' dtype.

    Without ZeRO, one all-reduce, which may overlap the backward pass. With ZeRO
    (Rajbhandari et al., SC'20), each of the ``R`` replicas keeps the optimizer state of
    ``1/R`` of the parameters (stage 1), and of the gradients (stage 2) and the
    parameters themselves (stage 3): the gradient is reduce-scattered instead (it may
    overlap as the all-reduce did), and at stages 1 and 2 the updated parameters are
    all-gathered after the optimizer step, on the critical path (the same bytes on the
    wire as a ring all-reduce's two halves; §7.2.1 of the paper). At stage 3 the
    parameters are all-gathered before the layer's forward and again before its
    backward: on the critical path with ``overlap: none``, prefetched behind the compute
    of the layers before it with ``overlap: gradients`` (the timeline's, see
    :mod:`planner.evaluate`).

    Sharded within nodes (``zero_shard: node``: FSDP's ``HYBRID_SHARD``, MiCS with
    node-sized groups) a replica group spanning ``m`` nodes, ``q`` ranks in each, keeps
    ``1/q`` shards: the gradient is reduce-scattered inside the node and its shard
    all-reduced across nodes (one ``hybrid_reduce`` term, so that it buckets as one
    collective; :func:`planner.costs.comm.hybrid_reduce_time`), and every parameter
    gather stays inside the node. ``aside``: the terms of parameters beside the layer's
    bulk (:attr:`CommTerm.aside`)."""
    terms: list[CommTerm] = []
    grads, params = elems * ctx.grad_bytes, elems * ctx.elem_bytes
    if ctx.zero == 0:
        _add(terms, term(ctx, "weight_grad", "all_reduce", group, grads, aside=aside))
        return terms
    hybrid = ctx.zero_shard == "node" and group.spans_nodes
    shard = Group(group.per_node, group.per_node) if hybrid else group
    if ctx.zero >= 3:
        _add(terms, term(ctx, "parameters", "all_gather", shard, params, "gather (forward)",
                         aside))
        _add(terms, term(ctx, "parameters", "all_gather", shard, params,
                         "gather (backward)", aside))
    _add(terms, term(ctx, "weight_grad", "hybrid_reduce" if hybrid else "reduce_scatter",
                     group, grads, aside=aside))
    if ctx.zero < 3:
        _add(terms, term(ctx, "parameters", "all_gather", shard, params, "gather (update)",
                         aside))
    return terms


def optimizer_kernel(elems: float, pb: ParamBytes) -> Elementwise:
    """The optimizer step over ``elems`` parameter elements: one memory-bound pass (read
    and write the weights and states, read the gradient), four FLOPs an element."""
    return Elementwise(elems * pb.update_traffic, elems * 4.0, "optimizer")


def shards(terms: list[CommTerm]) -> int:
    """Over how many devices ZeRO shards a layer with these terms: the replicas its
    weight gradient is reduced over, or under hybrid sharding those in one node (1 when
    nothing is reduced)."""
    # a mixture of experts reduces its experts over their replicas and its router and
    # shared experts over all devices: its shards are the routed experts' (the others'
    # state is sharded as theirs is, over fewer devices than it could be: the memory
    # errs high, by a router's few kilobytes, or by shared experts' 1/P_c - 1/P). Experts
    # without replicas (P_c = 1) are reduced over no one, and not sharded: the router's
    # reduction over all P had sharded them 1/P (an audit: Mixtral 8x7B on 8 H100s
    # under expert 8x1 with ZeRO 1 said 69 GiB, fits, for about 125)
    grads = [t for t in terms if t.phase == "weight_grad" and t.when == "gradient"
             and not t.aside]
    if not grads:
        return 1
    t = max(grads, key=lambda t: t.bytes)
    return t.group.per_node if t.collective == "hybrid_reduce" else t.group.size


def held(pb: ParamBytes, zero: int, terms: list[CommTerm]) -> ParamBytes:
    """Bytes per parameter element a device keeps for a layer with these terms: ``pb``,
    or with ZeRO its share over the layer's :func:`shards`."""
    return sharded(pb, zero, shards(terms)) if zero else pb


def stepped(params_local: float, zero: int, terms: list[CommTerm]) -> float:
    """Parameter elements the device's optimizer step updates: its shard, or with ZeRO
    the ``1/S`` of it whose state it keeps (:func:`shards`)."""
    return params_local / shards(terms) if zero else params_local


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def weighted_kernels(layer: Layer, layout: Layout, ctx: Context) -> dict[str, list[Kernel]]:
    """Kernels of a layer with weights on the busiest device of ``layout`` (recomputed:
    the forward ones again in the backward)."""
    return _with_rerun(layer, ctx, _weighted_kernels(layer, layout, ctx))


def _weighted_kernels(layer: Layer, layout: Layout, ctx: Context) -> dict[str, list[Kernel]]:
    b = _ceil_div(ctx.batch, layout.pc)
    mode = base_mode(layout.mode)
    if layout.mode == "model-sp" and layer.embedding is not None:
        # split by vocabulary rows: every token of the batch block is looked up (masked)
        return layer_kernels(layer, b, ctx.elem_bytes)
    if mode in ("model", "column"):
        return layer_kernels(layer, b, ctx.elem_bytes, model_split=layout.pr)
    if mode == "row":
        return layer_kernels(layer, b, ctx.elem_bytes, input_split=layout.pr)
    if layout.mode == "domain":
        return layer_kernels(layer, b, ctx.elem_bytes, height_split=layout.pr)
    if layout.mode == "ulysses":
        return layer_kernels(layer, b, ctx.elem_bytes, height_split=layout.pr,
                             core_split=layout.pr)
    if layout.mode in EXPERT_MODES:
        samples, split = _expert_share(layout, ctx.batch)
        return layer_kernels(layer, samples, ctx.elem_bytes, height_split=split,
                             expert_split=layout.pr)
    return layer_kernels(layer, b, ctx.elem_bytes)


def follower_kernels(layer: Layer, dist: Dist, ctx: Context) -> dict[str, list[Kernel]]:
    """Kernels of a layer without weights on the distribution it computes on (recomputed:
    the forward ones again in the backward)."""
    b = _ceil_div(ctx.batch, dist.batch[1])
    n_h = dist.height[1] if dist.height else 1
    n_f = dist.feature[1] if dist.feature else 1
    return _with_rerun(layer, ctx, layer_kernels(layer, b, ctx.elem_bytes, height_split=n_h,
                                                 feature_split=n_f))


def time_kernels(kernels: dict[str, list[Kernel]], ctx: Context
                 ) -> tuple[float, float, str, float]:
    """(forward seconds, backward seconds, estimator labels, the seconds of the backward
    that compute weight gradients) of a layer's kernels."""
    flat = kernels["forward"] + kernels["backward_data"] + kernels["backward_weight"]
    if not flat:
        return 0.0, 0.0, "", 0.0
    times = ctx.estimator.estimate(flat, ctx.cluster.device, ctx.network.dtype)
    n_f = len(kernels["forward"])
    n_w = len(kernels["backward_weight"])
    fwd = float(times.seconds[:n_f].sum())
    bwd = float(times.seconds[n_f:].sum())
    wgt = float(times.seconds[len(flat) - n_w:].sum()) if n_w else 0.0
    labels = sorted(set(times.source))
    return fwd, bwd, ", ".join(labels), wgt


def local_params(layer: Layer, layout: Layout | None) -> float:
    """Parameter elements the busiest device holds for the layer: under model and column
    layouts its share of the output channels, features or heads, rounded up as the
    kernels are (12 heads over 8 devices: 2 on the busiest, as over 6); under row
    layouts its share of the input features and the whole bias."""
    if layout is None or layout.pr <= 1:
        return float(layer.params)
    pr = layout.pr
    mode = base_mode(layout.mode)
    emb = layer.embedding
    if layout.mode == "model-sp" and emb is not None:  # split by vocabulary rows
        return layer.params * _ceil_div(emb.vocab, pr) / emb.vocab
    m = layer.moe
    if m is not None and mode in ("model", "expert"):
        # the router whole; every expert's share of the hidden features, or 1/P_r of them
        if mode == "model":
            return float(m.router_weights + m.experts * m.expert_weights(_ceil_div(m.ffn, pr))
                         + m.shared_weights(pr))
        return float(m.router_weights + m.experts // pr * m.expert_weights()
                     + m.shared_weights())
    if mode in ("model", "column") and layer.has_weights:
        if layer.attention is not None:
            return float(layer.attention.weights(*layer.attention.held(pr)))
        # output channels, features or the embedding width: parameters alike per entry
        whole = layer.model_split_limit
        return layer.params * _ceil_div(whole, pr) / whole
    if mode == "row" and layer.linear is not None:
        lin = layer.linear
        bias = lin.out_features if lin.bias else 0
        return ((layer.params - bias) * _ceil_div(lin.in_features, pr) / lin.in_features
                + bias)
    return float(layer.params)
