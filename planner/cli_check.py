"""``planner check`` (CI gate for training configurations) and ``planner launch``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from .cli import Finite, Whole, emit, jobs_option, one_stdin, output_option, write_utf8
from .errors import EXIT_CHECK_FAILED, EXIT_INPUT, InputError, UsageError, printable


@click.command()
@click.argument("configs", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--max-slowdown", type=Finite(1.0, None), default=None,
              help="Allowed ratio of the strategy's iteration time to the searched optimum "
                   "(default: the configuration's max_slowdown, else 1.10).")
@click.option("--format", "fmt", type=click.Choice(("text", "json", "github")),
              default="text", show_default=True,
              help="github: workflow annotations (::error file=...,line=...::) on the "
                   "configuration's lines.")
@click.option("--estimator", type=click.Choice(("auto", "roofline", "learned")),
              default="auto", show_default=True, help="Kernel-time estimator.")
@click.option("--models-dir", type=click.Path(file_okay=False), default=None,
              help="Kernel models to price with instead of the shipped ones (default: "
                   "$PLANNER_MODELS, else the shipped ones); a plan priced with others "
                   "is stale.")
@jobs_option("the configurations")
def check(configs: tuple[str, ...], max_slowdown: float | None, fmt: str,
          estimator: str, models_dir: str | None, jobs: int | str) -> None:
    """Check training configurations for CI.

    Each configuration (kind: training) names a network, a cluster, the question and the
    chosen strategy (a plan file, a grid, or pins). Checks: the strategy fits in memory;
    its predicted iteration time is within --max-slowdown of the searched optimum; a plan
    file still matches the network and cluster it was made from. Exit 0 when every check
    passes, 1 when one fails, 2 when an input is invalid.
    """
    import dataclasses

    from .cli_plan import make_estimator
    from .output import to_json
    from .parallel import Ahead, resolve_jobs, running
    from .training import check_config, github_lines, load_training, report_data, text_lines

    one_stdin(configs)
    reports = []
    errors: list[InputError] = []
    loaded: dict[int, tuple[Any, Any]] = {}

    def prepare(i: int) -> Callable[[], Any]:
        """Read configuration ``i`` here (its errors are its result); the call checks
        it (in a worker with --jobs)."""
        cfg = load_training(configs[i])
        if max_slowdown is not None:
            cfg = dataclasses.replace(cfg, max_slowdown=max_slowdown)
        est = _estimator_for(cfg, estimator, make_estimator, models_dir)
        loaded[i] = cfg, est
        return lambda: check_config(cfg, est)

    with running(resolve_jobs(jobs)), \
            Ahead(len(configs), prepare, shared=lambda i: loaded[i]) as ahead:
        for i in range(len(configs)):
            try:
                reports.append(ahead.get(i))
            except InputError as exc:
                errors.append(exc)
    if fmt == "json":
        write_utf8(to_json(report_data(reports, errors)))
    elif fmt == "github":
        for line in github_lines(reports, errors):
            click.echo(line)
    else:
        for line in text_lines(reports):
            click.echo(line)
        for err in errors:
            click.echo(err.render(), err=True)
    failed = sum(1 for r in reports if not r.ok)
    if fmt == "text" and (failed or (errors and len(configs) > 1)):
        # the summary, also where some are invalid (an audit found it left out then)
        from .units import count

        click.echo(f"planner check: {failed} of {count(len(configs), 'configuration')} "
                   "failed" + (f", {len(errors)} invalid" if errors else ""), err=True)
    if errors:
        raise click.exceptions.Exit(EXIT_INPUT)
    if failed:
        raise click.exceptions.Exit(EXIT_CHECK_FAILED)


def _estimator_for(cfg: Any, name: str, make: Any, models_dir: str | None) -> Any:
    # errors name the file as the check's do, relative to here (GitHub attaches an
    # annotation to a repository path only; an audit found this one absolute)
    from .errors import NotCovered
    from .inputs import cluster_from_document
    from .loading import load_file
    from .training import _config_error, _display

    device = cluster_from_document(load_file(cfg.cluster_path,
                                             _display(cfg.cluster_path))).device
    try:
        return make(name, models_dir, device)
    except NotCovered as exc:
        # this configuration's cluster, not the command: reported as the configuration's
        # error, after the others' outcomes (an audit: one CPU cluster stopped the check
        # of every configuration, with nothing on standard output)
        raise _config_error(cfg, "$.cluster",
                            str(exc).removeprefix("planner: error: ")) from None


@click.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--emit", "kind", type=click.Choice(("torchrun", "slurm", "env", "megatron")),
              default="torchrun", show_default=True, help="What to write.")
@click.option("--script", default="train.py", show_default=True,
              help="The training program each rank runs (it reads the plan: see "
                   "examples/launch/).")
@click.option("--master-port", type=Whole(1, 65535), default=29500,
              help="Rendezvous port. Given, the scripts use it; left out, they use "
                   "MASTER_PORT where they run if it is set, else 29500.")
@click.option("--cpus-per-task", type=Whole(1, 4096), default=None,
              help="Slurm: CPUs for each task (#SBATCH and srun --cpus-per-task). Left "
                   "out, a job of whole nodes shares each node's CPUs equally and a job "
                   "of part of a node gets Slurm's default, often one.")
@click.option("--plan-arg/--no-plan-arg", default=True, show_default=True,
              help="Give the training program --plan PLAN. Its path is in PLANNER_PLAN "
                   "either way; a program that refuses arguments it does not know "
                   "(Megatron-LM's pretrain_gpt.py) needs --no-plan-arg.")
@click.option("--strict", is_flag=True,
              help="Write nothing and exit 1 where a warning would be given: a plan that "
                   "does not fit in memory, or whose network or cluster file has changed "
                   "since it was made (for CI jobs and launch wrappers).")
@output_option
def launch(plan_file: str, kind: str, script: str, master_port: int,
           cpus_per_task: int | None, plan_arg: bool, strict: bool,
           output: str | None) -> None:
    """What each node needs to start a plan: node count, processes per node, the
    rank-to-device mapping of the placement, the plan path.

    torchrun: a script to run on every node (NODE_RANK, MASTER_ADDR); slurm: an sbatch
    script; env: KEY=VALUE lines for your own launcher; megatron: Megatron-LM's
    parallelism arguments, where every layer is split the same way (exit 2 otherwise).
    """
    from .launch import emit as render
    from .launch import launch_spec
    from .loading import load_file

    if not script.strip():
        raise click.BadParameter("the training program is empty; name the program each "
                                 "rank runs", param_hint="'--script'")
    if script.startswith("-"):
        raise click.BadParameter(f"{script!r} would be read by torchrun and srun as an "
                                 f"option; name the program as ./{script}",
                                 param_hint="'--script'")
    if not plan_arg and kind not in ("torchrun", "slurm"):
        raise click.BadParameter(f"--emit {kind} starts no training program to give "
                                 "--plan to; use --emit torchrun or slurm",
                                 param_hint="'--no-plan-arg'")
    if cpus_per_task is not None and kind != "slurm":
        raise click.BadParameter(f"CPUs a task are asked of Slurm; --emit {kind} has no "
                                 "place for them (use --emit slurm, or set them in your "
                                 "own launcher)", param_hint="'--cpus-per-task'")
    source = click.get_current_context().get_parameter_source
    named = click.core.ParameterSource.COMMANDLINE
    if source("script") is named and kind in ("env", "megatron"):
        raise click.BadParameter(f"--emit {kind} starts no training program; use --emit "
                                 "torchrun or slurm, or leave --script out",
                                 param_hint="'--script'")
    if source("master_port") is named and kind == "megatron":
        raise click.BadParameter("--emit megatron writes Megatron-LM's parallelism "
                                 "arguments, which hold no rendezvous port; set it where "
                                 "the job starts (torchrun --master-port, MASTER_PORT)",
                                 param_hint="'--master-port'")
    from pathlib import Path

    from .output import is_stream

    # /dev/stdin redirected from a file is a regular file to stat, but every node would
    # read its own standard input as the plan
    special = Path(os.path.abspath(plan_file)).parts[1:2] in (("dev",), ("proc",))
    if plan_file == "-" or special or is_stream(Path(plan_file)):
        raise UsageError("planner: error: launch needs the plan as a file: the scripts it "
                         "writes name it (PLANNER_PLAN) for the training script to read on "
                         "every node; write it with `planner plan ... -o plan.yaml`")
    doc = load_file(plan_file)
    spec = launch_spec(doc, plan_file)
    said = "error" if strict else "warning"
    if not spec.fits:
        click.echo(f"planner: {said}: {plan_file}: the plan does not fit in memory "
                   "(memory.fits: false): its ranks will run out of device memory; "
                   "`planner plan` finds one that fits", err=True)
    changed_files, missing = _changed_inputs(doc.data, plan_file)
    for changed in changed_files:
        click.echo(f"planner: {said}: {plan_file}: {changed} has changed since the plan "
                   "was made (its sha256 is not the one the plan records): `planner check` "
                   "prices the plan against it", err=True)
    if strict and (changed_files or not spec.fits):
        raise click.exceptions.Exit(EXIT_CHECK_FAILED)
    for gone in missing:
        click.echo(f"planner: note: {plan_file}: {gone} is not found here or beside the "
                   "plan, so whether it changed since the plan was made is not checked",
                   err=True)
    if kind == "megatron":
        from .megatron import megatron_args

        text = megatron_args(doc, plan_file)
    else:
        text = render(kind, spec, plan_file, script, master_port,
                      fixed_port=source("master_port") is named,
                      cpus_per_task=cpus_per_task, plan_arg=plan_arg)
        if (kind == "slurm" and cpus_per_task is None and spec.procs < spec.per_node):
            # advice, not a fault of the plan: --strict does not fail on it
            click.echo(f"planner: note: {plan_file}: the job takes part of each node "
                       f"({spec.procs} of {spec.per_node} devices), so each task gets "
                       "Slurm's default CPUs, often one, for its data loading; "
                       "--cpus-per-task N asks for N", err=True)
    # neither the plan, the training program nor the files the plan was made from is
    # overwritten by -o; a script is written executable
    emit(text, output, (plan_file, script, *_recorded_inputs(doc.data, plan_file)),
         executable=kind in ("torchrun", "slurm"))


def _changed_inputs(data: Any, plan_file: str) -> tuple[list[str], list[str]]:
    """The network and cluster files a plan records whose bytes are not the ones it was
    made from, and those not found. A file is looked for where the plan says (relative
    to here, as the plan's scripts name paths), then relative to the plan's folder; one
    found in neither place is not judged (the job may run elsewhere), and is named so
    that its silence is not read as a pass (found by an audit)."""
    from pathlib import Path

    from .loading import file_digest

    inputs = data.get("inputs") if isinstance(data, dict) else None
    changed: list[str] = []
    missing: list[str] = []
    for key in ("network", "cluster"):
        entry = inputs.get(key) if isinstance(inputs, dict) else None
        if not isinstance(entry, dict):
            continue
        name, want = entry.get("file"), entry.get("sha256")
        if not (isinstance(name, str) and name not in ("", "-") and isinstance(want, str)):
            continue
        found = next((p for p in (Path(name), Path(plan_file).parent / name)
                      if p.is_file()), None)
        if found is None:
            missing.append(f"its {key} file {printable(name)}")
            continue
        try:
            if file_digest(str(found)) != want:
                changed.append(f"its {key} file {printable(str(found))}")
        except OSError:
            continue
    return changed, missing


def _recorded_inputs(data: Any, plan_file: str) -> tuple[str, ...]:
    """The network and cluster files a plan records (``inputs.*.file``), as written
    and relative to the plan's folder: either may be where they are."""
    from pathlib import Path

    inputs = data.get("inputs") if isinstance(data, dict) else None
    out: list[str] = []
    for entry in inputs.values() if isinstance(inputs, dict) else []:
        name = entry.get("file") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name != "-":
            out += [name, str(Path(plan_file).parent / name)]
    return tuple(out)


def register(group: click.Group) -> None:
    """Attach the commands of this module to the CLI."""
    group.add_command(check)
    group.add_command(launch)
