"""Compiled messages in the Anthropic Messages API's request form (docs/behaviours.md P7).

Below both ``compile`` (``CompileResult.to_anthropic``) and ``model`` (compression requests),
so neither imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from .codec import block_to_api
from .content import Block, CompiledMessage, RedactedThinking, Text, Thinking, ToolResult, ToolUse

MAX_REQUEST_CACHE_CONTROLS = 4  # the provider's limit per request
CONTINUED_TEXT = "(continued)"


def _sendable(block: Block, role: str) -> bool:
    if type(block) is Text:
        return bool(block.text.strip())  # the API refuses blank text blocks
    if type(block) is Thinking:
        # Only the assistant's own signed thinking can be replayed; the API verifies the signature.
        return role == "assistant" and bool(block.signature)
    if type(block) is RedactedThinking:
        return role == "assistant"
    return True


def _mark_cache(content: list[dict[str, Any]]) -> dict[str, Any] | None:
    for block in reversed(content):
        if block["type"] not in ("thinking", "redacted_thinking"):  # thinking can't carry cache_control
            block["cache_control"] = {"type": "ephemeral"}
            return block
    return None


def _cap_cache_controls(turns: list[dict[str, Any]], ours: list[dict[str, Any]]) -> None:
    # The provider refuses more than 4 cache_control blocks: a host's own markers on stored text
    # give way, earliest first, to the compile's breakpoints.
    marked = [b for turn in turns for b in turn["content"] if "cache_control" in b]
    excess = len(marked) - MAX_REQUEST_CACHE_CONTROLS
    for block in marked:
        if excess <= 0:
            return
        if not any(block is o for o in ours):
            del block["cache_control"]
            excess -= 1


def _api_block(block: Block, participant: str, role: str, foreign: dict[str, str]) -> dict[str, Any]:
    """One block in API form; another participant's tool call (and its result) becomes text.

    The API accepts tool_use only in the assistant's turns, so a call another resident made is
    shown as what happened rather than as a call this assistant made.
    """
    if type(block) is ToolUse and role == "user":
        call = f"{participant} called {block.name}"
        foreign[block.id] = call
        return {"type": "text", "text": f"[{call} with {_compact(block.input)}]"}
    if type(block) is ToolResult and block.tool_use_id in foreign:
        body = block.content if isinstance(block.content, str) else " ".join(
            getattr(b, "text", f"[{b.type}]") for b in block.content
        )
        failed = " (an error)" if block.is_error else ""
        return {"type": "text", "text": f"[result of {foreign[block.tool_use_id]}{failed}: {body}]"}
    return block_to_api(block)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def to_anthropic_messages(messages: Sequence[CompiledMessage], assistant: str | Collection[str]) -> list[dict[str, Any]]:
    """Messages API ``messages``: roles by membership in ``assistant``, same-role runs merged (P7).

    A breakpoint becomes ``cache_control: {"type": "ephemeral"}`` on its message's last block (a
    host's own cache_control on stored text gives way past the provider's 4); blocks the API refuses (blank text, thinking outside the assistant's turns) are left out;
    tool_results lead their user turn; a leading assistant turn follows a "(continued)" user turn;
    another participant's tool calls and their results are shown as text.
    """
    speakers = {assistant} if isinstance(assistant, str) else assistant
    out: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    foreign: dict[str, str] = {}  # tool_use id -> "who called what", for calls not the assistant's own
    for message in messages:
        role = "assistant" if message.participant in speakers else "user"
        content = [_api_block(b, message.participant, role, foreign) for b in message.content if _sendable(b, role)]
        if not content:
            continue
        if message.cache_breakpoint:
            marked = _mark_cache(content)
            if marked is not None:
                ours.append(marked)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})
    for turn in out:
        # The API wants a user turn's tool_results first (an injection may sit before them).
        if turn["role"] == "user" and any(b["type"] == "tool_result" for b in turn["content"]):
            turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    _cap_cache_controls(out, ours)
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUED_TEXT}]})
    return out
