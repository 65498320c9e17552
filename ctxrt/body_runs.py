"""Runs of a compile's messages that an earlier body was built from, and the cache holding those bodies.

A request body is made from cached parts: ``runs`` finds the stretches of a compile's messages
that are, object for object, stretches of the messages the last body of the same form was made
from (a compile hands back the same ``CompiledMessage`` objects for unchanged messages), so only
the rest is made again. ``BodyCache`` holds the last body's record per form and options; a
compile memo owns one, so every result of a namespace's compiles shares it. Pure and synchronous.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from typing import Any

Run = tuple[int, int, int]  # (start in the new list, start in the old list, length)

_NEAR = 8  # old positions tried after the last run's end before a lookup by identity
_KEEP = 4  # forms and options a cache holds a body for


def _run_length(new: Sequence[Any], i: int, old: Sequence[Any], j: int) -> int:
    """How many items from ``new[i]`` are, object for object, the items from ``old[j]``:
    galloping slice compares, so a long run costs C-speed steps, a short one a few."""
    limit = min(len(new) - i, len(old) - j)
    length, step = 0, 16
    while length < limit:
        width = min(step, limit - length)
        same = list(map(operator.is_, new[i + length:i + length + width], old[j + length:j + length + width]))
        if False in same:
            return length + same.index(False)
        length += width
        step *= 2
    return length


def runs(new: Sequence[Any], old: Sequence[Any]) -> list[Run]:
    """The stretches of ``new`` that are stretches of ``old`` (by identity), in ``new``'s order.

    Each run is as long as it goes; a new item found nowhere in what is left of ``old`` starts no
    run (an item of ``old`` before the last run's end is looked for only near it). Work is
    O(runs · log) plus, at the first item not near where the last run ended, an O(what is left
    of ``old``) C-speed index.
    """
    out: list[Run] = []
    where: dict[int, int] | None = None
    i, j = 0, 0
    while i < len(new):
        item = new[i]
        found = next((k for k in range(j, min(j + _NEAR, len(old))) if old[k] is item), None)
        if found is None and j + _NEAR < len(old):
            if where is None:
                where = dict(zip(map(id, old[j:]), range(j, len(old))))
            k = where.get(id(item))
            found = k if k is not None and old[k] is item else None
        if found is None:
            i += 1
            continue
        length = _run_length(new, i, old, found)
        out.append((i, found, length))
        i, j = i + length, found + length
    return out


def shifted(positions: list[int], j: int, length: int, shift: int) -> list[int]:
    """The sorted ``positions`` in ``j``..``j + length - 1`` (of an old body), ``shift`` further on
    (in the new one): where a run's tool-bearing messages are, say, without a look at the others."""
    inside = positions[bisect_left(positions, j):bisect_left(positions, j + length)]
    return list(map(shift.__add__, inside)) if shift else inside


class BodyCache:
    """The record of the last body made per form and options (the key), for the next to start from.

    Records, and the table of them, are replaced whole, never edited, so a body made on another
    thread at the same time costs a cache miss at worst."""

    def __init__(self) -> None:
        self._records: dict[Hashable, Any] = {}

    def get(self, key: Hashable) -> Any:
        return self._records.get(key)

    def clear(self) -> None:
        self._records = {}

    def put(self, key: Hashable, record: Any) -> None:
        kept = [(k, r) for k, r in self._records.items() if k != key][1 - _KEEP:]
        self._records = dict(kept + [(key, record)])
