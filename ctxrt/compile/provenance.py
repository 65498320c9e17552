"""Provenance (P6): where each compiled message came from, and whether it carries its stored body whole.

``Source`` and ``Provenance`` are what a compile result reports; ``coverage_complete`` judges
whether rendered blocks carry stored ones unaltered. They stand alone because both the
injection placing (an injected message's source) and the pipeline use them, and the coverage
rule is a pure comparison of blocks worth reading and testing by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from ..content.blocks import Block, Document, Image, Message, RedactedThinking, Text, Thinking, ToolResult, ToolUse

@attrs.frozen
class Source:
    """Where a compiled message came from; ``complete`` is set for raw message bodies only (P6)."""

    kind: Literal["message", "summary", "injection"]
    id: str
    complete: bool | None = None


@attrs.frozen
class Provenance:
    """Which stored messages and summaries each compiled message came from, in the reader's view (P6, A4)."""

    compile_id: str
    namespace: str
    branch: str
    reader: str | None
    strategy: str
    messages: tuple[tuple[Source, ...], ...]  # parallel to CompileResult.messages
    raw_bodies: Mapping[str, Message]
    completeness: Mapping[str, bool]



def _covers(rendered: Block, stored: Block) -> bool:
    kind = type(stored)
    if type(rendered) is not kind:
        return False
    if type(stored) is Text and type(rendered) is Text:
        return stored.text in rendered.text  # a prefixed header is fine
    if type(stored) is Thinking and type(rendered) is Thinking:
        return rendered.thinking == stored.thinking and rendered.signature == stored.signature
    if type(stored) is RedactedThinking and type(rendered) is RedactedThinking:
        return rendered.data == stored.data
    if type(stored) is Image and type(rendered) is Image:
        return rendered.source == stored.source
    if type(stored) is Document and type(rendered) is Document:
        return rendered.source == stored.source and rendered.title == stored.title
    if type(stored) is ToolUse and type(rendered) is ToolUse:
        return (rendered.id, rendered.name, rendered.input) == (stored.id, stored.name, stored.input)
    if type(stored) is ToolResult and type(rendered) is ToolResult:
        if rendered.tool_use_id != stored.tool_use_id or rendered.is_error != stored.is_error:
            return False
        r, s = rendered.content, stored.content
        if isinstance(s, str) or isinstance(r, str):
            return isinstance(r, str) and isinstance(s, str) and s in r
        return coverage_complete(r, s)
    return rendered == stored  # audio, video, generated images, tool attempts and notices: carried as they are


def coverage_complete(rendered_blocks: Sequence[Block], stored_blocks: Sequence[Block]) -> bool:
    """Whether every stored block is carried unaltered, in order, by the rendered blocks (P6).

    Text is covered by a rendered text that contains it (empty stored text is ignored); media by
    an exactly equal source; tool blocks by id, name and input; thinking byte for byte.
    """
    j = 0
    for stored in stored_blocks:
        if type(stored) is Text and not stored.text:
            continue
        while j < len(rendered_blocks) and not _covers(rendered_blocks[j], stored):
            j += 1
        if j == len(rendered_blocks):
            return False
        if type(stored) is not Text:  # one rendered text may carry several stored texts (joined shards)
            j += 1
    return True
