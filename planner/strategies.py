"""Which layouts a layer admits. Generators yield only valid choices (the style of
Calculon's ``get_all_tensor_parallelisms``): the search never filters afterwards.

A layer with weights on ``P = P_r × P_c`` devices admits

* ``data 1×P`` when every device gets at least one sample (``P ≤ B``);
* ``model P_r×P_c`` for every divisor ``P_r > 1`` of ``P`` with ``P_r`` at most its output
  features / channels / heads and ``P_c ≤ B``;
* ``domain P_r×P_c`` for convolutions whose input and output heights are at least ``P_r``
  (the paper's analytic accounting, ``gholami2018``, splits any convolution), and (not
  under ``gholami2018``) for linear, attention and embedding layers on a sequence of at
  least ``P_r`` tokens, split by tokens (context parallelism);
* for linear layers (not under ``gholami2018``, which has no such layouts) ``column`` and
  ``row P_r×P_c``, Megatron's pair: ``P_r`` at most the output features (column) or the
  input features (row);
* ``column-sp``, ``row-sp`` and ``model-sp`` (attention, embeddings) on sequences of at
  least ``P_r`` tokens: Megatron-LM's sequence parallelism;
* ``ulysses`` for attention with at least ``P_r`` heads and tokens: DeepSpeed-Ulysses;
* ``expert`` and ``expert-sp`` for a mixture of experts whose experts ``P_r`` divides:
  expert parallelism, on a batch split over all ``P`` (``P ≤ B``) or on tokens split
  over the row group (at least ``P_r`` tokens);

each grid with both dimensions above one in the two placements (rows or columns inside a
node; the layouts that split a sequence's tokens in the ``sequence_placements`` of
:func:`candidate_layouts`).
"""

from __future__ import annotations

from collections.abc import Iterator

from .costs.layer import FEATURE_WISE
from .layout import (
    EXPERT_MODES,
    SEQUENCE_MODES,
    Layout,
    Pin,
    base_mode,
    divisors,
    holds_alike,
    make_layout,
    pin_layout,
)
from .network import Layer, Network, name_matches


def why_invalid(layer: Layer, layout: Layout, batch: int, paper: bool = False,
                microbatched: bool = False) -> str | None:
    """Why ``layout`` does not apply to ``layer`` at ``batch`` samples (None when it
    does); ``microbatched``: the batch is a microbatch of gradient accumulation."""
    if layout.pc > batch:
        what = "microbatch" if microbatched else "batch"
        return (f"its batch split P_c={layout.pc} is larger than the {what} {batch} (every "
                "device needs at least one sample)")
    if layout.mode == "model":
        limit = layer.model_split_limit
        what = _split_what(layer)
        if layout.pr > limit:
            return f"it has {limit} {what}, fewer than P_r={layout.pr}"
        why = why_heads_split(layer, layout.pr)
        if why is not None:
            return why
    if layout.mode in SEQUENCE_MODES:
        why = _why_not_sequence(layer, layout, paper)
        if why is not None:
            return why
    if layout.mode == "ulysses":
        return _why_not_ulysses(layer, layout, paper)
    if layout.mode in EXPERT_MODES:
        return _why_not_expert(layer, layout, batch, paper, microbatched)
    mode = base_mode(layout.mode)
    if layout.mode == "model-sp":
        if layout.pr > layer.model_split_limit:
            return (f"it has {layer.model_split_limit} {_split_what(layer)}, fewer than "
                    f"P_r={layout.pr}")
        return why_heads_split(layer, layout.pr)
    if mode in ("column", "row"):
        if layer.linear is None:
            return (f"{layout.mode}-parallel layouts (Megatron's pair) split a linear layer; "
                    "this layer is not one")
        if layer.linear.tied_to is not None and mode == "row":
            return ("an output head that shares its embedding's table splits it by "
                    "vocabulary rows (model or column), not by its input features (row)")
        if paper:
            return (f"the paper's accounting (--cost-model gholami2018) has no "
                    f"{layout.mode}-parallel layout")
        limit = layer.linear.out_features if mode == "column" else \
            layer.linear.in_features
        side = "output" if mode == "column" else "input"
        if layout.pr > limit:
            return f"it has {limit} {side} features, fewer than P_r={layout.pr}"
    if layout.mode == "domain":
        if layer.conv is None:
            return _why_not_context(layer, layout, paper)
        if not paper:
            h = min(layer.input_shape[1], layer.output_shape[1])
            if layout.pr > h:
                return (f"its image has {h} rows, fewer than P_r={layout.pr} (use fewer "
                        "rows in the grid, or --cost-model gholami2018 for the paper's "
                        "analytic split)")
    return None


def _why_not_context(layer: Layer, layout: Layout, paper: bool) -> str | None:
    """Why ``domain`` does not apply to a layer with weights that is no convolution:
    on a sequence it splits the tokens (context parallelism)."""
    tokens = sequence_tokens(layer)
    if tokens is None:
        return ("domain parallelism splits the height of a convolution or the tokens of "
                "a sequence; this layer has neither")
    if paper:
        return ("the paper's accounting (--cost-model gholami2018) splits the height of "
                "convolutions only, not a sequence's tokens")
    if layout.pr > tokens:
        return f"its sequence has {tokens} tokens, fewer than P_r={layout.pr}"
    return None


def _split_what(layer: Layer) -> str:
    """What a model split divides: heads, output channels, features or an expert's
    hidden features."""
    if layer.attention is not None:
        return "heads"
    if layer.conv is not None:
        return "output channels"
    return "hidden features an expert" if layer.moe is not None else "output features"


def _why_not_expert(layer: Layer, layout: Layout, batch: int, paper: bool,
                    microbatched: bool) -> str | None:
    """Why an expert-parallel layout does not apply (None when it does)."""
    m = layer.moe
    if m is None:
        return (f"{layout.mode} layouts (expert parallelism) split the experts of a "
                "mixture of experts (type: moe); this layer is not one")
    if paper:
        return (f"the paper's accounting (--cost-model gholami2018) has no {layout.mode} "
                "layout")
    if m.experts % layout.pr:
        return (f"P_r={layout.pr} does not divide its {m.experts} experts (every device of "
                "an expert group holds as many)")
    if layout.mode == "expert" and layout.p > batch:
        what = "microbatch" if microbatched else "batch"
        return (f"expert takes the batch split over all {layout.p} devices, more than the "
                f"{what} {batch} (use expert-sp, which splits the tokens over P_r)")
    if layout.mode == "expert-sp" and layout.pr > m.tokens:
        return f"its sequence has {m.tokens} tokens, fewer than P_r={layout.pr}"
    return None


def _why_not_ulysses(layer: Layer, layout: Layout, paper: bool) -> str | None:
    """Why ``ulysses`` (DeepSpeed-Ulysses) does not apply (None when it does)."""
    if layer.attention is None:
        return "ulysses layouts (DeepSpeed-Ulysses) split an attention layer; this is not one"
    if paper:
        return "the paper's accounting (--cost-model gholami2018) has no ulysses layout"
    if layout.pr > layer.attention.seq:
        return f"its sequence has {layer.attention.seq} tokens, fewer than P_r={layout.pr}"
    if layout.pr > layer.attention.heads:
        return f"it has {layer.attention.heads} heads, fewer than P_r={layout.pr}"
    return why_heads_split(layer, layout.pr, replicas=True)


def why_heads_split(layer: Layer, pr: int, replicas: bool = False) -> str | None:
    """Why ``pr`` devices cannot each take whole heads of an attention layer (None when
    they can, or when ``layer`` is no attention). A head is never split: ``pr`` divides
    the query heads, and the key/value heads too, as Megatron-LM's tensor parallelism
    requires (``num_attention_heads`` and ``num_query_groups`` divisible by the tensor
    size; a device holding the queries of two key/value groups would need both).
    ``replicas`` (DeepSpeed-Ulysses, whose weights are whole on every device): ``pr``
    may instead be a multiple of the key/value heads, each then sent to ``pr / kv``
    devices."""
    a = layer.attention
    if a is None:
        return None
    if a.heads % pr:
        return (f"P_r={pr} does not divide its {a.heads} heads (a head is not split, so "
                "every device of the row group takes as many)")
    kv = a.kv_heads
    if kv % pr == 0 or (replicas and pr % kv == 0):
        return None
    if replicas:
        return (f"P_r={pr} neither divides its {kv} key/value heads nor is a multiple of "
                "them (each device needs the key/value heads of its own query heads)")
    return (f"P_r={pr} does not divide its {kv} key/value heads (Megatron-LM's tensor "
            "parallelism gives every device whole key/value groups; split the tokens "
            "instead: ulysses or domain)")


def _why_not_sequence(layer: Layer, layout: Layout, paper: bool) -> str | None:
    """Why a sequence-parallel layout does not apply (None when it does)."""
    if paper:
        return ("the paper's accounting (--cost-model gholami2018) has no sequence "
                "parallelism")
    if layout.mode == "model-sp":
        kind = "an attention layer, an embedding or a mixture of experts"
        wrong = layer.attention is None and layer.embedding is None and layer.moe is None
    else:
        kind, wrong = "a linear layer", layer.linear is None
    if wrong:
        return (f"{layout.mode} layouts (Megatron's sequence parallelism) split {kind}; "
                "this layer is not one")
    tokens = sequence_tokens(layer)
    if tokens is None:
        return (f"{layout.mode} splits a sequence [seq, dim] by tokens, and this layer's "
                f"input is {list(layer.input_shape)}")
    if layout.pr > tokens:
        return f"its sequence has {tokens} tokens, fewer than P_r={layout.pr}"
    emb = layer.embedding
    if emb is not None and layout.pr > emb.vocab:
        return f"its table has {emb.vocab} rows, fewer than P_r={layout.pr}"
    return None


def sequence_tokens(layer: Layer) -> int | None:
    """The tokens a sequence-parallel layout splits: an embedding's sequence, or the
    first dimension of a ``[seq, dim]`` input (None: the layer has no sequence)."""
    if layer.embedding is not None:
        return layer.embedding.seq
    return layer.input_shape[0] if len(layer.input_shape) == 2 else None


def _token_split_limit(layer: Layer) -> int:
    """The most devices a sequence-parallel layout of ``layer`` spans (the reasons are
    :func:`_why_not_sequence`'s): its tokens, and an embedding's table rows (0: none)."""
    tokens = sequence_tokens(layer) or 0
    return min(tokens, layer.embedding.vocab) if layer.embedding is not None else tokens


def candidate_layouts(layer: Layer, gpus: int, batch: int, paper: bool = False,
                      placements: tuple[str, ...] = ("rows", "cols"),
                      sequence_placements: tuple[str, ...] = ("rows",)) -> Iterator[Layout]:
    """Every valid layout of a layer with weights, in a stable order. Sequence-parallel
    layouts take ``sequence_placements`` (the search: their row group on consecutive
    ranks only, in one node where it fits, as Megatron-LM places tensor parallelism:
    their collectives run on that group at every layer, and each placement searched
    costs a distribution more in every step of the dynamic program)."""
    if gpus <= batch:
        yield make_layout("data", 1, gpus)
    limit = layer.model_split_limit
    lin = layer.linear
    megatron = lin is not None and not paper
    spatial_rows = min(layer.input_shape[1], layer.output_shape[1]) if layer.is_spatial else 0
    for pr in divisors(gpus):
        if pr == 1:
            continue
        pc = gpus // pr
        if pc > batch:
            continue
        both = pc > 1
        tokens = not paper and pr <= _token_split_limit(layer)
        sp_placements = [pl for pl in sequence_placements if both or pl == "rows"]
        if pr <= limit and why_heads_split(layer, pr) is None:
            for pl in placements if both else ("rows",):
                yield make_layout("model", pr, pc, pl)
            if tokens and (layer.attention is not None or layer.embedding is not None
                           or layer.moe is not None):
                for pl in sp_placements:
                    yield make_layout("model-sp", pr, pc, pl)
        if tokens and layer.attention is not None and pr <= limit \
                and why_heads_split(layer, pr, replicas=True) is None:
            for pl in sp_placements:
                yield make_layout("ulysses", pr, pc, pl)
        if lin is not None and megatron:
            for mode, most in (("column", lin.out_features), ("row", lin.in_features)):
                if pr <= most and not (mode == "row" and lin.tied_to is not None):
                    for pl in placements if both else ("rows",):
                        yield make_layout(mode, pr, pc, pl)
                    if tokens:
                        for pl in sp_placements:
                            yield make_layout(f"{mode}-sp", pr, pc, pl)
        if layer.moe is not None and not paper and layer.moe.experts % pr == 0:
            if gpus <= batch:
                for pl in placements if both else ("rows",):
                    yield make_layout("expert", pr, pc, pl)
            if tokens:
                for pl in sp_placements:
                    yield make_layout("expert-sp", pr, pc, pl)
        if layer.conv is not None and (paper or pr <= spatial_rows):
            for pl in placements if both else ("rows",):
                yield make_layout("domain", pr, pc, pl)
        elif layer.conv is None and not paper and pr <= (sequence_tokens(layer) or 0):
            for pl in sp_placements:  # context parallelism: split by tokens
                yield make_layout("domain", pr, pc, pl)


class StrategyError(ValueError):
    """A chosen layout that does not apply; ``source`` is ``grid`` or the pin's index."""

    def __init__(self, message: str, source: str | int) -> None:
        super().__init__(message)
        self.source = source


def grid_layout(layer: Layer, gpus: int, pr: int, pc: int, mode: str | None,
                placement: str, pairs: dict[int, str] | None = None) -> Layout:
    """The layout one grid for every layer gives ``layer``: data when ``P_r = 1``; with
    ``mode: domain``, convolutions split their height and the other layers model; with
    ``mode: megatron``, linear layers take ``pairs`` (:func:`megatron_modes`) and the
    other layers model; with ``mode: megatron-cp`` (Megatron-LM's context parallelism),
    every layer its tokens over ``P_r`` and the batch over ``P_c``."""
    if pr == 1 or mode == "data":
        return make_layout("data", 1, gpus)
    if mode == CONTEXT_MODE:
        return make_layout("domain", pr, pc, placement)
    if mode == "domain" and layer.conv is not None:
        return make_layout("domain", pr, pc, placement)
    if mode in MEGATRON_MODES and pairs:
        return make_layout(pairs.get(layer.index, "model"), pr, pc, placement)
    return make_layout("model", pr, pc, placement)


#: the one-grid modes of Megatron-LM: tensor parallelism, and with sequence parallelism
MEGATRON_MODES: tuple[str, ...] = ("megatron", "megatron-sp")
#: Megatron-LM's context parallelism as one grid: every layer split by tokens (``P_r``)
#: and the batch (``P_c``), its weights whole
CONTEXT_MODE = "megatron-cp"
#: the modes of one grid for every layer (``--mode``, a training configuration's mode)
GRID_MODES: tuple[str, ...] = ("data", "model", "domain", *MEGATRON_MODES, CONTEXT_MODE)


def megatron_modes(network: Network, sequence: bool = False) -> dict[int, str]:
    """Megatron-LM's tensor parallelism for a network's linear layers: a linear whose
    output reaches another linear through feature-wise layers only is ``column``, that
    other one ``row``; the output head (the last layer, or one that shares its
    embedding's table) ``column``, its logits left split for the vocabulary-parallel
    cross-entropy (the others are left out: model-split). With ``sequence``
    (Megatron-LM's ``--sequence-parallel``), the linear layers so split on sequences are
    ``column-sp`` and ``row-sp``, attention layers and embeddings on sequences
    ``model-sp`` (a vocabulary-parallel embedding reduce-scattering by tokens)."""
    consumers: dict[int, list[int]] = {}
    for layer in network.layers:
        for i in layer.inputs:
            consumers.setdefault(i, []).append(layer.index)
    modes: dict[int, str] = {}
    for layer in network.layers:
        if layer.linear is None or layer.index in modes:
            continue
        if layer.linear.tied_to is not None or layer.index == len(network.layers) - 1:
            modes[layer.index] = "column"  # the head: its logits stay split for the loss
            continue
        nxt = consumers.get(layer.index, [])
        while len(nxt) == 1 and network.layers[nxt[0]].type in FEATURE_WISE:
            nxt = consumers.get(nxt[0], [])
        if len(nxt) == 1:
            target = network.layers[nxt[0]]
            if target.linear is not None and target.linear.tied_to is None:
                modes[layer.index] = "column"
                modes[target.index] = "row"
    if not sequence:
        return modes
    for layer in network.layers:
        if sequence_tokens(layer) is None:
            continue
        if layer.attention is not None or layer.embedding is not None or \
                layer.moe is not None:
            modes[layer.index] = "model-sp"
        elif layer.index in modes:
            modes[layer.index] += "-sp"
    return modes


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


def unmatched_pin_message(pin: Pin, network: Network, earlier: list[Pin] | None = None,
                          ) -> str:
    """Why a pin set no layer: it matches none, only layers without weights of their
    own, or only layers an earlier pin already sets (the first matching pin wins)."""
    matched = [layer for layer in network.layers
               if name_matches(layer.name, pin.pattern)]
    same = next((p for p in earlier or [] if p.pattern == pin.pattern), None)
    if same is not None:
        return (f"pin '{pin.text}' matches the same layers as the earlier pin "
                f"'{same.text}'; the first pin that matches a layer wins: give one")
    taken = []
    for layer in matched:
        if layer.has_weights:
            first = next((p for p in earlier or []
                          if name_matches(layer.name, p.pattern)), None)
            if first is not None:
                taken.append(f"{layer.name} by '{first.text}'")
    if taken:
        bare = any(not layer.has_weights for layer in matched)
        return (f"pin '{pin.text}' matches only layers an earlier pin sets "
                f"({_listed(taken)}){' and layers without weights' if bare else ''}; the "
                "first pin that matches a layer wins: put the narrower pin first")
    if matched:
        return (f"pin '{pin.text}' matches only layers without weights "
                f"({_listed([layer.name for layer in matched])}); they follow their "
                "neighbours' layout")
    return f"pin '{pin.text}' matches no layer of '{network.name}'"


def fixed_assignment(network: Network, gpus: int, batch: int, paper: bool,
                     grid: tuple[int, int] | None, mode: str | None, pins: list[Pin],
                     placement: str, microbatched: bool = False) -> dict[int, Layout]:
    """The layout of every layer with weights from one grid (or mode) and pins: the first
    matching pin wins, the other layers take the grid (default: data parallel). Raises
    :class:`StrategyError` naming the offending option."""
    if grid is not None:
        pr, pc = grid
        if mode == "data" and pr != 1:
            raise StrategyError(f"--mode data is the grid 1x{gpus}; --grid {pr}x{pc} needs "
                                "--mode model, domain, megatron, megatron-sp or megatron-cp",
                                "grid")
    elif mode in GRID_MODES[1:]:
        pr, pc = gpus, 1
    else:
        pr, pc = 1, gpus
    used = [False] * len(pins)
    out: dict[int, Layout] = {}
    owner_of = {t: o for o, tied in network.ties.items() for t in tied}
    pairs = megatron_modes(network, mode == "megatron-sp") if mode in MEGATRON_MODES \
        else None
    for layer in network.layers:
        if not layer.has_weights:
            continue
        chosen: Layout | None = None
        source: str | int = "grid"
        for i, pin in enumerate(pins):
            if name_matches(layer.name, pin.pattern):
                chosen, source, used[i] = pin_layout(pin, gpus, placement), i, True
                break
        owner = owner_of.get(layer.index)
        if owner is not None and owner in out:
            # one weight, held alike: a tied layer takes its owner's layout unless a pin
            # asks for one that holds it alike (a column head under a model-split
            # table); a pin asking for another is an error
            if chosen is not None and not holds_alike(out[owner], chosen):
                raise StrategyError(
                    f"layer '{layer.name}' shares its weights with "
                    f"'{network.layers[owner].name}' (tie) and takes its layout, "
                    f"{out[owner].label()}; the pin asks for {chosen.label()}", source)
            if chosen is None:
                on_grid = grid_layout(layer, gpus, pr, pc, mode, placement, pairs)
                chosen = on_grid if holds_alike(out[owner], on_grid) else out[owner]
        if chosen is None:
            chosen = grid_layout(layer, gpus, pr, pc, mode, placement, pairs)
        reason = why_invalid(layer, chosen, batch, paper, microbatched)
        if reason is not None:
            # under --mode megatron* a layer's layout is the mode's choice for it: name
            # the mode the user gave as well as the layout it stands for
            given = f" (--mode {mode}'s layout for it)" if source == "grid" and mode \
                and mode != chosen.mode else ""
            raise StrategyError(f"layer '{layer.name}' cannot use {chosen.label()}{given}: "
                                f"{reason}", source)
        out[layer.index] = chosen
    for i, pin in enumerate(pins):
        if not used[i]:
            raise StrategyError(unmatched_pin_message(pin, network, pins[:i]), i)
    return out
