"""A ChatCompletionContext for AutoGen (0.7) agents: ``get_messages`` is the agent's reader's compiled
view of a shared ctxrt slot (docs/integrations.md#autogen).

    pip install 'ctxrt[autogen]'

``CtxrtModelContext(manager, team=team)`` goes in ``AssistantAgent(..., model_context=...)``. What
the agent adds to its context is written to the shared slot: its own replies as the agent, its
tool calls as the agent once their results are added, together with them as one message (so no
other agent's message comes between a call and its results), a message from outside the team
(the task, a person) as its source (escaped when named as a role or as the agent, I14), and a system message (what a ``Memory`` adds) as
``"system"`` with the agent's reader as its audience, so no other agent sees it.
``get_messages()`` compiles the manager's view under its budget
(``CompileResult.to_openai_chat``) as AutoGen's LLM messages.

``clear()`` (an agent's or a team's ``reset()``) resets the agent's view, not the shared slot: the
view starts after the newest message the slot held then (summaries of what came before left out
too), and ``save_state()``/``load_state()`` carry that start, the view's end (what the slot
gained between a save and its load is left out of the restored view, as AutoGen's own context
forgets it) and any calls held for their results.

A group chat hands every agent every other agent's message: with the agents listed in one
``Team``, a context doesn't write what a member said (that member's own context wrote it: a
``UserMessage`` or an ``AssistantMessage`` whose source is the member, as a Swarm's handoff
hands on the member's tool calls, with the results answering them), and
an outside message that every member receives (the task) is written once.

``dump_component()`` gives a declarative config (``CtxrtModelContextConfig``: store, namespace,
branch, reader, agent, budget, team members). ``load_component`` is synchronous and a runtime is
opened in a running loop, and one store takes one writing runtime, so the host lends its own:
loaded inside ``with loading(runtime):``, each context opens its manager from that runtime at its
first async method, and contexts of one team loaded together share one ``Team``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
from autogen_core import Component, FunctionCall, Image
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    SystemMessage,
    UserMessage,
)

from pydantic import BaseModel
from typing_extensions import Self

from .. import Budget, ContextManager, MalformedContentError, aio, checks
from . import arguments, blocks
from .ledger import record_compiled

METADATA_KEY = "autogen_agent"  # metadata naming the agent whose context wrote a message


class Team:
    """The agents of one AutoGen team whose contexts share one slot (``members``: their names).

    Keeps the outside messages one member's context wrote until every other member has had its
    copy, or has since looked at its view (a copy reaches an agent before its next model call):
    the same message handed to each member is written once.
    """

    def __init__(self, members: Iterable[str]) -> None:
        # A string is an iterable of its letters, never a list of names: Team("ann") is refused.
        if isinstance(members, (str, bytes)) or not isinstance(members, Iterable):
            raise TypeError(f"Team members must be an iterable of agent names, not {type(members).__name__}")
        self.members = frozenset(checks.names(list(members), "Team members"))
        self._awaited: list[tuple[str, set[str]]] = []  # (an outside message, members yet to get it)

    def is_copy(self, agent: str, key: str) -> bool:
        """Whether another member's context wrote this outside message for ``agent`` too."""
        for held, waiting in self._awaited:
            if held == key and agent in waiting:
                waiting.discard(agent)
                self._awaited = [entry for entry in self._awaited if entry[1]]
                return True
        return False

    def wrote(self, agent: str, key: str) -> None:
        waiting = set(self.members - {agent})
        if waiting:
            self._awaited.append((key, waiting))

    def viewed(self, agent: str) -> None:
        """``agent``'s context compiled: no copy of an older message is still on its way to it."""
        for _, waiting in self._awaited:
            waiting.discard(agent)
        self._awaited = [entry for entry in self._awaited if entry[1]]


def _user_blocks(content: str | Sequence[str | Image], place: str) -> list[blocks.Block]:
    if not isinstance(content, (str, list)):
        raise MalformedContentError(place, f"must be a string or a list of strings and images, not {type(content).__name__}")
    if isinstance(content, str):
        return [blocks.text(content, place)] if content.strip() else []
    out = []
    for j, part in enumerate(content):
        if isinstance(part, Image):
            out.append(blocks.image(part.data_uri, f"{place}[{j}]"))
        elif part.strip():
            out.append(blocks.text(part, f"{place}[{j}]"))
    return out


def _written(message: LLMMessage, agent: str, reader: str) -> tuple[str, list[blocks.Block]] | None:
    """What a message added to the context writes to the slot: (participant, blocks), or None."""
    if isinstance(message, AssistantMessage):
        if isinstance(message.content, str):
            said = [blocks.text(message.content, "message.content")] if message.content.strip() else []
        else:
            said = [blocks.text(message.thought, "message.thought")] if message.thought and message.thought.strip() else []
            said += [blocks.tool_use(call.id, call.name, call.arguments, f"message.content[{j}]")
                     for j, call in enumerate(message.content)]
        return (agent, said) if said else None
    if isinstance(message, FunctionExecutionResultMessage):
        results = [blocks.tool_result(r.call_id, r.content, f"message.content[{j}]", is_error=bool(r.is_error))
                   for j, r in enumerate(message.content)]
        return (blocks.TOOL, results) if results else None
    if isinstance(message, UserMessage):
        content = _user_blocks(message.content, "message.content")
        return (blocks.speaker(message.source, agent), content) if content else None
    if message.content.strip():  # a SystemMessage: this agent's alone
        return blocks.instructions("system", [blocks.text(message.content, "message.content")], reader)
    return None


Made = dict[tuple[str, str, str], LLMMessage]  # text messages by (role, name, content)


def _llm_messages(messages: Sequence[Mapping[str, Any]], agent: str, failed: frozenset[str],
                  made: Made) -> tuple[list[LLMMessage], Made]:
    """Chat Completions messages as AutoGen's LLM messages (a run of tool messages as one result
    message; the results of the ``failed`` calls flagged ``is_error``), and the text messages among
    them by what they were made from. A text message ``made`` holds is handed back as that object
    (once per list), as AutoGen's own contexts hand back the messages they hold."""
    out: list[LLMMessage] = []
    names: dict[str, str] = {}  # call id -> the function's name, which AutoGen's results carry
    kept: Made = {}
    for message in messages:
        role = message["role"]
        content = message.get("content")
        key = (role, message.get("name") or "", content) if isinstance(content, str) and \
            not message.get("tool_calls") and role != "tool" else None
        if key is not None and key not in kept and key in made:
            kept[key] = made[key]
            out.append(made[key])
            continue
        if role == "assistant":
            calls = [FunctionCall(id=c["id"], arguments=c["function"]["arguments"], name=c["function"]["name"])
                     for c in message.get("tool_calls") or ()]
            names.update((call.id, call.name) for call in calls)
            if calls:
                out.append(AssistantMessage(content=calls, thought=content, source=agent))
            else:
                out.append(AssistantMessage(content=content or "", source=agent))
        elif role == "tool":
            call_id = message["tool_call_id"]
            error = call_id in failed
            result = FunctionExecutionResult(content=blocks.error_text(content or "") if error else content or "",
                                             name=names.get(call_id, ""), call_id=call_id, is_error=error)
            if out and isinstance(out[-1], FunctionExecutionResultMessage):
                out[-1].content.append(result)
            else:
                out.append(FunctionExecutionResultMessage(content=[result]))
        elif role == "user":
            out.append(UserMessage(content=_user_content(content), source=message.get("name") or blocks.USER))
        elif role in blocks.INSTRUCTIONS:
            out.append(SystemMessage(content=content or ""))
        else:
            continue
        if key is not None:
            kept.setdefault(key, out[-1])
    return out, kept


def _user_content(content: Any) -> str | list[str | Image]:
    if isinstance(content, str):
        return content
    parts: list[str | Image] = []
    for part in content:
        if part["type"] == "text":
            parts.append(part["text"])
        elif part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/"):
            parts.append(Image.from_base64(part["image_url"]["url"].partition(",")[2]))
        elif part["type"] == "image_url":
            parts.append(f"[image: {part['image_url']['url']}]")  # AutoGen would fetch it; the view stays offline
        else:
            parts.append(f"[{part['type']} not shown]")
    return parts


class CtxrtModelContextConfig(BaseModel):
    """What ``CtxrtModelContext.dump_component()`` writes and ``load_component`` reads."""

    store: str  # the runtime's path: a directory, or a PostgreSQL URL without its password
    namespace: str
    branch: str = "main"
    reader: str
    agent: str
    max_tokens: int
    reserve_for_response: int
    team: list[str]


@attrs.frozen
class _Loading:
    runtime: aio.Runtime
    teams: dict[tuple[str, str, frozenset[str]], Team] = attrs.field(factory=dict)


_loading: contextvars.ContextVar[_Loading | None] = contextvars.ContextVar("ctxrt_autogen_loading", default=None)


@contextlib.contextmanager
def loading(runtime: aio.Runtime) -> Iterator[None]:
    """Lends the host's ``runtime`` (``ctxrt.aio.open_runtime``, open on the store the configs
    name) to the ``CtxrtModelContext`` configs loaded inside: each opens its namespace from it at
    its first async method, and is usable while the runtime is open. The contexts of one team
    (the same store, branch and members) loaded in one block share one ``Team``."""
    if not isinstance(runtime, aio.Runtime):
        raise TypeError(f"runtime must be a ctxrt.aio Runtime (from ctxrt.aio.open_runtime), not {type(runtime).__name__}")
    token = _loading.set(_Loading(runtime))
    try:
        yield
    finally:
        _loading.reset(token)


@attrs.frozen
class _Opening:
    """A manager a loaded context opens at its first async method (see ``loading``)."""

    runtime: aio.Runtime
    config: CtxrtModelContextConfig

    async def open(self) -> ContextManager:
        return await self.runtime.open(self.config.namespace, view_reader=self.config.reader, branch=self.config.branch)


class CtxrtModelContext(ChatCompletionContext, Component[CtxrtModelContextConfig]):
    """An AutoGen agent's model context in a ctxrt slot, seen through the agent's reader.

    ``manager`` is a ``ctxrt.aio`` manager opened with the agent's ``view_reader``; ``agent`` is the
    agent's name, the participant it speaks as (default: the reader); ``team`` lists the agents
    whose contexts share the slot (see the module's doc); ``budget`` bounds every view.
    """

    def __init__(
        self,
        manager: ContextManager,
        *,
        budget: Budget | None = None,
        agent: str | None = None,
        team: Team | None = None,
    ) -> None:
        super().__init__()
        if isinstance(manager, _Opening):  # from load_component: opened at the first async method
            self._manager: ContextManager | None = None
            self._opening: _Opening | None = manager
            self.budget, self.agent = checks.optional_instance(budget, "budget", Budget) or Budget(), str(agent)
        else:
            self._manager, self.budget, self.agent = arguments.adapter_arguments("CtxrtModelContext", manager, budget, agent)
            self._opening = None
        self._attaching = asyncio.Lock()
        self.team = checks.optional_instance(team, "team", Team) or Team([self.agent])
        # The agent's tool calls, held until their results are added: written with them.
        self._calls: tuple[str, list[blocks.Block]] | None = None
        self._handed: set[str] = set()  # the call ids of another member's reply handed on, not written
        self._start = -1  # the view shows messages after this sequence (a reset's)
        # Stretches of sequences (after, through] the view leaves out: what the slot gained between a
        # saved state and its load (another timeline's turns).
        self._gaps: list[tuple[int, int]] = []
        # The last view's text messages: the next view reuses them rather than building and
        # validating each again (a third of a view's time at 20,000 messages).
        self._made: Made = {}

    component_config_schema = CtxrtModelContextConfig
    component_provider_override = "ctxrt.integrations.autogen.CtxrtModelContext"

    @property
    def manager(self) -> ContextManager:
        """The agent's manager; a context loaded from a config opens it at its first async method."""
        if self._manager is None:
            raise RuntimeError("this CtxrtModelContext was loaded from a config and opens its manager at its "
                               "first async method (add_message, get_messages, clear), not yet called")
        return self._manager

    async def _attached(self) -> None:
        async with self._attaching:
            if self._manager is None and self._opening is not None:
                self._manager = await self._opening.open()

    def _to_config(self) -> CtxrtModelContextConfig:
        if self._opening is not None:
            return self._opening.config
        return CtxrtModelContextConfig(
            store=str(self.manager.store_path), namespace=self.manager.namespace, branch=self.manager.branch,
            reader=str(self.manager.view_reader), agent=self.agent, max_tokens=self.budget.max_tokens,
            reserve_for_response=self.budget.reserve_for_response, team=sorted(self.team.members))

    @classmethod
    def _from_config(cls, config: CtxrtModelContextConfig) -> Self:
        lent = _loading.get()
        if lent is None:
            raise RuntimeError("CtxrtModelContext.load_component needs the host's runtime: load the config inside "
                               "`with ctxrt.integrations.autogen.loading(runtime):`")
        if str(lent.runtime.path) != config.store:
            raise ValueError(f"config store {config.store!r} is not the lent runtime's store {str(lent.runtime.path)!r}")
        team = lent.teams.setdefault((config.store, config.branch, frozenset(config.team)), Team(config.team))
        budget = Budget(config.max_tokens, config.reserve_for_response)
        return cls(_Opening(lent.runtime, config), budget=budget, agent=config.agent, team=team)  # type: ignore[arg-type]

    @property
    def _metadata(self) -> dict[str, str]:
        return {METADATA_KEY: self.agent, blocks.WRITER: self.manager.namespace}

    async def add_message(self, message: LLMMessage) -> None:
        """Writes what the agent added to the shared slot (see the module's doc).

        Raises ``TypeError`` for anything but an AutoGen LLM message, ``MalformedContentError``
        naming the place for content a ctxrt message can't hold; nothing is written then."""
        if not isinstance(message, (SystemMessage, UserMessage, AssistantMessage, FunctionExecutionResultMessage)):
            raise TypeError(f"message must be an AutoGen LLMMessage, not {type(message).__name__}")
        await self._attached()
        written = _written(message, self.agent, str(self.manager.view_reader))
        if isinstance(message, UserMessage):
            if message.source in self.team.members:
                return  # that member's own context wrote it
            key = json.dumps([message.source, written], sort_keys=True)
            if self.team.is_copy(self.agent, key):
                return
        if isinstance(message, AssistantMessage) and message.source != self.agent and message.source in self.team.members:
            # Another member's reply handed on (a Swarm's HandoffMessage.context): its context wrote
            # it, and the results answering its calls with it.
            self._handed = {b["id"] for b in written[1] if b["type"] == "tool_use"} if written is not None else set()
            return
        if isinstance(message, FunctionExecutionResultMessage) and written is not None and \
                all(b["tool_use_id"] in self._handed for b in written[1]):
            self._handed = set()
            return
        if isinstance(message, AssistantMessage) and isinstance(message.content, list):
            await self._write_held()
            self._calls = written
            return
        if isinstance(message, FunctionExecutionResultMessage) and self._calls is not None and written is not None:
            joined = blocks.paired([self._calls, written])
            if len(joined) == 1:
                self._calls, written = None, joined[0]
        await self._write_held()
        if written is None:
            return
        await self.manager.add_message(written[0], written[1], metadata=self._metadata)
        if isinstance(message, UserMessage):
            self.team.wrote(self.agent, key)

    async def _write_held(self) -> None:
        """Writes calls whose results never came (a compile leaves them out until answered)."""
        held, self._calls = self._calls, None
        if held is not None:
            await self.manager.add_message(held[0], held[1], metadata=self._metadata)

    async def get_messages(self) -> list[LLMMessage]:
        """The agent's reader's compiled view since its last reset, as AutoGen's LLM messages."""
        await self._attached()
        result = await self.manager.compile(self.budget)
        self.team.viewed(self.agent)
        if self._start >= 0 or self._gaps:
            summaries = {s.id for sources in result.provenance.messages for s in sources if s.kind == "summary"}
            before = set()
            for summary_id in summaries:
                summary = await self.manager.get_summary(summary_id)
                if summary is not None and (summary.last_sequence <= self._start or any(
                        after < summary.first_sequence and summary.last_sequence <= through
                        for after, through in self._gaps)):
                    before.add(summary_id)
            result = blocks.without(result, lambda source: self._hidden(int(source.id)) if source.kind == "message"
                                    else source.id in before)
        await record_compiled(self.manager, result, "openai_chat", self.agent)
        messages, self._made = _llm_messages(blocks.chat_messages(result, self.agent), self.agent,
                                             blocks.failed_calls(result), self._made)
        return messages

    def _hidden(self, sequence: int) -> bool:
        return sequence <= self._start or any(after < sequence <= through for after, through in self._gaps)

    async def _newest(self) -> int:
        newest = await self.manager.get_message_window(-1, 1)
        return newest.messages[-1].sequence if newest.messages else -1

    async def clear(self) -> None:
        """Resets the agent's view (an agent's or a team's ``reset()``): it starts after the newest
        message the slot holds now; the slot keeps every message for the other agents. Calls held
        for their results are dropped."""
        await self._attached()
        self._calls = None
        self._start, self._gaps = await self._newest(), []

    async def save_state(self) -> Mapping[str, Any]:
        """Where the agent's view starts and ends (the slot's newest message now), the stretches it
        leaves out, and the calls held for their results: the history itself is the slot's, kept
        by ctxrt."""
        await self._attached()
        return {"view_start": self._start, "view_end": await self._newest(), "gaps": [list(gap) for gap in self._gaps],
                "held_calls": list(self._calls) if self._calls is not None else None}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """Restores what ``save_state`` returned: the view it saved, and what the slot gains from
        now on (I9); or an earlier ctxrt's ``{"messages": []}`` (the view from the slot's start).
        ``ValueError`` naming the field for anything else, such as another context's messages,
        which this context would otherwise drop unseen."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping, not {type(state).__name__}")
        if state.get("messages", []) != []:
            raise ValueError("state['messages'] holds another model context's history: CtxrtModelContext keeps "
                             "history in its slot; write those messages with add_message instead")
        start, held = state.get("view_start", -1), state.get("held_calls")
        end, gaps = state.get("view_end"), state.get("gaps", [])
        for field, value in (("view_start", start), ("view_end", -1 if end is None else end)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"state[{field!r}] must be an integer sequence, not {value!r}")
        if not isinstance(gaps, list) or not all(isinstance(gap, list) and len(gap) == 2 and all(
                isinstance(n, int) and not isinstance(n, bool) for n in gap) for gap in gaps):
            raise ValueError(f"state['gaps'] must be a list of [after, through] sequence pairs, not {gaps!r}")
        if held is not None:
            if not (isinstance(held, list) and len(held) == 2 and isinstance(held[0], str) and isinstance(held[1], list)):
                raise ValueError("state['held_calls'] must be [participant, blocks] or None")
            held = (held[0], [blocks.checked(block, f"state['held_calls'][1][{j}]") for j, block in enumerate(held[1])])
        await self._attached()
        newest = await self._newest()
        # What the slot gained since the save is another timeline's: the restored view leaves it out.
        gained = [(end, newest)] if end is not None and newest > end else []
        self._start, self._calls, self._gaps = start, held, [(a, t) for a, t in gaps] + gained
