"""Memory per device against hand-computed examples (planner.costs.memory)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from planner.costs.memory import param_bytes
from planner.evaluate import Options, evaluate, make_context
from planner.inputs import load_cluster, load_network
from planner.layout import make_layout

from .conftest import CLUSTERS, NETWORKS, invoke
from .helpers import FixedEstimator, cluster, mlp


@pytest.mark.parametrize(("optimizer", "elem", "master", "total"), [
    ("sgd", 4, None, 8), ("momentum", 4, None, 12), ("adam", 4, None, 16),
    ("adam", 2, None, 16),        # ZeRO §3.1: 2 + 2 + (4 + 4 + 4)
    ("momentum", 2, None, 12),    # 2 + 2 + (4 + 4)
    ("adam", 2, False, 8),        # pure bf16: 2 + 2 + 2·2
    ("sgd", 2, True, 8),          # 2 + 2 + 4 (the master copy)
])
def test_bytes_per_parameter(optimizer, elem, master, total):
    assert param_bytes(optimizer, elem, master).total == total


def _eval(net, cl, layouts, p, b, **kw):
    opts = Options(gpus=p, batch=b, overlap=kw.pop("overlap", "none"), **kw)
    ctx = make_context(net, cl, opts, FixedEstimator(1e-6))
    return evaluate(ctx, opts, layouts)


def test_mlp_data_parallel_by_hand():
    net = mlp([1000, 1000, 10])
    cl = cluster()
    ev = _eval(net, cl, {lay.index: make_layout("data", 1, 4) for lay in net.layers
                         if lay.has_weights}, 4, 64)
    m = ev.memory
    params = 1000 * 1000 + 1000 + 1000 * 10 + 10
    assert (m.weights, m.gradients, m.optimizer) == (params * 4, params * 4, params * 4)
    # fc1 keeps its input, relu1 its output (which fc2 keeps too): 2 tensors of 16×1000;
    # the loss keeps the network's output, 16×10
    assert m.activations == 2 * 16 * 1000 * 4 + 16 * 10 * 4
    # busiest layer in backward: fc1 or relu1, ΔY and ΔX of 16×1000 each
    assert m.workspace == 2 * 16 * 1000 * 4
    # largest message: fc1's gradient all-reduce
    assert m.comm_buffers == (1000 * 1000 + 1000) * 4
    assert m.peak == pytest.approx(12 * params + 2 * 64000 + 640 + 128000 + 4004000)


def test_gradient_buckets_only_where_gradients_are_reduced():
    """With overlap, gradients gather in buckets (two of ``bucket_bytes`` at most) before
    their all-reduce; a layout with no replicas to reduce with holds none: one device
    (it held two 25 MiB buckets with nothing to send), or every layer model-split over
    all of them."""
    net = mlp([1000, 1000, 10])
    params = 1000 * 1000 + 1000 + 1000 * 10 + 10
    # buckets of 1.5 MB: data 1x4 reduces all 4,044,040 bytes of gradient (two full
    # buckets); model 2x2 holds and reduces half of them, 2,022,020 (one and a bit)
    for p, mode, grid, buckets in ((1, "data", (1, 1), 0), (4, "model", (4, 1), 0),
                                   (4, "data", (1, 4), 3 * 10**6),
                                   (4, "model", (2, 2), params * 4 // 2)):
        ev = _eval(net, cluster(), {lay.index: make_layout(mode, *grid)
                                    for lay in net.layers if lay.has_weights}, p, 64,
                   overlap="gradients", bucket_bytes=1.5e6)
        largest = max((t.bytes for r in ev.layers for t in r.cost.terms), default=0.0)
        assert ev.memory.comm_buffers == largest + buckets, (p, mode, grid)
        if p == 1:
            assert largest == 0 and ev.memory.gradients == params * 4


def test_model_split_shards_parameters():
    net = mlp([1000, 1000, 10])
    ev = _eval(net, cluster(), {lay.index: make_layout("model", 2, 2) for lay in net.layers
                                if lay.has_weights}, 4, 64, optimizer="adam")
    params_local = (1000 * 1000 + 1000) / 2 + (1000 * 10 + 10) / 2
    assert ev.memory.weights == params_local * 4
    assert ev.memory.optimizer == params_local * 8


def test_resnet50_data_parallel_parameters_and_activations():
    net = load_network(NETWORKS / "resnet50.yaml")
    cl = load_cluster(CLUSTERS / "dgx-h100.yaml")
    ev = _eval(net, cl, {lay.index: make_layout("data", 1, 8) for lay in net.layers
                         if lay.has_weights}, 8, 256)
    m = ev.memory
    assert m.weights == m.gradients == m.optimizer == 25_557_032 * 4
    # 32 samples per device; what one sample keeps (see test_network) times 32
    per_sample = sum(net.saved_tensors().values()) * 4 + sum(
        lay.saved_bytes_extra for lay in net.layers)
    assert m.activations == pytest.approx(32 * per_sample, rel=1e-12)
    assert m.capacity == 81559 * 2**20 - 2**30
    assert m.fits


def test_gpt2_adam_bf16_memory():
    text = (NETWORKS / "gpt2-small.yaml").read_text().replace("dtype: float32", "dtype: bfloat16")
    from planner.inputs import load_network_text

    net = load_network_text(text)
    cl = load_cluster(CLUSTERS / "dgx-h100.yaml")
    ev = _eval(net, cl, {lay.index: make_layout("data", 1, 8) for lay in net.layers
                         if lay.has_weights}, 8, 64, optimizer="adam")
    # 124,439,808 params × 16 bytes (bf16 weights and grads, fp32 master and moments)
    assert ev.memory.weights + ev.memory.gradients + ev.memory.optimizer == 124_439_808 * 16


def test_does_not_fit_is_reported():
    net = mlp([30000, 30000, 30000])
    small = cluster(device="T4")
    ev = _eval(net, small, {lay.index: make_layout("data", 1, 2) for lay in net.layers
                            if lay.has_weights}, 2, 8)
    assert not ev.memory.fits  # 1.8G params × 12 B ≫ 15 GiB
    ev2 = _eval(net, small, {lay.index: make_layout("model", 2, 1) for lay in net.layers
                             if lay.has_weights}, 2, 8)
    assert ev2.memory.weights == pytest.approx(ev.memory.weights / 2, rel=1e-4)


def test_the_loss_keeps_the_networks_output():
    # GPT-2's logits: softmax cross-entropy keeps them for backward (log-softmax's
    # output, as test_memory_torch checks against autograd), 1,024 tokens × 50,257
    # classes a sample, 8 samples a device: 1.53 GiB in float32, which plans missed
    net = load_network(NETWORKS / "gpt2-small.yaml")
    cl = load_cluster(CLUSTERS / "dgx-h100.yaml")
    ev = _eval(net, cl, {lay.index: make_layout("data", 1, 8) for lay in net.layers
                         if lay.has_weights}, 8, 64)
    head = next(r for r in ev.layers if r.layer.name == "lm_head")
    assert head.layer.index == len(net.layers) - 1 and head.layer.saved_internal == 0
    assert head.activation_bytes == 8 * 1024 * 50257 * 4
    # in bf16 the loss still keeps fp32 probabilities (it upcasts the logits: Megatron-
    # LM's vocabulary-parallel cross-entropy, PyTorch's on logits.float(); Korthikanti
    # et al. 2023 count 4·s·b·v/t), 4 bytes an element, not the network's 2 (found by a
    # memory audit: 50% low); over a vocabulary split 8 ways (Megatron's column head), an
    # eighth of them
    from planner.inputs import load_network_text
    bf16 = load_network_text((NETWORKS / "gpt2-small.yaml").read_text().replace(
        "dtype: float32", "dtype: bfloat16"))
    ev = _eval(bf16, cl, {lay.index: make_layout("data", 1, 8) for lay in bf16.layers
                          if lay.has_weights}, 8, 64)
    head = next(r for r in ev.layers if r.layer.name == "lm_head")
    assert head.activation_bytes == 8 * 1024 * 50257 * 4
    assert bf16.activation_bytes(head.layer) == 1024 * 50257 * 4
    split = {lay.index: make_layout("data", 1, 8) for lay in bf16.layers if lay.has_weights}
    split[head.layer.index] = make_layout("column", 8, 1)
    ev = _eval(bf16, cl, split, 8, 64)
    col = next(r for r in ev.layers if r.layer.name == "lm_head")
    assert col.activation_bytes == pytest.approx(64 * 1024 * 50257 / 8 * 4, rel=1e-12)
    body = bf16.by_name("h.0.mlp.c_fc")  # everything else in the network's 2 bytes
    assert bf16.output_bytes(body) == 2
    from planner.costs.layer import loss_cost
    from planner.layout import Dist
    ctx = make_context(bf16, cl, Options(gpus=8, batch=64))
    kernels, _ = loss_cost(head.layer, Dist(8, (1, 8), None), ctx)
    # per element: read the bf16 logits, write fp32 log-probabilities; backward: the
    # dense gradient written, read, the saved output read (fp32), the input gradient
    # written in bf16
    elems = 8 * 1024 * 50257
    assert kernels["forward"][0].bytes == elems * (2 + 4)
    assert kernels["backward_data"][0].bytes == elems * (3 * 4 + 2)


@pytest.mark.parametrize(("dtype", "kind", "kept", "workspace"), [
    # fused (Megatron-LM's vocabulary-parallel loss): fp32 probabilities kept, the
    # gradient written over them; the head's output and input gradients in flight
    ("float32", "fused", 4, 4), ("bfloat16", "fused", 4, 2),
    # eager (PyTorch's cross_entropy on fp32 logits): log-probabilities kept, their
    # gradient and the logits' gradient written while both are live, all fp32
    ("float32", "eager", 4, 2 * 4), ("bfloat16", "eager", 4, 2 * 4),
    # the same on bf16 logits as they come: all three in bf16
    ("bfloat16", "eager-no-upcast", 2, 2 * 2),
])
def test_the_cross_entropy_s_memory_by_hand(dtype, kind, kept, workspace):
    """GPT-2 small, 8 sequences of 1,024 tokens a device, 50,257 classes: L = 8 · 1,024 ·
    50,257 logits. Kept for backward: L at the loss's bytes; the busiest moment's
    workspace: the loss's (L times the bytes given, per test_memory_torch's count of
    autograd) or the head's gradients in flight (L + 8 · 1,024 · 768 at the network's
    bytes), whichever is larger."""
    from planner.inputs import load_network_text

    net = load_network_text((NETWORKS / "gpt2-small.yaml").read_text().replace(
        "dtype: float32", f"dtype: {dtype}")).with_cross_entropy(kind)
    cl = load_cluster(CLUSTERS / "dgx-h100.yaml")
    layouts = {lay.index: make_layout("data", 1, 8) for lay in net.layers if lay.has_weights}
    ev = _eval(net, cl, layouts, 8, 64, cross_entropy=kind)
    logits = 8 * 1024 * 50257
    head = next(r for r in ev.layers if r.layer.name == "lm_head")
    assert head.activation_bytes == logits * kept
    e = 4 if dtype == "float32" else 2
    assert ev.memory.workspace == max(logits * workspace, (logits + 8 * 1024 * 768) * e)
    # the loss's elementwise kernels read and write at the loss's bytes too
    assert net.output_bytes(head.layer) == kept


def test_uneven_splits_hold_the_busiest_share():
    """A split that does not divide the heads, channels or features leaves the busiest
    device the rounded-up share, for memory as for time: 12 heads over 8 devices put 2 on
    one of them, as over 6, so its weights (Q, K, V and output projections of 2 heads,
    the output bias whole) and what attention keeps for backward are those of 6x1. A
    linear layer of 10 output features over 4 holds 3 of them; split by its 10 input
    features (row), 3 of the weight's columns and the whole bias."""
    from planner.costs.layer import local_params
    from planner.evaluate import own_kept_bytes
    from planner.inputs import load_network_text

    net = load_network_text("kind: network\ninput: [64, 768]\nlayers:\n"
                            "  - {name: attn, type: attention, heads: 12, dropout: 0.1}\n"
                            "  - {name: fc, type: linear, out_features: 10}\n"
                            "  - {name: fc2, type: linear, out_features: 7}\n")
    attn, fc, fc2 = net.layers
    d, hd, s = 768, 64, 64
    two_heads = d * 3 * 2 * hd + 2 * hd * d + 3 * 2 * hd + d  # by hand, biases included
    assert local_params(attn, make_layout("model", 6, 1)) == two_heads
    assert local_params(attn, make_layout("model", 8, 1)) == two_heads
    assert local_params(attn, make_layout("model", 12, 1)) == two_heads // 2 + d // 2
    # kept per sample at 2 bytes: Q, K, V, context of 2 heads, probabilities and dropout
    # output (elements), the dropout mask (bytes)
    kept = (s * 4 * 2 * hd + 2 * 2 * s * s) * 2 + 2 * s * s
    for pr in (6, 8):
        assert own_kept_bytes(attn, make_layout("model", pr, 1), None, 1, 2) == kept
    assert local_params(fc, make_layout("column", 4, 1)) == 3 * 769
    assert local_params(fc2, make_layout("row", 4, 1)) == 3 * 7 + 7


#: one GPT-3 175B layer's shape (Brown et al. 2020; Korthikanti et al. 2023, Table 3):
#: width 12,288, 96 heads, 2,048 tokens, pre-norm, a GELU MLP of 4h, dropout on the
#: attention probabilities and both residual branches, 16-bit activations, no flash
GPT3_LAYERS = """kind: network
name: gpt3-layers
input: [2048]
dtype: float16
layers:
  - {name: wte, type: embedding, vocab: 51200, dim: 12288}
  - {name: wpe, type: positional_embedding, positions: 2048}
  - {name: drop, type: dropout, p: 0.1}
  - repeat: 2
    name: h
    layers:
      - name: attn
        type: residual
        body:
          - {name: ln_1, type: layernorm}
          - {name: attn, type: attention, heads: 96, causal: true, flash: false,
             dropout: 0.1}
          - {name: resid_drop, type: dropout, p: 0.1}
      - name: mlp
        type: residual
        body:
          - {name: ln_2, type: layernorm}
          - {name: c_fc, type: linear, out_features: 49152}
          - {name: gelu, type: gelu}
          - {name: c_proj, type: linear, out_features: 12288}
          - {name: drop, type: dropout, p: 0.1}
  - {name: ln_f, type: layernorm}
  - {name: lm_head, type: linear, out_features: 51200, bias: false, tie: wte}
"""


@pytest.mark.parametrize("mode, t", [("data", 1), ("megatron", 4), ("megatron", 8),
                                     ("megatron-sp", 4), ("megatron-sp", 8)])
def test_a_transformer_layer_keeps_korthikantis_table_2(runner, tmp_path, mode, t):
    """Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models", MLSys 2023, Table 2: bytes one transformer layer keeps for backward, 16-bit
    activations with dropout masks, batch b, sequence s, width h, a heads, tensor
    parallelism t: ``sbh(34 + 5as/h)`` with none, ``sbh(10 + 24/t + 5as/(ht))`` with
    tensor parallelism, ``sbh/t · (34 + 5as/h)`` with sequence parallelism too. The
    planner's layer (its two residual blocks) on a GPT-3 175B-shaped layer, b = 1: within
    0.1% (its norms also keep an fp32 mean and reciprocal deviation a token, which the
    paper leaves out: 16 bytes a token, 0.0006% here)."""
    net = tmp_path / "gpt3.yaml"
    net.write_text(GPT3_LAYERS)
    args = ["-p", "1", "-b", "1"] if mode == "data" else \
        ["-p", str(t), "-b", "1", "--grid", f"{t}x1", "--mode", mode]
    r = invoke(runner, "cost", net, CLUSTERS / "dgx-h100.yaml", *args, "--format", "json")
    assert r.exit_code in (0, 1), r.stderr
    layers = json.loads(r.stdout)["layers"]
    kept = sum(L["memory"]["activation_bytes"] for L in layers if L["name"].startswith("h.0."))
    s, h, a = 2048, 12288, 96
    want = {"data": s * h * (34 + 5 * a * s / h),
            "megatron": s * h * (10 + 24 / t + 5 * a * s / (h * t)),
            "megatron-sp": s * h / t * (34 + 5 * a * s / h)}[mode]
    assert kept == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize("mode, t", [("data", 1), ("megatron", 8), ("megatron-sp", 8)])
def test_full_recomputation_keeps_korthikantis_checkpoint(runner, tmp_path, mode, t):
    """Korthikanti et al. (MLSys 2023, §4.1 and Table 2's last row): full activation
    recomputation keeps each layer's input, ``2sbh`` bytes in 16 bits (``2sbh/t`` with
    sequence parallelism: the input split by tokens; without it the input is whole on
    every device), and rebuilds one whole layer at a time. The GPT-3 175B-shaped layers
    above, b = 1, ``--recompute blocks``: with ``--recompute-unit layers`` the first layer
    keeps exactly the second's input (``2sbh/t``: its last add's output), and its
    rebuild's working set is Table 2's layer less that checkpoint, within 0.1%; by
    residual blocks it keeps twice that (the MLP block's input too)."""
    net = tmp_path / "gpt3.yaml"
    net.write_text(GPT3_LAYERS)
    args = ["-p", "1", "-b", "1"] if mode == "data" else \
        ["-p", str(t), "-b", "1", "--grid", f"{t}x1", "--mode", mode]
    s, h, a = 2048, 12288, 96
    split = t if mode == "megatron-sp" else 1
    table2 = {"data": s * h * (34 + 5 * a * s / h),
              "megatron": s * h * (10 + 24 / t + 5 * a * s / (h * t)),
              "megatron-sp": s * h / t * (34 + 5 * a * s / h)}[mode]
    for unit, checkpoints in (("layers", 1), ("blocks", 2)):
        r = invoke(runner, "cost", net, CLUSTERS / "dgx-h100.yaml", *args, "--recompute",
                   "blocks", "--recompute-unit", unit, "--format", "json")
        assert r.exit_code in (0, 1), r.stderr
        doc = json.loads(r.stdout)
        kept = sum(L["memory"]["activation_bytes"] for L in doc["layers"]
                   if L["name"].startswith("h.0."))
        assert kept == checkpoints * 2 * s * h / split
        if unit == "layers":
            rebuilt = doc["memory"]["recompute"]["largest_rebuild_bytes"]
            assert rebuilt == pytest.approx(table2 - 2 * s * h / split, rel=1e-3)


@settings(max_examples=200, deadline=None)
@given(hst.lists(hst.integers(-1, 40), min_size=1, max_size=12),
       hst.lists(hst.tuples(hst.integers(-1, 40), hst.integers(0, 2**40)), max_size=60))
def test_sums_up_to_each_point_are_the_direct_sums(points, items):
    """What the recomputed blocks still keep when each is rebuilt, summed in one sorted
    pass (``evaluate._sums_up_to``), is the direct sum for every point, exactly: the
    sizes are whole bytes."""
    from planner.evaluate import _sums_up_to

    expected = [float(sum(size for pos, size in items if pos <= p)) for p in points]
    assert _sums_up_to(points, [(pos, float(size)) for pos, size in items]) == expected


def test_the_documents_memory_parts_sum_to_its_peak(runner):
    """Found by an audit: each part of the breakdown was rounded to whole bytes on its
    own, so on GPT-2 small over 7 devices (ZeRO-free, but 124M parameters' activations in
    sevenths) they summed to one byte more than peak_bytes. The parts are whole bytes
    summing to the peak; the helper gives leftover bytes to the largest fractions."""
    import json

    from planner.costs.memory import whole_parts

    from .conftest import EXAMPLES, invoke

    for extra in ((), ("--zero", "3")):
        r = invoke(runner, "plan", EXAMPLES / "networks/gpt2-small.yaml",
                   EXAMPLES / "clusters/dgx-h100.yaml", "-p", "7", "-b", "3", *extra,
                   "--format", "json")
        assert r.exit_code == 0, r.stderr
        m = json.loads(r.stdout)["memory"]
        assert sum(m["breakdown"].values()) == m["peak_bytes"]
    # 0.5 + 0.5 + 0.5 = 1.5 rounds to 2: the first two take the two halves, each rounded
    # alone they would be 0 + 0 + 0 (round half to even)
    assert whole_parts([0.5, 0.5, 0.5]) == [1, 1, 0]
    assert whole_parts([10.2, 20.3, 30.7]) == [10, 20, 31]  # 61.2 -> 61
    assert whole_parts([3.0, 4.0]) == [3, 4]


def test_a_domain_split_convolution_keeps_its_halo_rows_after_a_relu():
    """Two 3x3 convolutions (padding 1) with a ReLU between, split by height over 4
    devices (batch 4: 16 of the 64 rows a device). Each convolution keeps its input with
    a halo row above and below (18 rows); the ReLU keeps the same tensor (its output),
    which is kept once, at the larger size (an audit: it had been kept at 16 rows, the
    ReLU's, where the ReLU came first). A row is 4 samples x 8 channels x 64 columns of
    4 bytes, 8,192 bytes: the input's 18 rows, the ReLU's output's 18 and the network's
    output's 16 (the loss keeps it) make 52."""
    from planner.inputs import load_network_text

    net = load_network_text("kind: network\ninput: [8, 64, 64]\nlayers:\n"
                            "  - {name: c1, type: conv, out_channels: 8, kernel: 3, "
                            "padding: 1}\n"
                            "  - {name: r, type: relu}\n"
                            "  - {name: c2, type: conv, out_channels: 8, kernel: 3, "
                            "padding: 1}\n")
    ev = _eval(net, cluster(), {lay.index: make_layout("domain", 4, 1)
                                for lay in net.layers if lay.has_weights}, 4, 4)
    assert ev.memory.activations == 52 * 8192


@pytest.mark.parametrize("view", ["identity", "flatten"])
def test_a_trailing_view_changes_no_memory(view):
    """Found by an audit: a bf16 output head followed by an identity (or a flatten) was
    shown keeping half the bytes for the loss (its bf16 logits, where the loss keeps
    fp32 probabilities: 6.11 MiB a sample at 16 × 100,000, shown 3.05), and its largest
    gradients in flight counted the view's input and output gradients as two tensors
    (buffers 390.6 MiB against 195.4 at batch 64). A view is the same tensor: the same
    network without it keeps and moves the same bytes."""
    from planner.inputs import load_network_text

    from .helpers import cluster

    head = "kind: network\ninput: [16, 64]\ndtype: bfloat16\nlayers:\n" \
           "  - {type: linear, out_features: 100000}\n"
    plain = load_network_text(head)
    viewed = load_network_text(head + f"  - {{type: {view}}}\n")
    # by hand: 16 tokens x 100,000 logits x 4 bytes (fp32 probabilities); the network
    # input the linear keeps is no layer's output, so no layer's to show
    for net in (plain, viewed):
        assert sum(net.activation_bytes(layer) for layer in net.layers) == \
            16 * 100_000 * 4
    opts = Options(gpus=1, batch=64)
    reports = []
    for net in (plain, viewed):
        ctx = make_context(net, cluster(), opts)
        lay = {layer.index: make_layout("data", 1, 1) for layer in net.layers
               if layer.has_weights}
        reports.append(evaluate(ctx, opts, lay).memory)
    assert reports[1].activations == reports[0].activations
    assert reports[1].workspace == reports[0].workspace
