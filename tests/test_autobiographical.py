"""Autobiographical and Knowledge compression through the public API (T3-T8, P1, L2;
D2, D4, D7).

Determinism rules: a real LMDB store under ``tmp_path`` (durability "os": these tests are
about compression, not fsync), the real clock and a ``trio.fail_after`` hang guard in every
async test. Models are ``ScriptedModel`` or ``AnthropicModel`` over the real
``anthropic.AsyncAnthropic`` pointed at the loopback server of ``ctxrt.testing`` with SDK
retries off: never the network. Ordering between a compression request and a host's call is
forced with ``trio.Event``s held by the responder, never by sleeps; sleeps only wait out a hold's
or a model's timeout, give a drain that must stay idle its chance to run, or poll for background
work under the guard. The strategy's state is read through ``await m.inspect()``'s copy
and persisted logs through the engine's read API; the only patches are a store that refuses the
floor write and a smaller recall budget; the model timeout is ``open_runtime(model_timeout_s=...)``.
Strategy planning (``next_unit``, ``request_for``, ``apply_unit``, ``select``) is also tested as
plain synchronous code over ``ctxrt.testing.PlainContext``: no trio, no store.

Token arithmetic: ``say(i)`` is a 29-character prose text, so it costs 10 tokens
(``ceil(29 / 2.9)``), and carries the marker ``<m{i:05d}>``. Summaries the scripted model writes
name the lowest and highest markers they were shown, so a marker in a request always tells how
late in the conversation the request reached (T4).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio
import trio.testing

import ctxrt
from ctxrt import Budget, ModelRequest, ModelResponse, SelectOptions, Text, ToolResult, ToolUse, Unit, Usage
from ctxrt.testing import (
    ApiReply,
    AppendItem,
    Atomically,
    PlainContext,
    ScriptedModel,
    SetValue,
    estimate_blocks,
    estimate_text,
    open_messages_api_server,
    states,
)
from ctxrt.namespace.actor import MODEL_TIMEOUT_S
from ctxrt.strategies import prompts
from ctxrt.strategies.autobiographical import AutobiographicalStrategy
from ctxrt.strategies.knowledge import INSTRUCTIONS, phase_of, phases
from ctxrt.strategies.prompts import SYSTEM, TRANSITION_PREFIX
from ctxrt.strategies.queue import BACKOFF_S, MAX_ATTEMPTS, RETRYABLE_STREAK_LIMIT
from support import wait_until

GUARD_S = 20
HOLD_S = 10.0  # a hold's timeout: far longer than a test runs, so only the test's clock.jump lapses it
MODEL = "model-x"
NS = "diary"
MARK = re.compile(r"<m(\d{5})>")


# -- helpers ---------------------------------------------------------------------------------


def say(i: int) -> str:
    """A 29-character prose text carrying marker ``i``: 10 tokens."""
    return f"<m{i:05d}> we talked it over".ljust(29, ".")


assert estimate_text(say(0)) == 10


def autobio(**overrides: Any) -> ctxrt.Autobiographical:
    """Small windows: chunks of four ``say`` messages, no head, no recent window, no holdback."""
    config: dict[str, Any] = {
        "target_chunk_tokens": 40, "recent_window_tokens": 0, "l1_holdback_chunks": 0, "summary_target_tokens": 50,
    }
    config.update(overrides)
    return ctxrt.Autobiographical(MODEL, **config)


def text_of(message: Any) -> str:
    return "\n".join(b.text for b in message.content if isinstance(b, Text))


def markers(text: str) -> list[int]:
    return [int(found) for found in MARK.findall(text)]


def remember(request: ModelRequest) -> str:
    """A memory naming the span of markers the request asked about (the chunk, else everything)."""
    found = markers(text_of(request.messages[-1])) or [n for m in request.messages for n in markers(text_of(m))]
    if not found:
        return "memory of nothing in particular"
    return f"memory <m{min(found):05d}> to <m{max(found):05d}>"


def l1_requests(model: ScriptedModel) -> list[ModelRequest]:
    """Chunk compressions (their last message holds the chunk's transcript)."""
    return [r for r in model.requests if "<earlier_in_conversation>" in text_of(r.messages[-1])]


async def strategy(m: ctxrt.ContextManager) -> Any:
    """A copy of the namespace actor's strategy, through the documented ``inspect()`` hook."""
    return (await m.inspect()).strategy


async def chunk_ids(m: ctxrt.ContextManager) -> list[tuple[str, ...]]:
    return [chunk.message_ids for chunk in (await strategy(m)).chunks]


def stored_log(rt: ctxrt.Runtime, name: str, *, namespace: str = NS, strategy_name: str = "autobio") -> list[Any]:
    """What the store holds of a strategy log on ``main`` (the engine's txn-free read), as JSON values."""
    state = states.strategy_state(namespace, strategy_name, name)
    return [json.loads(item.data) for item in rt.engine.read_log(state, rt.engine.branch("main").id)]


def shown_summaries(result: ctxrt.CompileResult) -> list[str]:
    return list(dict.fromkeys(s.id for sources in result.provenance.messages for s in sources if s.kind == "summary"))


def raw_sources(result: ctxrt.CompileResult) -> set[str]:
    """Ids of the messages compiled raw (sources of compiled messages that show no summary)."""
    return {s.id for sources in result.provenance.messages if all(x.kind == "message" for x in sources) for s in sources}


async def covered_by_shown(m: ctxrt.ContextManager, result: ctxrt.CompileResult) -> set[str]:
    """Every message id a summary shown in ``result`` covers (through its children for L2 and up)."""
    covered: set[str] = set()
    for summary_id in shown_summaries(result):
        covered.update(await leaves_of(m, summary_id))
    return covered


async def leaves_of(m: ctxrt.ContextManager, summary_id: str) -> list[str]:
    """The message ids a summary covers: an L1's sources, else its children's leaves (public reads only)."""
    summary = await m.get_summary(summary_id)
    assert summary is not None
    if summary.level == 1:
        return list(summary.source_ids)
    return [leaf for child in summary.source_ids for leaf in await leaves_of(m, child)]


async def add_all(m: ctxrt.ContextManager, count: int, *, start: int = 0) -> list[str]:
    return [await m.add_message("user", say(i)) for i in range(start, start + count)]


def tool_use(id: str, name: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": {"q": id}}


def tool_result(id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id, "content": f"result of {id}"}


def budget(tokens: int) -> Budget:
    return Budget(max_tokens=tokens, reserve_for_response=0)


async def backing_off_after(m: ctxrt.ContextManager, wake: float | None) -> bool:
    """Whether the drain waits for a backoff that ends after ``wake`` (a later one, after a failure)."""
    now = (await strategy(m)).wake_at()
    return now is not None and (wake is None or now > wake)


async def has_summaries(m: ctxrt.ContextManager) -> bool:
    return await m.search_summaries() != []


def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def floor_of(namespaces: Sequence[ctxrt.NamespaceInfo]) -> int:
    return {info.namespace: info.narrowing_floor for info in namespaces}[NS]


def assert_tool_pairs_intact(result: ctxrt.CompileResult) -> None:
    """Every tool_use is answered in the next message, every tool_result asked in the previous one (P4)."""
    messages = result.messages
    for index, message in enumerate(messages):
        uses = {b.id for b in message.content if isinstance(b, ToolUse)}
        if uses:
            following = messages[index + 1] if index + 1 < len(messages) else None
            answered = {b.tool_use_id for b in following.content if isinstance(b, ToolResult)} if following else set()
            assert uses <= answered, f"tool_use {uses - answered} at {index} has no result after it"
        results = {b.tool_use_id for b in message.content if isinstance(b, ToolResult)}
        if results:
            previous = messages[index - 1] if index > 0 else None
            asked = {b.id for b in previous.content if isinstance(b, ToolUse)} if previous else set()
            assert results <= asked, f"tool_result {results - asked} at {index} has no tool_use before it"


def compiled_tokens(result: ctxrt.CompileResult) -> int:
    return sum(estimate_blocks(message.content) for message in result.messages)


# -- T3: zones, chunks, L1s, merges ----------------------------------------------------------


async def test_head_window_is_verbatim_with_a_cache_marker_on_its_last_entry(tmp_path: Path) -> None:
    """The head window's messages are compiled as stored, and only its last carries the cache marker; past it
    only summary seams and the tail do (T3, P5, P9)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(head_window_tokens=30, recent_window_tokens=20))
            ids = await add_all(m, 20)
            await m.wait_ready()
            result = await m.compile(budget(10_000))
            stored = [await m.get_message(i) for i in ids[:3]]
            head = result.messages[:3]
            assert [(c.participant, c.content) for c in head] == [(s.participant, s.content) for s in stored]
            assert [c.cache_breakpoint for c in head] == [False, False, True]
            # After the head, only summary seams and the tail carry a breakpoint (P9), and no more
            # than P5 allows: the head's end, the latest seam, the tail.
            assert result.messages[-1].cache_breakpoint
            seams = [i for i, c in enumerate(result.messages[:-1]) if c.cache_breakpoint and i >= 3]
            assert seams and all(
                any(s.kind == "summary" for s in result.provenance.messages[i]) for i in seams
            )
            assert sum(c.cache_breakpoint for c in result.messages) <= 3
            body = result.to_anthropic(assistant="Claude")
            assert body["messages"][0]["content"][2]["cache_control"] == {"type": "ephemeral"}
            assert ids[3] not in raw_sources(result)  # the middle starts right after the head: summarised


async def test_recent_window_is_raw_evicted_newest_first_and_emitted_chronologically(tmp_path: Path) -> None:
    """The recent window is raw; a budget too small for it keeps its newest messages, in order (T3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(recent_window_tokens=1_000))
            ids = await add_all(m, 12)
            result = await m.compile(budget(55))
            assert [s[0].id for s in result.provenance.messages] == ids[-5:]
            assert [text_of(c) for c in result.messages] == [say(i) for i in range(7, 12)]
            assert all(s[0].complete for s in result.provenance.messages)
            assert (await strategy(m)).chunks == []  # all of it is recent: nothing to chunk


async def test_chunks_close_at_the_target_with_at_least_four_messages(tmp_path: Path) -> None:
    """A chunk closes once it holds the target's tokens and at least four messages, whichever comes last (T3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            few = await rt.open("few", strategy=autobio(target_chunk_tokens=60))
            many = await rt.open("many", strategy=autobio(target_chunk_tokens=5), isolate=True)
            await add_all(few, 20)
            await add_all(many, 10)
            await few.compile(budget(100))
            await many.compile(budget(100))
            # 60 tokens = six say() messages; 5 tokens would be one message, but four are the least.
            assert [len(c) for c in (await chunk_ids(few))] == [6, 6, 6]
            assert [len(c) for c in (await chunk_ids(many))] == [4, 4]
            everything = [m.id for m in await few.get_all_messages()]
            assert [i for c in (await chunk_ids(few)) for i in c] == everything[:18]  # contiguous, in order


async def test_chunks_never_close_right_after_a_tool_use(tmp_path: Path) -> None:
    """A chunk that reaches its target on a tool_use waits for the tool_result to join it (T3, P4)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=1))
            ids = await add_all(m, 3)
            ids.append(await m.add_message("Claude", [tool_use("t1", "search")]))
            ids.append(await m.add_message("user", [tool_result("t1")]))
            ids += await add_all(m, 3, start=5)
            ids.append(await m.add_message("Claude", [{"type": "text", "text": "looking"}, tool_use("t2", "read")]))
            ids.append(await m.add_message("user", [tool_result("t2")]))
            await m.compile(budget(100))
            assert await chunk_ids(m) == [tuple(ids[:5]), tuple(ids[5:10])]
            for chunk in await chunk_ids(m):
                last = await m.get_message(chunk[-1])
                assert not any(isinstance(b, ToolUse) for b in last.content)


async def test_chunk_records_persist_and_boundaries_survive_a_restart(tmp_path: Path) -> None:
    """Closed chunks are stored records: after a restart, even under another target, they stay as they were (T3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=50))
            await add_all(m, 23)
            await m.compile(budget(100))
            before = await chunk_ids(m)
            persisted = stored_log(rt, "chunks")
        assert [len(c) for c in before] == [5, 5, 5, 5]
        assert [tuple(record["ids"]) for record in persisted] == before
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=50))
            assert await chunk_ids(m) == before
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=80))  # another target: old records stand
            await add_all(m, 9, start=23)
            await m.compile(budget(100))
            after = await chunk_ids(m)
            assert after[: len(before)] == before
            assert [len(c) for c in after[len(before) :]] == [8]  # 3 left over + 5 new, closed at 80 tokens


async def test_chunks_closed_over_messages_stored_before_the_open_are_persisted(tmp_path: Path) -> None:
    """Messages stored while no compile or tick ran close into chunks at the next open's first unit, and their
    records are stored with the floor like any others: a restart keeps the boundaries and numbers on (T3, D2)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(), view_reader="alice")
            ids = await add_all(m, 8)
            assert await chunk_ids(m) == [] and stored_log(rt, "chunks") == []
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(), view_reader="alice")
            await m.wait_ready()
            assert await chunk_ids(m) == [tuple(ids[:4]), tuple(ids[4:])]
            assert [(r["id"], tuple(r["ids"])) for r in stored_log(rt, "chunks")] == [
                ("c-0", tuple(ids[:4])), ("c-1", tuple(ids[4:]))
            ]
            assert floor_of(await rt.list_namespaces()) >= int(ids[-1])
            assert len(await m.search_summaries()) == 2
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(), view_reader="alice")
            ids += await add_all(m, 4, start=8)
            await m.compile(budget(100))
            assert [c.id for c in (await strategy(m)).chunks] == ["c-0", "c-1", "c-2"]
            assert await chunk_ids(m) == [tuple(ids[:4]), tuple(ids[4:8]), tuple(ids[8:])]
            assert [r["id"] for r in stored_log(rt, "chunks")] == ["c-0", "c-1", "c-2"]


async def test_each_closed_chunk_is_compressed_into_one_l1_summary(tmp_path: Path) -> None:
    """Every closed chunk gets exactly one L1 whose sources are the chunk's messages, made from one request (T3)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=100))
            ids = await add_all(m, 16)
            assert not await m.is_ready()
            await m.wait_ready()
            assert await m.is_ready()
            l1s = await m.search_summaries(levels=[1])
            assert [match.summary.source_ids for match in sorted(l1s, key=lambda f: f.summary.first_sequence)] == await chunk_ids(m) == [
                tuple(ids[i : i + 4]) for i in range(0, 16, 4)
            ]
            assert len(l1_requests(model)) == 4 == len(model.requests)
            for match in l1s:
                first = ids.index(match.summary.first_id)
                assert match.summary.content == f"memory <m{first:05d}> to <m{first + 3:05d}>"
                assert match.summary.level == 1 and match.summary.parent_id is None


async def test_the_newest_closed_chunk_is_held_back_from_l1(tmp_path: Path) -> None:
    """``l1_holdback_chunks`` newest closed chunks wait: the drain is ready without compressing them."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(l1_holdback_chunks=1))
            await add_all(m, 12)
            await m.wait_ready()
            compressed = {match.summary.source_ids for match in await m.search_summaries()}
            assert compressed == set((await chunk_ids(m))[:2])
            await add_all(m, 4, start=12)
            await m.wait_ready()
            compressed = {match.summary.source_ids for match in await m.search_summaries()}
            assert compressed == set((await chunk_ids(m))[:3])


async def test_l1s_merge_into_l2_and_l2s_into_l3_at_the_merge_threshold(tmp_path: Path) -> None:
    """``merge_threshold`` unmerged L1s become one L2 over them (and L2s one L3); the sources get a parent (T3)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            await add_all(m, 4 * 9)
            await m.wait_ready()
            every = await m.search_summaries(include_merged=True, limit=100)
            by_level: dict[int, list[ctxrt.Summary]] = {}
            for match in every:
                by_level.setdefault(match.summary.level, []).append(match.summary)
            assert {level: len(found) for level, found in by_level.items()} == {1: 9, 2: 3, 3: 1}
            l3 = by_level[3][0]
            assert l3.parent_id is None
            assert sorted(l3.source_ids) == sorted(s.id for s in by_level[2])
            for l2 in by_level[2]:
                assert l2.parent_id == l3.id
                children = [await m.get_summary(child) for child in l2.source_ids]
                assert all(child is not None and child.level == 1 and child.parent_id == l2.id for child in children)
                assert (l2.first_sequence, l2.last_sequence) == (children[0].first_sequence, children[-1].last_sequence)
            # A merge is told the memories it merges, and nothing later: its span is theirs.
            assert l3.content == "memory <m00000> to <m00035>"
            assert [match.summary.id for match in await m.search_summaries()] == [l3.id]  # the frontier


async def test_merged_l1s_are_not_shown_once_their_l2_is(tmp_path: Path) -> None:
    """Anti-redundancy: a compile shows an L2 and none of its L1s, and still covers every middle message (T3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3, recent_window_tokens=40))
            ids = await add_all(m, 4 * 5 + 4)
            await m.wait_ready()
            result = await m.compile(budget(2_000))
            shown = shown_summaries(result)
            l2 = [match.summary for match in await m.search_summaries(levels=[2])]
            assert len(l2) == 1 and l2[0].id in shown
            assert not set(l2[0].source_ids) & set(shown)
            assert len([s for s in shown if s.startswith("L1-")]) == 2  # the two unmerged ones
            assert set(ids) <= raw_sources(result) | await covered_by_shown(m, result)
            assert ids[-4:] == [s[0].id for s in result.provenance.messages[-4:]]  # the recent window, raw


async def test_messages_cut_to_max_message_tokens_still_fit_the_budget(tmp_path: Path) -> None:
    """With ``max_message_tokens``, cut messages are priced as what is sent, so the compile fits its budget (P2, T3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(recent_window_tokens=100_000, max_message_tokens=1_000))
            for i in range(4):
                await m.add_message("user", say(i) + " word" * 2_000)
            result = await m.compile(budget(3_200))
            assert len(result.messages) >= 3  # each cut to at most its 1,000-token cap
            assert all(ctxrt.content.tokens.estimate_blocks(m.content) <= 1_000 for m in result.messages)
            assert compiled_tokens(result) <= 3_200


# -- T4: "as of" the chunk, and what becomes a summary ---------------------------------------


async def test_a_compression_request_holds_nothing_after_its_chunk(tmp_path: Path) -> None:
    """A chunk's request is head, prior recall pairs, the chunk, the instruction: no later message or memory (T4)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(head_window_tokens=20, recent_window_tokens=30, merge_threshold=3,
                                                 auto_tick=True))
            await add_all(m, 60)
            await m.wait_ready()
            requests = l1_requests(model)
            assert len(requests) >= 10
            for number, request in enumerate(requests):
                chunk = markers(text_of(request.messages[-1]))
                assert chunk == sorted(chunk) and len(chunk) >= 4
                everything = [n for message in request.messages for n in markers(text_of(message))]
                assert max(everything) == max(chunk), f"request {number} reaches past its chunk"
                assert "<m00000>" in text_of(request.messages[0])  # the head window leads
                recalls = [text_of(c) for c in request.messages if text_of(c).startswith("[Recall ")]
                if number > 0:
                    assert recalls, "prior memories come as recall pairs"
                assert request.model == MODEL


async def test_recall_pairs_are_capped_newest_first_so_a_backlog_does_not_grow_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog of unmerged memories is recalled newest first within the recall budget (T4)."""
    monkeypatch.setattr(prompts, "RECALL_BUDGET_TOKENS", 3 * (50 + prompts.RECALL_PAIR_OVERHEAD_TOKENS))
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(lambda request: remember(request).ljust(145, "."))  # 145 characters: 50 tokens
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=100))
            await add_all(m, 4 * 8)
            await m.wait_ready()
            assert {s.summary.tokens for s in await m.search_summaries()} == {50}
            for number, request in enumerate(model.requests):
                recalled = [text_of(c) for c in request.messages if text_of(c).startswith("[Recall ")]
                assert recalled == [f"[Recall L1-{k}]" for k in range(max(0, number - 3), number)]


@pytest.mark.parametrize(
    "reply",
    [
        ModelResponse((Text("I can't help with that."),), "refusal", Usage(1, 1)),
        ModelResponse((Text("   "),), "end_turn", Usage(1, 1)),
        ModelResponse((), "end_turn", Usage(1, 0)),
        ModelResponse((Text("a memory cut off mid"),), "max_tokens", Usage(1, 1)),
        ModelResponse((ToolUse("t9", "remember", {}),), "tool_use", Usage(1, 1)),
    ],
    ids=["refusal", "blank-text", "no-content", "max-tokens", "tool-use"],
)
async def test_only_a_complete_end_turn_with_text_becomes_a_summary(tmp_path: Path, reply: ModelResponse) -> None:
    """A refusal, blank or empty reply, a cut-off reply or a tool call leaves the chunk queued, not summarised (T4)."""
    with trio.fail_after(GUARD_S):
        replies = [reply]
        model = ScriptedModel(lambda request: replies.pop(0) if replies else remember(request))
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            await add_all(m, 4)
            assert await m.tick()
            assert await m.search_summaries() == []
            assert not await m.is_ready()  # still queued
            assert [c.id for c in (await strategy(m))._l1_queue()] == ["c-0"]
            assert await m.tick()
            [match] = await m.search_summaries()
            assert match.summary.content == "memory <m00000> to <m00003>"
            assert len(model.requests) == 2 and await m.is_ready()


@pytest.mark.parametrize("error", [ValueError("a strategy bug"), ctxrt.RuntimeClosedError("a strategy's own error"),
                                   ctxrt.BranchNotFoundError("a strategy's own lookup")], ids=type)
async def test_a_drain_failure_while_the_actor_lives_is_logged_as_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    """L2 (second attack round): a strategy whose planning raises while its runtime and branch live
    is logged at error level, whatever the exception's type; only an actor that is stopping logs
    the store or branch gone at debug level."""

    class Failing(AutobiographicalStrategy):
        def next_unit(self, ctx: Any) -> Unit | None:
            raise error

    caplog.set_level(logging.DEBUG, logger="ctxrt")
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ctxrt.OfflineModel(), durability="os") as rt:
            m = await rt.open(NS, strategy=Failing(autobio(auto_tick=True)))
            for i in range(8):
                await m.add_message("user", say(i))
            await wait_until(lambda: any("failed to plan a unit" in r.getMessage() for r in caplog.records))
            planning = [r for r in caplog.records if "failed to plan a unit" in r.getMessage()]
            assert {r.levelno for r in planning} == {logging.ERROR}
            assert all(r.exc_info and r.exc_info[1] is error for r in planning)


async def test_compression_requests_carry_a_copy_of_the_tool_definitions_and_refuse_non_json(tmp_path: Path) -> None:
    """M6 (from a host-style attack): ``set_tool_definitions`` refuses a definition that isn't JSON
    (a key that isn't a string, which JSON would have turned into "1"), naming the place; an accepted
    one reaches the next compression request as it was when set, whatever the host changes later."""
    model = ScriptedModel(remember)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            with pytest.raises(ctxrt.MalformedContentError) as refused:
                m.set_tool_definitions([{"name": "ok"}, {"name": "t", 1: 2}])
            assert refused.value.path == "tools[1][1]"
            tool = {"name": "lookup", "input_schema": {"type": "object", "properties": {}}}
            m.set_tool_definitions([tool])
            tool["name"] = "changed after it was set"
            await add_all(m, 8)
            assert await m.tick()
            assert model.requests[-1].tools == ({"name": "lookup", "input_schema": {"type": "object", "properties": {}}},)


async def test_closing_the_runtime_while_compression_drains_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """L3, L5 (from a host-style attack): leaving ``open_runtime`` while an auto-ticking namespace plans
    and commits compression stops it quietly; its store actor having stopped is not an error to log
    (it was, with a traceback, in most of these five rounds)."""
    caplog.set_level(logging.DEBUG, logger="ctxrt")
    with trio.fail_after(GUARD_S):
        for round_ in range(5):
            async with ctxrt.open_runtime(tmp_path / f"s{round_}", model=ctxrt.OfflineModel()) as rt:
                m = await rt.open(NS, view_reader="ann", strategy=ctxrt.Autobiographical(
                    "x", auto_tick=True, target_chunk_tokens=50, recent_window_tokens=50, l1_holdback_chunks=0))
                for _ in range(40):
                    await m.add_message("user", "words here. " * 30)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_failed_compression_is_retried_then_quarantined_and_stays_raw(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunk whose request is refused stays queued and is retried; after MAX_ATTEMPTS it is quarantined,
    logged and compiled raw (T3, L2)."""

    def fail(request: ModelRequest) -> str:
        if "<m00000>" in text_of(request.messages[-1]):
            raise ctxrt.ModelError("model-x: HTTP 400 invalid_request_error", retryable=False)
        return remember(request)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(fail)
        caplog.set_level(logging.WARNING, logger="ctxrt.autobiographical")
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 8)
            for attempt in range(1, MAX_ATTEMPTS):
                assert await m.tick()
                assert (await strategy(m)).attempts == {"c-0": attempt}
                assert [c.id for c in (await strategy(m))._l1_queue()] == ["c-0", "c-1"]  # queued, first in line
            assert await m.tick()
            assert (await strategy(m)).quarantined() == ["c-0"]
            assert [c.id for c in (await strategy(m))._l1_queue()] == ["c-1"]
            await m.wait_ready()
            assert [s.summary.source_ids for s in await m.search_summaries()] == [tuple(ids[4:])]
            result = await m.compile(budget(1_000))
            assert set(ids[:4]) <= raw_sources(result)  # quarantined: raw in place
            assert [s[0].id for s in result.provenance.messages[:4]] == ids[:4]
            assert len(model.requests) == MAX_ATTEMPTS + 1
        quarantine = [r for r in caplog.records if r.levelno == logging.ERROR and "quarantined" in r.getMessage()]
        assert len(quarantine) == 1 and "c-0" in quarantine[0].getMessage() and NS in quarantine[0].getMessage()
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            assert (await strategy(m)).quarantined() == ["c-0"]  # the count is stored: a restart doesn't retry forever
            await m.wait_ready()
            assert len(model.requests) == MAX_ATTEMPTS + 1


async def test_retryable_failures_never_quarantine_a_chunk_and_the_drain_backs_off(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    """An outage (retryable errors) counts no attempt against the chunk; the drain waits a backoff, then
    compresses it once the model answers again (T8, L2)."""
    outage = {"on": True}

    def flaky(request: ModelRequest) -> str:
        if outage["on"]:
            raise ctxrt.ModelError("model-x: HTTP 529 overloaded_error", retryable=True)
        return remember(request)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(flaky)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(auto_tick=True))
            await add_all(m, 8)
            await wait_until(lambda: backing_off_after(m, None))  # the drain tried, and waits
            assert (await strategy(m)).attempts == {} and (await strategy(m)).quarantined() == []
            assert [c.id for c in (await strategy(m))._l1_queue()][:1] == ["c-0"]  # still first in line
            tried, wake = len(model.requests), (await strategy(m)).wake_at()
            await trio.testing.wait_all_tasks_blocked()
            assert len(model.requests) == tried  # no hammering inside the backoff
            # Until the timer fired, the actor is asked nothing: a message it takes once the backoff is
            # over but before its timer fires cancels the timer, and the drain waits for new messages.
            clock.jump(BACKOFF_S)
            await wait_until(lambda: len(model.requests) > tried)  # tried again once the backoff lapsed
            await wait_until(lambda: backing_off_after(m, wake))  # failed again: waits longer
            assert len(model.requests) == tried + 1
            outage["on"] = False
            clock.jump(2 * BACKOFF_S)  # the backoff doubled
            await wait_until(lambda: len(model.requests) > tried + 1)  # the drain retries by itself
            await wait_until(lambda: has_summaries(m))
            assert (await strategy(m)).attempts == {}


# -- T5: holds -------------------------------------------------------------------------------


async def test_a_held_message_and_everything_after_it_stay_raw_until_released(tmp_path: Path) -> None:
    """A hold keeps its message and every later one out of chunks and raw in compiles; releasing lets them go (T5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(auto_tick=True))
            ids = await add_all(m, 6)
            ids.append(await m.add_message("user", say(6), hold_compression=True))
            ids += await add_all(m, 13, start=7)
            await m.wait_ready()
            assert await chunk_ids(m) == [tuple(ids[:4])]  # ids[4:6] can't close a chunk before the hold
            result = await m.compile(budget(1_000))
            assert set(ids[4:]) <= raw_sources(result)
            assert [s[0].id for s in result.provenance.messages[-len(ids[4:]) :]] == ids[4:]
            await m.release_compression([ids[6]])
            await m.wait_ready()
            assert [i for c in (await chunk_ids(m)) for i in c] == ids
            assert len(await m.search_summaries()) == 5


async def test_hold_compression_on_a_stored_message_holds_it_and_what_follows(tmp_path: Path) -> None:
    """``hold_compression(ids)`` holds from the earliest id it names; the rest of the zone still compresses (T5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 4)
            later = await add_all(m, 12, start=4)
            await m.hold_compression([later[5], later[2]])
            await m.wait_ready()
            assert await chunk_ids(m) == [tuple(ids)]
            await m.release_compression([later[2]])
            await m.wait_ready()
            assert await chunk_ids(m) == [tuple(ids), tuple(later[:4])]  # later[4] comes before the hold on later[5]


async def test_a_hold_with_a_timeout_lapses_by_itself(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A hold with a timeout keeps messages raw until it lapses, then they are chunked (T5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = [await m.add_message("user", say(0), hold_compression=HOLD_S)]
            ids += await add_all(m, 7, start=1)
            await m.wait_ready()
            assert await chunk_ids(m) == []
            clock.jump(HOLD_S)
            await trio.testing.wait_all_tasks_blocked()  # the actor's timer fired: the hold lapsed
            await m.wait_ready()
            assert await chunk_ids(m) == [tuple(ids[:4]), tuple(ids[4:])]


async def test_a_lapsed_hold_resumes_background_compression_without_new_messages(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    """Under auto_tick, a hold timing out wakes the drain: the held chunk compresses with no further call (T5, T8)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(auto_tick=True))
            await m.add_message("user", say(0), hold_compression=HOLD_S)
            await add_all(m, 3, start=1)
            await trio.testing.wait_all_tasks_blocked()
            assert model.requests == [] and await chunk_ids(m) == []
            clock.jump(HOLD_S)
            await wait_until(lambda: bool(model.requests))
            assert markers(text_of(model.requests[0].messages[-1])) == [0, 1, 2, 3]


# -- T6: summary reads and head-window reset -------------------------------------------------


async def test_search_summaries_by_text_regex_levels_and_merged(tmp_path: Path) -> None:
    """Text counts case-insensitively, regex counts matches, results sort by count; merged ones only on request (T6)."""
    contents = {0: "Alpha beta ALPHA", 1: "alpha alpha alpha", 2: "gamma", 3: "merged: alpha"}

    def write(request: ModelRequest) -> str:
        found = markers(text_of(request.messages[-1]))
        return contents[found[0] // 4] if found else contents[3]

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(write), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=2))
            await add_all(m, 12)
            await m.wait_ready()
            everything = await m.search_summaries(include_merged=True)
            by_content = {match.summary.content: match.summary for match in everything}
            assert sorted(by_content) == sorted(contents.values())
            found = await m.search_summaries(text="alpha", include_merged=True)
            assert [(f.summary.content, f.matches) for f in found] == [
                ("alpha alpha alpha", 3), ("Alpha beta ALPHA", 2), ("merged: alpha", 1)
            ]
            assert [(f.summary.content, f.matches) for f in await m.search_summaries(regex=r"al\w+")] == [
                ("merged: alpha", 1)
            ]  # the frontier only: the two merged L1s are left out
            regex = await m.search_summaries(regex=r"a[lm]", include_merged=True, levels=[1])
            assert [(f.summary.content, f.matches) for f in regex] == [("alpha alpha alpha", 3), ("gamma", 1)]
            assert [f.summary.level for f in await m.search_summaries(levels=[2])] == [2]
            assert await m.search_summaries(text="zeta") == []
            assert len(await m.search_summaries(include_merged=True, limit=2)) == 2
            assert all(f.matches == 1 for f in everything)  # no matcher: each matches once


async def test_get_summaries_in_range_selects_by_message_timestamps(tmp_path: Path) -> None:
    """A summary is in range when the span of its first and last messages' timestamps meets it; sorted by start (T6)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=2))
            for i in range(12):
                await m.add_message("user", say(i), timestamp_ms=1_000 * (i + 1))
            await m.wait_ready()
            l1 = await m.get_summaries_in_range(level=1)
            assert [(s.first_id, s.last_id) for s in l1] == [c for c in ((c[0], c[-1]) for c in await chunk_ids(m))]
            # L1s cover 1,000-4,000, 5,000-8,000 and 9,000-12,000 ms.
            assert [s.content for s in await m.get_summaries_in_range(from_ms=4_500, to_ms=8_500, level=1)] == [
                "memory <m00004> to <m00007>"
            ]
            assert len(await m.get_summaries_in_range(from_ms=4_000, to_ms=5_000, level=1)) == 2  # inclusive ends
            assert len(await m.get_summaries_in_range(from_ms=8_001, level=1)) == 1
            assert len(await m.get_summaries_in_range(to_ms=999)) == 0
            everything = await m.get_summaries_in_range()
            assert {s.level for s in everything} == {1, 2}  # merged ones too: callers drop what they want
            assert [s.first_sequence for s in everything] == sorted(s.first_sequence for s in everything)


async def test_get_summary_by_id(tmp_path: Path) -> None:
    """``get_summary`` returns the summary with that id, merged or not, and None for an unknown id (T6)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 4)
            await m.wait_ready()
            [match] = await m.search_summaries()
            summary = await m.get_summary(match.summary.id)
            assert summary == match.summary
            assert (summary.first_id, summary.last_id, summary.source_ids) == (ids[0], ids[-1], tuple(ids))
            assert await m.get_summary("L1-999") is None


async def test_summaries_and_merges_survive_a_restart(tmp_path: Path) -> None:
    """Summaries, their parents and what is queued are the same after closing and reopening the runtime (T3)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            await add_all(m, 4 * 5)
            await m.wait_ready()
            before = await m.search_summaries(include_merged=True)
            requests = len(model.requests)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            assert await m.is_ready()
            assert await m.search_summaries(include_merged=True) == before
            await add_all(m, 4, start=20)
            await m.wait_ready()
            # Only the new chunk, then the merge it completes: nothing is compressed again.
            assert len(model.requests) == requests + 2
            assert markers(text_of(model.requests[requests].messages[-1])) == [20, 21, 22, 23]
            assert [s.summary.level for s in await m.search_summaries()] == [2, 2]


async def test_reset_head_window_with_text_starts_a_head_at_the_transition_message(tmp_path: Path) -> None:
    """The given text becomes a "[Topic Transition]" message that starts the new head window; earlier messages
    are still summarised or raw, never dropped, and the head's start survives a restart (T6)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        config = autobio(head_window_tokens=30, recent_window_tokens=20)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=config)
            before = await add_all(m, 14)
            await m.wait_ready()  # chunks close after the old head and before the old recent window
            transition = await m.reset_head_window("Now: the budget review.")
            stored = await m.get_message(transition)
            assert (stored.participant, text_of(stored)) == ("Context Manager", f"{TRANSITION_PREFIX}\n\nNow: the budget review.")
            after = await add_all(m, 14, start=14)
            await m.wait_ready()
            result = await m.compile(budget(10_000))
            # The head: the transition message (15 tokens) and the first 10-token message after it.
            assert [s[0].id for s in result.provenance.messages[:2]] == [transition, after[0]]
            assert [c.cache_breakpoint for c in result.messages[:3]] == [False, True, False]
            assert set(before + after) <= raw_sources(result) | await covered_by_shown(m, result)
            assert set(before[:3]) <= raw_sources(result)  # the old head stays raw, after the new head
            assert (await chunk_ids(m))[2] == tuple(before[11:])  # the stretch before the transition closed at it
            assert requests_reaching_past_their_chunk(model) == []
            assert not any("Summarize" in text_of(r.messages[-1]) for r in model.requests)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=config)
            again = await m.compile(budget(10_000))
            assert again.provenance.messages[0][0].id == transition


def requests_reaching_past_their_chunk(model: ScriptedModel) -> list[int]:
    late = []
    for number, request in enumerate(l1_requests(model)):
        chunk = markers(text_of(request.messages[-1]))
        if max(n for message in request.messages for n in markers(text_of(message))) > max(chunk):
            late.append(number)
    return late


async def test_reset_head_window_without_text_asks_the_model_for_a_transition_summary(tmp_path: Path) -> None:
    """Without text, the model summarises the head window; its reply is the transition message, for the reader
    the manager compiles for, after the floor covers what it read (T6, D2, D8)."""
    floors: list[int] = []
    rt_box: list[ctxrt.Runtime] = []

    async def answer(request: ModelRequest) -> str:
        floors.append(floor_of(await rt_box[0].list_namespaces()))
        if "Summarize the prior conversation" in text_of(request.messages[-1]):
            return "We planned the launch."
        return remember(request)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(answer)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            rt_box.append(rt)
            m = await rt.open(NS, strategy=autobio(head_window_tokens=30, recent_window_tokens=20), view_reader="alice")
            ids = await add_all(m, 6)
            transition = await m.reset_head_window()
            [request] = model.requests
            assert markers(text_of(request.messages[-1])) == [0, 1, 2]  # the head window it replaces
            assert floors == [int(ids[2])]
            stored = await m.get_message(transition)
            assert stored.content == (Text(f"{TRANSITION_PREFIX}\n\nWe planned the launch.", audience=("alice",)),)
            result = await m.compile(budget(10_000))
            assert result.provenance.messages[0][0].id == transition
            assert result.messages[0].content == (Text(f"{TRANSITION_PREFIX}\n\nWe planned the launch."),)


async def test_reset_head_window_without_text_makes_nothing_when_the_model_refuses(tmp_path: Path) -> None:
    """A refused transition summary raises ModelError and adds no message (T6, T4)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(lambda request: ModelResponse((), "refusal", Usage(1, 0)))
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(head_window_tokens=30))
            await add_all(m, 6)
            with pytest.raises(ctxrt.ModelError, match=NS):
                await m.reset_head_window()
            assert await m.message_count() == 6
            assert (await strategy(m)).head_start_id is None


# -- T7: Knowledge ---------------------------------------------------------------------------


def _message(*blocks: Any, participant: str = "Claude") -> ctxrt.Message:
    return ctxrt.Message("1", 1, participant, tuple(blocks), None, 0, ())


def test_phase_of_classifies_messages_by_the_tools_they_call() -> None:
    """Lesson tools beat ``subagent:`` beats ``mcpl:``/``zulip:`` research; other tools and dialogue are synthesis (T7)."""
    assert phase_of(_message(Text("thinking aloud"))) == "synthesis"
    assert phase_of(_message(ToolUse("a", "mcpl:search", {}))) == "research"
    assert phase_of(_message(ToolUse("a", "zulip:read", {}))) == "research"
    assert phase_of(_message(ToolUse("a", "subagent:planner", {}))) == "subagent"
    assert phase_of(_message(ToolUse("a", "lessons:create", {}))) == "lesson"
    assert phase_of(_message(ToolUse("a", "lessons:update", {}))) == "lesson"
    assert phase_of(_message(ToolUse("a", "lessons:delete", {}))) == "synthesis"  # exact names only
    assert phase_of(_message(ToolUse("a", "bash", {}))) == "synthesis"
    mixed = _message(ToolUse("a", "mcpl:search", {}), ToolUse("b", "subagent:x", {}), ToolUse("c", "lessons:update", {}))
    assert phase_of(mixed) == "lesson"
    assert phase_of(_message(ToolUse("a", "mcpl:x", {}), ToolUse("b", "subagent:y", {}))) == "subagent"


def test_phases_let_a_tool_result_message_inherit_the_last_tool_phase() -> None:
    """A message of tool results only takes the phase before it; dialogue resets to synthesis (T7)."""
    sequence = [
        _message(ToolUse("a", "zulip:read", {})),
        _message(ToolResult("a", "ok"), participant="user"),
        _message(Text("so")),
        _message(ToolResult("b", "late"), participant="user"),
        _message(ToolUse("c", "subagent:x", {})),
        _message(ToolResult("c", "done"), participant="user"),
    ]
    assert phases(sequence) == ["research", "research", "synthesis", "synthesis", "subagent", "subagent"]
    assert phase_of(_message(ToolResult("a", "ok")), "lesson") == "lesson"
    assert phase_of(_message(ToolResult("a", "ok"), Text("and more"))) == "synthesis"


async def test_knowledge_chunks_close_at_phase_changes(tmp_path: Path) -> None:
    """A Knowledge chunk closes where the phase changes (two messages at least), never after a tool_use (T7)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=ctxrt.Knowledge(MODEL, target_chunk_tokens=1_000, recent_window_tokens=0,
                                                          l1_holdback_chunks=0))
            ids = await add_all(m, 3)  # synthesis
            for n in range(2):  # research
                ids.append(await m.add_message("Claude", [tool_use(f"r{n}", "mcpl:search")]))
                ids.append(await m.add_message("user", [tool_result(f"r{n}")]))
            ids.append(await m.add_message("Claude", [tool_use("l0", "lessons:create")]))  # lesson
            ids.append(await m.add_message("user", [tool_result("l0")]))
            ids += await add_all(m, 1, start=9)  # a lone synthesis message can't close a chunk on its own
            ids.append(await m.add_message("Claude", [tool_use("s0", "subagent:critic")]))
            ids.append(await m.add_message("user", [tool_result("s0")]))
            ids += await add_all(m, 2, start=12)
            await m.compile(budget(100))
            assert await chunk_ids(m) == [tuple(ids[:3]), tuple(ids[3:7]), tuple(ids[7:9]), tuple(ids[9:12])]
            assert (await strategy(m)).name == "knowledge"


async def test_knowledge_chunks_close_at_their_phase_ceiling(tmp_path: Path) -> None:
    """Within one phase a Knowledge chunk closes at its ceiling: 1.5x the target for synthesis (T7)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), durability="os") as rt:
            m = await rt.open(NS, strategy=ctxrt.Knowledge(MODEL, target_chunk_tokens=40, recent_window_tokens=0,
                                                          l1_holdback_chunks=0))
            await add_all(m, 13)
            await m.compile(budget(100))
            assert [len(c) for c in (await chunk_ids(m))] == [6, 6]  # 60 tokens = 1.5 x 40


async def test_knowledge_asks_phase_specific_instructions_that_keep_leads(tmp_path: Path) -> None:
    """Knowledge's L1 instruction names the chunk's phases, their guidance and [LEAD]; merges keep [LEAD] too (T7)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(lambda request: "found: the API limit [LEAD] ask ops")
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=ctxrt.Knowledge(MODEL, target_chunk_tokens=1_000, recent_window_tokens=0,
                                                          l1_holdback_chunks=0, merge_threshold=2))
            await add_all(m, 2)
            for n in range(2):
                await m.add_message("Claude", [tool_use(f"r{n}", "zulip:search")])
                await m.add_message("user", [tool_result(f"r{n}")])
            await add_all(m, 2, start=10)
            await m.wait_ready()
            synthesis, research = (text_of(r.messages[-1]) for r in model.requests[:2])
            assert "[LEAD]" in synthesis and INSTRUCTIONS["synthesis"] in synthesis
            assert INSTRUCTIONS["research"] not in synthesis
            assert "[LEAD]" in research and INSTRUCTIONS["research"] in research and "research" in research
            phases_found = {s.summary.phase for s in await m.search_summaries(levels=[1], include_merged=True)}
            assert phases_found == {"synthesis", "research"}
            assert any(s.summary.level == 2 and "[LEAD]" in s.summary.content for s in await m.search_summaries())


# -- plain planning: the strategy as synchronous code over PlainContext (no trio, no store) ----


def msg(sequence: int, *blocks: Any, participant: str = "user") -> ctxrt.Message:
    """Message ``sequence`` (its id is the sequence), ``say(sequence)`` unless blocks are given."""
    return ctxrt.Message(
        id=str(sequence), sequence=sequence, participant=participant, content=blocks or (Text(say(sequence)),),
        metadata=None, timestamp_ms=1_000 * sequence, caused_by=(),
    )


class RecordingContext(PlainContext):
    """A PlainContext that notes, for every chunk record it is given, the floor at that moment."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.floor_at_record: list[tuple[int, int]] = []  # (floor, the chunk's last sequence)

    def append_log(self, name: str, value: Any) -> None:
        if name == "chunks":
            self.floor_at_record.append((self.floor, value["last"]))
        super().append_log(name, value)


def planned(count: int, config: Any = None, **overrides: Any) -> tuple[AutobiographicalStrategy, RecordingContext]:
    """A strategy initialised over messages 1..count (``autobio(**overrides)`` unless a config is given)."""
    ctx = RecordingContext([msg(i) for i in range(1, count + 1)])
    strategy_ = (config or autobio(**overrides)).create()
    strategy_.initialize(ctx)
    return strategy_, ctx


def answer(text: str, stop_reason: str = "end_turn") -> ModelResponse:
    return ModelResponse((Text(text),), stop_reason, Usage(1, 1))


def run_unit(strategy_: AutobiographicalStrategy, ctx: PlainContext, text: str | None = None) -> Unit:
    """Plan the next unit, mark its reach as the actor would (D2), and apply a remembering reply."""
    unit = strategy_.next_unit(ctx)
    assert unit is not None
    ctx.mark_compression_read(unit.reaches)
    request = strategy_.request_for(unit, ctx)
    assert strategy_.apply_unit(unit, answer(text or remember(request)), ctx)
    return unit


def request_markers(request: ModelRequest) -> list[int]:
    return [n for message in request.messages for n in markers(text_of(message))]


def test_plain_initialize_writes_nothing_and_the_first_unit_closes_chunks_at_the_target() -> None:
    """``initialize`` only reads; ``next_unit`` closes chunks of four 10-token messages at the 40-token target,
    each record written after the floor covers it (T3, D2)."""
    strategy_, ctx = planned(10)
    assert (ctx.logs, ctx.values, ctx.floor, strategy_.chunks) == ({}, {}, 0, [])
    assert not strategy_.is_ready()  # chunks can close: there is work
    strategy_.next_unit(ctx)
    assert ctx.logs["chunks"] == [
        {"id": "c-0", "ids": ["1", "2", "3", "4"], "first": 1, "last": 4},
        {"id": "c-1", "ids": ["5", "6", "7", "8"], "first": 5, "last": 8},
    ]  # 9 and 10 are 20 tokens: not a chunk yet
    assert ctx.floor == 8
    assert ctx.floor_at_record == [(4, 4), (8, 8)]  # the floor first, then the record
    ctx.messages += [msg(11), msg(12)]
    strategy_.on_new_message(ctx.messages[-1], ctx)
    strategy_.next_unit(ctx)
    assert [c["ids"] for c in ctx.logs["chunks"]][2:] == [["9", "10", "11", "12"]]
    assert ctx.floor == 12


def test_plain_chunks_hold_at_least_four_messages_and_never_end_on_a_tool_use() -> None:
    """A 1-token target still takes four messages; a chunk reaching it on a tool_use takes the result too (T3, P4)."""
    messages = [msg(1), msg(2), msg(3), msg(4, ToolUse("t1", "search", {}), participant="Claude"),
                msg(5, ToolResult("t1", "found")), msg(6), msg(7)]
    ctx = PlainContext(messages)
    strategy_ = autobio(target_chunk_tokens=1).create()
    strategy_.initialize(ctx)
    strategy_.next_unit(ctx)
    assert [c["ids"] for c in ctx.logs["chunks"]] == [["1", "2", "3", "4", "5"]]


def test_plain_next_unit_is_the_oldest_pending_chunk_reaching_its_last_sequence() -> None:
    """The unit is the oldest chunk without an L1; its ``reaches`` is the chunk's last sequence, so the actor's
    floor covers it before the request exists; asking again plans the same unit (T3, D2)."""
    strategy_, ctx = planned(12)
    unit = strategy_.next_unit(ctx)
    assert unit is not None and (unit.key, unit.reaches) == ("c-0", 4)
    assert unit.work.message_ids == ("1", "2", "3", "4")
    assert strategy_.next_unit(ctx) == unit  # nothing applied: the same unit, no new chunk records
    assert len(ctx.logs["chunks"]) == 3
    run_unit(strategy_, ctx)
    unit = strategy_.next_unit(ctx)
    assert unit is not None and (unit.key, unit.reaches) == ("c-1", 8)


def test_plain_the_newest_closed_chunk_is_held_back() -> None:
    """With ``l1_holdback_chunks=1`` the newest closed chunk waits for a later one."""
    strategy_, ctx = planned(8, l1_holdback_chunks=1)
    assert run_unit(strategy_, ctx).key == "c-0"
    assert strategy_.next_unit(ctx) is None and strategy_.is_ready()
    ctx.messages += [msg(i) for i in range(9, 13)]
    strategy_.on_new_message(ctx.messages[-1], ctx)
    assert run_unit(strategy_, ctx).key == "c-1"


def test_plain_a_request_is_as_of_its_chunk() -> None:
    """A chunk's request is the head, prior recall pairs, the chunk and the instruction, and holds nothing
    after the chunk, though later messages exist (T4)."""
    strategy_, ctx = planned(14, head_window_tokens=20)
    ctx.system_prompt = "You remember for the diary."
    first = strategy_.next_unit(ctx)
    assert first is not None and first.work.message_ids == ("3", "4", "5", "6")  # after the head (1, 2)
    request = strategy_.request_for(first, ctx)
    assert (request.model, request.system, request.max_tokens) == (MODEL, "You remember for the diary.", 75)
    assert markers(text_of(request.messages[0])) == [1, 2]  # the head window leads
    assert markers(text_of(request.messages[-1])) == [3, 4, 5, 6]  # the chunk, in the last message
    assert max(request_markers(request)) == 6  # nothing after the chunk (7..14 exist)
    assert "<earlier_in_conversation>" in text_of(request.messages[-1])
    strategy_.apply_unit(first, answer("memory <m00003> to <m00006>"), ctx)
    second = strategy_.next_unit(ctx)
    assert second is not None and second.key == "c-1"
    request = strategy_.request_for(second, ctx)
    recalls = [text_of(m) for m in request.messages]
    assert "[Recall L1-0]" in recalls and "memory <m00003> to <m00006>" in recalls  # the prior memory, recalled
    assert max(request_markers(request)) == 10 == second.reaches
    ctx.system_prompt = None
    assert strategy_.request_for(second, ctx).system == SYSTEM


def test_plain_an_end_turn_text_reply_becomes_an_l1_summary() -> None:
    """A complete end_turn with text is stored as the chunk's L1: its record names the chunk's messages (T3, T4)."""
    strategy_, ctx = planned(8)
    unit = strategy_.next_unit(ctx)
    assert unit is not None
    assert strategy_.apply_unit(unit, answer("  memory of the plan  "), ctx) is True
    [record] = ctx.logs["summaries"]
    assert {k: record[k] for k in ("id", "level", "content", "source_ids", "first_sequence", "last_sequence",
                                   "first_id", "last_id")} == {
        "id": "L1-0", "level": 1, "content": "memory of the plan", "source_ids": ["1", "2", "3", "4"],
        "first_sequence": 1, "last_sequence": 4, "first_id": "1", "last_id": "4",
    }
    assert record["tokens"] == estimate_text("memory of the plan")
    assert [match.summary.id for match in strategy_.search_summaries(ctx)] == ["L1-0"]
    assert "attempts" not in ctx.values
    next_unit = strategy_.next_unit(ctx)
    assert next_unit is not None and next_unit.key == "c-1"


@pytest.mark.parametrize(
    "reply",
    [
        answer("I can't help with that.", "refusal"),
        answer("   "),
        ModelResponse((), "end_turn", Usage(1, 0)),
        answer("a memory cut off mid", "max_tokens"),
        ModelResponse((ToolUse("t9", "remember", {}),), "tool_use", Usage(1, 1)),
        ctxrt.ModelError("model-x: HTTP 400 invalid_request_error", retryable=False),
    ],
    ids=["refusal", "blank-text", "no-content", "max-tokens", "tool-use", "non-retryable-error"],
)
def test_plain_a_reply_that_is_not_a_memory_counts_an_attempt(reply: Any) -> None:
    """A refusal, an empty or cut-off reply, a tool call or a non-retryable error stores nothing and counts an
    attempt (progress), with no refusal ladder (T12); after MAX_ATTEMPTS the chunk is quarantined and the
    next one comes up (T4, T3, L2)."""
    strategy_, ctx = planned(8, refusal_fallbacks=0)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        unit = strategy_.next_unit(ctx)
        assert unit is not None and unit.key == "c-0"
        assert strategy_.apply_unit(unit, reply, ctx) is True
        assert ctx.values["attempts"] == {"c-0": attempt}  # stored: a restart doesn't retry forever
        assert "summaries" not in ctx.logs
    assert strategy_.quarantined() == ["c-0"]
    unit = strategy_.next_unit(ctx)
    assert unit is not None and unit.key == "c-1"


def test_plain_a_units_attempts_and_ladder_step_go_once_its_summary_is_made_and_at_load() -> None:
    """A unit's stored attempts and ladder step are dropped once its summary is made, and a done
    unit's read back are dropped at load: neither record grows with the run (T13, T12)."""
    strategy_, ctx = planned(12, refusal_fallbacks=0)
    unit = strategy_.next_unit(ctx)
    assert unit is not None and unit.key == "c-0"
    strategy_.apply_unit(unit, answer("no", "refusal"), ctx)
    assert ctx.values["attempts"] == {"c-0": 1}
    strategy_.apply_unit(unit, answer("memory of the plan"), ctx)
    assert ctx.values["attempts"] == {} and strategy_.attempts == {}
    ctx.values["attempts"] = {"c-0": 2, "c-1": 1}  # as an earlier version left them
    ctx.values["ladder"] = {"c-0": {"rung": "plain_text", "taken": 1}, "c-1": {"rung": "plain_text", "taken": 1}}
    restarted = autobio(refusal_fallbacks=0).create()
    restarted.initialize(ctx)
    assert restarted.attempts == {"c-1": 1} and list(restarted.ladder) == ["c-1"]


async def test_a_garbled_attempts_record_is_logged_and_its_units_count_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored ``attempts`` record this version can't read (a count that isn't a whole number) is
    logged at ERROR naming the namespace, branch and record, and its units count from 0 again: the
    namespace compiles and compresses on (T13)."""
    refusing = ScriptedModel(lambda request: ModelResponse((Text("no"),), "refusal", Usage(1, 1)))
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=refusing, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(refusal_fallbacks=0))
            ids = await add_all(m, 8)
            assert await m.tick()
            state = states.strategy_state(NS, "autobio", "attempts")
            await rt.store.ask(SetValue(state=state, branch="main", value={"c-0": "3"}))
        caplog.set_level(logging.ERROR, logger="ctxrt.autobiographical")
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(refusal_fallbacks=0))
            await m.compile(budget(1_000))
            assert (await strategy(m)).attempts == {}
            await m.wait_ready()
            assert {s.summary.source_ids for s in await m.search_summaries()} == {tuple(ids[:4]), tuple(ids[4:])}
    [logged] = [r.getMessage() for r in caplog.records if "attempts" in r.getMessage()]
    assert "'c-0'" in logged and f"namespace {NS!r} on branch 'main'" in logged


async def test_a_garbled_summary_record_refuses_the_start_naming_it_and_another_strategy_recovers(
    tmp_path: Path
) -> None:
    """A stored summary this version can't read is the namespace's memory: the strategy refuses to
    start rather than lose it, naming the namespace, branch and record; set_strategy to a config
    that reads it again is refused the same way, and another strategy recovers (T13, C5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            await add_all(m, 8)
            await m.wait_ready()
            state = states.strategy_state(NS, "autobio", "summaries")
            await rt.store.ask(AppendItem(state=state, branch="main", data=json.dumps({"id": "L1-9", "level": "1"}).encode()))
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            named = rf"summaries record #2 .* of namespace {NS!r} on branch 'main' can't be read"
            with pytest.raises(ctxrt.StrategyRefusedError, match=named):
                await m.compile(budget(1_000))
            with pytest.raises(ctxrt.StrategyRefusedError, match=named):  # it reads the same record
                await m.set_strategy(autobio(recent_window_tokens=30))
            with pytest.raises(ctxrt.StrategyRefusedError, match=named):
                await m.compile(budget(1_000))
            await m.set_strategy(ctxrt.WindowedPassthrough())
            assert len((await m.compile(budget(1_000))).provenance.messages) == 8


def test_plain_a_retryable_error_backs_off_without_counting_an_attempt() -> None:
    """A retryable failure leaves the chunk first in line, counts nothing and sets a doubling backoff on the
    context's clock; a good reply clears it; a streak of RETRYABLE_STREAK_LIMIT counts one attempt (L2, T8)."""
    strategy_, ctx = planned(8)
    outage = ctxrt.ModelError("model-x: HTTP 529 overloaded_error", retryable=True)
    ctx.clock = 100.0
    unit = strategy_.next_unit(ctx)
    assert unit is not None
    assert strategy_.apply_unit(unit, outage, ctx) is False  # no progress: the drain waits
    assert strategy_.wake_at() == 100.0 + BACKOFF_S
    assert "attempts" not in ctx.values and strategy_.attempts == {} and strategy_.quarantined() == []
    ctx.clock = 101.0
    assert strategy_.next_unit(ctx) == unit  # still first in line
    assert strategy_.apply_unit(unit, outage, ctx) is False
    assert strategy_.wake_at() == 101.0 + 2 * BACKOFF_S
    assert strategy_.apply_unit(unit, answer("memory of the plan"), ctx) is True
    assert strategy_.wake_at() is None and [r["content"] for r in ctx.logs["summaries"]] == ["memory of the plan"]
    unit = strategy_.next_unit(ctx)
    assert unit is not None and unit.key == "c-1"
    for _ in range(RETRYABLE_STREAK_LIMIT - 1):
        assert strategy_.apply_unit(unit, outage, ctx) is False
    assert "attempts" not in ctx.values
    assert strategy_.apply_unit(unit, outage, ctx) is True  # the streak's end counts as one attempt
    assert ctx.values["attempts"] == {"c-1": 1}


def test_plain_l1s_merge_at_the_merge_threshold() -> None:
    """L1s come first; once ``merge_threshold`` are unmerged they merge into an L2 told only their memories,
    reaching their last sequence; the merged L1s get the L2 as parent (T3, T4, D2)."""
    strategy_, ctx = planned(12, merge_threshold=3)
    assert [run_unit(strategy_, ctx).key for _ in range(2)] == ["c-0", "c-1"]
    assert run_unit(strategy_, ctx).key == "c-2"  # two L1s don't merge: the next chunk comes first
    merge = strategy_.next_unit(ctx)
    assert merge is not None and (merge.key, merge.reaches) == ("L1-0,L1-1,L1-2", 12)
    request = strategy_.request_for(merge, ctx)
    assert [text_of(m) for m in request.messages[:-1]] == [
        "memory <m00001> to <m00004>", "memory <m00005> to <m00008>", "memory <m00009> to <m00012>"
    ]
    assert "consolidate" in text_of(request.messages[-1])
    assert strategy_.apply_unit(merge, answer("memory <m00001> to <m00012>"), ctx)
    l2 = ctx.logs["summaries"][-1]
    assert (l2["id"], l2["level"], l2["source_ids"], l2["first_sequence"], l2["last_sequence"]) == (
        "L2-3", 2, ["L1-0", "L1-1", "L1-2"], 1, 12
    )
    assert {s.id: s.parent_id for s in strategy_.summaries} == {"L1-0": "L2-3", "L1-1": "L2-3", "L1-2": "L2-3",
                                                                "L2-3": None}
    assert strategy_.next_unit(ctx) is None and strategy_.is_ready()


def test_plain_select_fits_the_budget_and_shows_the_frontier() -> None:
    """select fits ``budget.usable``: the recent window raw (newest first), the frontier summary, then the newest
    uncovered raw messages; a dry run writes nothing; a real one closes chunks first (T3, P2, P1, D4)."""
    strategy_, ctx = planned(40, merge_threshold=4, recent_window_tokens=30)
    dry = strategy_.select(ctx.view, budget(1_000), SelectOptions(dry_run=True, context=ctx))
    assert ctx.logs == {} and ctx.floor == 0  # a dry run closes nothing
    assert [e.source_ids for e in dry] == [(str(i),) for i in range(1, 41)]  # all raw: nothing summarised yet
    while strategy_.next_unit(ctx) is not None:
        run_unit(strategy_, ctx)
    # 1..36 closed into nine chunks (37 can't close alone; 38..40 are the recent window): eight L1s merged.
    frontier = sorted((s.first_sequence, s.last_sequence, s.level) for s in strategy_.summaries if s.parent_id is None)
    assert frontier == [(1, 16, 2), (17, 32, 2), (33, 36, 1)]
    shown = {s.id for s in strategy_.summaries if s.parent_id is None}
    for usable in (1_000, 120, 45, 5):
        entries = strategy_.select(ctx.view, budget(usable), SelectOptions(context=ctx))
        assert sum(estimate_blocks(e.content) for e in entries) <= usable
        newest = [e.source_ids[0] for e in entries if e.relation == "copy"][-3:]
        if usable >= 30:
            assert newest == ["38", "39", "40"]  # the recent window, raw, in order
    entries = strategy_.select(ctx.view, budget(1_000), SelectOptions(context=ctx))
    assert {i for e in entries for i in e.summary_ids} == shown
    covered = {i for e in entries if e.relation == "derived" for i in e.source_ids}
    raw = {e.source_ids[0] for e in entries if e.relation == "copy"}
    assert covered | raw == {str(i) for i in range(1, 41)} and not covered & raw


def test_plain_knowledge_chunks_at_phase_changes_asks_by_phase_and_caps_research() -> None:
    """Knowledge closes chunks at phase changes, asks each L1 with its phase's guidance and [LEAD], records the
    chunk's phase, and shows research L1s within 0.3 of the level's allowance, synthesis within 0.7 (T7)."""
    messages: list[ctxrt.Message] = []
    for base in (0, 8, 16):
        messages += [msg(base + i) for i in range(1, 5)]  # synthesis
        for n in (base + 5, base + 7):  # research: a call and its result, twice
            messages.append(msg(n, ToolUse(f"r{n}", "mcpl:search", {}), participant="Claude"))
            messages.append(msg(n + 1, ToolResult(f"r{n}", "found it")))
    messages.append(msg(25))  # synthesis again: the last research stretch closes
    ctx = PlainContext(messages)
    strategy_ = ctxrt.Knowledge(MODEL, target_chunk_tokens=1_000, recent_window_tokens=0, l1_holdback_chunks=0,
                                merge_threshold=100).create()
    strategy_.initialize(ctx)
    chunks = []
    while (unit := strategy_.next_unit(ctx)) is not None:
        ctx.mark_compression_read(unit.reaches)
        instruction = text_of(strategy_.request_for(unit, ctx).messages[-1])
        phase = "research" if "[Tool: mcpl:search]" in instruction else "synthesis"
        other = "synthesis" if phase == "research" else "research"
        assert INSTRUCTIONS[phase] in instruction and INSTRUCTIONS[other] not in instruction
        assert "[LEAD]" in instruction
        memory = f"{phase} memory of what we went over"
        while len(memory) < 58:
            memory += " ok"
        assert strategy_.apply_unit(unit, answer(memory[:58]), ctx)
        chunks.append(unit.work.message_ids)
    assert chunks == [tuple(m.id for m in messages[b : b + 4]) for b in range(0, 24, 4)]
    assert [(s.phase, s.tokens) for s in strategy_.summaries] == [("synthesis", 20), ("research", 20)] * 3
    # Usable 200, each shown L1 costing 40: synthesis may take 0.7 (140: all three), research 0.3 (60: one,
    # the newest); raw messages of the research stretches left out fill what is left.
    entries = strategy_.select(ctx.view, budget(200), SelectOptions(context=ctx))
    assert list(dict.fromkeys(i for e in entries for i in e.summary_ids)) == ["L1-0", "L1-2", "L1-4", "L1-5"]
    assert sum(estimate_blocks(e.content) for e in entries) <= 200

# -- T8: the drain ---------------------------------------------------------------------------


async def test_auto_tick_compresses_in_the_background_without_tick(tmp_path: Path) -> None:
    """With auto_tick, new messages start compression in the namespace actor: no tick() or wait_ready() needed (T8)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(auto_tick=True, merge_threshold=3))
            await add_all(m, 12)
            await wait_until(m.is_ready)
            assert [s.summary.level for s in await m.search_summaries()] == [2]
            assert len(model.requests) == 4


async def test_without_auto_tick_nothing_compresses_until_asked(tmp_path: Path) -> None:
    """Without auto_tick no request is sent by itself; tick() does one unit of work per call (T8)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=2))
            await add_all(m, 8)
            await trio.testing.wait_all_tasks_blocked()
            assert model.requests == []
            assert await m.tick()  # L1 of chunk 0
            assert [len(model.requests), len(await m.search_summaries(include_merged=True))] == [1, 1]
            assert await m.tick()  # L1 of chunk 1
            assert [len(model.requests), len(await m.search_summaries(include_merged=True))] == [2, 2]
            assert not await m.is_ready()
            assert await m.tick()  # the merge
            assert [s.summary.level for s in await m.search_summaries()] == [2]
            assert await m.is_ready()
            assert not await m.tick()  # nothing left
            assert len(model.requests) == 3


async def test_wait_ready_drives_compression_to_ready(tmp_path: Path) -> None:
    """wait_ready() runs every queued chunk and merge, then is_ready() holds (T8)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=3))
            await add_all(m, 4 * 9)
            assert not await m.is_ready()
            await m.wait_ready()
            assert await m.is_ready()
            assert len(model.requests) == 9 + 3 + 1
            await m.wait_ready()  # nothing to do: returns at once
            assert len(model.requests) == 13


# -- P1: compile never waits for compression -------------------------------------------------


async def test_compile_does_not_wait_for_an_outstanding_compression(tmp_path: Path) -> None:
    """While a compression request is out, compile, add_message and is_ready answer at once (P1, T8)."""
    release = trio.Event()
    sent = trio.Event()

    async def slow(request: ModelRequest) -> str:
        sent.set()
        await release.wait()
        return remember(request)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(slow)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(auto_tick=True))
            ids = await add_all(m, 4)
            await sent.wait()
            with trio.fail_after(2):
                result = await m.compile(budget(1_000))
                ids += await add_all(m, 2, start=4)
                again = await m.compile(budget(1_000))
                assert not await m.is_ready()
            assert [s[0].id for s in result.provenance.messages] == ids[:4]  # raw while the request is out
            assert [s[0].id for s in again.provenance.messages] == ids
            assert not release.is_set() and await m.search_summaries() == []
            release.set()
            await m.wait_ready()
            [match] = await m.search_summaries()
            assert match.summary.source_ids == tuple(ids[:4])
            assert shown_summaries(await m.compile(budget(1_000))) == [match.summary.id]


# -- D2, D4, D7: the narrowing floor ---------------------------------------------------------


async def test_narrowing_floor_covers_each_chunk_before_its_request_is_sent(tmp_path: Path) -> None:
    """With a reader, the namespace's narrowing floor already covers a chunk (or a merge's span) when its
    request reaches the model (D2, D4)."""
    seen: list[tuple[int, int]] = []
    rt_box: list[ctxrt.Runtime] = []
    ids: list[str] = []

    async def check(request: ModelRequest) -> str:
        floor = floor_of(await rt_box[0].list_namespaces())
        reached = max(n for message in request.messages for n in markers(text_of(message)))
        seen.append((floor, int(ids[reached])))
        return remember(request)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(check)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            rt_box.append(rt)
            m = await rt.open(NS, strategy=autobio(auto_tick=True, merge_threshold=3, recent_window_tokens=30),
                              view_reader="alice")
            for i in range(40):
                ids.append(await m.add_message("user", say(i)))
            await m.wait_ready()
            assert len(seen) == len(model.requests) >= 10
            assert any("consolidate" in text_of(r.messages[-1]) for r in model.requests)
            for floor, needed in seen:
                assert floor >= needed
            closed = (await strategy(m)).chunks[-1].last_sequence
            assert floor_of(await rt.list_namespaces()) >= closed


async def test_no_narrowing_floor_is_written_without_a_reader(tmp_path: Path) -> None:
    """A namespace that compiles for no reader compresses without writing a floor (D7)."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=2))
            await add_all(m, 16)
            await m.wait_ready()
            assert len(model.requests) == 4 + 2 + 1
            assert floor_of(await rt.list_namespaces()) == 0


async def test_a_failing_floor_write_sends_no_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the floor can't be raised, no compression request goes out and the chunk waits; its record
    is written with the floor once the store takes it (D4, D2, T3)."""
    floor_state = states.floor_state(NS)

    async def refusing(command: Any) -> Any:
        commands = command.commands if isinstance(command, Atomically) else (command,)
        if any(isinstance(c, SetValue) and c.state == floor_state for c in commands):
            raise OSError("the store refused the floor write")
        return await real_ask(command)

    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(), view_reader="alice")
            await add_all(m, 4)
            real_ask = rt.store.ask
            monkeypatch.setattr(rt.store, "ask", refusing)
            await m.compile(budget(100))  # the chunk would close (and raise the floor) here: the compile goes on
            assert stored_log(rt, "chunks") == []  # no chunk record without its floor (D2)
            with pytest.raises(OSError, match="floor"):
                await m.tick()
            assert (await strategy(m)).attempts == {}  # not an attempt: nothing was asked
            assert model.requests == []
            assert floor_of(await rt.list_namespaces()) == 0
            monkeypatch.undo()
            await m.wait_ready()
            assert len(model.requests) == 1 and len(await m.search_summaries()) == 1
            [record] = stored_log(rt, "chunks")
            assert floor_of(await rt.list_namespaces()) >= record["last"]


# -- L2: faults through the real SDK ---------------------------------------------------------


FAULTS = {
    "429": ApiReply.error(429, "slow down"),
    "500": ApiReply.error(500, "internal"),
    "529": ApiReply.error(529, "overloaded"),
    "refusal": ApiReply.refusal("I won't summarise this."),
    "actor-timeout": ApiReply.text("too late").after(5),
    "sdk-timeout": ApiReply.text("too late").after(5),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_model_faults_leave_the_store_consistent_and_the_chunk_queued(tmp_path: Path, fault: str) -> None:
    """An HTTP error, a refusal or a reply past the timeout writes no summary, keeps the chunk queued and lets
    the manager compile throughout; the next good reply is used (L2, T3)."""
    replies = [FAULTS[fault].after(max(FAULTS[fault].delay_s, 0.2)), ApiReply.text("memory of the plan")]
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server(replies) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test") as client:
                model = ctxrt.AnthropicModel(client, max_retries=0, timeout_s=0.5 if fault == "sdk-timeout" else 30)
                timeout_s = 0.5 if fault == "actor-timeout" else MODEL_TIMEOUT_S
                async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os",
                                              model_timeout_s=timeout_s) as rt:
                    m = await rt.open(NS, strategy=autobio())
                    if fault == "actor-timeout":
                        assert (await m.inspect()).model_timeout_s == 0.5
                    ids = await add_all(m, 5)
                    await m.compile(budget(100))
                    chunks_before = stored_log(rt, "chunks")
                    compiles: list[ctxrt.CompileResult] = []
                    done = trio.Event()

                    async def tick() -> None:
                        # A refusal takes a rung (progress); an outage or timeout doesn't (the drain backs off).
                        assert await m.tick() == (fault == "refusal")
                        done.set()

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(tick)
                        while not done.is_set():  # each compile is a checkpoint: the tick goes on meanwhile
                            compiles.append(await m.compile(budget(1_000)))
                    assert len(server.requests) == 1
                    assert len(compiles) >= 3  # the manager kept compiling while the request was out
                    for result in compiles:
                        assert [s[0].id for s in result.provenance.messages] == ids
                    assert await m.search_summaries() == []
                    assert stored_log(rt, "summaries") == []
                    assert stored_log(rt, "chunks") == chunks_before
                    assert [c.id for c in (await strategy(m))._l1_queue()] == ["c-0"]
                    assert not await m.is_ready()
                    assert [m.id for m in await m.get_all_messages()] == ids
                    await m.wait_ready()
                    [match] = await m.search_summaries()
                    assert match.summary.content == "memory of the plan"
                    assert len(server.requests) == 2
                    body = server.requests[0]
                    assert body["model"] == MODEL and "<m00003>" in str(body["messages"])
                    assert "<m00004>" not in str(body["messages"])  # T4 through the wire too
                    result = await m.compile(budget(1_000))
                    assert shown_summaries(result) == [match.summary.id]
                    assert [s[0].id for s in result.provenance.messages[2:]] == ids[4:]
                async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
                    m = await rt.open(NS, strategy=autobio())
                    assert [s.summary.content for s in await m.search_summaries()] == ["memory of the plan"]
                    # A refusal took a rung of the ladder (T12), not an attempt; an outage counts none.
                    assert (await strategy(m)).attempts == {}


# -- a long run ------------------------------------------------------------------------------


LONG_RUN = 5_000


async def test_a_long_run_fits_its_budgets_keeps_tool_pairs_and_drops_nothing_uncovered(tmp_path: Path) -> None:
    """5,000 messages with background compression and a compile every 50: every compile fits its budget and keeps
    tool pairs whole; once ready, every message is raw or under a shown summary (T3, T8, P1, P2, P4)."""
    tight = Budget(max_tokens=2_200, reserve_for_response=1_000)  # less than the windows want: evictions
    roomy = Budget(max_tokens=6_000, reserve_for_response=1_000)  # the windows, the frontier and the debt fit
    with trio.fail_after(120):
        model = ScriptedModel(lambda request: remember(request) + " and then" * 20)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=ctxrt.Autobiographical(
                MODEL, target_chunk_tokens=300, head_window_tokens=100, recent_window_tokens=1_000, auto_tick=True,
                summary_target_tokens=100,
            ))
            ids: list[str] = []
            compiles = 0
            largest_message = 0
            for i in range(LONG_RUN):
                if i % 7 == 6:  # a tool call, answered at once
                    ids.append(await m.add_message("Claude", [{"type": "text", "text": say(i)}, tool_use(f"t{i}", "look")]))
                    ids.append(await m.add_message("user", [tool_result(f"t{i}")]))
                elif i % 97 == 0:
                    ids.append(await m.add_message("user", say(i) + " and at length" * 60))
                else:
                    ids.append(await m.add_message("Claude" if i % 2 else "user", say(i)))
                largest_message = max(largest_message, estimate_blocks((await m.get_message(ids[-1])).content))
                if i % 50 == 49:
                    result = await m.compile(tight)
                    compiles += 1
                    assert compiled_tokens(result) <= tight.usable
                    if i > 500:
                        # The budget is what binds: a greedy fill stops where the next piece doesn't fit,
                        # so the room it leaves is less than the largest piece (a message or a summary).
                        largest = max(largest_message, *(s.tokens + 20 for s in (await strategy(m)).summaries))
                        assert compiled_tokens(result) > tight.usable - largest
                    assert_tool_pairs_intact(result)
                    assert result.provenance.messages[-1][0].id == ids[-1]
            await m.wait_ready()
            for budget_ in (tight, roomy):
                result = await m.compile(budget_)
                assert compiled_tokens(result) <= budget_.usable
                assert_tool_pairs_intact(result)
            covered = await covered_by_shown(m, result)
            missing = [i for i in ids if i not in covered and i not in raw_sources(result)]
            assert missing == []
            assert compiles == LONG_RUN // 50
            levels = {s.summary.level for s in await m.search_summaries()}
            assert 3 in levels
            assert len((await strategy(m)).chunks) > 100
            assert len(model.requests) == len(await m.search_summaries(include_merged=True, limit=100_000))


# -- host controls: retry, render stats, strict, health (issue 13 items 4, 6) --------------------


async def test_retry_quarantined_puts_a_quarantined_chunk_back_and_it_compresses(tmp_path: Path) -> None:
    """Item 4: a quarantined unit is retried on demand; its failure count is reset in the store."""
    failing = [True]

    def flaky(request: ModelRequest) -> str:
        if failing[0] and "<m00000>" in text_of(request.messages[-1]):
            raise ctxrt.ModelError("model-x: HTTP 400 invalid_request_error", retryable=False)
        return remember(request)

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(flaky), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 8)
            await m.wait_ready()
            assert (await m.health()).quarantined == ("c-0",)
            assert await m.retry_quarantined() == ["c-0"]  # still failing: it quarantines again
            await m.wait_ready()
            assert (await m.health()).quarantined == ("c-0",)
            failing[0] = False
            assert await m.retry_quarantined() == ["c-0"]
            await m.wait_ready()
            assert (await m.health()).quarantined == ()
            covered = {i for s in await m.search_summaries() for i in s.summary.source_ids}
            assert covered == set(ids)
            assert await m.retry_quarantined() == []
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(flaky), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            assert (await m.health()).quarantined == ()  # the reset count was stored


async def test_render_stats_say_what_was_left_out_uncovered_and_strict_refuses_it(tmp_path: Path) -> None:
    """Item 6: history no summary covers that doesn't fit is reported, never silently dropped; a
    strict compile refuses it; once compression catches up, nothing is left out."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            assert m.render_stats() is None
            ids = await add_all(m, 16)
            result = await m.compile(budget(60))
            stats = m.render_stats()
            assert stats is not None and stats.dropped_ids
            assert set(stats.dropped_ids) == set(ids) - raw_sources(result)
            assert "no shown summary covers" in (stats.dropped_reason or "") and "not compressed yet" in (stats.dropped_reason or "")
            assert stats.total_tokens <= 60 and stats.pending_units > 0
            health = await m.health()
            assert health.pending_units > 0 and health.compression_debt_tokens >= 40
            assert health.last_compile_ms is not None and health.last_compile_ms >= 0
            with pytest.raises(ctxrt.OverBudgetError, match="strict compile refused"):
                await m.compile(budget(60), strict=True)
            await m.compile(budget(60), dry_run=True)
            assert m.render_stats() == stats  # a dry run leaves the last compile's stats
            await m.wait_ready()
            await m.compile(budget(200), strict=True)
            stats = m.render_stats()
            assert stats is not None and stats.dropped_ids == () and stats.dropped_reason is None
            assert sum(count for _, count in stats.summaries) >= 1 and stats.summary_tokens > 0
            assert (await m.health()).pending_units == 0


@pytest.mark.parametrize("holdback", [0, 2])
async def test_health_before_the_first_compile_says_what_the_compile_would_leave(tmp_path: Path, holdback: int) -> None:
    """T3, T8, P1: sixty messages wait for compression and nothing has compiled; health() agrees with
    is_ready() and counts the units and debt the chunks would make, as the first compile leaves them
    (with and without a holdback), and writes nothing (no chunk record, no floor)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            writer = await rt.open("writer")
            for i in range(60):
                await writer.add_message("user", say(i))
            m = await rt.open(NS, strategy=autobio(l1_holdback_chunks=holdback))
            before = rt.engine.last_sequence
            health = await m.health()
            assert not await m.is_ready()
            assert not health.ready and health.pending_units > 0 and health.compression_debt_tokens > 0
            assert rt.engine.last_sequence == before and stored_log(rt, "chunks") == []
            await m.compile(budget(10_000))
            after = await m.health()
            assert (after.ready, after.pending_units, after.compression_debt_tokens) == (
                health.ready, health.pending_units, health.compression_debt_tokens)
            await m.wait_ready()
            assert (await m.health()).pending_units == 0


async def test_new_messages_that_close_no_chunk_leave_the_namespace_ready(tmp_path: Path) -> None:
    """T3, T8, P1 (from a host-style attack): after an append that closes no chunk (it stays in the
    recent window), is_ready() and health().ready say True, as the tick that finds nothing to do
    does; before, both said False until a compile."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(recent_window_tokens=300))
            for i in range(2):
                await m.add_message("user", say(i))
                health = await m.health()
                assert await m.is_ready() and health.ready and health.pending_units == 0
            assert await m.tick() is False
            assert (await m.health()).ready


async def test_chunks_before_a_resident_joined_are_remembered_in_the_witnessed_voice(tmp_path: Path) -> None:
    """Item 8: with witnessed_before_sequence, a chunk wholly before it is asked for in the
    witnessed voice and its summary says so; later chunks in the resident's own voice; the
    identity reminder ends every compression instruction."""
    with trio.fail_after(GUARD_S):
        model = ScriptedModel(remember)
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())  # claims the namespace's config; reopened below
            ids = await add_all(m, 4)
            joined = int(ids[-1]) + 1
            await m.set_strategy(autobio(witnessed_before_sequence=joined, identity_reminder="You are Ada."))
            await add_all(m, 4, start=4)
            await m.wait_ready()
            instructions = [text_of(r.messages[-1]) for r in l1_requests(model)]
            assert len(instructions) == 2
            assert "before you joined" in instructions[0] and "before you joined" not in instructions[1]
            assert all(text.endswith("You are Ada.") for text in instructions)
            summaries = sorted((s.summary for s in await m.search_summaries()), key=lambda s: s.first_sequence)
            assert [s.witnessed for s in summaries] == [True, False]
        async with ctxrt.open_runtime(store(tmp_path), model=model, durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(witnessed_before_sequence=joined, identity_reminder="You are Ada."))
            reloaded = sorted((s.summary for s in await m.search_summaries()), key=lambda s: s.first_sequence)
            assert [s.witnessed for s in reloaded] == [True, False]  # stored with the summary


def test_voice_options_of_the_wrong_type_are_refused_naming_them() -> None:
    """Bad input is refused where the config is made, naming the field."""
    with pytest.raises(ValueError, match="witnessed_before_sequence"):
        autobio(witnessed_before_sequence=-1)
    with pytest.raises(ValueError, match="identity_reminder"):
        autobio(identity_reminder=3)


# -- pins (issue 13 item 3) ----------------------------------------------------------------------


def compiled_text(result: ctxrt.CompileResult) -> str:
    return "\n".join(b.text for m in result.messages for b in m.content if isinstance(b, Text))


async def test_a_pinned_range_stays_raw_in_place_whatever_the_budget_and_survives_a_restart(tmp_path: Path) -> None:
    """Item 3: after compression covers a range, a raw pin still shows its messages verbatim in
    place; a summary covering only pinned messages isn't shown twice; unpin gives it back."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(hierarchical=False))
            ids = await add_all(m, 16)
            await m.wait_ready()
            before = await m.compile(budget(400))
            assert not set(ids[4:8]) & raw_sources(before)  # summarised: not raw
            pin = await m.pin_range(ids[4], ids[7], name="the plan")
            assert (pin.first_id, pin.last_id, pin.name, pin.level) == (ids[4], ids[7], "the plan", None)
            pinned = await m.compile(budget(400))
            assert set(ids[4:8]) <= raw_sources(pinned)
            order = [s.id for sources in pinned.provenance.messages for s in sources if s.id in ids]
            assert order == sorted(order, key=int)  # in place
            shown = {s.id for sources in pinned.provenance.messages for s in sources if s.kind == "summary"}
            assert "L1-1" not in shown  # it covers only the pinned messages
            assert await m.list_pins() == [pin]
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(hierarchical=False))
            assert await m.list_pins() == [pin]
            assert set(ids[4:8]) <= raw_sources(await m.compile(budget(400)))
            assert await m.unpin(pin.id) is True and await m.unpin(pin.id) is False
            assert not set(ids[4:8]) & raw_sources(await m.compile(budget(400)))
            second = await m.pin_range(ids[0], ids[0])
            assert second.id != pin.id  # ids are never reused


async def test_a_level_pin_shows_its_range_at_that_level_at_most(tmp_path: Path) -> None:
    """Item 3: where a higher summary covers a range pinned at level 1, the level-1 summaries of the
    range show instead (the rest of the history stays as merged as it was)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(merge_threshold=2))
            ids = await add_all(m, 16)
            await m.wait_ready()
            summaries = {s.summary.id: s.summary for s in await m.search_summaries(include_merged=True)}

            def over_pin(result: ctxrt.CompileResult) -> list[int]:
                """Levels of the shown summaries that cover any of ids[0..3]."""
                shown = {s.id for sources in result.provenance.messages for s in sources if s.kind == "summary"}
                return sorted(summaries[i].level for i in shown if summaries[i].first_sequence <= int(ids[3]))

            assert max(over_pin(await m.compile(budget(2_000)))) > 1
            await m.pin_range(ids[0], ids[3], level=1)
            assert over_pin(await m.compile(budget(2_000))) == [1]
            assert (await m.list_pins())[0].level == 1


async def test_pins_are_refused_by_a_strategy_without_them_and_bad_ranges_are_named(tmp_path: Path) -> None:
    """Item 3: clear errors naming the place; nothing is stored by a refusal."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            plain = await rt.open("plain")
            first = await plain.add_message("user", "a")
            with pytest.raises(ctxrt.StrategyRefusedError, match="does not support pins"):
                await plain.pin_range(first, first)
            assert await plain.list_pins() == []
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 4)
            with pytest.raises(ValueError, match="comes after"):
                await m.pin_range(ids[3], ids[0])
            with pytest.raises(ctxrt.MessageNotFoundError, match="'999999'"):
                await m.pin_range(ids[0], "999999")
            with pytest.raises(ValueError, match="level"):
                await m.pin_range(ids[0], ids[1], level=0)
            assert await m.list_pins() == []


async def test_every_message_left_out_is_reported_wherever_it_was_in_the_view(tmp_path: Path) -> None:
    """Item 6 (from a host-style attack): recent-window and head-window messages that don't fit
    are reported too, and strict refuses; the summaries shown are the newest that fit, so what
    goes is the oldest history; a raw pin inside the recent window is kept."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(recent_window_tokens=100_000))
            ids = await add_all(m, 40)
            result = await m.compile(budget(100))  # the recent window holds 400 tokens: 10 messages fit
            stats = m.render_stats()
            assert stats is not None and len(stats.dropped_ids) == 30
            assert set(stats.dropped_ids) == set(ids) - raw_sources(result)
            with pytest.raises(ctxrt.OverBudgetError):
                await m.compile(budget(100), strict=True)
            pin = await m.pin_range(ids[30], ids[30])
            pinned = await m.compile(budget(100))
            assert ids[30] in raw_sources(pinned) and ids[-1] in raw_sources(pinned)
            order = [s.id for sources in pinned.provenance.messages for s in sources]
            assert order == sorted(order, key=int)
            await m.unpin(pin.id)
        async with ctxrt.open_runtime(tmp_path / "head", model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(head_window_tokens=100_000))
            ids = await add_all(m, 40)
            result = await m.compile(budget(100))
            stats = m.render_stats()
            assert stats is not None and set(stats.dropped_ids) == set(ids) - raw_sources(result)
            assert ids[-1] in stats.dropped_ids  # the head kept the oldest: reported, not silent


async def test_summaries_that_dont_all_fit_leave_out_the_oldest_history(tmp_path: Path) -> None:
    """Item 6 (from the controls benchmark): with more summaries than the budget holds, the newest
    are shown and the oldest history is what is reported left out."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio(hierarchical=False))
            ids = await add_all(m, 40)
            await m.wait_ready()
            result = await m.compile(budget(80))
            stats = m.render_stats()
            assert stats is not None and stats.dropped_ids
            summaries = {s.summary.id: s.summary for s in await m.search_summaries(include_merged=True)}
            shown = raw_sources(result) | {leaf for sources in result.provenance.messages for x in sources
                                           if x.kind == "summary" for leaf in summaries[x.id].source_ids}
            assert set(stats.dropped_ids) | shown == set(ids)
            assert max(map(int, stats.dropped_ids)) < min(map(int, shown))  # the oldest went
            assert "didn't fit" in (stats.dropped_reason or "") and result.messages


@pytest.mark.parametrize(("field", "value"), [
    ("compression_model", None), ("compression_model", ""), ("target_chunk_tokens", 0), ("target_chunk_tokens", -5),
    ("head_window_tokens", -1), ("recent_window_tokens", -1), ("hierarchical", "yes"), ("merge_threshold", 1),
    ("summary_target_tokens", 0), ("auto_tick", 1), ("summary_participant", ""), ("max_message_tokens", -1),
    ("l1_holdback_chunks", 2.5), ("adaptive_resolution", 1), ("folding", "deep"), ("slack_ratio", -0.1),
    ("slack_ratio", True), ("enforce_budget", "no"), ("over_budget_grace_ratio", 1.5), ("refusal_fallbacks", -1),
    ("l1_budget_tokens", -1), ("l2_budget_tokens", 1.5), ("l3_budget_tokens", "9"), ("recall_budget_tokens", -3),
    ("compression_max_tokens", 0), ("merge_max_source_span_messages", 0), ("max_speculative_l1s", -1),
    ("summary_system_prompt", 3), ("summary_user_prompt", b"x"), ("chunk_boundary", "topic"),
])
def test_every_config_option_of_the_wrong_kind_is_refused_naming_it(field: str, value: object) -> None:
    """(T15) Bad input is refused where the config is made, naming the field: a zero chunk size, a
    missing compression model or a merge of one summary were accepted before and only went wrong
    later; the long-run knobs are checked the same way."""
    options: dict[str, object] = {"compression_model": "m", field: value}
    with pytest.raises(ValueError, match=field):
        ctxrt.Autobiographical(**options)  # type: ignore[arg-type]
    if field not in ("hierarchical",):
        with pytest.raises(ValueError, match=field):
            ctxrt.Knowledge(**options)  # type: ignore[arg-type]


def test_windowed_refuses_a_negative_message_cap_naming_it() -> None:
    """Bad input is refused where the config is made, naming the field."""
    with pytest.raises(ValueError, match="max_message_tokens"):
        ctxrt.WindowedPassthrough(max_message_tokens=-1)
