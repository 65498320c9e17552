"""Autobiographical memory's selection: which summaries and raw messages a compile shows within
its budget, and what it reports left out (docs/behaviours.md T5, T6, P6, P9).

A pure function of the view's messages, the zones, the pins and the summary frontier, apart
from the strategy's state and its compression work, so a compile's choices can be checked
without a strategy, a store or an event loop. How level-1 summaries share their budget is the
compression policy's choice (``choose_l1``); ``choose`` is the plain one.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry
from ..content import Message, Text, sequence_key
from .base import Pin, RenderStats
from .coverage import Coverage, RunIds, Runs, count_outside, covers, gaps, union
from .live import JoinedDepths, LiveMemo, LiveOptions, Piece, apply_live_policy_at, holds_live_blocks, loose
from .records import Summary
from .shown_entries import ShownEntries
from .zones import Zones

if TYPE_CHECKING:
    from ..views import MessageView

logger = logging.getLogger("ctxrt.autobiographical")

SUMMARY_HEADER_TOKENS = 20  # what a shown summary's recall header and turn cost besides its text
LEVEL_BUDGET_TOKENS = 30000  # per-level summary budgets (levels 1, 2 and 3)

Price = Callable[[Summary], int]
Chooser = Callable[[list[Summary], int, Price], list[Summary]]


@attrs.frozen
class Selection:
    """What a compile shows (the live policy applied) and what it costs, by zone."""

    entries: list[Entry]
    head_tokens: int
    middle_tokens: int
    tail_tokens: int
    total_tokens: int
    stats: RenderStats


def choose(candidates: list[Summary], allowance: int, price: Price) -> list[Summary]:
    """Summaries to show within ``allowance`` tokens at ``price``, the newest first (what doesn't
    fit is the oldest history), returned oldest first."""
    chosen = []
    for summary in reversed(candidates):
        if price(summary) > allowance:
            break  # older ones may be smaller, but showing them would leave a newer gap
        chosen.append(summary)
        allowance -= price(summary)
    return chosen[::-1]


class SummaryPrices:
    """What showing a summary costs (its recall header and its text) as a view prices text,
    memoised at one pricing: the plain ``tokens + 20`` unless the estimator is calibrated."""

    def __init__(self, participant: str) -> None:
        self._participant = participant
        self._prices: dict[str, int] = {}
        self._priced_at: object = None

    def pricer(self, view: MessageView) -> Price:
        if view.pricing != self._priced_at:
            self._prices, self._priced_at = {}, view.pricing
        prices = self._prices

        def price(summary: Summary) -> int:
            found = prices.get(summary.id)
            if found is None:
                priced = view.estimate_tokens(Message(summary.id, 0, self._participant, (Text(summary.content),)))
                ratio = priced / summary.tokens if summary.tokens else 1.0
                found = prices[summary.id] = priced + round(SUMMARY_HEADER_TOKENS * ratio)
            return found

        return price


def frontier_under_pins(frontier: Sequence[Summary], summaries: Sequence[Summary], pins: Sequence[Pin]) -> list[Summary]:
    """``frontier``, with any summary above a level pin it overlaps opened into its children."""
    level_pins = [pin for pin in pins if pin.level is not None]
    if not level_pins:
        return list(frontier)
    children: dict[str, list[Summary]] = {}
    for summary in summaries:
        if summary.parent_id is not None:
            children.setdefault(summary.parent_id, []).append(summary)
    out: list[Summary] = []
    stack = list(frontier)
    while stack:
        summary = stack.pop()
        too_deep = any(pin.level is not None and summary.level > pin.level and summary.first_sequence
                       <= pin.last_sequence and pin.first_sequence <= summary.last_sequence for pin in level_pins)
        if too_deep and children.get(summary.id):
            stack.extend(children[summary.id])
        else:
            out.append(summary)
    return out


def select(
    messages: Sequence[Message], view: MessageView, usable: int, *, made: ShownEntries, zones: Zones,
    head_start_id: str | None, pins: Sequence[Pin], frontier: Sequence[Summary],
    leaves: Callable[[Summary], tuple[str, ...]], price: Price, choose_l1: Chooser, pending_units: int,
    coverage: Coverage, stamp: object, live: LiveOptions, live_memo: LiveMemo,
) -> Selection:
    """The head window, pinned raw ranges, the recent window, and in the middle the ``frontier``
    summaries that fit (level budgets, the newest history first) and the uncovered messages that
    fit (newest first); every message of the view is shown, covered or reported (no silent drops).
    Entries come from ``made`` and ``zones``, the same objects for what is unchanged since an
    earlier compile, and the live policy has been applied to them."""
    count = len(messages)
    head = zones.head(messages, view, head_start_id)
    head_start, head_end = head.start, head.end
    shown_head = bisect_right(head.totals, usable) - 1  # the head's messages that fit, oldest first
    entries_head = head.entries[:shown_head]
    if entries_head:
        entries_head[-1] = made.marked(entries_head[-1])
    head_tokens = spent = head.totals[shown_head]
    # Pinned raw ranges outside the head come next, whatever the pressure, oldest first.
    raw_pins = [(pin.first_sequence, pin.last_sequence) for pin in pins if pin.level is None]
    pinned_at: list[int] = []  # indices of the pinned messages outside the head, ascending
    for low, high in union([(bisect_left(messages, first, key=sequence_key), bisect_right(messages, last, key=sequence_key))
                            for first, last in raw_pins]):
        pinned_at += [index for index in range(low, high) if not head_start <= index < head_start + shown_head]
    pinned_set = set(pinned_at)
    pinned_entries: list[tuple[int, list[Entry]]] = []
    pinned_shown: list[int] = []
    for index in pinned_at:
        entry, cost = made.raw(messages[index], view.estimate_tokens)
        if spent + cost <= usable:
            pinned_entries.append((messages[index].sequence, [entry]))
            pinned_shown.append(index)
            spent += cost
    pinned_tokens = spent - head_tokens
    # Recent window: evicted newest-first within budget, emitted chronologically.
    recent_start = zones.recent_start(messages, view, head_end)
    recent_runs, tail_tokens = zones.take(messages, view, [(recent_start, count)], usable - spent, pinned_at)
    recent_from = recent_runs[0][0] if recent_runs else count  # the oldest index it shows (pinned ones aside)
    spent += tail_tokens
    # The middle: shown summaries (anti-redundant: the frontier) and uncovered raw messages.
    if raw_pins:
        frontier = [s for s in frontier if not all(_pinned(raw_pins, int(leaf)) for leaf in leaves(s))]
    shown: list[Summary] = []
    budgets = {3: LEVEL_BUDGET_TOKENS, 2: LEVEL_BUDGET_TOKENS, 1: LEVEL_BUDGET_TOKENS}
    carry = 0
    for level in (1, 2, 3):  # the newest history first: under pressure the oldest summaries go
        allowance = min(budgets[level] + carry, usable - spent)
        candidates = sorted((s for s in frontier if s.level == level), key=lambda s: s.first_sequence)
        chosen = choose_l1(candidates, allowance, price) if level == 1 else choose(candidates, allowance, price)
        cost = sum(price(summary) for summary in chosen)
        shown += chosen
        spent += cost
        carry = max(0, allowance - cost)
    covered = coverage.runs(shown, messages, stamp, leaves, view.changes)
    summary_tokens = spent - head_tokens - tail_tokens - pinned_tokens
    # The middle is [0, head_start) (before a reset head, T6) and [head_end, recent_start); its
    # uncovered messages, newest first, are compression debt: keep the newest raw that fit.
    middle_ranges = [(0, head_start), (head_end, recent_start)]
    uncovered = [run for low, high in middle_ranges for run in gaps(covered, low, high)]
    kept_runs, kept_tokens = zones.take(messages, view, uncovered, usable - spent, pinned_at)
    spent += kept_tokens
    kept_from = kept_runs[0][0] if kept_runs else None  # the oldest kept index
    left = sum(stop - start for start, stop in uncovered) - sum(stop - start for start, stop in kept_runs)
    left -= sum(1 for index in pinned_at if covers(uncovered, index))
    if left:
        logger.info("compression debt: %d uncovered middle message(s) left out of the compile", left)
    # No silent drops: every message of the view is shown raw or covered by a shown summary,
    # or it is reported, with why. Shown raw: the head's run, the recent window's and the kept
    # middle's (pinned messages aside: shown only if they fit with the pins).
    raw_runs = [(head_start, head_start + shown_head), (recent_from, count), *((index, index + 1) for index in pinned_shown)]
    if kept_from is not None:
        raw_runs += [(max(kept_from, low), high) for low, high in middle_ranges if high > kept_from]
    gone = gaps(union([*covered, *raw_runs]), 0, count)
    if len(pinned_shown) < len(pinned_at):  # pinned messages are shown only if they fit with the pins
        left_out = pinned_set.difference(pinned_shown)
        gone = union([*gone, *((index, index + 1) for index in sorted(left_out) if not covers(covered, index))])
    dropped = RunIds(messages, gone)
    debt = 0
    if dropped:
        summarised = coverage.runs(frontier, messages, stamp, leaves, view.changes)
        debt = sum(count_outside(summarised, start, stop) for start, stop in gone)
        debt -= sum(1 for index in pinned_at if covers(gone, index) and not covers(summarised, index))
    levels: dict[int, int] = {}
    for summary in shown:
        levels[summary.level] = levels.get(summary.level, 0) + 1
    stats = RenderStats(
        head_tokens=head_tokens, summary_tokens=summary_tokens,
        middle_raw_tokens=spent - head_tokens - tail_tokens - summary_tokens, tail_tokens=tail_tokens,
        summaries=tuple(sorted(levels.items())),
        pending_units=pending_units,
        dropped_ids=dropped,
        dropped_reason=(f"{len(dropped)} message(s) left out that no shown summary covers, within the budget "
                        f"({usable:,} tokens): {debt} not compressed yet (tick or wait_ready), "
                        f"{len(dropped) - debt} whose summaries, pins or recent window didn't fit (raise the "
                        f"budget, or lower recent_window_tokens)") if dropped else None,
    )
    # In sequence order (a stable sort: on a tie, summaries before raw messages, as they cover
    # what follows): shown summaries, the kept middle's and the recent window's runs, pins.
    singles: list[tuple[int, list[Entry]]] = [
        *((summary.first_sequence, list(made.summary(summary, leaves(summary)))) for summary in shown),
        *pinned_entries]
    items: list[tuple[int, list[Entry] | tuple[int, int]]] = [
        *singles[: len(shown)], *_runs_apart([*kept_runs, *recent_runs], messages, singles), *singles[len(shown) :]]
    items.sort(key=itemgetter(0))
    entries = entries_head  # extended in place: the head's entries come first
    live_at = [index for index in head.live if index < shown_head]
    placed: list[tuple[int, list[Entry], tuple[int, int] | None]] = []  # where each item's entries went
    for _, item in items:
        at = len(entries)
        if isinstance(item, tuple):  # a run of the view, from the windows zones keeps
            start, stop = item
            group = zones.entries(messages, view, start, stop)
            entries += group
            live_at += [at + index for index in zones.live(messages, start, stop, group)]
            placed.append((at, group, item))
        else:
            entries += item
            live_at += [at + index for index, entry in enumerate(item) if holds_live_blocks(entry)]
            placed.append((at, item, None))
    if entries and not entries[-1].cache_marker:
        # P9: the tail carries a breakpoint too, so the next compile reads everything up to
        # this one's newest message from the provider's cache. P5's cap of 3 keeps the head
        # window's end (the first), the latest summary seam and this tail (the last two).
        entries[-1] = made.marked(entries[-1])
    if live_at:  # the depths after entries, by pieces: a kept run's from its running totals
        pieces: list[Piece] = [(index, loose(entries[index])) for index in range(shown_head)]
        for at, group, run in placed:
            if run is None:
                pieces += [(at + index, loose(entry)) for index, entry in enumerate(group)]
            else:
                pieces += [(at + offset, after) for offset, after in zones.depths(messages, run[0], run[1], group)]
        depths = JoinedDepths(pieces, live.image_strip_depth_tokens)
        entries = apply_live_policy_at(entries, live_at, depths.after, live, live_memo)
    zones.trim(messages)  # after the depths were read
    return Selection(entries, head_tokens, spent - head_tokens - tail_tokens, tail_tokens, spent, stats)


def _pinned(ranges: Sequence[tuple[int, int]], sequence: int) -> bool:
    return any(first <= sequence <= last for first, last in ranges)


def _runs_apart(runs: Runs, messages: Sequence[Message], singles: Sequence[tuple[int, list[Entry]]]
                ) -> list[tuple[int, tuple[int, int]]]:
    """``runs`` of ``messages`` keyed for the sort by their first sequence, each cut into single
    messages where a single item's key falls inside it (a summary whose range holds a raw
    message, say), so sorting runs orders entries as sorting every message would."""
    keys = sorted(key for key, _ in singles)
    out: list[tuple[int, tuple[int, int]]] = []
    for start, stop in runs:
        first, last = messages[start].sequence, messages[stop - 1].sequence
        at = bisect_right(keys, first)
        if at < len(keys) and keys[at] <= last:
            out += [(messages[index].sequence, (index, index + 1)) for index in range(start, stop)]
        else:
            out.append((first, (start, stop)))
    return out
