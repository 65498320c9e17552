"""Attack (issue 35): racing appenders, one cancelled at the k-th time a line of the store's commit
path runs (committer_lmdb.py, writer.py, store/actor.py, mailbox.py), in a trio host.

    python attack/cancel.py WHERE SEED CASES [TASKS]

Each case: TASKS appenders (one of them the main task) append in turn on a fresh store; at the
k-th run of a drawn line (on the trio thread, never inside the scheduler's instrument), the scope
of a drawn appender is cancelled at the scheduler's next step, as another task would (it may be the one running); the appender goes on appending.
Checks: the run raises nothing (no "a commit is still out"), every append after the cancel still
lands (nothing stuck), close doesn't hang, the store is sound, every acknowledged append stored.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import random
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.store import committer_lmdb
from ctxrt.testing import verify_store

LANDINGS = [0]  # system-task landings (a lone commit handed over), counted per case
_land = committer_lmdb.DurableCommitter._land


async def _counted_land(self: Any, *args: Any) -> None:
    LANDINGS[0] += 1
    await _land(self, *args)


committer_lmdb.DurableCommitter._land = _counted_land  # type: ignore[method-assign]

BASE = Path(ctxrt.__file__).parent
FILES = tuple(str(BASE / name) for name in ("store/committer_lmdb.py", "store/writer.py", "store/actor.py", "mailbox.py"))
APPENDS = 12
HANG_S = 60


class Run:
    def __init__(self, tasks: int) -> None:
        self.scopes: list[trio.CancelScope | None] = [None] * tasks
        self.acks: list[tuple[int, str]] = []
        self.cancelled = 0
        self.after_cancel = 0


async def appender(manager: Any, run: Run, who: int) -> None:
    for number in range(APPENDS):
        with trio.CancelScope() as scope:
            run.scopes[who] = scope
            message_id = await manager.add_message("user", f"{who} line {number}")
            run.acks.append((who, message_id))
            if run.cancelled:
                run.after_cancel += 1
        run.scopes[who] = None
        if scope.cancelled_caught:
            run.cancelled += 1


async def host(path: Path, tasks: int, run: Run) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/a{who}") for who in range(tasks)]
        async with trio.open_nursery() as nursery:
            for who in range(1, tasks):
                nursery.start_soon(appender, managers[who], run, who)
            await appender(managers[0], run, 0)


def in_instrument(frame: types.FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name in ("before_io_wait", "after_io_wait"):
            return True
        frame = frame.f_back
    return False


def counted(filename: str, lineno: int) -> bool:
    return linecache.getline(filename, lineno).strip() != "try:"


def discover(path: Path, tasks: int) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in FILES:
            return None if event == "call" else trace
        if event == "line" and counted(frame.f_code.co_filename, frame.f_lineno) and not in_instrument(frame):
            site = (frame.f_code.co_filename, frame.f_lineno)
            counts[site] = counts.get(site, 0) + 1
        return trace

    sys.settrace(trace)
    try:
        trio.run(host, path, tasks, Run(tasks))
    finally:
        sys.settrace(None)
    return counts


def cancel_at(path: Path, tasks: int, site: tuple[str, int], k: int, victim: int) -> tuple[Any, bool, Run]:
    run = Run(tasks)
    seen = 0
    done = False

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal seen, done
        if done:
            return None
        if frame.f_code.co_filename not in FILES:
            return None if event == "call" else trace
        if event == "line" and (frame.f_code.co_filename, frame.f_lineno) == site and not in_instrument(frame):
            seen += 1
            active = [scope for scope in run.scopes if scope is not None]
            if seen >= k and active:
                done = True
                scope = active[victim % len(active)]
                if "await " in linecache.getline(*site):  # a deadline passed as it reaches this checkpoint
                    scope.cancel()
                else:  # as another task would: at the scheduler's next step, never inside sync code
                    trio.lowlevel.current_trio_token().run_sync_soon(scope.cancel)
        return trace

    raised = None
    sys.settrace(trace)
    try:
        trio.run(host, path, tasks, run)
    except BaseException as exc:  # noqa: BLE001
        raised = exc
    finally:
        sys.settrace(None)
    return raised, done, run


async def lost_acks(path: Path, run: Run, tasks: int) -> list[Any]:
    lost = []
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        for who in range(tasks):
            reader = await runtime.open(f"agents/a{who}")
            for owner, message_id in run.acks:
                if owner == who and await reader.get_message(message_id) is None:
                    lost.append((who, message_id))
    return lost


def main() -> int:
    where, seed, cases = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tasks = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    base = Path(tempfile.mkdtemp(prefix="attcm-c-", dir="/dev/shm" if where == "shm" else "/tmp"))
    failures = 0
    try:
        counts = discover(base / "discover", tasks)
        only = os.environ.get("ONLY")  # e.g. committer_lmdb: draw lines of that file only
        sites = sorted(site for site in counts if not only or only in f"{site[0]}:{site[1]}")
        rng = random.Random(seed)
        print(f"# cancel {where} tasks {tasks} seed {seed}: {len(sites)} lines", flush=True)
        for number in range(cases):
            site = rng.choice(sites)
            k = rng.randint(1, counts[site])
            victim = rng.randrange(tasks)
            label = f"{os.path.relpath(site[0], BASE)}:{site[1]} k={k}/{counts[site]} victim {victim} (seed {seed} case {number})"
            path = base / f"s{number}"
            faulthandler.dump_traceback_later(HANG_S, exit=True)
            started = time.monotonic()
            LANDINGS[0] = 0
            raised, done, run = cancel_at(path, tasks, site, k, victim)
            faulthandler.cancel_dump_traceback_later()
            problems = []
            if raised is not None:
                problems.append(f"raised {raised!r}")
            expected = tasks * APPENDS - run.cancelled
            if raised is None and len(run.acks) != expected:
                problems.append(f"acks {len(run.acks)} != {expected}")
            if (path / "data.mdb").exists():
                report = verify_store(path)
                if report.status != "sound":
                    problems.append(f"verify: {report}")
                else:
                    lost = trio.run(lost_acks, path, run, tasks)
                    if lost:
                        problems.append(f"lost {len(lost)}: {lost[:3]}")
            if problems:
                failures += 1
            status = "FAIL " + "; ".join(problems) if problems else "ok"
            print(f"{status} {label} cancelled={done}/{run.cancelled} acks={len(run.acks)} after={run.after_cancel} landings={LANDINGS[0]}"
                  f" {time.monotonic() - started:.1f}s", flush=True)
            del raised
            shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# done: {cases} cases, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
