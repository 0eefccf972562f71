"""The activation memory the planner predicts is what PyTorch's autograd really keeps.

Builds small networks in PyTorch (the ``torch`` extra, CPU), runs a forward pass under
``torch.autograd.graph.saved_tensors_hooks`` and a cross-entropy loss, and counts the
bytes of every distinct tensor autograd saves for backward, parameters excluded; compares
with ``Network.saved_tensors`` and each layer's masks and indices."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.inputs import load_network_text

B = 4


def _saved_bytes(model: nn.Module, x: torch.Tensor, loss: bool = True) -> int:
    """Bytes of the distinct activation tensors autograd keeps (parameters, buffers and
    per-channel batch-norm statistics excluded: they do not grow with the batch), with a
    cross-entropy loss on the output unless ``loss`` is false."""
    params = {p.data_ptr() for p in model.parameters()} | {
        b.data_ptr() for b in model.buffers()}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params and t.dim() > 1:
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x.requires_grad_(False))
        if not loss:
            return sum(seen.values())
        # the loss, as in training: log-softmax keeps its output for backward (the
        # planner counts the network's output once for it)
        nn.functional.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long))
    return sum(seen.values())


def _predicted(net) -> int:
    per_sample = sum(net.saved_tensors().values()) * net.elem_bytes + sum(
        lay.saved_bytes_extra for lay in net.layers)
    return per_sample * B


def test_cnn_matches_autograd():
    torch.manual_seed(0)
    # no dropout here: on the CPU PyTorch keeps its mask as float32, on GPUs the fused
    # kernel keeps one byte per element, which is what the planner counts
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10))
    model.train()
    got = _saved_bytes(model, torch.randn(B, 3, 16, 16))
    net = load_network_text("""
kind: network
input: [3, 16, 16]
layers:
  - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}
  - {type: batchnorm}
  - {type: relu}
  - {type: maxpool, kernel: 2}
  - {type: conv2d, out_channels: 16, kernel: 3, padding: 1}
  - {type: relu}
  - {type: flatten}
  - {type: linear, out_features: 10}
""")
    assert _predicted(net) == got


def test_average_pools_keep_their_input_as_autograd_does():
    """Found by an audit: average pooling kept nothing for backward in the planner;
    PyTorch's AvgPool2DBackward0 and AdaptiveAvgPool2DBackward0 save their input (a
    DenseNet transition's 1×1 convolution output, here the first conv's), while an
    adaptive pool to 1×1 is a mean, which keeps only sizes."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.AvgPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(2), nn.Conv2d(8, 16, 1), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10))
    model.train()
    got = _saved_bytes(model, torch.randn(B, 3, 16, 16))
    net = load_network_text("""
kind: network
input: [3, 16, 16]
layers:
  - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}
  - {type: avgpool, kernel: 2}
  - {type: conv2d, out_channels: 8, kernel: 3, padding: 1}
  - {type: adaptive_avgpool, output_size: 2}
  - {type: conv2d, out_channels: 16, kernel: 1}
  - {type: adaptive_avgpool, output_size: 1}
  - {type: flatten}
  - {type: linear, out_features: 10}
""")
    assert _predicted(net) == got
    # by hand, per sample, fp32: the input image (3·16·16, the first conv's, for its
    # weights' gradient), the first conv's output (8·16·16, the pool's), the pooled map
    # (8·8·8, the second conv's), its output (8·8·8, the adaptive pool's), the 2×2 map
    # (8·2·2, the 1×1 conv's), the flattened 16 (the linear's) and the logits (10, the
    # loss's); the 1×1 conv's output, 16·2·2, is not kept (a mean)
    assert got == B * 4 * (3 * 256 + 8 * 256 + 8 * 64 + 8 * 64 + 8 * 4 + 16 + 10)


def test_mlp_with_gelu_and_layernorm_matches_autograd():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16),
                          nn.Tanh(), nn.Linear(16, 4))
    got = _saved_bytes(model, torch.randn(B, 32))
    net = load_network_text("""
kind: network
input: [32]
layers:
  - {type: linear, out_features: 64}
  - {type: gelu}
  - {type: layernorm}
  - {type: linear, out_features: 16}
  - {type: tanh}
  - {type: linear, out_features: 4}
""")
    assert _predicted(net) == got


@pytest.mark.parametrize("heads", [1, 4])
def test_attention_internal_tensors(heads):
    """Q, K, V, the probabilities and the context per sample, by hand."""
    seq, dim = 16, 32
    net = load_network_text(f"""
kind: network
input: [{seq}, {dim}]
layers:
  - {{type: attention, heads: {heads}}}
""")
    a = net.layers[0]
    hd = dim // heads
    assert a.saved_internal == seq * 3 * heads * hd + seq * heads * hd + heads * seq * seq


class _EagerAttention(nn.Module):
    """Attention as GPT-2's reference code writes it: one QKV projection, softmax,
    dropout on the probabilities, P·V, the output projection."""

    def __init__(self, seq: int, dim: int, heads: int, p: float) -> None:
        super().__init__()
        self.seq, self.dim, self.heads = seq, dim, heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, hd = x.shape[0], self.dim // self.heads
        q, k, v = (t.view(b, self.seq, self.heads, hd).transpose(1, 2)
                   for t in self.qkv(x).split(self.dim, dim=-1))
        att = self.drop(((q @ k.transpose(-2, -1)) / hd ** 0.5).softmax(-1))
        return self.proj((att @ v).transpose(1, 2).reshape(b, self.seq, self.dim))


def test_attention_dropout_keeps_its_output_and_mask():
    """Dropout on the attention probabilities keeps, besides the softmax output, its own
    output (P·V's backward reads it) and its mask: the planner adds h·s² elements and h·s²
    mask bytes a sample (Korthikanti et al., MLSys 2023: 5as² bytes in 16-bit). Autograd
    keeps exactly two more h·s² tensors with dropout than without; on the CPU the mask is
    float32, so both are 4 bytes an element here (on GPUs the mask is a byte)."""
    torch.manual_seed(0)
    seq, dim, heads = 16, 32, 4
    x = torch.randn(B, seq, dim)
    kept = {p: _saved_bytes(_EagerAttention(seq, dim, heads, p).train(), x, loss=False)
            for p in (0.0, 0.1)}
    nets = {p: load_network_text(f"kind: network\ninput: [{seq}, {dim}]\nlayers:\n"
                                 f"  - {{type: attention, heads: {heads}, dropout: {p}}}\n")
            for p in (0.0, 0.1)}
    d_internal = nets[0.1].layers[0].saved_internal - nets[0.0].layers[0].saved_internal
    d_mask = nets[0.1].layers[0].saved_bytes_extra - nets[0.0].layers[0].saved_bytes_extra
    assert d_internal == d_mask == heads * seq * seq
    assert kept[0.1] - kept[0.0] == B * 4 * (d_internal + d_mask)


class _LiveBytes(TorchDispatchMode):
    """The bytes of the tensors PyTorch allocates while this mode is active and that are
    still alive, and their maximum: every operator's outputs (forward and backward)
    counted once a storage, released when the storage is freed (what the CUDA allocator
    would hand out, seen on the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage())
        return out

    def _add(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if not key or key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)

        def free(k: int = key) -> None:
            self.now -= self.live.pop(k, 0)

        weakref.finalize(storage, free)


@pytest.mark.parametrize(("dtype", "kind"), [
    ("float32", "eager"), ("bfloat16", "eager"), ("bfloat16", "eager-no-upcast")])
def test_eager_cross_entropy_peak_matches_autograd(dtype, kind):
    """PyTorch's ``cross_entropy`` (``log_softmax`` then ``nll_loss``) over a head's
    logits, the caller's reference to them dropped before backward as torchtitan's
    training step does: the most its forward and backward hold at once is what the
    planner adds for it, the kept log-probabilities and the eager loss's workspace (three
    logits-sized tensors in the loss's dtype: fp32 when the logits are upcast), within
    0.5% (the head's small weight and input gradients)."""
    from planner.evaluate import Options, evaluate, make_context
    from planner.layout import make_layout

    from .helpers import FixedEstimator, cluster

    tokens, dim, vocab = 2048, 4, 8192
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    head = nn.Linear(dim, vocab, bias=False).to(dt)
    x = torch.randn(1, tokens, dim, dtype=dt, requires_grad=True)
    y = torch.randint(0, vocab, (tokens,))
    live = _LiveBytes()
    with live:
        logits = head(x)
        flat = logits.flatten(0, 1)
        loss = nn.functional.cross_entropy(flat.float() if kind == "eager" else flat, y)
        del logits, flat
        loss.backward()
    net = load_network_text(f"""
kind: network
dtype: {dtype}
input: [{tokens}, {dim}]
layers:
  - {{type: linear, out_features: {vocab}, bias: false}}
""").with_cross_entropy(kind)
    opts = Options(gpus=1, batch=1, overlap="none", cross_entropy=kind)
    ctx = make_context(net, cluster(), opts, FixedEstimator(1e-6))
    ev = evaluate(ctx, opts, {0: make_layout("data", 1, 1)})
    # the head's input, kept by the linear layer, was allocated before: not in the count
    loss_bytes = ev.memory.activations - tokens * dim * net.elem_bytes + ev.memory.workspace
    per = 4 if kind == "eager" else net.elem_bytes
    assert loss_bytes == 3 * tokens * vocab * per
    assert live.peak == pytest.approx(loss_bytes, rel=0.005)


@pytest.mark.parametrize("ceil", [False, True])
def test_pool_output_sizes_match_pytorch_also_where_the_window_passes_the_input(ceil):
    """Found by an audit: a pooling window larger than its input was refused, though
    under ceil_mode PyTorch keeps a window that starts inside it (3×3, stride 2, on 2×2
    gives 1×1). Every kernel, stride and padding over small inputs: the planner's output
    size is PyTorch's, and it refuses exactly where PyTorch does."""
    from planner.errors import InputError

    for size in (1, 2, 3, 5):
        for k in (1, 2, 3, 4):
            for s in (1, 2, 3):
                for pad in range(k // 2 + 1):
                    x = torch.zeros(1, 1, size, size)
                    try:
                        want = nn.functional.max_pool2d(x, k, s, pad,
                                                        ceil_mode=ceil).shape[-1]
                    except RuntimeError:
                        want = None
                    text = (f"kind: network\ninput: [1, {size}, {size}]\nlayers:\n"
                            "  - {type: conv2d, out_channels: 1, kernel: 1}\n")
                    for kind in ("maxpool", "avgpool"):
                        body = text + (f"  - {{type: {kind}, kernel: {k}, stride: {s}, "
                                       f"padding: {pad}, ceil_mode: {str(ceil).lower()}}}\n")
                        try:
                            got = load_network_text(body).layers[1].output_shape[-1]
                        except InputError:
                            got = None
                        assert got == want, (size, k, s, pad, kind)


def test_adaptive_average_pooling_matches_pytorch_also_to_a_larger_output():
    """Found by an audit: an adaptive pool to an output larger than its input was
    refused, though PyTorch repeats the input's cells (torchvision's VGG-16 on 32 × 32
    images pools 1 × 1 to 7 × 7). Output sizes and what autograd keeps match PyTorch's;
    the FLOPs add every window's reads, PyTorch's windows running from ⌊i·h/oh⌋ to
    ⌈(i+1)·h/oh⌉ (by hand for 7 → 3: rows [0, 3), [2, 5), [4, 7), 9 a column)."""
    torch.manual_seed(0)
    for h, oh in ((1, 7), (4, 7), (7, 3), (7, 7), (14, 7)):
        model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.AdaptiveAvgPool2d(oh), nn.Flatten(),
                              nn.Linear(2 * oh * oh, 4))
        x = torch.randn(B, 3, h, h)
        net = load_network_text(f"kind: network\ninput: [3, {h}, {h}]\nlayers:\n"
                                "  - {type: conv2d, out_channels: 2, kernel: 1}\n"
                                f"  - {{type: adaptive_avgpool, output_size: {oh}}}\n"
                                "  - {type: flatten}\n  - {type: linear, out_features: 4}\n")
        assert net.layers[1].output_shape == tuple(model[1](model[0](x)).shape[1:])
        assert _predicted(net) == _saved_bytes(model, x), (h, oh)
    pool = load_network_text("kind: network\ninput: [2, 7, 7]\nlayers:\n"
                             "  - {type: conv2d, out_channels: 2, kernel: 1}\n"
                             "  - {type: adaptive_avgpool, output_size: 3}\n"
                             "  - {type: flatten}\n  - {type: linear, out_features: 4}\n")
    assert pool.layers[1].flops == 2 * 9 * 9


def test_same_padding_with_an_even_kernel_matches_pytorch():
    """``padding: same`` with an even effective kernel was refused; PyTorch pads one
    row (column) more after than before: it copies the input padded by that one
    (``F.pad``), convolves the copy with the symmetric rest and keeps the copy for
    backward (a (2, 4) kernel on 3 × 32 × 32 keeps 3 × 33 × 33). Output shapes and the
    bytes autograd keeps match PyTorch's, dilation included (a kernel of 4 with
    dilation 2 spans 7 columns: symmetric, no copy of its own)."""
    import warnings

    torch.manual_seed(0)
    cases = (((2, 4), (1, 1)), ((4, 4), (1, 2)), ((3, 2), (2, 1)), ((3, 3), (1, 1)))
    for kernel, dilation in cases:
        with warnings.catch_warnings():  # PyTorch warns of the asymmetric copy
            warnings.simplefilter("ignore")
            model = nn.Sequential(
                nn.Conv2d(3, 8, kernel, padding="same", dilation=dilation), nn.ReLU(),
                nn.Conv2d(8, 8, kernel, padding="same", dilation=dilation), nn.ReLU(),
                nn.Flatten(), nn.Linear(8 * 32 * 32, 10))
            x = torch.randn(B, 3, 32, 32)
            torch_shapes = [tuple(model[0](x).shape[1:])]
            saved = _saved_bytes(model, x)
        net = load_network_text(
            "kind: network\ninput: [3, 32, 32]\nlayers:\n"
            f"  - {{type: conv2d, out_channels: 8, kernel: {list(kernel)}, padding: same, "
            f"dilation: {list(dilation)}}}\n  - {{type: relu}}\n"
            f"  - {{type: conv2d, out_channels: 8, kernel: {list(kernel)}, padding: same, "
            f"dilation: {list(dilation)}}}\n  - {{type: relu}}\n"
            "  - {type: flatten}\n  - {type: linear, out_features: 10}\n")
        assert [net.layers[0].output_shape] == torch_shapes == [(8, 32, 32)]
        internal = sum(lay.saved_internal for lay in net.layers) * net.elem_bytes * B
        assert _predicted(net) + internal == saved, (kernel, dilation)
