"""Memo tables keyed by the identity of an immutable object (a cluster, a device).

The objects hold dicts, so they cannot be hashed; their ``id`` can, and the table keeps a
reference to each object so that its ``id`` is not reused while its memo lives.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    """Per-object memo dicts, at most ``objects`` of them (oldest dropped first)."""

    def __init__(self, objects: int = 8) -> None:
        self._objects = objects
        self._tables: dict[Hashable, tuple[Any, dict[K, V]]] = {}

    def table(self, obj: Any, *extra: Hashable) -> dict[K, V]:
        """The memo of ``obj`` (and of ``extra``, e.g. a dtype)."""
        key = (id(obj), *extra)
        entry = self._tables.get(key)
        if entry is None or entry[0] is not obj:
            if len(self._tables) >= self._objects:
                self._tables.pop(next(iter(self._tables)))
            entry = (obj, {})
            self._tables[key] = entry
        return entry[1]


__all__ = ["IdentityMemo"]
