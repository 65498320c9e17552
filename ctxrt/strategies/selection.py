"""Autobiographical memory's selection: which summaries and raw messages a compile shows within
its budget, and what it reports left out (docs/behaviours.md T5, T6, P6, P9).

A pure function of the view's messages, the zones, the pins and the summary frontier, apart
from the strategy's state and its compression work, so a compile's choices can be checked
without a strategy, a store or an event loop. How level-1 summaries share their budget is the
compression policy's choice (``choose_l1``); ``choose`` is the plain one. With adaptive resolution
(docs/behaviours.md T10) a ``MiddleFolder`` the strategy hands in chooses the middle's summaries
instead (a fold: strategies/folding.py), and the rest is as without it.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple

import attrs

from ..budget import Entry
from ..content.blocks import Message, Text, sequence_key
from .base import Pin, RenderStats
from .coverage import Coverage, RunIds, Runs, count_outside, covers, gaps, union
from .live import JoinedDepths, LiveMemo, LiveOptions, Piece, apply_live_policy_at, holds_live_blocks, loose
from .records import Summary
from .shown_entries import ShownEntries
from .zones import Head, Zones

if TYPE_CHECKING:
    from ..views import MessageView

logger = logging.getLogger("ctxrt.autobiographical")

SUMMARY_HEADER_TOKENS = 20  # what a shown summary's recall header and turn cost besides its text
LEVEL_BUDGET_TOKENS = 30000  # per-level summary budgets (levels 1, 2 and 3)

Price = Callable[[Summary], int]
Chooser = Callable[[list[Summary], int, Price], list[Summary]]
LevelBudgets = tuple[int | None, int | None, int | None]  # levels 1, 2 and 3; None: LEVEL_BUDGET_TOKENS


class Folded(NamedTuple):
    """The middle's summaries a fold shows (``shown``, costing ``tokens``), the tokens past the
    allowance the middle may take (``grace``: within a refusing strategy's grace) and the
    strategy's own record of the fold (handed back in ``Selection.fold``)."""

    shown: list[Summary]
    tokens: int
    grace: int
    fold: object


MiddleFolder = Callable[[Sequence[Message], Runs, Sequence[int], Callable[[int], int], int], Folded]
"""Adaptive resolution (docs/behaviours.md T10): given the view's messages, the middle's runs,
the pinned indices (shown apart), what each message costs shown raw and the middle's allowance,
the summaries the middle shows; its uncovered messages are shown raw, newest first, within the
allowance and the grace."""


@attrs.frozen
class Selection:
    """What a compile shows (the live policy applied) and what it costs, by zone."""

    entries: list[Entry]
    head_tokens: int
    middle_tokens: int
    tail_tokens: int
    total_tokens: int
    stats: RenderStats
    fold: object = None  # the ``MiddleFolder``'s record, if one chose the middle


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
    opened: list[Summary] = []
    stack = list(frontier)
    while stack:
        summary = stack.pop()
        too_deep = any(pin.level is not None and summary.level > pin.level and summary.first_sequence
                       <= pin.last_sequence and pin.first_sequence <= summary.last_sequence for pin in level_pins)
        if too_deep and children.get(summary.id):
            stack.extend(children[summary.id])
        else:
            opened.append(summary)
    return opened


def select(
    messages: Sequence[Message], view: MessageView, usable: int, *, made: ShownEntries, zones: Zones,
    head_start_id: str | None, pins: Sequence[Pin], frontier: Sequence[Summary],
    leaves: Callable[[Summary], tuple[str, ...]], price: Price, choose_l1: Chooser, pending_units: int,
    coverage: Coverage, stamp: object, live: LiveOptions, live_memo: LiveMemo,
    level_budgets: LevelBudgets | None = None, folder: MiddleFolder | None = None,
) -> Selection:
    """The head window, pinned raw ranges, the recent window, and in the middle the ``frontier``
    summaries that fit (level budgets, the newest history first) and the uncovered messages that
    fit (newest first); every message of the view is shown, covered or reported (no silent drops).
    Entries come from ``made`` and ``zones``, the same objects for what is unchanged since an
    earlier compile, and the live policy has been applied to them.

    The zones take the budget in that order, each what is left by those before it: ``_head``,
    ``_pins``, ``_recent``, then the middle's ``_summaries`` and ``_uncovered``; ``_report`` says
    what none of them shows, ``_assemble`` lays the entries out in sequence order and
    ``_live_policy`` applies the live policy to them. With a ``folder`` (adaptive resolution) the
    fold chooses the middle's summaries instead of ``_summaries``; ``level_budgets``: see ``_summaries``."""
    head = _head(messages, view, usable, made, zones, head_start_id)
    pinned = _pins(messages, view, pins, made, head.shown, usable - head.tokens)
    recent = _recent(messages, view, zones, head.window.end, usable - head.tokens - pinned.tokens, pinned.at)
    spent = head.tokens + pinned.tokens + recent.tokens
    if pinned.ranges:  # a summary of pinned messages alone adds nothing: they are shown raw
        frontier = [s for s in frontier if not all(_pinned(pinned.ranges, int(leaf)) for leaf in leaves(s))]
    middle = [(0, head.window.start), (head.window.end, recent.start)]
    if folder is None:
        shown, summary_tokens = _summaries(frontier, usable - spent, price, choose_l1, level_budgets)
        grace, fold = 0, None
    else:
        shown, summary_tokens, grace, fold = folder(
            messages, middle, pinned.at, lambda index: made.raw(messages[index], view.estimate_tokens)[1], usable - spent)
    spent += summary_tokens
    covered = coverage.runs(shown, messages, stamp, leaves, view.changes)
    kept = _uncovered(messages, view, zones, covered, middle, usable - spent + grace, pinned.at)
    spent += kept.tokens
    gone = _gone(len(messages), head, pinned, recent, covered, middle, kept)
    dropped, reason = _report(messages, gone, pinned.at, usable,
                              lambda: coverage.runs(frontier, messages, stamp, leaves, view.changes))
    stats = RenderStats(
        head_tokens=head.tokens, summary_tokens=summary_tokens, middle_raw_tokens=pinned.tokens + kept.tokens,
        tail_tokens=recent.tokens, summaries=_levels(shown), pending_units=pending_units, dropped_ids=dropped,
        dropped_reason=reason,
    )
    entries, live_at, placed = _assemble(messages, view, made, zones, leaves, head, pinned, shown, [*kept.runs, *recent.runs])
    if live_at:
        entries = _live_policy(messages, zones, entries, head.fits, live_at, placed, live, live_memo)
    zones.trim(messages)  # after the depths were read
    return Selection(entries, head.tokens, spent - head.tokens - recent.tokens, recent.tokens, spent, stats, fold)


class _HeadShown(NamedTuple):
    """The head window, and what of it fits: its first ``fits`` messages (``shown``), their
    entries (the last marked: the head window's end is a cache breakpoint) and ``tokens``."""

    window: Head
    fits: int
    entries: list[Entry]
    tokens: int

    @property
    def shown(self) -> range:
        return range(self.window.start, self.window.start + self.fits)


def _head(messages: Sequence[Message], view: MessageView, usable: int, made: ShownEntries, zones: Zones,
          start_id: str | None) -> _HeadShown:
    """The head window's messages that fit, oldest first (T5, T6)."""
    window = zones.head(messages, view, start_id)
    fits = bisect_right(window.totals, usable) - 1
    entries = window.entries[:fits]
    if entries:
        entries[-1] = made.marked(entries[-1])
    return _HeadShown(window, fits, entries, window.totals[fits])


class _Pinned(NamedTuple):
    """Pinned raw ranges outside the head's shown messages: the pins' ``ranges`` (sequences), the
    indices pinned (``at``, ascending), those shown (what fits with the pins before it), each
    shown one's entry by its sequence, and their ``tokens``."""

    ranges: list[tuple[int, int]]
    at: list[int]
    shown: list[int]
    entries: list[tuple[int, list[Entry]]]
    tokens: int


def _pins(messages: Sequence[Message], view: MessageView, pins: Sequence[Pin], made: ShownEntries, head: range,
          allowance: int) -> _Pinned:
    """Pinned raw ranges outside the head come next, whatever the pressure, oldest first."""
    ranges = [(pin.first_sequence, pin.last_sequence) for pin in pins if pin.level is None]
    at: list[int] = []
    for low, high in union([(bisect_left(messages, first, key=sequence_key), bisect_right(messages, last, key=sequence_key))
                            for first, last in ranges]):
        at += [index for index in range(low, high) if index not in head]
    shown: list[int] = []
    entries: list[tuple[int, list[Entry]]] = []
    tokens = 0
    for index in at:
        entry, cost = made.raw(messages[index], view.estimate_tokens)
        if tokens + cost <= allowance:
            entries.append((messages[index].sequence, [entry]))
            shown.append(index)
            tokens += cost
    return _Pinned(ranges, at, shown, entries, tokens)


class _Recent(NamedTuple):
    """The recent window: its ``start`` (where the middle ends), the ``runs`` it shows (pinned
    messages aside), the oldest index it shows (``shown_from``) and their ``tokens``."""

    start: int
    runs: Runs
    shown_from: int
    tokens: int


def _recent(messages: Sequence[Message], view: MessageView, zones: Zones, head_end: int, allowance: int,
            pinned: list[int]) -> _Recent:
    """The recent window: evicted newest-first within ``allowance``, emitted chronologically."""
    start = zones.recent_start(messages, view, head_end)
    runs, tokens = zones.take(messages, view, [(start, len(messages))], allowance, pinned)
    return _Recent(start, runs, runs[0][0] if runs else len(messages), tokens)


def _summaries(frontier: Sequence[Summary], allowance: int, price: Price, choose_l1: Chooser,
               level_budgets: LevelBudgets | None = None) -> tuple[list[Summary], int]:
    """The middle's shown summaries (anti-redundant: the ``frontier``) within ``allowance``, and
    their tokens: each level within its budget and what the level before it left of its own.
    Without ``level_budgets``, 30,000 tokens a level, level 1 first (the newest history first:
    under pressure the oldest summaries go). With them (``l1_budget_tokens`` and the others, any
    None standing for 30,000), as the reference library's waterfall: level 3 first, what it
    leaves carrying to level 2, then to level 1."""
    shown: list[Summary] = []
    spent = carry = 0
    budgets = dict(zip((1, 2, 3), (LEVEL_BUDGET_TOKENS if b is None else b for b in level_budgets or (None,) * 3)))
    for level in (3, 2, 1) if level_budgets is not None else (1, 2, 3):
        budget = min(budgets[level] + carry, allowance - spent)
        candidates = sorted((s for s in frontier if s.level == level), key=lambda s: s.first_sequence)
        chosen = choose_l1(candidates, budget, price) if level == 1 else choose(candidates, budget, price)
        cost = sum(price(summary) for summary in chosen)
        shown += chosen
        spent += cost
        carry = max(0, budget - cost)
    return shown, spent


class _Kept(NamedTuple):
    """The middle's uncovered messages (``uncovered`` runs), the ``runs`` of them kept raw and their ``tokens``."""

    uncovered: Runs
    runs: Runs
    tokens: int


def _uncovered(messages: Sequence[Message], view: MessageView, zones: Zones, covered: Runs, middle: Runs,
               allowance: int, pinned: list[int]) -> _Kept:
    """The middle is [0, head start) (before a reset head, T6) and [head end, recent start); its
    uncovered messages, newest first, are compression debt: keep the newest raw that fit."""
    uncovered = [run for low, high in middle for run in gaps(covered, low, high)]
    runs, tokens = zones.take(messages, view, uncovered, allowance, pinned)
    left = sum(stop - start for start, stop in uncovered) - sum(stop - start for start, stop in runs)
    left -= sum(1 for index in pinned if covers(uncovered, index))
    if left:
        logger.info("compression debt: %d uncovered middle message(s) left out of the compile", left)
    return _Kept(uncovered, runs, tokens)


def _gone(count: int, head: _HeadShown, pinned: _Pinned, recent: _Recent, covered: Runs, middle: Runs,
          kept: _Kept) -> Runs:
    """The runs of the view neither shown raw nor covered by a shown summary. Shown raw: the
    head's run, the recent window's and the kept middle's (pinned messages aside: shown only if
    they fit with the pins)."""
    kept_from = kept.runs[0][0] if kept.runs else None  # the oldest kept index
    raw = [(head.shown.start, head.shown.stop), (recent.shown_from, count), *((index, index + 1) for index in pinned.shown)]
    if kept_from is not None:
        raw += [(max(kept_from, low), high) for low, high in middle if high > kept_from]
    gone = gaps(union([*covered, *raw]), 0, count)
    if len(pinned.shown) < len(pinned.at):
        left_out = set(pinned.at).difference(pinned.shown)
        gone = union([*gone, *((index, index + 1) for index in sorted(left_out) if not covers(covered, index))])
    return gone


def _report(messages: Sequence[Message], gone: Runs, pinned: list[int], usable: int,
            summarised: Callable[[], Runs]) -> tuple[RunIds, str | None]:
    """No silent drops: the messages ``gone``, and why: not compressed yet (no summary of the
    frontier, ``summarised()``, covers them), or their summaries, pins or recent window didn't fit."""
    dropped = RunIds(messages, gone)
    if not dropped:
        return dropped, None
    covering = summarised()
    debt = sum(count_outside(covering, start, stop) for start, stop in gone)
    debt -= sum(1 for index in pinned if covers(gone, index) and not covers(covering, index))
    return dropped, (f"{len(dropped)} message(s) left out that no shown summary covers, within the budget "
                     f"({usable:,} tokens): {debt} not compressed yet (tick or wait_ready), "
                     f"{len(dropped) - debt} whose summaries, pins or recent window didn't fit (raise the "
                     f"budget, or lower recent_window_tokens)")


def _levels(shown: list[Summary]) -> tuple[tuple[int, int], ...]:
    """How many summaries of each level are shown, by level."""
    levels: dict[int, int] = {}
    for summary in shown:
        levels[summary.level] = levels.get(summary.level, 0) + 1
    return tuple(sorted(levels.items()))


Placed = list[tuple[int, list[Entry], tuple[int, int] | None]]  # where each item's entries went, and its run if a run


def _assemble(messages: Sequence[Message], view: MessageView, made: ShownEntries, zones: Zones,
              leaves: Callable[[Summary], tuple[str, ...]], head: _HeadShown, pinned: _Pinned, shown: list[Summary],
              runs: Runs) -> tuple[list[Entry], list[int], Placed]:
    """The entries in sequence order: the head's first, then (a stable sort: on a tie, summaries
    before raw messages, as they cover what follows) shown summaries, the kept middle's and the
    recent window's ``runs``, pins; the last one marked. With which entries the live policy may
    change and where each item's entries went."""
    singles: list[tuple[int, list[Entry]]] = [
        *((summary.first_sequence, list(made.summary(summary, leaves(summary)))) for summary in shown),
        *pinned.entries]
    items: list[tuple[int, list[Entry] | tuple[int, int]]] = [
        *singles[: len(shown)], *_runs_apart(runs, messages, singles), *singles[len(shown) :]]
    items.sort(key=itemgetter(0))
    entries = head.entries  # extended in place: the head's entries come first
    live_at = [index for index in head.window.live if index < head.fits]
    placed: Placed = []
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
    return entries, live_at, placed


def _live_policy(messages: Sequence[Message], zones: Zones, entries: list[Entry], head_fits: int, live_at: list[int],
                 placed: Placed, live: LiveOptions, live_memo: LiveMemo) -> list[Entry]:
    """``entries`` with the live policy applied at ``live_at``, by the depths after each, read by
    pieces: a kept run's from its running totals, any other entry estimated when asked."""
    pieces: list[Piece] = [(index, loose(entries[index])) for index in range(head_fits)]
    for at, group, run in placed:
        if run is None:
            pieces += [(at + index, loose(entry)) for index, entry in enumerate(group)]
        else:
            pieces += [(at + offset, after) for offset, after in zones.depths(messages, run[0], run[1], group)]
    depths = JoinedDepths(pieces, live.image_strip_depth_tokens)
    return apply_live_policy_at(entries, live_at, depths.after, live, live_memo)


def _pinned(ranges: Sequence[tuple[int, int]], sequence: int) -> bool:
    return any(first <= sequence <= last for first, last in ranges)


def _runs_apart(runs: Runs, messages: Sequence[Message], singles: Sequence[tuple[int, list[Entry]]]
                ) -> list[tuple[int, tuple[int, int]]]:
    """``runs`` of ``messages`` keyed for the sort by their first sequence, each cut into single
    messages where a single item's key falls inside it (a summary whose range holds a raw
    message, say), so sorting runs orders entries as sorting every message would."""
    keys = sorted(key for key, _ in singles)
    keyed: list[tuple[int, tuple[int, int]]] = []
    for start, stop in runs:
        first, last = messages[start].sequence, messages[stop - 1].sequence
        at = bisect_right(keys, first)
        if at < len(keys) and keys[at] <= last:
            keyed += [(messages[index].sequence, (index, index + 1)) for index in range(start, stop)]
        else:
            keyed.append((first, (start, stop)))
    return keyed
