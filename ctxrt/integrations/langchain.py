"""An AgentMiddleware for LangChain 1.x agents: the model sees the agent's reader's compiled view of
a shared ctxrt slot (docs/integrations.md#langchain).

    pip install 'ctxrt[langchain]'

``CtxrtMiddleware(manager)`` goes in ``create_agent(..., middleware=[...])``. At each model call
(``awrap_model_call``; ``wrap_model_call`` from a thread other than the runtime's loop) it writes
the agent state's messages it hasn't written yet to the shared slot (a human message as its
``name`` or ``"user"``, the agent's messages and tool calls as the agent, tool messages as
``"tool"``), hands the model the manager's compiled view under its budget in place of the state's
messages (the system message stays the agent's), and writes the model's reply. How far the state
is written is kept in the agent's state (``ctxrt_recorded``), so a checkpointer's thread resumes
where it left off; without one each invocation's state is its own input and turn. What the state
holds after the last model call (a tool that returns directly) is written when the agent ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ExtendedModelResponse, ModelCallResult, PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, convert_to_messages, convert_to_openai_messages
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired

from .. import Budget, ContextManager
from . import blocks

RECORDED = "ctxrt_recorded"  # the state key: how many of the state's messages are in the slot
_T = TypeVar("_T")


class CtxrtState(AgentState[Any]):
    ctxrt_recorded: NotRequired[Annotated[int, PrivateStateAttr]]


def _reply(result: ModelCallResult[Any]) -> tuple[list[BaseMessage], Command[Any] | None]:
    """The messages a model call added to the state, and any command an inner middleware returned."""
    if isinstance(result, AIMessage):
        return [result], None
    if isinstance(result, ExtendedModelResponse):
        return list(result.model_response.result), result.command
    return list(result.result), None


def _with_recorded(result: ModelCallResult[Any], count: int) -> ExtendedModelResponse[Any]:
    """``result`` with the state's written count set, beside any update an inner middleware made."""
    messages, inner = _reply(result)
    response = result.model_response if isinstance(result, ExtendedModelResponse) else (
        ModelResponse(result=messages) if isinstance(result, AIMessage) else result)
    update: dict[str, Any] = {}
    if inner is not None and isinstance(inner.update, dict):
        update.update(inner.update)
    update[RECORDED] = count
    return ExtendedModelResponse(model_response=response, command=Command(update=update))


def _written_count(state: AgentState[Any]) -> int:
    count = state.get(RECORDED, 0)
    return count if isinstance(count, int) else 0


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
        if manager.view_reader is None:
            raise ValueError("CtxrtMiddleware needs a manager opened with view_reader=<the agent's reader>")
        self.manager = manager
        self.budget = budget if budget is not None else Budget()
        self.agent = agent if agent is not None else manager.view_reader
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.loop = loop

    async def record(self, messages: Sequence[BaseMessage]) -> None:
        """Writes LangChain messages to the slot, as the agent's turn would (see the module's doc)."""
        if not messages:
            return
        planned = blocks.from_chat(convert_to_openai_messages(list(messages)), self.agent)
        for participant, content in planned:
            await self.manager.add_message(participant, content)

    async def view(self) -> list[AnyMessage]:
        """The agent's reader's compiled view, as LangChain messages."""
        result = await self.manager.compile(self.budget)
        # LangChain wants every dict to carry content; an assistant message of calls alone has none.
        messages = convert_to_messages([{"content": "", **m} for m in blocks.chat_messages(result, self.agent)])
        return cast("list[AnyMessage]", messages)  # each one of the AnyMessage kinds convert_to_messages makes

    async def _before(self, request: ModelRequest[Any]) -> tuple[ModelRequest[Any], int]:
        messages = request.state["messages"]
        await self.record(messages[_written_count(request.state):])
        return request.override(messages=await self.view()), len(messages)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelCallResult[Any]]],
    ) -> ExtendedModelResponse[Any]:
        viewed, count = await self._before(request)
        result = await handler(viewed)
        reply, _ = _reply(result)
        await self.record(reply)
        return _with_recorded(result, count + len(reply))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelCallResult[Any]],
    ) -> ExtendedModelResponse[Any]:
        viewed, count = self._on_loop(self._before(request))
        result = handler(viewed)
        reply, _ = _reply(result)
        self._on_loop(self.record(reply))
        return _with_recorded(result, count + len(reply))

    async def aafter_agent(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        messages = state["messages"]
        done = _written_count(state)
        if done >= len(messages):
            return None
        await self.record(messages[done:])
        return {RECORDED: len(messages)}

    def after_agent(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._on_loop(self.aafter_agent(state, runtime))

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
