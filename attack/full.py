"""Attack (issue 35): a map that fills during a lone commit, and a full disk (a small tmpfs).

    python attack/full.py map SEED ROUNDS     # small map_size on /dev/shm: growth
    python attack/full.py disk SEED ROUNDS    # a 1 MiB tmpfs mounted for the round (root)

Appends of drawn sizes from the main task (and, in half the rounds, two child tasks at once).
Every append must be acknowledged or refused with StoreFullError (never anything else, never a
hang); on the full disk, once refused, the tmpfs is grown and later appends must land. Then the
store verifies sound and every acknowledged append is stored.
"""

from __future__ import annotations

import faulthandler
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.errors import StoreFullError
from ctxrt.testing import verify_store


class Round:
    def __init__(self) -> None:
        self.acks: list[tuple[int, str]] = []
        self.refused = 0
        self.other: list[BaseException] = []
        self.after_growth = 0


async def host(path: Path, rng: random.Random, mode: str, tasks: int, mount: Path | None, state: Round) -> None:
    map_size = 64 << 10 if mode == "map" else 1 << 30
    async with ctxrt.open_runtime(path, map_size=map_size) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(tasks)]
        grown = trio.Event()

        async def append(who: int, count: int) -> None:
            for number in range(count):
                text = f"{who}-{number} " + "x" * rng.randint(10, 60_000)
                try:
                    message_id = await managers[who].add_message("user", text)
                except StoreFullError:
                    state.refused += 1
                    if mount is not None and not grown.is_set() and state.refused >= 3:  # refused again first
                        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
                        grown.set()
                    continue
                except Exception as exc:  # noqa: BLE001
                    state.other.append(exc)
                    continue
                state.acks.append((who, message_id))
                if grown.is_set():
                    state.after_growth += 1

        async with trio.open_nursery() as nursery:
            for who in range(1, tasks):
                nursery.start_soon(append, who, 30)
            await append(0, 60)


async def lost_acks(path: Path, state: Round) -> list[Any]:
    lost = []
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        readers: dict[int, Any] = {}
        for who, message_id in state.acks:
            if who not in readers:
                readers[who] = await runtime.open(f"agents/a{who}")
            if await readers[who].get_message(message_id) is None:
                lost.append((who, message_id))
    return lost


def main() -> int:
    mode, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    failures = 0
    base = Path(tempfile.mkdtemp(prefix="attcm-f-", dir="/dev/shm" if mode == "map" else "/tmp"))
    try:
        for number in range(rounds):
            tasks = rng.choice((1, 3))
            mount = None
            if mode == "disk":
                mount = base / f"m{number}"
                mount.mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
                path = mount / "store"
            else:
                path = base / f"s{number}"
            state = Round()
            problems = []
            faulthandler.dump_traceback_later(120, exit=True)
            try:
                trio.run(host, path, rng, mode, tasks, mount, state)
            except BaseException as exc:  # noqa: BLE001
                problems.append(f"raised {exc!r}")
            faulthandler.cancel_dump_traceback_later()
            if state.other:
                problems.append(f"other errors {state.other[:3]!r}")
            if mode == "disk" and state.refused and not state.after_growth:
                problems.append("nothing landed after the disk grew")
            report = verify_store(path)
            if report.status != "sound":
                problems.append(f"verify: {report}")
            else:
                lost = trio.run(lost_acks, path, state)
                if lost:
                    problems.append(f"lost {len(lost)}: {lost[:3]}")
            if problems:
                failures += 1
            status = "FAIL " + "; ".join(problems) if problems else "ok"
            print(f"{status} round {number} tasks {tasks} acks {len(state.acks)} refused {state.refused}"
                  f" after growth {state.after_growth} ({mode} seed {seed})", flush=True)
            if mount is not None:
                subprocess.run(["umount", str(mount)], check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {rounds} rounds, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
