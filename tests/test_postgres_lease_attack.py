"""Ctrl-C in the lease code of a PostgreSQL engine (K12), from a host-style attack: a real SIGINT at a
line of ``PostgresEngine.close`` or ``hold`` in a trio host, as ``tests/test_interrupt_sweep.py``
sends them. ``attack/sigint.py`` sweeps every line of the lease code a host reaches."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio

import ctxrt.store.postgres
from ctxrt.store.postgres import PostgresEngine
from ctxrt.testing import RegisterState, SetValue, execute

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
