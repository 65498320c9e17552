"""A healthy but slow server must never be cut (K16): another session holds the store's catalog
lock exclusive (as a writer does, its backend lock first) for HOLD seconds, READ_CUT_S and
BATCH_CUT_S at their defaults (35 s). Meanwhile the host appends (its batch waits for the lock),
compiles, and reads the horizon (a fork's first step: last_sequence waits for the writer).

python attack/slow_lock.py [HOLD ...]   (default: 20 32)
Expected: with HOLD 20 every call succeeds after ~20 s and nothing is cut; with HOLD 32 the
server's own 30 s lock_timeout answers (StoreUnavailableError naming the lock wait), never the
cut (35 s).
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import psycopg
import trio

import ctxrt
from ctxrt.testing import temporary_cluster

CUTS: list[str] = []


class Catch(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "cutting" in record.getMessage():
            CUTS.append(record.getMessage())


def hold_catalog(url: str, seconds: float, held: threading.Event) -> None:
    with psycopg.connect(url) as conn:
        from ctxrt.store.postgres import _lock_key  # the store's key, as its writers compute it
        key = _lock_key(conn, "catalog")
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s::text || '/backend/' || pg_backend_pid(), 0))",
                     (str(key),))
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        held.set()
        time.sleep(seconds)
        conn.rollback()


async def timed(what: str, call: object) -> str:
    began = time.monotonic()
    try:
        await call()  # type: ignore[operator]
        return f"{what}: ok after {time.monotonic() - began:.1f} s"
    except ctxrt.StoreUnavailableError as exc:
        return f"{what}: StoreUnavailableError after {time.monotonic() - began:.1f} s: {exc.reason[:150]}"


async def attack(url: str, hold: float) -> list[str]:
    async with ctxrt.open_runtime(url, durability="sync") as rt:
        ann = await rt.open("ann", isolate=True)
        bob = await rt.open("bob", isolate=True)
        await ann.add_message("user", "warm")
        await bob.add_message("user", "warm")
        held = threading.Event()
        holder = threading.Thread(target=hold_catalog, args=(url, hold, held))
        holder.start()
        await trio.to_thread.run_sync(held.wait)
        found: list[str] = []

        async def run(what: str, call: object) -> None:
            found.append(await timed(what, call))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "append", lambda: ann.add_message("user", "during the hold"))
            nursery.start_soon(run, "compile", lambda: bob.compile(ctxrt.Budget(max_tokens=50_000)))
            nursery.start_soon(run, "fork", bob.fork)
        await trio.to_thread.run_sync(holder.join)
        return found


def main() -> None:
    logging.getLogger().addHandler(Catch())
    holds = [float(a) for a in sys.argv[1:]] or [20.0, 32.0]
    with temporary_cluster() as cluster:
        for n, hold in enumerate(holds):
            CUTS.clear()
            url = cluster.create_database(f"slow{n}")
            found = trio.run(attack, url, hold)
            print(f"hold {hold:g} s: {found}; cuts logged: {CUTS or 'none'}", flush=True)


if __name__ == "__main__":
    main()
