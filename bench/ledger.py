"""What the request ledger costs (issue 38; Q7), side by side in one run through the public API.

    python -m bench.ledger [--quick]

A turn with the ledger against one without, at 20,000 messages. A store of N messages (20,000;
quick: 5,000) of about 36 estimated tokens each, alternating user and Claude, is built through
``add_message`` (``harness.fill``, durability "os"), then opened with durability "sync" (the
default). Two Passthrough namespaces read the shared slot: "plain" (no ledger) and "kept"
(``ledger=True``). A turn of either is one durable ``add_message`` in its namespace, then
``compile(BUDGET)`` and ``to_anthropic(assistant="Claude")`` (the body a host sends); a kept turn
then calls ``record_request(result, form="anthropic", ...)`` with the usage and latency a model
reports. The budget is ``Budget(max_tokens=100_000)``: about 2,650 of these messages. Each round
runs SAMPLES turns of each, the two in a shuffled order; a variant's figure is the median over
all its turns. A record commits in the batch of the runtime's next ``add_message`` (Q1): the
kept turns' records ride in the next turn's append (a kept turn's, or the first plain one after
a kept run), as they would in a host where the reply is added next. Target: a kept turn <= 1.1x
a plain one. Two rows say where a kept turn's extra time goes: ``record_request``'s own call, and
the ``add_message`` its record rides in against a plain turn's. A third namespace, "small"
(``ledger=True``), takes kept turns with ``SMALL`` (about 28 of these messages) in the same rounds:
its ``record_request`` against the kept one's says how much of a record's cost follows the size
of the request, and how much is what any record costs. The floor row adds to each plain turn
the least any record adds (that record_request plus what the add_message a record rides in costs
over a plain one, medians of this run): the target is out of reach of any record whose floor row
is over it. The same rounds again with durability
"os" give the ratio without the disk's share (an fsync shared with other work swings the durable
one either way).

Reading the ledger: two ledgers of R records (1,000 and 100,000; quick: 1,000 and 20,000), each
made by ``record_request`` of one compile of a 40-message namespace over and over (durability
"os"), then ``requests(limit=50)`` on each, interleaved in rounds. Target: at the larger <= 2x at
1,000.

Results are printed and written to ``bench/results-ledger.md``. ``CTXRT_BENCH_DIR`` chooses where
the stores live.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any, Literal

import ctxrt

from .harness import TABLE_HEAD, entry, fill, interleave, measured, median_figure, run_trio, scratch, versus

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results-ledger.md"
BUDGET = ctxrt.Budget(max_tokens=100_000)
SAMPLES = 10
SMALL = ctxrt.Budget(max_tokens=2_000, reserve_for_response=1_000)
USAGE = ctxrt.Usage(9_000, 300, cache_read_input_tokens=8_500)


def say(n: int) -> str:
    return f"[{n}] a line of ordinary conversation about the plan, the build and the tests, and what came of them"


def speaker(n: int) -> str:
    return "user" if n % 2 else "Claude"


async def turns(store: Path, rounds: int, rng: random.Random,
                durability: Literal["sync", "os"] = "sync") -> dict[str, list[float]]:
    async with ctxrt.open_runtime(store, durability=durability) as rt:
        managers = {"plain": await rt.open("plain"), "kept": await rt.open("kept", ledger=True),
                    "small": await rt.open("small", ledger=True)}
        times: dict[str, list[float]] = {f"{name}{what}": [] for name in managers for what in ("", " add", " record")}
        written = [0]

        async def turn(name: str) -> float:
            manager = managers[name]
            began = time.perf_counter()
            await manager.add_message(speaker(written[0]), say(written[0]))
            times[f"{name} add"].append((time.perf_counter() - began) * 1000)
            result = await manager.compile(SMALL if name == "small" else BUDGET)
            result.to_anthropic(assistant="Claude")
            if name != "plain":
                recording = time.perf_counter()
                await manager.record_request(result, form="anthropic", options={"assistant": "Claude"},
                                             model="claude-x", usage=USAGE, latency_ms=850.0)
                times[f"{name} record"].append((time.perf_counter() - recording) * 1000)
            written[0] += 1
            return (time.perf_counter() - began) * 1000

        for name in managers:  # warm: each namespace's first compile reads the slot
            for _ in range(3):
                await turn(name)
        for each in times.values():
            each.clear()

        def variant(name: str) -> Any:
            async def run(_: int) -> float:
                for _ in range(SAMPLES):
                    times[name].append(await turn(name))
                return 0.0
            return run

        await interleave(rounds, {name: variant(name) for name in managers}, rng)
        for manager in managers.values():
            await manager.aclose()
    return times


async def ledger_of(store: Path, records: int) -> None:
    async with ctxrt.open_runtime(store, durability="os") as rt:
        manager = await rt.open("agents/ann", view_reader="ann", ledger=True)
        for n in range(40):
            await manager.add_message(speaker(n), say(n))
        result = await manager.compile(BUDGET)
        for _ in range(records):
            await manager.record_request(result, form="anthropic", options={"assistant": "Claude"}, usage=USAGE,
                                         latency_ms=850.0)
        await manager.aclose()


async def reads(stores: dict[int, Path], rounds: int, rng: random.Random) -> dict[int, list[float]]:
    async with ctxrt.open_runtime(stores[min(stores)], readonly=True) as small, \
            ctxrt.open_runtime(stores[max(stores)], readonly=True) as large:
        managers = {min(stores): await small.open("agents/ann"), max(stores): await large.open("agents/ann")}

        def variant(size: int) -> Any:
            async def run(_: int) -> float:
                times = []
                for _ in range(SAMPLES):
                    began = time.perf_counter()
                    found = await managers[size].requests(limit=50)
                    times.append((time.perf_counter() - began) * 1000)
                    assert len(found) == 50
                return statistics.median(times)
            return run

        return await interleave(rounds, {size: variant(size) for size in managers}, rng)


async def _body(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rng = random.Random(38)
    size = 5_000 if quick else 20_000
    rounds = 6 if quick else 16
    sizes = (1_000, 20_000 if quick else 100_000)
    rows = []
    with scratch("ctxrt-bench-ledger-") as tmp:
        built = await fill(tmp / "turns", size, say, participant=speaker)
        times = await turns(tmp / "turns", rounds, rng)
        cpu = await turns(tmp / "turns", rounds, rng, "os")
        rows.append(versus(f"a durable turn with record_request, {size:,} messages", "ms", times["kept"],
                           times["plain"], "without the ledger", target=1.1))
        rows.append(versus("  of which record_request's own call (no target: the rest is the write its record rides in)",
                           "ms", times["kept record"], times["plain"], "a turn without the ledger", target=None,
                           op=None))
        rows.append(versus("  record_request's own call for a 28-message request (no target: what any record costs)",
                           "ms", times["small record"], times["kept record"], "for the kept turn's", target=None,
                           op=None))
        rows.append(versus("  its add_message, which carries a kept turn's record (no target)", "ms", times["kept add"],
                           times["plain add"], "a plain turn's", target=None, op=None))
        # The least any record adds, from this run's medians: a 28-message request's record_request
        # and what the add_message a record rides in costs over a plain one. Against a plain turn,
        # it says whether any record, however small its request, could keep within the target.
        least = (statistics.median(times["small record"]) + statistics.median(times["kept add"])
                 - statistics.median(times["plain add"]))
        rows.append(versus("  the floor: a plain turn plus the least any record adds (a 28-message request's "
                           "record_request and the write a record rides in; no target)", "ms",
                           [each + least for each in times["plain"]], times["plain"], "a plain turn", target=None,
                           op=None))
        rows.append(versus("  the same turns with durability \"os\" (no target: the CPU alone, whatever the disk does)",
                           "ms", cpu["kept"], cpu["plain"], "without the ledger", target=None, op=None))
        made = {}
        for records in sizes:
            began = time.perf_counter()
            await ledger_of(tmp / f"ledger-{records}", records)
            made[records] = time.perf_counter() - began
        found = await reads({records: tmp / f"ledger-{records}" for records in sizes}, rounds, rng)
        rows.append(versus(f"requests(limit=50), {sizes[1]:,} records", "ms", found[sizes[1]], found[sizes[0]],
                           f"at {sizes[0]:,} records", target=2.0))
    info = {"messages": size, "built_s": built, "ledgers_s": made, "rounds": rounds, "samples": SAMPLES}
    return rows, info


def run(quick: bool = False) -> list[dict[str, Any]]:
    return run_trio(_body, quick)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    import lmdb
    import trio

    info = rows[0]
    lines = ["## The request ledger", "",
             measured("ledger", info["messages"] < 20_000, f"py-lmdb {lmdb.__version__}", f"trio {trio.__version__}"),
             "",
             f"A store of {info['messages']:,} messages built in {info['built_s']:.1f} s (durability \"os\"), measured "
             f"with durability \"sync\": {info['rounds']} rounds of {info['samples']} turns of each variant, in a "
             f"shuffled order each round; the figure is the median turn. The ledgers were made in "
             + ", ".join(f"{seconds:.1f} s ({records:,} records)" for records, seconds in info["ledgers_s"].items())
             + "; `requests(limit=50)` figures are the median across rounds of each round's median of "
             f"{info['samples']} reads.", "", *TABLE_HEAD]
    for each in rows:
        verdict = "" if each["passed"] is None else "pass" if each["passed"] else "**fail**"
        target = "" if each["target"] is None else f"<= {each['target']}"
        lines.append(f"| {each['measure']} | {median_figure(each['ctxrt'], 'ms')} | "
                     f"{each['comparison_label']}: {median_figure(each['comparison'], 'ms')} | {each['ratio']:.2f} | "
                     f"{target} | {verdict} |")
    return "\n".join(lines) + "\n"


main = entry("ledger", __doc__, run, to_markdown, RESULTS, quick_help="5,000 messages and 20,000 records")

if __name__ == "__main__":
    raise SystemExit(main())
