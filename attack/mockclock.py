"""Attack (issue 35): appenders under deadlines on trio's MockClock with autojump, so a deadline
fires the moment every task is blocked: while a lone caller's commit is out, while the actor's
batch is out, while a landing runs.

    python attack/mockclock.py WHERE SEED ROUNDS

Checks as attack/deadline.py: no error, each appender's last append (no deadline) lands, the
runtime closes, the store sound, every acknowledged append stored.
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
import trio.testing

from ctxrt.testing import verify_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deadline import LANDINGS, lost_acks  # noqa: E402

import ctxrt  # noqa: E402


async def host(path: Path, tasks: int, rng: random.Random, acks: list[tuple[int, str]], gave_up: list[int]) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(tasks)]

        async def append(who: int) -> None:
            for number in range(60):
                with trio.move_on_after(rng.choice((0.5, 1.0, 5.0, float("inf")))) as scope:
                    acks.append((who, await managers[who].add_message("user", f"{who} {number}")))
                if scope.cancelled_caught:
                    gave_up[0] += 1
            acks.append((who, await managers[who].add_message("user", f"{who} last")))

        async with trio.open_nursery() as nursery:
            for who in range(1, tasks):
                nursery.start_soon(append, who)
            await append(0)


def main() -> int:
    where, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="attcm-mc-", dir="/dev/shm" if where == "shm" else "/tmp"))
    failures = 0
    try:
        for number in range(rounds):
            tasks = rng.randint(1, 3)
            path = base / f"s{number}"
            acks: list[tuple[int, str]] = []
            gave_up = [0]
            LANDINGS[0] = 0
            problems: list[Any] = []
            faulthandler.dump_traceback_later(120, exit=True)
            try:
                trio.run(host, path, tasks, rng, acks, gave_up, clock=trio.testing.MockClock(autojump_threshold=0))
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
