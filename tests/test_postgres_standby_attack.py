"""Attacks on reads from a hot standby (issue 39 item 4, K14): edge cases found by driving a real
primary and standby from outside the suite (attack/ in the helper's tree)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
import trio

import ctxrt
from ctxrt.testing import Cluster

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
