"""Autobiographical's windows and dropped ids kept between compiles (zones.py, coverage.RunIds)
equal what a walk over the whole view gives, after any appends, edits and removals: pure, with
no strategy, store or event loop."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import Image, MessageView, Summary, Text, ToolResult, Window
from ctxrt.testing import ChangeLog, estimate_blocks
from ctxrt.strategies.chunking import head_window
from ctxrt.strategies.coverage import Coverage, RunIds
from ctxrt.strategies.live import JoinedDepths, holds_live_blocks, loose
from ctxrt.strategies.shown_entries import ShownEntries
from ctxrt.strategies.zones import Zones

PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


class EditedListing:
    """A list of messages as a listing that names its edits and removals, as a slot's does: the
    list is extended in place by appends and replaced by a rewrite."""

    def __init__(self) -> None:
        self.messages: list[ctxrt.Message] = []
        self.log = ChangeLog()

    def window(self, count: int) -> Window:
        return Window(self.messages, True, (self, self.log.count))

    def changes(self, stamp: object) -> list[tuple[int, int]] | None:
        listing, count = stamp if isinstance(stamp, tuple) else (None, 0)
        return self.log.since(count) if listing is self else None

    def may_hold_audience(self) -> bool:
        return False

    def rewrite(self, index: int, message: ctxrt.Message | None) -> None:
        sequence = self.messages[index].sequence
        self.messages = [*self.messages[:index], *([message] if message else []), *self.messages[index + 1 :]]
        self.log.add((sequence, sequence))


def message(sequence: int, kind: str, words: int) -> ctxrt.Message:
    blocks: tuple[Any, ...] = (Text(" ".join(["word"] * words)),)
    if kind == "result":
        blocks = (ToolResult(f"t{sequence}", " ".join(["out"] * words)),)
    elif kind == "image":
        blocks = (*blocks, Image(PNG))
    return ctxrt.Message(str(sequence), sequence, "user", blocks)


def walked_recent_start(messages: list[ctxrt.Message], view: MessageView, floor: int, window: int) -> int:
    """The recent window's start by the walk the kept totals replace."""
    total, start = 0, len(messages)
    for index in range(len(messages) - 1, floor - 1, -1):
        cost = view.estimate_tokens(messages[index])
        if total + cost > window:
            break
        total += cost
        start = index
    if floor < start < len(messages) and type(messages[start].content[0]) is ToolResult:
        start -= 1
    return start


def walked_runs(costs: list[int], runs: list[tuple[int, int]], allowance: int, skipped: list[int]) -> tuple[list[int], int]:
    """The indices the newest-first walk over ``runs`` takes, oldest first, and their cost."""
    taken, spent = [], 0
    for index in [index for low, high in reversed(runs) for index in range(high - 1, low - 1, -1)]:
        if index in skipped:
            continue
        if spent + costs[index] > allowance:
            break
        taken.append(index)
        spent += costs[index]
    return taken[::-1], spent


STEP = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(st.sampled_from(["text", "text", "result", "image"]),
                                                    st.integers(0, 3) | st.integers(0, 60)), min_size=1, max_size=20)),
    st.tuples(st.sampled_from(["edit", "remove"]), st.integers(0, 10**6), st.integers(0, 60)),
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(STEP, min_size=2, max_size=30), cap=st.sampled_from([0, 0, 25]),
    head_tokens=st.integers(0, 120), recent_tokens=st.integers(0, 400), data=st.data(),
)
def test_kept_windows_equal_a_walk_over_the_view_after_appends_edits_and_removals(
    steps: list[Any], cap: int, head_tokens: int, recent_tokens: int, data: st.DataObject
) -> None:
    """(T9) The head, the recent window's start, what the recent window and runs of the middle
    take within an allowance (skipping pinned messages), their entries, the entries the live
    policy may change and the depths after them, all kept across compiles, equal a fresh walk
    over the view after every step."""
    listing = EditedListing()
    view = MessageView(listing)
    zones = Zones(ShownEntries(cap, "Claude"), head_tokens, recent_tokens)
    sequence = 0
    for step in steps:
        if step[0] == "append":
            for kind, words in step[1]:
                sequence += 1
                listing.messages.append(message(sequence, kind, words))
        elif listing.messages:
            index = step[1] % len(listing.messages)
            old = listing.messages[index]
            listing.rewrite(index, attrs.evolve(old, content=(Text(" ".join(["edited"] * step[2])),))
                            if step[0] == "edit" else None)
        messages = listing.messages
        fresh = ShownEntries(cap, "Claude")
        made = [fresh.raw(m, view.estimate_tokens) for m in messages]
        head = zones.head(messages, view, None)
        start, end = head_window(messages, view, None, head_tokens)
        assert (head.start, head.end) == (start, end)
        assert head.entries == [entry for entry, _ in made[start:end]]
        floor = data.draw(st.integers(0, len(messages)), label="floor")
        recent_start = zones.recent_start(messages, view, floor)
        assert recent_start == walked_recent_start(messages, view, floor, recent_tokens)
        allowance = data.draw(st.integers(0, recent_tokens + 20), label="allowance")
        skipped = data.draw(st.lists(st.integers(0, max(0, len(messages) - 1)), max_size=5)
                            .map(lambda found: sorted(set(found) & set(range(len(messages))))), label="skipped")
        # The recent window, then (as a compile's middle) runs below it, the newest first.
        bounds = data.draw(st.lists(st.integers(0, recent_start), unique=True, max_size=6).map(sorted), label="middle")
        entries = [entry for entry, _ in made]
        costs = [cost for _, cost in made]
        for runs in ([(recent_start, len(messages))], list(zip(bounds[::2], bounds[1::2]))):
            taken_runs, spent = zones.take(messages, view, runs, allowance, skipped)
            taken = [index for low, high in taken_runs for index in range(low, high)]
            assert (taken, spent) == walked_runs(costs, runs, allowance, skipped)
            assert all(high < low or any(high <= index < low for index in skipped) or not any(
                a <= high < b for a, b in runs) for (_, high), (low, _) in zip(taken_runs, taken_runs[1:]))
            for low, high in taken_runs:
                run = zones.entries(messages, view, low, high)
                assert run == entries[low:high]
                assert zones.live(messages, low, high, run) == [
                    index - low for index in range(low, high) if holds_live_blocks(entries[index])]
                depths = JoinedDepths([(0, loose(entry)) for entry in entries[:low]]
                                      + [(low + offset, after) for offset, after in zones.depths(messages, low, high, run)]
                                      + [(index, loose(entries[index])) for index in range(high, len(entries))], 10**9)
                for index in range(high - 1, low - 1, -1):
                    assert depths.after(index) == sum(estimate_blocks(e.content) for e in entries[index + 1 :])
        zones.trim(messages)


@given(bounds=st.lists(st.integers(0, 40), unique=True, max_size=8).map(sorted), data=st.data())
def test_dropped_ids_read_from_runs_equal_the_tuple_of_them(bounds: list[int], data: st.DataObject) -> None:
    """(T9) ``render_stats().dropped_ids`` read from runs of the view is the tuple of those
    messages' ids: equal to it either way round, hashed the same, indexed and sliced the same."""
    messages = [message(n, "text", 1) for n in range(1, 41)]
    disjoint = list(zip(bounds[::2], bounds[1::2]))  # sorted, apart, non-empty: as gaps() gives them
    ids = tuple(m.id for start, stop in disjoint for m in messages[start:stop])
    lazy = RunIds(messages, disjoint)
    assert lazy == ids and ids == lazy and not lazy != ids and hash(lazy) == hash(ids)
    assert len(lazy) == len(ids) and list(lazy) == list(ids) and bool(lazy) == bool(ids) and repr(lazy) == repr(ids)
    assert lazy != list(ids)  # as a tuple is not equal to a list
    if ids:
        index = data.draw(st.integers(-len(ids), len(ids) - 1))
        assert lazy[index] == ids[index] and lazy[index:] == ids[index:] and ids[index] in lazy


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["edit", "remove", "reveal", "append"]), st.integers(0, 10**6)),
                      max_size=12))
def test_coverage_kept_across_changes_equals_coverage_found_afresh(steps: list[tuple[str, int]]) -> None:
    """(T9) What summaries cover, kept across the view's edits, removals, reveals inside their
    ranges and appends, equals what a fresh ``Coverage`` finds in the view as it is."""
    listing = EditedListing()
    listing.messages = [message(n, "text", 2) for n in range(1, 41) if n % 7]  # 7, 14, ... hidden for now
    summaries = [Summary(f"L1-{n}", 1, "s", 1, tuple(str(s) for s in range(first, first + 8) if s % 7), first,
                         first + 7, str(first), str(first + 7), 0) for n, first in enumerate(range(1, 33, 8))]
    view = MessageView(listing)
    kept = Coverage()
    hidden = [n for n in range(1, 41) if n % 7 == 0]
    sequence = 40
    for kind, pick in steps:
        messages = listing.messages
        if kind == "reveal" and hidden:
            revealed = hidden.pop(pick % len(hidden))
            at = next((index for index, m in enumerate(messages) if m.sequence > revealed), len(messages))
            listing.messages = [*messages[:at], message(revealed, "text", 3), *messages[at:]]
            listing.log.add((revealed, revealed))
        elif kind == "append":
            sequence += 1
            messages.append(message(sequence, "text", 1))
        elif messages:
            index = pick % len(messages)
            listing.rewrite(index, message(messages[index].sequence, "text", 5) if kind == "edit" else None)
        messages = listing.messages
        stamp = view.window(1).stamp
        for shown in (summaries, summaries[1::2]):
            assert kept.runs(shown, messages, stamp, lambda s: s.source_ids, view.changes) == Coverage().runs(
                shown, messages, stamp, lambda s: s.source_ids, view.changes)
