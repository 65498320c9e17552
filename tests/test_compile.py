"""ctxrt.compile: splitting, tool pairing, injections, cache breakpoints, provenance, the Anthropic form."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from ctxrt.compile.breakpoints import apply_cache_breakpoints
from ctxrt.compile.pipeline import build_compile_result
from ctxrt import (
    Budget,
    CompileResult,
    CompiledMessage,
    Entry,
    Image,
    Injection,
    Message,
    MessageInjection,
    PreviewResult,
    Provenance,
    RedactedThinking,
    Source,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
)
from ctxrt.errors import EmptyRequestError, MalformedContentError
from ctxrt.compile.injections import place_injections, refuse_audience_in_injections, validate_injections
from ctxrt.compile.provenance import coverage_complete
from ctxrt.compile.tool_pairing import repair_tool_pairing, split_mixed_tool_messages
from ctxrt.testing import to_anthropic_messages

USE_A = ToolUse("a", "search", {"q": "x"})
RESULT_A = ToolResult("a", "found")
USE_B = ToolUse("b", "fetch", {"url": "u"})
RESULT_B = ToolResult("b", "page")


def cm(participant: str, *blocks: Any, bp: bool = False) -> CompiledMessage:
    return CompiledMessage(participant, tuple(Text(b) if isinstance(b, str) else b for b in blocks), cache_breakpoint=bp)


def texts(messages: list[CompiledMessage]) -> list[tuple[str, str]]:
    return [(m.participant, " ".join(b.text for b in m.content if isinstance(b, Text))) for m in messages]


def build(entries: list[Entry], bodies: dict[str, Message] | None = None, **kwargs: Any) -> CompileResult:
    bodies = bodies or {}
    return build_compile_result(
        entries, namespace="ns", branch="main", reader=None, strategy_name="passthrough", lookup=bodies.get, **kwargs
    )


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


def test_budget_defaults_and_usable_tokens():
    """P2: strategies fit into max_tokens - reserve_for_response (100k and 4k by default)."""
    assert Budget().usable == 96_000
    assert Budget(5_000, 2_000).usable == 3_000


@pytest.mark.parametrize("kwargs", [{"max_tokens": -1}, {"reserve_for_response": True}, {"max_tokens": 1.5}])
def test_budget_refuses_non_integer_or_negative_values(kwargs):
    """P2: a budget is made of non-negative integers."""
    with pytest.raises(ValueError):
        Budget(**kwargs)


def test_injection_refuses_an_unknown_position():
    """P3: an injection's position is system, before_user or after_user."""
    with pytest.raises(ValueError):
        Injection("ns", "middle", "x")  # type: ignore[arg-type]


def test_message_injection_refuses_negative_depth():
    """P3: a message injection's depth counts messages from the end and can't be negative."""
    with pytest.raises(ValueError):
        MessageInjection("user", "x", depth=-1)


def test_preview_result_carries_its_figures():
    """P2: a preview reports fit, final and budget tokens, and head/tail/middle spend."""
    preview = PreviewResult(True, 10, 100, 1, 2, 7)
    assert (preview.fits, preview.head_tokens + preview.tail_tokens + preview.middle_tokens) == (True, 10)


# --------------------------------------------------------------------------------------------
# Splitting mixed tool messages (P4)
# --------------------------------------------------------------------------------------------


def test_mixed_message_splits_into_leading_results_and_following_parts():
    """P4: leading blocks stay with the participant, each tool_result run becomes "user", the rest goes back."""
    parts = split_mixed_tool_messages("Claude", (Text("t"), USE_A, RESULT_A, Text("then"), USE_B, RESULT_B))
    assert parts == [
        ("Claude", (Text("t"), USE_A)),
        ("user", (RESULT_A,)),
        ("Claude", (Text("then"), USE_B)),
        ("user", (RESULT_B,)),
    ]


def test_user_messages_and_messages_without_results_are_not_split():
    """P4: a "user" message (any case) or one with no tool_result stays whole."""
    assert split_mixed_tool_messages("User", (RESULT_A, Text("x"))) == [("User", (RESULT_A, Text("x")))]
    assert split_mixed_tool_messages("Claude", (Text("x"), USE_A)) == [("Claude", (Text("x"), USE_A))]


def test_message_of_only_results_becomes_one_user_message():
    """P4: a non-user message holding only tool_results becomes a single "user" message."""
    assert split_mixed_tool_messages("Claude", (RESULT_A, RESULT_B)) == [("user", (RESULT_A, RESULT_B))]


# --------------------------------------------------------------------------------------------
# Tool pairing (P4)
# --------------------------------------------------------------------------------------------


def test_paired_tool_cycle_is_kept():
    """P4: a tool_use answered in the next message, and that answer, both stay."""
    messages = [cm("user", "go"), cm("Claude", "ok", USE_A), cm("user", RESULT_A)]
    assert repair_tool_pairing(messages) == messages


def test_trailing_orphan_tool_use_is_dropped_but_its_text_kept():
    """P4: a tool_use with no answer in the next message is dropped; its message keeps the rest."""
    assert repair_tool_pairing([cm("user", "go"), cm("Claude", "ok", USE_A)]) == [cm("user", "go"), cm("Claude", "ok")]


def test_leading_orphan_tool_result_and_its_emptied_message_are_dropped():
    """P4: a tool_result whose tool_use isn't in the previous message is dropped; an emptied message goes too."""
    assert repair_tool_pairing([cm("user", RESULT_A), cm("Claude", "hi")]) == [cm("Claude", "hi")]


def test_answer_that_is_not_in_the_immediately_next_message_breaks_the_pair():
    """P4: a tool_use and a tool_result one message apart are both orphans."""
    messages = [cm("Claude", USE_A), cm("user", "interjection"), cm("user", RESULT_A)]
    assert repair_tool_pairing(messages) == [cm("user", "interjection")]


def test_dropped_message_passes_its_cache_breakpoint_back():
    """P5: a breakpoint on a message emptied by pairing repair moves to the message before it."""
    messages = [cm("user", "head"), cm("Claude", USE_B, bp=True)]
    assert repair_tool_pairing(messages) == [cm("user", "head", bp=True)]


# --------------------------------------------------------------------------------------------
# Cache breakpoints (P5)
# --------------------------------------------------------------------------------------------


def test_at_most_three_breakpoints_keeping_the_head_end_and_the_latest():
    """P5: of five requested breakpoints, the first (head end) and the last two are kept."""
    messages = [cm("user", str(i), bp=i % 2 == 0) for i in range(10)]  # 0, 2, 4, 6, 8
    kept = [i for i, m in enumerate(apply_cache_breakpoints(messages)) if m.cache_breakpoint]
    assert kept == [0, 6, 8]


def test_three_or_fewer_breakpoints_are_left_alone():
    """P5: up to three breakpoints pass unchanged."""
    messages = [cm("user", "a", bp=True), cm("Claude", "b"), cm("user", "c", bp=True)]
    assert apply_cache_breakpoints(messages) == messages


def test_breakpoint_on_a_split_entry_goes_on_its_last_part():
    """P5: a cache marker on an entry that splits lands on the entry's last compiled part."""
    entry = Entry("Claude", (Text("t"), USE_A, RESULT_A, Text("after")), ("5",), cache_marker=True)
    result = build([Entry("user", (Text("q"),), ("4",)), entry])
    assert [(m.participant, m.cache_breakpoint) for m in result.messages] == [
        ("user", False),
        ("Claude", False),
        ("user", False),
        ("Claude", True),
    ]


# --------------------------------------------------------------------------------------------
# Injections (P3, B4)
# --------------------------------------------------------------------------------------------

CONVERSATION = [cm("user", "u1"), cm("Claude", "c1"), cm("User", "u2"), cm("Claude", "c2")]


def test_injections_are_placed_around_the_last_user_message():
    """P3: before_user goes before the last "user" message (case-insensitive), after_user after it, order kept."""
    out, system = place_injections(
        CONVERSATION,
        [
            Injection("a", "after_user", "after 1"),
            Injection("b", "before_user", "before 1"),
            Injection("c", "system", "sys"),
            Injection("d", "before_user", "before 2"),
            Injection("e", "after_user", "after 2"),
        ],
    )
    assert texts(out) == [
        ("user", "u1"),
        ("Claude", "c1"),
        ("system_context:b", "before 1"),
        ("system_context:d", "before 2"),
        ("User", "u2"),
        ("system_context:a", "after 1"),
        ("system_context:e", "after 2"),
        ("Claude", "c2"),
    ]
    assert system == [Text("sys")]


def test_without_a_user_message_before_user_is_dropped_and_after_user_goes_last():
    """P3: with no user message, before_user injections vanish and after_user ones go at the end."""
    out, _ = place_injections(
        [cm("Claude", "c1")], [Injection("a", "before_user", "gone"), Injection("b", "after_user", "end")]
    )
    assert texts(out) == [("Claude", "c1"), ("system_context:b", "end")]


@pytest.mark.parametrize(("depth", "index"), [(0, 4), (1, 3), (4, 0), (99, 0)])
def test_message_injection_lands_depth_messages_from_the_end(depth, index):
    """P3: a message injection at depth d sits before the last d messages (at the start if d is too large)."""
    out, _ = place_injections(CONVERSATION, (), [MessageInjection("Host", "note", depth=depth)])
    assert out[index] == cm("Host", "note")
    assert [m for m in out if m.participant != "Host"] == CONVERSATION


def test_injection_at_the_user_message_keeps_after_user_next_to_it():
    """P3: an after_user injection hugs the user message it follows, ahead of a depth-0 message injection."""
    conversation = [cm("Claude", "c"), cm("user", "u")]
    out, _ = place_injections(conversation, [Injection("n", "after_user", "a")], [MessageInjection("Host", "m")])
    assert texts(out) == [("Claude", "c"), ("user", "u"), ("system_context:n", "a"), ("Host", "m")]


def test_audience_in_an_injection_is_refused_naming_the_place():
    """B4: an Injection or MessageInjection carrying an audience is refused with the injected block's path."""
    with pytest.raises(MalformedContentError) as info:
        refuse_audience_in_injections(
            [Injection("a", "system", "ok"), Injection("b", "after_user", [Text("x"), Text("y", audience=("bob",))])], ()
        )
    assert info.value.path == "injections[1].content[1]"
    nested = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r", "audience": ["bob"]}]}
    with pytest.raises(MalformedContentError) as info:
        refuse_audience_in_injections((), [MessageInjection("user", [nested])])
    assert info.value.path == "message_injections[0].content[0].content[0]"


def test_injections_without_audience_pass_the_check():
    """B4: injections without an audience are placed normally."""
    validate_injections([Injection("a", "before_user", "x")], [MessageInjection("user", [{"type": "text", "text": "y"}])])
    result = build([Entry("user", (Text("q"),), ("1",))], injections=[Injection("a", "before_user", "x")])
    assert texts(result.messages) == [("system_context:a", "x"), ("user", "q")]


def test_compile_with_an_audience_in_an_injection_is_refused():
    """B4: build_compile_result refuses an injection audience before placing anything."""
    with pytest.raises(MalformedContentError) as info:
        build([Entry("user", (Text("q"),))], message_injections=[MessageInjection("user", [Text("s", audience=("x",))])])
    assert info.value.path == "message_injections[0].content[0]"


@pytest.mark.parametrize(
    ("injections", "message_injections", "path"),
    [
        ([Injection("a", "system", [{"type": "image", "source": {"type": "url", "url": "https://x"}}])], [], "injections[0].content[0]"),
        ([Injection("a", "after_user", [{"type": "txt"}])], [], "injections[0].content[0].type"),
        ([], [MessageInjection("", "x")], "message_injections[0].participant"),
        ([], [MessageInjection("user", [])], "message_injections[0].content"),
    ],
)
def test_malformed_injections_are_refused_naming_the_place(injections, message_injections, path):
    """B4/M6: malformed injected content (or a non-text system injection) is refused with its path."""
    with pytest.raises(MalformedContentError) as info:
        validate_injections(injections, message_injections)
    assert info.value.path == path


# --------------------------------------------------------------------------------------------
# Coverage and provenance (P6)
# --------------------------------------------------------------------------------------------


def test_coverage_text_may_be_prefixed_but_not_altered():
    """P6: a rendered text containing the stored text covers it; an altered one doesn't."""
    stored = (Text("hello"),)
    assert coverage_complete((Text("[Alice] hello"),), stored)
    assert not coverage_complete((Text("hell"),), stored)


def test_coverage_media_and_tool_blocks_must_match_exactly():
    """P6: media by exact source, tool blocks by id, name and input, thinking byte for byte."""
    image = Image({"type": "base64", "media_type": "image/png", "data": "AAAA"})
    stored = (image, USE_A, Thinking("t", "s"))
    assert coverage_complete((image, USE_A, Thinking("t", "s")), stored)
    assert not coverage_complete((Image({**image.source, "data": "AAAB"}), USE_A, Thinking("t", "s")), stored)
    assert not coverage_complete((image, ToolUse("a", "search", {"q": "y"}), Thinking("t", "s")), stored)
    assert not coverage_complete((image, USE_A, Thinking("t", "other")), stored)


def test_coverage_follows_order_and_ignores_empty_stored_text():
    """P6: stored blocks are covered in order; empty stored text needs no cover."""
    assert coverage_complete((Text("a"), USE_A), (Text(""), Text("a"), USE_A))
    assert not coverage_complete((USE_A, Text("a")), (Text("a"), USE_A))
    assert coverage_complete((Text("one two"),), (Text("one"), Text("two")))


def test_coverage_of_tool_results_looks_inside_their_content():
    """P6: a tool_result is covered by one with the same id and covering content."""
    stored = (ToolResult("a", (Text("r"), Image({"type": "url", "url": "https://x"}))),)
    assert coverage_complete(stored, stored)
    assert not coverage_complete((ToolResult("a", (Text("r"),)),), stored)


def test_provenance_lists_sources_raw_bodies_and_completeness():
    """P6: each compiled message lists its sources; raw bodies come from lookup; completeness is judged on what was rendered."""
    bodies = {
        "1": Message("1", 1, "user", (Text("question"),)),
        "2": Message("2", 2, "Claude", (Text("full answer"),)),
    }
    entries = [
        Entry("user", (Text("question"),), ("1",)),
        Entry("Claude", (Text("full ans"),), ("2",)),
        Entry("Claude", (Text("summary"),), ("1", "2"), relation="derived", summary_ids=("s1",)),
        Entry("Claude", (Text("gone"),), ("9",)),
    ]
    result = build(entries, bodies, injections=[Injection("tools", "after_user", "note")], compile_id="c-1")
    provenance = result.provenance
    assert isinstance(provenance, Provenance)
    assert (provenance.compile_id, provenance.namespace, provenance.branch, provenance.strategy) == ("c-1", "ns", "main", "passthrough")
    assert provenance.messages == (
        (Source("message", "1", True),),
        (Source("injection", "tools"),),
        (Source("message", "2", False),),
        (Source("message", "1"), Source("message", "2"), Source("summary", "s1")),
        (Source("message", "9", False),),
    )
    assert provenance.raw_bodies == {"1": bodies["1"], "2": bodies["2"]}
    assert provenance.completeness == {"1": True, "2": False, "9": False}


def test_every_part_of_a_split_entry_repeats_its_sources():
    """P6: a split entry's parts all list the entry's sources, and completeness sees all parts."""
    body = Message("7", 7, "Claude", (Text("t"), USE_A, RESULT_A))
    result = build([Entry("user", (Text("go"),), ("6",)), Entry("Claude", body.content, ("7",))], {"7": body})
    assert result.provenance.messages[1:] == ((Source("message", "7", True),), (Source("message", "7", True),))
    assert result.provenance.completeness["7"] is True


def test_compile_id_is_generated_when_not_given():
    """P6: every compile has a fresh id."""
    first = build([Entry("user", (Text("q"),))]).provenance.compile_id
    second = build([Entry("user", (Text("q"),))]).provenance.compile_id
    assert first and second and first != second


def test_empty_entries_are_skipped():
    """A3: an entry with no content compiles to no message."""
    result = build([Entry("user", ()), Entry("user", (Text("q"),), ("1",))])
    assert result.messages == [cm("user", "q")]
    assert result.provenance.messages == ((Source("message", "1", False),),)


def test_entry_with_an_audience_is_refused():
    """B3/A8: a compiled entry never carries an audience; one that does is refused naming the block."""
    with pytest.raises(MalformedContentError) as info:
        build([Entry("user", (Text("q"),)), Entry("user", (Text("x", audience=("bob",)),))])
    assert info.value.path == "entries[1].content[0]"


# --------------------------------------------------------------------------------------------
# Anthropic form (P7)
# --------------------------------------------------------------------------------------------

_REQUEST = TypeAdapter(MessageCreateParamsNonStreaming)


def _force(value: Any) -> Any:
    # pydantic validates the SDK's Iterable fields lazily: walking them runs the validation.
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ValidatorIterator":
        return [_force(v) for v in value]
    return value


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def assert_api_accepts(body: dict[str, Any]) -> None:
    """What messages.create checks: the SDK's own types, plus the rules its types can't express."""
    _force(_REQUEST.validate_python({**body, "model": "claude-sonnet-4-5", "max_tokens": 1024}))
    turns = body["messages"]
    assert turns and turns[0]["role"] == "user"
    assert all(a["role"] != b["role"] for a, b in zip(turns, turns[1:]))
    assert not _keys(turns) & {"audience", "raw"}
    assert sum(1 for turn in turns for b in turn["content"] if "cache_control" in b) <= 4
    for i, turn in enumerate(turns):
        content = turn["content"]
        assert content
        asked = {b["id"] for b in content if b["type"] == "tool_use"}
        if asked:
            assert turn["role"] == "assistant"
            answered = [b["tool_use_id"] for b in turns[i + 1]["content"] if b["type"] == "tool_result"]
            assert set(answered) >= asked
        results = [b for b in content if b["type"] == "tool_result"]
        if results:
            assert turn["role"] == "user"
            assert content[: len(results)] == results  # tool_results lead their turn
            assert {b["tool_use_id"] for b in results} <= {b["id"] for b in turns[i - 1]["content"] if b["type"] == "tool_use"}
        for block in content:
            if block["type"] == "text":
                assert block["text"].strip()


def test_roles_merge_and_breakpoints_become_cache_control_on_the_last_block():
    """P7: roles by assistant membership, same-role runs merged, a breakpoint marks its message's last block."""
    messages = [
        cm("user", "u1"),
        cm("Alice", "a1", bp=True),
        cm("Claude", "c1"),
        CompiledMessage("Claude", (Text("c2"), Thinking("t", "sig")), cache_breakpoint=True),
    ]
    assert to_anthropic_messages(messages, {"Claude"}) == [
        {"role": "user", "content": [{"type": "text", "text": "u1"}, {"type": "text", "text": "a1", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "c1"},
                {"type": "text", "text": "c2", "cache_control": {"type": "ephemeral"}},
                {"type": "thinking", "thinking": "t", "signature": "sig"},
            ],
        },
    ]


def test_host_cache_controls_give_way_to_breakpoints_past_the_provider_limit():
    """P5/P7: with host cache_control on stored text, a request still holds at most 4, keeping the compile's breakpoints."""
    host = {"type": "ephemeral"}
    messages = [CompiledMessage("user", (Text(f"h{i}", cache_control=host),)) for i in range(4)]
    messages += [cm("Claude", "c1", bp=True), cm("user", "u1", bp=True)]
    out = to_anthropic_messages(messages, {"Claude"})
    marked = [b["text"] for turn in out for b in turn["content"] if "cache_control" in b]
    assert marked == ["h2", "h3", "c1", "u1"]


def test_leading_assistant_turn_is_preceded_by_a_continued_user_turn():
    """P7: the request starts with a user turn even when the context starts with the assistant."""
    out = to_anthropic_messages([cm("Claude", "hi"), cm("user", "yo")], "Claude")
    assert out[0] == {"role": "user", "content": [{"type": "text", "text": "(continued)"}]}
    assert [t["role"] for t in out] == ["user", "assistant", "user"]


def test_blocks_the_api_refuses_are_left_out():
    """P7: blank text, unsigned thinking and thinking in a user turn are not sent; an emptied message drops out."""
    messages = [
        CompiledMessage("user", (Text("  "), Thinking("x", "s"), RedactedThinking("r"))),
        CompiledMessage("user", (Text("q"),)),
        CompiledMessage("Claude", (Thinking("unsigned"), Text("a"))),
    ]
    assert to_anthropic_messages(messages, ["Claude"]) == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
    ]


def test_injection_never_lands_between_a_tool_call_and_its_result():
    """P3/P4: a before_user or depth place inside a tool pair moves before the tool call, keeping the pair adjacent."""
    entries = [Entry("user", (Text("go"),)), Entry("Claude", (USE_A,)), Entry("user", (RESULT_A,))]
    result = build(
        entries,
        injections=[Injection("mem", "before_user", "remember")],
        message_injections=[MessageInjection("Claude", "aside", depth=1)],
    )
    assert [(m.participant, m.content) for m in result.messages] == [
        ("user", (Text("go"),)),
        ("Claude", (Text("aside"),)),
        ("system_context:mem", (Text("remember"),)),
        ("Claude", (USE_A,)),
        ("user", (RESULT_A,)),
    ]
    assert_api_accepts(result.to_anthropic(assistant="Claude"))


def test_tool_results_lead_their_user_turn():
    """P7: in a user turn, tool_result blocks come before any other block, as the API requires."""
    messages = [cm("Claude", USE_A), cm("Host", "note"), cm("user", RESULT_A, "thanks")]
    out = to_anthropic_messages(messages, {"Claude"})
    assert [b["type"] for b in out[-1]["content"]] == ["tool_result", "text", "text"]


def test_system_joins_the_host_prompt_and_system_injections():
    """P3/P7: "system" is the host's prompt and the system injections joined by blank lines, absent when neither is given."""
    result = build([Entry("user", (Text("q"),))], injections=[Injection("a", "system", "one"), Injection("b", "system", [Text("two")])])
    assert result.to_anthropic(assistant="Claude", system="base")["system"] == "base\n\none\n\ntwo"
    assert result.to_anthropic(assistant="Claude")["system"] == "one\n\ntwo"
    assert "system" not in build([Entry("user", (Text("q"),))]).to_anthropic(assistant="Claude")


def test_rich_compile_is_accepted_by_the_sdk_types():
    """P7: a compile with tool cycles, media, thinking, injections and breakpoints validates against the SDK's request types."""
    entries = [
        Entry("user", (Text("look at this"), Image({"type": "base64", "media_type": "image/png", "data": "AAAA"})), ("1",), cache_marker=True),
        Entry("Claude", (Thinking("plan", "sig"), Text("searching"), USE_A, RESULT_A, Text("and"), USE_B), ("2",)),
        Entry("user", (RESULT_B, Text("also this")), ("3",), cache_marker=True),
        Entry("Alice", (Text("I agree"),), ("4",)),
        Entry("Claude", (Text("summary of the middle"),), relation="derived", summary_ids=("s1",), cache_marker=True),
    ]
    result = build(
        entries,
        injections=[Injection("rag", "before_user", "ctx"), Injection("sys", "system", "rules")],
        message_injections=[MessageInjection("Host", "hint", depth=1)],
    )
    assert_api_accepts(result.to_anthropic(assistant=["Claude"], system="You are Claude."))


# A generated conversation: tool calls come from the assistant, answered in a user message or
# bundled into the assistant's own message; some messages are then evicted, leaving orphans.
_words = st.sampled_from(["alpha", "beta", "gamma", " ", "", "délta", "{json: 1}"])
_turn = st.one_of(
    st.tuples(st.just("say"), st.sampled_from(["user", "User", "Alice", "Claude"]), _words),
    st.tuples(st.just("call"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("think"), st.booleans(), _words),
)


def _entries(turns: list[tuple[Any, ...]]) -> list[Entry]:
    entries: list[Entry] = []
    for n, turn in enumerate(turns):
        if turn[0] == "say":
            entries.append(Entry(turn[1], (Text(turn[2]),), (str(n),)))
        elif turn[0] == "think":
            entries.append(Entry("Claude", (Thinking("reason", "sig" if turn[1] else None), Text(turn[2])), (str(n),)))
        else:
            uses = tuple(ToolUse(f"t{n}_{k}", "tool", {"k": k}) for k in range(turn[1]))
            results = tuple(ToolResult(u.id, "ok") for u in uses)
            if turn[2]:
                entries.append(Entry("Claude", uses + results + (Text("done"),), (str(n),)))
            else:
                entries.append(Entry("Claude", (Text("calling"),) + uses, (str(n),)))
                entries.append(Entry("user", results, (f"{n}r",)))
    return entries


@settings(max_examples=300, deadline=None)
@given(
    turns=st.lists(_turn, min_size=1, max_size=10),
    evict=st.sets(st.integers(0, 20), max_size=4),
    markers=st.sets(st.integers(0, 20), max_size=6),
    positions=st.lists(st.sampled_from(["system", "before_user", "after_user"]), max_size=3),
    depths=st.lists(st.tuples(st.sampled_from(["Host", "Claude", "user"]), st.integers(0, 6)), max_size=2),
)
def test_any_compiled_conversation_is_accepted_by_the_sdk_types(turns, evict, markers, positions, depths):
    """P4/P5/P7: whatever survives eviction, the request validates against the SDK and pairs every tool call."""
    entries = [
        Entry(e.participant, e.content, e.source_ids, cache_marker=i in markers)
        for i, e in enumerate(_entries(turns))
        if i not in evict
    ]
    result = build(
        entries,
        injections=[Injection(f"ns{i}", p, f"inject {i}") for i, p in enumerate(positions)],
        message_injections=[MessageInjection(p, f"note {i}", depth=d) for i, (p, d) in enumerate(depths)],
    )
    assert sum(m.cache_breakpoint for m in result.messages) <= 3
    assert len(result.provenance.messages) == len(result.messages)
    try:
        body = result.to_anthropic(assistant="Claude", strict=True)
    except EmptyRequestError:  # P8: nothing to send is refused, never sent as messages: []
        assert not to_anthropic_messages(result.messages, "Claude")
        return
    assert_api_accepts(body)


def test_another_residents_tool_cycle_is_shown_as_text_so_the_request_stays_valid():
    """P7: the API takes tool_use only from the assistant; bob's call in ann's request becomes text, and so does its result."""
    messages = [
        CompiledMessage("user", (Text("look it up"),)),
        CompiledMessage("bob", (Text("on it"), ToolUse("b1", "search", {"q": "x"}))),
        CompiledMessage("user", (ToolResult("b1", "found x"),)),
        CompiledMessage("ann", (Text("thanks bob"), ToolUse("a1", "read", {}))),
        CompiledMessage("user", (ToolResult("a1", "read it"),)),
    ]
    body = to_anthropic_messages(messages, "ann")
    user_blocks = [b for turn in body if turn["role"] == "user" for b in turn["content"]]
    assert not any(b["type"] == "tool_use" for b in user_blocks)
    assert {"type": "text", "text": '[bob called search with {"q":"x"}]'} in user_blocks
    assert {"type": "text", "text": "[result of bob called search: found x]"} in user_blocks
    assert any(b["type"] == "tool_result" and b["tool_use_id"] == "a1" for b in user_blocks)  # ann's own stays a pair
