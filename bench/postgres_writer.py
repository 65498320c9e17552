"""A child process of ``bench/postgres.py``: one runtime on a PostgreSQL store, driven over stdin.

    python -m bench.postgres_writer URL writers PROCESS TASKS [shared]
    python -m bench.postgres_writer URL appender

``writers`` (figure 2): open ``URL`` (durability "sync"), open namespace ``writer-PROCESS`` with
``isolate=True`` (this process's own slot; with ``shared``, not isolated: the store's shared slot,
which every process appends to), append one message (warm-up), print ``ready``, then
wait for ``go START END`` on stdin (``time.monotonic()`` values: on Linux one clock for every
process). From START, TASKS trio tasks each await ``add_message`` in a loop until END; prints one
JSON line: the appends that completed inside the window (``counted``), every append this process
made (``appended``, the warm-up included), the process's CPU seconds in the window, and its store
actor's batches and commands (how many appends shared a commit).

``appender`` (figure 3): open ``URL``, open namespace ``b`` (not isolated: the store's shared slot,
which namespace ``a`` of the bench process reads), print ``ready``; then for each line ``MARKER``
on stdin append one message whose text starts with MARKER and print its id. Ends at EOF.
"""

from __future__ import annotations

import json
import sys
import time

import trio

import ctxrt


def text(head: str) -> str:
    """A ~200 B chat message starting with ``head``."""
    head = f"{head} "
    return head + "x" * max(0, 200 - len(head))


async def writers(url: str, process: int, tasks: int, shared: bool) -> None:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        manager = await rt.open(f"writer-{process}", isolate=not shared)
        await manager.add_message("user", text(f"p{process} warm-up"))
        appended = 1
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        _, start, end = line.split()
        start_at, end_at = float(start), float(end)
        await trio.sleep(max(0.0, start_at - time.monotonic()))
        before = rt.statistics()
        cpu = time.process_time()
        counted = 0

        async def writer(task: int) -> None:
            nonlocal appended, counted
            n = 0
            while time.monotonic() < end_at:
                await manager.add_message("user", text(f"p{process} t{task} m{n}"))
                n += 1
                appended += 1
                if time.monotonic() <= end_at:
                    counted += 1

        async with trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(writer, task)
        cpu = time.process_time() - cpu
        after = rt.statistics()
        print(json.dumps({
            "process": process, "counted": counted, "appended": appended, "cpu_s": cpu,
            "batches": after.batches - before.batches, "commands": after.commands - before.commands,
        }), flush=True)


async def appender(url: str) -> None:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        manager = await rt.open("b")
        print("ready", flush=True)
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            message_id = await manager.add_message("user", text(line.strip()))
            print(message_id, flush=True)


def main(argv: list[str]) -> None:
    url, mode = argv[0], argv[1]
    if mode == "writers":
        trio.run(writers, url, int(argv[2]), int(argv[3]), argv[4:] == ["shared"])
    elif mode == "appender":
        trio.run(appender, url)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
