"""A host process for tests/test_postgres_processes.py: tasks that race other processes to create and
delete branches of shared names, append and edit there and on main, and fork. Prints one JSON line:
how many operations were acknowledged, and every error other than the expected refusals."""

from __future__ import annotations

import json
import random
import sys
import time

import trio

import ctxrt

EXPECTED = (ctxrt.BranchExistsError, ctxrt.BranchNotFoundError)  # the races' own refusals


async def main(url: str, process: int, seconds: float) -> None:
    rng = random.Random(process)
    acknowledged = 0
    unexpected: list[str] = []
    async with ctxrt.open_runtime(url) as rt:

        async def racer(number: int, deadline: float) -> None:
            nonlocal acknowledged
            main_manager = await rt.open(f"main-p{process}-{number}")
            while time.monotonic() < deadline:
                name = f"shared{rng.randrange(3)}"
                try:
                    roll = rng.random()
                    if roll < 0.3:
                        await rt.create_branch(name)
                        side = await rt.open(f"side-p{process}-{number}", branch=name)
                        first = await side.add_message("user", f"p{process} on {name}")
                        await side.edit_message(first, f"p{process} edited on {name}")
                        acknowledged += 2
                        if rng.random() < 0.5:
                            await rt.delete_branch(name)
                    elif roll < 0.45:
                        await rt.delete_branch(name)
                    elif roll < 0.55:
                        fork = await main_manager.fork()
                        await main_manager.add_message("user", f"p{process} on {fork}")
                        acknowledged += 1
                        await main_manager.switch_branch("main")
                    else:
                        await main_manager.add_message("user", f"p{process} main")
                        acknowledged += 1
                except EXPECTED:
                    pass
                except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on any
                    unexpected.append(f"{type(exc).__name__}: {exc}")

        deadline = time.monotonic() + seconds
        async with trio.open_nursery() as nursery:
            for number in range(4):
                nursery.start_soon(racer, number, deadline)
    print(json.dumps({"acknowledged": acknowledged, "unexpected": unexpected[:20]}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
