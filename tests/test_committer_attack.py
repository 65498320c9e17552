"""A lone durable caller (its commit handed over from its own task while the flush measures fast)
interrupted or cancelled while its commit is out (K3, K9, L3, L8).

The store lives in /dev/shm, where the flush measures fast, so a caller that finds the store idle
commits from its own task (store/committer_lmdb.py); without /dev/shm the tests are skipped. The
frozen-disk cases are in test_store_flush.py; attack/ holds the sweeps these were drawn from.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt import open_runtime
from ctxrt.testing import verify_store
from support import at_line, line_of

COMMITTER = str(Path(ctxrt.__file__).parent / "store" / "committer_lmdb.py")
WARM = 5  # appends before the one interrupted: the flush's moving average settles


@pytest.fixture
def memory_path() -> Iterator[Path]:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no memory filesystem at /dev/shm: the flush wouldn't measure fast")
    directory = Path(tempfile.mkdtemp(prefix="ctxrt-lone-", dir="/dev/shm"))
    try:
        yield directory / "store"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def lost(path: Path, acks: list[tuple[int, str]]) -> list[tuple[int, str]]:
    missing = []
    async with open_runtime(path, readonly=True) as rt:
        readers: dict[int, Any] = {}
        for who, message_id in acks:
            if who not in readers:
                readers[who] = await rt.open(f"agents/a{who}")
            if await readers[who].get_message(message_id) is None:
                missing.append((who, message_id))
    return missing


@pytest.mark.parametrize("how", ["trio", "asyncio.run", "run_until_complete"])
def test_ctrl_c_while_the_main_tasks_lone_commit_is_out_ends_in_a_bare_keyboard_interrupt_and_it_lands(
    memory_path: Path, how: str,
) -> None:
    """A host appending in its main task (trio's, or an asyncio host's of H4) gets a real SIGINT
    while its own commit is out: the run ends in a bare KeyboardInterrupt, and the interrupted append
    (its commit was out) is stored with every acknowledged one, the store sound (L8, K3)."""
    line = line_of(COMMITTER, "_lone", "await trio.lowlevel.wait_readable(self._writer.ready)")
    acks: list[tuple[int, str]] = []
    sending: list[int] = []
    interrupted: list[int] = []  # the append whose commit was out at the SIGINT
    reached = 0

    def reach() -> None:
        nonlocal reached
        reached += 1
        if reached == 3:  # the third commit a caller made alone (the open's, then appends)
            interrupted.append(sending[-1])
            os.kill(os.getpid(), signal.SIGINT)

    async def appends(manager: Any) -> None:
        for number in range(WARM + 10):
            sending.append(number)
            acks.append((0, await manager.add_message("user", f"line {number}")))

    async def trio_host() -> None:
        async with open_runtime(memory_path) as rt:
            await appends(await rt.open("agents/a0"))

    async def asyncio_host() -> None:
        async with ctxrt.aio.open_runtime(memory_path) as rt:
            await appends(await rt.open("agents/a0"))

    def run() -> None:
        if how == "trio":
            trio.run(trio_host)
        elif how == "asyncio.run":
            asyncio.run(asyncio_host())
        else:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(asyncio_host())
            finally:
                loop.close()

    sys.settrace(at_line(COMMITTER, line, reach))
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            run()
    finally:
        sys.settrace(None)
    assert type(raised.value) is KeyboardInterrupt
    assert reached == 3, "no append committed alone: the flush didn't measure fast"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert verify_store(memory_path).status == "sound"
    assert trio.run(lost, memory_path, acks) == []

    async def texts() -> list[str]:
        async with open_runtime(memory_path, readonly=True) as rt:
            manager = await rt.open("agents/a0")
            return [message.content[0].text for message in await manager.query_messages(limit=100)]

    # Interrupted, the append may still be acknowledged (an asyncio host's Ctrl-C reaches trio's main
    # task, not the caller); either way its commit was out, and it lands.
    assert f"line {interrupted[0]}" in trio.run(texts), "the interrupted append, whose commit was out, didn't land"


async def test_lone_and_racing_appenders_under_drawn_deadlines_lose_no_acknowledged_append(memory_path: Path) -> None:
    """Appenders alone and racing, each append under a drawn deadline of at most a few ms, so that
    deadlines fall while a lone caller's commit is out, in an actor batch and in a landing: every
    acknowledged append is stored, each appender's next append lands after them (nothing left out),
    and the runtime closes (L3, K9)."""
    rng = random.Random(35)
    acks: list[tuple[int, str]] = []
    gave_up = 0
    with trio.fail_after(60):
        async with open_runtime(memory_path) as rt:
            managers = [await rt.open(f"agents/a{who}") for who in range(3)]

            async def append(who: int, count: int) -> None:
                nonlocal gave_up
                for number in range(count):
                    with trio.move_on_after(rng.choice((0.0, 1e-5, 2e-4, 1e-3, 3e-3, float("inf")))) as scope:
                        acks.append((who, await managers[who].add_message("user", f"{who} {number}")))
                    gave_up += scope.cancelled_caught
                acks.append((who, await managers[who].add_message("user", f"{who} last")))

            await append(0, 60)  # alone: the lone path
            async with trio.open_nursery() as nursery:
                for who in range(3):
                    nursery.start_soon(append, who, 40)
    assert gave_up > 0
    assert verify_store(memory_path).status == "sound"
    assert await lost(memory_path, acks) == []
