"""The refusal ladder, the quarantine alarm and the compression request's knobs (T12, T13, T15).

Strategy planning (``next_unit``, ``request_for``, ``apply_unit``) is driven as plain code over
``ctxrt.testing.PlainContext`` (the drain's one model call per rung is one ``request_for`` and one
``apply_unit`` here); what crosses the runtime (the alarm on ``subscribe``, the stored rung
across a restart, the unit spans) goes through the public API over a real LMDB store with a
``ScriptedModel`` and a ``trio.fail_after`` guard.

Token arithmetic: ``say(i)`` is 29 characters, 10 tokens, and carries the marker ``<m{i:05d}>``,
so a request's markers tell what it read. ``config()``: a head window of messages 1-2, then
chunks of four (c-0 is messages 3-6, c-1 7-10, ...), no recent window, no holdback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import ctxrt
from ctxrt import ModelError, ModelRequest, ModelResponse, Text, ToolUse, Unit, Usage, tracing
from ctxrt.testing import PlainContext, ScriptedModel

GUARD_S = 20
MODEL = "model-x"
NS = "diary"
MARK = re.compile(r"<m(\d{5})>")
TOOLS = ({"name": "lookup", "input_schema": {"type": "object", "properties": {}}},)
REFUSED = ModelResponse((Text("I can't help with that."),), "refusal", Usage(1, 1))
TOOL_CALL = ModelResponse((ToolUse("t1", "lookup", {}),), "tool_use", Usage(1, 1))
EMPTY = ModelResponse((), "end_turn", Usage(1, 0))
# What docs/api.md says: the plain-text rung's line, the bundled system text, the failures that quarantine.
PLAIN_TEXT = "Write the memory as plain text directly in your response — do not call any tools for this."
SYSTEM = "You are forming autobiographical memories of a conversation."
MAX_ATTEMPTS = 3


def say(i: int) -> str:
    return f"<m{i:05d}> we talked it over".ljust(29, ".")


def msg(i: int, *blocks: Any) -> ctxrt.Message:
    return ctxrt.Message(id=str(i), sequence=i, participant="user", content=blocks or (Text(say(i)),),
                         metadata=None, timestamp_ms=1_000 * i, caused_by=())


def config(**overrides: Any) -> ctxrt.Autobiographical:
    options: dict[str, Any] = {"target_chunk_tokens": 40, "head_window_tokens": 20, "recent_window_tokens": 0,
                               "l1_holdback_chunks": 0, "summary_target_tokens": 50}
    return ctxrt.Autobiographical(MODEL, **(options | overrides))


def answer(text: str) -> ModelResponse:
    return ModelResponse((Text(text),), "end_turn", Usage(1, 1))


def text_of(request: ModelRequest) -> str:
    return "\n".join(b.text for m in request.messages for b in m.content if isinstance(b, Text))


def markers(request: ModelRequest) -> list[int]:
    return sorted({int(found) for found in MARK.findall(text_of(request))})


def planned(count: int, conf: ctxrt.Autobiographical | None = None, *, tools: bool = True,
            reader: str | None = None, messages: list[ctxrt.Message] | None = None,
            ) -> tuple[Any, PlainContext]:
    ctx = PlainContext(messages if messages is not None else [msg(i) for i in range(1, count + 1)], reader=reader)
    ctx.tools = TOOLS if tools else ()
    strategy = (conf or config()).create()
    strategy.initialize(ctx)
    return strategy, ctx


def step(strategy: Any, ctx: PlainContext, reply: Callable[[ModelRequest], Any] | Any,
         ) -> tuple[Unit, ModelRequest, Any]:
    """One call of the drain: plan the next unit, raise the floor, build its request, apply the reply."""
    unit = strategy.next_unit(ctx)
    assert unit is not None
    ctx.mark_compression_read(unit.reaches)
    request = strategy.request_for(unit, ctx)
    outcome = reply(request) if callable(reply) else reply
    outcome = answer(outcome) if isinstance(outcome, str) else outcome
    assert strategy.apply_unit(unit, outcome, ctx) is True
    return unit, request, strategy.unit_outcome(unit)


# -- the ladder (T12) ------------------------------------------------------------------------


def test_each_rung_is_tried_in_order_and_recorded_then_the_spent_ladder_counts_one_failure() -> None:
    """T12: a refused reply sends the unit down the ladder one rung per request, each rung asking
    less (plain text; no tools; the chunk alone; its first half), each recorded in the unit's
    outcome; when the last rung is refused too, that counts one failure and the next attempt
    starts again from the full request."""
    strategy, ctx = planned(12, config(refusal_fallbacks=4))
    seen = [step(strategy, ctx, REFUSED) for _ in range(5)]
    requests = [request for _, request, _ in seen]
    assert [(o.rung, o.result, o.next_rung) for _, _, o in seen] == [
        ("full", "fallback", "plain_text"), ("plain_text", "fallback", "no_tools"),
        ("no_tools", "fallback", "source_only"), ("source_only", "fallback", "split"), ("split", "failure", None)]
    assert {unit.key for unit, _, _ in seen} == {"c-0"}
    assert [o.failure for _, _, o in seen] == ["refusal"] * 5
    assert [PLAIN_TEXT in text_of(r) for r in requests] == [False, True, True, True, True]
    assert [bool(r.tools) for r in requests] == [True, True, False, False, False]
    assert [markers(r) for r in requests] == [[1, 2, 3, 4, 5, 6]] * 3 + [[3, 4, 5, 6], [3, 4]]
    assert strategy.attempts == {"c-0": 1} and ctx.values["attempts"] == {"c-0": 1}
    _, again, outcome = step(strategy, ctx, answer("the memory"))
    assert again == requests[0] and outcome.rung == "full" and outcome.result == "summary"


@pytest.mark.parametrize("reply", [REFUSED, TOOL_CALL, EMPTY], ids=["refusal", "tool-call", "no-text"])
def test_a_tool_call_or_an_empty_reply_takes_the_ladder_as_a_refusal_does(reply: ModelResponse) -> None:
    """T12: a reply calling a tool, refused, or with no text takes the next rung, not an attempt."""
    strategy, ctx = planned(12)
    _, _, outcome = step(strategy, ctx, reply)
    assert outcome.result == "fallback" and outcome.next_rung == "plain_text"
    assert outcome.failure == {"refusal": "refusal", "tool_use": "tool_use", "end_turn": "no text"}[reply.stop_reason]
    assert strategy.attempts == {}


@pytest.mark.parametrize("rung", range(5))
def test_a_success_at_any_rung_becomes_the_summary(rung: int) -> None:
    """T12: whichever rung is answered, its reply is the chunk's summary; a split's two halves are
    stitched into one summary of the whole chunk; the ladder and attempts are left clean."""
    strategy, ctx = planned(12, config(refusal_fallbacks=4))
    for _ in range(rung):
        step(strategy, ctx, REFUSED)
    halves = iter(["the first half", "the second half"])
    while "summaries" not in ctx.logs:
        step(strategy, ctx, answer(next(halves)))
    [summary] = ctx.logs["summaries"]
    assert summary["source_ids"] == ["3", "4", "5", "6"] and summary["level"] == 1
    assert summary["content"] == ("the first half\n\nthe second half" if rung == 4 else "the first half")
    assert strategy.attempts == {} and strategy.ladder == {} and ctx.values.get("ladder", {}) == {}


def test_the_ladder_is_bounded_by_refusal_fallbacks_and_skips_a_rung_that_changes_nothing() -> None:
    """T12: at most ``refusal_fallbacks`` rungs per attempt; a rung that would change nothing (no
    tools to drop, no head or recall to leave out) is skipped, uncounted; 0 turns the ladder off;
    after MAX_ATTEMPTS spent ladders the chunk is quarantined."""
    strategy, ctx = planned(8, config(head_window_tokens=0, refusal_fallbacks=3), tools=False)
    rungs = [step(strategy, ctx, REFUSED)[2].rung for _ in range(3 * MAX_ATTEMPTS)]
    assert rungs == ["full", "plain_text", "split"] * MAX_ATTEMPTS
    assert strategy.quarantined() == ["c-0"]
    strategy, ctx = planned(8, config(refusal_fallbacks=0))
    assert [step(strategy, ctx, REFUSED)[2].result for _ in range(MAX_ATTEMPTS)] == ["failure"] * MAX_ATTEMPTS
    assert strategy.quarantined() == ["c-0"]


def test_a_transient_error_keeps_the_back_off_and_not_the_ladder() -> None:
    """T12, L2: a retryable model error leaves the unit at its rung, uncounted, and backs off."""
    strategy, ctx = planned(12)
    step(strategy, ctx, REFUSED)
    unit = strategy.next_unit(ctx)
    assert unit is not None
    assert strategy.apply_unit(unit, ModelError("overloaded", retryable=True), ctx) is False
    outcome = strategy.unit_outcome(unit)
    assert outcome is not None and outcome.result == "transient" and outcome.rung == "plain_text"
    assert strategy.attempts == {} and strategy.wake_at() is not None
    assert PLAIN_TEXT in text_of(strategy.request_for(unit, ctx))


def test_a_split_rungs_requests_read_nothing_after_their_half() -> None:
    """T12, T4: on the split rung the first half's request reads the chunk's older half alone, the
    second half's its newer half alone; a merge group splits the same way."""
    strategy, ctx = planned(12, config(refusal_fallbacks=4))
    for _ in range(4):
        step(strategy, ctx, REFUSED)
    _, first, outcome = step(strategy, ctx, answer("first"))
    assert markers(first) == [3, 4] and outcome.result == "half" and outcome.half == 1
    _, second, outcome = step(strategy, ctx, answer("second"))
    assert markers(second) == [5, 6] and outcome.result == "summary" and outcome.half == 2
    assert "first" not in text_of(second)

    strategy, ctx = planned(20, config(refusal_fallbacks=4, merge_threshold=4))
    for _ in range(4):  # four L1s, each naming its chunk's markers
        step(strategy, ctx, lambda request: f"memory {markers(request)[-4:]}")
    requests = []
    while len(ctx.logs["summaries"]) == 4:
        unit, request, outcome = step(strategy, ctx, lambda request: REFUSED if len(requests) < 3 else "merged")
        requests.append(request)
        assert "," in unit.key  # the merge group
    assert outcome.rung == "split" and len(requests) == 5  # full, plain text, no tools, two halves
    first_half, second_half = requests[-2:]
    assert "[3, 4, 5, 6]" in text_of(first_half) and "[15, 16, 17, 18]" not in text_of(first_half)
    assert "[15, 16, 17, 18]" in text_of(second_half) and "[3, 4, 5, 6]" not in text_of(second_half)
    assert ctx.logs["summaries"][-1]["level"] == 2 and ctx.logs["summaries"][-1]["content"] == "merged\n\nmerged"


def test_with_a_reader_no_ladder_request_holds_another_readers_block() -> None:
    """T12, A1: every rung's request (split halves and recall pairs included) is built from the
    reader's view: a block for another reader is never in it."""
    secret = "SECRET for bob only"
    messages = [msg(i, Text(say(i)), Text(secret, audience=("bob",))) if i % 3 == 0 else msg(i)
                for i in range(1, 17)]
    strategy, ctx = planned(0, config(refusal_fallbacks=4), reader="ann", messages=messages)
    requests: list[ModelRequest] = []
    step(strategy, ctx, answer("an earlier memory"))  # c-0 summarised: c-1's requests recall it
    while len(ctx.logs["summaries"]) < 2:
        requests.append(step(strategy, ctx, REFUSED if len(requests) < 4 else answer("half"))[1])
    assert len(requests) == 6 and any("[Recall" in text_of(r) for r in requests)
    assert all(secret not in text_of(r) and "bob" not in text_of(r) for r in requests)


def test_the_rung_is_stored_with_the_attempts_and_survives_a_restart() -> None:
    """T12: where a unit stands on its ladder, a split's first half included, is stored beside its
    attempts: a strategy started again from the store resumes the ladder where it was."""
    strategy, ctx = planned(12, config(refusal_fallbacks=4))
    for _ in range(2):
        step(strategy, ctx, REFUSED)
    unit = strategy.next_unit(ctx)
    assert unit is not None
    before = strategy.request_for(unit, ctx)
    restarted = config(refusal_fallbacks=4).create()
    restarted.initialize(ctx)
    _, after, outcome = step(restarted, ctx, REFUSED)
    assert after == before and outcome.rung == "no_tools"
    step(restarted, ctx, REFUSED)
    step(restarted, ctx, answer("first"))  # the split's first half
    again = config(refusal_fallbacks=4).create()
    again.initialize(ctx)
    _, second, _ = step(again, ctx, answer("second"))
    assert markers(second) == [5, 6]
    assert ctx.logs["summaries"][0]["content"] == "first\n\nsecond"


@pytest.mark.parametrize("garbled", [
    {"rung": "plain_text", "taken": "x"},
    {"rung": "plain_text", "taken": -100},
    {"rung": "split", "taken": 1, "first_half": 7},
    {"rung": "split", "taken": 1, "first_half": {"a": 1}},
    {"rung": "plain_text", "taken": 1, "first_half": "not a split's"},
    {"rung": "plain_text", "taken": 1, "failure": 5},
    {"rung": "plain_text", "taken": 1, "extra": 1},
], ids=["taken-text", "taken-negative", "half-int", "half-dict", "half-off-split", "failure-int", "extra-field"])
def test_a_garbled_ladder_step_is_logged_and_its_unit_starts_from_the_full_request(
        garbled: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """T12: a stored ladder step this version can't read, field by field, is logged at ERROR naming
    the namespace, branch and unit, and ignored: the unit's next request is the full one and no
    stored value reaches a request or a summary."""
    strategy, ctx = planned(12)
    step(strategy, ctx, REFUSED)
    ctx.values["ladder"] = {"c-0": garbled}
    restarted = config().create()
    with caplog.at_level(logging.ERROR, logger="ctxrt.autobiographical"):
        restarted.initialize(ctx)
    [logged] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "'c-0'" in logged and "namespace 'default' on branch 'main'" in logged
    unit, request, outcome = step(restarted, ctx, answer("the memory"))
    assert unit.key == "c-0" and outcome.rung == "full" and PLAIN_TEXT not in text_of(request)
    assert ctx.logs["summaries"][0]["content"] == "the memory"


async def test_a_restarted_runtime_resumes_the_ladder(tmp_path: Path) -> None:
    """T12: the rung reached is stored with the namespace: after a restart the unit's next request
    is the next rung's, not the full request again."""
    replies = [REFUSED]
    model = ScriptedModel(lambda request: replies.pop(0) if replies else "the memory")
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=config())
            for i in range(1, 9):
                await m.add_message("user", say(i))
            assert await m.tick()
            assert await m.search_summaries() == []
        async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=config())
            assert await m.tick()
            [match] = await m.search_summaries()
    assert match.summary.content == "the memory"
    first, second = model.requests
    assert PLAIN_TEXT not in text_of(first) and PLAIN_TEXT in text_of(second)


# -- the quarantine alarm (T13) ---------------------------------------------------------------


async def test_a_quarantine_raises_one_alarm_for_subscribers_who_ask(tmp_path: Path) -> None:
    """T13: a unit whose ladders are spent MAX_ATTEMPTS times is quarantined (``health()`` says so,
    its messages stay raw) and ``subscribe(alarms=True)`` delivers one ``QuarantineAlarm`` naming
    it; a plain ``subscribe()`` keeps to message events."""
    model = ScriptedModel(lambda request: REFUSED)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
            m = await rt.open(NS, view_reader="ann", strategy=config(head_window_tokens=0, refusal_fallbacks=2))
            async with m.subscribe(alarms=True) as alarmed, m.subscribe() as plain:
                for i in range(1, 5):
                    await m.add_message("user", say(i))
                while not (await m.health()).quarantined:
                    assert await m.tick()
                await m.add_message("user", "after the quarantine")  # every event before it has arrived
                seen = [await alarmed.receive() for _ in range(6)]
                heard = [await plain.receive() for _ in range(5)]
            assert (await m.health()).quarantined == ("c-0",)
    alarms = [event for event in seen if isinstance(event, ctxrt.QuarantineAlarm)]
    assert alarms == [ctxrt.QuarantineAlarm(NS, "main", "c-0", MAX_ATTEMPTS, "split", "refusal")]
    assert isinstance(seen[-1], ctxrt.Added) and seen[-1].message.content == (Text("after the quarantine"),)
    assert all(isinstance(event, ctxrt.Added) for event in heard)
    assert len(model.requests) == MAX_ATTEMPTS * 3  # the full request and two rungs, per attempt


async def test_each_rung_is_a_unit_span_attribute(tmp_path: Path) -> None:
    """T12: each model call's unit span records the rung it was made at and what came of it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    replies = [REFUSED, TOOL_CALL]
    model = ScriptedModel(lambda request: replies.pop(0) if replies else "the memory")
    tracing.configure(tracer_provider=provider)
    try:
        with trio.fail_after(GUARD_S):
            async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
                m = await rt.open(NS, strategy=config())
                m.set_tool_definitions(list(TOOLS))
                for i in range(1, 9):
                    await m.add_message("user", say(i))
                for _ in range(3):
                    assert await m.tick()
    finally:
        tracing.configure()
    spans = [dict(s.attributes or {}) for s in exporter.get_finished_spans() if s.name == "ctxrt.compression_unit"]
    assert [(s["ctxrt.unit.rung"], s["ctxrt.unit.result"], s.get("ctxrt.unit.failure")) for s in spans] == [
        ("full", "fallback", "refusal"), ("plain_text", "fallback", "tool_use"), ("no_tools", "summary", None)]
    assert [s["ctxrt.unit.outcome"] for s in spans] == ["applied"] * 3
    assert not model.requests[2].tools


# -- the knobs (T15) --------------------------------------------------------------------------


def l1_request(conf: ctxrt.Autobiographical, *, summaries: int = 0, system_prompt: str | None = None,
               ) -> ModelRequest:
    """The next L1 request after ``summaries`` chunks were summarised (each memory names its chunk)."""
    strategy, ctx = planned(4 * summaries + 8, conf)
    ctx.system_prompt = system_prompt
    for _ in range(summaries):
        step(strategy, ctx, lambda request: f"memory of {markers(request)[-4:]}".ljust(145, "."))
    unit = strategy.next_unit(ctx)
    assert unit is not None
    return strategy.request_for(unit, ctx)


def recall_count(request: ModelRequest) -> int:
    return text_of(request).count("[Recall ")


def test_compression_max_tokens_changes_only_the_requests_max_tokens() -> None:
    """T15: ``compression_max_tokens`` is the request's ``max_tokens``; None keeps 1.5 x the summary target."""
    plain, capped = l1_request(config()), l1_request(config(compression_max_tokens=900))
    assert plain.max_tokens == 75 and capped.max_tokens == 900
    assert attrs.evolve(capped, max_tokens=plain.max_tokens) == plain


def test_summary_system_prompt_stands_in_only_where_the_namespace_has_none() -> None:
    """T15: ``summary_system_prompt`` replaces the bundled system text; a namespace's own system
    prompt still comes first (the request stays the agent's prefix); nothing else changes."""
    mine = "You keep the ship's log."
    plain, knobbed = l1_request(config()), l1_request(config(summary_system_prompt=mine))
    assert plain.system == SYSTEM and knobbed.system == mine
    assert attrs.evolve(knobbed, system=plain.system) == plain
    own = l1_request(config(summary_system_prompt=mine), system_prompt="You are Ann.")
    assert own.system == "You are Ann."


@pytest.mark.parametrize("prompt", ["Recall this:\n{content}\nKeep the names.", "Keep the names."])
def test_summary_user_prompt_replaces_only_the_ask_around_the_transcript(prompt: str) -> None:
    """T15: ``summary_user_prompt`` is the chunk's ask, ``{content}`` the chunk's transcript (a prompt
    without it follows the transcript); the head, recall pairs, system and limits are unchanged."""
    plain, knobbed = l1_request(config(), summaries=1), l1_request(config(summary_user_prompt=prompt), summaries=1)
    assert knobbed.messages[:-1] == plain.messages[:-1]
    assert attrs.evolve(knobbed, messages=plain.messages) == plain
    ask = "\n".join(b.text for b in knobbed.messages[-1].content if isinstance(b, Text))
    transcript = ask[ask.index("<earlier_in_conversation>"):ask.index("</earlier_in_conversation>")]
    assert markers(attrs.evolve(plain, messages=plain.messages[-1:])) == [int(n) for n in MARK.findall(transcript)]
    if "{content}" in prompt:
        assert ask.startswith("Recall this:\n<earlier_in_conversation>") and ask.endswith("Keep the names.")
    else:
        assert ask.startswith("<earlier_in_conversation>") and ask.endswith("</earlier_in_conversation>\n\nKeep the names.")
    assert "We are ready to form a long-term memory" not in ask


def test_recall_budget_tokens_caps_only_the_recall_pairs_newest_first() -> None:
    """T15: ``recall_budget_tokens`` keeps the newest recall pairs that fit (each its summary's
    tokens and 50 more); None recalls them all as before."""
    plain = l1_request(config(merge_threshold=100), summaries=4)
    capped = l1_request(config(merge_threshold=100, recall_budget_tokens=2 * (50 + 50)), summaries=4)
    assert recall_count(plain) == 4 and recall_count(capped) == 2
    recalled = [text for text in (m.content[0].text for m in capped.messages if isinstance(m.content[0], Text))
                if text.startswith("[Recall ")]
    assert recalled == ["[Recall L1-2]", "[Recall L1-3]"]
    kept = plain.messages[:2] + plain.messages[-5:]  # the head pair, the two newest recall pairs, the chunk
    assert attrs.evolve(plain, messages=kept) == capped

