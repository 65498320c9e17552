"""Attack 7: a read-only runtime in another process reads a store while its writer grows the map
(smallest map, large messages), then while the writer is killed with SIGKILL and a new writer
reopens it (K3, K14's read-only open beside a writer, the map's growth under a reader).

The reader polls ``message_count`` and ``get_all_messages`` in a loop and writes, for each read,
the count it saw. Expected: it never fails (a read-only runtime reads what is committed, the map
growing under it included), the counts it sees never go down, every message it reads is whole
(its image matches the sha256 in its metadata), and after the writer's kill and reopen it goes
on reading and sees at least every append the writer acknowledged before its read began.

    python attack/a7_live_reader.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HERE = Path(__file__).resolve().parent


async def reader(path: str) -> None:
    import ctxrt

    while True:  # the writer's first open makes the store
        try:
            async with ctxrt.open_runtime(path, readonly=True) as rt:
                break
        except (FileNotFoundError, ctxrt.StoreFormatError, ctxrt.UnknownStateError):
            await trio.sleep(0.01)
    async with ctxrt.open_runtime(path, readonly=True) as rt:
        manager = None
        while manager is None:
            try:
                manager = await rt.open("a", isolate=True)
            except ctxrt.UnknownStateError:
                await trio.sleep(0.01)
        common.say("reading")
        while True:
            began = time.monotonic()
            messages = await manager.get_all_messages()
            bad = [p for m in messages for p in common.check_image("main", m)]
            common.say(f"read {began:.6f} {len(messages)} {len(bad)}")
            for p in bad[:3]:
                common.say("bad " + p)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--reader", nargs=1)
    args = parser.parse_args()
    if args.reader:
        trio.run(reader, args.reader[0])
        return
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    failures = 0
    for round_ in range(args.rounds):
        base = Path(tempfile.mkdtemp(prefix="att35-a7-", dir=common.BASE))
        path = base / "store"
        problems = one_round(path, rng)
        failures += bool(problems)
        for p in problems[:10]:
            print("   ", p, flush=True)
        if problems:
            print(f"kept {base}", flush=True)
        else:
            shutil.rmtree(base)
    print(f"RESULT a7: {args.rounds} rounds, {failures} failed (seed {seed})", flush=True)
    sys.exit(1 if failures else 0)


def one_round(path: Path, rng: random.Random) -> list[str]:
    problems: list[str] = []
    acks: list[tuple[float, int]] = []  # (when acked, how many acked by then) in namespace "a"
    reads: list[tuple[float, int, float]] = []  # (began, count, when read)

    def writer() -> subprocess.Popen:
        return subprocess.Popen([common.PYTHON, str(HERE / "a1_sigkill.py"), "--child", str(path), "0", "12", "100000",
                                 "65536", "60000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=common.env())

    read_proc = subprocess.Popen([common.PYTHON, __file__, "--reader", str(path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=common.env())
    write_proc = writer()
    procs = {write_proc.stdout.fileno(): "w", read_proc.stdout.fileno(): "r"}
    bufs = {fd: b"" for fd in procs}
    kill_at = time.monotonic() + rng.uniform(0.3, 2.0)
    end_at = kill_at + 2.0
    acked_a = 0
    restarted = False
    last_count = 0
    while time.monotonic() < end_at:
        if not restarted and time.monotonic() >= kill_at:
            os.kill(write_proc.pid, signal.SIGKILL)
            write_proc.wait()
            del procs[write_proc.stdout.fileno()]
            write_proc = writer()  # a new writer's open runs the page walk, beside the reader
            procs[write_proc.stdout.fileno()] = "w"
            bufs[write_proc.stdout.fileno()] = b""
            restarted = True
        ready, _, _ = select.select(list(procs), [], [], 0.01)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                if procs[fd] == "r":
                    problems.append(f"the reader ended: {read_proc.stderr.read().decode()[-1500:]}")
                    end_at = 0
                del procs[fd]
                continue
            bufs[fd] += chunk
            *lines, bufs[fd] = bufs[fd].split(b"\n")
            for line in lines:
                words = line.decode().split()
                if not words:
                    continue
                if procs[fd] == "w" and words[0] == "ack" and words[2] == "a":
                    acked_a += 1
                    acks.append((time.monotonic(), acked_a))
                elif words[0] == "read":
                    began, count, bad = float(words[1]), int(words[2]), int(words[3])
                    if count < last_count:
                        problems.append(f"the reader's count went down {last_count} -> {count}")
                    last_count = count
                    if bad:
                        problems.append(f"a read saw {bad} damaged images")
                    reads.append((began, count, time.monotonic()))
                elif words[0] == "bad":
                    problems.append(line.decode())
    for proc in (write_proc, read_proc):
        proc.kill()
        proc.wait()
    # Each read that began after an ack must hold it (the reader's clock and ours are one monotonic clock).
    missed = 0
    for began, count, _ in reads:
        due = max((n for when, n in acks if when < began - 0.002), default=0)
        if count < due:  # both writers append to "a": acks count up across them, as messages do
            missed += 1
    if missed:
        problems.append(f"{missed} reads missed appends acknowledged before they began")
    print(f"reads {len(reads)}, last count {last_count}, acks in 'a' {acked_a}, writer killed and reopened: "
          f"{restarted}: {'ok' if not problems else 'FAIL'}", flush=True)
    return problems


if __name__ == "__main__":
    main()
