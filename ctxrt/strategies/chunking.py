"""Autobiographical memory's zones and chunking: where the head window lies in a reader's view
(the recent window's bounds are kept in zones.py), and how the compressible middle closes into
chunks (docs/behaviours.md T3, T5, T6).

Pure functions over a view's messages, apart from the strategy's state, so the chunk boundaries
(which are persisted and must stay stable across restarts) can be checked without a strategy or
an event loop. When a chunk may close is a ``ChunkRule`` the compression policy makes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..content.blocks import Message, ToolUse, has_block, sequence_key
from .records import Chunk

if TYPE_CHECKING:
    from ..views import MessageView

MIN_CHUNK_MESSAGES = 4

ChunkRule = Callable[[Sequence[Message], int, Message | None], bool]
"""Whether the chunk ``pending`` (of ``tokens`` tokens) closes at its last message, ``following``
coming next (None at the end of the frontier). One rule serves one frontier walk: it is asked
once for each message, in order, as ``pending`` grows, so it may carry state along the walk. A
chunk never closes right after a tool_use whatever the rule says."""


def closes_at_target(target_chunk_tokens: int) -> ChunkRule:
    """The plain rule: a chunk closes at ``target_chunk_tokens`` with at least 4 messages."""

    def closes(pending: Sequence[Message], tokens: int, following: Message | None) -> bool:
        return tokens >= target_chunk_tokens and len(pending) >= MIN_CHUNK_MESSAGES

    return closes


Boundary = Callable[[Message, Message, Sequence[Message]], bool]
"""A host's ``chunk_boundary(previous, next, chunk)``: whether the chunk ``chunk`` (ending with
``previous``) closes before ``next``, at a topic change say. Pure."""


def with_boundary(rule: ChunkRule, boundary: Boundary | None,
                  raised: Callable[[Message, Exception], None]) -> ChunkRule:
    """``rule``, and a chunk of at least 4 messages closes too where ``boundary`` says so. A
    boundary that raises is taken as False (``raised`` hears of it): a host's bug never stops
    the namespace or its chunking."""
    if boundary is None:
        return rule

    def closes(pending: Sequence[Message], tokens: int, following: Message | None) -> bool:
        if rule(pending, tokens, following):  # asked first, always: a rule may carry state along the walk
            return True
        if following is None or len(pending) < MIN_CHUNK_MESSAGES:
            return False
        try:
            return bool(boundary(pending[-1], following, tuple(pending)))
        except Exception as exc:  # noqa: BLE001 - the host's function: reported, taken as no boundary
            raised(pending[-1], exc)
            return False

    return closes


def head_window(
    messages: Sequence[Message], view: MessageView, head_start_id: str | None, window_tokens: int
) -> tuple[int, int]:
    """The head window's ``[start, end)`` in ``messages``: from the head-window reset's message
    (T6) or the first, as many as fit in ``window_tokens``, not ending on a tool_use."""
    start = 0
    if head_start_id is not None:
        index = view.index_of(head_start_id)
        start = index if index is not None else 0
    if window_tokens <= 0:
        return start, start
    total, end = 0, start
    while end < len(messages) and total + view.estimate_tokens(messages[end]) <= window_tokens:
        total += view.estimate_tokens(messages[end])
        end += 1
    if end > start and end < len(messages) and has_block(messages[end - 1], ToolUse):
        end -= 1  # don't split a tool pair at the head's edge
    return start, end


def walk(
    frontier: Sequence[Message], view: MessageView, rule: ChunkRule, *, seam: bool, number: int
) -> list[Chunk]:
    """The chunks ``frontier`` closes into under ``rule``, the first numbered ``number``; with
    ``seam``, its remainder closes too (nothing more can join it)."""
    closed: list[Chunk] = []
    pending: list[Message] = []
    tokens = 0
    for index, message in enumerate(frontier):
        pending.append(message)
        tokens += view.estimate_tokens(message)
        following = frontier[index + 1] if index + 1 < len(frontier) else None
        closes = rule(pending, tokens, following) and not has_block(message, ToolUse)
        if closes or (seam and following is None):
            closed.append(Chunk(f"c-{number + len(closed)}", tuple(m.id for m in pending), pending[0].sequence,
                                pending[-1].sequence))
            pending, tokens = [], 0
    return closed


def closing(
    messages: Sequence[Message], view: MessageView, *, closed: Sequence[Chunk], head: tuple[int, int], end: int,
    rule: Callable[[], ChunkRule],
) -> list[Chunk]:
    """The chunks that close now after ``closed``, oldest first, below ``end`` (the recent window
    and the earliest held message, T5); ``rule()`` makes a fresh rule for each walk.

    The compressible zone is ``[0, head_start) + [head_end, end)``: after a head-window reset
    (T6) the stretch before the transition message is compressed too; its remainder closes at
    the head's edge, an ownership seam nothing more can join.
    """
    head_start, head_end = head
    last = closed[-1].last_sequence if closed else 0
    start = bisect_left(messages, last + 1, key=sequence_key)
    found: list[Chunk] = []
    if start < head_start < head_end and end >= head_start:
        found += walk(messages[start:head_start], view, rule(), seam=True, number=len(closed))
        if found:
            start = bisect_left(messages, found[-1].last_sequence + 1, key=sequence_key)
    if start >= head_start:
        start = max(start, head_end)
    found += walk(messages[start:end], view, rule(), seam=False, number=len(closed) + len(found))
    return found
