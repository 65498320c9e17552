"""Per-message shaping shared by strategies: truncation to ``max_message_tokens``."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..budget import Entry
from ..content.blocks import Message, Text, ToolResult
from ..memos import IdMemo
from ..content.tokens import estimate_message
from .base import copy_entry, raw_entry

# Cut at the densest rate the estimator prices (2.3 chars a token), less room for the marker,
# so a cut message is priced as what is sent and never above its cap (a cut at 4 chars a token
# would be priced by the content-class estimator at up to 1.7x the cap: a compile could overrun).
CHARS_PER_CAPPED_TOKEN = 2.3
MARKER_TOKENS = 20
OMITTED = "[content omitted — context budget exceeded]"


def _cut(text: str, limit: int, tokens: int) -> str:
    cut = text[:limit]
    if cut and "\ud800" <= cut[-1] <= "\udbff":  # never split a surrogate pair
        cut = cut[:-1]
    return f"{cut}\n\n[truncated — original was {tokens} tokens]"


def shape(message: Message, cap: int, estimate: Callable[[Message], int] = estimate_message) -> tuple[Message, int]:
    """``message`` truncated to about ``cap`` tokens (text and string tool results; a tool
    result is cut or emptied, never removed), and what it costs as sent."""
    tokens = estimate(message)
    if cap <= 0 or tokens <= cap:
        return message, tokens
    limit = max(0, int((cap - MARKER_TOKENS) * CHARS_PER_CAPPED_TOKEN))
    blocks = []
    for block in message.content:
        if type(block) is Text and len(block.text) > limit:
            block = attrs.evolve(block, text=_cut(block.text, limit, tokens))
        elif type(block) is ToolResult and isinstance(block.content, str) and len(block.content) > limit:
            block = attrs.evolve(block, content=_cut(block.content, limit, tokens) if limit > 200 else OMITTED)
        blocks.append(block)
    shaped = attrs.evolve(message, content=tuple(blocks))
    return shaped, estimate(shaped)


def shaped_entry(
    message: Message, cap: int, estimate: Callable[[Message], int], copies: IdMemo[Message, Entry]
) -> tuple[Entry, int]:
    """``message``'s ``copy`` entry, shaped to ``cap``, and what it costs as sent."""
    shaped, cost = shape(message, cap, estimate)
    return entry_of(message, shaped, copies), cost


def entry_of(message: Message, shaped: Message, copies: IdMemo[Message, Entry]) -> Entry:
    """The ``copy`` entry of ``shaped``, what ``shape`` made of ``message``: the view's own
    (``raw_entry``) when it is ``message`` as is; a cut copy is new at each call, held by no view."""
    if shaped is message:
        return raw_entry(message, copies)
    return copy_entry(shaped)
