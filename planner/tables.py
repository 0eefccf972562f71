"""Tables that fit the terminal without cutting numbers.

rich shrinks a table that is wider than the console by truncating every column alike
("2.167 ms" becomes "2.16…") and can squeeze a folding column to nothing. A number cut
short is worse than no number, so before a table is printed: columns the table marks as
``wide`` (a breakdown) give way to its ``narrow`` columns (their sum) when the whole
does not fit; an unwrapped column keeps its widest cell and a wrapped one its longest
word (columns that fold, such as layer names, may break anywhere, down to 16 characters);
and if the table still does not fit, it is printed at its natural width, no name broken,
and the terminal wraps the lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table


class FitTable(Table):
    """A rich table with two column sets: ``wide`` shown when the table fits the
    console, ``narrow`` shown instead when it does not; and ``optional`` columns, left
    out only where even the narrow form does not fit."""

    def __init__(self, *args: Any, wide: tuple[str, ...] = (), narrow: tuple[str, ...] = (),
                 optional: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wide = wide
        self.narrow = narrow
        self.optional = optional

    def add_column(self, *args: Any, key: str | None = None, **kwargs: Any) -> None:
        """As rich's, with ``key``: the name ``wide`` and ``narrow`` know the column by
        (its header by default), so two forms of a column may share a header."""
        super().add_column(*args, **kwargs)
        self.columns[-1].fit_key = key  # type: ignore[attr-defined]


def _tables(renderable: Any) -> Iterator[Table]:
    if isinstance(renderable, Table):
        yield renderable
    elif isinstance(renderable, Group):
        for part in renderable.renderables:
            yield from _tables(part)


def _natural(console: Console, renderable: Any) -> int:
    return Measurement.get(console, console.options.update_width(100_000), renderable).maximum


def _key(column: Any) -> str:
    return getattr(column, "fit_key", None) or str(column.header)


def _drop(table: Table, names: tuple[str, ...]) -> None:
    table.columns[:] = [c for c in table.columns if _key(c) not in names]
    for i, column in enumerate(table.columns):  # rich pads the edges by this index
        column._index = i


def fit(console: Console, renderable: Any) -> int:
    """Prepare every table in ``renderable`` for ``console``; returns the width to print
    at (the console's, or more where a table cannot be narrowed without cutting)."""
    need = console.width
    for table in _tables(renderable):
        if isinstance(table, FitTable):
            columns = list(table.columns)
            _drop(table, table.narrow)
            if _natural(console, table) > console.width:
                table.columns[:] = columns
                _drop(table, table.wide)
                if table.optional and _natural(console, table) > console.width:
                    _drop(table, table.optional)
        opts = console.options.update_width(100_000)
        lo, hi = [], []
        for column in table.columns:
            sizes = [Measurement.get(console, opts, c) for c in [column.header, *column.cells]]
            top = max(m.maximum for m in sizes)
            if column.no_wrap:
                least = top
            elif column.overflow == "fold":  # long names may break anywhere
                least = min(top, max(column.min_width or 0,
                                     min(16, max(m.minimum for m in sizes))))
            else:
                least = max(m.minimum for m in sizes)
            lo.append(least)
            hi.append(top)
        overhead = _natural(console, table) - sum(hi)
        room = console.width - overhead
        widths = list(hi)
        while sum(widths) > room:
            slack = [w - m for w, m in zip(widths, lo, strict=True)]
            if max(slack) <= 0:
                break
            widths[slack.index(max(slack))] -= 1
        if sum(widths) > room:
            # wider than the console whatever is folded: the terminal wraps the lines
            # anyway, so break no name ("h.0.attn.resid_d" / "rop")
            widths = list(hi)
        if widths != hi:
            for column, w in zip(table.columns, widths, strict=True):
                column.width = w
        need = max(need, sum(widths) + overhead)
    return need


@dataclass(frozen=True)
class Row:
    """One line of a per-layer table: the layer's name, its cells after the name, and
    whether the second cell is shown dim (a layout taken from a neighbour)."""

    name: str
    cells: tuple[str, ...]
    dim: bool


#: a name's first component that is a number as a repeat group writes its copies' (no
#: leading zero, so that the range shown reads as the names do)
#: (``layers.12.mlp.down_proj``: ``layers.``, ``12``, ``.mlp.down_proj``)
_COPY = re.compile(r"^((?:[^.]+\.)*?)(0|[1-9][0-9]*)(\..+)$")


def collapse_copies(rows: list[Row]) -> list[Row]:
    """The rows with each run of two or more consecutive copies of a repeat group that
    read alike (the same layers, with the same cells) shown once, their names'
    copy number a range: ``layers.0.attn``, ``layers.1.attn`` … ``layers.31.attn`` alike
    become ``layers.0-31.attn``. A copy is the consecutive rows whose names share a
    prefix and a copy number (the first component that is a number); copies are consecutive
    when their numbers are. Rows whose cells differ (another layout, a recomputed block,
    another stage, the first copy receiving the embedding's output) end a run."""
    # each copy: its prefix (None: a row outside any copy), its number, its rows, and what
    # must match for copies to read alike (each row's name after the number, cells, dim)
    units: list[tuple[str | None, int, list[Row], list[tuple[str, tuple[str, ...], bool]]]]
    units = []
    for row in rows:
        m = _COPY.match(row.name)
        if m is None:
            units.append((None, -1, [row], []))
            continue
        prefix, number = m.group(1), int(m.group(2))
        if not (units and units[-1][:2] == (prefix, number)):
            units.append((prefix, number, [], []))
        units[-1][2].append(row)
        units[-1][3].append((m.group(3), row.cells, row.dim))
    out: list[Row] = []
    i = 0
    while i < len(units):
        prefix, first, members, shape = units[i]
        j = i + 1
        while prefix is not None and j < len(units) and units[j][0] == prefix and \
                units[j][1] == first + (j - i) and units[j][3] == shape:
            j += 1
        if j - i < 2:
            out.extend(members)
        else:
            last = first + (j - i) - 1
            out.extend(Row(f"{prefix}{first}-{last}{suffix}", cells, dim)
                       for suffix, cells, dim in shape)
        i = j
    return out


#: the caption of a table with collapsed copies (``alike``: in what they are alike)
COPIES_CAPTION = ("N-M in a name: one row stands for copies N to M of a repeat group, alike "
                  "{alike}; --all-layers lists every layer")
