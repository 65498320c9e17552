"""Attack (issue 35): a stalled disk (fsfreeze) under the lone path. Root only: an ext4 image in
/dev/shm (so the flush measures fast and the lone path runs) on a loop device.

    python attack/stall.py SEED ROUNDS

Each round draws a host (trio, asyncio.run, run_until_complete) and a scenario:
- "sigint": the main task's append waits on the frozen disk; a ticker task must keep running
  (its longest gap is reported); a real SIGINT then; a timer thaws the disk: the run ends in a
  bare KeyboardInterrupt after the thaw, the writer thread stopped;
- "cancel": the main task's append gives up at a timeout while frozen (it must leave before the
  thaw), a second one gives up too (through the actor, parked behind the first's landing), then
  the disk thaws and later appends land.
Then: the store sound, every acknowledged append stored (and both given-up appends, which were
sent: K9).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio

import ctxrt
import ctxrt.aio
from ctxrt.testing import verify_store

THAW_S = 1.0


class Disk:
    def __init__(self, base: Path) -> None:
        self.image, self.mount = base / "disk.img", base / "mnt"
        self.mount.mkdir()
        with self.image.open("wb") as out:
            out.truncate(32 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", *(["-O", "^has_journal"] if os.environ.get("NOJOURNAL") else []), str(self.image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mount)], check=True)
        self.frozen = False
        self.thawed_at = 0.0
        self.lock = threading.Lock()

    def freeze(self) -> None:
        subprocess.run(["fsfreeze", "-f", str(self.mount)], check=True)
        self.frozen = True
        threading.Timer(THAW_S, self.thaw).start()

    def thaw(self) -> None:
        with self.lock:
            if self.frozen:
                self.frozen = False
                self.thawed_at = time.monotonic()  # before: a commit may land as the thaw starts
                subprocess.run(["fsfreeze", "-u", str(self.mount)], check=True)

    def remove(self) -> None:
        self.thaw()
        if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.mount)], check=False)


class State:
    def __init__(self) -> None:
        self.acks: list[str] = []
        self.sent: list[str] = []  # texts of appends that gave up
        self.longest_gap = 0.0
        self.left_at: list[float] = []


async def ticker(state: State, until: float) -> None:
    last = time.monotonic()
    while time.monotonic() < until:
        await trio.sleep(0.001)
        now = time.monotonic()
        state.longest_gap = max(state.longest_gap, now - last)
        last = now


async def aio_ticker(state: State, until: float) -> None:
    last = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(0.001)
        now = time.monotonic()
        state.longest_gap = max(state.longest_gap, now - last)
        last = now


async def body(manager: Any, disk: Disk, scenario: str, state: State, spawn: Any, timeout: Any) -> None:
    for number in range(10):
        state.acks.append(await manager.add_message("user", f"warm {number}"))
    disk.freeze()
    if scenario == "sigint":
        spawn(state)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        state.acks.append(await manager.add_message("user", "while frozen"))
        raise AssertionError("answered while frozen")
    for number in range(2):
        text = f"gave up {number}"
        state.sent.append(text)
        started = time.monotonic()
        if await timeout(0.2, manager.add_message("user", text)):
            raise AssertionError("answered while frozen")
        state.left_at.append(time.monotonic() - started)
    for number in range(5):
        state.acks.append(await manager.add_message("user", f"after {number}"))


async def trio_host(path: Path, disk: Disk, scenario: str, state: State) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        manager = await runtime.open("agents/a0")
        async with trio.open_nursery() as nursery:
            async def timeout(seconds: float, call: Any) -> bool:
                with trio.move_on_after(seconds):
                    await call
                    return True
                return False

            await body(manager, disk, scenario, state,
                       lambda state: nursery.start_soon(ticker, state, time.monotonic() + 0.3), timeout)


async def aio_host(path: Path, disk: Disk, scenario: str, state: State) -> None:
    async with ctxrt.aio.open_runtime(path) as runtime:
        manager = await runtime.open("agents/a0")
        tasks = []

        async def timeout(seconds: float, call: Any) -> bool:
            try:
                await asyncio.wait_for(call, seconds)
            except TimeoutError:
                return False
            return True

        await body(manager, disk, scenario, state,
                   lambda state: tasks.append(asyncio.ensure_future(aio_ticker(state, time.monotonic() + 0.3))),
                   timeout)


def run(how: str, path: Path, disk: Disk, scenario: str, state: State) -> None:
    if how == "trio":
        trio.run(trio_host, path, disk, scenario, state)
    elif how == "asyncio.run":
        asyncio.run(aio_host(path, disk, scenario, state))
    else:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(aio_host(path, disk, scenario, state))
        finally:
            loop.close()


async def stored(path: Path, state: State) -> list[str]:
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        reader = await runtime.open("agents/a0")
        lost = [message_id for message_id in state.acks if await reader.get_message(message_id) is None]
        texts = {m.content[0].text for m in await reader.query_messages(limit=1000)}
        lost += [text for text in state.sent if text not in texts]
    return lost


def main() -> int:
    seed, rounds = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    failures = 0
    for number in range(rounds):
        how = rng.choice(("trio", "asyncio.run", "run_until_complete"))
        scenario = rng.choice(("sigint", "cancel"))
        base = Path(tempfile.mkdtemp(prefix="attcm-s-", dir="/dev/shm"))
        disk = Disk(base)
        state = State()
        problems = []
        raised = None
        faulthandler.dump_traceback_later(60, exit=True)
        started = time.monotonic()
        try:
            run(how, disk.mount / "store", disk, scenario, state)
        except BaseException as exc:  # noqa: BLE001
            raised = exc
        ended = time.monotonic()
        faulthandler.cancel_dump_traceback_later()
        if scenario == "sigint":
            if type(raised) is not KeyboardInterrupt:
                problems.append(f"raised {raised!r}")
            if disk.thawed_at == 0 or ended < disk.thawed_at:
                problems.append("ended before the thaw")
        else:
            if raised is not None:
                problems.append(f"raised {raised!r}")
            if any(left > 0.6 for left in state.left_at):
                problems.append(f"gave up late: {state.left_at}")
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            problems.append("SIGINT handler changed")
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if [t for t in threading.enumerate() if t.name == "ctxrt-store-writer"]:
            problems.append("writer thread alive")
        disk.thaw()
        report = verify_store(disk.mount / "store")
        if report.status != "sound":
            problems.append(f"verify {report}")
        else:
            lost = trio.run(stored, disk.mount / "store", state)
            if lost:
                problems.append(f"lost {lost}")
        del raised
        if problems:
            failures += 1
        status = "FAIL " + "; ".join(problems) if problems else "ok"
        print(f"{status} round {number} {how} {scenario} acks {len(state.acks)} longest tick gap"
              f" {state.longest_gap * 1000:.1f}ms left {[round(x, 2) for x in state.left_at]}"
              f" took {ended - started:.2f}s (seed {seed})", flush=True)
        disk.remove()
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {rounds} rounds, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
