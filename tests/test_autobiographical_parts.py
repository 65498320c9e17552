"""Autobiographical memory's pure parts on their own: stored records, chunking, the queue and the
selection's choices, with no strategy object, store or event loop."""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import Pin, SelectOptions, Summary, Text, ToolResult, ToolUse
from ctxrt.strategies.chunking import closes_at_target, walk
from ctxrt.strategies.knowledge import KNOWLEDGE, phase_rule
from ctxrt.strategies.policy import AUTOBIOGRAPHICAL
from ctxrt.strategies.queue import MAX_ATTEMPTS, l1_queue, merge_group
from ctxrt.strategies.records import (
    Chunk,
    chunk_record,
    chunks_from,
    pins_from,
    pins_record,
    summaries_from,
    summary_record,
)
from ctxrt.strategies.selection import choose
from ctxrt.testing import PlainContext


def msg(sequence: int, *blocks: Any, participant: str = "user") -> ctxrt.Message:
    return ctxrt.Message(
        id=str(sequence), sequence=sequence, participant=participant, content=blocks or (Text(f"message {sequence}"),),
        metadata=None, timestamp_ms=1_000 * sequence, caused_by=(),
    )


def stored(record: Any) -> Any:
    """``record`` as it comes back from a store: through JSON."""
    return json.loads(json.dumps(record))


def l1(number: int, content: str = "a memory", phase: str | None = None, witnessed: bool = False) -> Summary:
    first, last = 4 * number + 1, 4 * number + 4
    return Summary(f"L1-{number}", 1, content, len(content), tuple(str(s) for s in range(first, last + 1)), first,
                   last, str(first), str(last), 1_000 + number, None, phase, witnessed)


@settings(max_examples=100, deadline=None)
@given(
    contents=st.lists(st.text(max_size=40), min_size=1, max_size=8),
    merged=st.integers(min_value=0, max_value=8),
    phases=st.sampled_from([None, "synthesis", "research"]),
    witnessed=st.booleans(),
)
def test_stored_summaries_read_back_the_same_with_their_parents(
    contents: list[str], merged: int, phases: str | None, witnessed: bool
) -> None:
    """Summaries written as records and read back through JSON are the summaries written, each
    merged one with the parent that names it among its sources (T3)."""
    children = [l1(n, content, phases, witnessed) for n, content in enumerate(contents)]
    merged = min(merged, len(children))
    written = list(children)
    if merged:
        group = children[:merged]
        written.append(Summary(f"L2-{len(children)}", 2, "merged", 6, tuple(s.id for s in group),
                               group[0].first_sequence, group[-1].last_sequence, group[0].first_id,
                               group[-1].last_id, 9_999, witnessed=witnessed))
    expected = [attrs.evolve(s, parent_id=written[-1].id) if s in children[:merged] else s for s in written]
    assert summaries_from([stored(summary_record(s)) for s in written]) == expected


def test_records_keep_the_stored_forms_earlier_versions_wrote_and_read() -> None:
    """A chunk, a summary and the pins are stored in the forms earlier versions wrote, and a
    summary stored before phases and voices existed reads back with neither (T3, T7)."""
    chunk = Chunk("c-0", ("1", "2", "3", "4"), 1, 4)
    assert chunk_record(chunk) == {"id": "c-0", "ids": ["1", "2", "3", "4"], "first": 1, "last": 4}
    assert chunks_from([stored(chunk_record(chunk))]) == [chunk]
    assert summary_record(l1(0, "memory", "research", True)) == {
        "id": "L1-0", "level": 1, "content": "memory", "tokens": 6, "source_ids": ["1", "2", "3", "4"],
        "first_sequence": 1, "last_sequence": 4, "first_id": "1", "last_id": "4", "created_ms": 1_000,
        "phase": "research", "witnessed": True,
    }
    older = {"id": "L1-0", "level": 1, "content": "memory", "tokens": 6, "source_ids": ["1", "2", "3", "4"],
             "first_sequence": 1, "last_sequence": 4, "first_id": "1", "last_id": "4", "created_ms": 1_000}
    assert summaries_from([older]) == [l1(0, "memory")]
    pin = Pin("pin-0", "1", "4", 1, 4, "the plan", None, 5)
    assert pins_record([pin], 1) == {"next": 1, "pins": [{"id": "pin-0", "first_id": "1", "last_id": "4",
                                                          "first_sequence": 1, "last_sequence": 4,
                                                          "name": "the plan", "level": None, "created_ms": 5}]}
    assert pins_from(stored(pins_record([pin], 1))) == ([pin], 1)
    assert pins_from({"pins": "damaged"}) == ([], 0)


def test_knowledge_chunks_close_at_a_phase_change_where_plain_chunks_wait_for_their_target() -> None:
    """Over synthesis, a research tool pair, then synthesis again, Knowledge's rule closes a chunk
    at each phase change (at least 2 messages) while the plain rule, short of its target, closes
    none (T3, T7)."""
    frontier = [
        msg(1), msg(2, participant="Claude"),
        msg(3, ToolUse("t1", "mcpl:search", {"q": "x"}), participant="Claude"), msg(4, ToolResult("t1", "found")),
        msg(5, participant="Claude"), msg(6),
    ]
    view = PlainContext(frontier).view
    assert KNOWLEDGE.chunk_rule is phase_rule
    closed = walk(frontier, view, KNOWLEDGE.chunk_rule(10_000), seam=False, number=3)
    assert closed == [Chunk("c-3", ("1", "2"), 1, 2), Chunk("c-4", ("3", "4"), 3, 4)]
    assert AUTOBIOGRAPHICAL.chunk_rule is closes_at_target
    assert walk(frontier, view, AUTOBIOGRAPHICAL.chunk_rule(10_000), seam=False, number=3) == []
    assert walk(frontier, view, AUTOBIOGRAPHICAL.chunk_rule(10_000), seam=True, number=3) == [
        Chunk("c-3", tuple(str(n) for n in range(1, 7)), 1, 6)  # a seam closes its remainder
    ]


def test_the_queue_holds_back_the_newest_chunks_and_skips_a_quarantined_merge_group() -> None:
    """L1 work waits for all but the newest ``l1_holdback_chunks`` chunks; a merge group refused
    ``MAX_ATTEMPTS`` times seals its first summary, and the level's next group starts after it (T3, T4)."""
    chunks = [Chunk(f"c-{n}", (str(n),), n, n) for n in range(3)]
    assert l1_queue(chunks, chunks, 1) == chunks[:2]
    assert l1_queue(chunks[1:], chunks, 1, closing=[Chunk("c-3", ("3",), 3, 3)]) == chunks[1:]
    summaries = [l1(n) for n in range(5)]
    assert merge_group({1: summaries}, {}, 2) == summaries[:2]
    assert merge_group({1: summaries}, {"L1-0,L1-1": MAX_ATTEMPTS}, 2) == summaries[1:3]
    assert merge_group({1: summaries}, {"L1-0,L1-1": MAX_ATTEMPTS - 1}, 2) == summaries[:2]  # retried, not skipped
    assert merge_group({1: summaries[:1]}, {}, 2) is None


def test_summaries_are_chosen_newest_first_and_never_leave_a_newer_gap() -> None:
    """Within an allowance the newest summaries are shown; one that doesn't fit stops the choice,
    even if an older, smaller one would fit (T3)."""
    small_old, large, small_new = l1(0, "a" * 10), l1(1, "b" * 50), l1(2, "c" * 10)
    price = {s.id: s.tokens for s in (small_old, large, small_new)}.__getitem__
    assert choose([small_old, large, small_new], 30, lambda s: price(s.id)) == [small_new]
    assert choose([small_old, large, small_new], 65, lambda s: price(s.id)) == [large, small_new]
    assert choose([small_old, large, small_new], 70, lambda s: price(s.id)) == [small_old, large, small_new]


def test_a_compile_hands_back_the_same_entries_for_unchanged_messages_and_summaries() -> None:
    """Autobiographical's compiles give the same ``Entry`` object for a message that is the same
    object in the view and for a summary shown again (compile's memo keys on entry identity), a
    new one for an edited message, and what a fresh strategy selects (P16)."""
    config = ctxrt.Autobiographical(compression_model="m", head_window_tokens=20, recent_window_tokens=60,
                                    target_chunk_tokens=10**6)
    budget = ctxrt.Budget(max_tokens=100_000, reserve_for_response=0)
    messages = [msg(n) for n in range(1, 41)]
    summary = l1(3)  # covers 13-16; the head is 1-5, the recent window 26-40

    def compiled(ctx: PlainContext, strategy: Any = None) -> list[Any]:
        if strategy is None:
            strategy = config.create()
            strategy.initialize(ctx)
        return strategy.select(ctx.view, budget, SelectOptions())

    ctx = PlainContext(messages)
    ctx.logs["summaries"] = [stored(summary_record(summary))]
    strategy = config.create()
    strategy.initialize(ctx)
    first = compiled(ctx, strategy)
    assert any(entry.summary_ids == (summary.id,) for entry in first)
    assert [e.cache_marker for e in first[:6]] == [False] * 4 + [True, False]  # the head's end is marked
    again = compiled(ctx, strategy)
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))

    edited = [attrs.evolve(m, content=(Text("an edit"),)) if m.id == "20" else m for m in messages]
    ctx = PlainContext(edited)
    ctx.logs["summaries"] = [stored(summary_record(summary))]
    after_edit = compiled(ctx, strategy)
    assert after_edit == compiled(ctx)
    for old, new in zip(first, after_edit, strict=True):
        assert (new is old) == (new.source_ids != ("20",)), new.source_ids
        if new.source_ids == ("20",):
            assert new.content == (Text("an edit"),)

    ctx.messages.append(msg(41))
    appended = compiled(ctx, strategy)
    assert appended == compiled(ctx)
    assert appended[-1].source_ids == ("41",) and appended[-1].cache_marker
    by_source = {entry.source_ids: entry for entry in after_edit[:-1]}
    assert all(entry is by_source[entry.source_ids] for entry in appended[:-2] if entry.source_ids in by_source)


def test_an_edit_that_lets_a_chunk_close_is_counted_as_a_fresh_strategy_counts_it() -> None:
    """A message edited (or revealed) to more tokens can close the pending chunk: the next compile
    closes it and reports the pending units a strategy started afresh on the same state reports,
    though no message was added (T3, T9)."""
    config = ctxrt.Autobiographical(compression_model="m", target_chunk_tokens=60, recent_window_tokens=40,
                                    l1_holdback_chunks=0)
    budget = ctxrt.Budget(max_tokens=100_000, reserve_for_response=0)
    messages = [msg(n) for n in range(1, 21)]  # about 4 tokens each: no chunk closes
    ctx = PlainContext(messages)
    strategy = config.create()
    strategy.initialize(ctx)
    strategy.select(ctx.view, budget, SelectOptions(context=ctx))
    assert strategy.render_stats().pending_units == 0 and not ctx.logs.get("chunks")

    edited = PlainContext([attrs.evolve(m, content=(Text("long " * 80),)) if m.id == "3" else m for m in messages])
    edited.logs, edited.values = ctx.logs, ctx.values
    strategy.select(edited.view, budget, SelectOptions(context=edited))
    fresh = config.create()
    fresh.initialize(edited)
    fresh.select(edited.view, budget, SelectOptions(context=edited))
    stats, fresh_stats = strategy.render_stats(), fresh.render_stats()
    assert stats is not None and stats == fresh_stats and stats.pending_units == 1


def test_a_summary_reaching_into_the_recent_window_is_placed_by_its_first_message() -> None:
    """A shown summary whose range lies inside the raw recent window (a window made wider since
    its chunk closed) comes in sequence order: after the message before its range and before its
    first message, as a per-message order places it, however the window's entries are kept (T3)."""
    config = ctxrt.Autobiographical(compression_model="m", head_window_tokens=20, recent_window_tokens=10**6,
                                    target_chunk_tokens=10**6)
    ctx = PlainContext([msg(n) for n in range(1, 41)])
    ctx.logs["summaries"] = [stored(summary_record(l1(3)))]  # covers 13-16; the head is 1-5
    strategy = config.create()
    strategy.initialize(ctx)
    entries = strategy.select(ctx.view, ctxrt.Budget(max_tokens=100_000, reserve_for_response=0), SelectOptions())
    sources = [entry.summary_ids or entry.source_ids for entry in entries]
    at = sources.index(("L1-3",))
    assert sources[at - 1 : at + 3] == [("12",), ("L1-3",), ("L1-3",), ("13",)]
    assert [int(s[0]) for s in sources if s != ("L1-3",)] == list(range(1, 41))
