"""Content blocks, ``Message``, and the reader's view of a message's blocks.

Blocks are frozen attrs classes in Anthropic Messages API shape (field names as the API spells
them). Messages handed out by ctxrt are immutable: caches, views and strategies share them.
Converting dicts to blocks and back lives elsewhere (a host's content checked in ``validation.py``,
the storage form in ``codec.py``, the API form in ``wire.py``); this module holds data and the
audience rules that need no codec (docs/behaviours.md A2, A5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeAlias, Union

import attrs


def _listed_audience(value: Any) -> Any:
    """A list given as an audience is kept as a tuple, so the frozen block stays hashable; anything
    else is kept as given (a stored audience that isn't a list of strings names no one, A2)."""
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen
class Text:
    text: str
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    cache_control: Mapping[str, Any] | None = attrs.field(default=None, kw_only=True)
    # An opaque provider-native replay form; several blocks of one message may share it (A5).
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "text"


@attrs.frozen
class Thinking:
    thinking: str
    signature: str | None = None
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "thinking"


@attrs.frozen
class RedactedThinking:
    data: str
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "redacted_thinking"


@attrs.frozen
class Image:
    # {"type": "base64", "media_type": ..., "data": ...} | {"type": "url", "url": ...}
    source: Mapping[str, Any]
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "image"


@attrs.frozen
class Document:
    source: Mapping[str, Any]
    title: str | None = attrs.field(default=None, kw_only=True)
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "document"


@attrs.frozen
class ToolUse:
    id: str
    name: str
    input: Mapping[str, Any]
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_use"


@attrs.frozen
class ToolResult:
    tool_use_id: str
    content: "str | tuple[Block, ...]"
    is_error: bool = attrs.field(default=False, kw_only=True)
    raw: Any = attrs.field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_result"


Block: TypeAlias = Union[Text, Thinking, RedactedThinking, Image, Document, ToolUse, ToolResult]
BLOCK_TYPES: tuple[type[Block], ...] = (Text, Thinking, RedactedThinking, Image, Document, ToolUse, ToolResult)

ContentLike: TypeAlias = "str | Sequence[Block | Mapping[str, Any]]"


@attrs.frozen
class Message:
    """A stored message: ``id`` is its ``sequence`` in decimal text."""

    id: str
    sequence: int
    participant: str
    content: tuple[Block, ...]
    metadata: Mapping[str, Any] | None = None
    timestamp_ms: int = 0
    caused_by: tuple[str, ...] = ()
    # Token estimate memo for tokens.py; not part of the message's identity.
    _tokens: int = attrs.field(default=-1, init=False, eq=False, repr=False)


def sequence_key(message: Message) -> int:
    """A message's sequence: the key its lists are sorted and bisected by."""
    return message.sequence


def has_audience(block: object) -> bool:
    """Whether ``block`` declares an audience (any value but None)."""
    return getattr(block, "audience", None) is not None


def names_reader(audience: object, reader: str | None) -> bool:
    """Whether a stored ``audience`` names ``reader``; one that isn't a tuple of strings names no one (A2)."""
    if reader is None or not isinstance(audience, tuple):
        return False
    return reader in audience and all(isinstance(name, str) for name in audience)


def holds_audience(blocks: Sequence[Block]) -> bool:
    """Whether any block, top level or nested in a tool result, declares an audience."""
    for block in blocks:
        if has_audience(block):
            return True
        if type(block) is ToolResult and not isinstance(block.content, str) and holds_audience(block.content):
            return True
    return False


def content_for_reader(blocks: Sequence[Block], reader: str | None) -> tuple[Block, ...]:
    """The blocks ``reader`` may see, with the ``audience`` field removed (docs/behaviours.md A2, A5, A8).

    Keeps blocks with no audience and those whose audience names ``reader``; ``reader=None``
    keeps only blocks with no audience. A raw replay form shared with a hidden block is taken
    off the blocks that remain, so replaying it can't carry the hidden block. Blocks nested in a
    tool result follow the same rule (a write refuses an audience there, B1, but a store written
    before that check may hold one); the tool result itself stays, for its call's sake.
    """
    if not holds_audience(blocks):
        return tuple(blocks)
    kept: list[Block] = []
    hidden_raws: list[Any] = []
    for block in blocks:
        audience = getattr(block, "audience", None)
        if audience is None:
            if type(block) is ToolResult and not isinstance(block.content, str) and holds_audience(block.content):
                block = attrs.evolve(block, content=content_for_reader(block.content, reader), raw=None)
            kept.append(block)
        elif names_reader(audience, reader):
            kept.append(attrs.evolve(block, audience=None))  # type: ignore[arg-type]  # only Text and Thinking carry one
        elif block.raw is not None:
            hidden_raws.append(block.raw)
    if hidden_raws:
        kept = [
            attrs.evolve(block, raw=None) if block.raw is not None and block.raw in hidden_raws else block
            for block in kept
        ]
    return tuple(kept)


@attrs.frozen
class CompiledMessage:
    """One message of a compiled request: who speaks, what, and whether the prompt cache breaks after it."""

    participant: str
    content: tuple[Block, ...]
    cache_breakpoint: bool = False


def hidden_by_edit(old: Sequence[Block], new: Sequence[Block]) -> tuple[frozenset[str], bool]:
    """Who an edit hides a block from, in place (docs/behaviours.md D1).

    Blocks are compared by position, over the positions both versions hold: a block the edit
    leaves out is a deletion, like a removed message, not a narrowing. Returns the named readers
    it hides a block from, and whether it hides one from readers it doesn't name (a block with no
    audience given one hides it from everyone outside the new audience, the no-reader view
    included).
    """
    names: set[str] = set()
    others = False
    for block, after_block in zip(old, new):
        before = getattr(block, "audience", None)
        after = getattr(after_block, "audience", None)
        if before is None:
            others = others or after is not None
        elif after is not None:
            before_names = {n for n in before if isinstance(n, str)} if isinstance(before, tuple) else set()
            after_names = set(after) if isinstance(after, tuple) else set()
            names |= before_names - after_names
    return frozenset(names), others


def has_block(message: Message, kind: type) -> bool:
    """Whether ``message`` holds a top-level block of exactly type ``kind``."""
    return any(type(block) is kind for block in message.content)
