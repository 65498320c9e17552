"""Attacks on reads from a hot standby (issue 39 item 4, K14): edge cases found by driving a real
primary and standby from outside the suite (attack/ in the helper's tree)."""

from __future__ import annotations

import html
import time
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
import trio

import ctxrt
from ctxrt.errors import ReadOnlyStoreError, StoreUnavailableError
from ctxrt.testing import Cluster
from test_inspector import get, serving

GUARD_S = 120


@pytest.fixture(scope="module")
def pg_standby(pg_cluster: Cluster) -> Iterator[Cluster]:
    """A hot standby of the session's cluster, streaming its WAL (every database of it)."""
    with pg_cluster.replica() as standby:
        yield standby


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _end_wal_at_a_page_boundary(url: str) -> None:
    """Write logical messages (no effect on the store) on the primary until its last WAL record
    ends exactly at a page's end: its WAL insert position is then just past the next page's header,
    a position no record on the standby ends at."""
    with psycopg.connect(url, autocommit=True) as conn:
        def insert() -> int:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            return _lsn(str(row[0]))

        def emit(size: int) -> None:
            conn.execute("SELECT pg_logical_emit_message(false, 'ctxrt-test', repeat('x', %s))", (size,))

        for attempt in range(400):
            before = insert()
            emit(1000)
            after = insert()
            size, room = after - before, 8192 - after % 8192
            if before // 8192 != after // 8192 or room < size:
                continue
            emit(1000 + room - size - attempt % 16)  # the record's header varies a little with its length
            if insert() % 8192 in (24, 40):  # a page header's size (short, or long on a segment's first page)
                return
        raise AssertionError("the primary's WAL never ended at a page boundary")


async def test_a_standby_gives_the_horizon_at_once_when_the_primarys_wal_ends_at_a_page_boundary(
    pg_url: str, pg_standby: Cluster,
) -> None:
    """K14: on an idle primary whose last WAL record ends exactly at a page's end (its insert
    position is then past the next page's header), a standby that has replayed everything gives
    ``last_sequence`` at once. It waited for the primary's next WAL record instead: 15-25 s, until
    the background writer's next snapshot record, or a ``StoreUnavailableError`` at 30 s."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "on the primary")
        standby_url = pg_standby.url(urlsplit(pg_url).path.lstrip("/"))
        async with ctxrt.open_runtime(standby_url, readonly=True) as reader:
            await trio.to_thread.run_sync(_end_wal_at_a_page_boundary, pg_url)
            began = time.monotonic()
            horizon = await trio.to_thread.run_sync(lambda: reader.engine.last_sequence)
            waited = time.monotonic() - began
        assert horizon >= 1
        assert waited < 5, f"the standby's horizon took {waited:.1f} s on an idle primary"


def test_a_replica_is_replayed_at_once_when_the_primarys_wal_ends_at_a_page_boundary(
    pg_url: str, pg_standby: Cluster,
) -> None:
    """K14 (the test seam): ``Cluster.replayed()`` returns at once when the primary's last WAL
    record ends at a page's end, rather than waiting for its next record."""
    pg_standby.replayed()
    _end_wal_at_a_page_boundary(pg_url)
    began = time.monotonic()
    pg_standby.replayed(timeout=60)
    assert time.monotonic() - began < 5


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (a look at a server) until it holds."""
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} didn't happen within {GUARD_S} s")
        time.sleep(0.01)


async def test_a_standby_readers_other_reads_go_on_while_its_horizon_waits_for_replay(
    pg_url: str, pg_standby: Cluster,
) -> None:
    """K14: while a standby reader's ``last_sequence`` waits for a replay that stands still (paused
    with ``pg_wal_replay_pause()``), the same runtime's other reads answer at once, and the horizon is
    given once replay resumes. The wait held the engine's read lock: every read of the process (on
    the loop's thread) waited the 30 s with it."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "replayed")
        standby_url = pg_standby.url(urlsplit(pg_url).path.lstrip("/"))
        await trio.to_thread.run_sync(pg_standby.replayed)
        with psycopg.connect(standby_url, autocommit=True) as standby:
            standby.execute("SELECT pg_wal_replay_pause()")
            try:
                async with ctxrt.open_runtime(pg_url) as rt:
                    await (await rt.open("ann")).add_message("user", "not replayed yet")
                async with ctxrt.open_runtime(standby_url, readonly=True) as reader:
                    ann = await reader.open("ann")
                    given: list[int] = []
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(trio.to_thread.run_sync, lambda: given.append(reader.engine.last_sequence))

                        def waiting() -> bool:  # the horizon's wait has looked at the replay at least once
                            row = standby.execute(
                                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND pid <> pg_backend_pid() AND query LIKE '%pg_last_wal_replay_lsn() >=%'").fetchone()
                            return bool(row and row[0])

                        await trio.to_thread.run_sync(_wait_for, waiting, "the horizon's wait")
                        began = time.monotonic()
                        texts = [b.text for m in await ann.get_all_messages() for b in m.content
                                 if isinstance(b, ctxrt.Text)]
                        took = time.monotonic() - began
                        assert not given, "the horizon waits while replay is paused"
                        standby.execute("SELECT pg_wal_replay_resume()")
            finally:
                standby.execute("SELECT pg_wal_replay_resume()")
        assert texts == ["replayed"]
        assert took < 5, f"a read beside the horizon's wait took {took:.1f} s"
        assert given and given[0] >= 2


async def test_a_standby_reader_says_its_primary_is_down_and_gives_the_horizon_once_it_is_back(
    pg_url: str, pg_cluster: Cluster, pg_standby: Cluster,
) -> None:
    """K14: while the primary is down and the standby's WAL receiver has stopped, a standby reader's
    ``last_sequence`` raises ``StoreUnavailableError`` saying the standby isn't streaming from its
    primary (it said to grant pg_read_all_stats, which a superuser has); its other reads go on. Once
    the primary is back and streaming, the first ``last_sequence`` of a reader that didn't ask
    during the outage gives the horizon (it failed on its link to the primary, which the restart
    had ended)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "before the outage")
        standby_url = pg_standby.url(urlsplit(pg_url).path.lstrip("/"))
        await trio.to_thread.run_sync(pg_standby.replayed)
        async with ctxrt.open_runtime(standby_url, readonly=True) as asking, \
                ctxrt.open_runtime(standby_url, readonly=True) as quiet:
            first = asking.engine.last_sequence
            assert quiet.engine.last_sequence == first
            with psycopg.connect(standby_url, autocommit=True) as standby:
                def receiving(status: str | None) -> Callable[[], bool]:
                    return lambda: standby.execute("SELECT status FROM pg_stat_wal_receiver").fetchone() == (
                        None if status is None else (status,))

                with pg_cluster.down():
                    await trio.to_thread.run_sync(_wait_for, receiving(None), "the WAL receiver's stop")
                    with pytest.raises(StoreUnavailableError) as raised:
                        asking.engine.last_sequence
                    assert "isn't streaming" in str(raised.value) and "pg_read_all_stats" not in str(raised.value)
                    assert len(await (await asking.open("ann")).get_all_messages()) == 1
                await trio.to_thread.run_sync(_wait_for, receiving("streaming"), "the WAL receiver's return")
            assert quiet.engine.last_sequence >= first
            assert asking.engine.last_sequence >= first


def _top(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(sequence) FROM ctxrt_items").fetchone()
        return int(row[0]) if row and row[0] is not None else 0


async def test_a_standby_promoted_under_a_reader_gives_its_own_horizon(pg_url: str, pg_cluster: Cluster) -> None:
    """K14: a standby promoted (``pg_ctl promote``) under a read-only runtime is a primary: the
    reader's ``last_sequence`` reaches the writes made on it, at once, whatever the old primary does
    (writes there no longer reach it). Before, the reader kept asking the old primary: an idle one
    gave its stale horizon for ever, one still written made each call wait 30 s and fail, one
    stopped made it say the standby wasn't streaming."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "before the promotion")
        with pg_cluster.replica() as standby:
            await trio.to_thread.run_sync(standby.replayed)
            standby_url = standby.url(urlsplit(pg_url).path.lstrip("/"))
            async with ctxrt.open_runtime(standby_url, readonly=True) as reader:
                first = reader.engine.last_sequence
                assert first == _top(pg_url)
                await trio.to_thread.run_sync(standby.promote)
                async with ctxrt.open_runtime(standby_url) as promoted:
                    for n in range(3):
                        await (await promoted.open("ann")).add_message("user", f"on the promoted server {n}")
                assert reader.engine.last_sequence >= _top(standby_url) > first
                async with ctxrt.open_runtime(pg_url) as old:
                    await (await old.open("ann")).add_message("user", "on the old primary")
                began = time.monotonic()
                assert reader.engine.last_sequence >= _top(standby_url)
                assert time.monotonic() - began < 5
                texts = [b.text for m in await (await reader.open("ann")).get_all_messages() for b in m.content
                         if isinstance(b, ctxrt.Text)]
                assert texts == ["before the promotion"] + [f"on the promoted server {n}" for n in range(3)]


async def test_the_inspector_on_a_standby_serves_other_pages_while_its_index_waits_for_replay(
    pg_url: str, pg_standby: Cluster,
) -> None:
    """K14: ``ctxrt serve`` on a standby whose replay stands still (paused): the index, which shows
    the horizon, waits for it, and the other pages answer meanwhile; once replay resumes the index
    answers too. The horizon was read on the loop's thread: every page waited 30 s with it and
    the index answered 503."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("agents/ann")).add_message("user", "replayed")
        standby_url = pg_standby.url(urlsplit(pg_url).path.lstrip("/"))
        await trio.to_thread.run_sync(pg_standby.replayed)
        with psycopg.connect(standby_url, autocommit=True) as standby:
            standby.execute("SELECT pg_wal_replay_pause()")
            try:
                async with ctxrt.open_runtime(pg_url) as rt:
                    await (await rt.open("agents/ann")).add_message("user", "not replayed yet")
                async with serving(standby_url) as url, trio.open_nursery() as nursery:
                    index: list[int] = []

                    async def ask_index() -> None:
                        index.append((await get(url + "/"))[0])

                    nursery.start_soon(ask_index)

                    def waiting() -> bool:
                        row = standby.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid() AND query LIKE '%pg_last_wal_replay_lsn() >=%'").fetchone()
                        return bool(row and row[0])

                    await trio.to_thread.run_sync(_wait_for, waiting, "the index's wait for replay")
                    began = time.monotonic()
                    status, page = await get(url + "/timeline?branch=main")
                    took = time.monotonic() - began
                    assert not index, "the index waits while replay is paused"
                    standby.execute("SELECT pg_wal_replay_resume()")
            finally:
                standby.execute("SELECT pg_wal_replay_resume()")
        assert status == 200 and "replayed" in html.unescape(page)
        assert took < 5, f"the timeline took {took:.1f} s beside the index's wait"
        assert index == [200]


async def test_every_write_through_a_standby_runtime_is_refused_naming_the_standby(
    pg_url: str, pg_standby: Cluster,
) -> None:
    """K14: each write through a read-only runtime on a hot standby (a namespace's edit, removal,
    fork, branch and ledger record; the runtime's branches and host state) raises
    ``ReadOnlyStoreError`` naming the hot standby, and the runtime still reads. The namespace's own
    refusals (edit, removal, fork) said only "read-only runtime"."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            ann = await rt.open("ann", ledger=True)
            first = await ann.add_message("user", "hi")
            last = await ann.add_message("assistant", "hello")
            await rt.create_branch("feat")
        standby_url = pg_standby.url(urlsplit(pg_url).path.lstrip("/"))
        await trio.to_thread.run_sync(pg_standby.replayed)
        async with ctxrt.open_runtime(standby_url, readonly=True) as reader:
            ann = await reader.open("ann", ledger=True)
            compiled = await ann.compile()
            state = await reader.host_state("settings")
            writes: dict[str, Callable[[], Awaitable[object]]] = {
                "add_message": lambda: ann.add_message("user", "x"),
                "edit_message": lambda: ann.edit_message(first, "y"),
                "remove_message": lambda: ann.remove_message(first),
                "remove_messages": lambda: ann.remove_messages(first, last),
                "fork": lambda: ann.fork("f"),
                "branch_at": lambda: ann.branch_at(first, "g"),
                "record_request": lambda: ann.record_request(compiled, form="anthropic", model="m"),
                "host_state.set": lambda: state.set({"x": 1}),
                "create_branch": lambda: reader.create_branch("h"),
                "delete_branch": lambda: reader.delete_branch("feat"),
            }
            for name, write in writes.items():
                with pytest.raises(ReadOnlyStoreError, match="hot standby"):
                    await write()
            assert [m.id for m in await ann.get_all_messages()] == [first, last]
