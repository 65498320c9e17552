"""Live context settings and the queue and chunking knobs (T14, T15).

Determinism rules as in test_autobiographical.py: a real LMDB store under ``tmp_path``
(durability "os"), ``ScriptedModel`` for compression, a ``trio.fail_after`` guard in every async
test, ordering forced with ``trio.Event``s held by the responder, never sleeps. ``say(i)`` costs
10 tokens, so windows and targets below count messages in tens.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt import Budget, ModelRequest, Text
from ctxrt.testing import ScriptedModel, SetValue, estimate_text, states
from ctxrt.strategies.queue import merge_group
from ctxrt.strategies.records import Summary
from support import wait_until

GUARD_S = 20
MODEL = "model-x"
NS = "diary"


def say(i: int, words: str = "we talked it over") -> str:
    """A 29-character prose text carrying marker ``i``: 10 tokens."""
    return f"<m{i:05d}> {words}".ljust(29, ".")


assert estimate_text(say(0)) == 10


def autobio(**overrides: Any) -> ctxrt.Autobiographical:
    """Chunks of four messages, no head, no recent window, no holdback."""
    config: dict[str, Any] = {"target_chunk_tokens": 40, "recent_window_tokens": 0, "l1_holdback_chunks": 0,
                              "summary_target_tokens": 50}
    config.update(overrides)
    return ctxrt.Autobiographical(MODEL, **config)


def remember(request: ModelRequest) -> str:
    return f"memory {len(request.messages)}"


def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def runtime(tmp_path: Path, model: Any = None) -> Any:
    return ctxrt.open_runtime(store(tmp_path), model=model or ScriptedModel(remember), durability="os")


async def add_all(m: ctxrt.ContextManager, count: int, *, start: int = 0) -> list[str]:
    return [await m.add_message("user", say(i)) for i in range(start, start + count)]


def source_ids(result: ctxrt.CompileResult) -> list[str]:
    return [source.id for sources in result.provenance.messages for source in sources]


def stored_settings(rt: ctxrt.Runtime, branch: str = "main") -> Any:
    return rt.engine.read_value(states.settings_state(NS), rt.engine.branch(branch).id)


async def chunks(m: ctxrt.ContextManager) -> list[tuple[str, ...]]:
    return [chunk.message_ids for chunk in (await m.inspect()).strategy.chunks]


async def every_summary(m: ctxrt.ContextManager) -> dict[str, Summary]:
    return {found.summary.id: found.summary for found in await m.search_summaries(include_merged=True, limit=10_000)}


# -- update and compile --------------------------------------------------------------------


async def test_a_compile_after_an_update_uses_the_new_windows(tmp_path: Path) -> None:
    """T14: head and recent windows changed live are the zones of the next compile; nothing else moves."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio(recent_window_tokens=60))
            ids = await add_all(m, 20)
            await m.compile(Budget(100, 0))
            before = m.render_stats()
            assert before is not None and (before.head_tokens, before.tail_tokens) == (0, 60)
            found = await m.update_context_settings(head_window_tokens=20, recent_window_tokens=30)
            assert found == m.context_settings() == ctxrt.ContextSettings(
                None, head_window_tokens=20, recent_window_tokens=30, target_chunk_tokens=40, merge_threshold=6,
                auto_tick=False)
            result = await m.compile(Budget(50, 0))
            after = m.render_stats()
            assert after is not None and (after.head_tokens, after.tail_tokens) == (20, 30)
            assert source_ids(result) == ids[:2] + ids[-3:]
            assert m.strategy == autobio(recent_window_tokens=60)  # the config stays what it was


async def test_a_compile_after_an_update_equals_one_from_scratch(tmp_path: Path) -> None:
    """T14, T9: what the strategy kept across compiles (its head and recent windows) follows a
    change: the compile equals one of a restarted runtime under the same settings."""
    changes = [{"head_window_tokens": 30, "recent_window_tokens": 50}, {"head_window_tokens": 10},
               {"recent_window_tokens": 120, "target_chunk_tokens": 60}, {"head_window_tokens": 0}]
    for turn, change in enumerate(changes):
        with trio.fail_after(GUARD_S):
            async with runtime(tmp_path) as rt:
                m = await rt.open(NS, strategy=autobio(recent_window_tokens=40))
                await add_all(m, 10, start=10 * turn)
                await m.compile(Budget(150, 0))
                await m.tick()
                await m.update_context_settings(**change)
                warm = await m.compile(Budget(150, 0))
                warm_stats = m.render_stats()
            async with runtime(tmp_path) as rt:
                m = await rt.open(NS, strategy=autobio(recent_window_tokens=40))
                cold = await m.compile(Budget(150, 0))
                assert (warm.messages, warm.provenance.messages, warm_stats) == (
                    cold.messages, cold.provenance.messages, m.render_stats())


async def test_knowledge_chunks_at_its_phase_ceiling_of_the_new_target(tmp_path: Path) -> None:
    """T14, T7: Knowledge's chunks close at its phase ceiling (1.5x for dialogue) of the target set
    live; the chunks closed before stay as they were."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=ctxrt.Knowledge(MODEL, target_chunk_tokens=40, recent_window_tokens=0))
            ids = await add_all(m, 12)
            await m.compile(Budget(1000, 0))
            await m.update_context_settings(target_chunk_tokens=80)
            ids += await add_all(m, 12, start=12)
            await m.compile(Budget(1000, 0))
            assert await chunks(m) == [tuple(ids[:6]), tuple(ids[6:12]), tuple(ids[12:])]


async def test_compile_without_a_budget_uses_the_default_budget(tmp_path: Path) -> None:
    """T14: ``default_budget`` is what ``compile()`` without a budget spends; a budget given wins."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS)  # Passthrough: the default budget is the setting it takes
            ids = await add_all(m, 10)
            assert source_ids(await m.compile()) == ids
            await m.update_context_settings(default_budget=Budget(40, 10))
            assert source_ids(await m.compile()) == ids[-3:]
            assert source_ids(await m.compile(Budget(1000, 0))) == ids
            await m.update_context_settings(default_budget=None)
            assert source_ids(await m.compile()) == ids


async def test_racing_managers_compile_with_one_whole_setting_and_lose_nothing(tmp_path: Path) -> None:
    """T14: two managers change the settings while they compile and compress: every compile's
    zones are one whole setting's (never a head of one and a recent window of another), and every
    chunk and summary written under earlier settings stays."""
    wide_head = {"head_window_tokens": 60, "recent_window_tokens": 20, "target_chunk_tokens": 40, "merge_threshold": 2}
    wide_tail = {"head_window_tokens": 20, "recent_window_tokens": 60, "target_chunk_tokens": 60, "merge_threshold": 3}
    with trio.fail_after(GUARD_S * 2):
        async with runtime(tmp_path) as rt:
            first = await rt.open(NS, strategy=autobio())
            second = await rt.open(NS)
            ids = await add_all(first, 60)
            await second.update_context_settings(**wide_tail)
            # A budget of exactly head + recent: the middle shows nothing, so the zones are what shows.
            whole = {tuple(ids[:6] + ids[-2:]), tuple(ids[:2] + ids[-6:])}
            compiled: list[tuple[str, ...]] = []
            seen_chunks: list[tuple[str, ...]] = []
            seen_summaries: dict[str, Summary] = {}

            async def change(m: ctxrt.ContextManager) -> None:
                for turn in range(12):
                    await m.update_context_settings(**(wide_head if turn % 2 else wide_tail))
                    await m.tick()

            async def compile_and_note(m: ctxrt.ContextManager) -> None:
                for _ in range(24):
                    compiled.append(tuple(source_ids(await m.compile(Budget(80, 0)))))
                    seen_chunks[:] = await chunks(m)
                    seen_summaries.update(await every_summary(m))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(change, first)
                nursery.start_soon(change, second)
                nursery.start_soon(compile_and_note, first)
                nursery.start_soon(compile_and_note, second)
            assert set(compiled) == whole  # both settings compiled, and nothing between them
            final_chunks = await chunks(first)
            assert final_chunks[: len(seen_chunks)] == seen_chunks  # chunks closed stay closed
            final = await every_summary(first)
            assert {1, 2} <= {s.level for s in seen_summaries.values()}  # merges made while settings changed
            assert set(seen_summaries) <= set(final)
            assert all(final[key].source_ids == summary.source_ids for key, summary in seen_summaries.items())
            assert {s.source_ids for s in final.values() if s.level == 1} <= set(final_chunks)
            await first.update_context_settings(**wide_tail)
            assert tuple(source_ids(await second.compile(Budget(80, 0)))) == tuple(ids[:2] + ids[-6:])


async def test_a_unit_in_flight_lands_after_an_update(tmp_path: Path) -> None:
    """T14: a chunk's compression sent under the old settings lands after they change, and its
    summary covers the chunk as it was closed."""
    asked, reply = trio.Event(), trio.Event()

    async def held(request: ModelRequest) -> str:
        asked.set()
        await reply.wait()
        return "the memory"

    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path, ScriptedModel(held)) as rt:
            m = await rt.open(NS, strategy=autobio())
            ids = await add_all(m, 8)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(m.tick)
                await asked.wait()
                await m.update_context_settings(target_chunk_tokens=80, merge_threshold=2, recent_window_tokens=30)
                assert await chunks(m) == [tuple(ids[:4]), tuple(ids[4:])]
                reply.set()
            summaries = await m.search_summaries()
            assert [s.summary.source_ids for s in summaries] == [tuple(ids[:4])]
            shown = {s.id for sources in (await m.compile(Budget(1000, 0))).provenance.messages for s in sources
                     if s.kind == "summary"}
            assert shown == {summaries[0].summary.id}
            ids += await add_all(m, 16, start=8)
            await m.compile(Budget(1000, 0))
            # The next chunk closes at the new target (8 messages) below the new recent window (3).
            assert await chunks(m) == [tuple(ids[:4]), tuple(ids[4:8]), tuple(ids[8:16])]


async def test_auto_tick_turned_on_live_compresses_in_the_background(tmp_path: Path) -> None:
    """T14, T8: auto-tick set live starts the background drain on what is queued and on new messages."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            await add_all(m, 8)
            await m.compile(Budget(1000, 0))
            assert await m.search_summaries() == []
            await m.update_context_settings(auto_tick=True)
            await wait_until(lambda: summaries_made(m, 2))
            await add_all(m, 4, start=8)
            await wait_until(lambda: summaries_made(m, 3))


async def summaries_made(m: ctxrt.ContextManager, count: int) -> bool:
    return len(await m.search_summaries(limit=100)) >= count


# -- persistence ---------------------------------------------------------------------------


async def test_settings_persist_across_a_restart_and_a_fork(tmp_path: Path) -> None:
    """T14: a reopen with the same config reads the settings back (no ConfigConflictError); a fork
    and a derive carry them and changes there stay there; another config starts from its own values and
    keeps only the default budget."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            await add_all(m, 12)
            await m.update_context_settings(recent_window_tokens=30, auto_tick=True, default_budget=Budget(500, 0))
            changed = m.context_settings()
            await rt.open(NS, strategy=autobio())  # the same config: no conflict
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            assert m.context_settings() == changed
            assert (await m.inspect()).strategy.auto_tick
            main = await rt.open(NS, strategy=autobio())
            await m.fork("side")
            assert m.context_settings() == changed
            await m.update_context_settings(head_window_tokens=10)
            assert m.context_settings().head_window_tokens == 10
            assert main.context_settings() == changed
            child = await main.derive(branch="child")
            assert child.context_settings() == changed
            await main.set_strategy(autobio(recent_window_tokens=70))
            assert main.context_settings() == ctxrt.ContextSettings(Budget(500, 0), 0, 70, 40, 6, False)
        async with runtime(tmp_path) as rt:
            other = await rt.open(NS, strategy=autobio(target_chunk_tokens=50))
            assert other.context_settings() == ctxrt.ContextSettings(Budget(500, 0), 0, 0, 50, 6, False)


async def test_bad_settings_are_refused_by_name_and_change_nothing(tmp_path: Path) -> None:
    """T14: an unknown name, a bad value, or a setting the strategy hasn't is refused naming it;
    the store and the settings in force stay as they were, the rest of the call included."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            await m.update_context_settings(recent_window_tokens=30)
            stored, settings = stored_settings(rt), m.context_settings()
            with pytest.raises(TypeError, match="'recent_window'"):
                await m.update_context_settings(head_window_tokens=10, recent_window=5)
            for name, bad in [("merge_threshold", 1), ("target_chunk_tokens", 0), ("head_window_tokens", -1),
                              ("recent_window_tokens", None), ("auto_tick", "yes"), ("default_budget", 1000),
                              ("recent_window_tokens", True)]:
                other = {"merge_threshold": 3} if name != "merge_threshold" else {"head_window_tokens": 10}
                with pytest.raises(ValueError, match=name):
                    await m.update_context_settings(**other, **{name: bad})
            assert stored_settings(rt) == stored and m.context_settings() == settings
            p = await rt.open("plain", strategy=ctxrt.WindowedPassthrough())
            with pytest.raises(ctxrt.StrategyRefusedError, match="'target_chunk_tokens'"):
                await p.update_context_settings(default_budget=Budget(100, 0), target_chunk_tokens=10)
            assert p.context_settings() == ctxrt.ContextSettings()
        async with ctxrt.open_runtime(store(tmp_path), readonly=True) as rt:
            r = await rt.open(NS, strategy=autobio())
            assert r.context_settings() == settings
            with pytest.raises(ctxrt.ReadOnlyStoreError):
                await r.update_context_settings(head_window_tokens=10)


async def test_a_garbled_settings_record_is_logged_and_the_configs_values_hold(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """T14: a stored settings record this version can't read (a value the setting refuses, as
    another version or a host's bug might write) is logged at ERROR naming the namespace, branch and
    record and saying the live changes are lost; the config's values are in force, and an update
    stores a whole record again."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            await m.update_context_settings(recent_window_tokens=30, default_budget=Budget(500, 0))
            garbled = {**stored_settings(rt), "changes": {"recent_window_tokens": 30, "merge_threshold": 1}}
            await rt.store.ask(SetValue(state=states.settings_state(NS), branch="main", value=garbled))
        with caplog.at_level(logging.ERROR, logger="ctxrt.namespace"):
            async with runtime(tmp_path) as rt:
                m = await rt.open(NS, strategy=autobio())
                assert m.context_settings() == ctxrt.ContextSettings(None, 0, 0, 40, 6, False)
                await m.update_context_settings(head_window_tokens=10)
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio())
            assert m.context_settings() == ctxrt.ContextSettings(None, 10, 0, 40, 6, False)
    [logged] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "context settings" in logged and f"namespace {NS!r} on branch 'main'" in logged and "lost" in logged


# -- the knobs (T15) -------------------------------------------------------------------------


def topic(previous: Any, following: Any, chunk: Any) -> bool:
    return bool(following.metadata.get("topic"))


async def test_chunk_boundary_closes_a_chunk_early_at_a_topic_change(tmp_path: Path) -> None:
    """T15: a chunk of at least 4 messages closes before a message ``chunk_boundary`` marks, never
    right after a tool_use; elsewhere chunks close at the target as without it."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=120, chunk_boundary=topic))

            async def plain(i: int, **metadata: Any) -> str:
                return await m.add_message("user", say(i), metadata=metadata or None)

            ids = [await plain(i) for i in range(5)]
            ids.append(await m.add_message("assistant", [{"type": "tool_use", "id": "t", "name": "look", "input": {}}]))
            ids.append(await m.add_message("user", [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
                                           metadata={"topic": True}))  # right after a tool_use: no boundary
            ids.append(await plain(7, topic=True))
            ids.append(await plain(8))
            ids.append(await plain(9, topic=True))  # two messages since the last boundary: too few
            ids.append(await plain(10))
            ids.append(await plain(11, topic=True))
            ids += [await plain(i) for i in range(12, 26)]
            await m.compile(Budget(10_000, 0))
            assert await chunks(m) == [tuple(ids[:7]), tuple(ids[7:11]), tuple(ids[11:23])]


async def test_chunk_boundary_is_asked_once_per_pair_of_messages_however_often_the_namespace_compiles(
        tmp_path: Path) -> None:
    """T15: the pending stretch is walked again at every compile, but the host's function, pure, is
    asked about each pair of messages once (the chunk so far growing with it), not once per compile."""
    asked: list[tuple[str, str, int]] = []

    def boundary(previous: Any, following: Any, chunk: Any) -> bool:
        asked.append((previous.id, following.id, len(chunk)))
        return False

    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=100_000, chunk_boundary=boundary))
            for i in range(40):
                await m.add_message("user", say(i))
                await m.compile(Budget(100_000, 0))
    assert len(asked) == len(set(asked)) == 40 - 4


async def test_a_chunk_boundary_that_raises_is_no_boundary_and_the_namespace_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """T15: a host's ``chunk_boundary`` that raises is taken as False and logged once per message:
    chunks close at the target and the namespace keeps answering."""
    def broken(previous: Any, following: Any, chunk: Any) -> bool:
        raise RuntimeError("host bug")

    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio(target_chunk_tokens=60, chunk_boundary=broken))
            ids = await add_all(m, 12)
            with caplog.at_level(logging.WARNING, logger="ctxrt.autobiographical"):
                await m.compile(Budget(10_000, 0))
                await m.compile(Budget(10_000, 0))
                assert await m.is_ready() is False
            assert await chunks(m) == [tuple(ids[:6]), tuple(ids[6:])]
            # Asked after the 4th and 5th message of each chunk (the target closes the 6th): 4 messages.
            raised = [r for r in caplog.records if "chunk_boundary raised" in r.getMessage()]
            assert len(raised) == 4
            await m.wait_ready()
            assert len(await m.search_summaries()) == 2


async def test_a_config_with_a_chunk_boundary_is_recorded_as_absent_and_reopens(tmp_path: Path) -> None:
    """T15: a config holding a host's function isn't recorded as data; reopening with it works,
    and its live settings are kept."""
    config = autobio(chunk_boundary=topic)
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=config)
            await add_all(m, 8)
            await m.update_context_settings(recent_window_tokens=20)
            assert rt.engine.read_value(states.config_state(NS), rt.engine.branch("main").id) is None
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=config)
            assert m.context_settings().recent_window_tokens == 20
            await rt.open(NS, strategy=config)  # the same config: no conflict
            await m.wait_ready()
            assert len(await m.search_summaries()) == 1


async def test_merge_max_source_span_limits_what_a_merge_covers(tmp_path: Path) -> None:
    """T15: with ``merge_max_source_span_messages``, no merge covers more messages than that; the
    threshold still decides when a level merges."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            plain = await rt.open("plain", strategy=autobio(merge_threshold=4))
            capped = await rt.open(NS, strategy=autobio(merge_threshold=4, merge_max_source_span_messages=10))
            await add_all(plain, 32)  # one history: both namespaces read the shared slot
            for m in (plain, capped):
                await m.compile(Budget(10_000, 0))
                await m.wait_ready()
            plain_l2 = [s for s in (await every_summary(plain)).values() if s.level == 2]
            capped_all = (await every_summary(capped)).values()
            assert [len(s.source_ids) for s in plain_l2] == [4, 4]
            # 2 L1s of 4 messages (8 <= 10) once 4 are waiting; the last 2 wait for more.
            assert [len(s.source_ids) for s in capped_all if s.level == 2] == [2, 2, 2]
            assert len([s for s in capped_all if s.level == 1 and s.parent_id is None]) == 2


def summary(key: str, level: int = 1) -> Summary:
    return Summary(key, level, "text", 1, (key,), 0, 0, key, key, 0)


def test_a_summary_wider_than_the_span_stays_unmerged() -> None:
    """T15: a summary that can't merge with its next within the span is passed over, not a stop."""
    unmerged = {1: [summary("a"), summary("b"), summary("c"), summary("d")]}
    spans = {"a": 9, "b": 2, "c": 2, "d": 2}
    group = merge_group(unmerged, {}, 3, max_span=5, span=lambda s: spans[s.id])
    assert group is not None and [s.id for s in group] == ["b", "c"]
    assert merge_group(unmerged, {}, 3) == unmerged[1][:3]


async def test_max_speculative_l1s_caps_the_unmerged_l1s_made(tmp_path: Path) -> None:
    """T15: no more than ``max_speculative_l1s`` unmerged L1s are made; a merge makes room again."""
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path) as rt:
            m = await rt.open(NS, strategy=autobio(max_speculative_l1s=3, merge_threshold=6))
            await add_all(m, 40)
            await m.compile(Budget(10_000, 0))
            await m.wait_ready()
            assert await m.is_ready()
            assert len(await every_summary(m)) == 3
            assert (await m.health()).pending_units == 7  # the chunks held back are still debt
            await m.update_context_settings(merge_threshold=2)
            await m.wait_ready()
            made = (await every_summary(m)).values()
            assert len([s for s in made if s.level == 1]) == 10  # every chunk, as merges made room
            assert len([s for s in made if s.level == 1 and s.parent_id is None]) <= 3


async def test_summary_participant_speaks_every_summary(tmp_path: Path) -> None:
    """T15: ``summary_participant`` is who a shown summary, a recall pair and a merge are spoken by."""
    model = ScriptedModel(remember)
    with trio.fail_after(GUARD_S):
        async with runtime(tmp_path, model) as rt:
            m = await rt.open(NS, strategy=autobio(summary_participant="memory", merge_threshold=2))
            await add_all(m, 12)
            await m.compile(Budget(10_000, 0))
            await m.wait_ready()
            result = await m.compile(Budget(10_000, 0))
            shown = [message for message, sources in zip(result.messages, result.provenance.messages)
                     if any(source.kind == "summary" for source in sources)]
            assert {message.participant for message in shown} == {"Context Manager", "memory"}  # header, memory
            assert all(request.assistant == frozenset({"memory"}) for request in model.requests)
            assert any(message.participant == "memory" for request in model.requests for message in request.messages)
            assert "Claude" not in {message.participant for request in model.requests for message in request.messages}


def test_the_asyncio_front_updates_and_reads_the_settings(tmp_path: Path) -> None:
    """T14 (H1): ``ctxrt.aio`` managers have both methods, with the trio ones' answers."""
    async def main() -> ctxrt.ContextSettings:
        async with ctxrt.aio.open_runtime(store(tmp_path), model=ScriptedModel(remember), durability="os") as rt:
            m = await rt.open(NS, strategy=autobio())
            changed = await m.update_context_settings(recent_window_tokens=20)
            assert m.context_settings() == changed
            return changed

    assert asyncio.run(main()).recent_window_tokens == 20
