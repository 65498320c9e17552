"""A host process for the lease attacks: one runtime on ``url`` serving the auto-ticking Autobiographical
namespace ``agents/a``, driven by lines on stdin, one JSON line out per event.

argv: url, tag (written into every summary this process's model answers), lease_ms, model_delay_s.
Lines: ``open`` (held or refused), ``add N`` (N messages, then a compile), ``stats``, ``close``.
Events: ``{"calling": n}`` when a compression request reaches the model (before its delay).
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys

import trio

import ctxrt
import ctxrt.store.postgres
from ctxrt.testing import ScriptedModel

NAMESPACE = "agents/a"


COMMAND: list[str] = [""]  # the line being answered, echoed as "cmd"


def say(**answer: object) -> None:
    print(json.dumps({"cmd": COMMAND[0], **answer}), flush=True)


def memory() -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical("test-model", target_chunk_tokens=60, recent_window_tokens=0, head_window_tokens=0,
                                  l1_holdback_chunks=0, auto_tick=True)


async def main(url: str, tag: str, delay_s: float) -> None:
    calls = 0

    async def summarise(request: ctxrt.ModelRequest) -> str:
        nonlocal calls
        calls += 1
        say(calling=calls)
        await trio.sleep(delay_s)
        return f"summary by {tag} #{calls} " + "word " * 10

    model = ScriptedModel(summarise)
    errors: list[str] = []
    async with ctxrt.open_runtime(url, model=model) as rt:
        say(ready=tag)
        manager = None
        line_no = 0
        while True:
            text = await trio.to_thread.run_sync(sys.stdin.readline)
            line = text.split()
            COMMAND[0] = text.strip()
            if not line or line[0] == "close":
                break
            try:
                if line[0] == "open":
                    try:
                        manager = await rt.open(NAMESPACE, strategy=memory())
                    except ctxrt.ConfigConflictError as exc:
                        say(held=False, message=str(exc)[:200])
                        continue
                    say(held=True)
                elif line[0] == "add":
                    assert manager is not None
                    for _ in range(int(line[1])):
                        await manager.add_message("user", f"{tag} line {line_no}: " + "word " * 15)
                        line_no += 1
                    await manager.compile()
                    say(added=int(line[1]))
                elif line[0] == "stats":
                    assert manager is not None
                    health = await manager.health()
                    say(calls=calls, pending=health.pending_units, in_flight=health.in_flight_model_calls,
                        waiting=health.waiting_for, error=health.strategy_error)
            except ctxrt.CtxrtError as exc:
                say(error=type(exc).__name__, message=str(exc)[:300])
    say(closed=True, errors=errors)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it waits, for an attack's report
    ctxrt.store.postgres.LEASE_MS = int(sys.argv[3])
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[4]))
