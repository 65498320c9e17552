"""Shared fixtures. Every fixture is function-scoped (pytest-trio requires it for trio fixtures)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ctxrt.runtime import Runtime, open_runtime

SOAK_ENV = "CTXRT_SOAK"


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
