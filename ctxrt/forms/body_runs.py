"""Runs of a compile's messages that an earlier body was built from, and the cache holding those bodies.

A request body is made from cached parts: ``runs`` finds the stretches of a compile's messages
that are, object for object, stretches of the messages the last body of the same form was made
from (a compile hands back the same ``CompiledMessage`` objects for unchanged messages), so only
the rest is made again. ``BodyCache`` holds the last body's record per form and options; a
compile memo owns one, so every result of a namespace's compiles shares it. Pure and synchronous.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar, cast

from ..content.blocks import CompiledMessage
from .wire import holds_tools
from ..memos import KEEP, newest, outgrown

Run = tuple[int, int, int]  # (start in the new list, start in the old list, length)


class MadeFrom:
    """How a body's item list (``items``, as returned) follows the body made before it for the same
    form and options: its record's ``token``, the record it was assembled from (``prior``, None
    if none), the items before its first turn (``shift``: a continued turn put first), the turns
    that are copies in ``items`` (``copied``, sorted: the cap's and the last), and the ``runs``
    of turns taken whole from that record, (turn here, turn there, count). The request ledger's
    digest reads the items both bodies share off it (``BodyDigests``) instead of comparing them."""

    __slots__ = ("copied", "items", "prior", "runs", "shift", "token")

    def __init__(self, items: list[Any], token: object, prior: object | None, shift: int, copied: list[int],
                 runs: list[Run]) -> None:
        self.items, self.token, self.prior, self.shift, self.copied, self.runs = items, token, prior, shift, copied, runs

_NEAR = 8  # old positions tried after the last run's end before a lookup by identity
_TAIL = 4  # a long run's end most often lies this near the end of what is left
_LONG = 64  # a run this long is tried to the end at once
T = TypeVar("T")


def run_length(new: Sequence[Any], i: int, old: Sequence[Any], j: int) -> int:
    """How many items from ``new[i]`` equal the items from ``old[j]`` (the same object compares
    equal without a call to ``__eq__``), by C-speed slice compares: galloping, and once the run
    is long, all that is left at once and then all but its last few (a long run most often goes
    on to the end of one list or to a few items before it), else its end by halves, so it costs
    O(its length)."""
    start, step, probed = i, 1, False
    while True:
        step = min(step, len(new) - i, len(old) - j)
        if step <= 0:
            return max(i - start, 0)
        if step >= _LONG and not probed:
            probed, rest = True, min(len(new) - i, len(old) - j)
            width = next((w for w in (rest, rest - _TAIL) if w > step and new[i:i + w] == old[j:j + w]), 0)
            if width:
                i, j, step = i + width, j + width, 1  # what is left is at most _TAIL long
                continue
            if rest - _TAIL > step:  # both failed: it ends in the first rest - _TAIL, found by halves
                lo, hi = 0, rest - _TAIL  # the first lo equal, not the first hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if new[i + lo:i + mid] == old[j + lo:j + mid]:
                        lo = mid
                    else:
                        hi = mid
                return i - start + lo
        if new[i:i + step] == old[j:j + step]:
            i, j, step = i + step, j + step, step * 2
        elif step == 1:
            return i - start
        else:
            step //= 2


def runs(new: Sequence[Any], old: Sequence[Any]) -> list[Run]:
    """The stretches of ``new`` that are stretches of ``old``, in ``new``'s order: a run starts at
    an item that is an item of ``old`` (the same object) and goes on while the items are equal
    (an equal compiled message makes the same API blocks).

    Each run is as long as it goes; an item starts one if it is near where the last run ended,
    or else is found in all that is left of ``old``, unless the item after it is near (this one
    replaced one: an edit, made again without a look at the rest). Work is O(runs · log) plus, at
    the first item found nowhere near, an O(what is left of ``old``) index.
    """
    out: list[Run] = []
    where: dict[int, int] | None = None
    i, j = 0, 0
    while i < len(new):
        item = new[i]
        found = _near(item, old, j)
        if found is None and j + _NEAR < len(old) and not (i + 1 < len(new) and _near(new[i + 1], old, j) is not None):
            if where is None:
                where = dict(zip(map(id, old[j:]), range(j, len(old))))
            k = where.get(id(item))
            found = k if k is not None and old[k] is item else None
        if found is None:
            i += 1
            continue
        length = run_length(new, i, old, found)
        out.append((i, found, length))
        i, j = i + length, found + length
    return out


def carried(found: list[Run], old_parts: list[T], old_tools: list[int], new: Sequence[CompiledMessage]
            ) -> tuple[list[T | None], list[int], list[int]]:
    """What the runs ``found`` (of ``new`` in the last body's messages) carry over: each message's
    part from the last body (None for the others), the positions in no run, and where the
    tool-bearing messages are (the runs' as they were, the others looked at)."""
    parts: list[T | None]
    if found and found[0][0] == 0:  # a run from the first message: its slice starts the list
        parts = cast(list[T | None], old_parts[found[0][1]:found[0][1] + found[0][2]])
        parts += [None] * (len(new) - len(parts))
    else:
        parts = [None] * len(new)
    gaps: list[int] = []
    tools: list[int] = []
    position = 0
    for i, j, length in found:
        gaps += range(position, i)
        tools += (k for k in range(position, i) if holds_tools(new[k]))
        if i:
            parts[i:i + length] = old_parts[j:j + length]
        tools += shifted(old_tools, j, length, i - j)
        position = i + length
    gaps += range(position, len(new))
    tools += (k for k in range(position, len(new)) if holds_tools(new[k]))
    return parts, gaps, tools


def holds(positions: Sequence[int], position: int) -> bool:
    """Whether the sorted ``positions`` hold ``position``."""
    at = bisect_left(positions, position)
    return at < len(positions) and positions[at] == position


def _near(item: Any, old: Sequence[Any], j: int) -> int | None:
    """Where ``item`` is among the few items of ``old`` from ``j``, if it is."""
    return next((k for k in range(j, min(j + _NEAR, len(old))) if old[k] is item), None)


def shifted(positions: list[int], j: int, length: int, shift: int) -> list[int]:
    """The sorted ``positions`` in ``j``..``j + length - 1`` (of an old body), ``shift`` further on
    (in the new one): where a run's tool-bearing messages are, say, without a look at the others."""
    inside = positions[bisect_left(positions, j):bisect_left(positions, j + length)]
    return list(map(shift.__add__, inside)) if shift else inside


class SharedParts:
    """A message's parts made under no earlier calls, per form and role, by message object, for
    every body cache of one reader view of a slot (P17): every namespace reading the message so
    makes its blocks once. Owned by that view (``compile.ViewShare``), or by one cache alone.
    ``generation`` counts the times a host was found to have edited a shared part: every record
    of the caches sharing these from before then is dropped."""

    def __init__(self) -> None:
        self.parts: dict[tuple[Hashable, ...], Any] = {}
        self.generation = 0

    def part(self, key: tuple[Hashable, ...], message: object, make: Callable[[], T]) -> T:
        """The part ``make`` makes of ``message`` for ``key`` (the form, ``id(message)`` and the
        role), made once while these hold it; a part must name its ``message``."""
        part = self.parts.get(key)
        if part is None or part.message is not message:
            part = self.parts[key] = make()
        return cast(T, part)

    def bound(self, messages: Sequence[object]) -> None:
        """``memos.outgrown``, for the parts of up to ``KEEP`` forms of a body of ``messages``:
        past it, keep the parts of ``messages`` alone."""
        if outgrown(len(self.parts), KEEP * len(messages)):
            live = set(map(id, messages))
            self.parts = {key: part for key, part in self.parts.items() if key[1] in live}


class BodyCache:
    """The record of the last body made per form and options (the key), for the next to start from,
    and the parts it shares (``shared``: its reader view's, else its own).

    Records, and the table of them, are replaced whole, never edited, so a body made on another
    thread at the same time costs a cache miss at worst."""

    def __init__(self, shared: SharedParts | None = None) -> None:
        self.shared = SharedParts() if shared is None else shared
        self._records: dict[Hashable, tuple[int, Any]] = {}
        self.made: MadeFrom | None = None  # how the last item list returned follows the body before it

    def made_from(self, items: object) -> MadeFrom | None:
        """``made`` if ``items`` is the list it describes (the last one made), else None."""
        made = self.made
        return made if made is not None and made.items is items else None

    def get(self, key: Hashable) -> Any:
        generation, record = self._records.get(key, (-1, None))
        return record if generation == self.shared.generation else None

    def made_of(self, key: Hashable, messages: Sequence[object]) -> Any:
        """The last record of ``key`` if it was made of ``messages`` (equal ones, in order; a
        record names its ``messages``), else None: a result's second body of one form (the host's,
        then the request ledger's) takes the first one's record as it is, not assembled again."""
        record = self.get(key)
        if record is None or len(record.messages) != len(messages):
            return None
        return record if record.messages == (messages if isinstance(messages, list) else list(messages)) else None

    def clear(self) -> None:
        """Drop every record, and the parts shared with other caches (a host edited one, P15):
        every cache sharing them makes its next bodies afresh."""
        self._records = {}
        self.shared.parts = {}
        self.shared.generation += 1

    def put(self, key: Hashable, record: Any, messages: Sequence[object]) -> None:
        """Keep ``record``, a body made of ``messages``, as the last of ``key``."""
        self._records = newest(self._records, key, (self.shared.generation, record))
        self.shared.bound(messages)
