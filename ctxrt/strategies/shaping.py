"""Per-message shaping shared by strategies: truncation to ``max_message_tokens`` (REF §4.4)."""

from __future__ import annotations

import attrs

from ..content import Message, Text, ToolResult
from ..tokens import estimate_message

CHARS_PER_CAPPED_TOKEN = 4
OMITTED = "[content omitted — context budget exceeded]"


def _cut(text: str, limit: int, tokens: int) -> str:
    cut = text[:limit]
    if cut and "\ud800" <= cut[-1] <= "\udbff":  # never split a surrogate pair
        cut = cut[:-1]
    return f"{cut}\n\n[truncated — original was {tokens} tokens]"


def shape(message: Message, cap: int) -> tuple[Message, int]:
    """``message`` truncated to about ``cap`` tokens (text and string tool results; a tool
    result is cut or emptied, never removed), and its priced cost."""
    tokens = estimate_message(message)
    if cap <= 0 or tokens <= cap:
        return message, tokens
    limit = cap * CHARS_PER_CAPPED_TOKEN
    blocks = []
    for block in message.content:
        if type(block) is Text and len(block.text) > limit:
            block = attrs.evolve(block, text=_cut(block.text, limit, tokens))
        elif type(block) is ToolResult and isinstance(block.content, str) and len(block.content) > limit:
            block = attrs.evolve(block, content=_cut(block.content, limit, tokens) if limit > 200 else OMITTED)
        blocks.append(block)
    return attrs.evolve(message, content=tuple(blocks)), min(tokens, cap + 50)
