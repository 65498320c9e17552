"""The reference compile (``ctxrt.compile.reference``): every step done afresh, with no memo, and
what the memoised pipeline must return (P3-P6, P9, P16). Pure and synchronous: the sequences of
compiles through one memo are checked against it in tests/test_incremental_compile.py; here
single compiles of any entries, the steps themselves, and ``strict=True``."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrt import (
    CompiledMessage,
    CompileResult,
    Entry,
    Injection,
    Message,
    MessageInjection,
    Source,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
)
from ctxrt.compile.pipeline import CompileMemo, build_compile_result
from ctxrt.compile.reference import ReferenceMismatch, compile_reference, split_entry, stable_prefix_tokens
from ctxrt.errors import MalformedContentError
from ctxrt.testing import estimate_blocks

IDS = ("a", "b", "c")
SOURCES = ("1", "2", "3", "4", "5")  # "5" is never stored: its lookup finds nothing

texts = st.sampled_from(["hi", "", "said more", "x"])
blocks = st.one_of(
    st.builds(Text, texts),
    st.builds(Text, texts),
    st.builds(Thinking, st.just("hm"), st.just("sig")),
    st.builds(ToolUse, st.sampled_from(IDS), st.just("search"), st.just({"q": 1})),
    st.builds(ToolResult, st.sampled_from(IDS), st.sampled_from(["found", "other"])),
)
stored = st.fixed_dictionaries({sid: st.lists(blocks, min_size=1, max_size=3).map(tuple) for sid in SOURCES[:4]})


@st.composite
def entry_lists(draw: st.DrawFn, bodies: dict[str, tuple[Any, ...]]) -> list[Entry]:
    """Entries as strategies make them: raw copies of stored messages (whole, shaped, or of
    several), summaries, references, some marked, some empty, the same object given twice."""
    out: list[Entry] = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["whole", "whole", "shaped", "several", "summary", "referenced", "again"]))
        sid = draw(st.sampled_from(SOURCES))
        participant = draw(st.sampled_from(["user", "assistant", "bob"]))
        content = bodies.get(sid, (Text("gone"),))
        match kind:
            case "whole":
                entry = Entry(participant, content, (sid,))
            case "shaped":  # a strategy's rendering: blocks dropped or rewritten
                entry = Entry(participant, draw(st.lists(blocks, max_size=3).map(tuple)), (sid,))
            case "several":
                entry = Entry(participant, content + draw(st.lists(blocks, max_size=2).map(tuple)),
                              (sid, draw(st.sampled_from(SOURCES))))
            case "summary":
                entry = Entry("user", (Text(f"summary of {sid}"),), (sid,), "derived", (f"s{sid}",))
            case "referenced":
                entry = Entry(participant, (Text(f"see {sid}"),), (sid,), "referenced")
            case _:
                if not out:
                    continue
                out.append(draw(st.sampled_from(out)))
                continue
        out.append(attrs.evolve(entry, cache_marker=draw(st.booleans())))
    return out


injection_sets = st.sampled_from([
    {},
    {"injections": [Injection("notes", "system", "remember this")]},
    {"injections": [Injection("notes", "before_user", "before"), Injection("clock", "after_user", "now")]},
    {"message_injections": [MessageInjection("user", "reminder", depth=2)]},
])


def stored_messages(bodies: dict[str, tuple[Any, ...]]) -> dict[str, Message]:
    return {sid: Message(sid, int(sid), "user", content) for sid, content in bodies.items()}


def memoised(entries: list[Entry], lookup: Any, memo: CompileMemo | None = None, **kwargs: Any) -> CompileResult:
    return build_compile_result(entries, namespace="ns", branch="main", reader=None, strategy_name="test",
                                lookup=lookup, compile_id="c", memo=memo, **kwargs)


def reference(entries: list[Entry], lookup: Any, **kwargs: Any) -> CompileResult:
    return compile_reference(entries, namespace="ns", branch="main", reader=None, strategy_name="test",
                             lookup=lookup, compile_id="c", **kwargs)


def assert_same(result: CompileResult, expected: CompileResult) -> None:
    assert result.messages == expected.messages
    assert result.system_injections == expected.system_injections
    assert result.provenance.messages == expected.provenance.messages
    assert dict(result.provenance.raw_bodies) == dict(expected.provenance.raw_bodies)
    assert dict(result.provenance.completeness) == dict(expected.provenance.completeness)
    assert result.stable_prefix_tokens == expected.stable_prefix_tokens


@settings(max_examples=300)
@given(data=st.data(), bodies=stored, injected=injection_sets)
def test_a_compile_equals_the_reference(data: st.DataObject, bodies: dict[str, tuple[Any, ...]],
                                        injected: dict[str, Any]) -> None:
    """P3-P6, P16: whatever entries a strategy hands over (tool pairs whole, split or orphaned,
    shaped copies, copies of messages not found, summaries, markers, the same entry twice) and
    whatever is injected, the pipeline's compile is the reference's, twice through one memo, and
    ``strict=True`` finds nothing to refuse."""
    lookup = stored_messages(bodies).get
    entries = data.draw(entry_lists(bodies))
    memo = CompileMemo()
    first = memoised(entries, lookup, memo, **injected)
    assert_same(first, reference(entries, lookup, **injected))
    again = memoised(entries, lookup, memo, strict=True, **injected)
    assert_same(again, reference(entries, lookup, previous=first, **injected))


def test_split_puts_the_marker_on_the_last_part_and_makes_nothing_of_empty_content() -> None:
    """P4, P5: a non-user message holding results becomes its parts, the results speaking as the
    user; the entry's cache marker goes on the last part only; an empty entry makes no part."""
    entry = Entry("bob", (Text("calling"), ToolResult("a", "late"), Text("after")), ("1",), cache_marker=True)
    assert split_entry(entry, 0) == [
        CompiledMessage("bob", (Text("calling"),)),
        CompiledMessage("user", (ToolResult("a", "late"),)),
        CompiledMessage("bob", (Text("after"),), cache_breakpoint=True),
    ]
    assert split_entry(Entry("bob", (), ("1",), cache_marker=True), 0) == []


def test_the_reference_refuses_an_audience_where_the_entry_is() -> None:
    """B3, A8: an entry carrying a block with an audience is refused, naming its place, by the
    reference as by the pipeline."""
    entries = [Entry("user", (Text("hi"),)), Entry("user", (Text("secret", audience=("bob",)),))]
    for compile_with in (memoised, reference):
        with pytest.raises(MalformedContentError) as refused:
            compile_with(entries, {}.get)
        assert refused.value.path == "entries[1].content[0]"


def test_a_call_the_repair_drops_leaves_its_message_incomplete() -> None:
    """P4, P6: a copy whose tool call nobody answers loses the call; what is left of it no longer
    carries its stored body whole, while an untouched copy does."""
    bodies = {"1": Message("1", 1, "assistant", (Text("let me look"), ToolUse("a", "search", {"q": 1}))),
              "2": Message("2", 2, "user", (Text("never mind"),))}
    entries = [Entry(m.participant, m.content, (m.id,)) for m in bodies.values()]
    result = reference(entries, bodies.get)
    assert result.messages == [CompiledMessage("assistant", (Text("let me look"),)),
                               CompiledMessage("user", (Text("never mind"),))]
    assert result.provenance.messages == ((Source("message", "1", False),), (Source("message", "2", True),))
    assert result.provenance.completeness == {"1": False, "2": True}


def test_the_stable_prefix_ends_at_a_breakpoint_of_the_compile_before() -> None:
    """P9: the tokens up to the last breakpoint of the compile before whose prefix is unchanged;
    0 with no compile before or other system blocks."""
    a, b, c = (CompiledMessage("user", (Text(f"message {k}"),)) for k in range(3))
    before = CompileResult([a, attrs.evolve(b, cache_breakpoint=True), c], [], reference([], {}.get).provenance)
    now = [a, b, CompiledMessage("user", (Text("another"),))]
    assert stable_prefix_tokens(before, now, []) == estimate_blocks(a.content) + estimate_blocks(b.content) > 0
    assert stable_prefix_tokens(None, now, []) == 0
    assert stable_prefix_tokens(before, now, [Text("system")]) == 0


def test_strict_refuses_a_memo_trusted_past_an_edit() -> None:
    """P16: a memo told the view didn't change (the same stamp) while a stored body did keeps its
    judgement of the old body; ``strict=True`` compares with the reference and says what differs."""
    bodies = {"1": Message("1", 1, "user", (Text("first words"),))}
    entry = Entry("user", (Text("[shaped] first words"),), ("1",))  # judged against the body it was made of
    memo = CompileMemo()
    memoised([entry], bodies.get, memo, stamp="same")
    bodies["1"] = attrs.evolve(bodies["1"], content=(Text("edited words"),))
    with pytest.raises(ReferenceMismatch, match="provenance.messages"):
        memoised([entry], bodies.get, memo, stamp="same", strict=True)
    assert memoised([entry], bodies.get, CompileMemo(), strict=True).provenance.completeness == {"1": False}


def test_an_equal_entry_made_anew_is_judged_as_itself_by_a_warm_memo() -> None:
    """P6, P16: one entry object given twice is one entry (its calls, answered once, carry its body
    whole); an equal entry made anew in the first place is another, whose unanswered call the
    repair drops, so it no longer carries its body whole. The warm memo, which copies the equal
    entry's parts from the last compile, judges it as the reference does (it judged both places
    together before)."""
    bodies = {"1": Message("1", 1, "assistant", (Text("looking"), ToolUse("a", "search", {"q": 1}))),
              "2": Message("2", 2, "user", (ToolResult("a", "found"),))}
    call, answer = (Entry(m.participant, m.content, (m.id,)) for m in bodies.values())
    memo = CompileMemo()
    first = memoised([call, call, answer], bodies.get, memo)
    assert first.provenance.completeness == {"1": True, "2": True}
    renewed = [attrs.evolve(call), call, answer]
    again = memoised(renewed, bodies.get, memo, strict=True)
    assert again.provenance.messages[0] == (Source("message", "1", False),)
    assert again.provenance.messages[1] == (Source("message", "1", True),)
    assert_same(again, reference(renewed, bodies.get, previous=first))
