"""Autobiographical memory's compression queue: which units are pending and in what order, when a
unit is quarantined, and how long the drain backs off after an outage (docs/behaviours.md T4).

Pure decisions over the strategy's chunks, summaries and stored attempt counts, kept apart from
the strategy so the order of work and the quarantine rules can be read and tested on their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from .records import Chunk, Summary

MAX_ATTEMPTS = 3  # refusals and failures a unit may have before it is quarantined
RETRYABLE_STREAK_LIMIT = 12  # consecutive retryable failures that count as one attempt
BACKOFF_S = 0.5  # the drain's first wait after a retryable failure, doubling
MAX_BACKOFF_S = 60.0

logger = logging.getLogger("ctxrt.autobiographical")


def group_key(group: Sequence[Summary]) -> str:
    """The unit key (and attempts key) of a merge group: its summary ids, comma-separated."""
    return ",".join(s.id for s in group)


def l1_queue(
    pending: Iterable[Chunk], chunks: Sequence[Chunk], holdback: int, closing: Sequence[Chunk] = (), *,
    room: int | None = None,
) -> list[Chunk]:
    """The chunks waiting for an L1, oldest first: ``pending`` and ``closing`` (chunks about to
    close, counted too), less the newest ``holdback`` of all chunks, at most ``room`` of them
    (``max_speculative_l1s`` less the unmerged L1s; None: no cap)."""
    waiting = [*pending, *closing]
    every = [*chunks, *closing]
    if holdback > 0 and every:
        newest = {c.id for c in every[-holdback:]}
        waiting = [c for c in waiting if c.id not in newest]
    return waiting if room is None else waiting[:room]


def merge_group(
    unmerged: Mapping[int, Sequence[Summary]], attempts: Mapping[str, int], threshold: int, *,
    max_span: int | None = None, span: Callable[[Summary], int] = lambda summary: 0,
) -> list[Summary] | None:
    """The next group of ``threshold`` unmerged summaries of level 1, else of level 2, oldest
    first, that isn't quarantined; None if there is none.

    With ``max_span``, a group covers at most that many source messages (``span`` of each
    summary: the messages it covers; ctxrt merges up to level 3, so the reference's scaling above
    it never applies): once ``threshold`` are waiting, the longest run of at least 2 from the
    oldest that fits merges; a summary that can't open such a run stays unmerged, shown as it is."""
    sealed = sealed_summaries(attempts)
    for level in (1, 2):
        frontier = unmerged.get(level, [])
        start = 0
        while start < len(frontier):
            if frontier[start].id in sealed:
                start += 1
                continue
            group = list(frontier[start : start + threshold])
            if len(group) < threshold:
                break
            if max_span is not None:
                group = within_span(group, max_span, span)
                if len(group) < 2:
                    start += 1  # too wide to merge with its next: it stays unmerged
                    continue
            if attempts.get(group_key(group), 0) < MAX_ATTEMPTS:
                return group
            break
    return None


def sealed_summaries(attempts: Mapping[str, int]) -> set[str]:
    """The ids of the summaries no merge starts from: a quarantined group's first summary is
    sealed, it stays unmerged and later groups start after it, so one refused merge doesn't stop
    its level for good."""
    return {key.split(",")[0] for key, count in attempts.items() if count >= MAX_ATTEMPTS and "," in key}


def within_span(group: Sequence[Summary], max_span: int, span: Callable[[Summary], int]) -> list[Summary]:
    """The longest run from ``group``'s first whose spans sum to at most ``max_span``."""
    total, taken = 0, []
    for summary in group:
        total += span(summary)
        if total > max_span:
            break
        taken.append(summary)
    return taken


def attempts_from(stored: Any, where: str = "the namespace") -> dict[str, int]:
    """The ``attempts`` value read back, checked entry by entry: one this version can't read
    (not a unit's key and a whole count of at least 0: another version's, a host's bug) is logged
    at ERROR, naming ``where`` (the namespace and branch), and ignored: its unit counts from 0
    again, which is harmless (a quarantined one is tried again, and may be quarantined again)."""
    if stored is None:
        return {}
    if not isinstance(stored, dict):
        logger.error("the stored attempts %r of %s can't be read; every unit counts from 0 again", stored, where)
        return {}
    attempts: dict[str, int] = {}
    for key, count in stored.items():
        if isinstance(key, str) and type(count) is int and count >= 0:
            attempts[key] = count
        else:
            logger.error("the stored attempts %r of unit %r in %s can't be read; it counts from 0 again", count, key,
                         where)
    return attempts


def settled(key: str, compressed: Collection[str], merged: Collection[str], count: int = 0) -> bool:
    """Whether the unit ``key`` is done, so its attempts and ladder step are spent: a chunk's once
    its L1 is made (its id is in ``compressed``), a merge group's once any of its summaries is
    merged (in ``merged``), by it or by another group, so it can't be made again. A quarantined
    group (``count``) whose first summary is unmerged isn't: it seals that summary."""
    if "," not in key:
        return key in compressed
    members = key.split(",")
    if count >= MAX_ATTEMPTS and members[0] not in merged:
        return False
    return any(member in merged for member in members)


def quarantined(attempts: Mapping[str, int]) -> list[str]:
    """The keys of the units that failed ``MAX_ATTEMPTS`` times."""
    return [key for key, count in attempts.items() if count >= MAX_ATTEMPTS]


class Backoff:
    """The drain's wait after retryable model failures (an outage), doubling from ``BACKOFF_S``
    to ``MAX_BACKOFF_S``; every ``RETRYABLE_STREAK_LIMIT`` in a row count as one attempt."""

    def __init__(self) -> None:
        self.streak = 0
        self.until = 0.0  # the context's clock; 0.0: no wait

    def failed(self, now: float) -> bool:
        """Note a retryable failure at ``now``; whether it counts as an attempt."""
        self.streak += 1
        self.until = now + min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (self.streak - 1))
        return self.streak % RETRYABLE_STREAK_LIMIT == 0

    def answered(self) -> None:
        """The model answered: the streak and the wait end."""
        self.streak, self.until = 0, 0.0
