"""The OpenAI Agents SDK adapter (``ctxrt.integrations.openai_agents``), with the real SDK: two
agents with a ``CtxrtSession`` each over one slot, driven by the SDK's own offline model
(``agents.testing.ScriptedModel``), and by the SDK's real OpenAI models through the real ``openai``
client against the loopback OpenAI server, which refuses any request that breaks OpenAI's rules."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.extensions.memory import EncryptedSession
from agents.run_internal.session_persistence import rewind_session_items
from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call
from cryptography.fernet import Fernet
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

import ctxrt
from adapters_support import BUDGET, IMAGE, PUBLIC, SECRET, TOOL_SECRET, holds, line, residents, run, summaries_hold
from ctxrt.integrations.openai_agents import CtxrtSession
from ctxrt.openai_rules import violations
from ctxrt.testing import ApiReply, estimate_blocks, estimate_text
from loopback_openai import serving_openai_api

set_tracing_disabled(True)  # the SDK would otherwise try to export traces over the network


@function_tool
def lookup(key: str) -> str:
    """Looks a key up."""
    return TOOL_SECRET if key == "ann" else "nothing"


def replies(speaker: str) -> Any:
    """The SDK's scripted model step: a tool call on the first turn, then a line per turn."""
    turns = iter(range(1, 10_000))

    def step(call: ModelCall) -> Any:
        turn = next(turns)
        if turn == 1 and speaker == "ann":
            return [function_call("lookup", {"key": "ann"}, call_id="call_1")]
        return [assistant_message(line(speaker, turn))]

    return step


def scripted(speaker: str, steps: int) -> ScriptedModel:
    responder = replies(speaker)
    return ScriptedModel([{"responder": responder} for _ in range(steps)])


def test_an_audience_block_for_one_agent_never_reaches_the_other_agents_model(tmp_path: Path) -> None:
    """ann's line, ann's tool result and the run's public lines: ann's model sees them all (her
    own call and its output as a function_call pair), bob's sees the public ones and ann's call
    as text, never the line meant for ann alone (I1)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            await team.write_for_ann()
            ann_model, bob_model = scripted("ann", 2), scripted("bob", 1)
            ann = Agent(name="ann", instructions="You are ann.", model=ann_model, tools=[lookup])
            bob = Agent(name="bob", instructions="You are bob.", model=bob_model)
            await Runner.run(ann, "ann, look yourself up", session=CtxrtSession(team.ann, budget=BUDGET))
            await Runner.run(bob, "bob, what's new?", session=CtxrtSession(team.bob, budget=BUDGET))

            ann_inputs = [call.input for call in ann_model.calls]
            bob_inputs = [call.input for call in bob_model.calls]
            assert holds(ann_inputs[0], SECRET) and holds(ann_inputs[0], PUBLIC)
            assert any(item.get("type") == "function_call_output" for item in ann_inputs[1])
            assert holds(bob_inputs, PUBLIC) and holds(bob_inputs, "ann called lookup")
            assert holds(bob_inputs, TOOL_SECRET)  # ann's tool output was said to everyone
            assert not holds(bob_inputs, SECRET)
            assert not any(item.get("type", "message") != "message" for item in bob_inputs[0])

    run(body)


def test_a_long_run_compresses_and_every_view_stays_under_budget(tmp_path: Path) -> None:
    """40 turns through two sessions with Autobiographical: each turn's view fits the budget with
    nothing left out, the late turns carry summaries instead of the old turns, and bob's
    summaries never read ann's line (I2)."""

    async def body() -> None:
        async with residents(tmp_path / "store", compress=True) as team:
            await team.write_for_ann()
            ann_model, bob_model = scripted("ann", 21), scripted("bob", 20)
            agents = {
                "ann": (Agent(name="ann", model=ann_model, tools=[lookup]), CtxrtSession(team.ann, budget=BUDGET)),
                "bob": (Agent(name="bob", model=bob_model), CtxrtSession(team.bob, budget=BUDGET)),
            }
            for turn in range(40):
                agent, session = agents["ann" if turn % 2 == 0 else "bob"]
                await Runner.run(agent, f"turn {turn}, go on", session=session)
                await team.settle()
                assert team.within_budget(session.manager), (turn, session.manager.render_stats())
            last = bob_model.calls[-1].input
            assert holds(last, "SUMMARY") and team.summaries_shown(team.bob) > 0
            assert len(last) < await team.bob.message_count() / 2
            assert not holds([c.input for c in bob_model.calls], SECRET)
            assert not summaries_hold(team.summarisers["bob"], SECRET)

    run(body)


def test_every_request_the_sdks_openai_models_send_passes_openais_rules(tmp_path: Path) -> None:
    """The SDK's own OpenAIResponsesModel (ann, with a tool) and OpenAIChatCompletionsModel (bob),
    through the real openai client to the loopback server: audience, an image, a tool pair, the
    other agent's call as text and summaries, 18 turns, every request accepted and rule-clean (I3)."""

    called: list[bool] = []

    def reply(body: dict[str, Any]) -> ApiReply:
        if body.get("tools") and not called:  # ann's first turn
            called.append(True)
            return ApiReply.tool_use("lookup", {"key": "ann"}, id="call_1")
        return ApiReply.text(line("agent", len(json.dumps(body)) % 97))

    async def body() -> list[dict[str, Any]]:
        with serving_openai_api(reply) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            async with residents(tmp_path / "store", compress=True) as team:
                await team.write_for_ann(image=True)
                ann = Agent(name="ann", model=OpenAIResponsesModel("gpt-test", client), tools=[lookup])
                bob = Agent(name="bob", model=OpenAIChatCompletionsModel("gpt-test", client))
                sessions = {"ann": CtxrtSession(team.ann, budget=BUDGET), "bob": CtxrtSession(team.bob, budget=BUDGET)}
                await Runner.run(ann, "ann, look yourself up", session=sessions["ann"])
                for turn in range(18):
                    name, agent = ("bob", bob) if turn % 2 == 0 else ("ann", ann)
                    await Runner.run(agent, f"turn {turn}", session=sessions[name])
                    await team.settle()
            await client.close()
            return server.requests

    requests = run(body)
    assert len(requests) == 20 and holds(requests[-1], "SUMMARY")
    for request in requests:
        api = "responses" if "input" in request else "chat"
        assert violations(request, api=api) == []
    bob_requests = [r for r in requests if "messages" in r]
    assert bob_requests and not holds(bob_requests, SECRET)


def test_pop_item_and_clear_session_remove_only_what_that_session_wrote(tmp_path: Path) -> None:
    """``pop_item`` removes and returns the newest item the session wrote, as given (not bob's line
    after it); ``clear_session`` removes the rest of its items and leaves bob's and the host's (I4, I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann, bob = CtxrtSession(team.ann), CtxrtSession(team.bob)
            await team.ann.add_message("user", PUBLIC)
            await ann.add_items([{"role": "user", "content": "first"},
                                 {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "said"}]},
                                 {"type": "function_call_output", "call_id": "c1", "output": "found"}])
            await bob.add_items([{"role": "user", "content": "bob's"}])
            assert await ann.pop_item() == {"type": "function_call_output", "call_id": "c1", "output": "found"}
            assert await ann.pop_item() == {"type": "message", "role": "assistant",
                                            "content": [{"type": "output_text", "text": "said"}]}
            texts = [getattr(b, "text", b.type) for m in await team.ann.get_all_messages() for b in m.content]
            assert texts == [PUBLIC, "first", "tool_use", "bob's"]
            await ann.clear_session()
            assert [m.participant for m in await team.ann.get_all_messages()] == ["user", "user"]
            assert await ann.pop_item() is None
            assert [i["content"] for i in await bob.get_items()] == [PUBLIC, "bob's"]

    run(body)


def test_get_items_with_a_limit_never_holds_an_output_whose_call_was_cut(tmp_path: Path) -> None:
    """``get_items(limit)`` is the newest ``limit`` items of the view, less any function output
    whose call fell outside (the SDK's session_settings limit), parallel calls' included (I4)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = CtxrtSession(team.ann)
            await ann.add_items([{"role": "user", "content": "go"},
                                 {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                                 {"type": "function_call_output", "call_id": "c1", "output": "found"},
                                 {"type": "message", "role": "assistant", "content": "done"}])
            kinds = [i.get("type", "message") for i in await ann.get_items()]
            assert kinds == ["message", "function_call", "function_call_output", "message"]
            assert [i["type"] for i in await ann.get_items(limit=2)] == ["message"]
            assert [i["type"] for i in await ann.get_items(limit=3)] == ["function_call", "function_call_output", "message"]
            assert await CtxrtSession(team.bob).get_items() != []
            await ann.add_items([{"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": "{}"},
                                 {"type": "function_call", "call_id": "c3", "name": "lookup", "arguments": "{}"},
                                 {"type": "function_call_output", "call_id": "c2", "output": "two"},
                                 {"type": "function_call_output", "call_id": "c3", "output": "three"}])
            assert [(i["type"], i["call_id"]) for i in await ann.get_items(limit=3)] == [
                ("function_call", "c3"), ("function_call_output", "c3")]

    run(body)


def test_a_session_refuses_a_manager_without_a_reader_and_a_part_it_cannot_keep(tmp_path: Path) -> None:
    """A manager with no reader can't be an agent's view; an input part a ctxrt message can't hold
    is refused naming its place, and nothing of that batch is written (I4)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            plain = await team.runtime.open("host")
            try:
                CtxrtSession(plain)
            except ValueError as error:
                assert "view_reader" in str(error)
            else:
                raise AssertionError("a session over a manager with no reader")
            ann = CtxrtSession(team.ann)
            try:
                await ann.add_items([{"role": "user", "content": "kept?"},
                                     {"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}])
            except ctxrt.MalformedContentError as error:
                assert error.path == "items[1].content[0]"
            else:
                raise AssertionError("an input_file part was taken")
            assert await team.ann.message_count() == 0

    run(body)


def test_a_call_and_its_output_saved_apart_stay_one_message_whatever_another_agent_writes_meanwhile(tmp_path: Path) -> None:
    """A tool that needs approval: the run saves ann's call, stops, bob speaks, and the approved
    run saves the output in a later batch. The output joins its call's message, so ann's view
    (her next run's history) holds the call and its output as a pair and bob's shows both as
    text, one right after the other (I5)."""

    @function_tool(needs_approval=True)
    def approved_lookup(key: str) -> str:
        """Looks a key up once a person approves."""
        return TOOL_SECRET

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            steps = iter([[function_call("approved_lookup", {"key": "ann"}, call_id="call_1")],
                          [assistant_message("ann is done")]])
            model = ScriptedModel([{"responder": lambda call: next(steps)} for _ in range(2)])
            ann = Agent(name="ann", model=model, tools=[approved_lookup])
            session = CtxrtSession(team.ann, budget=BUDGET)
            stopped = await Runner.run(ann, "ann, look yourself up", session=session)
            await Runner.run(Agent(name="bob", model=scripted("bob", 1)), "bob, what's new?",
                             session=CtxrtSession(team.bob, budget=BUDGET))
            state = stopped.to_state()
            for interruption in stopped.interruptions:
                state.approve(interruption)
            await Runner.run(ann, state, session=session)
            items = await session.get_items()
            assert [item.get("type") for item in items[1:3]] == ["function_call", "function_call_output"]
            assert items[2]["output"] == TOOL_SECRET
            stored = [[b.type for b in m.content] for m in await team.ann.get_all_messages()]
            assert stored == [["text"], ["tool_use", "tool_result"], ["text"], ["text"], ["text"]]
            bob_view = [i["content"] for i in await CtxrtSession(team.bob).get_items()]
            called = next(i for i, text in enumerate(bob_view) if "ann called approved_lookup" in text)
            assert TOOL_SECRET in bob_view[called + 1]

    run(body)


def test_add_items_maps_a_call_id_ctxrt_refuses_and_checks_the_whole_batch_before_writing(tmp_path: Path) -> None:
    """A provider's call id such as ``functions.lookup:0`` is stored mapped alike in the call and
    its output, and handed back as given, so the pair reaches ann's view; an item ctxrt can't
    store (a lone surrogate in an output) is refused naming it, and nothing of its batch is
    written (I4, I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = CtxrtSession(team.ann)
            await ann.add_items([{"role": "user", "content": "go"},
                                 {"type": "function_call", "call_id": "functions.lookup:0", "name": "lookup", "arguments": "{}"},
                                 {"type": "function_call_output", "call_id": "functions.lookup:0", "output": "found"}])
            items = await ann.get_items()
            assert [i.get("type", "message") for i in items] == ["message", "function_call", "function_call_output"]
            assert items[1]["call_id"] == items[2]["call_id"] == "functions.lookup:0"  # as given back by SQLiteSession
            stored = [b for m in await team.ann.get_all_messages() for b in m.content if b.type == "tool_use"]
            assert ":" not in stored[0].id  # stored under an id ctxrt's rule takes (P8)
            try:
                await ann.add_items([{"role": "user", "content": "again"},
                                     {"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": "{}"},
                                     {"type": "function_call_output", "call_id": "c2", "output": "bad \ud800 output"}])
            except ctxrt.MalformedContentError as error:
                assert error.path == "items[2].output" and "surrogate" in error.reason
            else:
                raise AssertionError("a lone surrogate was taken")
            assert await team.ann.message_count() == 2

    run(body)


def test_pop_item_and_clear_session_never_touch_another_namespaces_lines_or_hand_back_a_hidden_one(tmp_path: Path) -> None:
    """A line bob's manager tags with ann's session id, and one tagged in full as ann's but meant
    for bob alone: ann's ``pop_item`` returns neither and ``clear_session`` leaves both; a call
    and its output come off one item at a time (I4)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = CtxrtSession(team.ann)
            await ann.add_items([{"role": "user", "content": "go"},
                                 {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                                 {"type": "function_call_output", "call_id": "c1", "output": "found"}])
            await team.bob.add_message("bob", "bob's own line", metadata={"agents_sdk_session": "agents/ann"})
            await team.bob.add_message("user", [{"type": "text", "text": "for bob alone", "audience": ["bob"]}],
                                       metadata={"agents_sdk_session": "agents/ann", "ctxrt_writer": "agents/ann"})
            assert await ann.pop_item() == {"type": "function_call_output", "call_id": "c1", "output": "found"}
            assert await ann.pop_item() == {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
            await ann.clear_session()
            assert await ann.pop_item() is None
            left = [getattr(b, "text", b.type) for m in await team.ann.get_all_messages() for b in m.content]
            assert left == ["bob's own line", "for bob alone"]

    run(body)


# -- a faithful Session (I12), instructions (I7), speakers (I8), argument errors (I10) -----------

ENCRYPTED = "gAAAAABo" + "Zm9yIGFubiBhbG9uZQ" * 20  # a store=False reasoning model's encrypted reasoning
TURN = [
    {"role": "user", "content": "what's the weather in Lisbon?"},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "and this picture?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{IMAGE}", "detail": "low"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}],
     "encrypted_content": ENCRYPTED},
    {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "lookup",
     "arguments": "{\"key\": \"lisbon\"}", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_a", "output": "sunny, 24C"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "lisbon"}},
    {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": ENCRYPTED[::-1]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [
        {"type": "output_text", "text": "Sunny, 24C.", "logprobs": [],
         "annotations": [{"type": "url_citation", "url": "https://weather.example", "title": "w",
                          "start_index": 0, "end_index": 5}]}]},
]


async def sqlite_gives(*batches: list[Any]) -> list[Any]:
    """What the SDK's own ``SQLiteSession`` gives back after ``add_items`` of each batch."""
    session = SQLiteSession("reference")
    try:
        for batch in batches:
            await session.add_items(batch)
        return await session.get_items()
    finally:
        session.close()


def test_get_items_gives_back_every_item_as_sqlite_session_does(tmp_path: Path) -> None:
    """A turn of every kind the SDK saves (a user's parts and image, reasoning with its encrypted
    content, a call with its id and status, its output, a hosted web search, an assistant message
    with annotations): ``get_items`` gives back what ``SQLiteSession`` gives, in order, 8 in, 8
    out; bob's view holds ann's words and her call as text, never her reasoning or search (I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = CtxrtSession(team.ann)
            await ann.add_items(TURN)
            assert await ann.get_items() == await sqlite_gives(TURN)
            assert await ann.get_items(limit=2) == TURN[-2:]
            bob_view = await CtxrtSession(team.bob).get_items()
            assert holds(bob_view, "Sunny, 24C.") and holds(bob_view, "ann called lookup")
            assert not holds(bob_view, ENCRYPTED[:40]) and not holds(bob_view, "ws_1")

    run(body)


def test_an_item_ctxrt_has_no_block_for_is_kept_for_the_agent_alone_and_popped_as_given(tmp_path: Path) -> None:
    """``{"foo": "bar"}`` and a hosted tool's call are stored (as their JSON, for ann's reader
    alone), come back from ``get_items`` as given and from ``pop_item`` newest first; bob's view
    never holds them (I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = CtxrtSession(team.ann)
            odd = [{"foo": "bar"}, {"type": "web_search_call", "id": "ws_9", "status": "completed"}]
            await ann.add_items(odd)
            assert await team.ann.message_count() == 1
            assert await ann.get_items() == odd
            assert await CtxrtSession(team.bob).get_items() == []
            assert await ann.pop_item() == odd[1]
            assert await ann.pop_item() == odd[0]
            assert await ann.pop_item() is None

    run(body)


def test_an_encrypted_session_over_a_ctxrt_session_stores_and_gives_back(tmp_path: Path) -> None:
    """``EncryptedSession(CtxrtSession(...))``: the envelopes are stored for ann alone and the
    items come back decrypted, as given; bob sees none of them (I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            key = Fernet.generate_key().decode("ascii")
            ann = EncryptedSession("ann", CtxrtSession(team.ann), key)
            await ann.add_items(TURN[:1] + TURN[3:5])
            assert await ann.get_items() == await sqlite_gives(TURN[:1] + TURN[3:5])
            assert await team.ann.message_count() == 1
            assert await CtxrtSession(team.bob).get_items() == []

    run(body)


def test_a_run_through_the_sdk_saves_items_it_reads_back_unchanged(tmp_path: Path) -> None:
    """Two runs of ann's with a tool call through the real runner: what the session gives back is
    what a ``SQLiteSession`` beside it gives back for the same runs, ids and all, so the SDK's
    fingerprints of saved items match (I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ours, theirs = CtxrtSession(team.ann), SQLiteSession("ann")
            for session in (ours, theirs):
                agent = Agent(name="ann", model=scripted("ann", 3), tools=[lookup])
                await Runner.run(agent, "ann, look yourself up", session=session)
                await Runner.run(agent, "and again", session=session)
            assert await ours.get_items() == await theirs.get_items()
            theirs.close()

    run(body)


@st.composite
def batches(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Batches as the runner saves them: people's messages (user, system, developer; short form
    or parts), and the agent's steps (reasoning, hosted calls and messages, then function calls
    answered in any order, some answered only in the next batch, as after an approval)."""
    text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
    ids = iter(range(10_000))
    out: list[list[dict[str, Any]]] = []
    deferred: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        batch, deferred = deferred, []
        for _ in range(draw(st.integers(1, 3))):
            n = next(ids)
            kind = draw(st.sampled_from(["user", "parts", "system", "developer", "step"]))
            if kind in ("user", "system", "developer"):
                batch.append({"role": kind, "content": draw(text)})
            elif kind == "parts":
                batch.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": draw(text)}]})
            else:
                for made in draw(st.lists(st.sampled_from(["reasoning", "search", "said"]), max_size=3)):
                    batch.append(
                        {"type": "reasoning", "id": f"rs_{n}_{len(batch)}", "encrypted_content": draw(text),
                         "summary": [{"type": "summary_text", "text": draw(text)}]} if made == "reasoning"
                        else {"type": "web_search_call", "id": f"ws_{n}_{len(batch)}", "status": "completed"}
                        if made == "search" else
                        {"id": f"msg_{n}_{len(batch)}", "type": "message", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": draw(text), "annotations": []}]})
                calls = [f"call_{n}_{k}" for k in range(draw(st.integers(0, 3)))]
                batch += [{"type": "function_call", "call_id": c, "name": "lookup", "arguments": json.dumps({"k": draw(text)}),
                           "id": f"fc_{c}", "status": "completed"} for c in calls]
                outputs = [{"type": "function_call_output", "call_id": c, "output": draw(text)}
                           for c in draw(st.permutations(calls))]
                if outputs and draw(st.booleans()):
                    deferred = outputs
                    break
                batch += outputs
        out.append(batch)
    if deferred:
        out.append(deferred)
    return out


def answered(items: list[Any]) -> list[Any]:
    """``items`` less any function call whose output isn't among them: a compiled view holds no
    unanswered call (P4), so a call whose output was popped is out of it until answered."""
    outputs = {item["call_id"] for item in items if item.get("type") == "function_call_output"}
    return [item for item in items if item.get("type") != "function_call" or item["call_id"] in outputs]


@settings(max_examples=25)
@given(batches())
def test_get_items_equals_sqlite_sessions_items_for_any_batches(tmp_path_factory: Any, drawn: list[list[dict[str, Any]]]) -> None:
    """Random batches of the SDK's item types, each call answered in its batch or the next: what
    ``get_items`` gives back equals what ``SQLiteSession`` gives back, and ``pop_item`` takes off
    the same item (I12)."""
    store = tmp_path_factory.mktemp("roundtrip") / "store"

    async def body() -> None:
        async with residents(store) as team:
            ann = CtxrtSession(team.ann)
            for batch in drawn:
                await ann.add_items(batch)
            reference = SQLiteSession("reference")
            for batch in drawn:
                await reference.add_items(batch)
            assert await ann.get_items() == await reference.get_items()
            assert await ann.pop_item() == await reference.pop_item()
            assert await ann.get_items() == answered(await reference.get_items())
            reference.close()

    run(body)


def test_two_agents_rewinding_at_once_take_back_only_their_own_items(tmp_path: Path) -> None:
    """ann and bob each save a turn and have the SDK rewind it (``rewind_session_items``, as on a
    conversation retry) at once: each rewind finds its items at the tail of its view by their
    fingerprints and pops them; when the other's line came after, the SDK leaves the session as
    it is rather than pop another's item (I12)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann, bob = CtxrtSession(team.ann), CtxrtSession(team.bob)
            saved = {"ann": TURN[2:5], "bob": [{"role": "user", "content": "bob's question"}, TURN[-1]]}

            async def save_and_rewind(session: CtxrtSession, name: str) -> None:
                await session.add_items(saved[name])
                await rewind_session_items(session, saved[name])

            await asyncio.gather(save_and_rewind(ann, "ann"), save_and_rewind(bob, "bob"))
            stored = await team.ann.get_all_messages()
            left = {name: sum(m.metadata["ctxrt_writer"] == f"agents/{name}" for m in stored) for name in saved}
            assert left["ann"] in (0, 1) and left["bob"] in (0, 2)  # each rewind took all its items, or none
            assert left != {"ann": 1, "bob": 2}  # the one saved last found its items at its view's tail
            await ann.clear_session()
            await bob.clear_session()
            await ann.add_items(TURN[2:5])
            await bob.add_items(saved["bob"])
            await rewind_session_items(ann, TURN[2:5])  # bob's line is the view's tail: left alone
            assert await ann.get_items() == TURN[2:5] + [
                {"type": "message", "role": "user", "content": "bob's question"},
                {"type": "message", "role": "user", "content": "[bob] Sunny, 24C."}]
            await rewind_session_items(bob, saved["bob"])
            assert await ann.get_items() == TURN[2:5]

    run(body)


def priced(request: dict[str, Any]) -> int:
    """A Responses request's instructions and input as ctxrt prices content: text, calls and
    their outputs as the blocks they are stored as."""
    stored: list[Any] = []
    for item in request["input"]:
        if item.get("type") == "function_call":
            stored.append(ctxrt.ToolUse(item["call_id"], item["name"], json.loads(item["arguments"])))
        elif item.get("type") == "function_call_output":
            stored.append(ctxrt.ToolResult(item["call_id"], item["output"]))
        else:
            content = item["content"]
            stored += [ctxrt.Text(part.get("text", "")) for part in content] if isinstance(content, list) \
                else [ctxrt.Text(content)]
    return estimate_blocks(stored) + estimate_text(request.get("instructions", ""))


def test_every_model_call_of_a_long_tool_run_is_compiled_under_the_budget(tmp_path: Path) -> None:
    """One run of 25 tool calls, each output about 150 tokens, under ``Budget(4000, reserve 500)``
    with ``run_config=session.run_config()``: all 26 requests the SDK's OpenAIResponsesModel sends
    through the real client are under 3,500 tokens with the instructions, rule-clean, the
    newest output in each, and no item twice; the session holds every call (I11)."""

    budget = ctxrt.Budget(max_tokens=4_000, reserve_for_response=500)

    def reply(body: dict[str, Any]) -> ApiReply:
        done = sum(item.get("type") == "function_call_output" for item in body["input"])
        answered = {item["call_id"] for item in body["input"] if item.get("type") == "function_call_output"}
        n = len(replied)
        replied.append(n)
        if n < 25:
            return ApiReply.tool_use("lookup", {"key": f"k{n}"}, id=f"call_{n}")
        return ApiReply.text(f"done after {done} outputs in view, {len(answered)} answered")

    replied: list[int] = []

    @function_tool
    def lookup(key: str) -> str:
        """Looks a key up."""
        return f"{key}: " + "a long tool output that fills the budget quickly. " * 30

    async def body() -> tuple[list[dict[str, Any]], int]:
        with serving_openai_api(reply) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            async with residents(tmp_path / "store") as team:
                session = CtxrtSession(team.ann, budget=budget)
                ann = Agent(name="ann", instructions="You are ann.", model=OpenAIResponsesModel("gpt-test", client),
                            tools=[lookup])
                await Runner.run(ann, "look up 25 keys", session=session, run_config=session.run_config(),
                                 max_turns=40)
                calls = len([b for m in await team.ann.get_all_messages() for b in m.content if b.type == "tool_use"])
            await client.close()
            return server.requests, calls

    requests, calls = run(body)
    assert len(requests) == 26 and calls == 25
    for n, request in enumerate(requests):
        assert priced(request) <= budget.usable, (n, priced(request))
        assert violations(request, api="responses") == []
        keys = [json.dumps(item, sort_keys=True) for item in request["input"]]
        assert len(keys) == len(set(keys))
        if n:
            assert request["input"][-1] == {"type": "function_call_output", "call_id": f"call_{n - 1}",
                                            "output": mock_output(n - 1)}


def mock_output(n: int) -> str:
    return f"k{n}: " + "a long tool output that fills the budget quickly. " * 30


def test_run_config_passes_its_arguments_on_and_keeps_its_own_filter(tmp_path: Path) -> None:
    """``run_config(**kwargs)`` hands the kwargs to ``RunConfig``; a filter of the caller's
    would replace the budget's and is refused with TypeError (I11)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            session = CtxrtSession(team.ann)
            config = session.run_config(workflow_name="standup")
            assert config.workflow_name == "standup" and config.call_model_input_filter is not None
            try:
                session.run_config(call_model_input_filter=lambda data: data.model_data)
            except TypeError as error:
                assert "call_model_input_filter" in str(error)
            else:
                raise AssertionError("a second filter was taken")

    run(body)


def test_system_and_developer_items_stay_with_their_agent(tmp_path: Path) -> None:
    """A system and a developer item in ann's input: written for ann's reader alone, back from
    her ``get_items`` with their roles, and never in bob's view nor in any request bob's
    OpenAIChatCompletionsModel sends (I7)."""

    async def body() -> list[dict[str, Any]]:
        with serving_openai_api(lambda body: ApiReply.text("noted")) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            async with residents(tmp_path / "store") as team:
                ann, bob = CtxrtSession(team.ann), CtxrtSession(team.bob)
                given = [{"role": "system", "content": "ann's rule: never share K-7781"},
                         {"role": "developer", "content": "ann's style: terse"},
                         {"role": "user", "content": "hello both"}]
                model = ScriptedModel([{"responder": lambda call: [assistant_message("ok")]}])
                await Runner.run(Agent(name="ann", model=model), given, session=ann)
                assert (await ann.get_items())[:3] == given
                stored = [(m.participant, b.audience) for m in await team.ann.get_all_messages() for b in m.content]
                assert stored[:2] == [("system", ("ann",)), ("developer", ("ann",))]
                assert not holds(await bob.get_items(), "ann's rule") and not holds(await bob.get_items(), "terse")
                await Runner.run(Agent(name="bob", model=OpenAIChatCompletionsModel("gpt-test", client)), "bob?",
                                 session=bob)
            await client.close()
            return server.requests

    requests = run(body)
    assert len(requests) == 1 and holds(requests, "hello both")
    assert not holds(requests, "ann's rule") and not holds(requests, "terse")


def test_another_agents_words_reach_the_model_led_by_their_name(tmp_path: Path) -> None:
    """The Responses form has no name field: in bob's view ann's reply is a user message whose
    text starts ``[ann] ``, a person's line has no prefix, and ann's call stays as text (I8)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            ann = Agent(name="ann", model=scripted("ann", 2), tools=[lookup])
            await Runner.run(ann, "ann, look yourself up", session=CtxrtSession(team.ann))
            bob_view = await CtxrtSession(team.bob).get_items()
            texts = [item["content"] for item in bob_view]
            assert texts[0] == "ann, look yourself up"
            assert texts[-1] == f"[ann] {line('ann', 2)}"
            assert texts[1] == '[ann called lookup with {"key":"ann"}]'
            assert texts[2] == f"[result of ann called lookup: {TOOL_SECRET}]"

    run(body)


def test_wrong_argument_types_are_refused_naming_the_parameter_before_anything_is_written(tmp_path: Path) -> None:
    """``CtxrtSession("x")`` and ``budget=5000``: TypeError naming the parameter; ``agent="system"``
    (a role, I14): ValueError naming ``agent``; ``agent=""``: MalformedContentError at ``agent``;
    ``get_items(limit="3")`` or ``limit=True``: TypeError naming ``limit``;
    ``add_items("hello")``: TypeError; a function_call without its fields: MalformedContentError
    naming ``items[1].call_id``, and nothing of the batch is written (I10)."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            for call, named in ((lambda: CtxrtSession("x"), "manager"),  # type: ignore[arg-type]
                                (lambda: CtxrtSession(team.ann, budget=5000), "budget"),  # type: ignore[arg-type]
                                (lambda: CtxrtSession(team.ann, agent=7), "agent")):  # type: ignore[arg-type]
                try:
                    call()
                except TypeError as error:
                    assert named in str(error)
                else:
                    raise AssertionError(f"a wrong {named} was taken")
            for role in ("system", "User", "tool", "assistant", "person:x"):
                try:
                    CtxrtSession(team.ann, agent=role)
                except ValueError as error:
                    assert "agent" in str(error)
                else:
                    raise AssertionError(f"agent={role!r} was taken")
            try:
                CtxrtSession(team.ann, agent="")
            except ctxrt.MalformedContentError as error:
                assert error.path == "agent"
            else:
                raise AssertionError("agent='' was taken")
            ann = CtxrtSession(team.ann)
            for limit in ("3", True, 2.0):
                try:
                    await ann.get_items(limit)  # type: ignore[arg-type]
                except TypeError as error:
                    assert "limit" in str(error)
                else:
                    raise AssertionError(f"limit={limit!r} was taken")
            for items, error_type, where in (("hello", TypeError, "items"), ([{"role": "user", "content": "hi"}, 5], TypeError, "items[1]"),
                                             ([{"role": "user", "content": "hi"}, {"type": "function_call"}],
                                              ctxrt.MalformedContentError, "items[1].call_id")):
                try:
                    await ann.add_items(items)  # type: ignore[arg-type]
                except error_type as error:
                    assert where in str(error)
                else:
                    raise AssertionError(f"{items!r} was taken")
            assert await team.ann.message_count() == 0

    run(body)


def test_each_view_the_session_compiles_is_kept_in_a_ledger_that_is_on(tmp_path: Path) -> None:
    """Q6: with ann's namespace's ledger on, each view her CtxrtSession compiled is in her ledger
    (form openai_responses, her reader, rebuilt to its digest); bob's namespace keeps none."""

    async def body() -> None:
        async with residents(tmp_path / "store") as team:
            switch = await team.runtime.open("agents/ann", ledger=True)
            await switch.aclose()
            await team.write_for_ann()
            ann = Agent(name="ann", instructions="You are ann.", model=scripted("ann", 2), tools=[lookup])
            bob = Agent(name="bob", instructions="You are bob.", model=scripted("bob", 1))
            await Runner.run(ann, "ann, look yourself up", session=CtxrtSession(team.ann, budget=BUDGET))
            await Runner.run(bob, "bob, what's new?", session=CtxrtSession(team.bob, budget=BUDGET))
            records = await team.ann.requests()
            assert records and all(r.form == "openai_responses" and r.reader == "ann" for r in records)
            assert all([(await team.ann.rebuild_request(r)).matches for r in records])
            assert await team.bob.requests() == []

    run(body)
