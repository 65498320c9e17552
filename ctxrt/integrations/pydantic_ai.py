"""A history processor for Pydantic AI agents: each model request carries the agent's reader's
compiled view of a shared ctxrt slot (docs/integrations.md#pydantic-ai).

    pip install 'ctxrt[pydantic-ai]'

``CtxrtHistory(manager)`` is a capability: ``Agent(..., capabilities=[history])``. Pydantic AI 2
took history processors from ``Agent(history_processors=...)`` into capabilities
(``ProcessHistory(processor)``), and this one does the processor's work in the same hook
(``before_model_request``): ``history.process(messages)`` writes the run's messages it hasn't
written yet to the shared slot (a user prompt as ``"user"``, the agent's replies and tool calls
as the agent, its thinking parts for its reader alone, handed back before the calls they came
with, I13; tool returns and tool retry prompts as ``"tool"``, joined to the calls they answer
as one message, so no other agent's message comes between them) and returns the manager's
compiled view under its budget as Pydantic AI messages, the run's system prompt first. The
request sends that view; the run's own history is left as it was. When the run ends
(``after_run``) the final reply is written too. ``process`` also serves as a plain history
processor: ``ProcessHistory(history.process)``, which then writes the final reply at the next
request.

What the slot holds is known by identity (``ledger.Ledger``): a message written is marked in its
``metadata`` (``ctxrt_recorded``: its key), and a message with no mark is known by what it
writes and its ``run_id`` and timestamps, wherever it stands, or one built by the host (no
``run_id``) by what it writes and its place in the history. So history passed back in
(``message_history=result.all_messages()``), trimmed to a sliding window, round-tripped through
JSON without its metadata, or built afresh from the same messages is not written twice, and a run's new prompt always is; a message an earlier ctxrt marked (``True``)
counts as written. Another participant's words come to the model as a user prompt whose first
text starts with ``[name] `` (the form has no name field); system prompt parts are the run's
own, never written, and lead the view. Pydantic AI's
``ConversationStore`` (an entry log per conversation, forks and revisions, loaded whole) has no
place for a view compiled per reader, and is not implemented.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext

from .. import Budget, ContextManager, MalformedContentError, checks
from . import arguments, blocks
from .ledger import Ledger, record_compiled

MARK = "ctxrt_recorded"  # the metadata key holding the identity of a message the slot holds
VIEW = "view"  # the mark of a message made from the compiled view: the slot holds what it shows


def _mark(message: ModelMessage, key: str) -> None:
    message.metadata = {**(message.metadata or {}), MARK: key}


def _marked(message: ModelMessage) -> str | None:
    key = (message.metadata or {}).get(MARK)
    if key is True:  # an earlier ctxrt's mark, before marks held keys: the slot holds what it wrote
        return VIEW
    return key if isinstance(key, str) else None


def _user_blocks(content: str | Sequence[Any], place: str) -> list[blocks.Block]:
    if isinstance(content, str):
        return [blocks.text(content, place)] if content.strip() else []
    out = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            if part.strip():
                out.append(blocks.text(part, f"{place}[{j}]"))
        elif isinstance(part, ImageUrl):
            out.append(blocks.image(part.url, f"{place}[{j}]"))
        elif isinstance(part, BinaryContent) and part.is_image:
            out.append(blocks.image(part.data_uri, f"{place}[{j}]"))
        else:
            raise MalformedContentError(f"{place}[{j}]", f"{type(part).__name__} has no place in a ctxrt message here")
    return out


def _tool_output(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _written(message: ModelMessage, agent: str, reader: str, place: str) -> list[tuple[str, list[blocks.Block]]]:
    """What one Pydantic AI message writes to the slot, in order: (participant, blocks)."""
    if isinstance(message, ModelResponse):
        said: list[blocks.Block] = []
        for j, piece in enumerate(message.parts):
            if isinstance(piece, TextPart) and piece.content.strip():
                said.append(blocks.text(piece.content, f"{place}.parts[{j}].content"))
            elif isinstance(piece, ThinkingPart):
                said.append(blocks.reasoning(dataclasses.asdict(piece), piece.content, reader, f"{place}.parts[{j}]"))
            elif isinstance(piece, ToolCallPart):
                said.append(blocks.tool_use(piece.tool_call_id, piece.tool_name, piece.args, f"{place}.parts[{j}]"))
        # Built-in tools' parts: nothing a view carries. Thinking alone is no turn to write.
        return [(agent, said)] if any(b["type"] != "thinking" for b in said) else []
    results: list[blocks.Block] = []
    prompts: list[blocks.Block] = []
    for j, part in enumerate(message.parts):
        where = f"{place}.parts[{j}]"
        if isinstance(part, ToolReturnPart):
            results.append(blocks.tool_result(part.tool_call_id, _tool_output(part.content), f"{where}.content"))
        elif isinstance(part, RetryPromptPart) and part.tool_name is not None:
            results.append(blocks.tool_result(part.tool_call_id, part.model_response(), where, is_error=True))
        elif isinstance(part, RetryPromptPart):
            prompts.append(blocks.text(part.model_response(), where))
        elif isinstance(part, UserPromptPart):
            prompts += _user_blocks(part.content, f"{where}.content")
    # A request's tool results answer the reply before it, so they come first (P4).
    return [(who, content) for who, content in ((blocks.TOOL, results), (blocks.USER, prompts)) if content]


def _identity(writer: str, position: int, message: ModelMessage, written: blocks.Writes) -> str:
    """The identity of a message with no mark: one a run made (``run_id``) by what it writes, its
    run and its timestamps, wherever it stands, so a sliding window or a JSON round trip without
    metadata keeps it (I6); one the host built, with no run and timestamps of its making, by what
    it writes and its place."""
    if message.run_id:
        stamps = [str(message.timestamp), *(str(getattr(part, "timestamp", "")) for part in message.parts)]
        return blocks.digest(writer, None, written, message.run_id, *stamps)
    return blocks.digest(writer, position, written, "")


def _user_content(content: Any) -> str | list[Any]:
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for part in content:
        if part["type"] == "text":
            parts.append(part["text"])
        elif part["type"] == "image_url" and part["image_url"]["url"].startswith("data:"):
            parts.append(BinaryContent.from_data_uri(part["image_url"]["url"]))
        elif part["type"] == "image_url":
            parts.append(ImageUrl(url=part["image_url"]["url"]))
        else:
            parts.append(f"[{part['type']} not shown]")
    return parts


def _named(content: str | list[Any], name: str | None) -> str | list[Any]:
    """User content with its speaker named at the start of its first text (``blocks.speaker_prefix``)."""
    if name is None:
        return content
    prefix = blocks.speaker_prefix(name)
    if isinstance(content, str):
        return prefix + content
    first = next((j for j, part in enumerate(content) if isinstance(part, str)), None)
    if first is None:
        return [prefix.rstrip(), *content]
    return [*content[:first], prefix + content[first], *content[first + 1:]]


def _model_messages(chat: Sequence[dict[str, Any]], reasoned: Mapping[str, list[Any]]) -> list[ModelMessage]:
    """Chat Completions messages as Pydantic AI's: each run of user and tool messages one request;
    a reply of tool calls led by the thinking parts it was given with (``reasoned``, I13)."""
    out: list[ModelMessage] = []
    names: dict[str, str] = {}  # call id -> the tool's name, which a tool return carries
    pending: list[ModelRequestPart] = []
    for message in chat:
        role = message["role"]
        if role == "assistant":
            if pending:
                out.append(ModelRequest(parts=pending))
                pending = []
            calls = message.get("tool_calls") or ()
            kept = next((reasoned[call["id"]] for call in calls if call["id"] in reasoned), [])
            parts: list[ModelResponsePart] = [ThinkingPart(**part) for part in kept]
            if message.get("content"):
                parts.append(TextPart(content=message["content"]))
            for call in calls:
                names[call["id"]] = call["function"]["name"]
                parts.append(ToolCallPart(tool_name=call["function"]["name"], args=call["function"]["arguments"],
                                          tool_call_id=call["id"]))
            out.append(ModelResponse(parts=parts))
        elif role == "tool":
            call_id = message["tool_call_id"]
            pending.append(ToolReturnPart(tool_name=names.get(call_id, ""), content=message["content"], tool_call_id=call_id))
        elif role in blocks.INSTRUCTIONS:
            pending.append(SystemPromptPart(content=message["content"]))
        else:
            pending.append(UserPromptPart(content=_named(_user_content(message["content"]), message.get("name"))))
    if pending:
        out.append(ModelRequest(parts=pending))
    return out


class CtxrtHistory(AbstractCapability[Any]):
    """A Pydantic AI agent's history in a ctxrt slot, seen through the agent's reader.

    ``manager`` is a ``ctxrt.aio`` manager opened with the agent's ``view_reader``; ``agent`` is the
    participant the agent speaks as (default: the reader); ``budget`` bounds every view.
    """

    def __init__(self, manager: ContextManager, *, budget: Budget | None = None, agent: str | None = None) -> None:
        self.manager, self.budget, self.agent = arguments.adapter_arguments("CtxrtHistory", manager, budget, agent)
        self.ledger = Ledger(self.manager)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # made from a live manager, not from a spec

    async def record(self, messages: Sequence[ModelMessage]) -> None:
        """Writes the messages the slot doesn't hold (a reply's tool calls and the request's
        results answering them as one message), every one checked before the first is written,
        and marks each message the slot holds with its identity."""
        messages = checks.sequence(messages, "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, (ModelRequest, ModelResponse)):
                raise TypeError(f"messages[{i}] must be a ModelRequest or ModelResponse, not {type(message).__name__}")
        writes: dict[int, blocks.Writes] = {}
        reader = str(self.manager.view_reader)

        def written(i: int) -> blocks.Writes:
            if i not in writes:
                writes[i] = [] if _marked(messages[i]) == VIEW else _written(messages[i], self.agent, reader, f"messages[{i}]")
            return writes[i]

        keys = [_marked(m) or _identity(self.manager.namespace, i, m, written(i)) for i, m in enumerate(messages)]
        await self.ledger.record(keys, written, {blocks.WRITER: self.manager.namespace})
        for key, message in zip(keys, messages):
            if self.ledger.slot_id(key) is not None:
                _mark(message, key)

    async def process(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history processor: writes what's new, returns the reader's compiled view."""
        await self.record(messages)
        result = await self.manager.compile(self.budget)
        await record_compiled(self.manager, result, "openai_chat", self.agent)
        view = _model_messages(blocks.chat_messages(result, self.agent), blocks.reasoned_calls(result, self.agent))
        for message in view:
            _mark(message, VIEW)
        system = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, SystemPromptPart)]
        if system:
            if view and isinstance(view[0], ModelRequest):
                view[0].parts = [*system, *view[0].parts]
            else:
                view.insert(0, ModelRequest(parts=system, metadata={MARK: VIEW}))
        return view

    async def before_model_request(self, ctx: RunContext[Any], request_context: ModelRequestContext) -> ModelRequestContext:
        request_context.messages = await self.process(list(request_context.messages))
        return request_context

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        await self.record(result.all_messages())
        return result
