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

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..budget import Entry
from ..content import Message, ToolResult, has_block
from .chunking import head_window
from .kept_window import KeptWindow
from .live import holds_live_blocks
from .shown_entries import ShownEntries

if TYPE_CHECKING:
    from ..views import MessageView

MIN_BACK = 64  # messages the recent window first reads back for, doubling until it is full

Runs = list[tuple[int, int]]


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

    def head(self, messages: Sequence[Message], view: MessageView, start_id: str | None) -> Head:
        """The head window of ``messages`` (``view``'s), from ``start_id`` (a reset, T6) or the first."""
        self._made.follow(view.pricing, len(messages))
        key = (view.window(1).stamp, view.pricing, start_id)
        head = self._head
        if head is None or key != self._head_key or self._head_open:
            start, end = head_window(messages, view, start_id, self._head_tokens)
            made = [self._made.raw(message, view.estimate_tokens) for message in messages[start:end]]
            entries = [entry for entry, _ in made]
            totals = [0]
            for _, cost in made:
                totals.append(totals[-1] + cost)
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
        start = fits - 1 if floor < fits < count and has_block(messages[fits], ToolResult) else fits
        # Forget what the window left behind once that outgrows it, keeping the newest message
        # that didn't fit, so the next compile knows where to stop without reading back.
        behind = max(0, fits - 1) - base
        if behind > max(MIN_BACK, count - fits):
            kept.drop_front(behind)
        return start

    def recent(self, messages: Sequence[Message], start: int, allowance: int, skipped: Sequence[int]) -> tuple[Runs, int]:
        """The recent window's messages that fit in ``allowance`` tokens as sent, newest first
        from the view's end down to ``start`` (after ``recent_start``), passing over the indices
        ``skipped`` (ascending): their runs, oldest first, and what they cost."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        totals = kept.totals
        runs: Runs = []
        spent = 0
        stop = len(messages)
        for low in [*(index + 1 for index in reversed(skipped)), start]:  # the stretches between skipped ones
            if low < stop:
                fits = base + bisect_left(totals, totals[stop - base] - (allowance - spent), low - base)
                if fits < stop:
                    runs.append((fits, stop))
                    spent += totals[stop - base] - totals[fits - base]
                if fits > low:
                    break  # one didn't fit: the window ends here
            stop = low - 1
        return runs[::-1], spent

    def entries(self, messages: Sequence[Message], start: int, stop: int) -> list[Entry]:
        """The entries of ``messages[start:stop]``, inside the recent window."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        return kept.entries[start - base : stop - base]

    def live(self, messages: Sequence[Message], start: int) -> list[int]:
        """The indices, from ``start``, of the recent window's entries the live policy may change."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        base = len(messages) - len(kept.entries)
        return [index + base - start for index in kept.live[bisect_left(kept.live, start - base) :]]

    def depth_after(self, messages: Sequence[Message], index: int) -> int:
        """The ``estimate_blocks`` tokens of the recent window's entries after ``messages[index]``."""
        kept = self._kept
        assert kept is not None, "recent_start comes first"
        return kept.depth_after(index - (len(messages) - len(kept.entries)))

    def _follow(self, messages: Sequence[Message], view: MessageView) -> KeptWindow:
        self._made.follow(view.pricing, len(messages))
        window = view.window(1)
        kept = self._kept
        if kept is None or not kept.follow(view, window):
            newest = messages[-1].sequence if messages else -1
            kept = self._kept = KeptWindow(newest + 1, self._made.raw, view, window, ())
        return kept
