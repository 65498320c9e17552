"""Costs benchmarks (issue 12): what a large history costs a cold open, a fork, a further namespace
and a durable append, side by side in one run, all through the public API.

    python -m bench.costs [--quick]

Every figure here goes through the public API only (``import ctxrt`` and the names it re-exports:
``open_runtime``, ``Runtime.open``, ``create_branch``, ``delete_branch``, ``ContextManager.add_message``,
``compile``, ``message_count``, ``Budget``, ``Passthrough``, ``WindowedPassthrough``), so it runs
unchanged over any internals. The raw py-lmdb loops of (d) and (e) are comparisons, not ctxrt.

Stores are built beforehand through ``add_message`` (durability "os", 500 concurrent calls, which the
store actor group-commits), in namespace "builder" on the shared slot: realistic mixed messages of
30-300 tokens (as the runtime's estimator counts them), alternating user and assistant. The budget
is ``Budget(max_tokens=24_000, reserve_for_response=4_000)``: 20,000 usable tokens, about 120 of
those messages.

(a) Cold open + first compile at LARGE messages (200,000; quick: 50,000) against 2,000, for
    Passthrough and WindowedPassthrough. Each sample is a fresh Python process (so no module,
    runtime or slot cache survives from an earlier one) that opens the store (durability "sync",
    the default), opens a namespace of the strategy's own and compiles; the figure is
    ``open_runtime`` + ``rt.open`` + the first ``compile``. The OS page cache is not dropped (that
    needs root and hits the whole machine): the store's files are in memory, so this is a
    process-cold, not a disk-cold, open. One unmeasured process per (size, strategy) opens the
    namespace first, so every measured sample reopens a namespace the store already records (a
    host's restart); that first open is shown beside it (WindowedPassthrough places its anchor
    then). Target: ratio large / small <= 2. The split (open_runtime, rt.open, first compile, a
    second warm compile) and the child's peak RSS are shown beside it.
(b) Fork + first compile: on a runtime whose main branch already compiled the slot (Passthrough),
    ``create_branch`` at the head, ``rt.open`` the same namespace on the new branch, first
    ``compile``; LARGE against 2,000. Target: ratio <= 2. The branch is deleted after each sample.
(c) Memory of each further namespace compiling the same slot at LARGE messages: one namespace
    opened and compiled first (its cost, in RSS, shown for reference), then K more namespaces
    (different names, the same shared slot ``messages``) each opened and compiled once, with
    ``tracemalloc`` tracing only those K; the heap still held after them, divided by K, MiB.
    Target <= 5 MiB. RSS growth per namespace is shown beside it.
(d) Durable ``add_message`` (durability "sync", the default), one at a time, against raw py-lmdb:
    one ``txn.put`` of bytes the size of the stored message and a commit, in a fresh environment
    with the store's settings (sync, metasync, no writemap) in the same temporary filesystem.
    Ratio: ctxrt appends/s / raw puts/s (= raw time / ctxrt time). Target >= 0.9.
(e) 100 concurrent appenders, each with a manager of its own in a namespace of its own (all on the
    shared slot), against 1 appender, durable: appends/s ratio. Target >= 15. Beside it: the same
    100 appenders sharing one manager (no target).
References for (d) and (e), not ctxrt, in the same rounds: the raw loop of (d) with one trio
    checkpoint per append (every ctxrt call is a checkpoint, so no trio API that keeps that rule
    gets above this loop), and a minimal trio group commit (callers park, one committer task puts
    what has queued in one durable transaction and wakes them; no validation, encoding or caches)
    with 100 callers against 1. They bound what the targets of (d) and (e) can reach on the machine.
    The write path's regression guards (issue 27) compare ctxrt with them, ctxrt / reference:
    durable ``add_message`` one at a time / the raw + checkpoint loop >= 0.75, and the 100 concurrent
    appenders / the minimal group commit's 100 callers >= 0.25. Both sides of each wait on the same
    disk in the same rounds, so these two are judged on the median of the per-round ratios: a ratio
    of medians over rounds in the disk's fast and slow modes fell to 0.34 in a run whose per-round
    ratio was 0.59. The disk's speed still moves them: ctxrt's own cost per append is a smaller
    share of a slow commit (0.95 in a run whose raw commits took about 5 ms, 0.58-0.62 at 0.35 ms).
    Beside them: a few µs of plain Python timed right after a durable raw commit and warm; a thread that
    slept in fdatasync runs the Python after it slower, so every µs an append spends in Python costs
    more than a µs in a durable loop.
(f) For reference, no target: a warm Passthrough compile at 20,000 messages (the 20,000-token
    budget, and a budget that holds them all), and a sibling's ``await message_count()`` after one
    append (a runtime with durability "os", as bench/context.py measures it).

(d), (e) and their references run interleaved in the same rounds; every round takes the variants in a
shuffled order.
Figures are medians across rounds (min–max). Results are printed and written to
``bench/results-costs.md``. ``CTXRT_BENCH_DIR`` chooses where the stores live (a real disk, not tmpfs,
or the durable figures mean nothing).

A profile of one cold open + first compile at the large size (not part of the run):

    python -m bench.costs --profile [MESSAGES] [passthrough|windowed]
"""

from __future__ import annotations

import gc
import json
import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import lmdb
import trio

import ctxrt

from . import harness
from .harness import TABLE_HEAD, interleave, measured, scratch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_PATH = HERE / "results-costs.md"
BUDGET = ctxrt.Budget(max_tokens=24_000, reserve_for_response=4_000)
EVERYTHING = ctxrt.Budget(max_tokens=100_000_000, reserve_for_response=0)
SMALL = 2_000
REFERENCE = 20_000
CONCURRENCY = 500
APPENDERS = 100
MAP_SIZE = 1 << 36  # open_runtime's default
STRATEGIES = {"passthrough": ctxrt.Passthrough, "windowed": ctxrt.WindowedPassthrough}
STRATEGY_NAMES = {"passthrough": "Passthrough", "windowed": "WindowedPassthrough"}
MIB = 1024 * 1024


# -- messages --------------------------------------------------------------------------------------

_WORDS = (
    "the plan for the next release covers the store the cache and the views we should check how the "
    "namespace actor answers a compile while a compression call is out and whether the budget holds "
    "after a fork I ran the tests again and two of them failed on the slow machine because the timeout "
    "was too short so I raised it and they pass now could you look at the summary of yesterday's "
    "meeting and tell me what is still open the reviewer asked for a smaller change and a clearer "
    "message about the reader record and the narrowing floor before we merge it into main"
).split()
_CORPUS = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(20_000))
_CHARS_PER_TOKEN = 2.9  # the runtime's estimate for prose


def text(n: int) -> str:
    """Message ``n``: prose of 30-300 estimated tokens (a fixed pseudo-random length per ``n``)."""
    tokens = 30 + (n * 2_654_435_761 % 4_294_967_296) % 271
    length = int(tokens * _CHARS_PER_TOKEN)
    start = (n * 40_503) % (len(_CORPUS) - 1_000)
    return f"[{n}] " + _CORPUS[start:start + length]


def participant(n: int) -> str:
    return "user" if n % 2 == 0 else "assistant"


def stored_size(n: int) -> int:
    """Bytes the store keeps for message ``n`` (participant, one text block, a 13-digit timestamp):
    the compact JSON ``add_message`` stores, computed here without reaching into ctxrt."""
    body = {"participant": participant(n), "content": [{"type": "text", "text": text(n)}],
            "timestamp_ms": 1_700_000_000_000}
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


async def build(directory: Path, count: int) -> float:
    """``count`` messages through ``add_message`` in namespace "builder" (durability "os", CONCURRENCY
    at once, group-committed by the store actor); returns the seconds it took."""
    started = time.perf_counter()
    async with ctxrt.open_runtime(directory, durability="os") as rt:
        writer = await rt.open("builder")
        for first in range(0, count, CONCURRENCY):
            async with trio.open_nursery() as nursery:
                for n in range(first, min(count, first + CONCURRENCY)):
                    nursery.start_soon(writer.add_message, participant(n), text(n))
        assert await writer.message_count() == count
    return time.perf_counter() - started


def _rss_mib() -> float:
    """Resident set size now, MiB (from /proc; the peak from getrusage where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mib() -> float:
    """This process's peak resident set, MiB: /proc's VmHWM (getrusage's ru_maxrss can carry the
    parent's size across fork + exec, so it is only the fallback)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- (a) the cold child ----------------------------------------------------------------------------


async def cold_open(store: str, strategy: str, budget: ctxrt.Budget = BUDGET) -> dict[str, Any]:
    """In this (fresh) process: open_runtime, rt.open, first and second compile; ms of each."""
    namespace = f"cold-{strategy}"
    clock = time.perf_counter_ns
    t0 = clock()
    async with ctxrt.open_runtime(store) as rt:
        t1 = clock()
        manager = await rt.open(namespace, strategy=STRATEGIES[strategy]())
        t2 = clock()
        first = await manager.compile(budget)
        t3 = clock()
        second = await manager.compile(budget)
        t4 = clock()
        count = await manager.message_count()
    t5 = clock()
    assert first.messages and len(second.messages) == len(first.messages)
    return {
        "open_runtime": (t1 - t0) / 1e6, "open": (t2 - t1) / 1e6, "compile": (t3 - t2) / 1e6,
        "second": (t4 - t3) / 1e6, "close": (t5 - t4) / 1e6, "total": (t3 - t0) / 1e6,
        "compiled": len(first.messages), "slot": count,
        "maxrss_mib": _peak_rss_mib(),
    }


def child(argv: list[str]) -> int:
    """``python -m bench.costs --child STORE STRATEGY [MAX_TOKENS RESERVE]``: one cold open (at that
    budget, else BUDGET); one JSON line on stdout."""
    store, strategy, *sizes = argv
    budget = ctxrt.Budget(*map(int, sizes)) if sizes else BUDGET
    gc.collect()
    figures = trio.run(cold_open, store, strategy, budget)
    figures["ctxrt"] = str(Path(ctxrt.__file__).resolve().parent)
    print(json.dumps(figures), flush=True)
    return 0


def run_child(store: Path, strategy: str, budget: ctxrt.Budget = BUDGET) -> dict[str, Any]:
    """One cold open in a fresh interpreter importing this checkout's ctxrt."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-m", "bench.costs", "--child", str(store), strategy,
                           str(budget.max_tokens), str(budget.reserve_for_response)], cwd=str(ROOT),
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"cold-open child ({strategy}, {store.name}) exited {done.returncode}: {tail}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (ROOT / "ctxrt").resolve()
    if Path(figures["ctxrt"]) != expected:
        raise RuntimeError(f"the cold-open child imported {figures['ctxrt']}, not {expected}")
    return figures


# -- (b) fork ----------------------------------------------------------------------------------


async def fork_once(rt: ctxrt.Runtime, name: str, budget: ctxrt.Budget = BUDGET) -> dict[str, float]:
    """create_branch at the head, rt.open the namespace there, first compile; ms of each. The branch
    is deleted after (not timed)."""
    clock = time.perf_counter_ns
    t0 = clock()
    await rt.create_branch(name)
    t1 = clock()
    manager = await rt.open("forker", branch=name, strategy=ctxrt.Passthrough())
    t2 = clock()
    result = await manager.compile(budget)
    t3 = clock()
    assert result.messages
    await manager.aclose()
    await rt.delete_branch(name)
    return {"create": (t1 - t0) / 1e6, "open": (t2 - t1) / 1e6, "compile": (t3 - t2) / 1e6,
            "total": (t3 - t0) / 1e6}


# -- (c) memory per further namespace ----------------------------------------------------------------


async def further_namespaces(rt: ctxrt.Runtime, tag: str, count: int, budget: ctxrt.Budget = BUDGET) -> dict[str, float]:
    """Open ``count`` more namespaces on the shared slot and compile each once, tracing the heap
    they add; MiB per namespace (tracemalloc, and RSS), and ms per open + compile (under tracing)."""
    managers = []
    gc.collect()
    rss_before = _rss_mib()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for k in range(count):
            manager = await rt.open(f"further-{tag}-{k}", strategy=ctxrt.Passthrough())
            result = await manager.compile(budget)
            assert result.messages
            managers.append(manager)
        elapsed = time.perf_counter() - started
        gc.collect()
        traced, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_after = _rss_mib()
    for manager in managers:
        await manager.aclose()
    return {"heap": traced / MIB / count, "peak": peak / MIB, "rss": (rss_after - rss_before) / count,
            "ms": elapsed * 1000 / count}


# -- (d), (e) appends --------------------------------------------------------------------------------


class Appends:
    """The append variants' stores and their running counters."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


async def sequential(manager: ctxrt.ContextManager, counter: Appends, count: int) -> float:
    """Appends/s of one caller awaiting each durable add_message."""
    started = time.perf_counter()
    for _ in range(count):
        n = counter.next()
        await manager.add_message(participant(n), text(n))
    return count / (time.perf_counter() - started)


async def concurrent(managers: list[ctxrt.ContextManager], counter: Appends, each: int) -> float:
    """Appends/s of APPENDERS callers at once (``managers``: one each, or one shared), durable."""

    async def appender(manager: ctxrt.ContextManager) -> None:
        for _ in range(each):
            n = counter.next()
            await manager.add_message(participant(n), text(n))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for task in range(APPENDERS):
            nursery.start_soon(appender, managers[task % len(managers)])
    return APPENDERS * each / (time.perf_counter() - started)


class Raw:
    """A raw py-lmdb environment with the store's settings: one put + durable commit per append.

    With ``checkpoint``, one trio schedule point per append as well: the least any trio API that
    is a checkpoint (as every ctxrt call is) adds to a raw commit (reference, not ctxrt). Without
    ``sync``, commits are not flushed (the store's durability "os"): bench/turn.py's CPU figure.
    """

    def __init__(self, directory: Path, *, sync: bool = True) -> None:
        directory.mkdir(parents=True)
        self.env = lmdb.open(str(directory), map_size=MAP_SIZE, max_dbs=16, sync=sync, metasync=True,
                             writemap=False, max_readers=512, subdir=True)
        self.db = self.env.open_db(b"items")
        self.key = 0
        self.pack = struct.Struct(">Q").pack

    def payloads(self, counter: Appends, count: int) -> list[bytes]:
        return [b"x" * stored_size(counter.next()) for _ in range(count)]

    def put(self, data: bytes) -> None:
        self.key += 1
        with self.env.begin(write=True) as txn:
            txn.put(self.pack(self.key), data, db=self.db)

    async def sequential(self, counter: Appends, count: int, *, checkpoint: bool = False) -> float:
        payloads = self.payloads(counter, count)
        started = time.perf_counter()
        if checkpoint:
            for data in payloads:
                await trio.lowlevel.checkpoint()
                self.put(data)
        else:
            for data in payloads:
                self.put(data)
        elapsed = time.perf_counter() - started
        await trio.lowlevel.checkpoint()
        return count / elapsed

    async def off_the_loop(self, counter: Appends, count: int) -> float:
        """Each put and durable commit in a worker thread (``trio.to_thread.run_sync``): the standard
        way to keep a blocking commit off the loop, as ctxrt's writer thread does (reference)."""
        payloads = self.payloads(counter, count)
        started = time.perf_counter()
        for data in payloads:
            await trio.to_thread.run_sync(self.put, data)
        return count / (time.perf_counter() - started)

    def close(self) -> None:
        self.env.close()


def python_work(n: int) -> int:
    """Reference work, not ctxrt: a few µs of ordinary Python (a message built, checked and encoded)."""
    body = {"participant": participant(n), "content": [{"type": "text", "text": text(n)}], "timestamp_ms": n}
    for key, value in body.items():
        if not isinstance(key, str) or value is None:
            raise AssertionError(key)
    return len(json.dumps(body, separators=(",", ":")))


async def after_commit(raw: Raw, counter: Appends, count: int, *, commit: bool) -> float:
    """µs of ``python_work`` run right after a durable raw commit (``commit``) or with none before it
    (warm). The ratio shows what a thread's sleep in fdatasync costs the Python that runs next."""
    payloads = raw.payloads(counter, count)
    times = []
    for k, data in enumerate(payloads):
        if commit:
            raw.put(data)
        started = time.perf_counter_ns()
        python_work(k)
        times.append(time.perf_counter_ns() - started)
    await trio.lowlevel.checkpoint()
    return statistics.median(times) / 1000


class RawGroup:
    """Reference, not ctxrt: the least a trio group commit costs. Callers park on the loop and a
    committer task puts whatever has queued in ONE durable py-lmdb transaction, then wakes them:
    no validation, encoding, caches or errors. Its 100-to-1 ratio bounds what any trio design of
    this shape reaches on this machine."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.queue: list[tuple[trio.lowlevel.Task, bytes]] = []
        self.committer: trio.lowlevel.Task | None = None
        self.idle = False

    async def serve(self) -> None:
        self.committer = trio.lowlevel.current_task()
        while True:
            if not self.queue:
                self.idle = True
                await trio.lowlevel.wait_task_rescheduled(self._stop)
            await trio.lowlevel.cancel_shielded_checkpoint()  # let the callers woken with the first one join
            batch, self.queue = self.queue, []
            with self.raw.env.begin(write=True) as txn:
                for _, data in batch:
                    self.raw.key += 1
                    txn.put(self.raw.pack(self.raw.key), data, db=self.raw.db)
            for task, _ in batch:
                trio.lowlevel.reschedule(task)

    def _stop(self, _: Any) -> trio.lowlevel.Abort:
        self.idle = False  # cancelled while idle: nothing will wake it again
        return trio.lowlevel.Abort.SUCCEEDED

    async def append(self, data: bytes) -> None:
        # A caller is woken by the committer only: no cancellation while its payload is queued.
        self.queue.append((trio.lowlevel.current_task(), data))
        if self.idle:
            self.idle = False
            assert self.committer is not None
            trio.lowlevel.reschedule(self.committer)
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def run(self, counter: Appends, tasks: int, each: int) -> float:
        """Appends/s of ``tasks`` callers appending ``each`` payloads one after another."""
        payloads = [self.raw.payloads(counter, each) for _ in range(tasks)]

        async def caller(mine: list[bytes]) -> None:
            for data in mine:
                await self.append(data)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for mine in payloads:
                nursery.start_soon(caller, mine)
        return tasks * each / (time.perf_counter() - started)


# -- (f) reference -----------------------------------------------------------------------------------


async def warm_compile(manager: ctxrt.ContextManager, budget: ctxrt.Budget, samples: int) -> float:
    await manager.compile(budget)
    times = []
    for _ in range(samples):
        started = time.perf_counter_ns()
        await manager.compile(budget)
        times.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(times)


async def sibling_count(a: ctxrt.ContextManager, b: ctxrt.ContextManager, counter: Appends, samples: int) -> float:
    times = []
    for _ in range(samples):
        n = counter.next()
        await a.add_message(participant(n), text(n))
        started = time.perf_counter_ns()
        await b.message_count()
        times.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(times)


# -- the run ---------------------------------------------------------------------------------------


def _settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"large": 50_000, "cold_rounds": 5, "fork_rounds": 5, "memory_rounds": 2, "further": 4,
                "append_rounds": 9, "sequential": 200, "each": 20, "reference_rounds": 3, "compiles": 5,
                "counts": 50}
    return {"large": 200_000, "cold_rounds": 7, "fork_rounds": 7, "memory_rounds": 3, "further": 6,
            "append_rounds": 15, "sequential": 300, "each": 30, "reference_rounds": 5, "compiles": 10,
            "counts": 200}


def _log(line: str) -> None:
    print(f"costs: {line}", file=sys.stderr, flush=True)


async def append_rates(root: Path, settings: dict[str, Any], rng: random.Random) -> dict[str, list[float]]:
    """(d), (e): three fresh stores (durability "sync") and the raw references, interleaved."""
    counter = Appends()
    raw = Raw(root / "raw")
    group = RawGroup(Raw(root / "raw-group"))
    try:
        async with ctxrt.open_runtime(root / "one") as one_rt, ctxrt.open_runtime(root / "many") as many_rt, \
                ctxrt.open_runtime(root / "shared") as shared_rt:
            single = await one_rt.open("appender")
            own = [await many_rt.open(f"appender-{k}") for k in range(APPENDERS)]
            shared = await shared_rt.open("appender")
            await sequential(single, counter, 20)
            await raw.sequential(counter, 20)
            await concurrent(own, counter, 2)
            await concurrent([shared], counter, 2)
            async with trio.open_nursery() as committer:
                committer.start_soon(group.serve)
                await group.run(counter, 1, 20)
                appends = await interleave(
                    settings["append_rounds"],
                    {
                        "ctxrt": lambda _: sequential(single, counter, settings["sequential"]),
                        "raw": lambda _: raw.sequential(counter, settings["sequential"]),
                        "raw_checkpoint": lambda _: raw.sequential(counter, settings["sequential"], checkpoint=True),
                        "raw_thread": lambda _: raw.off_the_loop(counter, settings["sequential"]),
                        "own": lambda _: concurrent(own, counter, settings["each"]),
                        "shared": lambda _: concurrent([shared], counter, settings["each"]),
                        "group_one": lambda _: group.run(counter, 1, settings["sequential"]),
                        "group_many": lambda _: group.run(counter, APPENDERS, settings["each"]),
                        "work_warm": lambda _: after_commit(raw, counter, settings["sequential"], commit=False),
                        "work_after_commit": lambda _: after_commit(raw, counter, settings["sequential"], commit=True),
                    },
                    rng,
                )
                committer.cancel_scope.cancel()
    finally:
        raw.close()
        group.raw.close()
    return appends


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    settings = _settings(quick)
    large = settings["large"]
    rng = random.Random(20261212)
    started = time.perf_counter()
    info: dict[str, Any] = {"quick": quick, "settings": settings, "large": large, "build_s": {}}
    with scratch("ctxrt-bench-costs-") as root:
        stores = {"small": root / "small", "large": root / "large", "reference": root / "reference"}
        for name, count in (("small", SMALL), ("large", large), ("reference", REFERENCE)):
            info["build_s"][name] = await build(stores[name], count)
            _log(f"built {count:,} messages in {info['build_s'][name]:.1f} s")
        info["store_mib"] = {name: sum(f.stat().st_size for f in path.iterdir()) / MIB
                             for name, path in stores.items()}

        # (a) cold opens, each in a fresh process; nothing in this process holds those stores open.
        first_open = {(size, strategy): run_child(stores[size], strategy)  # the namespace's first open: not in (a)
                      for size in ("small", "large") for strategy in STRATEGIES}
        cold: dict[tuple[str, str], list[dict[str, Any]]] = {(s, k): [] for s in ("small", "large")
                                                               for k in STRATEGIES}
        for _ in range(settings["cold_rounds"]):
            order = list(cold)
            rng.shuffle(order)
            for size, strategy in order:
                await trio.lowlevel.checkpoint()
                cold[size, strategy].append(run_child(stores[size], strategy))
        _log(f"cold opens done at {time.perf_counter() - started:.0f} s")

        # (c), then (b), on runtimes over the large and small stores (durability "sync").
        async with ctxrt.open_runtime(stores["large"]) as big_rt, ctxrt.open_runtime(stores["small"]) as small_rt:
            gc.collect()
            rss_before = _rss_mib()
            first_started = time.perf_counter()
            base = await big_rt.open("forker", strategy=ctxrt.Passthrough())
            await base.compile(BUDGET)
            first_ms = (time.perf_counter() - first_started) * 1000
            gc.collect()
            info["first_namespace"] = {"rss_mib": _rss_mib() - rss_before, "ms": first_ms}
            memory = []
            for round_ in range(settings["memory_rounds"]):
                memory.append(await further_namespaces(big_rt, str(round_), settings["further"]))
            _log(f"memory done at {time.perf_counter() - started:.0f} s")

            small_base = await small_rt.open("forker", strategy=ctxrt.Passthrough())
            await small_base.compile(BUDGET)
            for rt in (big_rt, small_rt):  # warm-up: one fork each, not measured
                await fork_once(rt, "warm-up")
            forks = await interleave(
                settings["fork_rounds"],
                {"large": lambda r: fork_once(big_rt, f"fork-{r}"), "small": lambda r: fork_once(small_rt, f"fork-{r}")},
                rng,
            )
        _log(f"forks done at {time.perf_counter() - started:.0f} s")

        appends = await append_rates(root, settings, rng)
        _log(f"appends done at {time.perf_counter() - started:.0f} s")

        # (f) reference figures at 20,000 messages, durability "os".
        counter = Appends()
        async with ctxrt.open_runtime(stores["reference"], durability="os") as rt:
            a = await rt.open("resident-a")
            b = await rt.open("resident-b")
            await b.compile(BUDGET)
            reference = await interleave(
                settings["reference_rounds"],
                {
                    "budget": lambda _: warm_compile(b, BUDGET, settings["compiles"]),
                    "everything": lambda _: warm_compile(b, EVERYTHING, settings["compiles"]),
                    "count": lambda _: sibling_count(a, b, counter, settings["counts"]),
                },
                rng,
            )
    info["seconds"] = time.perf_counter() - started
    return _rows(settings, cold, first_open, memory, forks, appends, reference, info), info


def _split(samples: list[dict[str, Any]], first: dict[str, Any]) -> str:
    def part(key: str) -> str:
        return harness.median_figure(harness.summary(s[key] for s in samples), "ms")

    return (f"open_runtime {part('open_runtime')}, rt.open {part('open')}, first compile {part('compile')}, "
            f"second compile {part('second')}; peak RSS "
            f"{statistics.median(s['maxrss_mib'] for s in samples):,.0f} MiB; the namespace's first open ever (one "
            f"process, not in the figure): {first['total']:,.0f} ms, of which rt.open {first['open']:,.0f} ms and "
            f"first compile {first['compile']:,.1f} ms")


def _rows(settings: dict[str, Any], cold: dict[tuple[str, str], list[dict[str, Any]]],
          first_open: dict[tuple[str, str], dict[str, Any]], memory: list[dict[str, float]],
          forks: dict[str, list[dict[str, float]]], appends: dict[str, list[float]],
          reference: dict[str, list[float]], info: dict[str, Any]) -> list[dict[str, Any]]:
    large = settings["large"]
    sizes = f"{large:,} vs {SMALL:,}"
    rows: list[dict[str, Any]] = []
    for strategy in STRATEGIES:
        big, small = cold["large", strategy], cold["small", strategy]
        rows.append(harness.versus(
            f"(a) cold open + first compile, {STRATEGY_NAMES[strategy]}, {sizes} messages", "ms",
            [s["total"] for s in big], [s["total"] for s in small], f"at {SMALL:,}", target=2, op="<=",
            ratio_means=f"{large // 1000}k / 2k",
            split=f"at {large:,}: {_split(big, first_open['large', strategy])}. "
                  f"At {SMALL:,}: {_split(small, first_open['small', strategy])}.",
        ))
    big_fork, small_fork = forks["large"], forks["small"]
    rows.append(harness.versus(
        f"(b) fork (create_branch at the head) + rt.open on it + first compile, Passthrough, {sizes}", "ms",
        [f["total"] for f in big_fork], [f["total"] for f in small_fork], f"at {SMALL:,}", target=2, op="<=",
        ratio_means=f"{large // 1000}k / 2k",
        split="; ".join(
            f"at {label}: create_branch {harness.median_figure(harness.summary(f['create'] for f in samples), 'ms')}, rt.open "
            f"{harness.median_figure(harness.summary(f['open'] for f in samples), 'ms')}, first compile "
            f"{harness.median_figure(harness.summary(f['compile'] for f in samples), 'ms')}"
            for label, samples in ((f"{large:,}", big_fork), (f"{SMALL:,}", small_fork))) + ".",
    ))
    first = info["first_namespace"]
    rows.append(harness.row(
        f"(c) heap held per further namespace compiling the shared slot at {large:,} messages (tracemalloc, "
        f"{settings['further']} namespaces a round)", "MiB", [m["heap"] for m in memory], target=5, op="<=",
        comparison=f"RSS growth per further namespace: {harness.median_figure(harness.summary(m['rss'] for m in memory), 'MiB')}; "
                   f"the first namespace (it loads the slot): {first['rss_mib']:,.0f} MiB RSS, {first['ms']:,.0f} ms; "
                   f"a further open + compile under tracing: "
                   f"{harness.median_figure(harness.summary(m['ms'] for m in memory), 'ms')}",
        comparison_label=None, ratio=None,
    ))
    rows.append(harness.versus(
        "(d) durable add_message, one at a time (durability \"sync\") vs raw py-lmdb put + durable commit", "appends/s",
        appends["ctxrt"], appends["raw"], "raw py-lmdb", target=0.9, op=">=", ratio_means="ctxrt / raw",
    ))
    rows.append(harness.versus(
        f"(e) durable add_message, {APPENDERS} concurrent appenders (a manager and namespace each) vs 1", "appends/s",
        appends["own"], appends["ctxrt"], "1 appender", target=15, op=">=", ratio_means=f"{APPENDERS} / 1",
    ))
    rows.append(harness.versus(
        f"(e) the same, {APPENDERS} appenders sharing one manager vs 1", "appends/s",
        appends["shared"], appends["ctxrt"], "1 appender", target=None, op=None, ratio_means=f"{APPENDERS} / 1",
    ))
    rows.append(harness.versus(
        "(d) reference, not ctxrt: raw py-lmdb put + durable commit + one trio checkpoint, vs raw alone: the "
        "most a trio API that checkpoints can reach", "appends/s",
        appends["raw_checkpoint"], appends["raw"], "raw py-lmdb", target=None, op=None,
        ratio_means="raw + checkpoint / raw",
    ))
    rows.append(harness.versus(
        "(d) durable add_message vs that raw + checkpoint loop", "appends/s",
        appends["ctxrt"], appends["raw_checkpoint"], "raw + checkpoint", target=0.75, op=">=", by_round=True,
        ratio_means="ctxrt / raw + checkpoint",
    ))
    rows.append(harness.versus(
        "(d) reference, not ctxrt: raw py-lmdb put + durable commit in a worker thread (trio.to_thread), the "
        "loop free during the flush, vs raw + checkpoint on the loop", "appends/s",
        appends["raw_thread"], appends["raw_checkpoint"], "raw + checkpoint", target=None, op=None, by_round=True,
        ratio_means="off the loop / on it",
    ))
    rows.append(harness.versus(
        "(d) durable add_message (committed by the store's writer thread, off the loop) vs that raw commit off "
        "the loop", "appends/s",
        appends["ctxrt"], appends["raw_thread"], "raw off the loop", target=None, op=None, by_round=True,
        ratio_means="ctxrt / raw off the loop",
    ))
    rows.append(harness.versus(
        "(d) reference, not ctxrt: the same few µs of plain Python run right after a durable raw commit vs warm",
        "µs", appends["work_after_commit"], appends["work_warm"], "warm", target=None, op=None,
        ratio_means="after a commit / warm",
    ))
    rows.append(harness.versus(
        f"(e) reference, not ctxrt: a minimal trio group commit over raw py-lmdb puts, {APPENDERS} callers vs 1",
        "appends/s", appends["group_many"], appends["group_one"], "1 caller", target=None, op=None,
        ratio_means=f"{APPENDERS} / 1",
    ))
    rows.append(harness.versus(
        f"(e) {APPENDERS} concurrent add_message appenders vs that minimal group commit's {APPENDERS} callers",
        "appends/s", appends["own"], appends["group_many"], "minimal group commit", target=0.25, op=">=",
        by_round=True, ratio_means="ctxrt / minimal",
    ))
    rows.append(harness.row(
        f"(f) warm Passthrough compile at {REFERENCE:,} messages, the 20,000-token budget", "ms",
        reference["budget"], target=None, op=None, comparison="", comparison_label=None, ratio=None,
    ))
    rows.append(harness.row(
        f"(f) warm Passthrough compile at {REFERENCE:,} messages, a budget that holds them all", "ms",
        reference["everything"], target=None, op=None, comparison="", comparison_label=None, ratio=None,
    ))
    rows.append(harness.row(
        f"(f) sibling's `await message_count()` after 1 append, {REFERENCE:,} messages (durability \"os\")", "µs",
        reference["count"], target=None, op=None, comparison="", comparison_label=None, ratio=None,
    ))
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(f); one dict per figure (figures, ratio, target, passed)."""
    return harness.run_trio(_run, quick)


# -- markdown --------------------------------------------------------------------------------------



def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    settings, large = first["settings"], first["large"]
    builds = ", ".join(f"{n:,} messages {first['build_s'][k]:.1f} s ({first['store_mib'][k]:,.0f} MiB on disk)"
                       for k, n in (("small", SMALL), ("large", large), ("reference", REFERENCE)))
    lines = [
        "## Costs",
        "",
        measured("costs", first["quick"], f"py-lmdb {lmdb.__version__}", f"trio {trio.__version__}")
        + f" The whole run took {first['seconds']:.0f} s.",
        "",
        "**Every ctxrt figure goes through the public API** (`import ctxrt`: `open_runtime`, `Runtime.open`, "
        "`create_branch`, `add_message`, `compile`, `message_count`, ...); none reaches into the store, the "
        "slot caches or the views. Stores were built through `add_message` (durability \"os\", 500 concurrent "
        "calls): " + builds + ". Messages are prose of 30–300 estimated tokens, alternating user and assistant; "
        "the budget is `Budget(max_tokens=24_000, reserve_for_response=4_000)` (20,000 usable tokens).",
        "",
        (f"(a) runs each sample in a fresh Python process ({settings['cold_rounds']} per size and strategy, in a "
        "shuffled order; one unmeasured process first opens each namespace, so every sample reopens one the "
        "store records). The OS page cache is not dropped: the store's files are in memory, so these are "
        f"process-cold, not disk-cold, opens. (b): {settings['fork_rounds']} rounds; (c): "
        f"{settings['memory_rounds']} rounds of {settings['further']} further namespaces; (d), (e): "
        f"{settings['append_rounds']} rounds interleaved, {settings['sequential']} sequential appends or "
        f"{APPENDERS} × {settings['each']} concurrent ones per variant and round; (f): "
        f"{settings['reference_rounds']} rounds. Figures are medians across rounds (min–max); ratios are "
        "ratios of medians."),
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        unit = row["unit"]
        comparison = row.get("comparison")
        if isinstance(comparison, dict):
            comparison = f"{row['comparison_label']}: {harness.median_figure(comparison, unit)}"
        ratio = "" if row.get("ratio") is None else f"{row['ratio']:,.2f} ({row['ratio_means']})"
        if row.get("by_round"):
            ratio += f"; per round {row['paired_ratio']:,.2f}, judged"
        target = "" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {harness.median_figure(row['ctxrt'], unit)} | {comparison or ''} | {ratio} "
                     f"| {target} | {verdict} |")
    lines += ["", harness.paired_line(rows), "",
              ("The rows marked \"reference, not ctxrt\" time raw py-lmdb loops (their figures sit in the ctxrt "
              "column): one put and durable commit per append with one trio checkpoint added, and a minimal trio "
              "group commit with no validation, encoding or caches. They show how near the targets of (d) and (e) "
              "any trio code gets on this machine, and the rows after them compare ctxrt with those loops: "
              "those two ratios are the write path's regression guards (issue 27: >= 0.75 and >= 0.25), judged "
              "on the median of the per-round ratios, since both sides of each wait on the same disk in a round."),
              "", "Where the time goes (medians, min–max):", ""]
    lines += [f"- {row['measure']}: {row['split']}" for row in rows if row.get("split")]
    return "\n".join(lines) + "\n"


main = harness.entry("costs", __doc__, run, to_markdown, RESULTS_PATH, quick_help="a 50,000-message large store, "
                     "fewer rounds (about 3 minutes)")


# -- profile ---------------------------------------------------------------------------------------


def profile(argv: list[str]) -> int:
    """``--profile [MESSAGES] [STRATEGY]``: build a store, then profile one cold open + first compile
    in a fresh process; print the top 25 lines by cumulative time."""
    count = int(argv[0]) if argv else 200_000
    strategy = argv[1] if len(argv) > 1 else "passthrough"
    with scratch("ctxrt-bench-costs-profile-") as root:
        seconds = trio.run(build, root / "store", count)
        print(f"built {count:,} messages in {seconds:.1f} s", file=sys.stderr)
        run_child(root / "store", strategy)  # the namespace's first open
        code = ("import cProfile, pstats, sys, trio; from bench.costs import cold_open; "
                "profiler = cProfile.Profile(); profiler.enable(); "
                "figures = trio.run(cold_open, sys.argv[1], sys.argv[2]); profiler.disable(); print(figures); "
                "pstats.Stats(profiler).sort_stats('cumulative').print_stats(25)")
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, "-c", code, str(root / "store"), strategy], cwd=str(ROOT),
                              env=env, check=False).returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        raise SystemExit(child(sys.argv[2:]))
    if sys.argv[1:2] == ["--profile"]:
        raise SystemExit(profile(sys.argv[2:]))
    raise SystemExit(main())
