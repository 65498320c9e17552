"""Request bodies made from the last body's cached parts (P14) and what a host may edit in one (P15)."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from typing import Any

import anthropic
import attrs
import openai
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt.forms.anthropic_body import anthropic_messages
from ctxrt.forms.body_runs import BodyCache, run_length, runs
from ctxrt.forms.openai_body import chat_messages, responses_input
from ctxrt.forms.openai_wire import to_chat_messages, to_responses_input
from ctxrt import CompiledMessage, Image, RedactedThinking, Text, Thinking, ToolResult, ToolUse
from ctxrt.testing import ApiReply, open_messages_api_server, open_openai_api_server, to_anthropic_messages

GUARD_S = 10
PARTICIPANTS = ("user", "Claude", "bob", "ann")
TOOL_IDS = ("t1", "t2", "call_1")
EPHEMERAL = {"type": "ephemeral"}
EXAMPLES = 2000 if os.environ.get("CTXRT_SOAK") == "1" else 120  # make soak explores further

texts = st.sampled_from(["hi", "  ", "", "tail \n", "long answer", "x"])
text_blocks = st.builds(Text, texts, cache_control=st.sampled_from([None, None, EPHEMERAL]))
nested = st.one_of(texts, st.lists(text_blocks, max_size=2).map(tuple))
blocks = st.one_of(
    text_blocks,
    text_blocks,
    st.builds(Thinking, st.just("hm"), st.sampled_from([None, "sig"])),
    st.builds(RedactedThinking, st.just("r")),
    st.builds(ToolUse, st.sampled_from(TOOL_IDS), st.sampled_from(["search", "mcpl:search"]), st.just({"q": 1})),
    st.builds(ToolResult, st.sampled_from(TOOL_IDS), nested, is_error=st.booleans()),
    st.builds(Image, st.sampled_from([{"type": "base64", "media_type": "image/png", "data": "AA=="},
                                      {"type": "blob_ref", "sha256": "ab"}])),
)
messages = st.builds(CompiledMessage, st.sampled_from(PARTICIPANTS), st.lists(blocks, min_size=1, max_size=3).map(tuple),
                     cache_breakpoint=st.booleans())
assistants = st.sampled_from(["Claude", ("Claude", "bob"), "user"])


def step(data: st.DataObject, current: list[CompiledMessage], seen: list[CompiledMessage]) -> list[CompiledMessage]:
    """The next compile's messages: what a compile does between turns, sharing message objects."""
    kind = data.draw(st.sampled_from(["append", "trim", "slide", "splice", "remark", "reuse", "same"]))
    new = list(current)
    if kind in ("append", "slide"):
        new += data.draw(st.lists(messages, min_size=1, max_size=3))
    if kind in ("trim", "slide") and new:
        del new[: data.draw(st.integers(1, min(3, len(new))))]
    if kind == "splice" and new:
        at = data.draw(st.integers(0, len(new) - 1))
        new[at:at + data.draw(st.integers(0, 2))] = data.draw(st.lists(messages, max_size=2))
    if kind == "remark" and new:  # a breakpoint moved: new objects for the messages it touched
        at = data.draw(st.integers(0, len(new) - 1))
        new[at] = attrs.evolve(new[at], cache_breakpoint=not new[at].cache_breakpoint)
    if kind == "reuse" and seen:  # an object from an earlier compile back in another place
        new.insert(data.draw(st.integers(0, len(new))), data.draw(st.sampled_from(seen)))
    return new


def host_edits(body: list[dict[str, Any]]) -> None:
    """What a host may do to a body (P15): its list, and its last turn, edited in place."""
    if not body:
        return
    last = body[-1]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    last["content"].append({"type": "text", "text": "added by the host"})
    body.append({"role": "user", "content": [{"type": "text", "text": "another"}]})
    body.pop(0)


def scribble(item: Any) -> None:
    """What a host may do to an OpenAI body's last item (P15): anything, at any depth, in place."""
    if isinstance(item, dict):
        for value in item.values():
            scribble(value)
        item["added by the host"] = 1
    elif isinstance(item, list):
        for value in item:
            scribble(value)
        item.append({"type": "text", "text": "added by the host"})


def openai_host_edits(body: tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]) -> None:
    """What a host may do to an OpenAI body (P15): its list, its last item and its counts edited in place."""
    items, left_out, _ = body
    if items:
        scribble(items[-1])
        items.append({"role": "user", "content": "another"})
        items.pop(0)
    left_out["thinking"] = 99


Made = Callable[[list[CompiledMessage], Any, BodyCache], Any]
Afresh = Callable[[list[CompiledMessage], Any], Any]
FORMS: dict[str, tuple[Made, Afresh, Callable[[Any], None]]] = {
    "anthropic": (anthropic_messages, to_anthropic_messages, host_edits),
    "openai chat": (chat_messages, to_chat_messages, openai_host_edits),
    "openai chat, alternated, with a system prompt": (
        functools.partial(chat_messages, system="be brief", system_role="developer", alternate_roles=True),
        functools.partial(to_chat_messages, system="be brief", system_role="developer", alternate_roles=True),
        openai_host_edits,
    ),
    "openai responses": (responses_input, to_responses_input, openai_host_edits),
}


@pytest.mark.parametrize("form", FORMS)
@settings(max_examples=EXAMPLES)
@given(data=st.data(), first=st.lists(messages, max_size=12), assistant=assistants)
def test_a_body_made_from_cached_parts_equals_one_made_afresh(
    form: str, data: st.DataObject, first: list[CompiledMessage], assistant: Any
) -> None:
    """P14, P15: over compiles that append, trim the front, splice, move breakpoints and bring
    back earlier message objects, each body made from the last one's parts (in the Anthropic
    form and both OpenAI forms, with what they left out or showed as text) equals a body made
    from scratch, though the host edited every body's last turn or item; and so does an older
    compile's."""
    made_from_cache, made_afresh, edit = FORMS[form]
    cache = BodyCache()
    current, seen, history = first, list(first), [first]
    for _ in range(data.draw(st.integers(1, 12))):
        if data.draw(st.integers(0, 9)) == 0:
            assistant = data.draw(assistants)
        made = made_from_cache(current, assistant, cache)
        assert made == made_afresh(current, assistant)
        edit(made)
        current = step(data, current, seen)
        seen += current
        history.append(current)
    older = data.draw(st.sampled_from(history))
    assert made_from_cache(older, assistant, cache) == made_afresh(older, assistant)


@given(st.data())
def test_a_run_is_as_long_as_the_lists_stay_equal_however_long(data: st.DataObject) -> None:
    """P14: ``run_length`` (galloping, and trying a long run to its end at once) counts exactly
    the equal items from the two starts, for runs far past where it tries the whole rest."""
    old = [0] * data.draw(st.integers(0, 400), label="length")
    new = list(old)
    for at in data.draw(st.lists(st.integers(0, 400), max_size=3), label="edits"):  # a few stretches differ
        end = data.draw(st.integers(at, at + 6), label="end")
        new[at:end] = data.draw(st.lists(st.integers(1, 3), max_size=6), label="with")
    start = data.draw(st.integers(0, 400), label="start")
    i, j = min(start, len(new)), min(start + data.draw(st.integers(-2, 2), label="shift"), len(old))
    j = max(j, 0)
    expected = 0
    while i + expected < len(new) and j + expected < len(old) and new[i + expected] == old[j + expected]:
        expected += 1
    assert run_length(new, i, old, j) == expected


@given(st.lists(st.integers(0, 6), max_size=30), st.lists(st.integers(0, 6), max_size=30))
def test_runs_are_the_stretches_of_the_new_list_found_by_identity_in_the_old(old_keys: list[int], new_keys: list[int]) -> None:
    """P14: every run is a stretch of the new list that is, object for object, one of the old, and
    an item skipped over is in no stretch of what was left of the old list but where the item
    after it is near that stretch's start (it replaced an item there: an edit)."""
    pool = [object() for _ in range(7)]
    old, new = [pool[k] for k in old_keys], [pool[k] for k in new_keys]
    found = runs(new, old)
    covered, consumed = 0, 0

    def skipped_rightly(k: int) -> bool:
        if new[k] not in old[consumed:]:
            return True
        return new[k] not in old[consumed:consumed + 8] and k + 1 < len(new) and new[k + 1] in old[consumed:consumed + 8]

    for i, j, length in found:
        assert length > 0 and i >= covered
        assert all(a is b for a, b in zip(new[i:i + length], old[j:j + length], strict=True))
        assert all(map(skipped_rightly, range(covered, i)))
        covered, consumed = i + length, j + length
    assert all(map(skipped_rightly, range(covered, len(new))))


def test_strict_names_the_turn_a_host_edited_that_later_bodies_share() -> None:
    """P15: an earlier turn is shared with later bodies; editing it is found by strict=True,
    which names the turn and makes the next bodies afresh."""
    talk = [CompiledMessage("user" if n % 2 == 0 else "Claude", (Text(f"message {n}"),)) for n in range(6)]
    provenance = ctxrt.Provenance("c", "ns", "main", None, "passthrough", tuple(() for _ in talk), {}, {})
    result = ctxrt.CompileResult(talk, [], provenance)
    body = result.to_anthropic(assistant="Claude")
    body["messages"][1]["content"][0]["text"] = "rewritten by the host"  # not the host's: read-only
    with pytest.raises(ctxrt.InvalidRequestError, match=r"messages\[1\]: .*read-only"):
        result.to_anthropic(assistant="Claude", strict=True)
    assert result.to_anthropic(assistant="Claude") == {"messages": to_anthropic_messages(talk, "Claude")}


@pytest.mark.parametrize(("form", "field"), [("chat", "messages"), ("responses", "input")])
def test_strict_names_the_openai_item_a_host_edited_that_later_bodies_share(form: str, field: str) -> None:
    """P15: an OpenAI body's earlier items are shared with later bodies; editing one is found by
    strict=True, which names the item (and the API whose body it is) and makes the next bodies afresh."""
    talk = [CompiledMessage("user" if n % 2 == 0 else "Claude", (Text(f"message {n}"),)) for n in range(6)]
    provenance = ctxrt.Provenance("c", "ns", "main", None, "passthrough", tuple(() for _ in talk), {}, {})
    result = ctxrt.CompileResult(talk, [], provenance)
    make = result.to_openai_chat if form == "chat" else result.to_openai_responses
    afresh = to_chat_messages(talk, "Claude") if form == "chat" else to_responses_input(talk, "Claude")
    body = make(assistant="Claude")
    body[field][1]["content"] = "rewritten by the host"  # not the host's: read-only
    with pytest.raises(ctxrt.InvalidRequestError, match=rf"{field}\[1\]: .*read-only") as raised:
        make(assistant="Claude", strict=True)
    assert raised.value.api == ("Chat Completions" if form == "chat" else "Responses API")
    assert make(assistant="Claude") == {field: afresh[0]}


async def test_a_host_editing_its_body_and_the_anthropic_client_sending_it_leave_later_bodies_unchanged(
    runtime: ctxrt.Runtime,
) -> None:
    """P15: through the public API, the host edits each body's dict, list and last turn, the real
    anthropic client sends it to the local Messages API server (and leaves it as it was), and
    every later body equals one made afresh."""
    with trio.fail_after(GUARD_S):
        manager = await runtime.open("chat")
        async with open_messages_api_server(lambda _: ApiReply.text("ok")) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
                for n in range(6):
                    await manager.add_message("user" if n % 2 == 0 else "Claude", f"turn {n} ")
                    result = await manager.compile(ctxrt.Budget(max_tokens=10_000))
                    body = result.to_anthropic(assistant="Claude", system="be brief")
                    assert body == result.to_anthropic(assistant="Claude", system="be brief", strict=True)
                    sent = copy.deepcopy(body)
                    reply = await client.messages.create(model="m", max_tokens=5, **body)
                    assert reply.content[0].text == "ok"
                    assert body == sent  # the client left the body as it was
                    body["system"] = "changed"
                    host_edits(body["messages"])
        assert len(server.requests) == 6


async def test_a_host_editing_its_openai_bodies_and_the_openai_client_sending_them_leave_later_bodies_unchanged(
    runtime: ctxrt.Runtime,
) -> None:
    """P15: through the public API, the host edits each Chat Completions and Responses body's dict,
    list and last item, the real openai client sends it to the local OpenAI API server (and leaves
    it as it was), and every later body equals one made afresh."""
    with trio.fail_after(GUARD_S):
        manager = await runtime.open("chat")
        async with open_openai_api_server(lambda _: ApiReply.text("ok")) as server:
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client:
                for n in range(6):
                    await manager.add_message("user" if n % 2 == 0 else "Claude", f"turn {n} ")
                    result = await manager.compile(ctxrt.Budget(max_tokens=10_000))
                    chat = result.to_openai_chat(assistant="Claude", system="be brief")
                    assert chat == result.to_openai_chat(assistant="Claude", system="be brief", strict=True)
                    sent = copy.deepcopy(chat)
                    await client.chat.completions.create(model="m", **chat)
                    assert chat == sent  # the client left the body as it was
                    responses = result.to_openai_responses(assistant="Claude", system="be brief")
                    assert responses == result.to_openai_responses(assistant="Claude", system="be brief", strict=True)
                    sent = copy.deepcopy(responses)
                    await client.responses.create(model="m", **responses)
                    assert responses == sent
                    for body, field in ((chat, "messages"), (responses, "input")):
                        body["added by the host"] = 1
                        openai_host_edits((body[field], body.left_out, body.as_text))
        assert len(server.requests) == 12


def test_trimming_a_final_assistant_turn_leaves_the_blocks_later_bodies_share() -> None:
    """P15, P8: the trim of a final assistant turn's trailing whitespace is made on the host's copy
    of its last block: once the turn is no longer last, the next body shows it as stored."""
    cache = BodyCache()
    said = [CompiledMessage("user", (Text("hi"),)), CompiledMessage("Claude", (Text("first"), Text("answer \n")))]
    first = anthropic_messages(said, "Claude", cache)
    assert first[-1]["content"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "answer"}]
    later = said + [CompiledMessage("user", (Text("more"),))]
    assert anthropic_messages(later, "Claude", cache) == to_anthropic_messages(later, "Claude")


@settings(max_examples=EXAMPLES)
@given(data=st.data(), first=st.lists(messages, min_size=20, max_size=60), assistant=assistants)
def test_a_long_run_of_one_role_cut_at_the_front_equals_a_body_made_afresh(
    data: st.DataObject, first: list[CompiledMessage], assistant: Any
) -> None:
    """P14: a turn merging a long run of one role whose front the budget cut is taken as a slice of
    its content (its markers and ours less the cut parts'), and the body equals one made afresh,
    with tool results, breakpoints and host markers anywhere in the run, cuts at a turn boundary
    and edits inside the run (an observer resident whose assistant seldom speaks)."""
    speaker = assistant if isinstance(assistant, str) else assistant[0]
    quiet = [attrs.evolve(m, participant="ann") if m.participant == speaker and data.draw(st.integers(0, 5))
             else m for m in first]
    cache = BodyCache()
    current = quiet
    for _ in range(data.draw(st.integers(1, 6))):
        assert anthropic_messages(current, assistant, cache) == to_anthropic_messages(current, assistant)
        # The front cut by a few, or just past the first of the speaker's messages (a turn boundary).
        spoken = next((k + 1 for k, m in enumerate(current) if m.participant == speaker), 1)
        current = current[data.draw(st.sampled_from([1, 2, 4, spoken])):] + data.draw(st.lists(messages, max_size=2))
        if current and data.draw(st.booleans()):  # a message inside the run edited
            at = data.draw(st.integers(0, len(current) - 1))
            current[at] = attrs.evolve(current[at], content=(Text(f"edited {at}"),))
    assert anthropic_messages(current, assistant, cache) == to_anthropic_messages(current, assistant)


@pytest.mark.parametrize("then", ["an edit", "an edit and a reply"])
def test_a_front_cut_at_a_turn_boundary_before_a_long_run_leaves_no_empty_turn(then: str) -> None:
    """P14, P8: the budget cuts the window exactly where the assistant's turn ended, and the long
    user run after it is no longer the last body's turn whole (a message in it edited): the body is
    that run's turn, as made afresh, with no emptied assistant turn before it."""
    def said(who: str, text: str) -> CompiledMessage:
        return CompiledMessage(who, (Text(text),))

    users = [said("user", f"user {k}") for k in range(30)]
    cache = BodyCache()
    anthropic_messages([said("Claude", "the assistant says"), *users], "Claude", cache)
    later = users[:25] + [said("user", "user 25, edited")] + users[26:]
    if then == "an edit and a reply":
        later.append(said("Claude", "a reply"))
    assert anthropic_messages(later, "Claude", cache) == to_anthropic_messages(later, "Claude")
