"""Errors and exit codes, kept in one place.

Exit codes follow the convention of linters that CI jobs rely on:

====  ==========================================================================
code  meaning
====  ==========================================================================
0     success: the files are valid, the plan was found, every check passed
1     the question was valid but the answer is "no": a configuration that does
      not fit in memory, a strategy slower than allowed, no feasible plan
2     the input or the usage is wrong: invalid YAML, unknown keys, bad values,
      unreadable files, bad command-line options (click's usage errors are 2 too)
====  ==========================================================================

The core raises these exceptions and never prints; ``cli.py`` formats them once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INPUT = 2


@dataclass(frozen=True)
class Issue:
    """One problem found in an input document, located by a JSON-path-like string.

    ``path`` is ``$`` for the document root, ``$.layers[3].kernel`` for a nested value.
    ``at_key`` points the location at the mapping key instead of its value (used for
    unknown and duplicate keys).
    """

    path: str
    message: str
    at_key: bool = False


@dataclass(frozen=True)
class Located:
    """An issue resolved to a position in a file (1-based line and column; line 0: the
    file as a whole, :func:`whole_file`)."""

    file: str
    line: int
    column: int
    message: str
    path: str
    source_line: str | None = None

    def render(self, snippet: bool = True) -> str:
        """Compiler-style text: ``FILE:LINE:COL: error: MESSAGE (at $.path)`` and a caret.

        Control characters from the file are shown as U+FFFD: a hostile file must not
        send escape sequences (or a bell) to the terminal."""
        if self.line == 0:  # the file itself (missing, unreadable, empty): no position
            at = "" if self.path == "$" else f" (at {self.path})"
            return printable(f"{self.file}: error: {self.message}{at}")
        head = printable(f"{self.file}:{self.line}:{self.column}: error: {self.message} "
                          f"(at {self.path})")
        if not snippet or self.source_line is None:
            return head
        line = printable(self.source_line.rstrip("\r\n").expandtabs(1))
        if len(line) > 160:
            start = max(0, self.column - 80)
            line = line[start : start + 160]
            caret_at = self.column - 1 - start
        else:
            caret_at = self.column - 1
        caret_at = max(0, min(caret_at, len(line)))
        return f"{head}\n    {line}\n    {' ' * caret_at}^"


def whole_file(file: str, message: str) -> Located:
    """An issue with a file as a whole (it is missing, a folder, unreadable, empty, too
    large, or named twice): shown as ``FILE: error: MESSAGE``, where a line and column
    would point at nothing."""
    return Located(file, 0, 0, message, "$")


_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f"
                       r"\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control characters replaced by U+FFFD (one for one, so columns hold):
    for messages, and for names written into comment lines, where a newline would start
    a line of YAML or shell of its own."""
    return _CONTROLS.sub("\ufffd", text)


class PlannerError(Exception):
    """Base class of every error the planner reports to the user."""

    exit_code: int = EXIT_INPUT


#: Problems gathered per file: checking stops at this many. A file with more is usually
#: not a planner file at all, and listing them all would take long and flood the screen.
MAX_ISSUES = 100


class TooManyIssues(Exception):
    """Raised by :class:`IssueList` when it is full (validation stops there)."""


class IssueList(list[Issue]):
    """A list of issues that stops validation (raises :class:`TooManyIssues`) once it
    holds :data:`MAX_ISSUES`."""

    def append(self, issue: Issue) -> None:
        """Add an issue; raise :class:`TooManyIssues` when the list is full."""
        super().append(issue)
        if len(self) >= MAX_ISSUES:
            raise TooManyIssues()


class InputError(PlannerError):
    """One or more problems in input files, each with file, line, column and path.

    ``truncated``: checking stopped after :data:`MAX_ISSUES` problems (a note says so).
    """

    exit_code = EXIT_INPUT

    def __init__(self, problems: list[Located], truncated: bool = False) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.column, p.message))
        self.truncated = truncated
        super().__init__(self.render())

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its problems (a ``--jobs`` worker sends it to the parent)."""
        return (type(self), (self.problems, self.truncated))

    def render(self, snippet: bool = True) -> str:
        """All problems, one block each, sorted by file and position."""
        text = "\n".join(p.render(snippet) for p in self.problems)
        if self.truncated and self.problems:
            text += (f"\n{self.problems[0].file}: note: stopped after {len(self.problems)} "
                     "problems; fix these and run again (is this a planner file?)")
        return text


class UsageError(PlannerError):
    """A command-line option that is wrong on its own or together with the inputs."""

    exit_code = EXIT_INPUT


class NotCovered(UsageError):
    """``--estimator learned`` for a device the kernel models have no measurements of:
    the option and one cluster's device together (``check`` reports it as that
    configuration's, beside the others' outcomes)."""


class ModelDataError(PlannerError):
    """A shipped or user-given model/catalog file is missing, corrupt or inconsistent."""

    exit_code = EXIT_INPUT


class ManifestValueError(ModelDataError):
    """A wrong value in a model manifest, named by its key path from the document's root
    (``models.conv.file``). The loader reports it at that key's line and column, as the
    user's own inputs get; without a file to point into, it reads ``KEY: MESSAGE``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.message))


@dataclass
class Shortfall:
    """How far the best layout misses the memory capacity, and what would help."""

    needed_bytes: float
    capacity_bytes: float
    suggestions: list[str] = field(default_factory=list)
    #: the message around the suggestions: what misses by how much, and what follows
    #: them (:meth:`message`)
    head: str = ""
    tail: str = ""

    def message(self) -> str:
        """``head; try A or B ...tail``: the message of the failure it describes, made
        again where a suggestion is added or replaced."""
        tips = " or ".join(self.suggestions)
        return self.head + (f"; try {tips}" if tips else "") + self.tail


class NoFeasiblePlan(PlannerError):
    """A valid question with no answer: nothing fits in device memory.

    ``shortfall`` says how far the leanest layout misses; ``baselines`` are the baselines
    as priced (plain data, as a plan document lists them), for ``compare`` to show what
    did not fit. :meth:`deferred` makes one whose parts are worked out when first read."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(self, message: str, shortfall: Shortfall | None = None,
                 baselines: list[dict[str, Any]] | None = None) -> None:
        self._parts: tuple[str, Shortfall | None, list[dict[str, Any]] | None] | None = \
            (message, shortfall, baselines)
        self._explain: Callable[[], NoFeasiblePlan] | None = None
        super().__init__(message)

    @classmethod
    def deferred(cls, explain: Callable[[], NoFeasiblePlan]) -> NoFeasiblePlan:
        """A failure whose message, shortfall and baselines are ``explain()``'s, worked
        out when first read: the ``auto`` options search many settings and drop the
        failures of all but the last, and saying why one failed prices every baseline
        grid that did not fit."""
        out = cls("")
        out._parts, out._explain = None, explain
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled worked out (a ``--jobs`` worker sends its failure to the parent)."""
        return (type(self), self._resolved())

    def _resolved(self) -> tuple[str, Shortfall | None, list[dict[str, Any]] | None]:
        if self._parts is None:
            assert self._explain is not None
            done = self._explain()
            self._parts, self._explain = (str(done), done.shortfall, done.baselines), None
        return self._parts

    @property
    def shortfall(self) -> Shortfall | None:
        """How far the leanest layout misses, and what would help."""
        return self._resolved()[1]

    @property
    def baselines(self) -> list[dict[str, Any]] | None:
        """The baselines as priced, or None."""
        return self._resolved()[2]

    def __str__(self) -> str:
        return self._resolved()[0]


class CheckFailed(PlannerError):
    """``planner check`` found a configuration that fails a check."""

    exit_code = EXIT_CHECK_FAILED
