"""Events (issue 13 item 5; docs/api.md, Host controls): ``subscribe()`` gives each added, edited
and removed message once, in sequence order, writes from other managers included, and for a
read-only runtime the writes of another runtime. Real LMDB stores; ``diff`` by property."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import ctxrt
from ctxrt import Added, Edited, Message, MessageEvent, Removed, Text
from ctxrt.events import diff
from support import wait_until

GUARD_S = 30


def apply(old: list[Message], events: list[MessageEvent]) -> list[Message]:
    by_sequence = {m.sequence: m for m in old}
    for event in events:
        if isinstance(event, Removed):
            for message_id in event.ids:
                del by_sequence[int(message_id)]
        elif isinstance(event, Edited):
            assert event.previous == by_sequence[event.message.sequence]
            by_sequence[event.message.sequence] = event.message
        else:
            assert event.message.sequence not in by_sequence
            by_sequence[event.message.sequence] = event.message
    return [by_sequence[s] for s in sorted(by_sequence)]


slots = st.lists(st.tuples(st.integers(1, 40), st.sampled_from(["a", "b"])), unique_by=lambda t: t[0]).map(
    lambda pairs: [Message(str(s), s, "user", (Text(t),)) for s, t in sorted(pairs)])


@given(slots, st.data())
def test_the_diff_of_two_looks_at_a_slot_turns_the_first_into_the_second(old: list[Message], data: st.DataObject) -> None:
    """Item 5: what a read-only runtime reports between two looks accounts for every change."""
    kept = [m for m in old if data.draw(st.booleans())]
    edited = [Message(m.id, m.sequence, m.participant, (Text("edited"),)) if data.draw(st.booleans()) else m
              for m in kept]
    top = max((m.sequence for m in old), default=0)
    new = edited + [Message(str(s), s, "user", (Text("new"),)) for s in range(top + 1, top + data.draw(st.integers(0, 3)) + 1)]
    assert apply(old, diff(old, new)) == new


async def collect(receive: trio.MemoryReceiveChannel[MessageEvent], count: int) -> list[MessageEvent]:
    return [await receive.receive() for _ in range(count)]


async def test_every_append_of_100_concurrent_writers_arrives_once_in_order_then_edits_and_removals(tmp_path: Path) -> None:
    """Item 5: 100 writers on other managers; each Added once, in sequence order; an edit brings the
    message and what it was; a removal the ids it took."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            watcher = await rt.open("watcher")
            writers = [await rt.open(f"writer-{i}") for i in range(100)]
            async with watcher.subscribe() as events:
                async with trio.open_nursery() as nursery:
                    for i, writer in enumerate(writers):
                        async def write(writer: ctxrt.ContextManager = writer, i: int = i) -> None:
                            for j in range(5):
                                await writer.add_message("user", f"w{i}-{j}")
                        nursery.start_soon(write)
                added = await collect(events, 500)
                assert all(isinstance(e, Added) for e in added)
                sequences = [e.message.sequence for e in added]  # type: ignore[union-attr]
                assert sequences == sorted(set(sequences)) and len(sequences) == 500
                assert sequences == [m.sequence for m in await watcher.get_all_messages()]
                first, second, third = (str(s) for s in sequences[:3])
                await writers[0].edit_message(first, "changed")
                await writers[1].remove_messages(second, third)
                edited, removed = await collect(events, 2)
                assert isinstance(edited, Edited) and edited.message.content == (Text("changed"),)
                assert edited.previous is not None and edited.previous.id == first
                assert removed == Removed((second, third))
                with trio.move_on_after(0.1):
                    extra = await events.receive()
                    raise AssertionError(f"an event nobody made: {extra!r}")


async def test_a_read_only_runtime_reports_another_runtimes_writes(tmp_path: Path) -> None:
    """Item 5: a read-only runtime sees the writer's appends in order, and its rewrites."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            writer = await rt.open("writer")
            before = await writer.add_message("user", "before")
            async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as reader_rt:
                reader = await reader_rt.open("writer")
                async with reader.subscribe(poll_interval_s=0.01) as events:
                    ids = [await writer.add_message("user", f"m{i}") for i in range(5)]
                    added = await collect(events, 5)
                    assert [e.message.id for e in added] == ids  # type: ignore[union-attr]
                    await writer.edit_message(before, "after")
                    await writer.remove_message(ids[0])
                    # Seen in one look or two (a rewrite between looks is reported as removals, then edits).
                    changes = {type(event): event for event in await collect(events, 2)}
                    assert changes[Removed] == Removed((ids[0],))
                    edited = changes[Edited]
                    assert isinstance(edited, Edited) and edited.message.content == (Text("after"),)
                    assert edited.previous is not None and edited.previous.content == (Text("before"),)


async def test_a_subscription_ends_when_its_branch_is_deleted(tmp_path: Path) -> None:
    """Item 5 (from a host-style attack): the channel closes, so a host's loop over it ends."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            main = await rt.open("writer")
            await main.add_message("user", "first")
            branch = await main.fork("side")
            side = await rt.open("watcher", branch=branch)
            async with side.subscribe() as events:
                await side.add_message("user", "on the side")
                await rt.delete_branch(branch)
                seen = [event async for event in events]
            assert [type(e) for e in seen] == [Added]


@pytest.mark.parametrize("move", ["fork", "switch_branch", "Runtime.switch_branch"])
async def test_a_subscription_ends_when_its_manager_moves_to_another_branch(tmp_path: Path, move: str) -> None:
    """R1, R3 (from a host-style attack): the subscription watched the slot the manager left; it
    ends (after the events already sent) rather than handing its host the old branch's writes as
    the manager's while the manager's own writes go unseen. Subscribed again, it hears the new branch."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            await rt.create_branch("side")
            manager = await rt.open("watcher")
            async with manager.subscribe() as events:
                await manager.add_message("user", "on main")
                if move == "fork":
                    await manager.fork("forked")
                elif move == "switch_branch":
                    await manager.switch_branch("side")
                else:
                    assert await rt.switch_branch("main", "side") == 1
                assert isinstance(events.receive_nowait(), Added)
                with pytest.raises(trio.EndOfChannel):
                    events.receive_nowait()
            async with manager.subscribe() as events:
                added = await manager.add_message("user", "on the new branch")
                event = await events.receive()
                assert isinstance(event, Added) and event.message.id == added


async def test_a_subscription_ends_when_its_manager_closes(tmp_path: Path) -> None:
    """Item 5 (from a host-style attack): a host's reader task loops over the events in a task of
    its own; closing the manager ends that loop after the events already sent, instead of leaving
    the task blocked forever."""
    seen: list[MessageEvent] = []
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            manager = await rt.open("watcher")
            other = await rt.open("watcher")
            subscribed = trio.Event()

            async def read() -> None:
                async with manager.subscribe() as events:
                    subscribed.set()
                    seen.extend([event async for event in events])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await subscribed.wait()
                await manager.add_message("user", "before the close")
                await manager.aclose()
                await other.add_message("user", "after the close")  # not for a closed manager's reader
            assert [(type(e), e.message.content) for e in seen if isinstance(e, Added)] == [
                (Added, (Text("before the close"),))]


async def test_subscriptions_end_when_the_runtime_closes(tmp_path: Path) -> None:
    """Item 5: leaving ``open_runtime`` ends every subscription's loop, in a writing runtime (events
    from the publish step) and in a read-only one (events from its looks)."""
    ended: list[str] = []

    async def read(manager: ctxrt.ContextManager, label: str, ready: trio.Event) -> None:
        async with manager.subscribe(poll_interval_s=0.01) as events:
            ready.set()
            async for _ in events:
                pass
        ended.append(label)

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
                writer = await rt.open("writer")
                await writer.add_message("user", "first")
                async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as reader_rt:
                    reader = await reader_rt.open("writer")
                    ready = [trio.Event(), trio.Event()]
                    nursery.start_soon(read, reader, "read-only", ready[0])
                    nursery.start_soon(read, writer, "writing", ready[1])
                    for event in ready:
                        await event.wait()
                    await writer.add_message("user", "second")
                await wait_until(lambda: "read-only" in ended)  # the read-only runtime closed
                assert ended == ["read-only"]  # the writing runtime's subscription lives on
        assert ended == ["read-only", "writing"]  # the nursery waited for the writing runtime's reader


async def test_an_ended_subscription_hears_no_more_commits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Item 5 (second attack round): once its manager closed, a subscription whose block is still
    open takes no more events, so other managers' commits log no failure of it."""
    caplog.set_level(logging.WARNING, logger="ctxrt")
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            closing = await rt.open("watcher")
            other = await rt.open("watcher")
            async with closing.subscribe() as events:
                await closing.aclose()
                for i in range(3):
                    await other.add_message("user", f"after the close {i}")
                assert [event async for event in events] == []
    assert [r.getMessage() for r in caplog.records] == []


async def test_a_read_only_subscription_stops_looking_when_its_runtime_closes(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    """Item 5 (second attack round): a read-only runtime's poller stops when the runtime closes, so
    a host task that stays in its subscribe block after the loop ended exits it cleanly instead of
    raising from the closed store."""
    async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
        await (await rt.open("writer")).add_message("user", "first")
    outcome: list[str] = []

    async def read(manager: ctxrt.ContextManager, subscribed: trio.Event) -> None:
        async with manager.subscribe(poll_interval_s=0.001) as events:
            subscribed.set()
            assert [event async for event in events] == []
            outcome.append("ended")
            clock.jump(1.0)  # a thousand poll intervals after the runtime closed
            await trio.testing.wait_all_tasks_blocked()
        outcome.append("left the block")

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as reader_rt:
                subscribed = trio.Event()
                nursery.start_soon(read, await reader_rt.open("writer"), subscribed)
                await subscribed.wait()
    assert outcome == ["ended", "left the block"]
