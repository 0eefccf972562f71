"""The command line: parse options, call the library, render or write the result.

This is the only module that prints or exits. Every :class:`~planner.errors.PlannerError`
is reported once, as plain text on stderr, with its exit code (see :mod:`planner.errors`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from . import __version__
from .errors import EXIT_INPUT, PlannerError, UsageError
from .threads import BLAS_THREAD_VARS

FORMATS = ("table", "json", "yaml")
EXIT_INTERNAL = 3


class Reported(click.ClickException):
    """A planner error on its way out: printed as is, with its own exit code (click 8.2
    and later declare ``exit_code`` a class variable, so each code is a subclass)."""

    def __new__(cls, message: str, exit_code: int) -> Reported:
        sub = _REPORTED.get(exit_code)
        if sub is None:
            sub = _REPORTED[exit_code] = type(f"Reported{exit_code}", (cls,),
                                              {"exit_code": exit_code})
        return super().__new__(sub)

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)

    def show(self, file: Any = None) -> None:
        """Print the message to stderr without click's 'Error:' prefix."""
        click.echo(self.message, err=True)


_REPORTED: dict[int, type[Reported]] = {}


class Finite(click.FloatRange):
    """A float range that refuses nan and infinity (FloatRange lets nan through: every
    comparison with it is false)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        import math

        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


def plain_whole(text: str) -> bool:
    """Whether ``text`` is a whole number as a person types it: ASCII digits with an
    optional sign (Python's ``int`` also takes ``1_000`` and full-width digits)."""
    import re

    return re.fullmatch(r"\s*[+-]?[0-9]+\s*", text) is not None


class Whole(click.IntRange):
    """An integer range that takes ASCII digits only (see :func:`plain_whole`)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not plain_whole(value):
            self.fail(f"{value!r} is not a whole number (digits 0-9)", param, ctx)
        return super().convert(value, param, ctx)


class PlannerGroup(click.Group):
    """A click group that turns planner errors into messages and exit codes."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        _attach_command_groups()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _attach_command_groups()
        return super().list_commands(ctx)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``--debug`` is the top group's option, but is taken anywhere before ``--``
        (``planner plan ... --debug``, where the README's advice to rerun with it sends
        people): no subcommand has an option or a value of that name."""
        if ctx.parent is None and "--debug" in args:
            cut = args.index("--") if "--" in args else len(args)
            head = [a for a in args[:cut] if a != "--debug"]
            if len(head) < cut:
                args = ["--debug", *head, *args[cut:]]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; report errors without tracebacks unless --debug."""
        try:
            result = super().invoke(ctx)
            if sys.stdout is not None:
                sys.stdout.flush()  # a full disk or a closed stdout is reported here
            return result
        except PlannerError as exc:
            if _debug(ctx):
                _traceback_exit(exc.exit_code)
            raise Reported(str(exc), exc.exit_code) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except BrokenPipeError:
            _quiet_broken_pipe()
        except OSError as exc:  # the environment, not planner: a full disk, a closed stream
            if _debug(ctx):
                _traceback_exit(EXIT_INPUT)
            where = exc.filename if exc.filename is not None else "standard output"
            _discard_stdout()
            raise Reported(f"planner: error: cannot write to {where}: "
                           f"{exc.strerror or exc}", EXIT_INPUT) from None
        except RecursionError:
            if _debug(ctx):
                _traceback_exit(EXIT_INPUT)
            raise Reported("planner: error: the input is nested too deeply to process",
                           EXIT_INPUT) from None
        except MemoryError:
            if _debug(ctx):
                _traceback_exit(EXIT_INPUT)
            raise Reported("planner: error: out of memory; the input is too large",
                           EXIT_INPUT) from None
        except Exception as exc:
            if _debug(ctx):
                _traceback_exit(EXIT_INTERNAL)
            raise Reported(
                f"planner: internal error: {type(exc).__name__}: {exc}\n"
                "This is a bug in planner. Run again with --debug for the traceback and "
                "report it.", EXIT_INTERNAL) from None


def _traceback_exit(code: int) -> NoReturn:
    """--debug: the traceback of the exception being handled, then the exit code the
    error has without --debug (Python's own exit on an exception is 1, which planner
    means as "the answer is no")."""
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    raise click.exceptions.Exit(code)


def _debug(ctx: click.Context) -> bool:
    root = ctx.find_root()
    return bool(root.params.get("debug")) or os.environ.get("PLANNER_DEBUG") == "1"


def _quiet_broken_pipe() -> NoReturn:
    _discard_stdout()
    raise click.exceptions.Exit(1)


def _discard_stdout() -> None:
    """Python flushes stdout at exit; point it at devnull so that raises nothing more."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        sys.stdout = _Closed(report=False)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)


def _closed(stream: Any) -> bool:
    """Whether a standard stream was closed by the shell (``>&-``, ``2>&-``)."""
    if stream is None:
        return True
    try:
        os.fstat(stream.fileno())
    except OSError:
        return True
    except (AttributeError, ValueError):  # not backed by a file (a test's capture)
        return False
    return False


class _Closed:
    """Stands for a standard stream the shell closed (``>&-``): writing to stdout fails
    with an error the command reports (exit 2, not a silent success); what is written to
    a closed stderr is dropped (it has nowhere to go, and the exit code still tells)."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, report: bool) -> None:
        self.report = report

    def write(self, text: str) -> int:
        if self.report:
            import errno

            raise OSError(errno.EBADF, "it is closed")
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""

    def isatty(self) -> bool:
        """Never a terminal."""
        return False


class _Dropping:
    """Stands for a standard error that fails when written (``2>/dev/full``, a full disk
    under a log, an I/O error): what does not get through is dropped, as a closed
    stderr's is (:class:`_Closed`), so that a failed note or message does not change the
    command's exit code (an uncaught OSError made every command exit 1, which planner
    means as "the answer is no"). Every other attribute is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError:
            self._lost()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._lost()

    def _lost(self) -> None:
        """Point the descriptor at the null device, so that the bytes still buffered and
        Python's flush at exit (which fails with status 120) go nowhere."""
        import contextlib

        # a stream without a descriptor (a test's capture) has nothing to redirect
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def fail(message: str) -> NoReturn:
    """Abort with a usage problem (exit 2)."""
    raise UsageError(f"planner: error: {message}")


#: ``click.Context.meta`` key of the files an option read besides a command's arguments
#: (the kernels commands' ``--cluster``): ``-o`` may not replace them either
READ_META = "planner.read"


def _read_too(protect: tuple[str, ...]) -> tuple[str, ...]:
    """``protect`` and the files options of the running command read."""
    ctx = click.get_current_context(silent=True)
    return (*protect, *(ctx.meta.get(READ_META, ()) if ctx is not None else ()))


def check_output(output: str | None, protect: tuple[str, ...] = ()) -> None:
    """Refuse a bad ``-o`` before doing the work (one of the inputs, a directory, a
    missing folder); :func:`emit` checks again when it writes."""
    if output is None or output == "-":
        return
    from .output import output_target

    output_target(output, _read_too(protect))


def one_stdin(paths: tuple[str, ...]) -> None:
    """Refuse ``-`` given twice: standard input holds one file."""
    if paths.count("-") > 1:
        raise UsageError("planner: error: '-' (standard input) is given more than once; it "
                         "holds one file: name the others, or pipe them in with <(command)")


def emit(text: str, output: str | None, protect: tuple[str, ...] = (),
         executable: bool = False) -> None:
    """Write the product: to stdout, or atomically to ``output`` (``-`` is stdout; a new
    file made ``executable`` when it is a script)."""
    if output is None or output == "-":
        write_utf8(text)
        return
    from .output import write_atomic

    write_atomic(output, text, _read_too(protect), executable)
    click.echo(f"wrote {output}", err=True)


def write_utf8(text: str) -> None:
    """Machine-readable output (JSON, YAML, CSV, scripts) on stdout in UTF-8, as ``-o``
    files are, whatever the locale: under a Latin-1 one "µs" had gone out as Latin-1
    bytes a JSON reader refused, and characters beyond it as ``\\uXXXX`` text a YAML
    reader took literally (an audit)."""
    out = click.get_text_stream("stdout") if sys.stdout is None else sys.stdout
    raw = getattr(out, "buffer", None)
    if raw is None:  # a stream without bytes beneath (a test's StringIO)
        click.echo(text, nl=False)
        return
    out.flush()
    raw.write(text.encode("utf-8", "surrogateescape"))
    raw.flush()


#: the narrowest console (``COLUMNS=1`` drew tables one character a line)
MIN_WIDTH = 40


def console(stderr: bool = False) -> Any:
    """A rich console; width from $COLUMNS or the terminal, no colour when piped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif stream is None or not stream.isatty():
        width = 120  # piped or captured: do not squeeze tables into 80 columns
    elif columns:  # $COLUMNS that is not a width ("abc"): the terminal's
        width = os.get_terminal_size(stream.fileno()).columns
    if width is not None:
        width = max(width, MIN_WIDTH)  # narrower, a table prints a character a line
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def watched(stderr: bool = True) -> bool:
    """Whether a person watches the stream: a terminal, not a log. Progress lines (cursor
    moves, redrawn text) are drawn only there, whatever FORCE_COLOR or TTY_COMPATIBLE
    tell rich: set in a CI job, they had put a spinner's control codes in its log (an
    audit). Tables keep rich's choice: colour forced is colour asked for."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def print_fitted(con: Any, renderable: Any) -> None:
    """Print tables that fit ``con`` without cutting a number (:mod:`.tables`). A table
    that must print wider than the console does so alone: the text around it keeps the
    console's width."""
    from rich.console import Group

    from .tables import fit

    if isinstance(renderable, Group):
        for part in renderable.renderables:
            print_fitted(con, part)
        return
    width = con.width
    con.width = fit(con, renderable)
    try:
        con.print(renderable)
    finally:
        con.width = width


def format_for(output: str | None) -> str:
    """The format an output file's suffix names: ``.json`` → json, ``.yaml``/``.yml`` →
    yaml, anything else (and stdout) → table."""
    suffix = "" if output in (None, "-") else os.path.splitext(str(output))[1].lower()
    return {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix, "table")


def render_data(data: Any, fmt: str | None, output: str | None,
                table: Callable[[], Any] | None,
                protect: tuple[str, ...] = ()) -> None:
    """Emit ``data`` as JSON or YAML, or print the rich ``table`` for a person (``fmt``
    None: the format the ``-o`` file's suffix names, else the table)."""
    from .output import to_json, to_yaml

    if fmt is None:
        fmt = format_for(output)
    if fmt in ("json", "yaml"):
        text = to_json(data) if fmt == "json" else to_yaml(data)
        _readable_plan(data, text)
        emit(text, output, protect)
    else:
        assert table is not None
        if output not in (None, "-"):
            emit(_plain_table(table(), 140), output, protect)
        else:
            con = console()
            if con.is_terminal:
                print_fitted(con, table())
            else:  # piped or captured: the bytes a file gets, at the console's width
                click.echo(_plain_table(table(), con.width), nl=False)


def _readable_plan(data: Any, text: str) -> None:
    """Refuse a plan document that ``validate``, ``launch`` and ``check`` would refuse as
    too large to read: one with every rank listed (``--expand-ranks``) on hundreds of
    thousands of devices (found by an audit: 44.6 MB written, exit 0, then refused by
    the commands that read plans)."""
    from .loading import MAX_PLAN_FILE_BYTES

    if not (isinstance(data, dict) and "placement" in data):
        return
    size = len(text.encode())
    if size > MAX_PLAN_FILE_BYTES:
        from .units import format_bytes

        raise UsageError(f"planner: error: the plan would be {format_bytes(size)}, over the "
                         f"{format_bytes(MAX_PLAN_FILE_BYTES)} that validate, launch and "
                         "check read"
                         + ("; --expand-ranks lists every rank of every group: leave it out "
                            "(each grid's rules say the same)" if _expanded(data) else ""))


def _expanded(data: dict[str, Any]) -> bool:
    grids = data.get("placement", {}).get("grids", [])
    return any(isinstance(g, dict) and isinstance(g.get("row_groups"), dict)
               and "ranks" in g["row_groups"] for g in grids)


def _plain_table(renderable: Any, width: int) -> str:
    """A table as plain text ``width`` wide, without the spaces rich pads each line to
    the width with."""
    import io

    from rich.console import Console

    sink = io.StringIO()
    print_fitted(Console(file=sink, width=width, color_system=None, highlight=False),
                 renderable)
    return "\n".join(line.rstrip() for line in sink.getvalue().split("\n"))


format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default=None,
    help="table for a person; json or yaml for programs. Default: what the -o file's "
         "suffix says (.json, .yaml, .yml), else table.")
output_option = click.option(
    "-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None,
    help="Write to this file (atomically) instead of stdout.")


F = TypeVar("F", bound=Callable[..., Any])


def count_or_auto(value: str, most: int, what: str) -> int | str:
    """An option's whole number from 1 to ``most``, or ``auto`` (BadParameter naming
    ``what`` it counts)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise click.BadParameter(f"{value!r}: give the number of {what}, 1 to {most:,}, or "
                                 "auto")
    return n


def _jobs_option(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    try:
        return count_or_auto(value, 1024, "searches to run at once")
    except click.BadParameter as exc:
        # from PLANNER_JOBS, the environment is what to fix (found by an audit; click
        # records where a value came from only after its callback)
        import sys

        given = any(a in ("-j", "--jobs") or a.startswith(("--jobs=", "-j"))
                    for a in sys.argv[1:])
        if not given and os.environ.get("PLANNER_JOBS") == value:
            raise click.BadParameter(f"PLANNER_JOBS={value}: {exc.message.split(': ', 1)[1]}",
                                     param_hint="'PLANNER_JOBS'") from None
        raise


def jobs_option(what: str) -> Callable[[F], F]:
    """``--jobs N|auto`` (``PLANNER_JOBS``), ``what`` naming the searches that run at
    once (:mod:`planner.parallel`)."""
    return click.option(
        "--jobs", "-j", default="auto", show_default=True, callback=_jobs_option,
        envvar="PLANNER_JOBS", metavar="N|auto",
        help=f"Searches run at once in worker processes ({what}); auto: one a usable "
             "CPU, at most 16. The output is the same bytes with any count. "
             "Environment: PLANNER_JOBS.")


@click.group(cls=PlannerGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                 "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="planner")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of short messages "
              "(taken anywhere on the command line, or PLANNER_DEBUG=1).")
def cli(debug: bool) -> None:
    """Plan how to parallelise the training of a deep network over many GPUs.

    Inputs are a network file and a cluster file (YAML), described in the README
    (Inputs), with examples in the repository's examples/ folder; `planner validate`
    checks them. Exit codes: 0 success, 1 a valid question whose answer is "no" (does not
    fit, too slow, no feasible plan), 2 invalid input or usage, 3 an internal error (a
    bug), 130 interrupted. A network, cluster or configuration given as `-` is read
    from standard input.
    """
    from .loading import forget_streams

    forget_streams()


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("-q", "--quiet", is_flag=True, help="Print nothing for valid files.")
def validate(files: tuple[str, ...], quiet: bool) -> None:
    """Check network, cluster and training files, and plans; report every problem.

    Each file says what it is with a top-level `kind: network | cluster | training`, or
    is recognised by its keys (a plan by the `planner:` and `problem:` keys planner
    writes; its placement is checked, as `planner launch` reads it). A training
    configuration is checked with the network, cluster and plan it names, as `planner
    check` reads them, without the search. Exit 0 when every file is valid, 2 otherwise.
    """
    from .errors import InputError
    from .inputs import validate_file

    one_stdin(files)
    problems: list[str] = []
    for path in files:
        try:
            kind, obj = validate_file(path)
        except InputError as exc:
            problems.append(exc.render())
            continue
        if not quiet:
            shown = "<stdin>" if path == "-" else path
            click.echo(f"{shown}: ok ({kind} {_describe(kind, obj)})")
    if problems:
        raise UsageError("\n".join(problems))


def _describe(kind: str, obj: Any) -> str:
    from .units import count

    if kind == "network":
        return (f"'{obj.name}', {count(len(obj.layers), 'layer')}, "
                f"{count(obj.params, 'parameter')}")
    if kind == "cluster":
        nodes = f"{count(obj.nodes, 'node')} × " if obj.nodes else ""
        return f"'{obj.name}', {nodes}{obj.devices_per_node} {obj.device.name} per node"
    if kind == "plan":
        return f"for '{obj.name}', {count(obj.world, 'device')} on {count(obj.nodes, 'node')}"
    return f"'{getattr(obj, 'name', '')}'"


@cli.command()
@click.argument("network", type=click.Path(dir_okay=True))
@click.option("--batch", "-b", type=Whole(1, 2**40), default=1, show_default=True,
              help="Batch size for the product shapes (counts stay per sample).")
@click.option("--all-layers", is_flag=True,
              help="Table: list each of the alike copies of a repeat group (shown as one "
              "row).")
@format_option
@output_option
def show(network: str, batch: int, all_layers: bool, fmt: str | None,
         output: str | None) -> None:
    """Show a network layer by layer: shapes, parameters, forward FLOPs.

    FLOPs count 2 per multiply-accumulate plus elementwise arithmetic; MACs count the
    matrix products alone. The JSON and YAML forms add what each layer keeps for
    backward, its training products (GEMM / convolution shapes) and halo rows.
    """
    from .inputs import load_network
    from .report import network_table, show_data

    check_output(output, (network,))
    net = load_network(network)
    data = show_data(net, batch)
    render_data(data, fmt, output, lambda: network_table(net, data, all_layers), (network,))


@cli.command()
@format_option
@output_option
def devices(fmt: str | None, output: str | None) -> None:
    """List the device catalog (names and aliases usable in cluster files)."""
    from .cluster import catalog, device_record
    from .report import devices_table

    check_output(output, ())
    data = _catalog_figures({"devices": [device_record(d) for d in catalog().values()]})
    render_data(data, fmt, output, lambda: devices_table(list(catalog().values())))


def _catalog_figures(data: Any) -> Any:
    """The catalog's figures as its file gives them: 12 significant digits (66.9 TFLOP/s
    read 66900000000000.01, the float product of 66.9 and 10^12: an audit), whole numbers
    as integers (85520809984 bytes, not 85520809984.0)."""
    if isinstance(data, dict):
        return {k: _catalog_figures(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_catalog_figures(v) for v in data]
    if isinstance(data, float) and math.isfinite(data):
        v = float(f"{data:.12g}")
        return int(v) if v.is_integer() and abs(v) < 2**53 else v
    return data


_attached: list[bool] = []


def _attach_command_groups() -> None:
    """Commands that live in their own modules, attached when the CLI loads; where one
    of those modules was imported first (it imports this one), when the CLI runs."""
    if _attached:
        return
    try:
        from . import cli_check, cli_plan
        from .cli_kernels import comm, kernels

        registers = (cli_plan.register, cli_check.register)
    except (ImportError, AttributeError):  # a command module is still importing
        return
    _attached.append(True)
    for register in registers:
        register(cli)
    cli.add_command(kernels)
    cli.add_command(comm)


_attach_command_groups()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``planner`` console script."""
    if _closed(sys.stdout):
        sys.stdout = _Closed(report=True)
    if _closed(sys.stderr):
        sys.stderr = _Closed(report=False)
    _tolerant_streams()
    if not isinstance(sys.stderr, (_Closed, _Dropping)):
        sys.stderr = _Dropping(sys.stderr)
    _one_blas_thread()
    _unix_signals()
    try:
        cli.main(args=argv, prog_name="planner")
    except SystemExit:
        if _INTERRUPTED:  # click prints "Aborted!" and exits 1, a "no" answer here
            raise SystemExit(130) from None
        raise
    except OSError as exc:
        # what the top level writes before any command runs (--help, --version) to a
        # full or closed stdout: reported as a subcommand's is (exit 2, no traceback)
        where = exc.filename if exc.filename is not None else "standard output"
        _discard_stdout()
        click.echo(f"planner: error: cannot write to {where}: {exc.strerror or exc}",
                   err=True)
        raise SystemExit(EXIT_INPUT) from None


_INTERRUPTED = False


def _unix_signals() -> None:
    """Exit as Unix tools do: killed by SIGPIPE when the reader of the output goes away
    (``planner plan ... | head``: status 141 in the shell, not 1, which means "no plan
    fits" to a CI job under ``pipefail``), and 130 after Ctrl-C. Files written with
    ``-o`` are replaced atomically, so neither leaves a partial one."""
    import signal

    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def interrupted(signum: int, frame: object) -> None:
        global _INTERRUPTED
        _INTERRUPTED = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)


def _one_blas_thread() -> None:
    """One BLAS thread unless the user set a thread count. The command line's matrix
    products are small (a few thousand kernels through networks of 16-32 units), so
    more threads do not make them faster, while OpenBLAS's idle helper threads spin and
    doubled the CPU time of a 6,000-kernel call (README, "Kernel times"). Only before
    numpy is loaded: it reads the variables once, at load."""
    if "numpy" in sys.modules or any(v in os.environ for v in BLAS_THREAD_VARS):
        return
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARS, "1"))


def _tolerant_streams() -> None:
    """On a terminal whose encoding cannot show every character (``PYTHONIOENCODING=ascii``,
    a Latin-1 locale), print what it can and escape the rest instead of failing with
    UnicodeEncodeError (files written with ``-o`` are always UTF-8)."""
    import codecs
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        try:
            utf = codecs.lookup(stream.encoding or "ascii").name.startswith("utf")
        except (LookupError, AttributeError):
            utf = False
        if not utf and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")
