"""Leases as rows behind a transaction-mode pooler (issue 39 item 3): K12, K13; and what an attack on them found.

The pooler is Debian's PgBouncer 1.18 in transaction mode, started in front of the session's
throwaway cluster (``ctxrt.pgcluster.start_pooler``); the host processes run
``tests/pg_lease_holder.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import ctxrt
import ctxrt.store.postgres
from ctxrt import ConfigConflictError
from ctxrt.store.postgres import LEASE_CLOSE_S, PostgresEngine
from ctxrt.testing import AppendItem, Cluster, Pooler, RegisterState, SetValue, execute, start_pooler

CHILD = Path(__file__).with_name("pg_lease_holder.py")
LEASE = ("agents/a/context", 1)  # the namespace's lease row: (name, branch)
LEASE_MS = 3000


@pytest.fixture(scope="module")
def pooler(pg_cluster: Cluster) -> Iterator[Pooler]:
    with start_pooler(pg_cluster) as started:
        yield started


@pytest.fixture
def pooled_url(pooler: Pooler, pg_url: str) -> str:
    """``pg_url``'s database, reached through the pooler."""
    return pooler.url(urllib.parse.unquote(urllib.parse.urlparse(pg_url).path.lstrip("/")))


class Host:
    """A host process holding (or trying to hold) the namespace's lease."""

    def __init__(self, url: str, lease_ms: int = LEASE_MS) -> None:
        self.process = subprocess.Popen([sys.executable, str(CHILD), url, str(lease_ms)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.answer() == {"ready": True}

    def answer(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the host ended early: {self.process.wait()} {self.process.stderr.read()[-3000:]}")
        return json.loads(line)

    def ask(self, line: str) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.answer()

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def lease_row(url: str) -> tuple[str, int, bool]:
    """(holder, token, whether it is unexpired) of the namespace's lease, read directly."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT holder, token, expires > clock_timestamp() FROM ctxrt_leases"
                           " WHERE name = %s AND branch = %s", LEASE).fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), bool(row[2])


def written(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT (SELECT count(*) FROM ctxrt_values) + (SELECT count(*) FROM ctxrt_items)").fetchone()
    assert row is not None
    return int(row[0])


def test_two_processes_behind_the_pooler_contend_for_one_namespace_and_exactly_one_serves_it(
    pooled_url: str,
) -> None:
    """K12, K13: two host processes behind PgBouncer in transaction mode open one remembering namespace
    at once: exactly one holds its lease and writes; the other is refused (ConfigConflictError)
    while the holder runs, and again after the holder renewed its lease past its first expiry."""
    hosts = [Host(pooled_url), Host(pooled_url)]
    try:
        answers: list[dict] = [{}, {}]

        def take(n: int) -> None:
            answers[n] = hosts[n].ask("take")

        racers = [threading.Thread(target=take, args=(n,)) for n in range(2)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        assert sorted(answer["held"] for answer in answers) == [False, True]
        holder, other = (hosts[0], hosts[1]) if answers[0]["held"] else (hosts[1], hosts[0])
        assert "pinned" in holder.ask("pin 0")
        _, token, _ = lease_row(pooled_url)
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            # Until the first take's expiry has passed on the server's clock (renewed meanwhile, or lost).
            (first_expiry,) = conn.execute("SELECT expires FROM ctxrt_leases").fetchone() or (None,)
            conn.execute("SELECT pg_sleep(greatest(0, extract(epoch FROM %s::timestamptz - clock_timestamp())))",
                         (first_expiry,))
        assert other.ask("take") == {"held": False}
        assert lease_row(pooled_url)[1:] == (token, True)  # still the first take's: renewed, never taken
        assert "pinned" in holder.ask("pin 1")
    finally:
        for host in hosts:
            host.end()


def test_a_killed_holder_is_taken_over_only_after_its_expiry_and_the_takers_writes_land(pooled_url: str) -> None:
    """K12, K13: the holder SIGKILLed (no clean close: its lease stays until its expiry), the other
    process behind the pooler is refused until the lease's expiry has passed on the server's
    clock, then takes it (the token raised) and its strategy writes land."""
    first, second = Host(pooled_url), Host(pooled_url)
    try:
        assert first.ask("take") == {"held": True}
        holder, token, _ = lease_row(pooled_url)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            (expiry,) = conn.execute("SELECT expires FROM ctxrt_leases WHERE name = %s AND branch = %s", LEASE).fetchone() or (None,)
        tries = []
        while not (answer := second.ask("take"))["held"]:  # each a take's round trip, until one wins
            tries.append(answer)
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            (taken_at,) = conn.execute("SELECT expires - %s * interval '1 millisecond' FROM ctxrt_leases"
                                       " WHERE name = %s AND branch = %s", (LEASE_MS, *LEASE)).fetchone() or (None,)
        assert tries, "the killed holder's lease was taken before its expiry"
        assert expiry is not None and taken_at is not None and taken_at >= expiry
        new_holder, new_token, _ = lease_row(pooled_url)
        assert new_holder != holder and new_token == token + 1
        before = written(pooled_url)
        assert "pinned" in second.ask("pin 2")
        assert written(pooled_url) > before
    finally:
        first.end()
        second.end()


def test_a_holder_whose_lease_was_taken_over_gets_the_error_and_writes_nothing(pooled_url: str) -> None:
    """K12, K13: a holder stopped past its lease's expiry (SIGSTOP: its renewer stops too) is taken over
    by another process; resumed, its next strategy write raises ConfigConflictError ("lost its
    lease") and writes nothing, and the new holder's writes go on."""
    first, second = Host(pooled_url), Host(pooled_url)
    try:
        assert first.ask("take") == {"held": True}
        first.process.send_signal(signal.SIGSTOP)
        while not (answer := second.ask("take"))["held"]:
            assert answer == {"held": False}
        before = written(pooled_url)
        first.process.send_signal(signal.SIGCONT)
        refused = first.ask("pin 0")
        assert refused["error"] == "ConfigConflictError" and "lost its lease" in refused["message"]
        assert written(pooled_url) == before
        assert "pinned" in second.ask("pin 1")
    finally:
        first.process.send_signal(signal.SIGCONT)
        first.end()
        second.end()


def test_the_fencing_check_refuses_a_write_under_a_lease_taken_over_while_its_holder_still_counts_it_held(
    pooled_url: str,
) -> None:
    """K12: the fencing token decides, not the holder's own count: a lease taken over after its expiry
    while its holder's renewer hasn't looked yet refuses the holder's next write of the namespace's
    states in that write's transaction (ConfigConflictError, nothing written), and ``holds`` says
    False from then; a write of another namespace in the same batch commits."""
    holder, taker = PostgresEngine(pooled_url, lease_ms=60_000), PostgresEngine(pooled_url)
    try:
        assert holder.hold(1, "agents/a/context") and not taker.hold(1, "agents/a/context")
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            conn.execute("UPDATE ctxrt_leases SET expires = now() - interval '1 second'")  # as if it lapsed
        assert taker.hold(1, "agents/a/context") and holder.holds(1, "agents/a/context")
        for name in ("agents/a/notes", "agents/b/notes"):
            holder.apply([RegisterState(name=name, kind="value")], execute)
        results, _ = holder.apply([SetValue(state="agents/a/notes", branch=1, value=1),
                                   SetValue(state="agents/b/notes", branch=1, value=2)], execute)
        (ok, error), (other_ok, _) = results
        assert not ok and isinstance(error, ConfigConflictError) and "lost its lease" in str(error)
        assert other_ok
        assert holder.read_value("agents/a/notes", 1) is None and holder.read_value("agents/b/notes", 1) == 2
        assert not holder.holds(1, "agents/a/context")
        results, _ = taker.apply([SetValue(state="agents/a/notes", branch=1, value=3)], execute)
        assert results == [(True, results[0][1])] and taker.read_value("agents/a/notes", 1) == 3
    finally:
        holder.close()
        taker.close()


def test_a_lease_that_lapsed_with_nobody_taking_it_over_stays_its_holders(pooled_url: str) -> None:
    """K12, L10: a lease that lapsed unrenewed (the server away longer than a lease, its holder
    stalled) while no other process took it over is still its holder's: its token is unchanged, so
    its next write lands, and its renewer pushes the expiry on again, after which another engine's
    take is refused; taken over once it lapsed, the holder's write is refused (the token moved)."""
    holder, taker = PostgresEngine(pooled_url, lease_ms=LEASE_MS), PostgresEngine(pooled_url)
    try:
        assert holder.hold(1, "agents/a/context")
        holder.apply([RegisterState(name="agents/a/notes", kind="value")], execute)
        with psycopg.connect(pooled_url, autocommit=True) as conn:
            conn.execute("UPDATE ctxrt_leases SET expires = now() - interval '1 minute'")  # as if it lapsed
            assert holder.holds(1, "agents/a/context")
            results, _ = holder.apply([SetValue(state="agents/a/notes", branch=1, value=1)], execute)
            assert results[0][0] and holder.read_value("agents/a/notes", 1) == 1
        deadline = time.monotonic() + 30
        while not lease_row(pooled_url)[2]:  # until the renewer's turn: a round trip each look
            assert time.monotonic() < deadline, "the renewer never renewed the lapsed lease"
        assert not taker.hold(1, "agents/a/context"), "a renewed lease was taken"
        with psycopg.connect(pooled_url, autocommit=True) as conn:  # taken over, as a take does once it lapsed
            conn.execute("UPDATE ctxrt_leases SET holder = 'another', token = token + 1")
        results, _ = holder.apply([SetValue(state="agents/a/notes", branch=1, value=2)], execute)
        assert not results[0][0] and isinstance(results[0][1], ConfigConflictError)
        assert holder.read_value("agents/a/notes", 1) == 1 and not holder.holds(1, "agents/a/context")
    finally:
        holder.close()
        taker.close()


def test_a_clean_close_gives_the_lease_back_at_once(pooled_url: str) -> None:
    """K12: a holder that closes cleanly gives its lease back: another engine takes it at once, long
    before its expiry, with the token raised."""
    holder, taker = PostgresEngine(pooled_url, lease_ms=600_000), PostgresEngine(pooled_url)
    try:
        assert holder.hold(1, "agents/a/context")
        _, token, _ = lease_row(pooled_url)
        assert not taker.hold(1, "agents/a/context")
        holder.close()
        assert taker.hold(1, "agents/a/context")
        assert lease_row(pooled_url)[1:] == (token + 1, True)
    finally:
        holder.close()
        taker.close()


async def test_a_schema_2_store_is_moved_to_schema_3_with_a_lease_table_by_a_writer(pg_url: str) -> None:
    """K12, K5: a store written before row leases (schema 2: no ctxrt_leases) opens read-only as it is;
    a writer's open adds the lease table and records schema 3, and its namespace's lease is a row."""
    async with ctxrt.open_runtime(pg_url) as rt:
        await (await rt.open("ann")).add_message("user", "line")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as the schema-2 ctxrt left it
        conn.execute("DROP TABLE ctxrt_leases")
        conn.execute("UPDATE ctxrt_meta SET value = 2 WHERE key = 'format'")
    async with ctxrt.open_runtime(pg_url, readonly=True) as rt:
        assert await (await rt.open("ann")).message_count() == 1
    async with ctxrt.open_runtime(pg_url) as rt:
        await rt.open("agents/a", strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT value FROM ctxrt_meta WHERE key = 'format'").fetchone() == (3,)
            assert conn.execute("SELECT count(*) FROM ctxrt_leases WHERE expires > now()").fetchone() == (1,)


def test_the_horizon_waits_behind_the_pooler_for_a_write_in_flight(pooled_url: str) -> None:
    """K13, K11: through a transaction-mode pooler ``last_sequence`` still reads the server's lock
    table: with another engine's batch in flight (its append's sequence drawn, not committed) a
    reader's horizon doesn't answer until that batch ends, and then answers its sequence."""
    writer, reader = PostgresEngine(pooled_url), PostgresEngine(pooled_url, create=False)
    try:
        writer.apply([RegisterState(name="log", kind="log")], execute)
        in_flight, go = threading.Event(), threading.Event()

        def stalled(batch: object, command: object) -> object:
            result = execute(batch, command)
            in_flight.set()  # the slot's lock held and its sequence drawn, the rows not sent
            go.wait()
            return result

        applied: list[object] = []
        batch = threading.Thread(target=lambda: applied.append(
            writer.apply([AppendItem(state="log", branch=1, data=b"x")], stalled)))
        batch.start()
        in_flight.wait()
        answered: list[int] = []
        horizon = threading.Thread(target=lambda: answered.append(reader.last_sequence))
        horizon.start()
        horizon.join(timeout=1.0)  # a horizon that didn't wait would have answered by now
        assert horizon.is_alive() and not answered
        go.set()
        batch.join()
        horizon.join()
        [([(ok, appended)], _)] = applied
        assert ok and answered == [appended.sequence]
    finally:
        writer.close()
        reader.close()


def test_a_writers_settings_stay_in_its_transactions_behind_the_pooler(pooled_url: str) -> None:
    """K13: the writer's settings (``synchronous_commit=off`` under durability "os", the idle-in-
    transaction bound) are its transactions' own: after its batches, the server connections the
    pooler hands other clients keep the server's settings."""
    writer = PostgresEngine(pooled_url, synchronous=False)
    try:
        writer.apply([RegisterState(name="notes", kind="value")], execute)
        for n in range(5):
            assert writer.apply([SetValue(state="notes", branch=1, value=n)], execute)[0][0][0]
        others = [psycopg.connect(pooled_url, autocommit=True) for _ in range(4)]
        try:
            for other in others:
                assert other.execute("SELECT current_setting('synchronous_commit'),"
                                     " current_setting('idle_in_transaction_session_timeout')").fetchone() == ("on", "0")
        finally:
            for other in others:
                other.close()
    finally:
        writer.close()


@pytest.mark.parametrize("outage", ["pooler stalled", "server down behind the pooler"])
def test_a_close_returns_while_the_server_behind_the_pooler_doesnt_answer_the_renewal(
    outage: str, pooler: Pooler, pg_cluster: Cluster, pooled_url: str, pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """K12, K13 (from an attack): an engine closed while its renewer waits for a server that doesn't
    answer (PgBouncer stopped mid-stream; or the server down, where PgBouncer queues the renewal
    for two minutes) returns within ``LEASE_CLOSE_S`` and a connect timeout with its renewer thread
    ended; the lease
    lapses at its expiry, and another engine takes it then (directly: PgBouncer holds off new
    logins for a while after the server's were failing)."""
    # Connect timeout 2 s: a renewer connecting again meanwhile.
    holder = PostgresEngine(pooled_url, lease_ms=600, connect_timeout_s=2)
    try:
        assert holder.hold(1, "agents/a/context")
        with contextlib.ExitStack() as outages:
            if outage == "pooler stalled":
                pooler.process.send_signal(signal.SIGSTOP)
                outages.callback(pooler.process.send_signal, signal.SIGCONT)
            else:
                outages.enter_context(pg_cluster.down())
            while not any("couldn't renew the leases" in r.getMessage() for r in caplog.records):
                time.sleep(0.05)  # until a renewal went unanswered for the lease's length
            assert holder.holds(1, "agents/a/context"), "lapsed, but nobody took it over"
            closing = threading.Thread(target=holder.close)
            closing.start()
            closing.join(timeout=LEASE_CLOSE_S + 5)
            assert not closing.is_alive(), "the close hung on the renewal"
            assert not any(thread.name == "ctxrt lease renewer" for thread in threading.enumerate())
        taker = PostgresEngine(pg_url)
        try:
            while not taker.hold(1, "agents/a/context"):  # lapsed at its expiry (not given back)
                time.sleep(0.05)
        finally:
            taker.close()
    finally:
        holder.close()


@pytest.mark.parametrize("name", ["agents/a/context", "agents/b/context"])  # hashtext < 0, > 0 in "public"
def test_a_take_is_refused_while_a_schema_2_writer_holds_the_namespace_as_a_session_lock(pg_url: str, name: str) -> None:
    """K12, K5 (from an attack: a ctxrt of schema 2 kept serving a namespace while a writer of this
    version moved the store and served it too): while a session holds the advisory lock a schema-2
    writer held a namespace's lease with, (branch, hashtext(schema/name)), the take is refused;
    once it lets go, the take wins."""
    with psycopg.connect(pg_url, autocommit=True) as old_writer:
        key = "hashtext(current_schema() || '/' || %s)"
        old_writer.execute(f"SELECT pg_advisory_lock(1, {key})", (name,))
        (sign,) = old_writer.execute(f"SELECT sign({key})", (name,)).fetchone() or (None,)
        engine = PostgresEngine(pg_url)
        try:
            assert not engine.hold(1, name)
            old_writer.execute(f"SELECT pg_advisory_unlock(1, {key})", (name,))
            assert engine.hold(1, name)
        finally:
            engine.close()
    assert sign == (-1 if name == "agents/a/context" else 1)


def test_a_take_through_a_pooler_gone_silent_fails_instead_of_hanging(
    pooler: Pooler, pooled_url: str,
) -> None:
    """K12, K13 (from an attack: a take, run on the event loop's thread, waited forever for a pooler
    that stopped answering, and so did every take and give-back after a renewal stuck there): a
    take unanswered for the engine's ``lease_statement_s`` is cut and raises StoreUnavailableError, and the
    engine's takes work again once the pooler answers."""
    engine = PostgresEngine(pooled_url, lease_ms=600, connect_timeout_s=2, lease_statement_s=0.5)
    try:
        assert engine.hold(1, "agents/a/context")
        outcome: list[BaseException | bool] = []

        def take() -> None:
            try:
                outcome.append(engine.hold(1, "agents/b/context"))
            except ctxrt.StoreUnavailableError as exc:
                outcome.append(exc)

        pooler.process.send_signal(signal.SIGSTOP)
        try:
            taking = threading.Thread(target=take)
            taking.start()
            taking.join(timeout=15)
            assert not taking.is_alive(), "the take hung on the silent pooler"
        finally:
            pooler.process.send_signal(signal.SIGCONT)
        assert isinstance(outcome[0], ctxrt.StoreUnavailableError) and "no answer in 0.5 s" in str(outcome[0])
        assert engine.hold(1, "agents/b/context")
    finally:
        engine.close()


# Ctrl-C in the lease code, from a host-style attack: a real SIGINT at a line of
# ``PostgresEngine.close`` or ``hold`` in a trio host, as tests/test_interrupt_sweep.py sends them
# (attack/sigint.py sweeps every line of the lease code a host reaches).
NAME = "agents/a/context"


def interrupted(function: str, at: Callable[[str], bool], run: Callable[[], Any]) -> None:
    """``run`` in a trio run, a real SIGINT sent at the first line of ``function`` (of the engine's
    module) whose text ``at`` accepts: the run must end in KeyboardInterrupt."""
    with open(ctxrt.store.postgres.__file__) as source:
        lines = source.read().splitlines()
    sent = []

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != ctxrt.store.postgres.__file__ or frame.f_code.co_name != function:
            return None
        if event == "line" and not sent and at(lines[frame.f_lineno - 1]):
            sent.append(frame.f_lineno)
            os.kill(os.getpid(), signal.SIGINT)
        return trace

    async def host() -> None:
        sys.settrace(trace)
        try:
            run()
        finally:
            sys.settrace(None)
        await trio.lowlevel.checkpoint()

    with pytest.raises(KeyboardInterrupt):
        trio.run(host)
    assert sent


def renewers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "ctxrt lease renewer"]


def test_ctrl_c_at_the_first_line_of_the_close_still_gives_the_lease_back_and_ends_the_renewer(pg_url: str) -> None:
    """K12: a Ctrl-C as a trio host's close of the engine begins waits for the close's end (raised
    after it): the lease is given back (another engine takes it at once) and the renewer ends.
    Cut short, the close left the renewer renewing the lease for as long as the process lived."""
    engine, taker = PostgresEngine(pg_url), PostgresEngine(pg_url)
    try:
        assert engine.hold(1, NAME)
        interrupted("close", lambda line: "_closing.set()" in line, engine.close)
        assert not renewers()
        assert taker.hold(1, NAME)
    finally:
        engine.close()
        taker.close()


def test_ctrl_c_as_the_first_hold_starts_the_renewer_leaves_a_close_that_ends_cleanly(pg_url: str) -> None:
    """K12: a Ctrl-C in the first take, at the line starting the renewer: the engine's close then ends
    cleanly with no renewer left (it raised RuntimeError, joining a thread never started), and
    the lease taken lapses at its expiry."""
    engine = PostgresEngine(pg_url, lease_ms=500)
    try:
        interrupted("hold", lambda line: ".start()" in line, lambda: engine.hold(1, NAME))
    finally:
        engine.close()
    assert not renewers()


def test_a_batch_stalled_under_one_lease_doesnt_hold_up_the_renewal_of_the_engines_others(pg_url: str) -> None:
    """K12 (from an attack: one statement renews every lease an engine holds, and it waited for the
    row of the engine's own batch in flight, which its fencing check keeps locked to the batch's
    end: a batch stalled past the lease's length, waiting for another process's slot lock say,
    cost the engine every lease it held): while a batch under one lease is stalled, the other
    leases are renewed on the server, and held."""
    engine = PostgresEngine(pg_url, lease_ms=600)
    try:
        engine.apply([RegisterState(name="agents/a/notes", kind="value")], execute)
        assert engine.hold(1, "agents/a/context") and engine.hold(1, "agents/b/context")
        in_flight, go = threading.Event(), threading.Event()

        def stalled(batch: object, command: Any) -> object:
            result = execute(batch, command)
            if command.value == 2:  # the first's fencing check answered: the lease row is locked
                in_flight.set()
                go.wait()
            return result

        writes = threading.Thread(target=engine.apply, args=(
            [SetValue(state="agents/a/notes", branch=1, value=1), SetValue(state="agents/a/notes", branch=1, value=2)],
            stalled))
        writes.start()
        try:
            in_flight.wait()
            with psycopg.connect(pg_url, autocommit=True) as conn:
                def expiry() -> Any:
                    return (conn.execute("SELECT expires FROM ctxrt_leases WHERE name = 'agents/b/context'").fetchone()
                            or (None,))[0]
                seen = [expiry()]
                deadline = time.monotonic() + 5.0  # 8 lease lengths: the failure's bound, not a timing
                while len(set(seen)) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
                    seen.append(expiry())
            assert len(set(seen)) >= 3, "the other lease wasn't renewed while the batch was stalled"
            assert engine.holds(1, "agents/b/context")
        finally:
            go.set()
            writes.join()
    finally:
        engine.close()


def test_a_take_that_waited_for_the_last_holders_batch_gets_a_full_lease(pg_url: str) -> None:
    """K12 (from an attack: a holder stopped mid-batch, its lease expired meanwhile; the taker's take
    waited for that batch to end and won, with an expiry counted from before its wait, already
    past: its first write was refused, "lost its lease"): the lease a take wins runs ``lease_ms``
    from when it was won, and the taker's writes land."""
    holder, taker = PostgresEngine(pg_url, lease_ms=300), PostgresEngine(pg_url, lease_ms=300)
    try:
        holder.apply([RegisterState(name="agents/a/notes", kind="value")], execute)
        assert holder.hold(1, NAME)
        in_flight, go = threading.Event(), threading.Event()

        def stalled(batch: object, command: Any) -> object:
            result = execute(batch, command)
            if command.value == 2:  # the first's fencing check answered: the lease row is locked
                in_flight.set()
                go.wait()
            return result

        writes = threading.Thread(target=holder.apply, args=(
            [SetValue(state="agents/a/notes", branch=1, value=1), SetValue(state="agents/a/notes", branch=1, value=2)],
            stalled))
        writes.start()
        taken: list[bool] = []
        try:
            in_flight.wait()
            # The holder's lease runs out (its renewer passes the locked row over); the take
            # waits for the batch's lock for three lease lengths.
            take = threading.Thread(target=lambda: taken.append(taker.hold(1, NAME)))
            take.start()
            with psycopg.connect(pg_url, autocommit=True) as conn:
                # The take queued behind the batch's lock first: one sent after the batch ends meets a
                # lapsed lease its holder's renewer may renew first (nobody took it: still its own).
                while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                       " AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO ctxrt_leases%'"
                                       ).fetchone()[0]:
                    conn.execute("SELECT pg_sleep(0.01)")
                conn.execute("SELECT pg_sleep(0.9)")
        finally:
            go.set()
            writes.join()
        take.join()
        assert taken == [True] and taker.holds(1, NAME)
        [(ok, _)] = taker.apply([SetValue(state="agents/a/notes", branch=1, value=3)], execute)[0]
        assert ok
    finally:
        holder.close()
        taker.close()
