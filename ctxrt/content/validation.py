"""Checks of the content a host hands in, and its normalised blocks (docs/behaviours.md M6, B1, B2).

What a host passes (attrs blocks or Anthropic Messages API dicts) is judged field by field here:
``blocks_from_content`` checks every field and every audience rule and returns normalised,
JSON-native blocks, or raises ``MalformedContentError`` naming the exact place
(``content[2].source.media_type``); participants, metadata and timestamps are checked alike. It
stands alone because it is the only strict form: the storage form (``codec``) trusts what passed
here, and the API form (``wire``) reads model responses leniently.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .. import checks
from .blocks import (
    AUDIENCE_TYPES,
    BLOCK_TYPES,
    Audio,
    Block,
    ContentLike,
    Document,
    GeneratedImage,
    Image,
    RedactedThinking,
    Text,
    Thinking,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
)
from ..errors import MalformedContentError

# The media types the Messages API accepts for base64 sources.
IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
DOCUMENT_MEDIA_TYPES = frozenset({"application/pdf"})
# Audio and video are kept whatever their format (a request form decides what it can send).
_AV_MEDIA_TYPE = re.compile(r"(audio|video)/[a-z0-9][a-z0-9.+-]*\Z")
MAX_TOKEN_ESTIMATE = 2**31 - 1
# Deeper JSON is refused at the edge so no later walk (encode, estimate, compare) can hit the
# interpreter's recursion limit on stored data.
MAX_JSON_DEPTH = 200
# Larger integers are refused at the edge: Python's default int_max_str_digits (4,300) would keep
# any process from writing them as JSON, or (when a host lifted it) from reading them back.
MAX_INT_BITS = 14_000

_BLOCK_BY_TAG: dict[str, type[Block]] = {cls.type: cls for cls in BLOCK_TYPES}
_AUDIENCE_TAGS = tuple(cls.type for cls in AUDIENCE_TYPES)
_NESTED_TAGS = ("text", "image", "document")  # what the API lets a tool_result hold
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What the Messages API accepts as a tool id (P8); ingress refuses others, and wire maps ids
# stored before it did. Tool names are kept as written (Knowledge reads phases from names like
# "mcpl:search", T7); wire rewrites them.
TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+\Z")


def type_name(value: object) -> str:
    """The name of ``value``'s type as refusals show it (``None`` for None)."""
    return "None" if value is None else type(value).__name__


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.match(key) else f"{path}[{json.dumps(key)}]"


def _string(value: object, path: str, *, non_empty: bool = False) -> str:
    if type(value) is not str:
        if not isinstance(value, str):
            raise MalformedContentError(path, f"expected a string, got {type_name(value)}")
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


def _tool_id(value: object, path: str) -> str:
    tool_id = _string(value, path, non_empty=True)
    if not TOOL_ID.match(tool_id):
        raise MalformedContentError(
            path, f"tool id {tool_id!r} is not one the Messages API accepts: use only letters, digits, "
            "'_' and '-' (^[a-zA-Z0-9_-]+$)"
        )
    return tool_id


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
                    f"{path}[{key!r}]", f"JSON object keys must be strings, got {type_name(key)}"
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
    raise MalformedContentError(path, f"is not JSON-serialisable ({type_name(value)})")


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
            path, f"an audience must be a non-empty list of reader names, got {type_name(value)}"
        )
    if not value:
        raise MalformedContentError(path, "an audience must name at least one reader (it is empty)")
    names = []
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise MalformedContentError(f"{path}[{i}]", f"a reader name must be a string, got {type_name(name)}")
        names.append(_string(name, f"{path}[{i}]", non_empty=True))
    return tuple(names)


def _raw(d: Mapping[str, Any], path: str) -> Any:
    raw = d.get("raw")
    return None if raw is None else _json_value(raw, f"{path}.raw")


def _media_source(d: Mapping[str, Any], path: str, tag: str) -> dict[str, Any]:
    spath = f"{path}.source"
    source = _required(d, "source", path, tag)
    if not isinstance(source, Mapping):
        raise MalformedContentError(spath, f"expected an object, got {type_name(source)}")
    kind = _string(_required(source, "type", spath, f"{tag} source"), f"{spath}.type")
    if kind == "base64":
        _check_keys(source, spath, f"base64 {tag} source", ("type", "media_type", "data"))
        media_type = _string(_required(source, "media_type", spath, f"{tag} source"), f"{spath}.media_type")
        _check_media_type(media_type, f"{spath}.media_type", tag)
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


def _check_media_type(media_type: str, path: str, tag: str) -> None:
    if tag in ("audio", "video"):
        if not _AV_MEDIA_TYPE.match(media_type) or not media_type.startswith(f"{tag}/"):
            raise MalformedContentError(path, f"{media_type!r} is not of the form {tag}/<subtype>, as {tag}/mp4")
        return
    allowed = DOCUMENT_MEDIA_TYPES if tag == "document" else IMAGE_MEDIA_TYPES
    if media_type not in allowed:
        raise MalformedContentError(path, f"{media_type!r} is not one of {', '.join(sorted(allowed))}")


def _optional_string(d: Mapping[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    return None if value is None else _string(value, f"{path}.{key}")


def _token_estimate(d: Mapping[str, Any], path: str) -> int | None:
    value = d.get("token_estimate")
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_ESTIMATE:
        raise MalformedContentError(f"{path}.token_estimate", f"a token estimate is an integer in "
                                    f"0..{MAX_TOKEN_ESTIMATE:,}, got {checks.shown(value)}")
    return int(value)


def _duration(d: Mapping[str, Any], path: str) -> float | None:
    value = d.get("duration")
    if value is None:
        return None
    if isinstance(value, int) and type(value) is not bool and 0 <= value < 2**53:
        return int(value)
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return float(value)
    raise MalformedContentError(f"{path}.duration", f"a duration is a finite number of seconds, 0 or more, "
                                f"got {checks.shown(value)}")


def decode_base64(data: str, path: str) -> bytes:
    """The bytes of strict base64 ``data``; ``MalformedContentError`` at ``path`` if it isn't."""
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedContentError(path, f"is not valid base64 ({exc})") from None


def _canonical_base64(data: str, path: str) -> str:
    raw = decode_base64(data, path)
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
        raise MalformedContentError(path, f"expected a content block (a dict or a block object), got {type_name(item)}")
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
                "top-level blocks may carry an audience"
            )
        if tag not in _AUDIENCE_TAGS:
            raise MalformedContentError(
                f"{path}.audience", f"a {tag} block may not carry an audience; only a message's own "
                f"top-level {', '.join(_AUDIENCE_TAGS)} blocks may"
            )
        audience = _audience(audience, f"{path}.audience")
    return _VALIDATORS[tag](d, path, audience)


def _v_text(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "text", ("type", "text", "audience", "cache_control", "raw"))
    text = _string(_required(d, "text", path, "text"), f"{path}.text")
    cache_control = d.get("cache_control")
    if cache_control is not None:
        if not isinstance(cache_control, Mapping):
            raise MalformedContentError(f"{path}.cache_control", f"expected an object, got {type_name(cache_control)}")
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
    _check_keys(d, path, "image", ("type", "source", "token_estimate", "source_url", "raw"))
    return Image(_media_source(d, path, "image"), token_estimate=_token_estimate(d, path),
                 source_url=_optional_string(d, "source_url", path), raw=_raw(d, path))


def _v_document(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "document", ("type", "source", "title", "filename", "raw"))
    return Document(_media_source(d, path, "document"), title=_optional_string(d, "title", path),
                    filename=_optional_string(d, "filename", path), raw=_raw(d, path))


def _v_audio(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "audio", ("type", "source", "duration", "transcript", "audience", "raw"))
    return Audio(_media_source(d, path, "audio"), duration=_duration(d, path),
                 transcript=_optional_string(d, "transcript", path), audience=audience, raw=_raw(d, path))


def _v_video(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "video", ("type", "source", "duration", "transcript", "audience", "raw"))
    return Video(_media_source(d, path, "video"), duration=_duration(d, path),
                 transcript=_optional_string(d, "transcript", path), audience=audience, raw=_raw(d, path))


def _v_generated_image(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "generated_image",
                ("type", "source", "prompt", "is_preview", "token_estimate", "audience", "raw"))
    is_preview = d.get("is_preview", False)
    if is_preview is None:
        is_preview = False
    if type(is_preview) is not bool:
        raise MalformedContentError(f"{path}.is_preview", f"expected a bool, got {type_name(is_preview)}")
    return GeneratedImage(_media_source(d, path, "generated_image"), prompt=_optional_string(d, "prompt", path),
                          is_preview=is_preview, token_estimate=_token_estimate(d, path), audience=audience,
                          raw=_raw(d, path))


def _tool_input(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    tool_input = d["input"]
    if not isinstance(tool_input, Mapping):
        raise MalformedContentError(f"{path}.input", f"expected an object, got {type_name(tool_input)}")
    # Keys inside input (an "audience" among them) are the tool's data and mean nothing here (B2).
    checked: dict[str, Any] = _json_value(tool_input, f"{path}.input")
    return checked


def _v_tool_use(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "tool_use", ("type", "id", "name", "input", "raw_xml", "unparseable_input", "raw"))
    tool_id = _tool_id(_required(d, "id", path, "tool_use"), f"{path}.id")
    name = _string(_required(d, "name", path, "tool_use"), f"{path}.name", non_empty=True)
    _required(d, "input", path, "tool_use")
    return ToolUse(tool_id, name, _tool_input(d, path), raw_xml=_optional_string(d, "raw_xml", path),
                   unparseable_input=_optional_string(d, "unparseable_input", path), raw=_raw(d, path))


def _v_tool_attempt(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "tool_attempt", ("type", "name", "input", "raw_xml", "reason", "audience", "raw"))
    name = d.get("name")
    if name is not None:
        name = _string(name, f"{path}.name", non_empty=True)
    raw_xml = _optional_string(d, "raw_xml", path)
    if name is None and raw_xml is None:
        raise MalformedContentError(f"{path}.name", "a tool_attempt needs the tool's 'name' or the call as "
                                                    "written ('raw_xml')")
    tool_input = None if d.get("input") is None else _tool_input(d, path)
    return ToolAttempt(name, tool_input, raw_xml=raw_xml, reason=_optional_string(d, "reason", path),
                       audience=audience, raw=_raw(d, path))


def _v_tool_notice(d: Mapping[str, Any], path: str, audience: tuple[str, ...] | None) -> Block:
    _check_keys(d, path, "tool_notice", ("type", "notices", "tool_name", "audience", "raw"))
    notices = _required(d, "notices", path, "tool_notice")
    if isinstance(notices, (str, bytes, bytearray)) or not isinstance(notices, Sequence) or not notices:
        got = "an empty list" if isinstance(notices, Sequence) and not notices else type_name(notices)
        raise MalformedContentError(f"{path}.notices", f"expected a non-empty list of strings, got {got}")
    texts = tuple(_string(notice, f"{path}.notices[{i}]", non_empty=True) for i, notice in enumerate(notices))
    return ToolNotice(texts, tool_name=_optional_string(d, "tool_name", path), audience=audience, raw=_raw(d, path))


def _v_tool_result(d: Mapping[str, Any], path: str, audience: object) -> Block:
    _check_keys(d, path, "tool_result", ("type", "tool_use_id", "content", "is_error", "tool_name", "raw"))
    if d.get("tool_use_id") is None:
        raise MalformedContentError(f"{path}.tool_use_id", "a tool_result needs the id of the tool_use it answers")
    tool_use_id = _tool_id(d["tool_use_id"], f"{path}.tool_use_id")
    is_error = d.get("is_error", False)
    if is_error is None:
        is_error = False
    if type(is_error) is not bool:
        raise MalformedContentError(f"{path}.is_error", f"expected a bool, got {type_name(is_error)}")
    content = d.get("content")
    cpath = f"{path}.content"
    if content is None:
        content = ""  # the API lets a tool_result carry no content
    elif isinstance(content, str):
        content = _string(content, cpath)
    elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        content = tuple(_validate_block(item, f"{cpath}[{i}]", True) for i, item in enumerate(content))
    else:
        raise MalformedContentError(cpath, f"expected a string or a list of blocks, got {type_name(content)}")
    return ToolResult(tool_use_id, content, is_error=is_error, tool_name=_optional_string(d, "tool_name", path),
                      raw=_raw(d, path))


_VALIDATORS: dict[str, Callable[[Mapping[str, Any], str, Any], Block]] = {
    "text": _v_text,
    "thinking": _v_thinking,
    "redacted_thinking": _v_redacted,
    "image": _v_image,
    "document": _v_document,
    "tool_use": _v_tool_use,
    "tool_result": _v_tool_result,
    "audio": _v_audio,
    "video": _v_video,
    "generated_image": _v_generated_image,
    "tool_attempt": _v_tool_attempt,
    "tool_notice": _v_tool_notice,
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
        raise MalformedContentError(path, f"expected a string or a list of blocks, got {type_name(content)}")
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
        raise MalformedContentError(path, f"a participant must be a non-empty string, got {type_name(participant)}")
    return _string(participant, path, non_empty=True)


def validate_metadata(metadata: object, *, path: str = "metadata") -> Mapping[str, Any] | None:
    """A JSON-native copy of ``metadata`` (None, or an object with string keys) (M6)."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise MalformedContentError(path, f"metadata must be an object with string keys, got {type_name(metadata)}")
    copied: Mapping[str, Any] = _json_value(metadata, path)
    return copied


def validate_timestamp_ms(value: object, *, path: str = "timestamp_ms") -> int:
    """An integer epoch-millisecond time in 0..2**53 (M1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedContentError(path, f"must be an integer epoch millisecond, got {type_name(value)}")
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
