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

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from ..anthropic_rules import MAX_IMAGE_DATA_BYTES, MAX_IMAGES
from ..budget import Entry
from ..content.blobs import request_bytes
from ..content.blocks import Block, Image, Text, ToolResult, ToolUse
from ..memos import outgrown
from ..content.tokens import estimate_block, estimate_blocks

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
    """The size of a base64 image's data in the request, held by reference or not (M13; a URL
    image's bytes aren't in it: 0)."""
    return request_bytes(image.source)


def _describe(image: Image, where: str) -> str:
    media = image.source.get("media_type") or image.source.get("type") or "image"
    size = image_bytes(image)
    return f"{media}, {size // 1024:,} KiB, {where}" if size else f"{media}, {where}"


def live_count(total: int, limit: int) -> int:
    """How many of ``total`` (newest first) stay live under ``limit``: the line between live and
    dropped moves in steps of half the limit, so it stays put for several new ones and the prefix
    a provider cached stays byte-stable between steps (P9); at most ``limit``, and more than half
    of it whenever there are that many."""
    if total <= limit:
        return total
    step = max(1, limit // 2)
    over = total - limit
    return total - -(-over // step) * step


@attrs.define
class _Walk:
    """What the newest-first walk has counted so far; ``live_images`` and ``live_results`` are how
    many of each stay (``live_count``)."""

    options: LiveOptions
    live_images: int
    live_results: int | None
    images: int = 0
    image_bytes: int = 0
    depth: int = 0  # tokens of the entries after the current one (counted while it matters)
    results: int = 0

    def image(self, image: Image, where: str) -> tuple[Block, object]:
        size = image_bytes(image)
        if size > MAX_IMAGE_DATA_BYTES:
            return Text(IMAGE_DROPPED.format(what=_describe(image, where) + ", over the API's 5 MB limit")), "big"
        live = (self.images < self.live_images
                and self.image_bytes + size <= self.options.max_live_image_bytes
                and self.depth <= self.options.image_strip_depth_tokens)
        if live:
            self.images += 1
            self.image_bytes += size
            return image, None
        return Text(IMAGE_DROPPED.format(what=_describe(image, where))), "dropped"

    def tool_result(self, block: ToolResult, where: str) -> tuple[Block, object]:
        self.results += 1
        if self.live_results is not None and self.results > self.live_results:
            tokens = estimate_block(block)
            pruned = attrs.evolve(block, content=TOOL_RESULT_PRUNED.format(tokens=tokens))
            if estimate_block(pruned) < tokens:  # a note never costs more than what it replaces
                return pruned, "pruned"
        if isinstance(block.content, str):
            return block, None
        nested = [self.image(b, where) if type(b) is Image else (b, None) for b in reversed(block.content)][::-1]
        tags = tuple(tag for _, tag in nested)
        if not any(tags):
            return block, None
        return attrs.evolve(block, content=tuple(b for b, _ in nested)), tags

    def tool_use(self, block: ToolUse) -> tuple[Block, object]:
        cap = self.options.tool_use_input_max_tokens
        if cap <= 0:
            return block, None
        tokens = estimate_block(block)
        if tokens <= cap:
            return block, None
        pruned = attrs.evolve(block, input={"pruned": TOOL_INPUT_PRUNED.format(tokens=tokens)})
        return (pruned, "pruned") if estimate_block(pruned) < tokens else (block, None)


_KINDS = (Image, ToolResult, ToolUse)
LiveMemo = dict[tuple[Any, ...], tuple[tuple[Block, ...], Entry]]


def _count(entries: Sequence[Entry], last_n: int | None) -> tuple[int, int | None]:
    """(images that could stay live, tool results that stay) among ``entries``: images inside
    tool results the pruning takes don't count."""
    results = sum(1 for entry in entries for block in entry.content if type(block) is ToolResult)
    live_results = None if last_n is None else live_count(results, last_n)
    images = seen = 0
    for entry in reversed(entries):
        for block in reversed(entry.content):
            if type(block) is Image:
                images += image_bytes(block) <= MAX_IMAGE_DATA_BYTES
            elif type(block) is ToolResult:
                seen += 1
                if (live_results is None or seen <= live_results) and not isinstance(block.content, str):
                    images += sum(1 for b in block.content if type(b) is Image and image_bytes(b) <= MAX_IMAGE_DATA_BYTES)
    return images, live_results


def holds_live_blocks(entry: Entry) -> bool:
    """Whether the pass may change ``entry``: it holds an image, a tool result or a tool call."""
    return any(type(block) in _KINDS for block in entry.content)


Piece = tuple[int, Callable[[int], int]]
"""Where a piece of a list of entries starts, and ``after(k)``: the ``estimate_blocks`` tokens of
the piece's entries after its ``k``-th, to the piece's end (``after(-1)``: all of them)."""


def loose(entry: Entry) -> Callable[[int], int]:
    """``after`` for a piece of one entry, estimated when asked."""
    return lambda index: estimate_blocks(entry.content) if index < 0 else 0


class JoinedDepths:
    """``depth_after`` over entries laid out as pieces (starts ascending), counted by walking the
    pieces newest first only as far as the depth threshold: deeper, every image is out, so the
    exact figure no longer matters. A piece that keeps running totals answers in O(1)."""

    def __init__(self, pieces: Sequence[Piece], limit: int) -> None:
        self._starts = [start for start, _ in pieces]
        self._afters = [after for _, after in pieces]
        self._limit = limit
        self._next = len(pieces) - 1  # the newest piece not counted yet
        self._depth = 0  # the tokens of the pieces after it

    def after(self, index: int) -> int:
        piece = bisect_right(self._starts, index) - 1
        while self._next > piece and self._depth <= self._limit:
            self._depth += self._afters[self._next](-1)
            self._next -= 1
        if self._next > piece:
            return self._depth  # past the threshold
        return self._depth + self._afters[piece](index - self._starts[piece])


def apply_live_policy(entries: Sequence[Entry], options: LiveOptions, memo: LiveMemo | None = None) -> list[Entry]:
    """``entries`` with the images, tool results and tool inputs the options leave out replaced.

    With a ``memo`` (a strategy keeps one), an entry changed the same way as at an earlier call
    is handed back as the same object, so compile's own memo reuses what it prepared for it.
    """
    live = [index for index, entry in enumerate(entries) if holds_live_blocks(entry)]
    depths = JoinedDepths([(index, loose(entry)) for index, entry in enumerate(entries)], options.image_strip_depth_tokens)
    return apply_live_policy_at(entries, live, depths.after, options, memo)


def apply_live_policy_at(
    entries: Sequence[Entry], live: Sequence[int], depth_after: Callable[[int], int], options: LiveOptions,
    memo: LiveMemo | None = None,
) -> list[Entry]:
    """``apply_live_policy`` for a caller that keeps what it needs across compiles: ``live``, the
    indices (ascending) of the entries that ``holds_live_blocks``, the only ones the pass can
    change; ``depth_after(i)``, the tokens (``estimate_blocks``) of the entries after ``i``, asked
    for with falling ``i`` (any figure over ``image_strip_depth_tokens`` once the depth is past it)."""
    out = list(entries)
    if not live:
        return out
    images, live_results = _count([entries[index] for index in live], options.tool_result_max_last_n)
    walk = _Walk(options, live_count(images, min(options.max_live_images, MAX_IMAGES)), live_results)
    if memo is not None and outgrown(len(memo), len(out)):
        memo.clear()
    for index in reversed(live):
        entry = out[index]
        content = entry.content
        walk.depth = depth_after(index)
        where = f"message {entry.source_ids[0]}" if entry.source_ids else "a summary"
        changed: list[tuple[Block, object]] = []
        for block in reversed(content):
            kind = type(block)
            if kind is Image:
                changed.append(walk.image(block, where))  # type: ignore[arg-type]
            elif kind is ToolResult:
                changed.append(walk.tool_result(block, where))  # type: ignore[arg-type]
            elif kind is ToolUse:
                changed.append(walk.tool_use(block))  # type: ignore[arg-type]
            else:
                changed.append((block, None))
        changed.reverse()
        tags = tuple(tag for _, tag in changed)
        if any(tags):
            key = (id(content), entry.participant, entry.source_ids, entry.cache_marker, tags)
            found = memo.get(key) if memo is not None else None
            if found is not None and found[0] is content:
                out[index] = found[1]
            else:
                out[index] = attrs.evolve(entry, content=tuple(block for block, _ in changed))
                if memo is not None:
                    memo[key] = (content, out[index])
    return out
