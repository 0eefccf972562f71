"""Serialising plain data (JSON, YAML) deterministically and writing files safely."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .loading import resolve_plain


def round_sig(value: float, digits: int = 4) -> float:
    """Round a float to ``digits`` significant digits (0, inf, nan unchanged)."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def rounded(data: Any, digits: int = 4, _bytes: bool = False) -> Any:
    """A copy of plain data with every float rounded to ``digits`` significant digits
    (times, keys ``*_s``, always floats), except sizes in bytes (keys ``bytes`` or
    ``*_bytes``, and everything in a ``breakdown``), which are whole numbers of bytes
    (the nearest: a byte count a model averages may have a fraction; 25 MiB stays
    26214400, not 26210000.0)."""
    if isinstance(data, bool):
        return data
    if isinstance(data, float):
        if _bytes and math.isfinite(data):
            return round(data)
        return round_sig(data, digits)
    if isinstance(data, dict):
        return {k: _seconds(k, rounded(v, digits, _bytes or _is_bytes_key(k)))
                for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [rounded(v, digits, _bytes) for v in data]
    return data


def _seconds(key: object, value: Any) -> Any:
    """A time (key ``*_s``) is a float even where a sum of nothing made it the int 0."""
    if isinstance(key, str) and key.endswith("_s") and type(value) is int:
        return float(value)
    return value


def _is_bytes_key(key: object) -> bool:
    return isinstance(key, str) and (key in ("bytes", "breakdown") or key.endswith("_bytes"))


def to_json(data: Any) -> str:
    """Pretty JSON with a final newline; non-finite floats become null."""
    return json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


#: YAML 1.1's one-letter booleans (https://yaml.org/type/bool.html)
_ONE_LETTER_BOOLS = frozenset({"y", "Y", "n", "N"})


def _reads_as_text(text: str) -> bool:
    """Whether ``text`` written plain reads back as a string by the YAML 1.2 core schema
    as well (planner's reader, :func:`~.loading.resolve_plain`): ``1e3`` and ``0o17``
    are strings to YAML 1.1, whose resolver PyYAML writes by, but numbers to 1.2, so a
    network named "1e3" came back as 1000.0 from a plan planner had written. YAML 1.1's
    booleans y, Y, n and N, which PyYAML's resolver leaves out (Go's yaml.v2 and
    yaml-cpp read them as booleans: a layer named "y" came back true there), are quoted
    too."""
    if text in _ONE_LETTER_BOOLS:
        return False
    try:
        return isinstance(resolve_plain(text), str)
    except ValueError:  # a numeral too long to read: quote it
        return False


class _Dumper(_BaseDumper):  # type: ignore[misc]
    """Block style for mappings, flow style for short lists of scalars (shapes, grids);
    strings that YAML 1.2 would read as numbers are quoted (:func:`_reads_as_text`)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        tag = super().resolve(kind, value, implicit)
        if tag == _STR and kind is yaml.ScalarNode and implicit[0] \
                and not _reads_as_text(value):
            return "tag:yaml.org,2002:float"  # not str: the emitter quotes it
        return tag


def _repr_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = len(data) <= 8 and all(
        isinstance(v, (int, float)) or (isinstance(v, str) and len(v) < 24) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _repr_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    if math.isnan(data):
        text = ".nan"
    elif math.isinf(data):
        text = ".inf" if data > 0 else "-.inf"
    else:
        text = repr(data)
        if "e" in text and "." not in text.split("e")[0]:
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(list, _repr_list)
_Dumper.add_representer(tuple, _repr_list)
_Dumper.add_representer(float, _repr_float)


_YAML_OPTIONS: dict[str, Any] = {"allow_unicode": True, "width": 100}


def to_yaml(data: Any) -> str:
    """Block-style YAML, keys in insertion order, readable by any YAML 1.1/1.2 parser.

    Plain data (dicts, lists, tuples, strings, numbers, booleans, None, no container
    twice) goes straight to the emitter as events, which is several times faster than
    PyYAML's representer on plans of thousands of layers and gives the same bytes
    (``tests/test_reliability_output.py`` compares the two); anything else takes PyYAML's
    own path."""
    events: list[yaml.Event] = [yaml.StreamStartEvent(), yaml.DocumentStartEvent(explicit=False)]
    if not _events(data, events, set()):
        return _to_yaml_pyyaml(data)
    events += [yaml.DocumentEndEvent(explicit=False), yaml.StreamEndEvent()]
    text: str = yaml.emit(events, Dumper=_Dumper, **_YAML_OPTIONS)
    return text


def _to_yaml_pyyaml(data: Any) -> str:
    """:func:`to_yaml` through PyYAML's representer (the reference)."""
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                          **_YAML_OPTIONS)
    return text


_STR, _INT, _FLOAT = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_RESOLVER: Any = yaml.resolver.Resolver()
_SCALARS: dict[tuple[str, str], yaml.ScalarEvent] = {}


def _scalar(tag: str, text: str) -> yaml.ScalarEvent:
    """A scalar event with the implicit flags PyYAML's serializer would give it: plain
    when the text reads back as ``tag``, quoted when ``tag`` is str. The emitter only
    reads events, so equal scalars share one (plans repeat most of theirs)."""
    event = _SCALARS.get((tag, text))
    if event is None:
        if len(_SCALARS) > 200_000:
            _SCALARS.clear()
        plain = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))
        if plain == _STR and not _reads_as_text(text):
            plain = _FLOAT
        event = _SCALARS[(tag, text)] = yaml.ScalarEvent(
            None, tag, (plain == tag, tag == _STR), text)
    return event


def _float_text(data: float) -> str:
    if math.isnan(data):
        return ".nan"
    if math.isinf(data):
        return ".inf" if data > 0 else "-.inf"
    text = repr(data)
    if "e" in text and "." not in text.split("e")[0]:
        mant, exp = text.split("e")
        text = f"{mant}.0e{exp}"
    return text


def _events(data: Any, out: list[yaml.Event], seen: set[int]) -> bool:
    """Append the events of ``data`` to ``out``; False if PyYAML's representer must take
    it (a type it handles otherwise, or a container met twice: PyYAML writes an alias)."""
    kind = type(data)
    if kind is str:
        out.append(_scalar(_STR, data))
    elif kind is bool:
        out.append(_scalar("tag:yaml.org,2002:bool", "true" if data else "false"))
    elif kind is int:
        out.append(_scalar(_INT, str(data)))
    elif kind is float:
        out.append(_scalar(_FLOAT, _float_text(data)))
    elif data is None:
        out.append(_scalar("tag:yaml.org,2002:null", "null"))
    elif kind is dict:
        if id(data) in seen:
            return False
        seen.add(id(data))
        out.append(yaml.MappingStartEvent(None, "tag:yaml.org,2002:map", True,
                                          flow_style=False))
        for key, value in data.items():
            if not (_events(key, out, seen) and _events(value, out, seen)):
                return False
        out.append(yaml.MappingEndEvent())
    elif kind is list or kind is tuple:
        if id(data) in seen:
            return False
        seen.add(id(data))
        flow = len(data) <= 8 and all(
            isinstance(v, (int, float)) or (isinstance(v, str) and len(v) < 24) for v in data)
        out.append(yaml.SequenceStartEvent(None, "tag:yaml.org,2002:seq", True,
                                           flow_style=flow))
        for value in data:
            if not _events(value, out, seen):
                return False
        out.append(yaml.SequenceEndEvent())
    else:
        return False
    return True


def output_target(path: str | os.PathLike[str],
                  protect: tuple[str | os.PathLike[str], ...] = ()) -> Path:
    """The file ``-o path`` will replace, checked before any work is done: not one of
    ``protect`` (the command's inputs, however named: another relative path, a symlink or
    a hard link; ``-``: the file standard input is redirected from), not a directory, in
    a folder that exists. A symlink is followed (its target is rewritten, as ``>``
    would). A device, pipe or socket (``/dev/null``, ``/dev/stdout``, a FIFO) is written
    into, not replaced. Raises :class:`UsageError`."""
    shown = os.fspath(path)  # as the user wrote it
    if not shown:
        raise UsageError("planner: error: the output file name is empty; give -o FILE, or "
                         "leave -o out for standard output")
    if shown.endswith(("/", os.sep)) or shown.endswith(os.sep + ".") or shown == ".":
        # Path() drops a trailing slash: 'keep.txt/' would replace the file keep.txt
        raise UsageError(f"planner: error: cannot write {shown}: a file name that ends in "
                         "'/' names a folder; give the file's name (-o folder/plan.yaml)")
    given = Path(path)
    if is_stream(given):
        return given
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    for p in protect:
        try:
            if os.fspath(p) == "-":  # standard input, redirected from this very file?
                mine, got = os.fstat(0), os.stat(target)
                same = (mine.st_dev, mine.st_ino) == (got.st_dev, got.st_ino)
            else:
                same = target.exists() and Path(p).exists() and os.path.samefile(target, p)
        except (OSError, ValueError):
            continue
        if same:
            raise UsageError(f"planner: error: refusing to write {shown}: it is one of this "
                             "command's inputs; choose another output file")
    if target.is_dir():
        raise UsageError(f"planner: error: cannot write {shown}: it is a directory")
    if target.is_file() and (not os.access(target, os.W_OK)
                             or not os.stat(target).st_mode & 0o222):
        # the rename would replace a file its owner protected (root included)
        raise UsageError(f"planner: error: refusing to replace {shown}: it is read-only; "
                         "make it writable or choose another output file")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        what = f"{folder} is a file, not a folder" if folder.exists() else \
            f"folder {folder} does not exist"
        raise UsageError(f"planner: error: cannot write {shown}: {what}")
    return target


def is_stream(path: Path) -> bool:
    """Whether ``path`` (symlinks followed) is something other than a regular file or a
    folder: a device, pipe or socket, which is written into rather than replaced."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_atomic(path: str | os.PathLike[str], text: str | bytes,
                 protect: tuple[str | os.PathLike[str], ...] = (),
                 executable: bool = False) -> None:
    """Write ``text`` (or bytes) to ``path`` atomically: a temporary file in the same
    folder, flushed to disk, then a rename. An existing file is replaced only when the new
    one is complete; on any error (or an interrupt) the old file is untouched and no
    temporary file is left. A device or pipe (``/dev/null``, ``/dev/stdout``) is written
    into directly. Refuses to overwrite one of ``protect`` (the command's own
    inputs) or a read-only file. A new file is ``rw-rw-rw-`` less the umask (with
    ``executable``, a script, ``rwxrwxrwx``); an existing one keeps its mode. An
    operating-system error (no permission, disk full) is a :class:`UsageError` naming
    the file."""
    target = output_target(path, protect)
    # a path that is not UTF-8 reaches the text as surrogates (a launch script naming
    # it): written back as the bytes it was
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if is_stream(target):
        try:
            with open(target, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise UsageError(f"planner: error: cannot write {path}: "
                             f"{exc.strerror or exc}") from None
        return
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"planner: error: cannot write {path}: {exc.strerror or exc}") \
            from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if target.exists():
            with contextlib.suppress(OSError):
                os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            with contextlib.suppress(OSError):
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, (0o777 if executable else 0o666) & ~umask)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise UsageError(f"planner: error: cannot write {path}: {exc.strerror or exc}") \
                from None
        raise
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Make the rename durable (best effort: not every system can open a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
