"""The PostgreSQL horizon attacked as a host would meet it (issue 39; K11, K13, K16): a writer stalled
inside its transaction behind a transaction-mode pooler."""

from __future__ import annotations

import threading
import time

import pytest
import trio

import ctxrt

from ctxrt.errors import StoreUnavailableError
from ctxrt.store.postgres import PostgresEngine
from ctxrt.testing import AppendItem, Cluster, RegisterState, execute, start_pooler

from wire_counter import WireCounter

BOUND_MS = 1000


def test_the_horizon_gives_up_at_its_bound_behind_a_pooler_whatever_server_connection_it_gets(
    pg_cluster: Cluster, pg_url: str,
) -> None:
    """K16, K13: with a writer stalled inside its transaction (its locks held), ``last_sequence``
    through a transaction-mode pooler waits at most the lock bound, then raises
    ``StoreUnavailableError``, though its wait runs on a server connection the reader's session
    ``SET`` never reached (a pool of 2: the stalled writer holds the one the reader set up). It
    waited for as long as the writer stayed stalled."""
    database = pg_url.split("?")[0].rsplit("/", 1)[1]
    with start_pooler(pg_cluster, pool_size=2) as pooler:
        url = pooler.url(database)
        writer = PostgresEngine(url, idle_in_transaction_ms=60_000)
        reader = PostgresEngine(url, create=False, statement_timeout_ms=BOUND_MS)
        in_flight, go = threading.Event(), threading.Event()
        try:
            writer.apply([RegisterState(name="log", kind="log")], execute)

            def stalled(batch: object, command: object) -> object:
                result = execute(batch, command)
                in_flight.set()  # the slot's lock held and its sequence drawn, the rows not sent
                go.wait(30)
                return result

            batch = threading.Thread(target=lambda: writer.apply([AppendItem(state="log", branch=1, data=b"x")], stalled))
            batch.start()
            in_flight.wait()
            outcome: list[object] = []

            def horizon() -> None:
                began = time.monotonic()
                try:
                    outcome.append(reader.last_sequence)
                except StoreUnavailableError as exc:
                    outcome.append(exc)
                outcome.append(time.monotonic() - began)

            waiting = threading.Thread(target=horizon)
            waiting.start()
            waiting.join(timeout=10 * BOUND_MS / 1000)
            go.set()
            batch.join()
            waiting.join()
            assert isinstance(outcome[0], StoreUnavailableError), f"the horizon answered {outcome[0]} after {outcome[1]:.1f} s"
            assert "didn't end within" in outcome[0].reason, outcome[0].reason
        finally:
            go.set()
            writer.close()
            reader.close()


def test_a_durable_append_is_two_round_trips_on_the_wire(pg_url: str) -> None:
    """K16: a durable add_message's batch sends two Syncs on the writing connection (each a wait for
    the server): the locks, head and sequences, then the rows and the commit. Counted on the wire,
    by a proxy in front of the server: a transaction block opened in a pipeline synced after the
    BEGIN, again after the rows, after the COMMIT and at the pipeline's end (5)."""

    async def main(wire: WireCounter) -> None:
        async with ctxrt.open_runtime(wire.url, durability="sync") as rt:
            manager = await rt.open("ann", isolate=True)
            await manager.add_message("user", "warm-up")  # the tables read, the slot's state registered
            [before] = wire.syncs_of(b"INSERT INTO ctxrt_items")
            for n in range(5):
                await manager.add_message("user", f"line {n}")
            [after] = wire.syncs_of(b"INSERT INTO ctxrt_items")
            assert await manager.message_count() == 6
            assert after - before == 5 * 2, f"{(after - before) / 5} Syncs per append"

    with WireCounter(pg_url) as wire:
        trio.run(main, wire)
