"""Inspector and tracing benchmarks (issue 26), side by side in one run.

    python -m bench.inspector [--quick]

Pages. Two stores are built through ``add_message`` (durability "os"): 2,000 and 200,000 messages
(quick: 2,000 and 20,000), every 7th carrying a line with an audience for ``ann``, then a
namespace ``agents/ann`` claimed for reader ann with ``WindowedPassthrough()``. Each store is
opened read-only and served by the inspector (``ctxrt.inspector.app.serve``) on 127.0.0.1; a
plain HTTP client (urllib, in a worker thread) times whole requests, the server's work and the
loopback round trip both:

(a) the timeline's newest page (``/timeline``, 50 messages);
(b) a timeline page in the middle of the slot (``/timeline?page=N``);
(c) reader ann's breakdown (``/reader``, budget 20,000 tokens, reserve 4,000): the compile the
    namespace would make now, its provenance and render_stats, rendered. The inspector keeps the
    manager open, so this is a warm compile, as a second look is.

Each round fetches every page of both stores, in a shuffled order; a figure is the median across
rounds of each round's median of 5 fetches. Target: the large store's figure <= 2x the small one's.

History. Two stores whose namespace ``agents/ann`` (ledger on, 20 messages, WindowedPassthrough)
recorded 1,000 and 100,000 requests (quick: 1,000 and 10,000) through ``record_request`` (one compile
recorded again and again, 50 at once, then a message appended, in whose commit they are kept: so
50 records share each store sequence, where a host recording a turn at a time has one each; a
page the history finds by sequence reads those before it that share its first's), served the
same way:

(g) the request history's newest page (``/history``, 50 requests);
(h) a history page in the middle of the ledger (``/history?page=N``).

Target: the large ledger's figure <= 2x the small one's.

Tracing. On a 20,000-message store (quick: 5,000), one runtime, tracing switched on and off
between variants with ``ctxrt.tracing.configure``: on is the OpenTelemetry SDK's ``TracerProvider``
with a ``BatchSpanProcessor`` into an ``InMemorySpanExporter`` and a ``MeterProvider`` with an
``InMemoryMetricReader``; off is no provider (the API installed, nothing configured: every hook's
no-op path). Each round runs both in a shuffled order:

(d) a warm Passthrough compile (budget holding every message), median of 25;
(e) a durable ``add_message`` (durability "sync"), median of 100;
(e') the same append under durability "os" (no fsync per commit), median of 100: what tracing
     adds to an append, without the disk's noise around it. No target.

Target: on / off <= 1.1 for (d) and (e). And (f) the off path's own cost, what a compile and an append pay when
tracing is off: ``tracing.current()`` plus entering and leaving ``tracing.compiling``, in a tight
loop (ns per call), as a share of (d)'s and (e)'s off figures.

Results are printed and written to ``bench/results-inspector.md``. ``CTXRT_BENCH_DIR`` chooses
where the stores live (a real disk, for the durable figure).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from . import harness
from .harness import TABLE_HEAD, interleave, measured, scratch, versus

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-inspector.md"
FETCHES = 5
COMPILES = 25
APPENDS = 100


def _content(n: int) -> Any:
    text = f"message {n}: the build is green again after the cache fix, shipping tonight"
    if n % 7 == 3:
        return [{"type": "text", "text": text}, {"type": "text", "text": f"[for ann {n}] a private note",
                                                  "audience": ["ann"]}]
    return text


def _get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
        assert response.status == 200
    return time.perf_counter() - started


async def _pages(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import trio

    import ctxrt
    from ctxrt.inspector import app

    sizes = (2_000, 20_000 if quick else 200_000)
    rounds = 8 if quick else 30
    info: dict[str, Any] = {"sizes": sizes, "rounds_pages": rounds}
    with scratch("ctxrt-inspector-") as directory:
        for size in sizes:
            info[f"build_s_{size}"] = await harness.fill(directory / str(size), size, _content)
            async with ctxrt.open_runtime(directory / str(size), durability="os") as writer:
                await writer.open("agents/ann", view_reader="ann", strategy=ctxrt.WindowedPassthrough())
        async with trio.open_nursery() as nursery:
            urls = {}
            for size in sizes:
                runtime = await nursery.start(_readonly, directory / str(size))
                urls[size] = await nursery.start(partial(app.serve, runtime, str(size), port=0))
            paths = {"timeline": "/timeline?branch=main",
                     "middle": "/timeline?branch=main&page={middle}",
                     "reader": "/reader?branch=main&namespace=agents/ann&budget=20000&reserve=4000"}

            def variant(size: int, path: str) -> Any:
                url = urls[size] + path.format(middle=size // 100)

                async def fetch(_: int) -> float:
                    times = [await trio.to_thread.run_sync(_get, url) for _ in range(FETCHES)]
                    return statistics.median(times) * 1e6

                return fetch

            for size in sizes:  # a first look opens the reader's manager and fills the caches
                for path in paths.values():
                    await variant(size, path)(0)
            figures = await interleave(rounds, {(size, name): variant(size, path) for size in sizes
                                                for name, path in paths.items()}, random.Random(26))
            nursery.cancel_scope.cancel()
    small, large = sizes
    labels = {"timeline": "(a) the timeline's newest page", "middle": "(b) a timeline page in the middle",
              "reader": "(c) reader ann's breakdown (WindowedPassthrough, budget 20,000)"}
    rows = [versus(f"{labels[name]} at {large:,} messages", "µs", figures[(large, name)], figures[(small, name)],
                   f"at {small:,} messages", target=2.0) for name in paths]
    return rows, info


async def _ledger(directory: Path, requests: int) -> float:
    """A store whose ``agents/ann`` recorded ``requests`` requests; the seconds it took."""
    import trio

    import ctxrt

    started = time.perf_counter()
    async with ctxrt.open_runtime(directory, durability="os") as writer:
        ann = await writer.open("agents/ann", view_reader="ann", strategy=ctxrt.WindowedPassthrough(), ledger=True)
        for n in range(20):
            await ann.add_message("user" if n % 2 else "Claude", _content(n))
        result = await ann.compile(ctxrt.Budget(20_000, 4_000))
        usage = ctxrt.Usage(12_000, 400, cache_read_input_tokens=9_000)
        for first in range(0, requests, 50):
            async with trio.open_nursery() as nursery:
                for _ in range(first, min(requests, first + 50)):
                    nursery.start_soon(partial(ann.record_request, result, form="anthropic", model="claude-x",
                                               usage=usage, latency_ms=850.0))
            await ann.add_message("user", "the next turn")
    return time.perf_counter() - started


async def _history(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import trio

    from ctxrt.inspector import app
    from ctxrt.inspector.prices import parse_prices

    sizes = (1_000, 10_000 if quick else 100_000)
    rounds = 8 if quick else 30
    prices = parse_prices({"claude-x": {"input": 3, "output": 15, "cache_read": 0.3}})
    info: dict[str, Any] = {"ledger_sizes": sizes, "rounds_history": rounds}
    with scratch("ctxrt-history-") as directory:
        for size in sizes:
            info[f"ledger_build_s_{size}"] = await _ledger(directory / str(size), size)
        async with trio.open_nursery() as nursery:
            urls = {}
            for size in sizes:
                runtime = await nursery.start(_readonly, directory / str(size))
                urls[size] = await nursery.start(partial(app.serve, runtime, str(size), port=0, prices=prices))
            paths = {"newest": "/history?branch=main&namespace=agents/ann",
                     "middle": "/history?branch=main&namespace=agents/ann&page={middle}"}

            def variant(size: int, path: str) -> Any:
                url = urls[size] + path.format(middle=size // 100)

                async def fetch(_: int) -> float:
                    times = [await trio.to_thread.run_sync(_get, url) for _ in range(FETCHES)]
                    return statistics.median(times) * 1e6

                return fetch

            for size in sizes:
                for path in paths.values():
                    await variant(size, path)(0)
            figures = await interleave(rounds, {(size, name): variant(size, path) for size in sizes
                                                for name, path in paths.items()}, random.Random(38))
            nursery.cancel_scope.cancel()
    small, large = sizes
    labels = {"newest": "(g) the request history's newest page", "middle": "(h) a request history page in the middle"}
    rows = [versus(f"{labels[name]} at {large:,} requests", "µs", figures[(large, name)], figures[(small, name)],
                   f"at {small:,} requests", target=2.0) for name in paths]
    return rows, info


async def _readonly(path: Path, task_status: Any) -> None:
    import trio

    import ctxrt

    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        task_status.started(runtime)
        await trio.sleep_forever()


def _providers() -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    return tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()])


async def _tracing(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import trio

    import ctxrt
    from ctxrt import tracing

    messages = 5_000 if quick else 20_000
    rounds = 10 if quick else 60
    tracer_provider, meter_provider = _providers()
    with scratch("ctxrt-tracing-") as directory:
        build = await harness.fill(directory / "s", messages, _content)
        async with ctxrt.open_runtime(directory / "s") as runtime, \
                ctxrt.open_runtime(directory / "os", durability="os") as unsynced:  # and "sync", the default
            reader = await runtime.open("builder")
            writer = await runtime.open("appender", isolate=True)
            quick_writer = await unsynced.open("appender")
            budget = ctxrt.Budget(max_tokens=10_000_000)
            await reader.compile(budget)

            def switched(on: bool) -> None:
                if on:
                    tracing.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
                else:
                    tracing.configure()

            def compiles(on: bool) -> Any:
                async def run(_: int) -> float:
                    switched(on)
                    times = []
                    for _ in range(COMPILES):
                        started = time.perf_counter()
                        await reader.compile(budget)
                        times.append(time.perf_counter() - started)
                    switched(False)
                    return statistics.median(times) * 1e6
                return run

            def appends(on: bool, manager: Any = writer) -> Any:
                async def run(_: int) -> float:
                    switched(on)
                    times = []
                    for _ in range(APPENDS):
                        started = time.perf_counter()
                        await manager.add_message("user", "a durable append")
                        times.append(time.perf_counter() - started)
                    switched(False)
                    return statistics.median(times) * 1e6
                return run

            figures = await interleave(rounds, {("compile", True): compiles(True), ("compile", False): compiles(False),
                                                ("append", True): appends(True), ("append", False): appends(False),
                                                ("os", True): appends(True, quick_writer),
                                                ("os", False): appends(False, quick_writer)},
                                       random.Random(26))
    tracer_provider.shutdown()
    off_path = _off_path_ns()
    rows = [
        versus(f"(d) warm Passthrough compile at {messages:,} messages, tracing on", "µs", figures[("compile", True)],
               figures[("compile", False)], "tracing off", target=1.1),
        versus("(e) durable add_message, tracing on", "µs", figures[("append", True)], figures[("append", False)],
               "tracing off", target=1.1),
        versus("(e') add_message under durability \"os\", tracing on", "µs", figures[("os", True)],
               figures[("os", False)], "tracing off", target=None, op=None),
    ]
    compile_off = statistics.median(figures[("compile", False)]) * 1000
    append_off = statistics.median(figures[("append", False)]) * 1000
    rows.append(harness.row(
        "(f) the off path's hooks (tracing.current + tracing.compiling), per call", "ns", off_path, target=None,
        op=None, comparison=None, comparison_label=f"share of (d) off: {statistics.median(off_path) / compile_off:.5f}; "
                                                   f"of (e) off: {statistics.median(off_path) / append_off:.5f}",
    ))
    return rows, {"messages_tracing": messages, "rounds_tracing": rounds, "build_s_tracing": build}


def _off_path_ns() -> list[float]:
    from types import SimpleNamespace

    from ctxrt import tracing

    tracing.configure()
    command = SimpleNamespace(budget=SimpleNamespace(max_tokens=1, reserve_for_response=0), dry_run=False,
                              strict=False)
    samples = []
    for _ in range(7):
        count = 200_000
        started = time.perf_counter()
        for _ in range(count):
            tracing.current()
            with tracing.compiling("ns", "main", None, "passthrough", command):
                pass
        samples.append((time.perf_counter() - started) / count * 1e9)
    return samples


async def _body(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    page_rows, page_info = await _pages(quick)
    history_rows, history_info = await _history(quick)
    trace_rows, trace_info = await _tracing(quick)
    return page_rows + history_rows + trace_rows, {**page_info, **history_info, **trace_info, "quick": quick}


def run(quick: bool = False) -> list[dict[str, Any]]:
    return harness.run_trio(_body, quick)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0] if rows else {}
    quick = bool(first.get("quick"))
    sizes = first.get("sizes", (0, 0))
    lines = [
        "## Inspector", "",
        measured("inspector", quick, f"stores of {sizes[0]:,} and {sizes[1]:,} messages (built in "
                                     f"{first.get(f'build_s_{sizes[0]}', 0):.1f} s and "
                                     f"{first.get(f'build_s_{sizes[1]}', 0):.1f} s), "
                                     f"{first.get('rounds_pages')} rounds of page fetches; ledgers of "
                                     f"{first.get('ledger_sizes', (0, 0))[0]:,} and {first.get('ledger_sizes', (0, 0))[1]:,} "
                                     f"requests (built in {first.get('ledger_build_s_' + str(first.get('ledger_sizes', (0, 0))[0]), 0):.1f} s and "
                                     f"{first.get('ledger_build_s_' + str(first.get('ledger_sizes', (0, 0))[1]), 0):.1f} s), "
                                     f"{first.get('rounds_history')} rounds; tracing on a "
                                     f"{first.get('messages_tracing', 0):,}-message store, "
                                     f"{first.get('rounds_tracing')} rounds"), "",
        "Pages are whole HTTP requests to the inspector on 127.0.0.1 (median of 5 per round); tracing on is "
        "the OpenTelemetry SDK (BatchSpanProcessor into an InMemorySpanExporter, an InMemoryMetricReader), "
        "off is no provider. Figures: median across rounds (min–max across rounds).", "", *TABLE_HEAD,
    ]
    for each in rows:
        unit = each["unit"]
        comparison = each.get("comparison")
        theirs = (f"{each['comparison_label']}: {harness.median_figure(comparison, unit)}" if comparison
                  else each.get("comparison_label") or "")
        ratio = f"{each['ratio']:.2f}" if each.get("ratio") is not None else "–"
        target = f"{each['op']} {each['target']}" if each.get("target") is not None else "–"
        passed = {True: "pass", False: "**fail**", None: "–"}[each.get("passed")]
        lines.append(f"| {each['measure']} | {harness.median_figure(each['ctxrt'], unit)} | {theirs} | {ratio} | "
                     f"{target} | {passed} |")
    lines += ["", harness.paired_line([each for each in rows if each.get("paired_ratio") is not None])]
    return "\n".join(lines) + "\n"


main = harness.entry("inspector", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="stores of 2,000 and 20,000 messages, fewer rounds")

if __name__ == "__main__":
    sys.exit(main())
