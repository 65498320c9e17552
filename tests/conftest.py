"""Shared fixtures. Every fixture is function-scoped (pytest-trio requires it for trio fixtures)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ctxrt.runtime import Runtime, open_runtime

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
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
async def runtime(store_path: Path) -> AsyncIterator[Runtime]:
    async with open_runtime(store_path) as rt:
        yield rt
