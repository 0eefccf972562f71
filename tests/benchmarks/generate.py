"""Generate large networks for the speed benchmarks (not a test module).

``python tests/benchmarks/generate.py transformer 1000 OUT.yaml`` writes a decoder stack of
exactly 1,000 layers (an embedding, learned positions, then blocks of
layernorm → attention → dropout → add → layernorm → linear → gelu → linear → dropout → add,
and a final layernorm and head); ``mlp N OUT.yaml`` writes N layers alternating linear and
ReLU with varying widths (every linear layer a different shape, so nothing is shared).
"""

from __future__ import annotations

import sys


def transformer(layers: int, width: int = 1024, heads: int = 16, seq: int = 1024) -> str:
    blocks = (layers - 4) // 10
    extra = layers - 4 - 10 * blocks
    out = [
        "kind: network",
        f"name: transformer-{layers}",
        f"input: [{seq}]",
        "dtype: bfloat16",
        "layers:",
        f"  - {{name: wte, type: embedding, vocab: 32000, dim: {width}}}",
        f"  - {{name: wpe, type: positional_embedding, positions: {seq}}}",
        f"  - repeat: {blocks}",
        "    name: h",
        "    layers:",
        "      - name: attn",
        "        type: residual",
        "        body:",
        "          - {type: layernorm}",
        f"          - {{type: attention, heads: {heads}, causal: true, flash: true}}",
        "          - {type: dropout, p: 0.1}",
        "      - name: mlp",
        "        type: residual",
        "        body:",
        "          - {type: layernorm}",
        f"          - {{type: linear, out_features: {4 * width}}}",
        "          - {type: gelu}",
        f"          - {{type: linear, out_features: {width}}}",
        "          - {type: dropout, p: 0.1}",
    ]
    for i in range(extra):
        out.append(f"  - {{name: pad{i}, type: identity}}")
    out += ["  - {name: ln_f, type: layernorm}",
            "  - {name: head, type: linear, out_features: 32000, bias: false, tie: wte}"]
    return "\n".join(out) + "\n"


def mlp(layers: int) -> str:
    out = ["kind: network", f"name: mlp-{layers}", "input: [1024]", "dtype: float32",
           "layers:"]
    for i in range(layers // 2):
        width = 1024 + 64 * (i % 97)
        out.append(f"  - {{name: fc{i}, type: linear, out_features: {width}}}")
        out.append(f"  - {{name: relu{i}, type: relu}}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    kind, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    text = transformer(n) if kind == "transformer" else mlp(n)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
