"""The tables compile's caches keep, and the one rule that bounds them all.

Every cache on the compile path (``compile.CompileMemo``, the strategies' kept entries, the
bodies' parts, a view's copy entries, what one reader view of a slot shares, the copy entries
every reader view of a slot shares) is owned by something: a memo, a strategy, a view, a slot
cache's reader view, the slot cache (``LayeredMemo``). None is process-wide or weak,
so a table has to be bounded by its owner: ``outgrown`` is the rule, applied where a table grows
(``IdMemo.bound``), and ``KEEP`` is the one count of whole records (a body per request form) a
cache keeps. Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

SLACK = 256  # entries a table may hold beyond twice what is in use before it is cut back
KEEP = 4  # whole records (a body per request form and options) a cache keeps, newest last


def outgrown(size: int, in_use: int) -> bool:
    """The rule every table follows: one holding more than twice what is in use, and ``SLACK``
    more, is cut back to what is in use (or emptied, when its owner can't say what that is)."""
    return size > 2 * in_use + SLACK


class IdMemo(Generic[K, V]):
    """What was made of an object, by the object's identity: an entry holds its object, so an
    ``id`` is never taken by another object while the entry lives."""

    __slots__ = ("_table",)

    def __init__(self) -> None:
        self._table: dict[int, tuple[K, V]] = {}

    def get(self, key: K) -> V | None:
        found = self._table.get(id(key))
        return found[1] if found is not None and found[0] is key else None

    def put(self, key: K, value: V) -> V:
        self._table[id(key)] = (key, value)
        return value

    def __len__(self) -> int:
        return len(self._table)

    def copy(self) -> IdMemo[K, V]:
        """A new memo holding what this one holds now (the same values)."""
        made: IdMemo[K, V] = IdMemo()
        made._table = dict(self._table)
        return made

    def bound(self, in_use: int, live: Iterable[K] | None = None) -> None:
        """``outgrown``: past it, keep the entries of the objects ``live`` (all gone without it)."""
        if outgrown(len(self._table), in_use):
            keys = set() if live is None else set(map(id, live))
            self._table = {key: value for key, value in self._table.items() if key in keys}


class LayeredMemo(IdMemo[K, V]):
    """An ``IdMemo`` of its own over one it shares with others (``shared``): the entry of an object
    ``common`` says every sharer sees (the same object, so the same entry) is made once, there; any
    other object's is made here. A lookup finds either. ``bound`` bounds its own table by what is in
    use, the shared one by the objects ``held`` lists (what its owner holds)."""

    __slots__ = ("shared", "_common", "_held")

    def __init__(self, shared: IdMemo[K, V], common: Callable[[K], bool], held: Callable[[], Sequence[K]]) -> None:
        super().__init__()
        self.shared = shared
        self._common = common
        self._held = held

    def get(self, key: K) -> V | None:
        found = super().get(key)
        return self.shared.get(key) if found is None else found

    def put(self, key: K, value: V) -> V:
        return self.shared.put(key, value) if self._common(key) else super().put(key, value)

    def bound(self, in_use: int, live: Iterable[K] | None = None) -> None:
        super().bound(in_use, live)
        held = self._held()
        self.shared.bound(len(held), held)


def newest(records: dict[Hashable, V], key: Hashable, record: V) -> dict[Hashable, V]:
    """``records`` with ``record`` under ``key``, the newest, and the oldest beyond ``KEEP`` gone
    (a new table: a reader on another thread sees the old one or the new, whole)."""
    kept = [(k, r) for k, r in records.items() if k != key][1 - KEEP:]
    return dict(kept + [(key, record)])

