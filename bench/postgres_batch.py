"""A lone append's batch, statement by statement, against the raw append-shaped transaction
(``bench/postgres.py``'s ``RawPostgres``), on one connection of a throwaway cluster, interleaved in a
shuffled order each round (so each figure is taken in the same seconds): what the batch's shape
costs apart from the engine's Python around it.

    python -m bench.postgres_batch [--rounds N] [--no-flush]

Shapes (the engine's statements, on tables of its schema; prepared, as a direct writer's are):

- raw: BEGIN, SELECT ... FOR UPDATE, 2 INSERTs, UPDATE, COMMIT: 6 round trips;
- eight statements (the batch at b43611c): BEGIN, the locks, the catalog counter, the slot's lock
  and draw (planned again at every call), its head | sync | the item, the head, COMMIT: 2 round trips;
- five statements (the batch now): BEGIN, the locks with the slot's and its draw, the counter with
  the head | sync | the item and head in one statement, COMMIT: 2 round trips;
- floors: the whole append as one PL/pgSQL call (its head arithmetic a stand-in: a floor, not a
  design), in BEGIN/COMMIT and as its own transaction; the rows alone (BEGIN, rows, COMMIT in one
  round trip); an empty round trip.

``--no-flush`` runs the cluster with ``synchronous_commit=off``: the commit's WAL flush (the same in
every shape, and the noisiest part on a shared disk) left out.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import time
from typing import Any

import psycopg

from ctxrt.pgcluster import temporary_cluster
from ctxrt.store import postgres as pg

CURRENT = pg.CURRENT
_HEAD = struct.Struct(">qqqqI")  # a LogHead without removed ranges
CATALOG, SLOT = 1234567, 7654321
DATA = ("x" * 200).encode()
TABLES = """
CREATE TABLE ctxrt_meta (key text PRIMARY KEY, value bigint NOT NULL);
INSERT INTO ctxrt_meta VALUES ('catalog', 5);
CREATE TABLE ctxrt_items (state integer NOT NULL, branch integer NOT NULL, ordinal bigint NOT NULL, version bigint NOT NULL,
    sequence bigint NOT NULL, data bytea NOT NULL, PRIMARY KEY (state, branch, ordinal, version));
CREATE UNIQUE INDEX ctxrt_items_appended ON ctxrt_items (state, sequence) WHERE version = sequence;
CREATE TABLE ctxrt_heads (state integer NOT NULL, branch integer NOT NULL, version bigint NOT NULL, revision bigint NOT NULL,
    head bytea NOT NULL, PRIMARY KEY (state, branch, version));
CREATE SEQUENCE ctxrt_sequence;
CREATE TABLE raw_items (id bigint PRIMARY KEY, data bytea NOT NULL);
CREATE TABLE raw_heads (id integer PRIMARY KEY, head bytea NOT NULL);
CREATE TABLE raw_meta (key text PRIMARY KEY, value bigint NOT NULL);
INSERT INTO raw_meta VALUES ('sequence', 0);
CREATE FUNCTION one_append(cat bigint, slot bigint, st integer, br integer, d bytea) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE s bigint; h bytea;
BEGIN
  PERFORM set_config('statement_timeout', '30000', true), set_config('lock_timeout', '30000', true),
          set_config('idle_in_transaction_session_timeout', '10000', true);
  PERFORM pg_advisory_xact_lock(hashtextextended(cat::text || '/backend/' || pg_backend_pid(), 0));
  PERFORM pg_advisory_xact_lock_shared(cat);
  PERFORM value FROM ctxrt_meta WHERE key = 'catalog';
  PERFORM pg_advisory_xact_lock(slot);
  s := nextval('ctxrt_sequence');
  SELECT head INTO h FROM ctxrt_heads WHERE state = st AND branch = br AND version = 9223372036854775807;
  INSERT INTO ctxrt_items VALUES (st, br, s, s, s, d);
  INSERT INTO ctxrt_heads VALUES (st, br, 9223372036854775807, s, coalesce(h, decode(repeat('00', 36), 'hex')))
    ON CONFLICT (state, branch, version) DO UPDATE SET revision = EXCLUDED.revision, head = EXCLUDED.head;
  RETURN s;
END $$;
"""
BOUNDS = ("WITH bounds AS MATERIALIZED (SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true),"
          " set_config('idle_in_transaction_session_timeout', %s, true)),"
          f" backend AS MATERIALIZED (SELECT {pg._BACKEND_LOCK} FROM bounds)")
BOUND_PARAMS = ("30000", "30000", "10000", str(CATALOG), CATALOG)
HEAD = "SELECT head FROM ctxrt_heads WHERE state = %s AND branch = %s AND version = %s"
# The slot's lock and draw as the batch of eight statements sent it (b43611c): a join of the lock's
# row and generate_series, planned again at every call.
LOCK_AND_DRAW_BEFORE = ("WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s))"
                        " SELECT nextval('ctxrt_sequence') FROM locked, generate_series(1, %s)")


def _rows(state: int, sequence: int, head: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    length, ordinal = _HEAD.unpack(bytes(head))[:2] if head else (0, 0)
    return ((state, 1, ordinal, sequence, sequence, DATA),
            (state, 1, CURRENT, sequence, _HEAD.pack(length + 1, ordinal + 1, sequence, 0, 0)))


def shapes(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    def raw() -> None:
        with conn.transaction():
            row = conn.execute("SELECT value FROM raw_meta WHERE key = 'sequence' FOR UPDATE").fetchone()
            sequence = (row[0] if row else 0) + 1
            conn.execute("INSERT INTO raw_items (id, data) VALUES (%s, %s)", (sequence, DATA))
            conn.execute("INSERT INTO raw_heads (id, head) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET head = "
                         "EXCLUDED.head", (DATA[:40],))
            conn.execute("UPDATE raw_meta SET value = %s WHERE key = 'sequence'", (sequence,))

    def eight() -> None:
        with conn.pipeline() as pipeline:
            cursor = conn.cursor()
            cursor.execute("BEGIN")
            cursor.execute(BOUNDS + " SELECT pg_advisory_xact_lock_shared(%s) FROM backend", BOUND_PARAMS)
            catalog = conn.cursor().execute(pg._CATALOG)
            drawn = conn.cursor().execute(LOCK_AND_DRAW_BEFORE, (SLOT, 1))
            cursor.execute(HEAD, (1, 1, CURRENT))
            pipeline.sync()
            head = cursor.fetchall()
            catalog.fetchall()
            [(sequence,)] = drawn.fetchall()
            item, current = _rows(1, sequence, head[0][0] if head else None)
            cursor.executemany(pg._INSERT_ITEM, [item])
            cursor.executemany(pg._UPSERT_HEAD, [current])
            cursor.execute("COMMIT")

    def five() -> None:
        with conn.pipeline() as pipeline:
            cursor = conn.cursor()
            cursor.execute("BEGIN")
            drawn = conn.cursor().execute(BOUNDS + pg._LONE_SLOT, (*BOUND_PARAMS, SLOT, 1))
            cursor.execute(pg._CATALOG_AND_HEAD, (2, 1, CURRENT))
            pipeline.sync()
            [(_, head)] = cursor.fetchall()
            [(sequences,)] = drawn.fetchall()
            item, current = _rows(2, sequences[0], head)
            cursor.execute(pg._APPEND_ROWS, (*item, *current))
            cursor.execute("COMMIT")

    def function_in_transaction() -> None:
        with conn.transaction():
            conn.execute("SELECT one_append(%s, %s, %s, %s, %s)", (CATALOG, SLOT, 3, 1, DATA))

    def function_alone() -> None:
        conn.execute("SELECT one_append(%s, %s, %s, %s, %s)", (CATALOG, SLOT, 4, 1, DATA))

    fresh = iter(range(10**12, 10**13))

    def rows_alone() -> None:
        sequence = next(fresh)
        item, current = _rows(5, sequence, None)
        with conn.pipeline():
            cursor = conn.cursor()
            cursor.execute("BEGIN")
            cursor.execute(pg._APPEND_ROWS, (*item, *current))
            cursor.execute("COMMIT")

    def round_trip() -> None:
        conn.execute("SELECT 1")

    return {"raw append-shaped transaction (6 round trips)": raw, "batch, eight statements (before)": eight,
            "batch, five statements (now)": five, "floor: one PL/pgSQL call in BEGIN/COMMIT": function_in_transaction,
            "floor: one PL/pgSQL call, its own transaction": function_alone,
            "floor: the rows alone (BEGIN, rows, COMMIT: 1 round trip)": rows_alone, "an empty round trip": round_trip}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--no-flush", action="store_true", help="synchronous_commit=off")
    args = parser.parse_args(argv)
    with temporary_cluster(settings={"synchronous_commit": "off"} if args.no_flush else None) as cluster:
        conn = psycopg.connect(cluster.create_database("batch"), autocommit=True)
        conn.execute(TABLES)
        conn.prepare_threshold = 0
        kinds = shapes(conn)
        times: dict[str, list[float]] = {name: [] for name in kinds}
        load = os.getloadavg()[0]
        for n in range(20 + args.rounds):
            order = list(kinds.items())
            random.shuffle(order)
            for name, shape in order:
                started = time.perf_counter()
                shape()
                if n >= 20:
                    times[name].append(time.perf_counter() - started)
        conn.close()
    raw = statistics.median(times["raw append-shaped transaction (6 round trips)"])
    print(f"{args.rounds} rounds, {'synchronous_commit=off' if args.no_flush else 'durable commits'}, load average "
          f"{load:.2f} -> {os.getloadavg()[0]:.2f}")
    print("| shape | median, ms | / raw |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values) * 1e3:.3f} | {statistics.median(values) / raw:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
