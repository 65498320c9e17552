"""What every adapter shares: framework content as ctxrt's block dicts, and a resident's compiled
view in an OpenAI request form. Pure and synchronous, and imports no framework.

Who speaks in the slot: the agent as its reader's name (so its own turns are the assistant's in
its view, and another resident's in theirs), people as ``USER`` (or a name the framework gives
them), and tool results as ``TOOL``. A tool call's arguments are stored as the JSON object they
hold; arguments that aren't one (a model's malformed call) are kept whole under ``ARGUMENTS``.

Each block is checked by ctxrt's own content rules when it is made, naming the framework's place
it came from, so an adapter refuses a batch before writing any of it. A call id ctxrt's rule
refuses (``functions.lookup:0``) is mapped to one it accepts, alike in a call and its result and
on every turn, as the request forms map tool names. A call and the results answering it are
written as one message (``paired``): compile splits it into the call's turn and the results'
turn (P4), and no other resident's message can come between them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import CompileResult, EmptyRequestError, MalformedContentError, Message, content_for_reader
from ..validation import blocks_from_content
from ..wire import api_tool_id

USER = "user"
TOOL = "tool"
ARGUMENTS = "arguments"  # the key malformed call arguments are kept under, as sent
# Metadata naming the namespace whose manager wrote a message: what a session or context removes
# is what it wrote through its own manager, not whatever another writer tagged with its name.
WRITER = "ctxrt_writer"

Block = dict[str, Any]


def checked(block: Block, place: str) -> Block:
    """``block`` if ctxrt would store it, else ``MalformedContentError`` at ``place``."""
    try:
        blocks_from_content([block])
    except MalformedContentError as error:
        raise MalformedContentError(place, error.reason) from None
    return block


def text(value: str, place: str) -> Block:
    return checked({"type": "text", "text": value}, place)


def image(url: str, place: str) -> Block:
    """An image block for an http(s) URL or a base64 ``data:`` URL; ``MalformedContentError`` at
    ``place`` for anything else (the store would refuse it there too)."""
    if url.startswith(("http://", "https://")):
        return checked({"type": "image", "source": {"type": "url", "url": url}}, place)
    head, comma, data = url.partition(",")
    if url.startswith("data:") and comma and head.endswith(";base64"):
        return checked({"type": "image", "source": {"type": "base64", "media_type": head[5:-7], "data": data}}, place)
    raise MalformedContentError(place, f"an image must be an http(s) URL or a base64 data URL, not {url[:40]!r}")


def arguments(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A call's arguments as the JSON object stored for it."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {ARGUMENTS: raw}
    return parsed if isinstance(parsed, dict) else {ARGUMENTS: raw}


def tool_use(call_id: str, name: str, args: str | Mapping[str, Any] | None, place: str) -> Block:
    return checked({"type": "tool_use", "id": api_tool_id(call_id), "name": name, "input": arguments(args)}, place)


def tool_result(call_id: str, content: str | Sequence[Block], place: str, *, is_error: bool = False) -> Block:
    # A result with nothing to show is stored as empty text (an empty block list is no content).
    body = content if isinstance(content, str) else (list(content) or "")
    block: Block = {"type": "tool_result", "tool_use_id": api_tool_id(call_id), "content": body}
    if is_error:
        block["is_error"] = True
    return checked(block, place)


def paired(planned: Sequence[tuple[str, list[Block]]]) -> list[tuple[str, list[Block]]]:
    """Messages to write, each message of tool calls joined by the ``TOOL`` message of results
    right after it: one message, which compile splits into the call and its results (P4), so no
    other resident's write can come between them. Calls with no results after them stay alone
    (a compile leaves them out until answered)."""
    out: list[tuple[str, list[Block]]] = []
    for participant, content in planned:
        if participant == TOOL and out and _calls_alone(out[-1][1]) and all(b["type"] == "tool_result" for b in content):
            out[-1] = (out[-1][0], [*out[-1][1], *content])
        else:
            out.append((participant, list(content)))
    return out


def _calls_alone(content: Sequence[Block]) -> bool:
    kinds = {block["type"] for block in content}
    return "tool_use" in kinds and "tool_result" not in kinds


def _chat_parts(content: Any, place: str) -> list[Block]:
    """A Chat Completions message's content (a string, or text and image parts) as blocks."""
    if content is None or isinstance(content, str):
        return [text(content, place)] if content and content.strip() else []
    out: list[Block] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            if str(part.get("text", "")).strip():
                out.append(text(str(part["text"]), f"{place}[{j}].text"))
        elif kind == "refusal":
            out.append(text(str(part.get("refusal", "")), f"{place}[{j}].refusal"))
        elif kind == "image_url":
            out.append(image(str(part["image_url"]["url"]), f"{place}[{j}].image_url.url"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"a {kind!r} part has no place in a ctxrt message here")
    return out


def from_chat(messages: Sequence[Mapping[str, Any]], agent: str, start: int = 0) -> list[tuple[str, list[Block]]]:
    """Chat Completions messages as (participant, blocks) to write, in order: a user message as
    its ``name`` or ``USER``, a system or developer message as that role, the assistant's as
    ``agent`` with its ``tool_calls`` as tool_use blocks, and each run of ``tool`` messages as
    tool_result blocks, joined to the calls they follow (``paired``) or else one ``TOOL`` message.
    A message left with no block is skipped. Raises ``MalformedContentError`` naming the place
    (``messages[i]`` counting from ``start``) for content a ctxrt message can't hold, before
    anything is written."""
    out: list[tuple[str, list[Block]]] = []
    results: list[Block] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{start + i}]"
        if role == "tool":
            content = message.get("content")
            body = content if isinstance(content, str) else _chat_parts(content, f"{where}.content")
            results.append(tool_result(str(message["tool_call_id"]), body, f"{where}.content"))
            continue
        if results:
            out.append((TOOL, results))
            results = []
        content_blocks = _chat_parts(message.get("content"), f"{where}.content")
        if role == "assistant":
            if message.get("refusal"):
                content_blocks.append(text(str(message["refusal"]), f"{where}.refusal"))
            for k, call in enumerate(message.get("tool_calls") or ()):
                function = call["function"]
                content_blocks.append(tool_use(str(call["id"]), str(function["name"]), function.get("arguments"),
                                               f"{where}.tool_calls[{k}]"))
            participant = agent
        elif role == "user":
            participant = str(message.get("name") or USER)
        else:
            participant = str(role)
        if content_blocks:
            out.append((participant, content_blocks))
    if results:
        out.append((TOOL, results))
    return paired(out)


def seen_whole(message: Message, reader: str) -> bool:
    """Whether ``reader`` sees every block of ``message``: an adapter never hands back or removes a
    message holding a block meant for someone else, whatever its metadata says."""
    return len(content_for_reader(message.content, reader)) == len(message.content)


def chat_messages(result: CompileResult, assistant: str) -> list[dict[str, Any]]:
    """The compile as Chat Completions messages, ``assistant`` speaking as the assistant; ``[]``
    when nothing in the reader's view can be sent (an empty slot)."""
    try:
        return list(result.to_openai_chat(assistant=assistant)["messages"])
    except EmptyRequestError:
        return []


def responses_items(result: CompileResult, assistant: str) -> list[dict[str, Any]]:
    """The compile as Responses input items, ``assistant`` speaking as the assistant; ``[]`` when
    nothing in the reader's view can be sent."""
    try:
        return list(result.to_openai_responses(assistant=assistant)["input"])
    except EmptyRequestError:
        return []
