"""Attack 2: Ctrl-C (SIGINT) at a random moment into a host doing concurrent durable appends,
compiles and ``record_request`` (ledger on) inside ``open_runtime`` (L8, K3, Q-ledger).

The child runs the host through trio (``trio.run``) or asyncio (``asyncio.run`` with
``ctxrt.aio.open_runtime``); it logs every acknowledged append and record to its stdout pipe. The
parent sends SIGINT after a random delay (sometimes a second one a few ms later) and waits at most
TIMEOUT seconds: the child must end with a bare KeyboardInterrupt out of ``trio.run`` /
``asyncio.run`` (it prints ``kbi`` then, anything else is a failure), and not hang. Then the
parent reopens the store: every acked message there in order with no gap, every acked ledger record
listed by ``requests()``, and ``ctxrt verify`` sound.

    python attack/a2_sigint.py [--rounds N] [--front trio|aio|both] [--seed X]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

NAMESPACES = ["a", "b", "shared1"]
TIMEOUT = 20.0


def host(front: str, path: str, round_: int, tasks: int):
    """The host's main coroutine for ``front``: same work through either front."""
    import ctxrt
    import ctxrt.aio

    async def work(rt, spawn) -> None:
        managers = {ns: await rt.open(ns, isolate=common.isolated(ns), ledger=True) for ns in NAMESPACES}
        common.say("ready")

        async def appender(ns: str, task: int) -> None:
            manager = managers[ns]
            n = 0
            while True:
                mid = await manager.add_message("user", common.payload(round_, ns, task, n, 200))
                common.say(f"ack main {ns} {round_} {task} {n} {mid}")
                n += 1

        async def recorder(ns: str) -> None:
            manager = managers[ns]
            task = 900 + NAMESPACES.index(ns)
            mid = await manager.add_message("user", common.payload(round_, ns, task, 0))  # nothing to send before
            common.say(f"ack main {ns} {round_} {task} 0 {mid}")
            while True:
                result = await manager.compile(ctxrt.Budget(max_tokens=20_000))
                record = await manager.record_request(result, form="anthropic", model="m")
                common.say(f"rec {ns} {record.id}")

        async def turns() -> None:
            """The host's own turns, in its main task: compile, record the request, add the reply
            (the record rides the reply's batch, Q1)."""
            manager = managers["a"]
            mid = await manager.add_message("user", common.payload(round_, "a", 801, 0))  # nothing to send before
            common.say(f"ack main a {round_} 801 0 {mid}")
            n = 0
            while True:
                result = await manager.compile(ctxrt.Budget(max_tokens=20_000))
                record = await manager.record_request(result, form="anthropic", model="m")
                common.say(f"rec a {record.id}")
                mid = await manager.add_message("assistant", common.payload(round_, "a", 800, n))
                common.say(f"ack main a {round_} 800 {n} {mid}")
                n += 1

        await spawn([recorder(ns) for ns in NAMESPACES]
                    + [appender(NAMESPACES[task % len(NAMESPACES)], task) for task in range(tasks)], turns)

    if front == "trio":
        async def main() -> None:
            async with ctxrt.open_runtime(path, durability=common.DURABILITY) as rt:
                async def spawn(coros, in_main) -> None:
                    async with trio.open_nursery() as nursery:
                        for coro in coros:
                            nursery.start_soon(lambda c=coro: c)
                        await in_main()
                await work(rt, spawn)
        return lambda: trio.run(main)

    async def amain() -> None:
        async with ctxrt.aio.open_runtime(path, durability=common.DURABILITY) as rt:
            async def spawn(coros, in_main) -> None:
                async with asyncio.TaskGroup() as group:
                    for coro in coros:
                        group.create_task(coro)
                    await in_main()
            await work(rt, spawn)
    return lambda: asyncio.run(amain())


def child(front: str, path: str, round_: int, tasks: int) -> None:
    run = host(front, path, round_, tasks)
    common.say("started")  # imports done: an early SIGINT is timed from here
    try:
        run()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second SIGINT after the run ended is the harness's, not ctxrt's
        common.say("kbi")
        os._exit(42)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        common.say("other " + type(exc).__name__)
        traceback.print_exc()
        os._exit(3)
    common.say("returned")
    os._exit(4)


class Ledger(common.Acks):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, set[str]] = {}

    def feed(self, line: str) -> None:
        words = line.split()
        if words and words[0] == "rec":
            self.records.setdefault(words[1], set()).add(words[2])
        else:
            super().feed(line)


async def check_ledger(path: Path, acks: Ledger) -> list[str]:
    import ctxrt

    problems = []
    async with ctxrt.open_runtime(path) as rt:
        for ns, wanted in acks.records.items():
            async with await rt.open(ns, isolate=common.isolated(ns)) as manager:
                have = {record.id for record in await manager.requests(limit=1_000_000)}
            missing = wanted - have
            if missing:
                problems.append(f"ledger {ns}: {len(missing)} acked records missing, e.g. {sorted(missing)[:3]}")
    return problems


def run_round(path: Path, front: str, round_: int, tasks: int, acks: Ledger, rng: random.Random) -> dict:
    proc = subprocess.Popen([common.PYTHON, __file__, "--child", front, str(path), str(round_), str(tasks)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=common.env())
    fd = proc.stdout.fileno()
    buf = b""
    ready_at = sent_at = None
    delay = rng.uniform(0.0, 1.2)
    early = rng.random() < 0.2  # sometimes while the runtime opens: timed from the start, not from "ready"
    started = math.inf
    second = rng.random() < 0.3
    second_delay = rng.uniform(0.0, 0.05)
    seconds_sent = False
    last = []
    hung = False
    while True:
        now = time.monotonic()
        if sent_at is None and ((ready_at is not None and now - ready_at >= delay)
                                or (early and now - started >= delay / 3)):
            os.kill(proc.pid, signal.SIGINT)
            sent_at = now
        if sent_at is not None and second and not seconds_sent and now - sent_at >= second_delay:
            try:
                os.kill(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            seconds_sent = True
        if sent_at is not None and now - sent_at > TIMEOUT and not hung:
            hung = True
            subprocess.run(["py-spy", "dump", "--pid", str(proc.pid)], check=False)
            os.kill(proc.pid, signal.SIGKILL)
        r, _, _ = select.select([fd], [], [], 0.005)
        if r:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode()
                if text == "ready":
                    ready_at = time.monotonic()
                elif text == "started":
                    started = time.monotonic()
                elif not text.startswith(("ack", "rec")):
                    last.append(text)
                acks.feed(text)
    proc.wait()
    took = (time.monotonic() - sent_at) if sent_at else None
    return {"rc": proc.returncode, "stderr": proc.stderr.read().decode()[-3000:], "delay": delay, "hung": hung,
            "took": took, "said": last, "second": second, "early": early and ready_at is None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--front", default="both")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        front, path, r, t = args.child
        child(front, path, int(r), int(t))
        return
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    fronts = ["trio", "aio"] if args.front == "both" else [args.front]
    failures = total = 0
    worst = 0.0
    for front in fronts:
        base = Path(tempfile.mkdtemp(prefix=f"att35-a2-{front}-", dir=common.BASE))
        path = base / "store"
        acks = Ledger()
        front_failures = 0
        for round_ in range(args.rounds):
            tasks = rng.randint(5, args.tasks)
            out = run_round(path, front, round_, tasks, acks, rng)
            total += 1
            problems = []
            if out["hung"]:
                problems.append(f"no exit {TIMEOUT}s after SIGINT (killed)")
            elif out["rc"] != 42:
                problems.append(f"exit {out['rc']}, said {out['said']}: {out['stderr']}")
            elif out["stderr"].strip():
                problems.append(f"logged: {out['stderr']}")
            if out["took"] is not None:
                worst = max(worst, out["took"])
            problems += trio.run(common.check_store, path, acks, NAMESPACES)
            problems += trio.run(check_ledger, path, acks)
            code, detail = common.verify_cli(path)
            if code != 0:
                problems.append(f"verify exit {code}: {detail}")
            took = f"{out['took']:.2f}s" if out["took"] is not None else "-"
            print(f"{front} round {round_}: tasks {tasks} SIGINT after {out['delay']:.3f}s"
                  f"{' (twice)' if out['second'] else ''}{' (while opening)' if out['early'] else ''}, exit in {took}, acks {acks.count}, records "
                  f"{sum(map(len, acks.records.values()))}: {'ok' if not problems else 'FAIL'}", flush=True)
            for p in problems[:20]:
                print("   ", p, flush=True)
            front_failures += bool(problems)
        failures += front_failures
        if front_failures == 0:
            shutil.rmtree(base)
        else:
            print(f"kept {base}", flush=True)
    print(f"RESULT a2: {total} rounds, {failures} failed, slowest exit after SIGINT {worst:.2f}s (seed {seed})",
          flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
