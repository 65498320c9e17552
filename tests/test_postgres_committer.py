"""PostgreSQL's commit thread (store/committer.py's ``ThreadCommitter``): a lone caller's batch
handed to it from its own task, cancelled or interrupted while it is out, or cut off by the
server (K16, L3, L8, M1)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import ctxrt
from ctxrt import open_runtime
from support import at_line, line_of

COMMITTER = str(Path(ctxrt.__file__).parent / "store" / "committer.py")
POSTGRES = str(Path(ctxrt.__file__).parent / "store" / "postgres.py")
THREAD = "ctxrt-store-committer"


def open_transactions(url: str) -> list[tuple[Any, ...]]:
    """The other sessions of ``url``'s database inside a transaction."""
    with psycopg.connect(url, autocommit=True) as admin:
        return admin.execute("SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
                             " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL").fetchall()


async def stored_texts(url: str, name: str) -> list[str]:
    async with open_runtime(url, readonly=True) as rt:
        manager = await rt.open(name, isolate=True)
        return [message.content[0].text for message in await manager.get_all_messages()]


class CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` as soon as the task named ``...name`` ended its ``step``-th step: while it
    waits at its ``step``-th schedule point."""

    def __init__(self, name: str, scope: trio.CancelScope, step: int) -> None:
        self.name, self.scope, self.step, self.steps = name, scope, step, 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(self.name):
            self.steps += 1
            if self.steps == self.step:
                self.scope.cancel()


async def test_a_lone_append_cancelled_at_each_schedule_point_is_stored_whole_or_not_and_seen_by_others(
    pg_url: str,
) -> None:
    """L3, M1: a lone append on PostgreSQL cancelled at each of its schedule points in turn (its
    batch handed to the commit thread among them): its caller leaves at once, the batch lands or was
    never sent, what landed reaches the runtime's caches as it reaches the database (another
    runtime reads the same messages), and the next append lands after it."""
    step = 0
    outcomes = []
    async with open_runtime(pg_url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True)
        for warm in range(3):  # the commit's time measured: an idle loop blocks for it
            await manager.add_message("user", f"warm {warm}")
        while True:
            step += 1
            cancelling = CancelAtStep("cancelled_append", trio.CancelScope(), step)

            async def cancelled_append() -> None:
                with cancelling.scope:
                    await manager.add_message("user", f"cancelled at {step}")

            trio.lowlevel.add_instrument(cancelling)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancelled_append)
            finally:
                trio.lowlevel.remove_instrument(cancelling)
            await manager.add_message("user", f"after {step}")
            outcomes.append(cancelling.scope.cancelled_caught)
            if not cancelling.scope.cancelled_caught:
                break
        seen = [message.content[0].text for message in await manager.get_all_messages()]
    assert outcomes == [True] * (step - 1) + [False] and step >= 3, outcomes
    stored = await stored_texts(pg_url, "ann")
    # Cancelled at its first schedule point it sent nothing; at its wait for the thread (the last),
    # its batch was out.
    assert "cancelled at 1" not in stored and f"cancelled at {step - 1}" in stored
    assert stored == seen
    for number in range(1, step + 1):  # in order: each cancelled append, if stored, before the next one
        assert f"after {number}" in stored
        if f"cancelled at {number}" in stored:
            assert stored.index(f"cancelled at {number}") + 1 == stored.index(f"after {number}")
    assert open_transactions(pg_url) == []
    assert THREAD not in [thread.name for thread in threading.enumerate()]


def test_ctrl_c_while_a_lone_batch_is_on_the_commit_thread_lands_it_leaves_no_transaction_and_closes(
    pg_url: str,
) -> None:
    """L8, M1: a real SIGINT while a host's main task waits for its own batch on the commit thread:
    the run ends in a bare KeyboardInterrupt, the runtime closes (its commit thread is gone), no
    transaction is left open on the server, and the interrupted append (its batch was out) is
    stored after every acknowledged one."""
    line = line_of(COMMITTER, "_lone", "await trio.lowlevel.wait_readable(self._thread.ready)")
    sent: list[str] = []
    interrupted: list[str] = []
    reached = 0

    def reach() -> None:
        nonlocal reached
        reached += 1
        if reached == 5:
            interrupted.append(sent[-1])
            os.kill(os.getpid(), signal.SIGINT)

    async def host() -> None:
        async with open_runtime(pg_url, durability="sync") as rt:
            manager = await rt.open("ann", isolate=True)
            for number in range(20):
                sent.append(f"line {number}")
                await manager.add_message("user", sent[-1])

    sys.settrace(at_line(COMMITTER, line, reach))
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            trio.run(host)
    finally:
        sys.settrace(None)
    assert type(raised.value) is KeyboardInterrupt
    assert reached == 5 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert THREAD not in [thread.name for thread in threading.enumerate()]
    assert open_transactions(pg_url) == []
    assert trio.run(stored_texts, pg_url, "ann") == sent[: sent.index(interrupted[0]) + 1]


async def test_a_connection_killed_while_the_batch_is_on_the_commit_thread_says_whether_it_committed_is_unknown(
    pg_url: str,
) -> None:
    """K16, M1: the server drops the writer's connection while a lone append's batch is on the
    commit thread (before its COMMIT goes out): the caller gets ``StoreUnavailableError`` saying
    whether it committed is unknown, the next append lands on a new connection, and the runtime's
    close ends the thread."""
    line = line_of(POSTGRES, "_apply", 'cursor.execute("COMMIT")')
    armed = threading.Event()
    killed = threading.Event()

    def kill() -> None:
        if armed.is_set():
            armed.clear()
            with psycopg.connect(pg_url, autocommit=True) as admin:  # waits for the backend's end
                admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE"
                              " datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
            killed.set()

    threading.settrace(at_line(POSTGRES, line, kill))  # the commit thread starts with the runtime
    try:
        async with open_runtime(pg_url, durability="sync") as rt:
            manager = await rt.open("ann", isolate=True)
            await manager.add_message("user", "first")
            armed.set()
            with pytest.raises(ctxrt.StoreUnavailableError) as refused:
                await manager.add_message("user", "killed")
            assert killed.is_set()
            await manager.add_message("user", "last")
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    assert "whether it committed is unknown" in str(refused.value)
    assert await stored_texts(pg_url, "ann") == ["first", "last"]
    assert THREAD not in [thread.name for thread in threading.enumerate()]


async def test_lone_appends_land_while_another_task_keeps_the_loop_busy(pg_url: str) -> None:
    """K16, L3: a task that never lets the loop sleep (a checkpoint after every few microseconds of
    Python) beside a caller appending alone: each batch on the commit thread still gets the GIL it
    needs (a turn before it took its job, then at each busy pass once it is due) and lands."""
    done = False

    async def busy() -> None:
        while not done:
            sum(range(200))
            await trio.lowlevel.checkpoint()

    async with open_runtime(pg_url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy)
            with trio.fail_after(30):
                ids = [await manager.add_message("user", f"line {number}") for number in range(30)]
            done = True
    assert ids == sorted(ids, key=int)
    assert await stored_texts(pg_url, "ann") == [f"line {number}" for number in range(30)]


async def test_a_batch_out_on_a_stalled_server_leaves_a_busy_loop_its_passes(pg_url: str) -> None:
    """K16: while the server stalls (its backends stopped) with a batch on the commit thread, a task
    that never lets the loop sleep keeps most of its scheduler passes: the loop offers the thread a
    turn once the commit is due, and a commit that didn't end then is offered the next later, not
    at every pass (offered at every pass, the busy loop ran 1/40th of its passes); once the server
    goes on, the batch lands."""
    async def passes(seconds: float) -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            await trio.lowlevel.checkpoint()
            count += 1
        return count

    async with open_runtime(pg_url, durability="sync") as rt:
        manager = await rt.open("ann", isolate=True)
        for warm in range(5):  # the commit's time measured
            await manager.add_message("user", f"warm {warm}")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            backends = [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        free = await passes(0.3)
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(manager.add_message, "user", "stalled")
                await trio.lowlevel.checkpoint()  # the append hands its batch over
                stalled = await passes(0.3)
                for pid in backends:
                    os.kill(pid, signal.SIGCONT)
        finally:
            for pid in backends:
                os.kill(pid, signal.SIGCONT)
        assert stalled * 4 > free, (stalled, free)
    assert await stored_texts(pg_url, "ann") == [f"warm {warm}" for warm in range(5)] + ["stalled"]


async def test_a_connection_lost_during_the_batch_says_whether_it_committed_is_unknown_when_reconnecting_fails(
    pg_url: str,
) -> None:
    """K16, M1: the server drops the writer's connection while a batch is on the commit thread
    (its COMMIT about to go out) and refuses the new one (a server restarting, say): the caller
    still hears that whether it committed is unknown, not only why the reconnect failed (it read as
    a write that never went out); once the server takes connections again, the next append lands."""
    line = line_of(POSTGRES, "_apply", 'cursor.execute("COMMIT")')
    database = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    armed = threading.Event()

    def admit(allowed: bool) -> None:
        with psycopg.connect(pg_url, dbname="postgres", autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                psycopg.sql.Identifier(str(database)), psycopg.sql.SQL("true" if allowed else "false")))

    def kill() -> None:
        if armed.is_set():
            armed.clear()
            admit(False)
            with psycopg.connect(pg_url, dbname="postgres", autocommit=True) as admin:  # waits for the end
                admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE"
                              " datname = %s AND xact_start IS NOT NULL", (database,))

    threading.settrace(at_line(POSTGRES, line, kill))
    try:
        async with open_runtime(pg_url, durability="sync") as rt:
            manager = await rt.open("ann", isolate=True)
            await manager.add_message("user", "first")
            armed.set()
            try:
                with pytest.raises(ctxrt.StoreUnavailableError) as refused:
                    await manager.add_message("user", "cut off")
            finally:
                admit(True)
            await manager.add_message("user", "last")
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    assert "whether it committed is unknown" in str(refused.value), str(refused.value)
    assert await stored_texts(pg_url, "ann") == ["first", "last"]


CLOSER = Path(__file__).parent / "pg_stalled_closer.py"


def close_under_a_stalled_server(url: str, mode: str, bound_s: float, read_s: float = 60.0,
                                 batch_s: float = 60.0) -> tuple[list[dict[str, Any]], list[str]]:
    """Run pg_stalled_closer.py in ``mode``, its database's server sessions stopped (SIGSTOP) once it
    is ready, until it says how it ended (within a minute, or the test fails); then resume them.
    What it said after ``ready``, and what its stderr logged."""
    process = subprocess.Popen([sys.executable, str(CLOSER), url, mode, str(bound_s), str(read_s), str(batch_s)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped: list[int] = []
    try:
        assert process.stdout is not None and process.stdin is not None
        assert json.loads(process.stdout.readline()) == {"ready": True}
        with psycopg.connect(url, autocommit=True) as admin:
            stopped = [pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        process.stdin.write("go\n")
        process.stdin.flush()
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"the host's close waited for the stalled server for a minute: {out!r} {err[-2000:]!r}")
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
            process.wait()
    return [json.loads(line) for line in out.splitlines()], err.splitlines()


async def test_a_close_cuts_a_batch_the_stalled_server_never_answers_after_its_bound(pg_url: str) -> None:
    """K16, L3: the runtime closed while its server's sessions are stopped (SIGSTOP) with a
    cancelled caller's append out: the close waits the engine's bound for it (CLOSE_BATCH_S, here
    1 s), then cuts it, saying so, and returns (it waited for good before); once the server goes on,
    the store holds what was acknowledged and nothing of the cut batch (it never reached a COMMIT)."""
    said, logged = await trio.to_thread.run_sync(close_under_a_stalled_server, pg_url, "close", 1.0)
    assert said[0] == {"closing": True} and said[-1]["closed"] and 1.0 <= said[-1]["seconds"] < 30, said
    assert any("hasn't answered a batch in 1 s; cutting it" in line for line in logged), logged
    assert await stored_texts(pg_url, "ann") == ["warm"]


async def test_a_ctrl_c_while_the_stalled_server_holds_a_batch_ends_the_host_within_a_second_or_so(
    pg_url: str,
) -> None:
    """K16, L8: a Ctrl-C (a real SIGINT) while the server's sessions are stopped with an append's
    batch out: the host's run ends in KeyboardInterrupt once the batch has been out LEASE_CLOSE_S
    (1 s), not the close's 30 s bound (left at its default here), nor never, as before; the store
    then holds what was acknowledged."""
    said, logged = await trio.to_thread.run_sync(close_under_a_stalled_server, pg_url, "interrupt", 30.0)
    assert said[0] == {"closing": True} and said[-1]["interrupted"] and said[-1]["seconds"] < 20, said
    assert any("hasn't answered a batch in 1 s; cutting it" in line for line in logged), logged
    assert await stored_texts(pg_url, "ann") == ["warm"]


async def test_a_read_the_stalled_server_never_answers_is_cut_and_the_loop_goes_on(pg_url: str) -> None:
    """K16, L10: a compile whose reads (on the trio thread) the server's stopped sessions (SIGSTOP)
    never answer: the engine's watchdog cuts the read out past READ_CUT_S (here 2 s), saying so, and
    the compile ends (here on a new connection, the server's postmaster still answering) where it
    held every task of the loop for good before."""
    said, logged = await trio.to_thread.run_sync(close_under_a_stalled_server, pg_url, "read", 30.0, 2.0)
    assert ("compiled" in said[0] or "unavailable" in said[0]) and 2.0 <= said[0]["seconds"] < 30, said
    assert any("hasn't answered a read in 2 s; cutting it" in line for line in logged), logged
    assert said[-1]["closed"], said


async def test_a_fork_the_stalled_server_never_answers_is_cut_so_the_host_can_leave(pg_url: str) -> None:
    """K16, L4: a fork (the runtime carries it out whole: its caller's cancel waits for it) out while
    the server's sessions are stopped (SIGSTOP), the host cancelling it and leaving the block: the
    batch is cut once the server hasn't answered it in BATCH_CUT_S (here 2 s), the fork raises
    StoreUnavailableError saying so, and the close goes on. Before, the fork's wait, the host's
    block around it and so the close (whose own bound is armed once the block ends) waited for good,
    a Ctrl-C too."""
    said, logged = await trio.to_thread.run_sync(close_under_a_stalled_server, pg_url, "fork", 30.0, 3.0, 2.0)
    assert said[0] == {"closing": True} and said[-1]["closed"] and said[-1]["seconds"] < 30, said
    assert any("didn't answer a batch in 2 s" in line.get("unavailable", "") for line in said), said
    assert any("hasn't answered a batch in 2 s; cutting it" in line for line in logged), logged
    assert await stored_texts(pg_url, "ann") == ["warm"]


async def test_a_close_gives_back_a_lease_the_stalled_server_never_answers_within_a_second_or_so(pg_url: str) -> None:
    """K16, K12: a namespace holding a lease (its strategy keeps its memory in the store), the
    runtime closed while the server's sessions are stopped (SIGSTOP): the actor's give-back at its
    stop (on the loop's thread) waits LEASE_CLOSE_S for the lease connection and for its answer, as
    the engine's own give-back does, and the lease lapses at its expiry: the close ends within
    seconds of its 1 s bound (it waited 30 s for the give-back's answer, and the renewer's 10 s for
    the connection before that); the store holds what was acknowledged."""
    said, logged = await trio.to_thread.run_sync(close_under_a_stalled_server, pg_url, "lease", 1.0)
    assert said[0] == {"closing": True} and said[-1]["closed"] and said[-1]["seconds"] < 8, said
    assert any("couldn't give back the lease" in line for line in logged), logged
    assert await stored_texts(pg_url, "ann") == ["warm"]
