"""Autobiographical memory's selection: which summaries and raw messages a compile shows within
its budget, and what it reports left out (docs/behaviours.md T5, T6, P6, P9).

A pure function of the view's messages, the zones, the pins and the summary frontier, apart
from the strategy's state and its compression work, so a compile's choices can be checked
without a strategy, a store or an event loop. How level-1 summaries share their budget is the
compression policy's choice (``choose_l1``); ``choose`` is the plain one.
"""

from __future__ import annotations

import logging
from itertools import chain
from operator import attrgetter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry
from ..content import Message, Text
from .base import Pin, RenderStats
from .coverage import Coverage, count_outside, covers, gaps, outside, union
from .records import Summary
from .shown_entries import ShownEntries

if TYPE_CHECKING:
    from ..views import MessageView

logger = logging.getLogger("ctxrt.autobiographical")

SUMMARY_HEADER_TOKENS = 20  # what a shown summary's recall header and turn cost besides its text
LEVEL_BUDGET_TOKENS = 30000  # per-level summary budgets (levels 1, 2 and 3)
_ID = attrgetter("id")

Price = Callable[[Summary], int]
Chooser = Callable[[list[Summary], int, Price], list[Summary]]


@attrs.frozen
class Selection:
    """What a compile shows (before the live policy) and what it costs, by zone."""

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
    messages: Sequence[Message], view: MessageView, usable: int, *, made: ShownEntries, head: tuple[int, int],
    recent_start: int, pins: Sequence[Pin], frontier: Sequence[Summary], leaves: Callable[[Summary], tuple[str, ...]],
    price: Price, choose_l1: Chooser, pending_units: int, coverage: Coverage, stamp: object,
) -> Selection:
    """The head window, pinned raw ranges, the recent window, and in the middle the ``frontier``
    summaries that fit (level budgets, the newest history first) and the uncovered messages that
    fit (newest first); every message of the view is shown, covered or reported (no silent drops).
    Entries come from ``made``, the same objects for what is unchanged since an earlier compile."""
    head_start, head_end = head
    entries_head: list[Entry] = []
    spent = 0
    for message in messages[head_start:head_end]:
        entry, cost = made.raw(message, view.estimate_tokens)
        if spent + cost > usable:
            break
        entries_head.append(entry)
        spent += cost
    if entries_head:
        entries_head[-1] = made.marked(entries_head[-1])
    head_tokens = spent
    in_head = {entry.source_ids[0] for entry in entries_head}
    # Pinned raw ranges outside the head come next, whatever the pressure, oldest first.
    raw_pins = [(pin.first_sequence, pin.last_sequence) for pin in pins if pin.level is None]

    def pinned(sequence: int) -> bool:
        return any(first <= sequence <= last for first, last in raw_pins)

    pinned_entries: list[tuple[int, list[Entry]]] = []
    pinned_at: set[int] = set()  # indices of the pinned messages outside the head
    pinned_shown: set[int] = set()
    for index in (i for i, m in enumerate(messages) if m.id not in in_head and pinned(m.sequence)) if raw_pins else ():
        pinned_at.add(index)
        entry, cost = made.raw(messages[index], view.estimate_tokens)
        if spent + cost <= usable:
            pinned_entries.append((messages[index].sequence, [entry]))
            pinned_shown.add(index)
            spent += cost
    pinned_tokens = spent - head_tokens
    # Recent window: evicted newest-first within budget, emitted chronologically.
    recent: list[tuple[int, list[Entry]]] = []
    recent_from = len(messages)  # the oldest index the recent window shows (pinned ones aside)
    for index in range(len(messages) - 1, recent_start - 1, -1):
        if index in pinned_at:
            continue  # placed with the pins
        message = messages[index]
        entry, cost = made.raw(message, view.estimate_tokens)
        if spent + cost > usable:
            break
        recent.append((message.sequence, [entry]))
        recent_from = index
        spent += cost
    tail_tokens = spent - head_tokens - pinned_tokens
    # The middle: shown summaries (anti-redundant: the frontier) and uncovered raw messages.
    frontier = [s for s in frontier if not raw_pins or not all(pinned(int(leaf)) for leaf in leaves(s))]
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
    covered = coverage.runs(shown, messages, stamp, leaves)
    middle: list[tuple[int, list[Entry]]] = []
    for summary in shown:
        middle.append((summary.first_sequence, list(made.summary(summary, leaves(summary)))))
    summary_tokens = spent - head_tokens - tail_tokens - pinned_tokens
    # The middle is [0, head_start) (before a reset head, T6) and [head_end, recent_start); its
    # uncovered messages, newest first, are compression debt: keep the newest raw that fit.
    middle_ranges = [(0, head_start), (head_end, recent_start)]
    kept: list[tuple[int, list[Entry]]] = []
    kept_from: int | None = None  # the oldest kept index
    uncovered = (index for low, high in reversed(middle_ranges) for index in outside(covered, low, high)
                 if index not in pinned_at)
    for index in uncovered:
        message = messages[index]
        entry, cost = made.raw(message, view.estimate_tokens)
        if spent + cost > usable:
            total = sum(count_outside(covered, low, high) for low, high in middle_ranges)
            total -= sum(1 for index in pinned_at if any(low <= index < high for low, high in middle_ranges)
                         and not covers(covered, index))
            logger.info("compression debt: %d uncovered middle message(s) left out of the compile", total - len(kept))
            break
        kept.append((message.sequence, [entry]))
        kept_from = index
        spent += cost
    # No silent drops: every message of the view is shown raw or covered by a shown summary,
    # or it is reported, with why. Shown raw: the head's run, the recent window's and the kept
    # middle's (pinned messages aside: shown only if they fit with the pins).
    raw_runs = [(head_start, head_start + len(entries_head)), (recent_from, len(messages))]
    if kept_from is not None:
        raw_runs += [(max(kept_from, low), high) for low, high in middle_ranges if high > kept_from]
    raw_runs = union(raw_runs)
    gone = gaps(union([*covered, *raw_runs]), 0, len(messages))
    if pinned_at:  # pinned messages are shown only if they fit with the pins
        indices = {index for start, stop in gone for index in range(start, stop)}
        indices -= pinned_shown
        indices |= {index for index in pinned_at - pinned_shown if not covers(covered, index)}
        gone = union([(index, index + 1) for index in indices])
    dropped = tuple(chain.from_iterable(map(_ID, messages[start:stop]) for start, stop in gone))
    debt = 0
    if dropped:
        summarised = coverage.runs(frontier, messages, stamp, leaves)
        debt = sum(count_outside(summarised, start, stop) for start, stop in gone)
        debt -= sum(1 for index in pinned_at if any(a <= index < b for a, b in gone) and not covers(summarised, index))
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
    middle += kept + pinned_entries + recent
    middle.sort(key=lambda item: item[0])
    entries = entries_head + [entry for _, group in middle for entry in group]
    if entries and not entries[-1].cache_marker:
        # P9: the tail carries a breakpoint too, so the next compile reads everything up to
        # this one's newest message from the provider's cache. P5's cap of 3 keeps the head
        # window's end (the first), the latest summary seam and this tail (the last two).
        entries[-1] = made.marked(entries[-1])
    return Selection(entries, head_tokens, spent - head_tokens - tail_tokens, tail_tokens, spent, stats)
