"""Attack (issue 35): SIGKILL a process appending durably in its main task (the lone path on
/dev/shm) at a random moment, many rounds.

    python attack/kill.py WHERE SEED ROUNDS

Each round: a child process (``child`` mode) appends without end on a fresh store, printing each
acknowledged id; after a drawn number of acks plus a drawn delay (0-5 ms) it gets SIGKILL. Checks:
the store verifies sound, every acknowledged append is stored, and a new writer appends to it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import ctxrt
from ctxrt.testing import verify_store


async def child(path: str, tasks: int) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(tasks)]

        async def append(who: int) -> None:
            number = 0
            while True:
                message_id = await managers[who].add_message("user", f"{who} line {number}")
                os.write(1, f"{who} {message_id}\n".encode())
                number += 1

        async with trio.open_nursery() as nursery:
            for who in range(1, tasks):
                nursery.start_soon(append, who)
            await append(0)


async def check(path: Path, acks: list[tuple[int, str]]) -> list[tuple[int, str]]:
    lost = []
    async with ctxrt.open_runtime(path) as runtime:
        readers = {}
        for who, message_id in acks:
            if who not in readers:
                readers[who] = await runtime.open(f"agents/a{who}")
            if await readers[who].get_message(message_id) is None:
                lost.append((who, message_id))
        later = await runtime.open("agents/a0")
        await later.add_message("user", "after the kill")
    return lost


def main() -> int:
    if sys.argv[1] == "child":
        trio.run(child, sys.argv[2], int(sys.argv[3]))
        return 0
    where, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="attcm-k-", dir="/dev/shm" if where == "shm" else "/tmp"))
    failures = 0
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    try:
        for number in range(rounds):
            path = base / f"s{number}"
            tasks = rng.choice((1, 1, 2, 3))
            wanted, delay = rng.randint(1, 60), rng.uniform(0, 0.005)
            proc = subprocess.Popen([sys.executable, __file__, "child", str(path), str(tasks)],
                                    stdout=subprocess.PIPE, env=env)
            assert proc.stdout is not None
            acks: list[tuple[int, str]] = []
            while len(acks) < wanted:
                line = proc.stdout.readline()
                if not line:
                    break
                who, message_id = line.split()
                acks.append((int(who), message_id.decode()))
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            rest, _ = proc.communicate()
            for line in rest.splitlines():  # acknowledged before the kill landed
                who, message_id = line.split()
                acks.append((int(who), message_id.decode()))
            problems = []
            if not (path / "data.mdb").exists():
                problems.append("no store")
            else:
                report = verify_store(path)
                if report.status != "sound":
                    problems.append(f"verify: {report}")
                else:
                    lost = trio.run(check, path, acks)
                    if lost:
                        problems.append(f"lost {len(lost)}: {lost[:3]}")
                    report = verify_store(path)
                    if report.status != "sound":
                        problems.append(f"verify after a later append: {report}")
            if problems:
                failures += 1
            status = "FAIL " + "; ".join(problems) if problems else "ok"
            print(f"{status} round {number} tasks {tasks} acks {len(acks)} delay {delay * 1000:.2f}ms ({where} seed {seed})",
                  flush=True)
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {rounds} rounds, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
