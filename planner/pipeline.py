"""Pipeline parallelism: consecutive layers in stages, each on its own devices.

``planner plan --pipeline S --microbatches M`` splits the network into ``S`` stages of
consecutive layers and the ``P`` devices into ``S`` blocks of ``P/S`` consecutive ranks
(stage ``s`` on ranks ``s·P/S`` to ``(s+1)·P/S − 1``, whole nodes where ``P/S`` fills
them); a step's batch runs as ``M`` microbatches of ``B/M`` samples through the stages
under the 1F1B schedule (PipeDream-Flush: Narayanan et al., "Memory-efficient
pipeline-parallel DNN training", ICML 2021; the schedule Megatron-LM runs, Narayanan et
al., "Efficient large-scale language model training on GPU clusters using Megatron-LM",
SC 2021). Inside a stage the search plans every layer as it does a whole network (data,
model, domain, the ``P_r × P_c`` grid, Megatron's pairs), on ``P/S`` devices at the
microbatch size, with the stage's memory.

**Time.** A stage's forward pass ``F_s`` is one microbatch's forward through its layers
with the point-to-point send of the activation to the next stage; its backward pass
``B_s`` is the rest of the microbatch (the stage's compute and activation traffic, its
gradient reductions apart) with the return of its activation's gradient from the next
stage: each transfer between stages ``s`` and ``s + 1``, either way, is charged to stage
``s`` (the last stage is charged none, and a stage's input gradient is its
predecessor's). The chain of a microbatch through the stages carries every transfer
once whichever end pays it; which end does moves one transfer's time between adjacent
stages' loads, and so can move the busiest stage. The step is 1F1B's order
of passes simulated (:func:`one_f_one_b_finish`): stage ``s`` runs ``min(S − s − 1, M)``
forward passes, then a forward and a backward until the forwards run out, then the
backwards, each pass starting once its input is made. With equal stages it is
``(M + S − 1)·(F + B)``, the bubble ``(S − 1)/M`` of the Megatron-LM paper; with unequal
ones it can be well off the pipeline latency of Zheng et al., "Alpa", OSDI 2022, §5.2,
``Σ_s t_s + (M − 1)·max_s t_s``, which priced it before (a slow first stage that never
waits ends in ``M·t_0``). After the last
backward pass each stage reduces its weight gradients (the last microbatch's backward
overlaps them as without a pipeline) and steps its optimizer; the step ends when the
slowest stage's do (the global gradient norm Megatron-LM clips by needs every stage's).
A tied embedding and output head in different stages each keep a copy, and their
gradients are all-reduced between the two stages once a step, as Megatron-LM's
first and last stages do.

**Memory.** Under 1F1B stage ``s`` (from 0) has run the forward pass of
``min(S − s, M)`` microbatches before its first backward pass: it keeps their
activations at once (the first stage the most); GPipe would keep all ``M``.

**Stages.** A stage boundary falls where one tensor alone crosses it (between residual
blocks, not inside one), and every stage holds a layer with weights. The stages are
balanced by each layer's compute time on one device (its kernels at the microbatch
size, timed by the estimator) with a minimax
partition over the allowed boundaries, and once again by the stage times the search
found (a stage whose layouts communicate more gets fewer layers); the faster of the
two partitions is the plan.

**Interleaved stages.** With ``--virtual-stages V`` (Megatron-LM's interleaved 1F1B,
Narayanan et al. SC 2021 §2.2.2) the network is cut into ``V·S`` chunks of consecutive
layers and chunk ``c`` runs on stage ``c mod S``: each stage holds ``V`` model chunks
(chunk ``k`` of stage ``s`` is the network's ``k·S + s``-th). A microbatch crosses the
stages ``V`` times, so the fill and drain shrink ``V``-fold, to ``(S − 1)·t/V`` with
equal stages (the paper's bubble ``(1/V)·(S − 1)/M``), for ``V`` times the
point-to-point sends (the last stage's chunk sends on to the first stage's next). The
step is Megatron-LM's interleaved order of passes simulated as 1F1B's is.
The schedule needs ``M`` a multiple of ``S`` (the paper's condition). What a stage keeps
follows Megatron-LM's order of passes: stage ``s`` runs ``2·(S − s − 1) + (V − 1)·S``
chunk forward passes (at most ``M·V``) before its first backward pass, ``S`` microbatches
of a chunk at a time, then one forward and one backward; the activations it keeps are
the largest sum, over that order, of each chunk's kept activations times its
microbatches in flight (the first stage keeps ``S + (S − 1)/V`` stages' worth, the
``1 + (S − 1)/(S·V)`` factor of Korthikanti et al., "Reducing activation recomputation
in large transformer models", MLSys 2023). Each chunk is searched with ``1/V`` of the
device memory and its own most microbatches in flight, so a plan the search finds
fits; the stage's memory is then the sum of its chunks' weights, gradients, optimizer
state and kept activations, with the largest of their buffers and workspaces. A stage
ends its step when all its chunks have reduced their gradients and stepped (their
tails are added, none overlapped with another chunk's backward pass).

**Zero bubble.** ``--schedule zb-h1`` runs ZB-H1 (Qi et al., "Zero bubble (almost)
pipeline parallelism", ICLR 2024): each backward pass split into B (input gradients)
and W (weight gradients), 1F1B's order of F and B kept and the W passes run where the
stage would wait (:func:`zero_bubble_finish`, which simulates the schedule); every
stage keeps ``min(S, M)`` microbatches. With ``--tp-comm-overlap`` the input gradient's
reduce-scatter, which overlaps the weight gradient's GEMM otherwise, has no partner in
B (``Options.wgrad_deferred``).

Not modelled: ZB-H2, ZB-V and interleaved zero-bubble schedules, the overlap of the
point-to-point sends with compute (they are charged on the critical path), a layout
change between the last layer of one stage and the first of the next (the receiving
stage starts from whichever distribution its search prefers; Megatron-LM's
scatter-gather of the sent activation does the same), and stages of unequal device
counts.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .costs.comm import Group, collective_time
from .costs.layer import local_params, recompute_value
from .costs.memory import MemoryReport
from .errors import NoFeasiblePlan, UsageError
from .network import DTYPE_BYTES, Block, Layer, Network, layer_kernels
from .schedules import INTERLEAVED, SCHEDULE, SCHEDULES, ZERO_BUBBLE

#: re-balancing rounds by the stage times the search found
REBALANCE = 2


def cut_points(network: Network) -> list[int]:
    """Where a stage may start: the layer indices ``c`` (``0 < c < n``) such that no
    layer from ``c`` on reads a tensor made before layer ``c − 1`` (or the network
    input), so one tensor alone, layer ``c − 1``'s output, crosses the boundary."""
    n = len(network.layers)
    # the earliest tensor any layer at or after position c reads: a suffix minimum
    earliest = [n] * (n + 1)
    for layer in reversed(network.layers):
        earliest[layer.index] = min([earliest[layer.index + 1], *layer.inputs])
    return [c for c in range(1, n) if earliest[c] >= c - 1]


def stage_starts(network: Network) -> list[int]:
    """The boundaries a plan may use: :func:`cut_points` such that every stage holds a
    layer with weights (a stage of ReLUs and pools alone has nothing to lay out), and
    with ``--stage-boundaries layers`` only those between two copies of the network's
    repeat groups (a transformer's layers: Megatron-LM's stages hold whole ones, the
    token table with the first and the head with the last). Of the
    boundaries before the same next layer with weights, the last is kept (the layers
    without weights stay with the stage before); none before the first such layer or
    after the last."""
    weighted = [layer.index for layer in network.layers if layer.has_weights]
    if not weighted:
        return []
    nxt: list[int | None] = [None] * (len(network.layers) + 1)
    upcoming: int | None = None
    for i in range(len(network.layers) - 1, -1, -1):
        if network.layers[i].has_weights:
            upcoming = i
        nxt[i] = upcoming
    kept: dict[int, int] = {}
    cuts = cut_points(network)
    if network.stage_unit == "layers":  # between two copies of a repeat group only
        cp = network.copies
        cuts = [c for c in cuts if cp[c - 1] >= 0 and cp[c] >= 0 and cp[c - 1] != cp[c]]
    for c in cuts:
        w = nxt[c]
        if w is not None and w != weighted[0]:
            kept[w] = c  # ascending: the last boundary before w wins
    return sorted(kept.values())


def where_stages_start(network: Network) -> str:
    """Where a stage boundary may fall, for messages."""
    return "between copies of a repeat group (--stage-boundaries layers)" \
        if network.stage_unit == "layers" else "between residual blocks"


def chunk_recompute(value: str, blocks: int) -> str:
    """A recomputation setting as one stage (chunk) of ``blocks`` residual blocks takes
    it: ``N`` recomputes the first ``N`` blocks of each, as Megatron-LM's
    ``--recompute-num-layers`` does each pipeline stage's, all of them where it has
    fewer, and none where it has none (a chunk of the output head alone)."""
    if value == "none" or blocks == 0:
        return "none"
    if value.isdigit():
        return recompute_value(min(int(value), blocks), blocks)
    return value


def stage_network(network: Network, lo: int, hi: int) -> Network:
    """Layers ``lo`` to ``hi − 1`` as a network of their own: its input is layer
    ``lo − 1``'s output, whose gradient its layers compute for the stage before
    (:attr:`~planner.network.Layer.stage_input`), its loss only where it ends the
    network. A layer tied to one in another stage keeps a copy of the weight (it owns
    its parameters here)."""
    if not 0 <= lo < hi <= len(network.layers):
        raise ValueError(f"no stage {lo}:{hi}")
    names = {layer.name for layer in network.layers[lo:hi]}

    def index(i: int) -> int:
        return i - lo if i >= lo else -1

    layers: list[Layer] = []
    for layer in network.layers[lo:hi]:
        changes: dict[str, Any] = {"index": layer.index - lo,
                                   "inputs": tuple(index(i) for i in layer.inputs)}
        if any(0 <= i < lo for i in layer.inputs):  # made by the stage before
            changes["stage_input"] = True
        if layer.tied_to is not None and layer.tied_to not in names:
            changes["tied_to"] = None
            changes["params"] = layer.weight_elems
            if layer.linear is not None:
                changes["linear"] = dataclasses.replace(layer.linear, tied_to=None)
        layers.append(dataclasses.replace(layer, **changes))
    blocks = tuple(Block(b.name, index(b.input), tuple(i - lo for i in b.body),
                         tuple(i - lo for i in b.shortcut), b.add - lo)
                   for b in network.blocks if lo <= min(b.body) and b.add < hi)
    shape = network.input_shape if lo == 0 else network.layers[lo - 1].output_shape
    kind = network.input_kind if lo == 0 else \
        {3: "image", 2: "sequence", 1: "features"}[len(shape)]
    return Network(name=f"{network.name}[{lo}:{hi}]", dtype=network.dtype,
                   input_shape=shape, layers=tuple(layers), blocks=blocks,
                   input_kind=kind, loss=network.loss and hi == len(network.layers),
                   copies=network.copies[lo:hi], recompute_unit=network.recompute_unit,
                   loss_upcast=network.loss_upcast)


def layer_seconds(network: Network, ctx: Any, batch: int) -> np.ndarray:
    """Each layer's forward and backward kernels on one device at ``batch`` samples, by
    the estimator: what the first partition balances."""
    kernels: list[Any] = []
    owners: list[int] = []
    for layer in network.layers:
        prods = layer_kernels(layer, batch, network.elem_bytes)
        flat = prods["forward"] + prods["backward_data"] + prods["backward_weight"]
        kernels.extend(flat)
        owners.extend([layer.index] * len(flat))
    out = np.zeros(len(network.layers))
    if kernels:
        secs = ctx.estimator.estimate(kernels, ctx.cluster.device, network.dtype).seconds
        np.add.at(out, np.array(owners), secs)
    return out


def balance(weights: np.ndarray, cuts: list[int], stages: int) -> list[int] | None:
    """The stage boundaries ``[0, c_1, …, c_{S−1}, n]`` (each ``c`` in ``cuts``) whose
    heaviest stage is lightest, to a relative 1e-9 (None: fewer than ``S − 1``
    boundaries exist). For a limit, cutting each stage at the last boundary that keeps
    it under the limit uses the fewest stages; the least limit that needs no more than
    ``S`` is bisected, and a partition with fewer is split at its heaviest stages."""
    n = len(weights)
    if len(cuts) < stages - 1:
        return None
    prefix = np.concatenate([[0.0], np.cumsum(np.maximum(weights, 0.0))])
    allowed = np.array([*cuts, n])
    reach = prefix[allowed]

    def greedy(limit: float) -> list[int] | None:
        bounds = [0]
        while bounds[-1] < n:
            start = bounds[-1]
            k = int(np.searchsorted(reach, prefix[start] + limit, side="right")) - 1
            if k < 0 or allowed[k] <= start:
                return None
            bounds.append(int(allowed[k]))
            if len(bounds) - 1 > stages:
                return None
        return bounds

    lo, hi = 0.0, float(prefix[-1])
    best = greedy(hi)
    for _ in range(200):
        if hi - lo <= 1e-9 * max(hi, 1e-300):
            break
        mid = (lo + hi) / 2
        got = greedy(mid)
        if got is not None:
            best, hi = got, mid
        else:
            lo = mid
    if best is None:
        return None
    return _split_to(best, cuts, stages, prefix)


def by_count(cuts: list[int], n: int, chunks: int) -> list[int] | None:
    """Boundaries ``[0, c_1, …, n]`` giving every chunk the same number of the segments
    between cuts (residual blocks), those one short at both ends first, where the
    embedding and the head add their work: Megatron-LM's even split of the layers
    (None: fewer segments than chunks). Interleaved stages sum their chunks, and
    :func:`balance`'s lightest heaviest chunk leaves the slack to the last chunk, so
    that every other stage is heavier than an even split makes it (Llama 3 405B, 64
    chunks: 5.69 s a step against 5.60 s)."""
    segs = len(cuts) + 1
    if segs < chunks:
        return None
    base, extra = divmod(segs, chunks)
    short = chunks - extra  # chunks of base segments; the rest base + 1
    ends_first = sorted(range(chunks), key=lambda c: (min(c, chunks - 1 - c), c))
    shorter = set(ends_first[:short])
    sizes = [base + (0 if c in shorter else 1) for c in range(chunks)]
    starts = [0, *cuts]
    bounds, k = [0], 0
    for size in sizes[:-1]:
        k += size
        bounds.append(starts[k])
    return [*bounds, n]


def _split_to(best: list[int], cuts: list[int], stages: int, prefix: np.ndarray
              ) -> list[int] | None:
    """A partition with fewer stages than asked (a light tail) split at its heaviest
    stages until it has ``stages`` (None: no boundary is left inside any)."""
    while len(best) - 1 < stages:
        heavy = sorted(range(len(best) - 1),
                       key=lambda k: (-(prefix[best[k + 1]] - prefix[best[k]]), k))
        for k in heavy:
            inside = [c for c in cuts if best[k] < c < best[k + 1]]
            if inside:
                half = (prefix[best[k]] + prefix[best[k + 1]]) / 2
                best = sorted([*best, min(inside, key=lambda c: (abs(prefix[c] - half), c))])
                break
        else:
            return None
    return best


def p2p_seconds(cluster: Any, first: int, size: int, nbytes: float,
                to: int | None = None) -> float:
    """One message of ``nbytes`` from every rank of the stage on ranks ``first`` to
    ``first + size − 1`` to its peer in the stage starting at rank ``to`` (default: the
    next, ``size`` ranks on), all at once: over the nodes' network where any peer is on
    another node, else inside the node."""
    if nbytes <= 0:
        return 0.0
    g = cluster.devices_per_node
    shift = size if to is None else to - first
    across = any((r // g) != ((r + shift) // g) for r in range(first, first + size))
    link = cluster.inter if across else cluster.intra
    return float(link.latency_s) + float(nbytes) / float(link.bandwidth)


@dataclass
class Stage:
    """One stage as planned (with interleaved stages: one model chunk of a stage)."""

    index: int  #: the pipeline stage: the devices it runs on
    lo: int  #: its first layer in the network
    hi: int  #: one past its last
    first_rank: int
    devices: int
    inflight: int  #: microbatches whose activations it keeps at once
    question: Any  #: the stage's question (network, options, context)
    result: Any  #: its SearchResult
    send_s: float  #: per microbatch: the activation sent on and its gradient returned
    chunk: int = 0  #: the model chunk of its stage (0 without interleaving)

    @property
    def evaluation(self) -> Any:
        return self.result.best.evaluation

    @property
    def microbatch_s(self) -> float:
        """``t_s``: one microbatch through the stage, its sends included."""
        return float(self.evaluation.microbatch_s) + self.send_s

    @property
    def forward_pass_s(self) -> float:
        """F: one microbatch's forward pass through the stage, its collectives and the
        send of its activation on included."""
        return float(self.evaluation.forward_s) + self.send_s / 2

    @property
    def weight_pass_s(self) -> float:
        """W: the kernels of one microbatch's backward pass that compute weight
        gradients."""
        return float(self.evaluation.weight_compute_s)

    @property
    def backward_pass_s(self) -> float:
        """B: the rest of the backward pass (input gradients, its collectives, the
        return of its activation's gradient from the next stage)."""
        return self.microbatch_s - self.forward_pass_s - self.weight_pass_s

    def passes(self, schedule: str) -> tuple[float, ...]:
        """The passes ``schedule`` runs for one microbatch (named by
        :data:`~planner.schedules.PASSES`): F and B, or ZB-H1's F, B and W."""
        if schedule == ZERO_BUBBLE:
            return self.forward_pass_s, self.backward_pass_s, self.weight_pass_s
        return self.forward_pass_s, self.microbatch_s - self.forward_pass_s

    @property
    def tail_s(self) -> float:
        """What the stage does once a step after its last backward pass: the exposed
        gradient reductions and the optimizer step."""
        ev = self.evaluation
        m = int(self.question.options.microbatches)
        return max(0.0, float(ev.time_s) - m * float(ev.microbatch_s))


@dataclass
class PipelineResult:
    """A pipelined plan: its stages (model chunks, in the network's order, with
    interleaving), and the step they make."""

    stages: list[Stage]
    microbatches: int
    time_s: float
    bubble_s: float
    ties_s: float  #: tied weights' gradient all-reduces between stages, once a step
    partitions: list[dict[str, Any]]  #: every partition tried and its time
    #: each pipeline stage's memory per device (all its chunks')
    memories: list[MemoryReport] = dataclasses.field(default_factory=list)
    virtual: int = 1  #: model chunks a stage
    schedule: str = SCHEDULE  #: the schedule priced (with ``virtual > 1``: interleaved)
    #: memory turned something down on the way: a chunk's search found something
    #: faster that did not fit (:attr:`~planner.search.SearchResult.memory_bound`) or had
    #: no plan, or a partition did not fit; a ZeRO stage that keeps less might then give
    #: a faster step (``--zero auto`` over a pipeline; callers that try more add theirs)
    memory_bound: bool = False

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memories)

    @property
    def peak_bytes(self) -> float:
        """The busiest stage's peak memory per device."""
        return max(float(m.peak) for m in self.memories)

    @property
    def fullest(self) -> int:
        """The pipeline stage with the highest peak (the first on a tie)."""
        return max(range(len(self.memories)), key=lambda k: (self.memories[k].peak, -k))


def _tie_seconds(network: Network, stages: list[Stage]) -> float:
    """All-reduces of a tied weight's gradient between the stages that keep a copy."""
    where = {}
    for st in stages:
        for layer in network.layers[st.lo:st.hi]:
            where[layer.name] = st
    total = 0.0
    cluster = stages[0].question.cluster
    for owner, tied in network.ties.items():
        own = where[network.layers[owner].name]
        for t in tied:
            other = where[network.layers[t].name]
            if other.index == own.index:
                continue  # one stage's chunks: its copies are its own
            rec = next(r for r in own.evaluation.layers
                       if r.layer.name == network.layers[owner].name)
            nbytes = local_params(rec.layer, rec.layout) * DTYPE_BYTES[
                own.question.options.grad_dtype or network.dtype]
            g = cluster.devices_per_node
            same = own.first_rank // g == other.first_rank // g
            group = Group(2, 2 if same else 1)
            total += collective_time("all_reduce", float(nbytes), group, cluster,
                                     own.question.options.algorithm)[0]
    return total


def _compose(network: Network, stages: list[Stage], microbatches: int, virtual: int = 1,
             schedule: str = SCHEDULE) -> tuple[float, float, float]:
    """(step time, bubble, tie reductions) of planned stages (model chunks)."""
    count = len(stages) // virtual
    t = [sum(c.microbatch_s for c in stages if c.index == s) for s in range(count)]
    tails = [sum(c.tail_s for c in stages if c.index == s) for s in range(count)]
    busiest = max(t)
    ties = _tie_seconds(network, stages)
    passes = [st.passes(schedule) for st in stages]
    if schedule == ZERO_BUBBLE:
        span = max(zero_bubble_finish(passes, microbatches))
    else:
        span = max(one_f_one_b_finish(passes, count, virtual, microbatches))
    return span + max(tails) + ties, span - microbatches * busiest, ties


def schedule(stages: int, virtual: int, microbatches: int, stage: int
             ) -> list[tuple[str, int]]:
    """The order of one stage's passes under Megatron-LM's 1F1B schedules: ``("F" or
    "B", model chunk)``. Without interleaving stage ``s`` runs ``min(S − s − 1, M)``
    forward passes, then one forward and one backward until the forwards run out, then
    the remaining backwards. Interleaved, it runs ``2·(S − s − 1) + (V − 1)·S`` chunk
    forwards first (at most all ``M·V``), through the chunks ``S`` microbatches at a
    time (forwards from chunk 0 up, backwards from chunk ``V − 1`` down)."""
    total = microbatches * virtual
    if virtual == 1:
        warm = min(stages - stage - 1, total)
    else:
        warm = min(2 * (stages - stage - 1) + (virtual - 1) * stages, total)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (stages * virtual)) // stages
        return c if forward else virtual - 1 - c

    order = [("F", chunk(k, True)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", chunk(warm + k, True)), ("B", chunk(k, False))]
    order += [("B", chunk(k, False)) for k in range(total - warm, total)]
    return order


def one_f_one_b_finish(passes: Sequence[tuple[float, ...]], stages: int, virtual: int,
                       microbatches: int) -> list[float]:
    """When each stage ends its last pass under Megatron-LM's 1F1B (interleaved with
    ``virtual`` model chunks a stage), from each chunk's ``(F, B)`` seconds for one
    microbatch, the chunks in the network's order (chunk ``c`` on stage ``c mod S``).

    Every stage runs its passes in :func:`schedule`'s order; its ``n``-th forward (or
    backward) pass is of microbatch ``⌊n / (S·V)⌋·S + n mod S`` (the interleaved
    schedule runs ``S`` microbatches of a chunk at a time; without interleaving, the
    ``n``-th). A forward pass of chunk ``c`` waits for chunk ``c − 1``'s of the same
    microbatch, a backward pass for chunk ``c + 1``'s (the last chunk's for its own
    forward). With equal stages this is ``(M + S − 1)·(F + B)`` without interleaving
    and ``M·V·(F + B) + (S − 1)·(F + B)`` interleaved with ``M`` a multiple of ``S``
    (the bubbles of Narayanan et al., SC 2021, §2.2)."""
    return _run_orders(passes, stages, virtual, microbatches)


#: ``fill(stage, kind, clock, ready, made)``: the stage's clock once it has used the wait
#: before its next pass (of ``kind``, whose input is made at ``ready``; ``made``: the F and
#: B passes the stage has run)
Fill = Callable[[int, str, float, float, dict[str, int]], float]


def _run_orders(passes: Sequence[tuple[float, ...]], stages: int, virtual: int,
                microbatches: int, fill: Fill | None = None) -> list[float]:
    """Each stage's clock after its last F or B pass of :func:`schedule`'s order (see
    :func:`one_f_one_b_finish`), ``fill`` run before each pass."""
    count, v, m = stages, virtual, microbatches
    chunks = count * v
    assert len(passes) == chunks, (len(passes), chunks)
    orders = [schedule(count, v, m, s) for s in range(count)]
    end = {"F": [[math.nan] * m for _ in range(chunks)],
           "B": [[math.nan] * m for _ in range(chunks)]}
    clock = [0.0] * count
    step = [0] * count
    made = [{"F": 0, "B": 0} for _ in range(count)]
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(count):
            while step[s] < len(orders[s]):
                kind, k = orders[s][step[s]]
                n = made[s][kind]
                j = (n // chunks) * count + n % count
                c = k * count + s
                if kind == "F":
                    ready = 0.0 if c == 0 else end["F"][c - 1][j]
                else:
                    ready = end["F"][c][j] if c == chunks - 1 else end["B"][c + 1][j]
                if math.isnan(ready):
                    break  # its input is not made yet: another stage first
                if fill is not None:
                    clock[s] = fill(s, kind, clock[s], ready, made[s])
                clock[s] = max(clock[s], ready) + passes[c][0 if kind == "F" else 1]
                end[kind][c][j] = clock[s]
                made[s][kind] += 1
                step[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise AssertionError("the 1F1B orders wait on each other")
    return clock


def zero_bubble_finish(passes: Sequence[tuple[float, ...]], microbatches: int
                       ) -> list[float]:
    """When each stage ends its last pass under ZB-H1 (Qi et al., "Zero bubble (almost)
    pipeline parallelism", ICLR 2024, §2.1), from each stage's ``(F, B, W)`` seconds
    for one microbatch (``B`` the input gradients, ``W`` the weight gradients).

    Every stage runs the forward (F) and backward (B) passes in 1F1B's order
    (:func:`schedule`); ``F`` of microbatch ``k`` waits for the stage before's, ``B``
    for the stage after's (the last stage's for its own ``F``). A microbatch's ``W``
    may run any time after its ``B``: the stage runs its pending ``W`` passes, oldest
    first, while it would otherwise wait for its next pass's input; before a forward
    pass that would hold more than ``min(S, M)`` microbatches not yet through ``W`` (the
    most 1F1B's first stage holds); and after its last ``B``. With the same passes on
    every stage, ``W ≤ F`` and ``M ≥ S`` this is the paper's ZB-H1: a step of
    ``M·(F + B + W) + (S − 1)·(F + B − W)`` against 1F1B's ``(M + S − 1)·(F + B + W)``
    (its Table 2; a third of 1F1B's bubble when the three passes take as long).

    Two ways of filling a wait are run and the one that ends sooner kept (the first on
    a tie), as the paper's own scheduler tries
    variants of its greedy order: a ``W`` whenever the stage would wait, even one that
    outlasts the wait and so delays the next pass (as 1F1B's ``W`` right after its
    ``B`` does: never slower than 1F1B), or only a ``W`` that ends within the wait."""
    runs = [_zero_bubble_run(passes, microbatches, overrun) for overrun in (True, False)]
    return min(runs, key=lambda ends: max(ends))


def _zero_bubble_run(passes: Sequence[tuple[float, ...]], microbatches: int,
                     overrun: bool) -> list[float]:
    """:func:`zero_bubble_finish` with one way of filling a wait (``overrun``: any
    ``W`` while the stage would wait; else only one that ends in time)."""
    count = len(passes)
    cap = min(count, microbatches)
    weights = [0] * count  # the W passes each stage has run

    def fill(s: int, kind: str, clock: float, ready: float, made: dict[str, int]
             ) -> float:
        w = passes[s][2]
        while kind == "F" and made["F"] - weights[s] >= cap and weights[s] < made["B"]:
            clock += w
            weights[s] += 1
        while weights[s] < made["B"] and (clock < ready if overrun else clock + w <= ready):
            clock += w
            weights[s] += 1
        return clock

    ends = _run_orders([(f, b) for f, b, _ in passes], count, 1, microbatches, fill)
    return [ends[s] + (microbatches - weights[s]) * passes[s][2] for s in range(count)]


def in_flight(stages: int, virtual: int, microbatches: int, stage: int
              ) -> list[tuple[int, ...]]:
    """Each model chunk's microbatches in flight (run forward, not yet backward) after
    each forward pass of :func:`schedule`: the moments a stage's memory peaks."""
    held = [0] * virtual
    states: list[tuple[int, ...]] = []
    for kind, c in schedule(stages, virtual, microbatches, stage):
        held[c] += 1 if kind == "F" else -1
        if kind == "F":
            states.append(tuple(held))
    return states


def stage_memory(chunks: list[Stage], states: list[tuple[int, ...]], capacity: float
                 ) -> MemoryReport:
    """A stage's memory per device from its chunks' (in chunk order): their weights,
    gradients and optimizer state added, their kept activations at the moment of the
    schedule (``states``, from :func:`in_flight`) when they add up to most, plus the
    largest working set one chunk's backward pass adds (a rebuilt block), and the
    largest buffers and workspace. One chunk: its own report."""
    mems: list[MemoryReport] = [c.evaluation.memory for c in chunks]
    if len(chunks) == 1:
        return mems[0]
    kept = [float(m.kept) for m in mems]
    extra = max(max(0.0, float(m.activations) - c.inflight * float(m.kept))
                for m, c in zip(mems, chunks, strict=True))
    held = max(sum(n * k for n, k in zip(state, kept, strict=True)) for state in states)
    return MemoryReport(
        weights=sum(m.weights for m in mems),
        gradients=sum(m.gradients for m in mems),
        optimizer=sum(m.optimizer for m in mems),
        activations=held + extra,
        comm_buffers=max(m.comm_buffers for m in mems),
        workspace=max(m.workspace for m in mems),
        capacity=capacity,
        rebuilt=tuple(r for m in mems for r in m.rebuilt),
        kept=sum(kept),
    )


def search_pipeline(q: Any, stages: int, objective: str, pins: tuple[str, ...],
                    run: Callable[[Any, str, tuple[str, ...]], Any],
                    context: Callable[[Network, Any], Any], virtual: int = 1,
                    schedule: str = SCHEDULE) -> PipelineResult:
    """The best pipelined plan with ``stages`` stages of ``virtual`` model chunks
    under ``schedule`` (raises NoFeasiblePlan): ``run(question, objective, pins)``
    searches one chunk's question, ``context(net, options)`` builds its cost context."""
    return _pipeline(q, stages, lambda sq, lo: run(sq, objective, pins), context,
                     virtual=virtual, schedule=schedule, reuse=not pins, ahead=True)


@dataclass
class Fixed:
    """A stage priced with given layouts (``cost``, ``check``), in the shape of a
    search's result: its one candidate is its best."""

    evaluation: Any
    notes: list[str] = dataclasses.field(default_factory=list)
    explored: int = 1

    @property
    def best(self) -> Fixed:
        return self


def price_pipeline(q: Any, stages: int, layouts: dict[int, Any],
                   price: Callable[[Any, dict[int, Any]], Any],
                   context: Callable[[Network, Any], Any],
                   bounds: list[int] | None = None, virtual: int = 1,
                   schedule: str = SCHEDULE) -> PipelineResult:
    """Given layouts in ``stages`` stages of ``virtual`` model chunks: ``layouts`` maps
    every layer with weights (by its index in the whole network) to a layout on ``P/S``
    devices, ``price(question, assignment)`` prices one chunk's question (it may replace
    the question's context and options, as ``--zero auto`` does). With ``bounds``
    (``[0, c_1, …, n]``, one boundary per chunk, from a plan) the chunks are those; else
    they are balanced as the search balances them, and the fastest partition that fits
    is taken (the leanest when none does)."""

    def run(sq: Any, lo: int) -> Fixed:
        n = len(sq.network.layers)
        return Fixed(price(sq, {i - lo: lay for i, lay in layouts.items()
                                if lo <= i < lo + n}))

    return _pipeline(q, stages, run, context, bounds, must_fit=False, virtual=virtual,
                     schedule=schedule)


def chunk_signature(network: Network) -> tuple[Any, ...]:
    """What a chunk's search sees of it, its layers' and blocks' names left out (ties
    and block membership by position): two chunks of one signature (a transformer's
    middle stages) are the same question, whose answer is the same layouts by
    position."""
    position = {layer.name: layer.index for layer in network.layers}
    block = {b.name: str(i) for i, b in enumerate(network.blocks)}

    def tie(name: str | None) -> str | None:
        return None if name is None else f"#{position.get(name, -1)}"

    layers = tuple(dataclasses.replace(
        layer, name="", path="", block=None if layer.block is None else block[layer.block],
        tied_to=tie(layer.tied_to),
        linear=None if layer.linear is None else
        dataclasses.replace(layer.linear, tied_to=tie(layer.linear.tied_to)))
        for layer in network.layers)
    blocks = tuple(dataclasses.replace(b, name="") for b in network.blocks)
    # which blocks recompute with the one before them
    units = tuple(network.unit_of[b.name] == network.unit_of[a.name]
                  for a, b in itertools.pairwise(network.blocks))
    return (network.dtype, network.input_shape, network.input_kind, network.loss,
            network.loss_upcast, layers, blocks, units)


def _pipeline(q: Any, stages: int, run: Callable[[Any, int], Any],
              context: Callable[[Network, Any], Any], bounds: list[int] | None = None,
              must_fit: bool = True, virtual: int = 1, schedule: str = SCHEDULE,
              reuse: bool = False, ahead: bool = False) -> PipelineResult:
    """Stages (``virtual`` model chunks each) planned by ``run(chunk question, first
    layer)``, over the partitions balancing finds (or ``bounds``); the fastest that fits
    (``must_fit``: else NoFeasiblePlan; otherwise the leanest when none fits). With
    ``reuse`` (a search without pins, which match layers by name) a chunk that asks the
    question another chunk asked (:func:`chunk_signature`, its devices and microbatches
    in flight) takes that chunk's answer, its layouts by position and the settings its
    search chose, evaluated on its own layers, instead of being searched again. With
    ``ahead`` (``run`` is a search) and several jobs (:mod:`planner.parallel`), the
    chunks of a partition that search questions of their own run at once, each in a
    worker."""
    net = q.network
    opts = q.options
    p, m = opts.gpus, opts.microbatches
    if p % stages:
        raise UsageError(f"planner: error: --pipeline {stages} does not divide the "
                         f"{p} devices into equal stages; use a divisor of {p}")
    virtual_check(net, stages, virtual, m)
    schedule_check(virtual, schedule)
    size = p // stages
    chunks = stages * virtual
    cuts = stage_starts(net)
    if len(cuts) < chunks - 1:
        raise UsageError(
            f"planner: error: --pipeline {stages}: '{net.name}' has "
            f"{len(cuts) + 1} place{'s' if len(cuts) else ''} to start a stage (stage "
            f"boundaries fall where one tensor alone crosses, {where_stages_start(net)}, "
            "and every stage needs a layer with weights); use "
            f"at most {len(cuts) + 1} stages")
    if bounds is not None:
        assert len(bounds) == chunks + 1 and set(bounds[1:-1]) <= set(cuts), bounds
    # ZB-H1 holds up to min(S, M) microbatches on every stage, those run forward and
    # not yet through W (a W keeps the inputs of the layers with weights and their
    # output gradients: about what a transformer block keeps for its backward pass)
    held: tuple[int, ...] = (min(stages, m),)
    states = [in_flight(stages, virtual, m, s) for s in range(stages)] \
        if schedule != ZERO_BUBBLE else [[held] for _ in range(stages)]
    # each chunk keeps its own most microbatches at once, in its share of the memory
    most = [[max(st[k] for st in states[s]) for k in range(virtual)] for s in range(stages)]
    cluster = q.cluster
    if virtual > 1:
        cluster = dataclasses.replace(
            cluster, reserved_memory=cluster.reserved_memory
            + cluster.capacity_bytes * (virtual - 1) / virtual)
    weights = layer_seconds(net, q.ctx, opts.batch)
    planned: dict[tuple[int, int, int], Stage] = {}
    failures: dict[tuple[int, int, int], NoFeasiblePlan] = {}
    answered: dict[tuple[Any, ...], Stage] = {}  # a question's first answer (reuse)

    def answer(sq: Any, lo: int, key: tuple[Any, ...],
               searched: Callable[[], Any] | None = None) -> Any:
        """``run``'s result for a chunk question (``searched()``'s where it ran in a
        worker), or (``reuse``) the answer to the same question asked by another
        chunk, re-evaluated on this one's layers."""
        from .evaluate import evaluate

        same = answered.get(key) if reuse else None
        if same is None:
            if searched is None:
                return run(sq, lo)
            result, sq.ctx, sq.options = searched()  # as run leaves its question
            return result
        sq.ctx = dataclasses.replace(same.question.ctx, network=sq.network)
        sq.options = same.question.options
        assignment = {r.layer.index: r.layout for r in same.evaluation.layers
                      if r.follows is None and r.layer.has_weights}
        return Fixed(evaluate(sq.ctx, sq.options, assignment), list(same.result.notes), 0)

    asked: dict[tuple[int, int, int], tuple[Any, tuple[Any, ...]]] = {}

    def ask(c: int, lo: int, hi: int) -> tuple[Any, tuple[Any, ...]]:
        """Chunk ``c``'s question (layers ``lo:hi``) and its key for ``reuse``."""
        key = (c, lo, hi)
        if key not in asked:
            s, k = c % stages, c // stages
            sub = stage_network(net, lo, hi)
            # a stage whose first rank does not begin a node has groups that cross
            # nodes where stage 0's do not (ranks 6-11 of 8-GPU nodes: 2 + 4)
            sopts = dataclasses.replace(opts, gpus=size, first_rank=s * size,
                                        run_gpus=opts.run_gpus or opts.gpus,
                                        inflight=most[s][k],
                                        recompute=chunk_recompute(
                                            opts.recompute, len(sub.recompute_units)),
                                        wgrad_deferred=schedule == ZERO_BUBBLE)
            ctx = context(sub, sopts)
            if virtual > 1:
                ctx = dataclasses.replace(ctx, cluster=cluster)
            sq = dataclasses.replace(q, network=sub, options=sopts, ctx=ctx, cluster=cluster)
            asked[key] = sq, (chunk_signature(sub), most[s][k], ctx.rank_offset) \
                if reuse else ()
        return asked[key]

    def plan_stage(c: int, lo: int, hi: int, searched: Callable[[], Any] | None = None
                   ) -> Stage:
        key = (c, lo, hi)
        s, k = c % stages, c // stages
        if key in failures:
            raise failures[key]
        hit = planned.get(key)
        if hit is None:
            sq, key_q = ask(c, lo, hi)
            sopts = sq.options
            try:
                result = answer(sq, lo, key_q, searched)
            except NoFeasiblePlan as exc:
                what = f"pipeline stage {s}" if virtual == 1 else \
                    f"pipeline stage {s}, model chunk {k}"
                share = "" if virtual == 1 else f" with 1/{virtual} of their memory"
                failures[key] = NoFeasiblePlan(
                    f"planner: no feasible plan for {what} (layers "
                    f"'{net.layers[lo].name}' to '{net.layers[hi - 1].name}', "
                    f"{size} devices{share}): {str(exc).removeprefix('planner: ')}", None)
                raise failures[key] from None
            send = 0.0
            if hi < len(net.layers):
                last = result.best.evaluation.layers[-1]
                from .evaluate import local_elems

                nbytes = local_elems(last.layer.out_elems, last.dist_out, sopts.batch,
                                     last.layer.out_rows) * \
                    net.elem_bytes
                send = 2 * p2p_seconds(sq.cluster, s * size, size, nbytes,
                                       ((c + 1) % stages) * size)
            hit = planned[key] = Stage(s, lo, hi, s * size, size, sopts.inflight, sq,
                                       result, send, k)
            if reuse:
                answered.setdefault(key_q, hit)
        return hit

    def plan_partition(part: list[int]) -> list[Stage]:
        """Every chunk's plan, in order (the first failure raised); with ``ahead``, the
        chunks that search a question of their own (not planned, not failed, not the
        question an earlier chunk asks) in workers at once."""
        from .parallel import Ahead, jobs

        keys = [(c, part[c], part[c + 1]) for c in range(chunks)]
        own = [False] * chunks
        if ahead and jobs() > 1:
            earlier: set[tuple[Any, ...]] = set()
            for c, key in enumerate(keys):
                if key in planned or key in failures:
                    continue
                key_q = ask(*key)[1]
                own[c] = not reuse or (key_q not in answered and key_q not in earlier)
                earlier.add(key_q)
        if sum(own) < 2:
            return [plan_stage(*key) for key in keys]

        def search(c: int) -> tuple[Any, Any, Any]:
            sq = ask(*keys[c])[0]
            result = run(sq, keys[c][1])
            return result, sq.ctx, sq.options  # run leaves its choices in its question

        def refs(c: int) -> list[Any]:
            """What a chunk's result holds of the parent's: by reference."""
            sq = ask(*keys[c])[0]
            return [sq.network, *sq.network.layers, *sq.network.blocks, sq.cluster,
                    q.cluster, sq.ctx, sq.ctx.cluster, sq.ctx.estimator, sq.options, net,
                    *net.layers, *net.blocks]

        out: list[Stage] = []
        with Ahead(chunks, lambda c: lambda: search(c), may_run=lambda c: own[c],
                   shared=refs) as workers:
            for c, key in enumerate(keys):
                if own[c]:
                    out.append(plan_stage(*key, searched=functools.partial(workers.get, c)))
                else:
                    workers.skip(c)
                    out.append(plan_stage(*key))
        return out

    tried: list[dict[str, Any]] = []
    best: PipelineResult | None = None
    leanest: PipelineResult | None = None
    error: NoFeasiblePlan | None = None
    seen: set[tuple[int, ...]] = set()

    def partitions() -> Iterator[list[int]]:
        """``bounds``; or the balancing rounds (each on the weights the last left) until
        one repeats, then, interleaved, Megatron-LM's even split (:func:`by_count`)."""
        if bounds is not None:
            yield bounds
            return
        for _ in range(REBALANCE + 1):
            part = balance(weights, cuts, chunks)
            if part is None or tuple(part) in seen:
                break
            yield part
        even = by_count(cuts, len(net.layers), chunks) if virtual > 1 else None
        if even is not None and tuple(even) not in seen:
            yield even

    for part in partitions():
        seen.add(tuple(part))
        try:
            plans = plan_partition(part)
        except NoFeasiblePlan as exc:
            tried.append({"bounds": part, "time_s": None,
                          "outcome": str(exc).removeprefix("planner: ")})
            error = error or exc
            # a chunk that does not fit: lighten it (its layers count double)
            for c in range(chunks):
                if (c, part[c], part[c + 1]) in failures:
                    weights[part[c]:part[c + 1]] *= 2
            continue
        time, bubble, ties = _compose(net, plans, m, virtual, schedule)
        memories = [stage_memory([st for st in plans if st.index == s], states[s],
                                 q.cluster.capacity_bytes) for s in range(stages)]
        cand = PipelineResult(plans, m, time, bubble, ties, [], memories, virtual,
                              schedule if virtual == 1 else INTERLEAVED)
        tried.append({"bounds": part, "time_s": time,
                      "outcome": "plan" if cand.fits else "does not fit"})
        if cand.fits and (best is None or time < best.time_s):
            best = cand
        if leanest is None or cand.peak_bytes < leanest.peak_bytes:
            leanest = cand
        # re-weigh each chunk's layers by the time the search found for it
        for st in plans:
            own = float(weights[st.lo:st.hi].sum())
            if own > 0:
                weights[st.lo:st.hi] *= st.microbatch_s / own
    if best is None and not must_fit:
        best = leanest
    if best is None:
        if error is not None:
            raise error
        raise NoFeasiblePlan(f"planner: no feasible plan with {stages} pipeline stages: "
                             "no stage partition fits in memory", None)
    best.partitions = tried
    best.memory_bound = bool(failures) or any(t["outcome"] != "plan" for t in tried) or \
        any(getattr(st.result, "memory_bound", False) for st in planned.values())
    return best


def virtual_check(network: Network, stages: int, virtual: int, microbatches: int,
                  option: str = "--virtual-stages", counts: str = "--microbatches") -> None:
    """UsageError unless ``virtual`` model chunks a stage make an interleaved schedule:
    a pipeline to interleave, ``M`` a multiple of ``S``, and ``V·S`` chunks the network
    can be cut into."""
    if virtual == 1:
        return
    if stages == 1:
        raise UsageError(f"planner: error: {option} {virtual} interleaves the stages of a "
                         "pipeline; give --pipeline 2 or more")
    if microbatches % stages:
        raise UsageError(
            f"planner: error: {option} {virtual}: the interleaved schedule runs the "
            f"microbatches {stages} at a time through each stage's chunks, so {counts} "
            f"must be a multiple of the {stages} stages (got {microbatches})")
    most = max_stages(network)
    if stages * virtual > most:
        raise UsageError(
            f"planner: error: {option} {virtual}: {stages} stages of {virtual} chunks "
            f"are {stages * virtual} chunks, and '{network.name}' can be cut into at most "
            f"{most} (a boundary falls where one tensor alone crosses, "
            f"{where_stages_start(network)}, and every chunk needs a layer with weights)")


def schedule_check(virtual: int | str, schedule: str) -> None:
    """UsageError unless ``schedule`` can run ``virtual`` model chunks a stage (``auto``:
    several)."""
    if schedule not in SCHEDULES:
        raise UsageError(f"planner: error: --schedule {schedule}: the schedules are "
                         f"{', '.join(SCHEDULES)}")
    if schedule == ZERO_BUBBLE and virtual != 1:
        raise UsageError(f"planner: error: --schedule {schedule} runs one model chunk a "
                         f"stage; drop --virtual-stages {virtual} or use --schedule "
                         f"{SCHEDULE} (interleaved)")


def given_bounds(network: Network, names: list[str], chunks: int) -> list[int]:
    """The chunk boundaries ``[0, c_1, …, n]`` that stages (chunks) starting at the
    layers ``names`` make (ValueError, with what to fix and the position at fault as
    ``args[1]``, unless there are ``chunks − 1`` of them, in the network's order, each
    a place a stage may start)."""
    allowed = stage_starts(network)
    index = {layer.name: layer.index for layer in network.layers}
    bounds = [0]
    for k, name in enumerate(names):
        at = index.get(name)
        if at is None:
            # a block's or a repeat's name: the first of its layers a stage may start at
            inside = [layer.index for layer in network.layers
                      if layer.name.startswith(name + ".")]
            first = next((i for i in inside if i in allowed), None)
            hint = f"; its first layer a stage may start at is " \
                f"'{network.layers[first].name}'" if first is not None else ""
            if not inside:
                import difflib

                close = difflib.get_close_matches(name, list(index), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"'{name}' is not a layer of '{network.name}'{hint}", k)
        if at not in allowed:
            near = sorted(allowed, key=lambda c: (abs(c - at), c))[:3]
            raise ValueError(
                f"a stage cannot start at '{name}': a stage starts where one tensor alone "
                f"crosses, {where_stages_start(network)}, and every stage needs a layer "
                "with weights; "
                f"nearby: {', '.join(repr(network.layers[c].name) for c in sorted(near))}",
                k)
        if at <= bounds[-1]:
            raise ValueError(f"'{name}' comes before or at the previous stage's start: "
                             "list the starts in the network's order", k)
        bounds.append(at)
    if len(names) != chunks - 1:
        raise ValueError(f"{chunks} stages need {chunks - 1} start"
                         f"{'s' if chunks > 2 else ''} (the first stage starts at the "
                         f"network's first layer), got {len(names)}", None)
    return [*bounds, len(network.layers)]


def stage_label(network: Network, st: Stage) -> str:
    """``'embed' .. 'block3.mlp_out'`` for a person."""
    return f"{network.layers[st.lo].name} .. {network.layers[st.hi - 1].name}"


def max_stages(network: Network) -> int:
    """The most stages the network can be cut into."""
    return len(stage_starts(network)) + 1


def bubble_fraction(res: PipelineResult) -> float:
    """The idle share of a step the fill and drain leave."""
    return res.bubble_s / res.time_s if res.time_s > 0 else math.nan
