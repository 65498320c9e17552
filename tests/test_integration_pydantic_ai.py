"""The Pydantic AI adapter (``ctxrt.integrations.pydantic_ai``), with real Pydantic AI agents: two
agents with a ``CtxrtHistory`` each over one slot, on pydantic_ai's own offline model
(``FunctionModel``, which is handed the messages of each request), and on pydantic_ai's
``OpenAIChatModel`` through the real ``openai`` client against the loopback server, which refuses
any request that breaks OpenAI's rules."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from adapters_support import BUDGET, PUBLIC, SECRET, TOOL_SECRET, holds, line, residents, run, summaries_hold, words
from ctxrt import MalformedContentError
from ctxrt.integrations.pydantic_ai import CtxrtHistory
from ctxrt.openai_rules import violations
from ctxrt.testing import ApiReply
from loopback_openai import serving_openai_api


def lookup(key: str) -> str:
    """Looks a key up."""
    return TOOL_SECRET if key == "ann" else "nothing"


class Scripted:
    """A FunctionModel's function: records what each request held; calls the tool once if asked."""

    def __init__(self, speaker: str, *, call_first: bool = False) -> None:
        self.speaker = speaker
        self.call_first = call_first
        self.calls: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls.append(messages)
        if self.call_first:
            self.call_first = False
            return ModelResponse(parts=[ToolCallPart("lookup", {"key": "ann"}, tool_call_id="call_1")])
        return ModelResponse(parts=[TextPart(line(self.speaker, len(self.calls)))])


def agent(name: str, manager: Any, model: Any) -> Agent[None, str]:
    return Agent(model, system_prompt=f"You are {name}.", tools=[lookup],
                 capabilities=[CtxrtHistory(manager, budget=BUDGET)])


def test_an_audience_block_for_one_agent_never_reaches_the_other_agents_model(tmp_path: Path) -> None:
    """ann's model sees her system prompt, the line for her, the public line and her own tool
    call and return; bob's sees his system prompt, the public line and ann's call as text, never
    ann's line; ann's final reply reaches the slot when her run ends (I1)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            await team.write_for_ann()
            ann_model, bob_model = Scripted("ann", call_first=True), Scripted("bob")
            await agent("ann", team.ann, FunctionModel(ann_model)).run("ann, look yourself up")
            await agent("bob", team.bob, FunctionModel(bob_model)).run("bob, what's new?")
            assert holds(ann_model.calls[0], "You are ann.") and holds(ann_model.calls[0], SECRET)
            assert holds(ann_model.calls[0], PUBLIC)
            assert isinstance(ann_model.calls[1][-1], ModelRequest)
            assert isinstance(ann_model.calls[1][-1].parts[0], ToolReturnPart)
            assert holds(bob_model.calls, "You are bob.") and holds(bob_model.calls, PUBLIC)
            assert holds(bob_model.calls, "ann called lookup") and holds(bob_model.calls, TOOL_SECRET)
            assert holds(bob_model.calls, line("ann", 2)) and not holds(bob_model.calls, SECRET)
            assert not holds(bob_model.calls, "You are ann.")

    run(body)


def test_a_signed_thinking_part_comes_back_before_its_tool_call_to_that_agent_alone(tmp_path: Path) -> None:
    """ann's reply of a signed ThinkingPart and a tool call is written with the thinking for her
    reader alone: her next request holds the part, signature and all, ahead of the call, and
    bob's requests never hold it (I13)."""
    thought = ThinkingPart("ann ponders", signature="sig-1", provider_name="anthropic")

    def ann_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ann_calls.append(messages)
        if len(ann_calls) == 1:
            return ModelResponse(parts=[thought, ToolCallPart("lookup", {"key": "ann"}, tool_call_id="call_1")])
        return ModelResponse(parts=[TextPart("done")])

    ann_calls: list[list[ModelMessage]] = []

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            await agent("ann", team.ann, FunctionModel(ann_model)).run("ann, look yourself up")
            bob_model = Scripted("bob")
            await agent("bob", team.bob, FunctionModel(bob_model)).run("bob, what's new?")
            reply = next(m for m in ann_calls[1] if isinstance(m, ModelResponse))
            assert reply.parts[0] == thought and isinstance(reply.parts[1], ToolCallPart)
            assert holds(bob_model.calls, "ann called lookup") and not holds(bob_model.calls, "ann ponders")

    run(body)


def test_a_long_run_compresses_and_every_view_stays_under_budget(tmp_path: Path) -> None:
    """40 runs of two agents with Autobiographical: each view fits the budget with nothing left
    out, the late requests carry summaries instead of the old turns, and bob's summaries never
    read ann's line (I2)."""

    async def body() -> None:
        async with residents(tmp_path / "store", compress=True) as team:
            await team.write_for_ann()
            scripts = {"ann": Scripted("ann", call_first=True), "bob": Scripted("bob")}
            agents = {"ann": (agent("ann", team.ann, FunctionModel(scripts["ann"])), team.ann),
                      "bob": (agent("bob", team.bob, FunctionModel(scripts["bob"])), team.bob)}
            for turn in range(40):
                name = "ann" if turn % 2 == 0 else "bob"
                runner, manager = agents[name]
                await runner.run(f"turn {turn}, go on")
                await team.settle()
                assert team.within_budget(manager), turn
            last = scripts["bob"].calls[-1]
            assert holds(last, "SUMMARY") and team.summaries_shown(team.bob) > 0
            parts = sum(len(m.parts) for m in last)
            assert parts < await team.bob.message_count() / 2
            assert not holds(scripts["bob"].calls, SECRET) and not summaries_hold(team.summarisers["bob"], SECRET)

    run(body)


def test_every_request_openaichatmodel_sends_passes_openais_rules(tmp_path: Path) -> None:
    """pydantic_ai's OpenAIChatModel for both agents, through the real openai client to the
    loopback server: audience, an image, a tool pair, the other agent's call as text and
    summaries, 18 runs, every request accepted and rule-clean, none of bob's holding ann's line (I3)."""
    called: list[bool] = []

    def reply(body: dict[str, Any]) -> ApiReply:
        if "look yourself up" in str(body["messages"][-1]) and not called:
            called.append(True)
            return ApiReply.tool_use("lookup", {"key": "ann"}, id="call_1")
        return ApiReply.text(line("agent", len(body["messages"])))

    async def body() -> list[dict[str, Any]]:
        with serving_openai_api(reply) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))
            async with residents(tmp_path / "store", compress=True) as team:
                await team.write_for_ann(image=True)
                agents = {"ann": agent("ann", team.ann, model), "bob": agent("bob", team.bob, model)}
                await agents["ann"].run("ann, look yourself up")
                for turn in range(18):
                    await agents["bob" if turn % 2 == 0 else "ann"].run(f"turn {turn}")
                    await team.settle()
            await client.close()
            return server.requests

    requests = run(body)
    assert len(requests) == 20 and holds(requests[-1], "SUMMARY") and holds(requests, "ann called lookup")
    for request in requests:
        assert violations(request, api="chat") == []
    assert not holds([r for r in requests if "You are bob." in str(r)], SECRET)


def test_history_passed_back_in_is_not_written_again_and_process_serves_as_a_plain_processor(tmp_path: Path) -> None:
    """``message_history=result.all_messages()`` brings back messages already written: they are
    not written twice. ``ProcessHistory(history.process)`` hands the model the same view; the
    final reply then reaches the slot at the next request (I4)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            history = CtxrtHistory(team.ann)
            first = await Agent(FunctionModel(Scripted("ann")), capabilities=[history]).run("one")
            await Agent(FunctionModel(Scripted("ann")), capabilities=[history]).run("two", message_history=first.all_messages())
            assert [m.participant for m in await team.ann.get_all_messages()] == ["user", "ann"] * 2
            script = Scripted("bob")
            plain = Agent(FunctionModel(script), capabilities=[ProcessHistory(CtxrtHistory(team.bob).process)])
            result = await plain.run("three")
            assert holds(script.calls[0], "one") and holds(script.calls[0], line("ann", 1))
            assert [m.participant for m in await team.bob.get_all_messages()][-1] == "user"
            await plain.run("four", message_history=result.all_messages())
            assert [m.participant for m in await team.bob.get_all_messages()][-3:] == ["user", "bob", "user"]

    run(body)


class Asking:
    """A FunctionModel's function that calls the tool on each run's first request and notes
    whether the run's next request carried that call's return."""

    def __init__(self, speaker: str) -> None:
        self.speaker = speaker
        self.pending: str | None = None
        self.answered: list[bool] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self.pending is None:
            self.pending = f"{self.speaker}_{len(self.answered)}"
            return ModelResponse(parts=[ToolCallPart("lookup", {"key": self.speaker}, tool_call_id=self.pending)])
        returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
        self.answered.append(any(p.tool_call_id == self.pending for p in returns))
        self.pending = None
        return ModelResponse(parts=[TextPart(f"{self.speaker} is done")])


def test_agents_running_at_once_each_get_their_own_tool_call_and_its_return(tmp_path: Path) -> None:
    """ann and bob run at once (asyncio.gather), each calling a tool in every run: each run's
    request after the call carries that call and its return, whatever the other agent wrote
    meanwhile, and each stored call is one message with its return (I5)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            scripts = {"ann": Asking("ann"), "bob": Asking("bob")}
            agents = [agent(name, manager, FunctionModel(scripts[name]))
                      for name, manager in (("ann", team.ann), ("bob", team.bob))]
            for turn in range(3):
                await asyncio.gather(*(a.run(f"turn {turn}") for a in agents))
            assert scripts["ann"].answered == [True] * 3 and scripts["bob"].answered == [True] * 3
            calls = [m for m in await team.ann.get_all_messages() if any(b.type == "tool_use" for b in m.content)]
            assert len(calls) == 6 and all([b.type for b in m.content] == ["tool_use", "tool_result"] for m in calls)

    run(body)


def fresh_history() -> list[ModelMessage]:
    """A history built afresh, as a host rebuilds it from its own records: no marks, no run ids."""
    return [ModelRequest(parts=[SystemPromptPart("You are ann, imported."), UserPromptPart("imported question")]),
            ModelResponse(parts=[TextPart("imported answer")])]


def test_the_same_history_built_afresh_on_two_runs_is_written_once_and_each_new_prompt_is_written(tmp_path: Path) -> None:
    """The same ``message_history`` built afresh for two runs is stored once; each run's new
    prompt, even one repeating an earlier prompt's words, is stored (I6)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            runner = agent("ann", team.ann, FunctionModel(Scripted("ann")))
            for _ in range(2):
                await runner.run("go on", message_history=fresh_history())
            stored = [m.content[0].text for m in await team.ann.get_all_messages()]  # type: ignore[union-attr]
            assert stored == ["imported question", "imported answer", "go on", line("ann", 1), "go on", line("ann", 2)]

    run(body)


def test_a_sliding_window_of_history_rebuilt_from_json_without_metadata_is_written_once_and_in_order(
        tmp_path: Path) -> None:
    """Each run is handed the last four messages of the one before, round-tripped through JSON
    without their metadata (as a host keeps its own records): each message is stored once, and
    the model's view holds the turns in the order they were said (I6)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            model = Scripted("ann")
            runner = agent("ann", team.ann, FunctionModel(model))
            history: list[ModelMessage] = []
            for turn in range(4):
                result = await runner.run(f"question {turn}", message_history=history)
                kept = json.loads(ModelMessagesTypeAdapter.dump_json(result.all_messages()[-4:]))
                history = ModelMessagesTypeAdapter.validate_python([{k: v for k, v in m.items() if k != "metadata"}
                                                                    for m in kept])
            said = [f"question {turn}" if k == 0 else line("ann", turn + 1) for turn in range(4) for k in range(2)]
            stored = [m.content[0].text for m in await team.ann.get_all_messages()]  # type: ignore[union-attr]
            assert stored == said
            seen = [p.content for m in model.calls[-1] for p in m.parts if isinstance(p, (UserPromptPart, TextPart))]
            assert seen == said[:-1]

    run(body)


def test_an_imported_system_prompt_stays_with_its_agent_and_other_speakers_are_named(tmp_path: Path) -> None:
    """A system prompt part in ann's imported history reaches ann's model as a system prompt part
    and never bob's; ann's words reach bob's model as a user prompt starting ``[ann] `` (I7, I8)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann_model, bob_model = Scripted("ann"), Scripted("bob")
            await agent("ann", team.ann, FunctionModel(ann_model)).run("go on", message_history=fresh_history())
            await agent("bob", team.bob, FunctionModel(bob_model)).run("bob, what's new?")
            system = [p.content for m in ann_model.calls[0] if isinstance(m, ModelRequest)
                      for p in m.parts if isinstance(p, SystemPromptPart)]
            assert "You are ann, imported." in system
            assert not holds(bob_model.calls, "You are ann") and holds(bob_model.calls, "imported question")
            prompts = [p.content for m in bob_model.calls[0] if isinstance(m, ModelRequest)
                       for p in m.parts if isinstance(p, UserPromptPart)]
            assert f"[ann] {line('ann', 1)}" in prompts and "imported question" in prompts

    run(body)


def test_wrong_arguments_are_refused_naming_them_and_bad_content_before_anything_is_written(tmp_path: Path) -> None:
    """A wrong manager, an int budget or a wrong agent raises TypeError naming it at construction,
    an agent named as a role ValueError (I14);
    a history holding content the store refuses raises MalformedContentError naming its place and
    writes none of it (I10)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            for kwargs, named in (({"manager": "x"}, "manager"), ({"budget": 5000}, "budget"), ({"agent": 7}, "agent")):
                arguments: dict[str, Any] = {"manager": team.ann, **kwargs}
                with pytest.raises(TypeError, match=named):
                    CtxrtHistory(arguments.pop("manager"), **arguments)
            for role in ("system", "User", "tool", "assistant", "person:x"):
                with pytest.raises(ValueError, match="agent"):
                    CtxrtHistory(team.ann, agent=role)
            history = CtxrtHistory(team.ann)
            with pytest.raises(MalformedContentError) as refused:
                await history.record([ModelRequest(parts=[UserPromptPart("fine")]),
                                      ModelRequest(parts=[UserPromptPart("\ud800")])])
            assert refused.value.path == "messages[1].parts[0].content"
            with pytest.raises(TypeError, match="messages"):
                await history.record(["hello"])  # type: ignore[list-item]
            assert await team.ann.message_count() == 0

    run(body)


def test_history_marked_by_the_earlier_adapter_is_not_written_again(tmp_path: Path) -> None:
    """History as the earlier adapter left it: each message it wrote marked
    ``metadata={"ctxrt_recorded": True}``, its slot messages carrying no ``ctxrt_keys``. Passed
    back in as ``message_history``: nothing of it is written again, the new prompt and reply are,
    and ann's model sees the old question once (I6)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            await team.ann.add_message("user", "old question")
            await team.ann.add_message("ann", "old answer")
            marked = {"ctxrt_recorded": True}
            history: list[ModelMessage] = [
                ModelRequest(parts=[SystemPromptPart("You are ann."), UserPromptPart("old question")], metadata=marked),
                ModelResponse(parts=[TextPart("old answer")], metadata=marked)]
            script = Scripted("ann")
            await agent("ann", team.ann, FunctionModel(script)).run("new question", message_history=history)
            stored = [m.content[0].text for m in await team.ann.get_all_messages()]  # type: ignore[union-attr]
            assert stored == ["old question", "old answer", "new question", line("ann", 1)]
            prompts = [p.content for m in script.calls[0] if isinstance(m, ModelRequest)
                       for p in m.parts if isinstance(p, UserPromptPart)]
            assert prompts == ["old question", "new question"]

    run(body)


def exchange(draw: Any, turn: int) -> list[ModelMessage]:
    """One turn of Pydantic AI's own messages as its agent graph makes them: a request with the
    user's prompt (the first turn's with system prompt parts before it), a reply with text or tool
    calls, a request of their returns and a final reply."""
    system = [SystemPromptPart(draw(words())) for _ in range(draw(st.integers(0, 2)))] if turn == 0 else []
    said: list[ModelMessage] = [ModelRequest(parts=[*system, UserPromptPart(draw(words()))])]
    calls = [ToolCallPart("lookup", {"key": draw(words())}, tool_call_id=f"call_{turn}_{k}")
             for k in range(draw(st.integers(0, 2)))]
    if calls:
        text = [TextPart(draw(words()))] if draw(st.booleans()) else []
        said.append(ModelResponse(parts=[*text, *calls]))
        said.append(ModelRequest(parts=[ToolReturnPart("lookup", draw(words()), tool_call_id=c.tool_call_id) for c in calls]))
    said.append(ModelResponse(parts=[TextPart(draw(words()))]))
    return said


def comparable(messages: list[ModelMessage]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    def part(p: Any) -> tuple[Any, ...]:
        args = p.args_as_dict() if isinstance(p, ToolCallPart) else None
        return type(p).__name__, getattr(p, "content", None), getattr(p, "tool_name", None), args, getattr(p, "tool_call_id", None)

    return [(type(m).__name__, [part(p) for p in m.parts]) for m in messages]


@pytest.mark.soak
def test_what_the_model_is_handed_equals_plain_message_history_for_random_histories(
    soak_scale: Callable[[int, int], int], tmp_path_factory: Any
) -> None:
    """Random histories of Pydantic AI's own messages (system prompt parts, user prompts, text,
    tool calls and their returns) passed as ``message_history`` with a new prompt: the model is
    handed, part for part, what the same agent without ``CtxrtHistory`` hands it (I6, I7)."""

    @settings(max_examples=soak_scale(10, 300))
    @given(st.data())
    def check(data: Any) -> None:
        history = [m for turn in range(data.draw(st.integers(1, 4))) for m in exchange(data.draw, turn)]

        async def body() -> None:
            async with residents(tmp_path_factory.mktemp("store")) as team:
                through_ctxrt, plain = Scripted("ann"), Scripted("ann")
                await Agent(FunctionModel(through_ctxrt), capabilities=[CtxrtHistory(team.ann)]).run(
                    "next", message_history=copy.deepcopy(history))
                await Agent(FunctionModel(plain)).run("next", message_history=copy.deepcopy(history))
                assert comparable(through_ctxrt.calls[0]) == comparable(plain.calls[0])

        run(body)

    check()


def test_two_agents_at_once_with_trims_and_rewinds_write_each_message_once(tmp_path: Path) -> None:
    """ann and bob run at once, each passing its last run's history back in, trimmed of its first
    exchange after the third turn and rewound to the second run's history before the fifth: every
    prompt and reply is stored once, none lost (I6)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            async def converse(name: str, manager: Any) -> None:
                runner = agent(name, manager, FunctionModel(Scripted(name)))
                history: list[ModelMessage] = []
                kept: list[ModelMessage] = []
                for turn in range(6):
                    if turn == 3:
                        history = history[2:]
                    if turn == 5:
                        history = kept
                    history = (await runner.run(f"{name} question {turn}", message_history=history)).all_messages()
                    if turn == 1:
                        kept = history

            await asyncio.gather(converse("ann", team.ann), converse("bob", team.bob))
            texts = [m.content[0].text for m in await team.ann.get_all_messages()]  # type: ignore[union-attr]
            for name in ("ann", "bob"):
                assert [t for t in texts if t.startswith(f"{name} question")] == [f"{name} question {t}" for t in range(6)]
                assert [t for t in texts if t.startswith(f"{name} turn")] == [line(name, t) for t in range(1, 7)]
            assert len(texts) == len(set(texts)) == 24

    run(body)


def test_each_request_the_adapter_compiles_is_kept_in_a_ledger_that_is_on(tmp_path: Path) -> None:
    """Q6: with ann's namespace's ledger on, each model request her CtxrtHistory compiled is in her
    ledger (form openai_chat, her reader, rebuilt to its digest); bob's namespace keeps none."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            switch = await team.runtime.open("agents/ann", ledger=True)
            await switch.aclose()
            await team.write_for_ann()
            ann_model = Scripted("ann", call_first=True)
            await agent("ann", team.ann, FunctionModel(ann_model)).run("ann, look yourself up")
            await agent("bob", team.bob, FunctionModel(Scripted("bob"))).run("bob, what's new?")
            records = await team.ann.requests()
            assert len(records) == len(ann_model.calls)
            assert all(r.form == "openai_chat" and r.reader == "ann" for r in records)
            assert all([(await team.ann.rebuild_request(r)).matches for r in records])
            assert await team.bob.requests() == []

    run(body)
