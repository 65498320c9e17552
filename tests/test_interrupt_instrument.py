"""asyncio's second Ctrl-C raised inside the durable committer's turn-giving instrument (L8, H4).

Under ``asyncio.run`` the second SIGINT raises ``KeyboardInterrupt`` wherever the loop's thread
is, an instrument's hook that trio calls included; trio then drops that instrument. The
committer's stop removed it again, and trio's ``KeyError`` cut the store actor's close short and
was logged as the close's error (found by attack/a2_sigint.py, two SIGINTs a few ms apart).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt.testing import GiveTurns


def test_a_second_ctrl_c_inside_the_commit_turn_instrument_ends_the_host_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """L8, H4: both SIGINTs raised at the first line of the turn-giving hook while durable appends
    run: ``asyncio.run`` raises a bare KeyboardInterrupt, the close logs no error, and every
    acknowledged append is stored."""
    code = GiveTurns.before_io_wait.__code__
    fired: list[bool] = []
    acked: list[str] = []

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and len(acked) >= 20 and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # asyncio's first: cancels the main task
            signal.raise_signal(signal.SIGINT)  # its second: KeyboardInterrupt here, in trio's hook
        return local

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    async def main() -> None:
        async with ctxrt.aio.open_runtime(tmp_path / "store") as rt:
            manager = await rt.open("ann", isolate=True)

            async def appender(k: int) -> None:
                while True:
                    acked.append(await manager.add_message("user", f"line {k}"))

            previous = sys.gettrace()
            sys.settrace(trace)
            try:
                async with asyncio.TaskGroup() as group:
                    for k in range(4):
                        group.create_task(appender(k))
            finally:
                sys.settrace(previous)

    caplog.set_level(logging.ERROR, logger="ctxrt")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert fired
    assert not [record for record in caplog.records if record.name.startswith("ctxrt")], caplog.text

    async def stored() -> set[str]:
        async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as rt:
            manager = await rt.open("ann", isolate=True)
            return {message.id for message in await manager.get_all_messages()}

    assert set(acked) <= trio.run(stored)
