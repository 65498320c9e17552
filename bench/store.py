"""Store benchmarks: ratios measured side by side in one run on this machine (K2, K6, limits.md).

    python -m bench.store [--quick]

Every measure compares two variants. Both run in the same process and in the same rounds, in a
shuffled order each round (A/B/B/A...). Each figure is the median of its rounds, and each ratio
is a ratio of medians. The host is noisy: limits.md reports ±30-50% between runs of
CPU-bound figures, so read the min-max ranges too.

(a) A durable sequential append of ~200 B through the store actor, against a raw py-lmdb loop
    that does one put and one durable commit per append. The raw loop runs in a fresh env with
    the store's settings. Target: throughput ratio ctxrt/raw >= 0.8.
(b) 100 concurrent appenders against 1, both durable (K6). Target: throughput ratio >= 10.
(c) ``create_branch``, and a point read (``engine.log_item`` at a random index in a fresh read
    txn), at 200,000 items against 2,000 items (K2). Target: cost ratio <= 1.5 each.
(d) A durable append at 200,000 items against one at 2,000. Target: cost ratio <= 1.2.

The stores for (c) and (d) are built quickly with durability "os" and big ``Atomically``
batches. They are then reopened with durability "sync" for measuring. Results are printed and
written to ``bench/results-store.md``. Set ``CTXRT_BENCH_DIR`` to choose where the stores live.
That place must be a real disk, not tmpfs, or the durable figures mean nothing.
"""

from __future__ import annotations

import functools
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import lmdb
import trio

from ctxrt.runtime import Runtime, open_runtime
from ctxrt.store import keys
from ctxrt.store.protocol import AppendItem, Atomically, RegisterState

from . import harness
from .harness import TABLE_HEAD, interleave, measured, paired_line, scratch, versus

RESULTS_PATH = Path(__file__).with_name("results-store.md")
STATE = "bench-log"
MAP_SIZE = 1 << 36  # the store's default
BIG, SMALL = 200_000, 2_000


def _message(n: int) -> bytes:
    """A ~200 B compact-JSON chat message, as limits.md measures."""
    body = f'{{"participant":"user","content":[{{"type":"text","text":"message {n:08d} '
    data = body + "x" * (196 - len(body)) + '"}]}'
    return data.encode()


# -- variants: each returns one figure (per second, or microseconds per operation) ----------------


async def ctxrt_sequential(directory: Path, count: int) -> float:
    """Appends/s of one caller awaiting each durable append through the actor, on a fresh store."""
    async with open_runtime(directory, durability="sync") as rt:
        await rt.store.ask(RegisterState(name=STATE, kind="log"))
        for n in range(20):  # warm-up
            await rt.store.ask(AppendItem(state=STATE, branch="main", data=_message(n)))
        started = time.perf_counter()
        for n in range(count):
            await rt.store.ask(AppendItem(state=STATE, branch="main", data=_message(n)))
        elapsed = time.perf_counter() - started
    return count / elapsed


async def ctxrt_concurrent(directory: Path, tasks: int, each: int) -> float:
    """Appends/s of ``tasks`` callers appending at once (durable, group-committed), on a fresh store."""
    async with open_runtime(directory, durability="sync") as rt:
        await rt.store.ask(RegisterState(name=STATE, kind="log"))
        for n in range(20):
            await rt.store.ask(AppendItem(state=STATE, branch="main", data=_message(n)))

        async def appender(task: int) -> None:
            for n in range(each):
                await rt.store.ask(AppendItem(state=STATE, branch="main", data=_message(task * each + n)))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(appender, task)
        elapsed = time.perf_counter() - started
    return tasks * each / elapsed


async def raw_lmdb_sequential(directory: Path, count: int) -> float:
    """Puts/s of a raw py-lmdb loop, one put + durable commit each, in a fresh env with the store's settings."""
    directory.mkdir(parents=True)
    env = lmdb.open(
        str(directory), map_size=MAP_SIZE, max_dbs=len(keys.ALL_DBS) + 2, sync=True, metasync=True,
        writemap=False, max_readers=512, subdir=True,
    )
    try:
        db = env.open_db(b"items")
        pack = keys.U64.pack
        for n in range(20):
            with env.begin(write=True) as txn:
                txn.put(pack(n), _message(n), db=db)
        started = time.perf_counter()
        for n in range(20, 20 + count):
            with env.begin(write=True) as txn:
                txn.put(pack(n), _message(n), db=db)
        elapsed = time.perf_counter() - started
    finally:
        env.close()
    await trio.lowlevel.checkpoint()
    return count / elapsed


async def create_branch_cost(rt: Runtime, count: int, tag: str) -> float:
    """Microseconds per durable ``create_branch``."""
    started = time.perf_counter()
    for n in range(count):
        await rt.create_branch(f"{tag}-{n}")
    return (time.perf_counter() - started) / count * 1e6


async def point_read_cost(rt: Runtime, count: int, rng: random.Random) -> float:
    """Microseconds per ``engine.log_item`` at a random index, each in a fresh read txn."""
    engine = rt.engine
    with engine.reader() as txn:
        length = engine.log_head(txn, STATE, engine.branch("main")).length
    indexes = [rng.randrange(length) for _ in range(count)]
    started = time.perf_counter()
    for index in indexes:
        with engine.reader() as txn:
            item = engine.log_item(txn, STATE, engine.branch("main"), index)
        assert item is not None
    elapsed = time.perf_counter() - started
    await trio.lowlevel.checkpoint()
    return elapsed / count * 1e6


async def append_cost(rt: Runtime, count: int) -> float:
    """Microseconds per durable sequential append through the actor."""
    started = time.perf_counter()
    for n in range(count):
        await rt.store.ask(AppendItem(state=STATE, branch="main", data=_message(n)))
    return (time.perf_counter() - started) / count * 1e6


async def build_store(directory: Path, items: int) -> None:
    """Fill a store with ``items`` appends quickly: durability "os" and 5,000-append Atomically groups."""
    async with open_runtime(directory, durability="os") as rt:
        await rt.store.ask(RegisterState(name=STATE, kind="log"))
        chunk = 5_000
        for first in range(0, items, chunk):
            group = tuple(
                AppendItem(state=STATE, branch="main", data=_message(n)) for n in range(first, min(items, first + chunk))
            )
            await rt.store.ask(Atomically(commands=group))


# -- the run -------------------------------------------------------------------------------------


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(20240611)
    rounds = 3 if quick else 11
    with scratch("ctxrt-bench-") as root:
        fresh = iter(range(1_000_000))

        def new_directory() -> Path:
            return root / f"fresh-{next(fresh)}"

        async def in_fresh(body: Callable[[Path], Awaitable[float]]) -> float:
            directory = new_directory()
            try:
                return await body(directory)
            finally:
                shutil.rmtree(directory, ignore_errors=True)

        sequential = 200 if quick else 500
        tasks, each = 100, (20 if quick else 40)
        throughput = await interleave(
            rounds,
            {
                "raw": lambda _: in_fresh(lambda d: raw_lmdb_sequential(d, sequential)),
                "ctxrt 1": lambda _: in_fresh(lambda d: ctxrt_sequential(d, sequential)),
                "ctxrt 100": lambda _: in_fresh(lambda d: ctxrt_concurrent(d, tasks, each)),
            },
            rng,
        )

        big_path, small_path = root / "big", root / "small"
        started = time.perf_counter()
        await build_store(big_path, BIG)
        await build_store(small_path, SMALL)
        build_s = time.perf_counter() - started
        branches = 50 if quick else 100
        reads = 10_000 if quick else 20_000
        appends = 100 if quick else 300
        async with open_runtime(big_path) as big, open_runtime(small_path) as small:
            scale = await interleave(
                rounds,
                {
                    "branch big": lambda r: create_branch_cost(big, branches, f"r{r}"),
                    "branch small": lambda r: create_branch_cost(small, branches, f"r{r}"),
                    "read big": lambda _: point_read_cost(big, reads, rng),
                    "read small": lambda _: point_read_cost(small, reads, rng),
                    "append big": lambda _: append_cost(big, appends),
                    "append small": lambda _: append_cost(small, appends),
                },
                rng,
            )

    rows = [
        versus("(a) durable sequential append, 200 B: actor vs raw py-lmdb put+commit", "appends/s",
               throughput["ctxrt 1"], throughput["raw"], "raw py-lmdb", target=0.8, op=">="),
        versus("(b) durable appends, 100 concurrent appenders vs 1 (K6)", "appends/s",
               throughput["ctxrt 100"], throughput["ctxrt 1"], "1 appender", target=10.0, op=">="),
        versus(f"(c) create_branch at {BIG:,} items vs {SMALL:,} (K2)", "µs/op",
               scale["branch big"], scale["branch small"], f"at {SMALL:,}", target=1.5, op="<="),
        versus(f"(c) point read (log_item, fresh txn) at {BIG:,} items vs {SMALL:,}", "µs/op",
               scale["read big"], scale["read small"], f"at {SMALL:,}", target=1.5, op="<="),
        versus(f"(d) durable append at {BIG:,} items vs {SMALL:,}", "µs/op",
               scale["append big"], scale["append small"], f"at {SMALL:,}", target=1.2, op="<="),
    ]
    return rows, {"build_s": build_s, "quick": quick}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every store ratio; one dict per measure (figures, ratio, target, passed)."""
    return harness.run_trio(_run, quick)


# Every number of a figure at its median's precision: no decimals from 100 up, else one.
PRECISION: harness.Precision = ((100, ",.0f"), (0, ",.1f"))


_figure = functools.partial(harness.figure, precision=PRECISION, shared=True)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown section: a table of measure, ctxrt, comparison, ratio, target, pass/fail."""
    first = rows[0]
    lines = [
        "## Store",
        "",
        measured("store", first["quick"], f"py-lmdb {lmdb.__version__}", f"trio {trio.__version__}")
        + f" {first['rounds']} rounds; variants interleaved in a shuffled order each round; figures are medians "
        f"(min–max across rounds); ratios are ratios of medians. The {BIG:,}-item store took "
        f"{first['build_s']:.1f} s to build (durability \"os\", 5,000-append Atomically groups); "
        "every measured write is durable (\"sync\").",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        lines.append(
            f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} "
            f"| {row['comparison_label']}: {_figure(row['comparison'], row['unit'])} "
            f"| {row['ratio']:.2f} | {row['op']} {row['target']:g} | {'pass' if row['passed'] else '**fail**'} |"
        )
    lines += ["", paired_line(rows)]
    return "\n".join(lines) + "\n"


main = harness.entry("store", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and smaller samples")


if __name__ == "__main__":
    raise SystemExit(main())
