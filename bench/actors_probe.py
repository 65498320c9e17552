"""The measuring side of ``bench/actors.py``: one ctxrt version, driven command by command over stdin.

    python bench/actors_probe.py STORE_DIR MESSAGES   (with PYTHONPATH naming the ctxrt to measure)

Run once per version (the previous design and the current one), so the parent can interleave the
two processes measure by measure. It uses only the public API both designs share
(``ctxrt.open_runtime``, ``Runtime.open``, ``add_message``, ``compile``, ``Budget``, the default
Passthrough strategy), except the reader check, which has no public form: there it reaches the
design's own check (internal path; the parent labels it so).

Set-up: a store at STORE_DIR with an isolated namespace "big" holding MESSAGES messages (built with
durability "os", 500 concurrent appends), reopened with durability "sync"; an isolated namespace
"tiny" with one message; an isolated namespace "appender" for the durable appends; an isolated
namespace "ann" claimed by reader ann, with one message. Then it prints one JSON line
``{"ready": ..., "ctxrt": <path of the ctxrt it imported>, "design": "previous"|"current"}`` and
answers each command line with one JSON line:

- ``compile N``: µs of each of N warm Passthrough compiles of "big" (a budget that holds them all);
- ``tiny N``: µs of each of N compiles of "tiny" (a request's round trip through the namespace);
- ``add N``: µs of each of N durable ``add_message`` calls to "appender";
- ``check N K``: ns per reader check, K batches of N checks in a tight loop (internal path);
- ``quit``: close the runtime and exit.

Every command starts with a full ``gc.collect()``, so no command pays for another's garbage.
Only this JSON goes to stdout.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

from probe_io import fill, reply, text  # noqa: E402 (bench/ is still on the path here, and probe_io imports no ctxrt)

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # bench/ itself: its other modules are no business of the version measured here

import trio

import ctxrt

EVERYTHING = ctxrt.Budget(max_tokens=10_000_000, reserve_for_response=0)




async def _build(directory: str, count: int) -> None:
    async with ctxrt.open_runtime(directory, durability="os") as rt:
        big = await rt.open("big", isolate=True)
        await fill(big, count)
        for name, reader in (("tiny", None), ("ann", "ann")):
            manager = await rt.open(name, isolate=True, view_reader=reader)
            await manager.add_message("user", text(0))


def _previous_checks(manager: Any, calls: int) -> float:
    """ns per check of the previous design: ``manager._actor.check("ann")`` in a tight loop (as
    bench/audience.py F1 measured it)."""
    check = manager._actor.check
    started = time.perf_counter_ns()
    for _ in range(calls):
        check("ann")
    return (time.perf_counter_ns() - started) / calls


def _current_checks(record: Any, place: Any, calls: int) -> float:
    """ns per check of the current design: ``check_reader(record, "ann", place)`` in a tight loop,
    on the record the actor holds (read once through ``inspect()``)."""
    from ctxrt.namespace.core import check_reader

    started = time.perf_counter_ns()
    for _ in range(calls):
        check_reader(record, "ann", place)
    return (time.perf_counter_ns() - started) / calls


async def main(directory: str, count: int) -> None:
    await _build(directory, count)
    async with ctxrt.open_runtime(directory, durability="sync") as rt:
        big = await rt.open("big", isolate=True)
        tiny = await rt.open("tiny", isolate=True)
        appender = await rt.open("appender", isolate=True)
        ann = await rt.open("ann", isolate=True, view_reader="ann")
        compiled = await big.compile(EVERYTHING)
        assert len(compiled.messages) == count, (len(compiled.messages), count)
        await tiny.compile(EVERYTHING)
        await ann.compile(EVERYTHING)
        if hasattr(ann, "inspect"):  # the current design: the pure check, on the record the actor holds
            from ctxrt.namespace.core import Place

            design = "current"
            record, place = (await ann.inspect()).record, Place(ann.namespace, ann.branch)
            assert record == "ann", record

            def checks(calls: int) -> float:
                return _current_checks(record, place, calls)
        else:
            design = "previous"

            def checks(calls: int) -> float:
                return _previous_checks(ann, calls)
        checks(1_000)
        appended = 0
        reply({"ready": True, "ctxrt": os.path.dirname(os.path.abspath(ctxrt.__file__)), "design": design})

        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                break
            command, numbers = words[0], [int(w) for w in words[1:]]
            gc.collect()
            figures: list[float] = []
            if command == "compile":
                for _ in range(numbers[0]):
                    started = time.perf_counter_ns()
                    await big.compile(EVERYTHING)
                    figures.append((time.perf_counter_ns() - started) / 1000)
            elif command == "tiny":
                for _ in range(numbers[0]):
                    started = time.perf_counter_ns()
                    await tiny.compile(EVERYTHING)
                    figures.append((time.perf_counter_ns() - started) / 1000)
            elif command == "add":
                for _ in range(numbers[0]):
                    appended += 1
                    started = time.perf_counter_ns()
                    await appender.add_message("user", text(appended))
                    figures.append((time.perf_counter_ns() - started) / 1000)
            elif command == "check":
                calls, batches = numbers
                figures = [checks(calls) for _ in range(batches)]
            else:
                reply({"error": f"unknown command {command!r}"})
                continue
            reply({"figures": figures})
        for manager in (big, tiny, appender, ann):
            await manager.aclose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
