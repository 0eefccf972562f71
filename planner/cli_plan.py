"""Commands that price and plan: ``planner cost`` (a given layout), and the search
commands added by :mod:`planner.search`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from .cli import format_option, output_option, render_data
from .errors import UsageError

ESTIMATORS = ("auto", "roofline", "learned")


def _size(value: str) -> float:
    from .units import UnitError, parse_quantity

    try:
        return parse_quantity(value, "bytes", positive=False)
    except UnitError as exc:
        raise click.BadParameter(str(exc)) from None


def problem_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by cost, plan, compare and sweep."""
    decorators = [
        click.argument("network", type=click.Path(dir_okay=True)),
        click.argument("cluster", type=click.Path(dir_okay=True)),
        click.option("--cost-model", type=click.Choice(("exact", "gholami2018")),
                     default="exact", show_default=True,
                     help="exact volumes and the cluster's algorithms, or the paper's "
                          "Eq. 3-9 as printed."),
        click.option("--overlap", type=click.Choice(("none", "gradients")),
                     default="gradients", show_default=True,
                     help="Overlap weight-gradient all-reduces with the backward pass."),
        click.option("--bucket-size", "bucket", default="25 MiB", show_default=True,
                     help="Gradient bucket size for --overlap gradients (0: one per layer)."),
        click.option("--optimizer", type=click.Choice(("sgd", "momentum", "adam")),
                     default="momentum", show_default=True,
                     help="Optimizer state kept per parameter."),
        click.option("--master-weights/--no-master-weights", default=None,
                     help="Keep fp32 master weights (default: for 16-bit dtypes)."),
        click.option("--algorithm",
                      type=click.Choice(("auto", "ring", "tree", "recursive", "hierarchical")),
                      default=None, help="Collective algorithm (default: the cluster's)."),
        click.option("--estimator", type=click.Choice(ESTIMATORS), default="auto",
                     show_default=True,
                     help="Kernel times: the learned models (auto: when they cover the "
                          "device), or the roofline."),
        click.option("--models-dir", type=click.Path(file_okay=False), default=None,
                     envvar="PLANNER_MODELS", help="Kernel models to use instead of the "
                                                   "shipped ones."),
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


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


def load_question(network: str, cluster: str, gpus: int, batch: int, cost_model: str,
                  overlap: str, bucket: str, optimizer: str, master_weights: bool | None,
                  algorithm: str | None, estimator: str, models_dir: str | None) -> Question:
    """Load both files, build the options and the cost context."""
    from .evaluate import Options, check_question, make_context
    from .inputs import load_cluster, load_network

    net = load_network(network)
    cl = load_cluster(cluster)
    options = Options(gpus=gpus, batch=batch, cost_model=cost_model, overlap=overlap,
                      bucket_bytes=_size(bucket), optimizer=optimizer,
                      master_weights=master_weights, algorithm=algorithm)
    check_question(net, cl, options)
    est = make_estimator(estimator, models_dir, cl.device)
    ctx = make_context(net, cl, options, est)
    return Question(net, cl, network, cluster, options, ctx, est.name)


def make_estimator(name: str, models_dir: str | None, device: Any) -> Any:
    """The kernel-time estimator a command asked for."""
    from .costs.compute import Roofline

    if name == "roofline":
        return Roofline()
    try:
        from .kernels import learned_estimator
    except ImportError:
        if name == "learned":
            raise UsageError("planner: error: the learned kernel models are not installed") \
                from None
        return Roofline()
    return learned_estimator(models_dir, required=(name == "learned"))


def layout_assignment(q: Question, grid: str | None, mode: str | None,
                      pins: tuple[str, ...], placement: str) -> dict[int, Any]:
    """The layout of every layer with weights from --grid/--mode/--pin."""
    from .layout import make_layout, parse_grid, parse_pin, pin_layout
    from .strategies import why_invalid

    p, b = q.options.gpus, q.options.batch
    paper = q.options.cost_model == "gholami2018"
    parsed = [parse_pin(text, p) for text in pins]
    used = [False] * len(parsed)
    if grid is not None:
        pr, pc = parse_grid(grid, p)
    elif mode in ("model", "domain"):
        pr, pc = p, 1
    else:
        pr, pc = 1, p
    assignment: dict[int, Any] = {}
    for layer in q.network.layers:
        chosen = None
        for i, pin in enumerate(parsed):
            if layer.has_weights and _matches(layer.name, pin.pattern):
                chosen = pin_layout(pin, p, placement)
                used[i] = True
                source = f"--pin '{pin.text}'"
                break
        if not layer.has_weights:
            continue
        if chosen is None:
            source = "--grid/--mode"
            if pr == 1:
                chosen = make_layout("data", 1, p)
            elif mode == "domain" and layer.conv is not None:
                chosen = make_layout("domain", pr, pc, placement)
            else:
                chosen = make_layout("model", pr, pc, placement)
        reason = why_invalid(layer, chosen, b, paper)
        if reason is not None:
            raise UsageError(f"planner: error: layer '{layer.name}' cannot use "
                             f"{chosen.label()} ({source}): {reason}")
        assignment[layer.index] = chosen
    for i, pin in enumerate(parsed):
        if not used[i]:
            names = [layer.name for layer in q.network.layers if _matches(layer.name,
                                                                          pin.pattern)]
            if names:
                raise UsageError(f"planner: error: --pin '{pin.text}' matches only layers "
                                 f"without weights ({', '.join(names[:5])}); they follow "
                                 "their neighbours' layout")
            raise UsageError(f"planner: error: --pin '{pin.text}' matches no layer of "
                             f"'{q.network.name}'")
    return assignment


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)


def nodes_used(q: Question) -> int:
    """Nodes the devices occupy."""
    return int(-(-q.options.gpus // q.cluster.devices_per_node))


gpus_option = click.option("--gpus", "-p", type=click.IntRange(1, 2**30), required=True,
                           help="Number of devices P.")
batch_option = click.option("--batch", "-b", type=click.IntRange(1, 2**40), required=True,
                            help="Global batch size B (samples per iteration).")


@click.command()
@problem_options
@gpus_option
@batch_option
@click.option("--grid", default=None, metavar="PRxPC",
              help="One grid for every layer with weights, e.g. 32x16 (1xP: data).")
@click.option("--mode", type=click.Choice(("data", "model", "domain")), default=None,
              help="model: split output features over P_r; domain: split the height of "
                   "convolutions over P_r (other layers model).")
@click.option("--pin", "pins", multiple=True, metavar="'GLOB=MODE[:PRxPC]'",
              help="Layout for matching layers, e.g. 'conv*=data' 'fc*=model:32x16'. "
                   "Repeatable; the first match wins.")
@click.option("--placement", type=click.Choice(("rows", "cols")), default="rows",
              show_default=True,
              help="rows: each row group (P_r) on consecutive devices, inside a node when "
                   "it fits; cols: each column group (P_c) inside a node.")
@click.option("--all-layers", is_flag=True, help="Table: list layers without communication.")
@format_option
@output_option
def cost(network: str, cluster: str, gpus: int, batch: int, grid: str | None,
         mode: str | None, pins: tuple[str, ...], placement: str, all_layers: bool,
         fmt: str, output: str | None, **kw: Any) -> None:
    """Price one given layout: per-layer compute and communication, memory, iteration.

    Without --grid, --mode or --pin every layer is data parallel. Exit 0 when the layout
    fits in memory, 1 when it does not, 2 for invalid input.
    """
    from .evaluate import evaluate
    from .plan import plan_document, plan_table

    q = load_question(network, cluster, gpus, batch, **kw)
    assignment = layout_assignment(q, grid, mode, pins, placement)
    ev = evaluate(q.ctx, q.options, assignment)
    doc = plan_document("cost", q.network, network, q.cluster.name, cluster, q.options, ev,
                        q.estimator_name, nodes_used(q))
    render_data(doc, fmt, output, lambda: plan_table(doc, all_layers), (network, cluster))
    if not ev.memory.fits:
        from .units import format_bytes

        click.echo(f"planner: the layout does not fit: {format_bytes(ev.memory.peak)} "
                   f"needed per device, {format_bytes(ev.memory.capacity)} available",
                   err=True)
        raise click.exceptions.Exit(1)


def register(group: click.Group) -> None:
    """Attach the commands of this module to the CLI."""
    group.add_command(cost)

