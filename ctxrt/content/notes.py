"""The text a block becomes where a request form has no place for it (docs/api.md, Request forms).

Audio and video have no form in the Messages API (nor video in OpenAI's), a generated image none
in an assistant's turn, and a tool attempt or a tool notice none anywhere: sending either as a
call would break the pairing of calls and results (P4). Each becomes one short note, the same
words in every form and on every turn (P9), and the token estimate prices that note (``tokens``).
A note never holds media bytes: a blob that went missing doesn't change it.
"""

from __future__ import annotations

import json
from typing import Any

from .blocks import Audio, GeneratedImage, ToolAttempt, ToolNotice, Video

_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _what(source: Any) -> str:
    """A media source as a note names it: its URL, else its media type."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return str(source.get("media_type") or source.get("type") or "")


def media_note(block: Audio | Video | GeneratedImage) -> str:
    """``[audio: 12 s, audio/mpeg, transcript: ...]``; ``[generated image (preview): image/png, prompt: ...]``."""
    if type(block) is GeneratedImage:
        head = "generated image (preview)" if block.is_preview else "generated image"
        parts = [_what(block.source)]
        if block.prompt and block.prompt.strip():
            parts.append(f"prompt: {block.prompt}")
    else:
        assert type(block) is Audio or type(block) is Video
        head = block.type
        parts = [] if block.duration is None else [f"{block.duration:g} s"]
        parts.append(_what(block.source))
        if block.transcript and block.transcript.strip():
            parts.append(f"transcript: {block.transcript}")
    return f"[{head}: {', '.join(part for part in parts if part)}]"


def attempt_note(block: ToolAttempt) -> str:
    """``[tool call not run: search {"q":"x"}; reason: refused]``, or the call as written when
    the attempt has no name."""
    if block.name is not None:
        call = block.name if block.input is None else f"{block.name} {_compact(block.input)}"
    else:
        call = block.raw_xml or ""
    reason = f"; reason: {block.reason}" if block.reason and block.reason.strip() else ""
    return f"[tool call not run: {call}{reason}]"


def notice_note(block: ToolNotice) -> str:
    """``[tool notice (search): first; second]``."""
    about = f" ({block.tool_name})" if block.tool_name else ""
    return f"[tool notice{about}: {'; '.join(block.notices)}]"


def note(block: Audio | Video | GeneratedImage | ToolAttempt | ToolNotice) -> str:
    """The note for any of the kinds a form may show as text only."""
    if type(block) is ToolAttempt:
        return attempt_note(block)
    if type(block) is ToolNotice:
        return notice_note(block)
    assert type(block) is Audio or type(block) is Video or type(block) is GeneratedImage
    return media_note(block)
