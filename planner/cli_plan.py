"""Commands that price and plan: ``planner cost`` (a given layout), and the search
commands added by :mod:`planner.search`."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click

from .cli import (
    FORMATS,
    Whole,
    check_output,
    count_or_auto,
    emit,
    format_option,
    jobs_option,
    output_option,
    plain_whole,
    render_data,
)
from .costs import COST_MODELS, OVERLAPS
from .costs.memory import OPTIMIZERS
from .errors import NoFeasiblePlan, UsageError
from .memo import IdentityMemo
from .schedules import SCHEDULE, SCHEDULES
from .units import MAX_BATCH, MAX_GPUS

ESTIMATORS = ("auto", "roofline", "learned")
#: --precision: the network dtypes and their short names (a subset of network.DTYPE_ALIASES)
PRECISIONS = ("float32", "float16", "bfloat16", "float64", "fp32", "fp16", "bf16", "fp64")


def _size(value: str) -> float:
    from .units import UnitError, parse_bucket_size

    try:
        return parse_bucket_size(value)
    except UnitError as exc:
        raise click.BadParameter(str(exc), param_hint="'--bucket-size'") from None


def problem_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by cost, plan, compare and sweep."""
    decorators = [
        click.argument("network", type=click.Path(dir_okay=True)),
        click.argument("cluster", type=click.Path(dir_okay=True)),
        click.option("--cost-model", type=click.Choice(COST_MODELS),
                     default="exact", show_default=True,
                     help="exact volumes and the cluster's algorithms, or the paper's "
                          "Eq. 3-9 as printed."),
        click.option("--overlap", type=click.Choice(OVERLAPS),
                     default="gradients", show_default=True,
                     help="Overlap weight-gradient all-reduces with the backward pass."),
        click.option("--bucket-size", "bucket", default="25 MiB", show_default=True,
                     help="Gradient bucket size for --overlap gradients (0: one per layer)."),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=False,
                     show_default=True,
                     help="Overlap sequence-parallel layers' all-gathers and "
                          "reduce-scatters with their GEMMs inside a node (Megatron-LM's "
                          "--tp-comm-overlap, Transformer Engine's userbuffers)."),
        click.option("--overlap-param-gather/--no-overlap-param-gather", default=False,
                     show_default=True,
                     help="With ZeRO 1-2, gather the updated parameters under the next "
                          "step's first forward pass, a bucket ahead of the layers "
                          "that need them (Megatron-LM's --overlap-param-gather)."),
        click.option("--stage-boundaries", type=click.Choice(("blocks", "layers")),
                     default="blocks", show_default=True,
                     help="Where pipeline stages may start: between residual blocks, or "
                          "only between copies of the network's repeat groups (a "
                          "transformer's layers, as Megatron-LM's stages hold them)."),
        # costs.layer.CP_COMM_TYPES (not imported here: the CLI starts without numpy)
        click.option("--cp-comm-type", type=click.Choice(("p2p", "allgather", "auto")),
                     default="p2p",
                     show_default=True,
                     help="How context parallelism (domain attention) moves the keys and "
                          "values: p2p, a ring of sends overlapped with attention; "
                          "allgather, gathered before it; auto, the cheaper a layer "
                          "(Megatron-LM's --cp-comm-type)."),
        # evaluate.CROSS_ENTROPY (not imported here: the CLI starts without numpy)
        click.option("--cross-entropy",
                     type=click.Choice(("fused", "eager", "eager-no-upcast")),
                     default="fused", show_default=True,
                     help="How the loss's softmax cross-entropy runs: fused keeps its fp32 "
                          "probabilities and writes their gradient over them (Megatron-LM's "
                          "vocabulary-parallel loss); eager is PyTorch's cross_entropy on "
                          "fp32 logits (torchtitan, Hugging Face, autocast), whose backward "
                          "holds two more logits-sized fp32 tensors; eager-no-upcast, on "
                          "16-bit logits as they come (a pure bf16 script)."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS),
                     default="momentum", show_default=True,
                     help="Optimizer state kept per parameter."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="dtype of the weights and activations, in place of the "
                          "network's (bf16 = bfloat16, fp16 = float16, fp32 = float32)."),
        click.option("--master-weights/--no-master-weights", default=None,
                     help="Keep fp32 master weights (default: for 16-bit dtypes)."),
        click.option("--grad-precision", type=click.Choice(PRECISIONS), default=None,
                     help="dtype the gradients are accumulated and reduced in (default: "
                          "the weights'; fp32 for a bf16 model as Megatron-LM does: "
                          "twice the gradient memory and traffic)."),
        click.option("--zero", type=click.Choice(("0", "1", "2", "3", "auto")),
                     default="0", show_default=True,
                     help="ZeRO stage: shard the optimizer state (1), the gradients too "
                          "(2) or the weights too (3) over each layer's data-parallel "
                          "replicas; auto: the fastest stage that fits."),
        click.option("--zero-shard", type=click.Choice(("all", "node", "auto")),
                     default="all", show_default=True,
                     help="Over whom ZeRO shards: all of a layer's data-parallel replicas, "
                          "or those inside each node, replicated across nodes (hybrid "
                          "sharding: FSDP HYBRID_SHARD, MiCS); auto: the faster."),
        click.option("--recompute", default="none", show_default=True,
                     callback=_recompute_option, metavar="none|blocks|N|auto",
                     help="Activation recomputation: blocks keeps each residual block's "
                          "input and re-runs the block's forward in the backward pass; N "
                          "does so for the first N blocks; auto: as few as memory needs."),
        click.option("--recompute-unit", type=click.Choice(("blocks", "layers")),
                     default="blocks", show_default=True,
                     help="What --recompute re-runs from one kept input: each residual "
                          "block, or each transformer layer (its attention and MLP blocks "
                          "together, as Megatron-LM's full recomputation and torchtitan's "
                          "full activation checkpointing keep; needs a repeat group); N "
                          "then counts layers."),
        click.option("--microbatches", default="1", show_default=True,
                     callback=_microbatches_option, metavar="N|auto",
                     help="Gradient accumulation: forward and backward passes per step, "
                          "each over batch / N samples; gradients are reduced once, in "
                          "the last one's backward pass. With --pipeline: the microbatches "
                          "of the pipeline schedule. auto (plan): the fastest count that "
                          "divides the batch."),
        click.option("--algorithm",
                      type=click.Choice(("auto", "ring", "tree", "recursive", "hierarchical")),
                      default=None, help="Collective algorithm (default: the cluster's)."),
        click.option("--estimator", type=click.Choice(ESTIMATORS), default="auto",
                     show_default=True,
                     help="Kernel times: the learned models (auto: when they cover the "
                          "device), or the roofline."),
        click.option("--models-dir", type=click.Path(file_okay=False), default=None,
                     help="Kernel models to use instead of the shipped ones (default: "
                          "$PLANNER_MODELS, else the shipped ones)."),
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


def _microbatches_option(ctx: click.Context, param: click.Parameter, value: str
                         ) -> int | str:
    return count_or_auto(value, MAX_BATCH, "microbatches (a divisor of --batch)")


def _recompute_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from .costs.layer import recompute_error

    if value != "auto" and recompute_error(value):
        raise click.BadParameter(f"{value!r}: use none, blocks, a number of residual "
                                 "blocks (the first ones) or auto")
    return value


@dataclass
class Question:
    """The inputs of a pricing or planning command, loaded and checked."""

    network: Any
    cluster: Any
    network_file: str
    cluster_file: str
    options: Any
    ctx: Any
    estimator_name: str
    recompute_auto: bool = False  #: --recompute auto: the search picks the blocks
    #: the learned kernel models' digest where they time the question (None: roofline)
    models_sha256: str | None = None
    #: the ZeRO stages and ways of sharding asked for (``--zero auto``: all stages;
    #: ``--zero-shard auto`` on several nodes: both ways)
    zero_stages: tuple[int, ...] = ()
    zero_shards: tuple[str, ...] = ()
    #: the pipeline schedule (``--schedule``): 1F1B, or ZB-H1's deferred weight gradients
    schedule: str = SCHEDULE
    #: told what an ``auto`` search tries now (what, value): ``("microbatches", "16")``
    progress: Callable[[str, str], None] | None = None
    #: the pins were checked to match layers of the whole network: a pipeline stage's
    #: question, where a pin may match none of the stage's own layers
    pins_matched: bool = False

    @property
    def zero_auto(self) -> bool:
        """Whether the search picks the ZeRO setting (more than one was asked for)."""
        return len(self.zero_stages) * len(self.zero_shards) > 1


def load_question(network: str, cluster: str, gpus: int, batch: int, cost_model: str,
                  overlap: str, bucket: str, optimizer: str, master_weights: bool | None,
                  algorithm: str | None, estimator: str, models_dir: str | None,
                  zero: int | str = 0, recompute: str = "none", zero_shard: str = "all",
                  precision: str | None = None, grad_precision: str | None = None,
                  microbatches: int | str = 1, tp_comm_overlap: bool = False,
                  cp_comm_type: str = "p2p", overlap_param_gather: bool = False,
                  stage_boundaries: str = "blocks", recompute_unit: str = "blocks",
                  cross_entropy: str = "fused") -> Question:
    """Load both files, build the options and the cost context (``zero="auto"`` or
    ``zero_shard="auto"``: stage 0 over all replicas until the search picks one)."""
    from .evaluate import ZERO_STAGES, Options, check_question, make_context
    from .inputs import load_cluster, load_network
    from .network import DTYPE_ALIASES

    if network == cluster == "-":
        raise UsageError("planner: error: the network and the cluster cannot both come from "
                         "standard input (-); name one of them as a file, or pipe one in "
                         "with <(command)")
    if str(zero) == "0" and zero_shard != "all":
        raise UsageError(f"planner: error: --zero-shard {zero_shard} needs ZeRO: add "
                         "--zero 1, 2, 3 or auto")
    if "auto" in (zero, zero_shard) and cost_model == "gholami2018":
        raise UsageError("planner: error: --zero auto needs --cost-model exact: the paper's "
                         "accounting (Gholami et al. 2018) has no sharded optimizer; drop "
                         "--zero or the cost model")
    if microbatches == "auto":
        raise UsageError("planner: error: --microbatches auto is for `planner plan`, which "
                         "searches the count; give a number here")
    assert isinstance(microbatches, int)
    if batch % microbatches:
        raise UsageError(f"planner: error: the batch {batch} is not a multiple of "
                         f"--microbatches {microbatches}; each microbatch runs the same "
                         "number of samples: pick a batch or a count that divides it")
    if tp_comm_overlap and cost_model == "gholami2018":
        raise UsageError("planner: error: --tp-comm-overlap needs --cost-model exact: the "
                         "paper's accounting (Gholami et al. 2018) has no sequence "
                         "parallelism; drop --tp-comm-overlap or the cost model")
    if overlap_param_gather:
        why = "drop --overlap-param-gather or"
        if str(zero) in ("0", "3"):
            raise UsageError(f"planner: error: --overlap-param-gather overlaps ZeRO stages 1 "
                             f"and 2's gathers of the updated parameters, and --zero {zero} "
                             + ("has none" if str(zero) == "0" else
                                "gathers before each pass (prefetched already)")
                             + f"; {why} use --zero 1, 2 or auto")
        if overlap != "gradients":
            raise UsageError("planner: error: --overlap-param-gather needs --overlap "
                             "gradients: the gathers fill the gradients' buckets (Megatron-LM "
                             f"needs --overlap-grad-reduce with it); {why} the overlap")
    if cp_comm_type != "p2p" and cost_model == "gholami2018":
        raise UsageError(f"planner: error: --cp-comm-type {cp_comm_type} needs --cost-model "
                         "exact: the paper's accounting (Gholami et al. 2018) splits a "
                         "sequence as an image, by halo rows; drop --cp-comm-type or the "
                         "cost model")
    if microbatches > 1 and cost_model == "gholami2018":
        raise UsageError("planner: error: --microbatches needs --cost-model exact: the "
                         "paper's accounting (Gholami et al. 2018) runs one pass a step; "
                         "drop --microbatches or the cost model")
    rec_auto = recompute == "auto"
    if rec_auto and cost_model == "gholami2018":
        raise UsageError("planner: error: --recompute needs --cost-model exact: the paper's "
                         "accounting (Gholami et al. 2018) keeps every activation; drop "
                         "--recompute or the cost model")
    from .costs.layer import canonical_recompute

    net = load_network(network).in_dtype(precision).with_cross_entropy(cross_entropy)
    for key, unit in (("stage_boundaries", stage_boundaries),
                      ("recompute_unit", recompute_unit)):
        if unit == "layers":
            net = by_layers(net, network, key)
    cl = load_cluster(cluster)
    stages = ZERO_STAGES if zero == "auto" else (int(zero),)
    # within nodes is the same as over all replicas while the devices fit in one node
    shards = (zero_shard,) if zero_shard != "auto" else \
        ("all", "node") if gpus > cl.devices_per_node else ("all",)
    auto = len(stages) * len(shards) > 1
    options = Options(gpus=gpus, batch=batch // microbatches, microbatches=microbatches,
                      cost_model=cost_model, overlap=overlap,
                      bucket_bytes=_size(bucket), optimizer=optimizer,
                      master_weights=master_weights, algorithm=algorithm,
                      zero=0 if auto else stages[0],
                      zero_shard="all" if auto else shards[0],
                      recompute="none" if rec_auto else
                      canonical_recompute(recompute, len(net.recompute_units)),
                      grad_dtype=DTYPE_ALIASES.get(grad_precision, grad_precision)
                      if grad_precision is not None else None,
                      tp_comm_overlap=tp_comm_overlap, cp_comm_type=cp_comm_type,
                      overlap_param_gather=overlap_param_gather, cross_entropy=cross_entropy)
    check_question(net, cl, options)
    _defaults_notes(net, options)
    est = make_estimator(estimator, models_dir, cl.device)
    _chip_note(cl.device, net.dtype, est.name)
    ctx = make_context(net, cl, options, est)
    return Question(net, cl, network, cluster, options, ctx, est.name, rec_auto,
                    models_digest(est), stages, shards)


def _defaults_notes(net: Any, options: Any) -> None:
    """On standard error, once: the numerics a transformer's plan took by default where
    the usual practice differs and the memory verdict may follow (an audit found a
    Llama 3 8B plan that fit on the defaults and would not as Megatron-LM trains it):
    momentum's 12 bytes a parameter against Adam's 16, and 16-bit gradients accumulated
    over microbatches, which Megatron-LM accumulates in fp32."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None or not any(layer.attention is not None for layer in net.layers):
        return

    def default(name: str) -> bool:
        return ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None)

    notes = []
    if default("optimizer") and options.optimizer == "momentum":
        notes.append("--optimizer not given: momentum's state is priced (Adam, the usual "
                     "choice for transformers, keeps one more value a parameter: "
                     "--optimizer adam)")
    grad = options.grad_dtype or net.dtype
    auto = ctx.params.get("microbatches") == "auto"  # priced at 1 here, chosen later
    if default("grad_precision") and (options.microbatches > 1 or auto) and \
            grad in ("bfloat16", "float16"):
        many = "the microbatches the plan takes" if auto else \
            f"{options.microbatches} microbatches"
        notes.append(f"gradients accumulate over {many} in {grad}, the weights' dtype "
                     "(Megatron-LM accumulates in fp32 by default: --grad-precision fp32)")
    noted = ctx.meta.setdefault("planner.noted", set())  # once a command: sweep asks many
    for note in notes:
        if note not in noted:
            noted.add(note)
            click.echo(f"planner: note: {note}", err=True)


def _chip_note(device: Any, dtype: str, estimator: str) -> None:
    """On standard error, once: a device of a catalog die (``chip``) with a faster peak
    than every catalog board of that die. The kernel models time a GPU they have not
    measured at the sustained FLOP/s of a measured board of its die, so it is timed
    hardly faster than that board: what a cluster file gets that writes ``base: H100-SXM``
    with a doubled ``peak_flops`` for a new GPU and keeps the base's chip (an audit: a
    synthetic H100 with twice the peak, bandwidth, SMs and L2 ran 7% faster)."""
    from .cluster import catalog
    from .network import DTYPE_PEAK_KEY

    if device.kind != "gpu" or not device.chip or estimator == "roofline":
        return
    key = DTYPE_PEAK_KEY.get(dtype, "fp32")
    boards = [d for d in catalog().values() if d.chip == device.chip]
    if not boards or device.name in {d.name for d in boards}:
        return
    top = max(boards, key=lambda d: d.peak(key))
    if device.peak(key) <= 1.1 * top.peak(key):
        return
    note = (f"device {device.name!r} is a {device.chip} (its chip) with {key} peak "
            f"{device.peak(key) / top.peak(key):.2f}× the {top.name}'s: the kernel models "
            f"hold a board of a measured die to that die's sustained FLOP/s, so its "
            f"compute-bound kernels are timed about as fast as the {top.name}'s; give it a "
            "chip of its own (chip: NAME) if it is a new die")
    ctx = click.get_current_context(silent=True)
    noted = ctx.meta.setdefault("planner.noted", set()) if ctx is not None else set()
    if note not in noted:
        noted.add(note)
        click.echo(f"planner: note: {note}", err=True)


def by_layers(net: Any, network: str, key: str) -> Any:
    """The network with ``key`` (``stage_boundaries``: ``--stage-boundaries``,
    ``recompute_unit``: ``--recompute-unit``) at layers, the copies of its repeat groups;
    a usage error where it has none."""
    from .network import BY_LAYERS

    out = net.by_layers(key)
    if out is None:
        option = "--" + key.replace("_", "-")
        raise UsageError(f"planner: error: {option} layers {BY_LAYERS[key]}, and {network} "
                         f"has no repeat group; use {option} blocks")
    return out


def inputs_of(network: str, cluster: str, kw: dict[str, Any]) -> tuple[str, ...]:
    """The files a pricing or planning command reads, which -o and --plot must never
    replace: the network, the cluster and, unless the roofline is asked for, the kernel
    models' files (a plan written over models/manifest.yaml broke every later run)."""
    if kw.get("estimator") == "roofline":
        return (network, cluster)
    from .errors import ModelDataError
    from .kernels import find_models_dir

    try:
        folder = find_models_dir(kw.get("models_dir"))
    except ModelDataError:
        return (network, cluster)  # reported when the models are loaded
    return (network, cluster, *sorted(str(f) for f in folder.iterdir() if f.is_file()))


def models_digest(estimator: Any) -> str | None:
    """The digest of the learned models an estimator times kernels with (None: the
    roofline)."""
    models = getattr(estimator, "models", None)
    return getattr(models, "digest", None)


def make_estimator(name: str, models_dir: str | None, device: Any) -> Any:
    """The kernel-time estimator a command asked for."""
    from .costs.compute import Roofline

    if name == "roofline":
        return Roofline()
    from .kernels import learned_estimator
    from .kernels.store import ENV

    kind = getattr(device, "kind", "gpu")
    if name == "auto" and kind != "gpu" and models_dir is None and not os.environ.get(ENV):
        return Roofline()  # the models were trained on GPUs only
    est = learned_estimator(models_dir, required=(name == "learned"))
    if name == "auto" and hasattr(est, "covers") and not est.covers(device):
        # models of GPUs alone, named by --models-dir or PLANNER_MODELS, for a CPU: the
        # roofline, as without them (an audit found the GPU models timing a CPU here,
        # while `kernels predict` and `eval` refuse them that device)
        return Roofline()
    if name == "learned" and hasattr(est, "covers") and not est.covers(device):
        from .errors import NotCovered

        raise NotCovered(f"planner: error: --estimator learned: {device.name} is a {kind} "
                         "and the kernel models have no measurements of it (they were "
                         "fitted on GPUs); use --estimator roofline or auto")
    return est


def layout_assignment(q: Question, grid: str | None, mode: str | None,
                      pins: tuple[str, ...], placement: str, count: str = "--gpus"
                      ) -> dict[int, Any]:
    """The layout of every layer with weights from --grid/--mode/--pin (``count`` names
    the device count the grids must fill, in messages)."""
    from .layout import parse_grid, parse_pin
    from .strategies import StrategyError, fixed_assignment

    p, b = q.options.gpus, q.options.batch
    parsed = [parse_pin(text, p, count) for text in pins]
    try:
        return fixed_assignment(q.network, p, b, q.options.cost_model == "gholami2018",
                                parse_grid(grid, p, count) if grid is not None else None,
                                mode, parsed, placement, q.options.microbatches > 1)
    except StrategyError as exc:
        if str(exc).startswith("pin "):  # a pin that matched nothing names itself
            raise UsageError(f"planner: error: --{exc}") from None
        source = "--grid/--mode" if exc.source == "grid" else \
            f"--pin '{parsed[int(exc.source)].text}'"
        raise UsageError(f"planner: error: {exc} ({source})") from None


def _matches(name: str, pattern: str) -> bool:
    from .network import name_matches

    return name_matches(name, pattern)


def nodes_used(q: Question) -> int:
    """Nodes the devices occupy."""
    return int(-(-q.options.gpus // q.cluster.devices_per_node))


gpus_option = click.option("--gpus", "-p", type=Whole(1, MAX_GPUS), required=True,
                           help="Number of devices P.")
expand_option = click.option("--expand-ranks", is_flag=True,
                             help="List every row and column group's ranks (large for big P).")
batch_option = click.option("--batch", "-b", type=Whole(1, MAX_BATCH), required=True,
                            help="Global batch size B (samples per iteration).")


#: ``plan --schedule auto``: every schedule the stage counts and chunk counts allow, the
#: fastest kept
AUTO_SCHEDULE = "auto"


def schedule_option(auto: bool = False) -> Callable[[Any], Any]:
    """``--schedule`` of ``plan`` (``auto``: it also takes ``auto``) and ``cost``."""
    return click.option(
        "--schedule", type=click.Choice((*SCHEDULES, AUTO_SCHEDULE) if auto else SCHEDULES),
        default=SCHEDULE, show_default=True,
        help="With --pipeline: 1f1b (interleaved with --virtual-stages), or zb-h1: 1F1B "
             "with each backward pass split into input and weight gradients, the weight "
             "gradients deferred into the fill and drain (Qi et al. 2024)"
             + ("; auto: both, the faster kept (1f1b on a tie: it holds less)." if auto
                else "."))


@click.command()
@problem_options
@gpus_option
@batch_option
@click.option("--grid", default=None, metavar="PRxPC",
              help="One grid for every layer with weights, e.g. 32x16 (1xP: data).")
# strategies.GRID_MODES (not imported here: the CLI starts without numpy)
@click.option("--mode", type=click.Choice(("data", "model", "domain", "megatron",
                                           "megatron-sp", "megatron-cp")),
              default=None,
              help="model: split output features over P_r; domain: split the height of "
                   "convolutions over P_r (other layers model); megatron: linear layers "
                   "in column/row pairs over P_r, a tied head column (other layers "
                   "model); megatron-sp: megatron with sequence parallelism (the pairs "
                   "column-sp/row-sp, attention, embeddings and mixtures of experts "
                   "model-sp); megatron-cp: Megatron-LM's context parallelism (every "
                   "layer split by tokens over P_r and the batch over P_c).")
@click.option("--pin", "pins", multiple=True, metavar="'GLOB=MODE[:PRxPC[:rows|cols]]'",
              help="Layout for matching layers, e.g. 'conv*=data' 'fc*=model:32x16', "
                   "'fc7=model:4x2:cols' (a placement of its own, else --placement). "
                   "Repeatable; the first match wins.")
@click.option("--placement", type=click.Choice(("rows", "cols")), default="rows",
              show_default=True,
              help="rows: each row group (P_r) on consecutive devices, inside a node when "
                   "it fits; cols: each column group (P_c) inside a node.")
@click.option("--pipeline", type=Whole(1, MAX_GPUS), default=1, show_default=True,
              metavar="S",
              help="Pipeline parallelism: S stages of consecutive layers, each on P/S "
                   "devices (--grid and --pin grids are a stage's), balanced as `plan "
                   "--pipeline` balances them, running --microbatches under 1F1B.")
@click.option("--virtual-stages", "virtual", type=Whole(1, MAX_GPUS), default=1,
              show_default=True, metavar="V",
              help="With --pipeline: V model chunks a stage under Megatron-LM's "
                   "interleaved 1F1B (the network in V*S chunks, chunk c on stage c mod "
                   "S); --microbatches a multiple of S.")
@schedule_option()
@click.option("--stage-starts", "starts", default=None, metavar="LAYER,...",
              help="With --pipeline: the layers where stages 1 to S-1 (chunks, with "
                   "--virtual-stages) start, in order, in place of the balanced ones "
                   "(e.g. Megatron-LM's uneven first and last stages).")
@expand_option
@click.option("--all-layers", is_flag=True,
              help="Table: list every layer (those without communication, and each of "
              "the alike copies of a repeat group shown as one row).")
@format_option
@output_option
def cost(network: str, cluster: str, gpus: int, batch: int, grid: str | None,
         mode: str | None, pins: tuple[str, ...], placement: str, pipeline: int,
         virtual: int, schedule: str, starts: str | None, expand_ranks: bool,
         all_layers: bool, fmt: str | None, output: str | None, **kw: Any) -> None:
    """Price one given layout: per-layer compute and communication, memory, iteration.

    Without --grid, --mode or --pin every layer is data parallel. Exit 0 when the layout
    fits in memory, 1 when it does not, 2 for invalid input.
    """
    from .plan import placement_record, plan_document, plan_table

    ins = inputs_of(network, cluster, kw)
    check_output(output, ins)
    q = load_question(network, cluster, gpus, batch, **kw)
    if starts is not None and pipeline == 1:
        raise UsageError("planner: error: --stage-starts places the stages of a pipeline; "
                         "give --pipeline 2 or more")
    schedule_option_check(schedule, pipeline, virtual)
    q.schedule = schedule
    if pipeline > 1 or virtual > 1:
        doc, res = pipeline_cost(q, pipeline, grid, mode, pins, placement, expand_ranks,
                                 virtual, starts)
        render_data(doc, fmt, output, lambda: _pipeline_tables(doc, all_layers), ins)
        overlap_note(doc)
        if not res.fits:
            from .units import format_bytes

            mem = res.memories[res.fullest]
            click.echo(f"planner: the layout does not fit: pipeline stage {res.fullest} "
                       f"needs {format_bytes(mem.peak)} per device, "
                       f"{format_bytes(mem.capacity)} available", err=True)
            raise click.exceptions.Exit(1)
        return
    assignment = layout_assignment(q, grid, mode, pins, placement)
    extra: dict[str, Any] = {}
    if q.recompute_auto:
        ev, q.ctx, q.options, zero_trials, extra["recompute_auto"] = _cost_recompute(
            q, assignment)
    else:
        ev, q.ctx, q.options, zero_trials = _price(q.ctx, q.options, assignment, q)
    if zero_trials is not None:
        extra["zero_auto"] = zero_trials
    extra["placement"] = placement_record(ev, q.options.gpus, q.cluster.devices_per_node,
                                          expand_ranks, q.cluster.device.kind)
    doc = plan_document("cost", q.network, network, q.cluster.name, cluster, q.options, ev,
                        q.estimator_name, nodes_used(q), q.cluster.device, extra,
                        q.models_sha256)
    render_data(doc, fmt, output, lambda: plan_table(doc, all_layers), ins)
    overlap_note(doc)
    if not ev.memory.fits:
        from .units import format_bytes

        click.echo(f"planner: the layout does not fit: {format_bytes(ev.memory.peak)} "
                   f"needed per device, {format_bytes(ev.memory.capacity)} available",
                   err=True)
        raise click.exceptions.Exit(1)


def overlap_note(doc: dict[str, Any]) -> None:
    """With ``--tp-comm-overlap``, say on standard error which sequence-parallel layers
    still wait for their collectives: those whose tensor-parallel group spans nodes
    (userbuffers overlap within a node)."""
    if not doc["problem"].get("tp_comm_overlap"):
        return
    names = [lay["name"] for lay in doc["layers"]
             if lay["type"] in ("linear", "attention") and lay["mode"].endswith("-sp")
             and any(t.get("note") == "tokens" and t["per_node"] < t["group"]
                     for t in lay["comm"]["terms"])]
    if names:
        click.echo(f"planner: note: --tp-comm-overlap: {len(names)} sequence-parallel "
                   f"layer{'s' if len(names) > 1 else ''} ('{names[0]}'"
                   f"{', ...' if len(names) > 1 else ''}) split over devices of more than "
                   "one node; Transformer Engine's userbuffers overlap within a node, so "
                   "their collectives are not overlapped", err=True)


def _pipeline_tables(doc: dict[str, Any], all_layers: bool) -> Any:
    from rich.console import Group

    from .plan import pipeline_table, plan_table

    return Group(plan_table(doc, all_layers), pipeline_table(doc))


def schedule_option_check(schedule: str, pipeline: int | str, virtual: int | str,
                          auto: bool = False) -> None:
    """UsageError unless ``--schedule`` goes with the other pipeline options (``auto``:
    the command takes ``--pipeline auto``)."""
    from .pipeline import schedule_check

    if schedule == SCHEDULE:
        return
    if pipeline == 1:
        raise UsageError(f"planner: error: --schedule {schedule} schedules the stages of a "
                         "pipeline; give --pipeline 2 or more" + (", or auto" if auto else ""))
    if schedule != AUTO_SCHEDULE:
        schedule_check(virtual, schedule)


def stage_count_check(q: Question, stages: int, option: str = "--pipeline") -> None:
    """UsageError unless ``stages`` divides the devices and the network can be cut into
    that many stages (and the question allows a pipeline)."""
    from .pipeline import max_stages, where_stages_start

    if q.options.cost_model == "gholami2018":
        raise UsageError(f"planner: error: {option} needs --cost-model exact: the paper's "
                         "accounting (Gholami et al. 2018) has no pipeline; drop "
                         f"{option} or the cost model")
    p = q.options.gpus
    if p % stages:
        raise UsageError(f"planner: error: {option} {stages} does not divide the {p} "
                         f"devices into equal stages; use a divisor of {p}")
    most = max_stages(q.network)
    if stages > most:
        raise UsageError(
            f"planner: error: {option} {stages}: '{q.network.name}' can be cut into "
            f"at most {most} stage{'s' if most > 1 else ''} (a stage boundary falls "
            f"where one tensor alone crosses, {where_stages_start(q.network)}, and every "
            "stage needs a layer with weights)")


def stage_context(q: Question) -> Callable[[Any, Any], Any]:
    """Builds a stage's cost context with the question's cluster and estimator."""
    from .evaluate import make_context

    def context(net: Any, options: Any) -> Any:
        return make_context(net, q.cluster, options, q.ctx.estimator)

    return context


def stage_pricer(q: Question) -> Callable[[Any, dict[int, Any]], Any]:
    """Prices one stage's given layouts as ``cost`` prices a network's (``--zero auto``,
    ``--recompute auto`` per stage), leaving the stage's question with its choice."""

    def price(sq: Question, assignment: dict[int, Any]) -> Any:
        if sq.recompute_auto:
            ev, sq.ctx, sq.options, _, _ = _cost_recompute(sq, assignment)
        else:
            ev, sq.ctx, sq.options, _ = _price(sq.ctx, sq.options, assignment, sq)
        return ev

    return price


def pipeline_cost(q: Question, stages: int, grid: str | None, mode: str | None,
                  pins: tuple[str, ...], placement: str, expand: bool, virtual: int = 1,
                  starts: str | None = None) -> tuple[dict[str, Any], Any]:
    """``cost --pipeline S``: the given layouts on each stage's ``P/S`` devices, the
    stages (``virtual`` chunks each) balanced as the search balances them, or starting
    at the layers ``starts`` names (comma-separated). Returns the document and the
    PipelineResult."""
    import dataclasses

    from .pipeline import given_bounds, price_pipeline, virtual_check

    virtual_check(q.network, stages, virtual, q.options.microbatches)
    stage_count_check(q, stages)
    bounds = None
    if starts is not None:
        names = [n.strip() for n in starts.split(",") if n.strip()]
        try:
            bounds = given_bounds(q.network, names, stages * virtual)
        except ValueError as exc:
            raise UsageError(f"planner: error: --stage-starts: {exc.args[0]}") from None
    p = q.options.gpus
    size = p // stages
    sq = dataclasses.replace(q, options=dataclasses.replace(q.options, gpus=size))
    layouts = layout_assignment(sq, grid, mode, pins, placement,
                                f"a stage's device count (--gpus {p} / --pipeline {stages})")
    if not q.zero_auto:
        res = price_pipeline(q, stages, layouts, stage_pricer(q), stage_context(q), bounds,
                             virtual, q.schedule)
        return pipeline_doc(q, res, None, None, None, expand, command="cost"), res
    # --zero auto: one setting for every stage (see pipeline_zero_auto), the fastest that
    # fits, or the leanest when none does (the lower stage, then all replicas, on a tie)
    from .search import ZeroTrial, zero_settings

    priced = []
    for stage, shard in zero_settings(q.zero_stages, q.zero_shards):
        zq = fixed_zero(q, stage, shard)
        res = price_pipeline(zq, stages, layouts, stage_pricer(zq), stage_context(zq),
                             bounds, virtual, q.schedule)
        doc = pipeline_doc(zq, res, None, None, None, expand, command="cost")
        priced.append((doc, res, (stage, shard != "all"),
                       ZeroTrial(stage, "fits" if res.fits else "does not fit", res.time_s,
                                 doc["iteration"]["comm_s"], res.peak_bytes, shard)))
    fitting = [f for f in priced if f[1].fits]
    doc, res, _, _ = min(fitting, key=lambda f: (f[1].time_s, f[2])) if fitting else \
        min(priced, key=lambda f: (f[1].peak_bytes, f[2]))
    return _with_trials(doc, "zero_auto", [f[3].to_data() for f in priced]), res


def _price(ctx: Any, options: Any, assignment: dict[int, Any], q: Question
           ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
    """One layout priced: evaluated as asked, or with ``--zero auto`` (``--zero-shard
    auto``) at every ZeRO setting, taking the fastest that fits (the lower stage, then
    sharding over all replicas, on a tie) or the leanest when none does. Returns the
    evaluation, the context and options it used, and the settings' trials."""
    import dataclasses

    from .evaluate import evaluate
    from .search import ZeroTrial, zero_settings

    if not q.zero_auto:
        return evaluate(ctx, options, assignment), ctx, options, None
    evs = []
    for stage, shard in zero_settings(q.zero_stages, q.zero_shards):
        opts = dataclasses.replace(options, zero=stage, zero_shard=shard)
        sctx = dataclasses.replace(ctx, zero=stage, zero_shard=shard)
        evs.append((evaluate(sctx, opts, assignment), opts, sctx))

    def order(e: tuple[Any, Any, Any]) -> tuple[int, str]:
        return e[1].zero, e[1].zero_shard != "all"

    fitting = [e for e in evs if e[0].memory.fits]
    ev, opts, sctx = min(fitting, key=lambda e: (e[0].time_s, order(e))) if fitting else \
        min(evs, key=lambda e: (e[0].memory.peak, order(e)))
    trials = [ZeroTrial(o.zero, "fits" if e.memory.fits else "does not fit", e.time_s,
                        e.comm_s, e.memory.peak, o.zero_shard).to_data() for e, o, _ in evs]
    return ev, sctx, opts, trials


def _cost_recompute(q: Question, assignment: dict[int, Any]
                    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None,
                               list[dict[str, Any]]]:
    """``cost --recompute auto``: the layout recomputing no block, then (when that does
    not fit) every block and the least number of blocks, the first ones, that fits, by
    bisection; the least that fits is taken, or every block when none does (each count
    priced by :func:`_price`). Returns its pricing and the counts' trials."""
    from .search import RecomputeTrial, price_least_recomputed

    taken, priced = price_least_recomputed(
        q.ctx, q.options, lambda c, o: _price(c, o, assignment, q),
        lambda p: bool(p[0].memory.fits))
    trials = [RecomputeTrial(n, "fits" if ev.memory.fits else "does not fit", ev.time_s,
                             ev.memory.peak).to_data()
              for n, (ev, *_) in sorted(priced.items())]
    return (*taken, trials)


def pin_candidates(q: Question, pins: tuple[str, ...]) -> dict[int, list[Any]]:
    """The layouts each pinned layer may take in the search (a pin without a grid keeps
    the mode and lets the search choose the grid and placement)."""
    from .layout import parse_pin
    from .strategies import candidate_layouts, unmatched_pin_message, why_invalid

    p, b = q.options.gpus, q.options.batch
    paper = q.options.cost_model == "gholami2018"
    parsed = [parse_pin(text, p) for text in pins]
    used = [False] * len(parsed)
    out: dict[int, list[Any]] = {}
    for layer in q.network.layers:
        if not layer.has_weights:
            continue
        for i, pin in enumerate(parsed):
            if not _matches(layer.name, pin.pattern):
                continue
            used[i] = True
            # a grid of one row is data parallelism whatever the mode says (as in cost)
            mode = "data" if pin.grid is not None and pin.grid[0] == 1 else pin.mode
            # sequence parallelism is searched on rows only; a pin may place it by cols
            seq = (pin.placement,) if pin.placement else ("rows",)
            allowed = [lay for lay in candidate_layouts(layer, p, b, paper,
                                                        sequence_placements=seq)
                       if lay.mode == mode and (pin.grid is None or lay.grid == pin.grid)
                       and (pin.placement is None or lay.placement == pin.placement)]
            if not allowed:
                from .layout import pin_layout

                wanted = pin_layout(pin, p)
                reason = why_invalid(layer, wanted, b, paper, q.options.microbatches > 1) \
                    or "no grid allows it"
                raise UsageError(f"planner: error: layer '{layer.name}' cannot use "
                                 f"{wanted.label()} (--pin '{pin.text}'): {reason}")
            out[layer.index] = allowed
            break
    for i, pin in enumerate(parsed):
        if not used[i] and not q.pins_matched:
            why = unmatched_pin_message(pin, q.network, parsed[:i])
            raise UsageError(f"planner: error: --{why}")
    return out


def pins_match_the_network(network: Any, pins: tuple[str, ...]) -> None:
    """UsageError for a pin that sets no layer of the whole network (first matching pin
    wins), before a pipeline's stages are searched: a stage's layers need not match
    every pin (`--pin 'fc*=model:2x4'` sets VGG-16's classifier, in its last stage, and
    was refused as matching no layer of the first; found by an audit of the README)."""
    from .layout import parse_pin, pin_grid_devices
    from .strategies import unmatched_pin_message

    # (a grid is a stage's: read against its own size, which pin_misfits checked)
    parsed = [parse_pin(text, pin_grid_devices(text) or 1) for text in pins]
    used = [False] * len(parsed)
    for layer in network.layers:
        if not layer.has_weights:
            continue
        first = next((i for i, pin in enumerate(parsed)
                      if _matches(layer.name, pin.pattern)), None)
        if first is not None:
            used[first] = True
    for i, pin in enumerate(parsed):
        if not used[i]:
            why = unmatched_pin_message(pin, network, parsed[:i])
            raise UsageError(f"planner: error: --{why}")


def run_search(q: Question, objective: str, pins: tuple[str, ...]) -> Any:
    """Search a question (raises NoFeasiblePlan). With --zero auto or --recompute auto
    the question takes the stage and the blocks the search chose."""
    from .search import search, search_recompute, search_zero

    pinned = pin_candidates(q, pins)

    def inner(ctx: Any, options: Any, recomputed: int = 0, no_plan: Any = None
              ) -> tuple[Any, Any, Any]:
        if q.zero_auto:
            return search_zero(ctx, options, objective, pinned, q.zero_stages, q.zero_shards,
                               recomputed, no_plan)
        return search(ctx, options, objective, pinned), ctx, options

    if q.recompute_auto:
        result, q.ctx, q.options = search_recompute(q.ctx, q.options, inner)
    else:
        result, q.ctx, q.options = inner(q.ctx, q.options)
    return result


def plan_doc(q: Question, result: Any, objective: str, expand: bool) -> dict[str, Any]:
    """The plan document of a search result."""
    from .output import rounded
    from .plan import placement_record, plan_document

    ev = result.best.evaluation
    bases = []
    for b in result.baselines:
        rec = b.to_data()
        if rec["applicable"]:
            rec["speedup"] = rec["time_s"] / ev.time_s if ev.time_s > 0 else 0.0
        bases.append(rec)
    extra = {
        "objective": objective,
        "search": {"evaluated": result.explored, "chosen": result.best.name,
                   "lower_bound_s": result.lower_bound_s, "notes": result.notes},
        "placement": placement_record(ev, q.options.gpus, q.cluster.devices_per_node, expand,
                                      q.cluster.device.kind),
        "baselines": rounded(bases, 4),
    }
    if result.zero_trials:
        extra["zero_auto"] = [t.to_data() for t in result.zero_trials]
    if result.recompute_trials:
        extra["recompute_auto"] = [t.to_data() for t in result.recompute_trials]
    return plan_document("plan", q.network, q.network_file, q.cluster.name, q.cluster_file,
                         q.options, ev, q.estimator_name, nodes_used(q), q.cluster.device,
                         extra, q.models_sha256)


objective_option = click.option(
    "--objective", type=click.Choice(("time", "comm")), default="time", show_default=True,
    help="time: iteration time (with overlap); comm: communication time alone.")
pin_option = click.option(
    "--pin", "pins", multiple=True, metavar="'GLOB=MODE[:PRxPC[:rows|cols]]'",
    help="Constrain matching layers: a mode (the search picks the grid and placement), "
         "a mode and a grid (the search picks the placement), or all three. Repeatable; "
         "the first match wins.")



def _pipeline_option(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    return count_or_auto(value, MAX_GPUS, "stages (a divisor of --gpus)")


def _virtual_option(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    return count_or_auto(value, MAX_GPUS, "model chunks a pipeline stage")


@click.command()
@problem_options
@gpus_option
@batch_option
@objective_option
@pin_option
@click.option("--pipeline", default="1", show_default=True, callback=_pipeline_option,
              metavar="S|auto",
              help="Pipeline parallelism: S stages of consecutive layers, each on P/S "
                   "devices, running --microbatches under the 1F1B schedule; auto: the "
                   "fastest stage count that fits (1: no pipeline).")
@click.option("--virtual-stages", "virtual", default="1", show_default=True,
              callback=_virtual_option, metavar="V|auto",
              help="With --pipeline: V model chunks a stage under Megatron-LM's "
                   "interleaved 1F1B (the network in V*S chunks, chunk c on stage c mod "
                   "S): a V-fold shorter fill and drain for V times the sends; "
                   "--microbatches a multiple of S. auto: the fastest V that fits.")
@schedule_option(auto=True)
@expand_option
@click.option("--all-layers", is_flag=True,
              help="Table: list every layer (those without communication, and each of "
              "the alike copies of a repeat group shown as one row).")
@jobs_option("the microbatch counts of --microbatches auto, a pipeline partition's "
             "stages")
@format_option
@output_option
def plan(network: str, cluster: str, gpus: int, batch: int, objective: str,
         pins: tuple[str, ...], pipeline: int | str, virtual: int | str, schedule: str,
         expand_ranks: bool, all_layers: bool, jobs: int | str, fmt: str | None,
         output: str | None, **kw: Any) -> None:
    """Search the best layout of every layer and place the ranks.

    Writes the plan (YAML/JSON for launch scripts, or a table): each layer's mode and
    P_r x P_c grid, its compute and communication, memory per device, the rank
    placement, and the baselines with the plan's speedup over each. With --pipeline,
    the stages too. Exit 0 with a plan, 1 when nothing fits in memory, 2 for invalid
    input.
    """
    from .plan import baselines_table, pipeline_table, plan_table

    ins = inputs_of(network, cluster, kw)
    check_output(output, ins)
    auto = kw["microbatches"] == "auto"
    if auto:
        microbatches_auto_check(kw["cost_model"], objective)
    q = load_question(network, cluster, gpus, batch, **{**kw, "microbatches": 1} if auto
                      else kw)
    if virtual != 1 and pipeline == 1:
        raise UsageError(f"planner: error: --virtual-stages {virtual} interleaves the "
                         "stages of a pipeline; give --pipeline 2 or more, or auto")
    schedule_option_check(schedule, pipeline, virtual, auto=True)
    q.schedule = schedule
    from .errors import NoFeasiblePlan
    from .parallel import resolve_jobs, running

    try:
        with searching() as q.progress, running(resolve_jobs(jobs)):
            if auto:
                try:
                    doc = microbatches_auto(q, pipeline, objective, pins, expand_ranks,
                                            virtual)
                except MicrobatchesFailed as exc:
                    if pipeline != 1:  # a stage's advice is a stage's: not checked
                        raise
                    checked = more_devices(exc.question, exc, objective, pins)
                    raise (checked if checked is exc else
                           MicrobatchesFailed(checked, exc.question, exc.trials)) from None
            else:
                try:
                    doc = plan_for(q, pipeline, objective, pins, expand_ranks, virtual)
                except NoFeasiblePlan as exc:
                    if pipeline != 1:  # a stage's advice is a stage's: not checked
                        raise
                    raise more_devices(q, exc, objective, pins) from None
    except NoFeasiblePlan as exc:
        _no_plan_document(q, exc, fmt, output)
        raise

    def table() -> Any:
        from rich.console import Group

        parts = [plan_table(doc, all_layers)]
        if "pipeline" in doc:
            parts.append(pipeline_table(doc))
        return Group(*parts, baselines_table(doc))

    render_data(doc, fmt, output, table, ins)
    overlap_note(doc)


def _no_plan_document(q: Question, exc: Exception, fmt: str | None,
                      output: str | None) -> None:
    """When nothing fits and the plan was asked for as JSON or YAML on standard output,
    a document a program can read there too (``plan: null``, the leanest layout's peak
    memory, the reason; as ``compare`` writes), besides the reason and exit 1. An ``-o``
    file is not written: it may hold the last plan that fitted."""
    from .errors import NoFeasiblePlan
    from .output import rounded
    from .plan import plan_header

    if output not in (None, "-") or (fmt or "table") == "table":
        return
    assert isinstance(exc, NoFeasiblePlan)
    head = plan_header("plan", q.network, q.network_file, q.cluster.name, q.cluster_file,
                       q.options, q.estimator_name, nodes_used(q), q.models_sha256)
    data: dict[str, Any] = {"planner": head["planner"], "inputs": head["inputs"],
                            "problem": head["problem"], "plan": None}
    if exc.shortfall is not None:
        data["leanest_peak_bytes"] = exc.shortfall.needed_bytes
    if isinstance(exc, MicrobatchesFailed):
        data["microbatches_auto"] = exc.trials
    data["error"] = str(exc).removeprefix("planner: ")
    render_data(rounded(data, 4), fmt, None, None)


#: seconds a search runs before a terminal is shown that it is running
SEARCHING_AFTER_S = 1.0


@contextlib.contextmanager
def searching(stream: Any = None, after_s: float = SEARCHING_AFTER_S
              ) -> Iterator[Callable[[str, str], None]]:
    """While the block runs, a line on a terminal's stderr that a search is running, for
    how long, and what its ``auto`` options try now (``planning: 16 microbatches, 4
    pipeline stages · 1:23``), shown after ``after_s`` seconds and removed at the end:
    a plan with ``--pipeline auto --recompute auto`` takes minutes. Nothing on a log or
    a pipe. Yields the callable that is told what is tried."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from .cli import console, watched

    con = console(stderr=True) if stream is None else Console(
        file=stream, force_terminal=True, width=120)
    trying: dict[str, str] = {}

    def tell(what: str, value: str) -> None:
        trying[what] = value

    if not con.is_terminal or (stream is None and not watched()):
        yield tell
        return
    start = time.monotonic()

    class _Line:
        def __rich__(self) -> Text:
            took = int(time.monotonic() - start)
            now = ", ".join(f"{v} {k}" for k, v in trying.items())
            return Text(f"planning{': ' + now if now else ''} · {took // 60}:{took % 60:02d}",
                        style="dim")

    live = Live(_Line(), console=con, transient=True, refresh_per_second=4)
    timer = threading.Timer(after_s, live.start)
    timer.daemon = True
    timer.start()
    try:
        yield tell
    finally:
        timer.cancel()
        timer.join()
        live.stop()


def plan_for(q: Question, pipeline: int | str, objective: str, pins: tuple[str, ...],
             expand: bool, virtual: int | str = 1) -> dict[str, Any]:
    """The plan document of ``planner plan`` for one count of microbatches."""
    if pipeline != 1:
        return pipeline_plan(q, pipeline, objective, pins, expand, virtual)
    return plan_doc(q, search_flat(q, objective, pins), objective, expand)


def plan_bound(q: Question, pipeline: int | str, objective: str, virtual: int | str
               ) -> float:
    """No step :func:`plan_for` can find for ``q`` is faster (seconds): the least of
    :func:`count_bounds` over the stage counts it tries (raises its usage errors)."""
    if pipeline == 1:
        return count_bounds(q, [1], virtual)[1]
    return min(count_bounds(q, stage_counts(q, pipeline, objective, virtual),
                            virtual).values())


class Beaten(Exception):
    """No step of a question can beat a plan in hand: its lower bound (seconds)."""

    def __init__(self, bound_s: float) -> None:
        super().__init__(bound_s)
        self.bound_s = bound_s


def bound_trial(bound_s: float, **keys: Any) -> dict[str, Any]:
    """An ``auto`` option's record of a count not searched: its step's lower bound is
    no faster than the best found (:mod:`planner.bounds`)."""
    return {**keys, "time_s": None, "outcome": "bound", "bound_s": bound_s}


#: each question's stage floors (the bounds ask them for a microbatch count before its
#: search, the search again per stage count and schedule; a worker inherits them)
_FLOORS: IdentityMemo[int, Any] = IdentityMemo(objects=16)


def stage_floor(q: Question, stages: int) -> Any:
    """:func:`~planner.bounds.compute_floor` of ``q``'s network on a stage's devices at
    the microbatch (recomputation only adds kernels: the floor recomputes nothing)."""
    import dataclasses

    from .bounds import compute_floor
    from .evaluate import make_context

    memo = _FLOORS.table(q)
    if stages not in memo:
        opts = dataclasses.replace(q.options, gpus=q.options.gpus // stages,
                                   recompute="none")
        memo[stages] = compute_floor(make_context(q.network, q.cluster, opts,
                                                  q.ctx.estimator))
    return memo[stages]


def count_bounds(q: Question, counts: list[int], virtual: int | str) -> dict[int, float]:
    """For each stage count, no step of ``q`` in that many stages is faster: the least
    of :func:`~planner.bounds.step_floor` over the schedules and chunk counts its search
    tries (``--schedule auto``: both; ``--virtual-stages auto``: one chunk and, where
    the microbatches allow, several)."""
    from .bounds import step_floor
    from .pipeline import max_stages
    from .schedules import INTERLEAVED, ZERO_BUBBLE

    m = q.options.microbatches
    schedules = (SCHEDULE, ZERO_BUBBLE) if q.schedule == AUTO_SCHEDULE else (q.schedule,)
    out: dict[int, float] = {}
    for s in counts:
        floor = stage_floor(q, s)
        if s == 1:
            out[s] = step_floor(floor, 1, m)
            continue
        chunks = [virtual] if isinstance(virtual, int) else \
            [1, *([2] if m % s == 0 and max_stages(q.network) >= 2 * s else [])]
        out[s] = min(step_floor(floor, s, m, v, INTERLEAVED) if v > 1 else
                     min(step_floor(floor, s, m, 1, name) for name in schedules)
                     for v in chunks)
    return out


def search_flat(q: Question, objective: str, pins: tuple[str, ...]) -> Any:
    """:func:`run_search` for a plan without pipeline stages: where nothing fits in memory
    and the network can be cut into stages, the message also suggests ``--pipeline
    auto`` (each stage keeps its layers' weights and state only)."""
    import dataclasses

    from .errors import NoFeasiblePlan
    from .pipeline import max_stages

    try:
        return run_search(q, objective, pins)
    except NoFeasiblePlan as exc:
        short = exc.shortfall
        if short is None or objective != "time" or q.options.cost_model != "exact" \
                or q.options.gpus < 2 or max_stages(q.network) < 2:
            raise
        tip = ("pipeline stages (--pipeline auto: each stage keeps only its layers' "
               "weights, gradients and optimizer state)")
        more = dataclasses.replace(short, suggestions=[*short.suggestions, tip])
        raise NoFeasiblePlan(more.message(), more, exc.baselines) from exc


def more_devices(q: Question, exc: Any, objective: str, pins: tuple[str, ...]) -> Any:
    """A flat plan that does not fit, its "more devices" advice checked by searching the
    same question on more devices (:func:`~planner.search.more_devices_checked`); with
    pins, whose grids are the question's device count's, ``exc`` as it is."""
    import dataclasses

    from .search import leanest_fits, more_devices_checked

    if pins:
        return exc

    def search_at(n: int) -> None:
        if q.progress is not None:
            q.progress("devices", f"{n:,}")
        at = dataclasses.replace(q, options=dataclasses.replace(q.options, gpus=n),
                                 ctx=dataclasses.replace(q.ctx, gpus=n))
        if not leanest_fits(at.ctx, at.options):  # fits: a plan does; else search it
            run_search(at, objective, ())

    return more_devices_checked(exc, q.options.gpus, q.options.batch,
                                q.cluster.max_devices(), search_at)


#: ``--microbatches auto`` stops after this many counts in a row slower than the best
MICROBATCH_PATIENCE = 3


def microbatches_auto_check(cost_model: str, objective: str) -> None:
    if cost_model == "gholami2018":
        raise UsageError("planner: error: --microbatches needs --cost-model exact: the "
                         "paper's accounting (Gholami et al. 2018) runs one pass a step; "
                         "drop --microbatches or the cost model")
    if objective != "time":
        raise UsageError("planner: error: --microbatches auto plans for --objective time: "
                         "more microbatches trade compute efficiency for memory, not "
                         "communication volume; give a count or drop --objective")


def with_microbatches(q: Question, count: int) -> Question:
    """The question with the step's batch in ``count`` microbatches."""
    import dataclasses

    from .evaluate import check_question, make_context

    opts = dataclasses.replace(q.options, batch=q.options.step_batch // count,
                               microbatches=count)
    check_question(q.network, q.cluster, opts)
    return dataclasses.replace(q, options=opts,
                               ctx=make_context(q.network, q.cluster, opts, q.ctx.estimator))


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, by trial division up to its square root (a
    scan of 1..n took hours for a batch of 2^40: an audit)."""
    import math

    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


class MicrobatchesFailed(NoFeasiblePlan):
    """``--microbatches auto`` with no count that fits: the failure of the count that came
    nearest, its question (for the "more devices" advice to check) and the counts
    tried (for the document that says nothing fits)."""

    def __init__(self, failure: NoFeasiblePlan, question: Question,
                 trials: list[dict[str, Any]]) -> None:
        message, lead = str(failure), "planner: no plan fits in memory: "
        m = question.options.microbatches
        if message.startswith(lead) and len(trials) > 1:
            message = (f"planner: no plan fits in memory with any of the {len(trials)} "
                       f"microbatch counts tried; the nearest, {m:,}: "
                       + message.removeprefix(lead))
        super().__init__(message, failure.shortfall, failure.baselines)
        self.question, self.trials = question, trials

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the failure alone (a sweep's row in a ``--jobs`` worker)."""
        return (NoFeasiblePlan, self._resolved())


def microbatches_auto(q: Question, pipeline: int | str, objective: str,
                      pins: tuple[str, ...], expand: bool, virtual: int | str = 1
                      ) -> dict[str, Any]:
    """``plan --microbatches auto``: every count that divides the batch, from 1 up, each
    planned as asked (``--pipeline`` included), until :data:`MICROBATCH_PATIENCE` counts
    in a row are slower than the best so far; the fastest plan (the fewer microbatches
    on a tie), with the counts tried as ``microbatches_auto``. Interleaved stages with a
    given stage count try the multiples of that count. A count whose every stage count's
    lower bound is no faster than the best so far is not searched (:class:`Beaten`,
    ``bound`` in the record) and counts as a slower one."""
    from .bounds import beaten
    from .errors import NoFeasiblePlan
    from .output import rounded
    from .parallel import Ahead
    from .search import least_state_bytes
    from .units import format_bytes

    batch = q.options.step_batch
    step = pipeline if isinstance(virtual, int) and virtual > 1 and \
        isinstance(pipeline, int) else 1
    counts = [m for m in divisors(batch) if m % step == 0]
    if not counts:
        raise UsageError(f"planner: error: --virtual-stages {virtual} needs a multiple of "
                         f"the {pipeline} stages microbatches, and no multiple of "
                         f"{pipeline} divides the batch {batch}")
    trials: list[dict[str, Any]] = []
    best: tuple[float, dict[str, Any]] | None = None
    errors: list[tuple[int, NoFeasiblePlan]] = []  # (count's place, its failure)
    slower = 0
    # each count's question (or the error asking it raised), made once, by the loop or
    # by the look-ahead deciding whether to start it
    made: dict[int, Question | Exception] = {}

    def question(i: int) -> Question:
        if i not in made:
            try:
                made[i] = with_microbatches(q, counts[i])
            except Exception as exc:
                made[i] = exc
        got = made[i]
        if isinstance(got, Exception):
            raise got
        return got

    def floor(i: int) -> float:  # its stage floors are memoised (stage_floor)
        return plan_bound(question(i), pipeline, objective, virtual)

    def prepare(i: int) -> Callable[[], dict[str, Any]]:
        qi = question(i)
        return lambda: plan_for(qi, pipeline, objective, pins, expand, virtual)

    # what no count of microbatches changes (flat plans without --zero auto; the first
    # count is always searched, for the error's tips): a count whose parameter state alone
    # is over the capacity has no plan, and is not searched
    zero = max((q.options.zero, *q.zero_stages))
    capacity = q.cluster.capacity_bytes

    def hopeless(i: int) -> float | None:
        if i == 0 or pipeline != 1:
            return None
        need = least_state_bytes(question(i).ctx, question(i).options, zero)
        return need if need > capacity else None

    def may_run(i: int) -> bool:  # False only where the loop will skip count i
        try:
            return hopeless(i) is None and (best is None or not beaten(floor(i), best[0]))
        except Exception:  # the loop raises it when it gets there
            return True

    with Ahead(len(counts), prepare, may_run) as ahead:
        for i, m in enumerate(counts):
            if q.progress is not None:
                q.progress("microbatches", f"{m:,}")
            try:
                question(i)
                need = hopeless(i)
                if need is not None:
                    ahead.skip(i)
                    trials.append({"microbatches": m, "time_s": None, "outcome": (
                        f"no plan fits in memory: the parameter state alone needs at least "
                        f"{format_bytes(need)} per device, {format_bytes(capacity)} is "
                        "available"), "state_bytes": need})
                    continue
                if best is not None and beaten(floor(i), best[0]):
                    ahead.skip(i)
                    raise Beaten(floor(i))
                doc = ahead.get(i)
            except NoFeasiblePlan as exc:
                errors.append((i, exc))
                trials.append({"microbatches": m, "time_s": None, "outcome": _why(exc)})
                continue
            except Beaten as exc:  # no faster than the best: as a slower count
                trials.append(bound_trial(exc.bound_s, microbatches=m))
                slower += 1
                if slower >= MICROBATCH_PATIENCE:
                    break
                continue
            t = float(doc["iteration"]["time_s"])
            pipe = doc["problem"].get("pipeline") or {}
            trials.append({"microbatches": m, "time_s": t, "outcome": "plan",
                           **({"stages": pipe.get("stages", 1)} if pipeline != 1 else {}),
                           **({"virtual_stages": pipe.get("virtual_stages", 1)}
                              if virtual == "auto" else {}),
                           **({"schedule": pipe.get("schedule", SCHEDULE)}
                              if q.schedule == AUTO_SCHEDULE else {})})
            if best is None or t < best[0]:
                best, slower = (t, doc), 0
            else:
                slower += 1
                if slower >= MICROBATCH_PATIENCE:
                    break
    if best is None:
        # the failure of the count that came nearest to fitting (the fewer microbatches
        # on a tie), with what was tried: the first count's said what 1 microbatch
        # needs, where more needed far less (Mixtral 8x7B on 8 H100s at batch 128: short
        # by 557.2 GiB, where 128 microbatches are short by 12.65 GiB; an audit)
        assert errors
        i, error = min(errors, key=lambda e: (
            e[1].shortfall.needed_bytes if e[1].shortfall is not None else math.inf, e[0]))
        raise MicrobatchesFailed(error, question(i), rounded(trials, 4))
    doc = {k: v for k, v in best[1].items() if k != "layers"}
    doc["microbatches_auto"] = rounded(trials, 4)
    doc["layers"] = best[1]["layers"]
    return doc


def stage_counts(q: Question, stages: int | str, objective: str, virtual: int | str
                 ) -> list[int]:
    """The stage counts ``--pipeline stages`` tries (``auto``: every count that divides
    the devices and the network's boundaries allow, 1 included; with ``virtual`` chunks
    a stage, the counts the interleaved schedule allows); raises the usage errors of
    a count that cannot be asked."""
    from .pipeline import max_stages, virtual_check

    if objective != "time":
        raise UsageError("planner: error: --pipeline plans for --objective time: a "
                         "pipeline's bubble is idle time, not communication; drop one")
    p, m = q.options.gpus, q.options.microbatches
    if stages == "auto":
        if q.options.cost_model == "gholami2018":
            stage_count_check(q, 2)  # its message
        most = max_stages(q.network)
        counts = [s for s in range(1, min(p, most) + 1) if p % s == 0
                  and (s == 1 or not isinstance(virtual, int) or virtual == 1
                       or (m % s == 0 and s * virtual <= most))]
    else:
        assert isinstance(stages, int)
        stage_count_check(q, stages)
        if isinstance(virtual, int):
            virtual_check(q.network, stages, virtual, m)
        counts = [stages]
    return counts


def pipeline_plan(q: Question, stages: int | str, objective: str, pins: tuple[str, ...],
                  expand: bool, virtual: int | str = 1) -> dict[str, Any]:
    """The plan document of ``--pipeline``: the fastest of :func:`stage_counts` that
    fits (``virtual="auto"``: :func:`best_interleaving` for each count). A stage count
    whose step's lower bound (:func:`count_bounds`) is no faster than the best count so
    far is not searched (``bound`` in ``pipeline_auto``). With ``--zero auto`` (or
    ``--zero-shard auto``) and stages, :func:`pipeline_zero_auto`."""
    if q.zero_auto and any(s > 1 for s in stage_counts(q, stages, objective, virtual)):
        return pipeline_zero_auto(q, stages, objective, pins, expand, virtual)
    return _pipeline_search(q, stages, objective, pins, expand, virtual)[0]


def pin_misfits(q: Question, stages: int | str, counts: list[int], pins: tuple[str, ...]
                ) -> dict[int, str]:
    """The stage counts of ``counts`` (and 1, the plan without stages, which is always
    searched, as a count or as a baseline) a pin's grid does not fit, each with why: with
    stages, a pin's grid is one stage's, ``P/S`` devices (``--pin 'fc*=model:2x4'`` on 16
    devices: 2 stages; 1, the plan without stages, wants 16). UsageError where none
    fits, naming the pin and the devices a stage has (a stage-sized grid exited 2 before:
    the plan without stages, searched first, said the grid's 8 devices were not the 16
    of --gpus; found by an audit)."""
    from .layout import pin_grid_devices

    p = q.options.gpus
    sized = [(text, d) for text in pins if (d := pin_grid_devices(text)) is not None]
    out: dict[int, str] = {}
    for s in sorted({1, *counts}):
        wrong = next(((text, d) for text, d in sized if d * s != p), None)
        if wrong is not None:
            out[s] = (f"--pin '{wrong[0]}' has a grid of {wrong[1]} devices, and "
                      + ("the plan without stages has all " if s == 1 else
                         f"a stage of {s} has ") + f"{p // s}")
    if counts and all(s in out for s in counts):
        text, d = next((t, d) for t, d in sized if any(d * s != p for s in counts))
        if stages == "auto":
            raise UsageError(f"planner: error: --pin '{text}': with --pipeline auto a "
                             f"pin's grid is one stage's, and no stage count gives a stage "
                             f"{d} of the {p} devices (P/S for S among "
                             f"{', '.join(map(str, counts))}); give a grid of one of those "
                             "sizes, or a pin without a grid")
        raise UsageError(f"planner: error: --pin '{text}': with --pipeline {stages} a "
                         f"pin's grid is one stage's, {p // counts[0]} devices (--gpus {p} "
                         f"/ --pipeline {stages}), not {d}")
    return out


def fixed_zero(q: Question, stage: int, shard: str) -> Question:
    """``q`` with one ZeRO setting, as if ``--zero stage --zero-shard shard`` were
    given."""
    import dataclasses

    return dataclasses.replace(
        q, zero_stages=(stage,), zero_shards=(shard,),
        options=dataclasses.replace(q.options, zero=stage, zero_shard=shard),
        ctx=dataclasses.replace(q.ctx, zero=stage, zero_shard=shard))


def pipeline_zero_auto(q: Question, stages: int | str, objective: str,
                       pins: tuple[str, ...], expand: bool, virtual: int | str = 1
                       ) -> dict[str, Any]:
    """``--zero auto`` with pipeline stages: one ZeRO setting for every stage, as
    Megatron-LM's distributed optimizer and DeepSpeed's ``zero_optimization.stage`` are
    one setting for the job. Each setting plans the whole pipeline (every stage count
    asked, the plan without stages among them), by :func:`search_zero`'s rules: stages 0
    and 1 always; stage 2, which prices every layout as stage 1 does and only keeps
    less, only when stage 1's pipeline was turned down something for memory
    (:attr:`~planner.pipeline.PipelineResult.memory_bound`, a count or the plan without
    stages that had no plan); stage 3 by the same rule unless its gathers are
    prefetched. The fastest step wins (the lower stage, then sharding over all
    replicas, on a tie); its document records every setting in ``zero_auto``.

    (Each stage choosing its own setting, as a plan without stages does, gave stages
    of one plan different ZeRO stages, which no launcher runs, and the plan's
    ``problem.zero`` said 0: found by an audit. Nor was the mix the fastest: Llama 3 8B
    in 2 stages on 16 H100s chose 1 and 3, a 3.301 s step, against 3.297 s with 1 for
    both.)"""
    import dataclasses

    from .errors import NoFeasiblePlan
    from .evaluate import prefetches, zero_label
    from .search import ZeroTrial, zero_settings
    from .units import format_time

    prefetch = prefetches(dataclasses.replace(q.ctx, zero=3), q.options)
    trials: list[ZeroTrial] = []
    found: list[tuple[float, int, bool, dict[str, Any]]] = []
    limits: list[bool] = []  # each trial with a plan: whether memory turned one down
    failure: NoFeasiblePlan | None = None
    for stage, shard in zero_settings(q.zero_stages, q.zero_shards):
        prev = trials[-1] if trials and trials[-1].shard == shard and \
            trials[-1].stage == stage - 1 else None
        if stage >= 2 and not (stage == 3 and prefetch) and prev is not None \
                and not prev.outcome.startswith("no plan") \
                and not (prev.outcome == "plan" and limits[-1]):
            base = prev.stage if prev.outcome == "plan" else 1
            trials.append(ZeroTrial(stage, f"same as {base}" if stage == 2
                                    else f"not faster than {base}", shard=shard))
            continue
        zq = fixed_zero(q, stage, shard)
        try:
            doc, time_s, limited = _pipeline_search(zq, stages, objective, pins, expand,
                                                    virtual)
        except NoFeasiblePlan as exc:
            failure = exc
            trials.append(ZeroTrial(stage, "no plan", shard=shard))
            continue
        it = doc["iteration"]
        trials.append(ZeroTrial(stage, "plan", time_s, it["comm_s"],
                                doc["memory"]["peak_bytes"], shard))
        limits.append(limited)
        found.append((time_s, stage, shard != "all", doc))
    if not found:
        assert failure is not None
        raise failure
    time_s, stage, local, doc = min(found, key=lambda f: f[:3])
    chosen = zero_label(stage, "node" if local else "all")
    scored = [f"{zero_label(t.stage, t.shard)} {format_time(t.time_s)}" for t in trials
              if t.outcome == "plan" and zero_label(t.stage, t.shard) != chosen
              and t.time_s is not None]
    asked = "--zero auto" if len(set(q.zero_stages)) > 1 else "--zero-shard auto"
    note = (f"{asked} chose {chosen} for every pipeline stage"
            + (f" (searched: {', '.join(scored)})" if scored else ""))
    if "search" in doc:
        doc["search"]["notes"].append(note)
    return _with_trials(doc, "zero_auto", [t.to_data() for t in trials])


def _pipeline_search(q: Question, stages: int | str, objective: str, pins: tuple[str, ...],
                     expand: bool, virtual: int | str = 1
                     ) -> tuple[dict[str, Any], float, bool]:
    """:func:`pipeline_plan` for one ZeRO setting: the document, its step (seconds,
    unrounded) and whether memory turned something down on the way (the plan without
    stages or a stage count had no plan, or found something faster that did not fit)."""
    import dataclasses

    from .bounds import beaten
    from .errors import NoFeasiblePlan

    counts = stage_counts(q, stages, objective, virtual)
    misfit = pin_misfits(q, stages, counts, pins)
    if pins:
        pins_match_the_network(q.network, pins)
        q = dataclasses.replace(q, pins_matched=True)
    bounds = count_bounds(q, counts, virtual)
    context = stage_context(q)
    flat_q = dataclasses.replace(q)
    flat_bases: list[dict[str, Any]] = []  # priced even where nothing fits without stages
    flat: Any = None
    if 1 not in misfit:
        try:
            flat = run_search(flat_q, objective, pins)
        except NoFeasiblePlan as exc:
            flat_bases = exc.baselines or []
    limited = flat is None or flat.memory_bound
    trials: list[dict[str, Any]] = []
    chunk_trials: list[dict[str, Any]] = []
    schedule_trials: list[dict[str, Any]] = []
    best: Any = None  # (time, stage count, result)
    error: NoFeasiblePlan | None = None
    for s in counts:
        if q.progress is not None and stages == "auto":
            q.progress("pipeline stages", f"{s:,}")
        if s in misfit:
            trials.append({"stages": s, "time_s": None, "outcome": misfit[s]})
            continue
        if s == 1:
            if flat is None:
                trials.append({"stages": 1, "time_s": None, "outcome": "no plan"})
                continue
            t = flat.best.evaluation.time_s
            trials.append({"stages": 1, "time_s": t, "outcome": "plan"})
            if best is None or t < best[0]:
                best = (t, 1, flat)
            continue
        if best is not None and beaten(bounds[s], best[0]):
            trials.append(bound_trial(bounds[s], stages=s))
            continue
        try:
            if virtual == "auto":
                res = best_interleaving(q, s, objective, pins, context, chunk_trials,
                                        schedule_trials)
            else:
                assert isinstance(virtual, int)
                res = best_schedule(q, s, objective, pins, context, virtual,
                                    schedule_trials)
        except NoFeasiblePlan as exc:
            error = error or exc
            limited = True
            trials.append({"stages": s, "time_s": None, "outcome": _why(exc)})
            continue
        limited = limited or res.memory_bound
        trials.append({"stages": s, "time_s": res.time_s, "outcome": "plan",
                       **({"virtual_stages": res.virtual} if virtual == "auto" else {}),
                       **({"schedule": res.schedule} if q.schedule == AUTO_SCHEDULE
                          else {})})
        if best is None or res.time_s < best[0]:
            best = (res.time_s, s, res)
    if best is None:
        if error is not None:
            raise error
        raise NoFeasiblePlan("planner: no feasible plan with any pipeline stage count",
                             None)
    bases = plan_doc(flat_q, flat, objective, False)["baselines"] if flat is not None \
        else flat_bases
    if best[1] == 1:
        doc = plan_doc(flat_q, flat, objective, expand)
        if stages == "auto":
            doc = _with_trials(doc, "pipeline_auto", trials)
    else:
        doc = pipeline_doc(q, best[2], flat, bases, trials if stages == "auto" else None,
                           expand, flat_reason=misfit.get(1))
    if virtual == "auto":
        doc = _with_trials(doc, "virtual_auto", chunk_trials)
    if schedule_trials:
        doc = _with_trials(doc, "schedule_auto", schedule_trials)
    return doc, best[0], limited


#: ``--virtual-stages auto`` stops after this many chunk counts in a row slower than the
#: best (or not fitting): more chunks shorten the fill and drain by less each time while
#: their sends and memory grow
VIRTUAL_PATIENCE = 2


def best_schedule(q: Question, stages: int, objective: str, pins: tuple[str, ...],
                  context: Callable[[Any, Any], Any], virtual: int,
                  trials: list[dict[str, Any]]) -> Any:
    """The best pipelined plan of ``stages`` stages of ``virtual`` model chunks under
    ``q.schedule``; ``auto``: under every schedule that runs ``virtual`` chunks a stage
    (1F1B and ZB-H1 for one, interleaved 1F1B alone for more), the fastest kept (the
    first on a tie: 1F1B, which holds fewer microbatches on the later stages), the
    outcome of each where there was a choice appended to ``trials``. Raises the first
    NoFeasiblePlan when none fits."""
    import dataclasses

    from .bounds import beaten, step_floor
    from .errors import NoFeasiblePlan
    from .pipeline import search_pipeline
    from .schedules import ZERO_BUBBLE

    if q.schedule != AUTO_SCHEDULE or virtual > 1:
        return search_pipeline(dataclasses.replace(q), stages, objective, pins,
                               run_search, context, virtual,
                               SCHEDULE if q.schedule == AUTO_SCHEDULE else q.schedule)
    best: Any = None
    error: NoFeasiblePlan | None = None
    floor = None
    limited = False
    for name in (SCHEDULE, ZERO_BUBBLE):
        if best is not None:
            if floor is None:
                floor = stage_floor(q, stages)
            bound = step_floor(floor, stages, q.options.microbatches, 1, name)
            if beaten(bound, best.time_s):
                trials.append(bound_trial(bound, stages=stages, schedule=name))
                continue
        try:
            res = search_pipeline(dataclasses.replace(q), stages, objective, pins,
                                  run_search, context, virtual, name)
        except NoFeasiblePlan as exc:
            error = error or exc
            limited = True
            trials.append({"stages": stages, "schedule": name, "time_s": None,
                           "outcome": _why(exc)})
            continue
        limited = limited or res.memory_bound
        trials.append({"stages": stages, "schedule": name, "time_s": res.time_s,
                       "outcome": "plan"})
        if best is None or res.time_s < best.time_s:
            best = res
    if best is None:
        assert error is not None
        raise error
    best.memory_bound = limited  # any schedule's: a leaner ZeRO stage may let it win
    return best


def best_interleaving(q: Question, stages: int, objective: str, pins: tuple[str, ...],
                      context: Callable[[Any, Any], Any], trials: list[dict[str, Any]],
                      schedule_trials: list[dict[str, Any]]) -> Any:
    """``--virtual-stages auto`` for ``stages`` stages: 1, 2, … model chunks a stage (more
    than one where the microbatches are a multiple of the stages), as many as the
    network's boundaries allow, until :data:`VIRTUAL_PATIENCE` counts in a row are
    slower or do not fit; the fastest (the fewer chunks on a tie). Each count is planned
    by :func:`best_schedule` (which appends to ``schedule_trials``). Appends each count's
    outcome to ``trials``; raises the first NoFeasiblePlan when none fits."""
    from .bounds import beaten, step_floor
    from .errors import NoFeasiblePlan
    from .pipeline import max_stages
    from .schedules import INTERLEAVED

    most = max_stages(q.network) // stages
    counts = [v for v in range(1, most + 1)
              if v == 1 or q.options.microbatches % stages == 0]
    best: Any = None
    error: NoFeasiblePlan | None = None
    slower = 0
    floor = None
    limited = False
    for v in counts:
        if best is not None and v > 1:  # every chunk count has one bound
            if floor is None:
                floor = stage_floor(q, stages)
            bound = step_floor(floor, stages, q.options.microbatches, v, INTERLEAVED)
            if beaten(bound, best.time_s):  # as a slower count
                trials.append(bound_trial(bound, stages=stages, virtual_stages=v))
                slower += 1
                if slower >= VIRTUAL_PATIENCE:
                    break
                continue
        try:
            res = best_schedule(q, stages, objective, pins, context, v, schedule_trials)
        except NoFeasiblePlan as exc:
            error = error or exc
            limited = True
            trials.append({"stages": stages, "virtual_stages": v, "time_s": None,
                           "outcome": _why(exc)})
            slower += 1
        else:
            limited = limited or res.memory_bound
            trials.append({"stages": stages, "virtual_stages": v, "time_s": res.time_s,
                           "outcome": "plan"})
            if best is None or res.time_s < best.time_s:
                best, slower = res, 0
            else:
                slower += 1
        if slower >= VIRTUAL_PATIENCE:
            break
    if best is None:
        assert error is not None
        raise error
    best.memory_bound = limited  # any chunk count's
    return best


def _why(exc: Exception) -> str:
    """A trial's outcome when it has no plan: the reason, without the tips (they are
    for the trial's own question, not the one asked)."""
    return str(exc).removeprefix("planner: ").split("; try ")[0]


def _with_trials(doc: dict[str, Any], key: str, trials: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    """The plan with what an ``auto`` option tried under ``key`` (before its layers,
    which come last)."""
    from .output import rounded

    out = {k: v for k, v in doc.items() if k != "layers"}
    out[key] = rounded(trials, 4)
    out["layers"] = doc["layers"]
    return out


def pipeline_doc(q: Question, res: Any, flat: Any, bases: list[dict[str, Any]] | None,
                 trials: list[dict[str, Any]] | None, expand: bool, command: str = "plan",
                 flat_reason: str | None = None) -> dict[str, Any]:
    """The plan document of a pipelined plan: the stages' layers one after the other,
    each with its stage; the iteration of the whole step; the busiest stage's memory;
    every stage's placement on its ranks; the unpipelined plan among the baselines
    (``command`` cost: given layouts, so no search and no baselines; ``flat_reason``:
    why the plan without stages was not searched)."""
    from .evaluate import question_param_bytes
    from .output import rounded
    from .plan import layer_record, placement_record, plan_header, utilisation
    from .schedules import PASSES

    stages = res.stages
    v = res.virtual
    count = len(stages) // v
    m = res.microbatches
    evs = [st.evaluation for st in stages]
    head = plan_header(command, q.network, q.network_file, q.cluster.name, q.cluster_file,
                       q.options, q.estimator_name, nodes_used(q), q.models_sha256)
    schedule = res.schedule
    interleave = {"virtual_stages": v} if v > 1 else {}
    head["problem"]["pipeline"] = {"stages": count, **interleave, "schedule": schedule,
                                   **({"boundaries": "layers"}
                                      if q.network.stage_unit == "layers" else {})}
    if q.recompute_auto:  # each stage's count is in its record (stage_plans: recompute)
        head["problem"]["recompute"] = "auto"

    def per_stage(value: Callable[[Any, Any], float]) -> float:
        """The largest over the pipeline stages of a figure added over their chunks."""
        return max(sum(value(ev, st) for ev, st in zip(evs, stages, strict=True)
                       if st.index == s) for s in range(count))

    compute = per_stage(lambda ev, st: ev.compute_s)
    # the tied weights' gradient all-reduces between stages run once a step, on its
    # critical path (left out of comm_s, they were time no figure accounted for: an audit)
    comm = per_stage(lambda ev, st: ev.comm_s + m * st.send_s) + res.ties_s
    # what the busiest stage waits for besides its compute, the schedule's bubble apart
    # (the bubble is idle time, not communication: found by an audit, where 70B's
    # exposed figure was all its communication because the bubble outgrew it)
    # (a difference of sums: its rounding residue, 1e-19 s where nothing waits, is 0)
    gap = res.time_s - res.bubble_s - compute
    exposed = min(comm, gap if gap > 1e-9 * res.time_s else 0.0)
    iteration = {
        "time_s": res.time_s,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "forward_s": sum(ev.forward_s for ev in evs),
        "backward_s": sum(ev.backward_s for ev in evs),
        "optimizer_s": per_stage(lambda ev, st: ev.optimizer_s),
        "weight_grad_s": per_stage(lambda ev, st: ev.weight_grad_s * ev.reductions),
        "activation_comm_s": per_stage(lambda ev, st: ev.activation_comm_s),
        "parameters_comm_s": per_stage(lambda ev, st: ev.parameters_s),
        "recompute_s": per_stage(lambda ev, st: ev.recompute_s),
        "bubble_s": res.bubble_s,
        "samples_per_s": q.options.step_batch / res.time_s if res.time_s > 0 else 0.0,
        **utilisation(q.network, q.cluster.device, q.options.gpus, q.options.step_batch,
                      res.time_s),
    }
    memory = {**res.memories[res.fullest].to_data(), "stage": res.fullest}
    grids: list[dict[str, Any]] = []
    stage_recs: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []
    per_node = q.cluster.devices_per_node
    for st, ev in zip(stages, evs, strict=True):
        pl = placement_record(ev, st.devices, per_node, expand, q.cluster.device.kind,
                              st.first_rank % per_node)
        chunk = {"chunk": st.chunk} if v > 1 else {}
        for g in pl["grids"]:
            g = {"stage": st.index, **chunk, "first_rank": st.first_rank, **g}
            if expand:
                for key in ("row_groups", "col_groups"):
                    g[key]["ranks"] = [[st.first_rank + r for r in grp]
                                       for grp in g[key]["ranks"]]
            grids.append(g)
        so = st.question.options
        pb = question_param_bytes(st.question.network, so)
        for r in ev.layers:
            layers.append({"stage": st.index, **chunk,
                           **layer_record(r, pb, st.question.options.zero)})
        own = res.memories[st.index]
        stage_recs.append({
            "stage": st.index,
            **chunk,
            "layers": [q.network.layers[st.lo].name, q.network.layers[st.hi - 1].name],
            "layer_count": st.hi - st.lo,
            "ranks": [st.first_rank, st.first_rank + st.devices - 1],
            "inflight": st.inflight,
            "microbatch_s": st.microbatch_s,
            "send_s": st.send_s,
            # the passes its schedule runs: forward and backward (ZB-H1: the backward's
            # input and weight gradients apart), each with its send
            "passes_s": dict(zip(PASSES[schedule], st.passes(schedule), strict=True)),
            "tail_s": st.tail_s,
            # the stage's devices' peak, all its chunks' (with interleaving; each chunk
            # was planned in its share)
            "peak_bytes": own.peak,
            "fits": own.fits,
            # the count of blocks recomputed where the question left it to the stage
            # (ZeRO is one setting for every stage: pipeline_zero_auto)
            **({"recompute": so.recompute} if q.recompute_auto else {}),
            "notes": st.result.notes,
        })
    placement = {
        "devices": q.options.gpus,
        "devices_per_node": per_node,
        "device_kind": q.cluster.device.kind,
        "nodes": nodes_used(q),
        "rank_to_device": f"rank k runs on node k // {per_node}, local device k % "
                          f"{per_node}",
        "stage_ranks": f"stage s runs on ranks s*{stages[0].devices} + k for k in "
                       f"0..{stages[0].devices - 1}; a grid's rules number the ranks of "
                       "its stage from first_rank",
        "grids": grids,
    }
    doc: dict[str, Any] = {**head, "iteration": iteration, "memory": memory}
    if bases is not None:
        doc["objective"] = "time"
        doc["search"] = {"evaluated": sum(st.result.explored for st in stages),
                         "chosen": "pipeline", "lower_bound_s": None,
                         "notes": [f"{count} pipeline stages"
                                   + (f" of {v} model chunks" if v > 1 else "")]}
    doc["pipeline"] = {
        "stages": count,
        **interleave,
        "microbatches": m,
        "schedule": schedule,
        "bubble_s": res.bubble_s,
        "bubble_fraction": res.bubble_s / res.time_s if res.time_s > 0 else 0.0,
        "tied_allreduce_s": res.ties_s,
        "stage_plans": stage_recs,
        "partitions": [{"bounds": [q.network.layers[b].name if b < len(q.network.layers)
                                   else None for b in part["bounds"][:-1]],
                        "time_s": part["time_s"], "outcome": part["outcome"]}
                       for part in res.partitions],
    }
    doc["placement"] = placement
    if bases is not None:
        doc["baselines"] = _pipeline_baselines(res, flat, bases, flat_reason)
    if trials is not None:
        doc["pipeline_auto"] = trials
    doc["layers"] = layers
    return rounded(doc, 4)  # type: ignore[no-any-return]


def _pipeline_baselines(res: Any, flat: Any, bases: list[dict[str, Any]],
                        reason: str | None = None) -> list[dict[str, Any]]:
    """The unpipelined plan, then its baselines, each with its speedup over ``res``."""
    flat_t = flat.best.evaluation.time_s if flat is not None else None
    baselines = [{"name": "no pipeline",
                  "description": "the searched plan on all devices, without stages",
                  "applicable": flat is not None,
                  **({"time_s": flat_t, "comm_s": flat.best.evaluation.comm_s,
                      "exposed_comm_s": flat.best.evaluation.exposed_comm_s,
                      "peak_bytes": flat.best.evaluation.memory.peak,
                      "fits": flat.best.evaluation.memory.fits,
                      "speedup": flat_t / res.time_s} if flat is not None else
                     {"reason": reason or "nothing fits without a pipeline"})}]
    for b in bases:
        b = dict(b)
        if b.get("applicable") and b.get("time_s"):
            b["speedup"] = b["time_s"] / res.time_s
        baselines.append(b)
    return baselines


@click.command()
@problem_options
@gpus_option
@batch_option
@objective_option
@pin_option
@format_option
@output_option
def compare(network: str, cluster: str, gpus: int, batch: int, objective: str,
            pins: tuple[str, ...], fmt: str | None, output: str | None, **kw: Any) -> None:
    """The baselines and the searched plan side by side."""
    from .errors import NoFeasiblePlan
    from .output import rounded
    from .plan import baselines_table, plan_header

    ins = inputs_of(network, cluster, kw)
    check_output(output, ins)
    q = load_question(network, cluster, gpus, batch, **kw)
    try:
        result = search_flat(q, objective, pins)
    except NoFeasiblePlan as failed:
        if failed.baselines is None or failed.shortfall is None:
            raise
        exc = more_devices(q, failed, objective, pins)  # checked, as plan's advice
        # what was compared, each baseline with its memory, then the reason (exit 1)
        head = plan_header("plan", q.network, q.network_file, q.cluster.name, q.cluster_file,
                           q.options, q.estimator_name, nodes_used(q), q.models_sha256)
        data = {"planner": head["planner"], "inputs": head["inputs"],
                "problem": head["problem"], "plan": None,
                "leanest_peak_bytes": exc.shortfall.needed_bytes,
                "baselines": exc.baselines, "error": str(exc).removeprefix("planner: ")}
        data = rounded(data, 4)
        render_data(data, fmt, output, lambda: baselines_table(data), ins)
        raise exc from None
    doc = plan_doc(q, result, objective, False)
    data = {"planner": doc["planner"], "inputs": doc["inputs"], "problem": doc["problem"],
            "plan": {"iteration": doc["iteration"], "memory": {
                k: doc["memory"][k] for k in ("peak_bytes", "capacity_bytes", "fits")},
                "layouts": _layout_summary(doc)},
            **({"zero_auto": doc["zero_auto"]} if "zero_auto" in doc else {}),
            "baselines": doc["baselines"]}
    render_data(data, fmt, output, lambda: baselines_table(doc), ins)


def _layout_summary(doc: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in doc["layers"]:
        if "follows" in rec:
            continue
        key = f"{rec['mode']} {rec['grid'][0]}x{rec['grid'][1]}" + (
            " cols" if rec["placement"] == "cols" else "")
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


MAX_SWEEP = 1024  #: combinations one sweep plans (each is a whole search)


def _int_list(value: str, option: str, maximum: int) -> list[int]:
    """Comma-separated integers in ``[1, maximum]`` (the bounds of ``plan``'s option),
    sorted, each once. An empty item (``8,,16``, ``64,``) is a typo, not nothing."""
    hint = f"'{option}'"
    if any(not x.strip() for x in value.split(",")):
        raise click.BadParameter(f"an empty item in {value!r}; give comma-separated "
                                 "integers such as 8,32,128", param_hint=hint)
    try:
        parts = [x for x in value.split(",") if x.strip()]
        if not all(plain_whole(x) for x in parts):
            raise ValueError(value)
        items = [int(x) for x in parts]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}",
                                 param_hint=hint) from None
    if not items or any(x < 1 for x in items):
        raise click.BadParameter(f"expected positive integers, got {value!r}", param_hint=hint)
    if any(x > maximum for x in items):
        raise click.BadParameter(f"{max(items)} is too large (at most {maximum:,})",
                                 param_hint=hint)
    return sorted(set(items))


#: what ``sweep --format`` writes: the other commands' formats and CSV
SWEEP_FORMATS = (*FORMATS, "csv")


@click.command()
@problem_options
@click.option("--gpus", "-p", "gpus_list", required=True, metavar="P1,P2,...",
              help="Device counts, e.g. 8,32,128,512 (planned in increasing order, each "
                   "once).")
@click.option("--batch", "-b", "batch_list", default=None, metavar="B1,B2,...",
              help="Batch sizes, e.g. 512,2048 (in increasing order, each once): strong "
                   "scaling, the same batch on more devices.")
@click.option("--batch-per-device", "per_device_list", default=None, metavar="B1,B2,...",
              help="Samples a device, e.g. 4,16, in place of --batch: weak scaling, each "
                   "device count planned at that many times its devices.")
@click.option("--pipeline", default="1", show_default=True, callback=_pipeline_option,
              metavar="S|auto",
              help="As plan's: S pipeline stages in every plan, or auto, the fastest "
                   "stage count that fits for each device count and batch.")
@click.option("--virtual-stages", "virtual", default="1", show_default=True,
              callback=_virtual_option, metavar="V|auto",
              help="As plan's: model chunks a pipeline stage (interleaved 1F1B).")
@schedule_option(auto=True)
@objective_option
@pin_option
@jobs_option("the rows")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Also draw iteration time and throughput against devices, a line a "
                   "batch size, to this PNG file (needs matplotlib: planner[plot]).")
@click.option("--format", "fmt", type=click.Choice(SWEEP_FORMATS), default=None,
              help="table for a person; json or yaml for programs; csv, a row a device "
                   "count and batch size, for a spreadsheet or a plot. Default: what the "
                   "-o file's suffix says (.json, .yaml, .yml, .csv), else table.")
@output_option
def sweep(network: str, cluster: str, gpus_list: str, batch_list: str | None,
          per_device_list: str | None, pipeline: int | str, virtual: int | str,
          schedule: str, objective: str, pins: tuple[str, ...], jobs: int | str,
          plot: str | None, fmt: str | None, output: str | None, **kw: Any) -> None:
    """Plan for every combination of device counts and batch sizes (strong scaling), or
    of device counts and samples a device (weak scaling)."""
    from .errors import NoFeasiblePlan

    if batch_list is not None and per_device_list is not None:
        raise UsageError("planner: error: --batch and --batch-per-device exclude each "
                         "other: give --batch for strong scaling (the same batches on "
                         "every device count) or --batch-per-device for weak scaling (the "
                         "batch grows with the devices)")
    if batch_list is None and per_device_list is None:
        raise UsageError("planner: error: sweep needs --batch (strong scaling: the same "
                         "batches on every device count) or --batch-per-device (weak "
                         "scaling: the batch grows with the devices), one of them")
    gpus_values = _int_list(gpus_list, "--gpus", MAX_GPUS)
    if virtual != 1 and pipeline == 1:
        raise UsageError(f"planner: error: --virtual-stages {virtual} interleaves the "
                         "stages of a pipeline; give --pipeline 2 or more, or auto")
    schedule_option_check(schedule, pipeline, virtual, auto=True)
    auto_micro = kw["microbatches"] == "auto"
    if auto_micro:
        microbatches_auto_check(kw["cost_model"], objective)
    # each row planned as `plan` plans it (stages, microbatch counts tried); else the
    # search alone
    as_plan = auto_micro or pipeline != 1
    weak = per_device_list is not None
    batch_values = _int_list(str(per_device_list), "--batch-per-device", MAX_BATCH) \
        if weak else _int_list(str(batch_list), "--batch", MAX_BATCH)
    what = "samples a device" if weak else "batch sizes"
    if len(gpus_values) * len(batch_values) > MAX_SWEEP:
        raise click.BadParameter(
            f"{len(gpus_values)} device counts × {len(batch_values)} {what} is more than "
            f"{MAX_SWEEP:,} plans; split the sweep",
            param_hint="'--gpus' / '--batch-per-device'" if weak else "'--gpus' / '--batch'")
    if weak and max(gpus_values) * max(batch_values) > MAX_BATCH:
        raise click.BadParameter(
            f"{max(batch_values)} samples a device on {max(gpus_values):,} devices is a batch "
            f"of {max(gpus_values) * max(batch_values):,}, more than {MAX_BATCH:,}",
            param_hint="'--batch-per-device'")
    ins = inputs_of(network, cluster, kw)
    check_output(output, ins)
    if output not in (None, "-") and os.path.splitext(output)[1].lower() in (
            ".png", ".svg", ".pdf", ".jpg", ".jpeg"):
        # -o writes the table, CSV, YAML or JSON: a plot named by -o got the table's text
        # (found by an audit)
        raise click.BadParameter(f"{output!r} names an image, and -o writes the sweep's "
                                 "table, CSV, YAML or JSON; --plot FILE.png draws the plot",
                                 param_hint="'-o'")
    if plot:
        check_output(plot, ins)  # an input named is refused first, whatever its suffix
        if os.path.splitext(plot)[1].lower() != ".png":
            raise click.BadParameter(f"{plot!r}: the plot is a PNG image; name the file "
                                     "*.png", param_hint="'--plot'")
        if output not in (None, "-") and os.path.abspath(plot) == os.path.abspath(output):
            raise UsageError(f"planner: error: --plot and -o name the same file {plot}; "
                             "give them different names")
        _pyplot()  # before anything is planned: a missing matplotlib wasted the sweep
    if fmt is None and output not in (None, "-") and \
            os.path.splitext(output)[1].lower() == ".csv":
        fmt = "csv"
    from .evaluate import beyond_cluster
    from .inputs import load_cluster

    # a device count the cluster cannot hold is asked wrongly: before anything is planned
    cl = load_cluster(cluster)
    beyond_cluster(cl, gpus_values, sweep=True)
    rows: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}  # the question's settings, the same for every row
    # (batch, devices, samples a device under weak scaling)
    combos = [(b * p if weak else b, p, b if weak else None)
              for b in batch_values for p in gpus_values]
    start = time.monotonic()
    progress = None
    task = None
    from .cli import console, watched

    # a progress bar only for a person watching (on a log it left a stray newline)
    show_progress = console(stderr=True).is_terminal and watched()

    def settings_of(q: Question) -> dict[str, Any]:
        """The question's settings, the same for every row."""
        out = _sweep_settings(q, kw)
        if pipeline != 1:  # as a plan records its pipeline (auto: per row)
            out["pipeline"] = {
                "stages": pipeline, "virtual_stages": virtual, "schedule": schedule,
                **({"boundaries": "layers"} if q.network.stage_unit == "layers" else {})}
        if auto_micro:
            out["microbatches"] = "auto"
        return out

    def prepare(i: int) -> Callable[[], tuple[dict[str, Any], dict[str, Any] | None]]:
        """Load row ``i``'s question here (its notes said once, in order); the call
        plans it (in a worker with --jobs)."""
        b, p, per = combos[i]
        each = {} if per is None else {"batch_per_device": per}
        try:
            q = load_question(network, cluster, p, b,
                              **{**kw, "microbatches": 1} if auto_micro else kw)
        except NoFeasiblePlan as exc:
            row = _infeasible_row(p, b, each, exc)
            return lambda: (row, None)
        q.schedule = schedule
        sets = settings_of(q)
        return lambda: (_sweep_row(q, p, b, each, pipeline, virtual, objective, pins,
                                   auto_micro, as_plan), sets)

    from .parallel import Ahead, resolve_jobs, running

    try:
        with running(resolve_jobs(jobs)), Ahead(len(combos), prepare) as ahead:
            for i in range(len(combos)):
                if progress is None and show_progress and \
                        time.monotonic() - start > 1.0 and i < len(combos):
                    from rich.progress import Progress

                    progress = Progress(console=console(stderr=True), transient=True)
                    progress.start()
                    task = progress.add_task("planning", total=len(combos), completed=i)
                row, sets = ahead.get(i)
                rows.append(row)
                if not settings and sets:
                    settings = sets
                if progress is not None and task is not None:
                    progress.update(task, completed=i + 1)
    finally:
        if progress is not None:
            progress.stop()
    from . import __version__
    from .output import rounded

    data = rounded({"planner": __version__, "network": network, "cluster": cluster,
                    "device": cl.device.name, "objective": objective,
                    "scaling": "weak" if weak else "strong",
                    "problem": settings, "results": rows}, 4)
    if plot and any(r["feasible"] for r in rows):
        _plot(data["results"], plot, ins, f"{_network_name(network)} on {cl.name}")
    elif plot:  # empty axes would replace a plot the user had (an audit)
        click.echo(f"planner: note: {plot} is not written: no row of the sweep has a plan "
                   "to draw", err=True)
    if fmt == "csv":
        emit(_sweep_csv(data["results"]), output, ins)
    else:
        render_data(data, fmt, output, lambda: _sweep_table(data["results"]), ins)
    if not any(r["feasible"] for r in rows):
        raise NoFeasiblePlan("planner: no device count and batch size of the sweep has a "
                             "feasible plan")


def _sweep_row(q: Question, p: int, b: int, each: dict[str, Any], pipeline: int | str,
               virtual: int | str, objective: str, pins: tuple[str, ...], auto_micro: bool,
               as_plan: bool) -> dict[str, Any]:
    """A sweep's row: as ``plan`` plans it (``as_plan``), else the search's best, with
    its speedup over data parallelism; a row without a plan when nothing fits."""
    from .errors import NoFeasiblePlan
    from .plan import utilisation

    try:
        if as_plan:
            return _planned_row(q, p, b, each, pipeline, virtual, objective, pins,
                                auto_micro)
        result = run_search(q, objective, pins)
    except NoFeasiblePlan as exc:
        return _infeasible_row(p, b, each, exc)
    ev = result.best.evaluation
    data_base = next((x for x in result.baselines if x.name == "data"), None)
    use = utilisation(q.network, q.cluster.device, q.options.gpus, q.options.step_batch,
                      ev.time_s)
    doc = plan_doc(q, result, objective, False)
    row: dict[str, Any] = {
        "gpus": p, "batch": b, **each, "feasible": True, "time_s": ev.time_s,
        "samples_per_s": b / ev.time_s if ev.time_s else 0.0,
        **_tokens_per_s(q, b, ev.time_s),
        "tflops_per_device": use["tflops_per_device"], "mfu": use["mfu"],
        "comm_s": ev.comm_s, "exposed_comm_s": ev.exposed_comm_s,
        "peak_bytes": ev.memory.peak, "layouts": _layout_summary(doc),
        **_auto_choices(q, doc["problem"]),
    }
    # null where data parallelism is not applicable or does not fit (a baseline that
    # runs out of memory is no alternative: found by an audit)
    base = data_base.candidate if data_base is not None else None
    row["speedup_vs_data"] = base.evaluation.time_s / ev.time_s \
        if base is not None and base.evaluation.memory.fits else None
    return row


def _infeasible_row(p: int, b: int, each: dict[str, Any], exc: Any) -> dict[str, Any]:
    """A sweep's row without a plan: why, and how far the leanest layout misses."""
    short = exc.shortfall
    return {"gpus": p, "batch": b, **each, "feasible": False,
            "reason": str(exc).removeprefix("planner: "),
            **({"needed_bytes": short.needed_bytes, "capacity_bytes": short.capacity_bytes}
               if short is not None else {})}


def _planned_row(q: Question, p: int, b: int, each: dict[str, Any], pipeline: int | str,
                 virtual: int | str, objective: str, pins: tuple[str, ...],
                 auto_micro: bool) -> dict[str, Any]:
    """A sweep's row as ``plan`` plans it (``--pipeline``, ``--microbatches auto``): its
    document's figures, with the stages and microbatches it chose."""
    if auto_micro:
        doc = microbatches_auto(q, pipeline, objective, pins, False, virtual)
    else:
        doc = plan_for(q, pipeline, objective, pins, False, virtual)
    it, prob = doc["iteration"], doc["problem"]
    t = float(it["time_s"])
    row: dict[str, Any] = {
        "gpus": p, "batch": b, **each, "feasible": True, "time_s": t,
        "samples_per_s": it["samples_per_s"], **_tokens_per_s(q, b, t),
        "tflops_per_device": it["tflops_per_device"], "mfu": it["mfu"],
        "comm_s": it["comm_s"], "exposed_comm_s": it["exposed_comm_s"],
        "peak_bytes": doc["memory"]["peak_bytes"], "layouts": _layout_summary(doc),
    }
    pipe = prob.get("pipeline") or {}
    if pipeline != 1:
        row["pipeline"] = pipe.get("stages", 1)
        if virtual == "auto":
            row["virtual_stages"] = pipe.get("virtual_stages", 1)
        if q.schedule == AUTO_SCHEDULE:
            row["schedule"] = pipe.get("schedule", SCHEDULE)
    if auto_micro:
        row["microbatches"] = prob.get("microbatches", 1)
    row.update(_auto_choices(q, prob))
    # the data-parallel baseline on all the devices, where it applies and fits
    data = next((x for x in doc.get("baselines", []) if x["name"] == "data"), None)
    row["speedup_vs_data"] = data["time_s"] / t if data is not None and \
        data.get("applicable", True) and data.get("fits") else None
    return row


def _tokens_per_s(q: Question, batch: int, time_s: float) -> dict[str, float]:
    """A sweep row's tokens a second, for a network of tokens (else nothing)."""
    if q.network.input_kind != "tokens" or not time_s:
        return {}
    return {"tokens_per_s": batch * q.network.input_shape[0] / time_s}


def _auto_choices(q: Question, prob: dict[str, Any]) -> dict[str, Any]:
    """What ``--zero auto`` and ``--recompute auto`` chose for a sweep's row, from its
    plan's ``problem``."""
    out: dict[str, Any] = {}
    if q.zero_auto:
        out["zero"] = prob["zero"]
        if len(q.zero_shards) > 1:
            out["zero_shard"] = prob.get("zero_shard", "all")
    if q.recompute_auto:
        out["recompute"] = prob["recompute"]
    return out


#: the columns of ``sweep --format csv``, in order (an empty cell where a row has none)
SWEEP_CSV = ("gpus", "batch", "batch_per_device", "feasible", "time_s", "samples_per_s",
             "tokens_per_s", "tflops_per_device", "mfu", "comm_s", "exposed_comm_s",
             "peak_bytes", "pipeline", "virtual_stages", "schedule", "microbatches", "zero",
             "zero_shard", "recompute", "speedup_vs_data", "layouts", "needed_bytes",
             "capacity_bytes", "reason")


def _sweep_csv(rows: list[dict[str, Any]]) -> str:
    """A sweep as CSV: a header, then a row a device count and batch size; a row's
    layouts as ``count× layout`` joined by ``; ``."""
    import csv
    import io

    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(SWEEP_CSV)
    for r in rows:
        cells = []
        for col in SWEEP_CSV:
            v = r.get(col)
            if col == "layouts" and isinstance(v, dict):
                v = "; ".join(f"{n}× {k}" for k, n in v.items())
            cells.append("" if v is None else str(v).lower() if isinstance(v, bool) else v)
        out.writerow(cells)
    return buf.getvalue()


def _network_name(path: str) -> str:
    """The network's file name without its folder and suffix (the plot's title)."""
    return os.path.splitext(os.path.basename(path))[0] if path != "-" else "network"


def _sweep_settings(q: Question, kw: dict[str, Any]) -> dict[str, Any]:
    """What a sweep asked besides the device counts and batches: a plan's ``problem``
    less those, ZeRO and recomputation as asked (``auto``: the search picks per row,
    and the row says what)."""
    from .plan import DEFAULT_ALGORITHM, problem_record

    rec: dict[str, Any] = {}
    for k, v in problem_record(q.network, q.options).items():
        if k == "zero":
            zero = str(kw.get("zero", 0))
            rec["zero"] = zero if zero == "auto" else int(zero)
            if rec["zero"]:
                rec["zero_shard"] = kw.get("zero_shard", "all")
        elif k not in ("gpus", "batch", "zero_shard"):
            rec[k] = v
    if q.recompute_auto:
        rec["recompute"] = "auto"
    if q.network.recompute_unit == "layers" and rec.get("recompute") != "none":
        rec["recompute_unit"] = "layers"
    rec["estimator"] = q.estimator_name
    rec["algorithm"] = q.options.algorithm or DEFAULT_ALGORITHM
    return rec


def _sweep_table(rows: list[dict[str, Any]]) -> Any:
    import textwrap

    from rich import box

    from .tables import FitTable
    from .units import format_bytes, format_rate, format_time

    # the layouts on one line where the table fits, else one layout a line (a layout
    # such as "3× model 32x2" is never broken); samples/s (batch / iteration) and MFU
    # whenever that fits (a scaling study reads them), not only with the layouts on a line
    t = FitTable(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False,
                 wide=("layouts",), narrow=("layouts-lines",), optional=("samples/s", "MFU"))
    auto = any("zero" in r for r in rows)  # --zero auto: the stage each plan uses
    rec = any("recompute" in r for r in rows)  # --recompute auto: the blocks recomputed
    # --pipeline, --microbatches auto: the stages and microbatches each plan took
    staged = any("pipeline" in r for r in rows)
    micro = any("microbatches" in r for r in rows)
    extra = (("stages",) if staged else ()) + (("micro",) if micro else ()) + \
        (("ZeRO",) if auto else ()) + (("recompute",) if rec else ())
    weak = any("batch_per_device" in r for r in rows)  # --batch-per-device
    per = ("batch/device",) if weak else ()
    for col in ("devices", *per, "batch", "iteration", "samples/s", "MFU", "exposed",
                "memory",
                *extra,
                "vs data"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("layouts", no_wrap=False)
    t.add_column("layouts", key="layouts-lines", no_wrap=True)
    for r in rows:
        if not r["feasible"]:
            reason = r["reason"].split(";")[0].replace("planner: ", "")
            # short of memory: what the leanest layout needs, in the memory column (the
            # whole sentence folded the layouts column into ten lines a row)
            need = r.get("needed_bytes")
            if need is not None:
                reason = f"leanest short by {format_bytes(need - r['capacity_bytes'])}"
            t.add_row(str(r["gpus"]), *((str(r["batch_per_device"]),) if weak else ()),
                      str(r["batch"]), "no plan", "", "", "",
                      "" if need is None else format_bytes(need),
                      *(("",) * len(extra)), "", reason,
                      textwrap.fill(reason, 16, break_long_words=False))
            continue
        lay = [f"{n}× {k}" for k, n in r["layouts"].items()]
        # one layout a line; a cols placement continues on the next ("12× column 16x8
        # cols" would widen the column by the five characters the placement takes)
        lines = [f"{n}× {k.removesuffix(' cols')}" + ("\n    cols" if k.endswith(" cols")
                                                       else "")
                 for k, n in r["layouts"].items()]
        vs = f"{r['speedup_vs_data']:.3g}x" if r.get("speedup_vs_data") is not None else "n/a"
        t.add_row(str(r["gpus"]), *((str(r["batch_per_device"]),) if weak else ()),
                  str(r["batch"]), format_time(r["time_s"]),
                  format_rate(r["samples_per_s"]), f"{r['mfu']:.1%}",
                  format_time(r["exposed_comm_s"]), format_bytes(r["peak_bytes"]),
                  *((str(r["pipeline"]),) if staged else ()),
                  *((str(r["microbatches"]),) if micro else ()),
                  *((str(r["zero"]) + (" node" if r.get("zero_shard") == "node" else ""),)
                    if auto else ()),
                  *((str(r["recompute"]),) if rec else ()), vs,
                  ", ".join(lay), "\n".join(lines))
    return t


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing off screen; a usage error naming the extra where it
    is not installed."""
    os.environ.pop("MPLBACKEND", None)  # the plot is drawn off screen whatever it says
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("planner: error: --plot needs matplotlib: pip install "
                         "'planner[plot]'") from None
    return plt


def _plot(rows: list[dict[str, Any]], path: str, protect: tuple[str, ...] = (),
          title: str = "") -> None:
    """Iteration time and throughput against the device count, a line a batch size;
    the throughput panel's dotted lines are perfect scaling from each line's first
    point (a strong-scaling study reads its efficiency off the gap)."""
    plt = _pyplot()
    import io

    from matplotlib.ticker import LogFormatter

    from .output import write_atomic

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    # a line a batch (strong scaling), or a line a batch per device (weak)
    key = "batch_per_device" if any("batch_per_device" in r for r in rows) else "batch"
    for b in sorted({r[key] for r in rows}):
        pts = [r for r in rows if r[key] == b and r["feasible"]]
        if not pts:
            continue
        gpus = [r["gpus"] for r in pts]
        label = f"batch {b:,}" if key == "batch" else f"{b:,} a device"
        ax1.plot(gpus, [r["time_s"] * 1e3 for r in pts], "o-", label=label)
        line = ax2.plot(gpus, [r["samples_per_s"] for r in pts], "o-", label=label)
        ideal = [pts[0]["samples_per_s"] * g / gpus[0] for g in gpus]
        ax2.plot(gpus, ideal, ":", color=line[0].get_color())
    counts = sorted({r["gpus"] for r in rows if r["feasible"]})
    for ax, label in ((ax1, "iteration time (ms)"), (ax2, "samples/s (dotted: linear)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if counts:  # the device counts themselves on the axis, not powers of two
            ax.set_xticks(counts, [f"{g:,}" for g in counts])
            # the x axis alone: within a decade the y axis's labels are its minor ticks
            # (found by an audit: a weak-scaling plot's flat lines had no y labels)
            ax.xaxis.set_minor_locator(plt.NullLocator())
        # plain numbers (91.6, not 9.16 × 10^1); the minor ticks labelled only where
        # the axis spans less than a decade, as matplotlib's log formatter does
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.4g}"))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False,
                                                  minor_thresholds=(1, 0.4)))
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if ax.lines:  # no feasible point: an empty plot, without matplotlib's warning
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, metadata={"Software": None})
    plt.close(fig)
    write_atomic(path, buf.getvalue(), protect)
    click.echo(f"wrote {path}", err=True)


def register(group: click.Group) -> None:
    """Attach the commands of this module to the CLI."""
    for command in (cost, plan, compare, sweep):
        group.add_command(command)

