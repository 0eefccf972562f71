"""Collective cost formulas against values worked out by hand (planner.costs.comm).

Sources of the formulas: Thakur, Rabenseifner & Gropp, IJHPCA 2005; Chan et al., CCPE
2007; REFERENCES §1 (the paper's all-gather and all-reduce) and §3 (hierarchical)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.costs.comm import (
    Group,
    clog2,
    collective_time,
    flat_time,
    paper_all_gather,
    paper_all_reduce,
)

from .helpers import cluster

A, BETA, N = 1e-5, 1e-9, 1e6  # 10 µs, 1 GB/s, 1 MB


@pytest.mark.parametrize(("op", "alg", "p", "expected"), [
    # all-reduce
    ("all_reduce", "ring", 4, 2 * 3 * A + 2 * 3 / 4 * N * BETA),
    ("all_reduce", "recursive", 8, 2 * 3 * A + 2 * 7 / 8 * N * BETA),
    # 5 = 4 + 1: one rank folded onto a partner and back (MPICH; Thakur et al. §4.4)
    ("all_reduce", "recursive", 5, (2 * 2 + 2) * A + (2 * 3 / 4 + 2) * N * BETA),
    ("all_reduce", "tree", 8, 2 * 3 * A + 2 * N * BETA),
    # all-gather / reduce-scatter
    ("all_gather", "ring", 4, 3 * A + 3 / 4 * N * BETA),
    ("all_gather", "recursive", 5, 3 * A + 4 / 5 * N * BETA),
    ("reduce_scatter", "ring", 16, 15 * A + 15 / 16 * N * BETA),
    ("reduce_scatter", "recursive", 16, 4 * A + 15 / 16 * N * BETA),
    # broadcast
    ("broadcast", "ring", 8, 7 * A + N * BETA),
    ("broadcast", "tree", 8, 3 * (A + N * BETA)),
    ("broadcast", "recursive", 8, (3 + 7) * A + 2 * 7 / 8 * N * BETA),
    # all-to-all
    ("all_to_all", "ring", 8, 7 * A + 7 / 8 * N * BETA),
    ("all_to_all", "recursive", 8, 3 * A + 3 / 2 * N * BETA),
    # point-to-point
    ("p2p", "ring", 2, A + N * BETA),
])
def test_flat_formulas(op, alg, p, expected):
    assert flat_time(op, alg, N, p, A, BETA) == pytest.approx(expected, rel=1e-12)


def test_group_of_one_costs_nothing():
    cl = cluster()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "p2p"):
        assert collective_time(op, 1e9, Group(1, 1), cl) == (0.0, "none")
        assert flat_time(op, "ring", 1e9, 1, A, BETA) == 0.0


def test_clog2():
    assert [clog2(p) for p in (1, 2, 3, 4, 5, 512, 513)] == [0, 1, 2, 2, 3, 9, 10]


def test_intra_node_group_uses_intra_tier():
    cl = cluster(intra=(2e-6, 100e9), inter=(5e-6, 10e9), algorithm="ring")
    t, alg = collective_time("all_reduce", 8e6, Group(8, 8), cl)
    assert alg == "ring"
    assert t == pytest.approx(2 * 7 * 2e-6 + 2 * 7 / 8 * 8e6 / 100e9, rel=1e-12)


def test_spanning_ring_runs_a_channel_per_nic():
    """NCCL's ring over 2 nodes of 8, a NIC a device (REFERENCES §3, NCCL's tuning model:
    bus bandwidth = channels × per-channel bandwidth; 2(nodes−1) of the 2(p−1) steps at
    the network's latency). Each of the 8 channels leaves a node through another rank's
    NIC, so a rank sends 1/8 of the ring's 2·15/16·n over its NIC (10 GB/s) and 7/8 over
    NVLink (100 GB/s) at once: the slower share is the NIC's, n/8 at 10 GB/s, an
    effective 80 GB/s. One rank a node (or MPI's single ring) is the network's alone."""
    cl = cluster(intra=(2e-6, 100e9), inter=(5e-6, 10e9), algorithm="ring")
    n = 8e6
    t, _ = collective_time("all_reduce", n, Group(16, 8), cl)
    assert t == pytest.approx(28 * 2e-6 + 2 * 5e-6 + 2 * 15 / 16 * n / 80e9, rel=1e-12)
    t, _ = collective_time("all_gather", n, Group(32, 8), cl)  # 4 nodes: 3 hops between
    assert t == pytest.approx(28 * 2e-6 + 3 * 5e-6 + 31 / 32 * n / 80e9, rel=1e-12)
    # two ranks a node: two channels, the NIC's half (n/2 at 10 GB/s) is the slower
    t, _ = collective_time("all_reduce", n, Group(8, 2), cl)
    assert t == pytest.approx(8 * 2e-6 + 6 * 5e-6 + 2 * 7 / 8 * n / 20e9, rel=1e-12)
    t, _ = collective_time("all_reduce", n, Group(4, 1), cl)
    assert t == pytest.approx(6 * 5e-6 + 2 * 3 / 4 * n / 10e9, rel=1e-12)
    # a fast network: the node's links are the slower share, 7/8 of the traffic
    fast = cluster(intra=(2e-6, 100e9), inter=(5e-6, 50e9), algorithm="ring")
    t, _ = collective_time("all_reduce", n, Group(16, 8), fast)
    assert t == pytest.approx(28 * 2e-6 + 2 * 5e-6 + 2 * 15 / 16 * n * 7 / 8 / 100e9,
                              rel=1e-12)
    # pairwise all-to-all: 8 of 16 peers a node away, their half of n through the NIC
    t, _ = collective_time("all_to_all", n, Group(16, 8), cl)
    assert t == pytest.approx(7 * 2e-6 + 8 * 5e-6 + 8 / 16 * n / 10e9, rel=1e-12)
    mpi = dataclasses.replace(cl, library="mpi")
    t, _ = collective_time("all_reduce", n, Group(16, 8), mpi)
    assert t == pytest.approx(2 * 15 * 5e-6 + 2 * 15 / 16 * n / 10e9, rel=1e-12)


@pytest.mark.parametrize("library", ["mpi", "nccl"])
def test_hierarchical_all_reduce_by_hand(library):
    """Reduce-scatter in the node (q=8), all-reduce across m=4 nodes on n/8, all-gather.
    Each part is the fastest algorithm the library has: MPI's recursive halving and
    doubling, Rabenseifner and the textbook tree; NCCL's rings, and across the nodes its
    tree, whose latency is one hop a level of the binary tree over the 4 nodes, each way
    (one rank a node: no chain inside)."""
    cl = dataclasses.replace(cluster(intra=(2e-6, 100e9), inter=(5e-6, 10e9),
                                     algorithm="hierarchical"), library=library)
    n = 64e6
    t, alg = collective_time("all_reduce", n, Group(32, 8), cl)
    assert alg == "hierarchical"
    if library == "mpi":
        rs = min(7 * 2e-6, 3 * 2e-6) + 7 / 8 * n / 100e9   # best of ring / recursive halving
        ar = min(2 * 3 * 5e-6 + 2 * 3 / 4 * (n / 8) / 10e9,  # ring
                 2 * 2 * 5e-6 + 2 * 3 / 4 * (n / 8) / 10e9,  # Rabenseifner
                 2 * 2 * 5e-6 + 2 * (n / 8) / 10e9)         # tree
    else:
        rs = 7 * 2e-6 + 7 / 8 * n / 100e9                   # ring
        ar = min(2 * 3 * 5e-6 + 2 * 3 / 4 * (n / 8) / 10e9,  # ring
                 2 * 2 * 5e-6 + 2 * (n / 8) / 10e9)         # tree
    ag = rs
    assert t == pytest.approx(rs + ar + ag, rel=1e-12)


def test_nccl_auto_runs_what_nccl_runs():
    """On a GPU cluster ``auto`` takes NCCL's algorithms: inside a node a ring (no
    recursive halving or doubling, no tree), even for 8 KiB where Rabenseifner's 2⌈log 8⌉
    = 6 latency steps would be faster than the ring's 14; across nodes NCCL's tree, a
    chain through the node's 8 ranks and a binary tree over the 4 nodes:
    2 · (7 · 2 µs + 2 · 5 µs) + 2nβ (NCCL's tuning model, REFERENCES §3). Named on the
    command line, recursive is priced as asked; a CPU cluster defaults to MPI."""
    cl = cluster(intra=(2e-6, 100e9), inter=(5e-6, 10e9))
    assert cl.collective_library == "nccl"
    n = 8192.0
    t, alg = collective_time("all_reduce", n, Group(8, 8), cl)
    assert alg == "ring" and t == pytest.approx(14 * 2e-6 + 2 * 7 / 8 * n / 100e9, rel=1e-12)
    t, alg = collective_time("all_reduce", n, Group(8, 8), cl, "recursive")
    assert alg == "recursive" and t == pytest.approx(6 * 2e-6 + 2 * 7 / 8 * n / 100e9,
                                                     rel=1e-12)
    t, alg = collective_time("all_gather", n, Group(8, 8), cl)
    assert alg == "ring" and t == pytest.approx(7 * 2e-6 + 7 / 8 * n / 100e9, rel=1e-12)
    t, alg = collective_time("all_reduce", n, Group(32, 8), cl, "tree")
    # the tree's 2n per node leave over the node's 8 NICs (80 GB/s), the chain runs on
    # NVLink (100 GB/s): the NICs are the slower
    assert alg == "tree" and t == pytest.approx(2 * (7 * 2e-6 + 2 * 5e-6) + 2 * n / 80e9,
                                                rel=1e-12)
    mpi = dataclasses.replace(cl, library="mpi")
    assert collective_time("all_reduce", n, Group(8, 8), mpi)[1] == "recursive"
    knl = cluster(per_node=1, device="cori-knl")
    assert knl.collective_library == "mpi"


@pytest.mark.parametrize(("library", "algorithms"), [
    ("mpi", ("ring", "tree", "recursive", "hierarchical")),
    ("nccl", ("ring", "tree", "hierarchical"))])
def test_auto_is_the_minimum(library, algorithms):
    """``auto`` is the fastest algorithm the library has (NCCL: no recursive)."""
    cl = dataclasses.replace(cluster(algorithm="auto"), library=library)
    g = Group(32, 8)
    for n in (1e3, 1e6, 1e9):
        t, _ = collective_time("all_reduce", n, g, cl)
        others = [collective_time("all_reduce", n, g, cl, a)[0] for a in algorithms]
        assert t == pytest.approx(min(others), rel=1e-12)


def test_vectorised_matches_scalar():
    cl = cluster()
    sizes = np.array([1e2, 1e5, 3e7, 2e9])
    for op in ("all_reduce", "all_gather", "all_to_all", "broadcast"):
        for g in (Group(8, 8), Group(64, 8), Group(16, 1)):
            arr, _ = collective_time(op, sizes, g, cl)
            for n, t in zip(sizes, arr, strict=True):
                assert t == pytest.approx(collective_time(op, float(n), g, cl)[0], rel=1e-12)


def test_nvls_from_threshold():
    """In-switch reduction from min_bytes on: α_nvls + n / algbw_nvls, an algorithm
    bandwidth the same at every group size (NCCL's tuning model: NVLS's bus bandwidth
    times 5/6 for any p, a ring's times p/(2(p−1)))."""
    cl = cluster(intra=(3e-6, 100e9), nvls_algbw=70e9, nvls_latency_s=20e-6,
                 nvls_min_bytes=2 * 2**20)
    _, alg_small = collective_time("all_reduce", 1 * 2**20, Group(8, 8), cl)
    assert alg_small != "nvls"
    big, alg = collective_time("all_reduce", 256 * 2**20, Group(8, 8), cl)
    assert alg == "nvls"
    assert big == pytest.approx(20e-6 + 256 * 2**20 / 70e9, rel=1e-12)
    # on two ranks the ring moves 2·(1/2)·n = n at 100 GB/s (2.684 ms + 2α = 6 µs)
    # and beats NVLS's 3.835 ms + 20 µs; on four, 2·3/4·n: 4.027 ms + 18 µs, NVLS wins
    two, alg = collective_time("all_reduce", 256 * 2**20, Group(2, 2), cl)
    assert alg == "ring" and two == pytest.approx(2 * 3e-6 + 256 * 2**20 / 100e9, rel=1e-12)
    four, alg = collective_time("all_reduce", 256 * 2**20, Group(4, 4), cl)
    assert alg == "nvls" and four == pytest.approx(big, rel=1e-12)
    # a named flat algorithm is that algorithm alone: ring 2(p-1)α + 2(p-1)/p·n·β
    ring, alg = collective_time("all_reduce", 256 * 2**20, Group(8, 8), cl, "ring")
    assert alg == "ring"
    assert ring == pytest.approx(14 * 3e-6 + 2 * 7 / 8 * 256 * 2**20 / 100e9, rel=1e-12)
    # hierarchical keeps NCCL's choice inside the node
    hier, _ = collective_time("all_reduce", 256 * 2**20, Group(8, 8), cl, "hierarchical")
    assert hier == pytest.approx(big, rel=1e-12)


def test_paper_formulas_by_hand():
    # REFERENCES §1: all-gather α⌈log p⌉ + β(p−1)/p·n; all-reduce twice that
    assert paper_all_gather(1000.0, 512, 2e-6, 4 / 6e9) == pytest.approx(
        9 * 2e-6 + 511 / 512 * 1000 * 4 / 6e9, rel=1e-12)
    assert paper_all_reduce(1000.0, 512, 2e-6, 4 / 6e9) == pytest.approx(
        2 * 9 * 2e-6 + 2 * 511 / 512 * 1000 * 4 / 6e9, rel=1e-12)
    assert paper_all_reduce(1000.0, 1, 2e-6, 1.0) == 0.0


OPS = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                       "all_to_all", "p2p"])
ALGS = st.sampled_from(["ring", "tree", "recursive", "hierarchical", "auto"])


@settings(max_examples=200, deadline=None)
@given(op=OPS, alg=ALGS, size=st.integers(2, 4096), per_node=st.sampled_from([1, 2, 4, 8]),
       n=st.floats(1.0, 1e10), factor=st.floats(1.01, 100.0))
def test_cost_grows_with_bytes_and_latency(op, alg, size, per_node, n, factor):
    per_node = min(per_node, size)
    g = Group(size, per_node)
    cl = cluster(algorithm=alg)
    t1, _ = collective_time(op, n, g, cl)
    t2, _ = collective_time(op, n * factor, g, cl)
    assert t2 >= t1 > 0
    slow = cluster(intra=(2e-6 * factor, 100e9), inter=(5e-6 * factor, 10e9), algorithm=alg)
    t3, _ = collective_time(op, n, g, slow)
    assert t3 >= t1
    # never below the latency of one message, never below moving the bytes once
    assert t1 >= 2e-6 * (1 - 1e-12)
    assert math.isfinite(t1)


def test_hierarchical_all_to_all_by_hand():
    """All-to-all of n bytes a rank over 4 nodes of 8 (rail-wise, two phases): a pairwise
    exchange inside the node, 7α_intra + 7/8·n/B_intra, then one across the 4 nodes on
    each rail, 3α_inter + 3/4·n/B_inter. The NIC term is the floor: 3/4 of what a rank
    sends is bound for other nodes and leaves through its own NIC, so no two-tier
    schedule moves less across nodes."""
    cl = cluster(intra=(2e-6, 100e9), inter=(5e-6, 10e9), algorithm="hierarchical")
    n = 64e6
    t, alg = collective_time("all_to_all", n, Group(32, 8), cl)
    assert alg == "hierarchical"
    assert t == pytest.approx(7 * 2e-6 + 7 / 8 * n / 100e9 + 3 * 5e-6 + 3 / 4 * n / 10e9,
                              rel=1e-12)
    assert t >= 3 / 4 * n / 10e9


def test_nccl_ring_over_an_uneven_group_loads_the_widest_nodes_links():
    """12 ranks on 8-GPU nodes (8 + 4), NCCL's ring all-reduce (REFERENCES §4: 2(p−1)
    steps, 2(p−1)/p·n a rank): the thinner node's 4 NICs carry 1/4 of a rank's bytes,
    the 8-rank node's links 7/8 of them (an audit found 3/4, the thinner node's); the
    2(m−1) = 2 steps between nodes pay the network's latency, the other 20 the node's."""
    from planner.costs.comm import nccl_ring_time

    cl = cluster(per_node=8, intra=(2e-6, 100e9), inter=(5e-6, 1000e9))
    n = 1e6
    beta = max(1 / (4 * 1000e9), 7 / 8 / 100e9)  # here the links bind
    want = 20 * 2e-6 + 2 * 5e-6 + 2 * 11 / 12 * n * beta
    assert nccl_ring_time("all_reduce", n, Group(12, 4, 2), cl) == pytest.approx(
        want, rel=1e-12)
    even = 28 * 2e-6 + 2 * 5e-6 + 2 * 15 / 16 * n * max(1 / (8 * 1000e9), 7 / 8 / 100e9)
    assert nccl_ring_time("all_reduce", n, Group(16, 8), cl) == pytest.approx(even,
                                                                              rel=1e-12)


def test_nccl_tree_latency_is_the_widest_nodes_chain():
    """12 ranks on 8-GPU nodes (8 + 4): the chain through the 8-rank node has 7 hops,
    so the tree's latency is 2(7·α_intra + ⌈log2 2⌉·α_inter); its bandwidth is still the
    thinner node's, whose 4 NICs carry 2n (β = max(1/(4·B_inter), 1/B_intra)). Found by
    an audit: the chain was the thinnest node's 3 hops. Even groups are unchanged."""
    from planner.costs.comm import nccl_tree_time

    cl = cluster(per_node=8, intra=(2e-6, 100e9), inter=(5e-6, 10e9))
    n = 1e6
    beta = max(1 / (4 * 10e9), 1 / cl.intra.bandwidth_for(4))
    want = 2 * (7 * 2e-6 + 1 * 5e-6) + 2 * n * beta
    assert nccl_tree_time(n, Group(12, 4, 2), cl) == pytest.approx(want, rel=1e-12)
    # 8 + 8 + 4: the widest holds 8 (a node's devices), not 20 − 2·4 = 12
    want3 = 2 * (7 * 2e-6 + clog2(3) * 5e-6) + 2 * n * beta
    assert nccl_tree_time(n, Group(20, 4, 3), cl) == pytest.approx(want3, rel=1e-12)
    even = 2 * (7 * 2e-6 + 1 * 5e-6) + 2 * n * max(1 / (8 * 10e9),
                                                    1 / cl.intra.bandwidth_for(8))
    assert nccl_tree_time(n, Group(16, 8), cl) == pytest.approx(even, rel=1e-12)


def test_recursive_halving_on_p_not_a_power_of_two():
    """24 ranks (REFERENCES §1; Thakur et al. 2005 §4.4, MPICH): the 8 over 16 hand their
    whole vector to a partner first and get their result back at the end, then the 16
    halve: all-reduce (2·4 + 2)α + (2·15/16 + 2)·nβ, reduce-scatter (4 + 2)α + (15/16 +
    1 + 1/24)·nβ; an audit found the power-of-two formula, 2·⌈log 24⌉α + 2·23/24·nβ,
    about half. Bruck's all-gather and powers of two are as before."""
    assert flat_time("all_reduce", "recursive", N, 24, A, BETA) == pytest.approx(
        10 * A + (2 * 15 / 16 + 2) * N * BETA, rel=1e-12)
    assert flat_time("reduce_scatter", "recursive", N, 24, A, BETA) == pytest.approx(
        6 * A + (15 / 16 + 1 + 1 / 24) * N * BETA, rel=1e-12)
    assert flat_time("all_gather", "recursive", N, 24, A, BETA) == pytest.approx(
        5 * A + 23 / 24 * N * BETA, rel=1e-12)
    assert flat_time("all_reduce", "recursive", N, 16, A, BETA) == pytest.approx(
        8 * A + 2 * 15 / 16 * N * BETA, rel=1e-12)
    # on an MPI cluster auto no longer calls it the cheapest at 24: the ring is
    mpi = dataclasses.replace(cluster(per_node=1), library="mpi")
    assert collective_time("all_reduce", 1e8, Group(24, 1), mpi)[1] == "ring"


@pytest.mark.parametrize(("op", "group", "share"), [
    ("all_to_all", Group(12, 4, 2), 2 / 3), ("all_to_all", Group(16, 8), 1 / 2),
    ("all_gather", Group(12, 4, 2), 2 / 3 / 4), ("all_gather", Group(16, 8), 1 / 2 / 8),
    ("reduce_scatter", Group(20, 4, 3), 16 / 20 / 4)])
def test_hierarchical_crossing_is_what_the_thinnest_node_must_send(op, group, share):
    """The step across nodes of a hierarchical collective carries what the thinnest
    node's q NICs must: (p − q)/p of the data, 1/q of it a NIC for all-gather and
    reduce-scatter (each rank's share of the result) and all of it for all-to-all (each
    rank's n bytes). On 12 = 8 + 4 that is 2/3 where an even group's (m − 1)/m is 1/2
    (an audit: the uneven all-to-all was priced below what the NICs can move). With
    links inside the node that cost nothing, the time is that share at 10 GB/s."""
    from planner.costs.comm import hierarchical_time

    cl = cluster(per_node=8, intra=(0.0, 1e18), inter=(0.0, 10e9))
    n = 1e9
    assert hierarchical_time(op, n, group, cl) == pytest.approx(share * n / 10e9, rel=1e-6)


def test_hybrid_reduction_over_an_uneven_group_reduces_every_rank():
    """ZeRO within nodes on 25 ranks of 8-GPU nodes (8 + 8 + 8 + 1): the thinnest node's
    one rank makes shards of 1, nothing sharded, and the reduction is the all-reduce of
    all 25 ranks, as without ZeRO (an audit found the all-reduce of 4 node
    representatives, the other 21 ranks unreduced); on 12 = 8 + 4 with shards of 4 the
    shard's 3 holders (two in the 8-rank node) all-reduce it."""
    cl = cluster(per_node=8)
    n = 1.5e8
    assert collective_time("hybrid_reduce", n, Group(25, 1, 4), cl)[0] == pytest.approx(
        collective_time("all_reduce", n, Group(25, 1, 4), cl)[0], rel=1e-12)
    inside = collective_time("reduce_scatter", n, Group(4, 4), cl)[0]
    across = collective_time("all_reduce", n / 4, Group(3, 1, 2), cl)[0]
    assert collective_time("hybrid_reduce", n, Group(12, 4, 2), cl)[0] == pytest.approx(
        inside + across, rel=1e-12)
    # an even group: one holder a node, as before
    assert collective_time("hybrid_reduce", n, Group(16, 8), cl)[0] == pytest.approx(
        collective_time("reduce_scatter", n, Group(8, 8), cl)[0]
        + collective_time("all_reduce", n / 8, Group(2, 1), cl)[0], rel=1e-12)


def test_the_parts_of_nccl_s_cross_node_costs_that_no_test_checked():
    """An audit of the tests found three terms of the collective models that could be
    changed unnoticed; each is checked here by hand on a cluster that makes it count.

    * all-to-all across nodes (NCCL's pairwise exchange): ``(w−1)α_intra + (p−q)α_net +
      max((p−q)/p·β_net, (w−1)/p·β_intra)·n``; with NVLink slower than the network
      a rank the NVLink term is the larger (16 ranks = 2 nodes of 8: 7/16 of the bytes
      at 10 GB/s against 8/16 at 100 GB/s).
    * the hybrid reduction's replicas of a shard over an uneven group: 13 = 8 + 5 makes
      shards of 5 held by ⌈13/5⌉ = 3 ranks (two in the 8-rank node), not 2.
    * a flat algorithm across nodes waits for the slower tier's latency, also where
      that is the node's own (an MPI ring over 2 nodes of 2 with α_intra 9 µs and
      α_net 2 µs: 2·3 steps of 9 µs)."""
    from planner.costs.comm import nccl_ring_time

    slow_links = cluster(per_node=8, intra=(2e-6, 10e9), inter=(5e-6, 100e9))
    n = 1e9
    by_hand = 7 * 2e-6 + 8 * 5e-6 + max(8 / 16 / 100e9, 7 / 16 / 10e9) * n
    assert nccl_ring_time("all_to_all", n, Group(16, 8), slow_links) == pytest.approx(
        by_hand, rel=1e-12)
    cl = cluster(per_node=8)
    inside = collective_time("reduce_scatter", n, Group(5, 5), cl)[0]
    across = collective_time("all_reduce", n / 5, Group(3, 1, 2), cl)[0]
    assert collective_time("hybrid_reduce", n, Group(13, 5, 2), cl)[0] == pytest.approx(
        inside + across, rel=1e-12)
    mpi = dataclasses.replace(cluster(per_node=2, intra=(9e-6, 100e9), inter=(2e-6, 10e9),
                                      algorithm="ring"), library="mpi")
    t, name = collective_time("all_reduce", 8.0, Group(4, 2), mpi)
    # 2(p−1) = 6 steps at the larger latency, 2(p−1)/p of the bytes at the slower link
    assert name == "ring"
    assert t == pytest.approx(6 * 9e-6 + 2 * 3 / 4 * 8.0 / 10e9, rel=1e-12)


def test_nvls_is_nccl_s_alone():
    """In-switch reduction is NCCL's (NVLS); under an MPI library a one-node all-reduce
    is one of MPI's algorithms (an audit found NVLS offered under MPI)."""
    cl = cluster(per_node=8, nvls_algbw=400e9, nvls_min_bytes=0.0)
    assert collective_time("all_reduce", 1e9, Group(8, 8), cl)[1] == "nvls"
    mpi = dataclasses.replace(cl, library="mpi")
    assert collective_time("all_reduce", 1e9, Group(8, 8), mpi)[1] != "nvls"


def test_large_uneven_groups_are_priced_as_uneven(monkeypatch):
    """Past NODE_GROUP_MAX_PAIRS the groups of one digit are worked out in closed form:
    2,052 consecutive ranks on 8-GPU nodes are 256 nodes of 8 and one of 4 (an audit
    found them priced as even, so 2,052 devices reduced faster than 2,044). The closed
    form equals the enumeration wherever both run, groups that begin inside a node
    included."""
    import planner.layout as lay

    assert lay.node_group(((1, 2052),), 2052, 8) == Group(2052, 4, 257)
    assert lay.node_group(((1, 2048),), 2048, 8) == Group(2048, 8)
    # found by an audit: 4 groups of 1,455 on 8-GPU nodes were priced as the first
    # (7 a node on 182 nodes); the second begins at device 1,455, the last of node 181,
    # alone there, and spans 183 nodes (1 + 181 full + 6 on the last)
    assert lay.node_group(((1, 1455),), 5820, 8) == Group(1455, 1, 183)
    for g in (4, 8, 12):
        for stride in (1, 2, 3, 4, 6):
            if g % stride or stride >= g:
                continue
            for count in range(2, 30):
                for groups in (1, 2, 3):
                    for offset in (0, 1, g - 1):
                        p = stride * count * groups
                        monkeypatch.setattr(lay, "NODE_GROUP_MAX_PAIRS", 10**12)
                        lay.node_group.cache_clear()
                        exact = lay.node_group(((stride, count),), p, g, offset)
                        monkeypatch.setattr(lay, "NODE_GROUP_MAX_PAIRS", 0)
                        lay.node_group.cache_clear()
                        assert lay.node_group(((stride, count),), p, g, offset) == exact, \
                            (g, stride, count, groups, offset)
