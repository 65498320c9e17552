"""Autobiographical's head and recent windows, kept between compiles (docs/architecture.md, Strategies).

Where the two windows lie in a reader's view and what they show (docs/behaviours.md T3, T5,
T6). A warm compile's view is the last one plus an append, so both are kept: the head (at most
``head_window_tokens`` from the view's first message or a reset's) while the view is the same
but for appends past it, and the recent window's messages as a ``KeptWindow`` brought up to date
with the view's appends and changes, its bounds found by bisect on their running totals. A
compile then costs what changed, not a walk over the ~1,000 messages a 30,000-token window holds.
Pure and synchronous.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

from ..budget import Entry
from ..content.blocks import Message, ToolResult, has_block
from .chunking import head_window
from .coverage import Runs
from .kept_window import KeptWindow
from .live import Piece, holds_live_blocks, loose
from .shown_entries import ShownEntries

if TYPE_CHECKING:
    from ..views import MessageView

MIN_BACK = 64  # messages the recent window first reads back for, doubling until it is full


class Head(NamedTuple):
    """The head window: ``messages[start:end]``, their entries, what the first ``i`` cost as sent
    (``totals[i]``) and which entries the live policy may change."""

    start: int
    end: int
    entries: list[Entry]
    totals: list[int]
    live: list[int]


class Zones:
    """The head and recent windows of a view, their entries made by ``made``."""

    def __init__(self, made: ShownEntries, head_tokens: int, recent_tokens: int) -> None:
        self._made = made
        self._head_tokens = head_tokens
        self._recent_tokens = recent_tokens
        self._head: Head | None = None
        self._head_key: object = None  # the view's stamp and pricing and the reset's message it was found for
        self._head_open = True  # it reached the view's end when found: appends may move it
        self._kept: KeptWindow | None = None
        self._needed = sys.maxsize  # the oldest index this compile's windows used (trim forgets what is older)

    def resize(self, head_tokens: int, recent_tokens: int) -> None:
        """New window sizes (live settings, T14): the head is found again; the kept recent window
        stays (its bounds are found from its totals at each compile)."""
        if head_tokens != self._head_tokens:
            self._head = None
        self._head_tokens, self._recent_tokens = head_tokens, recent_tokens

    def head(self, messages: Sequence[Message], view: MessageView, start_id: str | None) -> Head:
        """The head window of ``messages`` (``view``'s), from ``start_id`` (a reset, T6) or the first."""
        self._made.follow(view, len(messages))
        key = (view.window(1).stamp, view.pricing, start_id)
        head = self._head
        if head is None or key != self._head_key or self._head_open:
            start, end = head_window(messages, view, start_id, self._head_tokens)
            made = [self._made.raw(message, view.estimate_tokens) for message in messages[start:end]]
            entries = [entry for entry, _ in made]
            totals = list(accumulate((cost for _, cost in made), initial=0))
            head = self._head = Head(start, end, entries, totals,
                                     [index for index, entry in enumerate(entries) if holds_live_blocks(entry)])
            self._head_key, self._head_open = key, end >= len(messages)
        return head

    def recent_start(self, messages: Sequence[Message], view: MessageView, floor: int) -> int:
        """Where the recent window starts: the newest messages (not below ``floor``) that fit in
        ``recent_window_tokens`` as the view prices them, not starting on a tool result."""
        kept = self._follow(messages, view)
        count, window = len(messages), self._recent_tokens
        base = count - len(kept.entries)  # kept: messages[base:]
        while base > floor and kept.estimates[-1] <= window:
            older = max(floor, base - max(MIN_BACK, count - base))
            kept.extend_back(messages[older:base], view)
            base = older
        estimates = kept.estimates
        fits = base + bisect_left(estimates, estimates[-1] - window, max(0, floor - base))
        # Keep the newest message that didn't fit, so the next compile knows where to stop without reading back.
        self._needed = min(self._needed, max(0, fits - 1))
        return fits - 1 if floor < fits < count and has_block(messages[fits], ToolResult) else fits

    def take(self, messages: Sequence[Message], view: MessageView, runs: Runs, allowance: int,
             skipped: Sequence[int]) -> tuple[Runs, int]:
        """Newest first over ``runs`` of ``messages`` (oldest first, after ``recent_start``),
        passing over the indices ``skipped`` (ascending), the messages that fit in ``allowance``
        tokens as sent until one doesn't: their runs, oldest first, and what they cost. A stretch
        that reaches the kept window is kept from then on, read back as far as the walk goes."""
        taken: Runs = []
        spent = 0
        for low, stop in _stretches(runs, skipped):
            fits, cost = self._fit(messages, view, low, stop, allowance - spent)
            if fits < stop:
                taken.append((fits, stop))
                spent += cost
            if fits > low:
                break  # one didn't fit: the walk ends here
        if taken:
            self._needed = min(self._needed, taken[-1][0])
        return taken[::-1], spent

    def _fit(self, messages: Sequence[Message], view: MessageView, low: int, stop: int, allowance: int) -> tuple[int, int]:
        """The oldest index from which ``messages[i:stop]`` (``i >= low``) fit in ``allowance``, and their cost."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        count = len(messages)
        base = count - len(kept.entries)
        while stop >= base:
            totals = kept.totals
            fits = base + bisect_left(totals, totals[stop - base] - allowance, max(low, base) - base)
            if fits > base or low >= base:
                return fits, totals[stop - base] - totals[fits - base]
            older = max(low, base - max(MIN_BACK, count - base))  # all of it fits: read back, doubling
            kept.extend_back(messages[older:base], view)
            base = older
        spent, fits = 0, stop  # apart from the kept window (an old stretch): message by message
        while fits > low:
            cost = self._made.raw(messages[fits - 1], view.estimate_tokens)[1]
            if spent + cost > allowance:
                break
            spent, fits = spent + cost, fits - 1
        return fits, spent

    def trim(self, messages: Sequence[Message]) -> None:
        """After a compile: forget what the windows left behind once that outgrows what they hold."""
        kept, needed, self._needed = self._kept, min(self._needed, len(messages)), sys.maxsize
        if kept is not None:
            behind = needed - (len(messages) - len(kept.entries))
            if behind > max(MIN_BACK, len(messages) - needed):
                kept.drop_front(behind)

    def entries(self, messages: Sequence[Message], view: MessageView, start: int, stop: int) -> list[Entry]:
        """The entries of ``messages[start:stop]`` (a run ``take`` gave)."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        if start >= base:
            return kept.entries[start - base : stop - base]
        older = [self._made.raw(message, view.estimate_tokens)[0] for message in messages[start : min(stop, base)]]
        return older + kept.entries[: max(0, stop - base)]

    def live(self, messages: Sequence[Message], start: int, stop: int, entries: Sequence[Entry]) -> list[int]:
        """The indices in ``entries`` (those of ``messages[start:stop]``) the live policy may change."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        older = max(0, min(stop, base) - start)
        found = [index for index in range(older) if holds_live_blocks(entries[index])]
        live = kept.live
        return found + [index + base - start for index in live[bisect_left(live, max(start, base) - base) :
                                                              bisect_left(live, stop - base)]]

    def depths(self, messages: Sequence[Message], start: int, stop: int, entries: Sequence[Entry]) -> list[Piece]:
        """``entries`` (those of ``messages[start:stop]``) as pieces for ``JoinedDepths``."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        older = max(0, min(stop, base) - start)
        pieces: list[Piece] = [(index, loose(entries[index])) for index in range(older)]
        if older < stop - start:
            after = kept.depth_after
            low, high = max(start, base) - base, stop - base - 1

            def within(offset: int) -> int:  # the tokens after ``offset`` in the kept run, to its end
                return after(low + offset) - after(high)

            pieces.append((older, within))
        return pieces

    def _follow(self, messages: Sequence[Message], view: MessageView) -> KeptWindow:
        self._made.follow(view, len(messages))
        window = view.window(1)
        kept = self._kept
        if kept is None or not kept.follow(view, window):
            newest = messages[-1].sequence if messages else -1
            kept = self._kept = KeptWindow(newest + 1, self._made.raw, view, window, ())
        return kept


def _stretches(runs: Runs, skipped: Sequence[int]) -> Runs:
    """``runs`` less the indices ``skipped`` (ascending), newest first."""
    out: Runs = []
    for low, high in runs:
        for index in skipped[bisect_left(skipped, low) : bisect_left(skipped, high)]:
            out.append((low, index))
            low = index + 1
        out.append((low, high))
    return [(low, high) for low, high in reversed(out) if low < high]
