"""Costs that grow with the budget, not the history (docs/behaviours.md L7).

A slot cache decodes from the newest message back only as far as a read asks; these tests count
what it decoded (``SlotCache.decoded``, on the cache ``inspect()`` names) and check
that what the lazy paths return equals what a full read of the store gives. Real LMDB stores in
temp dirs; the ratio itself (200,000 vs 2,000 messages) is measured in ``bench/costs.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt import Budget, Passthrough, Runtime, Text, WindowedPassthrough
from ctxrt.testing import AppendItem, LogHead, SlotCache, codec, estimate_message

GUARD_S = 60
HISTORY = 3_000
SMALL = Budget(max_tokens=1_400, reserve_for_response=400)  # about 60 of the messages below


async def write_history(path: Path, count: int = HISTORY, *, audience_every: int = 0) -> None:
    """``count`` messages, group-committed; every ``audience_every``-th holds a block for "bob" only."""
    async with ctxrt.open_runtime(path, durability="os") as rt:
        writer = await rt.open("writer")

        async def add(start: int) -> None:
            for i in range(start, min(start + 100, count)):
                content: list[Text] = [Text(f"message {i} " + "word " * 8)]
                if audience_every and i % audience_every == 0:
                    content.append(Text(f"for bob {i}", audience=("bob",)))
                await writer.add_message("user" if i % 2 else "assistant", content)

        for batch in range(0, count, 1_000):
            async with trio.open_nursery() as nursery:
                for start in range(batch, min(batch + 1_000, count), 100):
                    nursery.start_soon(add, start)
        await writer.aclose()


async def cache_of(rt: Runtime, manager: ctxrt.ContextManager) -> SlotCache:
    """The slot cache ``manager``'s namespace reads: the runtime's own (``inspect()`` names it, as a copy)."""
    figures = (await manager.inspect()).caches[0]
    return rt.slots.cache(figures.state, figures.branch_id)


def texts(messages: object) -> list[str]:
    return [block.text for message in messages for block in message.content]  # type: ignore[attr-defined]


async def test_a_cold_passthrough_compile_decodes_what_its_budget_holds_not_the_slot(tmp_path: Path) -> None:
    """L7: a cold open plus first compile decodes about what the budget holds; the compile equals
    the newest messages of a full read."""
    await write_history(tmp_path)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("reader", strategy=Passthrough())
            cache = await cache_of(rt, manager)
            assert cache.decoded == 0  # opening reads the head, no message
            assert await manager.message_count() == HISTORY and cache.decoded == 0
            result = await manager.compile(SMALL)
            assert 20 < len(result.messages) < 200
            assert cache.decoded <= 2 * len(result.messages) + 64
            newest = (await manager.get_all_messages())[-len(result.messages) :]
            assert [m.content for m in result.messages] == [m.content for m in newest]
            stats = manager.render_stats()  # Passthrough's older history is out by design: not a drop
            assert stats is not None and stats.dropped_ids == () and stats.head_tokens == 0
            assert stats.tail_tokens == sum(estimate_message(m) for m in newest) <= SMALL.usable
            assert cache.decoded == HISTORY  # get_all_messages needed them all


async def test_a_cold_windowed_compile_reads_back_to_its_anchor_or_the_budget_only(tmp_path: Path) -> None:
    """L7, T2: a first windowed compile of a long slot re-anchors from the tail without decoding the
    slot; a cold runtime later reads back to the stored anchor only."""
    await write_history(tmp_path)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("windowed", strategy=WindowedPassthrough())
            first = await manager.compile(SMALL)
            decoded = (await cache_of(rt, manager)).decoded
            assert decoded <= 4 * len(first.messages) + 128
            for i in range(3):
                await manager.add_message("user", f"after {i}")
            again = await manager.compile(SMALL)
            assert texts(again.messages)[: len(first.messages)] == texts(first.messages)  # same anchor
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("windowed", strategy=WindowedPassthrough())
            cold = await manager.compile(SMALL)
            assert texts(cold.messages) == texts(again.messages)
            assert (await cache_of(rt, manager)).decoded <= 2 * len(cold.messages) + 64


async def test_a_readers_cold_compile_projects_only_what_it_reads_and_hides_anothers_blocks(tmp_path: Path) -> None:
    """L7, A3: with audience blocks in the slot, a reader's cold compile still decodes about what its
    budget holds, and no compiled message holds another reader's block."""
    await write_history(tmp_path, audience_every=7)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            ann = await rt.open("ann", view_reader="ann", strategy=Passthrough())
            cache = await cache_of(rt, ann)
            assert cache.may_hold_audience  # from the head's flag, before any message is decoded
            result = await ann.compile(SMALL)
            assert cache.decoded <= 2 * len(result.messages) + 64
            assert not any("for bob" in text for text in texts(result.messages))
            bob = await rt.open("bob", view_reader="bob", strategy=Passthrough())
            seen = texts((await bob.compile(SMALL)).messages)
            assert any("for bob" in text for text in seen)


async def test_a_read_only_runtime_and_a_fork_compile_without_decoding_the_slot(tmp_path: Path) -> None:
    """L7: a read-only runtime is useful at once, and a fork's first compile reuses what its parent
    holds: neither decodes the history."""
    await write_history(tmp_path)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as writer_rt:
            writer = await writer_rt.open("writer")
            parent = await writer.compile(SMALL)
            async with ctxrt.open_runtime(tmp_path, readonly=True) as reader_rt:
                reader = await reader_rt.open("writer")
                assert texts((await reader.compile(SMALL)).messages) == texts(parent.messages)
                assert (await cache_of(reader_rt, reader)).decoded <= 2 * len(parent.messages) + 64
            parent_cache = await cache_of(writer_rt, writer)
            before = parent_cache.decoded
            branch = await writer.fork("side")
            side = await writer_rt.open("writer", branch=branch)
            assert texts((await side.compile(SMALL)).messages) == texts(parent.messages)
            assert (await cache_of(writer_rt, side)).decoded == 0
            assert parent_cache.decoded == before


async def test_an_old_message_is_read_without_decoding_the_messages_after_it(tmp_path: Path) -> None:
    """L7: get_message of an old message and a window near the head read what they name only."""
    await write_history(tmp_path)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("reader")
            cache = await cache_of(rt, manager)
            window = await manager.get_message_window(-5, 5)
            assert window.total_count == HISTORY and len(window.messages) == 5
            assert cache.decoded <= 64
            first = (await manager.get_message_window(0, 1)).messages[0]
            assert cache.decoded == HISTORY  # offset 0 reads back to the first message
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("reader")
            cache = await cache_of(rt, manager)
            assert await manager.get_message(first.id) == first
            assert cache.decoded == 1


async def test_an_audience_written_below_the_slot_layer_is_found_as_it_is_read_back(tmp_path: Path) -> None:
    """L7, A3: an item stored without its audience flag (through the store's own protocol) is
    projected once reading back meets it: no compile holds another reader's block."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path, durability="os") as rt:
            writer = await rt.open("writer")
            data = codec.message_to_json("user", (Text("secret", audience=("bob",)), Text("open")), None, 0, ())
            await rt.store.ask(AppendItem(state="messages", branch="main", data=data))  # no flag
            for i in range(300):
                await writer.add_message("user", f"plain {i}")
        async with ctxrt.open_runtime(tmp_path) as rt:
            ann = await rt.open("ann", view_reader="ann")
            cache = await cache_of(rt, ann)
            assert not cache.may_hold_audience
            result = await ann.compile(Budget(max_tokens=200_000))
            assert "secret" not in texts(result.messages) and "open" in texts(result.messages)
            assert cache.may_hold_audience


@pytest.mark.parametrize("flagged", [None, False, True])
def test_a_head_keeps_its_flag_and_a_head_without_one_reads_as_unknown(flagged: bool | None) -> None:
    """L7: the audience flag round-trips; a head an older ctxrt wrote (no flag byte) reads as None."""
    head = LogHead(3, 4, ((1, 2),), 9, 7, flagged)
    assert LogHead.decode(head.encode()) == head
    if flagged is None:
        assert head.encode() == LogHead(3, 4, ((1, 2),), 9, 7, False).encode()[:-1]


async def test_namespaces_reading_one_slot_as_one_reader_share_its_projection(tmp_path: Path) -> None:
    """L7, A3: each message is projected once per slot and reader view, not once per namespace;
    another reader's view is another projection, and a filtered view is its own."""
    await write_history(tmp_path, count=200, audience_every=5)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            first = await rt.open("ann/one", view_reader="ann")
            second = await rt.open("ann/two", view_reader="ann")
            bob = await rt.open("bob/one", view_reader="bob")
            filtered = await rt.open("ann/filtered", view_reader="ann", view_filter=lambda m: True)
            for manager in (first, second, bob, filtered):
                await manager.compile(Budget(max_tokens=200_000))
            shared = (await first.inspect()).reader_listing
            assert shared.shared and (await second.inspect()).reader_listing == shared  # one projection
            assert shared.projected == 200  # once, for both namespaces
            assert (await bob.inspect()).reader_listing.reader == "bob"  # its own projection of the slot
            assert not (await filtered.inspect()).reader_listing.shared
            assert texts((await first.compile(Budget(max_tokens=200_000))).messages) == texts(
                (await second.compile(Budget(max_tokens=200_000))).messages)


@pytest.mark.parametrize("change", ["edit", "remove"])
async def test_a_rewrite_that_brings_the_first_audience_block_is_seen_by_the_next_compile(
    tmp_path: Path, change: str,
) -> None:
    """L7, A3 (from a host-style attack): a listing's stamp names the listing, so a reader view that
    switches from passing its slot through to projecting it is never taken as 'only appended'."""
    big = Budget(max_tokens=100_000)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            bob = await rt.open("bob", view_reader="bob")
            ann = await rt.open("ann", view_reader="ann")
            ids = [await ann.add_message("user", f"msg {i}") for i in range(10)]
            await bob.compile(big)
            if change == "edit":
                await ann.edit_message(ids[0], [Text("msg 0 EDITED"), Text("for ann", audience=("ann",))])
            else:
                await ann.remove_message(ids[0])
                await ann.add_message("user", [Text("tail"), Text("for ann", audience=("ann",))])
            warm = texts((await bob.compile(big)).messages)
        async with ctxrt.open_runtime(tmp_path) as rt:
            cold = texts((await (await rt.open("bob", view_reader="bob")).compile(big)).messages)
    assert warm == cold and "for ann" not in warm
    assert ("msg 0 EDITED" in warm) if change == "edit" else ("msg 0" not in warm)


async def test_a_namespace_claimed_after_compiling_for_no_reader_compiles_its_readers_view(tmp_path: Path) -> None:
    """L7, C5 (from a host-style attack): the claim gives the actor another view, whose stamps are
    never the old view's, so the kept strategy starts over."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            writer = await rt.open("w")
            await writer.add_message("user", "hello")
            await writer.add_message("user", [Text("for ann only", audience=("ann",))])
            await writer.add_message("user", [Text("public"), Text("ann's note", audience=("ann",))])
            assert texts((await (await rt.open("x")).compile()).messages) == ["hello", "public"]
            warm = texts((await (await rt.open("x", view_reader="ann")).compile()).messages)
        async with ctxrt.open_runtime(tmp_path) as rt:
            cold = texts((await (await rt.open("x", view_reader="ann")).compile()).messages)
    assert warm == cold == ["hello", "for ann only", "public", "ann's note"]


async def test_an_edit_of_a_message_no_read_has_reached_is_applied_without_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """L7 (from a host-style attack): an edit older than everything the cache holds, even when it
    holds nothing yet, is read edited later; nothing is logged as a failure."""
    await write_history(tmp_path, count=300)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as rt:
            old_id = (await (await rt.open("reader")).get_message_window(0, 1)).messages[0].id
        async with ctxrt.open_runtime(tmp_path) as rt:
            manager = await rt.open("reader")
            cache = await cache_of(rt, manager)
            caplog.set_level(logging.WARNING, logger="ctxrt")
            await manager.edit_message(old_id, "rewritten")
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert cache.decoded == 0  # the edit judges the message read from the store (D5), not decoded into the cache
            assert texts([await manager.get_message(old_id)]) == ["rewritten"]
            assert texts((await manager.get_message_window(0, 1)).messages) == ["rewritten"]


async def test_a_read_only_walk_newest_first_never_repeats_a_message_while_the_writer_appends(tmp_path: Path) -> None:
    """L7 (from a review): query_messages(reverse=True) in a read-only runtime reads back as of the
    head it looked at first, so appends landing during the walk neither repeat nor reorder it."""
    await write_history(tmp_path, count=300)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path) as writer_rt:
            writer = await writer_rt.open("writer")
            async with ctxrt.open_runtime(tmp_path, readonly=True) as reader_rt:
                cache = await cache_of(reader_rt, await reader_rt.open("writer"))
                walk = cache.newest_first()
                seen = [next(walk) for _ in range(70)]
                for i in range(3):
                    await writer.add_message("user", f"late {i}")
                seen += list(walk)
    sequences = [m.sequence for m in seen]
    assert len(sequences) == 300 and sequences == sorted(set(sequences), reverse=True)
