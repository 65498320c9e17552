"""A host process for tests/test_postgres_lease.py: one writing runtime on a PostgreSQL store (through
a pooler or not), driven line by line on stdin, answering one JSON line each on stdout.

argv: url, lease_ms (the engine's lease length: the module's default, set before the open).
Lines: ``take`` (open ``agents/a`` with a strategy that keeps its memory: held or refused; the
first holder adds four messages), ``pin K`` (pin the K-th message: a strategy write), ``close``.
"""

from __future__ import annotations

import json
import sys

import trio

import ctxrt
import ctxrt.store.postgres

NAMESPACE = "agents/a"


def say(**answer: object) -> None:
    print(json.dumps(answer), flush=True)


async def main(url: str) -> None:
    async with ctxrt.open_runtime(url) as rt:
        say(ready=True)
        manager = None
        while True:
            line = (await trio.to_thread.run_sync(sys.stdin.readline)).split()
            if not line or line[0] == "close":
                break
            if line[0] == "take":
                try:
                    manager = await rt.open(NAMESPACE, strategy=ctxrt.Autobiographical("claude-haiku-4-5"))
                except ctxrt.ConfigConflictError:
                    say(held=False)
                    continue
                if await manager.message_count() == 0:
                    for n in range(4):
                        await manager.add_message("user", f"line {n}")
                say(held=True)
            elif line[0] == "pin":
                assert manager is not None
                ids = [m.id for m in await manager.get_all_messages()]
                try:
                    pinned = await manager.pin_range(ids[int(line[1])], ids[int(line[1])])
                except ctxrt.CtxrtError as exc:
                    say(error=type(exc).__name__, message=str(exc))
                else:
                    say(pinned=str(pinned))
    say(closed=True)


if __name__ == "__main__":
    ctxrt.store.postgres.LEASE_MS = int(sys.argv[2])
    trio.run(main, sys.argv[1])
