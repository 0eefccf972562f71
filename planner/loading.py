"""Safe YAML loading with source positions.

The file is read as bytes, checked (size, UTF-8, control characters), parsed into YAML
*events* by PyYAML's safe parser (libyaml when available), and built into plain data
(dict, list, str, int, float, bool, None) by an iterative builder that records where
every value and key came from. Building from events instead of ``yaml.load``:

* never constructs objects from tags: any tag other than the standard scalar and
  collection tags is an error (``!!python/object`` and friends);
* rejects duplicate keys, with the position of the second one;
* bounds nesting depth and the expanded size of aliases (no "billion laughs");
* uses no recursion, so 10,000-deep nesting is an error, not a crash;
* resolves plain scalars by the YAML 1.2 core schema: ``yes``/``no``/``on``/``off``
  stay strings and ``1e9`` is a number.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from .errors import MAX_ISSUES, InputError, Issue, Located, UsageError, printable, whole_file

# Bounds that keep any input file within about a second and 150 MB (the hostile-input
# tests hold the planner to 2 s and 200 MB): a 20,000-layer network written out layer by
# layer is about 2 MB and 200,000 values.
MAX_FILE_BYTES = 4 * 2**20
MAX_DEPTH = 64
MAX_NODES = 200_000  #: values in the document, with every alias expanded
# A plan has about 55 values a layer: the plans `planner plan` writes for the deepest
# networks it plans (20,000 layers: 10 MB of YAML, 1.1 million values, read in about 8 s)
# must read back in `launch`, `check` and `validate`. A file that starts as planner's
# plans do (`planner:` first) gets these bounds.
MAX_PLAN_FILE_BYTES = 32 * 2**20
MAX_PLAN_NODES = 2_000_000
_PLAN_HEAD = re.compile(rb'^(?:\xef\xbb\xbf)?\s*(?:\{\s*"planner"|planner)\s*:')

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_loader() -> Any:
    """The YAML loader class input files are read with (libyaml's when installed), for
    code that needs the node tree of a file this module accepts."""
    return _Loader

_TAG_PREFIX = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG_PREFIX}{t}" for t in ("str", "int", "float", "bool", "null")}
_MAP_TAG = f"{_TAG_PREFIX}map"
_SEQ_TAG = f"{_TAG_PREFIX}seq"
# event classes, compared by identity in the parse loop (faster than isinstance)
_StreamStart, _StreamEnd = yaml.StreamStartEvent, yaml.StreamEndEvent
_DocumentStart, _DocumentEnd = yaml.DocumentStartEvent, yaml.DocumentEndEvent
_Scalar, _Alias = yaml.ScalarEvent, yaml.AliasEvent
_MappingStart, _MappingEnd = yaml.MappingStartEvent, yaml.MappingEndEvent
_SequenceStart, _SequenceEnd = yaml.SequenceStartEvent, yaml.SequenceEndEvent

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL_TRUE = {"true", "True", "TRUE"}
_BOOL_FALSE = {"false", "False", "FALSE"}
_INT = re.compile(r"^[-+]?[0-9]+$")
_INT_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_INT_OCT = re.compile(r"^0o[0-7]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")
_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_NUMBER_START = frozenset("0123456789+-.")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x85\u2028\u2029\ufeff\ufffe\uffff]")
#: characters an editor shows as none or as part of a line, which YAML reads otherwise:
#: line breaks to the YAML reader (every later line number one off from the editor's) and
#: a byte-order mark inside the file (found by an audit: reported as a syntax error)
_INVISIBLE = {"\x85": "NEXT LINE, a line break to YAML that editors do not show as one",
              "\u2028": "LINE SEPARATOR, a line break to YAML that editors do not show "
                         "as one",
              "\u2029": "PARAGRAPH SEPARATOR, a line break to YAML that editors do not "
                         "show as one",
              "\ufeff": "a byte-order mark inside the file (one file pasted into "
                         "another?)"}


class Mark(NamedTuple):
    """A 0-based position in a source text (a tuple: one is made per value)."""

    line: int
    column: int


@dataclass
class Document:
    """Plain data from one YAML file, with the position of every value and key."""

    file: str
    text: str
    data: Any
    marks: dict[str, Mark] = field(default_factory=dict)
    key_marks: dict[str, Mark] = field(default_factory=dict)
    _lines: list[str] | None = field(default=None, repr=False, compare=False)
    #: how the file wrote a null it holds at the top level (``~``, ``null``), or None
    #: (it holds something else, or nothing: empty, comments alone)
    null_text: str | None = None

    def nothing(self) -> str:
        """What a document without data holds, for a message that asks for a mapping:
        "the file is empty" (nothing, comments alone) or "the file holds null (~), not a
        mapping" (an audit found a file of ``~`` alone said to be empty)."""
        if self.null_text is None:
            return "the file is empty"
        return f"the file holds null ({printable(self.null_text)}), not a mapping"

    def line(self, index: int) -> str | None:
        """Source line ``index`` (0-based), or None (split once: a file with thousands of
        problems must not be split thousands of times)."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines[index] if 0 <= index < len(self._lines) else None

    def locate(self, issue: Issue) -> Located:
        """Resolve an issue's path to a file position (nearest known ancestor)."""
        if self.data is None and all(not ln.strip() or ln.lstrip().startswith("#")
                                     for ln in self.text.splitlines()):
            # empty, or comments alone: nothing to point at
            return whole_file(self.file, issue.message) if issue.path == "$" else \
                Located(self.file, 0, 0, issue.message, issue.path)
        mark = self.find_mark(issue.path, issue.at_key)
        return Located(self.file, mark.line + 1, mark.column + 1, issue.message, issue.path,
                       self.line(mark.line))

    def find_mark(self, path: str, at_key: bool = False) -> Mark:
        """The mark of ``path``, or of its nearest ancestor that has one."""
        if at_key and path in self.key_marks:
            return self.key_marks[path]
        p = path
        while True:
            if p in self.marks:
                return self.marks[p]
            parent = parent_path(p)
            if parent is None:
                return Mark(0, 0)
            p = parent

    def error(self, issues: list[Issue], truncated: bool = False) -> InputError:
        """An :class:`InputError` for ``issues`` located in this document (``truncated``:
        checking stopped at :data:`~planner.errors.MAX_ISSUES`)."""
        return InputError([self.locate(i) for i in issues], truncated)


def child_path(path: str, key: str | int) -> str:
    """``$.a`` + ``b`` → ``$.a.b``; + ``3`` → ``$.a[3]``; odd keys are quoted."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _SIMPLE_KEY.fullmatch(key):
        return f"{path}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{path}['{escaped}']"


def parent_path(path: str) -> str | None:
    """The path one level up, or None at the root."""
    if path == "$":
        return None
    if path.endswith("]"):
        depth = 0
        for i in range(len(path) - 1, -1, -1):
            ch = path[i]
            if ch == "]":
                depth += 1
            elif ch == "[":
                depth -= 1
                if depth == 0:
                    return path[:i]
        return "$"
    cut = path.rfind(".")
    return path[:cut] if cut > 0 else "$"


def _whole(file: str, message: str) -> InputError:
    """An error about the file itself (missing, unreadable, too large, not text)."""
    return InputError([whole_file(file, message)])


def _fail(file: str, line: int, col: int, message: str, text: str = "") -> InputError:
    lines = text.splitlines()
    src = lines[line] if text and 0 <= line < len(lines) else None
    return InputError([Located(file, line + 1, col + 1, message, "$", src)])


#: what was read from standard input (``-``) and from pipes (``<(command)``), by the
#: name given: a stream can be read once, and a plan records the digest of what was read
_STREAMS: dict[str, bytes] = {}
STDIN = "-"
#: the message for ``-`` where a command reads measurement files (CSV, nccl-tests output)
STDIN_CSV = ("measurement files are not read from standard input; name the file, or pipe "
             "it in with <(command)")


def forget_streams() -> None:
    """Forget what was read from standard input and pipes (each command starts afresh)."""
    _STREAMS.clear()


def input_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an input as it was read: a stream's from memory, a file's from disk
    (for the digests a plan records)."""
    key = os.fspath(path)
    return _STREAMS[key] if key in _STREAMS else Path(path).read_bytes()


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of an input's bytes as they were read (plans record what they were made
    from; standard input and pipes included)."""
    return hashlib.sha256(input_bytes(path)).hexdigest()


def _yaml_limit(head: bytes) -> tuple[int, str]:
    """The size limit of a YAML input by its first bytes (a plan's is larger), and how
    to say it."""
    if _PLAN_HEAD.match(head):
        return MAX_PLAN_FILE_BYTES, (f"input files are limited to "
                                     f"{MAX_PLAN_FILE_BYTES // 2**20} MiB (plans)")
    return MAX_FILE_BYTES, f"input files are limited to {MAX_FILE_BYTES // 2**20} MiB"


#: a limit by a file's first 64 bytes: (bytes, how to say it)
Limit = Callable[[bytes], tuple[int, str]]


def _read_stream(fh: Any, name: str, limits: Limit = _yaml_limit) -> bytes:
    head = fh.read(64)
    limit, said = limits(head)
    raw = head + fh.read(limit + 1 - len(head))
    if len(raw) > limit:
        raise _whole(name, f"input is too large; {said}")
    return bytes(raw)


def _read_pipe(p: Path, name: str, kind: str, limits: Limit) -> bytes:
    """A pipe's bytes. Opened without blocking, so that a named pipe nobody writes to is
    an error rather than a wait forever (reading a pipe with no writer gives end of
    file); a pipe whose writer is there, as the shell's ``<(command)``, is read to its
    end."""
    import fcntl

    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            with os.fdopen(fd, "rb", closefd=False) as fh:
                raw = _read_stream(fh, name, limits)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _whole(name, _read_error(exc)) from None
    if not raw:
        raise _whole(name, f"is a pipe that nothing writes to, expected {kind}")
    return raw


def read_checked(path: str | os.PathLike[str], name: str, kind: str,
                 limits: Limit = _yaml_limit) -> bytes:
    """A named file's bytes, read with the checks every input gets: a missing file, a
    folder, a device (``/dev/zero`` would be read until memory runs out) or a file over
    ``limits`` is an :class:`InputError` naming it; a pipe is read without waiting for
    a writer that never comes. ``kind`` is the text expected, for the messages
    ("YAML", "CSV")."""
    return _read_checked(path, name, kind, limits)[0]


def _read_checked(path: str | os.PathLike[str], name: str, kind: str,
                  limits: Limit) -> tuple[bytes, bool]:
    """:func:`read_checked`, and whether the file was a pipe."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise _whole(name, "no such file") from None
    except OSError as exc:
        raise _whole(name, _read_error(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise _whole(name, f"is a directory, expected a {kind} file") from None
    if stat.S_ISFIFO(st.st_mode):  # a pipe: <(generate-network) in bash
        return _read_pipe(p, name, kind, limits), True
    if not stat.S_ISREG(st.st_mode):
        raise _whole(name, f"is not a regular file or a pipe, expected a {kind} file") \
            from None
    try:
        with p.open("rb") as fh:
            head = fh.read(64)
            limit, said = limits(head)
            if st.st_size > limit:
                raise _whole(name, f"file is too large ({st.st_size:,} bytes); {said}")
            raw = head + fh.read(limit + 1 - len(head))
    except OSError as exc:
        raise _whole(name, _read_error(exc)) from None
    if len(raw) > limit:
        raise _whole(name, f"file is too large; {said}")
    return raw, False


def read_text(path: str | os.PathLike[str], display: str | None = None) -> tuple[str, str]:
    """Read a file as UTF-8 text with the checks of this module; returns (display, text).
    ``-`` is standard input (``<stdin>`` in messages), and a pipe (``<(command)`` in the
    shell) is read as a file is; each is read once and kept.

    Raises :class:`InputError` for a missing, unreadable, oversized, binary or
    non-UTF-8 file, each with a position where one makes sense.
    """
    key = os.fspath(path)
    if key == STDIN:
        name = display if display is not None else "<stdin>"
        if key not in _STREAMS:
            import sys

            if sys.stdin is None or sys.stdin.isatty():
                raise _whole(name, "standard input is a terminal; pipe the YAML in "
                                        "(generate | planner ... -) or name a file")
            try:
                _STREAMS[key] = _read_stream(sys.stdin.buffer, name)
            except OSError as exc:
                raise _whole(name, _read_error(exc)) from None
        return name, decode(_STREAMS[key], name)
    name = display if display is not None else str(path)
    if not str(path):  # Path("") is the current folder: "is a directory" misleads
        raise UsageError("planner: error: a file name is empty ('' was given); give the "
                         "file's path")
    if key in _STREAMS:
        return name, decode(_STREAMS[key], name)
    raw, pipe = _read_checked(path, name, "YAML", _yaml_limit)
    if pipe:  # a pipe is read once: kept for the plan's digest of it
        _STREAMS[key] = raw
    return name, decode(raw, name)


def _read_error(exc: OSError) -> str:
    hint = " (check the file's permissions)" if isinstance(exc, PermissionError) else ""
    return f"cannot read the file: {exc.strerror or exc}{hint}"


def decode(raw: bytes, name: str, what: str | None = None) -> str:
    """Decode UTF-8 (with or without BOM) and reject control characters, with positions.

    A NUL byte near the start means a binary file (an image, an archive, a compiled
    model): that is said first, not the first byte that is not UTF-8. ``what`` names the
    text expected (default: CSV or YAML by the file's extension)."""
    if what is None:
        what = "CSV" if str(name).lower().endswith(".csv") else "YAML"
    for bom, encoding in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                          (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):
        if raw.startswith(bom):
            raise _whole(name, f"the file is {encoding} text; save it as UTF-8")
    head = raw[:64] if len(raw) % 2 == 0 else b""
    for zeros, nonzero, encoding in ((head[1::2], head[0::2], "UTF-16LE"),
                                     (head[0::2], head[1::2], "UTF-16BE")):
        if len(head) >= 4 and not zeros.strip(b"\x00") and all(nonzero):
            raise _whole(name, f"the file looks like {encoding} text without a byte-order "
                               "mark; save it as UTF-8")
    nul = raw.find(b"\x00", 0, 8192)
    if nul >= 0:
        line = raw.count(b"\n", 0, nul)
        col = nul - (raw.rfind(b"\n", 0, nul) + 1)
        raise _fail(name, line, col, "found a NUL byte: this looks like a binary file, not "
                                     f"{what} text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        pos = exc.start
        line = raw.count(b"\n", 0, pos)
        col = pos - (raw.rfind(b"\n", 0, pos) + 1)
        raise _fail(
            name, line, col,
            f"the file is not valid UTF-8 (byte 0x{raw[pos]:02x}); save it as UTF-8 text",
        ) from None
    m = _CONTROL.search(text)
    if m is not None:
        pos = m.start()
        line = text.count("\n", 0, pos)
        col = pos - (text.rfind("\n", 0, pos) + 1)
        if m.group() == "\x00":
            message = f"found a NUL byte: this looks like a binary file, not {what} text"
        elif m.group() in _INVISIBLE:
            message = (f"found U+{ord(m.group()):04X} ({_INVISIBLE[m.group()]}); delete it")
        else:
            message = (f"found control character U+{ord(m.group()):04X}, which {what} text "
                       "cannot contain; delete it (or save the file as plain UTF-8 text)")
        raise _fail(name, line, col, message, text)
    return text


def load_file(path: str | os.PathLike[str], display: str | None = None) -> Document:
    """Read and parse one YAML file into a :class:`Document`."""
    name, text = read_text(path, display)
    return parse_text(text, name)


#: Longest numeral read as a number. Converting a 4,300-digit integer is refused by Python
#: (and slow); no planner quantity needs more than a few digits.
MAX_NUMERAL = 400


def resolve_plain(value: str) -> Any:
    """A plain scalar by the YAML 1.2 core schema; ValueError for an absurdly long
    numeral (its message says so)."""
    if value and value[0] not in _NUMBER_START and value[0] not in "~nNtTfF":
        return value  # the common case: a word (every other form starts like this)
    if len(value) > MAX_NUMERAL and value[0] in _NUMBER_START and (
            _INT.match(value) or _INT_HEX.match(value) or _INT_OCT.match(value)
            or _FLOAT.match(value)):
        raise ValueError(f"a number written with {len(value):,} characters is out of range "
                         f"(at most {MAX_NUMERAL}); planner quantities are far smaller")
    if _NULL.match(value):
        return None
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    if _INT.match(value):
        return int(value)
    if _INT_HEX.match(value):
        return int(value, 16)
    if _INT_OCT.match(value):
        return int(value[2:], 8)
    if _FLOAT.match(value):
        x = float(value)
        if math.isinf(x):  # 1e400: not "inf", which the file does not say
            raise ValueError(f"the number {value} is beyond the largest a float holds "
                             "(about 1.8e308); planner quantities are far smaller")
        return x
    if _INF.match(value):
        return -math.inf if value.startswith("-") else math.inf
    if _NAN.match(value):
        return math.nan
    return value


def _construct_tagged(tag: str, value: str) -> Any:
    short = tag[len(_TAG_PREFIX):]
    if short == "str":
        return value
    resolved = resolve_plain(value)
    if short == "null" and resolved is None:
        return None
    if short == "bool" and isinstance(resolved, bool):
        return resolved
    if short == "int" and isinstance(resolved, int) and not isinstance(resolved, bool):
        return resolved
    if short == "float" and isinstance(resolved, (int, float)) and not isinstance(resolved, bool):
        return float(resolved)
    raise ValueError(f"{value!r} is not a valid !!{short}")


class _Frame:
    __slots__ = ("anchor", "container", "key", "key_mark", "path", "size")

    def __init__(self, container: Any, path: str, anchor: str | None) -> None:
        self.container = container
        self.path = path
        self.anchor = anchor
        self.key: str | None = None
        self.key_mark: Mark | None = None
        self.size = 1


def _tag_error(tag: str) -> str:
    shown = "!!" + tag[len(_TAG_PREFIX):] if tag.startswith(_TAG_PREFIX) else tag
    return (
        f"YAML tag '{shown}' is not allowed: planner files hold plain data "
        "(mappings, lists, strings, numbers, booleans)"
    )


class _ScannedAhead(Exception):
    """libyaml's scanner reached its own nesting limit (PyYAML 6.0.4's bundled libyaml
    stops at 1,000 flow levels while scanning ahead of the events): the events up to
    :data:`MAX_DEPTH` never arrived, so the file is read again by the pure-Python
    parser, which scans as it goes, to say where it nests too deep."""


def parse_text(text: str, file: str = "<string>") -> Document:
    """Parse YAML text into a :class:`Document`; every problem is an :class:`InputError`."""
    try:
        return _parse_text(text, file, _Loader)
    except _ScannedAhead:
        return _parse_text(text, file, yaml.SafeLoader)


def _parse_text(text: str, file: str, loader_class: Any) -> Document:
    doc = Document(file=file, text=text, data=None)
    issues: list[Located] = _LocatedList()

    def located(mark: Any, message: str, path: str = "$") -> Located:
        line = getattr(mark, "line", 0)
        col = getattr(mark, "column", 0)
        return Located(file, line + 1, col + 1, message, path, doc.line(line))

    stack: list[_Frame] = []
    anchors: dict[str, tuple[Any, int]] = {}
    documents = 0
    root: Any = None
    root_set = False
    values = 0  # values of the document so far, aliases expanded
    max_values = MAX_PLAN_NODES if _PLAN_HEAD.match(text[:64].encode()) else MAX_NODES

    def too_many(event: Any, path: str, limit: int = max_values) -> InputError:
        # the bound as an argument: the parse loop reads max_values as a plain local
        return InputError([located(
                event.start_mark,
                f"the document expands to more than {limit:,} values (an alias counts "
                "as everything it stands for); planner files are much smaller: is this the "
                "right file?", path,
            )])

    def attach(value: Any, size: int, mark: Mark, path_hint: str, event: Any) -> None:
        nonlocal root, root_set
        if not stack:
            root, root_set = value, True
            text = getattr(event, "value", None)
            if value is None and text:  # `~`, `null`: not nothing
                doc.null_text = str(text)
            return
        top = stack[-1]
        top.size += size
        if type(top.container) is list:
            path = path_hint or child_path(top.path, len(top.container))
            top.container.append(value)
            doc.marks[path] = mark
            return
        # mapping: either a key or a value
        if top.key is None:
            if not isinstance(value, str):
                if isinstance(value, (dict, list)):
                    issues.append(located(event.start_mark, "mapping keys must be plain "
                                          "strings, not collections", top.path))
                    top.key = f"<invalid key {len(top.container)}>"
                else:
                    # numbers/booleans as keys: keep their text so messages make sense
                    # (a boolean as written, `true` or `on`, not Python's 'True')
                    top.key = (str(getattr(event, "value", value)) if isinstance(value, bool)
                               else str(value) if value is not None else "null")
            else:
                top.key = value
            top.key_mark = mark
            return
        key = top.key
        path = path_hint or child_path(top.path, key)
        if key in top.container:
            first = doc.key_marks.get(path)
            where = f" (first defined at line {first.line + 1})" if first else ""
            assert top.key_mark is not None
            issues.append(Located(
                file, top.key_mark.line + 1, top.key_mark.column + 1,
                f"duplicate key '{key}'{where}; each key may appear once", path,
                doc.line(top.key_mark.line),
            ))
        else:
            top.container[key] = value
            doc.marks[path] = mark
            assert top.key_mark is not None
            doc.key_marks[path] = top.key_mark
        top.key = None
        top.key_mark = None

    def current_child_path() -> str:
        if not stack:
            return "$"
        top = stack[-1]
        if isinstance(top.container, list):
            return child_path(top.path, len(top.container))
        if top.key is None:
            return top.path
        return child_path(top.path, top.key)

    loader = loader_class(text)
    try:
        while True:
            event = loader.get_event()
            cls = type(event)
            if event is None or cls is _StreamEnd:
                break
            if cls is _DocumentStart:
                documents += 1
                if documents > 1:
                    issues.append(located(event.start_mark, "expected one YAML document, "
                                          "found more ('---' starts a second one)"))
                    break
                if event.version is not None and tuple(event.version) < (1, 2):
                    # read by YAML 1.2's core schema, a 1.1 file's 010 and yes would not
                    # be what its writer meant (an audit: the directive was ignored)
                    issues.append(located(event.start_mark, "planner reads YAML 1.2 (010 "
                                          "is ten, yes is a word), and the file asks for "
                                          f"YAML {'.'.join(map(str, event.version))}; "
                                          "drop the %YAML directive and check such values"))
                    break
                continue
            if cls is _StreamStart or cls is _DocumentEnd:
                continue
            sm = event.start_mark
            mark = Mark(sm.line, sm.column) if sm is not None else Mark(0, 0)
            value: Any
            if cls is _Scalar:
                top_frame = stack[-1] if stack else None
                is_key = top_frame is not None and type(top_frame.container) is dict and \
                    top_frame.key is None
                path = current_child_path()
                tag = event.tag
                if tag is None:
                    try:
                        value = event.value if event.style else resolve_plain(event.value)
                    except ValueError as exc:
                        issues.append(located(sm, str(exc), path))
                        value = None
                elif tag in _SCALAR_TAGS:
                    try:
                        value = _construct_tagged(tag, event.value)
                    except ValueError as exc:
                        issues.append(located(sm, str(exc), path))
                        value = event.value
                elif tag != "!":
                    issues.append(located(sm, _tag_error(tag), path))
                    value = event.value
                else:
                    value = event.value
                if is_key and event.value == "<<" and not event.style:
                    issues.append(located(sm, "YAML merge keys ('<<') are not supported; "
                                          "write the keys out", path))
                if event.anchor is not None:
                    anchors[event.anchor] = (value, 1)
                values += 1
                if values > max_values:
                    raise too_many(event, path)
                attach(value, 1, mark, path, event)
                continue
            if cls is _Alias:
                if event.anchor not in anchors:
                    inside = any(frame.anchor == event.anchor for frame in stack)
                    issues.append(located(
                        sm, f"alias '*{event.anchor}' is inside the collection "
                        f"'&{event.anchor}' names, which would then contain itself; write "
                        "the items out" if inside else f"unknown alias '*{event.anchor}'",
                        current_child_path()))
                    attach(None, 1, mark, "", event)
                    continue
                value, size = anchors[event.anchor]
                values += size
                if values > max_values:
                    raise too_many(event, current_child_path())
                attach(value, size, mark, "", event)
                continue
            if cls is _MappingStart or cls is _SequenceStart:
                is_map = cls is _MappingStart
                if stack and isinstance(stack[-1].container, dict) and stack[-1].key is None:
                    issues.append(located(sm, "mapping keys must be plain strings, not "
                                          "collections", stack[-1].path))
                    raise _Abort()
                tag = event.tag
                expected = _MAP_TAG if is_map else _SEQ_TAG
                path = current_child_path()
                if tag is not None and tag != "!" and tag != expected:
                    issues.append(located(sm, _tag_error(tag), path))
                if len(stack) >= MAX_DEPTH:
                    issues.append(located(
                        sm, f"nesting deeper than {MAX_DEPTH} levels; planner files are "
                        "shallow, check the indentation or brackets", path))
                    raise _Abort()
                values += 1
                if values > max_values:
                    raise too_many(event, path)
                stack.append(_Frame({} if is_map else [], path, event.anchor))
                doc.marks.setdefault(path, mark)
                continue
            if cls is _MappingEnd or cls is _SequenceEnd:
                frame = stack.pop()
                if frame.anchor is not None:
                    anchors[frame.anchor] = (frame.container, frame.size)
                parent_mark = doc.marks.get(frame.path, mark)
                attach(frame.container, frame.size, parent_mark, frame.path, event)
                continue
    except _Abort:
        pass
    except yaml.MarkedYAMLError as exc:
        if "maximum nesting depth" in str(exc.problem) and loader_class is not \
                yaml.SafeLoader:
            raise _ScannedAhead() from None
        mark_obj = exc.problem_mark or exc.context_mark
        message = exc.problem or "invalid YAML"
        if exc.context and exc.problem:
            started = ""
            if exc.context_mark is not None and exc.problem_mark is not None and \
                    exc.context_mark.line != exc.problem_mark.line:
                started = f" that started at line {exc.context_mark.line + 1}"
            message = f"{exc.problem} ({exc.context}{started})"
        if mark_obj is not None and _char_at(text, mark_obj.line, mark_obj.column) == "\t":
            message += "; YAML is indented with spaces, not tabs"
        # list.append: past the cap, the syntax error is still reported
        list.append(issues, located(mark_obj, f"invalid YAML: {message}"))
    except yaml.YAMLError as exc:
        list.append(issues, Located(file, 1, 1, f"invalid YAML: {exc}", "$", None))
    finally:
        loader.dispose()
    if issues:
        raise InputError(issues, truncated=len(issues) >= MAX_ISSUES)
    doc.data = root if root_set else None
    doc.marks.setdefault("$", Mark(0, 0))
    return doc


def _char_at(text: str, line: int, column: int) -> str:
    """The character at a 0-based line and column ('' outside the text)."""
    start = 0
    for _ in range(line):
        start = text.find("\n", start) + 1
        if start == 0:
            return ""
    pos = start + column
    return text[pos] if pos < len(text) and text[pos] != "\n" else ""


class _Abort(Exception):
    """Stop building: a structural problem makes the rest meaningless."""


class _LocatedList(list[Located]):
    """Problems found while parsing; parsing stops (``_Abort``) at ``MAX_ISSUES``."""

    def append(self, problem: Located) -> None:
        super().append(problem)
        if len(self) >= MAX_ISSUES:
            raise _Abort()
