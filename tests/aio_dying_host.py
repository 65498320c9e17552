"""The asyncio host tests/test_aio_guest.py breaks the trio guest run of (H7). Not a test module.

``python aio_dying_host.py <store path>`` opens a ctxrt.aio runtime on a loop run by hand, with a
model that breaks trio's bookkeeping (it reschedules its own task, which then ends: the run dies of
TrioInternalError without unwinding its tasks) while the host awaits ``tick()``. It prints what the
host's block raised and its cause, as ``<error> caused by <cause>``; a guard stops the loop if a
caller is left waiting.
"""

from __future__ import annotations

import asyncio
import sys

import trio

import ctxrt
import ctxrt.aio
from ctxrt.testing import ScriptedModel

GUARD_S = 60
SMALL = ctxrt.Autobiographical("m", target_chunk_tokens=40, recent_window_tokens=40, head_window_tokens=0)


async def breaking(request: ctxrt.ModelRequest) -> str:
    trio.lowlevel.reschedule(trio.lowlevel.current_task())  # a bug trio can't survive
    return "a summary"


async def host(path: str) -> str:
    try:
        async with ctxrt.aio.open_runtime(path, durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", strategy=SMALL, model=ScriptedModel(breaking))
            for number in range(12):
                await ann.add_message("user", f"message {number} with some words to summarise later on")
            await ann.tick()  # waits on the namespace actor while its model breaks the run
    except ctxrt.RuntimeClosedError as exc:
        return f"RuntimeClosedError caused by {type(exc.__cause__).__name__}"
    return "the block exited without an error"


def main(path: str) -> None:
    loop = asyncio.new_event_loop()
    loop.call_later(GUARD_S, loop.stop)  # a caller left waiting would hang the loop's run
    print(loop.run_until_complete(host(path)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
