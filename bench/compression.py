"""Compression benchmarks: Autobiographical write cost, warm compile and drain throughput.

    python -m bench.compression [--quick]

(a) Write cost: ``add_message`` latency (one caller awaiting each append) in a namespace
    whose actor runs Autobiographical with ``auto_tick`` (the drain compresses in the background
    through a zero-latency ``ScriptedModel``), at 50,000 messages against 5,000, both stores
    compressed and ready. The two stores are open side by side and measured in the same rounds,
    in a shuffled order; after each batch the drain is let finish (untimed) so one store's
    background work never lands in the other's figure. Measured durable ("sync"), then with
    durability "os", whose figure has no fsync noise to hide a growth in CPU cost. Target: cost
    ratio <= 1.2 for each. The seed (the TypeScript library, on its own machine) measured 0.71 ms
    at 5,000 and 7.8 ms at 20,000: 11x.
(b) A warm compile under Autobiographical at 20,000 messages with summaries in place (default
    budget, 2,000-token head window, 30,000-token recent window). Target: <= 20 ms. The seed
    measured 140-219 ms; the ratio is against its best, 140 ms (different machines: a pointer,
    not a like-for-like figure).
(c) Drain throughput: ``wait_ready()`` over a 20,000-message store with nothing compressed yet,
    ``ScriptedModel`` at zero latency: chunks compressed (L1s) per second, and units (L1s and
    merges) per second, with durability "sync" and again with "os" (to tell fsync from CPU). No
    target: a capacity figure.

Stores are built fast (durability "os", 50 concurrent writers through ``add_message``), then
reopened with durability "sync" for (a) and (c), then "os" for their second figures. Results
are printed and written to ``bench/results-compression.md``. ``CTXRT_BENCH_DIR`` chooses where
the stores live: a real disk, or the durable figures mean nothing.
"""

from __future__ import annotations

import functools
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.strategies.base import SelectOptions
from ctxrt.testing import ScriptedModel
from ctxrt.namespace.views import shared_reader_listing
from ctxrt.views import MessageView

from . import harness
from .harness import TABLE_HEAD, interleave, paired_line, scratch, versus

RESULTS_PATH = Path(__file__).with_name("results-compression.md")
NAMESPACE = "bench"
MODEL = "bench-model"
SMALL, BIG, COMPILE_AT, DRAIN_AT = 5_000, 50_000, 20_000, 20_000
SEED_WRITE_MS = {5_000: 0.71, 20_000: 7.8}
SEED_COMPILE_MS = (140.0, 219.0)
WRITERS = 50
SUMMARY = (
    "I remember working through the deployment plan with the user: we checked the staging logs, found the "
    "retry storm in the queue consumer, agreed to cap retries at five and to add jitter, and left the alert "
    "thresholds as an open question for the on-call review. "
) * 18  # about 1,500 tokens: what a model writes for the default 2,000-token summary target

_TOPICS = ("the deploy", "the schema", "a flaky test", "the budget", "the release notes", "an outage")


def say(n: int) -> str:
    """A ~200-character prose message (about 70 tokens)."""
    topic = _TOPICS[n % len(_TOPICS)]
    text = (f"Message {n}: about {topic}, I looked at what changed since yesterday and I think we should "
            f"keep the current plan, but check the numbers again before we ship anything to users.")
    return text[:200]


def strategy(*, auto_tick: bool) -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical(MODEL, head_window_tokens=2_000, auto_tick=auto_tick)


def scripted() -> ScriptedModel:
    return ScriptedModel(lambda request: SUMMARY)


# -- building stores -----------------------------------------------------------------------------


async def build(directory: Path, count: int, *, compress: bool) -> float:
    """Add ``count`` messages with 50 concurrent writers (durability "os"); if ``compress``, let the
    drain run as they arrive and wait until it is ready. Returns the seconds it took."""
    started = time.perf_counter()
    async with ctxrt.open_runtime(directory, model=scripted(), durability="os") as rt:
        m = await rt.open(NAMESPACE, strategy=strategy(auto_tick=compress))

        async def writer(first: int) -> None:
            for n in range(first, count, WRITERS):
                await m.add_message("user" if n % 2 == 0 else "Claude", say(n))

        async with trio.open_nursery() as nursery:
            for first in range(WRITERS):
                nursery.start_soon(writer, first)
        if compress:
            await m.wait_ready()
    return time.perf_counter() - started


# -- variants ------------------------------------------------------------------------------------


async def add_cost(m: ctxrt.ContextManager, count: int, first: int) -> float:
    """Milliseconds per ``add_message``, one caller awaiting each; the drain is let finish after (untimed)."""
    started = time.perf_counter()
    for n in range(first, first + count):
        await m.add_message("user" if n % 2 == 0 else "Claude", say(n))
    elapsed = time.perf_counter() - started
    await m.wait_ready()
    return elapsed / count * 1e3


async def compile_cost(m: ctxrt.ContextManager, count: int, *, add_first: bool, counter: list[int]) -> float:
    """Median milliseconds of ``count`` compiles (each after one untimed ``add_message`` if ``add_first``)."""
    figures = []
    for _ in range(count):
        if add_first:
            counter[0] += 1
            await m.add_message("user", say(counter[0]))
        started = time.perf_counter()
        await m.compile()
        figures.append(time.perf_counter() - started)
    return statistics.median(figures) * 1e3


async def select_cost(rt: ctxrt.Runtime, m: ctxrt.ContextManager, count: int) -> float:
    """Median milliseconds of the strategy's ``select`` alone (no provenance, no tool repair), an
    internal path: a copy of the strategy (``inspect()``) over the reader listing its actor reads (the
    slot's shared projection); a dry run, so nothing is buffered or written."""
    snapshot = await m.inspect()
    cache = rt.slots.cache(snapshot.caches[0].state, snapshot.caches[0].branch_id)
    strategy, view = snapshot.strategy, MessageView(shared_reader_listing(cache, snapshot.reader_listing.reader))
    budget = ctxrt.Budget()
    figures = []
    for _ in range(count):
        started = time.perf_counter()
        strategy.select(view, budget, SelectOptions(dry_run=True))
        figures.append(time.perf_counter() - started)
    return statistics.median(figures) * 1e3


async def drain_rate(template: Path, directory: Path, durability: str) -> tuple[float, float, int, int]:
    """(L1s/s, units/s, L1s, units) of ``wait_ready`` over a copy of an uncompressed store."""
    shutil.copytree(template, directory)
    try:
        model = scripted()
        async with ctxrt.open_runtime(directory, model=model, durability=durability) as rt:  # type: ignore[arg-type]
            m = await rt.open(NAMESPACE, strategy=strategy(auto_tick=False))
            started = time.perf_counter()
            await m.wait_ready()
            elapsed = time.perf_counter() - started
            summaries = await m.search_summaries(include_merged=True, limit=1_000_000)
        l1s = sum(1 for match in summaries if match.summary.level == 1)
        assert len(model.requests) == len(summaries)
        return l1s / elapsed, len(summaries) / elapsed, l1s, len(summaries)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- the run ---------------------------------------------------------------------------------------


def _row(
    measure: str, unit: str, mine: list[float], *, comparison: list[float] | float | None = None,
    comparison_label: str = "", ratio_limit: float | None = None, value_limit: float | None = None,
    ratio_means: str = "", note: str = "",
) -> dict[str, Any]:
    """One figure in the shape ``bench/__main__.py`` reads. ``comparison`` is figures measured in the
    same rounds (then ``ratio_limit`` bounds ours/comparison), or one figure from elsewhere, or none
    (then ``value_limit`` bounds our median itself, and ``target`` is text naming the unit)."""
    if isinstance(comparison, list):
        made = versus(measure, unit, mine, comparison, comparison_label, ratio_means=ratio_means, target=ratio_limit)
    else:
        made = harness.row(
            measure, unit, mine, comparison=comparison, comparison_label=comparison_label,
            ratio=None if comparison is None else statistics.median(mine) / comparison, ratio_means=ratio_means,
            paired_ratio=None, target=None if value_limit is None else f"<= {value_limit:g} {unit}", limit=value_limit,
        )
    made["note"] = note
    return made


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(20261130)
    rounds = 3 if quick else 9
    small, big = (1_000, 10_000) if quick else (SMALL, BIG)
    compile_at = 5_000 if quick else COMPILE_AT
    drain_at = 5_000 if quick else DRAIN_AT
    builds: dict[str, float] = {}
    with scratch("ctxrt-bench-") as root:
        # Compile first: its store is the "compressed" 20,000 of (b).
        builds[f"{compile_at:,} compressed"] = await build(root / "compile", compile_at, compress=True)
        counter = [compile_at]
        async with ctxrt.open_runtime(root / "compile", model=scripted(), durability="os") as rt:
            m = await rt.open(NAMESPACE, strategy=strategy(auto_tick=False))
            assert await m.is_ready()
            started = time.perf_counter()
            first = await m.compile()
            cold_ms = (time.perf_counter() - started) * 1e3
            compiled = len(first.messages)
            shown = sum(1 for sources in first.provenance.messages for s in sources if s.kind == "summary") // 2
            per_round = 10 if quick else 20
            compiles = await interleave(
                rounds,
                {
                    "unchanged": lambda _: compile_cost(m, per_round, add_first=False, counter=counter),
                    "after an add": lambda _: compile_cost(m, per_round, add_first=True, counter=counter),
                    "select": lambda _: select_cost(rt, m, per_round),
                },
                rng,
            )

        # (a) Write cost at two sizes, both compressed, side by side.
        builds[f"{small:,} compressed"] = await build(root / "small", small, compress=True)
        builds[f"{big:,} compressed"] = await build(root / "big", big, compress=True)
        appends = 100 if quick else 300
        writes: dict[str, list[float]] = {}
        added = {"small": small, "big": big}
        for durability in ("sync", "os"):  # "os" leaves out the fsync, whose noise can hide growth
            async with ctxrt.open_runtime(root / "small", model=scripted(), durability=durability) as rs, \
                    ctxrt.open_runtime(root / "big", model=scripted(), durability=durability) as rb:
                ms = await rs.open(NAMESPACE, strategy=strategy(auto_tick=True))
                mb = await rb.open(NAMESPACE, strategy=strategy(auto_tick=True))
                managers = {"small": ms, "big": mb}
                await ms.wait_ready()
                await mb.wait_ready()

                async def adds(size: str, count: int) -> float:
                    added[size] += count
                    return await add_cost(managers[size], count, added[size] - count)

                await adds("small", 50)  # warm-up: caches and the first chunk of each
                await adds("big", 50)
                measured = await interleave(
                    rounds, {"small": lambda _: adds("small", appends), "big": lambda _: adds("big", appends)}, rng
                )
                writes[f"small {durability}"], writes[f"big {durability}"] = measured["small"], measured["big"]
                chunks_small = len((await ms.inspect()).strategy.chunks)
                chunks_big = len((await mb.inspect()).strategy.chunks)

        # (c) Drain throughput over copies of one uncompressed store.
        builds[f"{drain_at:,} uncompressed"] = await build(root / "raw", drain_at, compress=False)
        drains: dict[str, list[tuple[float, float, int, int]]] = {"sync": [], "os": []}
        for n in range(1 if quick else 3):
            for durability in ("sync", "os"):
                drains[durability].append(await drain_rate(root / "raw", root / f"drain-{n}", durability))

    seed_growth = SEED_WRITE_MS[20_000] / SEED_WRITE_MS[5_000]
    seed_label = f"seed, {SEED_COMPILE_MS[0]:.0f}-{SEED_COMPILE_MS[1]:.0f} ms on its machine; its best"
    vs_worst = f"vs the seed's {SEED_COMPILE_MS[1]:.0f} ms: {{:.2f}}"
    rows = [
        _row(f"(a) add_message with an Autobiographical auto_tick actor, at {big:,} messages vs {small:,}, "
             "durability \"sync\"", "ms/add", writes["big sync"], comparison=writes["small sync"],
             comparison_label=f"at {small:,}", ratio_limit=1.2,
             note=f"chunks: {chunks_big:,} vs {chunks_small:,}; the seed grew {seed_growth:.0f}x from 5,000 to "
                  f"20,000 ({SEED_WRITE_MS[5_000]} -> {SEED_WRITE_MS[20_000]} ms)"),
        _row("(a) the same with durability \"os\" (no fsync: the strategy's and the actors' CPU)", "ms/add",
             writes["big os"], comparison=writes["small os"], comparison_label=f"at {small:,}", ratio_limit=1.2),
        _row(f"(b) warm compile at {compile_at:,} messages, summaries in place, unchanged since the last", "ms",
             compiles["unchanged"], comparison=SEED_COMPILE_MS[0], comparison_label=seed_label, value_limit=20.0,
             ratio_means=vs_worst.format(statistics.median(compiles["unchanged"]) / SEED_COMPILE_MS[1]),
             note=f"{compiled} compiled messages, {shown} summaries shown; cold first compile {cold_ms:.1f} ms"),
        _row(f"(b) warm compile at {compile_at:,} messages after one add_message", "ms",
             compiles["after an add"], comparison=SEED_COMPILE_MS[0], comparison_label=seed_label, value_limit=20.0,
             ratio_means=vs_worst.format(statistics.median(compiles["after an add"]) / SEED_COMPILE_MS[1])),
        _row(f"(b) of which the strategy's select alone (internal path: no compile.py, no mailbox), at "
             f"{compile_at:,}", "ms", compiles["select"]),
        _row(f"(c) drain: chunks compressed per second, {drain_at:,} messages, zero-latency model, durability "
             f"\"sync\"", "L1s/s", [d[0] for d in drains["sync"]],
             note=f"{drains['sync'][0][2]:,} L1s and {drains['sync'][0][3] - drains['sync'][0][2]:,} merges per run; "
                  f"{statistics.median(d[1] for d in drains['sync']):,.0f} units/s in all. Each unit commits its "
                  f"records one by one (a chunk record, a summary), so this is bound by fsync"),
        _row("(c) the same with durability \"os\" (CPU only)", "L1s/s", [d[0] for d in drains["os"]],
             note=f"{statistics.median(d[1] for d in drains['os']):,.0f} units/s in all"),
    ]
    return rows, {"builds": builds, "quick": quick}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (a)-(c); one dict per measure (figures, ratio, target, passed or None without a target)."""
    return harness.run_trio(_run, quick)


# Every number of a figure at its median's precision: no decimals from 100 up, one from 10, else two.
PRECISION: harness.Precision = ((100, ",.0f"), (10, ",.1f"), (0, ",.2f"))


_figure = functools.partial(harness.figure, precision=PRECISION, shared=True)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    builds = "; ".join(f"{name}: {seconds:.1f} s" for name, seconds in first["builds"].items())
    lines = [
        "## Compression",
        "",
        harness.measured("compression", first["quick"], f"trio {trio.__version__}")
        + f" {first['rounds']} rounds; variants "
        "interleaved in a shuffled order each round; figures are medians (min–max across rounds); ratios are "
        f"ratios of medians. Store builds (durability \"os\", {WRITERS} concurrent writers): {builds}. Seed figures come from another machine and "
        "another language: read their ratios as pointers.",
        "",
        *TABLE_HEAD,
    ]
    for row in rows:
        theirs = row["comparison"]
        if isinstance(theirs, dict):
            comparison = f"{row['comparison_label']}: {_figure(theirs, row['unit'])}"
        elif theirs is not None:
            comparison = f"{row['comparison_label']}: {theirs:g} {row['unit']}"
        else:
            comparison = "—"
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        if row["ratio_means"] and row["ratio"] is not None:
            ratio += f" ({row['ratio_means']})"
        target = "—" if row["target"] is None else row["target"] if isinstance(row["target"], str) \
            else f"{row['op']} {row['target']:g}"
        verdict = "—" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} | {comparison} | {ratio} "
                     f"| {target} | {verdict} |")
    lines.append("")
    for row in rows:
        if row["note"]:
            lines.append(f"- {row['measure'].split(' ', 1)[0]} {row['note']}.")
    if any(row["paired_ratio"] is not None for row in rows):
        lines.append("- " + paired_line(rows))
    return "\n".join(lines) + "\n"


main = harness.entry("compression", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="smaller stores and fewer rounds")


if __name__ == "__main__":
    raise SystemExit(main())
