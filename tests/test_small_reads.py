"""The small reads a host's UI makes (M10): a message as it was, the holds in force, the deepest
summary level, a marked document, Windowed's anchor, and a compile's figures without a build.

Each read that touches the store runs on both engines.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt import Budget, Image, Runtime, Text, open_runtime
from ctxrt.testing import ScriptedModel

GUARD_S = 30
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()


def summarise(request: Any) -> str:
    return "a memory of what was said"


@pytest.fixture(params=["lmdb", "postgres"])
async def rt(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[Runtime]:
    store = store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")
    async with open_runtime(store, model=ScriptedModel(summarise)) as opened:
        yield opened


def budget(tokens: int) -> Budget:
    return Budget(max_tokens=tokens, reserve_for_response=0)


def autobio(**overrides: Any) -> ctxrt.Autobiographical:
    config: dict[str, Any] = {"target_chunk_tokens": 40, "recent_window_tokens": 0, "l1_holdback_chunks": 0,
                              "summary_target_tokens": 50, "merge_threshold": 2}
    return ctxrt.Autobiographical("model-x", **{**config, **overrides})


def say(i: int) -> str:
    return f"message number {i:06d} here."[:29].ljust(29, ".")


# -- get_message_at ------------------------------------------------------------------------------


async def test_get_message_at_returns_the_version_in_force_at_that_sequence(rt: Runtime) -> None:
    """M10: before an edit the original, after it the edit; a removed message still reads as it was."""
    m = await rt.open("reads")
    first = await m.add_message("user", "as first written")
    written = rt.engine.last_sequence
    await m.edit_message(first, "as edited")
    edited = rt.engine.last_sequence
    await m.remove_message(first)
    assert (await m.get_message_at(first, written)).content == (Text("as first written"),)
    assert (await m.get_message_at(first, edited)).content == (Text("as edited"),)
    assert await m.get_message(first) is None
    with pytest.raises(ctxrt.MessageNotFoundError, match=repr(first)):
        await m.get_message_at(first, rt.engine.last_sequence)  # removed by then


async def test_get_message_at_refuses_a_message_not_yet_written_or_unknown(rt: Runtime) -> None:
    """M10, M7: a sequence before the message, an unknown id, a bad sequence."""
    m = await rt.open("reads")
    await m.add_message("user", "one")
    later = await m.add_message("user", "two")
    with pytest.raises(ctxrt.MessageNotFoundError):
        await m.get_message_at(later, int(later) - 1)
    with pytest.raises(ctxrt.MessageNotFoundError):
        await m.get_message_at("999999", rt.engine.last_sequence)
    with pytest.raises(TypeError, match="at_sequence"):
        await m.get_message_at(later, "7")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at_sequence"):
        await m.get_message_at(later, -1)


async def test_get_message_at_reads_a_sequence_past_every_write_as_now(rt: Runtime) -> None:
    """M10, M7: a sequence past any a store can write (2**64, or more) is the version in force now,
    never a report that the store is damaged (it isn't: the number was the host's)."""
    m = await rt.open("reads")
    first = await m.add_message("user", "as first written")
    await m.edit_message(first, "as edited")
    for far in (2**63 - 1, 2**63, 2**64, 2**200):
        assert (await m.get_message_at(first, far)).content == (Text("as edited"),)
    await m.remove_message(first)
    with pytest.raises(ctxrt.MessageNotFoundError, match=repr(first)):
        await m.get_message_at(first, 2**64)


# -- compression_holds ---------------------------------------------------------------------------


async def test_compression_holds_lists_the_holds_in_force(rt: Runtime) -> None:
    """M10, T5: each held message with the time left (None: until released); released ones go."""
    m = await rt.open("reads", strategy=autobio())
    held = await m.add_message("user", say(0), hold_compression=True)
    timed = await m.add_message("user", say(1))
    await m.hold_compression([timed], timeout_s=60)
    holds = await m.compression_holds()
    assert [h.message_id for h in holds] == [held, timed]
    assert holds[0].expires_in_s is None and holds[1].expires_in_s is not None
    assert 0 < holds[1].expires_in_s <= 60
    await m.release_compression([held])
    assert [h.message_id for h in await m.compression_holds()] == [timed]


async def test_a_lapsed_hold_is_not_in_force(rt: Runtime, clock: trio.testing.MockClock) -> None:
    """M10, T5: a timed hold past its time is not reported."""
    m = await rt.open("reads")
    timed = await m.add_message("user", say(0))
    await m.hold_compression([timed], timeout_s=5)
    clock.jump(6)
    assert await m.compression_holds() == []


# -- max_summary_level ---------------------------------------------------------------------------


async def test_max_summary_level_is_the_deepest_summary(rt: Runtime) -> None:
    """M10, T3: 0 before any summary, then the deepest level merges reached."""
    m = await rt.open("reads", strategy=autobio())
    assert await m.max_summary_level() == 0
    for i in range(24):
        await m.add_message("user", say(i))
    with trio.fail_after(GUARD_S):
        await m.wait_ready()
    levels = {match.summary.level for match in await m.search_summaries(include_merged=True, limit=1000)}
    assert await m.max_summary_level() == max(levels) >= 2


async def test_max_summary_level_is_zero_without_summaries(rt: Runtime) -> None:
    """M10: a strategy that keeps none answers 0."""
    m = await rt.open("plain")
    await m.add_message("user", "hello")
    assert await m.max_summary_level() == 0


# -- mark_document -------------------------------------------------------------------------------


async def test_mark_document_pins_the_range_under_its_title(rt: Runtime) -> None:
    """M10: a document is a pin named by its title (default "document"), with no level; it is kept raw."""
    m = await rt.open("reads", strategy=autobio())
    ids = [await m.add_message("user", say(i)) for i in range(16)]
    pin = await m.mark_document(ids[2], ids[5], title="design notes")
    untitled = await m.mark_document(ids[8], ids[8])
    assert (pin.first_id, pin.last_id, pin.name, pin.level) == (ids[2], ids[5], "design notes", None)
    assert untitled.name == "document"
    assert await m.list_pins() == [pin, untitled]
    with trio.fail_after(GUARD_S):
        await m.wait_ready()
    result = await m.compile(budget(10_000))
    raw = {s.id for sources in result.provenance.messages if all(x.kind == "message" for x in sources)
           for s in sources}
    assert set(ids[2:6]) | {ids[8]} <= raw


async def test_mark_document_is_refused_by_a_strategy_without_pins(rt: Runtime) -> None:
    """M10: Passthrough keeps no pins: StrategyRefusedError, nothing stored."""
    m = await rt.open("plain")
    first = await m.add_message("user", "hello")
    with pytest.raises(ctxrt.StrategyRefusedError, match="pins"):
        await m.mark_document(first, first)
    assert await m.list_pins() == []


# -- set_anchor / anchor -------------------------------------------------------------------------


async def test_set_anchor_starts_the_window_there_and_is_stored(rt: Runtime) -> None:
    """M10, T2: the anchor set is read back, the window starts there, and a reopen keeps it."""
    m = await rt.open("windowed", strategy=ctxrt.WindowedPassthrough())
    ids = [await m.add_message("user", say(i)) for i in range(10)]
    assert await m.anchor() is None
    await m.set_anchor(ids[4])
    assert await m.anchor() == ids[4]
    result = await m.compile(budget(10_000))
    assert [s.id for sources in result.provenance.messages for s in sources] == ids[4:]
    await m.aclose()
    again = await rt.open("windowed", strategy=ctxrt.WindowedPassthrough())
    assert await again.anchor() == ids[4]


async def test_set_anchor_refusals(rt: Runtime) -> None:
    """M10: another strategy refuses the anchor (StrategyRefusedError); an unknown id is not found."""
    w = await rt.open("windowed", strategy=ctxrt.WindowedPassthrough())
    await w.add_message("user", "hello")
    with pytest.raises(ctxrt.MessageNotFoundError, match="'12345'"):
        await w.set_anchor("12345")
    assert await w.anchor() is None
    plain = await rt.open("plain")
    first = await plain.add_message("user", "hello")
    with pytest.raises(ctxrt.StrategyRefusedError, match="anchor"):
        await plain.set_anchor(first)
    with pytest.raises(ctxrt.StrategyRefusedError, match="anchor"):
        await plain.anchor()


# -- compile_metadata ----------------------------------------------------------------------------


async def image_history(m: ctxrt.ContextManager, count: int) -> list[str]:
    return [await m.add_message("user", [Text(say(i)), Image(source={"type": "base64", "media_type": "image/png",
                                                                      "data": PNG})])
            for i in range(count)]


async def test_compile_metadata_names_what_a_compile_shows_without_reading_a_blob(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M10: the ids and figures match a compile's, and no blob is read (counted at the engine's seam)."""
    m = await rt.open("windowed", strategy=ctxrt.WindowedPassthrough(max_live_images=2))
    ids = await image_history(m, 12)
    reads: list[str] = []
    real = rt.engine.read_blob
    monkeypatch.setattr(rt.engine, "read_blob", lambda sha256: reads.append(sha256) or real(sha256))
    metadata = await m.compile_metadata(budget(8_000))
    assert reads == []
    result = await m.compile(budget(8_000))
    assert metadata.message_ids == tuple(s.id for sources in result.provenance.messages for s in sources)
    assert 1 < len(metadata.message_ids) < len(ids) and metadata.summary_ids == ()
    stats = m.render_stats()
    assert stats is not None and metadata.estimated_tokens == stats.total_tokens
    assert metadata.summary_tokens == 0


async def test_compile_metadata_of_summaries_and_its_refusals(rt: Runtime) -> None:
    """M10: summary ids shown come back; a dry run stores nothing; a bad budget is a TypeError."""
    m = await rt.open("reads", strategy=autobio())
    for i in range(24):
        await m.add_message("user", say(i))
    with trio.fail_after(GUARD_S):
        await m.wait_ready()
    last = rt.engine.last_sequence
    metadata = await m.compile_metadata(budget(200))
    assert rt.engine.last_sequence == last  # a dry run: nothing written
    result = await m.compile(budget(200))
    shown = tuple(dict.fromkeys(s.id for sources in result.provenance.messages for s in sources
                                if s.kind == "summary"))
    assert metadata.summary_ids and metadata.summary_ids == shown
    raw = tuple(s.id for sources in result.provenance.messages if all(x.kind == "message" for x in sources)
                for s in sources)
    assert metadata.message_ids == raw and metadata.summary_tokens > 0
    with pytest.raises(TypeError, match="budget"):
        await m.compile_metadata(2_000)  # type: ignore[arg-type]
