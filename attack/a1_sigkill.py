"""Attack 1: SIGKILL in the middle of group commits (K3).

A child process opens a store with durability "sync" and runs TASKS concurrent tasks appending
through ``ContextManager.add_message`` to several namespaces (own slots and the shared slot), one
of them forking mid-run and going on on the fork; after each append RETURNED it writes
``ack ...`` to its stdout pipe (one os.write per line). The parent kills it with SIGKILL at a
random moment, reads every ack line, then reopens the store and checks: every acked message is
there and readable, in order, no duplicate, no gap (each task appends one at a time, so what is
there is a prefix of what it sent, at most one past its last ack), and ``ctxrt verify`` says
sound. Several rounds share one store (a series), so a crash also meets what earlier crashes left.

    python attack/a1_sigkill.py [--rounds N] [--series S] [--tasks T] [--seed X]

Attack 4 is this one with the smallest map the API takes and large messages, so the map grows
(about a dozen doublings) while batches are out, and the kill often lands during a growth:

    python attack/a1_sigkill.py --map-size 65536 --pad 100000 --image 60000 --tasks 30
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import math
import os
import random
import select
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

NAMESPACES = ["a", "b", "c", "shared1", "shared2", "forky"]


def content(text: str, image: int, rng: random.Random) -> tuple[list, dict | None]:
    """``text`` alone, or with an image of ``image`` random bytes (every one its own blob)."""
    if not image:
        return [{"type": "text", "text": text}], None
    data = b"\x89PNG\r\n\x1a\n" + rng.randbytes(image)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    return [{"type": "text", "text": text}, {"type": "image", "source": source}], {"sha256": hashlib.sha256(data).hexdigest()}


async def child(path: str, round_: int, tasks: int, pad: int, map_size: int, image: int) -> None:
    import ctxrt

    rng = random.Random(round_)
    common.say("started")  # imports done: an early kill is timed from here (it lands in the open, the page walk)
    async with ctxrt.open_runtime(path, durability=common.DURABILITY, map_size=map_size) as rt:
        managers = {ns: await rt.open(ns, isolate=common.isolated(ns)) for ns in NAMESPACES}
        common.say("ready")

        async def appender(ns: str, task: int) -> None:
            manager = managers[ns]
            branch = manager.branch
            n = 0
            while True:
                blocks, metadata = content(common.payload(round_, ns, task, n, pad), image, rng)
                mid = await manager.add_message("user", blocks, metadata=metadata)
                common.say(f"ack {branch} {ns} {round_} {task} {n} {mid}")
                n += 1

        async def forker() -> None:
            manager = managers["forky"]
            n = 0
            for n in range(5):
                mid = await manager.add_message("user", common.payload(round_, "forky", 0, n))
                common.say(f"ack main forky {round_} 0 {n} {mid}")
            name = await manager.fork(f"f{round_}")
            common.say(f"fork forky {round_} {name}")
            n = 5
            while True:
                mid = await manager.add_message("user", common.payload(round_, "forky", 0, n))
                common.say(f"ack {name} forky {round_} 0 {n} {mid}")
                n += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forker)
            others = [ns for ns in NAMESPACES if ns != "forky"]
            for task in range(1, tasks):
                nursery.start_soon(appender, others[task % len(others)], task)


def run_round(path: Path, round_: int, tasks: int, acks: common.Acks, rng: random.Random, pad: int, map_size: int,
              image: int, early_share: float) -> dict:
    proc = subprocess.Popen([common.PYTHON, __file__, "--child", str(path), str(round_), str(tasks), str(pad),
                             str(map_size), str(image)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=common.env())
    fd = proc.stdout.fileno()
    buf = b""
    ready_at = None
    delay = rng.uniform(0.02, 1.5)
    early = rng.random() < early_share
    started = math.inf
    deadline = time.monotonic() + 60
    killed = False
    while True:
        now = time.monotonic()
        if not killed and ((ready_at is not None and now - ready_at >= delay) or (early and now - started >= delay / 20)):
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
        if now > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
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
                acks.feed(text)
    proc.wait()
    err = proc.stderr.read().decode()
    return {"grew": err.count("growing to"), "rc": proc.returncode, "stderr": err[-2000:], "delay": delay, "ready": ready_at is not None,
            "early": early and ready_at is None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--series", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--pad", type=int, default=0, help="characters of padding per message")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--map-size", type=int, default=1 << 36, help="the writer's map_size (attack 4: 65536)")
    parser.add_argument("--image", type=int, default=0, help="bytes of a random image added to each message")
    parser.add_argument("--early", type=float, default=0.15, help="share of rounds killed while the runtime opens")
    parser.add_argument("--child", nargs=6)
    args = parser.parse_args()
    if args.child:
        path, r, t, pad, map_size, image = args.child
        trio.run(child, path, int(r), int(t), int(pad), int(map_size), int(image))
        return
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    failures = 0
    total = 0
    for series in range(args.series):
        base = Path(tempfile.mkdtemp(prefix="att35-a1-", dir=common.BASE))
        path = base / "store"
        acks = common.Acks()
        for round_ in range(args.rounds):
            tasks = rng.randint(10, args.tasks)
            outcome = run_round(path, round_, tasks, acks, rng, args.pad, args.map_size, args.image, args.early)
            total += 1
            if outcome["rc"] != -signal.SIGKILL or not (outcome["ready"] or outcome["early"]):
                print(f"series {series} round {round_}: child ended {outcome['rc']}: {outcome['stderr']}", flush=True)
                failures += 1
                continue
            problems = trio.run(common.check_store, path, acks, NAMESPACES)
            code, detail = common.verify_cli(path)
            if code != 0:
                problems.append(f"verify exit {code}: {detail}")
            status = "ok" if not problems else "FAIL"
            print(f"series {series} round {round_}: tasks {tasks} kill after "
                  f"{'(while opening) ' + format(outcome['delay'] / 20, '.3f') if outcome['early'] else format(outcome['delay'], '.3f')}s, "
                  f"map grew {outcome['grew']}x, acks so far {acks.count}: {status} ({detail})", flush=True)
            for p in problems[:20]:
                print("   ", p, flush=True)
            failures += bool(problems)
        if failures == 0:
            shutil.rmtree(base)
        else:
            print(f"kept {base}", flush=True)
    print(f"RESULT a1: {total} rounds, {failures} failed (seed {seed})", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
