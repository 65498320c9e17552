"""Adaptive resolution: the level each chunk of the middle is shown at (docs/behaviours.md T10).

A fold gives each chunk of the middle, oldest first, a level: 0 shows it raw, k shows the
level-k summary over it (a level-k summary covers a contiguous run of chunks, all shown at k).
``solve`` picks the fold that fits an allowance with every chunk raw or covered, from the
summaries that exist (``Node``), the previous fold and the objective:

- ``"flat"``: the finest fit: from raw, fold the oldest chunks first, level 1 over the whole
  middle before any level 2, level 2 before level 3, until it fits.
- ``"kv-stable"``: the prompt cache's fit: keep the previous fold's levels for the oldest chunks
  (the longest byte-identical prefix) and re-solve only the newest stretch it must, as flat does.

Hysteresis (``slack_ratio``): a fold that fits and leaves at most ``slack_ratio`` of the
allowance is kept as it is; one that overruns gets coarser (to fit the allowance); one that leaves
more gets finer, to a fit within ``(1 - slack_ratio)`` of it, so the next few turns' growth
doesn't undo it. kv-stable gets finer only when it leaves more than half the allowance (or
``slack_ratio`` if more): a finer re-layout costs the prompt cache everything after its first
change, and folding the newest chunk frees far more than a turn adds, so a finer fold at the
slack would be undone within a few turns, each time a cache miss.

What a fold lacks (``Lack``): when even full folding can't fit, a chunk's level-1 summary and the
merges of ``merge_span`` level-(k-1) summaries into level k that would make it fit (never fewer:
level 3 never merges further, so smaller merges fragment the top level for good); when it fits
within the slack's edge (tight), the level-1 summaries only (a held-back chunk's), so the next
overrun can fold the newest chunk. A fold that can't fit shows its summaries before raw messages
(``newest_within``), as a compile without folding does.

Pure and synchronous: plain numbers in and out, no store, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

RAW = 0
TOP_LEVEL = 3
FOLDINGS = ("kv-stable", "flat")
KV_STABLE_FINER = 0.5  # kv-stable re-lays its fold finer only when it leaves more than this share unused


@attrs.frozen
class Node:
    """A summary the fold may show: ``key`` names it, at ``level`` over chunks ``[start, stop)``,
    costing ``tokens`` shown."""

    key: str
    level: int
    start: int
    stop: int
    tokens: int


@attrs.frozen
class Lack:
    """A summary the fold needs and lacks: the level-1 summary of chunk ``start`` (``level`` 1),
    or a merge into ``level`` of the level-(level-1) summaries over chunks ``[start, stop)``."""

    level: int
    start: int
    stop: int


@attrs.frozen
class Fold:
    """A fold: each chunk's level, oldest first; the summaries it shows (``shown``, oldest
    first); its ``tokens`` (fixed ones included); whether it ``fits`` the allowance; what it
    lacks (merges only when it doesn't fit and they would make it, level-1 summaries when it is
    tight too); and the tokens it would reach once what it lacks is made (``least``, a guess:
    more than the allowance when nothing can make it fit)."""

    levels: tuple[int, ...]
    shown: tuple[Node, ...]
    tokens: int
    fits: bool
    lacking: tuple[Lack, ...] = ()
    least: int = 0

    @property
    def deepest(self) -> int:
        return max(self.levels, default=RAW)


@attrs.frozen
class FoldProblem:
    """The middle to fold: each chunk's ``raw`` tokens (oldest first), the summaries that exist
    over them (``nodes``; at most one per chunk and level) and ``fixed``: what the middle shows
    raw whatever the fold (messages in no chunk)."""

    raw: tuple[int, ...]
    nodes: tuple[Node, ...] = ()
    fixed: int = 0


class _Tree:
    """The nodes by level and chunk, and the cost of a fold over a problem."""

    def __init__(self, problem: FoldProblem) -> None:
        self.problem = problem
        self.count = len(problem.raw)
        self.at: dict[int, list[Node | None]] = {level: [None] * self.count for level in range(1, TOP_LEVEL + 1)}
        for node in problem.nodes:
            if 1 <= node.level <= TOP_LEVEL and 0 <= node.start < node.stop <= self.count:
                row = self.at[node.level]
                if all(row[index] is None for index in range(node.start, node.stop)):
                    row[node.start : node.stop] = [node] * (node.stop - node.start)

    def cost(self, levels: Sequence[int], start: int = 0, stop: int | None = None) -> int:
        """The tokens ``levels`` shows for chunks ``[start, stop)`` (a valid fold's whole nodes)."""
        total, index, stop = 0, start, self.count if stop is None else stop
        while index < stop:
            level = levels[index]
            if level == RAW:
                total += self.problem.raw[index]
                index += 1
            else:
                node = self.at[level][index]
                assert node is not None
                total += node.tokens
                index = node.stop
        return total

    def shown(self, levels: Sequence[int]) -> tuple[Node, ...]:
        """The nodes a valid fold shows, oldest first."""
        shown: list[Node] = []
        for index, level in enumerate(levels):
            node = self.at[level][index] if level != RAW else None
            if node is not None and node.start == index:
                shown.append(node)
        return tuple(shown)

    def total(self, levels: Sequence[int]) -> int:
        return self.problem.fixed + self.cost(levels)

    def repaired(self, previous: Sequence[int] | None) -> list[int]:
        """``previous`` made valid over this problem: a level whose summary is gone, or whose
        summary's chunks aren't all at that level, drops a level (new chunks come in raw)."""
        levels = [min(max(int(level), RAW), TOP_LEVEL) for level in (previous or ())][: self.count]
        levels += [RAW] * (self.count - len(levels))
        for level in range(TOP_LEVEL, RAW, -1):
            row = self.at[level]
            for index in range(self.count):
                if levels[index] == level:
                    node = row[index]
                    if node is None or any(levels[j] != level for j in range(node.start, node.stop)):
                        levels[index] = level - 1
        return levels

    def boundary(self, levels: Sequence[int], at: int) -> bool:
        """Whether no node ``levels`` shows spans chunks on both sides of ``at``."""
        if at in (0, self.count) or levels[at - 1] == RAW:
            return True
        node = self.at[levels[at - 1]][at - 1]
        return node is None or node.stop <= at

    def flat(self, levels: Sequence[int], start: int, target: float) -> list[int]:
        """``levels`` up to ``start`` as they are; from ``start``, the finest fold that fits
        ``target`` (the whole fold's tokens): raw, then level 1 oldest first, then 2, then 3, a
        summary only where it costs less than what it replaces; the coarsest it can if none fits."""
        out = [*levels[:start], *([RAW] * (self.count - start))]
        total = self.total(out)
        for level in range(1, TOP_LEVEL + 1):
            row = self.at[level]
            index = start
            while index < self.count and total > target:
                node = row[index]
                if node is None or node.start < start or out[index] >= level:
                    index += 1
                    continue
                before = self.cost(out, node.start, node.stop)
                if node.tokens < before:
                    out[node.start : node.stop] = [level] * (node.stop - node.start)
                    total += node.tokens - before
                index = node.stop
            if total <= target:
                break
        return out

    def lacking(self, levels: Sequence[int], allowance: int, merge_span: int) -> tuple[tuple[Lack, ...], int]:
        """What the full fold ``levels``, which can't fit ``allowance``, lacks: each chunk's missing
        level-1 summary, and the merges of ``merge_span`` summaries that make it fit (``_plan``);
        with the tokens the plan reaches (more than ``allowance``: nothing can make it fit, and
        no merge is asked for)."""
        merges, reached = self._plan(levels, allowance, merge_span)
        return (*self.unsummarised(), *(merges if reached <= allowance else ())), reached

    def unsummarised(self) -> tuple[Lack, ...]:
        """The level-1 summaries the chunks lack."""
        return tuple(Lack(1, index, index + 1) for index in range(self.count) if self.at[1][index] is None)

    def _plan(self, levels: Sequence[int], allowance: int, merge_span: int) -> tuple[list[Lack], int]:
        """Merges that would make ``levels`` fit ``allowance``: the oldest run of ``merge_span``
        shown summaries of level 1 or 2 (none above them) first, a lacking level-1 summary
        counted as made, until it fits or none is left. Never fewer than ``merge_span``: a summary
        is permanent and level 3 never merges further, so a smaller merge would leave every
        summary above it covering less, and the top level would fill sooner and leave out more
        history over a long run than waiting for whole merges does. A made summary is guessed as
        large as its largest part (they share one target), a level-1 one as the largest made.
        Returns the merges whose parts exist
        now, and the tokens the plan reaches."""
        guess = max((node.tokens for node in self.problem.nodes), default=0)  # none made yet: none known to be large
        items: list[tuple[int, int, int, int, bool]] = []  # (level, start, stop, tokens, exists): the fold shown
        index = 0
        while index < self.count:
            level = levels[index]
            if level != RAW:
                node = self.at[level][index]
                assert node is not None
                items.append((level, node.start, node.stop, node.tokens, True))
                index = node.stop
                continue
            if self.at[1][index] is None and guess < self.problem.raw[index]:
                items.append((1, index, index + 1, guess, False))
            else:
                items.append((RAW, index, index + 1, self.problem.raw[index], True))
            index += 1
        total = self.problem.fixed + sum(item[3] for item in items)
        asked: list[Lack] = []
        at = 0
        while total > allowance:
            found = self._group(items, merge_span, max(0, at - merge_span))  # none starts before the last one's run
            if found is None:
                break
            at = found
            group = items[at : at + merge_span]
            merged = max(item[3] for item in group)
            if all(item[4] for item in group):
                asked.append(Lack(group[0][0] + 1, group[0][1], group[-1][2]))
            items[at : at + merge_span] = [(group[0][0] + 1, group[0][1], group[-1][2], merged, False)]
            total -= sum(item[3] for item in group) - merged
        return asked, total

    def _group(self, items: Sequence[tuple[int, int, int, int, bool]], merge_span: int, begin: int) -> int | None:
        """Where the oldest run of ``merge_span`` items of level 1 or 2 from ``begin`` (none before
        it, the last merge's run aside), over chunks with no summary a level above, starts in
        ``items``; None if there is none."""
        run = 0
        for at, (level, start, stop, _, _) in enumerate(items[begin:], begin):
            mergeable = level in (1, 2) and all(self.at[level + 1][chunk] is None for chunk in range(start, stop))
            run = run + 1 if mergeable and run and items[at - 1][0] == level else int(mergeable)
            if run == merge_span:
                return at - merge_span + 1
        return None


def solve(problem: FoldProblem, allowance: int, *, previous: Sequence[int] | None = None, folding: str = "kv-stable",
          slack_ratio: float = 0.1, merge_span: int = 6) -> Fold:
    """The fold of ``problem`` for ``allowance`` tokens after ``previous`` (each chunk's level in
    the last fold, oldest first, chunks past its end raw; None: no fold yet), by ``folding``'s
    objective with ``slack_ratio``'s hysteresis; merges it lacks group up to ``merge_span``
    summaries. Raises ValueError for a ``folding`` that is neither "kv-stable" nor "flat"."""
    if folding not in FOLDINGS:
        raise ValueError(f"folding must be one of {', '.join(map(repr, FOLDINGS))}, got {folding!r}")
    tree = _Tree(problem)
    kept = tree.repaired(previous)
    total = tree.total(kept)
    refined = allowance * (1 - slack_ratio)
    roomy = allowance * (1 - max(slack_ratio, KV_STABLE_FINER)) if folding == "kv-stable" else refined
    if previous is not None and roomy <= total <= allowance:
        levels = kept  # within the slack: as it was (hysteresis)
    elif folding == "flat" or previous is None:
        levels = tree.flat(kept, 0, allowance if total > allowance or previous is None else refined)
        if previous is not None and total < refined and tree.total(levels) <= total:
            levels = kept  # nothing finer fits
    elif total > allowance:
        levels = _later(tree, kept, allowance, lambda candidate: tree.total(candidate) <= allowance)
    else:
        levels = _later(tree, kept, refined,
                        lambda candidate: total < tree.total(candidate) <= refined and candidate != kept)
    total = tree.total(levels)
    fits = total <= allowance
    if fits:  # tight: the level-1 summaries it lacks, so the next overrun can fold the newest chunks
        lacking, least = tree.unsummarised() if total > refined else (), total
    else:  # the full fold: what would make it fit
        lacking, least = tree.lacking(levels, allowance, merge_span)
    return Fold(tuple(levels), tree.shown(levels), total, fits, lacking, least)


def _later(tree: _Tree, kept: list[int], target: float, better: Callable[[list[int]], bool]) -> list[int]:
    """kv-stable: the fold that keeps ``kept`` for the most chunks, oldest first, re-solving the
    rest as flat does for ``target``, that is ``better``; else ``kept`` if ``target`` is the
    refinement's (nothing finer fits) or the full fold (nothing fits)."""
    for start in range(tree.count, -1, -1):
        if tree.boundary(kept, start):
            candidate = tree.flat(kept, start, target)
            if better(candidate):
                return candidate
    overrun = tree.total(kept) > target
    return tree.flat(kept, 0, -1) if overrun else kept


def newest_within(fold: Fold, limit: int) -> tuple[Node, ...]:
    """The summaries ``fold`` shows that fit ``limit`` tokens, newest first, returned oldest
    first (all of them if the fold fits): a fold that can't fit shows its summaries before any
    raw message, as a compile without folding does, so what it leaves out is the oldest history,
    never a summary in favour of raw messages; the raw ones take what is left, newest first."""
    if fold.tokens <= limit:
        return fold.shown
    kept: list[Node] = []
    for node in reversed(fold.shown):
        if node.tokens > limit:
            break  # an older one may be smaller, but showing it would leave a newer gap
        kept.append(node)
        limit -= node.tokens
    return tuple(reversed(kept))
