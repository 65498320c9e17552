"""PostgreSQL (issue 15): ctxrt on its PostgreSQL engine, against ctxrt on LMDB and LangGraph's
PostgresSaver on the same server, measured side by side in one run.

    python -m bench.postgres [--quick]

Everything goes through the public API a user calls: ``ctxrt.open_runtime(url)`` (a
``postgresql://`` URL) or ``open_runtime(directory)`` (LMDB), ``Runtime.open``, ``add_message``,
``compile``, ``get_all_messages``; LangGraph's ``PostgresSaver.from_conn_string(url)`` (its own
psycopg connection: autocommit, pipelined ``put``) after ``setup()``. Every measured write is
durable: ctxrt with ``durability="sync"`` (the default), the server at PostgreSQL's defaults
(``fsync``, ``synchronous_commit=on``; the values in force are read back and reported).

The server is a throwaway cluster (``ctxrt.pgcluster.temporary_cluster()``): PostgreSQL's own
durability settings, 32 MB of shared buffers, reached over a Unix socket (no TCP), on the same disk
as the LMDB stores. Every system, database and process below uses this one server. A message is
~200 B of text: ``add_message("user", text)`` on ctxrt, ``{"role": "user", "content": text}`` in
LangGraph's ``messages`` channel (a plain dict: the cheapest value it stores).

(1) A turn = append one message, then compile everything for the next model call, with 20,000
    (and 1,000) messages already present; ``--quick`` measures 1,000 only.
    - ctxrt (PostgreSQL and LMDB alike): ``add_message``, then ``compile`` with a budget that holds
      everything (the default ``Passthrough`` returns every message), one namespace with
      ``isolate=True`` (its own slot). After the turn, outside its time, ``get_all_messages``
      (the "load" column). Histories are built fast (durability "os": on PostgreSQL
      ``synchronous_commit=off``; 20 concurrent adders), then reopened "sync"; the first compile
      after reopening is shown (not a figure).
    - LangGraph PostgresSaver: ``get_tuple`` (the latest checkpoint of the thread), append the
      message to the ``messages`` channel, ``put`` a new checkpoint (as bench/peers.py does with
      SqliteSaver); the history is built as one checkpoint holding every message. After the
      turn, outside its time, one more ``get_tuple`` (the "load" column).
    Ratios: PG-ctxrt time / LMDB-ctxrt time, and PostgresSaver time / PG-ctxrt time.
(2) Append throughput of 1, 4 and 8 writer processes on one PostgreSQL store (a fresh database
    per variant and round). Each process (``bench/postgres_writer.py``) opens the store
    (durability "sync") and its own namespace ``writer-<n>`` with ``isolate=True`` (its own slot),
    appends once, then waits at a start barrier: the bench hands every process the same start
    and end time (``time.monotonic``, one clock for all processes) once all are ready. From the
    start, 8 trio tasks per process await ``add_message`` on that namespace's manager in a loop
    until the end; appends completed inside the window count. Figure: messages/s of all processes
    together; ratio to 1 process. The same processes each writing a database of its own on the
    same server (the server's shared-nothing figure: nothing of one store in common), and 4
    processes all appending to the store's shared slot (namespaces not isolated), run in the same
    rounds. With PgBouncer installed, every one of these variants runs again with each process
    connected through it in transaction mode (``pooler.url(database)``; "own database" too, so its
    ratio compares like with like), in the same shuffled rounds, and the same figures and ratios are
    reported for it ("through PgBouncer"). Every message is then counted back from the store
    (directly). Beside it:
    the host's CPU use in the window (2 cores shared by the writers and the server), how many
    appends each group commit carried, and, sampling ``pg_stat_activity`` every 20 ms, how many
    backends waited for a lock and how many sat in a transaction waiting for their client.
(3) A compile that must see another process's append: the bench process (A) holds a warm
    manager of namespace ``a`` at 20,000 messages (1,000 with ``--quick``) on the store's shared
    slot; process B (``bench/postgres_writer.py appender``, namespace ``b``, the same shared slot)
    appends one message; A's next ``compile`` (everything) is timed, and must end with B's
    message (checked every time). Against: A's warm compile with nothing new, and on LMDB a
    warm compile after a sibling manager of the same runtime appended (namespace ``b``, shared
    slot). The append itself is outside the time.
(4) For context, on the same server: a raw psycopg durable single-row INSERT of 200 B
    (autocommit: one commit), the ``SELECT 1`` round trip, and a raw transaction shaped like
    ctxrt's append (BEGIN; SELECT ... FOR UPDATE of one row; two INSERTs; UPDATE; COMMIT). These
    run in the rounds of (1), so the append/INSERT ratio compares figures measured side by side.
    With PgBouncer installed (Debian's 1.18), the largest size's turn also runs through it in
    transaction mode in front of the same server (``start_pooler``), in the same rounds: its
    ``add_message`` and turn against the direct ones, and its ``add_message`` against the raw
    append-shaped transaction through the same pooler (psycopg's prepared statements off:
    ``prepare_threshold=None``, since PgBouncer 1.18 can't route them).
    Issue 39's figure: a process of its own (``bench/postgres_compare.py``'s latency child, this
    tree) times a durable ``add_message`` (a namespace with ``isolate=True``) and the raw
    append-shaped transaction alternately, 30 of each after 10 warm-up ones, so each round's ratio
    compares operations taken in the same seconds in the same state (the turn's ``add_message``
    above follows a compile of everything and is timed 3 at a time, the raw transaction 20 at a
    time); with PgBouncer, the same through it. Target: <= 1.5x, the median of the per-round ratios.
(5) Reads on a hot standby of the same server vs on the primary, and the replica's lag
    (``bench/postgres_standby.py``).

Every variant runs in every round, in a shuffled order each round; for (1), (3) and (4) a round's
figure is the median of several consecutive operations (3 turns, 3 compiles, 20 raw statements),
after warm-up ones. Figures are medians with min–max across rounds; ratios are ratios of medians
(the per-round ratio median beside them). Results are printed and written to
``bench/results-postgres.md``. ``CTXRT_BENCH_DIR`` chooses where the LMDB stores live (a real disk,
not tmpfs); the cluster lives in a fresh ``/tmp/ctxrt-pg-*`` directory.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import ctxrt
from ctxrt.pgcluster import PGBOUNCER, Cluster, Pooler, find_binaries, start_pooler, temporary_cluster

from . import harness, postgres_standby
from .harness import fill, interleave, scratch, summary, versus
from .peers import EVERYTHING, CheckpointerTurns, CtxrtTurns, _figure, _text, ctxrt_build
from .postgres_writer import text as _marked

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results-postgres.md"
SIZES = (1_000, 20_000)
QUICK_SIZES = (1_000,)
# (2): (layout, processes); "own database" is the server's shared-nothing figure for "own slot"
WRITER_VARIANTS = (("own slot", 1), ("own slot", 4), ("own slot", 8), ("own database", 4), ("own database", 8),
                   ("shared slot", 4))
THROUGH_POOLER = ", through PgBouncer"  # (2): a layout's processes each connect to ``pooler.url(database)``
TASKS = 8  # trio tasks per writer process
TURNS_PER_ROUND = 3
COMPILES_PER_ROUND = 3
RAW_PER_ROUND = 20
SAMPLE_S = 0.02  # (2): how often pg_stat_activity is sampled in a writers' window
LANGGRAPH = "langgraph-checkpoint-postgres"
SKIPPED_LANGGRAPH = f"skipped: {LANGGRAPH} not installed (pip install -e '.[bench]')"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _commit() -> str:
    """The code measured: the short commit, and whether the tree had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=HERE.parent, capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "?"
    if head.returncode != 0:
        return "?"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _texts(message: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in message.content)


# -- (1) LangGraph's PostgresSaver ---------------------------------------------------------------


class PostgresSaverTurns(CheckpointerTurns):
    """``PostgresSaver.from_conn_string(url)`` after ``setup()``; one thread holds the conversation."""

    label = "PostgresSaver"

    def __init__(self, url: str, stack: contextlib.ExitStack) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver

        self.start(stack.enter_context(PostgresSaver.from_conn_string(url)))


# -- (4) raw psycopg -----------------------------------------------------------------------------


class RawPostgres:
    """Plain psycopg on one autocommit connection (prepared statements after psycopg's usual 5 uses;
    ``prepare_threshold=None``: none, as through PgBouncer 1.18, which can't route them)."""

    def __init__(self, url: str, prepare_threshold: int | None = 5) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=prepare_threshold)
        self.conn.execute("CREATE TABLE raw_rows (id bigserial PRIMARY KEY, data bytea NOT NULL)")
        self.conn.execute("CREATE TABLE raw_items (id bigint PRIMARY KEY, data bytea NOT NULL)")
        self.conn.execute("CREATE TABLE raw_heads (id integer PRIMARY KEY, head bytea NOT NULL)")
        self.conn.execute("CREATE TABLE raw_meta (key text PRIMARY KEY, value bigint NOT NULL)")
        self.conn.execute("INSERT INTO raw_meta VALUES ('sequence', 0)")
        self.data = _text(0).encode()
        self.sequence = 0

    def insert(self) -> float:
        started = time.perf_counter()
        self.conn.execute("INSERT INTO raw_rows (data) VALUES (%s)", (self.data,))
        return time.perf_counter() - started

    def select_one(self) -> float:
        started = time.perf_counter()
        self.conn.execute("SELECT 1").fetchone()
        return time.perf_counter() - started

    def transaction(self) -> float:
        """BEGIN; lock the sequence row; insert an item; upsert a head; move the sequence; COMMIT."""
        conn = self.conn
        started = time.perf_counter()
        with conn.transaction():
            sequence = conn.execute("SELECT value FROM raw_meta WHERE key = 'sequence' FOR UPDATE").fetchone()[0] + 1
            conn.execute("INSERT INTO raw_items (id, data) VALUES (%s, %s)", (sequence, self.data))
            conn.execute("INSERT INTO raw_heads (id, head) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET head = "
                         "EXCLUDED.head", (self.data[:40],))
            conn.execute("UPDATE raw_meta SET value = %s WHERE key = 'sequence'", (sequence,))
        return time.perf_counter() - started

    def close(self) -> None:
        self.conn.close()


def _server(cluster: Cluster) -> dict[str, str]:
    """The server's version and the durability settings in force."""
    import psycopg

    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        found = {"version": conn.execute("SHOW server_version").fetchone()[0]}
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "shared_buffers"):
            found[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return found


# -- (1), (3), (4): one trio run ---------------------------------------------------------------------


POOLED = "ctxrt on PostgreSQL via PgBouncer"  # transaction mode, in front of the same server
POOLED_RAW = "raw append-shaped transaction, through PgBouncer"


async def _in_trio(cluster: Cluster, pooler: Pooler | None, root: Path, quick: bool, rng: random.Random) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    rounds = 5 if quick else 21
    info: dict[str, Any] = {"build_s": {}, "first_compile_s": {}, "turn_rounds": rounds, "sizes": sizes}
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        info["skipped"] = [SKIPPED_LANGGRAPH]
        have_langgraph = False
    else:
        info["skipped"] = []
        have_langgraph = True

    # (1) turns and (4) raw statements, in the same rounds
    turners: dict[tuple[str, int], Callable[[], Any]] = {}
    with contextlib.ExitStack() as sync_stack:
        async with contextlib.AsyncExitStack() as stack:
            for size in sizes:
                for system in ("PostgreSQL", "LMDB"):
                    where: Any = cluster.create_database(f"turns_{size}") if system == "PostgreSQL" \
                        else root / f"turns-{size}"
                    started = time.perf_counter()
                    await ctxrt_build(where, size)
                    info["build_s"][f"ctxrt on {system} @ {size:,}"] = time.perf_counter() - started
                    rt = await stack.enter_async_context(ctxrt.open_runtime(where, durability="sync"))
                    manager = await rt.open("chat", isolate=True)
                    started = time.perf_counter()
                    await manager.compile(EVERYTHING)
                    info["first_compile_s"][f"ctxrt on {system} @ {size:,} (own slot)"] = time.perf_counter() - started
                    turners[f"ctxrt on {system}", size] = CtxrtTurns(manager, size).turn
                if pooler is not None and size == sizes[-1]:  # the same turn, each statement through the pooler
                    database = f"pooled_{size}"
                    cluster.create_database(database)
                    await ctxrt_build(pooler.url(database), size)
                    rt = await stack.enter_async_context(ctxrt.open_runtime(pooler.url(database), durability="sync"))
                    manager = await rt.open("chat", isolate=True)
                    await manager.compile(EVERYTHING)
                    turners[POOLED, size] = CtxrtTurns(manager, size).turn
                if have_langgraph:
                    peer = PostgresSaverTurns(cluster.create_database(f"langgraph_{size}"), sync_stack)
                    started = time.perf_counter()
                    peer.build(size)
                    info["build_s"][f"PostgresSaver @ {size:,}"] = time.perf_counter() - started
                    turners["PostgresSaver", size] = peer.turn
            raw = RawPostgres(cluster.create_database("raw"))
            sync_stack.callback(raw.close)
            raws = {"raw INSERT commit": raw.insert, "raw SELECT 1": raw.select_one,
                    "raw append-shaped transaction": raw.transaction}
            if pooler is not None:  # beside the pooled add_message: the same transaction through the pooler
                cluster.create_database("raw_pooled")
                pooled_raw = RawPostgres(pooler.url("raw_pooled"), prepare_threshold=None)
                sync_stack.callback(pooled_raw.close)
                raws[POOLED_RAW] = pooled_raw.transaction

            await harness.warm_up(turners)  # two turns each, not counted
            for op in raws.values():
                for _ in range(10):
                    op()

            async def turns_round(key: tuple[str, int]) -> dict[str, float]:
                batch = [await harness.take_turn(turners[key]) for _ in range(TURNS_PER_ROUND)]
                return {part: statistics.median(f[part] for f in batch) for part in batch[0]}

            async def raw_round(op: Callable[[], float]) -> dict[str, float]:
                values = [op() for _ in range(RAW_PER_ROUND)]
                await trio.lowlevel.checkpoint()
                return {"op": statistics.median(values)}

            variants: dict[Any, Callable[[int], Any]] = {
                key: (lambda _, key=key: turns_round(key)) for key in turners}
            variants.update({(name, 0): (lambda _, op=op: raw_round(op)) for name, op in raws.items()})
            info["turns"] = await interleave(rounds, variants, rng)

    # (3) a compile after another process's append
    size = sizes[-1]
    info["foreign_size"] = size
    pg_url = cluster.create_database("foreign")
    lmdb_path = root / "foreign"
    started = time.perf_counter()
    await fill(pg_url, size, _text)  # namespace "builder": the shared slot
    info["build_s"][f"ctxrt on PostgreSQL @ {size:,} (shared slot)"] = time.perf_counter() - started
    started = time.perf_counter()
    await fill(lmdb_path, size, _text)
    info["build_s"][f"ctxrt on LMDB @ {size:,} (shared slot)"] = time.perf_counter() - started
    appender = subprocess.Popen(
        [sys.executable, "-m", "bench.postgres_writer", pg_url, "appender"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=_child_env(), cwd=HERE.parent)
    try:
        assert appender.stdin is not None and appender.stdout is not None
        ready = await trio.to_thread.run_sync(appender.stdout.readline)
        if ready.strip() != "ready":
            raise RuntimeError(f"the appender process did not start (it said {ready!r})")
        async with ctxrt.open_runtime(pg_url) as pg_rt, ctxrt.open_runtime(lmdb_path) as lmdb_rt:
            pg_a = await pg_rt.open("a")
            started = time.perf_counter()
            await pg_a.compile(EVERYTHING)
            info["first_compile_s"][f"ctxrt on PostgreSQL @ {size:,} (shared slot)"] = time.perf_counter() - started
            lmdb_a, sibling = await lmdb_rt.open("a"), await lmdb_rt.open("b")
            started = time.perf_counter()
            await lmdb_a.compile(EVERYTHING)
            info["first_compile_s"][f"ctxrt on LMDB @ {size:,} (shared slot)"] = time.perf_counter() - started
            counts = {"pg": size, "lmdb": size}
            marks = iter(range(1_000_000))

            async def foreign_append() -> str:
                marker = f"from-B-{next(marks):06d}"
                appender.stdin.write(marker + "\n")
                appender.stdin.flush()
                answer = await trio.to_thread.run_sync(appender.stdout.readline)
                if not answer.strip():
                    raise RuntimeError("the appender process ended")
                counts["pg"] += 1
                return marker

            async def sibling_append() -> str:
                marker = f"from-sibling-{next(marks):06d}"
                await sibling.add_message("user", _marked(marker))
                counts["lmdb"] += 1
                return marker

            async def timed_compile(manager: Any, engine: str, marker: str | None) -> float:
                started = time.perf_counter()
                compiled = await manager.compile(EVERYTHING)
                elapsed = time.perf_counter() - started
                if len(compiled.messages) != counts[engine]:
                    raise AssertionError(f"{engine}: compiled {len(compiled.messages)} messages, not {counts[engine]}")
                if marker is not None and not _texts(compiled.messages[-1]).startswith(marker):
                    raise AssertionError(f"{engine}: the compile does not end with {marker!r}: "
                                         f"{_texts(compiled.messages[-1])[:40]!r}")
                return elapsed

            async def after(manager: Any, engine: str, append: Callable[[], Any] | None) -> float:
                values = []
                for _ in range(COMPILES_PER_ROUND):
                    marker = await append() if append is not None else None
                    values.append(await timed_compile(manager, engine, marker))
                return statistics.median(values)

            compile_variants = {
                "PG after B's append": lambda _: after(pg_a, "pg", foreign_append),
                "PG warm": lambda _: after(pg_a, "pg", None),
                "LMDB after sibling's append": lambda _: after(lmdb_a, "lmdb", sibling_append),
                "LMDB warm": lambda _: after(lmdb_a, "lmdb", None),
            }
            for variant in compile_variants.values():  # warm-up
                await variant(0)
            info["compiles"] = await interleave(rounds, compile_variants, rng)
            info["foreign_checked"] = counts["pg"] - size
    finally:
        if appender.stdin is not None:
            appender.stdin.close()
        try:
            appender.wait(timeout=30)
        except subprocess.TimeoutExpired:
            appender.kill()
            appender.wait()
    return info


# -- (2) writer processes -----------------------------------------------------------------------


def _child_env(tree: Path = HERE.parent) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def _host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def writers_round(cluster: Cluster, processes: int, seconds: float, name: str, layout: str = "own slot",
                  tree: Path = HERE.parent, pooler: Pooler | None = None) -> dict[str, float]:
    """One round of ``processes`` writer processes on a fresh database: their figures together.
    ``layout``: each on its own slot of one store ("own slot"), all on the store's shared slot
    ("shared slot"), or each on its own slot in a database of its own ("own database": the server's
    shared-nothing figure, no row or lock of one store in common). ``tree``: the checkout whose
    ctxrt and writer the processes run (another commit's, for ``bench/postgres_compare.py``).
    ``pooler``: the processes reach their database(s) through it (the count-back goes direct)."""
    names = [f"{name}_{p}" for p in range(processes)] if layout == "own database" else [name] * processes
    urls = {database: cluster.create_database(database) for database in dict.fromkeys(names)}
    reach = {database: pooler.url(database) if pooler is not None else url for database, url in urls.items()}
    extra = ["shared"] if layout == "shared slot" else []
    children = [
        subprocess.Popen([sys.executable, "-m", "bench.postgres_writer", reach[names[p]], "writers", str(p), str(TASKS),
                          *extra],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_child_env(tree), cwd=tree)
        for p in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"writer process {child.args[4]} did not start (it said {line!r})")
        gc.collect()
        start = time.monotonic() + 0.05
        end = start + seconds
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"go {start!r} {end!r}\n")
            child.stdin.flush()
        time.sleep(max(0.0, start - time.monotonic()))
        cpu_before = _host_cpu()
        waits = _sample_waits(cluster, list(urls), end)
        cpu_after = _host_cpu()
        results = []
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line.strip():
                raise RuntimeError(f"writer process {child.args[4]} ended without its figures")
            results.append(json.loads(line))
        for child in children:
            if child.wait(timeout=60) != 0:
                raise RuntimeError(f"writer process {child.args[4]} exited with {child.returncode}")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if pooler is not None:  # the pooler keeps a round's server connections idle: end them, or
            _end_backends(cluster, list(urls))  # the rounds' fresh databases fill max_connections
    if layout == "shared slot":
        stored = trio.run(_count_writers, urls[name], [0], False)[0]
        if stored != sum(r["appended"] for r in results):
            raise AssertionError(f"{sum(r['appended'] for r in results)} appends acknowledged, {stored} in the store")
    for result in results if layout != "shared slot" else ():
        p = result["process"]
        stored = trio.run(_count_writers, urls[names[p]], [p], True)[p]
        if stored != result["appended"]:
            raise AssertionError(f"writer-{p}: {result['appended']} appends acknowledged, {stored} in the store")
    busy = (cpu_after[0] - cpu_before[0]) / max(1, cpu_after[1] - cpu_before[1])
    counted = sum(r["counted"] for r in results)
    return {
        **waits,
        "rate": counted / seconds,
        "host_cpu": busy * 100,
        "writers_cpu": 100 * sum(r["cpu_s"] for r in results) / seconds / (os.cpu_count() or 1),
        "per_commit": sum(r["commands"] for r in results) / max(1, sum(r["batches"] for r in results)),
    }


def _latencies(cluster: Cluster, pooler: Pooler | None, quick: bool, rng: random.Random) -> dict[str, Any]:
    """(4), issue 39's figure: rounds of ``postgres_compare.latency`` (add_message, the raw
    transaction and our batch alone, alternating in a child process), direct and through the
    pooler, in a shuffled order each round: each round's medians, ms."""
    from .postgres_compare import latency

    ways = {"direct": (cluster.create_database("latency"), cluster.create_database("latency_raw"), False)}
    if pooler is not None:
        for name in ("latency_pooled", "latency_pooled_raw"):
            cluster.create_database(name)
        ways["through PgBouncer"] = (pooler.url("latency_pooled"), pooler.url("latency_pooled_raw"), True)
    found: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for _ in range(2 if quick else 5):
        order = list(ways)
        rng.shuffle(order)
        for way in order:
            found[way].append({key: value * 1e3 for key, value in latency(HERE.parent, *ways[way]).items()})
    return {"latency": found}


def _end_backends(cluster: Cluster, databases: list[str]) -> None:
    """End the server connections to ``databases`` (a pooler's idle ones, once its clients left)."""
    import psycopg

    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ANY(%s)", (databases,))


def _sample_waits(cluster: Cluster, databases: list[str], until: float) -> dict[str, float]:
    """Until ``until`` (monotonic), every ``SAMPLE_S``: how many of ``database``'s backends wait for a
    lock, and how many sit in an open transaction waiting for their client (a lock holder whose
    process hasn't sent its next statement yet). Means over the samples."""
    import psycopg

    locked = holding = samples = 0
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        while time.monotonic() < until:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),"
                " count(*) FILTER (WHERE state = 'idle in transaction')"
                " FROM pg_stat_activity WHERE datname = ANY(%s)", (databases,)).fetchone()
            locked += row[0]
            holding += row[1]
            samples += 1
            time.sleep(max(0.0, min(SAMPLE_S, until - time.monotonic())))
    return {"lock_waiters": locked / max(1, samples), "client_waits": holding / max(1, samples)}


async def _count_writers(url: str, processes: list[int], isolate: bool) -> dict[int, int]:
    async with ctxrt.open_runtime(url) as rt:
        return {p: await (await rt.open(f"writer-{p}", isolate=isolate)).message_count() for p in processes}


def _processes(cluster: Cluster, pooler: Pooler | None, quick: bool, rng: random.Random) -> dict[str, Any]:
    """(2): every variant direct and, with a pooler, every variant again through it (layout
    "<layout>, through PgBouncer"), all in the same shuffled rounds."""
    rounds = 2 if quick else 7
    seconds = 1.5 if quick else 3.0
    fresh = iter(range(1_000_000))
    variants = list(WRITER_VARIANTS)
    if pooler is not None:
        variants += [(layout + THROUGH_POOLER, processes) for layout, processes in WRITER_VARIANTS]
    figures: dict[tuple[str, int], list[dict[str, float]]] = {variant: [] for variant in variants}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for layout, processes in order:
            through = pooler if layout.endswith(THROUGH_POOLER) else None
            figures[layout, processes].append(writers_round(
                cluster, processes, seconds, f"writers_{next(fresh)}", layout.removesuffix(THROUGH_POOLER),
                pooler=through))
    return {"writers": figures, "writer_rounds": rounds, "writer_seconds": seconds}


# -- the run ----------------------------------------------------------------------------------------


def _rows(info: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    def ms(key: Any, part: str) -> list[float]:
        return [f[part] * 1e3 for f in info["turns"][key]]

    def reported(made: dict[str, Any], means: str) -> dict[str, Any]:
        made.update(ratio_means=means, quick=quick)
        return made

    rows = []
    sizes = info["sizes"]
    for size in sizes:
        rows.append(reported(versus(
            f"(1) turn at {size:,} messages (add_message + compile of everything): ctxrt on PostgreSQL vs on LMDB",
            "ms", ms(("ctxrt on PostgreSQL", size), "turn"), ms(("ctxrt on LMDB", size), "turn"), "ctxrt on LMDB",
            target=None, op=None), "PG time / LMDB time"))
        if ("PostgresSaver", size) in info["turns"]:
            rows.append(reported(versus(
                f"(1) turn at {size:,} messages: LangGraph PostgresSaver (get_tuple + put) vs ctxrt on PostgreSQL",
                "ms", ms(("ctxrt on PostgreSQL", size), "turn"), ms(("PostgresSaver", size), "turn"),
                "PostgresSaver", inverse=True, target=None, op=None), "PostgresSaver time / PG-ctxrt time"))
    writers = info["writers"]
    rates = {variant: [f["rate"] for f in figures] for variant, figures in writers.items()}
    # direct, then (with a pooler) the same figures with every process connected through PgBouncer
    for via in ("", THROUGH_POOLER) if ("own slot" + THROUGH_POOLER, 1) in rates else ("",):
        one = rates["own slot" + via, 1]
        rows.append(reported(harness.row(
            f"(2) durable appends/s, 1 writer process ({TASKS} tasks){via}", "msg/s", one, target=None, op=None), ""))
        for n in (4, 8):
            rows.append(reported(versus(
                f"(2) durable appends/s, {n} writer processes ({TASKS} tasks each, each its own slot), all "
                f"together{via}",
                "msg/s", rates["own slot" + via, n], one, "1 process" + via, target=1.5 if n == 4 else None,
                op=">=" if n == 4 else None), f"{n} processes / 1"))
            rows.append(reported(versus(
                f"(2) durable appends/s, {n} writer processes on one store vs each writing its own database "
                f"(the server's shared-nothing figure){via}", "msg/s", rates["own slot" + via, n],
                rates["own database" + via, n], f"{n} processes, own databases{via}", target=0.8, op=">="),
                "one store / own databases"))
        rows.append(reported(versus(
            f"(2) durable appends/s, 4 writer processes ({TASKS} tasks each) all on the store's shared slot{via}",
            "msg/s", rates["shared slot" + via, 4], one, "1 process" + via, target=1.0, op=">="), "4 processes / 1"))
    compiles = {name: [v * 1e3 for v in values] for name, values in info["compiles"].items()}
    size = info["foreign_size"]
    rows.append(reported(versus(
        f"(3) compile at {size:,} messages after another process's append vs a warm compile, nothing new (PG)",
        "ms", compiles["PG after B's append"], compiles["PG warm"], "PG warm", target=None, op=None),
        "after / warm"))
    rows.append(reported(versus(
        f"(3) compile at {size:,} after another process's append (PG) vs after a sibling manager's append (LMDB)",
        "ms", compiles["PG after B's append"], compiles["LMDB after sibling's append"], "LMDB after sibling",
        target=None, op=None), "PG / LMDB"))
    big = sizes[-1]
    raw = {name: [f["op"] * 1e3 for f in info["turns"][name, 0]]
           for name in ("raw INSERT commit", "raw SELECT 1", "raw append-shaped transaction")}
    rows.append(reported(versus(
        f"(4) ctxrt add_message on PostgreSQL (at {big:,}) vs a raw psycopg durable INSERT commit", "ms",
        ms(("ctxrt on PostgreSQL", big), "append"), raw["raw INSERT commit"], "raw INSERT commit",
        target=None, op=None), "add_message / INSERT"))
    rows.append(reported(versus(
        f"(4) ctxrt add_message on PostgreSQL (at {big:,}) vs a raw transaction shaped like its append", "ms",
        ms(("ctxrt on PostgreSQL", big), "append"), raw["raw append-shaped transaction"],
        "raw append-shaped transaction", target=None, op=None), "add_message / raw transaction"))
    if (POOLED, big) in info["turns"]:
        rows.append(reported(versus(
            f"(4) ctxrt add_message on PostgreSQL (at {big:,}) through PgBouncer in transaction mode vs direct", "ms",
            ms((POOLED, big), "append"), ms(("ctxrt on PostgreSQL", big), "append"), "direct",
            target=None, op=None), "through PgBouncer / direct"))
        rows.append(reported(versus(
            f"(1) turn at {big:,} messages through PgBouncer in transaction mode vs direct (PostgreSQL)", "ms",
            ms((POOLED, big), "turn"), ms(("ctxrt on PostgreSQL", big), "turn"), "direct",
            target=None, op=None), "through PgBouncer / direct"))
        if (POOLED_RAW, 0) in info["turns"]:
            rows.append(reported(versus(
                f"(4) ctxrt add_message on PostgreSQL (at {big:,}) vs a raw transaction shaped like its append, both "
                "through PgBouncer in transaction mode (psycopg's prepared statements off)", "ms",
                ms((POOLED, big), "append"), [f["op"] * 1e3 for f in info["turns"][POOLED_RAW, 0]],
                "raw append-shaped transaction, through PgBouncer", target=None, op=None),
                "add_message / raw transaction, through PgBouncer"))
    for way, rounds in info.get("latency", {}).items():
        rows.append(reported(versus(
            f"(4) issue 39's figure, {way}: a durable add_message vs the raw append-shaped transaction, alternating "
            "in a process of their own (per-round ratio judged)", "ms", [r["append"] for r in rounds],
            [r["raw"] for r in rounds], "raw append-shaped transaction", target=1.5, by_round=True),
            "add_message / raw transaction"))
        rows.append(reported(versus(
            f"(4) the floor, {way}: our append batch alone (sync, on the caller's thread) vs the raw transaction, "
            "alternating with them", "ms", [r["batch"] for r in rounds], [r["raw"] for r in rounds],
            "raw append-shaped transaction", target=None, op=None), "batch alone / raw transaction"))
    rows.append(reported(harness.row("(4) raw psycopg SELECT 1 round trip", "ms", raw["raw SELECT 1"],
                                     target=None, op=None), ""))
    rows.extend(postgres_standby.rows(info, reported))
    return rows


_LAST_INFO: dict[str, Any] = {}


def _missing() -> str | None:
    """One "skipped: ..." line when this machine can't run the bench (no psycopg, no PostgreSQL server)."""
    if importlib.util.find_spec("psycopg") is None:
        return "skipped: psycopg is not installed (pip install -e '.[bench]')"
    if find_binaries() is None:
        return ("skipped: PostgreSQL's server binaries (initdb, pg_ctl, postgres) were not found "
                "(Debian: apt-get install postgresql; `make` does it; or set PG_BINDIR)")
    return None


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure (1)-(5) on a throwaway cluster; one dict per figure (reported, no targets)."""
    missing = _missing()
    if missing:
        print(missing, file=sys.stderr)
        return [{"measure": "postgres", "skipped": missing, "module": "postgres"}]
    rng = random.Random(20240615)
    load = os.getloadavg()
    started = time.perf_counter()
    with temporary_cluster() as cluster, scratch("ctxrt-bench-postgres-") as root, contextlib.ExitStack() as stack:
        server = _server(cluster)
        pooler = stack.enter_context(start_pooler(cluster)) if os.access(PGBOUNCER, os.X_OK) else None
        info = trio.run(_in_trio, cluster, pooler, root, quick, rng)
        info.update(_processes(cluster, pooler, quick, rng))
        info.update(_latencies(cluster, pooler, quick, rng))
        info.update(postgres_standby.measure(cluster, quick, rng))
    info.update(server=server, quick=quick, load=(load, os.getloadavg()), seconds=time.perf_counter() - started,
                commit=_commit(),
                versions={"ctxrt": _version("ctxrt"), "trio": trio.__version__, "psycopg": _version("psycopg"),
                          LANGGRAPH: _version(LANGGRAPH), "PostgreSQL": server["version"]})
    rows = _rows(info, quick)
    for line in info.get("skipped", []):
        rows.append({"measure": "postgres", "skipped": line})
    _LAST_INFO.clear()
    _LAST_INFO.update(info)
    for each in rows:
        each.setdefault("module", "postgres")
    return rows


# -- report -------------------------------------------------------------------------------------------

def to_markdown(rows: list[dict[str, Any]], info: dict[str, Any] | None = None) -> str:
    info = info if info is not None else _LAST_INFO
    measured = [row for row in rows if "skipped" not in row]
    if not measured:
        return "\n".join(["## PostgreSQL", "", *(row['skipped'] for row in rows)]) + "\n"
    quick = info.get("quick", False)
    versions = ", ".join(f"{name} {version}" for name, version in info.get("versions", {}).items())
    server = info.get("server", {})
    lines = [
        "## PostgreSQL",
        "",
        harness.measured("postgres", quick, versions)
        + f" Code: commit {info.get('commit', '?')}. Took {info.get('seconds', 0) / 60:.1f} min. Every variant ran "
        "in every round, in a shuffled order; figures are medians (min–max across rounds); ratios are ratios of "
        "medians, the median of the per-round ratios beside them. Turns, raw statements and compiles: "
        f"{info.get('turn_rounds', '?')} rounds ({TURNS_PER_ROUND} turns, {RAW_PER_ROUND} statements, "
        f"{COMPILES_PER_ROUND} compiles per variant per round, after warm-up ones); writer processes: "
        f"{info.get('writer_rounds', '?')} rounds of {info.get('writer_seconds', '?')} s windows, a fresh database "
        "each.",
        "",
        "Server: a throwaway cluster (`ctxrt.pgcluster.temporary_cluster()`) on this machine's disk (ext4 on a "
        "virtual disk), Unix socket, "
        + ", ".join(f"{key}={server[key]}" for key in ("fsync", "synchronous_commit", "wal_sync_method",
                                                        "full_page_writes", "shared_buffers") if key in server)
        + " (PostgreSQL's defaults but shared_buffers): every acknowledged commit is flushed. ctxrt "
        "`durability=\"sync\"` on both engines; the LMDB stores on the same disk.",
        "",
    ]
    if info.get("load"):
        (before, *_), (after, *_) = info["load"]
        lines += [f"Host load average (1 min) when the run began: {before:.2f}; when it ended: {after:.2f} "
                  f"({os.cpu_count()} cores; other work on the machine shares them with this run).", ""]
    for row in rows:
        if "skipped" in row:
            lines += [row["skipped"], ""]
    lines += ["| measure | ctxrt | comparison | ratio | per-round ratio |", "|---|---|---|---|---|"]
    for row in measured:
        comparison = (f"{row['comparison_label']}: {_figure(row['comparison'], row['unit'])}"
                      if row.get("comparison_label") else "–")
        ratio = f"{row['ratio']:,.2f} ({row['ratio_means']})" if row.get("ratio") is not None else "–"
        paired = f"{row['paired_ratio']:,.2f}" if row.get("paired_ratio") is not None else "–"
        lines.append(f"| {row['measure']} | {_figure(row['ctxrt'], row['unit'])} | {comparison} | {ratio} | {paired} |")
    lines.append("")
    turns = info.get("turns", {})
    if turns:
        lines += [
            "(1) Each system's parts of a turn, ms (median, min–max). ctxrt: append = `add_message`, compile = "
            "`compile` of everything, turn = both, load = `get_all_messages` after it. PostgresSaver: get_tuple, "
            "append = building the new checkpoint + `put`, turn = both, load = one more `get_tuple`.",
            "",
            "| system @ messages | append | compile / get_tuple | turn | load |",
            "|---|---|---|---|---|",
        ]
        for (system, size), figures in turns.items():
            if system.startswith("raw"):
                continue
            parts = {part: summary([f[part] * 1e3 for f in figures]) for part in figures[0]}
            middle = parts.get("compile", parts.get("get_tuple"))
            cells = [_figure(p, "") if p is not None else "–"
                     for p in (parts.get("append"), middle, parts.get("turn"), parts.get("load"))]
            lines.append(f"| {system} @ {size:,} | " + " | ".join(cells) + " |")
        lines.append("")
    writers = info.get("writers", {})
    if writers:
        lines += [
            f"(2) Writer processes ({TASKS} trio tasks each; own slot: own namespace with `isolate=True`; shared "
            "slot: own namespace, not isolated; own database: as own slot, each process's store a database of its "
            "own on the same server), median (min–max) "
            "across rounds: all processes' appends/s; the host's CPU busy in the window (2 cores, shared with the "
            "server); the writer processes' own CPU as a share of all cores; appends per group commit (the store "
            "actor of each process batches its tasks' appends into one transaction); from `pg_stat_activity` sampled "
            f"every {SAMPLE_S * 1e3:.0f} ms in the window, the mean number of the round's backends waiting for a lock "
            "(a batch waits for the lock of a slot another process's batch is writing) and of those inside a "
            "transaction waiting for their client to send the next statement (the lock holder, mostly). Layouts "
            "ending \"through PgBouncer\": the same, each process connected through PgBouncer in transaction mode "
            "(`start_pooler`: default_pool_size 20 per database, so up to 20 server connections for one store, 20 "
            "for each of the own databases); the others connect directly.",
            "",
            "| layout | processes | appends/s | host CPU busy | writers' CPU | appends per commit | backends waiting "
            "for a lock | in a transaction, waiting for their client |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for (layout, n), figures in writers.items():
            cells = [_figure(summary([f[key] for f in figures]), unit) for key, unit in (
                ("rate", ""), ("host_cpu", "%"), ("writers_cpu", "%"), ("per_commit", ""))]
            cells += [harness.figure(summary([f[key] for f in figures]), "", ((1, ".1f"), (0, ".2f")))
                      for key in ("lock_waiters", "client_waits")]
            lines.append(f"| {layout} | {n} | " + " | ".join(cells) + " |")
        lines += ["", "Every acknowledged append was counted back from the store after each round.", ""]
    compiles = info.get("compiles", {})
    if compiles:
        lines += [
            f"(3) Compiles of everything at {info.get('foreign_size', 0):,} messages on the shared slot, ms (median, "
            "min–max): " + "; ".join(f"{name}: {_figure(summary([v * 1e3 for v in values]), '')}"
                                      for name, values in compiles.items())
            + f". Each of the {info.get('foreign_checked', 0)} compiles after B's append ended with B's message "
            "(checked).",
            "",
        ]
    builds, firsts = info.get("build_s", {}), info.get("first_compile_s", {})
    if builds:
        lines += ["Building the histories (not figures), s: "
                  + "; ".join(f"{key}: {seconds:.1f}" for key, seconds in builds.items())
                  + ". ctxrt with durability \"os\" (own slot: 20 concurrent adders; shared slot: 500), "
                  "PostgresSaver as one checkpoint holding every message.", ""]
    if firsts:
        lines += ["The first compile after reopening (one sample each, not a figure), s: "
                  + "; ".join(f"{key}: {seconds:.3f}" for key, seconds in firsts.items()) + ".", ""]
    lines.append(
        "Notes: the PostgreSQL engine commits a batch on a commit thread of its own (an idle loop blocks for it, at most 2 ms) in one transaction: "
        "take the store's catalog lock shared; per slot, its lock, its head and sequences drawn after the lock "
        "(one round trip); then the items, the heads and the commit (one round trip); and a slot cache "
        "on a store other processes write asks the server for the head before each read. PostgresSaver stores "
        "the whole `messages` channel in every checkpoint (one blob), so each append rewrites the history. "
        "Durable figures on a shared virtual disk vary between rounds: read the ranges.")
    return "\n".join(lines) + "\n"


main = harness.entry("postgres", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="1,000 messages only, fewer rounds, shorter writer windows")


if __name__ == "__main__":
    raise SystemExit(main())
