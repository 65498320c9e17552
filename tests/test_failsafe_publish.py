"""Nothing that runs after a commit can stop the store actor or misreport a landed write (L6).

Determinism rules: a real LMDB store under ``tmp_path``, the real clock and a
``trio.fail_after`` guard. Concurrent writers are started in one nursery tick, so they share
batches; a slot cache's listener raises on purpose. Each test checks what every
caller was told against what the store holds, through the same runtime and after a reopen,
and that the failure was logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from ctxrt import Runtime, open_runtime
from ctxrt.testing import (
    AppendItem,
    ItemAppended,
    Operation,
    RegisterState,
    close_store,
    open_store,
    open_store_actor,
    prepare_append,
    serve_store,
)

WRITERS = 20


def stored(engine, state: str = "log") -> dict[int, bytes]:  # type: ignore[no-untyped-def]
    with engine.reader() as txn:
        return {item.sequence: bytes(item.data) for item in engine.log_items(txn, state, engine.branch("main"))}


async def test_a_publish_step_that_raises_neither_stops_the_actor_nor_fails_a_landed_write(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a publish callback raising after every commit, concurrent writers each get their committed
    result, the actor keeps serving, and the failures are logged (L6)."""
    handle = open_store(store_path)
    published: list[int] = []

    def publish(operations: Sequence[Operation]) -> None:
        published.extend(operation.sequence for operation in operations if isinstance(operation, ItemAppended))
        raise OverflowError("int too large to convert to float")  # what a huge hold raised downstream

    acked: dict[int, bytes] = {}
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                ref, inbox = open_store_actor(handle.engine, publish)
                await nursery.start(lambda task_status: serve_store(handle.engine, ref, inbox, task_status=task_status))
                await ref.ask(RegisterState(name="log", kind="log"))

                async def writer(number: int) -> None:
                    for counter in range(5):
                        data = f"writer {number} append {counter}".encode()
                        result = await ref.ask(AppendItem(state="log", branch="main", data=data))
                        assert isinstance(result, ItemAppended) and result.data == data
                        acked[result.sequence] = data

                async with trio.open_nursery() as writers:
                    for number in range(WRITERS):
                        writers.start_soon(writer, number)
                assert ref.statistics().largest_batch > 1, "the writers never shared a batch"
                result = await ref.ask(AppendItem(state="log", branch="main", data=b"still serving"))
                acked[result.sequence] = b"still serving"
                ref.close()
        assert stored(handle.engine) == acked
        assert sorted(published) == sorted(acked)
    finally:
        close_store(handle)
    failures = [record for record in caplog.records if "publishing" in record.getMessage()]
    assert failures and all(record.levelno == logging.ERROR and record.exc_info for record in failures)
    async with open_runtime(store_path, readonly=True) as reopened:
        assert stored(reopened.engine) == acked


async def messages_runtime(rt: Runtime) -> None:
    await rt.store.ask(RegisterState(name="messages", kind="log"))


def new_message(text: str) -> AppendItem:
    data, blobs, appended = prepare_append("user", text)
    return AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs), attachment=appended)


async def test_a_subscriber_that_raises_fails_alone_and_the_others_hear_every_message(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A slot-cache subscriber that raises is logged and skipped: the writers get their results, the
    subscribers after it hear every message, the cache holds every message (L6)."""
    heard: list[int] = []

    def broken(sequence: int) -> None:
        raise RuntimeError(f"subscriber broke on {sequence}")

    def listener(sequence: int) -> None:
        heard.append(sequence)

    acked: list[int] = []
    with trio.fail_after(30):
        async with open_runtime(store_path) as rt:
            await messages_runtime(rt)
            cache = rt.slots.acquire("messages", rt.engine.branch("main").id)
            cache.listen(broken)
            cache.listen(listener)

            async def writer(number: int) -> None:
                for counter in range(3):
                    result = await rt.store.ask(new_message(f"writer {number} says {counter}"))
                    acked.append(result.sequence)

            async with trio.open_nursery() as nursery:
                for number in range(WRITERS):
                    nursery.start_soon(writer, number)
            assert sorted(heard) == sorted(acked)
            assert [message.sequence for message in cache.current()] == sorted(acked)
            assert not cache.stale
            result = await rt.store.ask(new_message("after the failures"))
            assert cache.current()[-1].sequence == result.sequence
            rt.slots.release(cache)
        async with open_runtime(store_path, readonly=True) as reopened:
            assert sorted(stored(reopened.engine, "messages")) == sorted(acked) + [result.sequence]
    assert sum("a subscriber of slot messages" in record.getMessage() for record in caplog.records) == len(acked) + 1


async def test_a_cache_that_cant_apply_a_commit_reloads_it_from_the_store(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit event the slot cache can't take (a bad attachment) leaves the write landed and the
    cache reloads at its next read, holding every message in order (L6); its listeners hear of every
    append meanwhile, the stale cache's too (a background drain reads, and so reloads, only once it
    hears of one: it sat idle)."""
    with trio.fail_after(30):
        async with open_runtime(store_path) as rt:
            await messages_runtime(rt)
            cache = rt.slots.acquire("messages", rt.engine.branch("main").id)
            heard: list[int] = []
            cache.listen(heard.append)
            first = await rt.store.ask(new_message("before"))
            good = new_message("with a broken attachment")
            broken = AppendItem(state="messages", branch="main", data=good.data, attachment=object())
            results = []

            async def send(command: AppendItem) -> None:
                results.append(await rt.store.ask(command))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, broken)
                nursery.start_soon(send, new_message("beside it"))
            assert all(isinstance(result, ItemAppended) for result in results)
            assert cache.stale, "the cache noticed it missed a commit"
            last = await rt.store.ask(new_message("after"))
            texts = [message.content[0].text for message in cache.current()]  # type: ignore[union-attr]
            assert not cache.stale
            assert texts[0] == "before" and texts[-1] == "after"
            assert sorted(texts[1:3]) == ["beside it", "with a broken attachment"]
            appended = sorted([first.sequence, *(result.sequence for result in results), last.sequence])
            assert [message.sequence for message in cache.current()] == appended
            assert heard == appended
            rt.slots.release(cache)
    assert any("couldn't apply a commit" in record.getMessage() for record in caplog.records)
