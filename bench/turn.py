"""What a turn costs (issue 27): one durable ``add_message``, then ``compile`` and ``to_anthropic``,
against the durable-commit floor, all through the public API.

    python -m bench.turn [--quick]
    python -m bench.turn --profile MESSAGES [STRATEGY ...]

A store of N messages (2,000, 20,000 and 200,000; quick: 2,000 and 20,000) of about 36 estimated
tokens each, alternating user and Claude, is built through ``add_message`` (durability "os",
``harness.fill``). One namespace per strategy shares the slot: Passthrough, WindowedPassthrough and
Autobiographical (2,000-token head window, the default 30,000-token recent window), whose summaries
are made before measuring by ``ctxrt.testing.ScriptedModel`` at zero latency (durability "os",
``wait_ready``). The budget is ``Budget(max_tokens=100_000)``: 96,000 usable tokens after the default
4,000 reserve, about 2,650 of these messages.

Each strategy is then measured on a file copy of that store of its own (so the few hundred turns
measured add to its copy only, and every turn finds about N messages), opened with durability "sync"
(the default); the three runtimes are open together. A turn of a strategy is one ``add_message`` in
its namespace, then ``compile(BUDGET)``, then ``to_anthropic(assistant="Claude")``; each part is
timed, and the turn is their sum. Besides the turn (not in it): ``to_openai_chat`` and
``to_openai_responses`` of the same result, one ``list()`` copy of its messages, then a second
``compile(BUDGET)`` and ``to_anthropic`` with nothing changed since (the least any compile and body
cost at that size: the namespace actor's round trip and the fresh lists handed to the host). After each turn its namespace is let finish compressing
(``wait_ready``, untimed), so every turn finds its summaries in place.

The floor is a raw py-lmdb put of the turn's message size with a durable commit, in a fresh
environment with the store's settings (``costs.Raw``). Every turn's ``add_message`` is bracketed by
two floor puts, one right before it and one after the turn and its OpenAI forms (a put inside the
turn would slow the Python after it), and paired with their mean. A durable commit on a shared disk
costs from a fraction of a ms to over 10 ms (two modes, fast and slow, in runs), so a difference of
two medians (the turns' less the floor's) moved by several ms between runs and went negative; a
paired difference cancels what the disk does over the span of a turn, and bracketing averages out
which side of it a put falls on (the two sides cost a little differently).

A round runs SAMPLES turns of every strategy, the strategies in a shuffled order; over all the
rounds' turns, a strategy's turn over the floor is

    median(add_message − mean of its two floor puts) + median(compile) + median(to_anthropic)

shown with a 95% interval from resampling whole rounds (RESAMPLES times, with replacement, the same
rounds for every strategy): that interval is the estimate's own spread within the run. Pooling the
pairs converges much faster than a median of per-round figures: a round spent mostly in the slow
mode has a wide spread of differences, and across all rounds the pairs in the fast mode hold the
median. Between runs the host's CPU load moves compile and to_anthropic, and so the figure, by more
than that interval (up to 1.6x across five quick runs on a shared 2-core host); the CPU rows move
with it, the paired difference does not.

Beside it, not a target: the turn's CPU over the floor. The same estimate on fresh copies opened
with durability "os" against a floor whose commits are not flushed (no fsync on either side): what a
turn costs over a raw put with the disk out of it.

Targets (issue 27): a turn over the durable-commit floor <= 0.3 ms for Passthrough and
WindowedPassthrough, <= 0.5 ms for Autobiographical, at every size; WindowedPassthrough's turn over
the floor <= Passthrough's (the ratio of the two estimates, its interval from the same resamplings).

Then, over the same stores and at the same budget, through the other modules' helpers: a compile
right after another namespace's edit or removal against one right after an append (bench/edits.py),
from 20,000 messages on, target <= 2; a cold open + first compile in a fresh process
(bench/costs.py's child), fork + first compile and the heap held per further namespace compiling the
shared slot (bench/costs.py), the largest size against 2,000, targets <= 2, <= 2 and <= 5 MiB.

Results are printed and written to ``bench/results-turn.md``. ``CTXRT_BENCH_DIR`` chooses where the
stores live (a real disk: on tmpfs a durable commit costs nothing and the floor means nothing).

``--profile MESSAGES [STRATEGY ...]`` (passthrough, windowed, autobiographical; all unless named)
builds a store of MESSAGES and prints, for each strategy, cProfile's view of PROFILE_TURNS warm
turns (the turn alone: not the OpenAI forms, not the ``wait_ready`` after each): the functions by own
time and by cumulative time.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import itertools
import json
import pstats
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import lmdb
import trio

import ctxrt
from ctxrt.testing import ScriptedModel

from . import costs, edits, harness
from .harness import TABLE_HEAD, interleave, measured, median_figure, scratch, summary, versus

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-turn.md"
BUDGET = ctxrt.Budget(max_tokens=100_000)
ASSISTANT = "Claude"
MODEL = "bench-model"
SIZES = (2_000, 20_000, 200_000)
QUICK_SIZES = (2_000, 20_000)
STRATEGIES: dict[str, Callable[[], Any]] = {
    "Passthrough": ctxrt.Passthrough,
    "WindowedPassthrough": ctxrt.WindowedPassthrough,
    "Autobiographical": lambda: ctxrt.Autobiographical(MODEL, head_window_tokens=2_000),
}
NAMESPACES = {"Passthrough": "turn-passthrough", "WindowedPassthrough": "turn-windowed",
              "Autobiographical": "turn-autobiographical"}
TARGET_MS = {"Passthrough": 0.3, "WindowedPassthrough": 0.3, "Autobiographical": 0.5}
PARTS = ("add", "compile", "anthropic")  # the turn's parts, in order
FORMS = ("chat", "responses")  # timed after the turn, not in it
AFTER = ("compile_again", "anthropic_again", "copy")  # after the forms: the least a compile and a body cost
PROFILE_TURNS = 200
RESAMPLES = 1_000  # resamplings of the rounds for a figure's 95% interval

_WORDS = ("the plan for the next release covers the store the cache and the views we should check how the "
          "namespace actor answers a compile while a compression call is out").split()
_CORPUS = " ".join(_WORDS[(i * 7) % len(_WORDS)] for i in range(4_000))
_SUMMARY = ("I remember working through the deployment plan with the user: we checked the staging logs, found "
            "the retry storm in the queue consumer, agreed to cap retries at five and to add jitter, and left "
            "the alert thresholds as an open question for the on-call review. ") * 18  # about 1,500 tokens


def text(n: int) -> str:
    """Message ``n``: 96-108 characters of prose, about 36 estimated tokens."""
    head = f"[{n}] "
    start = (n * 40_503) % (len(_CORPUS) - 200)
    return head + _CORPUS[start:start + 96 + n % 13 - len(head)]


def participant(n: int) -> str:
    return "user" if n % 2 == 0 else ASSISTANT


def stored_size(n: int) -> int:
    """Bytes the store keeps for message ``n`` (its compact JSON with a 13-digit timestamp), computed
    here without reaching into ctxrt: the floor puts as much."""
    body = {"participant": participant(n), "content": [{"type": "text", "text": text(n)}],
            "timestamp_ms": 1_700_000_000_000}
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


def scripted() -> ScriptedModel:
    """A zero-latency model whose every summary is numbered, so no two are alike."""
    numbers = itertools.count()
    return ScriptedModel(lambda request: f"Summary {next(numbers)}. {_SUMMARY}")


# -- building --------------------------------------------------------------------------------------


async def build(store: Path, size: int) -> dict[str, float]:
    """``size`` messages through ``add_message`` (durability "os"), then the Autobiographical
    namespace's summaries (durability "os", ``wait_ready``); seconds of each, and the summaries made."""
    filled = await harness.fill(store, size, text, participant=participant)
    started = time.perf_counter()
    model = scripted()
    async with ctxrt.open_runtime(store, model=model, durability="os") as rt:
        manager = await rt.open(NAMESPACES["Autobiographical"], strategy=STRATEGIES["Autobiographical"]())
        await manager.wait_ready()
    return {"fill_s": filled, "compress_s": time.perf_counter() - started, "summaries": len(model.requests)}


# -- measuring -------------------------------------------------------------------------------------


class Turns:
    """The strategies' managers, and the counter their messages are numbered by."""

    def __init__(self, managers: dict[str, ctxrt.ContextManager], numbers: Iterator[int]) -> None:
        self.managers = managers
        self.numbers = numbers

    async def one(self, name: str, *, forms: bool = True, floor: costs.Raw | None = None) -> dict[str, float]:
        """One turn of ``name``'s namespace: ms of each part, and (``forms``) of the other request forms
        after it. With ``floor``, one raw put of the message's stored size right before the
        ``add_message`` and one after the rest: "floor" is their mean, "excess" the ``add_message``
        less that. (Not the second put right after ``add_message``: Python run right after the
        thread's own fsync is slower, which added about 0.05 ms to the compile after it.)"""
        manager = self.managers[name]
        n = next(self.numbers)
        payload = b"x" * stored_size(n) if floor is not None else b""
        clock = time.perf_counter_ns
        before = _put(floor, payload) if floor is not None else 0.0
        t0 = clock()
        await manager.add_message(participant(n), text(n))
        t1 = clock()
        result = await manager.compile(BUDGET)
        t2 = clock()
        result.to_anthropic(assistant=ASSISTANT)
        t3 = clock()
        figures = {"add": (t1 - t0) / 1e6, "compile": (t2 - t1) / 1e6, "anthropic": (t3 - t2) / 1e6,
                   "messages": len(result.messages)}
        figures["turn"] = figures["add"] + figures["compile"] + figures["anthropic"]
        if forms:
            result.to_openai_chat(assistant=ASSISTANT)
            t4 = clock()
            result.to_openai_responses(assistant=ASSISTANT)
            t5 = clock()
            list(result.messages)
            t6 = clock()
            again = await manager.compile(BUDGET)  # nothing changed since: what any compile costs at this size
            t7 = clock()
            again.to_anthropic(assistant=ASSISTANT)
            figures.update(chat=(t4 - t3) / 1e6, responses=(t5 - t4) / 1e6, copy=(t6 - t5) / 1e6,
                           compile_again=(t7 - t6) / 1e6, anthropic_again=(clock() - t7) / 1e6)
        if floor is not None:
            figures["floor"] = (before + _put(floor, payload)) / 2
            figures["excess"] = figures["add"] - figures["floor"]
        return figures

    async def sample(self, name: str, count: int, floor: costs.Raw | None = None) -> list[dict[str, float]]:
        """``count`` turns (``one``), each followed by ``wait_ready`` (untimed), so every turn finds its
        summaries in place."""
        turns = []
        for _ in range(count):
            turns.append(await self.one(name, floor=floor))
            await self.managers[name].wait_ready()
        return turns


def _put(raw: costs.Raw, payload: bytes) -> float:
    """ms of one raw put and commit (durable or not, as ``raw`` was opened)."""
    started = time.perf_counter_ns()
    raw.put(payload)
    return (time.perf_counter_ns() - started) / 1e6


def copies(store: Path, tag: str) -> dict[str, Path]:
    """A file copy of the closed ``store`` per strategy, beside it: each strategy's turns then grow
    only its own copy, so a few hundred turns leave every one near the size it is measured at."""
    out = {}
    for name in STRATEGIES:
        out[name] = store.with_name(f"{store.name}-{tag}-{NAMESPACES[name]}")
        shutil.copytree(store, out[name])
    return out


async def measure(store: Path, durability: Literal["sync", "os"], numbers: Iterator[int], raw_dir: Path,
                  settings: dict[str, Any], rng: random.Random) -> dict[str, list[list[dict[str, float]]]]:
    """Each strategy's turns, round by round, each bracketed by floor puts: on a copy of ``store`` per
    strategy opened with ``durability``, the floor's puts committed the same way ("sync": durably)."""
    stores = copies(store, durability)
    raw = costs.Raw(raw_dir, sync=durability == "sync")
    try:
        async with contextlib.AsyncExitStack() as stack:
            managers = {}
            for name, config in STRATEGIES.items():
                rt = await stack.enter_async_context(
                    ctxrt.open_runtime(stores[name], model=scripted(), durability=durability))
                managers[name] = await rt.open(NAMESPACES[name], strategy=config())
            turns = Turns(managers, numbers)
            for name in managers:  # warm-up, not counted: the first compile reads back what the budget holds
                await turns.sample(name, 3, raw)

            def sampler(name: str) -> Callable[[int], Any]:
                return lambda _: turns.sample(name, settings["samples"], raw)

            return await interleave(settings["rounds"], {name: sampler(name) for name in managers}, rng)
    finally:
        raw.close()
        for path in stores.values():
            shutil.rmtree(path, ignore_errors=True)


async def shared_figures(stores: dict[int, Path], settings: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """bench/costs.py's cold open, fork and further-namespace figures at BUDGET, the largest store
    against the smallest."""
    small, large = min(stores), max(stores)
    out: dict[str, Any] = {}
    for size in (small, large):  # each namespace's first open ever, not measured
        for strategy in costs.STRATEGIES:
            costs.run_child(stores[size], strategy, BUDGET)
    cold: dict[tuple[int, str], list[float]] = {(s, k): [] for s in (small, large) for k in costs.STRATEGIES}
    for _ in range(settings["cold_rounds"]):
        order = list(cold)
        rng.shuffle(order)
        for size, strategy in order:
            await trio.lowlevel.checkpoint()
            cold[size, strategy].append(costs.run_child(stores[size], strategy, BUDGET)["total"])
    out["cold"] = cold
    async with ctxrt.open_runtime(stores[large]) as big_rt, ctxrt.open_runtime(stores[small]) as small_rt:
        for rt in (big_rt, small_rt):
            base = await rt.open("forker", strategy=ctxrt.Passthrough())
            await base.compile(BUDGET)
            await costs.fork_once(rt, "warm-up", BUDGET)
        forks = await interleave(settings["fork_rounds"], {
            "large": lambda r: costs.fork_once(big_rt, f"fork-{r}", BUDGET),
            "small": lambda r: costs.fork_once(small_rt, f"fork-{r}", BUDGET)}, rng)
        out["fork"] = {key: [f["total"] for f in values] for key, values in forks.items()}
        out["memory"] = [await costs.further_namespaces(big_rt, f"turn-{r}", settings["further"], BUDGET)
                         for r in range(settings["memory_rounds"])]
    return out


# -- rows ------------------------------------------------------------------------------------------


def _settings(quick: bool) -> dict[str, Any]:
    # rounds x samples turns per strategy: at most ~500, so the 2,000-message copies stay under the budget
    if quick:
        return {"sizes": QUICK_SIZES, "rounds": 8, "samples": 40, "edit_rounds": 3, "cold_rounds": 3,
                "fork_rounds": 3, "memory_rounds": 1, "further": 3}
    return {"sizes": SIZES, "rounds": 12, "samples": 40, "edit_rounds": 5, "cold_rounds": 5, "fork_rounds": 5,
            "memory_rounds": 2, "further": 4}


def over_floor(turns: Iterable[dict[str, float]]) -> float:
    """The turn over the floor of these turns: the median of their paired differences (``add_message``
    less the mean of its floor puts) plus their median compile and their median to_anthropic."""
    turns = list(turns)
    return sum(statistics.median(turn[key] for turn in turns) for key in ("excess", "compile", "anthropic"))


def _interval(value: float, resampled: list[float]) -> dict[str, float]:
    """``value`` with the central 95% of its resampled values, as a figure (``{"median", "min", "max"}``)."""
    ordered = sorted(resampled)
    return {"median": value, "min": ordered[int(0.025 * len(ordered))],
            "max": ordered[int(0.975 * len(ordered)) - 1]}


def estimates(rounds: dict[str, list[list[dict[str, float]]]], rng: random.Random) -> dict[str, dict[str, float]]:
    """Each strategy's turn over the floor over all its turns (``over_floor``), with a 95% interval from
    RESAMPLES resamplings of whole rounds, the same rounds for every strategy; and under "ratio",
    WindowedPassthrough's over Passthrough's, its interval from the same resamplings."""
    count = len(rounds["Passthrough"])
    picks = [[rng.randrange(count) for _ in range(count)] for _ in range(RESAMPLES)]
    out, resampled = {}, {}
    for name, turns in rounds.items():
        resampled[name] = [over_floor(turn for i in pick for turn in turns[i]) for pick in picks]
        out[name] = _interval(over_floor(turn for each in turns for turn in each), resampled[name])
    out["ratio"] = _interval(out["WindowedPassthrough"]["median"] / out["Passthrough"]["median"],
                             [w / p for w, p in zip(resampled["WindowedPassthrough"], resampled["Passthrough"])])
    return out


def pooled(rounds: list[list[dict[str, float]]], key: str) -> dict[str, float]:
    """The median of ``key`` over every turn, with the min–max across rounds of each round's median."""
    medians = [statistics.median(turn[key] for turn in each) for each in rounds]
    return {"median": statistics.median(turn[key] for each in rounds for turn in each), "min": min(medians),
            "max": max(medians)}


def turn_rows(size: int, durable: dict[str, list[list[dict[str, float]]]],
              cpu: dict[str, list[list[dict[str, float]]]], rng: random.Random) -> list[dict[str, Any]]:
    """Each strategy's turn over the durable floor (with its parts) and, beside it, its CPU over the floor
    with no fsync on either side; then WindowedPassthrough's turn over the floor against Passthrough's."""
    over, cpu_over = estimates(durable, rng), estimates(cpu, rng)
    rows = []
    for name in STRATEGIES:
        rounds, cpu_rounds = durable[name], cpu[name]
        rows.append(harness.row(
            f"{name}, {size:,} messages: a turn over the durable-commit floor", "ms", over[name],
            target=TARGET_MS[name], op="<=", comparison=pooled(rounds, "floor"), comparison_label="the floor",
            ratio=None, paired_ratio=None, size=size, strategy=name,
            parts={key: pooled(rounds, key) for key in (*PARTS, *FORMS, "turn", "floor", "excess")},
            cpu_parts={key: pooled(cpu_rounds, key) for key in (*PARTS, *AFTER, "floor", "excess")},
            compiled=statistics.median(turn["messages"] for each in rounds for turn in each),
        ))
        rows.append(harness.row(
            f"{name}, {size:,} messages: the turn's CPU over the floor, no fsync on either side (durability "
            "\"os\"; not the issue's figure)", "ms", cpu_over[name], target=None, op=None,
            comparison=pooled(cpu_rounds, "floor"), comparison_label="the floor without fsync", ratio=None,
            paired_ratio=None,
        ))
    ratio = over["ratio"]
    rows.append(harness.row(
        f"WindowedPassthrough's turn over the floor vs Passthrough's, {size:,} messages", "ms",
        over["WindowedPassthrough"], target=1.0, op="<=", judged=ratio["median"], comparison=over["Passthrough"],
        comparison_label="Passthrough's", ratio=ratio["median"], ratio_interval=(ratio["min"], ratio["max"]),
        paired_ratio=None, size=size,
    ))
    return rows


def shared_rows(shared: dict[str, Any], small: int, large: int) -> list[dict[str, Any]]:
    sizes = f"{large:,} vs {small:,} messages"
    rows = [versus(f"cold open + first compile, {costs.STRATEGY_NAMES[strategy]}, {sizes}", "ms",
                   shared["cold"][large, strategy], shared["cold"][small, strategy], f"at {small:,}", target=2.0,
                   op="<=") for strategy in costs.STRATEGIES]
    rows.append(versus(f"fork + rt.open on it + first compile, Passthrough, {sizes}", "ms",
                       shared["fork"]["large"], shared["fork"]["small"], f"at {small:,}", target=2.0, op="<="))
    rows.append(harness.row(
        f"heap held per further namespace compiling the shared slot at {large:,} messages (tracemalloc)", "MiB",
        [m["heap"] for m in shared["memory"]], target=5.0, op="<=",
        comparison=summary(m["rss"] for m in shared["memory"]), comparison_label="RSS growth", ratio=None,
        paired_ratio=None,
    ))
    return rows


async def _run(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    settings = _settings(quick)
    rng = random.Random(27)
    rows: list[dict[str, Any]] = []
    builds: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    with scratch("ctxrt-bench-turn-") as root:
        stores: dict[int, Path] = {}
        for size in settings["sizes"]:
            stores[size] = root / f"s{size}"
            builds[str(size)] = await build(stores[size], size)
            print(f"built {size:,} messages: {builds[str(size)]}", file=sys.stderr)
            numbers = itertools.count(size)
            durable = await measure(stores[size], "sync", numbers, root / f"floor-{size}", settings, rng)
            cpu = await measure(stores[size], "os", numbers, root / f"floor-os-{size}", settings, rng)
            rows += turn_rows(size, durable, cpu, rng)
            print(f"measured {size:,} at {time.perf_counter() - started:.0f} s", file=sys.stderr)
        small, large = min(stores), max(stores)
        rows += shared_rows(await shared_figures(stores, settings, rng), small, large)
        # Last: bench/edits.py's writer adds a block with an audience, which every later read would project.
        for size in (size for size in stores if size >= 20_000):
            rows += edits.figure_rows(size, await edits.measure(stores[size], size, settings["edit_rounds"], rng, BUDGET))
        print(f"done at {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return rows, {"settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
                  "builds": builds, "quick": quick, "seconds": time.perf_counter() - started}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every figure; one dict per figure (figures, target, passed)."""
    return harness.run_trio(_run, quick)


# -- markdown --------------------------------------------------------------------------------------


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    settings = first["settings"]
    builds = "; ".join(f"{int(size):,}: {b['fill_s']:.1f} s to add, {b['compress_s']:.1f} s to compress "
                       f"({b['summaries']:,} summaries)" for size, b in first["builds"].items())
    lines = [
        "## A turn: add_message, compile, to_anthropic", "",
        measured("turn", first["quick"], f"py-lmdb {lmdb.__version__}", f"trio {trio.__version__}")
        + f" The whole run took {first['seconds']:.0f} s.", "",
        "Every ctxrt figure goes through the public API. Messages of about 36 estimated tokens, alternating user and "
        "Claude; `Budget(max_tokens=100_000)` (96,000 usable). Stores built with durability \"os\" (" + builds
        + "), measured on a copy per strategy with durability \"sync\". A turn is a durable `add_message`, "
        "`compile` and `to_anthropic`; the floor is a raw py-lmdb put of the message's size with a durable "
        "commit, one right before each `add_message` and one after its turn. "
        f"{settings['rounds']} rounds of {settings['samples']} turns per strategy, the strategies in a shuffled "
        "order each round; then the same again on fresh copies with durability \"os\" and a floor that does "
        "not fsync, for the CPU rows. A turn over the floor is, over all the turns, the median of `add_message` "
        "less the mean of its two floor puts, plus the median `compile` and the median `to_anthropic`; in "
        f"brackets its 95% interval from {RESAMPLES:,} resamplings of whole rounds.", "",
        *TABLE_HEAD,
    ]
    for row in rows:
        comparison = row.get("comparison")
        if isinstance(comparison, dict):
            comparison = f"{row['comparison_label']}: {median_figure(comparison, row['unit'])}"
        ratio = "" if row.get("ratio") is None else f"{row['ratio']:.2f}"
        if row.get("ratio_interval"):
            ratio += " ({:.2f}–{:.2f})".format(*row["ratio_interval"])
        target = "" if row["target"] is None else f"{row['op']} {row['target']:g}"
        verdict = "" if row["passed"] is None else "pass" if row["passed"] else "**fail**"
        lines.append(f"| {row['measure']} | {median_figure(row['ctxrt'], row['unit'])} | {comparison or ''} | {ratio} "
                     f"| {target} | {verdict} |")
    lines += ["", "Where a turn's time goes, durable (ms; the median over all turns, min–max across rounds of "
              "each round's median):",
              "", "| size | strategy | compiled messages | floor put | add_message | add_message − floor, paired | "
              "compile | to_anthropic | turn | to_openai_chat | to_openai_responses |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "parts" in row:
            cells = [median_figure(row["parts"][key], "")
                     for key in ("floor", "add", "excess", "compile", "anthropic", "turn", *FORMS)]
            lines.append(f"| {row['size']:,} | {row['strategy']} | {row['compiled']:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", "The same with no fsync on either side (durability \"os\", the floor's commit not flushed): the "
              "CPU rows' parts; then, after the turn, what a compile and a body cost with nothing changed since "
              "(the least any compile or body costs at that size: the namespace actor's round trip, and the "
              "fresh lists a result and a body hand the host) and one copy of the compiled messages' list.",
              "", "| size | strategy | floor put | add_message | add_message − floor, paired | "
              "compile | to_anthropic | compile, nothing changed | to_anthropic, nothing changed | a list copy |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "cpu_parts" in row:
            cells = [median_figure(row["cpu_parts"][key], "")
                     for key in ("floor", "add", "excess", "compile", "anthropic", "compile_again",
                                 "anthropic_again", "copy")]
            lines.append(f"| {row['size']:,} | {row['strategy']} | " + " | ".join(cells) + " |")
    lines += ["", "- A turn over the floor pairs each `add_message` with the mean of the two floor puts around "
              "its turn, so what the disk does over a turn's few ms cancels, where a difference of two medians (the "
              "figure before) kept the disk's swings: on this host a durable commit is either fast (a fraction "
              "of a ms) or slow (several ms), in runs. The paired differences, compiles and bodies of all "
              "rounds are pooled, so the pairs that fell in the fast mode hold the median; the interval in "
              "brackets comes from resampling whole rounds: the estimate's spread within this run. Between runs "
              "the host's CPU load moves `compile` and `to_anthropic` by more than that (up to 1.6x across five "
              "quick runs on a shared 2-core host), and the durable rows with them; the paired difference stays put.",
              "- The CPU rows are the same estimate with nothing flushed: what a turn costs over a raw put when "
              "the disk is out of it. `compile` there mostly runs faster than in the durable rows: Python right after "
              "a thread slept in an fsync runs slower (bench/costs.py's reference row), a cost the durable "
              "turn really pays.",
              "- Each strategy's turns run on a file copy of the built store, so its own few hundred turns are all "
              "it adds. After each turn, untimed, `wait_ready` lets Autobiographical's summaries land.",
              "- The compile-after-edit, cold open, fork and memory rows reuse bench/edits.py's and bench/costs.py's "
              "code at this module's budget."]
    return "\n".join(lines) + "\n"


main = harness.entry("turn", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="2,000 and 20,000 messages, fewer rounds")


# -- profile ---------------------------------------------------------------------------------------

PROFILED = {"passthrough": "Passthrough", "windowed": "WindowedPassthrough", "autobiographical": "Autobiographical"}


async def _profile(size: int, names: list[str]) -> None:
    with scratch("ctxrt-bench-turn-profile-") as root:
        store = root / "store"
        print(f"built {size:,} messages: {await build(store, size)}", file=sys.stderr)
        async with ctxrt.open_runtime(store, model=scripted()) as rt:
            turns = Turns({name: await rt.open(NAMESPACES[name], strategy=STRATEGIES[name]()) for name in names},
                          itertools.count(size))
            for name in names:
                await turns.sample(name, 5)
                gc.collect()
                profiler = cProfile.Profile()
                figures = []
                for _ in range(PROFILE_TURNS):
                    profiler.enable()
                    figures.append(await turns.one(name, forms=False))
                    profiler.disable()
                    await turns.managers[name].wait_ready()  # summaries in place, outside the profile
                medians = {key: round(statistics.median(f[key] for f in figures), 3) for key in figures[0]}
                print(f"\n==== {name}, {size:,} messages, {PROFILE_TURNS} turns (median ms under the profiler): "
                      f"{medians}")
                stats = pstats.Stats(profiler)
                stats.sort_stats("tottime").print_stats(30)
                stats.sort_stats("cumulative").print_stats(45)


def profile(argv: list[str]) -> int:
    """``--profile MESSAGES [STRATEGY ...]``: cProfile of PROFILE_TURNS warm turns per strategy."""
    size = int(argv[0]) if argv else 20_000
    names = [PROFILED[each] for each in argv[1:]] or list(STRATEGIES)
    trio.run(_profile, size, names)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--profile"]:
        raise SystemExit(profile(sys.argv[2:]))
    raise SystemExit(main())
