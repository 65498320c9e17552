"""The measuring side of ``bench/flush.py``: one ctxrt version, driven command by command over stdin.

    python bench/flush_probe.py STORE_DIR MESSAGES   (with PYTHONPATH naming the ctxrt to measure)

Run once per version (the base the change started from, and the current package), so the parent
can interleave the two processes measure by measure. Public API only: ``open_runtime``,
``Runtime.open``, ``add_message``, ``compile``, ``Budget``, the default Passthrough strategy.

Set-up: a store at STORE_DIR whose isolated namespace "big" holds MESSAGES messages (built with
durability "os", 500 concurrent appends), reopened with durability "sync" (the default); isolated
namespaces "w0".."w3" for the appenders and "one" for appends one at a time. Then it prints one
JSON line ``{"ready": ..., "ctxrt": <path of the ctxrt it imported>}`` and answers each command
line with one JSON line ``{"figures": [...]}`` (the first line also says ``"design"``: "current"
if it has the writer thread, else "base"):

- ``quiet N``: µs of each of N compiles of "big" (20,000-token budget), nothing else running;
- ``loaded N K``: the same while K tasks (at most 4) each append durably in a loop to a namespace
  of its own;
- ``timer N``: µs by which each of N ``trio.sleep(0.001)`` overshoots, while one task appends
  durably in a loop; ``idle N``: the same with nothing else running;
- ``add N``: µs of each of N durable ``add_message`` calls, one at a time;
- ``group N C``: appends/s of each of N rounds of C concurrent durable ``add_message`` callers, a
  manager each (group commit);
- ``quit``: close the runtime and exit.

Every command starts with a full ``gc.collect()``. Only this JSON goes to stdout.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import time
from typing import Any

from probe_io import fill, reply, text  # noqa: E402 (bench/ is still on the path here, and probe_io imports no ctxrt)

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # bench/ itself: its other modules are no business of the version measured here

import trio

import ctxrt

BUDGET = ctxrt.Budget(max_tokens=20_000, reserve_for_response=0)
APPENDERS = 4
TIMER_S = 0.001




async def _build(directory: str, count: int) -> None:
    async with ctxrt.open_runtime(directory, durability="os") as rt:
        big = await rt.open("big", isolate=True)
        await fill(big, count)


class Probe:
    def __init__(self, rt: Any, big: Any, one: Any, writers: list[Any]) -> None:
        self.rt, self.big, self.one, self.writers = rt, big, one, writers
        self.appended = 0

    async def compiles(self, count: int) -> list[float]:
        figures = []
        for _ in range(count):
            started = time.perf_counter_ns()
            await self.big.compile(BUDGET)
            figures.append((time.perf_counter_ns() - started) / 1000)
            await trio.lowlevel.checkpoint()
        return figures

    async def _append_until(self, manager: Any, stop: trio.Event) -> None:
        while not stop.is_set():
            self.appended += 1
            await manager.add_message("user", text(self.appended))

    async def loaded(self, count: int, appenders: int) -> list[float]:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for manager in self.writers[:appenders]:
                nursery.start_soon(self._append_until, manager, stop)
            await trio.sleep(0.01)  # the appenders under way
            figures = await self.compiles(count)
            stop.set()
        return figures

    async def timer(self, count: int, appending: bool) -> list[float]:
        stop = trio.Event()
        figures = []
        async with trio.open_nursery() as nursery:
            if appending:
                nursery.start_soon(self._append_until, self.writers[0], stop)
            await trio.sleep(0.01)
            for _ in range(count):
                started = time.perf_counter_ns()
                await trio.sleep(TIMER_S)
                figures.append((time.perf_counter_ns() - started) / 1000 - TIMER_S * 1e6)
            stop.set()
        return figures

    async def add(self, count: int) -> list[float]:
        figures = []
        for _ in range(count):
            self.appended += 1
            started = time.perf_counter_ns()
            await self.one.add_message("user", text(self.appended))
            figures.append((time.perf_counter_ns() - started) / 1000)
        return figures

    async def group(self, rounds: int, callers: int, managers: list[Any]) -> list[float]:
        figures = []
        for _ in range(rounds):
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for manager in managers[:callers]:
                    self.appended += 1
                    nursery.start_soon(manager.add_message, "user", text(self.appended))
            figures.append(callers / (time.perf_counter() - started))
        return figures


async def main(directory: str, count: int) -> None:
    await _build(directory, count)
    async with ctxrt.open_runtime(directory) as rt:
        big = await rt.open("big", isolate=True)
        one = await rt.open("one", isolate=True)
        writers = [await rt.open(f"w{n}", isolate=True) for n in range(APPENDERS)]
        crowd: list[Any] = []
        probe = Probe(rt, big, one, writers)
        await probe.compiles(3)
        await probe.add(3)
        reply({"ready": True, "ctxrt": os.path.dirname(os.path.abspath(ctxrt.__file__)),
                "design": "current" if importlib.util.find_spec("ctxrt.store.writer") else "base"})
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                break
            command, numbers = words[0], [int(w) for w in words[1:]]
            gc.collect()
            if command == "quiet":
                figures = await probe.compiles(numbers[0])
            elif command == "loaded":
                figures = await probe.loaded(numbers[0], numbers[1])
            elif command in ("timer", "idle"):
                figures = await probe.timer(numbers[0], command == "timer")
            elif command == "add":
                figures = await probe.add(numbers[0])
            elif command == "group":
                while len(crowd) < numbers[1]:
                    crowd.append(await rt.open(f"crowd{len(crowd)}"))
                figures = await probe.group(numbers[0], numbers[1], crowd)
            else:
                reply({"error": f"unknown command {command!r}"})
                continue
            reply({"figures": figures})


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
