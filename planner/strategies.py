"""Which layouts a layer admits. Generators yield only valid choices (the style of
Calculon's ``get_all_tensor_parallelisms``): the search never filters afterwards.

A layer with weights on ``P = P_r × P_c`` devices admits

* ``data 1×P`` when every device gets at least one sample (``P ≤ B``);
* ``model P_r×P_c`` for every divisor ``P_r > 1`` of ``P`` with ``P_r`` at most its output
  features / channels / heads and ``P_c ≤ B``;
* ``domain P_r×P_c`` for convolutions whose input and output heights are at least ``P_r``
  (the paper's analytic accounting, ``gholami2018``, splits any convolution);

each grid with both dimensions above one in the two placements (rows or columns inside a
node).
"""

from __future__ import annotations

from collections.abc import Iterator

from .layout import Layout, divisors, make_layout
from .network import Layer


def why_invalid(layer: Layer, layout: Layout, batch: int, paper: bool = False) -> str | None:
    """Why ``layout`` does not apply to ``layer`` (None when it does)."""
    if layout.pc > batch:
        return (f"its batch split P_c={layout.pc} is larger than the batch {batch} (every "
                "device needs at least one sample)")
    if layout.mode == "model":
        limit = layer.model_split_limit
        what = "heads" if layer.attention is not None else (
            "output channels" if layer.conv is not None else "output features")
        if layout.pr > limit:
            return f"it has {limit} {what}, fewer than P_r={layout.pr}"
    if layout.mode == "domain":
        if layer.conv is None:
            return "domain parallelism splits the height of a convolution; this layer has none"
        if not paper:
            h = min(layer.input_shape[1], layer.output_shape[1])
            if layout.pr > h:
                return (f"its image has {h} rows, fewer than P_r={layout.pr} (use fewer "
                        "rows in the grid, or --cost-model gholami2018 for the paper's "
                        "analytic split)")
    return None


def candidate_layouts(layer: Layer, gpus: int, batch: int, paper: bool = False,
                      placements: tuple[str, ...] = ("rows", "cols")) -> Iterator[Layout]:
    """Every valid layout of a layer with weights, in a stable order."""
    if gpus <= batch:
        yield make_layout("data", 1, gpus)
    limit = layer.model_split_limit
    spatial_rows = min(layer.input_shape[1], layer.output_shape[1]) if layer.is_spatial else 0
    for pr in divisors(gpus):
        if pr == 1:
            continue
        pc = gpus // pr
        if pc > batch:
            continue
        both = pc > 1
        if pr <= limit:
            for pl in placements if both else ("rows",):
                yield make_layout("model", pr, pc, pl)
        if layer.conv is not None and (paper or pr <= spatial_rows):
            for pl in placements if both else ("rows",):
                yield make_layout("domain", pr, pc, pl)
