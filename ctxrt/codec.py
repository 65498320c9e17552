"""The private codec: content validation at the edge, the storage form, the API form.

Three forms of a block exist:

- *ingress*: what a host passes (attrs blocks or Anthropic Messages API dicts). ``blocks_from_content``
  validates every field and every audience rule (docs/behaviours.md M6, B1, B2) and
  returns normalised blocks, or raises ``MalformedContentError`` naming the exact place.
- *storage*: compact JSON with Anthropic field names plus ``audience``/``raw``/``cache_control``
  when set; media replaced by ``blob_ref`` sources (M4). Decoding it trusts the data and is
  hand-tuned: it runs once per message on every cold slot load.
- *API*: the dicts ``anthropic.AsyncAnthropic().messages.create`` takes (no audience, no raw).

The module-level converter is private to ctxrt (never cattrs' global one). Its hooks for the block
union are the storage encoder/decoder below, dispatching on each class's ``type`` tag, so records
other modules persist (summaries, chunk records, Derivation) embed blocks in the same form.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import cattrs

from . import checks
from .content import (
    BLOCK_TYPES,
    Block,
    ContentLike,
    Document,
    Image,
    Message,
    RedactedThinking,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
)
from .errors import MalformedContentError, StoreCorruptError, StoreFormatError

T = TypeVar("T")

# The media types the Messages API accepts for base64 sources.
IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
DOCUMENT_MEDIA_TYPES = frozenset({"application/pdf"})
# Deeper JSON is refused at the edge so no later walk (encode, estimate, compare) can hit the
# interpreter's recursion limit on stored data.
MAX_JSON_DEPTH = 200
# Larger integers are refused at the edge: Python's default int_max_str_digits (4,300) would keep
# any process from writing them as JSON, or (when a host lifted it) from reading them back.
MAX_INT_BITS = 14_000

_BLOCK_BY_TAG: dict[str, type[Block]] = {cls.type: cls for cls in BLOCK_TYPES}
_NESTED_TAGS = ("text", "image", "document")  # what the API lets a tool_result hold
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What the Messages API accepts as a tool id (P8); ingress refuses others. Tool names are kept
# as written (Knowledge reads phases from names like "mcpl:search", T7); wire rewrites them.
_TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+\Z")


def _tool_id(value: object, path: str) -> str:
    tool_id = _string(value, path, non_empty=True)
    if not _TOOL_ID.match(tool_id):
        raise MalformedContentError(
            path, f"tool id {tool_id!r} is not one the Messages API accepts: use only letters, digits, "
            "'_' and '-' (^[a-zA-Z0-9_-]+$)"
        )
    return tool_id
_JSON_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
# The string escaper that encoder uses (ensure_ascii=False): the C one, where there is one.
_ENCODE_STRING: Callable[[str], str] = json.encoder.encode_basestring
# The C scanner called directly: json.loads adds encoding detection and a whitespace regex that
# stored data (written by _JSON_DUMPS) never needs; about 40% of a typical message's decode.
_SCAN_ONCE = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by __init__; typeshed omits it


# --------------------------------------------------------------------------------------------
# Ingress validation
# --------------------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{json.dumps(key)}]"


def _string(value: object, path: str, *, non_empty: bool = False) -> str:
    if type(value) is not str:
        if not isinstance(value, str):
            raise MalformedContentError(path, f"expected a string, got {_type_name(value)}")
        value = str.__str__(value)  # a plain str, whatever the subclass's __str__ says
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise MalformedContentError(
                path, f"holds a lone surrogate at character {exc.start}; the text is not valid UTF-8"
            ) from None
    if non_empty and not value:
        raise MalformedContentError(path, "must be a non-empty string")
    return value


def _json_value(value: object, path: str, depth: int = 0) -> Any:
    """A JSON-native copy of ``value`` (dicts with str keys, lists, str, finite numbers, bool, None)."""
    kind = type(value)
    if kind is str:
        return _string(value, path)
    if value is None or kind is bool:
        return value
    if kind is int and isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise MalformedContentError(path, f"an integer of {value.bit_length():,} bits is too large to store "
                                        f"(at most {MAX_INT_BITS:,} bits, about 4,200 digits)")
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise MalformedContentError(path, f"{value!r} is not a JSON number")
        return value
    if depth >= MAX_JSON_DEPTH:
        raise MalformedContentError(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise MalformedContentError(
                    f"{path}[{key!r}]", f"JSON object keys must be strings, got {_type_name(key)}"
                )
            key = _string(key, f"{path}[{json.dumps(key, ensure_ascii=True)}]")
            out[key] = _json_value(item, _key_path(path, key), depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, str):
        return _string(value, path)
    if isinstance(value, int):  # int subclasses (bool was handled above), e.g. IntEnum
        return _json_value(int(value), path, depth)
    if isinstance(value, float):
        return _json_value(float(value), path, depth)
    raise MalformedContentError(path, f"is not JSON-serialisable ({_type_name(value)})")


def _fields_of(block: Any) -> dict[str, Any]:
    """An attrs block as an ingress dict, values untouched, so one validator judges both forms."""
    fields = {a.name: getattr(block, a.name) for a in attrs.fields(type(block))}
    fields["type"] = block.type
    return fields


def _check_keys(d: Mapping[str, Any], path: str, tag: str, allowed: tuple[str, ...]) -> None:
    for key, value in d.items():
        # The SDK's model_dump() writes absent optionals as null: a None is taken as absent.
        if key not in allowed and value is not None:
            shown = key if isinstance(key, str) else repr(key)
            raise MalformedContentError(
                _key_path(path, shown) if isinstance(key, str) else f"{path}[{shown}]",
                f"unknown field for a {tag} block (allowed: {', '.join(sorted(allowed))})",
            )


def _required(d: Mapping[str, Any], key: str, path: str, tag: str) -> Any:
    value = d.get(key)
    if value is None:
        raise MalformedContentError(f"{path}.{key}", f"a {tag} block needs {key!r}")
    return value


def _audience(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise MalformedContentError(
            path, f"an audience must be a non-empty list of reader names, got {_type_name(value)}"
        )
    if not value:
        raise MalformedContentError(path, "an audience must name at least one reader (it is empty)")
    names = []
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise MalformedContentError(f"{path}[{i}]", f"a reader name must be a string, got {_type_name(name)}")
        names.append(_string(name, f"{path}[{i}]", non_empty=True))
    return tuple(names)


def _raw(d: Mapping[str, Any], path: str) -> Any:
    raw = d.get("raw")
    return None if raw is None else _json_value(raw, f"{path}.raw")


def _media_source(d: Mapping[str, Any], path: str, tag: str) -> dict[str, Any]:
    spath = f"{path}.source"
    source = _required(d, "source", path, tag)
    if not isinstance(source, Mapping):
        raise MalformedContentError(spath, f"expected an object, got {_type_name(source)}")
    kind = _string(_required(source, "type", spath, f"{tag} source"), f"{spath}.type")
    if kind == "base64":
        _check_keys(source, spath, f"base64 {tag} source", ("type", "media_type", "data"))
        media_type = _string(_required(source, "media_type", spath, f"{tag} source"), f"{spath}.media_type")
        allowed = IMAGE_MEDIA_TYPES if tag == "image" else DOCUMENT_MEDIA_TYPES
        if media_type not in allowed:
            raise MalformedContentError(
                f"{spath}.media_type", f"{media_type!r} is not one of {', '.join(sorted(allowed))}"
            )
        data = _string(_required(source, "data", spath, f"{tag} source"), f"{spath}.data", non_empty=True)
        return {"type": "base64", "media_type": media_type, "data": _canonical_base64(data, f"{spath}.data")}
    if kind == "url":
        _check_keys(source, spath, f"url {tag} source", ("type", "url"))
        url = _string(_required(source, "url", spath, f"{tag} source"), f"{spath}.url", non_empty=True)
        return {"type": "url", "url": url}
    if kind == "text" and tag == "document":
        _check_keys(source, spath, "text document source", ("type", "media_type", "data"))
        media_type = _string(_required(source, "media_type", spath, "text document source"), f"{spath}.media_type")
        if media_type != "text/plain":
            raise MalformedContentError(f"{spath}.media_type", f"a text document source is 'text/plain', not {media_type!r}")
        data = _string(_required(source, "data", spath, "text document source"), f"{spath}.data")
        return {"type": "text", "media_type": "text/plain", "data": data}
    kinds = "'base64', 'url' or 'text'" if tag == "document" else "'base64' or 'url'"
    raise MalformedContentError(f"{spath}.type", f"unknown {tag} source type {kind!r} (expected {kinds})")


def _decode_base64(data: str, path: str) -> bytes:
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedContentError(path, f"is not valid base64 ({exc})") from None


def _canonical_base64(data: str, path: str) -> str:
    raw = _decode_base64(data, path)
    # Stored media is re-encoded from its bytes, so keep the canonical spelling from the start:
    # the block a host wrote then equals the block it reads back.
    canonical = base64.b64encode(raw).decode("ascii")
    return data if canonical == data else canonical


def _validate_block(item: object, path: str, nested: bool) -> Block:
    if isinstance(item, BLOCK_TYPES):
        d: Mapping[str, Any] = _fields_of(item)
    elif isinstance(item, Mapping):
        d = item
    else:
        raise MalformedContentError(path, f"expected a content block (a dict or a block object), got {_type_name(item)}")
    tag = d.get("type")
    if tag is None:
        raise MalformedContentError(f"{path}.type", "missing: every block names its type")
    if not isinstance(tag, str) or tag not in _BLOCK_BY_TAG:
        raise MalformedContentError(
            f"{path}.type", f"unknown block type {tag!r} (expected one of {', '.join(_BLOCK_BY_TAG)})"
        )
    if nested and tag not in _NESTED_TAGS:
        raise MalformedContentError(
            f"{path}.type", f"a tool_result may hold only text, image and document blocks, not {tag!r}"
        )
    audience = d.get("audience")
    if audience is not None:
        if nested:
            raise MalformedContentError(
                f"{path}.audience", f"this {tag} block is nested in a tool_result; only a message's own "
                "top-level text and thinking blocks may carry an audience"
            )
        if tag not in ("text", "thinking"):
            raise MalformedContentError(
                f"{path}.audience", f"a {tag} block may not carry an audience; only a message's own "
                "top-level text and thinking blocks may"
            )
        audience = _audience(audience, f"{path}.audience")
    return _VALIDATORS[tag](d, path, audience)


def _v_text(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "text", ("type", "text", "audience", "cache_control", "raw"))
    text = _string(_required(d, "text", path, "text"), f"{path}.text")
    cache_control = d.get("cache_control")
    if cache_control is not None:
        if not isinstance(cache_control, Mapping):
            raise MalformedContentError(f"{path}.cache_control", f"expected an object, got {_type_name(cache_control)}")
        cache_control = _json_value(cache_control, f"{path}.cache_control")
        _string(_required(cache_control, "type", f"{path}.cache_control", "cache_control"), f"{path}.cache_control.type")
    return Text(text, audience=audience, cache_control=cache_control, raw=_raw(d, path))


def _v_thinking(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "thinking", ("type", "thinking", "signature", "audience", "raw"))
    thinking = _string(_required(d, "thinking", path, "thinking"), f"{path}.thinking")
    signature = d.get("signature")
    if signature is not None:
        signature = _string(signature, f"{path}.signature")
    return Thinking(thinking, signature, audience=audience, raw=_raw(d, path))


def _v_redacted(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "redacted_thinking", ("type", "data", "raw"))
    data = _string(_required(d, "data", path, "redacted_thinking"), f"{path}.data")
    return RedactedThinking(data, raw=_raw(d, path))


def _v_image(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "image", ("type", "source", "raw"))
    return Image(_media_source(d, path, "image"), raw=_raw(d, path))


def _v_document(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "document", ("type", "source", "title", "raw"))
    title = d.get("title")
    if title is not None:
        title = _string(title, f"{path}.title")
    return Document(_media_source(d, path, "document"), title=title, raw=_raw(d, path))


def _v_tool_use(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "tool_use", ("type", "id", "name", "input", "raw"))
    tool_id = _tool_id(_required(d, "id", path, "tool_use"), f"{path}.id")
    name = _string(_required(d, "name", path, "tool_use"), f"{path}.name", non_empty=True)
    tool_input = _required(d, "input", path, "tool_use")
    if not isinstance(tool_input, Mapping):
        raise MalformedContentError(f"{path}.input", f"expected an object, got {_type_name(tool_input)}")
    # Keys inside input (an "audience" among them) are the tool's data and mean nothing here (B2).
    return ToolUse(tool_id, name, _json_value(tool_input, f"{path}.input"), raw=_raw(d, path))


def _v_tool_result(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "tool_result", ("type", "tool_use_id", "content", "is_error", "raw"))
    if d.get("tool_use_id") is None:
        raise MalformedContentError(f"{path}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
    tool_use_id = _tool_id(d["tool_use_id"], f"{path}.tool_use_id")
    is_error = d.get("is_error", False)
    if is_error is None:
        is_error = False
    if type(is_error) is not bool:
        raise MalformedContentError(f"{path}.is_error", f"expected a bool, got {_type_name(is_error)}")
    content = d.get("content")
    cpath = f"{path}.content"
    if content is None:
        content = ""  # the API lets a tool_result carry no content
    elif isinstance(content, str):
        content = _string(content, cpath)
    elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        content = tuple(_validate_block(item, f"{cpath}[{i}]", True) for i, item in enumerate(content))
    else:
        raise MalformedContentError(cpath, f"expected a string or a list of blocks, got {_type_name(content)}")
    return ToolResult(tool_use_id, content, is_error=is_error, raw=_raw(d, path))


_VALIDATORS: dict[str, Callable[[Mapping[str, Any], str, Any], Block]] = {
    "text": _v_text,
    "thinking": _v_thinking,
    "redacted_thinking": _v_redacted,
    "image": _v_image,
    "document": _v_document,
    "tool_use": _v_tool_use,
    "tool_result": _v_tool_result,
}


def blocks_from_content(content: ContentLike, *, path: str = "content") -> tuple[Block, ...]:
    """Validated, normalised blocks from a host's content (M6, B1, B2).

    A ``str`` is one text block. Raises ``MalformedContentError`` naming the place, e.g.
    ``content[2].source.media_type``; empty content is refused.
    """
    if isinstance(content, str):
        if not content:
            raise MalformedContentError(path, "content is empty: give at least one block or some text")
        return (Text(_string(content, path)),)
    if isinstance(content, (Mapping, bytes, bytearray)) or not isinstance(content, Sequence):
        raise MalformedContentError(path, f"expected a string or a list of blocks, got {_type_name(content)}")
    if not content:
        raise MalformedContentError(path, "content is empty: give at least one block or some text")
    blocks = tuple(_validate_block(item, f"{path}[{i}]", False) for i, item in enumerate(content))
    _refuse_repeated_tool_ids(blocks, path)
    return blocks


def _refuse_repeated_tool_ids(blocks: Sequence[Block], path: str) -> None:
    """Two calls of one message with one id: no provider takes them, and no rendering could tell
    which call a result answers (P4, P8). (A result repeated for one call is left to compile's
    pairing, which keeps one.)"""
    seen: dict[str, int] = {}
    for i, block in enumerate(blocks):
        if isinstance(block, ToolUse):
            first = seen.setdefault(block.id, i)
            if first != i:
                raise MalformedContentError(f"{path}[{i}].id", f"{block.id!r} is also {path}[{first}]'s: each call "
                                                               f"in a message needs an id of its own")


def validate_participant(participant: object, *, path: str = "participant") -> str:
    """The participant name, which must be a non-empty string (M6)."""
    if not isinstance(participant, str):
        raise MalformedContentError(path, f"a participant must be a non-empty string, got {_type_name(participant)}")
    return _string(participant, path, non_empty=True)


def validate_metadata(metadata: object, *, path: str = "metadata") -> Mapping[str, Any] | None:
    """A JSON-native copy of ``metadata`` (None, or an object with string keys) (M6)."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise MalformedContentError(path, f"metadata must be an object with string keys, got {_type_name(metadata)}")
    copied: Mapping[str, Any] = _json_value(metadata, path)
    return copied


def validate_timestamp_ms(value: object, *, path: str = "timestamp_ms") -> int:
    """An integer epoch-millisecond time in 0..2**53 (M1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedContentError(path, f"must be an integer epoch millisecond, got {_type_name(value)}")
    if not 0 <= value <= 2**53:
        raise MalformedContentError(path, f"must be an epoch millisecond in 0..2**53, got {checks.shown(value)}")
    return int(value)


def find_audience(blocks: ContentLike, *, path: str) -> str | None:
    """The path of the first block carrying an audience, at the top level or nested (B3, B4).

    Works on unvalidated content too (attrs blocks or dicts); a plain string carries none.
    """
    if isinstance(blocks, str) or not isinstance(blocks, Sequence):
        return None
    for i, block in enumerate(blocks):
        where = f"{path}[{i}]"
        if isinstance(block, Mapping):
            audience = block.get("audience")
            nested = block.get("content") if block.get("type") == "tool_result" else None
        else:
            audience = getattr(block, "audience", None)
            nested = block.content if isinstance(block, ToolResult) else None
        if audience is not None:
            return where
        if nested is not None:
            found = find_audience(nested, path=f"{where}.content")
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------------------------
# Storage form
# --------------------------------------------------------------------------------------------


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
    elif cls is ToolResult:
        content = block.content
        d = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": content if isinstance(content, str) else [_enc_block(b) for b in content],
        }
        if block.is_error:
            d["is_error"] = True
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
    elif cls is Document:
        d = {"type": "document", "source": block.source}
        if block.title is not None:
            d["title"] = block.title
    else:
        raise TypeError(f"not a content block: {block!r}")
    if block.raw is not None:
        d["raw"] = block.raw
    return d


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
    return ToolUse(d["id"], d["name"], d["input"], raw=d.get("raw"))


def _dec_tool_result(d: dict[str, Any]) -> Block:
    content = d.get("content", "")
    if type(content) is list:
        content = tuple([_DECODERS[b["type"]](b) for b in content])
    return ToolResult(d["tool_use_id"], content, is_error=d.get("is_error", False), raw=d.get("raw"))


_DECODERS: dict[str, Callable[[dict[str, Any]], Block]] = {
    "text": _dec_text,
    "thinking": _dec_thinking,
    "redacted_thinking": lambda d: RedactedThinking(d["data"], raw=d.get("raw")),
    "image": lambda d: Image(d["source"], raw=d.get("raw")),
    "document": lambda d: Document(d["source"], title=d.get("title"), raw=d.get("raw")),
    "tool_use": _dec_tool_use,
    "tool_result": _dec_tool_result,
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
    Image: (("source", (dict,)),),
    Document: (("source", (dict,)), ("title", (str, type(None)))),
    ToolUse: (("id", (str,)), ("name", (str,)), ("input", (dict,))),
    ToolResult: (("tool_use_id", (str,)), ("content", (str, tuple)), ("is_error", (bool,))),
}


def _check_blocks(blocks: Sequence[Block]) -> None:
    for block in blocks:
        for field, types in _STORED_FIELDS[type(block)]:
            if type(getattr(block, field)) not in types:
                raise TypeError(f"a {block.type} block's {field} is {type(getattr(block, field)).__name__}")
        if type(block) is ToolResult and type(block.content) is tuple:
            _check_blocks(block.content)


# --------------------------------------------------------------------------------------------
# Media blobs (M4)
# --------------------------------------------------------------------------------------------


def _has_media(blocks: Sequence[Block]) -> bool:
    for block in blocks:
        kind = type(block)
        if kind is Image or kind is Document or kind is ToolResult:
            return True
    return False


def extract_blobs(
    blocks: Sequence[Block], *, path: str = "content"
) -> tuple[tuple[Block, ...], list[tuple[str, bytes, str]]]:
    """Blocks with base64 media replaced by ``blob_ref`` sources, and each distinct blob (sha256 hex, bytes, media_type)."""
    blobs: dict[str, tuple[str, bytes, str]] = {}

    def swap(block: Block, where: str) -> Block:
        if type(block) is Image or type(block) is Document:
            source = block.source
            if source.get("type") != "base64":
                return block
            raw = _decode_base64(source["data"], f"{where}.source.data")
            digest = hashlib.sha256(raw).hexdigest()
            blobs.setdefault(digest, (digest, raw, source["media_type"]))
            ref = {"type": "blob_ref", "sha256": digest, "media_type": source["media_type"]}
            return attrs.evolve(block, source=ref)
        if type(block) is ToolResult and not isinstance(block.content, str) and _has_media(block.content):
            nested = tuple(swap(b, f"{where}.content[{i}]") for i, b in enumerate(block.content))
            return attrs.evolve(block, content=nested)
        return block

    if not _has_media(blocks):
        return tuple(blocks), []
    out = tuple(swap(b, f"{path}[{i}]") for i, b in enumerate(blocks))
    return out, list(blobs.values())


def _filled(block: Block, get_blob: Callable[[str], tuple[bytes, str] | None]) -> Block:
    # A module-level helper, not a closure: a self-referencing closure is a reference cycle that
    # would keep ``get_blob`` (and the read transaction it holds) alive until a GC pass.
    if type(block) is Image or type(block) is Document:
        source = block.source
        if source.get("type") != "blob_ref":
            return block
        found = get_blob(source["sha256"])
        if found is None:
            return block  # block_to_api renders it as a notice rather than fail the whole read
        data = base64.b64encode(found[0]).decode("ascii")
        return attrs.evolve(
            block, source={"type": "base64", "media_type": source["media_type"], "data": data}
        )
    if type(block) is ToolResult and not isinstance(block.content, str) and _has_media(block.content):
        return attrs.evolve(block, content=tuple(_filled(b, get_blob) for b in block.content))
    return block


def resolve_blobs(
    blocks: Sequence[Block], get_blob: Callable[[str], tuple[bytes, str] | None]
) -> tuple[Block, ...]:
    """Blocks with ``blob_ref`` sources put back as base64; a missing blob leaves its ref in place."""
    if not _has_media(blocks):
        return tuple(blocks)
    return tuple(_filled(b, get_blob) for b in blocks)


# --------------------------------------------------------------------------------------------
# API form
# --------------------------------------------------------------------------------------------


def _api_source(block: Image | Document) -> dict[str, Any] | None:
    source = block.source
    return None if source.get("type") == "blob_ref" else dict(source)


def block_to_api(block: Block) -> dict[str, Any]:
    """The Anthropic Messages API dict for ``block``: no audience, no raw; cache_control kept."""
    if type(block) is Text:
        d: dict[str, Any] = {"type": "text", "text": block.text}
        if block.cache_control is not None:
            d["cache_control"] = dict(block.cache_control)
        return d
    if type(block) is ToolUse:
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
    if type(block) is ToolResult:
        content = block.content
        d = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": content if isinstance(content, str) else [block_to_api(b) for b in content],
        }
        if block.is_error:
            d["is_error"] = True
        return d
    if type(block) is Thinking:
        d = {"type": "thinking", "thinking": block.thinking}
        if block.signature is not None:
            d["signature"] = block.signature
        return d
    if type(block) is RedactedThinking:
        return {"type": "redacted_thinking", "data": block.data}
    if type(block) is Image or type(block) is Document:
        source = _api_source(block)
        if source is None:
            digest = block.source.get("sha256", "?")
            return {"type": "text", "text": f"[{block.type} unavailable: stored media {digest} is missing]"}
        d = {"type": block.type, "source": source}
        if type(block) is Document and block.title is not None:
            d["title"] = block.title
        return d
    raise TypeError(f"not a content block: {block!r}")


def _api_item(item: Any) -> Mapping[str, Any] | None:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)  # an SDK response object
    return dump() if callable(dump) else None


def blocks_from_api(items: Sequence[Any]) -> tuple[Block, ...]:
    """Blocks from a model response's content: lenient; block types ctxrt doesn't keep are skipped."""
    out: list[Block] = []
    for item in items:
        d = _api_item(item)
        if d is None:
            continue
        tag = d.get("type")
        if tag == "text":
            cache_control = d.get("cache_control")
            out.append(Text(str(d.get("text") or ""), cache_control=dict(cache_control) if cache_control else None))
        elif tag == "thinking":
            out.append(Thinking(str(d.get("thinking") or ""), d.get("signature")))
        elif tag == "redacted_thinking":
            out.append(RedactedThinking(str(d.get("data") or "")))
        elif tag == "tool_use":
            tool_input = d.get("input")
            out.append(
                ToolUse(str(d.get("id") or ""), str(d.get("name") or ""), dict(tool_input) if isinstance(tool_input, Mapping) else {})
            )
        elif tag == "tool_result":
            content = d.get("content")
            nested: str | tuple[Block, ...] = (
                content if isinstance(content, str) else blocks_from_api(content) if isinstance(content, list) else ""
            )
            out.append(ToolResult(str(d.get("tool_use_id") or ""), nested, is_error=bool(d.get("is_error"))))
        elif tag in ("image", "document") and isinstance(d.get("source"), Mapping):
            source = dict(d["source"])
            out.append(Image(source) if tag == "image" else Document(source, title=d.get("title")))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# The private converter
# --------------------------------------------------------------------------------------------


def _structure_block(data: Any, _: Any) -> Block:
    if not isinstance(data, dict):
        raise StoreFormatError(f"a stored block must be an object, got {_type_name(data)}")
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
