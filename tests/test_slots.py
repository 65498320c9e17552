"""Slot caches: one per (branch, slot) in a runtime, fed by commit events (spec/slot-cache.md S1-S5).

"No store read" is measured, not assumed: ``count_reads`` wraps the engine's read entry points
(``reader``, ``log_head``, ``log_items``) and records every call, so a test can assert that a
read touched LMDB not at all, or read exactly the records it should. Every test uses a real
LMDB store and the real clock under a ``trio.fail_after`` guard.
"""

from __future__ import annotations

import base64
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import ctxrt
from ctxrt import Runtime
from ctxrt.testing import SLACK, AppendItem, ScriptedModel, SlotCache, codec, execute, extract_blobs, prepare_append
from support import wait_until

GUARD_S = 20
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()


@attrs.define
class Reads:
    """What the engine was asked while counting: one entry per call."""

    transactions: int = 0
    heads: int = 0
    item_scans: list[tuple[int, int]] = attrs.Factory(list)  # (start index, records returned)

    @property
    def total(self) -> int:
        return self.transactions + self.heads + len(self.item_scans)


@contextmanager
def count_reads(monkeypatch: pytest.MonkeyPatch, rt: Runtime) -> Iterator[Reads]:
    engine = rt.engine
    reads = Reads()
    reader, log_head, log_items = engine.reader, engine.log_head, engine.log_items

    def counting_reader() -> Any:
        reads.transactions += 1
        return reader()

    def counting_head(*args: Any, **kwargs: Any) -> Any:
        reads.heads += 1
        return log_head(*args, **kwargs)

    def counting_items(*args: Any, **kwargs: Any) -> Any:
        items = log_items(*args, **kwargs)
        reads.item_scans.append((kwargs.get("start", 0), len(items)))
        return items

    with monkeypatch.context() as patch:
        patch.setattr(engine, "reader", counting_reader)
        patch.setattr(engine, "log_head", counting_head)
        patch.setattr(engine, "log_items", counting_items)
        yield reads


def shared_cache(rt: Runtime, branch: str = "main", state: str = "messages") -> SlotCache:
    return rt.slots.cache(state, rt.engine.branch(branch).id)


def texts(messages: Any) -> list[str]:
    return [block.text for message in messages for block in message.content]


async def fill(manager: ctxrt.ContextManager, count: int, prefix: str = "m") -> list[str]:
    return [await manager.add_message("user", f"{prefix}{i}") for i in range(count)]


# -- S1, S4: one shared cache, extended by the store actor ----------------------------------


async def test_every_manager_and_view_on_a_slot_reads_one_cache(runtime: Runtime) -> None:
    """S1: managers in different namespaces, and an isolated one's auxiliary view, share the (branch, slot) cache."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        b = await runtime.open("b")
        isolated = await runtime.open("c", isolate=True, auxiliary_views=[None])
        figures = shared_cache(runtime).figures()
        assert (await a.inspect()).caches[0] == figures
        assert (await b.inspect()).caches[0] == figures
        assert (await isolated.inspect()).caches[1] == figures
        assert (await isolated.inspect()).caches[0] == shared_cache(runtime, state="c/messages").figures()
        assert len(runtime.slots) == 2  # one cache per (branch, slot), whoever reads it


async def test_a_siblings_read_after_an_append_costs_no_reload_and_no_store_read(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1: after manager A appends, manager B's reads are served from the cache the commit extended."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        b = await runtime.open("b")
        await fill(a, 20)
        assert await b.message_count() == 20
        cache = shared_cache(runtime)
        reloads = cache.reloads
        new_id = await a.add_message("assistant", "fresh")
        with count_reads(monkeypatch, runtime) as reads:
            assert await b.message_count() == 21
            everything = await b.get_all_messages()
            assert (await b.get_message(new_id)).content == (ctxrt.Text("fresh"),)
            window = await b.get_message_window(-1, 1)
        assert reads.total == 0
        assert cache.reloads == reloads
        assert everything[-1].id == new_id
        assert window.messages[0].id == new_id and window.total_count == 21


async def test_a_siblings_compile_after_appends_reloads_nothing(runtime: Runtime) -> None:
    """S1: a compile by B after three appends by A holds them, with the cache never reloaded."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        b = await runtime.open("b")
        await fill(a, 5)
        await b.compile()
        cache = shared_cache(runtime)
        reloads = cache.reloads
        ids = await fill(a, 3, prefix="late")
        result = await b.compile()
        assert cache.reloads == reloads
        assert [source.id for (source,) in result.provenance.messages][-3:] == ids


async def test_an_extended_cache_is_stamped_with_the_new_revision(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S4: after appends the cache carries the slot head's revision, so the next read does no lookup."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        await fill(a, 3)
        cache = shared_cache(runtime)
        ids = await fill(a, 2)
        engine = runtime.engine
        with engine.reader() as txn:
            head = engine.log_head(txn, "messages", engine.branch("main"))
        assert cache.revision == head.revision == int(ids[-1])
        assert cache.rewrite_revision == head.rewrite_revision
        with count_reads(monkeypatch, runtime) as reads:
            assert len(cache.current()) == 5
        assert reads.total == 0


# -- S2: edits, removals, branches -----------------------------------------------------------


async def test_an_edit_patches_the_cache_and_every_reader_sees_it(runtime: Runtime) -> None:
    """S2: A's edit reaches B's next read and compile; the cache is patched (at most one rebuild), not re-read per reader."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        b = await runtime.open("b")
        ids = await fill(a, 4)
        await b.compile()
        cache = shared_cache(runtime)
        reloads = cache.reloads
        await a.edit_message(ids[1], "edited")
        assert texts(await b.get_all_messages()) == ["m0", "edited", "m2", "m3"]
        assert texts((await b.compile()).messages) == ["m0", "edited", "m2", "m3"]
        assert (await a.get_message(ids[1])).content == (ctxrt.Text("edited"),)
        assert cache.reloads - reloads <= 1
        assert cache.rewrite_revision == cache.revision


async def test_removals_patch_the_cache_and_every_reader_sees_them(runtime: Runtime) -> None:
    """S2: a single removal and a range removal by A are gone from B's next read and compile."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("a")
        b = await runtime.open("b")
        ids = await fill(a, 6)
        await b.compile()
        cache = shared_cache(runtime)
        reloads = cache.reloads
        await a.remove_message(ids[0])
        assert texts(await b.get_all_messages()) == ["m1", "m2", "m3", "m4", "m5"]
        await a.remove_messages(ids[2], ids[4])
        assert texts(await b.get_all_messages()) == ["m1", "m5"]
        assert texts((await b.compile()).messages) == ["m1", "m5"]
        assert await b.get_message(ids[3]) is None
        assert cache.reloads - reloads <= 2


async def test_a_cache_is_never_extended_with_another_branchs_records(runtime: Runtime, store_path: Path) -> None:
    """S2: appends on main and on a fork of equal length each reach only their own branch's cache."""
    with trio.fail_after(GUARD_S):
        main = await runtime.open("a")
        await fill(main, 3)
        forked = await runtime.open("a")
        await forked.fork("side")
        main_cache, side_cache = shared_cache(runtime), shared_cache(runtime, "side")
        assert main_cache is not side_cache
        on_main = await main.add_message("user", "main only")
        on_side = await forked.add_message("user", "side only")
        assert main_cache.count() == side_cache.count() == 4
        assert texts(await main.get_all_messages()) == ["m0", "m1", "m2", "main only"]
        assert texts(await forked.get_all_messages()) == ["m0", "m1", "m2", "side only"]
        assert await main.get_message(on_side) is None
        assert await forked.get_message(on_main) is None
        # The events agree with what the store holds for each branch.
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            for branch in ("main", "side"):
                fresh = shared_cache(reader, branch)
                assert fresh.current() == shared_cache(runtime, branch).current()


async def test_an_isolated_slots_appends_never_reach_the_shared_cache(runtime: Runtime) -> None:
    """S2: commit events are routed by (slot, branch): an isolated namespace's append leaves the shared cache alone."""
    with trio.fail_after(GUARD_S):
        shared = await runtime.open("a")
        isolated = await runtime.open("b", isolate=True)
        await shared.add_message("user", "shared")
        await isolated.add_message("user", "private")
        assert texts(await shared.get_all_messages()) == ["shared"]
        assert texts(await isolated.get_all_messages()) == ["private"]


async def test_an_append_without_a_decoded_attachment_resolves_its_media(runtime: Runtime) -> None:
    """S1, M4: a cache extended from an event's stored form puts the blob back, as a reload would."""
    with trio.fail_after(GUARD_S):
        manager = await runtime.open("a")
        await manager.add_message("user", "first")
        image = ctxrt.Image({"type": "base64", "media_type": "image/png", "data": PNG})
        stored, blobs = extract_blobs((image,))
        data = codec.message_to_json("user", stored, None, 1, ())
        operation = await runtime.store.ask(AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs)))
        message = await manager.get_message(str(operation.sequence))
        assert message.content == (image,)


async def test_decoding_media_pins_no_read_transaction(runtime: Runtime, store_path: Path) -> None:
    """S1, S3: decoding messages with media releases its read txn at once, not at the next GC pass."""
    image = ctxrt.Image({"type": "base64", "media_type": "image/png", "data": PNG})
    stored, blobs = extract_blobs((image,))
    data = codec.message_to_json("user", stored, None, 1, ())
    env = runtime.engine.env
    with trio.fail_after(GUARD_S):
        manager = await runtime.open("a")
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            gc.collect()
            gc.disable()
            try:
                for _ in range(40):
                    await runtime.store.ask(AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs)))
                    cache.current()  # a tail fill in the read-only runtime
                slots_used = env.info()["num_readers"]
            finally:
                gc.enable()
        assert slots_used <= 4
        assert all(m.content == (image,) for m in await manager.get_all_messages())


# -- S3: a read-only runtime revalidates ----------------------------------------------------


async def test_a_read_only_runtime_at_the_same_revision_reads_no_records(
    runtime: Runtime, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3: with no write since its last read, a read-only cache checks the head and scans nothing."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        await fill(writer, 5)
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            assert texts(cache.current()) == ["m0", "m1", "m2", "m3", "m4"]
            reloads, fills = cache.reloads, cache.tail_fills
            with count_reads(monkeypatch, runtime) as reads:
                assert len(cache.current()) == 5
            assert reads.item_scans == []
            assert reads.heads == 1
            assert (cache.reloads, cache.tail_fills) == (reloads, fills)


async def test_a_read_only_runtime_reads_only_the_appended_tail(
    runtime: Runtime, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3: after appends only, one tail fill reads just the new records; the cache is not reloaded."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        await fill(writer, 50)
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            assert len(cache.current()) == 50
            reloads, fills = cache.reloads, cache.tail_fills
            await writer.add_message("user", "one more")
            with count_reads(monkeypatch, runtime) as reads:
                assert texts(cache.current())[-1] == "one more"
            assert reads.item_scans == [(50, 1)]
            assert (cache.reloads, cache.tail_fills) == (reloads, fills + 1)
            await fill(writer, 3, prefix="t")
            with count_reads(monkeypatch, runtime) as reads:
                assert texts(cache.current())[-3:] == ["t0", "t1", "t2"]
            assert reads.item_scans == [(51, 3)]
            assert (cache.reloads, cache.tail_fills) == (reloads, fills + 2)
            assert cache.current() == shared_cache(runtime).current()


@pytest.mark.parametrize("rewrite", ["edit", "remove"])
async def test_a_read_only_runtime_reloads_after_a_rewrite(
    runtime: Runtime, store_path: Path, rewrite: str
) -> None:
    """S3: an edit or a removal since the last read moves rewrite_revision, so the read-only cache reloads."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        ids = await fill(writer, 4)
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            assert len(cache.current()) == 4
            reloads, fills = cache.reloads, cache.tail_fills
            if rewrite == "edit":
                await writer.edit_message(ids[2], "changed")
                expected = ["m0", "m1", "changed", "m3"]
            else:
                await writer.remove_message(ids[2])
                expected = ["m0", "m1", "m3"]
            await writer.add_message("user", "after")
            assert texts(cache.current()) == [*expected, "after"]
            assert (cache.reloads, cache.tail_fills) == (reloads + 1, fills)


async def test_a_read_only_runtime_compiles_without_writing_and_refuses_writes(runtime: Runtime, store_path: Path) -> None:
    """S3, K4: a read-only runtime beside a writer opens and compiles what the writer made, writing nothing."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        await fill(writer, 3)
        before = runtime.engine.last_sequence
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            manager = await reader.open("a")
            result = await manager.compile()
            assert [m.content[0].text for m in result.messages] == ["m0", "m1", "m2"]
            with pytest.raises(ctxrt.ReadOnlyStoreError):
                await manager.add_message("user", "refused")
            with pytest.raises(ctxrt.ReadOnlyStoreError):
                await reader.create_branch("nope")
        assert runtime.engine.last_sequence == before


# -- S5: diagnostics --------------------------------------------------------------------------


async def test_cache_diagnostics_log_reloads_with_a_reason_and_tail_fills_with_a_count(
    runtime: Runtime, store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """S5: with CTXRT_CACHE_DIAG=1, logger ctxrt.slots reports each reload's reason and each tail fill's count."""
    monkeypatch.setenv("CTXRT_CACHE_DIAG", "1")
    caplog.set_level(logging.INFO, logger="ctxrt.slots")
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        ids = await fill(writer, 3)
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            caplog.clear()
            await fill(writer, 2, prefix="t")
            cache.current()
            await writer.edit_message(ids[0], "changed")
            cache.current()
    records = [r for r in caplog.records if r.name == "ctxrt.slots"]
    messages = [r.getMessage() for r in records]
    assert len(messages) == 2, messages
    assert "tail fill" in messages[0] and "2 appended" in messages[0]
    assert "reload" in messages[1] and "rewritten since" in messages[1]
    assert all(r.levelno == logging.INFO for r in records)


async def test_cache_diagnostics_are_silent_unless_enabled(
    runtime: Runtime, store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """S5: without CTXRT_CACHE_DIAG=1 the same reloads and tail fills log nothing."""
    monkeypatch.delenv("CTXRT_CACHE_DIAG", raising=False)
    caplog.set_level(logging.DEBUG, logger="ctxrt.slots")
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        ids = await fill(writer, 3)
        async with ctxrt.open_runtime(store_path, readonly=True) as reader:
            cache = shared_cache(reader)
            await fill(writer, 2)
            cache.current()
            await writer.edit_message(ids[0], "changed")
            cache.current()
            assert (cache.tail_fills, cache.reloads) == (1, 2)
    assert [r for r in caplog.records if r.name == "ctxrt.slots"] == []


async def test_a_forks_slot_cache_starts_from_its_parents_without_decoding(runtime: Runtime) -> None:
    """S1, K2: a fork's first read takes the parent's cached messages up to the fork point (no reload),
    and they equal what a fresh load of the branch reads."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        await fill(writer, 20)
        branch = await writer.fork("child")
        figures = (await writer.inspect()).caches[0]
        assert figures.branch_id == runtime.engine.branch(branch).id
        assert figures.reloads == 0  # seeded
        child_cache = shared_cache(runtime, branch)
        fresh = SlotCache(runtime.engine, "messages", child_cache.branch_id, live=False)
        assert child_cache.current() == fresh.current()
        await writer.add_message("user", "on the fork")
        assert [m.content[0].text for m in child_cache.current()][-2:] == ["m19", "on the fork"]


async def test_a_forks_first_compile_takes_its_parents_copy_entries(runtime: Runtime) -> None:
    """S1, P17: a fork's slot cache starts with its parent's copy entries of the messages it takes
    over (the same objects), so its first compile makes none of them, and compiles what the
    parent's does; an edit on the fork makes the fork its own entry and leaves the parent's."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        ids = await fill(writer, 20)
        before = await writer.compile(ctxrt.Budget(max_tokens=10_000))
        parent = shared_cache(runtime)
        branch = await writer.fork("child")
        child = shared_cache(runtime, branch)
        assert child.messages and all(child.copies.get(m) is parent.copies.get(m) is not None for m in child.messages)
        assert (await writer.compile(ctxrt.Budget(max_tokens=10_000))).messages == before.messages
        await writer.edit_message(ids[3], "changed on the fork")
        after = await writer.compile(ctxrt.Budget(max_tokens=10_000))
        assert [m.content[0].text for m in after.messages][3] == "changed on the fork"  # type: ignore[union-attr]
        assert parent.copies.get(parent.messages[3]).content[0].text == "m3"  # type: ignore[union-attr]


async def test_a_branch_at_an_old_message_keeps_its_copy_entries_bounded_by_what_it_holds(runtime: Runtime) -> None:
    """S1, P17: a fork's slot starts with its parent's copy entries of the messages it takes over,
    and its table is bounded by the messages it holds, as every table is (``memos.outgrown``): a
    branch at an old message of a long parent, read only through a view filter (no reader view of
    the slot bounds its table), keeps the entries of its few messages, not the parent's hundreds
    (nor the parent's messages past the fork alive through them)."""
    with trio.fail_after(GUARD_S):
        writer = await runtime.open("a")
        ids = await fill(writer, 2 * SLACK + 100)
        await writer.compile(ctxrt.Budget(max_tokens=100_000))
        parent = shared_cache(runtime)
        assert len(parent.copies) == len(ids)
        name = await writer.branch_at(ids[4])
        filtered = await runtime.open("a", branch=name, view_filter=lambda message: True)
        child = shared_cache(runtime, name)
        assert child.reloads == 0 and [m.id for m in child.messages] == ids[:5]  # seeded
        assert all(child.copies.get(m) is parent.copies.get(m) is not None for m in child.messages)
        assert len(child.copies) <= 2 * len(child.messages) + SLACK
        assert texts((await filtered.compile(ctxrt.Budget(max_tokens=100_000))).messages) == [f"m{k}" for k in range(5)]
        assert len(child.copies) <= 2 * len(child.messages) + SLACK


async def test_the_last_actor_on_a_branch_leaving_drops_its_slot_cache(runtime: Runtime) -> None:
    """S1: caches live as long as an actor reads them; a fork nobody reads any more holds no memory."""
    with trio.fail_after(GUARD_S):
        keeper = await runtime.open("keeper")
        mover = await runtime.open("mover")
        await fill(keeper, 3)
        assert runtime.statistics().slot_caches == 1
        await mover.fork("side")
        assert runtime.statistics().slot_caches == 2
        await mover.aclose()
        assert runtime.statistics().slot_caches == 1  # the side branch's cache went with its last reader
        assert await keeper.message_count() == 3


# -- the append fan-out: O(1) per append for namespaces that don't want appends -------------------


async def test_an_append_visits_only_the_background_drainers_even_with_a_hold(tmp_path: Path) -> None:
    """With many namespaces on one slot, an append calls only the namespaces whose strategy drains in
    the background (they listen to the slot's cache); a hold rides its append through its own
    namespace actor, so an append with one visits no idle namespace either."""
    async with ctxrt.open_runtime(tmp_path / "store") as rt:
        idle = [await rt.open(f"idle-{k}") for k in range(20)]
        drainer = await rt.open("drainer", strategy=ctxrt.Autobiographical("m", auto_tick=True))
        cache = rt.slots.cache("messages", rt.engine.branch("main").id)
        assert len(cache.listeners) == 1
        heard: list[int] = []
        cache.listen(heard.append)
        plain = await idle[0].add_message("user", "no hold")
        held = await idle[3].add_message("user", "held", hold_compression=True)
        appended = [(await idle[0].get_message(found)).sequence for found in (plain, held)]
        assert heard == appended and len(cache.listeners) == 2  # each append once, to each listener
        await drainer.aclose()
        assert len(cache.listeners) == 1  # the test's own


async def test_a_shared_stores_cache_takes_in_an_append_it_read_before_its_event_without_reloading(
    pg_url: str,
) -> None:
    """S3, L6: on a shared store (PostgreSQL) a writing runtime's cache looks at the head before a
    read, so it may take an append in (a tail fill) before the append's commit event reaches it
    (the commit thread committed; the loop hasn't published it yet). The event then changes nothing:
    the cache neither goes stale nor reloads (it did both: the next read decoded the whole window
    again, and its listeners heard of no append until then)."""
    async with ctxrt.open_runtime(pg_url) as rt:
        await (await rt.open("a")).add_message("user", "first")
        cache = SlotCache(rt.engine, "messages", rt.engine.branch("main").id, live=True)
        assert [m.content[0].text for m in cache.current()] == ["first"]  # type: ignore[union-attr]
        loaded = cache.figures()
        data, _, appended = prepare_append("user", [{"type": "text", "text": "second"}])
        [(ok, _)], operations = rt.engine.apply(
            [AppendItem(state="messages", branch="main", data=data, attachment=appended)], execute)
        assert ok
        assert [m.content[0].text for m in cache.current()] == ["first", "second"]  # type: ignore[union-attr]
        for operation in operations:  # its event, after the read took it in
            cache.apply(operation)
        after = cache.figures()
        assert not cache.stale and after.reloads == loaded.reloads and after.tail_fills == loaded.tail_fills + 1
        assert [m.content[0].text for m in cache.current()] == ["first", "second"]  # type: ignore[union-attr]


async def test_a_shared_stores_cache_tells_its_listeners_of_another_processs_appends_it_reads(pg_url: str) -> None:
    """S3, T8: on a shared store (PostgreSQL) a cache takes another process's appends in at a look at
    the head (a tail fill), and its listeners hear each one's sequence, once: an auto-ticking
    namespace served here compresses them, where it heard only of this process's own appends and
    sat with units to compress for good (attack/liveness.py: no model call in 100 s of another
    process appending). An append of this process a look took in before its event is not heard
    again at the event."""
    async with ctxrt.open_runtime(pg_url) as rt, ctxrt.open_runtime(pg_url) as other:
        await (await rt.open("a")).add_message("user", "first")
        cache = SlotCache(rt.engine, "messages", rt.engine.branch("main").id, live=True)
        cache.current()
        heard: list[int] = []
        cache.listen(heard.append)
        writer = await other.open("a")
        theirs = [await writer.add_message("user", text) for text in ("second", "third")]
        assert [m.content[0].text for m in cache.current()][-2:] == ["second", "third"]  # type: ignore[union-attr]
        assert heard == [(await writer.get_message(found)).sequence for found in theirs]  # type: ignore[union-attr]
        data, _, appended = prepare_append("user", [{"type": "text", "text": "own"}])
        [(ok, own)], operations = rt.engine.apply(
            [AppendItem(state="messages", branch="main", data=data, attachment=appended)], execute)
        assert ok
        cache.current()  # the look takes it in before its event
        for operation in operations:
            cache.apply(operation)
        assert heard[2:] == [own.sequence]


async def test_an_auto_ticking_namespace_compresses_what_another_process_appends(pg_url: str) -> None:
    """T8, S3: a namespace served here with an auto-ticking strategy, another runtime on the same
    PostgreSQL store (another process's, as far as the caches know) appending to it: once this
    process reads the namespace, its drain compresses what was appended there (it never did)."""
    model = ScriptedModel(lambda _: "SUMMARY " + "remembered " * 30)
    config = ctxrt.Autobiographical("m", target_chunk_tokens=300, recent_window_tokens=0, head_window_tokens=0,
                                    l1_holdback_chunks=0, auto_tick=True)
    async with ctxrt.open_runtime(pg_url) as rt, ctxrt.open_runtime(pg_url) as other:
        served = await rt.open("auto", isolate=True, strategy=config, model=model)
        writer = await other.open("auto", isolate=True)
        for i in range(30):
            await writer.add_message("user", f"Message {i}. " + "filler words " * 20)
        with trio.fail_after(30):
            assert await served.message_count() == 30  # a read: the cache takes the appends in
            await wait_until(lambda: bool(model.requests))  # the drain's, sent in the background
            await served.wait_ready()
        assert (await served.health()).pending_units == 0
