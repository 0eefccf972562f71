"""Collective communication on a two-tier network (α–β models).

Every function takes the message size in **bytes** and returns **seconds**. ``nbytes`` may
be a float or a numpy array (the search prices many layouts at once).

Notation: ``p`` ranks in the group, ``n`` bytes, ``α`` latency, ``β = 1/bandwidth``
(seconds per byte, per device and direction). ``n`` is the size of the full result:
the all-gathered output, the all-reduced vector, the reduce-scatter input, the broadcast
message; for all-to-all, the bytes each rank sends in total.

Algorithms and their costs (Thakur, Rabenseifner & Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005; Chan et al., "Collective communication:
theory, practice, and experience", CCPE 2007; REFERENCES §1, §3):

=================  ===============================  ======================================
collective         algorithm                        time
=================  ===============================  ======================================
all-gather         ring                             (p−1)α + (p−1)/p·nβ
                   recursive (doubling / Bruck)     ⌈log p⌉α + (p−1)/p·nβ
reduce-scatter     ring                             (p−1)α + (p−1)/p·nβ
                   recursive (halving)              ⌈log p⌉α + (p−1)/p·nβ  (p = 2^k)
all-reduce         ring                             2(p−1)α + 2(p−1)/p·nβ
                   recursive (Rabenseifner)         2⌈log p⌉α + 2(p−1)/p·nβ  (p = 2^k)
                   tree (pipelined double binary)   2⌈log p⌉α + 2nβ
broadcast          ring (pipelined chain)           (p−1)α + nβ
                   tree (binomial)                  ⌈log p⌉(α + nβ)
                   recursive (scatter+all-gather)   (⌈log p⌉ + p − 1)α + 2(p−1)/p·nβ
all-to-all         ring (pairwise exchange)         (p−1)α + (p−1)/p·nβ
                   recursive (Bruck)                ⌈log p⌉α + ⌈log p⌉/2·nβ
point-to-point     —                                α + nβ
=================  ===============================  ======================================

Rabenseifner's all-reduce has exactly the cost the paper charges to its "ring" all-reduce
(``2α⌈log p⌉ + 2β(p−1)/p·n``), and recursive doubling/Bruck the cost of its all-gather.
Where ``p`` is not a power of two, recursive halving first folds the ``p − p'`` ranks
over the largest power of two ``p'`` onto partners, their whole vectors, and returns
their results at the end (MPICH; Thakur et al. §4.4): reduce-scatter ``(⌊log p⌋ + 2)α +
((p'−1)/p' + 1 + 1/p)·nβ``, all-reduce ``(2⌊log p⌋ + 2)α + (2(p'−1)/p' + 2)·nβ``.

**Libraries.** ``auto`` takes the fastest algorithm the cluster's collective library
runs. MPI (``collectives: {library: mpi}``, the default on CPU nodes) has all of the
above. NCCL (the default on GPUs) has rings, for all-reduce across nodes its double
binary trees, NVLS on NVSwitch systems, and no recursive halving or doubling; pricing
Rabenseifner's ``2⌈log p⌉`` latency steps with a latency fitted to NCCL's rings made an
8-GPU all-reduce of 8 KiB take 17 µs against the 39 µs measured. NCCL's tree is a chain
inside each node and a binary tree across the ``m`` nodes; its latency follows NCCL's own
tuning model (REFERENCES §3), ``2((q−1)α_intra + ⌈log m⌉α_inter)`` for ``q`` ranks a
node, and it moves ``2n`` through the node's NICs and along the chain (see *Two tiers*).
An algorithm named on the command line
(``--algorithm recursive``) is priced as asked, whatever the library.

**Two tiers.** A group lies either inside one node (intra-node tier) or spans nodes. The
inter-node bandwidth is per device: its own NIC, or its share of a NIC its node's devices
share. NCCL's ring over a spanning group with ``q`` ranks a node runs ``q`` channels,
each leaving the node through another rank's NIC (its tuning model: bus bandwidth =
channels × per-channel bandwidth, REFERENCES §3), so a rank sends ``1/q`` of the ring's
bytes through its NIC and ``(q−1)/q`` over the node's links at the same time:
``β_eff = max(β_inter/q, (q−1)/q·β_intra)``; of its ``2(p−1)`` all-reduce steps only the
``2(m−1)`` between nodes pay the network's latency (``m−1`` of ``p−1`` for all-gather,
reduce-scatter and broadcast). NCCL's tree moves ``2n`` per node through its ``q`` NICs
and along the chain inside it: ``2n·max(β_inter/q, β_intra)``. A pairwise all-to-all
sends the ``(p−q)/p`` of its bytes bound for other nodes through the rank's own NIC.
Other flat algorithms over a spanning group (MPI's, or with one rank a node) run at the
slower tier: their steps pay the inter-node latency and the smaller of the two
bandwidths. The **hierarchical** algorithm
splits the work (REFERENCES §3): for all-reduce, a reduce-scatter inside each node over its
``q`` group members, an all-reduce across the ``m`` nodes on ``n/q`` bytes (the ``q``
local ranks each drive their own NIC in parallel), and an all-gather inside the node.
All-gather and reduce-scatter go the same way in one direction; broadcast is an
inter-node broadcast followed by an intra-node one. All-to-all is two all-to-alls of the
rank's ``n`` bytes: inside the node, each rank gathers what its node's ranks send to
its rail (local index) on every node (``(q−1)/q·n`` over NVLink), then across the ``m``
nodes on each rail (``(m−1)/m·n`` through the rank's own NIC: what leaves a node is what
its ranks send to the other nodes, and no algorithm sends less). In an uneven group the
step across carries what the thinnest node's ``q`` NICs must, ``(p−q)/p`` of the data
(``(m−1)/m`` when even).

**Trees of switches.** A tier may list bandwidths by group size (PCIe systems, where a
ring behind one switch runs faster than one across switches); a group inside the node
uses the entry for its size.

**Hybrid sharding.** ZeRO sharded inside each node and replicated across nodes (FSDP's
``HYBRID_SHARD``; MiCS, Zhang et al., VLDB 2023, with node-sized shard groups) reduces a
gradient with ``hybrid_reduce``: a reduce-scatter inside each node over its ``q`` group
members, then an all-reduce of the ``n/q``-byte shard across the ``m`` nodes (each local
rank on its own NIC); in an uneven group, over the ``⌈p/q⌉`` ranks that hold the shard,
more than one in a wider node. It is the hierarchical all-reduce without its final all-gather:
every rank ends with the sum of its ``1/q`` shard, which the node's ``q`` ranks share.

**NVLS.** On NVSwitch systems NCCL reduces inside the switch from a message size on
(REFERENCES §3); a tier with ``nvls`` settings prices a one-node all-reduce of at least
``nvls_min_bytes`` as ``α_nvls + n / algbw_nvls`` when that is faster: an algorithm
bandwidth that does not depend on the group's size, as in NCCL's own tuning model (its
``tuning.cc``: NVLS's bus bandwidth times 5/6 for every ``p``), so NVLS beats a ring on
eight ranks of an H100 node and loses to it on two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

from ..cluster import Cluster, Link
from ..memo import IdentityMemo

Collective = Literal["all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all",
                     "p2p", "hybrid_reduce"]
COLLECTIVES: tuple[Collective, ...] = ("all_gather", "reduce_scatter", "all_reduce",
                                       "broadcast", "all_to_all", "p2p")
FLAT_ALGORITHMS = ("ring", "tree", "recursive")
ALGORITHMS = (*FLAT_ALGORITHMS, "hierarchical")
#: The flat algorithms that apply to each collective (a tree all-gather is not a thing).
APPLICABLE: dict[str, tuple[str, ...]] = {
    "all_gather": ("ring", "recursive"),
    "reduce_scatter": ("ring", "recursive"),
    "all_reduce": ("ring", "recursive", "tree"),
    "broadcast": ("ring", "tree", "recursive"),
    "all_to_all": ("ring", "recursive"),
}
#: The flat algorithms NCCL runs, which ``auto`` chooses from on a GPU cluster: rings for
#: every collective (all-to-all is grouped point-to-point sends, priced as the pairwise
#: exchange), and for all-reduce across nodes its trees. It has no recursive halving or
#: doubling, and a tree only from two nodes on.
NCCL_APPLICABLE: dict[str, tuple[str, ...]] = {
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_reduce": ("ring", "tree"),
    "broadcast": ("ring",),
    "all_to_all": ("ring",),
}

Bytes = TypeVar("Bytes", float, NDArray[np.float64])


def clog2(p: int) -> int:
    """⌈log2 p⌉ (0 for p ≤ 1)."""
    return 0 if p <= 1 else (p - 1).bit_length()


@dataclass(frozen=True)
class Group:
    """A communicator: ``size`` ranks, ``per_node`` of them in each node it touches.

    Where the ranks do not fill their nodes evenly (12 ranks on 8-GPU nodes: 8 + 4),
    ``per_node`` is the fewest in any of them, whose NICs each carry ``1/per_node`` of
    the cross-node traffic (the rails that finish last), and ``span`` the nodes touched
    (0: ``⌈size / per_node⌉``, the even case)."""

    size: int
    per_node: int
    span: int = 0

    def __post_init__(self) -> None:
        if self.size < 1 or self.per_node < 1 or self.per_node > self.size:
            raise ValueError(f"invalid group {self.size}/{self.per_node}")
        if self.span and not (1 <= self.span <= self.size
                              and self.per_node * self.span <= self.size):
            raise ValueError(f"invalid group {self.size}/{self.per_node} on {self.span} nodes")

    @property
    def nodes(self) -> int:
        """Nodes the group spans."""
        return self.span or -(-self.size // self.per_node)

    @property
    def spans_nodes(self) -> bool:
        """Whether the group crosses the inter-node tier."""
        return self.nodes > 1


def flat_time(op: Collective, algorithm: str, nbytes: Bytes, p: int, alpha: float,
              beta: float) -> Bytes:
    """Time of a flat algorithm on one tier (see the module table)."""
    if p <= 1:
        return nbytes * 0.0
    lg = clog2(p)
    frac = (p - 1) / p
    if op == "p2p":
        return alpha + nbytes * beta
    # recursive halving on a p that is not a power of two: the p − p' ranks over the
    # largest power of two p' first hand their whole vector to a partner and get their
    # result back at the end (MPICH's reduce-scatter and Rabenseifner all-reduce; Thakur
    # et al. 2005 §4.4): one step each way more, and the halving among p'
    low = 1 << (p.bit_length() - 1)
    if op in ("all_gather", "reduce_scatter"):
        if algorithm == "ring":
            return (p - 1) * alpha + frac * nbytes * beta
        if algorithm == "recursive" and (op == "all_gather" or low == p):
            return lg * alpha + frac * nbytes * beta  # Bruck's all-gather: any p
        if algorithm == "recursive":
            return (clog2(low) + 2) * alpha + ((low - 1) / low + 1 + 1 / p) * nbytes * beta
    elif op == "all_reduce":
        if algorithm == "ring":
            return 2 * (p - 1) * alpha + 2 * frac * nbytes * beta
        if algorithm == "recursive" and low == p:
            return 2 * lg * alpha + 2 * frac * nbytes * beta
        if algorithm == "recursive":
            return (2 * clog2(low) + 2) * alpha + (2 * (low - 1) / low + 2) * nbytes * beta
        if algorithm == "tree":
            return 2 * lg * alpha + 2 * nbytes * beta
    elif op == "broadcast":
        if algorithm == "ring":
            return (p - 1) * alpha + nbytes * beta
        if algorithm == "tree":
            return lg * (alpha + nbytes * beta)
        if algorithm == "recursive":
            return (lg + p - 1) * alpha + 2 * frac * nbytes * beta
    elif op == "all_to_all":
        if algorithm == "ring":
            return (p - 1) * alpha + frac * nbytes * beta
        if algorithm == "recursive":
            return lg * alpha + lg / 2 * nbytes * beta
    raise ValueError(f"no algorithm {algorithm!r} for {op}")


def _tier(cluster: Cluster, group: Group) -> tuple[float, float]:
    """(α, β) a flat algorithm over ``group`` sees: the slower tier when it spans nodes
    (inside a node, the bandwidth measured for groups of that size where the cluster
    lists one)."""
    if not group.spans_nodes:
        return cluster.intra.latency_s, 1.0 / cluster.intra.bandwidth_for(group.size)
    bw = min(cluster.intra.bandwidth_for(group.per_node), cluster.inter.bandwidth) if \
        group.per_node > 1 else cluster.inter.bandwidth
    return max(cluster.intra.latency_s, cluster.inter.latency_s), 1.0 / bw


Arr = NDArray[np.float64]


def nvls_time(link: Link, op: Collective, nbytes: Bytes, p: int) -> Bytes | None:
    """NVLS all-reduce time per message (inf below its threshold), or None.

    ``α_nvls + n / algbw_nvls`` at any group size, as NCCL's tuning model prices NVLS
    (its algorithm bandwidth is the channels' bus bandwidth times a constant 5/6, where a
    ring's is times ``p / (2(p−1))``). By each rank's traffic, ``(1 + 1/p)·n`` each way
    as the switch reduces against a ring's ``2(p−1)/p·n``, NVLS would lose on 2 ranks,
    tie on 4 and win on 8; NCCL's constant has it lose on 2 and win from 4 (the README's
    *Collectives: planner comm fit*). A bus bandwidth held constant
    instead (before 2026-11-28) priced NVLS on two ranks at 457 GB/s of algorithm
    bandwidth, more than an H100's NVLink moves one way."""
    if op != "all_reduce" or link.nvls_algbw is None or p <= 1:
        return None
    lat = link.nvls_latency_s if link.nvls_latency_s is not None else link.latency_s
    t = lat + nbytes / link.nvls_algbw
    if isinstance(nbytes, float):
        return math.inf if nbytes < (link.nvls_min_bytes or 0.0) else t
    return np.where(nbytes < (link.nvls_min_bytes or 0.0), np.inf, t)


def _pick(candidates: list[tuple[Bytes, str]]) -> tuple[Bytes, str]:
    """Elementwise minimum, named after the winner (``auto`` when winners differ)."""
    first = candidates[0][0]
    if isinstance(first, float):  # one message as a float: the fastest path
        return min(candidates, key=lambda c: c[0])
    if first.shape == (1,):  # one message: plain comparisons are much faster
        best = min(candidates, key=lambda c: float(c[0][0]))
        return best
    times = np.stack([t for t, _ in candidates])
    which = np.argmin(times, axis=0)
    names = {candidates[int(i)][1] for i in np.unique(which)}
    return times.min(axis=0), names.pop() if len(names) == 1 else "auto"


def widest_node(group: Group, cluster: Cluster) -> int:
    """Ranks of the group in its widest node. ``per_node`` is the thinnest node's (whose
    NICs carry the most across); in an uneven group (12 ranks on 8-GPU nodes: 8 + 4) the
    other nodes hold ``per_node`` at least, so the widest at most what is left of the
    group, and a node at most its devices."""
    q, m = group.per_node, group.nodes
    return min(group.size - (m - 1) * q, cluster.devices_per_node) if m > 1 else q


def hierarchical_time(op: Collective, nbytes: Bytes, group: Group, cluster: Cluster) -> Bytes:
    """Two-level algorithm: inside each node over its ranks, across nodes over ``nodes``
    ranks on ``1/per_node`` of the data (each local rank on its own NIC). In an uneven
    group the phases inside the nodes take as long as the widest node's (8 ranks of
    8 + 4: 7 steps and 7/8 of the bytes, where the thinner node's take 3 and 3/4; found
    by an audit), the phase across as long as the thinnest's (its 4 NICs carry 1/4)."""
    q, m = group.per_node, group.nodes
    w = widest_node(group, cluster)
    intra = Group(w, w)
    if m <= 1:
        return _best_flat(op, nbytes, intra, cluster, "auto")[0]
    inter_g = Group(m, 1)
    # what crosses a node boundary, as the thinnest node's NICs carry it: (p − q)/p of
    # the data, which is the (m − 1)/m an exchange among m rails moves in an even group;
    # in an uneven one (12 = 8 + 4) the 4-rank node's NICs carry 2/3, not 1/2 (an
    # audit: hierarchical all-to-alls were priced below what the NICs can move)
    p = group.size
    cross = m * (p - q) / ((m - 1) * p)
    if op == "all_reduce":
        return (_best_flat("reduce_scatter", nbytes, intra, cluster, "auto")[0]
                + _best_flat("all_reduce", nbytes / q, inter_g, cluster, "auto")[0]
                + _best_flat("all_gather", nbytes, intra, cluster, "auto")[0])
    if op in ("all_gather", "reduce_scatter"):
        # all-gather: across nodes on each rail (n/q of the result per rail), then inside
        # the node on the full result; reduce-scatter is the mirror image
        return (_best_flat(op, nbytes * cross / q, inter_g, cluster, "auto")[0]
                + _best_flat(op, nbytes, intra, cluster, "auto")[0])
    if op == "broadcast":
        return (_best_flat(op, nbytes, inter_g, cluster, "auto")[0]
                + _best_flat(op, nbytes, intra, cluster, "auto")[0])
    if op == "all_to_all":
        # two phases: inside the node each rank hands its peer on rail j everything bound
        # for rail j on any node ((q−1)/q of its n bytes); then each rail exchanges across
        # the m nodes, the rank's NIC carrying the (m−1)/m of the n bytes bound elsewhere
        return (_best_flat(op, nbytes, intra, cluster, "auto")[0]
                + _best_flat(op, nbytes * cross, inter_g, cluster, "auto")[0])
    return _best_flat(op, nbytes, group, cluster, "auto")[0]


def hybrid_reduce_time(nbytes: Bytes, group: Group, cluster: Cluster, alg: str
                       ) -> tuple[Bytes, str]:
    """Seconds of a hybrid-sharded gradient reduction (see the module notes) with
    ``alg`` for each part, and the parts' algorithms (``intra+inter``). A group inside
    one node is reduce-scattered; one rank a node all-reduces across the nodes."""
    q, m = group.per_node, group.nodes
    if m <= 1:
        return _collective("reduce_scatter", nbytes, group, cluster, alg)
    # the replicas of a shard: one a node in an even group; in an uneven one (12 = 8 +
    # 4, shards of q = 4) two in the 8-rank node and one in the other, every one of
    # them in the all-reduce (an audit: one a node left ranks unreduced, and with q = 1
    # the sum of 25 ranks was priced as that of the 4 nodes)
    holders = -(-group.size // q)
    replicas = Group(m, 1) if holders == m else Group(holders, 1, m)
    across, a_name = _collective("all_reduce", nbytes / q, replicas, cluster, alg)
    if q <= 1:
        return across, a_name
    inside, i_name = _collective("reduce_scatter", nbytes, Group(q, q), cluster, alg)
    return inside + across, f"{i_name}+{a_name}"


def nccl_tree_time(nbytes: Bytes, group: Group, cluster: Cluster) -> Bytes:
    """NCCL's all-reduce tree: a chain through the ranks of each node (its latency the
    widest node's) and a double binary tree across the ``m`` nodes, pipelined, one
    channel per NIC of the group's ``q`` ranks in its thinnest node (see the module
    notes)."""
    q, m = group.per_node, group.nodes
    widest = widest_node(group, cluster)  # the chain is as long as the widest node's
    latency = 2 * (max(widest - 1, 0) * cluster.intra.latency_s
                   + clog2(m) * cluster.inter.latency_s)
    if m <= 1:
        return latency + 2 * nbytes / cluster.intra.bandwidth_for(q)
    beta_net = 1.0 / cluster.inter.bandwidth / q
    beta = max(beta_net, 1.0 / cluster.intra.bandwidth_for(q)) if q > 1 else beta_net
    return latency + 2 * nbytes * beta


def nccl_ring_time(op: Collective, nbytes: Bytes, group: Group, cluster: Cluster) -> Bytes:
    """NCCL's ring over a group that spans nodes (see the module notes): ``q`` channels,
    each leaving the node through another rank's NIC, so a rank sends ``1/q`` of the
    ring's traffic over its NIC and ``(q−1)/q`` over the node's links, both at once;
    only the steps between nodes (``2(m−1)`` for an all-reduce) pay the network's
    latency. In an uneven group the ``q`` NICs are the thinnest node's and the
    ``(w−1)/w`` over the links the widest node's ``w`` ranks' (8 + 4: 7/8, not 3/4)."""
    p, q, m = group.size, group.per_node, group.nodes
    # an uneven group's NICs are the thinnest node's (q), its links the widest's (w)
    w = widest_node(group, cluster)
    a_in, a_net = cluster.intra.latency_s, cluster.inter.latency_s
    b_net = 1.0 / cluster.inter.bandwidth
    b_in = 1.0 / cluster.intra.bandwidth_for(w) if w > 1 else 0.0
    if op == "all_to_all":  # pairwise: (p − q)/p of the bytes leave through the NIC
        return ((w - 1) * a_in + (p - q) * a_net
                + max((p - q) / p * b_net, (w - 1) / p * b_in) * nbytes)
    steps, net, volume = ring_steps(op, p, m)
    beta = max(b_net / q, (w - 1) / w * b_in)
    return (steps - net) * a_in + net * a_net + volume * nbytes * beta


def ring_steps(op: Collective, p: int, m: int) -> tuple[int, int, float]:
    """A ring of ``p`` ranks on ``m`` nodes: its steps, those of them between nodes, and
    the bytes each rank sends as a fraction of ``n``."""
    if op == "all_reduce":
        return 2 * (p - 1), 2 * (m - 1), 2 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return p - 1, m - 1, (p - 1) / p
    if op == "broadcast":
        return p - 1, m - 1, 1.0
    raise ValueError(f"no ring for {op}")


def _flat(op: Collective, name: str, nbytes: Bytes, group: Group, cluster: Cluster,
          alpha: float, beta: float) -> Bytes:
    if cluster.collective_library == "nccl":
        if name == "tree" and op == "all_reduce":
            return nccl_tree_time(nbytes, group, cluster)
        if name == "ring" and group.spans_nodes:
            return nccl_ring_time(op, nbytes, group, cluster)
    return flat_time(op, name, nbytes, group.size, alpha, beta)


def _best_flat(op: Collective, nbytes: Bytes, group: Group, cluster: Cluster,
               algorithm: str) -> tuple[Bytes, str]:
    p = group.size
    if p <= 1:
        return nbytes * 0.0, "none"
    alpha, beta = _tier(cluster, group)
    if op == "p2p":
        return flat_time(op, "ring", nbytes, 2, alpha, beta), "p2p"
    names = APPLICABLE[op]
    if algorithm in names:
        names = (algorithm,)
    elif cluster.collective_library == "nccl":
        names = NCCL_APPLICABLE[op]
        if not group.spans_nodes:  # NCCL's trees start at two nodes
            names = tuple(n for n in names if n != "tree")
    candidates = [(_flat(op, name, nbytes, group, cluster, alpha, beta), name)
                  for name in names]
    if not group.spans_nodes and algorithm not in FLAT_ALGORITHMS and \
            cluster.collective_library == "nccl":
        # NVLS is NCCL's own choice; a named flat algorithm (--algorithm ring) is priced
        # as that algorithm alone
        nv = nvls_time(cluster.intra, op, nbytes, p)
        if nv is not None:
            candidates.append((nv, "nvls"))
    return _pick(candidates)


@overload
def collective_time(op: Collective, nbytes: float, group: Group, cluster: Cluster,
                    algorithm: str | None = None) -> tuple[float, str]: ...
@overload
def collective_time(op: Collective, nbytes: Arr, group: Group, cluster: Cluster,
                    algorithm: str | None = None) -> tuple[Arr, str]: ...


def collective_time(op: Collective, nbytes: float | Arr, group: Group, cluster: Cluster,
                    algorithm: str | None = None) -> tuple[float | Arr, str]:
    """Seconds for collective ``op`` of ``nbytes`` over ``group``, and the algorithm used.

    ``algorithm`` (default: the cluster's preference) is ``ring``, ``tree``,
    ``recursive``, ``hierarchical`` or ``auto`` (the fastest; for arrays the fastest per
    element, named ``auto`` when the winners differ). A group of one costs nothing.
    """
    alg = algorithm or cluster.algorithm
    if np.ndim(nbytes) == 0:
        # scalar questions repeat a lot in a search (the same gradient over the same group
        # for every layout that shares it): memoised per cluster object
        memo = _MEMO.table(cluster)
        key = (op, float(nbytes), group, alg)
        hit = memo.get(key)
        if hit is None:
            t, name = _collective(op, float(nbytes), group, cluster, alg)
            hit = (float(t), name)
            if len(memo) >= _MEMO_ENTRIES:
                memo.clear()
            memo[key] = hit
        return hit
    x = np.atleast_1d(np.asarray(nbytes, dtype=np.float64))
    return _collective(op, x, group, cluster, alg)


_MEMO_ENTRIES = 1 << 18
_MEMO: IdentityMemo[tuple[str, float, Group, str], tuple[float, str]] = IdentityMemo()


def _collective(op: Collective, x: Bytes, group: Group, cluster: Cluster,
                alg: str) -> tuple[Bytes, str]:
    if group.size <= 1:
        return x * 0.0, "none"
    if op == "hybrid_reduce":
        return hybrid_reduce_time(x, group, cluster, alg)
    if op == "p2p":
        alpha, beta = _tier(cluster, group)
        return flat_time(op, "ring", x, 2, alpha, beta), "p2p"
    hierarchical = group.spans_nodes and group.per_node > 1
    if alg == "hierarchical":
        if hierarchical:
            return hierarchical_time(op, x, group, cluster), "hierarchical"
        return _best_flat(op, x, group, cluster, "auto")
    flat = _best_flat(op, x, group, cluster, alg)
    if alg != "auto" or not hierarchical:
        return flat
    return _pick([flat, (hierarchical_time(op, x, group, cluster), "hierarchical")])


# ---------------------------------------------------------------------------------------
# The paper's accounting (Gholami et al., SPAA 2018, REFERENCES §1)


def paper_all_gather(words: Bytes, p: int, alpha: float, beta_word: float) -> Bytes:
    """Bruck all-gather as the paper charges it: ``α⌈log p⌉ + β (p−1)/p · n`` (n words)."""
    if p <= 1:
        return words * 0.0
    return alpha * clog2(p) + beta_word * (p - 1) / p * words


def paper_all_reduce(words: Bytes, p: int, alpha: float, beta_word: float) -> Bytes:
    """All-reduce as the paper charges it: ``2α⌈log p⌉ + 2β (p−1)/p · n`` (n words)."""
    if p <= 1:
        return words * 0.0
    return 2 * alpha * clog2(p) + 2 * beta_word * (p - 1) / p * words


def paper_halo(words: Bytes, alpha: float, beta_word: float) -> Bytes:
    """Pairwise halo exchange as the paper charges it: ``α + β · n`` (n words)."""
    return alpha + beta_word * words


def bus_bandwidth_factor(op: Collective, p: int) -> float:
    """nccl-tests' ``busbw = algbw · factor`` (REFERENCES §3)."""
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0


__all__ = ["ALGORITHMS", "COLLECTIVES", "Group", "collective_time", "flat_time",
           "hierarchical_time", "hybrid_reduce_time", "nccl_ring_time", "nvls_time",
           "paper_all_gather", "paper_all_reduce", "paper_halo", "ring_steps"]
