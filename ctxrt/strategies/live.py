"""What stays live in a compile: the image policy and tool-output pruning (docs/api.md, Host controls).

Pure and synchronous: a pass over a strategy's selected entries, newest first, that replaces
images past the newest ``max_live_images``, past ``max_live_image_bytes`` in all, deeper than
``image_strip_depth_tokens`` or larger than the Messages API takes (5 MB of base64 data, which
would fail every request that held it) with a short text naming them; tool results older than the newest
``tool_result_max_last_n`` with a line saying what was pruned; and tool_use inputs over
``tool_use_input_max_tokens`` with a note. Blocks are replaced, never dropped, so tool pairs
and the message structure stay; an entry it doesn't change is handed back as the same object.
A replacement never costs more than what it replaces (a pass only lowers a compile's tokens),
and never more than the API's 100 images stay live, whatever ``max_live_images`` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from ..anthropic_rules import MAX_IMAGE_DATA_BYTES, MAX_IMAGES
from ..compile import Entry
from ..content import Block, Image, Text, ToolResult, ToolUse
from ..tokens import estimate_block, estimate_blocks

MIB = 1 << 20
IMAGE_DROPPED = "[image dropped from live context: {what}]"
TOOL_RESULT_PRUNED = "[tool output pruned from live context: about {tokens} tokens]"
TOOL_INPUT_PRUNED = "[tool input pruned from live context: about {tokens} tokens]"


class LiveOptions(Protocol):
    """The config fields the pass reads (WindowedPassthrough's and Autobiographical's)."""

    @property
    def max_live_images(self) -> int: ...
    @property
    def max_live_image_bytes(self) -> int: ...
    @property
    def image_strip_depth_tokens(self) -> int: ...
    @property
    def tool_result_max_last_n(self) -> int | None: ...
    @property
    def tool_use_input_max_tokens(self) -> int: ...


def image_bytes(image: Image) -> int:
    """The size of a base64 image's data in the request (a URL image's bytes aren't in it: 0)."""
    data = image.source.get("data") if image.source.get("type") == "base64" else None
    return len(data) if isinstance(data, str) else 0


def _describe(image: Image, where: str) -> str:
    media = image.source.get("media_type") or image.source.get("type") or "image"
    size = image_bytes(image)
    return f"{media}, {size // 1024:,} KiB, {where}" if size else f"{media}, {where}"


@attrs.define
class _Walk:
    """What the newest-first walk has counted so far."""

    options: LiveOptions
    images: int = 0
    image_bytes: int = 0
    depth: int = 0  # tokens of the entries after the current one (counted while it matters)
    results: int = 0

    def image(self, image: Image, where: str) -> Block:
        size = image_bytes(image)
        if size > MAX_IMAGE_DATA_BYTES:
            return Text(IMAGE_DROPPED.format(what=_describe(image, where) + ", over the API's 5 MB limit"))
        live = (self.images < min(self.options.max_live_images, MAX_IMAGES)
                and self.image_bytes + size <= self.options.max_live_image_bytes
                and self.depth <= self.options.image_strip_depth_tokens)
        if live:
            self.images += 1
            self.image_bytes += size
            return image
        return Text(IMAGE_DROPPED.format(what=_describe(image, where)))

    def tool_result(self, block: ToolResult, where: str) -> Block:
        last_n = self.options.tool_result_max_last_n
        self.results += 1
        if last_n is not None and self.results > last_n:
            tokens = estimate_block(block)
            pruned = attrs.evolve(block, content=TOOL_RESULT_PRUNED.format(tokens=tokens))
            if estimate_block(pruned) < tokens:  # a note never costs more than what it replaces
                return pruned
        if isinstance(block.content, str):
            return block
        nested = tuple(self.image(b, where) if type(b) is Image else b for b in reversed(block.content))[::-1]
        return block if all(a is b for a, b in zip(nested, block.content)) else attrs.evolve(block, content=nested)

    def tool_use(self, block: ToolUse) -> Block:
        cap = self.options.tool_use_input_max_tokens
        if cap <= 0:
            return block
        tokens = estimate_block(block)
        if tokens <= cap:
            return block
        pruned = attrs.evolve(block, input={"pruned": TOOL_INPUT_PRUNED.format(tokens=tokens)})
        return pruned if estimate_block(pruned) < tokens else block


_KINDS = (Image, ToolResult, ToolUse)


def apply_live_policy(entries: Sequence[Entry], options: LiveOptions) -> list[Entry]:
    """``entries`` with the images, tool results and tool inputs the options leave out replaced."""
    walk = _Walk(options)
    out = list(entries)
    for index in range(len(out) - 1, -1, -1):
        entry = out[index]
        content = entry.content
        if any(type(block) in _KINDS for block in content):
            where = f"message {entry.source_ids[0]}" if entry.source_ids else "a summary"
            changed: list[Any] = []
            for block in reversed(content):
                kind = type(block)
                if kind is Image:
                    changed.append(walk.image(block, where))  # type: ignore[arg-type]
                elif kind is ToolResult:
                    changed.append(walk.tool_result(block, where))  # type: ignore[arg-type]
                elif kind is ToolUse:
                    changed.append(walk.tool_use(block))  # type: ignore[arg-type]
                else:
                    changed.append(block)
            changed.reverse()
            if any(a is not b for a, b in zip(changed, content)):
                out[index] = attrs.evolve(entry, content=tuple(changed))
        if walk.depth <= options.image_strip_depth_tokens:  # deeper, every image is out: stop counting
            walk.depth += estimate_blocks(content)
    return out
