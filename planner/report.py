"""Rendering: plain data for JSON/YAML, and rich tables for a person."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .cluster import Device
from .network import Network, layer_summary
from .tables import COPIES_CAPTION, Row, collapse_copies
from .units import count, format_bytes, format_si


def human_count(n: float) -> str:
    """1234567 → '1.23M'."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"


def show_data(net: Network, batch: int) -> dict[str, Any]:
    """The document of ``planner show``: network facts, layers, totals."""
    layers = [layer_summary(layer, net, batch) for layer in net.layers]
    kept = sum(r["activation_bytes"] for r in layers) + (
        net.saved_tensors().get(-1, 0) * net.elem_bytes)
    return {
        "network": net.name,
        "dtype": net.dtype,
        "input_shape": list(net.input_shape),
        "batch": batch,
        "layers": layers,
        "totals": {
            "layers": len(net.layers),
            "params": net.params,
            "macs_forward": net.macs,
            "flops_forward": net.flops,
            "activation_bytes": kept,
            "param_bytes": net.params * net.elem_bytes,
            # with experts: the parameters a token's forward pass multiplies by (the
            # router's, its top-k experts', the shared ones and every other layer's)
            **({"active_params": sum(r["moe"]["active_params"] if "moe" in r else r["params"]
                                     for r in layers)}
               if any("moe" in r for r in layers) else {}),
        },
    }


def _shape(s: list[int]) -> str:
    return "×".join(str(d) for d in s)


def network_table(net: Network, data: dict[str, Any], all_layers: bool = False) -> Any:
    """A per-layer table with totals (per sample counts); alike consecutive copies of a
    repeat group show once unless ``all_layers``."""
    t = Table(box=box.SIMPLE_HEAD, title=f"{net.name}  ({net.dtype}, input "
                                         f"{_shape(list(net.input_shape))}, per sample)",
              title_justify="left", pad_edge=False, padding=(0, 1))
    t.add_column("layer", overflow="fold", min_width=12)
    for col in ("type", "input", "output", "params", "FLOPs"):
        t.add_column(col, justify="left" if col == "type" else "right", no_wrap=True)
    rows = [Row(rec["name"], (
        rec["type"], _shape(rec["input_shape"]), _shape(rec["output_shape"]),
        f"{rec['params']:,}" if rec["params"] else "",
        human_count(rec["flops_forward"]) if rec["flops_forward"] else ""), False)
        for rec in data["layers"]]
    shown = rows if all_layers else collapse_copies(rows)
    for row in shown:
        t.add_row(row.name, *row.cells)
    if len(shown) < len(rows):
        t.caption = COPIES_CAPTION.format(alike="in type, shapes, parameters and FLOPs")
        t.caption_justify = "left"
    tot = data["totals"]
    t.add_section()
    t.add_row(Text("total", style="bold"), count(tot["layers"], "layer"), "", "",
              Text(f"{tot['params']:,}", style="bold"), human_count(tot["flops_forward"]))
    active = f", {tot['active_params']:,} active a token" if "active_params" in tot else ""
    note = Text(f"parameters: {tot['params']:,} ({format_bytes(tot['param_bytes'])} in "
                f"{net.dtype}){active}; forward per sample: "
                f"{human_count(tot['macs_forward'])} MACs, "
                f"{human_count(tot['flops_forward'])} FLOPs; kept for backward: "
                f"{format_bytes(tot['activation_bytes'], 3)}", style="dim")
    return Group(t, note)


def devices_table(devices: list[Device]) -> Any:
    """The device catalog as a table."""
    t = Table(box=box.SIMPLE_HEAD, title="device catalog (peak FLOP rates in TFLOP/s)",
              title_justify="left", pad_edge=False)
    # the peaks in TFLOP/s by the title, and one alias a line, so that the aliases fit
    # 120 columns (the width of a piped table) whole but for the longest
    for col, just in (("name", "left"), ("architecture", "left"), ("fp32", "right"),
                      ("bf16/fp16", "right"), ("memory", "right"), ("bandwidth", "right"),
                      ("SMs", "right"), ("L2", "right"), ("aliases", "left")):
        t.add_column(col, justify=just, overflow="fold", no_wrap=col != "aliases")  # type: ignore[arg-type]
    for d in devices:
        half = d.peak_flops.get("bf16") or d.peak_flops.get("fp16")
        t.add_row(d.name, d.architecture, f"{d.peak('fp32') / 1e12:.3g}",
                  f"{half / 1e12:.3g}" if half else "",
                  format_bytes(d.memory_bytes, 3), format_si(d.memory_bandwidth, "B/s", 3),
                  str(d.sm_count), format_bytes(d.l2_bytes, 3), "\n".join(d.aliases))
    return t
