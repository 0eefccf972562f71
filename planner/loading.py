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

import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError, Issue, Located

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_NODES = 2_000_000

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TAG_PREFIX = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG_PREFIX}{t}" for t in ("str", "int", "float", "bool", "null")}
_MAP_TAG = f"{_TAG_PREFIX}map"
_SEQ_TAG = f"{_TAG_PREFIX}seq"

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL_TRUE = {"true", "True", "TRUE"}
_BOOL_FALSE = {"false", "False", "FALSE"}
_INT = re.compile(r"^[-+]?[0-9]+$")
_INT_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_INT_OCT = re.compile(r"^0o[0-7]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff]")


@dataclass(frozen=True)
class Mark:
    """A 0-based position in a source text."""

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

    def locate(self, issue: Issue) -> Located:
        """Resolve an issue's path to a file position (nearest known ancestor)."""
        mark = self.find_mark(issue.path, issue.at_key)
        lines = self.text.splitlines()
        src = lines[mark.line] if 0 <= mark.line < len(lines) else None
        return Located(self.file, mark.line + 1, mark.column + 1, issue.message, issue.path, src)

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

    def error(self, issues: list[Issue]) -> InputError:
        """An :class:`InputError` for ``issues`` located in this document."""
        return InputError([self.locate(i) for i in issues])


def child_path(path: str, key: str | int) -> str:
    """``$.a`` + ``b`` → ``$.a.b``; + ``3`` → ``$.a[3]``; odd keys are quoted."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", key):
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


def _fail(file: str, line: int, col: int, message: str, text: str = "") -> InputError:
    lines = text.splitlines()
    src = lines[line] if text and 0 <= line < len(lines) else None
    return InputError([Located(file, line + 1, col + 1, message, "$", src)])


def read_text(path: str | os.PathLike[str], display: str | None = None) -> tuple[str, str]:
    """Read a file as UTF-8 text with the checks of this module; returns (display, text).

    Raises :class:`InputError` for a missing, unreadable, oversized, binary or
    non-UTF-8 file, each with a position where one makes sense.
    """
    p = Path(path)
    name = display if display is not None else str(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise _fail(name, 0, 0, "no such file") from None
    except OSError as exc:
        raise _fail(name, 0, 0, f"cannot read the file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise _fail(name, 0, 0, "is a directory, expected a YAML file") from None
    if not stat.S_ISREG(st.st_mode):
        raise _fail(name, 0, 0, "is not a regular file, expected a YAML file") from None
    if st.st_size > MAX_FILE_BYTES:
        raise _fail(
            name, 0, 0,
            f"file is too large ({st.st_size:,} bytes); input files are limited to "
            f"{MAX_FILE_BYTES // 2**20} MiB",
        )
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _fail(name, 0, 0, f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _fail(name, 0, 0, f"file is too large; input files are limited to "
                    f"{MAX_FILE_BYTES // 2**20} MiB")
    return name, decode(raw, name)


def decode(raw: bytes, name: str) -> str:
    """Decode UTF-8 (with or without BOM) and reject control characters, with positions."""
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
        what = "a NUL byte: this looks like a binary file" if m.group() == "\x00" else (
            f"control character U+{ord(m.group()):04X}")
        raise _fail(name, line, col, f"unexpected {what}, expected YAML text", text)
    return text


def load_file(path: str | os.PathLike[str], display: str | None = None) -> Document:
    """Read and parse one YAML file into a :class:`Document`."""
    name, text = read_text(path, display)
    return parse_text(text, name)


def _resolve_plain(value: str) -> Any:
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
        return float(value)
    if _INF.match(value):
        return -math.inf if value.startswith("-") else math.inf
    if _NAN.match(value):
        return math.nan
    return value


def _construct_tagged(tag: str, value: str) -> Any:
    short = tag[len(_TAG_PREFIX):]
    if short == "str":
        return value
    resolved = _resolve_plain(value)
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
    return (
        f"YAML tag '{tag}' is not allowed: planner files hold plain data "
        "(mappings, lists, strings, numbers, booleans)"
    )


def parse_text(text: str, file: str = "<string>") -> Document:
    """Parse YAML text into a :class:`Document`; every problem is an :class:`InputError`."""
    doc = Document(file=file, text=text, data=None)
    issues: list[Located] = []

    def located(mark: Any, message: str, path: str = "$") -> Located:
        lines = text.splitlines()
        line = getattr(mark, "line", 0)
        col = getattr(mark, "column", 0)
        src = lines[line] if 0 <= line < len(lines) else None
        return Located(file, line + 1, col + 1, message, path, src)

    stack: list[_Frame] = []
    anchors: dict[str, tuple[Any, int]] = {}
    documents = 0
    root: Any = None
    root_set = False

    def attach(value: Any, size: int, mark: Mark, path_hint: str, event: Any) -> None:
        nonlocal root, root_set
        if not stack:
            root, root_set = value, True
            return
        top = stack[-1]
        top.size += size
        if top.size > MAX_NODES:
            raise InputError([located(
                event.start_mark,
                f"the document expands to more than {MAX_NODES:,} values "
                "(too many aliases?); simplify the file",
                top.path,
            )])
        if isinstance(top.container, list):
            path = child_path(top.path, len(top.container))
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
                    top.key = str(value) if value is not None else "null"
            else:
                top.key = value
            top.key_mark = mark
            return
        key = top.key
        path = child_path(top.path, key)
        if key in top.container:
            first = doc.key_marks.get(path)
            where = f" (first defined at line {first.line + 1})" if first else ""
            assert top.key_mark is not None
            issues.append(Located(
                file, top.key_mark.line + 1, top.key_mark.column + 1,
                f"duplicate key '{key}'{where}; each key may appear once", path,
                _line(text, top.key_mark.line),
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

    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    issues.append(located(event.start_mark, "expected one YAML document, "
                                          "found more ('---' starts a second one)"))
                    break
                continue
            if isinstance(event, (yaml.StreamStartEvent, yaml.StreamEndEvent,
                                  yaml.DocumentEndEvent)):
                continue
            sm = event.start_mark
            mark = Mark(sm.line, sm.column) if sm is not None else Mark(0, 0)
            value: Any
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    issues.append(located(sm, f"unknown alias '*{event.anchor}'",
                                          current_child_path()))
                    attach(None, 1, mark, "", event)
                    continue
                value, size = anchors[event.anchor]
                attach(value, size, mark, "", event)
                continue
            if isinstance(event, yaml.ScalarEvent):
                is_key = bool(stack) and isinstance(stack[-1].container, dict) and \
                    stack[-1].key is None
                path = current_child_path()
                tag = event.tag
                if tag is not None and tag != "!" and tag not in _SCALAR_TAGS:
                    issues.append(located(sm, _tag_error(tag), path))
                    value = event.value
                elif tag in _SCALAR_TAGS:
                    try:
                        value = _construct_tagged(tag, event.value)
                    except ValueError as exc:
                        issues.append(located(sm, str(exc), path))
                        value = event.value
                elif not event.style and tag is None:
                    value = _resolve_plain(event.value)
                else:
                    value = event.value
                if is_key and event.value == "<<" and not event.style:
                    issues.append(located(sm, "YAML merge keys ('<<') are not supported; "
                                          "write the keys out", path))
                if event.anchor is not None:
                    anchors[event.anchor] = (value, 1)
                attach(value, 1, mark, path, event)
                continue
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                is_map = isinstance(event, yaml.MappingStartEvent)
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
                stack.append(_Frame({} if is_map else [], path, event.anchor))
                doc.marks.setdefault(path, mark)
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                if frame.anchor is not None:
                    anchors[frame.anchor] = (frame.container, frame.size)
                parent_mark = doc.marks.get(frame.path, mark)
                attach(frame.container, frame.size, parent_mark, frame.path, event)
                continue
    except _Abort:
        pass
    except yaml.MarkedYAMLError as exc:
        mark_obj = exc.problem_mark or exc.context_mark
        message = exc.problem or "invalid YAML"
        if exc.context and exc.problem:
            started = ""
            if exc.context_mark is not None and exc.problem_mark is not None and \
                    exc.context_mark.line != exc.problem_mark.line:
                started = f" that started at line {exc.context_mark.line + 1}"
            message = f"{exc.problem} ({exc.context}{started})"
        issues.append(located(mark_obj, f"invalid YAML: {message}"))
    except yaml.YAMLError as exc:
        issues.append(Located(file, 1, 1, f"invalid YAML: {exc}", "$", None))
    if issues:
        raise InputError(issues)
    doc.data = root if root_set else None
    doc.marks.setdefault("$", Mark(0, 0))
    return doc


class _Abort(Exception):
    """Stop building: a structural problem makes the rest meaningless."""


def _line(text: str, line: int) -> str | None:
    lines = text.splitlines()
    return lines[line] if 0 <= line < len(lines) else None
