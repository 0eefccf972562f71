"""Megatron-LM's sequence parallelism (Korthikanti, Casper, Lym, McAfee, Andersch,
Shoeybi, Catanzaro: "Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023, §4.2.2, Fig. 5 and 6, and Table 2): with tensor parallelism over ``t``
devices, the activations outside the split layers (norms, dropout, residual adds) are
split by tokens instead of replicated; the ``g`` and ``ḡ`` operators become an
all-gather forward with a reduce-scatter backward, and a reduce-scatter forward with an
all-gather backward. The per-layer activation memory goes from ``sbh(10 + 24/t)`` to
``sbh · 34/t`` bytes (flash attention: no ``as/h`` term)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.costs.layer import (
    follower_kernels,
    follower_terms,
    local_params,
    weighted_kernels,
    weighted_terms,
)
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_cluster, load_network, load_network_text
from planner.layout import (
    Dist,
    holds_alike,
    input_dist,
    make_layout,
    parse_pin,
    redistribution,
)
from planner.search import Space, Weights, solve
from planner.strategies import candidate_layouts, megatron_modes, why_invalid

from .conftest import EXAMPLES, invoke
from .helpers import FixedEstimator, cluster

B, E = 16, 4  # batch, bytes per element (fp32)
SEQ, DIM, FFN = 32, 64, 256


def _block(dtype: str = "float32") -> object:
    """A pre-norm transformer MLP block on 32 tokens of width 64."""
    return load_network_text(f"""
kind: network
name: block
input: [{SEQ}, {DIM}]
dtype: {dtype}
layers:
  - {{name: ln0, type: rmsnorm}}
  - name: mlp
    type: residual
    body:
      - {{name: ln, type: rmsnorm}}
      - {{name: up, type: linear, out_features: {FFN}}}
      - {{name: act, type: gelu}}
      - {{name: down, type: linear, out_features: {DIM}}}
  - {{name: head, type: linear, out_features: 16, bias: false}}
""")


def _ctx(net, p=8, per_node=8, **kw):
    opts = Options(gpus=p, batch=B, overlap="none", **kw)
    return make_context(net, cluster(per_node=per_node), opts, FixedEstimator(1e-5)), opts


def _terms(terms):
    return sorted((t.phase, t.collective, t.group.size, t.bytes, t.note) for t in terms)


def test_distributions():
    """``column-sp`` takes its input split by tokens over the row group (the height digit
    of a sequence) and leaves its output split by features, as ``column`` does;
    ``row-sp`` takes features and leaves tokens; moving one's output into the other's
    input is free, as between ``column`` and ``row``."""
    col, row = make_layout("column-sp", 4, 2), make_layout("row-sp", 4, 2)
    # a tensor-parallel split of the tokens (Dist.tensor: the norms between reduce their
    # scales as Megatron-LM does, test_norm_on_tokens)
    tokens = Dist(8, col.c_digit, col.r_digit, tensor=True)
    features = Dist(8, col.c_digit, None, col.r_digit)
    assert input_dist(col) == tokens and col.output_dist() == features
    assert input_dist(row) == features and row.output_dist() == tokens
    assert redistribution(row.output_dist(), input_dist(col), 8).kind == "none"
    attn = make_layout("model-sp", 4, 2)
    assert input_dist(attn) == attn.output_dist() == tokens
    assert parse_pin("*up=column-sp:4x2", 8).mode == "column-sp"
    # context parallelism splits the same tokens, over weights replicated everywhere
    assert make_layout("domain", 4, 2).output_dist() == Dist(8, col.c_digit, col.r_digit)


def test_terms_by_hand():
    """On 4 × 2 devices with 16 samples, b = 8 a batch block. ``up`` (64 → 256,
    column-sp): all-gather its input's tokens forward and again backward (it keeps only
    its own), reduce-scatter the input gradient: each of b × 32 × 64 × 4 bytes over the
    row group of 4; its weight gradient (64 · 256 + 256) / 4 over the column group of 2,
    as ``column``. ``down`` (256 → 64, row-sp): reduce-scatter its output forward,
    all-gather its gradient backward, b × 32 × 64 × 4 bytes each; its bias, added to each
    device's tokens, all-reduced over the row group (64 × 4 bytes); its weight gradient
    (256 · 64 / 4 + 64) over the column group, as ``row``."""
    net = _block()
    ctx, _ = _ctx(net)
    up, down = net.by_name("mlp.up"), net.by_name("mlp.down")
    x = 8 * SEQ * DIM * E
    assert _terms(weighted_terms(up, make_layout("column-sp", 4, 2), ctx)) == sorted([
        ("forward", "all_gather", 4, x, "tokens"),
        ("backward_data", "all_gather", 4, x, "tokens again"),
        ("backward_data", "reduce_scatter", 4, x, "tokens"),
        ("weight_grad", "all_reduce", 2, (DIM * FFN + FFN) / 4 * E, ""),
    ])
    assert _terms(weighted_terms(down, make_layout("row-sp", 4, 2), ctx)) == sorted([
        ("forward", "reduce_scatter", 4, x, "tokens"),
        ("backward_data", "all_gather", 4, x, "tokens"),
        ("backward_data", "all_reduce", 4, DIM * E, "token-split bias"),
        ("weight_grad", "all_reduce", 2, (FFN * DIM / 4 + DIM) * E, ""),
    ])
    # the pair without sequence parallelism: an all-reduce each way
    assert _terms(weighted_terms(up, make_layout("column", 4, 2), ctx))[0] == (
        "backward_data", "all_reduce", 4, x, "")


def test_norm_on_tokens():
    """An RMSNorm on a sequence split by tokens over 4 devices works on its own 8 of the
    32 tokens: no gather; its gain's gradient is summed as Megatron-LM sums it: over the
    2 data-parallel replicas with the other layers' gradients (in their buckets), and
    over the 4 tensor-parallel devices, which hold other tokens, once after the backward
    pass (``finalize_model_grads``), a term at the end of the step. It was one all-reduce
    over all 8 a norm, which split the buckets of the layers around it (an expert audit,
    2026-12-07). Under context parallelism (``domain``), whose weights are replicated
    everywhere, it stays one reduction over all 8. Its pass reads and writes a quarter
    of the batch block's elements."""
    net = _block()
    ctx, _ = _ctx(net)
    ln = net.by_name("mlp.ln")
    tokens = make_layout("row-sp", 4, 2).output_dist()
    terms, work, out = follower_terms(ln, tokens, ctx)
    assert work == out == tokens
    assert _terms(terms) == [("weight_grad", "all_reduce", 2, DIM * E, ""),
                             ("weight_grad", "all_reduce", 4, DIM * E,
                              "sequence-parallel sync (update)")]
    assert [t.when for t in terms] == ["gradient", "update"]
    cp = make_layout("domain", 4, 2).output_dist()
    assert _terms(follower_terms(ln, cp, ctx)[0]) == [("weight_grad", "all_reduce", 8,
                                                      DIM * E, "")]
    (fwd,) = follower_kernels(ln, tokens, ctx)["forward"]
    assert fwd.bytes == 3 * 8 * SEQ * DIM / 4 * E


def test_activation_memory_divides_by_the_row_group():
    """The block pinned to the Megatron pair on 4 × 2, without and with sequence
    parallelism: what the norm keeps (its input, the residual stream: 8 × 32 × 64
    elements a device without, a quarter with) and what ``up`` keeps (the norm's output:
    the same, with the norm's reciprocal roots), by hand; inside the pair (the GELU's
    input and ``down``'s input, split by features) nothing changes, as in Korthikanti et
    al.'s Table 2."""
    net = _block()
    ctx, opts = _ctx(net)
    idx = {n: net.by_name(n).index for n in ("mlp.up", "mlp.down", "head")}

    def run(sp):
        suffix = "-sp" if sp else ""
        ev = evaluate(ctx, opts, {idx["mlp.up"]: make_layout("column" + suffix, 4, 2),
                                  idx["mlp.down"]: make_layout("row" + suffix, 4, 2),
                                  idx["head"]: make_layout("column" + suffix, 4, 2)})
        return {r.layer.name: r.activation_bytes for r in ev.layers}

    plain, sp = run(False), run(True)
    # the norm's output (up's input) and its fp32 reciprocal root a token
    kept = 8 * SEQ * DIM * E + 8 * SEQ * 4
    assert plain["mlp.ln"] == kept and sp["mlp.ln"] == kept / 4
    # the GELU's input (up's output) and its output (down's input), split by features
    assert plain["mlp.up"] == sp["mlp.up"] == 8 * SEQ * FFN * E / 4
    assert plain["mlp.act"] == sp["mlp.act"] == 8 * SEQ * FFN * E / 4
    assert plain["mlp.down"] == sp["mlp.down"]


def test_which_layers_admit_it():
    net = _block()
    up = net.by_name("mlp.up")
    modes = {lay.mode for lay in candidate_layouts(up, 8, B)}
    assert {"column-sp", "row-sp"} <= modes and "model-sp" not in modes
    assert not {"column-sp", "row-sp"} & {
        lay.mode for lay in candidate_layouts(up, 8, B, paper=True)}
    assert "gholami2018" in why_invalid(up, make_layout("row-sp", 4, 2), B, paper=True)
    assert "split an attention layer" in why_invalid(up, make_layout("model-sp", 4, 2), B)
    vec = load_network_text("kind: network\ninput: [64]\nlayers:\n"
                            "  - {type: linear, out_features: 64}\n")
    assert "splits a sequence [seq, dim] by tokens" in why_invalid(
        vec.layers[0], make_layout("column-sp", 4, 2), B)
    short = load_network_text("kind: network\ninput: [2, 64]\nlayers:\n"
                              "  - {type: linear, out_features: 64}\n")
    assert "2 tokens, fewer than P_r=4" in why_invalid(
        short.layers[0], make_layout("row-sp", 4, 2), B)
    assert {(lay.mode, lay.pr) for lay in candidate_layouts(short.layers[0], 8, B)
            if lay.mode.endswith("-sp")} == {("column-sp", 2), ("row-sp", 2)}


def test_program_equals_evaluation():
    """The search over every layout, sequence-parallel ones included: the dynamic
    program's value is the evaluation of its answer (to 1e-12)."""
    net = _block("bfloat16")
    ctx, opts = _ctx(net)
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    assert value == pytest.approx(evaluate(ctx, opts, assignment).time_s, rel=1e-12)


VOCAB = 1000


def _language_model() -> object:
    """A token table, learned positions and one MLP block on 32 tokens of width 64."""
    return load_network_text(f"""
kind: network
name: lm
input: [{SEQ}]
dtype: float32
layers:
  - {{name: wte, type: embedding, vocab: {VOCAB}, dim: {DIM}}}
  - {{name: wpe, type: positional_embedding, positions: {SEQ}}}
  - name: mlp
    type: residual
    body:
      - {{name: ln, type: layernorm}}
      - {{name: up, type: linear, out_features: {FFN}}}
      - {{name: act, type: gelu}}
      - {{name: down, type: linear, out_features: {DIM}}}
  - {{name: head, type: linear, out_features: {VOCAB}, bias: false, tie: wte}}
""")


def test_vocabulary_parallel_embedding_by_hand():
    """``model-sp`` on a token table (Megatron-LM's vocabulary-parallel embedding with
    ``--sequence-parallel``), 4 × 2 devices, b = 8: every device gathers the batch
    block's token ids (8 × 32 int64, 8 bytes each), looks them all up in its 250 of the
    1,000 rows (the others read zero: the lookup is the whole block's, 8 × 32 × 64
    elements written), reduce-scatters the partial sums by tokens (8 × 32 × 64 × 4
    bytes) and all-gathers their gradient backward; no input gradient; its quarter of
    the table (250 × 64) is reduced over the column group of 2. Its input arrives split
    by tokens, its output leaves split by tokens, and the tied head may hold the table
    alike as ``column-sp`` on the same grid."""
    net = _language_model()
    ctx, _ = _ctx(net)
    wte = net.by_name("wte")
    lay = make_layout("model-sp", 4, 2)
    y = 8 * SEQ * DIM * E
    assert _terms(weighted_terms(wte, lay, ctx)) == sorted([
        ("forward", "all_gather", 4, 8 * SEQ * 8, "token ids"),
        ("forward", "reduce_scatter", 4, y, "tokens"),
        ("backward_data", "all_gather", 4, y, "tokens"),
        ("weight_grad", "all_reduce", 2, VOCAB / 4 * DIM * E, ""),
    ])
    assert local_params(wte, lay) == VOCAB / 4 * DIM
    (gather,) = weighted_kernels(wte, lay, ctx)["forward"]
    assert gather.bytes == 8 * SEQ * DIM * E * 2  # read and write the whole block
    assert lay in candidate_layouts(wte, 8, B)
    assert holds_alike(lay, make_layout("column-sp", 4, 2))
    assert holds_alike(lay, make_layout("column", 4, 2))
    assert not holds_alike(lay, make_layout("column-sp", 2, 4))
    assert "1000 rows, fewer than P_r=1024" in why_invalid(
        load_network_text(f"kind: network\ninput: [2048]\nlayers:\n  - {{type: embedding, "
                          f"vocab: {VOCAB}, dim: 64}}\n").layers[0],
        make_layout("model-sp", 1024, 1), 1)
    # learned positions on a token split: each device adds its own tokens' rows, no
    # gather; the table's gradient is summed over the 2 replicas and, after the backward
    # pass, over the 4 devices of the token split, as a norm's (test_norm_on_tokens)
    tokens = lay.output_dist()
    terms, work, out = follower_terms(net.by_name("wpe"), tokens, ctx)
    assert work == out == tokens
    assert _terms(terms) == [("weight_grad", "all_reduce", 2, SEQ * DIM * E, ""),
                             ("weight_grad", "all_reduce", 4, SEQ * DIM * E,
                              "sequence-parallel sync (update)")]


def test_megatron_sp_grid(runner):
    """``cost --grid 4x2 --mode megatron-sp`` on the small language model: the pair
    column-sp/row-sp, the table model-sp, the tied head column-sp; the program's pairs
    without it are the ``megatron`` grid's, the head column."""
    net = _language_model()
    assert {net.layers[i].name: m for i, m in megatron_modes(net).items()} == {
        "mlp.up": "column", "mlp.down": "row", "head": "column"}
    assert {net.layers[i].name: m for i, m in megatron_modes(net, sequence=True).items()} \
        == {"wte": "model-sp", "mlp.up": "column-sp", "mlp.down": "row-sp",
            "head": "column-sp"}
    r = invoke(runner, "cost", "examples/networks/gpt2-small.yaml",
               "examples/clusters/dgx-h100.yaml", "-p", "8", "-b", "8", "--grid", "4x2",
               "--mode", "megatron-sp", "--format", "json")
    assert r.exit_code == 0, r.output
    by = {rec["name"]: (rec["mode"], rec["grid"]) for rec in json.loads(r.stdout)["layers"]
          if "follows" not in rec}
    assert by["wte"] == ("model-sp", [4, 2]) and by["lm_head"] == ("column-sp", [4, 2])
    assert by["h.0.attn.attn"] == ("model-sp", [4, 2])
    assert (by["h.0.mlp.c_fc"][0], by["h.0.mlp.c_proj"][0]) == ("column-sp", "row-sp")


def test_buffer_cap():
    """The search's memory part is a sum over layers; a collective's buffer is not (the
    peak adds the largest). Llama 3 8B's head (4,096 → 128,256) as ``row-sp 64x1``
    reduce-scatters every device's whole partial logits, 64 × 8,192 × 128,256 bf16
    values (134 GB, more than a device holds): under a cap below that, the program
    prices it out (INF), and the cheapest cap every layer can keep is the largest of
    the layers' smallest buffers."""
    net = load_network("examples/networks/llama3-8b.yaml")
    opts = Options(gpus=64, batch=64, optimizer="adam")
    ctx = make_context(net, load_cluster("examples/clusters/dgx-h100.yaml"), opts,
                       FixedEstimator(1e-5))
    space = Space(ctx, opts, {})
    head = net.by_name("lm_head")
    lays = space.candidates[head.index]
    j = lays.index(make_layout("row-sp", 64, 1))
    assert space.buffers(head)[j] == 64 * 8192 * 128256 * 2
    capped = space.weighted_own(head, Weights(0.0, 0.0, 0.0, 1.0, buffer_cap=1e11))
    assert capped[j] == float("inf")
    free = space.weighted_own(head, Weights(0.0, 0.0, 0.0, 1.0))
    assert np.isfinite(free).all()
    assert np.array_equal(np.isinf(capped), space.buffers(head) > 1e11)
    assert space.fewest_buffer_bytes() == max(
        space.buffers(lay).min() for lay in net.layers if lay.has_weights)


def test_llama_at_batch_64_fits_only_with_it(runner):
    """Llama 3 8B on 64 H100s, 64 sequences of 8,192 tokens, Adam: Megatron's layouts
    without sequence parallelism need 107 GiB a device; the plan splits the residual
    stream by tokens and fits, as Megatron-LM's layouts with sequence parallelism do,
    and is no slower than they are."""
    r = invoke(runner, "plan", "examples/networks/llama3-8b.yaml",
               "examples/clusters/dgx-h100.yaml", "-p", "64", "-b", "64", "--optimizer",
               "adam", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    modes = [lay["mode"] for lay in doc["layers"] if lay.get("follows") is None]
    assert modes.count("row-sp") >= 16 and doc["memory"]["fits"]
    megatron = next(b for b in doc["baselines"] if b["name"] == "megatron")
    assert megatron["applicable"] and not megatron["fits"]
    sp = next(b for b in doc["baselines"] if b["name"] == "megatron-sp")
    assert sp["fits"] and doc["iteration"]["time_s"] <= sp["time_s"]


def test_pinned_to_cols(runner):
    """The search tries sequence-parallel layouts with their row group on consecutive
    ranks only; a pin may still place one by columns, and plan prices it as cost does."""
    base = ["examples/networks/gpt2-small.yaml", "examples/clusters/dgx-h100.yaml", "-p", "8",
            "-b", "64", "--pin", "h.*.mlp.c_fc=column-sp:4x2:cols", "--format", "json"]
    plan = invoke(runner, "plan", *base)
    assert plan.exit_code == 0, plan.output
    layers = {lay["name"]: lay for lay in json.loads(plan.stdout)["layers"]}
    assert (layers["h.3.mlp.c_fc"]["mode"], layers["h.3.mlp.c_fc"]["placement"]) == (
        "column-sp", "cols")
    cost = invoke(runner, "cost", *base)
    assert cost.exit_code == 0, cost.output
    priced = {lay["name"]: lay for lay in json.loads(cost.stdout)["layers"]}
    assert priced["h.3.mlp.c_fc"]["mode"] == "column-sp"


def test_attention_keeps_all_tokens_of_its_heads():
    """A head-split attention layer under sequence parallelism gathers its input's
    tokens, so what it keeps for backward (Q, K, V and the context of its heads, flash
    attention's fp32 log-sum-exp a row) covers every token, as without it: Korthikanti
    et al.'s Table 2 divides these by ``t`` once under both (until 2026-11-24 the
    planner divided them by the row group a second time). By hand, 32 tokens, 8 heads
    of 8, on 4 × 2: its 2 heads keep ``32 · (16 + 2 · 16) + 32 · 16`` = 2,048 elements a
    sample and ``2 · 32 · 4`` = 256 bytes, 8 samples a device."""
    from planner.evaluate import own_kept_bytes

    net = load_network_text(f"""
kind: network
name: attn
input: [{SEQ}, {DIM}]
layers:
  - {{name: attn, type: attention, heads: 8, flash: true}}
""")
    att = net.by_name("attn")
    expected = 8 * (2048 * E + 256)
    for mode in ("model", "model-sp"):
        lay = make_layout(mode, 4, 2)
        assert own_kept_bytes(att, lay, input_dist(lay), B, E) == expected, mode


def test_the_norms_sync_once_and_keep_the_buckets(runner):
    """GPT-2 small on 64 H100s at 4 × 16 (megatron-sp, bf16, batch 16): its 25 norms'
    scales and shifts and its position table ((25 · 2 · 768 + 1,024 · 768) · 2 bytes =
    1,649,664 bytes of bf16 gradients) are all-reduced over the tensor group of 4 once,
    in one bucket: the sync terms' shares add up to one all-reduce of those bytes. Their
    data-parallel halves join the linear layers' buckets over the 16 replicas, so no
    reduction spans all 64 devices; the step is 4.947 ms (7.20 ms with a reduction over
    every device a norm, against 4.58 ms without sequence parallelism; the expert
    audit's case)."""
    from planner.costs.layer import term
    from planner.layout import node_group

    doc = json.loads(invoke(runner, "cost", EXAMPLES / "networks" / "gpt2-small.yaml",
                            EXAMPLES / "clusters" / "dgx-h100.yaml", "-p", "64", "-b", "16",
                            "--precision", "bf16", "--optimizer", "adam", "--grid", "4x16",
                            "--mode", "megatron-sp", "--format", "json").stdout)
    terms = [t for lay in doc["layers"] for t in lay["comm"]["terms"]]
    sync = [t for t in terms if t["note"].startswith("sequence-parallel sync (update)")]
    assert len(sync) == 26 and {t["group"] for t in sync} == {4}
    total = sum(t["bytes"] for t in sync)
    assert total == (25 * 2 * 768 + 1024 * 768) * 2
    assert not [t for t in terms if t["phase"] == "weight_grad" and t["group"] == 64]
    q_net = load_network(EXAMPLES / "networks" / "gpt2-small.yaml")
    cl = load_cluster(EXAMPLES / "clusters" / "dgx-h100.yaml")
    ctx = make_context(q_net, cl, Options(gpus=64, batch=16))  # to price a collective
    one = term(ctx, "weight_grad", "all_reduce", node_group(((1, 4),), 64, 8, 0), total)
    assert sum(t["seconds"] for t in sync) == pytest.approx(one.seconds, rel=1e-3)
    assert doc["iteration"]["time_s"] == pytest.approx(4.947e-3, abs=5e-7)
