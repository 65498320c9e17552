"""Media held as references, its bytes read where they leave the runtime (M13; M4, M10).

A slot cache holds each medium as a reference (sha256, media type, size): a selection prices and
describes it from that, so ``compile_metadata`` reads no blob. A compile's messages and raw
bodies, the reads a host makes and the events it hears carry the base64 as written. The stores
here are written by one runtime and read by another, so every message is decoded from the store
(a writer's own appends carry their content and would read no blob either way).
"""

from __future__ import annotations

import base64
import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt import Budget, Edited, Image, Runtime, Text, ToolResult, ToolUse, open_runtime
from ctxrt.testing import MediaCache

GUARD_S = 30


def png(n: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + n.to_bytes(4, "big") + bytes(range(256)) * 3).decode()


def image(n: int) -> Image:
    return Image(source={"type": "base64", "media_type": "image/png", "data": png(n)})


def budget(tokens: int) -> Budget:
    return Budget(max_tokens=tokens, reserve_for_response=0)


@pytest.fixture(params=["lmdb", "postgres"])
def store(request: pytest.FixtureRequest, store_path: Path) -> Any:
    return store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")


async def written(store: Any, count: int) -> list[str]:
    """``count`` messages of a line and a distinct image, written and closed by one runtime."""
    async with open_runtime(store) as rt:
        m = await rt.open()
        return [await m.add_message("user", [Text(f"screenshot {i}"), image(i)]) for i in range(count)]


def counting(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every blob the runtime reads from its store, by sha256 (the engine's ``read_blob``: the seam)."""
    reads: list[str] = []
    real: Callable[[str], Any] = rt.engine.read_blob
    monkeypatch.setattr(rt.engine, "read_blob", lambda sha256: reads.append(sha256) or real(sha256))
    return reads


def shown_images(result: ctxrt.CompileResult) -> list[str]:
    return [block.source["data"] for message in result.messages for block in message.content if type(block) is Image]


async def test_compile_metadata_reads_no_blob_of_a_history_read_from_the_store(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M13, M10: messages decoded from the store hold their media by reference, so a
    compile_metadata reads no blob; the compile after it reads each shown message's once (its
    messages and raw bodies carry them as written); a warm compile reads none again."""
    ids = await written(store, 12)
    async with open_runtime(store) as rt:
        reads = counting(rt, monkeypatch)
        m = await rt.open("windowed", strategy=ctxrt.WindowedPassthrough(max_live_images=2))
        metadata = await m.compile_metadata(budget(50_000))
        assert reads == []
        assert metadata.message_ids == tuple(ids)  # all shown, the images past two as notes
        result = await m.compile(budget(50_000))
        assert shown_images(result) == [png(10), png(11)]  # the others as the image policy's notes
        assert len(reads) == len(set(reads)) == 12
        first = result.provenance.raw_bodies[ids[0]].content[1]
        assert isinstance(first, Image) and first.source["data"] == png(0)
        await m.add_message("user", "and a line of text")
        again = await m.compile(budget(50_000))
        assert shown_images(again) == [png(10), png(11)] and len(reads) == 12


async def test_a_host_reads_media_as_written_from_every_read(store: Any) -> None:
    """M13, A7: get_message, get_all_messages, get_message_window, query_messages, get_message_at,
    a compile's raw bodies and an edit's event carry the base64 as written, nested media included."""
    async with open_runtime(store) as rt:
        m = await rt.open()
        call = await m.add_message("agent", [ToolUse("t1", "shot", {})])
        nested = ToolResult("t1", (Text("here"), image(7)))
        result_id = await m.add_message("user", [nested])
        plain_id = await m.add_message("user", [Text("look"), image(8)])
    async with open_runtime(store) as rt:
        m = await rt.open()
        expected = {result_id: (nested,), plain_id: (Text("look"), image(8))}
        found = await m.get_message(plain_id)
        assert found is not None and found.content == expected[plain_id]
        every = {message.id: message.content for message in await m.get_all_messages()}
        assert every[result_id] == expected[result_id] and every[plain_id] == expected[plain_id]
        window = await m.get_message_window(-2, 2)
        assert [message.content for message in window.messages] == list(expected.values())
        queried = await m.query_messages(participant="user")
        assert [message.content for message in queried] == list(expected.values())
        assert (await m.get_message_at(plain_id, rt.engine.last_sequence)).content == expected[plain_id]
        result = await m.compile(budget(50_000))
        bodies = result.provenance.raw_bodies
        assert bodies[plain_id].content == expected[plain_id] and bodies[result_id].content == expected[result_id]
        assert call in bodies
        if rt.engine.shared:
            return  # on PostgreSQL an edit's event comes from a look at the head, decoded as stored
        async with m.subscribe() as events:
            await m.edit_message(plain_id, [Text("look again"), image(8)])
            with trio.fail_after(GUARD_S):
                event = await events.receive()
        assert isinstance(event, Edited)
        assert event.message.content == (Text("look again"), image(8))
        assert event.previous is not None and event.previous.content == expected[plain_id]


def test_a_media_cache_keeps_the_newest_used_blobs_within_its_bound() -> None:
    """M13: the cache is bounded in base64 characters; a blob used again stays, the least recently
    used goes first, and one it let go is read again when asked for."""
    blobs = {str(n): (bytes([n]) * 300, "image/png") for n in range(4)}
    reads: list[str] = []

    def read(sha256: str) -> tuple[bytes, str] | None:
        reads.append(sha256)
        return blobs.get(sha256)

    cache = MediaCache(read, limit=1_000)  # each blob is 400 characters of base64: two fit
    assert cache.text("0") == base64.b64encode(blobs["0"][0]).decode()
    cache.text("1")
    cache.text("0")  # used again: now the newest
    cache.text("2")  # over the bound: "1", the least recently used, goes
    assert len(cache) == 2 and reads == ["0", "1", "2"]
    cache.text("0")
    cache.text("1")
    assert reads == ["0", "1", "2", "1"] and cache.reads == 4
    assert cache.text("missing") is None and len(cache) == 2


async def test_a_channel_query_keeps_media_by_reference(store: Any) -> None:
    """M13, M11: a channel query hands out the base64 as written, first read after opening
    included, yet what its slot keeps afterwards holds references, not bytes: the media cache's
    bound is all the bytes the runtime keeps."""
    big = [base64.b64encode(n.to_bytes(4, "big") + bytes(range(256)) * 800).decode() for n in range(12)]
    async with open_runtime(store) as rt:
        m = await rt.open()
        for data in big:
            await m.add_message("user", [Image(source={"type": "base64", "media_type": "image/png", "data": data})],
                                metadata={"channel_id": "shots"})
    async with open_runtime(store) as rt:
        m = await rt.open()
        rt.slots.media.limit = 2 * len(big[0])  # the runtime's media cache keeps two of the twelve
        gc.collect()
        tracemalloc.start()
        try:
            found = await m.query_messages(channel="shots")
            assert [message.content[0].source["data"] for message in found] == big  # type: ignore[union-attr]
            del found
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert held < 5 * len(big[0])  # twelve images' base64 is 12 of them
        assert [message.content[0].source["data"] for message in await m.query_messages(channel="shots")] == big  # type: ignore[union-attr]
