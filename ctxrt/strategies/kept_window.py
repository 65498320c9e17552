"""WindowedPassthrough's window kept between compiles (docs/architecture.md, Strategies).

Between re-anchors a windowed compile is the previous one plus appends, so the strategy keeps
the window's entries (one ``copy`` entry per message from the anchor on, shaped, without
markers), their running token totals and where the entries the live policy may change are. A
compile brings it up to date with the view: appends are added, the messages the view's
``changes`` name are replaced, and everything else is handed back as the same ``Entry``
objects, which compile's memo keys on. Pure and synchronous.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry
from ..content import Message, sequence_key
from ..tokens import estimate_blocks
from .base import raw_entry
from .live import holds_live_blocks
from .shaping import shape

if TYPE_CHECKING:
    from ..views import MessageView, Window


class KeptWindow:
    """The messages of a view from ``anchor`` on, as entries, as of the window stamped ``stamp``."""

    def __init__(self, anchor: int, cap: int, view: MessageView, window: Window, messages: Sequence[Message],
                 shaped: Sequence[tuple[Message, int]]) -> None:
        self.anchor = anchor  # the anchor it was built from (not moved: a re-anchor builds anew)
        self._cap = cap
        self._pricing = view.pricing
        self._stamp = window.stamp
        self._newest = messages[-1].sequence if messages else -1
        self._sequences = [message.sequence for message, _ in shaped]
        self.entries = [raw_entry(message) for message, _ in shaped]
        self.totals = list(accumulate((cost for _, cost in shaped), initial=0))
        self.live = [index for index, entry in enumerate(self.entries) if holds_live_blocks(entry)]
        self._depths: list[int] | None = None  # running estimate_blocks totals, made on first need
        self._twins: dict[int, tuple[Entry, Entry]] = {}

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

    def _replace(self, low: int, high: int, messages: Sequence[Message], view: MessageView) -> None:
        """The entries of sequences ``low..high`` become those of ``messages`` (sequence ordered)."""
        start = bisect_left(self._sequences, low)
        stop = bisect_right(self._sequences, high)
        appending = start == stop == len(self.entries)
        shaped = [shape(message, self._cap, view.estimate_tokens) for message in messages]
        fresh = [raw_entry(message) for message, _ in shaped]
        self._sequences[start:stop] = [message.sequence for message in messages]
        self.entries[start:stop] = fresh
        totals = self.totals
        made = list(accumulate((cost for _, cost in shaped), initial=totals[start]))
        if appending:
            totals += made[1:]
        else:
            shift = made[-1] - totals[stop]
            self.totals = [*totals[:start], *made, *(total + shift for total in totals[stop + 1 :])]
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
        entries = self.entries
        if len(entries) <= 1:
            return [self._twin(entry) for entry in entries]
        return [self._twin(entries[0]), *entries[1:-1], self._twin(entries[-1])]

    def _twin(self, entry: Entry) -> Entry:
        found = self._twins.get(id(entry))
        if found is None or found[0] is not entry:
            if len(self._twins) > 8:
                self._twins.clear()
            found = self._twins[id(entry)] = (entry, attrs.evolve(entry, cache_marker=True))
        return found[1]
