"""Small validators that turn plain YAML data into typed values and gather every problem.

A :class:`Fields` reads the keys of one mapping. Each getter converts a value with a
converter (a function that raises :class:`Invalid` with a message the user can act on);
problems are appended to a shared list of :class:`~planner.errors.Issue` instead of
being raised, so one run reports everything wrong with a file. :meth:`Fields.finish`
reports keys nobody asked for, with a "did you mean" hint.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .errors import Issue
from .loading import child_path
from .units import Kind, UnitError, format_bytes, format_si, parse_quantity

T = TypeVar("T")

# Absurd sizes are input errors, not arithmetic to attempt (a 10^15-channel layer).
MAX_DIM = 2**40


class Invalid(ValueError):
    """A value that a converter rejects; the message says what was expected. ``at``:
    the part of the value that is wrong (``[1]``: its second item), for a location
    inside it."""

    def __init__(self, message: str, at: str = "") -> None:
        super().__init__(message)
        self.at = at


def type_name(value: object) -> str:
    """The YAML-ish name of a Python value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def show(value: object) -> str:
    """A short rendering of a value for messages, spelled as in YAML where that differs
    from Python (``true``, ``null``)."""
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        text = "[" + ", ".join(show(v) for v in value) + "]"  # YAML's flow form
        return text if len(text) <= 40 else type_name(value)
    if isinstance(value, (dict, list)):
        return type_name(value)
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def described(value: object) -> str:
    """What a message says was found: ``a string 'eight'``, ``an integer 3``, ``a list``,
    ``null`` (the type, and the value where it adds something)."""
    if value is None or isinstance(value, (dict, list)):
        return type_name(value)
    return f"{type_name(value)} {show(value)}"


def integer(minimum: int = 1, maximum: int = MAX_DIM) -> Callable[[object], int]:
    """Converter: an integer in ``[minimum, maximum]`` (``4.0`` is accepted as 4)."""

    def convert(value: object) -> int:
        given = value  # messages quote what the file says (1e300, not its 301 digits)
        if isinstance(value, bool):
            raise Invalid(f"expected an integer, got {show(value)}")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            if isinstance(value, float):
                raise Invalid(f"expected an integer, got {show(value)}")
            raise Invalid(f"expected an integer, got {described(value)}")
        if value < minimum:
            what = "a positive integer" if minimum == 1 else (
                "a non-negative integer" if minimum == 0 else f"an integer ≥ {minimum}")
            raise Invalid(f"expected {what}, got {_number_text(given)}")
        if value > maximum:
            raise Invalid(f"{_number_text(given)} is too large (at most {maximum:,})")
        return value

    return convert


def _number_text(value: object) -> str:
    """A number as a message quotes it: integers in full up to 30 digits, else ``1e+300``."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"{float(value):.3g}" if abs(value) < 10**308 else "a number above 1e308"
    return f"{value:g}" if isinstance(value, float) else str(value)


def number(minimum: float = 0.0, maximum: float = math.inf, *, exclusive_min: bool = False,
           ) -> Callable[[object], float]:
    """Converter: a finite real number in a range."""

    def convert(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"expected a number, got {described(value)}")
        x = float(value)
        if not math.isfinite(x):
            raise Invalid(f"expected a finite number, got {show(value)}")
        if x < minimum or (exclusive_min and x == minimum):
            op = ">" if exclusive_min else "≥"
            raise Invalid(f"expected a number {op} {minimum:g}, got {show(value)}")
        if x > maximum:
            raise Invalid(f"expected a number ≤ {maximum:g}, got {show(value)}")
        return x

    return convert


def bucket_size(value: object) -> float:
    """Converter: a gradient bucket size (:func:`planner.units.parse_bucket_size`)."""
    from .units import parse_bucket_size

    try:
        return parse_bucket_size(value)
    except UnitError as exc:
        raise Invalid(str(exc)) from None


def quantity(kind: Kind, *, positive: bool = True, minimum: float = 0.0,
             maximum: float = math.inf) -> Callable[[object], float]:
    """Converter: a unit string or SI number (see :mod:`planner.units`), optionally within
    plausible bounds (SI units): a value outside is almost always a wrong unit, and
    absurd figures would only turn the cost model's arithmetic into infinities."""

    def convert(value: object) -> float:
        try:
            x = parse_quantity(value, kind, positive=positive)
        except UnitError as exc:
            raise Invalid(str(exc)) from None
        if x > maximum or (x != 0 and x < minimum):
            bound = maximum if x > maximum else minimum
            shown = format_bytes(bound) if kind == "bytes" else format_si(bound, _UNIT[kind])
            edge = f"at most {shown}" if x > maximum else f"at least {shown}"
            raise Invalid(f"{show(value)} is not a plausible {_NOUN[kind]}: expected {edge}; "
                          f"is the unit right? (e.g. {_EXAMPLE[kind]})")
        return x

    return convert


_UNIT = {"time": "s", "bytes": "B", "bandwidth": "B/s", "flop_rate": "FLOP/s",
         "frequency": "Hz", "power": "W", "number": ""}
_NOUN = {"time": "time", "bytes": "size", "bandwidth": "bandwidth", "flop_rate": "FLOP rate",
         "frequency": "frequency", "power": "power", "number": "number"}
_EXAMPLE = {"time": "'2 us'", "bytes": "'80 GiB'", "bandwidth": "'400 Gbit/s'",
            "flop_rate": "'989 TFLOPS'", "frequency": "'1980 MHz'", "power": "'700 W'",
            "number": "42"}


MAX_TEXT = 10_000  #: characters in a name or description (they end up in every table)
#: C0 and C1 controls, and the bidirectional marks, embeddings, overrides and isolates,
#: which reorder what a terminal shows ("Trojan Source", CVE-2021-42574): a name with
#: U+202E reads backwards in a table
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                            r"\u202a-\u202e\u2066-\u2069]")


def string(value: object) -> str:
    """Converter: a non-empty string without control characters (names end up in
    tables on a terminal; an escape sequence there would be an attack)."""
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {described(value)}")
    if not value.strip():
        raise Invalid("expected a non-empty string")
    bad = _CONTROL_CHARS.search(value)
    if bad is not None:
        raise Invalid(f"expected text without control characters, found "
                      f"U+{ord(bad.group()):04X} in {show(value)}")
    if len(value) > MAX_TEXT:
        raise Invalid(f"expected at most {MAX_TEXT:,} characters, got {len(value):,}")
    return value


def boolean(value: object) -> bool:
    """Converter: ``true`` or ``false``."""
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {described(value)}")
    return value


def choice(options: Iterable[str]) -> Callable[[object], str]:
    """Converter: one of a closed set of strings, with a did-you-mean hint."""
    opts = list(options)

    def convert(value: object) -> str:
        if not isinstance(value, str) or value not in opts:
            hint = ""
            if isinstance(value, str):
                # the case first: 'SwiGLU' for 'swiglu', 'NCCL' for 'nccl' (an audit)
                same = [o for o in opts if o.lower() == value.lower()]
                close = same or difflib.get_close_matches(value, opts, n=1, cutoff=0.6)
                if close:
                    hint = f"; did you mean '{close[0]}'?"
            listing = ", ".join(opts)
            raise Invalid(f"expected one of {listing}, got {show(value)}{hint}")
        return value

    return convert


def pair(conv: Callable[[object], int], what: str) -> Callable[[object], tuple[int, int]]:
    """Converter: an integer or a list of two integers (height, width)."""

    def convert(value: object) -> tuple[int, int]:
        if isinstance(value, list):
            if len(value) != 2:
                raise Invalid(f"expected {what} as one integer or [height, width], "
                              f"got a list of {len(value)}")
            return conv(value[0]), conv(value[1])
        v = conv(value)
        return v, v

    return convert


#: PyTorch's input-size arguments, each beside the key its layer type has instead
INFERRED = {"in_channels": "out_channels", "in_features": "out_features",
            "embed_dim": "heads", "num_features": "type"}


class Fields:
    """Reads the keys of one mapping; problems go to ``issues``.

    If ``data`` is not a mapping, an issue is recorded and every getter returns its
    default, so callers can keep going and report more.
    """

    def __init__(self, data: object, path: str, issues: list[Issue], what: str) -> None:
        self.path = path
        self.issues = issues
        self.what = what
        self.ok = isinstance(data, dict)
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        self.seen: set[str] = set()
        if not self.ok:
            issues.append(Issue(path, f"expected {what} as a mapping of keys, "
                                      f"got {described(data)}"))

    def at(self, key: str) -> str:
        """The path of ``key`` in this mapping."""
        return child_path(self.path, key)

    def has(self, key: str) -> bool:
        """Whether the key is present (asking makes it a known key either way, so hints
        for misspelt keys can name it)."""
        self.seen.add(key)
        return key in self.data

    def raw(self, key: str) -> Any:
        """The raw value of a key (None if absent); the key counts as known."""
        self.seen.add(key)
        return self.data.get(key)

    def req(self, key: str, conv: Callable[[object], T]) -> T | None:
        """A required key: missing → issue at the mapping; invalid → issue at the value."""
        self.seen.add(key)
        if key not in self.data:
            if self.ok:
                self.missing(f"missing required key '{key}' in {self.what}")
            return None
        return self._convert(key, conv)

    def opt(self, key: str, conv: Callable[[object], T], default: T) -> T:
        """An optional key with a default (also used when the value is invalid)."""
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            return default
        value = self._convert(key, conv)
        return default if value is None else value

    def opt_none(self, key: str, conv: Callable[[object], T]) -> T | None:
        """An optional key without a default."""
        self.seen.add(key)
        if key not in self.data or self.data[key] is None:
            return None
        return self._convert(key, conv)

    def _convert(self, key: str, conv: Callable[[object], T]) -> T | None:
        try:
            return conv(self.data[key])
        except Invalid as exc:
            self.issues.append(Issue(self.at(key) + exc.at, str(exc)))
            return None

    def missing(self, message: str) -> None:
        """Record a key missing from this mapping, at the key that holds the mapping
        (``intra_node:``) where there is one: the mapping's own position is its first
        key's, which has nothing to do with the one missing. Not where the value is no
        mapping at all: that is said once, and keys missing from it are no news (an
        audit found 'network: [1, 2]' told of two missing tiers before the list)."""
        if self.ok:
            self.issues.append(Issue(self.path, message, at_key=True))

    def error(self, key: str | None, message: str) -> None:
        """Record a problem at ``key`` (or at the mapping when None)."""
        self.issues.append(Issue(self.at(key) if key else self.path, message))

    def finish(self, allowed_extra: Iterable[str] = ()) -> None:
        """Report every key that no getter asked for."""
        known = self.seen | set(allowed_extra)
        for key in self.data:
            if key in known:
                continue
            if key in INFERRED and INFERRED[key] in known:
                # PyTorch's constructor argument: the size comes from the layer before
                # (an audit: "did you mean 'out_channels'?" led to a wrong width)
                self.issues.append(Issue(
                    self.at(key), f"unknown key '{key}' in {self.what}: planner infers a "
                    "layer's input size from the layer before it; drop it", at_key=True))
                continue
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            if not close and len(key) >= 2:  # a shortening: 'out' for 'out_features'
                close = [k for k in sorted(known) if k.startswith(key)][:2]
                close = close if len(close) == 1 else []
            if close and close[0] in self.data:
                # a key the mapping already has is no suggestion (an audit: 'in_channels'
                # beside 'out_channels' was told "did you mean 'out_channels'?")
                hint = f"; '{close[0]}' is given already: drop '{key}'"
            else:
                hint = f"; did you mean '{close[0]}'?" if close else (
                    f"; expected one of: {', '.join(sorted(known))}" if known else "")
            self.issues.append(Issue(self.at(key), f"unknown key '{key}' in {self.what}{hint}",
                                     at_key=True))
