"""A host process for the PostgreSQL outage test: ``residents`` residents in one runtime on ``url``,
each serving its own auto-ticking Autobiographical namespace, adding and compiling in a loop
while the test stops and starts the server. Prints one JSON line per event:

- ``{"ready": ...}`` once every resident compiled;
- ``{"waiting": [...]}`` once every resident, its calls failing with StoreUnavailableError, heard
  from ``health()`` what its namespace waits for (the ``waiting_for`` of each);
- ``{"recovered": ...}`` once every resident that waited compiled again, its health waiting for
  nothing (then the next outage is reported the same way);
- ``{"compressed": ...}`` at the first compression request after each recovery;
- nothing when "quiet" comes: the residents stop adding (they go on compiling);
- ``{"stats": [...]}`` when "stats" comes on stdin: each resident's health (pending units, model calls
  in flight, waiting_for, strategy_error) and the model's requests so far;
- ``{"done": ...}`` when "stop" comes on stdin: what each resident's calls raised besides the outage's.

(tests/pg_outage_resident.py with the "stats" line, for attack/outage_cycles.py.)
"""

from __future__ import annotations

import json
import sys

import trio

import ctxrt
from ctxrt.testing import ScriptedModel


def memory() -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical("test-model", target_chunk_tokens=60, recent_window_tokens=0, head_window_tokens=0,
                                  l1_holdback_chunks=0, auto_tick=True)


async def main(url: str, process: int, residents: int) -> None:
    def summarise(request: ctxrt.ModelRequest) -> str:
        changed.set()
        return "what happened, in short " * 10

    model = ScriptedModel(summarise, delay_s=0.005)
    waited: dict[int, str] = {}
    recovered: set[int] = set()
    compiled: set[int] = set()
    unexpected: list[str] = []
    stop = trio.Event()
    quiet = trio.Event()  # set by "quiet": the residents only compile (their pending work drains)
    changed = trio.Event()

    async def resident(number: int, manager: ctxrt.ContextManager) -> None:
        line = 0
        while not stop.is_set():
            try:
                if not quiet.is_set():
                    await manager.add_message("user", f"p{process} r{number} line {line}: " + "word " * 15)
                await manager.compile()
            except ctxrt.StoreUnavailableError:
                if number not in waited:
                    health = await manager.health()  # answered during the outage
                    if health.waiting_for is not None:
                        waited[number] = health.waiting_for
                        changed.set()
            except ctxrt.CtxrtError as exc:  # a refused start (StrategyRefusedError) among them
                unexpected.append(f"r{number}: {exc!r}"[:300])
            else:
                line += 1
                if number in waited and number not in recovered:
                    if (await manager.health()).waiting_for is None:
                        recovered.add(number)
                        changed.set()
                if number not in compiled:
                    compiled.add(number)
                    changed.set()
            await trio.sleep(0.005)

    async def report() -> None:
        nonlocal changed
        said: set[str] = set()
        calls: int | None = None  # the model's requests when the namespaces last recovered
        while not stop.is_set():
            await changed.wait()
            changed = trio.Event()
            if "ready" not in said and len(compiled) == residents:
                said.add("ready")
                print(json.dumps({"ready": process}), flush=True)
            if "waiting" not in said and len(waited) == residents:
                said.add("waiting")
                print(json.dumps({"waiting": sorted(waited.values())}), flush=True)
            if "waiting" in said and recovered == set(waited):
                print(json.dumps({"recovered": process}), flush=True)
                said.discard("waiting")  # ready for the next outage
                waited.clear()
                recovered.clear()
                said.discard("compressed")
                calls = len(model.requests)
            if calls is not None and "compressed" not in said and len(model.requests) > calls:
                said.add("compressed")
                print(json.dumps({"compressed": process}), flush=True)

    async def wait_for_stop() -> None:
        while (line := (await trio.to_thread.run_sync(sys.stdin.readline)).strip()) in ("stats", "quiet"):
            if line == "quiet":
                quiet.set()
                continue
            healths = [await manager.health() for manager in managers]
            print(json.dumps({"stats": [[h.pending_units, h.in_flight_model_calls, h.waiting_for, h.strategy_error]
                                        for h in healths], "requests": len(model.requests)}), flush=True)
        stop.set()
        changed.set()

    async with ctxrt.open_runtime(url, model=model) as rt:
        managers = [await rt.open(f"p{process}-r{number}", strategy=memory(), view_reader=f"p{process}")
                    for number in range(residents)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report)
            nursery.start_soon(wait_for_stop)
            for number, manager in enumerate(managers):
                nursery.start_soon(resident, number, manager)
        print(json.dumps({"done": process, "unexpected": unexpected}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
