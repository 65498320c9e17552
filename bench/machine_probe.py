"""The measuring side of ``bench/machine.py``: one ctxrt version, driven command by command over stdin.

    python bench/machine_probe.py STORE_DIR MESSAGES   (with PYTHONPATH naming the ctxrt to measure)

Run once per version (the namespace actor before issue 25 and the current one), so the parent can
interleave the two processes measure by measure. Public API only.

Set-up: a store at STORE_DIR whose isolated namespace "ns" holds MESSAGES messages (built with
durability "os", 500 concurrent appends), reopened with durability "sync"; two managers of "ns",
the compiler and the editor (siblings: one namespace actor); an isolated namespace "appender" and
100 managers of "crowd" for the durable appends. Then it prints one JSON line
``{"ready": ..., "ctxrt": <path of the ctxrt it imported>, "design": "previous"|"current"}`` and
answers each command line with one JSON line ``{"figures": [...]}``:

- ``quiet N``: N times, the editor edits the newest message (awaited), then the compiler compiles
  (20,000-token budget): µs of each compile, right after an edit with nothing in flight;
- ``busy N``: while the editor edits the newest message in a loop, N compiles each after a random
  pause of up to 2 ms (so they land anywhere in an edit's cycle): µs of each;
- ``warm N``: µs of each of N compiles with no edit;
- ``add N``: µs of each of N durable ``add_message`` calls to "appender", one at a time;
- ``crowd N``: appends/s of 100 concurrent callers making N durable appends in all;
- ``quit``: close the runtime and exit.

Every command starts with a full ``gc.collect()``. Only this JSON goes to stdout.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import random
import sys
import time

from probe_io import fill, reply, text  # noqa: E402 (bench/ is still on the path here, and probe_io imports no ctxrt)

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # bench/ itself: its other modules are no business of the version measured here

import trio

import ctxrt

BUDGET = ctxrt.Budget(max_tokens=20_000)
CROWD = 100
PAUSE_S = 0.002




async def _build(directory: str, count: int) -> None:
    async with ctxrt.open_runtime(directory, durability="os") as rt:
        ns = await rt.open("ns", isolate=True)
        await fill(ns, count)


async def _timed_compile(compiler: ctxrt.ContextManager) -> float:
    started = time.perf_counter_ns()
    await compiler.compile(BUDGET)
    return (time.perf_counter_ns() - started) / 1000


async def main(directory: str, count: int) -> None:
    await _build(directory, count)
    rng = random.Random(25)
    async with ctxrt.open_runtime(directory, durability="sync") as rt:
        compiler = await rt.open("ns", isolate=True)
        editor = await rt.open("ns", isolate=True)
        appender = await rt.open("appender", isolate=True)
        crowd = [await rt.open("crowd", isolate=True) for _ in range(CROWD)]
        target = (await compiler.get_message_window(-1, 1)).messages[0].id
        for _ in range(3):
            await compiler.compile(BUDGET)
        edits = 0

        async def edit() -> None:
            nonlocal edits
            edits += 1
            await editor.edit_message(target, text(edits))

        design = "current" if importlib.util.find_spec("ctxrt.namespace.machine") else "previous"
        reply({"ready": True, "ctxrt": os.path.dirname(os.path.abspath(ctxrt.__file__)), "design": design})

        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                break
            command, number = words[0], int(words[1])
            gc.collect()
            figures: list[float] = []
            if command == "quiet":
                for _ in range(number):
                    await edit()
                    figures.append(await _timed_compile(compiler))
            elif command == "busy":
                async with trio.open_nursery() as nursery:
                    async def edit_forever() -> None:
                        while True:
                            await edit()

                    nursery.start_soon(edit_forever)
                    for _ in range(number):
                        await trio.sleep(rng.uniform(0, PAUSE_S))
                        figures.append(await _timed_compile(compiler))
                    nursery.cancel_scope.cancel()
            elif command == "warm":
                for _ in range(number):
                    figures.append(await _timed_compile(compiler))
            elif command == "add":
                for n in range(number):
                    started = time.perf_counter_ns()
                    await appender.add_message("user", text(n))
                    figures.append((time.perf_counter_ns() - started) / 1000)
            elif command == "crowd":
                each = max(1, number // CROWD)

                async def append(manager: ctxrt.ContextManager) -> None:
                    for n in range(each):
                        await manager.add_message("user", text(n))

                started = time.perf_counter_ns()
                async with trio.open_nursery() as nursery:
                    for manager in crowd:
                        nursery.start_soon(append, manager)
                figures.append(each * CROWD / ((time.perf_counter_ns() - started) / 1e9))
            else:
                reply({"error": f"unknown command {command!r}"})
                continue
            reply({"figures": figures})


if __name__ == "__main__":
    try:
        trio.run(main, sys.argv[1], int(sys.argv[2]))
    except Exception as exc:  # the parent reads this line and reports it
        reply({"error": f"{type(exc).__name__}: {exc}"})
        raise
