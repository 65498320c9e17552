"""The designs considered for a durable commit's flush, measured on raw py-lmdb under trio (internal path).

    python -m bench.flush_candidates [--quick]     (bench/flush.py runs it too, for its second table)

Each candidate commits one 600-byte put per durable transaction (an LMDB store of its own, sync
and metasync unless it says otherwise) from one appender task, in two settings: an idle loop, and
a loop kept busy by a task that computes for 150 µs between checkpoints (a compile's share of a
loaded host). Measured: the append's latency (p50, p99) and, when busy, the busy task's step
p99 (computing plus waiting for the loop: what a commit that stops the trio thread adds).

- ``inline``: begin, put, commit on the trio thread (the base).
- ``inline, metasync off``: LMDB's MDB_NOMETASYNC: the commit flushes the data pages only; its meta
  page reaches the disk with the next commit's flush, so an acknowledged write can be lost to a
  power loss. Half the flushes, still on the trio thread.
- ``whole txn in to_thread``: begin, put, commit in ``trio.to_thread.run_sync``.
- ``commit nosync + fdatasync in to_thread``: commit without a flush on the trio thread, then
  ``fdatasync`` the data file in ``to_thread``. LMDB's order (data flushed before the meta page
  that points at it) is lost: a power loss during that flush can leave a meta page on disk whose
  pages aren't.
- ``writer thread, no turns``: ctxrt's writer thread, the loop never handing it the GIL.
- ``writer thread`` (chosen): ctxrt's writer thread with ``GiveTurns`` and ``await_commit``, as the
  store actor runs it.

Rounds alternate the candidates in a shuffled order. Run alone, it prints its table; ``bench/flush.py``
puts it in ``bench/results-flush.md``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from . import harness
from .harness import scratch

VALUE = b"v" * 600
BURST_S = 0.00015
CANDIDATES = ("inline", "inline, metasync off", "whole txn in to_thread", "commit nosync + fdatasync in to_thread",
              "writer thread, no turns", "writer thread")

Commit = Callable[[bytes], Awaitable[None]]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Candidate:
    """One design over an LMDB environment of its own; ``append(key)`` is one durable commit."""

    def __init__(self, name: str, directory: Path) -> None:
        import lmdb

        self.name = name
        sync = name != "commit nosync + fdatasync in to_thread"
        self.env = lmdb.open(str(directory), map_size=1 << 30, sync=sync, metasync=name != "inline, metasync off")
        self.data_fd = os.open(directory / "data.mdb", os.O_RDONLY)
        self.writer: Any = None
        self.turns: Any = None

    def start(self) -> None:
        import trio

        from ctxrt.store.committer import GiveTurns
        from ctxrt.store.writer import WriterThread

        if self.name.startswith("writer thread"):
            self.writer = WriterThread(self.env)
            self.writer.start()
            if self.name == "writer thread":
                self.turns = GiveTurns(self.writer)
                trio.lowlevel.add_instrument(self.turns)

    def stop(self) -> None:
        import trio

        if self.turns is not None:
            trio.lowlevel.remove_instrument(self.turns)
        if self.writer is not None:
            self.writer.stop()
        os.close(self.data_fd)
        self.env.close()

    def _put_commit(self, key: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key, VALUE)

    async def append(self, key: bytes) -> None:
        import trio

        from ctxrt.store.committer import await_commit

        if self.name.startswith("inline"):
            self._put_commit(key)
            await trio.lowlevel.checkpoint()
        elif self.name == "whole txn in to_thread":
            await trio.to_thread.run_sync(self._put_commit, key)
        elif self.name == "commit nosync + fdatasync in to_thread":
            self._put_commit(key)
            await trio.to_thread.run_sync(os.fdatasync, self.data_fd)
        elif self.name == "writer thread":
            self.writer.begin().put(key, VALUE)
            error = await await_commit(self.writer, self.writer.commit)
            assert error is None, error
        else:  # the writer thread without turns: wait on its pipe, give it nothing
            self.writer.begin().put(key, VALUE)
            self.writer.commit()
            await trio.lowlevel.wait_readable(self.writer.ready)
            assert self.writer.landed() is None


async def _one(candidate: Candidate, appends: int, busy: bool) -> dict[str, list[float]]:
    import trio

    latencies: list[float] = []
    steps: list[float] = []
    done = trio.Event()

    async def computing() -> None:
        while not done.is_set():
            started = time.perf_counter()
            _spin(BURST_S)
            await trio.lowlevel.checkpoint()
            steps.append((time.perf_counter() - started) * 1e6)

    async with trio.open_nursery() as nursery:
        if busy:
            nursery.start_soon(computing)
        for n in range(appends):
            started = time.perf_counter()
            await candidate.append(b"%012d" % random.getrandbits(40))
            latencies.append((time.perf_counter() - started) * 1e6)
        done.set()
    return {"append": latencies, "step": steps}


def measure(root: Path, rounds: int, appends: int) -> dict[str, dict[str, list[float]]]:
    """Per candidate, pooled samples: ``idle`` and ``busy`` append latencies, and ``step`` (busy task)."""
    import trio

    async def body() -> dict[str, dict[str, list[float]]]:
        candidates = {}
        for index, name in enumerate(CANDIDATES):
            directory = root / f"candidate-{index}"
            directory.mkdir()
            candidates[name] = Candidate(name, directory)
            candidates[name].start()
        pooled: dict[str, dict[str, list[float]]] = {name: {"idle": [], "busy": [], "step": []} for name in CANDIDATES}
        rng = random.Random(7)
        try:
            for name in CANDIDATES:  # warm-up
                await _one(candidates[name], 5, False)
            for _ in range(rounds):
                order = list(CANDIDATES)
                rng.shuffle(order)
                for name in order:
                    pooled[name]["idle"] += (await _one(candidates[name], appends, False))["append"]
                    busy = await _one(candidates[name], appends, True)
                    pooled[name]["busy"] += busy["append"]
                    pooled[name]["step"] += busy["step"]
        finally:
            for candidate in candidates.values():
                candidate.stop()
        return pooled

    return trio.run(body)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else float("nan")


def table(pooled: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = ["| candidate | append, idle loop: p50 / p99 | append, busy loop: p50 / p99 | busy task's step p99 "
             "(150 µs of work) | keeps LMDB's flush order | answer after the flush |",
             "|---|---|---|---|---|---|"]
    keeps = {"commit nosync + fdatasync in to_thread": "no", "inline, metasync off": "yes (data, then meta later)"}
    answered = {"inline, metasync off": "no: the meta page waits for the next commit"}
    for name in CANDIDATES:
        figures = pooled[name]
        lines.append(
            f"| {name} | {percentile(figures['idle'], 0.5):,.0f} / {percentile(figures['idle'], 0.99):,.0f} µs | "
            f"{percentile(figures['busy'], 0.5):,.0f} / {percentile(figures['busy'], 0.99):,.0f} µs | "
            f"{percentile(figures['step'], 0.99):,.0f} µs | {keeps.get(name, 'yes')} | {answered.get(name, 'yes')} |")
    return lines


def section(pooled: dict[str, dict[str, list[float]]], rounds: int, appends: int, quick: bool) -> str:
    lines = [
        "### The candidates (internal path: raw py-lmdb under trio)",
        "",
        harness.measured("flush_candidates", quick, "py-lmdb " + _lmdb_version())
        + f" {rounds} rounds, each candidate in a shuffled order; per round and candidate {appends} durable "
        "commits of one 600-byte put on an idle loop, then as many beside a task that computes 150 µs between "
        "checkpoints. Percentiles pool every sample.",
        "",
        *table(pooled),
        "",
        "- The busy task's step is what a commit costs everyone else on the loop: the inline candidates stop "
        "it for their flushes (metasync off for one of the two, and it answers before its meta page is on "
        "disk, so a power loss can take an acknowledged write).",
        "- The busy-loop p99 of the candidates whose thread must win the GIL back by itself (a whole "
        "transaction in `to_thread`, a flush in `to_thread`, the writer thread without turns) is the GIL "
        "convoy: the thread waits behind a loop that drops and retakes the GIL at every pass.",
        "- A commit without a flush on the loop, then `fdatasync` in a thread, writes the meta page before "
        "the data pages it points at are flushed: a power loss during that flush can leave a store whose "
        "newest meta page points at pages that never reached the disk.",
        "- Chosen: the writer thread with turns: LMDB's own commit, its order kept, off the loop, and the "
        "thread handed the GIL when the loop is busy.",
        "",
    ]
    return "\n".join(lines)


def _lmdb_version() -> str:
    import lmdb

    return str(lmdb.__version__)


def run_candidates(quick: bool) -> tuple[dict[str, dict[str, list[float]]], int, int]:
    rounds, appends = (3, 40) if quick else (10, 60)
    with scratch("ctxrt-bench-flush-candidates-") as root:
        return measure(root, rounds, appends), rounds, appends


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.flush_candidates")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    pooled, rounds, appends = run_candidates(quick)
    print(section(pooled, rounds, appends, quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
