"""The storage form of messages and blocks, and the private converter built on it.

Blocks are stored as compact JSON with Anthropic field names plus ``audience``/``raw``/
``cache_control`` when set, media already swapped for ``blob_ref`` sources (by ``blobs``, M4).
Encoding writes byte for byte what ``json`` would; decoding trusts the data (it passed
``validation`` when written), checks only its shape, and is hand-tuned: it runs once per message
on every cold slot load.

The module-level converter is private to ctxrt (never cattrs' global one). Its hooks for the block
union are the storage encoder/decoder below, dispatching on each class's ``type`` tag, so records
other modules persist (summaries, chunk records, Derivation) embed blocks in the same form.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import cattrs

from .blocks import (
    BLOCK_TYPES,
    Audio,
    Block,
    Document,
    GeneratedImage,
    Image,
    Message,
    RedactedThinking,
    Text,
    Thinking,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
)
from ..errors import StoreCorruptError, StoreFormatError
from .validation import type_name

T = TypeVar("T")

_JSON_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
# The string escaper that encoder uses (ensure_ascii=False): the C one, where there is one.
_ENCODE_STRING: Callable[[str], str] = json.encoder.encode_basestring
# The C scanner called directly: json.loads adds encoding detection and a whitespace regex that
# stored data (written by _JSON_DUMPS) never needs; about 40% of a typical message's decode.
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by __init__; typeshed omits it


def _enc_block(block: Any) -> dict[str, Any]:
    """A block in storage form: Anthropic field names, None and defaults omitted."""
    cls = type(block)
    if cls is Text:
        d: dict[str, Any] = {"type": "text", "text": block.text}
        if block.audience is not None:
            d["audience"] = list(block.audience) if isinstance(block.audience, tuple) else block.audience
        if block.cache_control is not None:
            d["cache_control"] = block.cache_control
    elif cls is ToolUse:
        d = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
        _optional(d, "raw_xml", block.raw_xml)
        _optional(d, "unparseable_input", block.unparseable_input)
    elif cls is ToolResult:
        content = block.content
        d = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": content if isinstance(content, str) else [_enc_block(b) for b in content],
        }
        if block.is_error:
            d["is_error"] = True
        _optional(d, "tool_name", block.tool_name)
    elif cls is Thinking:
        d = {"type": "thinking", "thinking": block.thinking}
        if block.signature is not None:
            d["signature"] = block.signature
        if block.audience is not None:
            d["audience"] = list(block.audience) if isinstance(block.audience, tuple) else block.audience
    elif cls is RedactedThinking:
        d = {"type": "redacted_thinking", "data": block.data}
    elif cls is Image:
        d = {"type": "image", "source": block.source}
        _optional(d, "token_estimate", block.token_estimate)
        _optional(d, "source_url", block.source_url)
    elif cls is Document:
        d = {"type": "document", "source": block.source}
        _optional(d, "title", block.title)
        _optional(d, "filename", block.filename)
    elif cls is Audio or cls is Video:
        d = {"type": cls.type, "source": block.source}
        _optional(d, "duration", block.duration)
        _optional(d, "transcript", block.transcript)
        _audience(d, block.audience)
    elif cls is GeneratedImage:
        d = {"type": "generated_image", "source": block.source}
        _optional(d, "prompt", block.prompt)
        if block.is_preview:
            d["is_preview"] = True
        _optional(d, "token_estimate", block.token_estimate)
        _audience(d, block.audience)
    elif cls is ToolAttempt:
        d = {"type": "tool_attempt"}
        _optional(d, "name", block.name)
        _optional(d, "input", block.input)
        _optional(d, "raw_xml", block.raw_xml)
        _optional(d, "reason", block.reason)
        _audience(d, block.audience)
    elif cls is ToolNotice:
        d = {"type": "tool_notice", "notices": list(block.notices) if isinstance(block.notices, tuple)
             else block.notices}
        _optional(d, "tool_name", block.tool_name)
        _audience(d, block.audience)
    else:
        raise TypeError(f"not a content block: {block!r}")
    if block.raw is not None:
        d["raw"] = block.raw
    return d


def _optional(d: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        d[key] = value


def _audience(d: dict[str, Any], audience: Any) -> None:
    if audience is not None:
        d["audience"] = list(audience) if isinstance(audience, tuple) else audience


def _stored_audience(value: Any) -> Any:
    # A stored audience is read, never refused (A2): a list becomes a tuple, anything else is
    # kept as it is and names no one.
    return tuple(value) if type(value) is list else value


def _dec_text(d: dict[str, Any]) -> Block:
    if len(d) == 2:
        return Text(d["text"])
    audience = d.get("audience")
    return Text(
        d["text"],
        audience=None if audience is None else _stored_audience(audience),
        cache_control=d.get("cache_control"),
        raw=d.get("raw"),
    )


def _dec_thinking(d: dict[str, Any]) -> Block:
    audience = d.get("audience")
    return Thinking(
        d["thinking"],
        d.get("signature"),
        audience=None if audience is None else _stored_audience(audience),
        raw=d.get("raw"),
    )


def _dec_tool_use(d: dict[str, Any]) -> Block:
    if len(d) == 4:
        return ToolUse(d["id"], d["name"], d["input"])
    return ToolUse(d["id"], d["name"], d["input"], raw_xml=d.get("raw_xml"),
                   unparseable_input=d.get("unparseable_input"), raw=d.get("raw"))


def _dec_tool_result(d: dict[str, Any]) -> Block:
    content = d.get("content", "")
    if type(content) is list:
        content = tuple([_DECODERS[b["type"]](b) for b in content])
    return ToolResult(d["tool_use_id"], content, is_error=d.get("is_error", False), tool_name=d.get("tool_name"),
                      raw=d.get("raw"))


def _dec_audience(d: dict[str, Any]) -> Any:
    audience = d.get("audience")
    return None if audience is None else _stored_audience(audience)


def _dec_audio_video(cls: type[Audio] | type[Video]) -> Callable[[dict[str, Any]], Block]:
    def decode(d: dict[str, Any]) -> Block:
        return cls(d["source"], duration=d.get("duration"), transcript=d.get("transcript"),
                   audience=_dec_audience(d), raw=d.get("raw"))
    return decode


def _dec_generated_image(d: dict[str, Any]) -> Block:
    return GeneratedImage(d["source"], prompt=d.get("prompt"), is_preview=d.get("is_preview", False),
                          token_estimate=d.get("token_estimate"), audience=_dec_audience(d), raw=d.get("raw"))


def _dec_tool_attempt(d: dict[str, Any]) -> Block:
    return ToolAttempt(d.get("name"), d.get("input"), raw_xml=d.get("raw_xml"), reason=d.get("reason"),
                       audience=_dec_audience(d), raw=d.get("raw"))


def _dec_tool_notice(d: dict[str, Any]) -> Block:
    notices = d["notices"]
    return ToolNotice(tuple(notices) if type(notices) is list else notices, tool_name=d.get("tool_name"),
                      audience=_dec_audience(d), raw=d.get("raw"))


_DECODERS: dict[str, Callable[[dict[str, Any]], Block]] = {
    "text": _dec_text,
    "thinking": _dec_thinking,
    "redacted_thinking": lambda d: RedactedThinking(d["data"], raw=d.get("raw")),
    "image": lambda d: Image(d["source"], token_estimate=d.get("token_estimate"), source_url=d.get("source_url"),
                             raw=d.get("raw")),
    "document": lambda d: Document(d["source"], title=d.get("title"), filename=d.get("filename"), raw=d.get("raw")),
    "tool_use": _dec_tool_use,
    "tool_result": _dec_tool_result,
    "audio": _dec_audio_video(Audio),
    "video": _dec_audio_video(Video),
    "generated_image": _dec_generated_image,
    "tool_attempt": _dec_tool_attempt,
    "tool_notice": _dec_tool_notice,
}


def _dec_block(d: dict[str, Any]) -> Block:
    try:
        return _DECODERS[d["type"]](d)
    except (KeyError, TypeError) as exc:
        raise StoreFormatError(f"stored block is not in a form this version reads: {exc!r} in {d!r:.200}") from None


def message_to_json(
    participant: str,
    content: Sequence[Block],
    metadata: Mapping[str, Any] | None,
    timestamp_ms: int,
    caused_by: Sequence[str],
) -> bytes:
    """A message's storage form (its id and sequence are the store's, not part of it).

    Written piece by piece, byte for byte what ``_JSON_DUMPS`` makes of the whole message (the
    same key order, separators and string escapes): a plain text block and the plain strings and
    ints around it go straight through the C string escaper, anything else through
    ``_JSON_DUMPS`` (so its errors are the encoder's). About 4x faster than encoding a dict.
    """
    parts = ['{"participant":', _json_str(participant), ',"content":[']
    first = True
    for block in content:
        if not first:
            parts.append(",")
        first = False
        if (type(block) is Text and type(block.text) is str and block.audience is None
                and block.cache_control is None and block.raw is None):
            parts += ('{"type":"text","text":', _ENCODE_STRING(block.text), "}")
        else:
            parts.append(_JSON_DUMPS(_enc_block(block)))
    parts.append("]")
    if metadata is not None:
        parts += (',"metadata":', _JSON_DUMPS(metadata))
    if timestamp_ms:
        parts += (',"timestamp_ms":', int.__repr__(timestamp_ms) if type(timestamp_ms) is int
                  else _JSON_DUMPS(timestamp_ms))
    if caused_by:
        parts += (',"caused_by":', _JSON_DUMPS(list(caused_by)))
    parts.append("}")
    return "".join(parts).encode("utf-8")


def _json_str(value: Any) -> str:
    return _ENCODE_STRING(value) if type(value) is str else _JSON_DUMPS(value)


def message_from_json(data: bytes | memoryview, *, sequence: int, store: str) -> Message:
    """Decode a stored message (it passed ingress validation when written: its shape is checked,
    not its values again).

    Raises ``StoreCorruptError`` naming ``store`` (its data file or database) for bytes that aren't
    one JSON value (damage sealed into the record, e.g. by a move of an older format), and
    ``StoreFormatError`` for JSON this version doesn't read (a newer version's form, or fields of
    another type than this version writes).
    """
    try:
        text = str(data, "utf-8")
        d, end = _SCAN_ONCE(text, 0)
        if text[end:].strip():
            raise ValueError(f"{len(text) - end} bytes after the message")
    except (StopIteration, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        raise StoreCorruptError(store, f"stored message {sequence} doesn't decode: {exc!r}") from None
    try:
        content = tuple([_DECODERS[b["type"]](b) for b in d["content"]])
        caused_by = d.get("caused_by")
        message = Message(
            str(sequence),
            sequence,
            d["participant"],
            content,
            d.get("metadata"),
            d.get("timestamp_ms", 0),
            () if caused_by is None else tuple(caused_by),
        )
        _check_stored(message)
        return message
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreFormatError(f"stored message {sequence} is not in a form this version reads: {exc!r}") from None


def _check_stored(message: Message) -> None:
    """``TypeError`` unless every field has the type this version writes (a record of another
    shape would fail later, far from the store, in a compile or a request)."""
    if (type(message.participant) is not str or type(message.timestamp_ms) is not int
            or not (message.metadata is None or type(message.metadata) is dict)
            or not all(type(cause) is str for cause in message.caused_by)):
        raise TypeError("a message field of another type")
    _check_blocks(message.content)


_STORED_FIELDS: dict[type, tuple[tuple[str, tuple[type, ...]], ...]] = {
    Text: (("text", (str,)), ("cache_control", (dict, type(None)))),
    Thinking: (("thinking", (str,)), ("signature", (str, type(None)))),
    RedactedThinking: (("data", (str,)),),
    Image: (("source", (dict,)), ("token_estimate", (int, type(None))), ("source_url", (str, type(None)))),
    Document: (("source", (dict,)), ("title", (str, type(None))), ("filename", (str, type(None)))),
    ToolUse: (("id", (str,)), ("name", (str,)), ("input", (dict,)), ("raw_xml", (str, type(None))),
              ("unparseable_input", (str, type(None)))),
    ToolResult: (("tool_use_id", (str,)), ("content", (str, tuple)), ("is_error", (bool,)),
                 ("tool_name", (str, type(None)))),
    Audio: (("source", (dict,)), ("duration", (int, float, type(None))), ("transcript", (str, type(None)))),
    Video: (("source", (dict,)), ("duration", (int, float, type(None))), ("transcript", (str, type(None)))),
    GeneratedImage: (("source", (dict,)), ("prompt", (str, type(None))), ("is_preview", (bool,)),
                     ("token_estimate", (int, type(None)))),
    ToolAttempt: (("name", (str, type(None))), ("input", (dict, type(None))), ("raw_xml", (str, type(None))),
                  ("reason", (str, type(None)))),
    ToolNotice: (("notices", (tuple,)), ("tool_name", (str, type(None)))),
}


def _check_blocks(blocks: Sequence[Block]) -> None:
    for block in blocks:
        for field, types in _STORED_FIELDS[type(block)]:
            if type(getattr(block, field)) not in types:
                raise TypeError(f"a {block.type} block's {field} is {type(getattr(block, field)).__name__}")
        if type(block) is ToolResult and type(block.content) is tuple:
            _check_blocks(block.content)
        elif type(block) is ToolNotice and not all(type(notice) is str for notice in block.notices):
            raise TypeError("a tool_notice block's notices are not all strings")


# --------------------------------------------------------------------------------------------
# The private converter
# --------------------------------------------------------------------------------------------


def _structure_block(data: Any, _: Any) -> Block:
    if not isinstance(data, dict):
        raise StoreFormatError(f"a stored block must be an object, got {type_name(data)}")
    return _dec_block(data)


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    # The tagged union on "type": the hand-written storage codec, so a record persisted by any
    # module embeds its blocks exactly as messages store them.
    converter.register_structure_hook(Block, _structure_block)
    converter.register_unstructure_hook(Block, _enc_block)
    for cls in BLOCK_TYPES:
        converter.register_structure_hook(cls, _structure_block)
        converter.register_unstructure_hook(cls, _enc_block)
    return converter


_converter = _make_converter()


def to_jsonable(obj: Any) -> Any:
    """``obj`` (an attrs record, possibly holding blocks) as JSON-native data, via the private converter."""
    return _converter.unstructure(obj)


def from_jsonable(cls: type[T], data: Any) -> T:
    """The inverse of ``to_jsonable``."""
    return _converter.structure(data, cls)

