"""Which messages of a view summaries cover, as runs of view indices (docs/architecture.md, Strategies).

A summary covers the messages of its chunks, a contiguous stretch of the view when they closed,
so its coverage is the view's index range between its first and last sequence, less any message
edited into view inside that range since (not one of its leaves). Those exceptions are found by
one pass over the summary's messages and kept until the view's change log names a change in its
range (appends never land inside a summary); its runs are kept per view stamp (appends move no
index), so a compile's coverage questions cost O(summaries), not a scan of the view.
Pure and synchronous.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, overload

from ..content.blocks import Message, sequence_key
from .records import Summary

if TYPE_CHECKING:
    from ..slots import Change

Runs = list[tuple[int, int]]  # sorted, disjoint [start, stop) index runs


class Coverage:
    """The runs a set of summaries covers in a view, memoised: each summary's exceptions while the
    view's changes leave its range alone, its runs per view stamp (appends move no index)."""

    def __init__(self) -> None:
        self._stamp: object = None
        # summary id -> its sources (a summary a failed commit dropped may be made again under its
        # id), its first and last sequence and the sequences in that range that aren't its leaves
        self._outside: dict[str, tuple[tuple[str, ...], int, int, tuple[int, ...]]] = {}
        self._runs: dict[str, tuple[tuple[str, ...], Runs]] = {}  # summary id -> its sources, its runs at this stamp

    def runs(self, summaries: Sequence[Summary], messages: Sequence[Message], stamp: object,
             leaves: Callable[[Summary], tuple[str, ...]], changes: Callable[[object], list[Change] | None]) -> Runs:
        """The runs of ``messages`` (the view's at ``stamp``; ``changes``, its change log) that
        ``summaries`` cover."""
        if stamp != self._stamp:
            changed = None if self._stamp is None else changes(self._stamp)
            self._outside = {} if changed is None else {
                key: found for key, found in self._outside.items()
                if not any(low <= found[2] and found[1] <= high for low, high in changed)}
            self._stamp, self._runs = stamp, {}
        pieces: Runs = []
        for summary in summaries:
            found = self._runs.get(summary.id)
            if found is None or not _same(found[0], summary.source_ids):
                found = self._runs[summary.id] = (summary.source_ids, self._covered(summary, messages, leaves))
            pieces += found[1]
        return union(pieces)

    def _covered(self, summary: Summary, messages: Sequence[Message], leaves: Callable[[Summary], tuple[str, ...]]) -> Runs:
        start = bisect_left(messages, summary.first_sequence, key=sequence_key)
        stop = bisect_right(messages, summary.last_sequence, key=sequence_key)
        found = self._outside.get(summary.id)
        if found is None or not _same(found[0], summary.source_ids):
            found = self._outside[summary.id] = (summary.source_ids, summary.first_sequence, summary.last_sequence,
                                                 _not_leaves(messages[start:stop], leaves(summary)))
        runs: Runs = []
        for sequence in found[3]:
            at = bisect_left(messages, sequence, start, stop, key=sequence_key)
            runs.append((start, at))
            start = at + 1
        runs.append((start, stop))
        return runs


def _same(kept: tuple[str, ...], sources: tuple[str, ...]) -> bool:
    return kept is sources or kept == sources


def _not_leaves(messages: Sequence[Message], leaves: tuple[str, ...]) -> tuple[int, ...]:
    if len(messages) == len(leaves) and [message.id for message in messages] == list(leaves):
        return ()
    kept = set(leaves)
    return tuple(message.sequence for message in messages if message.id not in kept)


def union(pieces: Runs) -> Runs:
    """The runs covering what ``pieces`` cover, sorted and disjoint (empty pieces left out)."""
    out: Runs = []
    for start, stop in sorted(piece for piece in pieces if piece[0] < piece[1]):
        if out and start <= out[-1][1]:
            if stop > out[-1][1]:
                out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def covers(runs: Runs, index: int) -> bool:
    at = bisect_right(runs, (index, float("inf"))) - 1
    return at >= 0 and runs[at][0] <= index < runs[at][1]


def outside(runs: Runs, start: int, stop: int) -> Iterator[int]:
    """The indices of ``[start, stop)`` no run covers, newest first."""
    at = bisect_right(runs, (stop, stop)) - 1
    index = stop - 1
    while index >= start:
        while at >= 0 and runs[at][0] > index:
            at -= 1
        if at >= 0 and runs[at][1] > index:
            index = runs[at][0] - 1  # skip the run
            continue
        yield index
        index -= 1


def gaps(runs: Runs, start: int, stop: int) -> Runs:
    """The runs of ``[start, stop)`` no run of ``runs`` covers, oldest first."""
    out: Runs = []
    for a, b in runs:
        if a > start:
            out.append((start, min(a, stop)))
        start = max(start, b)
    if start < stop:
        out.append((start, stop))
    return [(a, b) for a, b in out if a < b]


def count_outside(runs: Runs, start: int, stop: int) -> int:
    """How many indices of ``[start, stop)`` no run covers."""
    count = max(0, stop - start)
    for a, b in runs[max(0, bisect_right(runs, (start, start)) - 1) :]:
        if a >= stop:
            break
        count -= max(0, min(stop, b) - max(start, a))
    return count


class RunIds(Sequence[str]):
    """The ids of the messages in ``runs`` of ``messages`` (a view's list: appends never move
    what it holds), oldest first, read only when asked, so a compile that leaves out most of a
    long history doesn't list it. Equal to (and hashed as) the tuple of the same ids."""

    __slots__ = ("_messages", "_runs", "_starts")

    def __init__(self, messages: Sequence[Message], runs: Runs) -> None:
        self._messages, self._runs = messages, runs
        self._starts = list(accumulate((stop - start for start, stop in runs), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        at = index + len(self) if index < 0 else index
        if not 0 <= at < len(self):
            raise IndexError("RunIds index out of range")
        run = bisect_right(self._starts, at) - 1
        return self._messages[self._runs[run][0] + at - self._starts[run]].id

    def __iter__(self) -> Iterator[str]:
        for start, stop in self._runs:
            for message in self._messages[start:stop]:
                yield message.id

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, (tuple, RunIds)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))
