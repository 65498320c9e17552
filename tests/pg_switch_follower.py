"""A host process for the switch-following test (R4): one manager on main of the PostgreSQL store
at ``url`` compiles without pause while the test's runtime switches main and "undo" back and forth.
Every compile must read one branch whole (main's every message, or undo's first ``kept``); it
prints a JSON line each time its compiles change branch, and a summary once stdin says stop."""

from __future__ import annotations

import json
import sys

import trio

import ctxrt

BUDGET = ctxrt.Budget(max_tokens=100_000, reserve_for_response=0)


async def main(url: str, ids: list[str], kept: int) -> None:
    async with ctxrt.open_runtime(url) as rt:
        manager = await rt.open("follower")
        stop = trio.Event()
        compiles, mixed, branch = 0, [], None

        async def wait_for_stop() -> None:
            await trio.to_thread.run_sync(sys.stdin.readline)
            stop.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_stop)
            while not stop.is_set():
                result = await manager.compile(BUDGET)
                compiles += 1
                shown = [s.id for sources in result.provenance.messages for s in sources if s.kind == "message"]
                if shown != (ids if result.provenance.branch == "main" else ids[:kept]):
                    mixed.append([result.provenance.branch, shown])
                if result.provenance.branch != branch:
                    branch = result.provenance.branch
                    print(json.dumps({"branch": branch}), flush=True)
        final = (await manager.compile(BUDGET)).provenance.branch
        print(json.dumps({"compiles": compiles, "mixed": mixed, "final": final, "manager": manager.branch}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
