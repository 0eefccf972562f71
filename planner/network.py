"""Network descriptions: the YAML schema, expansion of ``repeat`` groups and residual
blocks, and shape inference.

A network file looks like this (see ``examples/networks/`` for complete ones)::

    kind: network
    name: tiny-cnn
    input: [3, 32, 32]        # per sample: [C, H, W] image, [seq] tokens, [seq, dim], [features]
    dtype: float32
    layers:
      - {name: conv1, type: conv2d, out_channels: 16, kernel: 3, padding: 1}
      - {type: relu}
      - type: residual        # output = body(x) + shortcut(x); shortcut defaults to identity
        name: block1
        body:
          - {type: conv2d, out_channels: 16, kernel: 3, padding: 1}
        activation: relu      # applied after the add
      - repeat: 2             # copies named group.0, group.1, ...
        name: group
        layers:
          - {type: conv2d, out_channels: 16, kernel: 3, padding: 1}
      - {type: global_avgpool}
      - {type: flatten}
      - {name: fc, type: linear, out_features: 10}

Shape inference gives, for every layer, its input and output shape, parameter count,
forward multiply-accumulates and FLOPs (2 per multiply-accumulate, plus the elementwise
arithmetic of activations, norms and pooling), what it keeps for backward, the shapes of
its training products, and for convolutions and pooling the halo rows a height split
needs. Every problem is reported with its YAML path; nothing here knows about files.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import Issue
from .fields import (
    MAX_DIM,
    Fields,
    Invalid,
    boolean,
    choice,
    described,
    integer,
    number,
    pair,
    show,
    string,
)
from .loading import child_path
from .ops import Conv, Elementwise, Gemm, Kernel

Shape = tuple[int, ...]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

DTYPE_ALIASES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                                 "fp64": "float64", "half": "float16", "float": "float32"}


def dtype_hint(text: str) -> str:
    """What an unknown dtype's message suggests: the dtypes with their short names, and
    the one meant where only the case is off ('BF16': 'bf16') or a spelling is close."""
    short = {n: a for a, n in reversed(DTYPE_ALIASES.items())}  # the first of each
    listing = ", ".join(f"{n} ({short[n]})" if n in short else n for n in DTYPE_BYTES)
    lower = text.lower()
    close = [lower] if DTYPE_ALIASES.get(lower, lower) in DTYPE_BYTES else \
        difflib.get_close_matches(lower, [*DTYPE_BYTES, *DTYPE_ALIASES], n=1)
    return f"expected one of {listing}" + (f"; did you mean '{close[0]}'?" if close else "")


#: The catalog's peak-FLOP/s key for each network dtype.
DTYPE_PEAK_KEY: dict[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                                  "float64": "fp64"}

# Elementwise arithmetic per element, forward (a convention, documented in the README).
_ELEMENTWISE_FLOPS: dict[str, int] = {
    "relu": 1, "gelu": 8, "silu": 4, "tanh": 4, "sigmoid": 4, "identity": 0, "dropout": 1,
    "softmax": 5, "batchnorm": 2, "layernorm": 5, "rmsnorm": 4, "add": 1, "lrn": 6,
    "flatten": 0, "positional_embedding": 1,
    # gated linear units, per output element: the gate's activation and the product
    "glu": 5, "swiglu": 5, "geglu": 9,
}
#: Bytes per element of what the loss keeps: its probabilities in fp32 whatever the
#: network's dtype (:meth:`Network.output_bytes`).
LOSS_BYTES = 4
#: Rotary position embeddings, per query and key element: ``x·cos + rot(x)·sin``.
ROTARY_FLOPS = 3
#: Gated linear units (Dauphin et al. 2017; Shazeer 2020): ``act(a) · b`` for the two
#: halves ``[a, b]`` of the last dimension, and the gate's activation.
GATED = {"glu": "sigmoid", "swiglu": "silu", "geglu": "gelu"}

ACTIVATIONS = ("relu", "gelu", "silu", "tanh", "sigmoid", "identity")
LAYER_TYPES = (
    "conv2d", "linear", "maxpool", "avgpool", "global_avgpool", "adaptive_avgpool",
    *ACTIVATIONS, *GATED, "softmax", "dropout", "batchnorm", "layernorm", "rmsnorm", "lrn",
    "flatten", "embedding", "positional_embedding", "attention", "moe",
)
_TYPE_ALIASES = {
    "conv": "conv2d", "fc": "linear", "dense": "linear", "max_pool": "maxpool",
    "avg_pool": "avgpool", "global_avg_pool": "global_avgpool", "gap": "global_avgpool",
    "adaptive_avg_pool": "adaptive_avgpool", "bn": "batchnorm", "batch_norm": "batchnorm",
    "ln": "layernorm", "layer_norm": "layernorm", "rms_norm": "rmsnorm", "mha": "attention",
    "self_attention": "attention", "multihead_attention": "attention",
    "pos_embedding": "positional_embedding", "mixture_of_experts": "moe",
    # the same cost as relu (one elementwise pass, no parameters)
    "relu6": "relu", "leaky_relu": "relu",
}
_CHAIN = ("a network is one chain of layers from one input (residual blocks aside); "
          "see the README's What it does not model")
#: Well-known layer types planner does not model, and what to write instead, where
#: anything will do (a "did you mean" to the nearest name would change the operation).
UNSUPPORTED_TYPES: dict[str, str] = {
    "cross_attention": f"an encoder-decoder's cross-attention cannot be written: {_CHAIN}",
    "conv1d": "planner models 2-D convolutions: write a conv2d on an image of height 1 "
              "(input [C, 1, L], kernel [1, k])",
    "conv3d": "planner models 2-D convolutions only",
    "conv_transpose2d": f"a decoder's upsampling is not modelled: {_CHAIN}",
    "upsample": f"a decoder's upsampling is not modelled: {_CHAIN}",
    "interpolate": f"a decoder's upsampling is not modelled: {_CHAIN}",
    "concat": f"a skip connection is a residual block's add, not a concatenation: {_CHAIN}",
    "groupnorm": "group normalisation is not modelled; batchnorm has its parameters (2 a "
                 "channel) and costs as much",
    "hardswish": "write silu: about the same cost and no parameters",
    "mamba": "state-space layers (Mamba, S4) are not modelled",
    "mla": "multi-head latent attention (DeepSeek-V2/V3) is not modelled",
}
for _alias, _same in (("conv_transpose", "conv_transpose2d"), ("deconv", "conv_transpose2d"),
                      ("convtranspose2d", "conv_transpose2d"), ("cat", "concat"),
                      ("group_norm", "groupnorm"), ("ssm", "mamba"),
                      ("cross_attn", "cross_attention"), ("hard_swish", "hardswish")):
    UNSUPPORTED_TYPES[_alias] = UNSUPPORTED_TYPES[_same]
#: Layers whose output is a view of their input (no new storage).
VIEW_TYPES = ("flatten", "identity")
#: Layers that own weights (their layout is a free choice of the search).
WEIGHTED_TYPES = ("conv2d", "linear", "attention", "embedding", "moe")
#: The most layers a network may expand to (repeat groups multiply). Real networks have
#: a few thousand; the bound keeps a mistyped or hostile repeat count (nested repeats of
#: 100,000 make 10^10 layers) from running for hours. Plans of 10,000 layers take seconds.
MAX_LAYERS = 20_000


def name_matches(name: str, pattern: str) -> bool:
    """Whether a layer name matches a pin's pattern: the name itself, or a shell-style
    glob. The name is tried first, so a layer called ``fc[1]`` is pinned as
    ``fc[1]=...`` (as a glob, ``[1]`` is a character class: ``fc1``)."""
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


# ---------------------------------------------------------------------------------------
# Layer geometry


@dataclass(frozen=True)
class ConvGeom:
    """Geometry of a 2-D convolution (per sample)."""

    in_channels: int
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]

    def problem(self, batch: int, phase: str = "fwd", *, out_channels: int | None = None,
                in_height: int | None = None, groups: int | None = None,
                in_channels: int | None = None, pad_height: int | None = None,
                bands: int = 1) -> Conv:
        """The cuDNN problem for ``batch`` samples, optionally sharded (``bands``: the
        rows of one of that many bands of the image, :meth:`Conv.batch_split`)."""
        return Conv(
            n=batch, c=in_channels or self.in_channels, h=in_height or self.in_hw[0],
            w=self.in_hw[1], k=out_channels or self.out_channels, r=self.kernel[0],
            s=self.kernel[1], stride_h=self.stride[0], stride_w=self.stride[1],
            pad_h=self.padding[0] if pad_height is None else pad_height,
            pad_w=self.padding[1], dil_h=self.dilation[0],
            dil_w=self.dilation[1], groups=groups or self.groups,
            phase=phase,  # type: ignore[arg-type]
            bands=bands, full_h=self.in_hw[0] if bands > 1 else 0,
            full_pad_h=self.padding[0] if bands > 1 else 0,
        )


@dataclass(frozen=True)
class PoolGeom:
    """Geometry of a pooling window (per sample)."""

    kind: str
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    channels: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]


@dataclass(frozen=True)
class LinearGeom:
    """A linear layer applied to ``tokens`` vectors per sample."""

    in_features: int
    out_features: int
    tokens: int
    bias: bool
    tied_to: str | None


@dataclass(frozen=True)
class AttentionGeom:
    """Multi-head self-attention over ``seq`` tokens of width ``dim``."""

    seq: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    bias: bool  #: biases on the Q, K and V projections
    causal: bool
    flash: bool
    dropout: float = 0.0  #: on the attention probabilities
    #: rotary position embeddings (Su et al. 2021) rotate each query and key
    rotary: bool = False
    #: a bias on the output projection (None: as ``bias``; Qwen2's ``bias: qkv`` has none)
    out_bias: bool | None = None
    #: sliding-window attention (Mistral 7B, Jiang et al. 2023; Gemma 2's local layers):
    #: each query meets the ``window`` most recent keys, its own included (None: all
    #: keys up to it; causal only)
    window: int | None = None

    @property
    def windowed(self) -> bool:
        """Whether the window leaves out keys a causal query would meet."""
        return self.window is not None and self.window < self.seq

    def window_pairs(self) -> int:
        """Query-key pairs of a windowed sequence: query ``i`` (from 0) meets
        ``min(i + 1, W)`` keys, ``s·W − W·(W − 1)/2`` in all."""
        w = self.window if self.window is not None else self.seq
        return self.seq * w - w * (w - 1) // 2

    def held(self, split: int) -> tuple[int, int]:
        """Query and key/value heads on the busiest of ``split`` devices (rounded up:
        12 heads over 8 devices put 2 on one; every device holds a key/value head)."""
        return -(-self.heads // split), max(1, -(-self.kv_heads // split))

    def weights(self, heads: int | None = None, kv_heads: int | None = None) -> int:
        """Parameters of ``heads`` query and ``kv_heads`` key/value heads (default: all):
        their Q, K, V and output projections, and the biases (the output bias whole)."""
        h = self.heads if heads is None else heads
        kv = self.kv_heads if kv_heads is None else kv_heads
        q_out, kv_out = h * self.head_dim, kv * self.head_dim
        wts = self.dim * (q_out + 2 * kv_out) + q_out * self.dim
        out_bias = self.bias if self.out_bias is None else self.out_bias
        return wts + (q_out + 2 * kv_out if self.bias else 0) + (self.dim if out_bias else 0)

    def saved(self, heads: int | None = None, kv_heads: int | None = None
              ) -> tuple[int, int]:
        """What one sample keeps for backward with ``heads`` query and ``kv_heads``
        key/value heads (default: all of them): elements (Q, K, V, the context and,
        without flash attention, the softmax output and the dropped-out probabilities
        P·V reads) and bytes (flash attention's fp32 log-sum-exp per row, else the
        dropout mask). Korthikanti et al. (MLSys 2023) count the same per layer without
        flash attention: softmax output 2as², dropout mask as², its output 2as² bytes in
        16-bit (a heads, s tokens)."""
        h = self.heads if heads is None else heads
        kv = self.kv_heads if kv_heads is None else kv_heads
        q_out, kv_out = h * self.head_dim, kv * self.head_dim
        internal = self.seq * (q_out + 2 * kv_out) + self.seq * q_out
        extra = 0
        if self.flash:
            extra += h * self.seq * 4  # log-sum-exp per row, fp32
        else:
            internal += h * self.seq * self.seq  # the attention probabilities
            if self.dropout > 0:
                internal += h * self.seq * self.seq  # after dropout, for dV = Pᵀ·dO
                extra += h * self.seq * self.seq  # the mask, a byte each
        return internal, extra


#: the activations of a mixture-of-experts layer's expert MLPs: a gated unit has a gate
#: and an up projection (``act(x·W_gate) · (x·W_up)``, then ``W_down``), the others one
MOE_ACTIVATIONS = ("swiglu", "geglu", "glu", "gelu", "relu", "silu")


@dataclass(frozen=True)
class MoeGeom:
    """A mixture-of-experts MLP over ``tokens`` tokens of width ``dim`` (Shazeer et al.,
    ICLR 2017; GShard, Lepikhin et al., ICLR 2021; Mixtral, Jiang et al. 2024): a router
    (a linear layer ``dim → experts`` without bias, softmax, top-k) sends each token to
    ``top_k`` of ``experts`` MLPs ``dim → ffn → dim`` and sums their outputs weighted
    by its probabilities. With a ``capacity_factor`` each expert takes at most that
    many times its even share of the routed tokens, in buffers of that size that the
    kernels and the all-to-alls run on whole (GShard, Switch Transformer); without one
    (dropless), every expert gets its even share, or with a ``load_imbalance`` ``L``
    the busiest expert ``L`` times its even share (the others theirs): a router is only
    as even as its auxiliary loss makes it, and under expert parallelism the device of
    the busiest expert sets the pace."""

    tokens: int
    dim: int
    experts: int
    top_k: int
    ffn: int
    activation: str
    capacity_factor: float | None = None
    imbalance: float = 1.0  #: the busiest expert's routed rows over an even share
    #: shared experts (DeepSeekMoE, Dai et al. 2024): every token goes through them
    #: besides its routed ones, as through one MLP of ``shared · shared_ffn`` hidden
    #: features, whose output is added to the routed experts'
    shared: int = 0
    shared_ffn: int = 0  #: hidden features of each shared expert

    @property
    def shared_hidden(self) -> int:
        """Hidden features of the shared experts together."""
        return self.shared * self.shared_ffn

    def shared_weights(self, split: int = 1) -> int:
        """Parameters of the shared experts with their hidden features split ``split``
        ways (rounded up: the busiest device); 0 without any."""
        h = -(-self.shared_hidden // split)
        return self.expert_weights(h) if h else 0

    def busiest(self, local: int) -> float:
        """How many times its even share of routed rows the busiest device receives
        when each holds ``local`` of the experts: the busiest expert's ``imbalance``
        times an even share, and its ``local − 1`` neighbours' even shares,
        ``(local − 1 + imbalance) / local``; 1 where a device holds every expert (the
        rows of its tokens are all its own, however they spread over the experts)."""
        if local >= self.experts:
            return 1.0
        return (local - 1 + self.imbalance) / local

    @property
    def gated(self) -> bool:
        """Whether the experts are gated units (a gate and an up projection)."""
        return self.activation in GATED

    def up(self, ffn: int | None = None) -> int:
        """Outputs of an expert's first product for ``ffn`` hidden features (default:
        all): the gate and up projections side by side for a gated unit."""
        f = self.ffn if ffn is None else ffn
        return 2 * f if self.gated else f

    def expert_weights(self, ffn: int | None = None) -> int:
        """Parameters of one expert with ``ffn`` hidden features (default: all)."""
        f = self.ffn if ffn is None else ffn
        return self.dim * self.up(f) + f * self.dim

    @property
    def router_weights(self) -> int:
        """Parameters of the router (no bias, as Mixtral's)."""
        return self.dim * self.experts

    @property
    def fill(self) -> float:
        """Routed rows a token makes, buffers included: ``top_k`` times the capacity
        factor (1 without one)."""
        return self.top_k * (self.capacity_factor or 1.0)

    def rows(self, tokens: int) -> int:
        """Rows each expert multiplies when ``tokens`` tokens are routed over all of
        them: ``⌈fill · tokens / experts⌉``, the even share (times the capacity factor)."""
        return math.ceil(self.fill * tokens / self.experts - 1e-9)

    def saved(self, ffn: int | None = None, busiest: float = 1.0, shared_split: int = 1
              ) -> int:
        """Elements one sample keeps for backward besides its input, with ``ffn`` hidden
        features an expert (default: all): the router's probabilities, and per routed row
        the permuted input, the first product's output, the activation's output (the
        last product's input) and the expert's output (the combine's gradient by the
        router's weights reads it); ``busiest`` times the even share of the rows (a
        device's experts' rows under imbalance, :meth:`busiest`); per token, the shared
        experts' first product's and activation's outputs, their hidden features split
        ``shared_split`` ways."""
        f = self.ffn if ffn is None else ffn
        per_row = 2 * self.dim + self.up(f) + f
        h = -(-self.shared_hidden // shared_split)
        return self.tokens * (self.experts + self.up(h) + h) + math.ceil(
            self.tokens * self.fill * per_row * busiest - 1e-9)


@dataclass(frozen=True)
class EmbeddingGeom:
    """A token embedding table."""

    vocab: int
    dim: int
    seq: int


@dataclass(frozen=True)
class Layer:
    """One layer after expansion and shape inference. Counts are per sample."""

    index: int
    name: str
    type: str
    path: str  #: YAML path where the layer is defined
    input_shape: Shape
    output_shape: Shape
    params: int  #: trainable parameters this layer owns
    weight_elems: int  #: weight elements it computes with (= params unless tied)
    macs: int  #: forward multiply-accumulates of matrix products
    flops: int  #: forward FLOPs: 2 per multiply-accumulate + elementwise arithmetic
    inputs: tuple[int, ...]  #: producer layer indices (-1: the network input)
    saves_input: bool = False  #: keeps its input for backward
    saves_output: bool = False  #: keeps its output for backward (the last layer: the loss)
    saved_internal: int = 0  #: other elements kept for backward (attention Q, K, V, ...)
    saved_bytes_extra: int = 0  #: masks and indices kept for backward, in bytes
    conv: ConvGeom | None = None
    pool: PoolGeom | None = None
    linear: LinearGeom | None = None
    attention: AttentionGeom | None = None
    embedding: EmbeddingGeom | None = None
    moe: MoeGeom | None = None
    block: str | None = None  #: the residual block this layer belongs to
    role: str | None = None  #: 'body', 'shortcut' or 'add' inside a residual block
    tied_to: str | None = None
    #: its input is a pipeline stage's, made by a layer of the stage before: although it
    #: is the stage network's input, its gradient is computed and sent back
    stage_input: bool = False
    #: some layer upstream of its input has parameters, so its input's gradient is
    #: needed (False where only the network input and parameter-free layers, a flatten,
    #: a ReLU, lead to it: autograd computes no gradient nothing requires)
    upstream_params: bool = True

    @property
    def input_grad(self) -> bool:
        """Whether its backward pass computes its input's gradient: not for the
        network's input, nor for what only parameter-free layers made of it (nothing
        upstream waits for either), but for a pipeline stage's (the stage before runs
        its backward pass on it)."""
        return (self.inputs != (-1,) and self.upstream_params) or self.stage_input

    @property
    def has_weights(self) -> bool:
        """Whether the layer computes with weights of its own shape (conv2d, linear,
        attention, embedding): its layout is searched. Norms and positional embeddings
        own parameters too but follow their neighbours' layout."""
        return self.type in WEIGHTED_TYPES

    @property
    def in_elems(self) -> int:
        """Input elements per sample."""
        return math.prod(self.input_shape)

    @property
    def out_elems(self) -> int:
        """Output elements per sample."""
        return math.prod(self.output_shape)

    @property
    def in_rows(self) -> int:
        """:func:`rows_of` the layer's input."""
        return rows_of(self.input_shape)

    @property
    def out_rows(self) -> int:
        """:func:`rows_of` the layer's output."""
        return rows_of(self.output_shape)

    @property
    def is_spatial(self) -> bool:
        """Whether input and output are images ``[C, H, W]`` (domain splits apply)."""
        return len(self.input_shape) == 3 and len(self.output_shape) == 3

    @property
    def model_split_limit(self) -> int:
        """The most ways this layer's weights can be split (output channels, features,
        heads); 1 when a model split does not apply."""
        if self.conv is not None:
            return self.conv.out_channels
        if self.linear is not None:
            return self.linear.out_features
        if self.attention is not None:
            return self.attention.heads
        if self.embedding is not None:
            return self.embedding.dim
        if self.moe is not None:
            return self.moe.ffn  # each expert split by hidden features
        return 1

    @property
    def out_height(self) -> int:
        """Output height of a spatial layer (0 if not spatial)."""
        return self.output_shape[1] if len(self.output_shape) == 3 else 0

    @property
    def halo_forward(self) -> tuple[int, int]:
        """Input rows a height split needs from the neighbours above and below.

        Output row ``o`` of a window of ``k`` taps ``d`` rows apart (dilation), with
        stride ``s`` and padding ``p``, reads input rows ``o·s − p + d·j``,
        ``j = 0 … k−1``; a block of output rows owns the aligned input rows
        ``[o0·s, o1·s)`` and needs the distinct rows outside them that its windows read
        (:func:`halo_rows`): all ``p`` above and ``k_eff − s − p`` below
        (``k_eff = d(k−1)+1``) where windows leave no gaps, only the rows the taps hit
        where they do (a stride beyond the window, or a dilated window striding over
        rows it skips). A padding beyond the window (a 1×1 convolution padded by 1,
        whose output is taller than its input) needs ``p`` rows above too.
        """
        k, s, p, d = self._window_h()
        return halo_rows(k, s, p, d)

    @property
    def halo_backward(self) -> tuple[int, int]:
        """Output-gradient rows a height split needs from the neighbours (Eq. 7's
        backward halo, exact for stride and padding)."""
        k, s, p, d = self._window_h()
        k = d * (k - 1) + 1
        if k <= 1 and p == 0:
            return (0, 0)
        return (max(0, (k - 1 - p) // s), max(0, (s - 1 + p) // s))

    def split_halos(self, n: int) -> tuple[tuple[tuple[int, int], ...],
                                           tuple[tuple[int, int], ...]]:
        """:func:`split_halos` of the layer's window on its height split ``n`` ways."""
        k, s, p, d = self._window_h()
        return split_halos(k, s, p, d, self.input_shape[1], self.output_shape[1], n)

    def pool_halo(self, n: int) -> bool:
        """Whether a max or average pool on its height split ``n`` ways exchanges halo
        rows (both its input and its output have a row for every device; otherwise the
        height is gathered first)."""
        return self.pool is not None and self.pool.kind in ("max", "avg") and \
            self.is_spatial and min(self.in_rows, self.out_rows) >= n

    def split_reads(self, n: int) -> tuple[tuple[int, int], ...]:
        """:func:`split_reads` of the layer's window on its height split ``n`` ways."""
        k, s, p, d = self._window_h()
        return split_reads(k, s, p, d, self.input_shape[1], self.output_shape[1], n)

    def _window_h(self) -> tuple[int, int, int, int]:
        """Taps, stride, padding and dilation of the layer's window along the height."""
        if self.conv is not None:
            c = self.conv
            return c.kernel[0], c.stride[0], c.padding[0], c.dilation[0]
        if self.pool is not None and self.pool.kind in ("max", "avg"):
            return self.pool.kernel[0], self.pool.stride[0], self.pool.padding[0], 1
        return 1, 1, 0, 1

    def products(self, batch: int) -> dict[str, list[Kernel]]:
        """The kernels of one training step for ``batch`` samples on one device, by
        phase: ``forward``, ``backward_data``, ``backward_weight`` (empty when the layer
        has no such product)."""
        return layer_kernels(self, batch, elem_bytes=4)


@functools.lru_cache(maxsize=1024)
def halo_rows(taps: int, stride: int, pad: int, dilation: int) -> tuple[int, int]:
    """Distinct input rows outside a block's own ``[o0·s, o1·s)`` that its windows read,
    above and below, for a block away from the image's edges.

    Relative to ``o0·s``, output ``o0 + m`` reads ``m·s + t`` for each tap offset
    ``t = d·j − p``: those below 0 are above the block. Relative to ``o1·s``, output
    ``o1 − 1 − m`` reads ``t − s − m·s``: those from 0 up are below it."""
    offsets = [dilation * j - pad for j in range(taps)]
    reach = (dilation * (taps - 1) + pad) // max(stride, 1) + 2
    above = {m * stride + t for t in offsets for m in range(reach) if m * stride + t < 0}
    below = {t - stride - m * stride for t in offsets for m in range(reach)
             if t - stride - m * stride >= 0}
    return len(above), len(below)


def _device_halos(taps: int, stride: int, pad: int, dilation: int, h_in: int, h_out: int,
                  n: int, k: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Device ``k``'s forward and backward (above, below) halo rows of
    :func:`split_halos` (None where its block of outputs, or of inputs, is empty)."""
    offsets = [dilation * j - pad for j in range(taps)]
    span, s = dilation * (taps - 1), max(stride, 1)
    i0, i1 = k * h_in // n, (k + 1) * h_in // n
    o0, o1 = k * h_out // n, (k + 1) * h_out // n
    fwd = bwd = None
    if o1 > o0:
        # output o reads rows [o·s − p, o·s − p + span]: above i0 only where o·s − p < i0,
        # below i1 only where o·s − p + span ≥ i1
        near = range(o0, min(o1, max(o0, (i0 + pad - 1) // s + 1)))
        far = range(max(o0, -(-(i1 + pad - span) // s)), o1)
        above = {r for o in near for t in offsets if 0 <= (r := o * s + t) < i0}
        below = {r for o in far for t in offsets if i1 <= (r := o * s + t) < h_in}
        fwd = (len(above), len(below))
    if i1 > i0:
        # the outputs outside [o0, o1) whose windows read a row of [i0, i1)
        lo = max(0, -(-(i0 + pad - span) // s))
        hi = min(h_out, (i1 - 1 + pad) // s + 1)

        def hit(o: int) -> bool:
            return any(i0 <= o * s + t < i1 for t in offsets)

        bwd = (sum(hit(o) for o in range(lo, min(hi, o0))),
               sum(hit(o) for o in range(max(lo, o1), hi)))
    return fwd, bwd


@functools.lru_cache(maxsize=4096)
def split_reads(taps: int, stride: int, pad: int, dilation: int, h_in: int, h_out: int,
                n: int) -> tuple[tuple[int, int], ...]:
    """For each device of a height split ``n`` ways (balanced blocks, as
    :func:`split_halos`), the distinct (input rows it reads: its own and its forward
    halo, output rows it computes)."""
    return tuple(sorted({(rows_in + sum(fwd or (0, 0)), rows_out) for fwd, _, rows_in, rows_out
                         in _split_devices(taps, stride, pad, dilation, h_in, h_out, n)}))


@functools.lru_cache(maxsize=4096)
def _split_devices(taps: int, stride: int, pad: int, dilation: int, h_in: int, h_out: int,
                   n: int) -> tuple[tuple[tuple[int, int] | None, tuple[int, int] | None,
                                          int, int], ...]:
    """Each device's (forward halo, backward halo, input rows, output rows) of a height
    split ``n`` ways: what :func:`split_halos` and :func:`split_reads` read."""
    return tuple((*_device_halos(taps, stride, pad, dilation, h_in, h_out, n, k),
                  (k + 1) * h_in // n - k * h_in // n, (k + 1) * h_out // n - k * h_out // n)
                 for k in range(n))


def rows_of(shape: Shape) -> int:
    """The rows a height split divides: an image's ``[C, H, W]`` height, a sequence's
    ``[seq, dim]`` tokens; 0 for a vector."""
    return shape[1] if len(shape) == 3 else shape[0] if len(shape) == 2 else 0


def busiest_rows(rows: int, n: int) -> float:
    """The busiest device's share of ``rows`` split ``n`` ways in balanced blocks,
    ``⌈rows/n⌉/rows`` (``1/n`` where there are no rows to count)."""
    return -(-rows // n) / rows if rows > 0 and n > 1 else 1.0 / max(n, 1)


@functools.lru_cache(maxsize=4096)
def split_halos(taps: int, stride: int, pad: int, dilation: int, h_in: int, h_out: int,
                n: int) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """The halo rows of a height split over ``n`` devices, forward and backward: the
    distinct (rows above the device's own block, rows below it) over the devices.

    Every activation's height is split in balanced blocks, device ``k`` holding rows
    ``[⌊k·H/n⌋, ⌊(k+1)·H/n⌋)`` of the layer's input and of its output alike. Forward, a
    device reads the input rows its output rows' windows read (output ``o``:
    ``o·s − p + d·j``, inside the image) that are not its own; backward, it computes its
    own input rows' gradient from the output rows whose windows read them, and receives
    those of the output gradient it does not hold. Where the blocks are a whole number
    of strides this is :func:`halo_rows` inside the image and less at its edges (the
    first and last device have one neighbour: two devices read one side each); where
    they are not, windows straddle the blocks that :func:`halo_rows` takes as aligned
    (56 rows on 8 devices under a 2 × 2 pool of stride 2: a device holds 7 input rows
    and 3 or 4 output rows, and reads a row of its neighbour's; an audit found it priced
    as none)."""
    devices = _split_devices(taps, stride, pad, dilation, h_in, h_out, n)
    fwd = {d[0] for d in devices if d[0] is not None}
    bwd = {d[1] for d in devices if d[1] is not None}
    return tuple(sorted(fwd)), tuple(sorted(bwd))


def layer_kernels(layer: Layer, batch: int, elem_bytes: int, *, model_split: int = 1,
                  height_split: int = 1, input_split: int = 1,
                  feature_split: int = 1, core_split: int = 1,
                  expert_split: int = 1, key_split: int = 1) -> dict[str, list[Kernel]]:
    """The kernels of ``layer`` on one device's shard.

    ``batch`` is the local batch; ``model_split`` divides output channels, features or
    heads (rounded up: the busiest device); ``height_split`` divides the image height,
    the input shard including the forward halo rows, or a sequence's tokens (an
    attention layer's queries: each meets every key, context parallelism);
    ``input_split`` divides a linear layer's input features (a row-parallel shard: the
    reduction of its forward GEMM); ``core_split`` divides the heads of attention's core
    (the score and mix products), which then meets every token (DeepSpeed-Ulysses: the
    projections on a token split, the core on a head split);
    ``feature_split`` divides the features an activation or dropout works on;
    ``expert_split`` divides a mixture of experts' experts (expert parallelism: the
    device's experts take the rows the ``expert_split`` devices' tokens route to them);
    ``key_split`` divides the keys attention's core meets (one step of context
    parallelism's ring, which meets one device's keys at a time).
    """
    out: dict[str, list[Kernel]] = {"forward": [], "backward_data": [], "backward_weight": []}
    ms = max(1, model_split)
    if layer.conv is not None:
        c = layer.conv
        k_local = -(-c.out_channels // ms)
        g = c.groups
        if ms > 1 and g > 1:
            # each device holds k_local output channels: whole groups when ms < g
            g_local = max(1, g // ms) if g % ms == 0 else 1
            c_local = (c.in_channels // g) * g_local
        else:
            g_local, c_local = g, c.in_channels
        # a height split: the busiest device computes ceil(H_out / split) output rows
        # from the input rows they read, halo included; timed as the layer's padding
        # around the rows inside the image, or, where the halo is more than the padding
        # (an unpadded or strided filter), as those rows unpadded
        h_in, pad_h = c.in_hw[0], c.padding[0]
        if height_split > 1:
            rows = -(-c.out_hw[0] // height_split)
            reach = (rows - 1) * c.stride[0] + c.dilation[0] * (c.kernel[0] - 1) + 1
            h_in, pad_h = (reach - 2 * pad_h, pad_h) if reach > 2 * pad_h else (reach, 0)
        for phase, key in (("fwd", "forward"), ("bwd_data", "backward_data"),
                           ("bwd_filter", "backward_weight")):
            if phase == "bwd_data" and not layer.input_grad:
                continue  # the network input needs no gradient
            out[key].append(c.problem(batch, phase, out_channels=k_local, in_height=h_in,
                                      groups=g_local, in_channels=c_local, pad_height=pad_h,
                                      bands=height_split if height_split > 1 else 1))
        return out
    if layer.linear is not None:
        lin = layer.linear
        t = batch * -(-lin.tokens // max(1, height_split))
        n_local = -(-lin.out_features // ms)
        k_local = -(-lin.in_features // max(1, input_split))
        out["forward"].append(Gemm(t, n_local, k_local, role="fprop"))
        if layer.input_grad:
            out["backward_data"].append(Gemm(t, k_local, n_local, role="dgrad"))
        out["backward_weight"].append(Gemm(n_local, k_local, t, role="wgrad"))
        return out
    if layer.attention is not None:
        a = layer.attention
        # a token split (context parallelism): this device's queries meet every key
        sq = -(-a.seq // max(1, height_split))
        t = batch * sq
        h_local, kv_local = a.held(ms)
        qkv = (h_local + 2 * kv_local) * a.head_dim
        proj_in = h_local * a.head_dim
        bh = batch * h_local
        if core_split > 1:  # the core: its heads over every token
            sq, bh = a.seq, batch * a.held(core_split)[0]
        # the keys each query meets: a causal flash kernel skips the tiles above the
        # diagonal, half of them (Dao et al. 2022; split by tokens, as Megatron-LM's
        # context parallelism balances it: each device holds chunks i and 2·P_r − 1 − i
        # of 2·P_r, so its queries meet half the keys too); an unfused one computes the
        # whole score matrix and masks it
        sk = -(-a.seq // 2) if a.causal and a.flash else a.seq
        if a.windowed and a.flash:
            # a windowed flash kernel skips the tiles outside the band too: each query
            # meets its share of the band's pairs (an unfused one masks the whole matrix)
            sk = -(-a.window_pairs() // a.seq)
        sk = -(-sk // max(1, key_split))
        scores, mix = Gemm(sq, sk, a.head_dim, bh), Gemm(sq, a.head_dim, sk, bh)
        # rotary embeddings: one memory-bound pass over the queries and keys (read,
        # write; the cos and sin tables are per position, cached) after their
        # projection, and its transpose on dQ and dK before the projection's backward
        n_rot = float(t) * (h_local + kv_local) * a.head_dim
        rope = [Elementwise(2 * elem_bytes * n_rot, ROTARY_FLOPS * n_rot, "rotary")
                ] if a.rotary else []
        out["forward"] += [Gemm(t, qkv, a.dim, role="fprop"), *rope, scores, mix,
                           Gemm(t, a.dim, proj_in, role="fprop-out")]
        # backward through P·V (dP, dV), Q·Kᵀ (dQ, dK), then the two projections; flash
        # attention keeps no probabilities, so it computes Q·Kᵀ again first
        out["backward_data"] += ([scores] if a.flash else []) + [
            scores, mix, mix, mix, Gemm(t, proj_in, a.dim, role="dgrad-out"), *rope,
            *([Gemm(t, a.dim, qkv, role="dgrad")] if layer.input_grad else [])]
        out["backward_weight"] += [Gemm(a.dim, proj_in, t, role="wgrad-out"),
                                   Gemm(qkv, a.dim, t, role="wgrad")]
        if not a.flash:
            # an unfused kernel also passes over the score matrix in memory: the scaled,
            # masked softmax as one pass (Megatron-LM's fused kernel: read the scores,
            # write P) and its backward (read P and dP, write dS); with dropout a pass
            # that writes the dropped P and a byte of mask per score, and its backward
            # (read the gradient and the mask, write). Flash attention fuses all of it.
            n, eb = float(bh) * sq * a.seq, elem_bytes
            out["forward"].append(Elementwise(2 * eb * n, 5 * n, "softmax"))
            out["backward_data"].append(Elementwise(3 * eb * n, 10 * n, "softmax"))
            if a.dropout > 0:
                out["forward"].append(Elementwise((2 * eb + 1) * n, n, "dropout"))
                out["backward_data"].insert(0, Elementwise((2 * eb + 1) * n, n, "dropout"))
        return out
    if layer.moe is not None:
        return _moe_kernels(layer.moe, batch * -(-layer.moe.tokens // max(1, height_split)),
                            elem_bytes, ms, max(1, expert_split), layer.input_grad)
    if layer.embedding is not None:
        e = layer.embedding
        d_local = -(-e.dim // ms)
        t = batch * -(-e.seq // max(1, height_split))
        out["forward"].append(Elementwise(float(t * d_local * elem_bytes * 2), 0.0, "gather"))
        out["backward_weight"].append(Elementwise(float(t * d_local * elem_bytes * 3), float(
            t * d_local), "scatter-add"))
        return out
    # elementwise, normalisation, pooling: memory-bound passes
    # an image's rows or a sequence's tokens
    # the busiest device's rows of a height split (balanced blocks: ⌈H/n⌉), a pool's
    # halo rows read besides (an audit: timed as the mean H/n rows, without the halo)
    rows = layer.is_spatial or len(layer.input_shape) == 2
    n_h = height_split if rows else 1
    share_in = busiest_rows(layer.in_rows, n_h) / max(1, feature_split)
    share_out = busiest_rows(layer.out_rows, n_h) / max(1, feature_split)
    if n_h > 1 and layer.pool_halo(n_h):
        # the device that reads and writes the most rows, its halo included
        row_in = layer.in_elems / layer.in_rows
        row_out = layer.out_elems / layer.out_rows
        rin, rout = max(layer.split_reads(n_h), key=lambda r: r[0] * row_in + r[1] * row_out)
        share_in = rin / layer.in_rows / max(1, feature_split)
        share_out = rout / layer.out_rows / max(1, feature_split)
    elems_in = layer.in_elems * batch * share_in
    elems_out = layer.out_elems * batch * share_out
    if layer.type in ("flatten", "identity"):
        return out
    per = _ELEMENTWISE_FLOPS.get(layer.type, 1)
    if layer.pool is not None:
        per_out = layer.pool.kernel[0] * layer.pool.kernel[1]
        fwd_flops = elems_out * per_out
    else:
        fwd_flops = elems_out * per
    # norms: a pass for the statistics, one to normalise
    passes_in = 2.0 if layer.type in ("batchnorm", "layernorm", "rmsnorm") else 1.0
    fwd_bytes = (elems_in * passes_in + elems_out) * elem_bytes
    out["forward"].append(Elementwise(fwd_bytes, fwd_flops, layer.type))
    if layer.type == "add":
        bwd_bytes = 3 * elems_out * elem_bytes
    elif layer.type in GATED:  # read the saved input and dY, write both halves' gradients
        bwd_bytes = (2 * elems_in + elems_out) * elem_bytes
    else:
        bwd_bytes = (elems_in + 2 * elems_out) * elem_bytes
    out["backward_data"].append(Elementwise(bwd_bytes, fwd_flops * 2, layer.type))
    return out


def _moe_kernels(m: MoeGeom, t: int, eb: int, ffn_split: int, expert_split: int,
                 input_grad: bool) -> dict[str, list[Kernel]]:
    """The kernels of a mixture of experts for the ``t`` tokens a device routes, with
    each expert's hidden features split ``ffn_split`` ways and the experts
    ``expert_split`` ways. The router is a GEMM over the device's tokens; the experts a
    batched GEMM (one product an expert, as a grouped GEMM runs them) over the rows each
    of the device's experts receives from the ``expert_split`` devices that share them;
    memory-bound passes for the router's softmax and top-k, the permutation of the
    tokens into the experts' order, the activation, and the weighted sum of the outputs
    back into token order."""
    out: dict[str, list[Kernel]] = {"forward": [], "backward_data": [], "backward_weight": []}
    d, n_exp = m.dim, m.experts
    e_loc = n_exp // expert_split
    # per expert on the busiest device: under imbalance its hot expert's rows and its
    # neighbours' even shares, as e_loc products of the mean (a grouped GEMM's work)
    rows = math.ceil(m.rows(t * expert_split) * m.busiest(e_loc) - 1e-9)
    f = -(-m.ffn // ffn_split)
    up = m.up(f)
    hidden = float(rows) * e_loc  # rows through this device's experts
    routed = t * m.fill  # rows this device's tokens send (buffers included)
    router = Elementwise(float(t * n_exp * 2 * eb + t * m.top_k * (eb + 8)),
                         5.0 * t * n_exp, "router")
    permute = Elementwise((t + routed) * d * eb, 0.0, "permute")
    combine = Elementwise((routed + t) * d * eb, 2.0 * routed * d, "combine")
    act_flops = _ELEMENTWISE_FLOPS[m.activation] * hidden * f
    act = Elementwise((up + f) * hidden * eb, act_flops, m.activation)
    bwd_act = Elementwise(((2 * up + f) if m.gated else (up + 2 * f)) * hidden * eb,
                          2 * act_flops, m.activation)
    out["forward"] += [Gemm(t, n_exp, d), router, permute, Gemm(rows, up, d, e_loc), act,
                       Gemm(rows, d, f, e_loc), combine]
    # backward: the combine (and the router's weights' gradient), the down product, the
    # activation, the up product, the permutation's scatter-add, the router
    out["backward_data"] += [combine, Gemm(rows, f, d, e_loc), bwd_act, router]
    if input_grad:  # the tokens' gradient: through the up product, unpermuted, the router
        out["backward_data"][3:3] = [Gemm(rows, d, up, e_loc), permute]
        out["backward_data"].append(Gemm(t, d, n_exp))
    out["backward_weight"] += [Gemm(d, f, rows, e_loc), Gemm(up, d, rows, e_loc),
                               Gemm(n_exp, d, t)]
    if m.shared:
        # the shared experts, one MLP of their hidden features together on all the
        # device's tokens (split as each expert's are under a model split; whole under
        # expert parallelism), and the add of their output to the routed ones'
        h = -(-m.shared_hidden // ffn_split)
        s_up = m.up(h)
        s_flops = _ELEMENTWISE_FLOPS[m.activation] * float(t) * h
        out["forward"] += [Gemm(t, s_up, d), Elementwise((s_up + h) * float(t) * eb,
                                                         s_flops, m.activation),
                           Gemm(t, d, h), Elementwise(3.0 * t * d * eb, float(t * d), "add")]
        out["backward_data"] += [
            Gemm(t, h, d),
            Elementwise(((2 * s_up + h) if m.gated else (s_up + 2 * h)) * float(t) * eb,
                        2 * s_flops, m.activation)]
        if input_grad:
            out["backward_data"].append(Gemm(t, d, s_up))
        out["backward_weight"] += [Gemm(h, d, t), Gemm(d, s_up, t)]
    return out


@dataclass(frozen=True)
class Block:
    """A residual block: ``add(body(x), shortcut(x))``."""

    name: str
    input: int  #: the producer of the block input (-1: network input)
    body: tuple[int, ...]
    shortcut: tuple[int, ...]  #: empty for an identity shortcut
    add: int


#: the settings whose "layers" means the copies of a network's top-level repeat groups,
#: and what each does with them (for messages where the network has none)
BY_LAYERS = {
    "stage_boundaries": "starts pipeline stages between the copies of a repeat group",
    "recompute_unit": "recomputes each transformer layer (an attention block and the "
                      "blocks after it in one copy of a repeat group) as one",
}


@dataclass(frozen=True)
class Network:
    """A network after expansion and shape inference."""

    name: str
    dtype: str
    input_shape: Shape
    layers: tuple[Layer, ...]
    blocks: tuple[Block, ...] = ()
    input_kind: str = "image"  #: image, tokens, sequence or features
    #: whether the last layer's output feeds the loss (a pipeline stage before the last
    #: sends it to the next stage instead)
    loss: bool = True
    #: per layer, the copy of the network's top-level repeat groups it is in (numbered
    #: in order; −1 outside them): a transformer's layers, where Megatron-LM's pipeline
    #: stages may start
    copies: tuple[int, ...] = ()
    #: where pipeline stages may start: "blocks" (between residual blocks) or "layers"
    #: (between copies of a repeat group, ``--stage-boundaries``)
    stage_unit: str = "blocks"
    #: what recomputation re-runs from one kept input: "blocks" (each residual block)
    #: or "layers" (each transformer layer's blocks together, :attr:`recompute_units`;
    #: ``--recompute-unit``)
    recompute_unit: str = "blocks"
    #: whether the loss casts 16-bit logits to fp32 (:meth:`output_bytes`; False under
    #: ``--cross-entropy eager-no-upcast``: a pure 16-bit script's ``cross_entropy``)
    loss_upcast: bool = True

    @functools.cached_property
    def _recompute_groups(self) -> tuple[tuple[Block, ...], ...]:
        """The residual blocks of each recomputation unit, in order."""
        groups: list[list[Block]] = []
        if self.recompute_unit != "layers" or not self.copies:
            return tuple((blk,) for blk in self.blocks)
        last, opened_by_attention = None, False
        for blk in self.blocks:
            copy = self.copies[blk.add]
            attention = any(self.layers[i].attention is not None for i in blk.body)
            # a transformer layer opens with its attention block; the blocks after it
            # join it while they are in the same copy of a repeat group, or, outside
            # the repeat groups (DeepSeek-MoE's dense first layer), after an attention
            # block; a copy without attention (a ResNet stage's bottleneck) is a unit
            join = bool(groups) and not attention and copy == last and (
                copy >= 0 or opened_by_attention)
            if join:
                groups[-1].append(blk)
            else:
                groups.append([blk])
                opened_by_attention = attention
            last = copy
        return tuple(tuple(g) for g in groups)

    @functools.cached_property
    def recompute_units(self) -> tuple[Block, ...]:
        """The units recomputation re-runs, in order, each keeping only its input
        between the passes: every residual block, or under ``recompute_unit`` "layers"
        each transformer layer's blocks as one (what Megatron-LM's full recomputation
        keeps, and PyTorch's checkpoint wrapper around each of torchtitan's transformer
        blocks): a block with attention opens a layer, and the blocks after it join it
        within one copy of a top-level repeat group (or, outside them, after attention);
        a copy without attention is one unit a copy. A unit is a
        block spanning its blocks: the first's input and shortcut, every layer from the
        first's body to the last's add as its body, and the name of the copy where it
        has more than one block (``layers.3``)."""
        return tuple(g[0] if len(g) == 1 else Block(
            _common_name([b.name for b in g]), g[0].input,
            tuple(i for i in range(g[0].body[0], g[-1].add) if i not in g[0].shortcut),
            g[0].shortcut, g[-1].add) for g in self._recompute_groups)

    @functools.cached_property
    def unit_of(self) -> dict[str, str]:
        """Each residual block's recomputation unit (:attr:`recompute_units`), by name."""
        return {blk.name: unit.name for unit, group in zip(
            self.recompute_units, self._recompute_groups, strict=True) for blk in group}

    @property
    def elem_bytes(self) -> int:
        """Bytes per element of the network dtype."""
        return DTYPE_BYTES[self.dtype]

    def output_bytes(self, layer: Layer) -> int:
        """Bytes per element of ``layer``'s output as kept for backward: the network's
        dtype, but at least fp32's 4 for the output the loss keeps (a softmax
        cross-entropy upcasts 16-bit logits and keeps its fp32 probabilities: Megatron-
        LM's vocabulary-parallel cross-entropy, PyTorch's and Hugging Face's losses on
        ``logits.float()``; Korthikanti et al., MLSys 2023, count the loss's 4·s·b·v/t
        bytes)."""
        last = len(self.layers) - 1
        # the last layer, or the one a trailing flatten or identity is a view of
        if self.loss and self.loss_upcast and layer.index in (last, self.storage_of(last)):
            return max(self.elem_bytes, LOSS_BYTES)
        return self.elem_bytes

    def with_cross_entropy(self, kind: str) -> Network:
        """The network whose loss runs as ``--cross-entropy`` ``kind`` says: every kind
        upcasts 16-bit logits to fp32 but ``eager-no-upcast``."""
        upcast = kind != "eager-no-upcast"
        return self if upcast == self.loss_upcast else \
            dataclasses.replace(self, loss_upcast=upcast)

    def by_layers(self, key: str) -> Network | None:
        """The network with ``key`` (a :data:`BY_LAYERS` setting: ``stage_boundaries``,
        ``recompute_unit``) at "layers", the copies of its top-level repeat groups; None
        where it has no repeat group, which the caller words as an input error."""
        if not any(c >= 0 for c in self.copies):
            return None
        if key == "stage_boundaries":
            return dataclasses.replace(self, stage_unit="layers")
        return dataclasses.replace(self, recompute_unit="layers")

    def in_dtype(self, dtype: str | None) -> Network:
        """The network with its weights and activations in ``dtype`` (a name or a short
        name: bf16; None: as it is), as ``--precision`` and a configuration's
        ``precision`` ask."""
        dtype = DTYPE_ALIASES.get(dtype, dtype) if dtype is not None else self.dtype
        return self if dtype == self.dtype else dataclasses.replace(self, dtype=dtype)

    @property
    def params(self) -> int:
        """Trainable parameters."""
        return sum(layer.params for layer in self.layers)

    @property
    def macs(self) -> int:
        """Forward multiply-accumulates per sample."""
        return sum(layer.macs for layer in self.layers)

    @property
    def flops(self) -> int:
        """Forward FLOPs per sample."""
        return sum(layer.flops for layer in self.layers)

    @functools.cached_property
    def shared_entries(self) -> dict[int, Block]:
        """The blocks whose input is read, in the same distribution, once for two
        consumers: the body's first layer (with weights) moves the block input into its
        own input distribution, and the other consumer, the add (an identity shortcut) or
        the shortcut's first layer (with weights), may read that copy instead of the
        original (its backward adds its gradient to the copy's, which the one move
        takes back). By the body's first layer."""
        out: dict[int, Block] = {}
        layers = self.layers
        for blk in self.blocks:
            first = layers[blk.body[0]]
            if not (first.has_weights and first.inputs[0] == blk.input):
                continue
            if blk.shortcut:
                other = layers[blk.shortcut[0]]
                if not (other.has_weights and other.inputs[0] == blk.input):
                    continue
            out[first.index] = blk
        return out

    @functools.cached_property
    def ties(self) -> dict[int, tuple[int, ...]]:
        """Layers that share their weights (``tie:``): the owner's index → the indices of
        the layers tied to it. A tied pair keeps one layout (one copy of the weight)."""
        index = {layer.name: layer.index for layer in self.layers}
        out: dict[int, tuple[int, ...]] = {}
        for layer in self.layers:
            if layer.tied_to is not None and layer.tied_to in index:
                owner = index[layer.tied_to]
                out[owner] = (*out.get(owner, ()), layer.index)
        return out

    def by_name(self, name: str) -> Layer | None:
        """The layer called ``name``, if any."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        return None

    def match(self, pattern: str) -> list[Layer]:
        """Layers whose name matches a shell-style glob (``conv*``, ``layer1.*``), or is
        the pattern itself (see :func:`name_matches`)."""
        return [layer for layer in self.layers if name_matches(layer.name, pattern)]

    def storage_of(self, index: int) -> int:
        """The layer whose output tensor ``index``'s output shares storage with (a
        flatten or identity is a view of its input); -1 is the network input."""
        while index >= 0 and self.layers[index].type in VIEW_TYPES:
            index = self.layers[index].inputs[0]
        return index

    def saved_tensors(self) -> dict[int, int]:
        """Activation tensors kept for backward: producer index → elements per sample.

        A tensor that several layers keep (a ReLU output that the next convolution also
        keeps as its input, even through a flatten) counts once; -1 is the network input.
        """
        return dict(self._saved)

    @functools.cached_property
    def _saved(self) -> dict[int, int]:
        """:meth:`saved_tensors`, computed once (``show`` asks for every layer)."""
        kept: dict[int, int] = {}
        for layer in self.layers:
            if layer.saves_input:
                for src in layer.inputs:
                    size = self.layers[src].out_elems if src >= 0 else math.prod(
                        self.input_shape)
                    kept[self.storage_of(src)] = size
            if layer.saves_output:
                kept[self.storage_of(layer.index)] = layer.out_elems
        return kept

    def activation_bytes(self, layer: Layer) -> int:
        """Bytes per sample kept for backward attributed to ``layer``: its output if
        anyone keeps it, its internal tensors, its masks and indices."""
        kept = self._saved
        return kept.get(layer.index, 0) * self.output_bytes(layer) + \
            layer.saved_internal * self.elem_bytes + layer.saved_bytes_extra


# ---------------------------------------------------------------------------------------
# Parsing: YAML data → specs


@dataclass
class _Spec:
    kind: str  # a layer type, 'repeat' or 'residual'
    name: str | None
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    children: list[_Spec] = field(default_factory=list)
    shortcut: list[_Spec] | None = None
    count: int = 1
    start: int = 0
    activation: str | None = None


def _canonical_type(value: object) -> str:
    if not isinstance(value, str):
        raise Invalid(f"expected a layer type name, got {described(value)}")
    t = value.strip().lower()
    t = _TYPE_ALIASES.get(t, t)
    if t in LAYER_TYPES or t in ("residual", "repeat"):
        return t
    if t in UNSUPPORTED_TYPES:
        raise Invalid(f"layer type '{value}' is not supported: {UNSUPPORTED_TYPES[t]}")
    close = difflib.get_close_matches(t, [*LAYER_TYPES, "residual", "repeat"], n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else (
        f"; known types: {', '.join(LAYER_TYPES)}, residual, repeat")
    raise Invalid(f"unknown layer type '{value}'{hint}")


def _attention_bias(value: object) -> str:
    """Attention's ``bias``: true (Q, K, V and output projections: ``qkv+out``), false
    (``none``), or ``qkv`` (Q, K and V only, as Qwen2 and Megatron-LM's
    ``--add-qkv-bias``)."""
    if isinstance(value, bool):
        return "qkv+out" if value else "none"
    if value == "qkv":
        return value
    raise Invalid(f"expected true, false or qkv (biases on Q, K and V alone), got "
                  f"{described(value)}")


def _padding(value: object) -> tuple[int, int] | str:
    if value == "same":
        return "same"
    _padding_word(value, "an integer, [height, width] or 'same'")
    return pair(integer(0), "padding")(value)


def _pool_padding(value: object) -> tuple[int, int]:
    _padding_word(value, "an integer or [height, width]")
    return pair(integer(0), "padding")(value)


def _padding_word(value: object, forms: str) -> None:
    """A word where a padding is expected: PyTorch and Keras spell no padding 'valid'
    (0 here); a convolution takes 'same' as well."""
    if isinstance(value, str):
        fix = ("0 (no padding)" if value.strip().lower() in ("valid", "none") else
               "same" if "same" in forms else None)
        raise Invalid(f"expected padding as {forms}, got {show(value)}"
                      + (f"; did you mean {fix}?" if fix else ""))


_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.[]:/")


def _layer_name(value: object) -> str:
    s = string(value)
    bad = list(dict.fromkeys(c for c in s if c not in _NAME_CHARS))  # in order of use
    if bad:
        raise Invalid(f"layer names use the ASCII letters and digits and _ - . : / [ ] "
                      "only (they become keys of plan files, ranks' group names and "
                      f"--pin patterns); found {''.join(bad)!r} in {s!r}")
    if len(s) > 200:
        raise Invalid("layer names are at most 200 characters")
    return s


def _read_layer_params(kind: str, f: Fields) -> dict[str, Any]:
    p: dict[str, Any] = {}
    if kind == "conv2d":
        p["out_channels"] = f.req("out_channels", integer(1))
        p["kernel"] = f.req("kernel", pair(integer(1), "kernel"))
        p["stride"] = f.opt("stride", pair(integer(1), "stride"), (1, 1))
        p["padding"] = f.opt_none("padding", _padding) or (0, 0)
        p["dilation"] = f.opt("dilation", pair(integer(1), "dilation"), (1, 1))
        p["groups"] = f.opt("groups", integer(1), 1)
        p["bias"] = f.opt("bias", boolean, True)
    elif kind == "linear":
        p["out_features"] = f.req("out_features", integer(1))
        p["bias"] = f.opt("bias", boolean, True)
        p["tie"] = f.opt_none("tie", string)
    elif kind in ("maxpool", "avgpool"):
        p["kernel"] = f.req("kernel", pair(integer(1), "kernel"))
        p["stride"] = f.opt_none("stride", pair(integer(1), "stride"))
        p["padding"] = f.opt("padding", _pool_padding, (0, 0))
        p["ceil_mode"] = f.opt("ceil_mode", boolean, False)
    elif kind == "adaptive_avgpool":
        p["output_size"] = f.req("output_size", pair(integer(1), "output_size"))
    elif kind == "dropout":
        p["p"] = f.opt("p", number(0.0, 1.0), 0.5)
    elif kind == "batchnorm":
        p["affine"] = f.opt("affine", boolean, True)
        f.opt("eps", number(0.0), 1e-5)
        f.opt("momentum", number(0.0, 1.0), 0.1)
    elif kind == "layernorm":
        p["affine"] = f.opt("affine", boolean, True)
        p["bias"] = f.opt("bias", boolean, True)
        f.opt("eps", number(0.0), 1e-5)
    elif kind == "rmsnorm":
        p["affine"] = f.opt("affine", boolean, True)
        f.opt("eps", number(0.0), 1e-6)
    elif kind == "lrn":
        p["size"] = f.opt("size", integer(1), 5)
        f.opt("alpha", number(0.0), 1e-4)
        f.opt("beta", number(0.0), 0.75)
        f.opt("k", number(0.0), 1.0)
    elif kind == "embedding":
        p["vocab"] = f.req("vocab", integer(1))
        p["dim"] = f.req("dim", integer(1))
    elif kind == "positional_embedding":
        p["positions"] = f.req("positions", integer(1))
    elif kind == "attention":
        p["heads"] = f.req("heads", integer(1))
        p["head_dim"] = f.opt_none("head_dim", integer(1))
        p["kv_heads"] = f.opt_none("kv_heads", integer(1))
        p["bias"] = f.opt("bias", _attention_bias, "qkv+out")
        p["causal"] = f.opt("causal", boolean, False)
        p["flash"] = f.opt("flash", boolean, False)
        p["dropout"] = f.opt("dropout", number(0.0, 1.0), 0.0)
        p["rotary"] = f.opt("rotary", boolean, False)
        p["window"] = f.opt_none("window", integer(1))
    elif kind == "moe":
        p["experts"] = f.req("experts", integer(1, 1_000_000))
        p["top_k"] = f.opt("top_k", integer(1, 1_000_000), 2)
        p["top_k_given"] = f.has("top_k")
        p["ffn"] = f.req("ffn", integer(1))
        p["activation"] = f.opt("activation", choice(MOE_ACTIVATIONS), "swiglu")
        p["capacity_factor"] = f.opt_none("capacity_factor", number(0.0, 1e6,
                                                                    exclusive_min=True))
        p["load_imbalance"] = f.opt("load_imbalance", number(1.0, 1e6), 1.0)
        p["shared_experts"] = f.opt("shared_experts", integer(0, 1_000_000), 0)
        p["shared_ffn"] = f.opt_none("shared_ffn", integer(1))
    elif kind == "relu":  # leaky_relu's slope: the same one pass, no parameters
        f.opt("negative_slope", number(-1e6, 1e6), 0.01)
    elif kind == "gelu":  # GPT-2's gelu_new is the tanh form: a few FLOPs either way
        f.opt("approximate", choice(("none", "tanh")), "none")
    elif kind == "softmax":
        pass
    return p


def _parse_entries(data: object, path: str, issues: list[Issue], depth: int) -> list[_Spec]:
    if not isinstance(data, list):
        issues.append(Issue(path, f"expected a list of layers, got {_tn(data)}"))
        return []
    if not data:
        issues.append(Issue(path, "expected at least one layer, got an empty list"))
        return []
    return [s for i, item in enumerate(data)
            if (s := _parse_entry(item, child_path(path, i), issues, depth)) is not None]


def _tn(value: object) -> str:
    from .fields import type_name

    return type_name(value)


def _parse_entry(item: object, path: str, issues: list[Issue], depth: int) -> _Spec | None:
    if depth > 8:
        issues.append(Issue(path, "layer groups are nested more than 8 deep"))
        return None
    f = Fields(item, path, issues, "a layer")
    if not f.ok:
        return None
    name = f.opt_none("name", _layer_name)
    if "repeat" in f.data and "layers" not in f.data and f.data.get("type") not in (
            None, "repeat"):
        # 'repeat' on a layer of its own: one error that says how to write it (an audit
        # found four, the layer's keys "unknown in a layer")
        f.error("repeat", "'repeat' makes a group of copies: write the layer inside it, "
                          "{repeat: N, layers: [the layer]}")
        f.finish(allowed_extra=f.data.keys())
        return None
    if "repeat" in f.data:  # present, not asked: a layer's hints do not offer it
        count = f.req("repeat", integer(1, MAX_LAYERS))
        start = f.opt("start", integer(0, 1_000_000), 0)
        if f.has("type"):
            t = f.raw("type")
            if t != "repeat":
                f.error("type", "a 'repeat' group has no 'type' (or 'type: repeat')")
        children = _parse_entries(f.raw("layers"), f.at("layers"), issues, depth + 1) if \
            f.has("layers") else []
        if not f.has("layers"):
            f.missing("missing required key 'layers' in a repeat group")
        f.finish()
        return _Spec("repeat", name, path, children=children, count=count or 1, start=start)
    kind = f.req("type", _canonical_type)
    if kind is None:
        f.finish(allowed_extra=f.data.keys())
        return None
    if kind == "repeat":
        f.error("type", "a repeat group needs 'repeat: N' (the number of copies)")
        f.finish(allowed_extra=f.data.keys())
        return None
    if kind == "residual":
        body = _parse_entries(f.raw("body"), f.at("body"), issues, depth + 1) if f.has(
            "body") else []
        if not f.has("body"):
            f.missing("missing required key 'body' in a residual block")
        shortcut = None
        if f.has("shortcut") and f.raw("shortcut") is not None:
            raw = f.raw("shortcut")
            if raw == "identity":
                shortcut = None
            else:
                shortcut = _parse_entries(raw, f.at("shortcut"), issues, depth + 1)
        activation = f.opt_none("activation", choice(ACTIVATIONS))
        f.finish()
        return _Spec("residual", name, path, children=body, shortcut=shortcut,
                     activation=activation)
    f.what = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} layer"  # unknown keys name it
    if kind == "attention" and "sliding_window" in f.data:
        f.error("sliding_window", "the key is 'window': the most recent keys each query "
                                  "meets, its own included (causal attention)")
        f.seen.add("sliding_window")
    params = _read_layer_params(kind, f)
    f.finish()
    return _Spec(kind, name, path, params=params)


# ---------------------------------------------------------------------------------------
# Expansion and shape inference


class _ShapeError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


@dataclass
class _Builder:
    issues: list[Issue]
    layers: list[Layer] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # name → path of first definition
    counters: dict[str, int] = field(default_factory=dict)
    failed: bool = False
    input_kind: str = "image"
    #: the copies of the network's top-level repeat groups, numbered in order, and the
    #: first layer built for each spec inside one (→ its copy's number)
    copies: dict[str, int] = field(default_factory=dict)
    copy_from: dict[int, int] = field(default_factory=dict)

    #: names the file gives explicitly, which no automatic name may take
    reserved: set[str] = field(default_factory=set)

    def auto_name(self, prefix: str, kind: str) -> str:
        """The next ``kind<k>`` under ``prefix`` that no layer has or is given."""
        key = f"{prefix}|{kind}"
        while True:
            self.counters[key] = self.counters.get(key, 0) + 1
            base = f"{kind}{self.counters[key]}"
            name = f"{prefix}.{base}" if prefix else base
            if name not in self.names and name not in self.reserved:
                return name


def _expand(specs: list[_Spec], prefix: str, copy: str | None = None
            ) -> Iterator[tuple[_Spec, str, str | None]]:
    """Flatten repeat groups, yielding (spec, full name prefix for it, the copy of the
    outermost repeat group it is in: ``layers.3``, or None). Groups without a name are
    ``repeat``, then ``repeat2``, ``repeat3``... (skipping the names given)."""
    named = {spec.name for spec in specs if spec.name}
    for spec in specs:
        if spec.kind == "repeat":
            group = spec.name
            if group is None:
                group = next(g for g in itertools.chain(
                    ["repeat"], (f"repeat{k}" for k in itertools.count(2))) if g not in named)
                named.add(group)
            base = f"{prefix}.{group}" if prefix else group
            single = len(spec.children) == 1 and spec.children[0].name is None
            for i in range(spec.start, spec.start + spec.count):
                copy_prefix = f"{base}.{i}"
                outer = copy if copy is not None else copy_prefix
                if single:
                    child = spec.children[0]
                    if child.kind == "repeat":
                        yield from _expand([child], copy_prefix, outer)
                    else:  # the copy itself is named copy_prefix
                        yield child, copy_prefix + "\0", outer
                else:
                    yield from _expand(spec.children, copy_prefix, outer)
        else:
            yield spec, prefix, copy


def _full_name(b: _Builder, spec: _Spec, prefix: str) -> str:
    if prefix.endswith("\0"):
        return prefix[:-1]
    if spec.name is not None:
        return f"{prefix}.{spec.name}" if prefix else spec.name
    return b.auto_name(prefix, spec.kind if spec.kind != "residual" else "block")


def _build_seq(b: _Builder, specs: list[_Spec], prefix: str, shape: Shape | None, src: int,
               block: str | None, role: str | None) -> tuple[Shape | None, int]:
    expanded = list(_expand(specs, prefix))
    for spec, pre, _ in expanded:  # the names given here, before any is made up
        if pre.endswith("\0"):
            b.reserved.add(pre[:-1])
        elif spec.name is not None:
            b.reserved.add(f"{pre}.{spec.name}" if pre else spec.name)
    # a name given outside a repeat group that lies among a copy's names (g.0.linear1
    # beside `repeat: 2, name: g`) would push that copy's own names aside (its linear
    # layer became g.0.linear2 where copy 1's is g.1.linear1, so a pin g.*.linear1 met
    # the wrong layer; found by an audit)
    copies = {pre.removesuffix("\0") for _, pre, copy in expanded if copy is not None}
    for spec, pre, copy in expanded:
        if copy is not None or spec.name is None or pre.endswith("\0"):
            continue
        full = f"{pre}.{spec.name}" if pre else spec.name
        parts = full.split(".")
        inside = next((".".join(parts[:k]) for k in range(1, len(parts))
                       if ".".join(parts[:k]) in copies), None)
        if inside is not None:
            b.issues.append(Issue(spec.path, f"layer name '{full}' lies among the names of "
                                             f"repeat copy '{inside}' ({inside}.<layer>); "
                                             "rename it"))
            b.failed = True
    for spec, pre, copy in expanded:
        if not prefix:  # the network's own list: where each of its specs starts
            if copy is not None:
                b.copies.setdefault(copy, len(b.copies))
            b.copy_from[len(b.layers)] = b.copies[copy] if copy is not None else -1
        name = _full_name(b, spec, pre)
        if spec.kind == "residual":
            if block is not None:
                b.issues.append(Issue(spec.path, "residual blocks cannot be nested inside "
                                                 "another residual block"))
                b.failed = True
                return None, src
            shape, src = _build_residual(b, spec, name, shape, src)
            continue
        shape, src = _add_layer(b, spec, name, shape, src, block, role)
    return shape, src


def _register(b: _Builder, name: str, path: str, auto: str | None = None) -> None:
    """Claim a layer name; ``auto``: what a name the planner gives stands for (a
    residual block's sum), said where a layer of the file had taken it already."""
    if name in b.names:
        note = f"; the residual block names {auto} '{name}': rename the layer" if auto \
            else "; layer names must be unique"
        b.issues.append(Issue(path, f"duplicate layer name '{name}' (first defined at "
                                    f"{b.names[name]}){note}"))
    else:
        b.names[name] = path


def _build_residual(b: _Builder, spec: _Spec, name: str, shape: Shape | None,
                    src: int) -> tuple[Shape | None, int]:
    block_in, in_shape = src, shape
    out: Shape | None
    body_start = len(b.layers)
    body_shape, body_out = _build_seq(b, spec.children, name, shape, src, name, "body")
    body = tuple(range(body_start, len(b.layers)))
    sc_start = len(b.layers)
    if spec.shortcut:
        sc_shape, sc_out = _build_seq(b, spec.shortcut, f"{name}.shortcut", in_shape,
                                      block_in, name, "shortcut")
    else:
        sc_shape, sc_out = in_shape, block_in
    shortcut = tuple(range(sc_start, len(b.layers)))
    if b.failed or body_shape is None or sc_shape is None:
        b.failed = True
        return None, src
    if body_shape != sc_shape:
        where = "the block input" if not spec.shortcut else "the shortcut output"
        b.issues.append(Issue(spec.path, f"residual block '{name}': the body outputs "
                                         f"{list(body_shape)} but {where} is "
                                         f"{list(sc_shape)}; add a projection shortcut or "
                                         "fix the shapes"))
        b.failed = True
        return None, src
    add_name = f"{name}.add"
    _register(b, add_name, spec.path, auto="its sum")
    n = math.prod(body_shape)
    add = Layer(index=len(b.layers), name=add_name, type="add", path=spec.path,
                input_shape=body_shape, output_shape=body_shape, params=0, weight_elems=0,
                macs=0, flops=n, inputs=(body_out, sc_out), block=name, role="add")
    b.layers.append(add)
    b.blocks.append(Block(name, block_in, body, shortcut, add.index))
    out, last = body_shape, add.index
    if spec.activation is not None:
        act = _Spec(spec.activation, None, spec.path)
        out, last = _add_layer(b, act, f"{name}.{spec.activation}", out, last, None, None)
    return out, last


def _add_layer(b: _Builder, spec: _Spec, name: str, shape: Shape | None, src: int,
               block: str | None, role: str | None) -> tuple[Shape | None, int]:
    _register(b, name, spec.path)
    if b.failed or shape is None:
        return None, src
    try:
        layer = _infer(b, spec, name, shape, src)
    except _ShapeError as exc:
        b.issues.append(Issue(exc.path, exc.message))
        b.failed = True
        return None, src
    layer = dataclasses.replace(layer, block=block, role=role)
    b.layers.append(layer)
    return layer.output_shape, layer.index


def _conv_out(size: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    if ceil:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + p:  # PyTorch: the last window must start inside
            out -= 1
        return out
    return span // s + 1


def _shape_hint(what: str, dims: tuple[int, ...], got: int) -> str:
    """What to do about a layer given an input of the wrong rank (``got`` axes)."""
    if got == 3 and what in ("layernorm", "rmsnorm"):
        return ("; it normalises a token's features (the last axis), and on an image "
                "would normalise each row's pixels: a channels-first norm (ConvNeXt's "
                "LayerNorm) is not modelled; batchnorm has its parameters (2 a channel)")
    if got == 3 and 1 in dims:
        return ("; add a flatten layer first (or, for the same linear map at every pixel, "
                "a conv2d with kernel 1)")
    if got == 3:
        return ("; nothing turns an image into tokens: give the network its patches as "
                "input, [tokens, patch features] (a ViT-L/16 at 224 x 224: input: [196, "
                "768], then a linear patch embedding)")
    return "; add a flatten layer first" if 1 in dims else ""


def _infer(b: _Builder, spec: _Spec, name: str, shape: Shape, src: int) -> Layer:
    """Shape inference for one layer; raises _ShapeError with an actionable message."""
    kind, p, path = spec.kind, spec.params, spec.path
    idx = len(b.layers)
    base: dict[str, Any] = {"index": idx, "name": name, "type": kind, "path": path,
                            "input_shape": shape, "inputs": (src,)}
    n_in = math.prod(shape)

    def need(dims: tuple[int, ...], what: str) -> None:
        if len(shape) not in dims:
            expect = {3: "an image [C, H, W]", 2: "a sequence [seq, dim]",
                      1: "a vector [features]"}
            wanted = " or ".join(expect[d] for d in dims)
            raise _ShapeError(path, f"layer '{name}' ({what}) needs {wanted} as input, got "
                                    f"{list(shape)}" + _shape_hint(what, dims, len(shape)))

    def mk(out: Shape, **kw: Any) -> Layer:
        if any(d > MAX_DIM for d in out):
            raise _ShapeError(path, f"layer '{name}' output {list(out)} is absurdly large")
        args = {"params": 0, "weight_elems": 0, "macs": 0, "flops": 0, **base,
                "output_shape": out, **kw}
        return Layer(**args)

    if kind == "conv2d":
        need((3,), "conv2d")
        c, h, w = shape
        kh, kw = p["kernel"]
        sh, sw = p["stride"]
        dh, dw = p["dilation"]
        g, k = p["groups"], p["out_channels"]
        pad = p["padding"]
        extra_h = extra_w = 0
        if pad == "same":
            if (sh, sw) != (1, 1):
                raise _ShapeError(child_path(path, "padding"),
                                  "padding: same needs stride 1 (give the padding in rows)")
            # an even effective kernel pads one row (column) more after than before:
            # PyTorch pads the input's copy by that one (F.pad), convolves it with the
            # symmetric rest, and keeps the copy for backward
            extra_h, extra_w = (dh * (kh - 1)) % 2, (dw * (kw - 1)) % 2
            pad = (dh * (kh - 1) // 2, dw * (kw - 1) // 2)
        ph, pw = pad
        if c % g:
            raise _ShapeError(child_path(path, "groups"),
                              f"layer '{name}': {c} input channels are not divisible by "
                              f"groups={g}")
        if k % g:
            raise _ShapeError(child_path(path, "groups"),
                              f"layer '{name}': out_channels={k} is not divisible by "
                              f"groups={g}")
        eff_h, eff_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
        if eff_h > h + 2 * ph or eff_w > w + 2 * pw:
            raise _ShapeError(child_path(path, "kernel"),
                              f"layer '{name}': kernel {kh}×{kw} (dilation {dh}×{dw}) is "
                              f"larger than its padded input {h + 2 * ph}×{w + 2 * pw}")
        h_pad, w_pad = h + extra_h, w + extra_w  # the input the convolution reads
        oh, ow = _conv_out(h_pad, kh, sh, ph, dh), _conv_out(w_pad, kw, sw, pw, dw)
        wts = k * (c // g) * kh * kw
        bias = k if p["bias"] else 0
        macs = oh * ow * k * (c // g) * kh * kw
        geom = ConvGeom(c, k, (kh, kw), (sh, sw), (ph, pw), (dh, dw), g, p["bias"],
                        (h_pad, w_pad), (oh, ow))
        copied = (h_pad, w_pad) != (h, w)
        return mk((k, oh, ow), params=wts + bias, weight_elems=wts + bias, macs=macs,
                  flops=2 * macs + (oh * ow * k if bias else 0), conv=geom,
                  saves_input=not copied, saved_internal=c * h_pad * w_pad if copied else 0)
    if kind in ("maxpool", "avgpool"):
        need((3,), kind)
        c, h, w = shape
        kh, kw = p["kernel"]
        sh, sw = p["stride"] or (kh, kw)
        ph, pw = p["padding"]
        if ph * 2 > kh or pw * 2 > kw:
            raise _ShapeError(child_path(path, "padding"),
                              f"layer '{name}': padding must be at most half the kernel")
        oh = _conv_out(h, kh, sh, ph, 1, p["ceil_mode"])
        ow = _conv_out(w, kw, sw, pw, 1, p["ceil_mode"])
        # a window past the padded input: with ceil_mode PyTorch still takes one window
        # while it starts inside (a 3×3 window, stride 2, on 2×2 gives 1×1)
        if min(oh, ow) < 1:
            raise _ShapeError(child_path(path, "kernel"),
                              f"layer '{name}': pooling window {kh}×{kw} is larger than its "
                              f"input {h}×{w}" + ("" if p["ceil_mode"] else
                                                  " (ceil_mode: true keeps a window that "
                                                  "starts inside the input)"))
        pgeom = PoolGeom(kind[:3], (kh, kw), (sh, sw), (ph, pw), c, (h, w), (oh, ow))
        out_n = c * oh * ow
        extra = out_n * 8 if kind == "maxpool" else 0  # int64 argmax indices
        # both keep their input for backward (PyTorch's MaxPool2DWithIndicesBackward0 and
        # AvgPool2DBackward0 save ``self``), max pooling its argmax indices too
        return mk((c, oh, ow), flops=out_n * kh * kw, pool=pgeom, saves_input=True,
                  saved_bytes_extra=extra)
    if kind in ("global_avgpool", "adaptive_avgpool"):
        need((3,), kind)
        c, h, w = shape
        oh, ow = (1, 1) if kind == "global_avgpool" else p["output_size"]
        # PyTorch's windows: output i averages input rows ⌊i·h/oh⌋ to ⌈(i+1)·h/oh⌉, so an
        # output larger than its input repeats cells (torchvision's VGG on 32 × 32
        # images pools 1 × 1 to 7 × 7); the FLOPs add every window's reads
        win_h = [-(-(i + 1) * h // oh) - i * h // oh for i in range(oh)]
        win_w = [-(-(j + 1) * w // ow) - j * w // ow for j in range(ow)]
        # an output of 1×1 is a mean, which keeps only the input's sizes; any other
        # keeps the input (PyTorch's AdaptiveAvgPool2DBackward0 saves ``self``)
        return mk((c, oh, ow), flops=c * sum(win_h) * sum(win_w),
                  saves_input=(oh, ow) != (1, 1),
                  pool=PoolGeom("global" if kind == "global_avgpool" else "adaptive",
                                (max(win_h), max(win_w)), (max(1, h // oh), max(1, w // ow)),
                                (0, 0), c, (h, w), (oh, ow)))
    if kind in ACTIVATIONS or kind in ("dropout", "softmax"):
        fl = _ELEMENTWISE_FLOPS[kind] * n_in
        if kind == "dropout":
            return mk(shape, flops=fl, saved_bytes_extra=n_in if p["p"] > 0 else 0)
        saves_out = kind in ("relu", "tanh", "sigmoid", "softmax")
        saves_in = kind in ("gelu", "silu")
        return mk(shape, flops=fl, saves_output=saves_out, saves_input=saves_in)
    if kind == "batchnorm":
        ch = shape[0] if len(shape) == 3 else shape[-1]
        prm = 2 * ch if p["affine"] else 0
        # the saved batch mean and inverse deviation are per channel, not per sample
        return mk(shape, params=prm, flops=2 * n_in, saves_input=True)
    if kind in ("layernorm", "rmsnorm"):
        need((1, 2), kind)
    if kind == "layernorm":
        d = shape[-1]
        prm = (d + (d if p["bias"] else 0)) if p["affine"] else 0
        rows = n_in // d
        return mk(shape, params=prm, flops=5 * n_in, saves_input=True,
                  saved_bytes_extra=2 * rows * 4)
    if kind == "rmsnorm":
        d = shape[-1]
        rows = n_in // d
        # a fused kernel keeps its input and one fp32 reciprocal deviation per row
        return mk(shape, params=d if p["affine"] else 0, flops=4 * n_in, saves_input=True,
                  saved_bytes_extra=rows * 4)
    if kind in GATED:
        need((1, 2), kind)
        d = shape[-1]
        if d % 2:
            raise _ShapeError(path, f"layer '{name}' ({kind}) splits its {d} input features "
                                    "into a gate and a value half, so needs an even number; "
                                    "give the linear layer before it twice the width wanted")
        out = (*shape[:-1], d // 2)
        # a fused kernel (Megatron-LM's, Liger's) keeps its input alone; eager PyTorch
        # also keeps act(a), half as much again
        return mk(out, flops=_ELEMENTWISE_FLOPS[kind] * (n_in // 2), saves_input=True)
    if kind == "lrn":
        need((3,), "lrn")
        return mk(shape, flops=(2 * p["size"] + 4) * n_in, saves_input=True,
                  saves_output=True)
    if kind == "flatten":
        return mk((n_in,))
    if kind == "linear":
        need((1, 2), "linear")
        fin = shape[-1]
        tokens = shape[0] if len(shape) == 2 else 1
        fout = p["out_features"]
        wts = fin * fout + (fout if p["bias"] else 0)
        macs = tokens * fin * fout
        tied = p["tie"]
        params = wts
        if tied is not None:
            target = next((lay for lay in b.layers if lay.name == tied), None)
            if target is None or target.embedding is None:
                raise _ShapeError(child_path(path, "tie"),
                                  f"layer '{name}': 'tie: {tied}' must name an embedding "
                                  "layer defined earlier")
            if (target.embedding.vocab, target.embedding.dim) != (fout, fin):
                raise _ShapeError(child_path(path, "tie"),
                                  f"layer '{name}' ({fin}→{fout}) cannot share weights with "
                                  f"'{tied}' (vocab {target.embedding.vocab}, dim "
                                  f"{target.embedding.dim})")
            params = fout if p["bias"] else 0
        out = (tokens, fout) if len(shape) == 2 else (fout,)
        return mk(out, params=params, weight_elems=wts, macs=macs,
                  flops=2 * macs + (tokens * fout if p["bias"] else 0),
                  linear=LinearGeom(fin, fout, tokens, p["bias"], tied), saves_input=True,
                  tied_to=tied)
    if kind == "embedding":
        if len(shape) != 1:
            raise _ShapeError(path, f"layer '{name}' (embedding) needs token ids [seq] as "
                                    f"input, got {list(shape)}")
        if b.layers:
            raise _ShapeError(path, f"layer '{name}': an embedding must be the first layer "
                                    "(it reads token ids)")
        b.input_kind = "tokens"
        seq = shape[0]
        v, d = p["vocab"], p["dim"]
        return mk((seq, d), params=v * d, weight_elems=v * d, flops=0,
                  embedding=EmbeddingGeom(v, d, seq), saved_bytes_extra=seq * 8)
    if kind == "positional_embedding":
        need((2,), "positional_embedding")
        seq, d = shape
        if seq > p["positions"]:
            raise _ShapeError(child_path(path, "positions"),
                              f"layer '{name}': the sequence has {seq} tokens but only "
                              f"{p['positions']} positions are learned")
        return mk(shape, params=p["positions"] * d, weight_elems=0, flops=n_in)
    if kind == "attention":
        need((2,), "attention")
        seq, d = shape
        h = p["heads"]
        hd = p["head_dim"]
        if hd is None:
            if d % h:
                raise _ShapeError(child_path(path, "heads"),
                                  f"layer '{name}': width {d} is not divisible by heads={h}; "
                                  "give head_dim")
            hd = d // h
        kv = p["kv_heads"] or h
        if kv > h or h % kv:
            raise _ShapeError(child_path(path, "kv_heads"),
                              f"layer '{name}': kv_heads={kv} must divide heads={h}")
        if p["rotary"] and hd % 2:
            raise _ShapeError(child_path(path, "rotary"),
                              f"layer '{name}': rotary embeddings turn pairs of a head's "
                              f"features, and head_dim={hd} is odd")
        q_out, kv_out = h * hd, kv * hd
        if p["window"] is not None and not p["causal"]:
            raise _ShapeError(child_path(path, "window"),
                              f"layer '{name}': a window is the most recent keys each "
                              "query meets, which needs causal: true (bidirectional local "
                              "attention is not modelled)")
        att = AttentionGeom(seq, d, h, kv, hd, p["bias"] != "none", p["causal"], p["flash"],
                            float(p["dropout"]), p["rotary"], out_bias=p["bias"] == "qkv+out",
                            window=p["window"])
        wts = att.weights()
        proj_macs = seq * d * (q_out + 2 * kv_out) + seq * q_out * d
        attn_macs = 2 * h * seq * seq * hd
        sm = 5 * h * seq * seq
        if p["causal"]:
            # the model needs the scores of the keys up to each query: half the matrix,
            # which a causal flash kernel computes and an unfused one computes whole and
            # masks (its time counts that: layer_kernels); the model's FLOPs, and so
            # MFU, do not depend on the kernel
            attn_macs //= 2
        if att.windowed:
            # within a window: its band of query-key pairs less half the diagonal, as the
            # causal count's s²/2 is the triangle s(s + 1)/2 less it (an audit: a window
            # of s − 1 counted more than none), and the softmax's 5 FLOPs a score over
            # twice that
            attn_macs = 2 * h * att.window_pairs() * hd - h * seq * hd
            sm = 10 * h * att.window_pairs() - 5 * h * seq
        if p["rotary"]:
            sm += ROTARY_FLOPS * seq * (q_out + kv_out)
        internal, extra = att.saved()
        macs = proj_macs + attn_macs
        return mk(shape, params=wts, weight_elems=wts, macs=macs, flops=2 * macs + sm,
                  attention=att, saves_input=True, saved_internal=internal,
                  saved_bytes_extra=extra)
    if kind == "moe":
        need((2,), "moe")
        seq, d = shape
        if p["top_k"] > p["experts"]:
            given = p.get("top_k_given", True)
            raise _ShapeError(child_path(path, "top_k") if given else path,
                              f"layer '{name}': top_k={p['top_k']}"
                              f"{'' if given else ' (the default)'} is more than its "
                              f"{p['experts']} experts (each token goes to top_k of them)"
                              + ("" if given else f"; set top_k to at most {p['experts']}"))
        if p["load_imbalance"] > 1 and p["capacity_factor"] is not None:
            raise _ShapeError(child_path(path, "load_imbalance"),
                              f"layer '{name}': a capacity factor caps every expert at "
                              "its buffer (the tokens beyond it are dropped), so the "
                              "busiest expert's load is the buffer's; give "
                              "load_imbalance for dropless routing, without "
                              "capacity_factor")
        if p["load_imbalance"] * p["top_k"] > p["experts"]:
            raise _ShapeError(child_path(path, "load_imbalance"),
                              f"layer '{name}': load_imbalance={p['load_imbalance']:g} "
                              f"is more than experts / top_k = "
                              f"{p['experts'] / p['top_k']:g}: an expert takes each "
                              "token at most once, so at most all of them")
        if p["shared_ffn"] is not None and not p["shared_experts"]:
            raise _ShapeError(child_path(path, "shared_ffn"),
                              f"layer '{name}': shared_ffn sizes the shared experts, and "
                              "it has none; give shared_experts: N (or drop shared_ffn)")
        moe = MoeGeom(seq, d, p["experts"], p["top_k"], p["ffn"], p["activation"],
                      p["capacity_factor"], p["load_imbalance"], p["shared_experts"],
                      p["shared_ffn"] or p["ffn"] if p["shared_experts"] else 0)
        wts = moe.router_weights + moe.experts * moe.expert_weights() + moe.shared_weights()
        # forward work: the router on every token, each token through top_k experts and
        # the shared ones
        macs = seq * (moe.router_weights + moe.top_k * moe.expert_weights()
                      + moe.shared_weights())
        act = _ELEMENTWISE_FLOPS[p["activation"]]
        # the router's softmax and top-k (5 an expert), the activation on the hidden
        # features, and the weighted sum of the top_k outputs (2 an element); the shared
        # experts' activation, and their output added (1 an element)
        fl = 2 * macs + seq * (5 * moe.experts
                               + moe.top_k * (act * moe.ffn + 2 * d)
                               + (act * moe.shared_hidden + d if moe.shared else 0))
        return mk(shape, params=wts, weight_elems=wts, macs=macs, flops=fl, moe=moe,
                  saves_input=True, saved_internal=moe.saved(),
                  saved_bytes_extra=seq * moe.top_k * 8)  # the experts chosen, int64
    raise _ShapeError(path, f"layer type '{kind}' is not supported here")  # pragma: no cover


def _input_shape(value: object) -> Shape:
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else _tn(value)
        raise Invalid("expected the per-sample input shape as a list: [C, H, W] for images, "
                      f"[seq] for tokens, [seq, dim] or [features]; got {got}")
    if len(value) > 3:
        raise Invalid(f"expected at most 3 dimensions ([C, H, W]), got {len(value)}; the "
                      "batch dimension is not part of the input shape")
    conv = integer(1)
    dims = []
    for i, v in enumerate(value):
        try:
            dims.append(conv(v))
        except Invalid as exc:  # at the item, not the list's bracket (found by an audit)
            raise Invalid(str(exc), at=f"[{i}]") from None
    return tuple(dims)


def _spec_count(spec: _Spec) -> int:
    """Layers one entry expands to (exact integers: nested repeats may be huge)."""
    if spec.kind == "repeat":
        return spec.count * _expanded_count(spec.children)
    if spec.kind == "residual":
        return (_expanded_count(spec.children) + _expanded_count(spec.shortcut or [])
                + 1 + (1 if spec.activation else 0))
    return 1


def _expanded_count(specs: list[_Spec]) -> int:
    """Layers a list of entries expands to."""
    return sum(_spec_count(spec) for spec in specs)


def network_from_data(data: object, issues: list[Issue]) -> Network | None:
    """Validate plain data as a network; problems go to ``issues`` (None if any)."""
    f = Fields(data, "$", issues, "a network")
    if not f.ok:
        return None
    kind = f.opt("kind", string, "network")
    if kind != "network":
        f.error("kind", f"expected 'kind: network', got {kind!r}")
    name = f.opt("name", string, "network")
    f.opt_none("description", string)
    shape = f.req("input", _input_shape)
    dtype_raw = f.opt("dtype", string, "float32")
    dtype = DTYPE_ALIASES.get(dtype_raw, dtype_raw)
    if dtype not in DTYPE_BYTES:
        f.error("dtype", f"unknown dtype {dtype_raw!r}; {dtype_hint(dtype_raw)}")
        dtype = "float32"
    specs = _parse_entries(f.raw("layers"), f.at("layers"), issues, 0) if f.has(
        "layers") else []
    if not f.has("layers"):
        f.missing("missing required key 'layers' in a network")
    f.finish()
    if issues or shape is None:
        return None
    total = _expanded_count(specs)
    if total > MAX_LAYERS:
        biggest = max(specs, key=_spec_count)
        alone = _spec_count(biggest)
        where = f" ({biggest.kind} group alone: {alone:,})" if biggest.kind in (
            "repeat", "residual") and alone < total else ""
        issues.append(Issue(biggest.path if biggest.kind == "repeat" else "$.layers",
                            f"the network expands to {total:,} layers{where}; planner "
                            f"handles at most {MAX_LAYERS:,}: lower the repeat counts"))
        return None
    b = _Builder(issues)
    b.input_kind = {3: "image", 2: "sequence", 1: "features"}[len(shape)]
    _build_seq(b, specs, "", shape, -1, None, None)
    if issues:
        return None
    if not any(layer.has_weights for layer in b.layers):
        issues.append(Issue("$.layers", "the network has no layer with weights to split "
                                        "(conv2d, linear, attention, moe or embedding): "
                                        "nothing to plan"))
        return None
    # the loss keeps the network's output for backward (softmax cross-entropy keeps its
    # probabilities: GPT-2's logits, 50,257 a token, or a segmentation's map)
    b.layers[-1] = dataclasses.replace(b.layers[-1], saves_output=True)
    # whose output needs a gradient: a layer with parameters, or one fed by such a layer
    trained: list[bool] = []
    for i, layer in enumerate(b.layers):
        upstream = any(trained[j] for j in layer.inputs if j >= 0)
        trained.append(upstream or layer.params > 0 or layer.weight_elems > 0)
        if not upstream:
            b.layers[i] = dataclasses.replace(layer, upstream_params=False)
    copy_of, current = [], -1
    for i in range(len(b.layers)):  # each layer's: that of the last spec started at or before it
        current = b.copy_from.get(i, current)
        copy_of.append(current)
    return Network(name=name, dtype=dtype, input_shape=shape, layers=tuple(b.layers),
                   blocks=tuple(b.blocks), input_kind=b.input_kind, copies=tuple(copy_of))


def _common_name(names: list[str]) -> str:
    """The dotted prefix ``names`` share (``layers.3`` of ``layers.3.attn`` and
    ``layers.3.mlp``), or the first name where they share none."""
    parts = [n.split(".") for n in names]
    common = []
    for column in zip(*parts, strict=False):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    return ".".join(common) or names[0]


def layer_summary(layer: Layer, network: Network, batch: int) -> dict[str, Any]:
    """The per-layer record of ``planner show`` (plain data, stable key order)."""
    rec: dict[str, Any] = {
        "name": layer.name,
        "type": layer.type,
        "input_shape": list(layer.input_shape),
        "output_shape": list(layer.output_shape),
        "params": layer.params,
        "macs_forward": layer.macs,
        "flops_forward": layer.flops,
        "activation_bytes": network.activation_bytes(layer),
    }
    if layer.block is not None:
        rec["block"] = layer.block
        rec["role"] = layer.role
    if layer.tied_to is not None:
        rec["tied_to"] = layer.tied_to
    if layer.moe is not None:
        m = layer.moe
        rec["moe"] = {"experts": m.experts, "top_k": m.top_k, "ffn": m.ffn,
                      "activation": m.activation, "capacity_factor": m.capacity_factor,
                      "load_imbalance": m.imbalance,
                      **({"shared_experts": m.shared, "shared_ffn": m.shared_ffn}
                         if m.shared else {}),
                      # the parameters a token's forward pass multiplies by
                      "active_params": m.router_weights + m.top_k * m.expert_weights()
                      + m.shared_weights()}
    prods = layer_kernels(layer, batch, network.elem_bytes)
    shapes: dict[str, list[dict[str, Any]]] = {}
    for phase, kernels in prods.items():
        items = [_kernel_record(k) for k in kernels if not isinstance(k, Elementwise)]
        if items:
            shapes[phase] = items
    if shapes:
        rec["products"] = shapes
    if layer.conv is not None or (layer.pool is not None and layer.pool.kind in ("max", "avg")):
        rec["halo_rows"] = {"forward": list(layer.halo_forward),
                            "backward": list(layer.halo_backward)}
    return rec


def _kernel_record(k: Kernel) -> dict[str, Any]:
    if isinstance(k, Gemm):
        rec: dict[str, Any] = {"op": k.op, "m": k.m, "n": k.n, "k": k.k}
        if k.batch > 1:
            rec["batch"] = k.batch
        return rec
    assert isinstance(k, Conv)
    g = k.implicit_gemm()
    return {"op": k.op, "n": k.n, "c": k.c, "h": k.h, "w": k.w, "k": k.k, "r": k.r, "s": k.s,
            "implicit_gemm": {"m": g.m, "n": g.n, "k": g.k, "groups": g.batch}}


def iter_weighted(network: Network) -> Iterator[Layer]:
    """Layers whose layout the search chooses."""
    return (layer for layer in network.layers if layer.has_weights)


Converter = Callable[[object], Any]
