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

import argparse
import gc
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import lmdb
import trio

from ctxrt.runtime import Runtime, open_runtime
from ctxrt.store import keys
from ctxrt.store.protocol import AppendItem, Atomically, RegisterState

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


# -- the harness -------------------------------------------------------------------------------------


async def interleave(
    rounds: int, variants: dict[str, Callable[[int], Awaitable[float]]], rng: random.Random
) -> dict[str, list[float]]:
    """Run every variant once per round, in a shuffled order each round; return each one's figures."""
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            gc.collect()
            figures[name].append(await variants[name](round_))
    return figures


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _row(
    measure: str, unit: str, ctxrt: list[float], comparison: list[float], comparison_label: str,
    target: float, op: str,
) -> dict[str, Any]:
    mine, theirs = _summary(ctxrt), _summary(comparison)
    ratio = mine["median"] / theirs["median"]
    # Both variants ran in the same rounds, so per-round ratios cancel slow drift of the host.
    paired = statistics.median(a / b for a, b in zip(ctxrt, comparison))
    passed = ratio >= target if op == ">=" else ratio <= target
    return {
        "measure": measure,
        "unit": unit,
        "ctxrt": mine,
        "comparison": theirs,
        "comparison_label": comparison_label,
        "ratio": ratio,
        "paired_ratio": paired,
        "target": target,
        "op": op,
        "passed": passed,
        "rounds": len(ctxrt),
    }


async def _run(quick: bool) -> list[dict[str, Any]]:
    rng = random.Random(20240611)
    rounds = 3 if quick else 11
    base = os.environ.get("CTXRT_BENCH_DIR") or None
    with tempfile.TemporaryDirectory(prefix="ctxrt-bench-", dir=base) as tmp:
        root = Path(tmp)
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
        _row("(a) durable sequential append, 200 B: actor vs raw py-lmdb put+commit", "appends/s",
             throughput["ctxrt 1"], throughput["raw"], "raw py-lmdb", 0.8, ">="),
        _row("(b) durable appends, 100 concurrent appenders vs 1 (K6)", "appends/s",
             throughput["ctxrt 100"], throughput["ctxrt 1"], "1 appender", 10.0, ">="),
        _row(f"(c) create_branch at {BIG:,} items vs {SMALL:,} (K2)", "µs/op",
             scale["branch big"], scale["branch small"], f"at {SMALL:,}", 1.5, "<="),
        _row(f"(c) point read (log_item, fresh txn) at {BIG:,} items vs {SMALL:,}", "µs/op",
             scale["read big"], scale["read small"], f"at {SMALL:,}", 1.5, "<="),
        _row(f"(d) durable append at {BIG:,} items vs {SMALL:,}", "µs/op",
             scale["append big"], scale["append small"], f"at {SMALL:,}", 1.2, "<="),
    ]
    for row in rows:
        row["build_s"] = build_s
        row["quick"] = quick
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every store ratio; one dict per measure (figures, ratio, target, passed)."""
    return trio.run(_run, quick)


def _figure(summary: dict[str, float], unit: str) -> str:
    digits = 0 if summary["median"] >= 100 else 1
    return f"{summary['median']:,.{digits}f} {unit} ({summary['min']:,.{digits}f}–{summary['max']:,.{digits}f})"


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown section: a table of measure, ctxrt, comparison, ratio, target, pass/fail."""
    first = rows[0]
    lines = [
        "## Store",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} by `python -m bench.store{' --quick' if first['quick'] else ''}`: "
        f"Python {platform.python_version()}, py-lmdb {lmdb.__version__}, trio {trio.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}. "
        f"{first['rounds']} rounds; variants interleaved in a shuffled order each round; figures are medians "
        f"(min–max across rounds); ratios are ratios of medians. The {BIG:,}-item store took "
        f"{first['build_s']:.1f} s to build (durability \"os\", 5,000-append Atomically groups); "
        "every measured write is durable (\"sync\").",
        "",
        "| measure | ctxrt | comparison | ratio | target | pass/fail |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} "
            f"| {row['comparison_label']}: {_figure(row['comparison'], row['unit'])} "
            f"| {row['ratio']:.2f} | {row['op']} {row['target']:g} | {'pass' if row['passed'] else '**fail**'} |"
        )
    lines += [
        "",
        "Median of the per-round ratios (each round ran both variants): "
        + "; ".join(f"{row['measure'].split(' ', 1)[0]} {row['paired_ratio']:.2f}" for row in rows)
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and smaller samples")
    arguments = parser.parse_args(argv)
    rows = run(quick=arguments.quick)
    text = to_markdown(rows)
    RESULTS_PATH.write_text(text)
    print(text)
    print(f"written to {RESULTS_PATH}", file=sys.stderr)
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
