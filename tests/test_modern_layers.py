"""The layers of current decoder-only language models: RMSNorm (Zhang and Sennrich 2019),
gated linear units (SwiGLU, GEGLU: Shazeer 2020, "GLU Variants Improve Transformer"),
rotary position embeddings (Su et al. 2021) and grouped-query attention, and the Llama 3
8B example built from them. Every figure is derived by hand in the test's docstring."""

from __future__ import annotations

import pytest

from planner.costs.layer import follower_kernels, follower_terms
from planner.errors import InputError
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_network, load_network_text
from planner.layout import make_layout
from planner.network import layer_kernels
from planner.ops import Elementwise, Gemm
from planner.search import Space, Weights, solve
from planner.strategies import megatron_modes

from .conftest import NETWORKS
from .helpers import FixedEstimator, cluster


def _net(body: str, shape: str = "[16, 64]") -> object:
    return load_network_text(f"kind: network\nname: n\ninput: {shape}\nlayers:\n{body}")


def _passes(kernels):
    return [(k.label, k.bytes, k.flops) for k in kernels if isinstance(k, Elementwise)]


def test_rmsnorm_by_hand():
    """RMSNorm over 64 features of 16 tokens: 64 scale parameters and no shift (none with
    ``affine: false``); 4 FLOPs an element (square, sum, scale by the reciprocal root,
    multiply by the gain); a fused kernel keeps its input and one fp32 reciprocal root a
    row (16 × 4 bytes a sample), where LayerNorm keeps a mean besides. Forward it reads
    the input twice (the statistics, then the normalisation) and writes once: 3 × 1,024
    elements × 4 bytes a sample in fp32."""
    net = _net("  - {type: linear, out_features: 64}\n  - {name: n, type: rmsnorm}\n"
               "  - {name: m, type: rms_norm, affine: false}\n")
    n, m = net.by_name("n"), net.by_name("m")
    assert (n.type, n.params, m.type, m.params) == ("rmsnorm", 64, "rmsnorm", 0)
    assert n.flops == 4 * 16 * 64
    assert n.saves_input and n.saved_bytes_extra == 16 * 4
    assert net.params == 64 * 64 + 64 + 64
    ks = layer_kernels(n, 2, 4)
    assert _passes(ks["forward"]) == [("rmsnorm", 3 * 2 * 1024 * 4, 4 * 2 * 1024)]
    assert _passes(ks["backward_data"]) == [("rmsnorm", 3 * 2 * 1024 * 4, 8 * 2 * 1024)]


@pytest.mark.parametrize(("kind", "per"), [("swiglu", 5), ("geglu", 9), ("glu", 5)])
def test_gated_units_by_hand(kind, per):
    """A gated unit halves the features, ``act(a) · b`` for ``[a, b]``: 128 in, 64 out a
    token. FLOPs per output element: the gate's activation (SiLU 4, GELU 8, sigmoid 4,
    the planner's convention for these activations) and the product. It keeps its input
    (128 a token) for backward; forward it reads 128 and writes 64 elements a token,
    backward reads the saved input and dY (128 + 64) and writes dA and dB (128)."""
    net = _net(f"  - {{name: up, type: linear, out_features: 128}}\n"
               f"  - {{name: act, type: {kind}}}\n"
               "  - {name: down, type: linear, out_features: 64}\n")
    act = net.by_name("act")
    assert act.input_shape == (16, 128) and act.output_shape == (16, 64)
    assert act.flops == per * 16 * 64 and act.params == 0
    assert act.saves_input
    kept = net.saved_tensors()
    assert kept[net.by_name("up").index] == 16 * 128  # the gated unit's input
    assert kept[act.index] == 16 * 64  # the down projection's input
    ks = layer_kernels(act, 3, 2)
    t = 3 * 16
    assert _passes(ks["forward"]) == [(kind, (128 + 64) * t * 2, per * 64 * t)]
    assert _passes(ks["backward_data"]) == [(kind, (2 * 128 + 64) * t * 2, 2 * per * 64 * t)]


def test_gated_unit_shape_errors():
    """An odd width cannot be halved; an image is not a sequence of features."""
    with pytest.raises(InputError) as exc:
        _net("  - {type: linear, out_features: 7}\n  - {type: swiglu}\n")
    assert "needs an even number" in str(exc.value)
    assert str(exc.value).startswith("<network>:6:5: error: layer 'swiglu1'")
    with pytest.raises(InputError) as exc:
        _net("  - {type: conv2d, out_channels: 4, kernel: 3}\n  - {type: swiglu}\n",
             "[3, 8, 8]")
    assert "(swiglu) needs a vector [features] or a sequence [seq, dim]" in str(exc.value)


def test_gated_mlp_is_a_megatron_pair():
    """Megatron-LM's SwiGLU MLP (``--swiglu``): the fused gate-and-up projection is split
    by output features (column), the gated unit runs on each device's features with no
    communication (each shard holds its gate rows and their value rows), and the down
    projection takes them split (row). On 4 × 2 devices with 16 samples: the unit works
    on 8 samples × 16 tokens × 64/4 output features a device."""
    net = _net("  - {name: ln, type: rmsnorm}\n"
               "  - {name: up, type: linear, out_features: 128, bias: false}\n"
               "  - {name: act, type: swiglu}\n"
               "  - {name: down, type: linear, out_features: 64, bias: false}\n")
    up, act, down = (net.by_name(n) for n in ("up", "act", "down"))
    assert megatron_modes(net) == {up.index: "column", down.index: "row"}
    opts = Options(gpus=8, batch=16, overlap="none")
    ctx = make_context(net, cluster(), opts, FixedEstimator(1e-5))
    split = make_layout("column", 4, 2).output_dist()
    terms, work, out = follower_terms(act, split, ctx)
    assert terms == [] and work == out == split
    (fwd,) = follower_kernels(act, split, ctx)["forward"]
    local_out = 8 * 16 * 64 / 4
    assert fwd.bytes == (2 * local_out + local_out) * 4 and fwd.flops == 5 * local_out
    # the whole MLP as the search finds it with the weights that large: the program's
    # value is the evaluation of its answer
    space = Space(ctx, opts, {})
    space.prepare_transitions()
    value, assignment = solve(space, Weights())
    assert value == pytest.approx(evaluate(ctx, opts, assignment).time_s, rel=1e-12)


@pytest.mark.parametrize("flash", ["false", "true"])
def test_rotary_attention_by_hand(flash):
    """Rotary embeddings on 8 query and 2 key/value heads of 16 over 32 tokens: each
    query and key element costs ``x·cos + rot(x)·sin``, 3 FLOPs, so 3 × 32 × (128 + 32)
    more a sample; one memory-bound pass over Q and K each way (read and write them, 2
    bytes an element in bf16), after the projection forward and before its backward;
    nothing more is kept (the rotated Q and K replace the plain ones)."""
    # (a norm first, with parameters: the attention computes its input's gradient)
    plain = _net("  - {type: rmsnorm}\n  - {name: a, type: attention, heads: 8, kv_heads: 2, "
                 f"bias: false, flash: {flash}}}\n", "[32, 128]")
    rope = _net("  - {type: rmsnorm}\n  - {name: a, type: attention, heads: 8, kv_heads: 2, "
                f"bias: false, flash: {flash}, rotary: true}}\n", "[32, 128]")
    a, r = plain.layers[1], rope.layers[1]
    assert r.flops - a.flops == 3 * 32 * (128 + 32)
    assert (r.params, r.saved_internal, r.saved_bytes_extra) == (
        a.params, a.saved_internal, a.saved_bytes_extra)
    ks, kp = layer_kernels(r, 2, 2), layer_kernels(a, 2, 2)
    n = 2 * 32 * (8 + 2) * 16
    rot = Elementwise(2 * 2 * n, 3 * n, "rotary")
    qkv = Gemm(2 * 32, 128, (8 + 2 * 2) * 16)  # dX of the fused Q, K, V projection
    assert ks["forward"] == [kp["forward"][0], rot, *kp["forward"][1:]]
    at = kp["backward_data"].index(qkv)
    assert ks["backward_data"] == [*kp["backward_data"][:at], rot, *kp["backward_data"][at:]]
    # split by heads over 4 devices: 2 query heads and 1 key/value head a device
    k4 = layer_kernels(r, 2, 2, model_split=4)
    n4 = 2 * 32 * (2 + 1) * 16
    assert Elementwise(4 * n4, 3 * n4, "rotary") in k4["forward"]
    with pytest.raises(InputError) as exc:
        _net("  - {type: attention, heads: 4, head_dim: 3, rotary: true}\n", "[8, 12]")
    assert "head_dim=3 is odd" in str(exc.value)


def test_llama3_8b():
    """Meta's Llama 3 8B ("The Llama 3 Herd of Models", 2024, Table 3: 32 layers, model
    dimension 4,096, FFN dimension 14,336, 32 attention heads, 8 key/value heads; the
    released tokenizer has 128,256 tokens; untied head). Its parameters by hand: per
    block 4096 · (4096 + 2 · 1024) + 4096 · 4096 = 41,943,040 in attention, 3 · 4096 ·
    14,336 = 176,160,768 in the MLP and 2 · 4096 in its norms, 218,112,000 a block;
    32 blocks, the embedding and the head (128,256 · 4096 each) and the final norm:
    8,030,261,248, the count the released checkpoint has. The data-parallel search on
    its MLP pairs the projections as Megatron-LM does when the weights are split."""
    net = load_network(NETWORKS / "llama3-8b.yaml")
    assert net.params == 32 * 218_112_000 + 2 * 128_256 * 4096 + 4096 == 8_030_261_248
    blocks = [lay for lay in net.layers if lay.name.startswith("layers.0.")]
    assert [lay.type for lay in blocks] == ["rmsnorm", "attention", "add", "rmsnorm",
                                            "linear", "swiglu", "linear", "add"]
    attn = net.by_name("layers.0.attn.self_attn")
    assert attn.params == 41_943_040 and attn.attention.rotary
    modes = megatron_modes(net)
    assert modes[net.by_name("layers.7.mlp.gate_up_proj").index] == "column"
    assert modes[net.by_name("layers.7.mlp.down_proj").index] == "row"
    # forward FLOPs of one sequence: 2 × parameters × 8,192 tokens for the matrix
    # products outside attention (the embedding is a lookup: no FLOPs), the causal flash
    # kernel's half of 2 · 2 · 32 · 8192² · 128 a layer, plus the elementwise passes
    dense = 2 * (net.params - 128_256 * 4096) * 8192
    attention = 32 * 2 * 2 * 32 * 8192 * 8192 * 128 // 2
    assert net.flops > dense + attention
    assert net.flops - dense - attention < 0.01 * net.flops


def test_llama3_8b_at_128k_tokens():
    """The long-context example is Llama 3 8B with sequences of 131,072 tokens: the same
    layers and parameters (rotary embeddings have none), sixteen times the tokens, and
    attention's causal half of 2 · 2 · 32 · s² · 128 a layer 256 times over, and its
    softmax's 5 FLOPs a score (counted over all 32 · s² scores, as the network's FLOPs
    count them) with it; the rest (norms, rotary, SwiGLU) is under 0.1%."""
    short = load_network(NETWORKS / "llama3-8b.yaml")
    long = load_network(NETWORKS / "llama3-8b-128k.yaml")
    assert long.params == short.params == 8_030_261_248
    assert [(a.name, a.type, a.params) for a in long.layers] == \
        [(a.name, a.type, a.params) for a in short.layers]
    attn = long.by_name("layers.0.attn.self_attn").attention
    assert attn.seq == 131_072 == 16 * short.by_name("layers.0.attn.self_attn").attention.seq
    core = 32 * 2 * 2 * 32 * 131_072 ** 2 * 128 // 2
    dense = 2 * (long.params - 128_256 * 4096) * 131_072
    softmax = 32 * 5 * 32 * 131_072 ** 2
    assert 0 < long.flops - dense - core - softmax < 0.001 * long.flops


def test_llama2():
    """Llama 2 13B and 70B (Touvron et al. 2023, Table 1 and the released configurations:
    40 layers of 5,120 with 40 heads and an FFN of 13,824; 80 layers of 8,192 with 64
    query and 8 key/value heads and an FFN of 28,672; a 32,000-token vocabulary, untied
    heads, 4,096-token sequences). By hand, 13B: per block 4 · 5120² = 104,857,600 in
    attention, 3 · 5120 · 13,824 = 212,336,640 in the MLP and 2 · 5120 in its norms,
    317,204,480 a block; 40 blocks, the embedding and the head (32,000 · 5120 each) and the
    final norm: 13,015,864,320. 70B: 150,994,944 + 704,643,072 + 2 · 8192 = 855,654,400 a
    block (Llama 3 70B's); 80 blocks, 2 · 32,000 · 8192 and 8192: 68,976,648,192. Both are
    the released checkpoints' counts."""
    small = load_network(NETWORKS / "llama2-13b.yaml")
    assert small.params == 40 * 317_204_480 + 2 * 32_000 * 5120 + 5120 == 13_015_864_320
    assert small.by_name("layers.0.attn.self_attn").params == 104_857_600
    big = load_network(NETWORKS / "llama2-70b.yaml")
    assert big.params == 80 * 855_654_400 + 2 * 32_000 * 8192 + 8192 == 68_976_648_192
    for net in (small, big):
        assert net.by_name("layers.0.attn.self_attn").attention.seq == 4096


def test_qwen2_7b_biases_on_q_k_v_alone():
    """Qwen2-7B (the released configuration: 28 layers of 3,584, 28 query and 4
    key/value heads of 128, FFN 18,944, 152,064 table rows, untied) has biases on its
    Q, K and V projections and none on the output one (`bias: qkv`; `bias: true` counted
    3,584 a layer too many: found by an audit). By hand: per block 3584 · (3584 + 2 ·
    512) + 3584 · 3584 + 4608 = 29,364,736 in attention, 3 · 3584 · 18,944 = 203,685,888
    in the MLP and 7,168 in the norms, 233,057,792 a block; 28 blocks, 2 · 152,064 ·
    3584 and 3584: 7,615,616,512, the released checkpoint's count."""
    net = load_network(NETWORKS / "qwen2-7b.yaml")
    assert net.by_name("layers.0.attn.self_attn").params == 29_364_736
    assert net.params == 28 * 233_057_792 + 2 * 152_064 * 3584 + 3584 == 7_615_616_512
    # bias: true adds the output projection's; false, none
    for bias, extra in (("true", 3584), ("false", -4608)):
        text = (NETWORKS / "qwen2-7b.yaml").read_text().replace("bias: qkv", f"bias: {bias}")
        assert load_network_text(text).params == 7_615_616_512 + 28 * extra
    with pytest.raises(InputError) as exc:
        load_network_text((NETWORKS / "qwen2-7b.yaml").read_text().replace(
            "bias: qkv", "bias: kv"))
    assert "expected true, false or qkv (biases on Q, K and V alone), got a string 'kv'" in \
        str(exc.value)


def test_llama3_70b():
    """Llama 3 70B (the same paper, Table 3: 80 layers, model dimension 8,192, FFN
    dimension 28,672, 64 attention heads, 8 key/value heads). By hand: per block 8192 ·
    (8192 + 2 · 1024) + 8192 · 8192 = 150,994,944 in attention, 3 · 8192 · 28,672 =
    704,643,072 in the MLP and 2 · 8192 in its norms, 855,654,400 a block; 80 blocks, the
    embedding and the head (128,256 · 8192 each) and the final norm: 70,553,706,496, the
    released checkpoint's count."""
    net = load_network(NETWORKS / "llama3-70b.yaml")
    assert net.params == 80 * 855_654_400 + 2 * 128_256 * 8192 + 8192 == 70_553_706_496
    attn = net.by_name("layers.0.attn.self_attn")
    assert attn.params == 150_994_944
    assert attn.attention.heads == 64 and attn.attention.kv_heads == 8


def test_mistral_7b_and_its_sliding_window():
    """Mistral 7B (Jiang et al. 2023, Table 1): Llama 3 8B's block (width 4,096, 32 query
    and 8 key/value heads of 128, FFN 14,336) with a 32,000-token vocabulary and a
    sliding window of 4,096 keys on 8,192-token sequences. By hand: 218,112,000 a block,
    ×32, plus 2 · 32,000 · 4096 and 4096: 7,241,732,096 parameters. Query i (from 0) meets
    min(i + 1, 4096) keys: 4096 · 4097 / 2 + 4096 · 4096 = 8192 · 4096 − 4096 · 4095 / 2 =
    25,167,872 pairs, where causal attention over 8,192 counts 8192² / 2 = 33,554,432: the
    triangle's 8192 · 8193 / 2 less half its diagonal, as the band's MACs count it too
    (25,163,776 pairs: an audit found a window of s − 1 counted above none). So a layer's
    core is 2 · 32 · 25,163,776 · 128 MACs (with its projections 8192 · 4096 · 10,240:
    549,739,036,672 in all), and its flash kernels meet ⌈25,167,872 / 8192⌉ = 3,073 keys a
    query, against Llama's 4,096."""
    net = load_network(NETWORKS / "mistral-7b.yaml")
    assert net.params == 32 * 218_112_000 + 2 * 32_000 * 4096 + 4096 == 7_241_732_096
    attn = net.by_name("layers.0.attn.self_attn")
    a = attn.attention
    assert (a.window, a.windowed, a.window_pairs()) == (4096, True, 25_167_872)
    assert attn.macs == 8192 * 4096 * 10_240 + 2 * 32 * 25_163_776 * 128 == 549_739_036_672
    scores = _core(layer_kernels(attn, 1, 2)["forward"])
    assert (scores.m, scores.n, scores.k, scores.batch) == (8192, 3073, 128, 32)
    # the softmax's 5 FLOPs a score over twice the band (as causal attention's count is
    # over twice its half), and the rotary pass's 3 an element of the queries and keys
    assert attn.flops == 2 * attn.macs + 10 * 32 * 25_163_776 + 3 * 8192 * (4096 + 1024) \
        == 1_107_656_310_784
    # Llama 3 8B's layer has the same projections; its causal core is 4/3 of Mistral's...
    llama = load_network(NETWORKS / "llama3-8b.yaml").by_name("layers.0.attn.self_attn")
    assert llama.macs - 8192 * 4096 * 10_240 == 2 * 32 * 8192 * 8192 * 128 // 2
    # ...and a window as long as the sequence leaves it causal attention, kernels too
    same = _net("  - {type: attention, heads: 4, causal: true, flash: true, window: 16}\n")
    full = _net("  - {type: attention, heads: 4, causal: true, flash: true}\n")
    s_lay, f_lay = same.layers[0], full.layers[0]
    assert not s_lay.attention.windowed and s_lay.macs == f_lay.macs
    assert layer_kernels(s_lay, 2, 4) == layer_kernels(f_lay, 2, 4)
    # a narrower window never counts more: 15, one less than the sequence, counts
    # 16 · 15 − 105 − 8 = 127 pairs, under causal attention's 128
    macs = [_net("  - {type: attention, heads: 4, causal: true, flash: true"
                 f"{', window: ' + str(w) if w else ''}}}\n").layers[0].macs
            for w in (None, 15, 8, 1)]
    assert macs == sorted(macs, reverse=True) and macs[0] - macs[1] == 2 * 4 * 1 * 16


def _core(kernels):
    """The first product over the heads (Q·Kᵀ) among a layer's kernels."""
    return next(k for k in kernels if isinstance(k, Gemm) and k.batch > 1)


def test_a_window_without_flash_masks_the_whole_matrix():
    """An unfused kernel computes every score and masks those outside the window, as it
    does causal attention's upper half: its products and its memory are the whole
    16 × 16 matrix a head (4 heads, 16 keys a query), while the model's MACs count the
    band: window 4 on 16 tokens, 16 · 4 − 4 · 3 / 2 = 58 pairs less half the diagonal's
    16, 50, 2 · 4 · 50 · 16 MACs for the core (head_dim 64 / 4 = 16) besides the
    projections' 16 · 64 · 4 · 64."""
    net = _net("  - {type: attention, heads: 4, causal: true, window: 4}\n")
    lay = net.layers[0]
    assert lay.attention.window_pairs() == 58
    assert lay.macs == 16 * 64 * 4 * 64 + 2 * 4 * 50 * 16
    scores = _core(layer_kernels(lay, 1, 4)["forward"])
    assert (scores.m, scores.n, scores.k, scores.batch) == (16, 16, 16, 4)
    whole = _net("  - {type: attention, heads: 4, causal: true}\n").layers[0]
    assert lay.saved_internal == whole.saved_internal  # the probabilities, 16 × 16 a head


def test_a_window_needs_causal_attention():
    with pytest.raises(InputError) as err:
        _net("  - {type: attention, heads: 4, window: 8}\n")
    assert "a window is the most recent keys each query meets, which needs causal: true" \
        in str(err.value)
    with pytest.raises(InputError) as err:
        _net("  - {type: attention, heads: 4, causal: true, sliding_window: 8}\n")
    assert "the key is 'window'" in str(err.value)
    with pytest.raises(InputError) as err:
        _net("  - {type: attention, heads: 4, causal: true, window: 0}\n")
    assert "window" in str(err.value)


def test_gemma2_9b_alternates_local_and_global_attention():
    """Gemma 2 9B (Gemma Team 2024; the released configuration): 42 blocks of 3,584, 16
    query heads of 256 and 8 key/value heads, a GeGLU MLP of 14,336, four RMSNorms a
    block, a 256,000-token vocabulary tied to the head. By hand: 3584 · (4096 + 2 · 2048)
    + 4096 · 3584 = 44,040,192 in attention, 3 · 3584 · 14,336 = 154,140,672 in the MLP,
    4 · 3584 in norms, 198,195,200 a block; ×42, plus 256,000 · 3584 once (tied) and 3584:
    9,241,705,984. Even blocks are local (a 4,096-key window on 8,192 tokens: 25,167,872
    pairs a head, less half the diagonal's 8,192 as causal attention's count is:
    25,163,776), odd ones global (8192² / 2 = 33,554,432): the two cores differ by
    8,390,656 pairs · 2 · 16 · 256 = 68,736,253,952 MACs."""
    net = load_network(NETWORKS / "gemma2-9b.yaml")
    assert net.params == 42 * 198_195_200 + 256_000 * 3584 + 3584 == 9_241_705_984
    atts = [lay for lay in net.layers if lay.attention is not None]
    assert [a.attention.window for a in atts] == [4096, None] * 21
    local, glob = atts[0], atts[1]
    assert (local.name, glob.name) == ("layers.0.local.self_attn", "layers.0.global.self_attn")
    assert glob.macs - local.macs == (33_554_432 - 25_163_776) * 2 * 16 * 256 \
        == 68_736_253_952
    assert net.by_name("lm_head").tied_to == "embed_tokens"
