"""Two convolutions of the same work are not timed apart by the shape the kernel models
were not shown: a band of an image (domain parallelism) against the batch split of the
same work, and a grouped convolution against its groups stacked into the batch.

Both were found by an expert audit (2026-12-07): VGG-16 on 8 A100s at batch 256 planned
a height split of every convolution, 13% faster than data parallelism from compute alone
(the same implicit GEMM, timed 15% apart), and AlexNet's grouped convolutions, which no
training data covers, fell to the roofline and were priced slower on an A100 than the
same layer ungrouped with twice the FLOPs."""

from __future__ import annotations

import json

import pytest

from planner.cluster import lookup_device
from planner.kernels import LearnedEstimator
from planner.ops import Conv

from .conftest import CLUSTERS, NETWORKS, invoke

A100 = lookup_device("A100-SXM-80GB")


@pytest.fixture(scope="module")
def est() -> LearnedEstimator:
    return LearnedEstimator()


def test_a_band_knows_its_batch_split_by_hand():
    """VGG-16's conv1_2 (64 → 64 channels, 3 × 3, padding 1, 224 × 224) on a device
    of domain 8x1 at 1,024 images: 28 output rows of each image, read from 30 input
    rows, unpadded in height. The batch split of the same work is 1,024 / 8 = 128 whole
    images, with the layer's padding; the work is the same, 1,024 · 28 = 128 · 224
    output rows. With 10 images in 8 bands: ceil(10 / 8) = 2 whole images against 10
    bands of 28 rows, 280 / 448 = 0.625 of the work."""
    band = Conv(1024, 64, 30, 224, 64, 3, 3, pad_h=0, pad_w=1, bands=8, full_h=224,
                full_pad_h=1)
    assert band.out_h == 28
    whole, work = band.batch_split()
    assert whole == Conv(128, 64, 224, 224, 64, 3, 3, pad_h=1, pad_w=1)
    assert whole.out_h == 224 and work == 1.0
    small = Conv(10, 64, 30, 224, 64, 3, 3, pad_h=0, pad_w=1, bands=8, full_h=224,
                 full_pad_h=1)
    assert small.batch_split() == (Conv(2, 64, 224, 224, 64, 3, 3, pad_h=1, pad_w=1), 0.625)
    assert Conv(128, 64, 224, 224, 64, 3, 3, pad_h=1, pad_w=1).batch_split() is None


@pytest.mark.parametrize("phase", ["fwd", "bwd_data", "bwd_filter"])
def test_a_band_is_no_faster_than_its_batch_split(est, phase):
    """Each pass of a band is timed at least as its batch split's time times the work
    ratio (to float32's rounding, :data:`TIME_BITS`), and a band the models time
    slower keeps its own time."""
    band = Conv(1024, 64, 30, 224, 64, 3, 3, pad_h=0, pad_w=1, bands=8, full_h=224,
                full_pad_h=1, phase=phase)
    whole, work = band.batch_split()
    t = est.estimate([band, whole], A100, "float32")
    own = est.estimate([Conv(1024, 64, 30, 224, 64, 3, 3, pad_h=0, pad_w=1, phase=phase)],
                       A100, "float32").seconds[0]
    assert t.seconds[0] == pytest.approx(max(own, work * t.seconds[1]), rel=1.2e-7)
    assert t.seconds[0] >= work * t.seconds[1] * (1 - 1.2e-7)
    if own < work * t.seconds[1]:
        assert t.source[0].endswith("(as a batch split)"), t.source[0]


def test_vgg16_is_data_parallel_on_8_a100s(runner):
    """The audit's case: at batch 256 on 8 A100s the convolutions now take data
    parallelism, and no convolution's compute under the plan is below its data-parallel
    compute (it was: 7 of 13 height-split, 102.4 ms of compute against 118 ms)."""
    args = (NETWORKS / "vgg16.yaml", CLUSTERS / "dgx-a100.yaml", "-p", "8", "-b", "256",
            "--format", "json")
    plan = json.loads(invoke(runner, "plan", *args).stdout)
    data = json.loads(invoke(runner, "cost", *args, "--mode", "data").stdout)
    convs = [r for r in plan["layers"] if r["type"] == "conv2d"]
    assert len(convs) == 13 and all(r["mode"] == "data" for r in convs), \
        [(r["name"], r["mode"]) for r in convs]
    by_name = {r["name"]: r for r in data["layers"]}
    for r in convs:
        assert r["compute_s"] >= by_name[r["name"]]["compute_s"] * (1 - 1e-6)


def test_resnet50_takes_no_height_split_at_32_images_a_gpu(runner):
    """The audit's second case: 32 images a GPU on 1 and 2 A100s gave 432 and 871
    samples/s, 2.016 times, from height splits. Now no convolution is split by height,
    and the two GPUs run 2.002 times the samples (what is left: two layers split by
    channels, whose optimizer steps and gradients halve)."""
    one, two = (json.loads(invoke(runner, "plan", NETWORKS / "resnet50.yaml",
                                  CLUSTERS / "dgx-a100.yaml", "-p", str(p), "-b",
                                  str(32 * p), "--format", "json").stdout)
                for p in (1, 2))
    assert not [r["name"] for r in two["layers"] if r["mode"] == "domain"]
    assert two["iteration"]["samples_per_s"] / one["iteration"]["samples_per_s"] < 2.005


def test_a_grouped_convolution_is_its_groups_stacked(est):
    """AlexNet's conv2 (96 → 256 channels in 2 groups, 5 × 5 on 27 × 27, padding 2),
    128 images: timed by the model as 256 images of 48 → 128 channels ungrouped, to the
    bit, in each pass; the source says so. Half the FLOPs of the same layer ungrouped,
    it is timed faster than that layer (it was slower on an A100: the roofline at the
    FP32 peak, against the model's TF32 and Winograd rates)."""
    for phase in ("fwd", "bwd_data", "bwd_filter"):
        grouped = Conv(128, 96, 27, 27, 256, 5, 5, pad_h=2, pad_w=2, groups=2, phase=phase)
        stacked = Conv(256, 48, 27, 27, 128, 5, 5, pad_h=2, pad_w=2, phase=phase)
        whole = Conv(128, 96, 27, 27, 256, 5, 5, pad_h=2, pad_w=2, phase=phase)
        t = est.estimate([grouped, stacked, whole], A100, "float32")
        assert t.seconds[0] == t.seconds[1]
        assert t.source[0] == t.source[1] + " (groups as batch)", t.source
        assert t.source[0].startswith("mlp:conv_"), t.source
        assert t.seconds[0] < t.seconds[2]


def test_a_depthwise_convolution_stays_with_the_roofline(est):
    """32 groups of one channel each: stacked, 1 → 1 channel is beyond the data, so the
    roofline (plus the launch floor) times it, as before."""
    t = est.estimate([Conv(64, 32, 56, 56, 32, 3, 3, pad_h=1, pad_w=1, groups=32)], A100,
                     "float32")
    assert t.source == ("roofline (out of range)",)
