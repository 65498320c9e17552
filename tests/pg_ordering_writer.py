"""A writer process for the PostgreSQL ordering test: one runtime on ``url`` whose tasks append
``messages`` messages each, half of them to this process's own slot (``isolate=True``) and half to
the store's shared slot. Prints ``ready``, waits for a line on stdin (the test's barrier), then
appends and prints one JSON line: the ids it was given."""

from __future__ import annotations

import json
import sys

import trio

import ctxrt

TASKS = 4


async def main(url: str, process: int, messages: int) -> None:
    async with ctxrt.open_runtime(url) as rt:
        own = await rt.open(f"own-{process}", isolate=True)
        shared = await rt.open(f"shared-{process}")
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        ids: list[str] = []

        async def task(number: int) -> None:
            manager = own if number % 2 else shared
            for n in range(messages):
                ids.append(await manager.add_message("user", f"p{process} t{number} m{n}"))

        async with trio.open_nursery() as nursery:
            for number in range(TASKS):
                nursery.start_soon(task, number)
        print(json.dumps(ids), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
