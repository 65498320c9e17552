"""The Messages API's request rules (P8) and prompt-cache continuity (P9).

Each rule of ``ctxrt.anthropic_rules`` has a failing and a passing example; a property test
drives random multi-resident conversations through every bundled strategy and checks that each
compile either refuses with a ctxrt error or yields a body with no violation; a few bodies go
through the real ``anthropic`` client to the local server, which applies the same rules.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt.anthropic_rules import violations
from ctxrt.testing import ApiReply, ScriptedModel, estimate_blocks, open_messages_api_server

GUARD_S = 60
USER = {"role": "user", "content": [{"type": "text", "text": "hi"}]}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 5, "messages": list(messages), **extra}


def turn(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": role, "content": list(blocks)}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def use(tool_id: str = "t1", name: str = "search") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {}}


def result(tool_id: str = "t1", content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content}


EPHEMERAL = {"type": "ephemeral"}


# -- one failing and one passing example per rule (P8) ------------------------------------------

RULES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("messages_must_be_non_empty", body(), body(USER)),
    ("first_turn_must_be_user", body(turn("assistant", text("a")), USER), body(USER, turn("assistant", text("a")))),
    ("roles_must_alternate", body(USER, USER), body(USER, turn("assistant", text("a")), USER)),
    ("no_whitespace_only_text", body(turn("user", text(" \n"))), body(turn("user", text("x")))),
    ("no_empty_text_nested_in_a_tool_result",
     body(USER, turn("assistant", use()), turn("user", result(content=[text("")]))),
     body(USER, turn("assistant", use()), turn("user", result(content=[text("found")])))),
    ("every_tool_use_answered_in_the_next_turn",
     body(USER, turn("assistant", use()), turn("user", text("no answer"))),
     body(USER, turn("assistant", use()), turn("user", result()))),
    ("tool_results_come_first",
     body(USER, turn("assistant", use()), turn("user", text("note"), result())),
     body(USER, turn("assistant", use()), turn("user", result(), text("note")))),
    ("every_tool_result_answers_the_previous_turn",
     body(USER, turn("assistant", text("a")), turn("user", result("t9"))),
     body(USER, turn("assistant", use("t9")), turn("user", result("t9")))),
    ("tool_ids_match_the_api_alphabet",
     body(USER, turn("assistant", use("call.1:x")), turn("user", result("call.1:x"))),
     body(USER, turn("assistant", use("call_1-x")), turn("user", result("call_1-x")))),
    ("tool_names_match_the_api_alphabet",
     body(USER, turn("assistant", use(name="my.tool")), turn("user", result())),
     body(USER, turn("assistant", use(name="my_tool")), turn("user", result()))),
    ("tool_names_at_most_64_characters",
     body(USER, turn("assistant", use(name="n" * 65)), turn("user", result())),
     body(USER, turn("assistant", use(name="n" * 64)), turn("user", result()))),
    ("at_most_4_cache_controls_counting_nested_and_system",
     body(turn("user", text("a", cache_control=EPHEMERAL), text("b", cache_control=EPHEMERAL)),
          turn("assistant", use()),
          turn("user", result(content=[text("c", cache_control=EPHEMERAL)]), text("d", cache_control=EPHEMERAL)),
          system=[text("s", cache_control=EPHEMERAL)]),
     body(turn("user", text("a", cache_control=EPHEMERAL), text("b", cache_control=EPHEMERAL)),
          turn("assistant", use()),
          turn("user", result(content=[text("c", cache_control=EPHEMERAL)]), text("d")),
          system=[text("s", cache_control=EPHEMERAL)])),
    ("no_cache_control_on_thinking",
     body(USER, turn("assistant", {"type": "thinking", "thinking": "t", "signature": "s", "cache_control": EPHEMERAL},
                     text("a"))),
     body(USER, turn("assistant", {"type": "thinking", "thinking": "t", "signature": "s"}, text("a")))),
    ("no_cache_control_on_empty_text",
     body(turn("user", text("x"), text("", cache_control=EPHEMERAL))),
     body(turn("user", text("x", cache_control=EPHEMERAL)))),
    ("final_assistant_turn_not_ending_in_whitespace",
     body(USER, turn("assistant", text("partial answer "))),
     body(USER, turn("assistant", text("partial answer")))),
    ("no_unknown_field_such_as_audience",
     body(turn("user", text("x", audience=["ann"]))),
     body(turn("user", text("x")))),
]


@pytest.mark.parametrize(("rule", "bad", "good"), RULES, ids=[r[0] for r in RULES])
def test_each_request_rule_refuses_its_failing_example_and_accepts_its_passing_one(
    rule: str, bad: dict[str, Any], good: dict[str, Any]
) -> None:
    """P8: every rule of the checker, one failing and one passing body each."""
    assert violations(good) == []
    assert violations(bad) != [], rule


def test_a_violation_names_its_place() -> None:
    """P8: each violation says where, so a host can find the block."""
    found = violations(body(USER, turn("assistant", use("call.1")), turn("user", result("call.1"))))
    assert any(v.startswith("messages[1].content[0].id") for v in found)


# -- to_anthropic: fixes and refusals (P8) -----------------------------------------------------


def compiled(*messages: ctxrt.CompiledMessage) -> ctxrt.CompileResult:
    provenance = ctxrt.Provenance("c", "ns", "main", None, "passthrough", tuple(() for _ in messages), {}, {})
    return ctxrt.CompileResult(list(messages), [], provenance)


def test_an_empty_compile_raises_empty_request_error_saying_why() -> None:
    """P8: no messages: [] body; the error names the empty slot / budget."""
    with pytest.raises(ctxrt.EmptyRequestError, match="empty in this reader's view|exceeds the budget"):
        compiled().to_anthropic(assistant="Claude")


def test_a_compile_of_only_unsendable_blocks_raises_empty_request_error() -> None:
    """P8: blank text and a user's thinking leave nothing to send."""
    result = compiled(ctxrt.CompiledMessage("user", (ctxrt.Text("  "), ctxrt.Thinking("hm", "sig"))))
    with pytest.raises(ctxrt.EmptyRequestError, match="none of the 1 compiled"):
        result.to_anthropic(assistant="Claude")


def test_blank_nested_text_markers_and_trailing_whitespace_are_fixed_in_the_body() -> None:
    """P8: nested blank text dropped, nested markers counted in the cap of 4, final whitespace trimmed."""
    marked = {"type": "ephemeral"}
    result = compiled(
        ctxrt.CompiledMessage("user", (ctxrt.Text("a", cache_control=marked), ctxrt.Text("b", cache_control=marked))),
        ctxrt.CompiledMessage("Claude", (ctxrt.ToolUse("t1", "mcpl:search", {}),)),
        ctxrt.CompiledMessage("user", (ctxrt.ToolResult("t1", (ctxrt.Text(""), ctxrt.Text("x", cache_control=marked))),
                                       ctxrt.Text("c", cache_control=marked)), cache_breakpoint=True),
        ctxrt.CompiledMessage("Claude", (ctxrt.Text("so far "),)),
    )
    out = result.to_anthropic(assistant="Claude", strict=True)
    assert violations(out) == []
    assert out["messages"][1]["content"][0]["name"] == "mcpl_search"
    assert out["messages"][2]["content"][0]["content"] == [{"type": "text", "text": "x", "cache_control": marked}]
    assert out["messages"][-1]["content"][-1]["text"] == "so far"


@pytest.mark.parametrize("field, value", [("id", "call.1:x"), ("tool_use_id", "a b")])
async def test_a_tool_id_outside_the_api_alphabet_is_refused_at_ingress(runtime: ctxrt.Runtime, field: str,
                                                                        value: str) -> None:
    """P8: ids the API refuses are refused at add_message, naming the place; nothing is stored."""
    m = await runtime.open("ns")
    block = {"type": "tool_use", "id": value, "name": "s", "input": {}} if field == "id" else {
        "type": "tool_result", "tool_use_id": value, "content": "ok"}
    with pytest.raises(ctxrt.MalformedContentError) as raised:
        await m.add_message("Claude", [block])
    assert raised.value.path == f"content[0].{field}"
    assert len(await m.get_all_messages()) == 0


# -- the property: every compile is refused or valid (P8) --------------------------------------

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}
PARTICIPANTS = ("user", "Claude", "bob")
WHITESPACE = st.sampled_from(["", " ", "\n", "  \t", "\n\n"])
WORDS = st.sampled_from(["", "alpha", "beta gamma", "a much longer sentence about the weather " * 8])


@st.composite
def text_blocks(draw: st.DrawFn, *, nested: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(WHITESPACE) + draw(WORDS) + draw(WHITESPACE)}
    if draw(st.integers(0, 4)) == 0:
        block["cache_control"] = {"type": "ephemeral"}
    return block


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[str, list[dict[str, Any]]]]:
    """Turns of several residents: text (with whitespace, host cache markers), thinking, media, tool cycles."""
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    open_calls: list[str] = []
    for n in range(draw(st.integers(1, 14))):
        participant = draw(st.sampled_from(PARTICIPANTS))
        blocks: list[dict[str, Any]] = []
        if open_calls and draw(st.booleans()):
            for tool_id in open_calls:
                nested = draw(st.one_of(st.just("done"), st.just(""), st.lists(
                    st.one_of(text_blocks(nested=True), st.just(IMAGE)), min_size=1, max_size=3)))
                blocks.append({"type": "tool_result", "tool_use_id": tool_id, "content": nested})
            participant = draw(st.sampled_from(("user", participant)))
            open_calls = []
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(("text", "text", "thinking", "image", "orphan")))
            if kind == "text":
                blocks.append(draw(text_blocks()))
            elif kind == "thinking":
                blocks.append({"type": "thinking", "thinking": "hm", "signature": draw(st.sampled_from(["s", None]))})
            elif kind == "image":
                blocks.append(IMAGE)
            else:
                blocks.append({"type": "tool_result", "tool_use_id": f"gone{n}", "content": "late"})
        if draw(st.booleans()):
            open_calls = [f"t{n}_{k}" for k in range(draw(st.integers(1, 2)))]
            name = draw(st.sampled_from(["search", "mcpl:search", "lessons:create", "n" * 70]))
            blocks += [{"type": "tool_use", "id": tool_id, "name": name, "input": {"q": n}} for tool_id in open_calls]
        if not blocks:
            blocks.append(draw(text_blocks()))
        turns.append((participant, blocks))
    return turns


def strategies() -> dict[str, ctxrt.StrategyConfig]:
    return {
        "passthrough": ctxrt.Passthrough(),
        "windowed": ctxrt.WindowedPassthrough(re_anchor_fraction=0.5),
        "autobiographical": ctxrt.Autobiographical("m", target_chunk_tokens=40, head_window_tokens=30,
                                                   recent_window_tokens=60, l1_holdback_chunks=0,
                                                   summary_target_tokens=30),
        "knowledge": ctxrt.Knowledge("m", target_chunk_tokens=40, recent_window_tokens=60, l1_holdback_chunks=0,
                                     summary_target_tokens=30),
    }


BUDGETS = (ctxrt.Budget(max_tokens=12, reserve_for_response=0), ctxrt.Budget(max_tokens=150, reserve_for_response=0),
           ctxrt.Budget(max_tokens=100_000, reserve_for_response=0))


async def compile_everything(turns: list[tuple[str, list[dict[str, Any]]]], path: Path,
                             sink: Callable[[dict[str, Any]], None]) -> int:
    model = ScriptedModel(lambda request: "  a memory of it  ")
    compiles = 0
    async with ctxrt.open_runtime(path, model=model, durability="os") as rt:
        managers = {name: await rt.open(name, strategy=config) for name, config in strategies().items()}
        for i, (participant, content) in enumerate(turns):
            await managers["passthrough"].add_message(participant, copy.deepcopy(content))
            if i % 3 != 2 and i != len(turns) - 1:
                continue
            for name, m in managers.items():
                if name in ("autobiographical", "knowledge"):
                    await m.wait_ready()
                for budget in BUDGETS:
                    compiles += 1
                    try:
                        compiled = await m.compile(budget)
                        request = compiled.to_anthropic(assistant=("Claude",))
                    except ctxrt.CtxrtError as refused:
                        assert isinstance(refused, (ctxrt.OverBudgetError, ctxrt.EmptyRequestError)), refused
                        continue
                    found = violations(request)
                    assert found == [], (name, budget, found)
                    sink(request)
    return compiles


@pytest.mark.soak
def test_every_compile_under_every_strategy_is_refused_or_accepted_by_the_api_rules(
    soak_scale: Callable[[int, int], int],
) -> None:
    """P8: random residents, tool cycles, thinking, media, nested markers, whitespace, tiny and large budgets,
    under Passthrough, Windowed, Autobiographical and Knowledge: a ctxrt refusal or a body with zero violations."""
    total = [0]

    @settings(max_examples=soak_scale(60, 2000))
    @given(conversations())
    def run(turns: list[tuple[str, list[dict[str, Any]]]]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            total[0] += trio.run(compile_everything, turns, Path(tmp) / "store", lambda _: None)

    run()
    assert total[0] >= 200


# -- through the real SDK to the local server (P7, P8) -------------------------------------------


async def test_bodies_from_every_strategy_are_accepted_by_the_local_server_through_the_sdk(tmp_path: Path) -> None:
    """P8: the real anthropic client sends compiled bodies; the server, applying the same rules, answers 200."""
    turns = [
        ("user", [{"type": "text", "text": "look this up  "}, IMAGE]),
        ("Claude", [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "mcpl:search", "input": {}}]),
        ("user", [{"type": "tool_result", "tool_use_id": "t1",
                   "content": [{"type": "text", "text": ""}, {"type": "text", "text": "x", "cache_control": EPHEMERAL}]}]),
        ("bob", [{"type": "text", "text": "noted", "cache_control": EPHEMERAL}]),
        ("Claude", [{"type": "text", "text": "here it is \n", "cache_control": EPHEMERAL}]),
    ] * 3
    bodies: list[dict[str, Any]] = []
    with trio.fail_after(GUARD_S):
        await compile_everything(turns, tmp_path / "store", bodies.append)
        assert bodies
        async with open_messages_api_server(lambda _: ApiReply.text("ok")) as server:
            client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0)
            for request in bodies[::7]:
                reply = await client.messages.create(model="m", max_tokens=5, **request)
                assert reply.content[0].text == "ok"  # type: ignore[union-attr]
            with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
                await client.messages.create(
                    model="m", max_tokens=5, messages=[USER, turn("assistant", text("a "))])  # type: ignore[list-item]
            await client.close()


# -- P9: cache breakpoints keep the prefix -------------------------------------------------------


async def test_windowed_marks_its_anchor_and_tail_and_keeps_the_prefix_stable_between_re_anchors(
    runtime: ctxrt.Runtime,
) -> None:
    """P9: the anchor and the tail carry breakpoints; an append keeps everything up to the
    previous tail, so stable_prefix_tokens is the previous compile's whole request."""
    m = await runtime.open("w", strategy=ctxrt.WindowedPassthrough())
    for n in range(3):
        await m.add_message("user" if n % 2 == 0 else "Claude", f"message {n}")
    first = await m.compile(ctxrt.Budget(max_tokens=10_000, reserve_for_response=0))
    assert [c.cache_breakpoint for c in first.messages] == [True, False, True]
    assert first.stable_prefix_tokens == 0  # no previous compile
    await m.add_message("Claude", "message 3")
    second = await m.compile(ctxrt.Budget(max_tokens=10_000, reserve_for_response=0))
    assert [c.cache_breakpoint for c in second.messages] == [True, False, False, True]
    assert second.stable_prefix_tokens == sum(estimate_blocks(c.content) for c in first.messages)
    sent = second.to_anthropic(assistant="Claude")["messages"]
    assert sent[0]["content"][-1]["cache_control"] == EPHEMERAL
    assert sent[-1]["content"][-1]["cache_control"] == EPHEMERAL
    again = await m.compile(ctxrt.Budget(max_tokens=10_000, reserve_for_response=0))
    assert again.stable_prefix_tokens == sum(estimate_blocks(c.content) for c in second.messages)


async def test_windowed_re_anchor_keeps_no_prefix(runtime: ctxrt.Runtime) -> None:
    """P9: a re-anchor drops the previous anchor, so nothing up to a previous breakpoint stays."""
    m = await runtime.open("w", strategy=ctxrt.WindowedPassthrough(re_anchor_fraction=0.5))
    budget = ctxrt.Budget(max_tokens=400, reserve_for_response=0)
    for n in range(10):
        await m.add_message("user" if n % 2 == 0 else "Claude", "word " * 7)  # ~10 tokens each
    first = await m.compile(budget)
    assert len(first.messages) == 10
    assert first.messages[0].cache_breakpoint and first.messages[-1].cache_breakpoint
    await m.add_message("user", "word " * 200)  # overflow: re-anchor
    second = await m.compile(budget)
    assert first.provenance.messages[0] not in second.provenance.messages
    assert second.stable_prefix_tokens == 0


async def test_autobiographical_marks_head_and_summary_seams_and_reports_the_stable_prefix(
    runtime: ctxrt.Runtime,
) -> None:
    """P9: the head's end and each shown summary are breakpoints; a new raw message keeps the prefix."""
    m = await runtime.open("a", strategy=strategies()["autobiographical"],
                           model=ScriptedModel(lambda request: "a memory"))
    for n in range(16):
        await m.add_message("user" if n % 2 == 0 else "Claude", f"message number {n} " + "word " * 10)
    await m.wait_ready()
    budget = ctxrt.Budget(max_tokens=100_000, reserve_for_response=0)
    first = await m.compile(budget)
    marked = [i for i, c in enumerate(first.messages) if c.cache_breakpoint]
    assert marked and any(
        any(s.kind == "summary" for s in first.provenance.messages[i]) for i in marked
    )
    assert first.messages[-1].cache_breakpoint  # the tail, beside the head's end and the latest seam
    assert len(marked) <= 3
    again = await m.compile(budget)  # nothing changed: the whole request is served from cache
    assert again.stable_prefix_tokens == sum(estimate_blocks(c.content) for c in first.messages)


# -- from a host-style attack ---------------------------------------------------------------------


async def test_a_tool_id_another_resident_used_first_still_pairs_the_assistants_own_call(tmp_path: Path) -> None:
    """P8: agents number their calls alike (call_1...): bob's call_1 is shown as text, and Claude's own
    call_1 keeps its tool_result as a result, not as text about bob's call."""
    async with ctxrt.open_runtime(tmp_path / "s") as rt:
        m = await rt.open("a")
        await m.add_message("user", "go")
        await m.add_message("bob", [ctxrt.ToolUse("call_1", "search", {})])
        await m.add_message("user", [ctxrt.ToolResult("call_1", "bob's")])
        await m.add_message("Claude", [ctxrt.ToolUse("call_1", "search", {})])
        await m.add_message("user", [ctxrt.ToolResult("call_1", "mine")])
        body = (await m.compile()).to_anthropic(assistant="Claude")
    assert violations(body) == []
    assert body["messages"][-1]["content"][0] == {"type": "tool_result", "tool_use_id": "call_1", "content": "mine"}


@pytest.mark.parametrize("position", ["injections", "message_injections"])
async def test_an_injection_carrying_a_tool_block_is_refused_naming_it(tmp_path: Path, position: str) -> None:
    """P8, B4: an injection is placed after tool pairs are repaired, so a tool_use or tool_result in it
    could never pair: refused before the strategy runs, naming the block."""
    async with ctxrt.open_runtime(tmp_path / "s") as rt:
        m = await rt.open("a")
        await m.add_message("user", "go")
        block = [ctxrt.ToolUse("t9", "look", {})]
        kwargs: dict[str, Any] = (
            {"injections": [ctxrt.Injection("n", "after_user", block)]} if position == "injections"
            else {"message_injections": [ctxrt.MessageInjection("Claude", block)]}
        )
        with pytest.raises(ctxrt.MalformedContentError) as caught:
            await m.compile(**kwargs)
    assert caught.value.path == f"{position}[0].content[0]"


def test_a_blank_system_prompt_is_left_out_of_the_body() -> None:
    """P8: the API refuses a whitespace-only system; a blank one (the host's or an injection's) is dropped."""
    result = ctxrt.CompileResult([ctxrt.CompiledMessage("user", (ctxrt.Text("hi"),))], (ctxrt.Text("  "),),
                                 provenance=None)  # type: ignore[arg-type]
    body = result.to_anthropic(assistant="Claude", system="   ")
    assert "system" not in body and violations(body) == []
