"""A writer for test_host_state's kill -9 test: ``python host_state_writer.py STORE``.

It adds "turn N" messages, each with ``host_state={"progress": N}``, continuing from the progress
the store holds, and prints ``ack N`` once each is acknowledged, until it is killed.
"""

from __future__ import annotations

import sys

import trio

import ctxrt


async def main(store: str) -> None:
    async with ctxrt.open_runtime(store) as rt:
        progress = await rt.host_state("progress")
        manager = await rt.open("writer")
        stored = await progress.get()
        turn = 0 if stored is None else stored + 1
        while True:
            await manager.add_message("user", f"turn {turn}", host_state={"progress": turn})
            print(f"ack {turn}", flush=True)
            turn += 1


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
