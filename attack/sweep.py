"""Attack (issue 35): a real SIGINT at the k-th time a line of committer_lmdb.py / writer.py runs.

    python attack/sweep.py HOW ROLE WHERE SEED CASES

HOW: trio | asyncio.run | run_until_complete. ROLE: main (the host appends in its main task),
child (a child task appends, main waits), race (three tasks append at once, plus the main one).
WHERE: shm (/dev/shm: fast flush, the lone path) | disk (/tmp). A first traced run counts how often
each line runs (main thread and writer thread); then CASES cases, each a (line, k) drawn from SEED,
on a fresh store: SIGINT at the k-th run of that line. Checks: a bare KeyboardInterrupt, no writer
thread left, the store sound, every acknowledged append stored. A hang dumps every thread and exits.
"""

from __future__ import annotations

import asyncio
import faulthandler
import linecache
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import trio

import ctxrt
import ctxrt.aio
from ctxrt.store import committer_lmdb
from ctxrt.testing import verify_store

LANDINGS = [0]  # system-task landings (a lone commit handed over), counted per case
_land = committer_lmdb.DurableCommitter._land


async def _counted_land(self: Any, *args: Any) -> None:
    LANDINGS[0] += 1
    await _land(self, *args)


committer_lmdb.DurableCommitter._land = _counted_land  # type: ignore[method-assign]

ROOT = str(Path(ctxrt.__file__).parent / "store") + os.sep
FILES = tuple(ROOT + name for name in ("committer_lmdb.py", "writer.py"))
APPENDS = 30
HANG_S = 90
# SMALL_MAP=1: a 64 KiB map and appends of up to 30 KB, so the map fills (and grows) mid lone commit.
SMALL_MAP = bool(os.environ.get("SMALL_MAP"))
MAP = {"map_size": 64 << 10} if SMALL_MAP else {}


class Acks:
    def __init__(self) -> None:
        self.ids: list[tuple[str, str]] = []


async def appender(manager: Any, acks: Acks, who: int, count: int) -> None:
    for number in range(count):
        padding = "x" * ((number * 7919) % 30_000) if SMALL_MAP else ""
        message_id = await manager.add_message("user", f"{who} line {number} {padding}")
        acks.ids.append((f"agents/a{who}", message_id))


async def trio_host(path: Path, role: str, acks: Acks) -> None:
    async with ctxrt.open_runtime(path, **MAP) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(4)]
        if role == "main":
            await appender(managers[0], acks, 0, APPENDS)
        elif role == "child":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(appender, managers[0], acks, 0, APPENDS)
        else:
            async with trio.open_nursery() as nursery:
                for who in range(1, 4):
                    nursery.start_soon(appender, managers[who], acks, who, APPENDS // 3)
                await appender(managers[0], acks, 0, APPENDS // 3)


async def aio_host(path: Path, role: str, acks: Acks) -> None:
    async with ctxrt.aio.open_runtime(path, **MAP) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(4)]
        if role == "main":
            await appender(managers[0], acks, 0, APPENDS)
        elif role == "child":
            await asyncio.create_task(appender(managers[0], acks, 0, APPENDS))
        else:
            await asyncio.gather(*(appender(managers[who], acks, who, APPENDS // 3) for who in range(4)))


def run_host(how: str, role: str, path: Path, acks: Acks) -> None:
    if how == "trio":
        trio.run(trio_host, path, role, acks)
    elif how == "asyncio.run":
        asyncio.run(aio_host(path, role, acks))
    else:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(aio_host(path, role, acks))
        finally:
            loop.close()


def traced(trace: Any, run: Any) -> None:
    sys.settrace(trace)
    threading.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]


def discover(how: str, role: str, path: Path) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if filename not in FILES:
            return None if event == "call" else trace
        if event == "line" and linecache.getline(filename, frame.f_lineno).strip() != "try:":
            site = (filename, frame.f_lineno)
            counts[site] = counts.get(site, 0) + 1
        return trace

    traced(trace, lambda: run_host(how, role, path, Acks()))
    return counts


def interrupt_at(how: str, role: str, site: tuple[str, int], k: int, path: Path) -> tuple[Any, bool, Acks]:
    sent = False
    seen = 0
    acks = Acks()

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal sent, seen
        if sent:
            return None
        if frame.f_code.co_filename not in FILES:
            return None if event == "call" else trace
        if event == "line" and (frame.f_code.co_filename, frame.f_lineno) == site:
            seen += 1
            if seen == k:
                sent = True
                os.kill(os.getpid(), signal.SIGINT)
        return trace

    raised = None
    try:
        traced(trace, lambda: run_host(how, role, path, acks))
    except BaseException as exc:  # noqa: BLE001
        raised = exc
    return raised, sent, acks


async def lost_acks(path: Path, acks: Acks) -> list[Any]:
    lost = []
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        for who in range(4):
            ids = [message_id for namespace, message_id in acks.ids if namespace == f"agents/a{who}"]
            if not ids:
                continue
            reader = await runtime.open(f"agents/a{who}")
            for message_id in ids:
                if await reader.get_message(message_id) is None:
                    lost.append((who, message_id))
    return lost


def writers_alive() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "ctxrt-store-writer" and thread.is_alive()]


def main() -> int:
    how, role, where, seed, cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    base = Path(tempfile.mkdtemp(prefix="attcm-", dir="/dev/shm" if where == "shm" else "/tmp"))
    failures = 0
    try:
        faulthandler.dump_traceback_later(HANG_S * 3, exit=True)
        counts = discover(how, role, base / "discover")
        faulthandler.cancel_dump_traceback_later()
        rng = random.Random(seed)
        sites = sorted(counts)
        print(f"# {how} {role} {where} seed {seed}: {len(sites)} lines reached", flush=True)
        if os.environ.get("SHOW_COUNTS"):
            for site in sites:
                print(f"{os.path.basename(site[0])}:{site[1]} {counts[site]}", flush=True)
        for number in range(cases):
            site = rng.choice(sites)
            k = rng.randint(1, counts[site])
            where_ = f"{os.path.basename(site[0])}:{site[1]} k={k}/{counts[site]} ({how} {role} {where} seed {seed} case {number})"
            path = base / f"s{number}"
            faulthandler.dump_traceback_later(HANG_S, exit=True)
            started = time.monotonic()
            LANDINGS[0] = 0
            raised, sent, acks = interrupt_at(how, role, site, k, path)
            faulthandler.cancel_dump_traceback_later()
            problems = []
            if not sent:
                if raised is not None:
                    problems.append(f"never reached, raised {raised!r}")
            elif type(raised) is not KeyboardInterrupt:
                problems.append(f"raised {raised!r}")
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                problems.append("SIGINT handler left changed")
                signal.signal(signal.SIGINT, signal.default_int_handler)
            alive = writers_alive()
            if alive:
                problems.append(f"{len(alive)} writer threads alive")
            del raised
            if (path / "data.mdb").exists():
                report = verify_store(path)
                if report.status != "sound":
                    problems.append(f"verify: {report}")
                else:
                    lost = trio.run(lost_acks, path, acks)
                    if lost:
                        problems.append(f"lost {len(lost)} acked: {lost[:3]}")
            elif acks.ids:
                problems.append("acks but no store")
            status = "FAIL " + "; ".join(problems) if problems else "ok"
            if problems:
                failures += 1
            print(f"{status} {where_} sent={sent} acks={len(acks.ids)} landings={LANDINGS[0]} {time.monotonic() - started:.1f}s", flush=True)
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {cases} cases, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
