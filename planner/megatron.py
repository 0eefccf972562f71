"""A plan as Megatron-LM's parallelism arguments: ``planner launch PLAN --emit megatron``.

Megatron-LM (Shoeybi et al. 2019; Narayanan et al., SC'21) splits every transformer
layer the same way: tensor parallelism ``T`` (with sequence parallelism for all of them
or none), context parallelism ``C``, expert parallelism ``E`` for the experts, pipeline
stages ``S`` of whole transformer layers and data parallelism over the rest, ranks
ordered tensor, context, data, pipeline (its default ``tp-cp-ep-dp-pp``: the tensor
group on consecutive ranks, the stages in blocks of ``P / S``). A plan whose layers all
agree on one such split is emitted as the arguments that run it; any other is refused
(exit 2) with what Megatron-LM cannot express and the command that prices its nearest
layout, so that nothing is launched that the plan did not price.

Mapping (each from the plan document alone):

* every linear layer ``column``/``row``, attention and token-table layer ``model`` over
  ``P_r = T`` → ``--tensor-model-parallel-size T``, all ``-sp`` → ``--sequence-parallel``;
  all ``domain`` over ``P_r = C`` → ``--context-parallel-size C`` with
  ``--cp-comm-type`` from the attention layers' terms (``p2p`` or ``all_gather``, one a
  layer where they differ), attention ``ulysses`` → ``a2a``; all ``data`` → neither;
  ``T`` (and ``C`` under ``a2a``) divides every attention layer's query and key/value
  heads, which the plan records (Megatron-LM's and Transformer Engine's checks);
* mixtures of experts split like the rest (their experts' hidden features over ``T``,
  Megatron-LM's expert tensor parallelism), or ``expert`` over ``P_r = E`` with every
  other layer data parallel → ``--expert-model-parallel-size E`` (with the all-to-all
  token dispatcher the cost model prices);
* ``S`` stages, ``V`` chunks a stage of equal numbers of transformer layers →
  ``--pipeline-model-parallel-size S`` (``--num-layers-per-virtual-pipeline-stage``
  with ``V > 1``); with ``V = 1`` a first and a last stage of other counts →
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``;
  any other split → ``--pipeline-model-parallel-layout`` (:func:`pipeline_layout`);
* the step's batch ``B`` in ``M`` microbatches over ``D = P / (T·C·S)`` replicas →
  ``--micro-batch-size B/(M·D) --global-batch-size B``;
* ZeRO 1 → ``--use-distributed-optimizer`` (within nodes, with
  ``--num-distributed-optimizer-instances``, the nodes of a stage); ``overlap: gradients`` →
  ``--overlap-grad-reduce``; ``overlap_param_gather`` → ``--overlap-param-gather``;
  ``tp_comm_overlap`` → ``--tp-comm-overlap`` (with sequence parallelism, the only
  collectives it overlaps);
* recomputing every residual block → ``--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1``; the first ``2k`` of a chunk →
  ``--recompute-method block --recompute-num-layers k`` (with ``--recompute-unit
  layers`` the plan counts layers, and prices Megatron-LM's one checkpoint a layer);
* mixtures of experts: ``--moe-grouped-gemm`` where a rank holds several experts,
  ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity`` for a
  capacity factor; refused under tensor parallelism without sequence parallelism, and
  with experts split over ranks in fp16 (Megatron-LM's assertions);
* a sequence context parallelism cannot cut into ``2·C`` equal chunks, or whose tokens a
  rank does not split evenly over ``T`` under sequence parallelism, is refused;
  ``export CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context parallelism;
* bf16 / fp16 → ``--bf16`` / ``--fp16`` (over fp32 master weights), bf16 gradients →
  ``--grad-reduce-in-bf16`` (Megatron-LM's default for bf16 is fp32), fp32 gradients for
  either → ``--accumulate-allreduce-grads-in-fp32``; fp64, fp32 weights with half
  gradients, or no master weights are refused; Adam → ``--optimizer adam``, momentum →
  ``--optimizer sgd`` (Megatron-LM's momentum 0.9), SGD → ``--sgd-momentum 0`` besides.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from .errors import Issue, UsageError, printable
from .fields import show
from .launch import cp_method
from .loading import Document
from .megatron_model import ModelArgs
from .network import DTYPE_BYTES, Network
from .units import count, format_time

#: the modes of each of Megatron-LM's splits
_TENSOR = {"column": False, "row": False, "model": False,
           "column-sp": True, "row-sp": True, "model-sp": True}
_CONTEXT = ("domain", "ulysses")
#: the baselines a plan document compares that Megatron-LM runs as they are priced
_BASELINES = ("megatron-sp", "megatron", "megatron-cp")


class NotMegatron(UsageError):
    """A plan Megatron-LM's arguments cannot express (exit 2)."""


def _refuse(plan_path: str, why: str, data: dict[str, Any],
            fix: str | None = None) -> NotMegatron:
    """The error for a plan that Megatron-LM cannot run as planned, with ``fix`` or the
    command that prices Megatron-LM's own layouts where the plan compared them."""
    if fix is not None:
        return NotMegatron(f"planner: error: {printable(plan_path)}: Megatron-LM cannot "
                           f"run this plan as planned: {why}; {fix}")
    bases = data.get("baselines")
    base = {b.get("name"): b for b in bases if isinstance(b, dict)} \
        if isinstance(bases, list) else {}
    it = data.get("iteration")
    it = it if isinstance(it, dict) else {}
    prob = data.get("problem")
    pipe = prob.get("pipeline") if isinstance(prob, dict) else None
    stages = pipe.get("stages") if isinstance(pipe, dict) else None
    staged = isinstance(stages, int) and not isinstance(stages, bool) and stages > 1
    # a pipelined plan's Megatron-LM baselines are priced on all devices without stages
    again = (f" --pipeline {stages} --microbatches {prob.get('microbatches', 1)} "
             "--stage-boundaries layers" if staged and isinstance(prob, dict) else "")
    hint = f"; price Megatron-LM's own layouts with `planner cost ...{again} --mode " \
           "megatron-sp --grid TxD` (or `--mode megatron`, or `--mode megatron-cp --grid " \
           "CxD` for context parallelism" + ("; the grid is a stage's TxD" if staged else "") \
           + ") and emit that plan"
    fitting = [b for b in (base.get(name) for name in _BASELINES)
               if b and isinstance(b.get("time_s"), float) and b.get("fits") is True]
    if fitting and isinstance(it.get("time_s"), float):
        b = min(fitting, key=lambda b: b["time_s"])
        hint += (" (this plan's fastest Megatron-LM baseline"
                 + (", on all its devices without stages" if staged else "")
                 + f", {b.get('name')}, {b.get('description', '')}: {format_time(b['time_s'])} a "
                 f"step against its {format_time(it['time_s'])})")
    return NotMegatron(f"planner: error: {printable(plan_path)}: Megatron-LM cannot run "
                       f"this plan as planned: {why}{hint}")


def _weighted(doc: Document) -> list[dict[str, Any]]:
    """The plan's layers with weights, each with a name, a mode, a grid of two whole
    numbers and a placement (an :class:`InputError` at the entry otherwise; that the
    layers are a list of mappings, :func:`planner.launch.launch_spec` has checked)."""
    issues, out = [], []
    for i, lay in enumerate(doc.data["layers"]):
        where = f"$.layers[{i}]"
        if lay.get("type") not in ("linear", "attention", "embedding", "moe", "conv2d"):
            continue
        grid = lay.get("grid")
        if not (isinstance(grid, list) and len(grid) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in grid)):
            issues.append(Issue(f"{where}.grid", f"expected [P_r, P_c], two whole numbers "
                                                 f">= 1, got {show(grid)}"))
        elif not isinstance(lay.get("mode"), str) or not isinstance(lay.get("name"), str):
            issues.append(Issue(where, "expected the layer's name and mode"))
        else:
            out.append(lay)
    if issues:
        raise doc.error(issues)
    return out


def _split(layers: list[dict[str, Any]], plan_path: str, data: dict[str, Any]
           ) -> tuple[int, int, int, bool, list[str]]:
    """(T, C, E, sequence parallel, the attention layers' context methods)."""
    conv = next((lay for lay in layers if lay.get("type") == "conv2d"), None)
    if conv is not None:
        raise _refuse(plan_path, f"layer '{conv.get('name')}' is a convolution; Megatron-LM "
                                 "trains transformers", data)
    kinds: dict[str, list[dict[str, Any]]] = {"tensor": [], "context": [], "expert": [],
                                              "data": []}
    for lay in layers:
        mode, pr = lay.get("mode"), (lay.get("grid") or [1, 1])[0]
        if pr > 1 and lay.get("placement") != "rows":
            raise _refuse(plan_path, f"layer '{lay.get('name')}' places its {mode} {pr}x"
                                     f"{lay['grid'][1]} grid by columns; Megatron-LM's "
                                     "groups are consecutive ranks", data)
        if pr == 1 or mode == "data":
            kinds["data"].append(lay)
        elif mode in _TENSOR and lay.get("type") == "linear" and mode.startswith("model"):
            raise _refuse(plan_path, f"layer '{lay.get('name')}' is {mode} {pr}x"
                                     f"{lay['grid'][1]}: its output split by features and "
                                     "all-gathered after it, where Megatron-LM's linear "
                                     "layers are column / row pairs (--mode megatron)", data)
        elif mode in _TENSOR:
            kinds["tensor"].append(lay)
        elif mode in _CONTEXT:
            kinds["context"].append(lay)
        elif mode in ("expert", "expert-sp") and lay.get("type") == "moe":
            kinds["expert"].append(lay)
        else:
            raise _refuse(plan_path, f"layer '{lay.get('name')}' is {mode} {pr}x"
                                     f"{lay['grid'][1]}, which Megatron-LM has no split "
                                     "for", data)

    pairing = _pairing(layers, kinds["tensor"])
    if pairing is not None:
        raise _refuse(plan_path, pairing, data)

    def one(group: list[dict[str, Any]], what: str) -> int:
        sizes = Counter(lay["grid"][0] for lay in group)
        if len(sizes) > 1:
            (a, _), (b, _) = sizes.most_common(2)
            la = next(lay for lay in group if lay["grid"][0] == a)
            lb = next(lay for lay in group if lay["grid"][0] == b)
            raise _refuse(plan_path, f"its {what} groups differ in size ('{la['name']}' "
                                     f"over {a}, '{lb['name']}' over {b}); Megatron-LM "
                                     "has one size for every layer", data)
        return next(iter(sizes)) if sizes else 1

    present = [k for k in ("tensor", "context", "expert", "data") if kinds[k]]
    if kinds["tensor"] and kinds["context"]:
        a, b = kinds["tensor"][0], kinds["context"][0]
        raise _refuse(plan_path, f"layer '{a['name']}' splits its features over "
                                 f"{a['grid'][0]} devices and '{b['name']}' its tokens over "
                                 f"{b['grid'][0]}; Megatron-LM's tensor and context "
                                 "parallelism are separate dimensions (T x C devices), "
                                 "each layer split by both", data)
    if kinds["data"] and (kinds["tensor"] or kinds["context"]):
        split = (kinds["tensor"] or kinds["context"])[0]
        d = kinds["data"][0]
        raise _refuse(plan_path, f"layer '{d['name']}' is data parallel where "
                                 f"'{split['name']}' is {split['mode']} "
                                 f"{split['grid'][0]}x{split['grid'][1]}; Megatron-LM splits "
                                 "every layer over the same group", data)
    if kinds["expert"] and present != ["expert", "data"] and present != ["expert"]:
        first = kinds["expert"][0]
        raise _refuse(plan_path, f"layer '{first['name']}' is expert-parallel beside tensor or "
                                 "context parallelism; emitted only with every other "
                                 "layer data parallel", data)
    t, c, e = one(kinds["tensor"], "tensor-parallel"), one(kinds["context"], "context"), \
        one(kinds["expert"], "expert-parallel")
    sp = {_TENSOR[lay["mode"]] for lay in kinds["tensor"]}
    if len(sp) > 1:
        n = sum(_TENSOR[lay["mode"]] for lay in kinds["tensor"])
        raise _refuse(plan_path, f"{n} of its {len(kinds['tensor'])} tensor-parallel layers "
                                 "are sequence-parallel; Megatron-LM's --sequence-parallel "
                                 "is for all of them or none", data)
    by_heads = kinds["tensor"] + kinds["context"]
    known = _network_heads(data, plan_path) if any(
        lay.get("type") == "attention" and "heads" not in lay for lay in by_heads) else {}
    for lay in by_heads:
        counts = known.get(str(lay.get("name")))
        recorded = {"heads": counts[0], "kv_heads": counts[1]} if counts else {}
        why = _heads({**recorded, **lay})
        if why is not None:
            raise _refuse(plan_path, why, data)
    cp = []
    for lay in kinds["context"]:
        if lay.get("type") != "attention":
            continue
        # Megatron-core and Transformer Engine spell the gathered method all_gather
        # (Megatron-LM's --help says allgather, which Transformer Engine rejects)
        method = cp_method(lay)
        cp.append("a2a" if lay["mode"] == "ulysses" else
                  "all_gather" if method == "allgather" else method)
    if kinds["context"] and "a2a" in cp and len(set(cp)) > 1:
        raise _refuse(plan_path, "some attention layers are DeepSpeed-Ulysses and some "
                                 "context-parallel; Megatron-LM runs one or the other "
                                 "(--cp-comm-type a2a, or p2p / all_gather)", data)
    return t, c, e, sp == {True}, cp


def _network_heads(data: dict[str, Any], plan_path: str) -> dict[str, tuple[int, int]]:
    """Each attention layer's query and key/value heads, by name, from the network file
    the plan names, for a plan that does not record them (made before 2026-11-28): where
    the file is found (:func:`_recorded_network`); empty otherwise, and then nothing is
    checked."""
    network = _recorded_network(data, plan_path)
    if network is None:
        return {}
    return {layer.name: (layer.attention.heads, layer.attention.kv_heads)
            for layer in network.layers if layer.attention is not None}


def _recorded_network(data: dict[str, Any], plan_path: str) -> Network | None:
    """The network the plan was made from: its file where the plan names it (relative
    to here, as the launch scripts name paths) or beside the plan, if it is still the
    one the plan was made from (its sha256); None otherwise."""
    from pathlib import Path

    from .errors import PlannerError
    from .inputs import load_network
    from .loading import file_digest

    inputs = data.get("inputs")
    entry = inputs.get("network") if isinstance(inputs, dict) else None
    name = entry.get("file") if isinstance(entry, dict) else None
    want = entry.get("sha256") if isinstance(entry, dict) else None
    if not (isinstance(name, str) and name not in ("", "-") and isinstance(want, str)):
        return None
    places = [Path(name), Path(plan_path).parent / name]
    try:
        found = next((p for p in places if p.is_file() and file_digest(str(p)) == want),
                     None)
        return None if found is None else load_network(str(found))
    except (OSError, PlannerError):
        return None


def _heads(lay: dict[str, Any]) -> str | None:
    """Why Megatron-LM cannot split an attention layer's heads as the plan does (None
    when it can, or the plan, from before plans recorded them, does not say): its tensor
    parallelism and Transformer Engine's all-to-all context parallelism (``--cp-comm-type
    a2a``) both give every device whole query and key/value heads, where the planner's
    DeepSpeed-Ulysses may send each key/value head to several devices."""
    heads, kv = lay.get("heads"), lay.get("kv_heads")
    if lay.get("type") != "attention" or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, kv)):
        return None
    assert isinstance(heads, int) and isinstance(kv, int)
    pr = lay["grid"][0]
    size = "context" if lay["mode"] in _CONTEXT else "tensor"
    if lay["mode"] == "domain" or (heads % pr == 0 and kv % pr == 0):
        return None
    return (f"layer '{lay.get('name')}' is {lay['mode']} {pr}x{lay['grid'][1]} with "
            f"{heads} query and {kv} key/value heads; Megatron-LM's {size}-parallel size "
            f"must divide both (num_attention_heads and num_query_groups"
            + (", which Transformer Engine's all-to-all checks" if size == "context" else "")
            + f"), and {pr} does not divide {kv if heads % pr == 0 else heads}")


def _pairing(layers: list[dict[str, Any]], tensor: list[dict[str, Any]]) -> str | None:
    """Why the tensor-parallel layers are not Megatron-LM's, or None: its linear layers
    are column / row pairs (a column's row partner the next layer with weights, the
    feature-wise layers between them following it), the output head a column alone (the
    last layer with weights: its logits stay split for the vocabulary-parallel loss);
    attention, embeddings and experts split by ``model`` (the layouts
    :func:`planner.strategies.megatron_modes` gives the ``megatron`` baselines)."""
    split = {id(lay) for lay in tensor}
    open_column: dict[str, Any] | None = None

    def grid(lay: dict[str, Any]) -> str:
        return f"{lay['mode']} {lay['grid'][0]}x{lay['grid'][1]}"

    for lay in layers:
        base = lay["mode"].removesuffix("-sp") if id(lay) in split else None
        if open_column is not None:
            if lay.get("type") == "linear" and base == "row":
                open_column = None
                continue
            return (f"layer '{open_column['name']}' is {grid(open_column)} but the next "
                    f"layer with weights, '{lay['name']}', is {grid(lay)}, not its row "
                    "partner; Megatron-LM's linear layers are column / row pairs (only "
                    "the output head, the last layer, is a column alone)")
        if base is None:
            continue
        if lay.get("type") != "linear":
            if base != "model":
                return (f"layer '{lay['name']}' ({lay.get('type')}) is {grid(lay)}; "
                        "Megatron-LM splits attention, embeddings and experts by heads, "
                        "vocabulary or hidden features (model)")
        elif base == "column":
            open_column = lay
        else:  # a row with no column before it
            return (f"layer '{lay['name']}' is {grid(lay)} with no column layer before "
                    "it; Megatron-LM's linear layers are column / row pairs")
    return None


def _chunks(data: dict[str, Any], stages: int, virtual: int, plan_path: str
            ) -> list[int]:
    """The transformer layers (attention layers) of each model chunk in network order,
    checking that each chunk starts where a transformer layer does (its first layer with
    weights is attention, after a residual add that closes a block without one)."""
    layers = [lay for lay in data.get("layers") or [] if isinstance(lay, dict)]
    if stages == 1:
        return [sum(lay.get("type") == "attention" for lay in layers)]
    order = [(s, k) for k in range(virtual) for s in range(stages)]
    pos = {sk: i for i, sk in enumerate(order)}
    counts = [0] * len(order)
    members: list[list[dict[str, Any]]] = [[] for _ in order]
    for lay in layers:
        i = pos.get((lay.get("stage", 0), lay.get("chunk", 0)))
        if i is None:
            raise _refuse(plan_path, f"layer '{lay.get('name')}' names no stage of the "
                                     "pipeline", data)
        members[i].append(lay)
        counts[i] += lay.get("type") == "attention"
    for i in range(1, len(order)):
        before, chunk = members[i - 1], members[i]
        first = next((lay for lay in chunk if lay.get("type") in
                      ("linear", "attention", "embedding", "moe")), None)
        last_weighted = next((lay for lay in reversed(before) if lay.get("type") in
                              ("linear", "attention", "embedding", "moe")), None)
        whole = first is not None and first.get("type") == "attention" and before \
            and before[-1].get("type") == "add" and (last_weighted is None or
                                                     last_weighted.get("type") != "attention")
        if not whole:
            s, k = order[i]
            where = f"stage {s}" + (f" chunk {k}" if virtual > 1 else "")
            start = chunk[0].get("name") if chunk else "?"
            raise _refuse(plan_path, f"{where} starts at '{start}', "
                                     "inside a transformer layer; Megatron-LM's stages hold "
                                     "whole layers (make the plan with --stage-boundaries "
                                     "layers)", data)
    return counts


def _precision(prob: dict[str, Any], plan_path: str, data: dict[str, Any]) -> list[str]:
    """The dtype arguments: Megatron-LM trains fp32, or bf16 / fp16 weights over fp32
    master weights. For bf16 it reduces and accumulates the gradients in fp32 unless
    told ``--grad-reduce-in-bf16``; for fp16 in fp16 unless told
    ``--accumulate-allreduce-grads-in-fp32``. Any other mix is refused."""
    dtype = prob.get("dtype", "float32")
    grad = prob.get("grad_dtype", dtype)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise _refuse(plan_path, f"its weights are {dtype}; Megatron-LM trains in fp32, "
                                 "bf16 or fp16", data)
    if dtype == "float32":
        if grad != "float32":
            raise _refuse(plan_path, f"its gradients are {grad} under fp32 weights; "
                                     "Megatron-LM keeps fp32 weights' gradients in fp32 "
                                     "(--grad-precision fp32)", data)
        return []
    if prob.get("master_weights") is False:
        raise _refuse(plan_path, f"it keeps no fp32 master weights for its {dtype} "
                                 "weights; Megatron-LM's mixed-precision optimizer always "
                                 "does (drop --no-master-weights)", data)
    if grad not in ("float32", dtype):
        raise _refuse(plan_path, f"its gradients are {grad} under {dtype} weights; "
                                 f"Megatron-LM reduces them in fp32 or {dtype}", data)
    if dtype == "bfloat16":
        return ["--bf16"] + (["--grad-reduce-in-bf16"] if grad == dtype else
                             ["--accumulate-allreduce-grads-in-fp32"])
    return ["--fp16"] + (["--accumulate-allreduce-grads-in-fp32"] if grad == "float32"
                         else [])


def megatron_args(doc: Document, plan_path: str) -> str:
    """The lines ``--emit megatron`` prints (a bash array), or :class:`NotMegatron`."""
    data = doc.data
    assert isinstance(data, dict)  # launch_spec read its placement
    prob = data.get("problem")
    prob = prob if isinstance(prob, dict) else {}
    world = int(data["placement"]["devices"])
    pipe = prob.get("pipeline") or {}
    stages, virtual = int(pipe.get("stages", 1)), int(pipe.get("virtual_stages", 1))
    if pipe.get("schedule") == "zb-h1":
        raise _refuse(plan_path, "its pipeline runs ZB-H1, which Megatron-LM does not "
                                 "schedule", data)
    weighted = _weighted(doc)
    t, c, e, sp, cp = _split(weighted, plan_path, data)
    _check_sequence(weighted, t, c, sp, plan_path, data)
    _check_features(weighted, t, plan_path, data)
    moe = [lay for lay in weighted if lay.get("type") == "moe"]
    if moe and t > 1 and not sp:
        raise _refuse(plan_path, f"its mixture of experts runs under tensor parallelism "
                                 f"over {t} ranks without sequence parallelism, which "
                                 "Megatron-LM refuses (\"When using MoE and tensor "
                                 "parallelism, sequence parallelism must be used\")", data)
    if e > 1 and prob.get("dtype") == "float16":
        raise _refuse(plan_path, "its experts are split over ranks in fp16, which "
                                 "Megatron-LM refuses (\"Expert parallelism is not "
                                 "supported with fp16 training\"); plan it in bf16", data)
    batch, micro = prob.get("batch"), prob.get("microbatches", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise doc.error([Issue("$.problem.batch", f"expected the step's samples, a whole "
                                                  f"number >= 1, got {show(batch)}")])
    if int(prob.get("zero", 0)) not in (0, 1) or (prob.get("zero") and
                                                  prob.get("zero_shard", "all")
                                                  not in ("all", "node")):
        raise _refuse(plan_path, f"ZeRO stage {prob.get('zero')}"
                                 + (" within nodes" if prob.get("zero_shard") == "node"
                                    else "")
                                 + "; Megatron-LM's distributed optimizer shards the "
                                   "optimizer state over the replicas (stage 1)", data)
    instances = _optimizer_instances(data, prob, world // stages, t * c, e, plan_path)
    counts = _chunks(data, stages, virtual, plan_path)
    args: list[str] = [f"--tensor-model-parallel-size {t}"]
    if sp:
        args.append("--sequence-parallel")
    args.append(f"--pipeline-model-parallel-size {stages}")
    layout = None
    if virtual > 1:
        if len(set(counts)) > 1:
            layout = pipeline_layout(counts)
        else:
            args.append(f"--num-layers-per-virtual-pipeline-stage {counts[0]}")
    elif stages > 1 and len(set(counts)) > 1:
        if len(set(counts[1:-1])) > 1:
            layout = pipeline_layout(counts)
        else:
            args += [f"--decoder-first-pipeline-num-layers {counts[0]}",
                     f"--decoder-last-pipeline-num-layers {counts[-1]}"]
    if layout is not None:
        # quoted as one word in the array below
        args.append(f"--pipeline-model-parallel-layout {layout}")
    args.append(f"--context-parallel-size {c}")
    if cp:
        types = cp[0] if len(set(cp)) == 1 else " ".join(cp)
        args.append(f"--cp-comm-type {types}")
    if e > 1:  # the tokens exchanged all-to-all, as priced
        args += [f"--expert-model-parallel-size {e}", "--moe-token-dispatcher-type alltoall"]
    args += _moe_args(moe, e, str(prob.get("dtype", "float32")))
    replicas = world // (stages * t * c)
    if batch % (micro * replicas):
        raise _refuse(plan_path, f"its {micro} microbatches of {batch} samples do not "
                                 f"split evenly over {replicas} data-parallel replicas", data)
    args += [f"--micro-batch-size {batch // (micro * replicas)}",
             f"--global-batch-size {batch}"]
    if prob.get("zero") == 1:
        args.append("--use-distributed-optimizer")
        if instances > 1:
            args.append(f"--num-distributed-optimizer-instances {instances}")
    if prob.get("overlap") == "gradients":
        args.append("--overlap-grad-reduce")
        # the buckets as priced, in gradient elements (Megatron-LM's default is
        # max(40M, 1M x replicas) parameters, not the 25 MiB of PyTorch DDP the planner's
        # --bucket-size defaults to); one bucket a layer (0) has no such setting
        bucket = prob.get("bucket_bytes", 0)
        grad = DTYPE_BYTES.get(str(prob.get("grad_dtype", prob.get("dtype", "float32"))), 4)
        if isinstance(bucket, int | float) and bucket > 0:
            args.append(f"--ddp-bucket-size {max(1, int(bucket) // grad)}")
    if prob.get("overlap_param_gather"):
        args.append("--overlap-param-gather")
    if prob.get("tp_comm_overlap") and sp:
        # Megatron-LM overlaps only sequence parallelism's collectives (and refuses the
        # flag without it); the plan's overlap prices those alone, so without
        # sequence-parallel layers it changed nothing
        args.append("--tp-comm-overlap")
    args += _recompute(data, prob, plan_path)
    args += _precision(prob, plan_path, data)
    opt = prob.get("optimizer", "momentum")  # the planner's default (launch_spec read it)
    args += ["--optimizer adam"] if opt == "adam" else \
        ["--optimizer sgd"] + (["--sgd-momentum 0"] if opt == "sgd" else [])
    inputs = data.get("inputs")
    net = inputs.get("network") if isinstance(inputs, dict) else None
    called = net.get("name") if isinstance(net, dict) else None
    name = printable(called) if isinstance(called, str) else "plan"
    layers = sum(counts)
    head = [f"# planner launch: Megatron-LM's parallelism arguments for "
            f"{printable(plan_path)} ({name})",
            f"# {count(world, 'rank')}: tensor {t} x context {c} x pipeline {stages} x data "
            f"{replicas}" + (f", experts over {e} of the data-parallel ranks" if e > 1 else "")]
    model = _model(data, plan_path, layers)
    if model is None or model.refused is not None:
        why = ("its network file is not found here or beside the plan, or has changed"
               if model is None else f"the network is not Megatron-LM's GPT model: "
                                     f"{model.refused}")
        head.append(f"# the model's own arguments are yours to add ({layers} transformer "
                    f"layers: --num-layers {layers}, and its widths; {why})")
    else:
        head.append("# PLANNER_MEGATRON_MODEL_ARGS: the network's own arguments, from its "
                    "file, which does not say:")
        head += [f"#   {printable(note)}" for note in model.notes]
    if stages > 1 and "--overlap-grad-reduce" in args:
        head.append("# Megatron-LM buckets the gradients of the first pipeline stage (and "
                    "model chunk) only;")
        head.append("# the others reduce theirs in one bucket after their last backward "
                    "pass (the plan prices buckets on every stage)")
    env = []
    if t > 1 or c > 1:
        # Megatron-LM's validate_args asserts it with tensor or context parallelism on
        # GPUs before Blackwell (the order of the communication kernels it queues is
        # what its overlap relies on)
        env = ["# Megatron-LM requires this with tensor or context parallelism (before "
               "Blackwell GPUs)", "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    def array(name: str, values: list[str]) -> list[str]:
        return [f"{name}=("] + [f"  {' '.join(shlex.quote(w) for w in a.split())}"
                               for a in values] + [")"]

    body = array("PLANNER_MEGATRON_ARGS", args)
    if model is not None and model.refused is None:
        body += array("PLANNER_MEGATRON_MODEL_ARGS", model.args)
    return "\n".join(head + env + body) + "\n"


def _model(data: dict[str, Any], plan_path: str, layers: int) -> ModelArgs | None:
    """The network's model arguments (:mod:`planner.megatron_model`), where its file is
    found unchanged; None otherwise."""
    from .megatron_model import model_args

    network = _recorded_network(data, plan_path)
    if network is None:
        return None
    model = model_args(network)
    if model.refused is None and f"--num-layers {layers}" not in model.args:
        # the plan's chunks count the same attention layers: never seen, but a model
        # that disagrees with the stages must not be emitted beside them
        model.refused = f"its attention layers are not the plan's {layers}"
    return model


def _check_sequence(layers: list[dict[str, Any]], t: int, c: int, sp: bool, plan_path: str,
                    data: dict[str, Any]) -> None:
    """Refuse a plan whose sequence Megatron-LM cannot split as it was priced: context
    parallelism cuts each sequence into ``2·C`` equal chunks (two a rank, for the causal
    mask's balance; it asserts ``seq_length % (2·C) == 0``), and sequence parallelism
    splits each rank's ``seq / C`` tokens evenly over the ``T`` tensor-parallel ranks.
    The planner prices a ragged split as its busiest rank's ``⌈s / P_r⌉``. Plans made
    before they recorded each attention layer's ``seq`` (2026-12-07) are not checked."""
    seqs = sorted({int(lay["seq"]) for lay in layers if lay.get("type") == "attention"
                   and isinstance(lay.get("seq"), int) and not isinstance(lay["seq"], bool)})
    for s in seqs:
        if c > 1 and s % (2 * c):
            raise _refuse(plan_path, f"its {s:,}-token sequences do not split into "
                                     f"{2 * c} equal chunks, as Megatron-LM's context "
                                     f"parallelism over {c} ranks cuts them (2 a rank)", data)
        if sp and (s // c) % t:
            raise _refuse(plan_path, f"its {s // c:,} tokens a context-parallel rank do "
                                     f"not split evenly over the {t} ranks of sequence "
                                     "parallelism", data)


def pipeline_layout(counts: list[int]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` for chunks of ``counts``
    transformer layers in network order (chunk ``k`` of stage ``s`` is the
    ``(k·S + s)``-th, as Megatron-LM numbers its virtual stages): chunks split by ``|``,
    ``t*n`` for ``n`` transformer layers, the embedding ``E`` in the first and the loss
    ``L`` (the output head's) in the last; an experimental argument of Megatron-core
    (2025) that takes any split, where the older ones take equal chunks, or equal
    stages but the first and the last."""
    def layers(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    parts = [layers(n) for n in counts]
    parts[0] = "E" + parts[0]
    parts[-1] = ",".join(p for p in (parts[-1], "L") if p)
    return "|".join(parts)


def _optimizer_instances(data: dict[str, Any], prob: dict[str, Any], stage_ranks: int,
                         tc: int, e: int, plan_path: str) -> int:
    """Megatron-LM's ``--num-distributed-optimizer-instances`` for ZeRO 1 sharded within
    nodes (``--zero-shard node``): it cuts each data-parallel group (with the context
    ranks) into that many consecutive slices, reduce-scatters the gradients and gathers
    the parameters within a slice and all-reduces the shards across slices, as the plan
    priced, when a slice is a node's replicas: ``(devices of a stage) / (devices a
    node)`` instances, each node holding whole ``T × C`` groups. 1 where the state is
    sharded over all replicas (or a stage fits in one node)."""
    if prob.get("zero") != 1 or prob.get("zero_shard", "all") != "node":
        return 1
    per_node = data["placement"].get("devices_per_node")
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        return 1  # launch_spec has refused it
    if stage_ranks <= per_node:
        return 1
    if stage_ranks % per_node or per_node % tc:
        raise _refuse(plan_path, f"ZeRO stage 1 within nodes of {per_node} devices, where "
                                 f"a stage's {stage_ranks} ranks in groups of {tc} do not "
                                 "fill whole nodes; Megatron-LM's optimizer instances are "
                                 "equal slices of each data-parallel group", data)
    if e > 1:
        raise _refuse(plan_path, "ZeRO stage 1 within nodes with expert parallelism, which "
                                 "Megatron-LM refuses (\"Partial DistOpt cannot support MoE "
                                 "models with expert parallelism\")", data)
    return stage_ranks // per_node


def _check_features(layers: list[dict[str, Any]], t: int, plan_path: str,
                    data: dict[str, Any]) -> None:
    """Refuse a tensor-parallel linear layer whose split Megatron-LM cannot make: its
    column-parallel layers split the output features and its row-parallel ones the input
    features into ``T`` equal shards (``divide`` asserts it; Transformer Engine's
    ``Linear`` checks the same), where the planner prices a ragged split as its busiest
    shard. The output head is padded instead. Plans made before they recorded the
    features (2026-12-07) are not checked."""
    if t <= 1:
        return
    linear = [lay for lay in layers if lay.get("type") == "linear"]
    # the last is the output head, whose vocabulary Megatron-LM pads to a multiple of
    # 128·T (--make-vocab-size-divisible-by): GPT-2's 50,257 tokens run as 50,304 at T=2
    for lay in linear[:-1]:
        if lay.get("mode") not in _TENSOR:
            continue
        key = "in_features" if lay["mode"].startswith("row") else "out_features"
        n = lay.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n % t:
            what = "input" if key == "in_features" else "output"
            raise _refuse(plan_path, f"layer '{lay.get('name')}' is {lay['mode']} over {t} "
                                     f"ranks, and its {n:,} {what} features do not split "
                                     f"evenly over them; Megatron-LM's "
                                     f"{'row' if key == 'in_features' else 'column'}-parallel"
                                     " linear layers take equal shards", data,
                                     f"price a tensor-parallel size that divides {n:,} "
                                     "(`--grid TxD`), or a width that "
                                     f"{t} divides")


def _moe_args(moe: list[dict[str, Any]], e: int, dtype: str) -> list[str]:
    """Megatron-LM's arguments for the mixture of experts the plan priced: a grouped
    GEMM over a rank's experts where it holds several (the cost model times them as one
    batched product; in bf16, the one dtype every Megatron-LM version runs it in), and a
    capacity factor with the buffers padded to it (the cost model runs the kernels and
    all-to-alls on whole buffers), where the network gives one (one value for all
    layers)."""
    if not moe:
        return []
    out = []
    experts = {lay.get("experts") for lay in moe}
    if dtype == "bfloat16" and any(isinstance(x, int) and x // max(e, 1) > 1
                                   for x in experts):
        out.append("--moe-grouped-gemm")
    factors = sorted({float(lay["capacity_factor"]) for lay in moe
                      if isinstance(lay.get("capacity_factor"), int | float)})
    if factors:
        out += [f"--moe-expert-capacity-factor {factors[-1]:g}",
                "--moe-pad-expert-input-to-capacity"]
    return out


def _recompute(data: dict[str, Any], prob: dict[str, Any], plan_path: str) -> list[str]:
    """Megatron-LM's recomputation of whole transformer layers (two residual blocks)."""
    # a pipeline's chunks record their own where each chose (--recompute auto); else
    # every chunk takes the problem's, as Megatron-LM's stages do
    pipe = data.get("pipeline")
    stage_plans = pipe.get("stage_plans") if isinstance(pipe, dict) else None
    plans = [st for st in stage_plans if isinstance(st, dict) and "recompute" in st] \
        if isinstance(stage_plans, list) else []
    settings = {str(st["recompute"]) for st in plans} if plans \
        else {str(prob.get("recompute", "none"))}
    if settings <= {"none", "0"}:
        return []
    if settings == {"blocks"}:
        return ["--recompute-granularity full", "--recompute-method uniform",
                "--recompute-num-layers 1"]
    # counted in layers (--recompute-unit layers: what Megatron-LM keeps), or in residual
    # blocks, two a layer (their checkpoints priced, one a block: the safe side)
    per_layer = 1 if prob.get("recompute_unit") == "layers" else 2
    if len(settings) == 1 and next(iter(settings)).isdigit() \
            and int(next(iter(settings))) % per_layer == 0:
        return ["--recompute-granularity full", "--recompute-method block",
                f"--recompute-num-layers {int(next(iter(settings))) // per_layer}"]
    what = "layers" if per_layer == 1 else "residual blocks"
    raise _refuse(plan_path, f"it recomputes {', '.join(sorted(settings))} {what} a chunk; "
                             "Megatron-LM recomputes the same number of whole transformer "
                             "layers" + (" (two blocks each)" if per_layer == 2 else "")
                  + " in every chunk", data)
