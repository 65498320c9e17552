"""Compression liveness on PostgreSQL across processes: this process serves N auto-ticking
Autobiographical namespaces (ScriptedModel) and samples each one's health() every 0.2 s; a second
process appends to them (about RATE messages/s in all); a third compiles them in a loop. It
counts episodes where a namespace sat with pending_units > 0 and no model call in flight for more
than 5 s (it should never: auto_tick drains it), and after the appends stop, how long until every
namespace is idle (pending 0).

python attack/liveness.py [SECONDS=60] [N=3] [RATE=20] [--inproc] [--quiet]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import trio

import ctxrt
from ctxrt.testing import ScriptedModel, temporary_cluster

NAMES = [f"auto{i}" for i in range(8)]
INPROC = "--inproc" in sys.argv  # appends from the serving process itself (a control)
QUIET = "--quiet" in sys.argv  # no health() samples while the appends run: nothing of this process reads
NURSERY: list[trio.Nursery] = []


class Appends:
    """The appender run as a task of the serving process, shaped as the Popen the loop polls."""

    def __init__(self, rt: object, managers: list[ctxrt.ContextManager], rate: float, seconds: float) -> None:
        self.done = False
        self.count = 0

        async def run() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await managers[self.count % len(managers)].add_message("user", f"message {self.count} " + "words " * 40)
                self.count += 1
                await trio.sleep(1 / rate)
            self.done = True
        NURSERY[0].start_soon(run)

    def poll(self) -> int | None:
        return 0 if self.done else None

    def communicate(self) -> tuple[str, None]:
        return json.dumps({"appended": self.count}), None


def config() -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical("m", target_chunk_tokens=300, recent_window_tokens=0, head_window_tokens=0,
                                  l1_holdback_chunks=0, auto_tick=True)


async def appender(url: str, n: int, rate: float, seconds: float) -> None:
    async with ctxrt.open_runtime(url) as rt:
        managers = [await rt.open(name, isolate=True) for name in NAMES[:n]]
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            await managers[i % n].add_message("user", f"message {i} " + "words " * 40)
            i += 1
            await trio.sleep(1 / rate)
        print(json.dumps({"appended": i}), flush=True)


async def compiler(url: str, n: int, seconds: float) -> None:
    async with ctxrt.open_runtime(url) as rt:
        managers = [await rt.open(name, isolate=True) for name in NAMES[:n]]
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            await managers[i % n].compile(ctxrt.Budget(max_tokens=8_000))
            i += 1
            await trio.sleep(0.05)
        print(json.dumps({"compiled": i}), flush=True)


async def serve(url: str, n: int, seconds: float, rate: float) -> dict[str, object]:
    async with ctxrt.open_runtime(url) as rt, trio.open_nursery() as nursery:
        NURSERY.append(nursery)
        model = ScriptedModel(lambda _: "SUMMARY " + "remembered " * 30, delay_s=0.05)
        managers = [await rt.open(name, isolate=True, strategy=config(), model=model) for name in NAMES[:n]]
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        roles = ("compile",) if INPROC else ("append", "compile")
        others = [subprocess.Popen([sys.executable, __file__, "--" + role, url, str(n), str(rate), str(seconds)],
                                   env=env, stdout=subprocess.PIPE, text=True) for role in roles]
        if INPROC:  # the appends from this process, the one serving the namespaces
            others.insert(0, Appends(rt, managers, rate, seconds))
        stuck_since: dict[str, float] = {}
        episodes: list[tuple[str, float]] = []
        worst = 0.0
        began = time.monotonic()
        appends_over: float | None = None
        idle_after: float | None = None
        asked_while_quiet = None
        if QUIET:
            while others[0].poll() is None:
                await trio.sleep(0.2)
            asked_while_quiet = len(model.requests)
        while True:
            now = time.monotonic()
            if appends_over is None and others[0].poll() is not None:
                appends_over = now
            pending_all = 0
            for name, manager in zip(NAMES, managers):
                health = await manager.health()
                pending_all += health.pending_units
                if health.pending_units and not health.in_flight_model_calls:
                    since = stuck_since.setdefault(name, now)
                    worst = max(worst, now - since)
                else:
                    since = stuck_since.pop(name, None)
                    if since is not None and now - since > 5:
                        episodes.append((name, round(now - since, 1)))
            if appends_over is not None and pending_all == 0 and idle_after is None:
                idle_after = now - appends_over
            if appends_over is not None and (idle_after is not None or now - appends_over > 60):
                break
            await trio.sleep(0.2)
        for name, since in stuck_since.items():
            if time.monotonic() - since > 5:
                episodes.append((name, round(time.monotonic() - since, 1)))
        said = [p.communicate()[0].strip() for p in others]
        return {"seconds": round(time.monotonic() - began), "model_requests": len(model.requests),
                "requests_before_any_read_here": asked_while_quiet,
                "stuck_episodes_over_5s": episodes, "longest_pending_without_flight_s": round(worst, 1),
                "idle_after_appends_s": None if idle_after is None else round(idle_after, 1), "others": said}


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 60
    n = int(args[1]) if len(args) > 1 else 3
    rate = float(args[2]) if len(args) > 2 else 20
    with temporary_cluster() as cluster:
        url = cluster.create_database("live")
        print(json.dumps(trio.run(serve, url, n, seconds, rate)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--append"]:
        trio.run(appender, sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    elif sys.argv[1:2] == ["--compile"]:
        trio.run(compiler, sys.argv[2], int(sys.argv[3]), float(sys.argv[5]))
    else:
        main()
