"""How long a reader's view of a slot is kept (docs/behaviours.md P17, S1).

Namespaces reading one slot as one reader share that reader's cache on the slot cache (its
projection, its copy entries, what compiles make of its messages). It is kept while one of them
is open and dropped when the last closes or moves to another reader, even though the slot cache
stays for the namespaces reading it otherwise: a host that keeps opening namespaces for new
readers and closing them keeps nothing per closed reader. Store-backed, through the public API;
what a slot cache holds is read off ``Runtime.slots`` (its ``readers``, keyed by reader).
"""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest
import trio

import ctxrt
from ctxrt import Budget, Runtime, Text
from ctxrt.testing import SLACK, SlotCache
from support import wait_until

GUARD_S = 30
BUDGET = Budget(max_tokens=100_000, reserve_for_response=0)


def main_cache(rt: Runtime) -> SlotCache:
    return rt.slots.cache("messages", rt.engine.branch("main").id)


async def fill(manager: ctxrt.ContextManager) -> list[str]:
    """Messages some of which hold a block for one reader only."""
    ids = []
    for k in range(8):
        content = [Text(f"message {k}")]
        if k % 3 == 0:
            content.append(Text(f"for {['ann', 'bob'][k % 2]} only", audience=(["ann", "bob"][k % 2],)))
        ids.append(await manager.add_message("user" if k % 2 == 0 else "Claude", content))
    return ids


async def test_a_readers_cache_is_kept_while_one_of_its_namespaces_is_open_and_dropped_with_the_last(
    store_path: Path,
) -> None:
    """P17, S1: two namespaces reading the slot as ``ann`` share one reader cache; it stays while
    either is open and goes when the last closes, though the slot's cache stays for the keeper
    (reading it as no reader). A namespace with a view filter holds none."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper")
            await fill(keeper)
            first = await rt.open("ann-1", view_reader="ann")
            second = await rt.open("ann-2", view_reader="ann")
            filtered = await rt.open("ann-filtered", view_reader="ann", view_filter=lambda message: True)
            for manager in (first, second, filtered):
                await manager.compile(BUDGET)
            cache = main_cache(rt)
            assert set(cache.readers) == {None, "ann"}
            held = cache.readers["ann"]
            await first.aclose()
            assert cache.readers["ann"] is held  # the other namespace still reads it
            await second.aclose()
            assert set(cache.readers) == {None}  # the filtered one never held it
            await filtered.compile(BUDGET)
            assert set(cache.readers) == {None}
            assert main_cache(rt) is cache and rt.statistics().slot_caches == 1


async def test_a_view_rebuilt_for_the_same_reader_keeps_its_cache(store_path: Path) -> None:
    """P17: a new strategy rebuilds the namespace's views at a new epoch; the reader is the same, so
    is its cache (what compiles made of the messages is kept)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper")
            await fill(keeper)
            manager = await rt.open("ann-1", view_reader="ann")
            before = await manager.compile(BUDGET)
            held = main_cache(rt).readers["ann"]
            await manager.set_strategy(ctxrt.WindowedPassthrough())
            after = await manager.compile(BUDGET)
            assert main_cache(rt).readers["ann"] is held
            assert after.messages[1] is before.messages[1]  # an unmarked message: the shared compiled one
            await manager.aclose()
            assert set(main_cache(rt).readers) == {None}


async def test_a_namespace_claimed_for_a_reader_lets_go_of_the_view_it_read_before(store_path: Path) -> None:
    """P17, C1: a namespace opened for no reader reads the slot as no reader; claimed for ``ann`` by a
    second open, its views move to ``ann``'s cache and the no-reader one, which nobody else reads,
    goes (the keeper reads the slot as ``bob``)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper", view_reader="bob")
            await fill(keeper)
            unclaimed = await rt.open("shared")
            await unclaimed.compile(BUDGET)
            cache = main_cache(rt)
            assert set(cache.readers) == {"bob", None}
            claimed = await rt.open("shared", view_reader="ann")
            await claimed.compile(BUDGET)
            assert set(cache.readers) == {"bob", "ann"}
            await claimed.aclose()
            assert set(cache.readers) == {"bob", "ann"}  # the first manager still reads it, as ann now
            await unclaimed.aclose()
            assert set(cache.readers) == {"bob"}


async def test_a_compile_after_reopening_a_readers_namespace_equals_the_one_before(store_path: Path) -> None:
    """P17, A2: the reader's cache dropped with its last namespace is made again by the next: the
    compile is the same, content and provenance (its own compile id aside), made anew (nothing of
    the old one was kept)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper")
            await fill(keeper)
            for reader in ("ann", "bob"):
                manager = await rt.open(f"{reader}-1", view_reader=reader)
                before = await manager.compile(BUDGET)
                await manager.aclose()
                assert set(main_cache(rt).readers) == {None}
                manager = await rt.open(f"{reader}-1", view_reader=reader)
                after = await manager.compile(BUDGET)
                assert after.messages == before.messages
                assert attrs.evolve(after.provenance, compile_id=before.provenance.compile_id) == before.provenance
                assert all(made is not old for made, old in zip(after.messages, before.messages))
                assert after.to_anthropic(assistant="Claude") == before.to_anthropic(assistant="Claude")
                await manager.aclose()


async def test_a_message_no_audience_block_touches_has_one_copy_entry_for_every_reader(store_path: Path) -> None:
    """P17, A2: the copy entry of a message every reader sees as stored is the slot cache's, made
    once for all readers; one a reader sees projected is that reader's. What a reader compiles
    with entries another reader made equals what it compiles on its own (a view filter: no
    sharing), content and provenance."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper", view_reader="bob")
            ids = await fill(keeper)
            await keeper.compile(BUDGET)  # bob's view makes the shared entries first
            ann = await rt.open("ann-1", view_reader="ann")
            alone = await rt.open("ann-alone", view_reader="ann", view_filter=lambda message: True)
            shared, own = await ann.compile(BUDGET), await alone.compile(BUDGET)
            cache = main_cache(rt)
            projected = [message_id for k, message_id in enumerate(ids) if k % 3 == 0]
            assert len(cache.copies) == len(ids) - len(projected)  # one per unprojected message, not per reader
            for reader in ("ann", "bob"):
                assert len(cache.readers[reader].copies) == len(projected)  # type: ignore[attr-defined]
            assert shared.messages == own.messages
            assert attrs.evolve(shared.provenance, compile_id=own.provenance.compile_id,
                                namespace=own.provenance.namespace) == own.provenance
            await ann.aclose()
            await keeper.aclose()
            assert set(cache.readers) == set()  # the filtered namespace holds none
            await alone.aclose()


async def test_the_slots_copy_entries_stay_bounded_by_the_messages_it_holds_through_edits(store_path: Path) -> None:
    """P17, S2: each edit makes a message a new object, and a new copy entry for every reader; the
    entries of the old objects go once they outnumber what the slot holds (``memos.outgrown``), and
    every compile shows the edited text."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper", view_reader="bob")
            ids = await fill(keeper)
            ann = await rt.open("ann-1", view_reader="ann")
            cache = main_cache(rt)
            largest = 0
            for k in range(SLACK + 4 * len(ids)):  # past the slack: the old entries are cut
                await keeper.edit_message(ids[1], f"edit {k}")
                for manager in (keeper, ann):
                    texts = [block.text for message in (await manager.compile(BUDGET)).messages
                             for block in message.content if isinstance(block, Text)]
                    assert f"edit {k}" in texts
                largest = max(largest, len(cache.copies))
            assert largest > len(ids)  # old objects' entries were kept for a while ...
            assert largest <= 2 * len(cache.messages) + SLACK + 1  # ... and cut once outgrown
            assert len(cache.copies) <= 2 * len(cache.messages) + SLACK + 1


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_cancelled_opens_compiles_and_closes_leave_no_readers_cache_behind(store_path: Path, seed: int) -> None:
    """P17, L3: opens, compiles and closes of namespaces for three readers, cancelled at random
    points, leave each reader's cache exactly while a namespace of that reader is open: once every
    manager is closed and the actors are done, only the keeper's remains; reopened, each reader's
    namespace makes its own again, and closing it drops it."""
    rng = random.Random(seed)
    readers = ["ann", "bob", "cy"]
    cancelled = 0
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            keeper = await rt.open("keeper")
            await fill(keeper)
            live: list[ctxrt.ContextManager] = []
            for _ in range(80):
                timeout = rng.choice([0.0, rng.uniform(0, 0.0005), rng.uniform(0, 0.002), 1.0])
                with trio.move_on_after(timeout) as scope:
                    if live and rng.random() < 0.4:
                        manager = live.pop(rng.randrange(len(live)))
                        await manager.aclose()
                    else:
                        reader = rng.choice(readers)
                        opened = await rt.open(f"{reader}-{rng.randrange(2)}", view_reader=reader)
                        live.append(opened)
                        await opened.compile(BUDGET)
                cancelled += scope.cancelled_caught
            for manager in live:
                await manager.aclose()
            # An actor whose managers all left stops on its own time (a claim a cancelled open sent
            # may still be committing in the store's thread): wait for it, bounded by the guard.
            await wait_until(lambda: rt.statistics().namespace_actors == 1)
            cache = main_cache(rt)
            assert set(cache.readers) == {None}
            for reader in readers:
                manager = await rt.open(f"{reader}-0", view_reader=reader)
                await manager.compile(BUDGET)
                assert set(cache.readers) == {None, reader}
                await manager.aclose()
                await wait_until(lambda: rt.statistics().namespace_actors == 1)
                assert set(cache.readers) == {None}
    assert cancelled > 0
