"""Megatron-LM's column/row pair for linear layers (Shoeybi et al. 2019, arXiv 1909.08053,
§3 and Fig. 3a): the first linear of an MLP split by output features keeps its output
split, the second takes it split by input features and all-reduces its partial outputs,
so the pair pays one all-reduce forward (the row layer's, of its output) and one backward
(the column layer's, of its input gradient), and nothing between them."""

from __future__ import annotations

import json

import pytest

from planner.costs.layer import (
    follower_kernels,
    follower_terms,
    loss_cost,
    redistribute_terms,
    weighted_terms,
)
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_cluster, load_network, load_network_text
from planner.layout import Dist, holds_alike, input_dist, make_layout, redistribution
from planner.network import layer_kernels
from planner.ops import Gemm
from planner.search import Space, Weights, search, solve
from planner.strategies import candidate_layouts, megatron_modes, why_invalid

from .benchmarks.generate import transformer
from .conftest import CLUSTERS, NETWORKS, invoke
from .helpers import FixedEstimator, cluster, mlp
from .test_search import _transformer_text

B, E = 16, 4  # batch, bytes per element (fp32)


def _ctx(net, p, b=B, per_node=8, **kw):
    opts = Options(gpus=p, batch=b, overlap="none", **kw)
    return make_context(net, cluster(per_node=per_node), opts, FixedEstimator(1e-5)), opts


def _terms(terms):
    return {(t.phase, t.collective): (t.group.size, t.bytes) for t in terms}


def test_column_and_row_terms_by_hand():
    """fc2 (128 → 256) column-parallel and fc3 (256 → 32) row-parallel on a 2×2 grid:
    b = B/P_c = 8 samples a batch block; bytes derived from the layer sizes."""
    net = mlp([64, 128, 256, 32])
    ctx, _ = _ctx(net, 4)
    b = B / 2
    fc2, fc3 = net.by_name("fc2"), net.by_name("fc3")
    assert _terms(weighted_terms(fc2, make_layout("column", 2, 2), ctx)) == {
        ("backward_data", "all_reduce"): (2, b * 128 * E),   # ΔX partial sums, d_{i-1}
        ("weight_grad", "all_reduce"): (2, (128 * 256 + 256) / 2 * E),  # |W|/P_r over P_c
    }
    assert _terms(weighted_terms(fc3, make_layout("row", 2, 2), ctx)) == {
        ("forward", "all_reduce"): (2, b * 32 * E),          # Y partial sums, d_i
        ("weight_grad", "all_reduce"): (2, (256 * 32 / 2 + 32) * E),  # W rows/P_r, bias whole
    }
    # the row layer's GEMMs reduce over its 1/P_r of the input features
    ks = layer_kernels(fc3, 8, E, input_split=2)
    assert ks["forward"] == [Gemm(8, 32, 128)]
    assert ks["backward_data"] == [Gemm(8, 128, 32)]
    assert ks["backward_weight"] == [Gemm(32, 128, 8)]


def test_the_pair_pays_one_all_reduce_each_way_and_nothing_between():
    """fc2 column, relu on the split features, fc3 row (4×1): the activation traffic is
    exactly Megatron's two all-reduces; the gathered pair (model, model) pays an
    all-gather of each output and an all-reduce of each input gradient."""
    net = mlp([64, 128, 256, 32])
    ctx, opts = _ctx(net, 4)
    base = {net.by_name("fc1").index: make_layout("data", 1, 4)}
    pair = {**base, net.by_name("fc2").index: make_layout("column", 4, 1),
            net.by_name("fc3").index: make_layout("row", 4, 1)}
    ev = evaluate(ctx, opts, pair)
    moved = [(r.layer.name, t.phase, t.collective, t.bytes) for r in ev.layers
             for t in r.cost.terms if t.phase != "weight_grad"]
    fwd_moves = [m for m in moved if m[0] not in ("fc2", "fc3")]
    # data → column: the input is whole on every device already (a slice, no traffic);
    # fc1 is data parallel, so its output is gathered into fc2's replicated input
    assert all(m[1] == "redistribute" for m in fwd_moves)
    assert ("fc2", "backward_data", "all_reduce", B * 128 * E) in moved
    assert ("fc3", "forward", "all_reduce", B * 32 * E) in moved
    assert not [m for m in moved if m[0] in ("relu2", "fc3") and m[1] == "redistribute"]
    relu = next(r for r in ev.layers if r.layer.name == "relu2")
    assert relu.dist_in == relu.dist_out == Dist(4, (4, 1), None, (1, 4))
    # the relu works on a quarter of the features
    quarter = follower_kernels(relu.layer, relu.dist_in, ctx)["forward"][0]
    whole = follower_kernels(relu.layer, Dist(4, (4, 1), None), ctx)["forward"][0]
    assert quarter.bytes == whole.bytes / 4 and quarter.flops == whole.flops / 4
    gathered = evaluate(ctx, opts, {**base, net.by_name("fc2").index: make_layout("model", 4, 1),
                                    net.by_name("fc3").index: make_layout("model", 4, 1)})
    assert ev.activation_comm_s < gathered.activation_comm_s


def test_feature_split_redistribution_and_followers():
    """A column layout's output gathered over its feature digit (3/4 of the whole arrives
    on 4 devices); a replicated activation sliced for a row layout moves nothing forward
    and gathers its gradient backward; a layer norm gathers the features first."""
    col = make_layout("column", 4, 2)
    split = col.output_dist()
    whole = input_dist(col)
    assert split == Dist(8, (4, 2), None, (1, 4)) and whole == Dist(8, (4, 2), None)
    r = redistribution(split, whole, 8)
    assert (r.kind, r.received, r.need) == ("gather", pytest.approx(0.5 * 3 / 4), 0.5)
    assert r.group.size == 4
    assert redistribution(whole, split, 8).kind == "none"
    assert input_dist(make_layout("row", 4, 2)) == split
    net = mlp([64, 128, 256, 32])
    ctx, _ = _ctx(net, 8)
    terms = redistribute_terms(whole, split, 256, ctx, "input")
    assert [t.note for t in terms] == ["input (backward)"]
    ln = load_network_text("kind: network\nname: n\ninput: [64]\nlayers:\n"
                           "  - {type: linear, out_features: 128}\n"
                           "  - {type: layernorm}\n  - {type: gelu}\n")
    lctx, _ = _ctx(ln, 8)
    terms, work, out = follower_terms(ln.layers[1], split, lctx)
    assert work == out == whole
    assert [t.note for t in terms if t.phase == "redistribute"] == [
        "gather features (forward)"]
    terms, work, out = follower_terms(ln.layers[2], split, lctx)
    assert terms == [] and work == out == split


def test_which_layers_admit_the_pair():
    net = mlp([64, 128, 256, 32])
    fc3 = net.by_name("fc3")
    modes = {lay.mode for lay in candidate_layouts(fc3, 8, 64)}
    assert modes == {"data", "model", "column", "row"}
    assert not {"column", "row"} & {lay.mode for lay in candidate_layouts(fc3, 8, 64,
                                                                         paper=True)}
    assert "256 input features" in why_invalid(fc3, make_layout("row", 512, 1), 512)
    assert "32 output features" in why_invalid(fc3, make_layout("column", 64, 1), 64)
    assert "gholami2018" in why_invalid(fc3, make_layout("row", 4, 1), 4, paper=True)
    conv = load_network_text("kind: network\nname: c\ninput: [3, 8, 8]\nlayers:\n"
                             "  - {type: conv2d, out_channels: 8, kernel: 3}\n")
    assert "linear" in why_invalid(conv.layers[0], make_layout("column", 2, 1), 8)


def test_memory_of_the_pair():
    """The row layer keeps its input split by features (1/P_r: the relu's output, which
    the relu keeps too, counted once), where the gathered pair keeps it whole; weights
    1/P_r each, the row layer's bias whole."""
    net = mlp([64, 128, 256, 32])
    ctx, opts = _ctx(net, 4)
    first = {net.by_name("fc1").index: make_layout("data", 1, 4)}

    def run(m2, m3):
        ev = evaluate(ctx, opts, {**first, net.by_name("fc2").index: make_layout(m2, 4, 1),
                                  net.by_name("fc3").index: make_layout(m3, 4, 1)})
        return {r.layer.name: r for r in ev.layers}

    pair, gathered = run("column", "row"), run("model", "model")
    assert pair["relu2"].activation_bytes == B * 256 * E / 4
    assert gathered["relu2"].activation_bytes == B * 256 * E
    assert pair["fc3"].cost.params_local == 256 * 32 / 4 + 32
    assert pair["fc2"].cost.params_local == (128 * 256 + 256) / 4


def test_search_pairs_an_mlp_when_weights_must_be_split():
    """Two 8,192-wide linears with a GELU between them on 8 GPUs: the search splits the
    pair column then row, and the dynamic program's value is the plan's time."""
    net = load_network_text("kind: network\nname: mlp\ninput: [512, 2048]\nlayers:\n"
                            "  - {type: layernorm}\n"
                            "  - {type: linear, out_features: 8192}\n"
                            "  - {type: gelu}\n"
                            "  - {type: linear, out_features: 2048}\n"
                            "  - {type: layernorm}\n")
    ctx, opts = _ctx(net, 8, b=8)
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    modes = [assignment[i].mode for i in (1, 3)]
    assert modes == ["column", "row"]
    assert value == pytest.approx(evaluate(ctx, opts, assignment).time_s, rel=1e-9)
    result = search(ctx, opts)
    assert [r.layout.mode for r in result.best.evaluation.layers if r.follows is None] == \
        ["column", "row"]


def test_the_loss_is_timed_on_the_output_where_it_lives():
    """Softmax cross-entropy over the last layer's output: two passes over the local
    logits forward, four backward (bytes by hand); split by features (a column layer
    last), three all-reduces of one fp32 number per token over the feature group, which
    Megatron's vocabulary-parallel cross-entropy needs (max, target logit, sum of exp)."""
    net = load_network_text("kind: network\nname: lm\ninput: [128, 64]\nlayers:\n"
                            "  - {type: linear, out_features: 1000}\n")
    ctx, opts = _ctx(net, 8, b=16)
    head = net.layers[0]
    whole = Dist(8, (1, 8), None)  # data 1x8: 2 samples a device
    ks, terms = loss_cost(head, whole, ctx)
    elems = 2 * 128 * 1000
    assert [k.bytes for k in ks["forward"]] == [2 * elems * E]
    assert [k.bytes for k in ks["backward_data"]] == [4 * elems * E]
    assert terms == []
    split = make_layout("column", 4, 2).output_dist()  # 8 samples, a quarter of the vocab
    ks, terms = loss_cost(head, split, ctx)
    assert [k.bytes for k in ks["forward"]] == [2 * 8 * 128 * 1000 / 4 * E]
    assert [(t.phase, t.collective, t.group.size, t.bytes, t.note) for t in terms] == [
        ("forward", "all_reduce", 4, 8 * 128 * 4, f"loss: {what}")
        for what in ("maximum", "target logit", "sum of exponentials")]
    # in the evaluation, on the last layer (the fixed estimator: 1e-5 s a kernel)
    ev = evaluate(ctx, opts, {0: make_layout("column", 4, 2)})
    cost = ev.layers[-1].cost
    # forward: the GEMM and the loss; backward: the weight gradient (the input needs
    # none) and the loss
    assert cost.forward_s == pytest.approx(2e-5) and cost.backward_s == pytest.approx(2e-5)
    assert [t.note for t in cost.terms if t.phase == "forward"] == [
        "loss: maximum", "loss: target logit", "loss: sum of exponentials"]


def test_a_tied_head_column_split_keeps_its_logits_split():
    """GPT-2's head shares the token table; under a model-split table (vocabulary rows)
    the head may be column-split on the same grid: no all-gather of the logits (a model
    head's forward moves B/P_c × 1,024 × 50,257 elements), the loss's three per-token
    all-reduces instead, and a quarter of the logits kept per device."""
    net = load_network(NETWORKS / "gpt2-small.yaml")
    opts = Options(gpus=8, batch=8, overlap="none")
    ctx = make_context(net, load_cluster(CLUSTERS / "dgx-h100.yaml"), opts)
    wte, head = net.by_name("wte"), net.by_name("lm_head")
    base = {lay.index: make_layout("model", 4, 2) for lay in net.layers if lay.has_weights}
    gathered = evaluate(ctx, opts, base)
    split = evaluate(ctx, opts, {**base, head.index: make_layout("column", 4, 2)})
    g_head, s_head = gathered.layers[head.index], split.layers[head.index]
    b, vocab, seq = 4, 50257, 1024
    assert [(t.collective, t.bytes) for t in g_head.cost.terms if t.phase == "forward"] == [
        ("all_gather", b * seq * vocab * E)]
    assert [(t.collective, t.bytes, t.note) for t in s_head.cost.terms
            if t.phase == "forward"] == [
        ("all_reduce", b * seq * 4, f"loss: {what}")
        for what in ("maximum", "target logit", "sum of exponentials")]
    assert s_head.activation_bytes == pytest.approx(g_head.activation_bytes / 4, rel=0.01)
    assert split.time_s < gathered.time_s
    assert holds_alike(base[wte.index], make_layout("column", 4, 2))
    assert not holds_alike(make_layout("model", 4, 2), make_layout("column", 2, 4))


def test_a_lone_output_head_still_gets_a_megatron_baseline():
    """Found in review: a network whose only linear layer is its head had no megatron row in
    `compare` at all, with nothing said. Megatron-LM splits an output layer by columns
    (ColumnParallelLinear, its logits left split for the loss) with or without pairs, so
    the baseline is that head; a linear that is neither a pair's nor the head (here, a
    layer norm after it) leaves the baseline not applicable, with the reason; a network
    without linear layers has no megatron row, as before."""
    def megatron(net):
        opts = Options(gpus=8, batch=64, overlap="none")
        ctx = make_context(net, cluster(per_node=8), opts, FixedEstimator(1e-5))
        return [b for b in search(ctx, opts).baselines if b.name == "megatron"]

    (head,) = megatron(mlp([1024, 4096]))
    assert head.candidate is not None
    assert head.candidate.description.startswith("column-split head, model elsewhere, ")
    assert {lay.mode for lay in head.candidate.assignment.values()} == {"column"}
    (norm,) = megatron(mlp([1024, 4096], extra="  - {name: norm, type: layernorm}\n"))
    assert norm.candidate is None
    assert norm.reason.startswith("no linear layer feeds another one through feature-wise "
                                  "layers only, and the last layer is not a linear output "
                                  "head")
    assert megatron(load_network_text(
        "kind: network\nname: c\ninput: [3, 16, 16]\nlayers:\n"
        "  - {type: conv2d, out_channels: 8, kernel: 3}\n")) == []


def test_the_megatron_baseline_pairs_each_mlp():
    """GPT-2: each block's c_fc column and c_proj row (the GELU between them is
    feature-wise), the tied head column; attention and the table stay model-split. On a
    6.6B-parameter generated transformer the search finds that plan itself (here: 2 × 32 on 64
    H100s, where plain data parallelism does not fit), with some of its layers
    sequence-parallel (their norms and adds on half the tokens), and no slower."""
    net = load_network(NETWORKS / "gpt2-small.yaml")
    modes = {net.layers[i].name: m for i, m in megatron_modes(net).items()}
    assert modes["h.0.mlp.c_fc"] == "column" and modes["h.0.mlp.c_proj"] == "row"
    assert modes["lm_head"] == "column"
    assert len(modes) == 2 * 12 + 1
    # fc1 → relu → fc2 → relu → fc3: fc1/fc2 a pair; fc3, the head, column (Megatron-LM's
    # output layer is a ColumnParallelLinear, tied or not, its logits left split)
    tiny = mlp([64, 128, 256, 32])
    assert {tiny.layers[i].name: m for i, m in megatron_modes(tiny).items()} == {
        "fc1": "column", "fc2": "row", "fc3": "column"}
    # with sequence parallelism: the pairs, the head, attention and the table on tokens
    sp = {net.layers[i].name: m for i, m in megatron_modes(net, sequence=True).items()}
    assert (sp["h.0.mlp.c_fc"], sp["h.0.mlp.c_proj"]) == ("column-sp", "row-sp")
    assert (sp["wte"], sp["h.0.attn.attn"], sp["lm_head"]) == ("model-sp", "model-sp",
                                                               "column-sp")
    assert len(sp) == 2 * 12 + 1 + 12 + 1
    # a vector (no tokens): no sequence parallelism
    assert megatron_modes(tiny, sequence=True) == megatron_modes(tiny)
    big = load_network_text(transformer(324, width=4096, heads=32, seq=2048))
    opts = Options(gpus=64, batch=64)
    ctx = make_context(big, load_cluster(CLUSTERS / "dgx-h100.yaml"), opts)
    result = search(ctx, opts)
    megatron = next(b for b in result.baselines if b.name == "megatron")
    assert megatron.candidate.description == "column/row pairs, model elsewhere, 2x32"
    best = result.best.assignment
    assert {i: lay.mode.removesuffix("-sp") for i, lay in best.items()} == {
        i: lay.mode for i, lay in megatron.candidate.assignment.items()}
    assert {lay.grid for lay in best.values()} == {(2, 32)}
    assert result.best.evaluation.time_s <= megatron.candidate.evaluation.time_s
    data = next(b for b in result.baselines if b.name == "data")
    assert not data.candidate.evaluation.memory.fits


@pytest.mark.parametrize(("p", "batch", "bw"), [(4, 32, 1e9), (8, 128, 1e11), (16, 32, 1e11),
                                                (16, 128, 1e9)])
def test_dynamic_program_equals_the_evaluation_on_residual_blocks(p, batch, bw):
    """Transformer blocks with residuals and a tied head, the learned kernel models, no
    overlap: the dynamic program's value is the evaluated time of its answer (relative
    1e-12: float sums), whatever split activations cross the shortcuts."""
    net = load_network_text(_transformer_text(2))
    cl = cluster(per_node=8, intra=(1e-6, bw * 10), inter=(5e-6, bw))
    opts = Options(gpus=p, batch=batch, overlap="none")
    ctx = make_context(net, cl, opts)
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    assert value == pytest.approx(evaluate(ctx, opts, assignment).time_s, rel=1e-12)


def test_cost_and_check_take_the_megatron_mode(runner, tmp_path):
    """`cost --grid 4x2 --mode megatron` prices Megatron's assignment on that grid (the
    tied head column under the model-split table); a training configuration may ask for
    it too, and --mode data with a 4x2 grid names megatron among the modes that fit."""
    gpt2 = [NETWORKS / "gpt2-small.yaml", CLUSTERS / "dgx-h100.yaml", "-p", "8", "-b", "8"]
    r = invoke(runner, "cost", *gpt2, "--grid", "4x2", "--mode", "megatron", "--format",
               "json")
    assert r.exit_code == 0, r.stderr
    by = {rec["name"]: (rec["mode"], rec["grid"]) for rec in json.loads(r.stdout)["layers"]
          if "follows" not in rec}
    assert by["h.0.mlp.c_fc"] == ("column", [4, 2]) and by["h.0.mlp.c_proj"] == ("row", [4, 2])
    assert by["wte"] == ("model", [4, 2]) and by["lm_head"] == ("column", [4, 2])
    assert by["h.0.attn.attn"] == ("model", [4, 2])
    r = invoke(runner, "cost", *gpt2, "--grid", "4x2", "--mode", "data")
    assert r.exit_code == 2
    assert "--mode model, domain, megatron, megatron-sp or megatron-cp" in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"kind: training\nnetwork: {gpt2[0]}\ncluster: {gpt2[1]}\ngpus: 8\n"
                   "batch: 8\nstrategy: {grid: 4x2, mode: megatron}\n")
    r = invoke(runner, "check", cfg)
    assert "[memory]" in r.stdout and r.exit_code in (0, 1), r.stdout + r.stderr
