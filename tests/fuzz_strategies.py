"""Hypothesis strategies for the fuzz tests: networks, clusters and options, mostly
plausible, sometimes not (a kernel larger than its input, a prime device count, a batch
smaller than the devices, a wrong type, a huge or zero number)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: Values that no field should accept, drawn now and then in place of a good one.
WILD = st.sampled_from([0, -1, -7, 2**41, 1e300, -1e300, 0.5, "eight", None, True, [], {}])

DEVICES = ["H100-SXM", "A100-SXM-80GB", "V100-SXM2", "T4", "cori-knl", "P100-PCIe", "M40"]
# device counts: powers of two, primes, and anything
GPUS = st.one_of(st.sampled_from([1, 2, 3, 7, 8, 16, 31, 64, 97, 128, 256, 1009, 4096]),
                 st.integers(1, 4096))
BATCH = st.one_of(st.sampled_from([1, 2, 7, 32, 64, 512, 1024, 4096]), st.integers(1, 8192))


_COIN = st.integers(0, 999)


def _maybe_wild(draw: st.DrawFn, good: st.SearchStrategy[Any], p_wild: float = 0.02) -> Any:
    """A good value, or now and then (``p_wild``) one that no field should accept. The
    wild band of the coin sits mid-range: hypothesis favours 0 and the bounds."""
    if 480 <= draw(_COIN) < 480 + p_wild * 1000:
        return draw(WILD)
    return draw(good)


@st.composite
def _image_layer(draw: st.DrawFn, channels: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["conv2d", "conv2d", "conv2d", "relu", "batchnorm",
                                 "maxpool", "avgpool", "dropout", "residual"]))
    if kind == "conv2d":
        groups = draw(st.sampled_from([1, 1, 1, 2, 4]))
        layer: dict[str, Any] = {
            "type": "conv2d",
            "out_channels": _maybe_wild(draw, st.integers(1, 64).map(lambda c: c * groups)),
            "kernel": _maybe_wild(draw, st.integers(1, 7)),
            "stride": draw(st.integers(1, 3)),
            "padding": draw(st.one_of(st.integers(0, 3), st.just("same"))),
        }
        if groups > 1:
            layer["groups"] = groups
        if layer["padding"] == "same":
            layer["stride"] = 1
            layer["kernel"] = draw(st.sampled_from([1, 3, 5]))
        return layer
    if kind in ("maxpool", "avgpool"):
        return {"type": kind, "kernel": _maybe_wild(draw, st.integers(1, 4)),
                "stride": draw(st.integers(1, 3))}
    if kind == "dropout":
        return {"type": "dropout", "p": _maybe_wild(draw, st.floats(0, 1))}
    if kind == "residual":
        body = [{"type": "conv2d", "out_channels": channels, "kernel": 3, "padding": 1},
                {"type": "batchnorm"}, {"type": "relu"},
                {"type": "conv2d", "out_channels": draw(st.sampled_from([channels, 2 * channels])),
                 "kernel": 3, "padding": 1}]
        block: dict[str, Any] = {"type": "residual", "body": body, "activation": "relu"}
        if body[-1]["out_channels"] != channels or draw(st.booleans()):
            block["shortcut"] = [{"type": "conv2d", "out_channels": body[-1]["out_channels"],
                                  "kernel": 1}]
        return block
    return {"type": kind}


@st.composite
def network_data(draw: st.DrawFn, wide: bool | None = None) -> dict[str, Any]:
    """A network as plain data: a stack of image, sequence or vector layers, with a
    repeat group now and then (``wide``: sequences of wide layers only)."""
    kind = draw(st.sampled_from(["features", "features", "sequence"] if wide else
                                ["image", "image", "sequence", "tokens", "features"]))
    layers: list[dict[str, Any]] = []
    if kind == "image":
        c = draw(st.integers(1, 8))
        h = draw(st.integers(1, 64))
        shape: list[Any] = [c, h, draw(st.integers(1, 64))]
        for _ in range(draw(st.integers(1, 6))):
            layers.append(draw(_image_layer(c)))
            if layers[-1]["type"] == "conv2d" and isinstance(layers[-1]["out_channels"], int):
                c = layers[-1]["out_channels"]
        if draw(st.booleans()):
            layers.append({"type": "global_avgpool"})
        layers.append({"type": "flatten"})
    else:
        seq = draw(st.integers(1, 128))
        # wide layers (10^7..10^9 parameters) make memory the binding constraint
        wide = draw(st.booleans()) if wide is None else wide
        dim = draw(st.sampled_from([8192, 12288, 16384, 20000] if wide else
                                   [8, 16, 64, 96, 128, 4096]))
        if kind == "tokens":
            shape = [seq]
            layers.append({"type": "embedding", "vocab": draw(st.integers(2, 5000)), "dim": dim})
        elif kind == "sequence":
            shape = [seq, dim]
        else:
            shape = [dim]
        for _ in range(draw(st.integers(2 if wide else 0, 5))):
            choice = draw(st.sampled_from(["linear", "relu", "gelu", "layernorm", "attention",
                                           "dropout", "repeat", "rmsnorm", "gated", "moe"]))
            if choice in ("attention", "moe") and kind == "features":
                layers.append({"type": "relu"})  # attention needs a sequence
            elif choice == "moe":  # a mixture of experts: even, buffered or uneven
                experts = _maybe_wild(draw, st.sampled_from([2, 4, 8, 6]))
                top_k = draw(st.integers(1, 2))
                moe = {"type": "moe", "experts": experts, "top_k": top_k,
                       "ffn": draw(st.sampled_from([dim, 2 * dim, 7])),
                       "activation": draw(st.sampled_from(["swiglu", "gelu"]))}
                routing = draw(st.sampled_from(["even", "buffers", "uneven"]))
                if routing == "even":  # and two shared experts (no draw of its own)
                    moe["shared_experts"] = 2
                if routing == "buffers":
                    moe["capacity_factor"] = 1.25
                elif routing == "uneven" and isinstance(experts, int) \
                        and experts >= 2 * top_k:
                    moe["load_imbalance"] = 1.5
                layers.append(moe)
            elif choice == "attention":
                att = {"type": "attention",
                       "heads": _maybe_wild(draw, st.sampled_from([1, 2, 4, 8, 3])),
                       "causal": draw(st.booleans()), "flash": draw(st.booleans()),
                       "rotary": draw(st.booleans())}
                if att["causal"] and draw(st.booleans()):  # sliding-window attention
                    att["window"] = draw(st.integers(1, 2 * seq))
                layers.append(att)
            elif choice == "gated":  # a Llama MLP: fused gate and up, SwiGLU, down
                layers += [{"type": "linear", "out_features": 2 * dim},
                           {"type": draw(st.sampled_from(["swiglu", "geglu", "glu"]))},
                           {"type": "linear", "out_features": dim}]
            elif choice == "repeat":
                layers.append({"repeat": draw(st.integers(1, 3)), "name": "blk", "layers": [
                    {"type": "linear", "out_features": dim}, {"type": "gelu"}]})
            elif choice == "linear":
                layers.append({"type": "linear", "out_features": dim})
            else:
                layers.append({"type": choice})
    layers.append({"name": "head", "type": "linear",
                   "out_features": _maybe_wild(draw, st.one_of(st.integers(1, 4096),
                                                               st.just(65536)))})
    data: dict[str, Any] = {"kind": "network", "name": "fuzz",
                            "input": [_maybe_wild(draw, st.just(d), 0.01) for d in shape],
                            "dtype": draw(st.sampled_from(["float32", "bfloat16", "float16"])),
                            "layers": layers}
    return data


@st.composite
def cluster_data(draw: st.DrawFn, tight: bool = False) -> dict[str, Any]:
    """A cluster as plain data: tiers, devices per node, a catalog or inline device
    (``tight``: devices of 4 to 32 GiB, where memory decides the plan)."""
    per_node = _maybe_wild(draw, st.sampled_from([1, 2, 4, 8, 16]))
    data: dict[str, Any] = {"kind": "cluster", "name": "fuzz", "devices_per_node": per_node}
    if 400 <= draw(_COIN) < 600:
        data["nodes"] = _maybe_wild(draw, st.integers(1, 600))
    if tight:
        data["device"] = {"base": draw(st.sampled_from(["T4", "H100-SXM", "P100-PCIe"])),
                          "memory": draw(st.sampled_from(["4 GiB", "8 GiB", "16 GiB",
                                                          "32 GiB"]))}
    elif not 400 <= draw(_COIN) < 600:
        data["device"] = draw(st.sampled_from(DEVICES))
    else:
        data["device"] = {
            "peak_flops": {"fp32": _maybe_wild(draw, st.floats(1e9, 1e15)),
                           "bf16": draw(st.floats(1e9, 1e16))},
            "memory": _maybe_wild(draw, st.sampled_from(["1 GiB", "4 GiB", "16 GiB", "80 GiB"])),
            "memory_bandwidth": draw(st.sampled_from(["300 GB/s", "2 TB/s"])),
            "sm_count": draw(st.integers(1, 200)),
            "l2_cache": "40 MiB",
        }
    intra = {"latency": _maybe_wild(draw, st.sampled_from(["0 us", "2 us", "5.7 us"])),
             "bandwidth": _maybe_wild(draw, st.sampled_from(["6 GB/s", "450 GB/s", "15.75 GB/s"]))}
    inter = {"latency": draw(st.sampled_from(["2 us", "9.6 us", "20 us"])),
             "bandwidth": draw(st.sampled_from(["6 GB/s", "400 Gbit/s", "100 Gbit/s"]))}
    data["network"] = {"intra_node": intra, "inter_node": inter}
    data["collectives"] = {"algorithm": draw(st.sampled_from(
        ["auto", "ring", "tree", "recursive", "hierarchical"]))}
    if draw(st.booleans()):
        data["reserved_memory"] = draw(st.sampled_from(["0 B", "512 MiB", "1 GiB"]))
    return data


@st.composite
def options(draw: st.DrawFn, gpus: st.SearchStrategy[int] = GPUS,
            per_device: st.SearchStrategy[int] | None = None) -> dict[str, Any]:
    """The question besides the files (``per_device``: the batch is that many samples
    per device, else any)."""
    p = draw(gpus)
    return {
        "gpus": p,
        "batch": draw(BATCH) if per_device is None else p * draw(per_device),
        "cost_model": draw(st.sampled_from(["exact", "exact", "gholami2018"])),
        "overlap": draw(st.sampled_from(["gradients", "none"])),
        "optimizer": draw(st.sampled_from(["sgd", "momentum", "adam"])),
        "bucket_bytes": draw(st.sampled_from([0.0, 2.0**20, 25 * 2.0**20, 1e12])),
        "objective": draw(st.sampled_from(["time", "time", "comm"])),
        "pin_modes": draw(st.lists(st.sampled_from(["model", "data", "domain"]), max_size=1)),
        "pin_grid": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
        # sequence-parallel collectives overlapping their GEMMs (exact accounting only)
        "tp_comm_overlap": draw(st.booleans()),
        # context parallelism's keys and values (exact accounting only)
        "cp_comm_type": draw(st.sampled_from(["p2p", "allgather", "auto"])),
        # the loss's cross-entropy (its memory)
        "cross_entropy": draw(st.sampled_from(["fused", "eager", "eager-no-upcast"])),
    }
