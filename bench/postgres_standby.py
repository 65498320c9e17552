"""(5) of ``python -m bench.postgres``: reads on a hot standby against the primary (issue 39 item 4).

A replica of the bench's cluster (``Cluster.replica()``: ``pg_basebackup -R``, streaming) and a
store built on the primary (namespace ``chat``, ``isolate=True``, 1,000 messages with ``--quick``,
else 20,000). A read-only runtime on each server's URL holds a warm manager of ``chat``; in each
round, in a shuffled order: the median of 3 ``compile`` of everything on each, and of 3
``last_sequence`` on each engine (on the standby it asks the primary and waits for the replay, K14).
Then the replica's lag, once per round: a durable ``add_message`` on the primary returns, and the
time until the standby has replayed the primary's WAL up to its insert position read at once after
(polled every 0.2 ms on connections already open).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
import trio

import ctxrt
from ctxrt.pgcluster import Cluster

from . import harness
from .harness import versus
from .peers import EVERYTHING, ctxrt_build

SIZE, QUICK_SIZE = 20_000, 1_000
PER_ROUND = 3
POLL_S = 0.0002


def _lag(primary: psycopg.Connection[Any], standby: psycopg.Connection[Any]) -> float:
    """Seconds from now until the standby has replayed the primary's WAL up to where it is now."""
    started = time.perf_counter()
    row = primary.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    lsn = row[0] if row else "0/0"
    while not (standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone() or (False,))[0]:
        time.sleep(POLL_S)
    return time.perf_counter() - started


async def _measure(cluster: Cluster, replica: Cluster, quick: bool, rng: random.Random) -> dict[str, Any]:
    size = QUICK_SIZE if quick else SIZE
    rounds = 5 if quick else 15
    url = cluster.create_database("standby_reads")
    await ctxrt_build(url, size)  # type: ignore[arg-type]  # a URL opens a PostgreSQL store
    await trio.to_thread.run_sync(replica.replayed)
    standby_url = replica.url("standby_reads")
    figures: dict[str, list[float]] = {}
    async with ctxrt.open_runtime(url) as writer, ctxrt.open_runtime(url, readonly=True) as on_primary, \
            ctxrt.open_runtime(standby_url, readonly=True) as on_standby:
        appender = await writer.open("chat", isolate=True)
        managers = {"primary": await on_primary.open("chat", isolate=True),
                    "standby": await on_standby.open("chat", isolate=True)}
        engines = {"primary": on_primary.engine, "standby": on_standby.engine}
        for manager in managers.values():
            await manager.compile(EVERYTHING)  # warm
        with psycopg.connect(url, autocommit=True) as primary_sql, \
                psycopg.connect(standby_url, autocommit=True) as standby_sql:
            for _ in range(rounds):
                steps: list[tuple[str, Callable[[], Any]]] = []
                for where, manager in managers.items():
                    steps.append((f"compile on the {where}", lambda m=manager: m.compile(EVERYTHING)))
                    steps.append((f"last_sequence on the {where}", lambda e=engines[where]: trio.to_thread.run_sync(
                        lambda: e.last_sequence)))
                rng.shuffle(steps)
                for name, step in steps:
                    times = []
                    for _ in range(PER_ROUND):
                        started = time.perf_counter()
                        await step()
                        times.append(time.perf_counter() - started)
                    figures.setdefault(name, []).append(statistics.median(times) * 1e3)
                await appender.add_message("user", "a line for the replica")
                figures.setdefault("lag", []).append(_lag(primary_sql, standby_sql) * 1e3)
    return {"standby": figures, "standby_size": size}


def measure(cluster: Cluster, quick: bool, rng: random.Random) -> dict[str, Any]:
    """(5) on a replica of ``cluster``, made and removed here."""
    with cluster.replica() as replica:
        return trio.run(_measure, cluster, replica, quick, rng)


def rows(info: dict[str, Any], reported: Callable[[dict[str, Any], str], dict[str, Any]]) -> list[dict[str, Any]]:
    figures, size = info["standby"], info["standby_size"]
    return [
        reported(versus(
            f"(5) compile of a namespace at {size:,} messages in a read-only runtime: on a hot standby vs on the "
            "primary", "ms", figures["compile on the standby"], figures["compile on the primary"], "on the primary",
            target=None, op=None), "standby / primary"),
        reported(versus(
            "(5) last_sequence on a hot standby (asks the primary, waits for the replay) vs on the primary", "ms",
            figures["last_sequence on the standby"], figures["last_sequence on the primary"], "on the primary",
            target=None, op=None), "standby / primary"),
        reported(harness.row(
            "(5) the replica's observed lag: a durable add_message returned until the standby replayed it", "ms",
            figures["lag"], target=None, op=None), ""),
    ]
