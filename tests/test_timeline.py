"""The overlap timeline (Lee et al., MLHPC 2018; REFERENCES §2) checked by hand."""

from __future__ import annotations

import pytest

from planner.evaluate import Options, evaluate, make_context
from planner.layout import make_layout

from .helpers import FixedEstimator, cluster, mlp

K = 1e-3  # every kernel takes 1 ms


def _run(overlap, bucket=0.0, bw=1e9):
    # 3 linear layers 1000→1000 without bias, no ReLU in between: fc1 has no input
    # gradient, so the backward kernels are 1, 2, 2 from the first layer, and the loss
    # on fc3's output adds one kernel forward and one backward (booked on fc3).
    net = mlp([1000, 1000, 1000, 1000], bias=False, relu=False)
    # two devices, α = 0: a ring all-reduce of n bytes takes 2·(1/2)·n/bw = n/bw
    cl = cluster(per_node=2, intra=(0.0, bw), algorithm="ring")
    opts = Options(gpus=2, batch=8, overlap=overlap, bucket_bytes=bucket)
    ctx = make_context(net, cl, opts, FixedEstimator(K))
    layouts = {lay.index: make_layout("data", 1, 2) for lay in net.layers}
    return evaluate(ctx, opts, layouts)


def test_no_overlap_is_serial():
    ev = _run("none")
    w = 1000 * 1000 * 4 / 1e9  # 4 ms per layer
    # forward 3 kernels and the loss's, backward the loss's then 2 + 2 + 1, then 3
    # all-reduces, then the optimizer step: one update kernel per layer
    assert ev.time_s == pytest.approx(4 * K + 6 * K + 3 * w + 3 * K, rel=1e-12)
    assert ev.compute_s == pytest.approx(13 * K)
    assert ev.exposed_comm_s == pytest.approx(3 * w)


def test_overlap_queue_on_one_channel():
    ev = _run("gradients")
    # forward ends at 4 ms; gradients ready at 4+1+2 = 7 ms (fc3, after the loss's
    # backward), 9 ms (fc2), 10 ms (fc1); the channel is busy until 7+4 = 11, then
    # 11+4 = 15, then 15+4 = 19; plus the optimizer step (3 kernels)
    assert ev.time_s == pytest.approx(19e-3 + 3 * K, rel=1e-12)
    assert [b["start_s"] for b in ev.buckets] == pytest.approx([7e-3, 11e-3, 15e-3])
    assert ev.exposed_comm_s == pytest.approx(ev.time_s - ev.compute_s)


def test_overlap_hides_fast_gradients():
    ev = _run("gradients", bw=1e12)  # 4 µs per all-reduce: hidden except the last
    assert ev.time_s == pytest.approx(10e-3 + 4e-6 + 3 * K, rel=1e-9)


def test_buckets_merge_layers():
    ev = _run("gradients", bucket=100 * 2**20)
    assert len(ev.buckets) == 1 and ev.buckets[0]["layers"] == 3
    # one all-reduce of 12 MB starting when fc1's gradient is ready (10 ms)
    assert ev.time_s == pytest.approx(10e-3 + 12e-3 + 3 * K, rel=1e-12)
    # each layer carries its share of the bucket: the sum is the bucket's time
    per_layer = sum(r.cost.comm("weight_grad") for r in ev.layers)
    assert per_layer == pytest.approx(ev.weight_grad_s)


def test_buckets_keep_process_groups_apart():
    """Rows and cols placements of one 4x2 grid reduce their weight gradients over
    column groups of the same shape (2 ranks in one node) but other members ({0, 4}
    against {0, 1}): DDP reduces them in separate process groups, so two buckets, where
    two layers of one placement share one."""
    net = mlp([1000, 1000, 1000], bias=False, relu=False)
    cl = cluster(per_node=8, intra=(0.0, 1e9), algorithm="ring")
    opts = Options(gpus=8, batch=8, overlap="gradients", bucket_bytes=100 * 2**20)
    ctx = make_context(net, cl, opts, FixedEstimator(K))
    fc1, fc2 = net.by_name("fc1").index, net.by_name("fc2").index
    same = evaluate(ctx, opts, {fc1: make_layout("model", 4, 2),
                                fc2: make_layout("model", 4, 2)})
    assert [b["layers"] for b in same.buckets] == [2]
    mixed = evaluate(ctx, opts, {fc1: make_layout("model", 4, 2),
                                 fc2: make_layout("model", 4, 2, "cols")})
    assert [b["layers"] for b in mixed.buckets] == [1, 1]
    # each a ring all-reduce of its 1/4 shard (1 MB) over 2 ranks: n/bw = 1 ms
    assert [b["end_s"] - b["start_s"] for b in mixed.buckets] == pytest.approx([1e-3, 1e-3])
