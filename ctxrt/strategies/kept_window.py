"""A view's newest messages as entries, kept between compiles (docs/architecture.md, Strategies).

Between re-anchors a windowed compile is the previous one plus appends, and Autobiographical's
recent window slides forward by what was appended, so a strategy keeps the entries of the
view's messages from a sequence on (one ``copy`` entry per message, made by the strategy, shaped,
without markers), their running token totals as sent and as the view prices them unshaped, and
where the entries the live policy may change are. A compile brings it up to date with the view:
appends are added, the messages the view's ``changes`` name are replaced, and everything else is
handed back as the same ``Entry`` objects, which compile's memo keys on. Window bounds then come
by bisect on the totals, not by a walk. Pure and synchronous.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry
from ..content.blocks import Message, sequence_key
from ..memos import IdMemo
from ..content.tokens import estimate_blocks
from .live import holds_live_blocks

if TYPE_CHECKING:
    from ..views import MessageView, Window

Make = Callable[[Message, Callable[[Message], int]], tuple[Entry, int]]
"""A message's entry and what it costs as sent, given how the view prices a message."""


class KeptWindow:
    """The messages of a view from sequence ``anchor`` on, as entries, as of the window stamped ``stamp``.

    ``totals[i]``: what ``entries[:i]`` cost as sent; ``estimates[i]``: what their messages cost
    as the view prices them (the same unless a cap shaped them); ``live``: the indices of the
    entries that ``holds_live_blocks``, ascending.
    """

    def __init__(self, anchor: int, make: Make, view: MessageView, window: Window, messages: Sequence[Message],
                 made: Sequence[tuple[Entry, int]] | None = None) -> None:
        """``messages``: the view's messages from ``anchor`` on; ``made``: their entries and costs,
        if the caller has them."""
        self.anchor = anchor  # every message of the view from here on is kept
        self._make = make
        self._pricing = view.pricing
        self._stamp = window.stamp
        self._newest = window.messages[-1].sequence if window.messages else -1
        if made is None:
            made = [make(message, view.estimate_tokens) for message in messages]
        self._sequences = [message.sequence for message in messages]
        self.entries = [entry for entry, _ in made]
        self.totals = list(accumulate((cost for _, cost in made), initial=0))
        self.estimates = list(accumulate(map(view.estimate_tokens, messages), initial=0))
        self.live = [index for index, entry in enumerate(self.entries) if holds_live_blocks(entry)]
        self._depths: list[int] | None = None  # running estimate_blocks totals, made on first need
        self._twins: IdMemo[Entry, Entry] = IdMemo()

    def follow(self, view: MessageView, window: Window) -> bool:
        """Bring the entries up to ``view`` (``window`` its newest): patch what its changes name,
        add what was appended. False when that can't be done here (the caller builds anew)."""
        if view.pricing != self._pricing:
            return False
        if window.stamp != self._stamp:
            changes = view.changes(self._stamp)
            if changes is None:
                return False
            for low, high in changes:
                low, high = max(low, self.anchor), min(high, self._newest)
                if low <= high:
                    fresh = view.after(low - 1)
                    self._replace(low, high, fresh[: bisect_right(fresh, high, key=sequence_key)], view)
            self._stamp = window.stamp
        if window.messages and window.messages[-1].sequence > self._newest:
            added = view.after(self._newest)
            self._replace(self._newest + 1, added[-1].sequence, added, view)
            self._newest = added[-1].sequence
        return True

    def extend_back(self, messages: Sequence[Message], view: MessageView) -> None:
        """Keep the older ``messages`` too: the view's messages from a new anchor (the first's
        sequence) up to the current one."""
        if messages:
            self._replace(messages[0].sequence, self.anchor - 1, messages, view)
            self.anchor = messages[0].sequence

    def drop_front(self, count: int) -> None:
        """Forget the oldest ``count`` entries (a window moved past them)."""
        sequences = self._sequences
        self.anchor = sequences[count] if count < len(sequences) else self._newest + 1
        del sequences[:count]
        del self.entries[:count]
        self.totals = _rebased(self.totals, count)
        self.estimates = _rebased(self.estimates, count)
        self.live = [index - count for index in self.live[bisect_left(self.live, count) :]]
        if self._depths is not None:
            del self._depths[:count]  # depth_after reads differences

    def _replace(self, low: int, high: int, messages: Sequence[Message], view: MessageView) -> None:
        """The entries of sequences ``low..high`` become those of ``messages`` (sequence ordered)."""
        start = bisect_left(self._sequences, low)
        stop = bisect_right(self._sequences, high)
        appending = start == stop == len(self.entries)
        made = [self._make(message, view.estimate_tokens) for message in messages]
        fresh = [entry for entry, _ in made]
        self._sequences[start:stop] = [message.sequence for message in messages]
        self.entries[start:stop] = fresh
        self.totals = _spliced(self.totals, start, stop, [cost for _, cost in made], appending)
        self.estimates = _spliced(self.estimates, start, stop, list(map(view.estimate_tokens, messages)), appending)
        moved = len(fresh) - (stop - start)
        cut = bisect_left(self.live, start)
        self.live = [*self.live[:cut], *(start + i for i, entry in enumerate(fresh) if holds_live_blocks(entry)),
                     *(index + moved for index in self.live[bisect_left(self.live, stop) :])]
        depths = self._depths
        if appending and depths is not None:
            depths += list(accumulate((estimate_blocks(entry.content) for entry in fresh), initial=depths[-1]))[1:]
        else:
            self._depths = None  # made again on next need

    def depth_after(self, index: int) -> int:
        """The ``estimate_blocks`` tokens of the entries after ``index`` (the live policy's depth)."""
        if self._depths is None:
            self._depths = list(accumulate((estimate_blocks(entry.content) for entry in self.entries), initial=0))
        return self._depths[-1] - self._depths[index + 1]

    def marked(self) -> list[Entry]:
        """The entries with the first (the anchor) and the last (the tail) carrying cache markers
        (P9), the same marked objects while those entries are."""
        out = list(self.entries)
        if out:
            out[0], out[-1] = self._twin(out[0]), self._twin(out[-1])
        return out

    def _twin(self, entry: Entry) -> Entry:
        found = self._twins.get(entry)
        if found is None:
            self._twins.bound(2)  # the anchor's and the tail's are in use
            found = self._twins.put(entry, attrs.evolve(entry, cache_marker=True))
        return found


def _spliced(totals: list[int], start: int, stop: int, costs: list[int], appending: bool) -> list[int]:
    """Running ``totals`` with the costs of items ``start:stop`` replaced by ``costs``."""
    made = list(accumulate(costs, initial=totals[start]))
    if appending:
        totals += made[1:]
        return totals
    shift = made[-1] - totals[stop]
    return [*totals[:start], *made, *(total + shift for total in totals[stop + 1 :])]


def _rebased(totals: list[int], count: int) -> list[int]:
    """Running ``totals`` without their first ``count`` items."""
    base = totals[count]
    return [total - base for total in totals[count:]]
