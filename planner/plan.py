"""The plan document: what ``planner cost`` and ``planner plan`` write, as plain data
(for YAML/JSON) and as a rich table for a person.

Schema (every time in seconds, every size in bytes; sizes are whole numbers of bytes,
other floats rounded to 4 significant digits, so the same inputs give byte-identical
files)::

    planner: VERSION
    command: cost | plan
    inputs:
      network: {file, name, sha256}
      cluster: {file, name, sha256}
    problem: {gpus, batch, dtype, cost_model, overlap, bucket_bytes, optimizer,
              master_weights, grad_dtype, zero, zero_shard (with zero 1-3: all|node), recompute,
              tp_comm_overlap, overlap_param_gather (when true), cp_comm_type
              (allgather|auto; p2p when absent), cross_entropy (eager|eager-no-upcast;
              fused when absent),
              estimator, algorithm, nodes}
    iteration: {time_s, compute_s, comm_s, exposed_comm_s, forward_s, backward_s,
                optimizer_s, weight_grad_s, activation_comm_s, parameters_comm_s,
                recompute_s, samples_per_s, model_flops, tflops_per_device, mfu}
                # model_flops: the network's training FLOPs a step, 3x its forward
                # FLOPs (recomputation not counted); mfu: tflops_per_device over the
                # device's dense peak in the network's dtype
    memory: {peak_bytes, capacity_bytes, fits, breakdown: {weights, gradients, optimizer,
             activations, comm_buffers, workspace}}
    layers:                       # every layer, in execution order
      - name, type, mode (data|model|domain|column|row), grid: [P_r, P_c], placement (rows|cols),
        follows (for layers without weights: whose layout they follow),
        compute_s, compute: {forward_s, backward_s, estimator},
        comm: {forward_s, backward_data_s, weight_grad_s, redistribute_s, parameters_s,
               recompute_s,
               terms: [{phase, collective, group, per_node, bytes, seconds, algorithm, note,
                        exposed_s (overlapping its layer's GEMM, or attention under
                        context parallelism's p2p ring: what the pass pays)}]},
               # per_node: the group's ranks in each node it touches; where they do not
               # fill their nodes evenly (12 on 8-GPU nodes: 8 + 4), the fewest (4)
        memory: {params_bytes, activation_bytes}   # params_bytes: what this device keeps

    ZeRO (``problem.zero`` 1-3) turns each weight-gradient all-reduce into a reduce-scatter
    and adds ``parameters`` terms: an all-gather after the optimizer step (stages 1-2), or
    before the forward and the backward (stage 3). Sharded within nodes
    (``problem.zero_shard`` node) the reduction is a ``hybrid_reduce`` (a reduce-scatter in
    the node, an all-reduce of the shard across nodes) and the gathers stay in the node.
    Recomputation (``problem.recompute`` blocks) adds ``recompute`` terms, a block's
    forward collectives run again in its backward; the forward compute run again is in
    ``compute.backward_s``, and ``iteration.recompute_s`` totals both.
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .cluster import Device
from .costs.layer import CommTerm, held
from .costs.memory import ParamBytes, uses_master_weights
from .evaluate import (
    Evaluation,
    LayerResult,
    Options,
    grad_dtype,
    question_param_bytes,
    zero_label,
)
from .loading import file_digest
from .network import DTYPE_PEAK_KEY, Network
from .output import rounded
from .units import count, format_bytes, format_rate, format_time


def _term(t: CommTerm) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "phase": t.phase,
        "collective": t.collective,
        "group": t.group.size,
        "per_node": t.group.per_node,
        "bytes": t.bytes,
        "seconds": t.seconds,
        "algorithm": t.algorithm,
    }
    if t.note:
        rec["note"] = t.note
    if t.exposed_s is not None:  # overlapping its GEMM: what the critical path pays
        rec["exposed_s"] = t.exposed_s
    return rec


def layer_record(r: LayerResult, pb: ParamBytes, zero: int = 0) -> dict[str, Any]:
    """One layer of the plan document (``pb``: the bytes per parameter before ZeRO)."""
    c = r.cost
    pb = held(pb, zero, c.terms)
    rec: dict[str, Any] = {
        "name": r.layer.name,
        "type": r.layer.type,
    }
    a = r.layer.attention
    if a is not None:  # what a launcher checks a head split against (whole heads)
        rec["heads"], rec["kv_heads"] = a.heads, a.kv_heads
        rec["seq"] = a.seq  # and a sequence split against (Megatron-LM's even chunks)
        if a.windowed:
            rec["window"] = a.window
    lin = r.layer.linear
    if lin is not None:  # what a launcher checks a feature split against (even shards)
        rec["in_features"], rec["out_features"] = lin.in_features, lin.out_features
    m = r.layer.moe
    if m is not None:  # what a launcher's MoE arguments say
        rec["experts"], rec["top_k"] = m.experts, m.top_k
        if m.capacity_factor is not None:
            rec["capacity_factor"] = m.capacity_factor
    rec.update(mode=r.layout.mode, grid=[r.layout.pr, r.layout.pc],
               placement=r.layout.placement)
    if r.follows is not None:
        rec["follows"] = r.follows
    rec["compute_s"] = c.compute_s
    rec["compute"] = {"forward_s": c.forward_s, "backward_s": c.backward_s,
                      "estimator": c.estimator or "none"}
    rec["comm"] = {
        "forward_s": c.comm("forward"),
        "backward_data_s": c.comm("backward_data"),
        "weight_grad_s": c.comm("weight_grad"),
        "redistribute_s": c.comm("redistribute"),
        "parameters_s": c.comm("parameters"),
        "recompute_s": c.comm("recompute"),
        "terms": [_term(t) for t in c.terms],
    }
    rec["memory"] = {"params_bytes": c.params_local * pb.total,
                     "activation_bytes": r.activation_bytes}
    return rec


def utilisation(network: Network, device: Device, gpus: int, batch: int,
                time_s: float) -> dict[str, Any]:
    """Model FLOPs utilisation (MFU, Chowdhery et al., "PaLM", 2022, Appendix B): the
    FLOPs the network needs for a step of ``batch`` samples, three times its forward
    FLOPs (the backward pass twice the forward's: the input's and the weights'
    gradients), over ``time_s`` and ``gpus`` devices, and that rate over the device's
    dense peak in the network's dtype. Recomputed forwards and the optimizer are not
    counted: they are work the plan chose, not the network's. The forward FLOPs are
    ``planner show``'s: 2 a multiply-accumulate plus elementwise arithmetic, and a
    causal attention's masked half not counted, whatever its kernel (an unfused kernel
    computes it and masks it: time the plan pays, not FLOPs the model needs)."""
    flops = 3 * network.flops * batch
    rate = flops / time_s / gpus if time_s > 0 and gpus > 0 else 0.0
    return {"model_flops": flops, "tflops_per_device": rate / 1e12,
            "mfu": rate / device.peak(DTYPE_PEAK_KEY[network.dtype])}


def iteration_record(ev: Evaluation, network: Network, device: Device, options: Options
                     ) -> dict[str, Any]:
    """The iteration summary, with the step's :func:`utilisation`."""
    batch = options.step_batch
    return {
        "time_s": ev.time_s,
        "compute_s": ev.compute_s,
        "comm_s": ev.comm_s,
        "exposed_comm_s": ev.exposed_comm_s,
        "forward_s": ev.forward_s,
        "backward_s": ev.backward_s,
        "optimizer_s": ev.optimizer_s,
        "weight_grad_s": ev.weight_grad_s * ev.reductions,
        "activation_comm_s": ev.activation_comm_s,
        "parameters_comm_s": ev.parameters_s,
        "recompute_s": ev.recompute_s,
        "samples_per_s": batch / ev.time_s if ev.time_s > 0 else 0.0,
        **utilisation(network, device, options.gpus, batch, ev.time_s),
    }


#: the ``problem.algorithm`` of a plan priced with the cluster file's collective algorithm
DEFAULT_ALGORITHM = "cluster default"


def problem_record(network: Network, options: Options) -> dict[str, Any]:
    """The question a plan answers (its ``problem`` section, less the estimator, the
    algorithm and the node count): ``planner check`` compares a plan's with its
    configuration's."""
    return {
        "gpus": options.gpus,
        "batch": options.step_batch,
        # gradient accumulation only where there is some (a plan without it reads the same)
        **({"microbatches": options.microbatches} if options.microbatches > 1 else {}),
        "dtype": network.dtype,
        "cost_model": options.cost_model,
        "overlap": options.overlap,
        "bucket_bytes": options.bucket_bytes,
        "optimizer": options.optimizer,
        "master_weights": uses_master_weights(network.elem_bytes, options.master_weights),
        "grad_dtype": grad_dtype(network, options),
        "zero": options.zero,
        # ZeRO's sharding only where there is ZeRO (a plan without it reads the same)
        **({"zero_shard": options.zero_shard} if options.zero else {}),
        "recompute": options.recompute,
        # what recomputation re-runs, where it re-runs anything and not by residual block
        **({"recompute_unit": "layers"} if network.recompute_unit == "layers"
           and options.recompute != "none" else {}),
        # the overlap only where it is asked for (a plan without it reads the same)
        **({"tp_comm_overlap": True} if options.tp_comm_overlap else {}),
        **({"overlap_param_gather": True} if options.overlap_param_gather else {}),
        # context parallelism's method where it is not Megatron-LM's default ring
        **({"cp_comm_type": options.cp_comm_type} if options.cp_comm_type != "p2p" else {}),
        # the loss's memory where it is not the fused default (a plan without it reads the same)
        **({"cross_entropy": options.cross_entropy}
           if options.cross_entropy != "fused" else {}),
    }


def plan_header(command: str, network: Network, network_file: str, cluster_name: str,
                cluster_file: str, options: Options, estimator: str, nodes: int,
                models: str | None = None) -> dict[str, Any]:
    """What a plan document opens with: the version, the command, the inputs (with their
    digests; ``models``: the learned kernel models' :attr:`ModelSet.digest`, where they
    timed the plan) and the question."""
    inputs: dict[str, Any] = {
        "network": {"file": network_file, "name": network.name,
                    "sha256": file_digest(network_file)},
        "cluster": {"file": cluster_file, "name": cluster_name,
                    "sha256": file_digest(cluster_file)},
    }
    if models is not None:
        inputs["models"] = {"sha256": models}
    return {
        "planner": __version__,
        "command": command,
        "inputs": inputs,
        "problem": {**problem_record(network, options), "estimator": estimator,
                    "algorithm": options.algorithm or DEFAULT_ALGORITHM, "nodes": nodes},
    }


def plan_document(command: str, network: Network, network_file: str, cluster_name: str,
                  cluster_file: str, options: Options, ev: Evaluation, estimator: str,
                  nodes: int, device: Device, extra: dict[str, Any] | None = None,
                  models: str | None = None) -> dict[str, Any]:
    """The full plan document, rounded for stable output."""
    doc: dict[str, Any] = {
        **plan_header(command, network, network_file, cluster_name, cluster_file, options,
                      estimator, nodes, models),
        "iteration": iteration_record(ev, network, device, options),
        "memory": ev.memory.to_data(),
    }
    if extra:
        doc.update(extra)
    pb = question_param_bytes(network, options)
    doc["layers"] = [layer_record(r, pb, options.zero) for r in ev.layers]
    return rounded(doc, 4)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------
# The table


def _ms(x: float) -> str:
    return "" if x == 0 else format_time(x, 3)


def _count(value: str, trials: list[dict[str, Any]]) -> int:
    """The number of blocks a recomputation setting names (``blocks``: the most tried)."""
    if value == "none":
        return 0
    if value == "blocks":
        return max(int(t["blocks"]) for t in trials)
    return int(value)


def _over_peak(doc: dict[str, Any]) -> str:
    """Why a utilisation above the peak is not a fault: the roofline bounds every kernel,
    so only the counted FLOPs can exceed what ran. Winograd's and FFT convolutions
    multiply less than a direct one, as counted; and the count, 3× the forward, includes
    the input gradient of the network's first layer, which no kernel computes (its input
    is data): one linear layer read 107.7% for that alone (an audit)."""
    convs = any(str(r.get("type", "")).startswith("conv") for r in doc.get("layers", ()))
    why = ["the network's FLOPs count its first layer's input gradient, which is not "
           "computed"]
    if convs:
        why.insert(0, "convolutions are counted as a direct convolution does them, and "
                      "Winograd's and FFT convolutions multiply less")
    return " (over 100%: " + "; ".join(why) + ")"


def _recomputing(value: str, unit: str = "blocks") -> str:
    """How the table names a recomputation: every block (or layer, ``unit`` "layers"),
    or the first N."""
    if value == "auto":  # a pipeline's stages, each its own count
        return f"each stage's {unit} as its memory needs"
    if value == "blocks":
        return "blocks" if unit == "blocks" else "every layer"
    return f"{value} {unit}" if value != "1" else f"1 {unit[:-1]}"


def _tried(trial: dict[str, Any]) -> str:
    """What an ``auto`` option's trial gave, for the table: its step, the lower bound
    that spared its search (``≥ 1.2 s (bound)``), or ``no plan``."""
    if trial["time_s"] is not None:
        return format_time(trial["time_s"])
    if trial.get("outcome") == "bound":
        return f"≥ {format_time(trial['bound_s'])} (bound)"
    return "no plan"


def plan_table(doc: dict[str, Any], all_layers: bool = False) -> Any:
    """A person's view of a plan document: summary, per-layer breakdown, memory."""
    from rich import box
    from rich.console import Group as RichGroup
    from rich.text import Text

    from .tables import COPIES_CAPTION, FitTable, Row, collapse_copies

    it = doc["iteration"]
    mem = doc["memory"]
    prob = doc["problem"]
    unit = str(prob.get("recompute_unit", "blocks"))  # what a count of recomputed counts
    head = Text()
    head.append(f"{doc['inputs']['network']['name']} on {doc['inputs']['cluster']['name']}: ",
                style="bold")
    zero = int(prob.get("zero", 0))
    setting = zero_label(zero, str(prob.get("zero_shard", "all")))
    grads = prob.get("grad_dtype", prob["dtype"])
    micro = int(prob.get("microbatches", 1))
    head.append(f"{count(int(prob['gpus']), 'device')}, batch {int(prob['batch']):,}"
                + (f" in {micro} microbatches" if micro > 1 else "") + f", {prob['dtype']}"
                + (f" (gradients in {grads})" if grads != prob["dtype"] else "") + ", "
                f"cost model {prob['cost_model']}, overlap {prob['overlap']}"
                + (" and tensor-parallel" if prob.get("tp_comm_overlap") else "")
                + (" and parameter gathers" if prob.get("overlap_param_gather") else "")
                + (f", context parallelism {prob['cp_comm_type']}"
                   if prob.get("cp_comm_type", "p2p") != "p2p" else "")
                + (f", {prob['cross_entropy']} cross-entropy"
                   if prob.get("cross_entropy", "fused") != "fused" else "")
                + (f", ZeRO {setting}" if zero else "")
                + (f", recomputing {_recomputing(str(prob['recompute']), unit)} "
                   f"({format_time(it.get('recompute_s', 0.0))} a step)"
                   if str(prob.get("recompute", "none")) not in ("none", "0")
                   and (prob["recompute"] != "auto" or it.get("recompute_s")) else "")
                + "\n")
    head.append("iteration ", style="bold")
    head.append(f"{format_time(it['time_s'])}  (compute {format_time(it['compute_s'])}, "
                f"communication {format_time(it['comm_s'])}, exposed "
                f"{format_time(it['exposed_comm_s'])}"
                # ring attention's steps can wait longer than its traffic takes
                + (" with ring attention's steps"
                   if it["exposed_comm_s"] > it["comm_s"] * (1 + 1e-9) else "")
                + f"; {format_rate(it['samples_per_s'])} samples/s)\n")
    if "mfu" in it:
        head.append("utilisation ", style="bold")
        head.append(f"{it['tflops_per_device']:.4g} TFLOP/s a device of the network's "
                    f"FLOPs: MFU {it['mfu']:.1%} of the {prob['dtype']} peak"
                    + (_over_peak(doc) if it["mfu"] > 1 else "") + "\n")
    stages = doc.get("zero_auto")
    if stages:
        head.append("ZeRO auto ", style="bold")
        head.append("  ".join(
            zero_label(t["stage"], t.get("shard", "all")) + ": "
            + (t["outcome"] if t["time_s"] is None else
               format_time(t["time_s"]) + ("" if t["outcome"] in ("plan", "fits")
                                           else f" ({t['outcome']})"))
            + (" (chosen)" if zero_label(t["stage"], t.get("shard", "all")) == setting
               else "")
            for t in stages) + "\n")
    counts = doc.get("recompute_auto")
    if counts:
        chosen = str(prob.get("recompute", "none"))
        head.append("recompute auto ", style="bold")
        head.append("  ".join(
            f"{t['blocks']} {unit[:-1] if t['blocks'] == 1 else unit}: "
            + (t["outcome"] if t["time_s"] is None else
               format_time(t["time_s"]) + ("" if t["outcome"] in ("plan", "fits")
                                           else f" ({t['outcome']})"))
            + (" (chosen)" if _count(chosen, counts) == t["blocks"] else "")
            for t in counts) + "\n")
    trials = doc.get("pipeline_auto")
    if trials:
        picked = int(prob.get("pipeline", {}).get("stages", 1))
        head.append("pipeline auto ", style="bold")
        head.append("  ".join(
            f"{t['stages']} stage{'' if t['stages'] == 1 else 's'}: "
            + _tried(t)
            + (" (chosen)" if t["stages"] == picked else "") for t in trials) + "\n")
    chunks = doc.get("virtual_auto")
    if chunks:
        pipe = prob.get("pipeline", {})
        picked_at = (int(pipe.get("stages", 1)), int(pipe.get("virtual_stages", 1)))
        several = len({t["stages"] for t in chunks}) > 1
        head.append("virtual stages auto ", style="bold")
        head.append("  ".join(
            (f"{t['stages']}x" if several else "") + f"{t['virtual_stages']}: "
            + _tried(t)
            + (" (chosen)" if (t["stages"], t["virtual_stages"]) == picked_at else "")
            for t in chunks) + "\n")
    runs = doc.get("schedule_auto")
    if runs:
        pipe = prob.get("pipeline", {})
        picked_run = (int(pipe.get("stages", 1)), int(pipe.get("virtual_stages", 1)),
                      pipe.get("schedule"))
        several = len({t["stages"] for t in runs}) > 1
        head.append("schedule auto ", style="bold")
        head.append("  ".join(
            (f"{t['stages']} stages " if several else "") + f"{t['schedule']}: "
            + _tried(t)
            + (" (chosen)" if (t["stages"], 1, t["schedule"]) == picked_run else "")
            for t in runs) + "\n")
    tried = doc.get("microbatches_auto")
    if tried:
        picked = int(prob.get("microbatches", 1))
        head.append("microbatches auto ", style="bold")
        head.append("  ".join(
            f"{t['microbatches']}: "
            + _tried(t)
            + (f" ({t['stages']} stage{'' if t['stages'] == 1 else 's'})"
               if "stages" in t else "")
            + (" (chosen)" if t["microbatches"] == picked else "") for t in tried) + "\n")
    low = doc.get("search", {}).get("lower_bound_s")
    if low:
        head.append("lower bound ", style="bold")
        head.append(f"{format_time(low)}  (no layouts are faster: compute and critical-path "
                    "communication, gradients hidden)\n")
    fits = "fits" if mem["fits"] else "DOES NOT FIT"
    head.append("memory ", style="bold")
    head.append(f"{format_bytes(mem['peak_bytes'])} of {format_bytes(mem['capacity_bytes'])} "
                f"per device: ")
    head.append(fits, style="green" if mem["fits"] else "bold red")
    b = mem["breakdown"]
    head.append(f"  (weights {format_bytes(b['weights'])}, gradients "
                f"{format_bytes(b['gradients'])}, optimizer {format_bytes(b['optimizer'])}, "
                f"activations {format_bytes(b['activations'])}, buffers "
                f"{format_bytes(b['comm_buffers'] + b['workspace'])})")
    # ZeRO's parameter gathers get a column of their own where the plan has them
    breakdown = ("forward", "bwd data", "weight grad", "redistrib.") + (
        ("param gather",) if zero else ())
    t = FitTable(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), wide=breakdown,
                 narrow=("communication",))
    t.add_column("layer", overflow="fold", min_width=10)
    for col in ("type", "layout", "compute", *breakdown, "communication", "total"):
        t.add_column(col, justify="left" if col in ("type", "layout") else "right",
                     no_wrap=True)
    staged = any(int(rec.get("stage", 0)) > 0 for rec in doc["layers"])
    if staged:  # a pipeline's stages: which stage runs each layer
        t.add_column("stage", justify="right", no_wrap=True)
    hidden = [0, 0.0, 0.0, 0.0, 0.0]
    rows: list[Row] = []
    for rec in doc["layers"]:
        c = rec["comm"]
        gathers = c.get("parameters_s", 0.0)
        moves = c["forward_s"] + c["backward_data_s"] + c["redistribute_s"]
        comm = moves + c["weight_grad_s"] + gathers
        total = rec["compute_s"] + comm
        if not all_layers and "follows" in rec and moves == 0:
            hidden[0] += 1
            hidden[1] += rec["compute_s"]
            hidden[2] += comm
            hidden[3] += c["weight_grad_s"]
            hidden[4] += gathers
            continue
        layout = f"{rec['mode']} {rec['grid'][0]}x{rec['grid'][1]}"
        if rec["placement"] == "cols":
            layout += " (cols)"
        rows.append(Row(rec["name"], (
            rec["type"], layout, _ms(rec["compute_s"]), _ms(c["forward_s"]),
            _ms(c["backward_data_s"]), _ms(c["weight_grad_s"]), _ms(c["redistribute_s"]),
            *((_ms(gathers),) if zero else ()), _ms(comm), _ms(total),
            *((str(rec.get("stage", 0)),) if staged else ())), "follows" in rec))
    shown = rows if all_layers else collapse_copies(rows)
    for row in shown:
        cells: list[Any] = list(row.cells)
        if row.dim:
            cells[1] = Text(cells[1], style="dim")
        t.add_row(row.name, *cells)
    captions = []
    if len(shown) < len(rows):
        captions.append(COPIES_CAPTION.format(alike="in layout and times"))
    if hidden[0]:
        others = f"({count(int(hidden[0]), 'other')})"
        captions.append(f"{others}: layers that follow a neighbour's layout and move no "
                        "activations; --all-layers lists them")
        t.add_row(Text(others, style="dim"), "", "", _ms(hidden[1]), "", "",
                  _ms(hidden[3]), "", *((_ms(hidden[4]),) if zero else ()), _ms(hidden[2]),
                  _ms(hidden[1] + hidden[2]), *(("",) if staged else ()))
    if captions:
        t.caption = "\n".join(captions)
        t.caption_justify = "left"
    parts: list[Any] = [head, t]
    if t.caption:
        parts.append(Text(""))  # the caption's last line is not the table's blank line
    return RichGroup(*parts)


# ---------------------------------------------------------------------------------------
# Placement


def group_rules(pr: int, pc: int, placement: str) -> tuple[str, str]:
    """Compact rules for the row and column groups of a grid under a placement."""
    if placement == "rows":
        return (f"row group c (0 <= c < {pc}): ranks c*{pr} + r for r in 0..{pr - 1}",
                f"column group r (0 <= r < {pr}): ranks c*{pr} + r for c in 0..{pc - 1}")
    return (f"row group c (0 <= c < {pc}): ranks r*{pc} + c for r in 0..{pr - 1}",
            f"column group r (0 <= r < {pr}): ranks r*{pc} + c for c in 0..{pc - 1}")


def group_ranks(pr: int, pc: int, placement: str) -> tuple[list[list[int]], list[list[int]]]:
    """Every row group and column group of a grid as rank lists."""
    if placement == "rows":
        rows = [[c * pr + r for r in range(pr)] for c in range(pc)]
        cols = [[c * pr + r for c in range(pc)] for r in range(pr)]
    else:
        rows = [[r * pc + c for r in range(pr)] for c in range(pc)]
        cols = [[r * pc + c for c in range(pc)] for r in range(pr)]
    return rows, cols


def placement_record(ev: Evaluation, gpus: int, per_node: int, expand: bool,
                     device_kind: str = "gpu", offset: int = 0) -> dict[str, Any]:
    """Where every rank runs (on devices of ``device_kind``: gpu or cpu), and each grid's
    row and column groups (``offset``: the first rank's position in its node, for a
    pipeline stage)."""
    from .layout import make_layout

    used: dict[tuple[int, int, str], list[str]] = {}
    for r in ev.layers:
        if r.follows is None:
            key = (r.layout.pr, r.layout.pc, r.layout.placement)
            used.setdefault(key, []).append(r.layer.name)
    grids = []
    for (pr, pc, pl), names in sorted(used.items()):
        lay = make_layout("model" if pr > 1 else "data", pr, pc, pl)
        row_rule, col_rule = group_rules(pr, pc, pl)
        row_g, col_g = lay.row_group(per_node, offset), lay.col_group(per_node, offset)
        rec: dict[str, Any] = {
            "grid": [pr, pc],
            "placement": pl,
            "layers": names,
            "row_groups": {"count": pc, "size": pr, "per_node": row_g.per_node,
                           "nodes": row_g.nodes, "spans_nodes": row_g.spans_nodes,
                           "rule": row_rule},
            "col_groups": {"count": pr, "size": pc, "per_node": col_g.per_node,
                           "nodes": col_g.nodes, "spans_nodes": col_g.spans_nodes,
                           "rule": col_rule},
        }
        if expand:
            rows, cols = group_ranks(pr, pc, pl)
            rec["row_groups"]["ranks"] = rows
            rec["col_groups"]["ranks"] = cols
        grids.append(rec)
    return {
        "devices": gpus,
        "devices_per_node": per_node,
        "device_kind": device_kind,
        "nodes": -(-gpus // per_node),
        "rank_to_device": f"rank k runs on node k // {per_node}, local device k % {per_node}",
        "grids": grids,
    }


def baselines_table(doc: dict[str, Any]) -> Any:
    """The plan against each baseline."""
    from rich import box
    from rich.console import Group as RichGroup
    from rich.table import Table
    from rich.text import Text

    prob = doc.get("problem") or {}
    zero = prob.get("zero") or 0
    # every row is priced at the plan's ZeRO stage: say which, and where --zero auto
    # chose it (compare printed the baselines at stage 3 with no word of it: an audit)
    title = "baselines" + (
        f" (each at ZeRO stage {zero}"
        + (" within each node" if prob.get("zero_shard") == "node" else "")
        + (", the stage --zero auto chose for the plan" if doc.get("zero_auto") else "")
        + ")" if zero else "")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title=title,
              title_justify="left")
    for col in ("strategy", "iteration", "communication", "exposed", "memory", "speedup"):
        t.add_column(col, justify="left" if col == "strategy" else "right",
                     no_wrap=col != "strategy", overflow="fold")
    it = doc.get("iteration")
    if it is None:  # `compare` where nothing fits: the leanest layout the search found
        t.add_row(Text("plan (searched): no layout fits", style="bold"), "", "", "",
                  format_bytes(doc["leanest_peak_bytes"]) + " (leanest)", "")
    else:
        t.add_row(Text("plan (searched)", style="bold"), format_time(it["time_s"]),
                  format_time(it["comm_s"]), format_time(it["exposed_comm_s"]),
                  format_bytes(doc["memory"]["peak_bytes"]), "")
    notes: list[str] = []  # reasons too long for the column, said under the table
    for b in doc.get("baselines", []):
        if not b["applicable"]:
            reason = b["reason"]
            if len(reason) > REASON_INLINE:
                notes.append(f"{b['name']} is not applicable: {reason}")
                reason = "below"
            t.add_row(Text(f"{b['name']}: not applicable ({reason})", style="dim"),
                      "", "", "", "", "")
            continue
        mem = format_bytes(b["peak_bytes"]) + ("" if b["fits"] else " (does not fit)")
        speed = ""
        if b.get("speedup"):
            speed = f"{b['speedup']:.2f}x" if b["speedup"] < 10 else f"{b['speedup']:.3g}x"
        t.add_row(f"{b['name']}: {b['description']}", format_time(b["time_s"]),
                  format_time(b["comm_s"]), format_time(b["exposed_comm_s"]), mem, speed)
    if not notes:
        return t
    return RichGroup(t, Text("\n".join(notes), style="dim"))


#: the longest reason a baseline's row says inline (longer ones fold the strategy column
#: into a dozen lines; they go under the table, at its full width)
REASON_INLINE = 60


def pipeline_table(doc: dict[str, Any]) -> Any:
    """A pipelined plan's stages: their layers, ranks, one microbatch's time, what each
    does once a step, and memory."""
    from rich import box
    from rich.console import Group as RichGroup
    from rich.text import Text

    from .tables import FitTable

    pipe = doc["pipeline"]
    head = Text()
    head.append("pipeline ", style="bold")
    v = int(pipe.get("virtual_stages", 1))
    chunks = f" of {v} model chunks" if v > 1 else ""
    head.append(f"{pipe['stages']} stages{chunks}, {pipe['microbatches']} microbatches "
                f"({pipe['schedule']}): fill and drain "
                f"{format_time(pipe['bubble_s'])} ({pipe['bubble_fraction']:.1%} of the "
                "step)"
                + (f", tied weights' reductions {format_time(pipe['tied_allreduce_s'])}"
                   if pipe["tied_allreduce_s"] else "") + "\n")
    # each stage's passes: F / B, or ZB-H1's F / B / W (none in plans made before)
    kinds = list(pipe["stage_plans"][0].get("passes_s", {}))
    # a microbatch's time is its passes' sum: where the table is too wide for the
    # console, it gives way to the layer names (which fold mid-name otherwise)
    t = FitTable(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title="stages",
                 title_justify="left", wide=("microbatch",) if kinds else ())
    label = " / ".join({"forward": "F", "weight_grad": "W"}.get(k, "B") for k in kinds)
    for col in ("stage", *(("chunk",) if v > 1 else ()), "layers", "ranks", "in flight",
                "microbatch", *((label,) if kinds else ()), "sends", "step end",
                "memory"):
        # the layer names fold; the numbers keep their cells whole
        t.add_column(col, justify="left" if col in ("layers", "ranks") else "right",
                     overflow="fold", no_wrap=col != "layers")
    for st in pipe["stage_plans"]:
        mem = format_bytes(st["peak_bytes"]) + ("" if st["fits"] else " (does not fit)")
        passes = st.get("passes_s", {})
        t.add_row(str(st["stage"]), *((str(st["chunk"]),) if v > 1 else ()),
                  f"{st['layers'][0]} ..\n{st['layers'][1]} ({st['layer_count']})",
                  f"{st['ranks'][0]}-{st['ranks'][1]}",
                  str(st["inflight"]), format_time(st["microbatch_s"]),
                  *((" / ".join(format_time(passes[k]) for k in kinds),) if kinds
                    else ()),
                  format_time(st["send_s"]), format_time(st["tail_s"]), mem)
    return RichGroup(head, t)
