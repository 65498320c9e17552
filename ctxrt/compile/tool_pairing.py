"""Tool pairing (P4): mixed tool messages split, unanswered calls and unasked results dropped.

The Messages API wants each tool_use answered in the next message and each tool_result
asked in the previous one, and tool_results only in "user" turns. These pure functions of
compiled messages hold that rule on their own, apart from the pipeline that calls them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..content.blocks import Block, CompiledMessage, ToolResult, ToolUse

ToolIds = tuple[frozenset[str], frozenset[str]]  # (tool_use ids, tool_result ids) of one message


def split_mixed_tool_messages(participant: str, content: Sequence[Block]) -> list[tuple[str, tuple[Block, ...]]]:
    """Split a non-"user" message holding tool_results: each run of tool_results becomes a "user" part.

    Blocks before and after a run stay with ``participant``, in order.
    """
    if participant.lower() == "user" or not any(type(b) is ToolResult for b in content):
        return [(participant, tuple(content))]
    parts: list[tuple[str, tuple[Block, ...]]] = []
    run: list[Block] = []
    run_is_results = False
    for block in content:
        is_result = type(block) is ToolResult
        if run and is_result != run_is_results:
            parts.append(("user" if run_is_results else participant, tuple(run)))
            run = []
        run.append(block)
        run_is_results = is_result
    parts.append(("user" if run_is_results else participant, tuple(run)))
    return parts


def tool_ids(message: CompiledMessage) -> ToolIds | None:
    """(tool_use ids, tool_result ids) of a message, or None if it holds no tool block."""
    if not any(type(b) is ToolUse or type(b) is ToolResult for b in message.content):
        return None
    uses = frozenset(b.id for b in message.content if type(b) is ToolUse)
    results = frozenset(b.tool_use_id for b in message.content if type(b) is ToolResult)
    return (uses, results) if uses or results else None


_NO_TOOLS: ToolIds = (frozenset(), frozenset())


def repair_with_origins(
    messages: Sequence[CompiledMessage], tools: Sequence[ToolIds | None] | None = None
) -> tuple[list[CompiledMessage], list[int]]:
    """``repair_tool_pairing``, with the index in ``messages`` each kept message came from.

    ``tools`` (parallel to ``messages``, from ``tool_ids``) spares recomputing what a memo knows.
    """
    if tools is None:
        tools = [tool_ids(m) for m in messages]
    if not any(tools):
        return messages, range(len(messages))  # type: ignore[return-value]  # nothing to repair; callers only read them
    out: list[CompiledMessage] = []
    origins: list[int] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        own = tools[i]
        if own is None:
            out.append(message)
            origins.append(i)
            continue
        answered = (tools[i + 1] or _NO_TOOLS)[1] if i < last else frozenset()
        asked = (tools[i - 1] or _NO_TOOLS)[0] if i > 0 else frozenset()
        if own[0] <= answered and own[1] <= asked:
            out.append(message)
            origins.append(i)
            continue
        kept = tuple(
            b
            for b in message.content
            if not (type(b) is ToolUse and b.id not in answered)
            and not (type(b) is ToolResult and b.tool_use_id not in asked)
        )
        if not kept:
            if message.cache_breakpoint and out:  # the cached prefix still ends here
                out[-1] = attrs.evolve(out[-1], cache_breakpoint=True)
            continue
        out.append(attrs.evolve(message, content=kept))
        origins.append(i)
    return out, origins


def repair_tool_pairing(messages: Sequence[CompiledMessage]) -> list[CompiledMessage]:
    """Drop every tool_use not answered in the next message and every tool_result not asked in the previous one (P4).

    A message left empty is dropped (its cache breakpoint moves to the message before it).
    Kept pairs stay adjacent: both halves of a pair keep each other.
    """
    return repair_with_origins(messages)[0]
