"""A Session for the OpenAI Agents SDK: the agent's history is its reader's compiled view of a
shared ctxrt slot (docs/integrations.md#openai-agents-sdk).

    pip install 'ctxrt[openai-agents]'

``CtxrtSession(manager)`` implements the SDK's ``Session`` protocol over a ``ctxrt.aio`` manager
opened with the agent's reader:

- ``get_items()`` compiles the manager's view under its budget and returns it as Responses input
  items (``CompileResult.to_openai_responses``): summaries for the old stretch, the recent turns
  raw, tool calls and their outputs whole, nothing another resident's reader alone may see.
- ``add_items(items)`` writes each item the runner saves as a message of the shared slot: a
  user's message as ``"user"`` (a system or developer one as that role), the agent's messages and
  function calls as the agent,
  function outputs as ``"tool"``, each output right after its call. Items the view has no place
  for (reasoning, a hosted tool's call) are not kept.
- ``pop_item()`` removes the newest message this session wrote and returns it as an item;
  ``clear_session()`` removes every message it wrote. Other residents' messages stay.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agents.items import TResponseInputItem

from .. import Budget, ContextManager, Image, MalformedContentError, Message, Text, ToolResult, ToolUse
from . import blocks

if TYPE_CHECKING:
    from agents.memory import SessionSettings  # newer SDKs only: typed here, never imported

METADATA_KEY = "agents_sdk_session"  # metadata naming the session that wrote a message
_TEXT_PARTS = ("input_text", "output_text", "text")


def _as_dict(item: Any) -> Mapping[str, Any]:
    return item if isinstance(item, Mapping) else item.model_dump(exclude_none=True)


def _parts(content: Any, place: str) -> list[blocks.Block]:
    """A message's or an output's content (a string, or input/output parts) as blocks."""
    if isinstance(content, str):
        return [blocks.text(content)] if content.strip() else []
    out: list[blocks.Block] = []
    for j, part in enumerate(content or ()):
        part = _as_dict(part)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            if str(part.get("text", "")).strip():
                out.append(blocks.text(str(part["text"])))
        elif kind == "refusal":
            out.append(blocks.text(str(part.get("refusal", ""))))
        elif kind == "input_image" and part.get("image_url"):
            out.append(blocks.image(str(part["image_url"]), f"{place}[{j}].image_url"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"a {kind!r} part has no place in a ctxrt message here")
    return out


def _message(item: Mapping[str, Any], agent: str, place: str) -> tuple[str, list[blocks.Block]] | None:
    """One item as (participant, blocks), or None for an item the view has no place for."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        participant = agent if role == "assistant" else blocks.USER if role == "user" else str(role)
        said = _parts(item.get("content"), f"{place}.content")
        return (participant, said) if said else None
    if kind == "function_call":
        return agent, [blocks.tool_use(str(item["call_id"]), str(item["name"]), item.get("arguments"))]
    if kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _parts(output, f"{place}.output")
        return blocks.TOOL, [blocks.tool_result(str(item["call_id"]), content)]
    return None  # reasoning, hosted tools' calls: nothing a compiled view carries


def _in_pair_order(items: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The items with each function output moved right after its call, when both are here: a
    compile keeps a call only if the next message answers it (P4)."""
    outputs = {str(item["call_id"]): i for i, item in enumerate(items) if item.get("type") == "function_call_output"}
    placed: set[int] = set()
    ordered: list[tuple[int, Mapping[str, Any]]] = []
    for i, item in enumerate(items):
        if i in placed:
            continue
        ordered.append((i, item))
        answer = outputs.get(str(item.get("call_id"))) if item.get("type") == "function_call" else None
        if answer is not None and answer > i:
            ordered.append((answer, items[answer]))
            placed.add(answer)
    return ordered


def _as_item(message: Message, agent: str) -> TResponseInputItem:
    """A message this session wrote, as the item it was written from."""
    block = message.content[0]
    if isinstance(block, ToolUse):
        return {"type": "function_call", "call_id": block.id, "name": block.name, "arguments": json.dumps(block.input)}
    if isinstance(block, ToolResult):
        output = block.content if isinstance(block.content, str) else "\n\n".join(
            b.text for b in block.content if isinstance(b, Text))
        return {"type": "function_call_output", "call_id": block.tool_use_id, "output": output}
    if message.participant == agent:
        text = "\n\n".join(b.text for b in message.content if isinstance(b, Text))
        return {"type": "message", "role": "assistant", "content": text}
    parts: list[Any] = [
        {"type": "input_text", "text": b.text} if isinstance(b, Text)
        else {"type": "input_image", "image_url": _image_url(b), "detail": "auto"}
        for b in message.content if isinstance(b, (Text, Image))
    ]
    role = message.participant if message.participant in ("system", "developer") else "user"
    return {"type": "message", "role": role, "content": parts}  # type: ignore[return-value, misc]


def _image_url(block: Image) -> str:
    source = block.source
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    return str(source.get("url", ""))


class CtxrtSession:
    """The OpenAI Agents SDK's ``Session`` over a ctxrt manager opened with the agent's reader.

    ``manager`` is a ``ctxrt.aio`` manager with a ``view_reader`` (its namespace claimed for that
    reader); ``agent`` is the participant the agent speaks as in the slot (default: the reader);
    ``budget`` bounds every view ``get_items`` compiles; ``session_id`` (default: the manager's
    namespace) names this session in the metadata of the messages it writes.
    """

    def __init__(
        self,
        manager: ContextManager,
        *,
        budget: Budget | None = None,
        agent: str | None = None,
        session_id: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if manager.view_reader is None:
            raise ValueError("CtxrtSession needs a manager opened with view_reader=<the agent's reader>")
        self.manager = manager
        self.budget = budget if budget is not None else Budget()
        self.agent = agent if agent is not None else manager.view_reader
        self.session_id = session_id if session_id is not None else manager.namespace
        self.session_settings = session_settings

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The reader's compiled view as Responses input items (the newest ``limit`` of them, with
        no output whose call was cut off)."""
        result = await self.manager.compile(self.budget)
        items: list[Any] = blocks.responses_items(result, self.agent)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
            calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
            while items and items[0].get("type") == "function_call_output" and items[0]["call_id"] not in calls:
                items.pop(0)
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Writes each item as a message of the shared slot (see the module's doc)."""
        given = [_as_dict(item) for item in items]
        planned = []
        for i, item in _in_pair_order(given):  # every item checked before anything is written
            message = _message(item, self.agent, f"items[{i}]")
            if message is not None:
                planned.append(message)
        for participant, content in planned:
            await self.manager.add_message(participant, content, metadata={METADATA_KEY: self.session_id})

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the newest message this session wrote and returns it as an item (None if none)."""
        newest = await self.manager.query_messages(metadata={METADATA_KEY: self.session_id}, reverse=True, limit=1)
        if not newest:
            return None
        await self.manager.remove_message(newest[0].id)
        return _as_item(newest[0], self.agent)

    async def clear_session(self) -> None:
        """Removes every message this session wrote; the other residents' stay."""
        for message in await self.manager.query_messages(metadata={METADATA_KEY: self.session_id}):
            await self.manager.remove_message(message.id)
