"""Channels benchmark: ``query_messages(channel=)`` costs what it returns, however long the slot (M11).

    python -m bench.channels [--quick]

Two LMDB stores side by side in one run, through the public API: 2,000 messages and 200,000
(50,000 with ``--quick``), written with ``add_message`` (500 at once, group-committed), each with
a channel in either schema (``metadata["channel_id"]`` or ``metadata["external"]["channel_id"]``)
spread over 50 channels, except the channel ``probe``, which holds the same 20 messages in both.
Each store is reopened (a cold runtime), its first channel read (which builds the index from the
slot) is timed once, then rounds alternate the two stores: each round times 100
``query_messages(channel="probe")`` calls on each. The figure is the median per-query time at the
large store over the small one (target <= 2). For scale, the same query as a metadata scan
(``query_messages(metadata={"channel_id": "probe"})``, today's way, which finds only one schema)
is timed on each store. Results are printed and written to ``bench/results-channels.md``.
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
ROUNDS, CALLS = 15, 200
SCAN_CALLS = 10


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


async def measure(small: Path, large: Path) -> dict[str, Any]:
    async with ctxrt.open_runtime(small, durability="os") as rt_small, \
            ctxrt.open_runtime(large, durability="os") as rt_large:
        managers = {"small": await rt_small.open("reader"), "large": await rt_large.open("reader")}
        first: dict[str, float] = {}
        for name, m in managers.items():
            started = time.perf_counter()
            found = await m.query_messages(channel="probe")
            first[name] = time.perf_counter() - started
            assert len(found) == PROBES, (name, len(found))
        per_query: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(ROUNDS):
            for name, m in managers.items():
                per_query[name].append(await timed(lambda m=m: m.query_messages(channel="probe"), CALLS))
        scans = {name: await timed(lambda m=m: m.query_messages(metadata={"channel_id": "probe"}), SCAN_CALLS)
                 for name, m in managers.items()}
        counts = {name: sum((await m.channel_counts()).values()) for name, m in managers.items()}
    return {"first": first, "per_query": per_query, "scans": scans, "counts": counts}


def run(quick: bool = False) -> list[dict[str, Any]]:
    large = 50_000 if quick else 200_000
    with scratch("ctxrt-channels-") as directory:
        fills = {"small": trio.run(fill, directory / "small", SMALL), "large": trio.run(fill, directory / "large", large)}
        found = trio.run(measure, directory / "small", directory / "large")
    per_query = found["per_query"]
    label = f"{SMALL:,} messages"
    common = {"quick": quick, "large": large, "fills": fills, "first": found["first"], "scans": found["scans"],
              "counts": found["counts"]}
    return [
        harness.versus(f"query_messages(channel=) at {large:,} messages, {PROBES} found", "ms",
                       [s * 1000 for s in per_query["large"]], [s * 1000 for s in per_query["small"]], label,
                       target=2.0, by_round=True, **common),
    ]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    each = rows[0]
    large, quick = each["large"], each["quick"]
    mine, theirs = each["ctxrt"], each["comparison"]
    lines = [
        "## Channels", "", measured("channels", quick, f"{SMALL:,} and {large:,} messages"), "",
        f"Two LMDB stores opened side by side: {SMALL:,} and {large:,} messages over {CHANNELS} channels (both "
        f"schemas, alternating), the channel `probe` holding {PROBES} messages in each. {ROUNDS} rounds; each times "
        f"{CALLS} `query_messages(channel=\"probe\")` calls on each store. The ratio is the median of the "
        "per-round ratios (large over small).", "", *TABLE_HEAD,
        f"| {each['measure']} | {harness.median_figure(mine, 'ms')} | {harness.median_figure(theirs, 'ms')} "
        f"({each['comparison_label']}) | {each['paired_ratio']:.2f} | <= {each['target']} | "
        f"{'pass' if each['passed'] else 'FAIL'} |", "",
        "For scale (not judged):", "",
        "| store | first channel read (builds the index) | metadata scan, one schema (today's way) | messages "
        "counted by channel_counts() | fill |", "|---|---|---|---|---|",
    ]
    for name, size in (("small", SMALL), ("large", large)):
        lines.append(f"| {size:,} messages | {each['first'][name] * 1000:,.1f} ms | {each['scans'][name] * 1000:,.1f} ms "
                     f"| {each['counts'][name]:,} | {each['fills'][name]:,.1f} s |")
    speedup = each["scans"]["large"] * 1000 / mine["median"]
    lines += ["", f"At {large:,} messages the indexed query is {speedup:,.0f}x faster than the metadata scan."]
    return "\n".join(lines) + "\n"


main = harness.entry("channels", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="50,000 messages in the large store instead of 200,000")

if __name__ == "__main__":
    sys.exit(main())
