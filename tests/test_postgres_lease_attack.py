"""Ctrl-C in the lease code of a PostgreSQL engine (K12), from a host-style attack: a real SIGINT at a
line of ``PostgresEngine.close`` or ``hold`` in a trio host, as ``tests/test_interrupt_sweep.py``
sends them. ``attack/sigint.py`` sweeps every line of the lease code a host reaches."""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
import trio

import ctxrt.store.postgres
from ctxrt.store.postgres import PostgresEngine

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
