"""Attack 3: callers cancelled at every checkpoint of an append (L4, K3).

In one process, with a real store under /var/tmp: TASKS tasks append through
``ContextManager.add_message`` each under ``trio.move_on_after`` of a random deadline of 0..2 ms,
and CANCELLERS more append inside explicit cancel scopes that another task cancels at a random
moment; a steady task appends with no deadline all along and records its slowest append (the
runtime must keep serving it). Every attempt carries a unique payload. After the storm (and again
after a reopen in a new runtime): every acknowledged append there with its content whole; a
cancelled one there whole or not at all; no payload twice; each task's payloads in the order it
sent them; closing the runtime prompt; ``ctxrt verify`` sound. Rounds alternate durability "sync"
and "os" (the writer thread's lone and group commits, and the inline commit).

    python attack/a3_cancel.py [--rounds N] [--seconds S] [--seed X] [--busy]

``--busy`` adds a task burning CPU in 1 ms slices with a checkpoint between, so the loop never
idles: the steady appender's latency then shows whether the writer thread gets its GIL turns.
"""

from __future__ import annotations

import argparse
import random
import statistics
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import ctxrt  # noqa: E402

NAMESPACES = ["a", "b", "shared1"]


class Tally:
    def __init__(self) -> None:
        self.acked: dict[str, str] = {}  # payload -> id
        self.cancelled: set[str] = set()
        self.sent_order: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.steady_worst = 0.0
        self.steady_count = 0
        self.steady_times: list[float] = []


async def storm(path: Path, durability: str, seconds: float, tasks: int, cancellers: int, rng: random.Random,
                tally: Tally, busy: bool = False) -> dict:
    close_s = None
    async with ctxrt.open_runtime(path, durability=durability) as rt:
        managers = {ns: await rt.open(ns, isolate=common.isolated(ns)) for ns in NAMESPACES}
        stop = trio.Event()

        async def deadline_appender(task: int) -> None:
            ns = NAMESPACES[task % len(NAMESPACES)]
            n = 0
            while not stop.is_set():
                text = common.payload(0, ns, task, n, rng.choice((0, 0, 3000)))
                tally.sent_order[(ns, task)].append(n)
                with trio.move_on_after(rng.uniform(0, 0.002) if rng.random() < 0.9 else 0) as scope:
                    mid = await managers[ns].add_message("user", text)
                if scope.cancelled_caught:
                    tally.cancelled.add(text)
                else:
                    tally.acked[text] = mid
                n += 1
                await trio.sleep(0)

        async def scoped_appender(task: int, scopes: list) -> None:
            ns = NAMESPACES[task % len(NAMESPACES)]
            n = 0
            while not stop.is_set():
                text = common.payload(0, ns, task, n)
                tally.sent_order[(ns, task)].append(n)
                with trio.CancelScope() as scope:
                    scopes.append(scope)
                    mid = await managers[ns].add_message("user", text)
                    tally.acked[text] = mid
                if scope.cancelled_caught:
                    tally.cancelled.add(text)
                elif text not in tally.acked:
                    tally.cancelled.add(text)  # cancelled after it returned (not caught): counts as acked above
                n += 1

        async def canceller(scopes: list) -> None:
            while not stop.is_set():
                await trio.sleep(rng.uniform(0, 0.001))
                if scopes:
                    scopes.pop(rng.randrange(len(scopes))).cancel()

        async def burner() -> None:
            """A busy loop: CPU in 1 ms slices, a checkpoint between (the writer thread's GIL turns)."""
            while not stop.is_set():
                until = time.perf_counter() + 0.001
                while time.perf_counter() < until:
                    pass
                await trio.sleep(0)

        async def steady() -> None:
            n = 0
            while not stop.is_set():
                started = time.perf_counter()
                text = common.payload(0, "a", 999, n)
                tally.sent_order[("a", 999)].append(n)
                with trio.fail_after(10):
                    tally.acked[text] = await managers["a"].add_message("user", text)
                tally.steady_worst = max(tally.steady_worst, time.perf_counter() - started)
                tally.steady_times.append(time.perf_counter() - started)
                tally.steady_count += 1
                n += 1

        async with trio.open_nursery() as nursery:
            scopes: list = []
            for task in range(tasks):
                nursery.start_soon(deadline_appender, task)
            for task in range(tasks, tasks + cancellers):
                nursery.start_soon(scoped_appender, task, scopes)
            nursery.start_soon(canceller, scopes)
            nursery.start_soon(steady)
            if busy:
                nursery.start_soon(burner)
            await trio.sleep(seconds)
            stop.set()
        problems = await check(rt, tally)
        closing = time.perf_counter()
        for manager in managers.values():
            await manager.aclose()
    close_s = time.perf_counter() - closing
    return {"problems": problems, "close_s": close_s}


async def check(rt, tally: Tally) -> list[str]:
    problems = []
    seen: dict[str, list] = defaultdict(list)
    order: dict[tuple[str, int], list[int]] = defaultdict(list)
    for ns in NAMESPACES:
        async with await rt.open(ns, isolate=common.isolated(ns)) as manager:
            for message in await manager.get_all_messages():
                text = common.text_of(message)
                key = common.parse(text)
                if key is None or key[1] != ns:
                    continue
                seen[text].append(message.id)
                order[(ns, key[2])].append(key[3])
    for text, ids in seen.items():
        if len(ids) > 1:
            problems.append(f"duplicate {text[:40]} at {ids}")
        if text not in tally.acked and text not in tally.cancelled:
            problems.append(f"never sent? {text[:40]}")
    for text, mid in tally.acked.items():
        if text not in seen:
            problems.append(f"acked missing {text[:40]} ({mid})")
        elif seen[text][0] != mid:
            problems.append(f"acked {text[:40]} as {mid}, stored as {seen[text]}")
    for key, ns_order in order.items():
        if ns_order != sorted(ns_order):
            problems.append(f"{key}: payloads out of the order sent: {ns_order[:10]}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--busy", action="store_true", help="a task burns CPU in 1 ms slices all along")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    failures = 0
    worst_close = worst_steady = 0.0
    for round_ in range(args.rounds):
        durability = "sync" if round_ % 2 == 0 else "os"
        base = Path(tempfile.mkdtemp(prefix="att35-a3-", dir=common.BASE))
        path = base / "store"
        tally = Tally()
        tasks = rng.randint(5, args.tasks)
        out = trio.run(storm, path, durability, args.seconds, tasks, rng.randint(2, 10), rng, tally, args.busy)
        problems = out["problems"]

        async def reread() -> list[str]:
            async with ctxrt.open_runtime(path) as rt:
                return await check(rt, tally)
        problems += [f"after reopen: {p}" for p in trio.run(reread)]
        code, detail = common.verify_cli(path)
        if code != 0:
            problems.append(f"verify exit {code}: {detail}")
        if out["close_s"] > 2:
            problems.append(f"close took {out['close_s']:.2f}s")
        worst_close = max(worst_close, out["close_s"])
        worst_steady = max(worst_steady, tally.steady_worst)
        print(f"round {round_} ({durability}): tasks {tasks}, acked {len(tally.acked)}, cancelled "
              f"{len(tally.cancelled)}, steady appends {tally.steady_count} (median {statistics.median(tally.steady_times) * 1000:.2f} ms, slowest {tally.steady_worst * 1000:.1f} ms), "
              f"close {out['close_s'] * 1000:.1f} ms: {'ok' if not problems else 'FAIL'}", flush=True)
        for p in problems[:20]:
            print("   ", p, flush=True)
        failures += bool(problems)
        if not problems:
            shutil.rmtree(base)
        else:
            print(f"kept {base}", flush=True)
    print(f"RESULT a3: {args.rounds} rounds, {failures} failed, slowest steady append {worst_steady * 1000:.1f} ms, "
          f"slowest close {worst_close * 1000:.1f} ms (seed {seed})", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
