"""Attack (issue 35): racing appenders under drawn deadlines (real clock), on /dev/shm or /tmp.

    python attack/deadline.py WHERE SEED ROUNDS

Each round: 1-4 tasks (one is the main task) append 150 times each, every append under
``trio.move_on_after`` of a drawn 0-3 ms (a third of them none), so deadlines fall mid lone
commit, mid actor batch and mid landing. Then each task appends once more with no deadline (no
stuck commit), the runtime closes (no hang), the store verifies sound and every acknowledged
append is stored.
"""

from __future__ import annotations

import faulthandler
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.store import committer_lmdb
from ctxrt.testing import verify_store

LANDINGS = [0]
_land = committer_lmdb.DurableCommitter._land


async def _counted_land(self: Any, *args: Any) -> None:
    LANDINGS[0] += 1
    await _land(self, *args)


committer_lmdb.DurableCommitter._land = _counted_land  # type: ignore[method-assign]


async def host(path: Path, tasks: int, rng: random.Random, acks: list[tuple[int, str]], gave_up: list[int]) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(tasks)]

        async def append(who: int) -> None:
            for number in range(150):
                deadline = rng.choice((None, rng.uniform(0, 0.003), rng.uniform(0, 0.0005)))
                with trio.move_on_after(deadline if deadline is not None else float("inf")) as scope:
                    acks.append((who, await managers[who].add_message("user", f"{who} {number}")))
                if scope.cancelled_caught:
                    gave_up[0] += 1
            acks.append((who, await managers[who].add_message("user", f"{who} last")))

        async with trio.open_nursery() as nursery:
            for who in range(1, tasks):
                nursery.start_soon(append, who)
            await append(0)


async def lost_acks(path: Path, acks: list[tuple[int, str]]) -> list[Any]:
    lost = []
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        readers: dict[int, Any] = {}
        for who, message_id in acks:
            if who not in readers:
                readers[who] = await runtime.open(f"agents/a{who}")
            if await readers[who].get_message(message_id) is None:
                lost.append((who, message_id))
    return lost


def main() -> int:
    where, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="attcm-d-", dir="/dev/shm" if where == "shm" else "/tmp"))
    failures = 0
    try:
        for number in range(rounds):
            tasks = rng.randint(1, 4)
            path = base / f"s{number}"
            acks: list[tuple[int, str]] = []
            gave_up = [0]
            LANDINGS[0] = 0
            problems = []
            faulthandler.dump_traceback_later(120, exit=True)
            try:
                trio.run(host, path, tasks, rng, acks, gave_up)
            except BaseException as exc:  # noqa: BLE001
                problems.append(f"raised {exc!r}")
            faulthandler.cancel_dump_traceback_later()
            report = verify_store(path)
            if report.status != "sound":
                problems.append(f"verify {report}")
            else:
                lost = trio.run(lost_acks, path, acks)
                if lost:
                    problems.append(f"lost {len(lost)}: {lost[:3]}")
            if problems:
                failures += 1
            status = "FAIL " + "; ".join(problems) if problems else "ok"
            print(f"{status} round {number} tasks {tasks} acks {len(acks)} gave up {gave_up[0]}"
                  f" landings {LANDINGS[0]} ({where} seed {seed})", flush=True)
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {rounds} rounds, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
