"""Network schema and shape inference against known figures (REFERENCES §7)."""

from __future__ import annotations

import itertools

import pytest

from planner.errors import InputError
from planner.inputs import load_network, load_network_text
from planner.network import halo_rows
from planner.ops import Conv, Elementwise, Gemm

from .conftest import NETWORKS

# REFERENCES §7: parameter counts (exact) and forward multiply-accumulates per sample.
KNOWN = {
    "alexnet": (60_965_224, 0.72e9),
    "vgg16": (138_357_544, 15.5e9),
    "resnet50": (25_557_032, 4.1e9),
    "gpt2-small": (124_439_808, None),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_parameter_counts(name):
    net = load_network(NETWORKS / f"{name}.yaml")
    params, macs = KNOWN[name]
    assert net.params == params
    if macs is not None:
        # REFERENCES §7 gives MACs to 2-3 significant digits; the issue asks within 1%
        assert net.macs == pytest.approx(macs, rel=0.01)


def test_alexnet_shapes_and_weights():
    net = load_network(NETWORKS / "alexnet.yaml")
    shapes = {layer.name: layer.output_shape for layer in net.layers}
    assert shapes["conv1"] == (96, 55, 55)
    assert shapes["pool1"] == (96, 27, 27)
    assert shapes["pool2"] == (256, 13, 13)
    assert shapes["pool5"] == (256, 6, 6)
    assert shapes["flatten"] == (9216,)
    # REFERENCES §1: 60,954,656 weights without biases
    no_bias = sum(layer.params - (layer.conv.out_channels if layer.conv else
                                  layer.linear.out_features) for layer in net.layers
                  if layer.conv is not None or layer.linear is not None)
    assert no_bias == 60_954_656


def test_alexnet_grouped_conv_products():
    net = load_network(NETWORKS / "alexnet.yaml")
    conv2 = net.by_name("conv2")
    assert conv2 is not None and conv2.conv is not None
    prods = conv2.products(batch=8)
    fwd = prods["forward"][0]
    assert isinstance(fwd, Conv)
    g = fwd.implicit_gemm()
    # implicit GEMM per group: M = N·P·Q, N = K/g, K = C/g·R·S
    assert (g.m, g.n, g.k, g.batch) == (8 * 27 * 27, 128, 48 * 25, 2)
    bd = prods["backward_data"][0].implicit_gemm()
    assert (bd.m, bd.n, bd.k) == (8 * 27 * 27, 48, 128 * 25)
    bw = prods["backward_weight"][0].implicit_gemm()
    assert (bw.m, bw.n, bw.k) == (128, 48 * 25, 8 * 27 * 27)
    # FLOPs are the same for all three passes of direct convolution
    assert fwd.flops == 2 * conv2.macs * 8


def test_first_layer_has_no_backward_data():
    net = load_network(NETWORKS / "alexnet.yaml")
    assert net.layers[0].products(4)["backward_data"] == []


def test_linear_products():
    net = load_network(NETWORKS / "alexnet.yaml")
    fc6 = net.by_name("fc6")
    prods = fc6.products(batch=32)
    assert prods["forward"] == [Gemm(32, 4096, 9216)]
    assert prods["backward_data"] == [Gemm(32, 9216, 4096)]
    assert prods["backward_weight"] == [Gemm(4096, 9216, 32)]


def test_halo_rows():
    net = load_network(NETWORKS / "alexnet.yaml")
    # conv3: 3×3, stride 1, pad 1 → one row each side, forward and backward
    assert net.by_name("conv3").halo_forward == (1, 1)
    assert net.by_name("conv3").halo_backward == (1, 1)
    # conv1: 11×11 stride 4 pad 0: rows [4o, 4o+10] → 0 above, 11-4-0 = 7 below
    assert net.by_name("conv1").halo_forward == (0, 7)
    # backward: output-gradient rows floor((11-1-0)/4)=2 above, floor((4-1+0)/4)=0 below
    assert net.by_name("conv1").halo_backward == (2, 0)
    # pool 3×3 stride 2: 1 row below
    assert net.by_name("pool1").halo_forward == (0, 1)


def _conv_net(k: int, s: int, p: int, h: int = 24, d: int = 1):
    return load_network_text(f"""kind: network
name: one
input: [2, {h}, {h}]
layers:
  - {{type: conv2d, name: c, out_channels: 2, kernel: {k}, stride: {s}, padding: {p},
     dilation: {d}}}
""")


def test_halo_rows_count_the_rows_a_block_of_outputs_reads():
    """Brute force over kernels, strides, paddings and dilations: a block of output rows
    ``[o0, o1)`` owns input rows ``[o0·s, o1·s)``; the forward halo is the rows outside
    them its windows read, the backward the output-gradient rows outside ``[o0, o1)``
    whose windows reach its inputs. An audit found a 1×1 convolution padded by 1 (an
    output taller than its input) exchanged nothing, and 3×3 padded by 3 two rows of
    three: the formula took ``min(p, k − 1)`` rows above. Another (2026-12-07) found a
    dilated window with a stride over 1 counted the rows between its taps, which it
    strides over: 3×3 with stride 2, padding 2 and dilation 2 reads one row above and one
    below a block, not two and one."""
    o0, o1 = 40, 60
    for k in range(1, 8):
        for s in range(1, 5):
            for p in range(0, 7):
                for d in range(1, 4):
                    if (24 + 2 * p - d * (k - 1) - 1) // s + 1 < 1:
                        continue
                    layer = _conv_net(k, s, p, d=d).by_name("c")
                    reads = {o * s - p + d * j for o in range(o0, o1) for j in range(k)}
                    want = (sum(r < o0 * s for r in reads), sum(r >= o1 * s for r in reads))
                    assert layer.halo_forward == want, (k, s, p, d, layer.halo_forward, want)
                    owned = range(o0 * s, o1 * s)
                    grads = {o for o in range(o0 - 40, o1 + 40)
                             if any(o * s - p + d * j in owned for j in range(k))}
                    want = (sum(o < o0 for o in grads), sum(o >= o1 for o in grads))
                    assert layer.halo_backward == want, (k, s, p, d, layer.halo_backward,
                                                         want)
    # the audit's case, by hand: rows 2o − 2 + 2j, so a block [o0, o1) owning
    # [2·o0, 2·o1) reads 2·o0 − 2 above and 2·o1 below it
    assert _conv_net(3, 2, 2, d=2).by_name("c").halo_forward == (1, 1)


def test_resnet_blocks_and_names():
    net = load_network(NETWORKS / "resnet50.yaml")
    assert len(net.blocks) == 16
    names = [layer.name for layer in net.layers]
    assert "layer1.0.shortcut.downsample.0" in names
    assert "layer2.3.conv3" in names
    assert "layer4.2.add" in names
    b = net.blocks[0]
    assert net.layers[b.add].inputs == (b.body[-1], b.shortcut[-1])
    assert net.layers[b.shortcut[0]].inputs == (b.input,)
    b1 = net.blocks[1]
    assert b1.shortcut == ()
    assert net.layers[b1.add].inputs == (b1.body[-1], b1.input)


def test_gpt2_attention_and_tied_head():
    net = load_network(NETWORKS / "gpt2-small.yaml")
    attn = net.by_name("h.0.attn.attn")
    assert attn.attention is not None
    assert (attn.attention.heads, attn.attention.head_dim) == (12, 64)
    assert attn.params == 768 * 2304 + 2304 + 768 * 768 + 768
    head = net.by_name("lm_head")
    assert head.params == 0 and head.weight_elems == 50257 * 768
    assert head.tied_to == "wte"


def test_saved_tensors_counted_once():
    net = load_network_text("""
kind: network
input: [4, 8, 8]
layers:
  - {name: c1, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
  - {name: r1, type: relu}
  - {name: c2, type: conv2d, out_channels: 4, kernel: 3, padding: 1}
""")
    kept = net.saved_tensors()
    # c1 keeps the input, r1 keeps its output, c2 keeps the same tensor as its input;
    # the loss keeps the network's output, c2's
    assert kept == {-1: 256, 1: 256, 2: 256}


def test_gqa_parameters():
    net = load_network_text("""
kind: network
input: [16, 64]
layers:
  - {name: a, type: attention, heads: 8, kv_heads: 2, bias: false}
""")
    a = net.layers[0]
    assert a.params == 64 * 64 + 2 * 64 * 16 + 64 * 64


@pytest.mark.parametrize(("body", "fragment"), [
    ("- {type: conv2d, out_channels: 4, kernel: 3, stride: 2, padding: same}",
     "padding: same needs stride 1"),
    ("- {type: attention, heads: 3}", "needs a sequence [seq, dim] as input"),
    ("- {type: linear, out_features: 4}\n  - {type: linear, out_features: 4, tie: nope}",
     "needs a vector"),
    ("- {type: maxpool, kernel: 40}", "pooling window 40×40 is larger than its input"),
    ("- repeat: 2\n    layers: []", "expected at least one layer"),
    ("- {type: residual, body: [{type: residual, body: [{type: relu}]}]}",
     "residual blocks cannot be nested"),
    ("- {name: a, type: relu}\n  - {name: a, type: relu}", "duplicate layer name 'a'"),
])
def test_shape_errors(body, fragment):
    text = f"kind: network\ninput: [3, 32, 32]\nlayers:\n  {body}\n"
    with pytest.raises(InputError) as exc:
        load_network_text(text)
    assert fragment in str(exc.value)


def test_no_weights_is_an_error():
    with pytest.raises(InputError, match="no layer with weights"):
        load_network_text("kind: network\ninput: [8]\nlayers:\n  - {type: relu}\n")


def test_repeat_naming():
    net = load_network_text("""
kind: network
input: [8]
layers:
  - repeat: 2
    name: blk
    layers:
      - {name: fc, type: linear, out_features: 8}
      - {type: relu}
""")
    assert [layer.name for layer in net.layers] == [
        "blk.0.fc", "blk.0.relu1", "blk.1.fc", "blk.1.relu1"]


def test_a_name_among_a_repeat_copys_names_is_an_error():
    """A layer named ``g.0.linear1`` beside ``repeat: 2, name: g`` took copy 0's own name
    for its linear layer, which became ``g.0.linear2`` where copy 1's is ``g.1.linear1``
    (found by an audit): an error at the layer, exit 2 from the commands."""
    text = """kind: network
input: [16, 8]
layers:
  - {name: g.0.linear1, type: linear, out_features: 8}
  - repeat: 2
    name: g
    layers:
      - {type: linear, out_features: 8}
      - {type: relu}
"""
    with pytest.raises(InputError) as err:
        load_network_text(text)
    assert "layer name 'g.0.linear1' lies among the names of repeat copy 'g.0'" in \
        str(err.value)
    # beside them, under another prefix, it is a name like any other
    net = load_network_text(text.replace("g.0.linear1", "g0.linear1"))
    assert [layer.name for layer in net.layers] == [
        "g0.linear1", "g.0.linear1", "g.0.relu1", "g.1.linear1", "g.1.relu1"]


def test_glob_match():
    net = load_network(NETWORKS / "alexnet.yaml")
    assert [layer.name for layer in net.match("fc*")] == ["fc6", "fc7", "fc8"]


@pytest.mark.parametrize("flash, causal", [(False, False), (False, True), (True, False),
                                           (True, True)])
def test_attention_kernels(flash, causal):
    """Attention's batched products by hand (12 heads of 64 over 1,024 tokens, 2
    sequences): Q·Kᵀ and P·V forward; backward dP, dV, dQ, dK, and with flash attention
    Q·Kᵀ once more first, since it keeps no probabilities (Dao et al. 2022). A causal
    flash kernel meets half the keys (512 a query); an unfused one masks the whole
    1,024 × 1,024 score matrix."""
    from planner.network import layer_kernels

    net = load_network_text(f"kind: network\ninput: [1024, 768]\nlayers:\n  - {{type: "
                            f"attention, heads: 12, flash: {str(flash).lower()}, "
                            f"causal: {str(causal).lower()}}}\n")
    (att,) = net.layers
    ks = layer_kernels(att, 2, 2)
    sk = 512 if flash and causal else 1024
    scores, mix = Gemm(1024, sk, 64, 24), Gemm(1024, 64, sk, 24)
    def batched(kernels):
        return [k for k in kernels if isinstance(k, Gemm) and k.batch > 1]

    assert batched(ks["forward"]) == [scores, mix]
    assert batched(ks["backward_data"]) == [scores] * flash + [scores, mix, mix, mix]
    # an unfused kernel's softmax passes over the 2 x 12 x 1,024² scores in bf16: read the
    # scores and write P forward (4 bytes a score); read P and dP, write dS backward (6)
    passes = [(k.label, k.bytes) for phase in ("forward", "backward_data")
              for k in ks[phase] if isinstance(k, Elementwise)]
    n = 2 * 12 * 1024 * 1024
    assert passes == ([] if flash else [("softmax", 4 * n), ("softmax", 6 * n)])
    # the model's MACs count a causal attention's needed half whatever the kernel (the
    # unfused kernel's masked half is its time, above, not the model's work; MFU was
    # 7% higher for GPT-2 unfused than fused before: found by an audit)
    need = 512 if causal else 1024
    assert att.macs == 1024 * 768 * 4 * 768 + 2 * 12 * 1024 * need * 64


def test_unfused_attention_dropout_passes():
    """With dropout on the probabilities an unfused kernel adds a pass each way over the
    scores (fp32: read P, write the dropped P and a byte of mask, 9 bytes a score; its
    backward reads the gradient and the mask and writes, 9 too), beside the softmax's 8
    and 12 bytes; flash attention fuses them all (Dao et al. 2022)."""
    from planner.network import layer_kernels

    for flash in (False, True):
        net = load_network_text("kind: network\ninput: [256, 64]\nlayers:\n  - {type: "
                                f"attention, heads: 4, dropout: 0.1, flash: "
                                f"{str(flash).lower()}}}\n")
        ks = layer_kernels(net.layers[0], 3, 4)
        n = 3 * 4 * 256 * 256
        passes = {phase: [(k.label, k.bytes) for k in ks[phase] if isinstance(k, Elementwise)]
                  for phase in ("forward", "backward_data", "backward_weight")}
        assert passes == ({"forward": [], "backward_data": [], "backward_weight": []} if flash
                          else {"forward": [("softmax", 8 * n), ("dropout", 9 * n)],
                                "backward_data": [("dropout", 9 * n), ("softmax", 12 * n)],
                                "backward_weight": []})


def test_automatic_names_skip_the_names_given():
    """A layer without a name takes the next ``kind<k>`` that no layer has or is given
    anywhere in its list (an unnamed linear before one named ``linear1`` was called
    ``linear1`` too, and the file was refused as a duplicate the user never wrote);
    unnamed repeat groups are ``repeat``, ``repeat2``... (two were both ``repeat``)."""
    net = load_network_text(
        "kind: network\ninput: [10]\nlayers:\n"
        "  - {type: linear, out_features: 10}\n"
        "  - {name: linear1, type: linear, out_features: 10}\n"
        "  - {type: linear, out_features: 10}\n"
        "  - repeat: 2\n    layers:\n      - {type: linear, out_features: 10}\n"
        "  - {name: repeat2, type: relu}\n"
        "  - repeat: 1\n    layers:\n      - {type: linear, out_features: 10}\n"
        "      - {type: relu}\n")
    assert [layer.name for layer in net.layers] == [
        "linear2", "linear1", "linear3", "repeat.0", "repeat.1", "repeat2",
        "repeat3.0.linear1", "repeat3.0.relu1"]
    # names given twice are still an error, at the second
    with pytest.raises(InputError, match="duplicate layer name 'fc'"):
        load_network_text("kind: network\ninput: [10]\nlayers:\n"
                          "  - {name: fc, type: linear, out_features: 10}\n"
                          "  - {name: fc, type: linear, out_features: 10}\n")


def _refusal(input_shape: str, layers: str) -> str:
    with pytest.raises(InputError) as exc:
        load_network_text(f"kind: network\ninput: {input_shape}\nlayers:\n{layers}")
    return str(exc.value)


def test_what_cannot_be_written_says_so():
    """Found by an audit writing published networks: a LayerNorm after a convolution
    normalised each row's W pixels (112 parameters for ConvNeXt's 96 channels), and
    the nearest name was offered for operations planner does not model
    (cross_attention -> attention, conv3d -> conv2d). Each now names what to do."""
    conv = "  - {type: conv2d, out_channels: 96, kernel: 4, stride: 4}\n"
    for norm in ("layernorm", "rmsnorm"):
        msg = _refusal("[3, 224, 224]", conv + f"  - {{type: {norm}}}\n")
        assert f"({norm}) needs a vector [features] or a sequence [seq, dim] as input, got " \
            "[96, 56, 56]; it normalises a token's features (the last axis)" in msg
        assert "batchnorm has its parameters (2 a channel)" in msg
    msg = _refusal("[3, 224, 224]", conv + "  - {type: attention, heads: 4}\n")
    assert "nothing turns an image into tokens: give the network its patches as input" in msg
    msg = _refusal("[3, 224, 224]", conv + "  - {type: linear, out_features: 8}\n")
    assert "add a flatten layer first (or, for the same linear map at every pixel, a " \
        "conv2d with kernel 1)" in msg
    seq = "[16, 64]"
    msg = _refusal(seq, "  - {type: cross_attention, heads: 4}\n")
    assert "layer type 'cross_attention' is not supported: an encoder-decoder's " \
        "cross-attention cannot be written: a network is one chain" in msg
    assert "did you mean" not in msg
    msg = _refusal("[3, 8, 8]", "  - {type: conv1d, out_channels: 4, kernel: 3}\n")
    assert "write a conv2d on an image of height 1 (input [C, 1, L], kernel [1, k])" in msg
    # a sliding window is the most recent keys (Mistral's, Gemma's): causal attention
    msg = _refusal(seq, "  - {type: attention, heads: 4, window: 4096}\n")
    assert "a window is the most recent keys each query meets, which needs causal: true " \
        "(bidirectional local attention is not modelled)" in msg
    # an unknown key is named against the layer's own keys, without the group's 'repeat'
    msg = _refusal(seq, "  - {type: attention, heads: 4, relative_bias: true}\n")
    assert "unknown key 'relative_bias' in an attention layer; expected one of: bias, " \
        "causal, dropout, flash, head_dim, heads, kv_heads, name, rotary, type, window" in msg
    # relu6 and leaky_relu cost as relu does: read as relu
    net = load_network_text("kind: network\ninput: [16]\nlayers:\n"
                            "  - {type: linear, out_features: 8}\n  - {type: relu6}\n"
                            "  - {type: leaky_relu}\n")
    assert [lay.type for lay in net.layers] == ["linear", "relu", "relu"]


@pytest.mark.parametrize(("layer", "said"), [
    ("{type: conv2d, out_channels: 8, kernel: 3, padding: valid}",
     "expected padding as an integer, [height, width] or 'same', got 'valid'; did you "
     "mean 0 (no padding)?"),
    ("{type: conv2d, out_channels: 8, kernel: 3, padding: sam}",
     "got 'sam'; did you mean same?"),
    ("{type: maxpool, kernel: 2, padding: valid}",
     "expected padding as an integer or [height, width], got 'valid'; did you mean 0 (no "
     "padding)?"),
    ("{type: maxpool, kernel: 2, padding: same}",
     "expected padding as an integer or [height, width], got 'same' (at"),
])
def test_padding_words_say_what_to_write(layer, said):
    """'valid' (PyTorch's and Keras's word for no padding) was "expected an integer, got a
    string" (2026-12-07 audit); a pool takes no 'same'."""
    text = f"kind: network\nname: p\ninput: [3, 8, 8]\nlayers:\n  - {layer}\n"
    with pytest.raises(InputError) as exc:
        load_network_text(text)
    assert said in str(exc.value)


def _backward_gemms(text):
    from planner.network import layer_kernels

    net = load_network_text(text)
    return {layer.name: [(k.m, k.n, k.k) for k in layer_kernels(layer, 64, 4)["backward_data"]
                         if isinstance(k, Gemm)] for layer in net.layers}


def test_no_input_gradient_where_only_parameter_free_layers_lead_to_it():
    """Found by an audit: a linear layer after a flatten (or a ReLU) at the network's
    start was charged its input gradient's GEMM, which autograd skips since nothing
    upstream requires a gradient; the same network without the flatten was not (8.05 vs
    9.01 ms of compute for a 150,528 → 4,096 → 1,000 MLP on 8 H100s). A norm with
    parameters before it needs the gradient (its weights' gradient reads it), and so
    does everything after the first layer with parameters. An attention or MoE layer
    first skips its input projection's backward-data GEMM too, as a linear does."""
    head = "kind: network\nname: n\ninput: [{inp}]\nlayers:\n"
    mlp = ("  - {name: a, type: linear, out_features: 256}\n  - {type: relu}\n"
           "  - {name: b, type: linear, out_features: 10}\n")
    plain = _backward_gemms(head.format(inp=512) + mlp)
    flat = _backward_gemms(head.format(inp="2, 16, 16") + "  - {type: flatten}\n" + mlp)
    relu = _backward_gemms(head.format(inp=512) + "  - {type: relu}\n" + mlp)
    # 64 samples: b's dX is 64 × 256 from 64 × 10; a's would be 64 × 512 from 64 × 256
    assert plain["a"] == flat["a"] == relu["a"] == []
    assert plain["b"] == flat["b"] == relu["b"] == [(64, 256, 10)]
    normed = _backward_gemms(head.format(inp=512) + "  - {type: layernorm}\n" + mlp)
    assert normed["a"] == [(64, 512, 256)]
    # attention first: its output projection's dgrad (64·8 tokens, 32 from 32) stays,
    # the input projection's (32 features from 96 = q, k, v) goes
    attn = _backward_gemms("kind: network\nname: n\ninput: [8, 32]\nlayers:\n"
                           "  - {name: at, type: attention, heads: 4}\n"
                           "  - {type: linear, out_features: 10}\n")
    assert (512, 32, 32) in attn["at"] and (512, 32, 96) not in attn["at"]
    second = _backward_gemms("kind: network\nname: n\ninput: [8, 32]\nlayers:\n"
                             "  - {type: linear, out_features: 32}\n"
                             "  - {name: at, type: attention, heads: 4}\n")
    assert (512, 32, 96) in second["at"]


def test_pytorch_spellings_of_activations_are_read():
    """Found by an audit: `leaky_relu` with its `negative_slope` and `gelu` with
    `approximate: tanh` (GPT-2's gelu_new), as PyTorch writes them, were refused as
    unknown keys ("in a relu layer"). Both are read; neither changes the layer, and a
    key that neither takes is still refused."""
    base = "kind: network\ninput: [64]\nlayers:\n  - {type: linear, out_features: 64}\n"
    plain = load_network_text(base + "  - {type: relu}\n  - {type: gelu}\n")
    spelled = load_network_text(base + "  - {type: leaky_relu, negative_slope: 0.2}\n"
                                       "  - {type: gelu, approximate: tanh}\n")
    assert [(x.type, x.flops, x.saves_input, x.saves_output) for x in plain.layers] == \
        [(x.type, x.flops, x.saves_input, x.saves_output) for x in spelled.layers]
    with pytest.raises(InputError, match="unknown key 'approximate'"):
        load_network_text(base + "  - {type: relu, approximate: tanh}\n")
    with pytest.raises(InputError, match="approximate"):
        load_network_text(base + "  - {type: gelu, approximate: fast}\n")


def test_two_layers_alike_but_for_their_input_gradient_are_priced_apart():
    """The fuzz tests found it, the day the input gradient became skippable after a
    first ReLU: the evaluation's cache took two linear layers of one shape for the same
    cost, so the one after the ReLU (no input gradient) and the one after it (one)
    were priced alike, whichever came first; the plan's time then differed from the
    same layouts priced afresh by half a backward pass. (A head follows: the last layer
    carries the loss's kernels.)"""
    from planner.evaluate import Options, evaluate, make_context
    from planner.layout import make_layout

    from .helpers import FixedEstimator, cluster

    net = load_network_text("kind: network\ninput: [64]\nlayers:\n  - {type: relu}\n"
                            "  - {name: a, type: linear, out_features: 64}\n"
                            "  - {name: b, type: linear, out_features: 64}\n"
                            "  - {name: head, type: linear, out_features: 10}\n")
    opts = Options(gpus=1, batch=8, overlap="none")
    ctx = make_context(net, cluster(), opts, FixedEstimator(1e-3))
    ev = evaluate(ctx, opts, {i: make_layout("data", 1, 1) for i in (1, 2, 3)})
    a, b = (r for r in ev.layers if r.layer.name in ("a", "b"))
    # one kernel a GEMM: a runs its weight gradient alone, b its input's gradient too
    assert (a.cost.backward_s, b.cost.backward_s) == (pytest.approx(1e-3),
                                                      pytest.approx(2e-3))


def test_split_halos_are_the_rows_each_device_lacks():
    """Brute force over kernels, strides, paddings, dilations, heights and splits: with
    each activation's height in balanced blocks (device ``k`` of ``n`` holds rows
    ``[⌊k·H/n⌋, ⌊(k+1)·H/n⌋)`` of the input and of the output), a device's forward halo
    is the input rows its outputs' windows read (``o·s − p + d·j``, inside the image)
    outside its block, and its backward halo the output rows outside its block whose
    windows read one of its input rows; the distinct (above, below) pairs; and the rows
    each reads (its own and its halo) with the output rows it computes."""
    from planner.network import split_halos, split_reads

    checked = 0
    for k, s, p, d in itertools.product(range(1, 6), range(1, 4), range(0, 4), range(1, 3)):
        for h_in in (5, 13, 24, 27, 56):
            h_out = (h_in + 2 * p - d * (k - 1) - 1) // s + 1
            for n in (1, 2, 3, 4, 8):
                if h_out < 1 or n > min(h_in, h_out):
                    continue
                fwd, bwd, reads = set(), set(), set()
                for dev in range(n):
                    i0, i1 = dev * h_in // n, (dev + 1) * h_in // n
                    o0, o1 = dev * h_out // n, (dev + 1) * h_out // n
                    rows = {o * s - p + d * j for o in range(o0, o1) for j in range(k)}
                    rows = {r for r in rows if 0 <= r < h_in}
                    fwd.add((sum(r < i0 for r in rows), sum(r >= i1 for r in rows)))
                    reads.add((len(rows | set(range(i0, i1))), o1 - o0))
                    hits = [o for o in range(h_out)
                            if any(i0 <= o * s - p + d * j < i1 for j in range(k))]
                    bwd.add((sum(o < o0 for o in hits), sum(o >= o1 for o in hits)))
                assert split_halos(k, s, p, d, h_in, h_out, n) == \
                    (tuple(sorted(fwd)), tuple(sorted(bwd))), (k, s, p, d, h_in, n)
                assert split_reads(k, s, p, d, h_in, h_out, n) == tuple(sorted(reads))
                checked += 1
    assert checked > 1500


def test_split_halos_by_hand():
    """The audit's cases (2026-12-08). 56 rows on 8 devices hold 7 each: a 2 × 2 max pool
    of stride 2 gives 28 rows, 3 or 4 a device ([0, 3), [3, 7), …), and output 3 reads
    rows 6 and 7, one of them device 0's: one row, where the aligned blocks of before
    priced none. A 3×3 convolution of stride 2 and padding 1 there: device 1's outputs
    3 … 6 read rows 5 … 13, two above its [7, 14) (it was priced one). Split two ways,
    a 3×3 convolution of stride 1 reads one row, from its one neighbour, not two."""
    from planner.network import split_halos

    assert max(sum(side) for side in split_halos(2, 2, 0, 1, 56, 28, 8)[0]) == 1
    assert max(sum(side) for side in split_halos(3, 2, 1, 1, 56, 28, 8)[0]) == 2
    assert split_halos(3, 1, 1, 1, 12, 12, 2) == (((0, 1), (1, 0)), ((0, 1), (1, 0)))
    # aligned blocks inside the image: halo_rows (the rows `show` lists)
    fwd, bwd = split_halos(3, 1, 1, 1, 16, 16, 4)
    assert max(fwd) == halo_rows(3, 1, 1, 1) == (1, 1) and max(bwd) == (1, 1)
