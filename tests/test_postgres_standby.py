"""Reads from a hot standby (issue 39 item 4, K14): a replica made with ``pg_basebackup -R`` of the
session's cluster; real writer processes on the primary, a reader on the standby."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import trio

import ctxrt
from ctxrt.errors import ReadOnlyStoreError, StoreUnavailableError
from ctxrt.testing import Cluster
from test_inspector import get, serving
from test_postgres_ordering import _appended, _slot_sequences

WRITER = Path(__file__).with_name("pg_ordering_writer.py")
GUARD_S = 240


@pytest.fixture(scope="module")
def pg_standby(pg_cluster: Cluster) -> Iterator[Cluster]:
    """A hot standby of the session's cluster, streaming its WAL (every database of it)."""
    with pg_cluster.replica() as standby:
        yield standby


@pytest.fixture
def standby_url(pg_url: str, pg_standby: Cluster) -> str:
    """``pg_url``'s database as the standby serves it (made on the primary, replayed here)."""
    pg_standby.replayed()
    return pg_standby.url(urlsplit(pg_url).path.lstrip("/"))


async def test_a_reader_on_a_standby_never_skips_a_message_that_appears_later_and_sees_every_write(
    pg_url: str, standby_url: str,
) -> None:
    """K14: while 3 processes append in parallel on the primary, every horizon a reader on the standby
    is given (``last_sequence``) is final there: the messages at or below it are exactly those it
    read on the standby then, none appears below it later; the horizon never goes back; each slot
    lists its messages in sequence order; and once the writers are done, the standby's horizon
    reaches every acknowledged write and a read-only runtime on it reads every message."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await rt.open("setup")  # the store and its states exist before the writers open
        children = [subprocess.Popen([sys.executable, str(WRITER), pg_url, str(p), "40"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(3)]
        try:
            for child in children:
                assert child.stdout is not None and child.stdin is not None
                assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            seen: list[tuple[int, frozenset[int]]] = []
            async with ctxrt.open_runtime(standby_url, readonly=True) as standby:
                reader = standby.engine
                while any(child.poll() is None for child in children) or len(seen) < 3:
                    horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
                    visible = await trio.to_thread.run_sync(_appended, standby_url)
                    seen.append((horizon, frozenset(s for s in visible if s <= horizon)))
                for child in children:
                    await trio.to_thread.run_sync(child.wait)
                final_horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
                on_standby = await trio.to_thread.run_sync(_appended, standby_url)
                read = [m.id for p in range(3) for name in (f"own-{p}", f"shared-{p}")
                        for m in await (await standby.open(name, isolate=name.startswith("own"))).get_all_messages()]
            outputs = [child.communicate(timeout=120) for child in children]
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        assert all(child.returncode == 0 for child in children), [err[-2000:] for _, err in outputs]
        acknowledged = [i for out, _ in outputs for i in json.loads(out.strip().splitlines()[-1])]
        assert len(acknowledged) == 3 * 4 * 40

        final = _appended(pg_url)
        assert set(on_standby) == set(final), "every write is on the standby once it has the horizon past it"
        horizons = [horizon for horizon, _ in seen]
        assert horizons == sorted(horizons), "the horizon never goes back"
        assert final_horizon >= max(final), "the standby's horizon reaches every write (within the lag)"
        for horizon, saw in seen:
            assert saw == {s for s in final if s <= horizon}, f"a message appeared at or below horizon {horizon}"
        for slot, sequences in _slot_sequences(standby_url).items():
            assert sequences == sorted(sequences), f"slot {slot} lists its messages in sequence order"
        assert set(read) == set(acknowledged), "a read-only runtime on the standby reads every message"


async def test_a_write_to_a_standby_is_refused_naming_it_and_the_store_is_unchanged(
    pg_url: str, standby_url: str, pg_standby: Cluster,
) -> None:
    """K14: a writing open of a standby's URL, and a write through a read-only runtime on it, raise
    ``ReadOnlyStoreError`` naming the hot standby; the store (read on the primary) is unchanged."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "on the primary")
        await trio.to_thread.run_sync(pg_standby.replayed)
        before = _appended(pg_url)
        with pytest.raises(ReadOnlyStoreError, match="hot standby"):
            async with ctxrt.open_runtime(standby_url):
                pass
        async with ctxrt.open_runtime(standby_url, readonly=True) as standby:
            ann = await standby.open("ann")
            assert [b.text for m in await ann.get_all_messages() for b in m.content if isinstance(b, ctxrt.Text)] == ["on the primary"]
            with pytest.raises(ReadOnlyStoreError, match="hot standby"):
                await ann.add_message("user", "through the standby")
            with pytest.raises(ReadOnlyStoreError, match="hot standby"):
                await standby.create_branch("feat")
        assert _appended(pg_url) == before
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM ctxrt_branches").fetchone() == (1,)


async def test_the_inspector_serves_a_standby_following_the_primary(
    pg_url: str, standby_url: str, pg_standby: Cluster,
) -> None:
    """K14: ``ctxrt serve`` on a standby's URL: its pages answer, and a line the primary's writer adds
    is on the timeline once the standby has replayed it (W1)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as writer:
            ann = await writer.open("agents/ann")
            await ann.add_message("user", "the first line")
            await trio.to_thread.run_sync(pg_standby.replayed)
            async with serving(standby_url) as url:
                assert (await get(url + "/"))[0] == 200
                await ann.add_message("user", "a line from the primary's writer")
                await trio.to_thread.run_sync(pg_standby.replayed)
                status, page = await get(url + "/timeline?branch=main")
                assert status == 200 and "a line from the primary's writer" in html.unescape(page)


async def test_a_standby_of_a_standby_reads_but_gives_no_horizon(
    pg_url: str, standby_url: str, pg_standby: Cluster,
) -> None:
    """K14: a replica streaming from the standby (cascading) serves reads, but its ``last_sequence``
    raises ``StoreUnavailableError`` naming the cascade: its upstream's ``pg_locks`` shows no writer."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            await (await rt.open("ann")).add_message("user", "on the primary")
        await trio.to_thread.run_sync(pg_standby.replayed)
        with pg_standby.replica() as cascade:
            await trio.to_thread.run_sync(cascade.replayed)
            async with ctxrt.open_runtime(cascade.url(urlsplit(pg_url).path.lstrip("/")), readonly=True) as reader:
                ann = await reader.open("ann")
                assert [b.text for m in await ann.get_all_messages() for b in m.content
                        if isinstance(b, ctxrt.Text)] == ["on the primary"]
                with pytest.raises(StoreUnavailableError, match="cascading"):
                    reader.engine.last_sequence
