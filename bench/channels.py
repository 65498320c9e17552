"""Channels benchmark: ``query_messages(channel=)`` costs what it returns, however long the slot,
from the first read after opening (M11, K10); and what the stored index adds to ``add_message``.

    python -m bench.channels [--quick]

Two LMDB stores side by side in one run, through the public API: 2,000 messages and 200,000
(50,000 with ``--quick``), written with ``add_message`` (500 at once, group-committed), each with
a channel in either schema (``metadata["channel_id"]`` or ``metadata["external"]["channel_id"]``)
spread over 50 channels, except the channel ``probe``, which holds the same 20 messages in both.

Cold: in each of ``COLD_ROUNDS`` rounds both stores are opened afresh (new runtimes: nothing
decoded, no cache) and the first ``query_messages(channel="probe")`` on each is timed; the figure
is the median of the per-round ratios, large over small (target <= 2). Warm: then rounds alternate
the two stores, each timing 100 more such calls (target <= 2). For scale, the same query as a
metadata scan (``query_messages(metadata={"channel_id": "probe"})``, which finds only one schema)
and ``channel_counts()`` are timed on each store.

The index's cost on a write: a third store, durable (``durability="sync"``), takes lone
``add_message`` calls in rounds that alternate a message with a channel (it files an index entry)
and one without (``metadata={"topic": ...}``, the same size); the figure is the median of the
per-round ratios, with a channel over without. The same with ``durability="os"`` shows the CPU
part alone. Results are printed and written to ``bench/results-channels.md``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import trio

import ctxrt

from . import harness
from .harness import TABLE_HEAD, measured, scratch

RESULTS_PATH = Path(__file__).with_name("results-channels.md")
SMALL = 2_000
PROBES = 20  # messages in the probe channel, in both stores
CHANNELS = 50
CONCURRENCY = 500
ROUNDS, CALLS = 15, 100
COLD_ROUNDS = 7
SCAN_CALLS = 5
WRITE_ROUNDS, WRITES = 15, 20  # durable add_message rounds, calls of each kind per round


def metadata(n: int, count: int) -> dict[str, Any]:
    """Message ``n`` of ``count``: every (count // PROBES)-th is in ``probe``; schemas alternate."""
    step = count // PROBES
    channel = "probe" if n % step == 0 else f"c{n % CHANNELS}"
    schema = n // step if n % step == 0 else n  # so the probe channel holds both schemas too
    return {"channel_id": channel} if schema % 2 else {"external": {"channel_id": channel, "id": f"x{n}"}}


async def fill(directory: Path, count: int) -> float:
    started = time.perf_counter()
    async with ctxrt.open_runtime(directory, durability="os") as rt:
        writer = await rt.open("builder")
        for first in range(0, count, CONCURRENCY):
            async with trio.open_nursery() as nursery:
                for n in range(first, min(count, first + CONCURRENCY)):
                    nursery.start_soon(lambda n=n: writer.add_message("user", f"message {n}", metadata=metadata(n, count)))
    return time.perf_counter() - started


async def timed(call: Any, times: int) -> float:
    """Seconds per call, over ``times`` calls."""
    started = time.perf_counter()
    for _ in range(times):
        await call()
    return (time.perf_counter() - started) / times


async def cold(small: Path, large: Path) -> dict[str, float]:
    """The first channel read of a freshly opened runtime on each store, in seconds."""
    first: dict[str, float] = {}
    for name, path in (("small", small), ("large", large)):
        async with ctxrt.open_runtime(path, durability="os") as rt:
            m = await rt.open("reader")
            started = time.perf_counter()
            found = await m.query_messages(channel="probe")
            first[name] = time.perf_counter() - started
            assert len(found) == PROBES, (name, len(found))
    return first


async def measure(small: Path, large: Path) -> dict[str, Any]:
    firsts = [await cold(small, large) for _ in range(COLD_ROUNDS)]
    async with ctxrt.open_runtime(small, durability="os") as rt_small, \
            ctxrt.open_runtime(large, durability="os") as rt_large:
        managers = {"small": await rt_small.open("reader"), "large": await rt_large.open("reader")}
        per_query: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(ROUNDS):
            for name, m in managers.items():
                per_query[name].append(await timed(lambda m=m: m.query_messages(channel="probe"), CALLS))
        scans = {name: await timed(lambda m=m: m.query_messages(metadata={"channel_id": "probe"}), SCAN_CALLS)
                 for name, m in managers.items()}
        counts_time = {name: await timed(m.channel_counts, 3) for name, m in managers.items()}
        counts = {name: sum((await m.channel_counts()).values()) for name, m in managers.items()}
    return {"cold": {name: [each[name] for each in firsts] for name in ("small", "large")}, "per_query": per_query,
            "scans": scans, "counts": counts, "counts_time": counts_time}


async def writes(directory: Path, durability: str) -> dict[str, list[float]]:
    """Seconds per lone add_message, per round: with a channel, and without one."""
    per_call: dict[str, list[float]] = {"channel": [], "none": []}
    async with ctxrt.open_runtime(directory, durability=durability) as rt:  # type: ignore[arg-type]
        m = await rt.open("writer")
        await m.add_message("user", "warm up", metadata={"channel_id": "c0"})
        for r in range(WRITE_ROUNDS):
            for kind in ("channel", "none") if r % 2 else ("none", "channel"):
                key = "channel_id" if kind == "channel" else "topic"
                per_call[kind].append(await timed(
                    lambda key=key: m.add_message("user", "a message of ordinary length", metadata={key: "c1"}), WRITES))
    return per_call


def run(quick: bool = False) -> list[dict[str, Any]]:
    large = 50_000 if quick else 200_000
    with scratch("ctxrt-channels-") as directory:
        fills = {"small": trio.run(fill, directory / "small", SMALL), "large": trio.run(fill, directory / "large", large)}
        found = trio.run(measure, directory / "small", directory / "large")
        durable = trio.run(writes, directory / "durable", "sync")
        os_only = trio.run(writes, directory / "os", "os")
    per_query, first = found["per_query"], found["cold"]
    label = f"{SMALL:,} messages"
    common = {"quick": quick, "large": large, "fills": fills, "scans": found["scans"], "counts": found["counts"],
              "counts_time": found["counts_time"]}
    return [
        harness.versus(f"first query_messages(channel=) after opening, {large:,} messages, {PROBES} found", "ms",
                       [s * 1000 for s in first["large"]], [s * 1000 for s in first["small"]], label,
                       target=2.0, by_round=True, **common),
        harness.versus(f"query_messages(channel=) warm, {large:,} messages, {PROBES} found", "ms",
                       [s * 1000 for s in per_query["large"]], [s * 1000 for s in per_query["small"]], label,
                       target=2.0, by_round=True),
        harness.versus("durable add_message with a channel (files an index entry)", "ms",
                       [s * 1000 for s in durable["channel"]], [s * 1000 for s in durable["none"]],
                       "without a channel", by_round=True),
        harness.versus('add_message with a channel, durability="os"', "ms",
                       [s * 1000 for s in os_only["channel"]], [s * 1000 for s in os_only["none"]],
                       "without a channel", by_round=True),
    ]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    each = rows[0]
    large, quick = each["large"], each["quick"]
    lines = [
        "## Channels", "", measured("channels", quick, f"{SMALL:,} and {large:,} messages"), "",
        f"Two LMDB stores: {SMALL:,} and {large:,} messages over {CHANNELS} channels (both schemas, alternating), "
        f"the channel `probe` holding {PROBES} messages in each. Cold: {COLD_ROUNDS} rounds, each opening both "
        f"stores afresh and timing the first `query_messages(channel=\"probe\")` (the stored index: no whole-slot "
        f"decode). Warm: {ROUNDS} rounds, each timing {CALLS} calls on each store. Writes: {WRITE_ROUNDS} rounds of "
        f"{WRITES} lone `add_message` calls of each kind, with a channel and without. Each ratio is the median of "
        "the per-round ratios.", "", *TABLE_HEAD,
    ]
    for row in rows:
        target = f"<= {row['target']}" if row.get("target") is not None else "–"
        verdict = "–" if row.get("passed") is None else ("pass" if row["passed"] else "FAIL")
        lines.append(f"| {row['measure']} | {harness.median_figure(row['ctxrt'], 'ms')} | "
                     f"{harness.median_figure(row['comparison'], 'ms')} ({row['comparison_label']}) | "
                     f"{row['paired_ratio']:.2f} | {target} | {verdict} |")
    lines += [
        "", "For scale (not judged):", "",
        "| store | metadata scan, one schema | channel_counts() | messages counted | fill |", "|---|---|---|---|---|",
    ]
    for name, size in (("small", SMALL), ("large", large)):
        lines.append(f"| {size:,} messages | {each['scans'][name] * 1000:,.1f} ms | {each['counts_time'][name] * 1000:,.1f} ms "
                     f"| {each['counts'][name]:,} | {each['fills'][name]:,.1f} s |")
    lines += ["", "Before the stored index (2026-12-04 23:08, same machine), the first channel read at 200,000 "
              "messages built the slot cache's index by decoding every message: 13,609.9 ms (81.4 ms at 2,000)."]
    return "\n".join(lines) + "\n"


main = harness.entry("channels", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="50,000 messages in the large store instead of 200,000")

if __name__ == "__main__":
    sys.exit(main())
