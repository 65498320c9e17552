"""Two trees of ctxrt side by side on one PostgreSQL cluster, in one run: the figures of
``bench/postgres.py`` that a change of the commit path moves, before and after.

    python -m bench.postgres_compare OTHER_TREE [--rounds N] [--seconds S]

OTHER_TREE is a checkout of another commit (``git archive COMMIT | tar -x -C DIR``): its ``ctxrt``
and its ``bench/postgres_writer.py`` run in child processes, as this tree's do. In each round, in a
shuffled order, each tree runs:

- latency: one child process opens a durable runtime (its own database, made once per tree) and
  times ``add_message`` and the raw transaction shaped like its append (``bench/postgres.py``'s
  ``RawPostgres.transaction``, in a database of its own) alternately, ``PER_ROUND`` of each after
  warm-up ones: the child's medians, so each ratio compares figures taken in the same seconds;
  with them, the floor: the same store's append batch alone (``PostgresEngine.apply`` of the
  command an ``add_message`` of another namespace sent, called again and again on the caller's
  thread, synchronous: one round trip), what ``add_message`` costs past the server's work;
- writers: 8 writer processes, each on its own slot of one store, then the same processes each
  writing a database of its own (``bench/postgres.py``'s ``writers_round``, (2)).

Prints one markdown table: per tree, median (min-max across rounds) of each figure and ratio.
Nothing is written to the results files: quote it where it is read (``results-postgres.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PER_ROUND = 30  # add_message calls and raw transactions per latency round, after 10 warm-up ones
PROCESSES = 8


def _latency_child(url: str, raw_url: str, count: int, pooled: bool = False) -> None:
    """In a child process whose ``ctxrt`` is the tree under test: print the medians, s. ``pooled``:
    the URLs are a transaction-mode pooler's (the raw transaction prepares no statement)."""
    import psycopg
    import trio

    import ctxrt

    conn = psycopg.connect(raw_url, autocommit=True, **({"prepare_threshold": None} if pooled else {}))
    conn.execute("CREATE TABLE IF NOT EXISTS raw_items (id bigint PRIMARY KEY, data bytea NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS raw_heads (id integer PRIMARY KEY, head bytea NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS raw_meta (key text PRIMARY KEY, value bigint NOT NULL)")
    conn.execute("INSERT INTO raw_meta VALUES ('sequence', 0) ON CONFLICT DO NOTHING")
    data = ("x" * 200).encode()

    def raw() -> float:  # as bench/postgres.py's RawPostgres.transaction
        started = time.perf_counter()
        with conn.transaction():
            row = conn.execute("SELECT value FROM raw_meta WHERE key = 'sequence' FOR UPDATE").fetchone()
            sequence = row[0] + 1 if row else 1
            conn.execute("INSERT INTO raw_items (id, data) VALUES (%s, %s)", (sequence, data))
            conn.execute("INSERT INTO raw_heads (id, head) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET head = "
                         "EXCLUDED.head", (data[:40],))
            conn.execute("UPDATE raw_meta SET value = %s WHERE key = 'sequence'", (sequence,))
        return time.perf_counter() - started

    async def main() -> dict[str, float]:
        async with ctxrt.open_runtime(url, durability="sync") as rt:
            manager = await rt.open("chat", isolate=True)
            batch = await _batch_alone(rt)
            appends, raws, batches = [], [], []
            for n in range(10 + count):
                started = time.perf_counter()
                await manager.add_message("user", f"m{n} " + "x" * 195)
                appended = time.perf_counter() - started
                took = raw()
                alone = batch()
                if n >= 10:
                    appends.append(appended)
                    raws.append(took)
                    batches.append(alone)
            return {"append": statistics.median(appends), "raw": statistics.median(raws),
                    "batch": statistics.median(batches)}

    print(json.dumps(trio.run(main)), flush=True)
    conn.close()


async def _batch_alone(rt: Any) -> Any:
    """A function that times the store's append batch alone: the command an ``add_message`` of a
    namespace of its own sent (caught on its way to ``engine.apply``), applied again on this thread
    (another item of that namespace's log, which nothing reads after), s."""
    engine, caught = rt.engine, []
    apply = engine.apply

    def catch(commands: Any, execute: Any, unnested: Any = None) -> Any:
        caught.append((list(commands), execute, unnested))
        return apply(commands, execute, unnested)

    engine.apply = catch  # the committer calls ``self.apply``: this instance's attribute first
    try:
        await (await rt.open("floor", isolate=True)).add_message("user", "f " + "x" * 197)
    finally:
        del engine.apply
    commands, execute, unnested = caught[-1]

    def batch() -> float:
        started = time.perf_counter()
        apply(commands, execute, unnested)
        return time.perf_counter() - started

    return batch


def latency(tree: Path, url: str, raw_url: str, pooled: bool = False) -> dict[str, float]:
    """One latency round in a child process running ``tree``'s ctxrt: add_message, the raw
    transaction and our batch alone, alternating, medians in s (``_latency_child``)."""
    env = dict(os.environ, PYTHONPATH=str(tree))  # and -P: that tree's ctxrt, not this directory's modules
    out = subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), "latency", url, raw_url, str(PER_ROUND),
                          *(["pooled"] if pooled else [])],
                         env=env, cwd=tree, capture_output=True, text=True, timeout=600, check=True)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def _span(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return (f"{statistics.median(values) * scale:.{digits}f} "
            f"({min(values) * scale:.{digits}f}–{max(values) * scale:.{digits}f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="the other tree (before)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="each writer round's window")
    args = parser.parse_args(argv)
    from ctxrt.pgcluster import temporary_cluster

    from .postgres import writers_round

    trees = {"before": args.other.resolve(), "after": HERE.parent}
    rng = random.Random(20261205)
    fresh = iter(range(1_000_000))
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with temporary_cluster() as cluster:
        urls = {name: (cluster.create_database(f"latency_{name}"), cluster.create_database(f"raw_{name}"))
                for name in trees}
        for _ in range(args.rounds):
            order = [(name, kind) for name in trees for kind in ("latency", "own slot", "own database")]
            rng.shuffle(order)
            for name, kind in order:
                got = figures[name]
                if kind == "latency":
                    found = latency(trees[name], *urls[name])
                    got.setdefault("append", []).append(found["append"])
                    got.setdefault("raw", []).append(found["raw"])
                    got.setdefault("append / raw", []).append(found["append"] / found["raw"])
                    got.setdefault("batch", []).append(found["batch"])
                    got.setdefault("append / batch", []).append(found["append"] / found["batch"])
                    got.setdefault("batch / raw", []).append(found["batch"] / found["raw"])
                else:
                    rate = writers_round(cluster, PROCESSES, args.seconds, f"writers_{next(fresh)}", kind,
                                         tree=trees[name])["rate"]
                    got.setdefault(kind, []).append(rate)
    for got in figures.values():
        got["own slot / own database"] = [a / b for a, b in zip(got["own slot"], got["own database"], strict=True)]
    print(f"{args.rounds} rounds, {time.perf_counter() - started:.0f} s, load average {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; before: {trees['before']}")
    print("| figure | before | after | after / before |")
    print("|---|---|---|---|")
    rows = [("add_message, ms", "append", 1e3), ("raw append-shaped transaction, ms", "raw", 1e3),
            ("add_message / raw transaction (per round)", "append / raw", 1.0),
            ("the floor: our append batch alone (sync, one round trip), ms", "batch", 1e3),
            ("add_message / our batch alone (per round)", "append / batch", 1.0),
            ("our batch alone / raw transaction (per round)", "batch / raw", 1.0),
            (f"{PROCESSES} processes, own slots of one store, appends/s", "own slot", 1.0),
            (f"{PROCESSES} processes, own databases, appends/s", "own database", 1.0),
            ("one store / own databases (per round)", "own slot / own database", 1.0)]
    for label, key, scale in rows:
        before, after = figures["before"][key], figures["after"][key]
        digits = 0 if scale == 1.0 and statistics.median(after) > 100 else 2
        print(f"| {label} | {_span(before, scale, digits)} | {_span(after, scale, digits)} | "
              f"{statistics.median(after) / statistics.median(before):.2f} |")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["latency"]:
        _latency_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:6] == ["pooled"])
    else:
        raise SystemExit(main())
