"""The asyncio host tests/test_aio_guest.py interrupts with SIGINT. Not a test module.

``python aio_interrupt_host.py <how> <store path>`` opens a ctxrt.aio runtime and appends from
four asyncio tasks without end, printing ``ack <id>`` after each acknowledged append. ``<how>``
is ``asyncio.run`` (asyncio's own SIGINT handler: Ctrl-C cancels the main task) or
``run_until_complete`` (a loop run by hand, Python's default handler left in place, so trio's
guest run installs its own and Ctrl-C lands in trio code). What the loop's run raises is
printed as ``caught <name>`` and raised on.
"""

from __future__ import annotations

import asyncio
import os
import sys

import ctxrt.aio


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


async def host(path: str) -> None:
    async with ctxrt.aio.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/n{index}", view_reader=f"n{index}") for index in range(4)]

        async def append(manager: ctxrt.aio.ContextManager) -> None:
            number = 0
            while True:
                say(f"ack {await manager.add_message('user', f'line {number}')}")
                number += 1

        await asyncio.gather(*(append(manager) for manager in managers))


def main(how: str, path: str) -> None:
    try:
        if how == "asyncio.run":
            asyncio.run(host(path))
        else:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(host(path))
            finally:
                loop.close()
    except BaseException as exc:
        say(f"caught {type(exc).__name__}")
        raise


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
