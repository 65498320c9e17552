"""OpenAI's request rules (P11) and the two request forms that satisfy them (P10).

Each rule of ``ctxrt.openai_rules`` has a failing and a passing example; the forms' own cases
(pairing, foreign calls, ids, media, emptiness, audience) are checked on hand-made compiles; a
property test drives the random multi-resident conversations ``test_anthropic_rules`` uses
(with audience blocks, a reader and injections added) through every bundled strategy, checks
that each compile is refused with a ctxrt error or rendered in both forms with no violation and
nothing meant for another reader, and sends a sample through the real ``openai`` client to the
local server, which applies the same rules.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_anthropic_rules import BUDGETS, IMAGE, conversations, strategies

import ctxrt
from ctxrt.openai_rules import violations
from ctxrt.testing import ApiReply, ScriptedModel, open_openai_api_server

GUARD_S = 60
USER = {"role": "user", "content": "hi"}


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def asks(*ids: str, name: str = "search", arguments: str = "{}") -> dict[str, Any]:
    return {"role": "assistant", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}} for i in ids]}


def answers(tool_id: str, content: Any = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": tool_id, "content": content}


def responses(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items), **extra}


def said(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


def call(call_id: str = "c1", name: str = "search") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str = "c1", value: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": value}


PNG = "data:image/png;base64,aGVsbG8="

# -- one failing and one passing example per rule (P11) ------------------------------------------

CHAT_RULES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("messages_must_be_non_empty", chat(), chat(USER)),
    ("roles_are_known", chat({"role": "bot", "content": "x"}), chat({"role": "developer", "content": "x"})),
    ("assistant_has_content_or_tool_calls", chat(USER, {"role": "assistant"}),
     chat(USER, {"role": "assistant", "content": "a"})),
    ("no_blank_content", chat({"role": "user", "content": " \n"}), chat({"role": "user", "content": "x"})),
    ("no_blank_text_part", chat({"role": "user", "content": [{"type": "text", "text": ""}]}),
     chat({"role": "user", "content": [{"type": "text", "text": "x"}]})),
    ("images_only_in_user_messages",
     chat(USER, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}),
     chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]})),
    ("an_image_is_a_url_or_a_data_url",
     chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "aGVsbG8="}}]}),
     chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]})),
    ("every_call_answered_right_after_its_message",
     chat(USER, asks("t1"), USER, answers("t1")), chat(USER, asks("t1"), answers("t1"), USER)),
    ("every_tool_message_answers_a_call", chat(USER, answers("t9")), chat(USER, asks("t9"), answers("t9"))),
    ("a_call_is_answered_once", chat(USER, asks("t1"), answers("t1"), answers("t1")),
     chat(USER, asks("t1", "t2"), answers("t2"), answers("t1"))),
    ("call_ids_at_most_40_characters", chat(USER, asks("c" * 41), answers("c" * 41)),
     chat(USER, asks("c" * 40), answers("c" * 40))),
    ("function_names_match_the_alphabet", chat(USER, asks("t1", name="mcpl:search"), answers("t1")),
     chat(USER, asks("t1", name="mcpl_search"), answers("t1"))),
    ("participant_names_match_the_alphabet", chat({"role": "user", "content": "x", "name": "bob smith"}),
     chat({"role": "user", "content": "x", "name": "bob_smith"})),
    ("arguments_hold_a_json_object", chat(USER, asks("t1", arguments="[1]"), answers("t1")),
     chat(USER, asks("t1", arguments='{"q": 1}'), answers("t1"))),
    ("no_unknown_field_such_as_audience",
     chat({"role": "user", "content": [{"type": "text", "text": "x", "audience": ["ann"]}]}),
     chat({"role": "user", "content": [{"type": "text", "text": "x"}]})),
    ("no_unknown_message_field_such_as_cache_control", chat({"role": "user", "content": "x", "cache_control": {}}),
     chat({"role": "user", "content": "x"})),
]

RESPONSES_RULES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("input_must_be_non_empty", responses(), responses(said("user", "hi"))),
    ("assistant_content_is_output_text",
     responses(said("user", "hi"), said("assistant", [{"type": "input_text", "text": "a"}])),
     responses(said("user", "hi"), said("assistant", [{"type": "output_text", "text": "a", "annotations": []}]))),
    ("every_call_has_an_output_after_it", responses(said("user", "hi"), call()),
     responses(said("user", "hi"), call(), output())),
    ("every_output_answers_a_call_before_it", responses(said("user", "hi"), output(), call()),
     responses(said("user", "hi"), call(), output())),
    ("call_ids_are_unique", responses(call("c1"), output("c1"), call("c1"), output("c1")),
     responses(call("c1"), output("c1"), call("c1_2"), output("c1_2"))),
    ("call_ids_at_most_64_characters", responses(call("c" * 65), output("c" * 65)),
     responses(call("c" * 64), output("c" * 64))),
    ("no_blank_output", responses(call(), output(value=" ")), responses(call(), output(value="done"))),
    ("no_blank_message", responses(said("user", "")), responses(said("user", "x"))),
    ("known_item_types_only", responses({"type": "reasoning", "summary": []}, said("user", "x")),
     responses(said("user", "x"))),
    ("no_unknown_field_such_as_audience", responses({**said("user", "x"), "audience": ["ann"]}),
     responses(said("user", "x"))),
]


@pytest.mark.parametrize(("rule", "bad", "good"), CHAT_RULES, ids=[r[0] for r in CHAT_RULES])
def test_each_chat_completions_rule_refuses_its_failing_example_and_accepts_its_passing_one(
    rule: str, bad: dict[str, Any], good: dict[str, Any]
) -> None:
    """P11: every Chat Completions rule of the checker, one failing and one passing body each."""
    assert violations(good) == []
    assert violations(bad) != [], rule


@pytest.mark.parametrize(("rule", "bad", "good"), RESPONSES_RULES, ids=[r[0] for r in RESPONSES_RULES])
def test_each_responses_rule_refuses_its_failing_example_and_accepts_its_passing_one(
    rule: str, bad: dict[str, Any], good: dict[str, Any]
) -> None:
    """P11: every Responses rule of the checker, one failing and one passing body each."""
    assert violations(good, api="responses") == []
    assert violations(bad, api="responses") != [], rule


def test_a_violation_names_its_place() -> None:
    """P11: each violation says where, so a host can find the message."""
    found = violations(chat(USER, asks("c" * 41), answers("c" * 41)))
    assert any(v.startswith("messages[1].tool_calls[0].id:") for v in found)
    assert any(v.startswith("input[1].call_id:") for v in violations(responses(call(), call(), output()), api="responses"))


# -- the forms on hand-made compiles (P10, P11) ---------------------------------------------------


def compiled(*messages: ctxrt.CompiledMessage, system: tuple[ctxrt.Text, ...] = ()) -> ctxrt.CompileResult:
    provenance = ctxrt.Provenance("c", "ns", "main", None, "passthrough", tuple(() for _ in messages), {}, {})
    return ctxrt.CompileResult(list(messages), list(system), provenance)


def message(participant: str, *blocks: ctxrt.Text | ctxrt.ToolUse | ctxrt.ToolResult | ctxrt.Image | ctxrt.Document
            | ctxrt.Thinking | ctxrt.RedactedThinking) -> ctxrt.CompiledMessage:
    return ctxrt.CompiledMessage(participant, blocks)


def both(result: ctxrt.CompileResult, **kwargs: Any) -> tuple[ctxrt.OpenAIBody, ctxrt.OpenAIBody]:
    """Both forms, strict: each passes its rules or the call raises."""
    return (result.to_openai_chat(assistant="Claude", strict=True, **kwargs),
            result.to_openai_responses(assistant="Claude", strict=True, **kwargs))


PNG_SOURCE = {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}


def test_the_assistants_call_is_answered_right_after_it_and_the_rest_of_the_results_message_follows() -> None:
    """P10: own calls become tool_calls / function_call items; each result comes right after its call,
    before the text its stored message also held."""
    result = compiled(
        message("user", ctxrt.Text("look it up")),
        message("Claude", ctxrt.Text("on it"), ctxrt.ToolUse("t1", "mcpl:search", {"q": "pump"})),
        message("user", ctxrt.Text("by the way"), ctxrt.ToolResult("t1", "found it")),
    )
    chat_body, responses_body = both(result)
    assert chat_body["messages"] == [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": "on it", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "mcpl_search", "arguments": '{"q":"pump"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "found it"},
        {"role": "user", "content": "by the way"},
    ]
    assert responses_body["input"] == [
        {"type": "message", "role": "user", "content": "look it up"},
        {"type": "message", "role": "assistant", "content": "on it"},
        {"type": "function_call", "call_id": "t1", "name": "mcpl_search", "arguments": '{"q":"pump"}'},
        {"type": "function_call_output", "call_id": "t1", "output": "found it"},
        {"type": "message", "role": "user", "content": "by the way"},
    ]


def test_another_participants_call_and_its_result_are_shown_as_text_and_counted() -> None:
    """P10: only the assistant calls tools; bob's call and its result are text, with his name in Chat
    Completions, counted in as_text; Claude's own reuse of bob's id still pairs."""
    result = compiled(
        message("user", ctxrt.Text("go")),
        message("bob smith", ctxrt.ToolUse("call_1", "search", {"q": 1})),
        message("user", ctxrt.ToolResult("call_1", "bob's", is_error=True)),
        message("Claude", ctxrt.ToolUse("call_1", "search", {})),
        message("user", ctxrt.ToolResult("call_1", "mine")),
    )
    chat_body, responses_body = both(result)
    assert chat_body["messages"][1] == {"role": "user", "content": '[bob smith called search with {"q":1}]',
                                        "name": "bob_smith"}
    assert chat_body["messages"][2] == {"role": "user", "content": "[result of bob smith called search (an error): bob's]"}
    assert chat_body["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "mine"}
    assert "name" not in responses_body["input"][1]  # the Responses form has no participant name
    assert chat_body.as_text == responses_body.as_text == {"tool_use": 1, "tool_result": 1}


def test_a_reused_call_id_is_sent_as_another_id_and_both_halves_agree() -> None:
    """P10, P11: agents number calls alike; the second t1 goes as t1_2 in both forms, its result too."""
    result = compiled(
        message("user", ctxrt.Text("go")),
        message("Claude", ctxrt.ToolUse("t1", "a", {})),
        message("user", ctxrt.ToolResult("t1", "one")),
        message("Claude", ctxrt.ToolUse("t1", "b", {})),
        message("user", ctxrt.ToolResult("t1", "two")),
    )
    chat_body, responses_body = both(result)
    assert [m.get("tool_call_id") for m in chat_body["messages"] if m["role"] == "tool"] == ["t1", "t1_2"]
    assert [(i["type"], i["call_id"]) for i in responses_body["input"] if "call_id" in i] == [
        ("function_call", "t1"), ("function_call_output", "t1"), ("function_call", "t1_2"), ("function_call_output", "t1_2")]


def test_a_long_call_id_is_cut_to_each_forms_limit_the_same_for_call_and_result() -> None:
    """P11: Chat Completions takes ids up to 40 characters, Responses up to 64; a longer stored id keeps
    its start and a hash, the same bytes for the call and its result."""
    long_id = "toolu_" + "x" * 70
    result = compiled(message("user", ctxrt.Text("go")), message("Claude", ctxrt.ToolUse(long_id, "a", {})),
                      message("user", ctxrt.ToolResult(long_id, "ok")))
    chat_body, responses_body = both(result)
    sent = chat_body["messages"][1]["tool_calls"][0]["id"]
    assert len(sent) == 40 and sent.startswith("toolu_x") and chat_body["messages"][2]["tool_call_id"] == sent
    assert len(responses_body["input"][1]["call_id"]) == 64
    assert responses_body["input"][1]["call_id"] == responses_body["input"][2]["call_id"]


def test_thinking_is_left_out_and_media_a_form_cant_carry_becomes_a_counted_note() -> None:
    """P10: thinking is left out; an image in the assistant's turn and in a Chat Completions tool message
    becomes a note (Responses carries the tool's image); a text document is text; a PDF is a file part."""
    pdf = ctxrt.Document({"type": "base64", "media_type": "application/pdf", "data": "aGVsbG8="}, title="spec.pdf")
    note = ctxrt.Document({"type": "text", "media_type": "text/plain", "data": "the notes"}, title="notes")
    result = compiled(
        message("user", ctxrt.Text("read these"), pdf, note),
        message("Claude", ctxrt.Thinking("hm", "sig"), ctxrt.RedactedThinking("xx"), ctxrt.Image(PNG_SOURCE),
                ctxrt.ToolUse("t1", "shot", {})),
        message("user", ctxrt.ToolResult("t1", (ctxrt.Text(" "), ctxrt.Image(PNG_SOURCE)))),
    )
    chat_body, responses_body = both(result)
    assert chat_body["messages"][0]["content"] == [
        {"type": "text", "text": "read these"},
        {"type": "file", "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64,aGVsbG8="}},
        {"type": "text", "text": "[document: notes]\nthe notes"},
    ]
    assert chat_body["messages"][1]["content"] == "[image not shown]"
    assert chat_body["messages"][2] == {"role": "tool", "tool_call_id": "t1", "content": "[image not shown]"}
    assert responses_body["input"][3]["output"] == [{"type": "input_image", "image_url": PNG, "detail": "auto"}]
    assert chat_body.left_out == responses_body.left_out == {"thinking": 1, "redacted_thinking": 1}
    assert chat_body.as_text == {"document": 1, "image": 2}
    assert responses_body.as_text == {"document": 1, "image": 1}


def test_an_error_result_says_so_and_an_empty_one_is_never_an_empty_message() -> None:
    """P10, P11: neither form has is_error, so the result's text starts "Error: "; a result with nothing
    to show is "(no output)", never an empty tool message."""
    result = compiled(message("user", ctxrt.Text("go")),
                      message("Claude", ctxrt.ToolUse("t1", "a", {}), ctxrt.ToolUse("t2", "b", {})),
                      message("user", ctxrt.ToolResult("t1", "boom", is_error=True), ctxrt.ToolResult("t2", "  ")))
    chat_body, responses_body = both(result)
    assert [m["content"] for m in chat_body["messages"][2:]] == ["Error: boom", "(no output)"]
    assert [i["output"] for i in responses_body["input"][3:]] == ["Error: boom", "(no output)"]


def test_the_system_prompt_and_system_injections_lead_in_the_role_asked_for() -> None:
    """P10: Chat Completions gets one leading system (or developer) message; Responses the instructions;
    a blank system prompt is left out."""
    result = compiled(message("user", ctxrt.Text("hi")), system=(ctxrt.Text("be brief"), ctxrt.Text("  ")))
    chat_body = result.to_openai_chat(assistant="Claude", system="You help.", system_role="developer", strict=True)
    assert chat_body["messages"][0] == {"role": "developer", "content": "You help.\n\nbe brief"}
    assert result.to_openai_responses(assistant="Claude", system="You help.")["instructions"] == "You help.\n\nbe brief"
    bare = compiled(message("user", ctxrt.Text("hi")))
    assert bare.to_openai_chat(assistant="Claude", system="  ")["messages"] == [{"role": "user", "content": "hi"}]
    assert "instructions" not in bare.to_openai_responses(assistant="Claude", system="  ")
    with pytest.raises(ValueError, match="system_role"):
        bare.to_openai_chat(assistant="Claude", system_role="admin")  # type: ignore[arg-type]


@pytest.mark.parametrize("form", ["to_openai_chat", "to_openai_responses"])
def test_an_empty_compile_raises_empty_request_error_saying_why(form: str) -> None:
    """P11: no message: the error names the empty slot or budget; a system prompt alone is no request."""
    with pytest.raises(ctxrt.EmptyRequestError, match="empty in this reader's view|exceeds the budget"):
        getattr(compiled(), form)(assistant="Claude", system="You help.")


@pytest.mark.parametrize("form", ["to_openai_chat", "to_openai_responses"])
def test_a_compile_of_only_unsendable_blocks_raises_empty_request_error(form: str) -> None:
    """P11: blank text and thinking leave nothing to send, and the error says so."""
    result = compiled(message("user", ctxrt.Text("  ")), message("Claude", ctxrt.Thinking("hm", "sig")))
    with pytest.raises(ctxrt.EmptyRequestError, match="none of the 2 compiled"):
        getattr(result, form)(assistant="Claude", system="You help.")


@pytest.mark.parametrize(("form", "api"), [("to_openai_chat", "Chat Completions"), ("to_openai_responses", "Responses API")])
def test_strict_refuses_a_hand_made_compile_whose_result_answers_no_call(form: str, api: str) -> None:
    """P11: a compile pairs every result with its call (P4); one made by hand may not, and strict says so."""
    result = compiled(message("user", ctxrt.Text("go")), message("user", ctxrt.ToolResult("t9", "orphan")))
    getattr(result, form)(assistant="Claude")  # not strict: the body is returned as it is
    with pytest.raises(ctxrt.InvalidRequestError, match=api) as caught:
        getattr(result, form)(assistant="Claude", strict=True)
    assert caught.value.api == api and any("t9" in v for v in caught.value.violations)


def keys_in(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from keys_in(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from keys_in(inner)


async def test_a_readers_request_carries_its_own_lines_and_no_audience_field(tmp_path: Path) -> None:
    """P10, A2: compiled for ann, both forms carry the line meant for ann, not the one meant for bob,
    and no audience field anywhere."""
    async with ctxrt.open_runtime(tmp_path / "s") as rt:
        m = await rt.open("a", view_reader="ann")
        await m.add_message("user", [{"type": "text", "text": "hello all"},
                                     {"type": "text", "text": "ann: the code is 4", "audience": ["ann"]},
                                     {"type": "text", "text": "bob: the code is 7", "audience": ["bob"]}])
        result = await m.compile()
    for body in both(result):
        text = json.dumps(body)
        assert "the code is 4" in text and "the code is 7" not in text
        assert "audience" not in set(keys_in(dict(body)))


# -- the property: every compile is refused or valid in both forms (P11) -------------------------

READERS = st.sampled_from([("ann",), ("bob",), ("ann", "bob")])


@st.composite
def conversations_with_audiences(draw: st.DrawFn) -> list[tuple[str, list[dict[str, Any]]]]:
    """The Messages API property's conversations, with lines meant for ann, for bob, or for both."""
    turns = draw(conversations())
    for n, (_, blocks) in enumerate(turns):
        if draw(st.integers(0, 2)) == 0:
            audience = draw(READERS)
            blocks.append({"type": "text", "text": f"private-{'-'.join(audience)}-{n}", "audience": list(audience)})
    return turns


INJECTIONS = dict(
    injections=[ctxrt.Injection("sys", "system", "be brief"), ctxrt.Injection("notes", "after_user", "remember")],
    message_injections=[ctxrt.MessageInjection("bob", "an aside", depth=1)],
)


async def compile_both_forms(turns: list[tuple[str, list[dict[str, Any]]]], path: Path,
                             sink: Callable[[str, dict[str, Any]], None]) -> int:
    """Every compile of every strategy and budget for ann, in both forms: a ctxrt refusal, or bodies
    with no violation, no audience field and no line meant only for bob."""
    model = ScriptedModel(lambda request: "  a memory of it  ")
    checked = 0
    async with ctxrt.open_runtime(path, model=model, durability="os") as rt:
        managers = {name: await rt.open(name, strategy=config, view_reader="ann")
                    for name, config in strategies().items()}
        for i, (participant, content) in enumerate(turns):
            await managers["passthrough"].add_message(participant, copy.deepcopy(content))
            if i % 3 != 2 and i != len(turns) - 1:
                continue
            for name, m in managers.items():
                if name in ("autobiographical", "knowledge"):
                    await m.wait_ready()
                for budget in BUDGETS:
                    try:
                        result = await m.compile(budget, **INJECTIONS)  # type: ignore[arg-type]
                    except ctxrt.OverBudgetError:
                        continue
                    renders = (("chat", result.to_openai_chat), ("responses", result.to_openai_responses),
                               ("chat", partial(result.to_openai_chat, alternate_roles=True)))
                    for api, render in renders:
                        try:
                            body = render(assistant=("Claude",), system="You help.")
                        except ctxrt.EmptyRequestError:
                            continue
                        checked += 1
                        assert violations(body, api=api) == [], (name, budget, api)
                        text = json.dumps(body)
                        assert "audience" not in set(keys_in(dict(body)))
                        assert not any(f"private-bob-{n}" in text for n in range(len(turns)))
                        sink(api, body)
    return checked


async def send_through_the_sdk(bodies: list[tuple[str, dict[str, Any]]]) -> None:
    """The real openai client sends each body to the local server, which answers 200 only if it
    breaks no rule."""
    async with open_openai_api_server(lambda _: ApiReply.text("ok")) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client:
            for api, body in bodies:
                if api == "chat":
                    reply = await client.chat.completions.create(model="m", **body)
                    assert reply.choices[0].message.content == "ok"
                else:
                    response = await client.responses.create(model="m", **body)
                    assert response.output_text == "ok"
    assert len(server.requests) == len(bodies)


@pytest.mark.soak
def test_every_compile_in_both_openai_forms_is_refused_or_passes_the_rules_and_the_sdk(
    soak_scale: Callable[[int, int], int],
) -> None:
    """P10, P11: random residents, tool cycles, thinking, media, lines for ann or bob, injections, tiny and
    large budgets, under Passthrough, Windowed, Autobiographical and Knowledge, compiled for ann: a ctxrt
    refusal, or Chat Completions (roles alternating or not) and Responses bodies with zero violations,
    no audience and nothing meant only for bob; a sample of each example's bodies goes through the real
    openai client to the local server."""
    total = [0]
    sample: list[tuple[str, dict[str, Any]]] = []

    @settings(max_examples=soak_scale(40, 1500), deadline=None)
    @given(conversations_with_audiences())
    def run(turns: list[tuple[str, list[dict[str, Any]]]]) -> None:
        bodies: list[tuple[str, dict[str, Any]]] = []

        async def main(path: Path) -> None:
            with trio.fail_after(GUARD_S):
                total[0] += await compile_both_forms(turns, path, lambda api, body: bodies.append((api, body)))

        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, Path(tmp) / "store")
        sample.extend(bodies[::13][:3] + bodies[-1:])  # one client and server for the run, below

    run()
    assert total[0] >= 200

    async def send_sample() -> None:
        with trio.fail_after(GUARD_S):
            await send_through_the_sdk(sample)

    trio.run(send_sample)


async def test_bodies_the_server_refuses_come_back_as_the_sdks_bad_request(tmp_path: Path) -> None:
    """P11: the local server applies the same rules: an assistant message with no content is a 400 the
    SDK raises as BadRequestError, naming the place."""
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server(lambda _: ApiReply.text("ok")) as server:
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client:
                with pytest.raises(openai.BadRequestError, match=r"messages\[1\]: an assistant message needs"):
                    await client.chat.completions.create(
                        model="m", messages=[USER, {"role": "assistant"}])  # type: ignore[list-item, typeddict-item]
                with pytest.raises(openai.BadRequestError, match=r"input\[0\]: function_call 'c1' has no"):
                    await client.responses.create(model="m", input=[call()])  # type: ignore[list-item]


async def test_images_and_files_reach_the_server_through_the_sdk(tmp_path: Path) -> None:
    """P10, P11: a compile holding an image, a PDF and a tool's image, sent in both forms by the real
    client, is accepted; the server saw the data URLs."""
    async with ctxrt.open_runtime(tmp_path / "s") as rt:
        m = await rt.open("a")
        await m.add_message("user", [{"type": "text", "text": "see"}, IMAGE,
                                     {"type": "document", "title": "spec.pdf", "source": {
                                         "type": "base64", "media_type": "application/pdf", "data": "aGVsbG8="}}])
        await m.add_message("Claude", [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}])
        await m.add_message("user", [{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}])
        result = await m.compile()
    bodies = [("chat", dict(result.to_openai_chat(assistant="Claude"))),
              ("responses", dict(result.to_openai_responses(assistant="Claude")))]
    with trio.fail_after(GUARD_S):
        await send_through_the_sdk(bodies)
    assert PNG in json.dumps(bodies)


def test_media_at_a_url_the_forms_dont_fetch_becomes_a_note_naming_it() -> None:
    """P10, P11: a stored image at s3://... is no image_url the API takes; it is sent as a note with its URL."""
    result = compiled(message("user", ctxrt.Text("see"), ctxrt.Image({"type": "url", "url": "s3://bucket/a.png"}),
                              ctxrt.Image({"type": "url", "url": "https://x.test/b.png"})))
    chat_body, responses_body = both(result)
    assert chat_body["messages"][0]["content"] == [
        {"type": "text", "text": "see"}, {"type": "text", "text": "[image: s3://bucket/a.png]"},
        {"type": "image_url", "image_url": {"url": "https://x.test/b.png"}}]
    assert responses_body["input"][0]["content"][2] == {"type": "input_image", "image_url": "https://x.test/b.png",
                                                        "detail": "auto"}
    assert chat_body.as_text == responses_body.as_text == {"image": 1}


def test_alternate_roles_merges_runs_and_opens_with_a_user_turn() -> None:
    """P10: for chat templates that want user and assistant to alternate, runs of one role become one
    message (a name kept only where the whole run shares it), tool messages stay apart, and an opening
    assistant message follows "(continued)"."""
    result = compiled(
        message("Claude", ctxrt.Text("where were we")),
        message("Claude", ctxrt.ToolUse("t1", "look", {})),
        message("user", ctxrt.ToolResult("t1", "here"), ctxrt.Text("ann says hi")),
        message("bob", ctxrt.Text("bob too"), ctxrt.Image(PNG_SOURCE)),
        message("bob", ctxrt.Text("and again")),
    )
    body = result.to_openai_chat(assistant="Claude", system="sys", alternate_roles=True, strict=True)
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "(continued)"},
        {"role": "assistant", "content": "where were we", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "here"},
        {"role": "user", "content": [
            {"type": "text", "text": "ann says hi"}, {"type": "text", "text": "bob too"},
            {"type": "image_url", "image_url": {"url": PNG}}, {"type": "text", "text": "and again"}]},
    ]
    bobs = compiled(message("bob", ctxrt.Text("one")), message("bob", ctxrt.Text("two")))
    assert bobs.to_openai_chat(assistant="Claude", alternate_roles=True)["messages"] == [
        {"role": "user", "content": "one\n\ntwo", "name": "bob"}]


def _folded(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Alternation as P10 words it, one message at a time: a message of the role before it (not a
    tool message) joins it: strings by a blank line while both are strings, else as part lists; the
    calls in order; the name kept while every message so far had it."""
    out: list[dict[str, Any]] = []
    for item in messages:
        last = out[-1] if out else None
        if last is None or last["role"] != item["role"] or item["role"] == "tool":
            out.append(dict(item))
            continue
        joined = dict(last)
        if "content" in item:
            if "content" not in last:
                joined["content"] = item["content"]
            elif isinstance(last["content"], str) and isinstance(item["content"], str):
                joined["content"] = f"{last['content']}\n\n{item['content']}"
            else:
                as_parts = [[{"type": "text", "text": c}] if isinstance(c, str) else c for c in (last["content"], item["content"])]
                joined["content"] = as_parts[0] + as_parts[1]
        if "tool_calls" in item:
            joined["tool_calls"] = last.get("tool_calls", []) + item["tool_calls"]
        if joined.get("name") != item.get("name"):
            joined.pop("name", None)
        out[-1] = joined
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": "(continued)"})
    return out


@settings(max_examples=150)
@given(st.lists(st.tuples(st.sampled_from(["user", "Claude", "bob", "ann"]),
                          st.lists(st.sampled_from(["text", "image", "call"]), min_size=1, max_size=3)),
                min_size=1, max_size=12))
def test_alternated_roles_equal_merging_one_message_at_a_time(talk: list[tuple[str, list[str]]]) -> None:
    """P10: alternation merges each run of one role once (so a long run costs its length) into what
    merging it one message at a time gives."""
    made = []
    for k, (who, kinds) in enumerate(talk):
        blocks: list[Any] = []
        for n, kind in enumerate(kinds):
            if kind == "text":
                blocks.append(ctxrt.Text(f"{who} {k}.{n}"))
            elif kind == "image" and who != "Claude":
                blocks.append(ctxrt.Image(PNG_SOURCE))
            elif kind == "call" and who == "Claude":
                blocks.append(ctxrt.ToolUse(f"t{k}{n}", "look", {}))
        made.append(message(who, *(blocks or [ctxrt.Text(f"{who} {k}")])))
    result = compiled(*made)
    plain = result.to_openai_chat(assistant="Claude")["messages"]
    assert result.to_openai_chat(assistant="Claude", alternate_roles=True)["messages"] == _folded(plain)
