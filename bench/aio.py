"""ctxrt from asyncio (``ctxrt.aio``) against the same calls from trio, side by side in one run.

    python -m bench.aio [--quick]

Each round runs the trio host (``trio.run``, ``ctxrt.open_runtime``) and the asyncio host
(``asyncio.run``, ``ctxrt.aio.open_runtime``: the runtime in a trio guest run on the asyncio
loop) in a random order, each through the public API only, each opening the same stores afresh:

(a) A turn at 20,000 messages: a durable ``add_message`` (durability "sync") then a
    ``compile`` with a 20,000-token budget, Passthrough. Median ms per turn. Target: asyncio
    <= 1.5x trio.
(b) 100 concurrent appenders, a manager each (its own namespace over the shared slot), each
    awaiting its durable ``add_message`` calls one after another (trio tasks in a nursery;
    asyncio tasks in ``asyncio.gather``). Appends per second. Target: asyncio >= 0.5x trio.

(a) and (b) are judged by the median of the per-round ratios (each round runs both hosts back to
back): a durable commit's fsync varies tenfold from round to round on a shared host.
(c) The per-call hop: ``compile`` of a 1-message namespace, one call after another. Median µs
    per call, asyncio and trio, and the difference: what a call from asyncio costs on top.
(d) The same hop for a call that reaches no actor (``message_count``): the front's own cost.
(e) (c) with ``ctxrt.aio.guest.LINGER_TICKS = 0``: trio parks in its I/O thread as soon as it
    is idle, so each call first wakes it there (a byte to that thread, then
    ``call_soon_threadsafe`` back to the loop). No target: it shows what the linger saves.

A figure is the median across rounds of each round's median (min–max across rounds). Results are
printed and written to ``bench/results-aio.md``. ``CTXRT_BENCH_DIR`` chooses where the stores live
(a real disk, for the durable figures).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from . import harness
from .harness import TABLE_HEAD, measured, scratch

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-aio.md"
MESSAGES = 20_000
BUDGET_TOKENS = 20_000
APPENDERS = 100
HOSTS = ("trio", "asyncio")
TEXT = "a message of about two hundred bytes, as a resident might write it in a shared conversation: " * 2


def _settings(quick: bool) -> dict[str, int]:
    if quick:
        return {"rounds": 8, "turns": 8, "appends": 10, "hops": 100}
    return {"rounds": 30, "turns": 10, "appends": 20, "hops": 200}


async def _median_us(call: Callable[[], Awaitable[Any]], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def _measure(open_runtime: Any, gather: Callable[..., Awaitable[Any]], stores: dict[str, Path],
                   round_: int, host: str, settings: dict[str, int]) -> dict[str, float]:
    """One round's figures on one host: the turn, the appenders' throughput, the two hops."""
    import ctxrt

    figures: dict[str, float] = {}
    budget = ctxrt.Budget(max_tokens=BUDGET_TOKENS)
    async with open_runtime(stores["turn"], durability="sync") as rt:
        manager = await rt.open("turns")
        await manager.compile(budget)  # warm: the slot's cache holds what a compile reads

        async def turn() -> None:
            await manager.add_message("user", TEXT)
            await manager.compile(budget)

        figures["turn"] = await _median_us(turn, settings["turns"]) / 1000
    async with open_runtime(stores["append"], durability="sync") as rt:
        managers = [await rt.open(f"r{round_}-{host}/{n}") for n in range(APPENDERS)]

        async def appender(manager: Any) -> None:
            for _ in range(settings["appends"]):
                await manager.add_message("user", TEXT)

        started = time.perf_counter()
        await gather(*(lambda m=m: appender(m) for m in managers))
        figures["append"] = APPENDERS * settings["appends"] / (time.perf_counter() - started)
    async with open_runtime(stores["hop"], durability="os") as rt:
        manager = await rt.open("hop")
        await manager.compile(budget)
        figures["hop"] = await _median_us(lambda: manager.compile(budget), settings["hops"])
        figures["count"] = await _median_us(manager.message_count, settings["hops"])
        if host == "asyncio":
            from ctxrt.aio import guest

            linger, guest.LINGER_TICKS = guest.LINGER_TICKS, 0
            try:
                figures["hop_parked"] = await _median_us(lambda: manager.compile(budget), settings["hops"])
            finally:
                guest.LINGER_TICKS = linger
    return figures


def _on_trio(stores: dict[str, Path], round_: int, settings: dict[str, int]) -> dict[str, float]:
    import trio

    import ctxrt

    async def gather(*calls: Callable[[], Awaitable[Any]]) -> None:
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(call)

    return trio.run(_measure, ctxrt.open_runtime, gather, stores, round_, "trio", settings)


def _on_asyncio(stores: dict[str, Path], round_: int, settings: dict[str, int]) -> dict[str, float]:
    import ctxrt.aio

    async def gather(*calls: Callable[[], Awaitable[Any]]) -> None:
        await asyncio.gather(*(call() for call in calls))

    return asyncio.run(_measure(ctxrt.aio.open_runtime, gather, stores, round_, "asyncio", settings))


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(e); one dict per figure. Also writes ``bench/results-aio.md``."""
    import trio

    import ctxrt

    settings = _settings(quick)
    rng = random.Random(20261201)
    started = time.perf_counter()
    figures: dict[str, dict[str, list[float]]] = {host: {} for host in HOSTS}
    with scratch("ctxrt-bench-aio-") as root:
        stores = {name: root / name for name in ("turn", "append", "hop")}
        build_s = trio.run(harness.fill, stores["turn"], MESSAGES, lambda n: f"{TEXT} #{n}")

        async def one_message() -> None:
            async with ctxrt.open_runtime(stores["hop"], durability="os") as rt:
                await (await rt.open("hop")).add_message("user", TEXT)

        trio.run(one_message)
        runners = {"trio": _on_trio, "asyncio": _on_asyncio}
        for round_ in range(settings["rounds"]):
            order = list(HOSTS)
            rng.shuffle(order)
            for host in order:
                for name, value in runners[host](stores, round_, settings).items():
                    figures[host].setdefault(name, []).append(value)
    trio_, aio = figures["trio"], figures["asyncio"]
    rows = [
        _paired(f"(a) a turn at {MESSAGES:,} messages: durable add_message + compile, {BUDGET_TOKENS:,}-token "
                "budget", "ms", aio["turn"], trio_["turn"], target=1.5, op="<="),
        _paired(f"(b) {APPENDERS} concurrent durable appenders", "appends/s", aio["append"], trio_["append"],
                target=0.5, op=">="),
        _hop("(c) the per-call hop: compile of a 1-message namespace", aio["hop"], trio_["hop"]),
        _hop("(d) a call that reaches no actor: message_count", aio["count"], trio_["count"]),
        _hop("(e) (c) with LINGER_TICKS = 0: each call wakes trio in its I/O thread", aio["hop_parked"],
             trio_["hop"]),
    ]
    info = {"quick": quick, "settings": settings, "build_s": build_s, "seconds": time.perf_counter() - started,
            "python": sys.executable}
    for each in rows:
        each.update(info)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


def _paired(measure: str, unit: str, aio: list[float], trio_: list[float], *, target: float, op: str) -> dict[str, Any]:
    """A targeted row, judged by the median of the per-round ratios: each round ran both hosts back to
    back, so a round's ratio sees the same disk (a durable commit's fsync varies tenfold on a shared
    host, from round to round, far more than between the two hosts)."""
    row = harness.versus(measure, unit, aio, trio_, "trio host", op=op)
    row.update(target=target, passed=harness.OPS[op](row["paired_ratio"], target), judged="paired_ratio")
    return row


def _hop(measure: str, aio: list[float], trio_: list[float]) -> dict[str, Any]:
    difference = statistics.median(aio) - statistics.median(trio_)
    paired = statistics.median(a - t for a, t in zip(aio, trio_))
    return harness.versus(measure, "µs", aio, trio_, "trio host", op=None, difference=difference,
                          paired_difference=paired)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    settings = first["settings"]
    lines = [
        "## From asyncio",
        "",
        measured("aio", first["quick"], "trio and asyncio in one process") + f" {settings['rounds']} rounds; each "
        "round runs the trio host and the asyncio host in a random order, each opening the same stores afresh "
        "through the public API; a figure is the median across rounds of each round's median (min–max across "
        f"rounds). Per round and host: {settings['turns']} turns, {APPENDERS} appenders x {settings['appends']} "
        f"durable appends, {settings['hops']} calls per hop. The {MESSAGES:,}-message store was built in "
        f"{first['build_s']:.1f} s (durability \"os\").",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        comparison = f"{row['comparison_label']}: {harness.median_figure(row['comparison'], row['unit'])}"
        ratio = f"{row['ratio']:.2f}"
        if row.get("judged") == "paired_ratio":
            ratio += f" (per-round median {row['paired_ratio']:.2f}, judged)"
        if "difference" in row:
            ratio += f" (asyncio / trio); difference {row['difference']:+,.1f} {row['unit']}"
        target = "" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | asyncio: {harness.median_figure(row['ctxrt'], row['unit'])} | "
                     f"{comparison} | {ratio} | {target} | {verdict} |")
    lines += [
        "",
        harness.paired_line(rows),
        "",
        "- Where a call's time goes: trio code runs on the loop's thread, so an asyncio caller hands the call to a "
        "parked trio worker task directly (no thread, no new task) and the worker answers the caller's future "
        "directly. What is left of (d) is guest mode's scheduling: each pass of trio's scheduler is one callback "
        "of the asyncio loop (a `call_soon`, and an `epoll` that doesn't wait on each side), and even a call "
        "that reaches no actor takes two trio passes (trio's API checkpoints) and two asyncio passes (the "
        "caller's task step, its wake-up). A compile adds the namespace actor's pass: (c) over (d).",
        "- (e) is what a call costs when trio has gone idle: trio waits for I/O in a worker thread, and a call "
        "must wake that thread and come back through `call_soon_threadsafe`. After each call the front keeps "
        "trio runnable for `LINGER_TICKS` (3) scheduler passes, so a caller's next call finds it awake; the first "
        "call after a pause pays (e)'s cost.",
        "- (a) and (b) are judged by the median of the per-round ratios: each round ran both hosts back to back, "
        "and a durable commit's fsync varies tenfold from round to round on this shared host (the min–max "
        "columns), far more than between the hosts.",
    ]
    return "\n".join(lines) + "\n"


main = harness.entry("aio", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and calls")

if __name__ == "__main__":
    sys.exit(main())
