"""Megatron-LM's model arguments for a network file: what ``pretrain_gpt.py`` needs
besides the parallelism (:mod:`planner.megatron`) to build the network the plan priced.

Megatron-LM's GPT model is a stack of pre-norm decoder layers of one shape, each causal
self-attention and an MLP (or a mixture of experts), between a token embedding and an
output head. A network file that is such a stack maps onto its arguments one for one:

* the attention layers' count, width, heads and key/value heads → ``--num-layers``,
  ``--hidden-size``, ``--num-attention-heads``, ``--group-query-attention
  --num-query-groups`` (fewer key/value heads), ``--kv-channels`` (a head width other
  than ``hidden / heads``); their tokens → ``--seq-length`` and
  ``--max-position-embeddings``; rotary embeddings → ``--position-embedding-type rope``,
  a learned position table → ``learned_absolute`` (Megatron-LM's default), neither →
  ``none``; their dropout → ``--attention-dropout``;
* the norms → ``--normalization RMSNorm`` or ``LayerNorm`` (the default);
* the MLP's up projection → ``--ffn-hidden-size`` (half its width under SwiGLU, whose
  gate and up projections the network file fuses as Megatron-LM stores them) and its
  activation → ``--swiglu`` or GELU (the default);
* a mixture of experts → ``--num-experts``, ``--moe-router-topk``,
  ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size`` for shared
  experts, and ``--moe-layer-freq`` where some layers keep a dense MLP;
* biases: none on the linear layers (nor experts) → ``--disable-bias-linear`` (with
  ``--add-qkv-bias`` where only Q, K and V have them, Qwen2's); an output head not tied
  to the embedding → ``--untie-embeddings-and-output-weights``; no dropout layers →
  ``--hidden-dropout 0``.

A network that is not such a stack (convolutions, layers of different widths, local and
global attention alternating, activations Megatron-LM has no argument for) gets no model
arguments, and the reason. What the network file does not say is listed for the user:
the vocabulary (the tokenizer's), the norm's epsilon and the rotary base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .network import GATED, Layer, MoeGeom, Network
from .units import count


@dataclass
class ModelArgs:
    """Megatron-LM's model arguments for a network, or why there are none."""

    args: list[str] = field(default_factory=list)
    #: what the arguments leave to the user (the network file does not say it)
    notes: list[str] = field(default_factory=list)
    #: why the network is not Megatron-LM's GPT model (None: it is)
    refused: str | None = None


def _one(values: set[Any], what: str) -> tuple[Any, str | None]:
    """The one value of a set, or why there is not one."""
    if len(values) == 1:
        return next(iter(values)), None
    return None, f"its {what} differ ({', '.join(sorted(map(str, values)))})"


def model_args(net: Network) -> ModelArgs:
    """The arguments, per the module notes."""
    layers = net.layers
    if any(lay.conv is not None for lay in layers):
        return ModelArgs(refused="it has convolutions")
    atts = [lay.attention for lay in layers if lay.attention is not None]
    if not atts:
        return ModelArgs(refused="it has no attention layers")
    checks: dict[str, set[Any]] = {
        "attention layers' widths": {a.dim for a in atts},
        "attention layers' heads": {a.heads for a in atts},
        "attention layers' key/value heads": {a.kv_heads for a in atts},
        "attention layers' head widths": {a.head_dim for a in atts},
        "attention layers' sequences": {a.seq for a in atts},
        "attention layers' windows": {a.window if a.windowed else 0 for a in atts},
        "attention layers' biases": {(a.bias, a.out_bias) for a in atts},
        "attention layers' position embeddings": {a.rotary for a in atts},
        "attention layers' dropout": {a.dropout for a in atts},
    }
    for what, values in checks.items():
        _, why = _one(values, what)
        if why is not None:
            return ModelArgs(refused=why)
    a = atts[0]
    if not a.causal:
        return ModelArgs(refused="its attention is not causal (Megatron-LM's GPT model's is)")
    out = ModelArgs()
    args = out.args
    args += [f"--num-layers {len(atts)}", f"--hidden-size {a.dim}",
             f"--num-attention-heads {a.heads}"]
    if a.kv_heads != a.heads:
        args += ["--group-query-attention", f"--num-query-groups {a.kv_heads}"]
    if a.head_dim * a.heads != a.dim:
        args.append(f"--kv-channels {a.head_dim}")
    args += [f"--seq-length {a.seq}", f"--max-position-embeddings {a.seq}"]
    learned = any(lay.type == "positional_embedding" for lay in layers)
    if a.rotary and learned:
        return ModelArgs(refused="it has both rotary and learned position embeddings")
    if a.rotary:
        args.append("--position-embedding-type rope")
        out.notes.append("--rotary-base (Megatron-LM's default 10,000; Llama 3's is "
                         "500,000)")
    elif not learned:
        args.append("--position-embedding-type none")
    if a.windowed:
        out.notes.append(f"a sliding window: its attention meets the {a.window:,} most "
                         "recent keys, which these arguments do not set")
    norms = {lay.type for lay in layers if lay.type in ("layernorm", "rmsnorm")}
    norm, why = _one(norms, "norms")
    if why is not None or norm is None:
        return ModelArgs(refused=why or "it has no norms (Megatron-LM's layers are "
                                        "pre-norm)")
    if norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    head = _head(net)
    ffn = _dense_ffn(net, a.dim, head)
    if isinstance(ffn, str):
        return ModelArgs(refused=ffn)
    moes = [lay for lay in layers if lay.moe is not None]
    dense_width, act = ffn
    acts = {act} if act else set()
    if moes:
        moe_why = _moe(net, moes, len(atts), dense_width, args, acts)
        if moe_why is not None:
            return ModelArgs(refused=moe_why)
    elif dense_width is None:
        return ModelArgs(refused="it has no MLP")
    if dense_width is not None:
        args.insert(2, f"--ffn-hidden-size {dense_width}")
    activation, why = _one(acts, "MLP activations")
    if why is not None:
        return ModelArgs(refused=why)
    if activation == "swiglu":
        args.append("--swiglu")
    elif activation != "gelu":
        return ModelArgs(refused=f"its MLP's activation is {activation}, for which "
                                 "Megatron-LM has no argument (it runs GELU or SwiGLU)")
    linear_bias = {lay.linear.bias for lay in layers
                   if lay.linear is not None and lay is not head}
    # a network whose MLPs are all experts has no linear layer but its head: the
    # experts' projections have no biases, as --disable-bias-linear builds them
    bias, why = _one(linear_bias or {False}, "linear layers' biases")
    if why is not None:
        return ModelArgs(refused=why)
    qkv, out_bias = a.bias, a.out_bias if a.out_bias is not None else a.bias
    if bias is False and not qkv:
        args.append("--disable-bias-linear")
    elif bias is False and qkv and not out_bias:
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    elif not (bias is True and qkv and out_bias):
        return ModelArgs(refused="its biases are on some projections and not others, as "
                                 "no Megatron-LM argument sets them")
    if head is not None and head.linear is not None and head.linear.tied_to is None:
        args.append("--untie-embeddings-and-output-weights")
    args.append(f"--attention-dropout {a.dropout:g}")
    if any(lay.type == "dropout" for lay in layers):
        out.notes.append("--hidden-dropout for its dropout layers (Megatron-LM's default "
                         "0.1)")
    else:
        args.append("--hidden-dropout 0")
    vocab = next((lay.embedding.vocab for lay in layers if lay.embedding is not None),
                 None)
    if vocab is not None:
        out.notes.append(f"the tokenizer of its {vocab:,}-token vocabulary "
                         "(--tokenizer-type, or --vocab-size with NullTokenizer)")
    out.notes.append("--norm-epsilon (Megatron-LM's default 1e-5)")
    return out


def _head(net: Network) -> Layer | None:
    """The output head: the last linear layer, after the last attention layer."""
    last_att = max(i for i, lay in enumerate(net.layers) if lay.attention is not None)
    heads = [lay for lay in net.layers[last_att:] if lay.linear is not None]
    return heads[-1] if heads else None


def _dense_ffn(net: Network, dim: int, head: Layer | None
               ) -> tuple[int | None, str | None] | str:
    """The dense MLPs' hidden width and activation (None, None without any), or why
    Megatron-LM's MLP is not theirs: an up projection ``dim → f`` (``2f`` fused for a
    gated activation), the activation, a down projection ``f → dim``."""
    widths: set[int] = set()
    acts: set[str] = set()
    layers = net.layers
    for i, lay in enumerate(layers):
        if lay.linear is None or lay is head or lay.linear.in_features != dim:
            continue
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if nxt is None or nxt.linear is not None:
            return f"layer '{lay.name}' is a linear layer without an activation after it"
        act = nxt.type
        width = lay.linear.out_features
        if act in GATED:
            width //= 2
        widths.add(width)
        acts.add(act)
    if not widths:
        return None, None
    width, why = _one(widths, "MLPs' widths")
    if why is not None:
        return why
    act, why = _one(acts, "MLP activations")
    if why is not None:
        return why
    return width, act


def _moe(net: Network, moes: list[Layer], n_layers: int, dense: int | None, args: list[str],
         acts: set[str]) -> str | None:
    """Add the mixture-of-experts arguments; why not, or None."""
    geoms: list[MoeGeom] = [lay.moe for lay in moes if lay.moe is not None]
    shape = {(g.experts, g.top_k, g.ffn, g.shared, g.shared_ffn) for g in geoms}
    one, why = _one(shape, "mixtures of experts")
    if why is not None or one is None:
        return why
    experts, top_k, ffn, shared, shared_ffn = one
    acts.update(g.activation for g in geoms)
    args += [f"--num-experts {experts}", f"--moe-router-topk {top_k}",
             f"--moe-ffn-hidden-size {ffn}"]
    if shared:
        args.append(f"--moe-shared-expert-intermediate-size {shared * shared_ffn}")
    if len(moes) != n_layers:
        if dense is None:
            return (f"{count(len(moes), 'layer')} of {n_layers} have experts and the others "
                    "no MLP")
        # which decoder layers are dense: Megatron-LM's pattern, one entry a layer
        args.append(f"--moe-layer-freq {_layer_pattern(net)}")
    elif dense is None:
        # every layer has experts: the dense width Megatron-LM still reads, the experts'
        args.insert(2, f"--ffn-hidden-size {ffn}")
    return None


def _layer_pattern(net: Network) -> str:
    """``--moe-layer-freq``'s list of 1 (experts) and 0 (dense), one a decoder layer (an
    attention layer and what follows it up to the next), as a Python expression of runs
    (``[0]*1+[1]*27``)."""
    flags: list[int] = []
    for lay in net.layers:
        if lay.attention is not None:
            flags.append(0)
        elif lay.moe is not None and flags:
            flags[-1] = 1
    runs: list[tuple[int, int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1] = (f, runs[-1][1] + 1)
        else:
            runs.append((f, 1))
    return "+".join(f"[{f}]*{n}" for f, n in runs)
