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


def json_key(value: Any) -> Any:
    """What ``value`` compares as in a block: as its JSON, so ``True``, ``1`` and ``1.0`` differ
    (Python's ``==`` makes them equal, and a compile's memo, which reuses what an equal block made,
    would send a stale one after an edit between them); a list and a tuple of equal items are one
    JSON array, and an object's keys compare in any order. Anything else compares as itself."""
    kind = type(value)
    if value is None or kind is str:
        return value
    if isinstance(value, (int, float)):  # a bool is an int to Python
        return (bool if isinstance(value, bool) else float if isinstance(value, float) else int, value)
    if isinstance(value, Mapping):
        return {key: json_key(each) for key, each in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(json_key(each) for each in value)
    return value


def _json_field(**kwargs: Any) -> Any:
    """A block field holding JSON values (a tool's input, a source, ``raw``): compared by ``json_key``."""
    return attrs.field(eq=json_key, **kwargs)


def _listed_audience(value: Any) -> Any:
    """A list given as an audience is kept as a tuple, so the frozen block stays hashable; anything
    else is kept as given (a stored audience that isn't a list of strings names no one, A2)."""
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen
class Text:
    text: str
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    cache_control: Mapping[str, Any] | None = _json_field(default=None, kw_only=True)
    # An opaque provider-native replay form; several blocks of one message may share it (A5).
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "text"


@attrs.frozen
class Thinking:
    thinking: str
    signature: str | None = None
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "thinking"


@attrs.frozen
class RedactedThinking:
    data: str
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "redacted_thinking"


@attrs.frozen
class Image:
    # {"type": "base64", "media_type": ..., "data": ...} | {"type": "url", "url": ...}
    source: Mapping[str, Any] = _json_field()
    # The host's own token figure for the image (it wins over the flat estimate) and where the
    # image came from (kept for the host; a base64 image's origin, say).
    token_estimate: int | None = attrs.field(default=None, kw_only=True)
    source_url: str | None = attrs.field(default=None, kw_only=True)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "image"


@attrs.frozen
class Document:
    source: Mapping[str, Any] = _json_field()
    title: str | None = attrs.field(default=None, kw_only=True)
    filename: str | None = attrs.field(default=None, kw_only=True)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "document"


@attrs.frozen
class Audio:
    """Sound a host stored (a voice message, a recording): a base64 or URL ``source`` with an
    ``audio/...`` media type, its length in seconds and a transcript when the host has them."""

    source: Mapping[str, Any] = _json_field()
    duration: float | None = attrs.field(default=None, kw_only=True)
    transcript: str | None = attrs.field(default=None, kw_only=True)
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "audio"


@attrs.frozen
class Video:
    """A video a host stored: as ``Audio``, with a ``video/...`` media type."""

    source: Mapping[str, Any] = _json_field()
    duration: float | None = attrs.field(default=None, kw_only=True)
    transcript: str | None = attrs.field(default=None, kw_only=True)
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "video"


@attrs.frozen
class GeneratedImage:
    """An image a model made (model output media): a source as an ``Image``'s, the ``prompt`` it
    was made from, whether it is a preview (a draft the model refines), and a token figure."""

    source: Mapping[str, Any] = _json_field()
    prompt: str | None = attrs.field(default=None, kw_only=True)
    is_preview: bool = attrs.field(default=False, kw_only=True)
    token_estimate: int | None = attrs.field(default=None, kw_only=True)
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "generated_image"


@attrs.frozen
class ToolUse:
    id: str
    name: str
    input: Mapping[str, Any] = _json_field()
    # What the model wrote when it called in XML (prefill mode), and the arguments as written
    # when they didn't parse (then ``input`` is not to be trusted): kept for the host, never sent.
    raw_xml: str | None = attrs.field(default=None, kw_only=True)
    unparseable_input: str | None = attrs.field(default=None, kw_only=True)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_use"


@attrs.frozen
class ToolResult:
    tool_use_id: str
    content: "str | tuple[Block, ...]"
    is_error: bool = attrs.field(default=False, kw_only=True)
    tool_name: str | None = attrs.field(default=None, kw_only=True)  # as agent frameworks write it
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_result"


def _listed_notices(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen
class ToolAttempt:
    """A tool call the model attempted that was not run (refused, malformed, or written in a
    mode that doesn't execute it): the tool's ``name`` and ``input`` where known, the call as the
    model wrote it (``raw_xml``) and why it wasn't run. Never a call: it pairs with no result."""

    name: str | None = None
    input: Mapping[str, Any] | None = _json_field(default=None)
    raw_xml: str | None = attrs.field(default=None, kw_only=True)
    reason: str | None = attrs.field(default=None, kw_only=True)
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_attempt"


@attrs.frozen
class ToolNotice:
    """Notes a harness wrote about tool activity (a tool disabled, a call timed out), each a
    string, and the tool they concern where one does."""

    notices: tuple[str, ...] = attrs.field(converter=_listed_notices)
    tool_name: str | None = attrs.field(default=None, kw_only=True)
    audience: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_listed_audience)
    raw: Any = _json_field(default=None, kw_only=True)
    type: ClassVar[str] = "tool_notice"


Block: TypeAlias = Union[Text, Thinking, RedactedThinking, Image, Document, ToolUse, ToolResult,
                         Audio, Video, GeneratedImage, ToolAttempt, ToolNotice]
BLOCK_TYPES: tuple[type[Block], ...] = (Text, Thinking, RedactedThinking, Image, Document, ToolUse, ToolResult,
                                        Audio, Video, GeneratedImage, ToolAttempt, ToolNotice)
# The kinds of block that may carry an audience, as a message's own top-level blocks (B1).
AUDIENCE_TYPES: tuple[type[Block], ...] = (Text, Thinking, Audio, Video, GeneratedImage, ToolAttempt, ToolNotice)
# Media kept once in the blob table when given as base64 (M4).
MEDIA_TYPES = (Image, Document, Audio, Video, GeneratedImage)
Media: TypeAlias = Union[Image, Document, Audio, Video, GeneratedImage]

ContentLike: TypeAlias = "str | Sequence[Block | Mapping[str, Any]]"


@attrs.frozen
class Message:
    """A stored message: ``id`` is its ``sequence`` in decimal text."""

    id: str
    sequence: int
    participant: str
    content: tuple[Block, ...]
    metadata: Mapping[str, Any] | None = _json_field(default=None)
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
            kept.append(attrs.evolve(block, audience=None))  # type: ignore[arg-type]  # only AUDIENCE_TYPES carry one
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
