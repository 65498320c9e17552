"""A host's own state in the store (M9): a JSON value and a log of JSON entries per name, branched
like namespace state (R1, R2), set in a message's own transaction by ``add_message(host_state=)``,
audited by verify (K7), fronted for asyncio (H1).

Determinism rules: each test runs on both engines where it says so (a fresh LMDB directory, or a
fresh database of the session's PostgreSQL cluster). The kill -9 test starts a real writer process
(``host_state_writer.py``) and kills it with SIGKILL after a number of acknowledged messages drawn
from a seeded generator (the seed in every failure message, ``CTXRT_CRASH_SEED`` replays it); 3
rounds on each engine (50 under ``CTXRT_SOAK=1``), one store through them all. Corruption is a
flipped bit in the LMDB data file (as test_failsafe_bits does) or a rewritten PostgreSQL row.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt import HostEntry, MalformedContentError, open_runtime
from ctxrt.errors import BranchNotFoundError, ReadOnlyStoreError, StoreCorruptError
from ctxrt.testing import files, verify, verify_store
from support import LineReader, flip

WRITER = Path(__file__).with_name("host_state_writer.py")


@pytest.fixture(params=["lmdb", "postgres"])
def store(request: pytest.FixtureRequest, store_path: Path) -> Path | str:
    """An LMDB store's directory, or a PostgreSQL store's URL (a database of the test cluster)."""
    return store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")


@pytest.fixture
async def rt(store: Path | str) -> AsyncIterator[ctxrt.Runtime]:
    async with open_runtime(store, durability="os") as runtime:
        yield runtime


async def test_get_set_append_entries_round_trip_json(rt: ctxrt.Runtime) -> None:
    """M9: a state nobody wrote reads None and no entries; set replaces the value, append adds an
    entry whose sequence it returns, entries(since=s) holds those appended after sequence s."""
    state = await rt.host_state("framework")
    assert (state.name, state.branch) == ("framework", "main")
    assert await state.get() is None and await state.entries() == []
    value = {"turn": 3, "agents": ["ann", "bob"], "ratio": 0.5, "ok": True, "none": None, "text": "héllo"}
    await state.set(value)
    assert await state.get() == value
    await state.set([1, 2])
    assert await state.get() == [1, 2]
    first = await state.append({"request": 1})
    second = await state.append("two")
    third = await state.append(3)
    assert first < second < third
    assert await state.entries() == [HostEntry(first, {"request": 1}), HostEntry(second, "two"), HostEntry(third, 3)]
    assert await state.entries(since=first) == [HostEntry(second, "two"), HostEntry(third, 3)]
    assert await state.entries(since=third) == []
    assert await state.entries(since=0) == await state.entries()
    other = await rt.host_state("other")  # names are separate states
    assert await other.get() is None and await other.entries() == []


async def test_refuses_what_isnt_json_naming_the_place_and_stores_nothing(rt: ctxrt.Runtime) -> None:
    """M9, M7: a value or entry that isn't JSON, a bad name, a bad since, or a host_state of
    add_message that isn't JSON is refused at the call, naming the place; nothing is stored (the
    store's sequence doesn't move) and the message isn't either."""
    state = await rt.host_state("framework")
    await state.set({"kept": 1})
    await state.append("kept")
    manager = await rt.open("ann")
    before = rt.engine.last_sequence
    refusals: list[tuple[Any, str]] = [
        (lambda: state.set({"a": float("nan")}), "value.a"),
        (lambda: state.set({"a": [1, object()]}), "value.a[1]"),
        (lambda: state.set({1: "int key"}), "value[1]"),
        (lambda: state.append({"x": float("inf")}), "entry.x"),
        (lambda: state.append("\ud800"), "entry"),
        (lambda: rt.host_state("a/b"), "name"),
        (lambda: rt.host_state(""), "name"),
        (lambda: manager.add_message("user", "hi", host_state={"framework": {"a": {1, 2}}}),
         "host_state['framework'].a"),
        (lambda: manager.add_message("user", "hi", host_state={"bad/name": 1}), "host_state['bad/name']"),
    ]
    for call, path in refusals:
        with pytest.raises(MalformedContentError) as caught:
            await call()
        assert caught.value.path == path, (path, caught.value)
    for call, message in [(lambda: rt.host_state(3), "name must be a string"),
                          (lambda: manager.add_message("user", "hi", host_state=[("a", 1)]),
                           "host_state must be a mapping"),
                          (lambda: state.entries(since="3"), "since must be an integer")]:
        with pytest.raises(TypeError, match=message):
            await call()
    with pytest.raises(ValueError, match="since must be at least 0"):
        await state.entries(since=-1)
    assert rt.engine.last_sequence == before
    assert await state.get() == {"kept": 1} and [e.value for e in await state.entries()] == ["kept"]
    assert not await manager.get_all_messages()


async def test_a_fork_sees_the_parents_state_up_to_the_fork_point_and_child_writes_stay_on_the_child(
    rt: ctxrt.Runtime,
) -> None:
    """M9, R1, R2: a branch made at a sequence reads the parent's value and log as they were then;
    writes on the child never reach the parent, and the parent's later writes never reach the child."""
    parent = await rt.host_state("framework")
    await parent.set("before")
    early = await parent.append("e1")
    fork_point = rt.engine.last_sequence
    await parent.set("after")
    late = await parent.append("e2")
    await rt.create_branch("side", at_sequence=fork_point)
    child = await rt.host_state("framework", branch="side")
    assert await child.get() == "before"
    assert await child.entries() == [HostEntry(early, "e1")]
    own = await child.append("on the side")
    await child.set("child's")
    assert await child.get() == "child's"
    assert await child.entries() == [HostEntry(early, "e1"), HostEntry(own, "on the side")]
    assert await parent.get() == "after"
    assert await parent.entries() == [HostEntry(early, "e1"), HostEntry(late, "e2")]
    # A state first written on the child is absent on the parent.
    await (await rt.host_state("only-side", branch="side")).set(1)
    assert await (await rt.host_state("only-side")).get() is None


async def test_a_manager_fork_at_a_message_sees_the_state_written_with_it(rt: ctxrt.Runtime) -> None:
    """M9, R1: add_message(host_state=) writes the state just before its message in one batch, so
    a branch at that message (branch_at, derive at its sequence) sees the state set with it."""
    manager = await rt.open("ann")
    state = await rt.host_state("checkpoint")
    first = await manager.add_message("user", "one", host_state={"checkpoint": {"at": "one"}})
    await manager.add_message("user", "two", host_state={"checkpoint": {"at": "two"}})
    assert await state.get() == {"at": "two"}
    branch = await manager.branch_at(first, "back")
    assert await (await rt.host_state("checkpoint", branch=branch)).get() == {"at": "one"}
    child = await manager.derive(branch="derived", at_sequence=int(first))
    assert [m.id for m in await child.get_all_messages()] == [first]
    assert await (await rt.host_state("checkpoint", branch="derived")).get() == {"at": "one"}


async def test_add_message_with_host_state_commits_both_or_neither(rt: ctxrt.Runtime) -> None:
    """M9: a message refused (malformed content, a deleted branch) writes no state; a stored one
    stores its state, with or without hold_compression (the hold's path through the namespace
    actor commits the same one batch)."""
    manager = await rt.open("ann")
    state = await rt.host_state("progress")
    before = rt.engine.last_sequence
    with pytest.raises(MalformedContentError):
        await manager.add_message("user", [{"type": "bogus"}], host_state={"progress": 1})
    with pytest.raises(MalformedContentError):
        await manager.add_message("", "no participant", host_state={"progress": 1})
    assert rt.engine.last_sequence == before and await state.get() is None
    held = await manager.add_message("user", "held", host_state={"progress": 2, "other": [2]}, hold_compression=True)
    assert await state.get() == 2 and await (await rt.host_state("other")).get() == [2]
    assert [m.id for m in await manager.get_all_messages()] == [held]
    await rt.create_branch("doomed")
    doomed = await rt.open("ann", branch="doomed")
    doomed_state = await rt.host_state("progress", branch="doomed")
    await rt.delete_branch("doomed")
    with pytest.raises(BranchNotFoundError):
        await doomed.add_message("user", "gone", host_state={"progress": 3})
    with pytest.raises(BranchNotFoundError):
        await doomed_state.set(3)
    with pytest.raises(BranchNotFoundError):
        await doomed_state.get()
    assert await state.get() == 2


async def test_host_state_reads_back_after_a_restart_and_in_a_read_only_runtime(store: Path | str) -> None:
    """M9: what was set and appended reads back from a reopened store; a read-only runtime reads it
    and refuses writes with ReadOnlyStoreError."""
    async with open_runtime(store) as rt:
        state = await rt.host_state("framework")
        await state.set({"v": 1})
        entry = await state.append(["a"])
        manager = await rt.open("ann")
        await manager.add_message("user", "hi", host_state={"framework": {"v": 2}})
    async with open_runtime(store) as rt:
        state = await rt.host_state("framework")
        assert await state.get() == {"v": 2}
        assert await state.entries() == [HostEntry(entry, ["a"])]
    if isinstance(store, Path):
        async with open_runtime(store, readonly=True) as rt:
            state = await rt.host_state("framework")
            assert await state.get() == {"v": 2}
            with pytest.raises(ReadOnlyStoreError):
                await state.set(3)


@pytest.mark.soak
async def test_a_writer_killed_mid_loop_leaves_no_message_without_its_state_nor_state_without_its_message(
    store: Path | str, soak_scale: Callable[[int, int], int],
) -> None:
    """M9, K3: a writer process adding messages with host_state is killed with SIGKILL at a random
    point (3 rounds, 50 under soak); after each, the progress the store holds is exactly the last stored
    message's turn, as of each message it was that message's turn, the turns run unbroken from 0,
    and every acknowledged turn is there."""
    seed = int(os.environ.get("CTXRT_CRASH_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    acked = -1
    rounds = soak_scale(3, 50)
    with trio.fail_after(60 + rounds * 20):
        for round_ in range(rounds):
            context = f"round {round_} (seed {seed})"
            process = await trio.lowlevel.open_process([sys.executable, str(WRITER), str(store)],
                                                       stdout=subprocess.PIPE)
            try:
                assert process.stdout is not None
                lines = LineReader(process.stdout)
                for _ in range(rng.randint(3, 40)):
                    line = await lines.next_line()
                    assert line.startswith("ack "), f"{context}: {line!r}"
                    acked = int(line.split()[1])
                if rng.random() < 0.5:
                    await trio.sleep(rng.uniform(0, 0.003))
            finally:
                process.send_signal(signal.SIGKILL)
                status = await process.wait()
            assert status == -signal.SIGKILL, f"{context}: the writer ended with {status}"
            async with open_runtime(store) as rt:
                manager = await rt.open("writer")
                messages = await manager.get_all_messages()
                turns = [int(m.content[0].text.split()[1]) for m in messages]  # type: ignore[union-attr]
                assert turns == list(range(len(turns))), f"{context}: turns {turns[-5:]}"
                assert turns[-1] >= acked, f"{context}: acknowledged turn {acked} lost"
                assert await (await rt.host_state("progress")).get() == turns[-1], context
                main = rt.engine.branch("main").id
                for message, turn in zip(messages, turns):  # as of each message, the state set with it
                    assert rt.engine.read_value("host:value:progress", main, at=message.sequence) == turn, context


async def test_verify_passes_with_host_state_and_names_a_damaged_record(store_path: Path) -> None:
    """M9, K7: a store holding host state is sound; a flipped bit in a host log entry is named by
    verify and refused with StoreCorruptError naming the record."""
    async with open_runtime(store_path) as rt:
        state = await rt.host_state("framework")
        await state.set({"turn": 1})
        await state.append({"request": "a long enough entry to flip a bit inside"})
        manager = await rt.open("ann")
        await manager.add_message("user", "hi", host_state={"framework": {"turn": 2}})
    assert verify_store(store_path).status == "sound"
    async with open_runtime(store_path, readonly=True) as rt:
        places = list(files.record_places(store_path))
        named = {place: rt.engine.describe_row(place.table, place.key) for place in places}
    entry = next(place for place in places if "host:log:framework" in named[place] and "item" in named[place])
    flip(store_path / files.DATA_NAME, entry.value_at + entry.value_size // 2, 2)
    report = verify_store(store_path)
    assert report.status == "damaged"
    assert any(named[entry] in f"{item.place} {item.what}" for item in report.damage), report.damage
    with pytest.raises(StoreCorruptError, match="host:log:framework"):  # the open reads its key, or entries() it
        async with open_runtime(store_path, readonly=True) as rt:
            await (await rt.host_state("framework")).entries()


async def test_verify_on_postgresql_names_a_host_entry_that_isnt_json(pg_url: str) -> None:
    """M9, K7: on PostgreSQL a host state's entries and value are checked; an entry rewritten to
    bytes that aren't JSON is named, and entries() refuses it with StoreCorruptError."""
    import psycopg

    async with open_runtime(pg_url) as rt:
        state = await rt.host_state("framework")
        await state.set({"turn": 1})
        await state.append({"request": 1})
    assert verify(pg_url).status == "sound"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE ctxrt_items SET data = '\\x7b6e6f74'::bytea WHERE state = "
                     "(SELECT number FROM ctxrt_states WHERE name = 'host:log:framework')")
    report = verify(pg_url)
    assert report.status == "damaged"
    assert any("host:log:framework" in item.place for item in report.damage), report.damage
    async with open_runtime(pg_url) as rt:
        with pytest.raises(StoreCorruptError, match="host:log:framework"):
            await (await rt.host_state("framework")).entries()


def test_the_asyncio_front_returns_a_host_state_with_awaitable_methods(tmp_path: Path) -> None:
    """M9, H1: under ctxrt.aio, host_state returns a front whose get/set/append/entries are awaited
    from asyncio, and add_message(host_state=) commits as under trio."""

    async def main() -> None:
        async with ctxrt.aio.open_runtime(tmp_path / "store") as rt:
            state = await rt.host_state("framework")
            assert isinstance(state, ctxrt.aio.HostState) and state.name == "framework"
            await state.set({"a": 1})
            sequence = await state.append("entry")
            assert await state.get() == {"a": 1}
            assert await state.entries() == [HostEntry(sequence, "entry")]
            manager = await rt.open("ann")
            await manager.add_message("user", "hi", host_state={"framework": 2})
            assert await state.get() == 2

    asyncio.run(main())
