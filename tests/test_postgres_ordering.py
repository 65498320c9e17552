"""The ordering contract of a PostgreSQL store whose writers commit in parallel (issue 39, K11):
real writer processes race a reader that follows the store's visible horizon and makes forks."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import ctxrt
from ctxrt.errors import StoreUnavailableError
from ctxrt.store import postgres
from ctxrt.store.postgres import PostgresEngine
from ctxrt.testing import AppendItem, execute

CHILD = Path(__file__).with_name("pg_ordering_writer.py")


def _appended(url: str) -> dict[int, int]:
    """Every appended item's sequence -> its slot (state number), read with SQL."""
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT sequence, state FROM ctxrt_items WHERE version = sequence AND branch = 1"))


def _slot_sequences(url: str) -> dict[int, list[int]]:
    """Each slot's appended sequences in slot (ordinal) order."""
    slots: dict[int, list[int]] = {}
    with psycopg.connect(url) as conn:
        for state, sequence in conn.execute("SELECT state, sequence FROM ctxrt_items WHERE version = sequence"
                                            " AND branch = 1 ORDER BY state, ordinal"):
            slots.setdefault(state, []).append(sequence)
    return slots


async def test_readers_racing_parallel_writers_never_skip_a_message_that_appears_later(pg_url: str) -> None:
    """K11: while 3 processes append in parallel (each to its own slot and to the shared slot), every
    horizon a reader is given (``last_sequence``) is final: the messages at or below it are exactly
    those it saw then, none appears below it later; the horizon never goes back; each slot lists its
    messages in sequence order; and a fork made meanwhile keeps exactly what it held when made (K2)."""
    async with ctxrt.open_runtime(pg_url) as rt:
        await rt.open("forker")  # the store and its states exist before the writers open
        children = [subprocess.Popen([sys.executable, str(CHILD), pg_url, str(p), "40"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(3)]
        try:
            for child in children:
                assert child.stdout is not None and child.stdin is not None
                assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            reader = PostgresEngine(pg_url, create=False)
            seen: list[tuple[int, frozenset[int]]] = []
            forks: list[tuple[str, list[int]]] = []
            try:
                while any(child.poll() is None for child in children) or len(seen) < 3:
                    horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
                    visible = await trio.to_thread.run_sync(_appended, pg_url)
                    seen.append((horizon, frozenset(s for s in visible if s <= horizon)))
                    if len(forks) < 5:
                        name = f"fork-{len(forks)}"
                        await rt.create_branch(name)
                        row = await trio.to_thread.run_sync(reader.branch, name)
                        held = await trio.to_thread.run_sync(reader.read_log, "messages", row.id)
                        forks.append((name, [item.sequence for item in held]))
                for child in children:
                    await trio.to_thread.run_sync(child.wait)
                final_horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
                forks_after = [(name, [item.sequence for item in reader.read_log("messages", reader.branch(name).id)])
                               for name, _ in forks]
            finally:
                reader.close()
            outputs = [child.communicate(timeout=120) for child in children]
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    assert all(child.returncode == 0 for child in children), [err[-2000:] for _, err in outputs]
    acknowledged = {int(i) for out, _ in outputs for i in json.loads(out.strip().splitlines()[-1])}
    assert len(acknowledged) == 3 * 4 * 40

    final = _appended(pg_url)
    assert acknowledged <= set(final)
    horizons = [horizon for horizon, _ in seen]
    assert horizons == sorted(horizons), "the horizon never goes back"
    assert horizons[-1] <= final_horizon and final_horizon >= max(acknowledged), "the horizon reaches every write"
    for horizon, saw in seen:
        assert saw == {s for s in final if s <= horizon}, f"a message appeared at or below horizon {horizon}"
    for slot, sequences in _slot_sequences(pg_url).items():
        assert sequences == sorted(sequences), f"slot {slot} lists its messages in sequence order"
    assert forks == forks_after, "a fork holds what it held when it was made"
    assert any(held for _, held in forks)


async def test_a_schema_1_store_is_read_as_it_is_and_moved_to_schema_2_by_a_writer(pg_url: str) -> None:
    """K11, K5: a store written by the ctxrt before parallel writers (schema 1: the sequence a row of
    ctxrt_meta) opens read-only as it is; a writer's open moves it to schema 2, whose sequence goes on
    from the row's value; the row is gone, so a schema-1 writer still running writes nothing more."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        first = [await manager.add_message("user", f"line {n}") for n in range(3)]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as the schema-1 ctxrt left it
        conn.execute("DROP SEQUENCE ctxrt_sequence")
        conn.execute("DROP TABLE ctxrt_leases")
        conn.execute("INSERT INTO ctxrt_meta (key, value) VALUES ('sequence', %s)", (int(first[-1]),))
        conn.execute("UPDATE ctxrt_meta SET value = 1 WHERE key = 'format'")
    async with ctxrt.open_runtime(pg_url, readonly=True) as rt:
        reader = await rt.open("ann")
        assert [m.id for m in await reader.get_all_messages()] == first
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        later = await manager.add_message("user", "after the move")
        assert int(later) == int(first[-1]) + 1
    with psycopg.connect(pg_url, autocommit=True) as conn:
        meta = dict(conn.execute("SELECT key, value FROM ctxrt_meta").fetchall())
    assert meta["format"] == 3 and "sequence" not in meta  # moved on to schema 3 (row leases) too


async def test_a_stalled_writer_holds_up_the_horizon_and_forks_only_until_its_idle_transaction_is_ended(
    pg_url: str,
) -> None:
    """K11: a writer process stopped mid-batch (SIGSTOP, a stall) keeps its transaction, and the
    catalog and slot locks it holds, open: ``last_sequence`` waits for it, and a fork waits with
    every other write queued behind it. Each round trip of a batch ends with a Sync, so a stalled
    one is idle in transaction and the server ends it after ``IDLE_IN_TRANSACTION_MS``: the
    horizon and the fork go on (the horizon final: the stalled batch wrote nothing), and the
    stalled batch, resumed, fails with nothing written (before, the server saw a statement in
    progress and waited as long as the process stayed stopped)."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        await manager.add_message("user", "before the stall")
        stalled = PostgresEngine(pg_url, idle_in_transaction_ms=500)  # another process's writer
        reader = PostgresEngine(pg_url, create=False)
        state = next(info.name for info in stalled.list_states() if info.kind == "log")
        began, resume = threading.Event(), threading.Event()

        def stop_mid_batch(batch: Any, command: Any) -> Any:
            result = execute(batch, command)  # its slot locked, its head read, its sequence drawn
            began.set()
            resume.wait()
            return result

        def stalled_batch() -> None:
            stalled.apply([AppendItem(state=state, branch=1, data=b"never")], stop_mid_batch)

        try:
            async with trio.open_nursery() as nursery:
                failed: list[BaseException] = []

                async def run_stalled() -> None:
                    try:
                        await trio.to_thread.run_sync(stalled_batch)
                    except StoreUnavailableError as exc:
                        failed.append(exc)

                nursery.start_soon(run_stalled)
                try:
                    await trio.to_thread.run_sync(began.wait)
                    with trio.fail_after(postgres.STATEMENT_TIMEOUT_MS / 2000):  # before the horizon's wait gives up
                        horizon = await trio.to_thread.run_sync(lambda: reader.last_sequence)
                        await manager.fork("during-the-stall")
                        later = await manager.add_message("user", "after the fork")
                finally:
                    resume.set()
            assert failed, "the stalled batch, resumed, finds its transaction ended"
            assert horizon < int(later)
            assert all(item.data != b"never" for item in reader.read_log(state, 1))
        finally:
            resume.set()
            stalled.close()
            reader.close()


async def test_a_reader_opened_on_a_schema_1_store_keeps_its_horizon_when_a_writer_moves_the_store(pg_url: str) -> None:
    """K11: a read-only engine (a read-only runtime, ``ctxrt serve``) opened on a schema-1 store reads
    its horizon from the sequence row; a writer of this version then moves the store to schema 2 and
    the row goes: the reader's horizon goes on from schema 2's sequence, never back (it read 0)."""
    async with ctxrt.open_runtime(pg_url) as rt:
        manager = await rt.open("ann")
        await manager.add_message("user", "line")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as the schema-1 ctxrt left it
        (last,) = conn.execute("SELECT last_value FROM ctxrt_sequence").fetchone() or (0,)
        conn.execute("DROP SEQUENCE ctxrt_sequence")
        conn.execute("DROP TABLE ctxrt_leases")
        conn.execute("INSERT INTO ctxrt_meta (key, value) VALUES ('sequence', %s)", (last,))
        conn.execute("UPDATE ctxrt_meta SET value = 1 WHERE key = 'format'")
    reader = PostgresEngine(pg_url, create=False)
    try:
        before = reader.last_sequence
        assert before == last
        async with ctxrt.open_runtime(pg_url) as rt:  # moves the store to schema 2
            later = await (await rt.open("ann")).add_message("user", "after the move")
        assert reader.last_sequence == int(later) > before
    finally:
        reader.close()


def _fill_lock_table(conn: psycopg.Connection[Any]) -> int:
    """Take transaction advisory locks on ``conn`` until the server's lock table has no room for
    one more (chunks halving under savepoints: a refused chunk's locks go with its rollback)."""
    taken, chunk = 0, 4096
    conn.execute("BEGIN")
    while chunk:
        conn.execute("SAVEPOINT fill")
        try:
            conn.execute("SELECT pg_advisory_xact_lock(k) FROM generate_series(%s::bigint, %s) AS k",
                         (1 << 40 | taken, (1 << 40 | taken) + chunk - 1))
        except psycopg.errors.OutOfMemory:
            conn.execute("ROLLBACK TO SAVEPOINT fill")
            chunk //= 2
        else:
            taken += chunk
    return taken


def test_a_full_lock_table_refuses_a_lease_and_keeps_the_ones_held(pg_url: str) -> None:
    """K11, K12: with the server's lock table full (``max_locks_per_transaction`` too low for the
    slots of every process's batches), taking one more lease (a row: its statement needs its
    table's lock) raises ``StoreUnavailableError`` with the server's hint, and the leases this
    process holds stay held (rows: nothing of them is in a session to lose)."""
    holder, other = PostgresEngine(pg_url), PostgresEngine(pg_url)
    try:
        assert all(holder.hold(1, f"ns{n}") for n in range(3))
        with psycopg.connect(pg_url, autocommit=True) as hog:
            assert _fill_lock_table(hog)
            with pytest.raises(StoreUnavailableError, match="max_locks_per_transaction"):
                holder.hold(1, "one more")
            hog.execute("ROLLBACK")
        assert all(holder.holds(1, f"ns{n}") for n in range(3))
        assert not any(other.hold(1, f"ns{n}") for n in range(3))
    finally:
        holder.close()
        other.close()


async def test_batches_appending_to_the_same_slots_in_opposite_orders_meet_no_lock_cycle(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """K11: two runtimes (two processes' writers) append to the same three namespaces, one in one
    order and one in the other, so their batches hold several slots each: the slots' locks are
    taken in one order, so no batch waits in a cycle (the server broke each after a second and
    the batch ran again, 20x fewer appends than one writer), and every message is stored."""
    caplog.set_level(logging.INFO, logger="ctxrt.store")
    names = [f"ns{n}" for n in range(3)]
    async with ctxrt.open_runtime(pg_url) as first, ctxrt.open_runtime(pg_url) as second:
        ascending = [await first.open(name, isolate=True) for name in names]
        descending = [await second.open(name, isolate=True) for name in reversed(names)]
        ids: list[str] = []

        async def append(manager: ctxrt.ContextManager, text: str) -> None:
            ids.append(await manager.add_message("user", text))

        for manager in (*ascending, *descending):  # each runtime's tables know every slot's state
            await append(manager, "warm-up")
        with trio.fail_after(60):
            for round_ in range(40):
                async with trio.open_nursery() as nursery:
                    for managers in (ascending, descending):
                        for manager in managers:
                            nursery.start_soon(append, manager, f"round {round_}")
    assert not [r for r in caplog.records if "lock cycle" in r.getMessage()]
    assert len(set(_appended(pg_url)) & {int(i) for i in ids}) == 41 * 6


async def test_the_horizon_waits_on_the_lock_of_a_write_in_flight_and_wakes_when_it_commits(pg_url: str) -> None:
    """K16, K11: ``last_sequence`` with another process's batch in flight waits for that batch's own
    lock, as a lock wait on the server (no polling), and returns once the batch committed: a horizon
    at or past the batch's sequence, whose item is then readable."""
    async with ctxrt.open_runtime(pg_url) as rt:
        await (await rt.open("ann")).add_message("user", "before")
    writer = PostgresEngine(pg_url)  # another process's writer
    reader = PostgresEngine(pg_url, create=False)
    state = next(info.name for info in writer.list_states() if info.kind == "log")
    began, resume = threading.Event(), threading.Event()

    def hold_mid_batch(batch: Any, command: Any) -> Any:
        result = execute(batch, command)  # its slot locked, its sequence drawn
        began.set()
        resume.wait()
        return result

    try:
        async with trio.open_nursery() as nursery:
            applied: list[Any] = []
            horizons: list[int] = []

            async def apply() -> None:
                applied.append(await trio.to_thread.run_sync(
                    lambda: writer.apply([AppendItem(state=state, branch=1, data=b"in flight")], hold_mid_batch)))

            async def horizon() -> None:
                horizons.append(await trio.to_thread.run_sync(lambda: reader.last_sequence))

            nursery.start_soon(apply)
            try:
                await trio.to_thread.run_sync(began.wait)
                nursery.start_soon(horizon)
                with psycopg.connect(pg_url, autocommit=True) as conn, trio.fail_after(10):
                    while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                           " AND wait_event = 'advisory' AND query LIKE"
                                           " '%%pg_advisory_xact_lock_shared%%' AND datname = current_database()"
                                           ).fetchone()[0]:
                        await trio.sleep(0.01)  # until the server shows the horizon's lock wait
                assert not horizons, "the horizon waits while the batch is in flight"
            finally:
                resume.set()
        (results, operations) = applied[0]
        sequence = results[0][1].sequence
        assert horizons[0] >= sequence
        assert any(item.data == b"in flight" and item.sequence == sequence for item in reader.read_log(state, 1))
    finally:
        resume.set()
        writer.close()
        reader.close()
