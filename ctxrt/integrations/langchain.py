"""An AgentMiddleware for LangChain 1.x agents: the model sees the agent's reader's compiled view of
a shared ctxrt slot (docs/integrations.md#langchain).

    pip install 'ctxrt[langchain]'

``CtxrtMiddleware(manager)`` goes in ``create_agent(..., middleware=[...])``. Before each model
call (``abefore_model``) it writes the agent state's messages the slot doesn't hold yet, known by
their LangChain ids (``ledger.Ledger``; a human message as its speaker, ``blocks.speaker``, the
agent's messages and tool calls (invalid ones too) as the agent, its reasoning and thinking
parts for its reader alone (I13), tool messages joined to the calls they answer (an error status
kept, and given back), a system message as the agent's own instructions); at the call (``awrap_model_call``;
``wrap_model_call`` from a thread other than the runtime's loop) it hands the model the manager's
compiled view under its budget in place of the state's messages (the system prompt stays the
agent's), after writing the error results LangGraph's model node adds there for invalid tool calls. So a thread resumed from a checkpointer, history the caller passes back in, a trimmed
or rewound state each write a message once, and recording never stops. A message removed from
the state (``RemoveMessage``) leaves this thread's view, not the shared slot: the state keeps the
keys it saw written (``ctxrt_present``) and the stored messages it no longer shows
(``ctxrt_hidden``), both private to the middleware; the keys in ``ctxrt_present`` count as written,
and a thread checkpointed by an earlier ctxrt (which kept ``ctxrt_recorded``, a count of the
state's messages written) counts its first ``ctxrt_recorded`` messages as written, so an upgrade
writes nothing twice (such a message removed later stays in the view: its stored message isn't
known). A thread's view follows its current state through time travel too: the state keeps a
token of its own (``ctxrt_thread``, checkpointed with it) that tags every message it writes, and
the view leaves out the thread's stored messages none of whose keys the state holds now
(the turns a rewind to an earlier checkpoint abandoned). A message is known by its id and a digest
of what it says (``_version``), so one edited under its id is written anew and the version it
replaced leaves the view; messages an earlier ctxrt stored under bare ids count as written. A
thread resumed at the model node has what its state holds written at the model call. A reply with tool calls waits in the state
until its results are there and is written with them as one message; what the state holds when
the agent ends (the final reply, a tool that returns directly) is written then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from typing import Annotated, Any, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
from langchain.agents.middleware.types import ModelCallResult, PrivateStateAttr
from langchain_core.messages import (AIMessage, AnyMessage, BaseMessage, ToolMessage, convert_to_messages,
                                     convert_to_openai_messages)
from langgraph.runtime import Runtime
from typing_extensions import NotRequired

from .. import Budget, ContextManager, checks
from . import arguments, blocks
from .ledger import Ledger, record_compiled

PRESENT = "ctxrt_present"  # the state's message keys (``_keys``) the slot held at the last step
HIDDEN = "ctxrt_hidden"  # stored message ids this thread's view leaves out: removed from its state
RECORDED = "ctxrt_recorded"  # an earlier ctxrt's count: the state's first messages it wrote
THREAD = "ctxrt_thread"  # the thread's token: in its state, and in the metadata of what it writes
_T = TypeVar("_T")


class CtxrtState(AgentState[Any]):
    ctxrt_present: NotRequired[Annotated[list[str], PrivateStateAttr]]
    ctxrt_hidden: NotRequired[Annotated[list[str], PrivateStateAttr]]
    ctxrt_recorded: NotRequired[Annotated[int, PrivateStateAttr]]  # read from older checkpoints, never written
    ctxrt_thread: NotRequired[Annotated[str, PrivateStateAttr]]


def _thread(state: Mapping[str, Any]) -> str | None:
    value = state.get(THREAD)
    return value if isinstance(value, str) else None


def _ids(state: Mapping[str, Any], key: str) -> list[str]:
    value = state.get(key)
    return [str(each) for each in value] if isinstance(value, list) else []


def _written_before(state: Mapping[str, Any]) -> set[str]:
    """The ids of the state's messages the slot holds by the state's own account: those the last
    step saw written, or in a thread an earlier ctxrt checkpointed, its first ``ctxrt_recorded``."""
    if PRESENT in state:
        return set(_ids(state, PRESENT))
    count = state.get(RECORDED)
    if isinstance(count, bool) or not isinstance(count, int):
        return set()
    return {m.id for m in state["messages"][:count] if m.id is not None}


def _chat(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the Chat Completions dict ``blocks.from_chat`` reads, with what the
    conversion drops: a reply's invalid tool calls (as calls, their raw arguments kept, so the
    error results LangGraph answers them with stay paired) and a tool message's error status."""
    chat: dict[str, Any] = convert_to_openai_messages(message)
    if isinstance(message, AIMessage) and message.invalid_tool_calls:
        chat["tool_calls"] = [*chat.get("tool_calls", []), *(
            {"type": "function", "id": call["id"], "function": {"name": call["name"] or "", "arguments": call["args"]}}
            for call in message.invalid_tool_calls if call["id"] is not None)]
    if isinstance(message, ToolMessage) and message.status == "error":
        chat["status"] = "error"
    return chat


def _version(message: BaseMessage) -> str:
    """The key of a message with an id as it reads now: its id and a digest of what it says, so an
    edit under the same id (LangGraph's "edit state" time travel) is a message of its own."""
    said = json.dumps(_chat(message), sort_keys=True, ensure_ascii=True, default=str)
    return f"{message.id}#{hashlib.sha256(said.encode()).hexdigest()[:16]}"


def _marked_failed(messages: list[BaseMessage], failed: Collection[str]) -> None:
    """The results of the ``failed`` calls as LangChain gave them: status "error", their text
    without the prefix the request forms add."""
    for message in messages:
        if isinstance(message, ToolMessage) and message.tool_call_id in failed:
            message.status = "error"
            if isinstance(message.content, str):
                message.content = blocks.error_text(message.content)


def _with_reasoning(message: dict[str, Any], reasoned: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The agent's reply of tool calls led by the reasoning parts it was given with (I13), as
    ChatAnthropic sends a signed thinking block back before its tool_use; others as they are."""
    kept = next((reasoned[call["id"]] for call in message.get("tool_calls") or () if call["id"] in reasoned), None)
    if kept is None:
        return message
    said = message["content"]
    return {**message, "content": [*kept, *([{"type": "text", "text": said}] if said else [])]}


def _repairs(request: ModelRequest[Any]) -> list[BaseMessage]:
    """The state's messages with the error results the model node adds for this call to answer
    invalid tool calls (LangGraph keeps them in the state only with the reply), each given now the
    id it will keep there; none: the state's messages as they are."""
    state = request.state["messages"]
    answered = {m.tool_call_id for m in state if isinstance(m, ToolMessage)}
    invalid = {call["id"] for m in state if isinstance(m, AIMessage) for call in m.invalid_tool_calls} - answered
    added = [m for m in request.messages if isinstance(m, ToolMessage) and m.id is None and m.tool_call_id in invalid]
    for message in added:
        message.id = str(uuid.uuid4())
    by_call = {m.tool_call_id: m for m in added}
    return [each for m in state for each in (m, *(by_call[call["id"]] for call in getattr(m, "invalid_tool_calls", ())
                                                   if call["id"] in by_call))]


class CtxrtMiddleware(AgentMiddleware[CtxrtState, Any, Any]):
    """A LangChain agent's memory in a ctxrt slot, seen through the agent's reader.

    ``manager`` is a ``ctxrt.aio`` manager opened with the agent's ``view_reader``; ``agent`` is the
    participant the agent speaks as (default: the reader); ``budget`` bounds every view. Made in
    the runtime's event loop (or given ``loop``), so the synchronous ``wrap_model_call`` can hand
    its ctxrt calls to that loop from another thread.
    """

    state_schema = CtxrtState

    def __init__(
        self,
        manager: ContextManager,
        *,
        budget: Budget | None = None,
        agent: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__()
        self.manager, self.budget, self.agent = arguments.adapter_arguments("CtxrtMiddleware", manager, budget, agent)
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, not {type(loop).__name__}")
        self.ledger = Ledger(self.manager, group=THREAD)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.loop = loop

    async def record(self, messages: Sequence[BaseMessage], *, final: bool = True, held: Collection[str] = (),
                     thread: str | None = None) -> None:
        """Writes the LangChain messages the slot doesn't hold, as the agent's turn would (see the
        module's doc); unless ``final``, tool calls that end ``messages`` wait for their results;
        ids in ``held`` count as written; what is written is tagged with ``thread``. Every message
        is checked before the first is written (``MalformedContentError`` naming ``messages[i]``)."""
        messages = checks.instances(messages, "messages", BaseMessage)
        checks.optional_name(thread, "thread")
        await self.ledger.catch_up()
        known = self._keys(messages, held)
        reader = str(self.manager.view_reader)
        writes: dict[int, list[tuple[str, list[blocks.Block]]]] = {}

        def written(i: int) -> list[tuple[str, list[blocks.Block]]]:
            if i not in writes:
                writes[i] = blocks.from_chat(_chat(messages[i]), self.agent, reader, f"messages[{i}]")
            return writes[i]

        # A message LangGraph gave no id (one passed to record by hand) is known by what it writes and where.
        keys = [key or blocks.digest(self.manager.namespace, i, written(i)) for i, key in enumerate(known)]
        # A new message is stored under its id too (so a later version of it is known as an edit); an edit is not,
        # so the thread's view, which keeps its stored messages by the keys its state holds, leaves the old one out.
        also = {key: [m.id] for key, m in zip(keys, messages) if m.id is not None and key != m.id and self.ledger.slot_id(m.id) is None}
        metadata = {blocks.WRITER: self.manager.namespace, **({THREAD: thread} if thread is not None else {})}
        await self.ledger.record(keys, written, metadata, hold_calls=not final, held=held, also=also)

    def _keys(self, messages: Sequence[BaseMessage], held: Collection[str]) -> list[str | None]:
        """Each message's key: its ``_version``, or its bare id where an earlier ctxrt wrote it so
        (no stored message of that id lists a version, or the state's own account, ``held``,
        names the id); None for a message without an id."""
        keys: list[str | None] = []
        for message in messages:
            if message.id is None:
                keys.append(None)
                continue
            version, stored = _version(message), self.ledger.slot_id(message.id)
            bare = self.ledger.slot_id(version) is None and (
                message.id in held if stored is None else
                not any(key.startswith(f"{message.id}#") for key in self.ledger.keys(stored)))
            keys.append(message.id if bare else version)
        return keys

    def _seen(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``view``'s arguments for a step of the thread whose state is ``state``."""
        return {"hidden": set(_ids(state, HIDDEN)), "thread": _thread(state),
                "shown": {key for key in self._keys(state["messages"], _written_before(state)) if key is not None}}

    async def view(self, hidden: Collection[str] = (), *, thread: str | None = None,
                   shown: Collection[str] = ()) -> list[AnyMessage]:
        """The agent's reader's compiled view, as LangChain messages, without the stored messages
        ``hidden`` names (removed from the thread's state), nor those ``thread`` wrote holding
        none of the keys in ``shown`` (the state's messages' now, ``_keys``: a rewind abandoned
        them, or an edit replaced them)."""
        result = await self.manager.compile(self.budget)
        gone = set(hidden)
        if thread is not None:
            gone.update(stored for stored, keys in self.ledger.grouped(thread).items()
                        if keys and not any(key in shown for key in keys))
        if gone:
            result = blocks.without(result, lambda source: source.kind == "message" and source.id in gone)
        await record_compiled(self.manager, result, "openai_chat", self.agent)
        reasoned = blocks.reasoned_calls(result, self.agent)
        # LangChain wants every dict to carry content; an assistant message of calls alone has none.
        messages = convert_to_messages([_with_reasoning({"content": "", **m}, reasoned)
                                        for m in blocks.chat_messages(result, self.agent)])
        _marked_failed(messages, blocks.failed_calls(result))
        return cast("list[AnyMessage]", messages)  # each one of the AnyMessage kinds convert_to_messages makes

    async def _write_state(self, state: CtxrtState, *, final: bool) -> dict[str, Any] | None:
        """Writes the state's messages the slot doesn't hold (see the module's doc); what the slot
        now holds of the state, and what left the state since the last step, go back as the
        step's state update."""
        messages = state["messages"]
        held = _written_before(state)
        thread = _thread(state) or uuid.uuid4().hex
        await self.record(messages, final=final, held=held, thread=thread)
        now = [key for key in self._keys(messages, held) if key is not None]
        before = _ids(state, PRESENT)
        hidden = _ids(state, HIDDEN)
        # A key gone from the state is a message removed, or the version an edit replaced.
        hidden += [found for key in before if key not in now and (found := self.ledger.slot_id(key)) is not None]
        present = [key for key in now if key in held or self.ledger.slot_id(key) is not None]
        update: dict[str, Any] = {} if THREAD in state else {THREAD: thread}
        if present != before:
            update[PRESENT] = present
        if hidden != _ids(state, HIDDEN):
            update[HIDDEN] = hidden
        return update or None

    async def abefore_model(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._write_state(state, final=False)

    def before_model(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._on_loop(self._write_state(state, final=False))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelCallResult[Any]]],
    ) -> ModelCallResult[Any]:
        return await handler(request.override(messages=await self._view_for(request)))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelCallResult[Any]],
    ) -> ModelCallResult[Any]:
        return handler(request.override(messages=self._on_loop(self._view_for(request))))

    async def _view_for(self, request: ModelRequest[Any]) -> list[AnyMessage]:
        """The view handed to the model call ``request`` makes, holding the error results LangGraph
        added to its messages (``_repairs``) as the call without the middleware would, and what
        the state holds unwritten: a thread resumed at the model node (a checkpoint edited by
        ``aupdate_state``) skips ``abefore_model``."""
        state = request.state
        messages = _repairs(request)
        await self.record(messages, final=False, held=_written_before(state), thread=_thread(state))
        return await self.view(**self._seen({**state, "messages": messages}))

    async def aafter_agent(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._write_state(state, final=True)

    def after_agent(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._on_loop(self._write_state(state, final=True))

    def _on_loop(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Runs a ctxrt call on the runtime's loop from a synchronous agent in another thread."""
        loop = self.loop
        if loop is None or loop.is_closed():
            call.close()
            raise RuntimeError("CtxrtMiddleware was made outside an event loop and given no loop: pass loop=")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            call.close()
            raise RuntimeError(
                "a synchronous agent call (invoke, stream) on the ctxrt runtime's own event loop would block it: "
                "use ainvoke/astream, or run the agent in another thread (asyncio.to_thread)"
            )
        future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(call, loop)
        return future.result()
