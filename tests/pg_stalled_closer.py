"""A host process for tests/test_postgres_committer.py: a runtime on a PostgreSQL store whose
server the test stalls (SIGSTOP) while an append's batch is out, then closed by the host or by a
Ctrl-C.

argv: url, mode ("close": the append's caller cancelled, then the block ends; "interrupt": a real
SIGINT while the append is out; "read": a compile, whose reads the server doesn't answer, then the
block ends; "fork": as "close" with a fork out, a call the runtime shields from its caller's
cancel; "lease": as "close", the namespace's strategy keeping its memory there, so its actor
holds a lease it gives back at its stop), and the engine's close, read and batch bounds in seconds (its defaults, set before the
open: CLOSE_BATCH_S, READ_CUT_S, BATCH_CUT_S). Prints one JSON line per step: ``ready`` (after a first append), then,
once the test wrote a line on stdin, ``compiled`` (or ``unavailable``) with its seconds in mode
"read", and ``closing`` once the stalled append (or fork) is out, ``unavailable`` if the fork
raised StoreUnavailableError; at the end ``closed`` or
``interrupted``, with the seconds since ``closing``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import trio

import ctxrt
import ctxrt.store.postgres
from ctxrt.testing import ScriptedModel


CLOSING: list[float] = []  # when the close began (monotonic)


def say(**answer: object) -> None:
    print(json.dumps(answer), flush=True)


async def fork(manager: ctxrt.ContextManager) -> None:
    try:
        await manager.fork()
    except ctxrt.StoreUnavailableError as exc:
        say(unavailable=str(exc))


async def main(url: str, mode: str) -> None:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        # A strategy that keeps its memory in the store: the namespace holds a lease (K12).
        strategy = ctxrt.Autobiographical("m") if mode == "lease" else None
        manager = await rt.open("ann", isolate=True, strategy=strategy, model=ScriptedModel(lambda _: "summary"))
        await manager.add_message("user", "warm")
        say(ready=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        if mode == "read":
            began = time.monotonic()
            try:
                await manager.compile(ctxrt.Budget(max_tokens=10_000))
                say(compiled=True, seconds=time.monotonic() - began)
            except ctxrt.StoreUnavailableError as exc:
                say(unavailable=str(exc), seconds=time.monotonic() - began)
            say(closing=True)
            CLOSING.append(time.monotonic())
            return
        async with trio.open_nursery() as nursery:
            if mode == "fork":
                nursery.start_soon(fork, manager)
            else:
                nursery.start_soon(manager.add_message, "user", "stalled")
            await trio.sleep(0.3)  # the batch is out: the server doesn't answer
            say(closing=True)
            CLOSING.append(time.monotonic())
            if mode == "interrupt":
                os.kill(os.getpid(), signal.SIGINT)
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()  # its caller leaves; the batch stays out


if __name__ == "__main__":
    ctxrt.store.postgres.CLOSE_BATCH_S = float(sys.argv[3])
    ctxrt.store.postgres.READ_CUT_S = float(sys.argv[4])
    ctxrt.store.postgres.BATCH_CUT_S = float(sys.argv[5])
    try:
        trio.run(main, sys.argv[1], sys.argv[2])
    except KeyboardInterrupt:
        say(interrupted=True, seconds=time.monotonic() - CLOSING[0])
        sys.exit(130)
    say(closed=True, seconds=time.monotonic() - CLOSING[0])
