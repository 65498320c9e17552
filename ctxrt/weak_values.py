"""``WeakValues``: a table whose values are held weakly, for the caches that share what compile
makes of a message while some namespace holds it (``strategies.base``, ``compile``, ``body_runs``).

Unlike ``weakref.WeakValueDictionary``, an entry's removal is a function of ctxrt's own,
``drop``, which the runtime runs with Ctrl-C deferred (``runtime.py``): an entry dies wherever the
interpreter happens to be, and Python drops any error raised in a weak reference's callback, so a
KeyboardInterrupt trio's handler raised there was lost and the host ran on (L8).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WeakValues(Generic[K, V]):
    """``key -> value`` while something else holds the value. A value set from two threads at once
    may be dropped: a cache miss at worst."""

    __slots__ = ("refs", "__weakref__")

    def __init__(self) -> None:
        self.refs: dict[K, _Entry] = {}

    def get(self, key: K) -> V | None:
        entry = self.refs.get(key)
        return None if entry is None else entry()

    def __setitem__(self, key: K, value: V) -> None:
        self.refs[key] = _Entry(value, key, weakref.ref(self))

    def __len__(self) -> int:
        return len(self.refs)


class _Entry(weakref.KeyedRef[Any, Any]):
    """A value's weak reference, knowing its key and (weakly: an entry never keeps its table
    alive) its table."""

    __slots__ = ("table",)
    table: weakref.ReferenceType[WeakValues[Any, Any]]

    def __new__(cls, value: Any, key: Hashable, table: weakref.ReferenceType[WeakValues[Any, Any]]) -> _Entry:
        entry = super().__new__(cls, value, drop, key)
        entry.table = table
        return entry

    def __init__(self, value: Any, key: Hashable, table: weakref.ReferenceType[WeakValues[Any, Any]]) -> None:
        super().__init__(value, drop, key)


def drop(entry: _Entry) -> None:
    """The callback of every entry: once its value has died, remove it from its table (if both are
    still there, and the key wasn't set again meanwhile)."""
    table = entry.table()
    if table is not None and table.refs.get(entry.key) is entry:
        del table.refs[entry.key]
