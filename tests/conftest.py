"""Shared fixtures. Every trio fixture is function-scoped (pytest-trio requires it); the one
session-scoped fixture, ``pg_cluster``, is sync."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import trio.testing
from hypothesis import HealthCheck, settings

from ctxrt.testing import Cluster, StoreHandle, close_store, open_store, temporary_cluster
from ctxrt import Runtime, open_runtime

SOAK_ENV = "CTXRT_SOAK"

# `make test` is deterministic: the same examples on every run and every machine, no time limits
# (a fresh clone builds Hypothesis' Unicode tables on first use, and CI shares a busy machine).
# `make soak` explores with fresh random examples.
settings.register_profile(
    "ctxrt", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", parent=settings.get_profile("ctxrt"), derandomize=False)
settings.load_profile("explore" if os.environ.get(SOAK_ENV) == "1" else "ctxrt")


def soak_enabled() -> bool:
    """True under ``make soak`` (``CTXRT_SOAK=1``): soak tests run their long form."""
    return os.environ.get(SOAK_ENV) == "1"


@pytest.fixture
def soak_scale() -> Callable[[int, int], int]:
    """``soak_scale(bounded, long)``: ``long`` under ``CTXRT_SOAK=1``, else ``bounded``."""

    def scale(bounded: int, long: int) -> int:
        return long if soak_enabled() else bounded

    return scale


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """The test's trio clock (pytest-trio runs a test on a ``Clock`` fixture): it runs at wall
    speed, so ``trio.fail_after`` guards still fire, and ``clock.jump(s)`` lapses a timeout or a
    backoff at once, with no sleep."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
async def runtime(store_path: Path) -> AsyncIterator[Runtime]:
    async with open_runtime(store_path) as rt:
        yield rt


@pytest.fixture
def handle(store_path: Path) -> Iterator[StoreHandle]:
    """The store opened with no runtime around it: for tests that drive a machine synchronously."""
    opened = open_store(store_path, durability="os")
    try:
        yield opened
    finally:
        close_store(opened)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One throwaway PostgreSQL cluster for the whole session (socket only, no TCP), stopped and
    removed at the end. No server binaries is an error, never a skip: ``make`` installs them."""
    with temporary_cluster() as cluster:
        yield cluster


_pg_databases = itertools.count(1)


@pytest.fixture
def pg_url(pg_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """The libpq URL of a fresh, empty database of ``pg_cluster`` for this test alone, dropped after
    it (closing any connection it left). Dropped at once, a database's files are mostly still in the
    page cache and cheap to delete; kept to the session's end, the cluster's ~40,000 files had been
    written out, and deleting them held up the last test's teardown 18-66 s on a busy host."""
    import psycopg
    from psycopg import sql

    test = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())
    name = f"t{next(_pg_databases)}_{test}"[:63]
    yield pg_cluster.create_database(name)
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
