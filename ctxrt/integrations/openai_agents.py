"""A Session for the OpenAI Agents SDK: the agent's history is its reader's compiled view of a
shared ctxrt slot (docs/integrations.md#openai-agents-sdk).

    pip install 'ctxrt[openai-agents]'

``CtxrtSession(manager)`` implements the SDK's ``Session`` protocol over a ``ctxrt.aio`` manager
opened with the agent's reader:

- ``get_items()`` compiles the manager's view under its budget and returns it as Responses input
  items (``CompileResult.to_openai_responses``): summaries for the old stretch, the recent turns
  raw, tool calls and their outputs whole, nothing another resident's reader alone may see.
- ``add_items(items)`` writes the items the runner saves to the shared slot: a user's message as
  ``"user"`` (a system or developer one as that role), the agent's messages as the agent, and
  each run of function calls together with the batch's outputs answering them as one message of
  the agent's (compile splits it into the calls and their outputs, P4, and no other resident's
  message can come between them). An output whose call came in an earlier batch (a run resumed
  after a tool's approval) is added to the message of this session's that holds the call, or
  else written as ``"tool"``. Items
  the view has no place for (reasoning, a hosted tool's call) are not kept. Every item is
  checked before anything is written.
- ``pop_item()`` removes the newest item this session wrote through its manager and returns it;
  ``clear_session()`` removes every message it wrote. Other residents' messages stay, and so
  does any message holding a block this session's reader can't see.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
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
        return [blocks.text(content, place)] if content.strip() else []
    out: list[blocks.Block] = []
    for j, part in enumerate(content or ()):
        part = _as_dict(part)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            if str(part.get("text", "")).strip():
                out.append(blocks.text(str(part["text"]), f"{place}[{j}].text"))
        elif kind == "refusal":
            out.append(blocks.text(str(part.get("refusal", "")), f"{place}[{j}].refusal"))
        elif kind == "input_image" and part.get("image_url"):
            out.append(blocks.image(str(part["image_url"]), f"{place}[{j}].image_url"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"a {kind!r} part has no place in a ctxrt message here")
    return out


def _result(item: Mapping[str, Any], place: str) -> blocks.Block:
    output = item.get("output")
    content = output if isinstance(output, str) else _parts(output, f"{place}.output")
    return blocks.tool_result(str(item["call_id"]), content, f"{place}.output")


def _message(item: Mapping[str, Any], agent: str, place: str) -> tuple[str, list[blocks.Block]] | None:
    """One item other than a function call as (participant, blocks), or None for an item the view
    has no place for."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        participant = agent if role == "assistant" else blocks.USER if role == "user" else str(role)
        said = _parts(item.get("content"), f"{place}.content")
        return (participant, said) if said else None
    if kind == "function_call_output":
        return blocks.TOOL, [_result(item, place)]
    return None  # reasoning, hosted tools' calls: nothing a compiled view carries


def _planned(items: Sequence[Mapping[str, Any]], agent: str) -> list[tuple[str, list[blocks.Block]]]:
    """The messages a batch writes, every item checked first: each run of function calls with the
    batch's outputs answering them (in the batch's order) as one message of the agent's."""
    answers = {str(item["call_id"]): i for i, item in enumerate(items) if item.get("type") == "function_call_output"}
    placed: set[int] = set()
    out: list[tuple[str, list[blocks.Block]]] = []
    i = 0
    while i < len(items):
        if items[i].get("type") != "function_call":
            message = _message(items[i], agent, f"items[{i}]") if i not in placed else None
            if message is not None:
                out.append(message)
            i += 1
            continue
        calls: list[blocks.Block] = []
        results: list[int] = []
        while i < len(items) and items[i].get("type") == "function_call":
            item = items[i]
            calls.append(blocks.tool_use(str(item["call_id"]), str(item["name"]), item.get("arguments"), f"items[{i}]"))
            answer = answers.get(str(item["call_id"]), -1)
            if answer > i:
                results.append(answer)
            i += 1
        placed.update(results)
        out.append((agent, calls + [_result(items[k], f"items[{k}]") for k in sorted(results)]))
    return out


def _items(message: Message, agent: str) -> list[TResponseInputItem]:
    """A message this session wrote, as the items it was written from: one per call and output,
    or the message."""
    tools: list[Any] = []
    for block in message.content:
        if isinstance(block, ToolUse):
            tools.append({"type": "function_call", "call_id": block.id, "name": block.name,
                          "arguments": json.dumps(block.input)})
        elif isinstance(block, ToolResult):
            output = block.content if isinstance(block.content, str) else "\n\n".join(
                b.text for b in block.content if isinstance(b, Text))
            tools.append({"type": "function_call_output", "call_id": block.tool_use_id, "output": output})
    if tools:
        return tools
    if message.participant == agent:
        text = "\n\n".join(b.text for b in message.content if isinstance(b, Text))
        return [{"type": "message", "role": "assistant", "content": text}]
    parts: list[Any] = [
        {"type": "input_text", "text": b.text} if isinstance(b, Text)
        else {"type": "input_image", "image_url": _image_url(b), "detail": "auto"}
        for b in message.content if isinstance(b, (Text, Image))
    ]
    role = message.participant if message.participant in ("system", "developer") else "user"
    return [{"type": "message", "role": role, "content": parts}]  # type: ignore[list-item, misc]


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
        """The reader's compiled view as Responses input items (the newest ``limit`` of them, less
        any output whose call was cut off)."""
        result = await self.manager.compile(self.budget)
        items: list[Any] = blocks.responses_items(result, self.agent)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
            calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
            items = [item for item in items if item.get("type") != "function_call_output" or item["call_id"] in calls]
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Writes the items to the shared slot (see the module's doc); ``MalformedContentError``
        naming ``items[i]`` before anything is written."""
        planned = _planned([_as_dict(item) for item in items], self.agent)
        for participant, content in planned:
            if participant == blocks.TOOL:
                content = [result for result in content if not await self._answer(result)]
            if content:
                await self.manager.add_message(participant, content, metadata=self._metadata)

    async def _answer(self, result: blocks.Block) -> bool:
        """Adds an output to the message of this session's holding its call unanswered (written by
        an earlier batch), so the two stay one message; False if there is none."""
        call_id = result["tool_use_id"]

        def asks(message: Message) -> bool:
            return any(isinstance(b, ToolUse) and b.id == call_id for b in message.content) and not any(
                isinstance(b, ToolResult) and b.tool_use_id == call_id for b in message.content)

        message = await self._newest(asks)
        if message is None:
            return False
        await self.manager.edit_message(message.id, [*message.content, result])
        return True

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the newest item this session wrote and returns it (None if none): a message's
        last call or output is taken off it, the message goes with its only item."""
        message = await self._newest()
        if message is None:
            return None
        items = _items(message, self.agent)
        if len(items) > 1:
            await self.manager.edit_message(message.id, list(message.content[:-1]))
        else:
            await self.manager.remove_message(message.id)
        return items[-1]

    async def clear_session(self) -> None:
        """Removes every message this session wrote; the other residents' stay."""
        reader = str(self.manager.view_reader)
        for message in await self.manager.query_messages(metadata=self._metadata):
            if blocks.seen_whole(message, reader):
                await self.manager.remove_message(message.id)

    @property
    def _metadata(self) -> dict[str, str]:
        """What marks a message as this session's: its id, and the namespace it writes through."""
        return {METADATA_KEY: self.session_id, blocks.WRITER: self.manager.namespace}

    async def _newest(self, wanted: Callable[[Message], bool] = lambda message: True) -> Message | None:
        """The newest ``wanted`` message this session wrote whose blocks its reader sees (read back
        only as far as that, L7)."""
        reader = str(self.manager.view_reader)
        limit = 1
        while True:
            found = await self.manager.query_messages(metadata=self._metadata, reverse=True, limit=limit)
            for message in found:
                if blocks.seen_whole(message, reader) and wanted(message):
                    return message
            if len(found) < limit:
                return None
            limit *= 4
