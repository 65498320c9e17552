"""The Messages API's request rules as one checker (P8).

``violations(body)`` lists every rule a ``POST /v1/messages`` body breaks, each as a sentence
naming the place (``messages[3].content[0]``); an empty list means the API would accept the
body as far as these rules go. It is used by ``CompileResult.to_anthropic(strict=True)``, by
the local Messages API server in ``ctxrt.testing`` (which answers 400 with the list) and by
the tests. It judges the request's shape only, never the model, credentials or tool schemas.

The rules (P8):

- ``messages`` is a non-empty list whose first turn is a user turn, and roles alternate;
- no text block is empty or whitespace-only, nested ones in tool_result content included;
- every tool_use is answered by a tool_result in the next turn, the results first in that turn,
  and every tool_result answers a tool_use of the previous turn;
- tool ids match ``^[a-zA-Z0-9_-]+$`` and tool names ``^[a-zA-Z0-9_-]{1,64}$``;
- at most 4 ``cache_control`` markers in the whole request (system blocks, tools and blocks
  nested in tool_result content counted); none on thinking, redacted thinking or empty text;
- a final assistant turn does not end in whitespace;
- at most 100 images in a request, and no base64 image over 5 MB (5,242,880 bytes of data);
- no field the API doesn't know (``audience``, ``raw``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_CACHE_CONTROLS = 4
MAX_IMAGES = 100
MAX_IMAGE_DATA_BYTES = 5 * 1024 * 1024  # a base64 image's data, as the API counts it
TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+\Z")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")

# Fields of the request body this checker knows; anything else is reported as unknown.
BODY_FIELDS = frozenset({
    "model", "max_tokens", "messages", "system", "tools", "tool_choice", "metadata", "stop_sequences",
    "stream", "temperature", "top_k", "top_p", "thinking", "service_tier", "container", "mcp_servers",
})
MESSAGE_FIELDS = frozenset({"role", "content"})
_SOURCE_FIELDS = ("type", "media_type", "data", "url", "file_id", "content")
BLOCK_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "image": frozenset({"type", "source", "cache_control"}),
    "document": frozenset({"type", "source", "title", "context", "citations", "cache_control"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}
NESTED_TYPES = frozenset({"text", "image", "document"})  # what a tool_result's content may hold


def _blank(text: object) -> bool:
    return not isinstance(text, str) or not text.strip()


class _Checker:
    def __init__(self) -> None:
        self.found: list[str] = []
        self.cache_controls = 0
        self.images = 0

    def add(self, where: str, what: str) -> None:
        self.found.append(f"{where}: {what}")

    def block(self, block: Any, where: str, *, nested: bool = False) -> None:
        if not isinstance(block, Mapping):
            self.add(where, f"a content block must be an object, not {type(block).__name__}")
            return
        kind = block.get("type")
        allowed = BLOCK_FIELDS.get(kind) if isinstance(kind, str) else None
        if allowed is None:
            self.add(f"{where}.type", f"unknown block type {kind!r}")
            return
        if nested and kind not in NESTED_TYPES:
            self.add(f"{where}.type", f"a tool_result's content may hold only text, image and document, not {kind}")
        for key in block:
            if key not in allowed:
                self.add(f"{where}.{key}", f"unknown field for a {kind} block")
        if "cache_control" in block:
            self.cache_controls += 1
        if kind == "text":
            if _blank(block.get("text")):
                self.add(where, "text content blocks must contain non-whitespace text")
                if "cache_control" in block:
                    self.add(f"{where}.cache_control", "cache_control cannot be set on empty text blocks")
        elif kind == "tool_use":
            tool_id, name = block.get("id"), block.get("name")
            if not isinstance(tool_id, str) or not TOOL_ID.match(tool_id):
                self.add(f"{where}.id", f"tool_use id {tool_id!r} does not match ^[a-zA-Z0-9_-]+$")
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                self.add(f"{where}.name", f"tool name {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
            if not isinstance(block.get("input"), Mapping):
                self.add(f"{where}.input", "a tool_use input must be an object")
        elif kind == "tool_result":
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str) or not TOOL_ID.match(tool_id):
                self.add(f"{where}.tool_use_id", f"tool_use_id {tool_id!r} does not match ^[a-zA-Z0-9_-]+$")
            content = block.get("content")
            if isinstance(content, list):
                for i, inner in enumerate(content):
                    self.block(inner, f"{where}.content[{i}]", nested=True)
            elif content is not None and not isinstance(content, str):
                self.add(f"{where}.content", "a tool_result's content must be a string or a list of blocks")
        elif kind in ("image", "document"):
            source = block.get("source")
            if not isinstance(source, Mapping):
                self.add(f"{where}.source", "a media block needs a source object")
            else:
                for key in source:
                    if key not in _SOURCE_FIELDS:
                        self.add(f"{where}.source.{key}", "unknown field for a source")
                data = source.get("data")
                if kind == "image" and isinstance(data, str) and len(data) > MAX_IMAGE_DATA_BYTES:
                    self.add(f"{where}.source.data", f"image exceeds 5 MB maximum: {len(data):,} bytes > "
                                                     f"{MAX_IMAGE_DATA_BYTES:,} bytes")
            if kind == "image":
                self.images += 1

    def check(self, body: Any) -> list[str]:
        if not isinstance(body, Mapping):
            return ["body: must be a JSON object"]
        for key in body:
            if key not in BODY_FIELDS:
                self.add(str(key), "unknown field of the request body")
        self.system(body.get("system"))
        tools = body.get("tools")
        if isinstance(tools, list):
            for i, tool in enumerate(tools):
                if isinstance(tool, Mapping):
                    if "cache_control" in tool:
                        self.cache_controls += 1
                    name = tool.get("name")
                    if "type" not in tool and (not isinstance(name, str) or not TOOL_NAME.match(name)):
                        self.add(f"tools[{i}].name", f"tool name {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
        self.messages(body.get("messages"))
        if self.images > MAX_IMAGES:
            self.add("messages", f"too many images: at most {MAX_IMAGES} per request, found {self.images}")
        if self.cache_controls > MAX_CACHE_CONTROLS:
            self.add("body", f"a maximum of {MAX_CACHE_CONTROLS} blocks with cache_control may be provided; "
                             f"found {self.cache_controls}")
        return self.found

    def system(self, system: Any) -> None:
        if system is None or isinstance(system, str):
            return
        if not isinstance(system, list):
            self.add("system", "must be a string or a list of text blocks")
            return
        for i, block in enumerate(system):
            if isinstance(block, Mapping) and block.get("type") != "text":
                self.add(f"system[{i}].type", "system blocks must be text")
            self.block(block, f"system[{i}]")

    def messages(self, messages: Any) -> None:
        if not isinstance(messages, list):
            self.add("messages", "must be a list")
            return
        if not messages:
            self.add("messages", "at least one message is required")
            return
        turns: list[tuple[str, list[Any]]] = []
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(message, Mapping):
                self.add(where, "a message must be an object")
                turns.append(("?", []))
                continue
            for key in message:
                if key not in MESSAGE_FIELDS:
                    self.add(f"{where}.{key}", "unknown field of a message")
            role = message.get("role")
            if role not in ("user", "assistant"):
                self.add(f"{where}.role", f"must be 'user' or 'assistant', not {role!r}")
            content = message.get("content")
            if isinstance(content, str):
                if _blank(content):
                    self.add(f"{where}.content", "text content must contain non-whitespace text")
                blocks: list[Any] = [{"type": "text", "text": content}]
            elif isinstance(content, list):
                if not content:
                    self.add(f"{where}.content", "a message needs at least one content block")
                blocks = content
                for j, block in enumerate(blocks):
                    self.block(block, f"{where}.content[{j}]")
                    if isinstance(block, Mapping) and block.get("type") in ("thinking", "redacted_thinking"):
                        if "cache_control" in block:
                            self.add(f"{where}.content[{j}].cache_control",
                                     "cache_control cannot be set on thinking blocks")
                        if role != "assistant":
                            self.add(f"{where}.content[{j}]", "thinking blocks belong to assistant turns")
                    if isinstance(block, Mapping) and block.get("type") == "tool_use" and role != "assistant":
                        self.add(f"{where}.content[{j}]", "tool_use blocks belong to assistant turns")
                    if isinstance(block, Mapping) and block.get("type") == "tool_result" and role != "user":
                        self.add(f"{where}.content[{j}]", "tool_result blocks belong to user turns")
            else:
                self.add(f"{where}.content", "must be a string or a list of blocks")
                blocks = []
            turns.append((role if isinstance(role, str) else "?", blocks))
        if turns[0][0] != "user":
            self.add("messages[0].role", "the first message must use the user role")
        for i in range(1, len(turns)):
            if turns[i][0] == turns[i - 1][0]:
                self.add(f"messages[{i}].role", f"roles must alternate; two {turns[i][0]} turns in a row")
        self.tool_pairs(turns)
        role, blocks = turns[-1]
        if role == "assistant" and blocks:
            last = blocks[-1]
            if isinstance(last, Mapping) and last.get("type") == "text" and isinstance(last.get("text"), str):
                if last["text"] != last["text"].rstrip():
                    self.add(f"messages[{len(turns) - 1}]", "final assistant content cannot end with trailing whitespace")

    def tool_pairs(self, turns: Sequence[tuple[str, list[Any]]]) -> None:
        def ids(blocks: list[Any], kind: str, key: str) -> list[Any]:
            return [b.get(key) for b in blocks if isinstance(b, Mapping) and b.get("type") == kind]

        for i, (_, blocks) in enumerate(turns):
            uses = ids(blocks, "tool_use", "id")
            if uses:
                following = turns[i + 1][1] if i + 1 < len(turns) else []
                answered = set(ids(following, "tool_result", "tool_use_id"))
                for tool_id in uses:
                    if tool_id not in answered:
                        self.add(f"messages[{i}]", f"tool_use {tool_id!r} has no tool_result in the next message")
            results = ids(blocks, "tool_result", "tool_use_id")
            if results:
                asked = set(ids(turns[i - 1][1], "tool_use", "id")) if i > 0 else set()
                for tool_id in results:
                    if tool_id not in asked:
                        self.add(f"messages[{i}]", f"tool_result {tool_id!r} answers no tool_use of the previous message")
                kinds = [isinstance(b, Mapping) and b.get("type") == "tool_result" for b in blocks]
                if False in kinds and True in kinds[kinds.index(False):]:
                    self.add(f"messages[{i}]", "tool_result blocks must come first in their message")


def violations(body: Any) -> list[str]:
    """Every Messages API request rule ``body`` breaks (P8), each naming its place; [] if none."""
    return _Checker().check(body)
