"""Rounds of: a host (attack/host.py) working on a real PostgreSQL store; at a random moment the
server stalls (SIGSTOP); then the host is closed (stdin "close") or interrupted (SIGINT); the time
to its exit is measured; the server resumes (SIGCONT), then the store is checked: every
acknowledged append stored exactly once, nothing stored that wasn't tried, `ctxrt verify` clean.

python attack/stall_rounds.py ROUNDS [--target backends|postmaster|pooler] [--action close|int|mix]
    [--bound 2] [--cut 3] [--front trio|aio] [--resume-at S] [--seed N]
--resume-at S: resume the server S seconds after the action instead of after the host's exit
(races the cut with the answer: try S near --bound).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import trio

import ctxrt
from ctxrt.testing import start_pooler, temporary_cluster

HOST = Path(__file__).with_name("host.py")
ROOT = Path(__file__).resolve().parent.parent


def backends(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as admin:
        return [pid for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]


def postmaster(cluster: object) -> int:
    return int((cluster.data_dir / "postmaster.pid").read_text().split()[0])


async def stored(url: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    async with ctxrt.open_runtime(url, readonly=True) as rt:
        for name in ("w0", "w1", "auto"):
            try:
                manager = await rt.open(name, isolate=True)
            except ctxrt.UnknownStateError:  # the aio host makes no "auto"
                continue
            out[name] = [m.content[0].text.split(" ")[0] for m in await manager.get_all_messages()]
    return out


def one_round(n: int, args: argparse.Namespace, cluster: object, pooler: object, rng: random.Random) -> dict:
    db = f"r{n}_{os.getpid()}"
    cluster.create_database(db)
    direct = cluster.url(db)
    url = pooler.url(db) if pooler is not None else direct
    action = args.action if args.action != "mix" else rng.choice(["close", "int"])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    host = subprocess.Popen([sys.executable, str(HOST), url, str(args.bound), str(args.cut), args.front,
                             str(rng.randrange(1 << 30))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            # A shell's background job inherits SIGINT ignored, and Python (and trio)
                            # then leave it so: the host would never see the Ctrl-C.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[dict] = []
    err: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in host.stdout:
            try:
                said = json.loads(line)
            except ValueError:
                continue
            lines.append(said)
            if said.get("ready"):
                ready.set()

    def pump_err() -> None:
        err.extend(host.stderr)

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    stopped: list[int] = []
    outcome: dict = {"round": n, "action": action}
    try:
        if not ready.wait(60):
            host.wait(5)
            outcome["verdict"] = "host never ready"
            outcome["stderr"] = "".join(err)[-3000:]
            return outcome
        time.sleep(rng.uniform(0.3, 2.0))
        if args.target == "pooler":
            stopped = [pooler.process.pid]
        elif args.target == "postmaster":
            stopped = [postmaster(cluster), *backends(direct)]
        else:
            stopped = backends(direct)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(rng.uniform(0.0, 0.6))
        began, wall = time.monotonic(), time.time()
        if action == "close":
            host.stdin.write("close\n")
            host.stdin.flush()
        else:
            host.send_signal(signal.SIGINT)
        resumed = False
        deadline = began + args.limit
        while host.poll() is None and time.monotonic() < deadline:
            if args.resume_at is not None and not resumed and time.monotonic() - began >= args.resume_at:
                for pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                resumed = True
            time.sleep(0.02)
        outcome["exit_s"] = round(time.monotonic() - began, 2)
        if host.poll() is None:
            outcome["verdict"] = f"HUNG > {args.limit} s"
            host.send_signal(signal.SIGUSR2)  # faulthandler: every thread's stack on stderr
            time.sleep(1)
            outcome["stack"] = "".join(e for e in err if e.startswith(("Thread", "Current", "  File")))[-4000:]
            host.kill()
        outcome["rc"] = host.wait()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if host.poll() is None:
            host.kill()
            host.wait()
    time.sleep(0.3)
    outcome["end"] = next((line for line in reversed(lines) if "end" in line), None)
    tried = collections.Counter(line["try"] for line in lines if "try" in line)
    acked = [line["ack"] for line in lines if "ack" in line]
    errors = [line["err"] for line in lines if "err" in line]
    outcome["acked"] = len(acked)
    outcome["errors"] = errors[:4]
    outcome["log"] = [f"+{float(e[1:].split(' ', 1)[0]) - wall:.1f}s {e.split(' ', 1)[1].strip()[:140]}"
                      for e in err if e.startswith("@")][-8:]
    outcome["tracebacks"] = sum("Traceback" in e for e in err)
    # The server has resumed: a writer's stalled session is still there; give it its bounds.
    found = trio.run(stored, direct)
    problems = []
    for name, texts in found.items():
        counts = collections.Counter(texts)
        problems += [f"{name}: {t} stored {c}x" for t, c in counts.items() if c > 1]
    every = collections.Counter(t for texts in found.values() for t in texts)
    problems += [f"lost acknowledged {t}" for t in acked if every[t] != 1]
    problems += [f"stored untried {t}" for t in every if t != "warm" and t not in tried]
    unacked_landed = [t for t in tried if every[t] and t not in set(acked)]
    outcome["unacked_landed"] = len(unacked_landed)
    verify = subprocess.run([sys.executable, "-m", "ctxrt", "verify", direct], capture_output=True, text=True, env=env,
                            timeout=300)
    if verify.returncode != 0:
        problems.append(f"verify rc {verify.returncode}: {(verify.stdout + verify.stderr)[-800:]}")
    outcome["problems"] = problems
    outcome.setdefault("verdict", "ok" if not problems and outcome["exit_s"] < args.bound_expect else "CHECK")
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int)
    parser.add_argument("--target", default="backends", choices=["backends", "postmaster", "pooler"])
    parser.add_argument("--action", default="mix", choices=["close", "int", "mix"])
    parser.add_argument("--bound", type=float, default=2.0)
    parser.add_argument("--cut", type=float, default=3.0)
    parser.add_argument("--front", default="trio", choices=["trio", "aio"])
    parser.add_argument("--resume-at", type=float, default=None)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--expect", dest="bound_expect", type=float, default=15.0,
                        help="an exit later than this is flagged CHECK")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with temporary_cluster() as cluster:
        with (start_pooler(cluster) if args.target == "pooler" or args.front == "pooler" else contextlib.nullcontext()) as pooler:
            for n in range(args.rounds):
                print(json.dumps(one_round(n, args, cluster, pooler, rng)), flush=True)


if __name__ == "__main__":
    main()
