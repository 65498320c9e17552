"""``ctxrt load-test``: residents x namespaces x readers opening, claiming, adding, compiling and
ticking concurrently for a while, then checks that nothing was lost, leaked or claimed twice."""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .budget import Budget
from .errors import CtxrtError
from .runtime import open_runtime
from .testing import ScriptedModel


# Why a resident's call was refused, in words, for the refusals the load test expects.
_WHY = {
    "open: ReaderConflictError": "the namespace already records another reader (expected: each resident draws "
                                 "a reader at random, and a namespace serves the first reader that claims it)",
    "compile: OverBudgetError": "the newest message alone didn't fit the compile's budget",
}


def refusal_lines(refusals: Counter[str]) -> list[str]:
    """What ``refusals`` (keyed "operation: ErrorName") says, one line each, most frequent first."""
    return [f"{count} {key.partition(':')[0]} call{'s' if count != 1 else ''} refused with "
            f"{key.partition(': ')[2]}: {_WHY.get(key, 'unexpected; see docs/api.md for what raises it')}"
            for key, count in refusals.most_common()]


@attrs.define
class LoadReport:
    namespaces: int
    managers: int
    readers: int
    seconds: float
    operations: Counter[str]
    latencies_ms: dict[str, dict[str, float]]
    refusals: Counter[str]
    messages_acknowledged: int
    messages_stored: int
    claims: dict[str, str | None]
    claim_conflicts: list[str]
    actors_left: int
    deadlocked: bool

    @property
    def ok(self) -> bool:
        return (self.messages_acknowledged == self.messages_stored and not self.claim_conflicts
                and self.actors_left == 0 and not self.deadlocked)

    def throughput(self) -> dict[str, float]:
        return {name: count / self.seconds for name, count in self.operations.items()}


def _percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": ordered[-1], "mean": statistics.fmean(ordered)}


PROGRESS_EVERY_S = 0.25


async def run_load_test(
    store: Path | str, *, namespaces: int = 50, managers: int = 200, readers: int = 5, duration_s: float = 10.0,
    seed: int = 1, guard_s: float = 300.0, progress: Callable[[float, int], None] | None = None,
) -> LoadReport:
    """Run the load; ``guard_s`` bounds the whole run (a deadlock is reported, not hung on).

    ``progress``, if given, is called about every quarter second with the seconds elapsed and
    the operations done so far, and once more when the managers stop.

    Raises:
        StoreLockedError, StoreFormatError: as ``open_runtime`` on ``store``.
    """
    rng = random.Random(seed)
    names = [f"reader-{i}" for i in range(readers)]
    model = ScriptedModel(lambda request: "a summary of what happened " * 4)
    operations: Counter[str] = Counter()
    latencies: dict[str, list[float]] = {}
    refusals: Counter[str] = Counter()
    opened_for: dict[str, set[str]] = {}
    acknowledged = 0
    deadlocked = False
    started = time.perf_counter()

    def record(kind: str, began: float) -> None:
        operations[kind] += 1
        latencies.setdefault(kind, []).append((time.perf_counter() - began) * 1000)

    async with open_runtime(store, model=model, durability="os") as runtime:
        from .strategies.autobiographical import Autobiographical

        strategy = Autobiographical("load-model", target_chunk_tokens=400, recent_window_tokens=800,
                                    summary_target_tokens=50)

        async def resident(index: int) -> None:
            nonlocal acknowledged
            local = random.Random(rng.random())
            namespace = f"ns-{index % namespaces}"
            reader = local.choice(names)
            began = time.perf_counter()
            try:
                manager = await runtime.open(namespace, view_reader=reader, strategy=strategy)
            except CtxrtError as exc:
                refusals[f"open: {type(exc).__name__}"] += 1
                return
            record("open", began)
            opened_for.setdefault(namespace, set()).add(reader)
            try:
                deadline = started + duration_s
                while time.perf_counter() < deadline:
                    roll = local.random()
                    began = time.perf_counter()
                    operation = "add" if roll < 0.6 else "compile" if roll < 0.9 else "tick"
                    try:
                        if roll < 0.6:
                            await manager.add_message(local.choice(("user", reader)), f"{reader} says {local.random()}")
                            acknowledged += 1
                            record("add", began)
                        elif roll < 0.9:
                            await manager.compile(Budget(max_tokens=4000, reserve_for_response=500))
                            record("compile", began)
                        else:
                            await manager.tick()
                            record("tick", began)
                    except CtxrtError as exc:
                        refusals[f"{operation}: {type(exc).__name__}"] += 1
            finally:
                await manager.aclose()

        async def report_progress() -> None:
            assert progress is not None
            while time.perf_counter() < started + duration_s:
                progress(time.perf_counter() - started, sum(operations.values()))
                await trio.sleep(PROGRESS_EVERY_S)

        with trio.move_on_after(guard_s) as scope:
            async with trio.open_nursery() as nursery:
                if progress is not None:
                    nursery.start_soon(report_progress)
                for index in range(managers):
                    nursery.start_soon(resident, index)
        deadlocked = scope.cancelled_caught
        if progress is not None:
            progress(time.perf_counter() - started, sum(operations.values()))
        claims = {info.namespace: info.reader for info in await runtime.list_namespaces()}
        engine = runtime.engine
        stored = engine.read_head("messages", engine.branch("main").id).length
        actors_left = runtime.statistics().namespace_actors
    conflicts = [
        f"{namespace}: opened for {sorted(readers_seen)} but records {claims.get(namespace)!r}"
        for namespace, readers_seen in opened_for.items()
        if readers_seen != {claims.get(namespace)}
    ]
    return LoadReport(
        namespaces, managers, readers, time.perf_counter() - started, operations,
        {kind: _percentiles(samples) for kind, samples in latencies.items()}, refusals, acknowledged, stored,
        claims, conflicts, actors_left, deadlocked,
    )


def report_json(report: LoadReport) -> dict[str, Any]:
    data = attrs.asdict(report)
    data["throughput_per_s"] = report.throughput()
    data["ok"] = report.ok
    return data
