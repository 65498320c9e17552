"""The middle as adaptive resolution sees it (docs/behaviours.md T10): which persisted chunks a
fold may show at a level, what each costs raw, and the summaries over runs of them.

Apart from the strategy so the fold's input is a plain function of the view's messages, the
chunks, the summaries and the pins, and from ``folding`` so the solver stays numbers in, numbers
out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence

import attrs

from ..content.blocks import Message, sequence_key
from .base import Pin
from .coverage import Runs
from .folding import FoldProblem, Node
from .records import Chunk, Summary


@attrs.frozen
class MiddleFold:
    """The middle's foldable ``chunks`` (oldest first), the ``problem`` ``folding.solve`` takes, and
    its summary ``nodes`` (chunk indices into ``chunks``)."""

    chunks: list[Chunk]
    problem: FoldProblem
    nodes: list[Node]


def fold_problem(messages: Sequence[Message], middle: Runs, pinned: Sequence[int], cost: Callable[[int], int], *,
                 chunks: Sequence[Chunk], summaries: Sequence[Summary], pins: Sequence[Pin],
                 price: Callable[[Summary], int]) -> MiddleFold:
    """The middle's chunks wholly inside ``middle`` with no pinned message, each one's raw tokens
    (its own messages, at ``cost`` by index), the summaries over runs of them (a level pin keeps
    those above its level out) and the fixed tokens of the middle's other unpinned messages."""
    held = sorted(pinned)
    foldable, raw, inside = _foldable(messages, middle, held, cost, chunks)
    inside.update(held)
    fixed = sum(cost(index) for start, stop in middle for index in range(start, stop) if index not in inside)
    nodes = _nodes(foldable, summaries, pins, price)
    return MiddleFold(foldable, FoldProblem(tuple(raw), tuple(nodes), fixed), nodes)


def _foldable(messages: Sequence[Message], middle: Runs, held: list[int], cost: Callable[[int], int],
              chunks: Sequence[Chunk]) -> tuple[list[Chunk], list[int], set[int]]:
    """The chunks wholly in the middle holding no pinned index, their raw tokens and their indices."""
    found_chunks: list[Chunk] = []
    raw: list[int] = []
    inside: set[int] = set()
    for chunk in chunks:
        low = bisect_left(messages, chunk.first_sequence, key=sequence_key)
        high = bisect_left(messages, chunk.last_sequence + 1, key=sequence_key)
        if low >= high or not any(start <= low and high <= stop for start, stop in middle):
            continue
        at = bisect_left(held, low)
        if at < len(held) and held[at] < high:
            continue
        own = set(chunk.message_ids)
        found = [index for index in range(low, high) if messages[index].id in own]
        found_chunks.append(chunk)
        raw.append(sum(cost(index) for index in found))
        inside.update(found)
    return found_chunks, raw, inside


def _nodes(chunks: Sequence[Chunk], summaries: Sequence[Summary], pins: Sequence[Pin],
           price: Callable[[Summary], int]) -> list[Node]:
    """The summaries over contiguous runs of ``chunks``: a level-1 summary over its chunk, a higher
    one over the joined runs of its children; those above a level pin they overlap left out."""
    index_of = {chunk.message_ids: at for at, chunk in enumerate(chunks)}
    spans: dict[str, tuple[int, int]] = {}
    nodes: list[Node] = []
    level_pins = [pin for pin in pins if pin.level is not None]
    for summary in summaries:  # children before their parents: the log's order
        span = _span(summary, index_of, spans)
        if span is None:
            continue
        spans[summary.id] = span
        if not any(pin.level is not None and summary.level > pin.level and summary.first_sequence
                   <= pin.last_sequence and pin.first_sequence <= summary.last_sequence for pin in level_pins):
            nodes.append(Node(summary.id, summary.level, span[0], span[1], price(summary)))
    return nodes


def _span(summary: Summary, index_of: dict[tuple[str, ...], int],
          spans: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """The run of chunks ``summary`` covers, or None if it isn't a contiguous run of foldable ones."""
    if summary.level == 1:
        one = index_of.get(summary.source_ids)
        return None if one is None else (one, one + 1)
    parts = [spans[child] for child in summary.source_ids if child in spans]
    joined = len(parts) == len(summary.source_ids) > 0 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    return (parts[0][0], parts[-1][1]) if joined else None
