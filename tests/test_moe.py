"""Mixtures of experts (``type: moe``) and expert parallelism (``expert``,
``expert-sp``): shape inference, kernels, collectives and memory worked out by hand.

A router (``dim → experts``, no bias) sends each token to ``top_k`` of ``experts``
MLPs ``dim → ffn → dim`` (Shazeer et al., ICLR 2017; GShard, Lepikhin et al., ICLR
2021); under expert parallelism each device of a row group holds ``1/P_r`` of the
experts and all-to-alls carry the routed tokens to them and back (DeepSpeed-MoE,
Rajbhandari et al., ICML 2022)."""

from __future__ import annotations

import json

import pytest

from planner.costs.layer import held, local_params, shards, weighted_kernels, weighted_terms
from planner.evaluate import (
    Options,
    evaluate,
    make_context,
    own_kept_bytes,
    question_param_bytes,
)
from planner.inputs import load_network, load_network_text
from planner.layout import input_dist, make_layout
from planner.network import layer_summary
from planner.ops import Elementwise, Gemm
from planner.strategies import candidate_layouts, megatron_modes, why_invalid

from .conftest import CLUSTERS, NETWORKS, invoke
from .helpers import FixedEstimator, cluster, solved

B, E = 16, 4  # batch, bytes per element (fp32)
SEQ, DIM, EXPERTS, TOP, FFN = 32, 64, 8, 2, 128
#: one SwiGLU expert: the gate and up projections (64 → 2 · 128) and the down one
EXPERT = DIM * 2 * FFN + FFN * DIM  # 24,576
ROUTER = DIM * EXPERTS  # 512


def _net(extra: str = "", activation: str = "swiglu"):
    """A pre-norm decoder block whose MLP is a mixture of 8 experts, top-2."""
    return load_network_text(f"""
kind: network
name: moe
input: [{SEQ}, {DIM}]
layers:
  - name: attn
    type: residual
    body:
      - {{name: ln, type: rmsnorm}}
      - {{name: sa, type: attention, heads: 8, flash: true, causal: true, bias: false}}
  - name: mlp
    type: residual
    body:
      - {{name: ln, type: rmsnorm}}
      - {{name: moe, type: moe, experts: {EXPERTS}, top_k: {TOP}, ffn: {FFN},
          activation: {activation}{extra}}}
  - {{name: head, type: linear, out_features: 16, bias: false}}
""")


def _ctx(net, p=8, **kw):
    opts = Options(gpus=p, batch=B, overlap="none", **kw)
    return make_context(net, cluster(per_node=8), opts, FixedEstimator(1e-5)), opts


def _terms(terms):
    return sorted((t.phase, t.collective, t.group.size, t.bytes, t.note) for t in terms)


def test_mixtral_counts_by_hand():
    """Mixtral 8x7B (Jiang et al. 2024, Table 1: width 4096, 32 blocks, 32 heads of 128
    with 8 key/value heads, 8 experts of 14,336, top-2, vocabulary 32,000): per block
    4096 · (4096 + 2 · 1024) + 4096 · 4096 (attention), 8 · 3 · 4096 · 14,336 (experts),
    4096 · 8 (router), 2 · 4096 (norms); ×32, plus the table, the head and the final
    norm: 46,702,792,704, the count its release gives. A token's forward multiplies
    through the router and 2 experts: 4096 · 8 + 2 · 3 · 4096 · 14,336 = 352,354,304
    multiply-accumulates."""
    net = load_network(NETWORKS / "mixtral-8x7b.yaml")
    block = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 8 * 3 * 4096 * 14336 + 4096 * 8 \
        + 2 * 4096
    assert net.params == 32 * block + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    moe = net.by_name("layers.0.moe.experts")
    assert moe.params == 8 * 3 * 4096 * 14336 + 4096 * 8
    assert moe.macs == 4096 * 352_354_304
    assert moe.model_split_limit == 14336
    shown = layer_summary(moe, net, 1)["moe"]
    assert shown["active_params"] == 4096 * 8 + 2 * 3 * 4096 * 14336
    assert (shown["experts"], shown["top_k"], shown["capacity_factor"]) == (8, 2, None)


def test_show_totals_the_active_parameters(runner):
    """The README says `planner show` gives both counts; its totals and table gave only
    all of them (an audit). Mixtral's active ones by hand: a block's attention and
    norms, 4096 · (4096 + 2 · 1024) + 4096 · 4096 + 2 · 4096, its router, 4096 · 8, and
    2 of its 8 experts, 2 · 3 · 4096 · 14,336; ×32, plus the table, the head and the
    final norm: 12,879,925,248 (12.9B, Jiang et al. 2024). A dense network has none."""
    block = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 2 * 4096 + 4096 * 8 \
        + 2 * 3 * 4096 * 14336
    want = 32 * block + 2 * 32000 * 4096 + 4096
    assert want == 12_879_925_248
    r = invoke(runner, "show", NETWORKS / "mixtral-8x7b.yaml", "--format", "json")
    assert json.loads(r.stdout)["totals"]["active_params"] == want
    r = invoke(runner, "show", NETWORKS / "mixtral-8x7b.yaml")
    assert "parameters: 46,702,792,704 (86.99 GiB in bfloat16), 12,879,925,248 active a " \
           "token;" in " ".join(r.stdout.split()), r.stdout
    r = invoke(runner, "show", NETWORKS / "llama3-8b.yaml", "--format", "json")
    assert "active_params" not in json.loads(r.stdout)["totals"]


def test_shape_and_saved_by_hand():
    """Per sample: its 32 tokens' router probabilities (8 each) and per routed row (2 a
    token) the permuted input (64), the gate and up outputs (256), the activation's
    output (128) and the expert's output (64); with a capacity factor of 1.25, buffers
    of 1.25 times the rows. The chosen experts' indices, int64."""
    layer = _net().by_name("mlp.moe")
    assert layer.params == EXPERTS * EXPERT + ROUTER
    assert layer.macs == SEQ * (ROUTER + TOP * EXPERT)
    # 2 FLOPs a multiply-accumulate; softmax and top-k 5 an expert; SwiGLU 5 a hidden
    # feature; the weighted sum 2 an element of each routed row
    assert layer.flops == 2 * layer.macs + SEQ * (5 * EXPERTS + TOP * (5 * FFN + 2 * DIM))
    assert layer.saved_internal == SEQ * EXPERTS + SEQ * TOP * (2 * DIM + 2 * FFN + FFN)
    assert layer.saved_bytes_extra == SEQ * TOP * 8
    capped = _net(", capacity_factor: 1.25").by_name("mlp.moe")
    assert capped.saved_internal == SEQ * EXPERTS + 80 * (2 * DIM + 2 * FFN + FFN)
    gelu = _net(activation="gelu").by_name("mlp.moe")
    assert gelu.params == EXPERTS * (DIM * FFN + FFN * DIM) + ROUTER


def test_kernels_by_hand():
    """Data parallel on 8 devices (2 samples, 64 tokens a device): the router GEMM 64 × 8
    × 64; each of the 8 experts multiplies ⌈2 · 64 / 8⌉ = 16 rows, as one batched GEMM
    of 8 (gate and up: 16 × 256 × 64; down: 16 × 64 × 128). Expert parallel over 4
    (``expert 4x2``): 2 experts a device, each taking the rows the 4 devices' 64 tokens
    route to it, 2 · 256 / 8 = 64. A capacity factor of 1.25 pads each to ⌈1.25 · 16⌉ =
    20. Each expert's hidden features split 4 ways (``model 4x2``, 8 samples): 32 of them,
    every expert on the 256 tokens, 64 rows each."""
    net = _net()
    ctx, _ = _ctx(net)
    moe = net.by_name("mlp.moe")

    def gemms(lay, c=ctx, layer=moe):
        ks = weighted_kernels(layer, lay, c)
        return {ph: [(k.m, k.n, k.k, k.batch) for k in ks[ph] if isinstance(k, Gemm)]
                for ph in ks}

    data = gemms(make_layout("data", 1, 8))
    assert data["forward"] == [(64, 8, 64, 1), (16, 256, 64, 8), (16, 64, 128, 8)]
    assert data["backward_data"] == [(16, 128, 64, 8), (16, 64, 256, 8), (64, 64, 8, 1)]
    assert data["backward_weight"] == [(64, 128, 16, 8), (256, 64, 16, 8), (8, 64, 64, 1)]
    assert gemms(make_layout("expert", 4, 2))["forward"] == [
        (64, 8, 64, 1), (64, 256, 64, 2), (64, 64, 128, 2)]
    # expert-sp 4x2: 8 samples of 8 of the 32 tokens, the same 64 tokens a device
    assert gemms(make_layout("expert-sp", 4, 2)) == gemms(make_layout("expert", 4, 2))
    assert gemms(make_layout("model", 4, 2))["forward"] == [
        (256, 8, 64, 1), (64, 64, 64, 8), (64, 64, 32, 8)]
    capped = _net(", capacity_factor: 1.25")
    c2, _ = _ctx(capped)
    assert gemms(make_layout("data", 1, 8), c2, capped.by_name("mlp.moe"))["forward"][1] \
        == (20, 256, 64, 8)
    # the memory-bound passes: the permutation reads the 64 tokens and writes their 128
    # routed rows, the combine the reverse (and 2 FLOPs an element of each row)
    fwd = weighted_kernels(moe, make_layout("data", 1, 8), ctx)["forward"]
    passes = {k.label: k for k in fwd if isinstance(k, Elementwise)}
    assert passes["permute"].bytes == (64 + 128) * DIM * E
    assert passes["combine"].flops == 2 * 128 * DIM
    # SwiGLU reads the 8 · 16 rows' 256 gate and up features and writes 128
    assert passes["swiglu"].bytes == (256 + 128) * 8 * 16 * E


def test_expert_terms_by_hand():
    """``expert 4x2`` on 8 devices in one node, 2 samples a device: the routed rows a
    device sends are its 64 tokens × 2 experts, 128 rows of 64 (32 KiB in fp32), in an
    all-to-all over the row group of 4 to dispatch and one to combine, forward, and
    both again backward. Its 2 experts' weight gradient is reduced over their 2
    replicas, the router's (held whole) over all 8. ``expert-sp 4x2`` routes the same
    64 tokens a device (8 of 32 tokens of 8 samples)."""
    net = _net()
    ctx, _ = _ctx(net)
    moe = net.by_name("mlp.moe")
    buf = 64 * TOP * DIM * E
    a2a = [("forward", "all_to_all", 4, buf, "dispatch"),
           ("forward", "all_to_all", 4, buf, "combine"),
           ("backward_data", "all_to_all", 4, buf, "combine gradient"),
           ("backward_data", "all_to_all", 4, buf, "dispatch gradient")]
    grads = [("weight_grad", "all_reduce", 2, 2 * EXPERT * E, ""),
             ("weight_grad", "all_reduce", 8, ROUTER * E, "")]
    for mode in ("expert", "expert-sp"):
        assert _terms(weighted_terms(moe, make_layout(mode, 4, 2), ctx)) == sorted(a2a + grads)
    assert local_params(moe, make_layout("expert", 4, 2)) == 2 * EXPERT + ROUTER
    # a capacity factor of 1.25: buffers of 160 rows
    capped = _net(", capacity_factor: 1.25")
    c2, _ = _ctx(capped)
    terms = weighted_terms(capped.by_name("mlp.moe"), make_layout("expert", 4, 2), c2)
    assert terms[0].bytes == 160 * DIM * E


def test_load_imbalance_by_hand():
    """``load_imbalance: 1.5``: the busiest expert takes 1.5 times its even share. Under
    ``expert 4x2`` a device holds 2 experts, so the busiest device receives (1 + 1.5) / 2
    = 1.25 times its even share: each of its 2 experts' products runs ⌈1.25 · 64⌉ = 80
    rows (the grouped GEMM's total, 160), its all-to-all buffers are 1.25 · 128 = 160
    rows, and it keeps 1.25 times the routed rows' tensors, per sample ``32 · 8 +
    ⌈1.25 · 32 · 2 · (2 · 64 + 256 + 128)⌉ = 256 + 40,960`` elements. Under ``expert
    8x1`` (one expert a device) the busiest takes 1.5 · 128 = 192 rows. Where a device
    holds every expert (data, model) its rows are its own tokens', however uneven."""
    net = _net(", load_imbalance: 1.5")
    moe = net.by_name("mlp.moe")
    assert moe.moe is not None and moe.moe.busiest(2) == 1.25 and moe.moe.busiest(8) == 1
    ctx, _ = _ctx(net)
    even, _ = _ctx(_net())

    def gemms(lay, c):
        layer = c.network.by_name("mlp.moe")
        return [(k.m, k.n, k.k, k.batch) for k in weighted_kernels(layer, lay, c)["forward"]
                if isinstance(k, Gemm)]

    assert gemms(make_layout("expert", 4, 2), ctx) == [
        (64, 8, 64, 1), (80, 256, 64, 2), (80, 64, 128, 2)]
    assert gemms(make_layout("expert", 8, 1), ctx)[1] == (192, 256, 64, 1)
    for lay in (make_layout("data", 1, 8), make_layout("model", 4, 2)):
        assert gemms(lay, ctx) == gemms(lay, even)
    terms = weighted_terms(moe, make_layout("expert", 4, 2), ctx)
    assert [t.bytes for t in terms if t.collective == "all_to_all"] == [160 * DIM * E] * 4
    lay = make_layout("expert", 4, 2)
    assert own_kept_bytes(moe, lay, input_dist(lay), B, E) == 2 * (
        (256 + 40_960) * E + moe.saved_bytes_extra)
    assert layer_summary(moe, net, 1)["moe"]["load_imbalance"] == 1.5


def test_model_terms_by_hand():
    """``model 4x2`` (every expert's hidden features split 4 ways, 8 samples a batch
    block): the partial outputs are all-reduced over the row group, as a row-parallel
    layer's, and the input gradient's; each device holds the router and 32 of every
    expert's 128 hidden features, reduced over the column group of 2. ``model-sp``
    gathers the tokens and reduce-scatters the output instead."""
    net = _net()
    ctx, _ = _ctx(net)
    moe = net.by_name("mlp.moe")
    x = 8 * SEQ * DIM * E
    held = ROUTER + EXPERTS * (DIM * 2 * 32 + 32 * DIM)
    assert local_params(moe, make_layout("model", 4, 2)) == held
    assert _terms(weighted_terms(moe, make_layout("model", 4, 2), ctx)) == sorted([
        ("forward", "all_reduce", 4, x, ""), ("backward_data", "all_reduce", 4, x, ""),
        ("weight_grad", "all_reduce", 2, held * E, "")])
    sp = _terms(weighted_terms(moe, make_layout("model-sp", 4, 2), ctx))
    assert ("forward", "reduce_scatter", 4, x, "tokens") in sp
    assert ("forward", "all_gather", 4, x, "tokens") in sp
    # no second gather backward: the layer keeps its routed rows of every token and the
    # router reads the device's own (an audit found it charged as attention's is); with
    # shared experts, a tensor-parallel MLP keeping its share of its input, it is
    assert [t for t in sp if t[4] == "tokens again"] == []
    shared = _net(", shared_experts: 2, shared_ffn: 32").by_name("mlp.moe")
    assert ("backward_data", "all_gather", 4, x, "tokens again") in _terms(
        weighted_terms(shared, make_layout("model-sp", 4, 2), ctx))


def test_memory_by_hand():
    """What the layer keeps besides its input: data parallel, 2 samples of the per-sample
    count above; ``model 4x2`` (8 samples) with 32 hidden features an expert:
    ``32 · 8 + 64 · (128 + 64 + 32)``; ``expert 4x2``, 2 samples, as data parallelism
    (each device's experts receive as many rows as it sends); ``expert-sp 4x2``, 8
    samples of a quarter of the tokens."""
    moe = _net().by_name("mlp.moe")
    per = moe.saved_internal * E + moe.saved_bytes_extra

    def kept(lay):
        return own_kept_bytes(moe, lay, input_dist(lay), B, E)

    assert kept(make_layout("data", 1, 8)) == 2 * per
    assert kept(make_layout("expert", 4, 2)) == 2 * per
    assert kept(make_layout("expert-sp", 4, 2)) == 8 * per / 4
    assert kept(make_layout("model", 4, 2)) == 8 * ((256 + 64 * 224) * E
                                                    + moe.saved_bytes_extra)


def test_zero_shards_experts_over_their_replicas():
    """ZeRO stage 1 shards a layer's optimizer state over the devices that reduce its
    gradient: for ``expert 4x2`` the experts' 2 replicas (the router, reduced over all 8,
    is a few hundred bytes and sharded as they are)."""
    net = _net()
    ctx, _ = _ctx(net, zero=1)
    terms = weighted_terms(net.by_name("mlp.moe"), make_layout("expert", 4, 2), ctx)
    assert shards(terms) == 2


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("mode", ["expert", "expert-sp"])
def test_zero_leaves_experts_without_replicas_whole(zero, mode):
    """Under ``expert 8x1`` each device holds the only copy of its expert: ZeRO has no
    replica to shard it over (Rajbhandari et al. 2020, §5: the state is partitioned over
    the data-parallel processes that hold the same parameters), and only the router is
    reduced, over all 8. That reduction had sharded the experts 1/8 (an audit: Mixtral
    8x7B on 8 H100s with ZeRO 1 said 69.22 GiB, fits, where its experts' state alone is
    63 GiB a device). By hand, Mixtral's first MoE layer in bf16 with Adam: one expert,
    3 · 4,096 · 14,336 = 176,160,768 parameters, and the router's 4,096 · 8 = 32,768,
    at 2 + 2 + 12 bytes each whatever the stage: 2,819,096,576 bytes; no gather of the
    experts at stage 3, the router's over all 8."""
    net = load_network(NETWORKS / "mixtral-8x7b.yaml").in_dtype("bfloat16")
    opts = Options(gpus=8, batch=8, optimizer="adam", zero=zero)
    ctx = make_context(net, cluster(per_node=8), opts, FixedEstimator(1e-5))
    layer = net.by_name("layers.0.moe.experts")
    terms = weighted_terms(layer, make_layout(mode, 8, 1), ctx)
    assert shards(terms) == 1
    assert local_params(layer, make_layout(mode, 8, 1)) == 176_160_768 + 32_768
    each = held(question_param_bytes(net, opts), zero, terms).total
    assert local_params(layer, make_layout(mode, 8, 1)) * each == 2_819_096_576
    gathers = [(t.group.size, t.bytes) for t in terms if t.phase == "parameters"]
    assert gathers == [(8, 32_768 * 2)] * (2 if zero == 3 else 1)
    assert all(t.aside for t in terms if t.phase in ("parameters", "weight_grad"))


def test_which_layouts_apply():
    """Expert layouts split a mixture of experts whose experts ``P_r`` divides:
    ``expert`` when every device has a sample, ``expert-sp`` on at least ``P_r`` tokens
    (rows placement in the search); not under the paper's accounting, and not on another
    layer."""
    net = _net()
    moe = net.by_name("mlp.moe")
    modes = {(lay.mode, lay.pr, lay.placement) for lay in candidate_layouts(moe, 8, B)}
    assert {("expert", 2, "rows"), ("expert", 2, "cols"), ("expert", 4, "rows"),
            ("expert", 8, "rows"), ("expert-sp", 4, "rows")} <= modes
    assert ("expert-sp", 4, "cols") not in modes
    assert {m for m, _, _ in modes} == {"data", "model", "model-sp", "domain", "expert",
                                        "expert-sp"}
    # 6 devices: P_r = 3 and 6 do not divide 8 experts
    assert {lay.pr for lay in candidate_layouts(moe, 6, B) if lay.mode == "expert"} == {2}
    assert "P_r=3 does not divide its 8 experts" in why_invalid(
        moe, make_layout("expert", 3, 2), B)
    # 16 devices, 8 samples: expert needs a sample a device, expert-sp does not
    assert "more than the batch 8 (use expert-sp" in why_invalid(
        moe, make_layout("expert", 4, 4), 8)
    assert why_invalid(moe, make_layout("expert-sp", 4, 4), 8) is None
    assert "type: moe" in why_invalid(net.by_name("head"), make_layout("expert", 4, 2), B)
    assert "gholami2018" in why_invalid(moe, make_layout("expert", 4, 2), B, paper=True)
    assert "128 hidden features an expert, fewer than P_r=256" in why_invalid(
        moe, make_layout("model", 256, 1), B)
    # Megatron-LM's baselines split the experts as tensor parallelism (model, model-sp)
    assert megatron_modes(net, sequence=True)[moe.index] == "model-sp"


@pytest.mark.parametrize("p", [8, 32])
@pytest.mark.parametrize("held", [None, "expert", "expert-sp"])
def test_program_equals_evaluation(p, held):
    """The search over every layout, and with the mixture held to an expert-parallel
    layout (the others free): the dynamic program's value is the evaluation of its
    answer (to 1e-12)."""
    net = _net()
    moe = net.by_name("mlp.moe")
    pins = {moe.index: [make_layout(held, 4, p // 4)]} if held else None
    value, assignment, ev = solved(*_ctx(net, p), pins)
    assert value == pytest.approx(ev.time_s, rel=1e-12)
    if held:
        assert assignment[moe.index].mode == held


def test_no_move_between_sequence_parallel_attention_and_expert_sp():
    """``expert-sp`` takes its tokens split over the row group, where a ``model-sp``
    attention layer's reduce-scatter leaves them (Megatron-LM's tensor and sequence
    parallelism with expert parallelism over the same ranks), and ``expert`` its
    batch split over all devices, where data parallelism leaves it."""
    assert input_dist(make_layout("expert-sp", 4, 2)) == \
        make_layout("model-sp", 4, 2).output_dist()
    assert input_dist(make_layout("expert", 4, 2)) == make_layout("data", 1, 8).output_dist()
    net = _net()
    ctx, opts = _ctx(net)
    idx = {lay.name: lay.index for lay in net.layers if lay.has_weights}
    ev = evaluate(ctx, opts, {idx["attn.sa"]: make_layout("model-sp", 4, 2),
                              idx["mlp.moe"]: make_layout("expert-sp", 4, 2),
                              idx["head"]: make_layout("data", 1, 8)})
    moe = next(r for r in ev.layers if r.layer.name == "mlp.moe")
    assert not [t for t in moe.cost.terms if t.phase == "redistribute"]


def test_mixtral_plan_uses_expert_parallelism(runner):
    """Mixtral 8x7B on 64 H100s, 64 sequences of 4,096 tokens, Adam with ZeRO stage 1:
    the plan splits every mixture's experts 8 ways; pinned to data parallelism they
    need more memory than the device has."""
    args = [NETWORKS / "mixtral-8x7b.yaml", CLUSTERS / "dgx-h100.yaml",
            "-p", "64", "-b", "64", "--optimizer", "adam", "--zero", "1"]
    result = invoke(runner, "plan", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["memory"]["fits"]
    moes = [rec for rec in doc["layers"] if rec["type"] == "moe"]
    assert len(moes) == 32
    assert {(rec["mode"], rec["grid"][0]) for rec in moes} <= {("expert", 8),
                                                               ("expert-sp", 8)}
    pinned = invoke(runner, "cost", *args, "--pin", "*.experts=data")
    assert pinned.exit_code == 1 and "DOES NOT FIT" in pinned.stdout


def test_bad_descriptions_exit_2(runner, tmp_path):
    """A mixture with more experts a token than it has, an unknown activation, or an
    image input: exit 2 at the key, never a traceback."""
    base = ("kind: network\nname: bad\ninput: [32, 64]\nlayers:\n"
            "  - {type: moe, experts: 4, ffn: 128")
    cases = {", top_k: 5}\n": ("net.yaml:5:46: ", "top_k=5 is more than its 4 experts"),
             ", activation: swish}\n": ("net.yaml:5:51: ", "expected one of swiglu"),
             ", load_imbalance: 0.5}\n": ("net.yaml:5:55: ", "load_imbalance"),
             ", load_imbalance: 3}\n": ("net.yaml:5:55: ", "more than experts / top_k = 2"),
             ", load_imbalance: 1.2, capacity_factor: 1.5}\n": (
                 "net.yaml:5:55: ", "give load_imbalance for dropless routing"),
             "}\n": None}
    for tail, expected in cases.items():
        path = tmp_path / "net.yaml"
        path.write_text(base + tail)
        result = invoke(runner, "show", str(path))
        if expected is None:
            assert result.exit_code == 0, result.output
            continue
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        for part in expected:
            assert part in result.output, result.output
    image = tmp_path / "img.yaml"
    image.write_text("kind: network\ninput: [3, 8, 8]\nlayers:\n"
                     "  - {type: moe, experts: 4, ffn: 8}\n")
    result = invoke(runner, "show", str(image))
    assert result.exit_code == 2 and "needs a sequence [seq, dim]" in result.output


#: two shared experts of 32 hidden features: one SwiGLU MLP 64 → 2 · 64 → 64
SHARED = DIM * 2 * 64 + 64 * DIM  # 12,288


def test_deepseek_moe_counts_by_hand():
    """DeepSeekMoE 16B (Dai et al. 2024, arXiv 2401.06066: 16.4B parameters; its
    released configuration: width 2048, 28 blocks of 16 heads, the first block's MLP
    dense at 10,944, the others 64 routed experts of 1,408 with top-6 and 2 shared
    experts of 1,408, vocabulary 102,400, untied head): 2 · 102,400 · 2048 + 28 · 4 ·
    2048² + 3 · 2048 · 10,944 + 27 · (2048 · 64 + 64 · 3 · 2048 · 1408 + 2 · 3 · 2048 ·
    1408) + 28 · 2 · 2048 + 2048 = 16,375,728,128. A token multiplies through the
    router, 6 routed and both shared experts: 2048 · 64 + 8 · 3 · 2048 · 1408."""
    net = load_network(NETWORKS / "deepseek-moe-16b.yaml")
    assert net.params == 2 * 102400 * 2048 + 28 * 4 * 2048 ** 2 + 3 * 2048 * 10944 + 27 * (
        2048 * 64 + 64 * 3 * 2048 * 1408 + 2 * 3 * 2048 * 1408) + 28 * 2 * 2048 + 2048 \
        == 16_375_728_128
    moe = net.by_name("moe_layers.0.moe.experts")
    assert moe.macs == 4096 * (2048 * 64 + 8 * 3 * 2048 * 1408)
    shown = layer_summary(moe, net, 1)["moe"]
    assert (shown["shared_experts"], shown["shared_ffn"]) == (2, 1408)
    assert shown["active_params"] == 2048 * 64 + 8 * 3 * 2048 * 1408


def test_shared_experts_by_hand():
    """``shared_experts: 2, shared_ffn: 32``: every token also goes through one SwiGLU
    MLP of 64 hidden features (12,288 parameters), its output added to the routed
    experts'. Per sample it keeps that MLP's gate and up outputs (128) and its
    activation's (64) a token. Under ``model 4x2`` its hidden features split as each
    expert's (16 a device: 192 · 16 = 3,072 parameters, the products on the batch
    block's 256 tokens); under ``expert 4x2`` every device holds it whole and runs it on
    its own 64 tokens, and its gradient is reduced over all 8 devices with the router's,
    the routed experts' over their 2 replicas."""
    net = _net(", shared_experts: 2, shared_ffn: 32")
    moe = net.by_name("mlp.moe")
    plain = _net().by_name("mlp.moe")
    assert moe.params == plain.params + SHARED
    assert moe.macs == plain.macs + SEQ * SHARED
    assert moe.flops == plain.flops + 2 * SEQ * SHARED + SEQ * (5 * 64 + DIM)
    assert moe.saved_internal == plain.saved_internal + SEQ * (128 + 64)
    ctx, _ = _ctx(net)

    def shared_gemms(lay):
        ks = weighted_kernels(moe, lay, ctx)
        return [[(k.m, k.n, k.k) for k in ks[ph] if isinstance(k, Gemm) and k.batch == 1]
                for ph in ("forward", "backward_data", "backward_weight")]

    # the router's GEMM, then the shared MLP's: up, down; backward the down's and up's
    # input gradients (after the router's), their weight gradients (before the router's)
    model = make_layout("model", 4, 2)
    assert shared_gemms(model) == [[(256, 8, 64), (256, 32, 64), (256, 64, 16)],
                                   [(256, 64, 8), (256, 16, 64), (256, 64, 32)],
                                   [(8, 64, 256), (16, 64, 256), (64, 32, 256)]]
    expert = make_layout("expert", 4, 2)
    assert shared_gemms(expert) == [[(64, 8, 64), (64, 128, 64), (64, 64, 64)],
                                    [(64, 64, 8), (64, 64, 64), (64, 64, 128)],
                                    [(8, 64, 64), (64, 64, 64), (64, 128, 64)]]
    assert local_params(moe, model) == ROUTER + EXPERTS * 192 * 32 + 192 * 16
    assert local_params(moe, expert) == ROUTER + 2 * EXPERT + SHARED
    grads = [(t.group.size, t.bytes) for t in weighted_terms(moe, expert, ctx)
             if t.phase == "weight_grad"]
    assert grads == [(2, 2 * EXPERT * E), (8, (ROUTER + SHARED) * E)]
    # kept: model 4x2, 8 samples a device, each expert's 32 and the shared 16 hidden
    # features: 32 · (8 + 32 + 16) + 32 · 2 · (2 · 64 + 64 + 32) a sample
    assert own_kept_bytes(moe, model, input_dist(model), B, E) == 8 * (
        (32 * 56 + 64 * 224) * E + moe.saved_bytes_extra)


def test_shared_ffn_needs_shared_experts(runner, tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text("kind: network\ninput: [32, 64]\nlayers:\n"
                    "  - {type: moe, experts: 8, ffn: 128, shared_ffn: 64}\n")
    out = invoke(runner, "show", path)
    assert out.exit_code == 2 and "n.yaml:4:" in out.stderr, out.stderr
    assert "shared_ffn sizes the shared experts, and it has none" in out.stderr
