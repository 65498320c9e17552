"""What every adapter shares: framework content as ctxrt's block dicts, and a resident's compiled
view in an OpenAI request form. Pure and synchronous, and imports no framework (nor the runtime:
an adapter's arguments are checked in ``ctxrt.integrations.arguments``).

Who speaks in the slot: the agent as its reader's name (so its own turns are the assistant's in
its view, and another resident's in theirs), people as ``USER`` (or a name the framework gives
them, escaped when a form would read it as a role or as the agent: ``speaker``), and tool results
as ``TOOL``. A tool call's arguments are stored as the JSON object they
hold; arguments that aren't one (a model's malformed call) are kept whole under ``ARGUMENTS``.

Each block is checked by ctxrt's own content rules when it is made, naming the framework's place
it came from, so an adapter refuses a batch before writing any of it. A call id ctxrt's rule
refuses (``functions.lookup:0``) is mapped to one it accepts, alike in a call and its result and
on every turn, as the request forms map tool names. A call and the results answering it are
written as one message (``paired``): compile splits it into the call's turn and the results'
turn (P4), and no other resident's message can come between them.

What is in the slot is known by the framework's identity of each message (``Ledger``): its own id
where it has one, else a ``digest`` of what it writes, its place and the writer; so a message
handed over again (a resumed thread, history passed back in or rebuilt, a trimmed or rewound
state) is written once, whatever else changed around it. Instructions an agent is given are its
own (``instructions``): written as their role with the agent's reader as the audience, they come
back to that agent in that role and reach no one else. A speaker is named by the form's name
field, or where a form has none by ``speaker_prefix`` on the first text part.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from .. import checks
from ..budget import Budget
from ..compile.result import CompileResult
from ..content.blocks import Message, Thinking, ToolResult, ToolUse, content_for_reader
from ..errors import EmptyRequestError, MalformedContentError
from ..compile.provenance import Provenance, Source
from ..forms.openai_wire import ERROR_PREFIX
from ..content.validation import blocks_from_content
from ..forms.wire import api_tool_id

USER = "user"
TOOL = "tool"
ARGUMENTS = "arguments"  # the key malformed call arguments are kept under, as sent
# Metadata naming the namespace whose manager wrote a message: what a session or context removes
# is what it wrote through its own manager, not whatever another writer tagged with its name.
WRITER = "ctxrt_writer"
# Metadata listing the framework identities (``Ledger``) of the messages a stored message holds.
KEYS = "ctxrt_keys"
# The roles of instructions: written for the agent's reader alone, read back in their role.
INSTRUCTIONS = ("system", "developer")
# Participants the adapters and request forms read as a role: instructions, the assistant's turns,
# tool results, the unnamed person. No agent speaks as one, and no person is written as one.
RESERVED = (*INSTRUCTIONS, "assistant", TOOL, USER)
PERSON = "person:"  # leads the participant of a person named like a role or like the agent (``speaker``)
# A model's reasoning parts by their LangChain content types: Anthropic's thinking and redacted
# thinking, LangChain v1's reasoning.
REASONING = ("thinking", "redacted_thinking", "reasoning")
KEPT = "ctxrt_reasoning"  # in a thinking block's raw form: the reasoning part as the framework gave it

Block = dict[str, Any]
Writes = list[tuple[str, list[Block]]]  # what one framework message writes, in order: (participant, blocks)


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
    """Messages to write, each message of tool calls joined by the ``TOOL`` messages of results
    right after it that answer its calls: one message, which compile splits into the call and its
    results (P4), so no other resident's write can come between them. Calls with no results after
    them stay alone (a compile leaves them out until answered)."""
    out: list[tuple[str, list[Block]]] = []
    for participant, content in planned:
        if participant == TOOL and out and answers(out[-1][1], content):
            out[-1] = (out[-1][0], [*out[-1][1], *content])
        else:
            out.append((participant, list(content)))
    return out


def answers(calls: Sequence[Block], results: Sequence[Block]) -> bool:
    """Whether ``results`` are tool results alone, each answering a call among ``calls``."""
    ids = {block["id"] for block in calls if block["type"] == "tool_use"}
    return bool(ids) and bool(results) and all(b["type"] == "tool_result" and b["tool_use_id"] in ids for b in results)


def calls_alone(content: Sequence[Block]) -> bool:
    """Whether ``content`` holds tool calls and none of their results yet."""
    kinds = {block["type"] for block in content}
    return "tool_use" in kinds and "tool_result" not in kinds


def instructions(role: str, content: Sequence[Block], reader: str) -> tuple[str, list[Block]]:
    """Instructions an agent was given, as written: their role as the participant, every block for
    the agent's ``reader`` alone, so no other agent's view or request holds them."""
    return role, [{**block, "audience": [reader]} for block in content]


def reasoning(part: Mapping[str, Any], said: str, reader: str, place: str) -> Block:
    """A model's reasoning part (I13) as a thinking block for the agent's ``reader`` alone, the
    part whole (JSON) in its raw form: no request form carries thinking, so no view shows it and
    no other agent's compile holds it, and ``reasoned_calls`` gives it back with the agent's tool
    calls, where Anthropic requires it (a signed thinking block before its tool_use)."""
    return checked({"type": "thinking", "thinking": said, "audience": [reader], "raw": {KEPT: dict(part)}}, place)


def reasoned_calls(result: CompileResult, assistant: str) -> dict[str, list[Any]]:
    """The reasoning parts (``reasoning``) kept in ``assistant``'s compiled messages, by the id of
    each tool call in the same message: what a framework sends back before those calls."""
    out: dict[str, list[Any]] = {}
    for message in result.messages:
        if message.participant != assistant:
            continue
        kept = [b.raw[KEPT] for b in message.content if type(b) is Thinking and isinstance(b.raw, Mapping) and KEPT in b.raw]
        if kept:
            out.update((b.id, kept) for b in message.content if type(b) is ToolUse)
    return out


def speaker(name: str | None, agent: str) -> str:
    """The participant a person's (or another framework speaker's) message is written as (I14):
    ``USER`` for no name (or ``user``); else the name, unless a form would read it as a role (``RESERVED``, in
    any case) or as the agent itself, or it is already that escape: then ``PERSON`` and the name.
    So a person named ``system`` gets no instructions' authority in any agent's view, and one
    named like the agent never reaches its model as its own reply."""
    if not name or name.lower() == USER:
        return USER
    if name.lower() in RESERVED or name == agent or name.lower().startswith(PERSON):
        return PERSON + name
    return name


def speaker_prefix(name: str) -> str:
    """The text a speaker's first text part starts with in a form with no name field."""
    return f"[{name}] "


def digest(writer: str, position: int | None, written: Sequence[tuple[str, Sequence[Block]]], *extra: str) -> str:
    """The identity of a framework message that has no id of its own: what it writes, where it
    stands in the framework's list (None: anywhere), who wrote it (and ``extra``, such as a run's
    id and the message's timestamps)."""
    data = json.dumps([writer, position, written, extra], sort_keys=True, ensure_ascii=True, default=str)
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def _chat_parts(content: Any, place: str, reader: str | None = None) -> list[Block]:
    """A Chat Completions message's content (a string, or text and image parts) as blocks; with
    ``reader`` (the agent's own reply), reasoning parts too, kept for that reader alone (I13)."""
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
        elif kind in REASONING and reader is not None:
            said = part.get("thinking", part.get("reasoning", ""))
            out.append(reasoning(part, said if isinstance(said, str) else "", reader, f"{place}[{j}]"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"a {kind!r} part has no place in a ctxrt message here")
    return out


def from_chat(message: Mapping[str, Any], agent: str, reader: str, where: str) -> Writes:
    """One Chat Completions message as what it writes: a user message as its speaker (its
    ``name``, or a role of its own; ``speaker``), a system or developer message as the agent's own ``instructions``, the assistant's
    as ``agent`` with its ``tool_calls`` as tool_use blocks and its reasoning for ``reader`` alone
    (``reasoning``), a ``tool`` (``status`` "error": an error result) message as a ``TOOL``
    tool_result (``Ledger.record`` joins it to the calls it answers); nothing for a message with
    no block. Raises ``MalformedContentError`` naming the place (``where``) for content a ctxrt
    message can't hold."""
    role = message.get("role")
    if role == "tool":
        if message.get("tool_call_id") is None:  # LangChain's ChatMessage(role="tool") carries none
            raise MalformedContentError(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
        content = message.get("content")
        body = content if isinstance(content, str) else _chat_parts(content, f"{where}.content")
        return [(TOOL, [tool_result(str(message["tool_call_id"]), body, f"{where}.content",
                                    is_error=message.get("status") == "error")])]
    content_blocks = _chat_parts(message.get("content"), f"{where}.content", reader if role == "assistant" else None)
    if role == "assistant":
        if message.get("refusal"):
            content_blocks.append(text(str(message["refusal"]), f"{where}.refusal"))
        for k, call in enumerate(message.get("tool_calls") or ()):
            function = call["function"]
            content_blocks.append(tool_use(str(call["id"]), str(function["name"]), function.get("arguments"),
                                           f"{where}.tool_calls[{k}]"))
        participant = agent
    elif role in INSTRUCTIONS:
        return [instructions(str(role), content_blocks, reader)] if content_blocks else []
    else:
        # A role of a speaker's own (LangChain's ChatMessage(role="critic")) names it when nothing else does.
        participant = speaker(message.get("name") or (None if role == "user" else str(role)), agent)
    return [(participant, content_blocks)] if content_blocks else []


def seen_whole(message: Message, reader: str) -> bool:
    """Whether ``reader`` sees every block of ``message``: an adapter never hands back or removes a
    message holding a block meant for someone else, whatever its metadata says."""
    return len(content_for_reader(message.content, reader)) == len(message.content)


def chat_messages(result: CompileResult, assistant: str) -> list[dict[str, Any]]:
    """The compile as Chat Completions messages, ``assistant`` speaking as the assistant, an
    agent's own instructions back in their role; ``[]`` when nothing in the reader's view can be
    sent (an empty slot)."""
    try:
        messages = result.to_openai_chat(assistant=assistant)["messages"]
    except EmptyRequestError:
        return []
    return [{"role": m["name"], "content": m["content"]} if m["role"] == "user" and m.get("name") in INSTRUCTIONS else m
            for m in messages]


def failed_calls(result: CompileResult) -> frozenset[str]:
    """The call ids, as the request forms give them, whose results in ``result`` are errors: the
    forms have no flag for it and start the result's text with ``ERROR_PREFIX``, which
    ``error_text`` takes off again for a framework that has the flag."""
    return frozenset(api_tool_id(block.tool_use_id) for message in result.messages for block in message.content
                     if isinstance(block, ToolResult) and block.is_error)


def error_text(content: str) -> str:
    """An error result's text without the prefix the request forms give it."""
    return content.removeprefix(ERROR_PREFIX)


def without(result: CompileResult, hidden: Callable[[Source], bool]) -> CompileResult:
    """``result`` without the compiled messages made only of what ``hidden`` names (an agent's
    view changed in its framework: a removal, a reset); a call and its results, one stored
    message, go together. Under the same budget, so still within it."""
    kept = [k for k, sources in enumerate(result.provenance.messages) if not sources or not all(map(hidden, sources))]
    if len(kept) == len(result.messages):
        return result
    provenance: Provenance = attrs.evolve(result.provenance, messages=tuple(result.provenance.messages[k] for k in kept))
    return CompileResult([result.messages[k] for k in kept], result.system_injections, provenance)


def responses_items(result: CompileResult, assistant: str) -> list[dict[str, Any]]:
    """The compile as Responses input items, ``assistant`` speaking as the assistant; ``[]`` when
    nothing in the reader's view can be sent."""
    try:
        return list(result.to_openai_responses(assistant=assistant)["input"])
    except EmptyRequestError:
        return []
