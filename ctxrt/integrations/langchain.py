"""An AgentMiddleware for LangChain 1.x agents: the model sees the agent's reader's compiled view of
a shared ctxrt slot (docs/integrations.md#langchain).

    pip install 'ctxrt[langchain]'

``CtxrtMiddleware(manager)`` goes in ``create_agent(..., middleware=[...])``. Before each model
call (``abefore_model``) it writes the agent state's messages it hasn't written yet to the shared
slot (a human message as its ``name`` or ``"user"``, the agent's messages and tool calls as the
agent, tool messages joined to the calls they answer); at the call (``awrap_model_call``;
``wrap_model_call`` from a thread other than the runtime's loop) it hands the model the manager's
compiled view under its budget in place of the state's messages (the system message stays the
agent's). How far the state is written is kept in the agent's state (``ctxrt_recorded``) by the
same step that writes it, so a checkpointer's thread resumes where it left off, even after a
model call failed or was cancelled; without one each invocation's state is its own input and
turn. A reply with tool calls waits in the state until its results are there and is written with
them as one message; what the state holds when the agent ends (the final reply, a tool that
returns directly) is written then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any, TypeVar, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
from langchain.agents.middleware.types import ModelCallResult, PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, convert_to_messages, convert_to_openai_messages
from langgraph.runtime import Runtime
from typing_extensions import NotRequired

from .. import Budget, ContextManager
from . import blocks

RECORDED = "ctxrt_recorded"  # the state key: how many of the state's messages are in the slot
_T = TypeVar("_T")


class CtxrtState(AgentState[Any]):
    ctxrt_recorded: NotRequired[Annotated[int, PrivateStateAttr]]


def _written_count(state: AgentState[Any]) -> int:
    count = state.get(RECORDED, 0)
    return count if isinstance(count, int) else 0


def _awaiting_results(messages: Sequence[BaseMessage]) -> bool:
    """Whether the state ends with the agent's tool calls, their results yet to come."""
    return bool(messages) and isinstance(messages[-1], AIMessage) and bool(messages[-1].tool_calls)


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

    async def record(self, messages: Sequence[BaseMessage], start: int = 0) -> None:
        """Writes LangChain messages to the slot, as the agent's turn would (see the module's doc);
        ``start``: the first one's index in the state, for the place an error names."""
        if not messages:
            return
        planned = blocks.from_chat(convert_to_openai_messages(list(messages)), self.agent, start)
        for participant, content in planned:
            await self.manager.add_message(participant, content)

    async def view(self) -> list[AnyMessage]:
        """The agent's reader's compiled view, as LangChain messages."""
        result = await self.manager.compile(self.budget)
        # LangChain wants every dict to carry content; an assistant message of calls alone has none.
        messages = convert_to_messages([{"content": "", **m} for m in blocks.chat_messages(result, self.agent)])
        return cast("list[AnyMessage]", messages)  # each one of the AnyMessage kinds convert_to_messages makes

    async def _write_state(self, state: CtxrtState, *, final: bool) -> dict[str, Any] | None:
        """Writes the state's messages not yet written, but for tool calls still awaiting their
        results (unless ``final``); the written count goes back as the step's state update."""
        messages = state["messages"]
        done = _written_count(state)
        end = len(messages) - 1 if not final and _awaiting_results(messages) else len(messages)
        if end <= done:
            return None
        await self.record(messages[done:end], done)
        return {RECORDED: end}

    async def abefore_model(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._write_state(state, final=False)

    def before_model(self, state: CtxrtState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._on_loop(self._write_state(state, final=False))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelCallResult[Any]]],
    ) -> ModelCallResult[Any]:
        return await handler(request.override(messages=await self.view()))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelCallResult[Any]],
    ) -> ModelCallResult[Any]:
        return handler(request.override(messages=self._on_loop(self.view())))

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
