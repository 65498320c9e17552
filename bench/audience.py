"""Audience benchmarks (F1-F3), measured side by side in one run.

    python -m bench.audience [--quick]

Stores are built quickly (durability "os", 500 concurrent ``add_message`` calls that the store
actor group-commits) by a manager with no reader; in a store "with audience blocks", one message
in 100 holds a text block whose audience names ann. Every figure is the median of its rounds
(min-max across rounds); each round runs the variants once, in a shuffled order.

F1. The read-time reader check, *internal path*: ``check_reader(record, reader, place)``
    (``ctxrt.namespace.core``, the pure function the namespace actor runs on every request) in a
    tight loop, ns per call, on the record ann's namespace actor holds (read once through
    ``await manager.inspect()``), over 2,000 and over 200,000 messages (an in-memory comparison;
    the store's size should not show). Target: under 1,000 ns at both sizes. Beside it, the
    seed's 0.51-1.06 µs per check (Bun, 20,000 messages). Not the product's figure: the public
    one is what a request through the namespace actor's mailbox costs, ``await manager.health()``
    on the same manager, median µs per call, at both sizes.
F2. A write's cost with a reader and 1 audience block per 100 messages against no reader and no
    audience block, at 5,000 and 50,000 messages, under Autobiographical with a recent window
    that holds everything (no chunk closes, no model call: the seed's set-up). Both stores are
    open side by side and written alternately, write by write. Two figures each: (i)
    ``add_message`` alone; (ii) ``add_message`` then ``tick()``, so the strategy sees every write
    (its reader view of the new message, ``on_new_message``, its rebuild). Target: ratio
    (reader / none) <= 1.1, beside the seed's 0.71 vs 0.90 ms at 5,000 and 7.8 vs 8.4-9.0 ms at
    20,000.
F3. A compile in ann's view at 20,000 messages (with audience blocks) after one append:
    messages re-projected (``ReaderListing.projected`` delta, read through ``inspect()``'s copy: an
    internal path; target 1) and the compile's time
    (Passthrough, a 2,000-token budget so the figure is the view's, not emission's), beside a
    compile after one edit, which rewrites the slot and re-projects everything.

Results are printed and written to ``bench/results-audience.md``. ``CTXRT_BENCH_DIR`` chooses
where the stores live.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import lmdb
import trio

from ctxrt import Autobiographical, Budget, Text
from ctxrt.namespace.core import Place, check_reader
from ctxrt.runtime import open_runtime

from . import harness
from .harness import TABLE_HEAD, fill, interleave, measured, scratch, summary

RESULTS_PATH = Path(__file__).with_name("results-audience.md")
SEED_CHECK_US = (0.51, 1.06)
SEED_WRITE = {5_000: "seed at 5,000: 0.71 vs 0.90 ms, 1.27x", 50_000: "seed at 20,000: 7.8 vs 8.4–9.0 ms, 1.08–1.15x"}
VIEW_BUDGET = Budget(max_tokens=2_000, reserve_for_response=0)


def _text(n: int) -> str:
    return f"resident message {n:07d}: the quick brown fox jumps over the lazy dog"


def _content(n: int, audience: bool) -> Any:
    """Message ``n``: every hundredth holds a line for ann when the store has audience blocks."""
    if audience and n % 100 == 0:
        return [Text(f"[for ann] channel note {n}", audience=("ann",)), Text(_text(n))]
    return _text(n)


async def build(directory: Path, count: int, *, audience: bool) -> float:
    return await fill(directory, count, functools.partial(_content, audience=audience))


def _memory() -> Autobiographical:
    """The seed's set-up: a recent window that holds everything, so nothing compresses."""
    return Autobiographical("bench-model", head_window_tokens=0, recent_window_tokens=1_000_000_000)


# -- measures ---------------------------------------------------------------------------------


async def check_cost(directory: Path, calls: int, requests: int) -> dict[str, float]:
    """On ann's namespace over the store at ``directory``: ns per ``check_reader(record, "ann", place)``
    on the record its actor holds (internal path), and the median µs of ``await manager.health()``,
    a request through the actor's mailbox (public API)."""
    async with open_runtime(directory, durability="os") as rt:
        manager = await rt.open("agents/check", view_reader="ann")
        await manager.compile(VIEW_BUDGET)
        record, place = (await manager.inspect()).record, Place(manager.namespace, manager.branch)
        assert record == "ann", record
        started = time.perf_counter_ns()
        for _ in range(calls):
            check_reader(record, "ann", place)
        elapsed = time.perf_counter_ns() - started
        await manager.health()
        times = []
        for _ in range(requests):
            begun = time.perf_counter_ns()
            await manager.health()
            times.append((time.perf_counter_ns() - begun) / 1000)
        await manager.aclose()
    return {"check_ns": elapsed / calls, "request_us": statistics.median(times)}


async def write_costs(reader_store: Path, plain_store: Path, *, writes: int, offset: int) -> dict[str, dict[str, float]]:
    """ms per write for both variants, open side by side and alternating write by write (so drift
    on a busy host hits both alike): add_message alone, and add_message followed by tick()."""
    async with open_runtime(reader_store, durability="os") as with_reader, \
            open_runtime(plain_store, durability="os") as plain:
        managers = {
            "reader": await with_reader.open("agents/writer", strategy=_memory(), view_reader="ann"),
            "none": await plain.open("agents/writer", strategy=_memory()),
        }
        for manager in managers.values():
            await manager.compile(VIEW_BUDGET)  # warm: the strategy and its view have seen everything
            await manager.tick()
        samples: dict[str, dict[str, list[float]]] = {name: {"alone": [], "tick": []} for name in managers}
        for k in range(writes):
            order = list(managers) if k % 2 else list(reversed(managers))
            for name in order:
                manager, audience, n = managers[name], name == "reader", offset + 2 * k
                started = time.perf_counter_ns()
                await manager.add_message("user", _content(n, audience))
                samples[name]["alone"].append((time.perf_counter_ns() - started) / 1e6)
                started = time.perf_counter_ns()
                await manager.add_message("user", _content(n + 1, audience))
                await manager.tick()
                samples[name]["tick"].append((time.perf_counter_ns() - started) / 1e6)
        for manager in managers.values():
            await manager.aclose()
    return {name: {part: statistics.median(values) for part, values in parts.items()}
            for name, parts in samples.items()}


async def reprojection(directory: Path, samples: int) -> dict[str, float]:
    """Ann's compile at 20,000 messages after one append and after one edit: ms and messages re-projected."""
    async with open_runtime(directory, durability="os") as rt:
        ann = await rt.open("agents/view", view_reader="ann")
        writer = await rt.open("builder")
        await ann.compile(VIEW_BUDGET)
        snapshot = await ann.inspect()
        assert snapshot.caches[0].may_hold_audience, "the store holds audience blocks: ann's view projects"

        async def projected() -> int:  # how many messages ann's listing has projected (a copy, through inspect())
            return (await ann.inspect()).reader_listing.projected

        append_ms, append_projected, edit_ms, edit_projected = [], [], [], []
        for n in range(samples):
            mid = await writer.add_message("user", _content(100 * n, True))
            before = await projected()
            started = time.perf_counter_ns()
            await ann.compile(VIEW_BUDGET)
            append_ms.append((time.perf_counter_ns() - started) / 1e6)
            append_projected.append(await projected() - before)
            # Widens the line to bob too: no narrowing, but a rewrite of the slot.
            await writer.edit_message(mid, [Text(f"[for ann] channel note {100 * n}", audience=("ann", "bob")),
                                            Text(_text(100 * n))])
            before = await projected()
            started = time.perf_counter_ns()
            await ann.compile(VIEW_BUDGET)
            edit_ms.append((time.perf_counter_ns() - started) / 1e6)
            edit_projected.append(await projected() - before)
        assert (await ann.inspect()).reader_listing.shared, "ann's actor read the slot's shared projection throughout"
        await ann.aclose()
    return {
        "append_ms": statistics.median(append_ms), "append_projected": statistics.median(append_projected),
        "edit_ms": statistics.median(edit_ms), "edit_projected": statistics.median(edit_projected),
    }


# -- the run ----------------------------------------------------------------------------------


_row = functools.partial(harness.row, comparison=None, comparison_label="", ratio=None, ratio_means="")


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rounds = 2 if quick else 3
    calls = 200_000 if quick else 1_000_000
    requests = 1_000 if quick else 5_000
    writes = 100 if quick else 300
    samples = 5 if quick else 15
    check_sizes = (2_000, 200_000)
    write_sizes = (5_000, 50_000)
    built: dict[str, float] = {}
    with scratch("ctxrt-bench-audience-") as base:
        stores: dict[tuple[str, int], Path] = {}
        for size in check_sizes:
            stores[("check", size)] = base / f"check-{size}"
            built[f"check {size:,}"] = await build(stores[("check", size)], size, audience=True)
        for size in write_sizes:
            for variant in ("reader", "none"):
                stores[(variant, size)] = base / f"{variant}-{size}"
                built[f"{variant} {size:,}"] = await build(stores[(variant, size)], size, audience=variant == "reader")
        stores[("view", 20_000)] = base / "view-20000"
        built["view 20,000"] = await build(stores[("view", 20_000)], 20_000, audience=True)

        offset = 10_000_000

        async def write_both(size: int) -> dict[str, dict[str, float]]:
            nonlocal offset
            both = await write_costs(stores[("reader", size)], stores[("none", size)], writes=writes, offset=offset)
            offset += 2 * writes
            return both

        jobs: dict[tuple[str, int], Callable[[int], Awaitable[Any]]] = {}
        for size in check_sizes:
            jobs["check", size] = lambda _, path=stores[("check", size)]: check_cost(path, calls, requests)
        for size in write_sizes:
            jobs["write", size] = lambda _, size=size: write_both(size)
        jobs["view", 20_000] = lambda _: reprojection(stores[("view", 20_000)], samples)
        # An unseeded order, and no gc.collect() between jobs: as this module always ran them.
        figures = await interleave(rounds, jobs, random.Random(), collect=False)

    checks = {size: [f["check_ns"] for f in figures["check", size]] for size in check_sizes}
    requests_us = {size: [f["request_us"] for f in figures["check", size]] for size in check_sizes}
    written = {(variant, size): [both[variant] for both in figures["write", size]]
               for size in write_sizes for variant in ("reader", "none")}
    views: list[dict[str, float]] = figures["view", 20_000]

    rows: list[dict[str, Any]] = []
    small, large = (statistics.median(checks[size]) for size in check_sizes)
    seed_check = f"{SEED_CHECK_US[0] * 1000:.0f}–{SEED_CHECK_US[1] * 1000:.0f} ns (Bun, 20,000 messages)"
    for size in check_sizes:
        rows.append(_row(
            f"F1 reader check per request, {size:,} messages (internal path: `check_reader`)", "ns", checks[size],
            comparison=seed_check, comparison_label="seed", target=1000, op="<",
        ))
    rows.append(_row(
        "F1 check at 200,000 vs 2,000 messages (internal path)", "ns", checks[200_000],
        comparison=summary(checks[2_000]), comparison_label="at 2,000", ratio=large / small, ratio_means="200k / 2k",
    ))
    for size in check_sizes:
        rows.append(_row(
            f"F1 a request through ann's namespace actor's mailbox (`await manager.health()`), {size:,} messages",
            "µs", requests_us[size],
        ))
    rows.append(_row(
        "F1 that request at 200,000 vs 2,000 messages", "µs", requests_us[200_000],
        comparison=summary(requests_us[2_000]), comparison_label="at 2,000",
        ratio=statistics.median(requests_us[200_000]) / statistics.median(requests_us[2_000]),
        ratio_means="200k / 2k",
    ))
    for size in write_sizes:
        for part, label in (("alone", "add_message"), ("tick", "add_message + tick()")):
            reader = [w[part] for w in written[("reader", size)]]
            none = [w[part] for w in written[("none", size)]]
            ratio = statistics.median(reader) / statistics.median(none)
            note = f" ({SEED_WRITE[size]})" if part == "tick" else ""
            rows.append(_row(
                f"F2 {label}, reader + 1 audience block per 100, {size:,} messages{note}", "ms", reader,
                comparison=summary(none), comparison_label="no reader, no audience",
                ratio=ratio, ratio_means="reader / none", target=1.1, op="<=", judged=ratio,
            ))
    rows.append(_row(
        "F3 messages re-projected by ann's compile after 1 append, 20,000 messages", "messages",
        [v["append_projected"] for v in views],
        comparison=summary([v["edit_projected"] for v in views]), comparison_label="after 1 edit (a rewrite)",
        target=1, op="<=",
    ))
    append_ms = [v["append_ms"] for v in views]
    edit_ms = [v["edit_ms"] for v in views]
    rows.append(_row(
        "F3 ann's compile after 1 append, 20,000 messages (Passthrough, 2,000-token budget)", "ms", append_ms,
        comparison=summary(edit_ms), comparison_label="after 1 edit, re-projecting all",
        ratio=statistics.median(edit_ms) / statistics.median(append_ms), ratio_means="edit / append",
    ))
    info = {"quick": quick, "rounds_run": rounds, "calls": calls, "requests": requests, "writes": writes,
            "samples": samples, "built": built}
    return rows, info


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure F1-F3; one dict per figure. Also writes ``bench/results-audience.md``."""
    rows = harness.run_trio(_run, quick)
    RESULTS_PATH.write_text(to_markdown(rows))
    return rows


# Each number at its own precision: no decimals from 100 up, one from 1, else three.
PRECISION: harness.Precision = ((100, ",.0f"), (1, ".1f"), (0, ".3f"))


_figure = functools.partial(harness.figure, precision=PRECISION, none="")


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    builds = ", ".join(f"{name}: {seconds:.1f} s" for name, seconds in first["built"].items())
    lines = [
        "## Audience",
        "",
        measured("audience", first["quick"], f"py-lmdb {lmdb.__version__}", f"trio {trio.__version__}")
        + f" {first['rounds_run']} rounds, variants "
        f"interleaved in a shuffled order each round; the table shows the median across rounds (min–max). "
        f"F1 times {first['calls']:,} checks per round (internal path) and takes the median of "
        f"{first['requests']:,} `health()` requests; F2 takes the median of {first['writes']} writes per "
        f"variant per round; F3 the median of {first['samples']} compiles. Stores built with durability \"os\" "
        f"and 500 concurrent add_message calls ({builds}). The seed's figures are Bun on another, busy host.",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        comparison = _figure(row["comparison"], row["unit"])
        if row["comparison_label"]:
            comparison = f"{row['comparison_label']}: {comparison}" if comparison else row["comparison_label"]
        ratio = "" if row["ratio"] is None else f"{row['ratio']:,.2f} ({row['ratio_means']})"
        target = "" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} | {comparison} | {ratio} | "
                     f"{target} | {verdict} |")
    return "\n".join(lines) + "\n"


main = harness.entry("audience", __doc__, run, to_markdown, RESULTS_PATH, quick_help="fewer rounds and samples")


if __name__ == "__main__":
    raise SystemExit(main())
