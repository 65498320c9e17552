"""ctxrt's trio entry point awaited from asyncio: a clear error pointing at ctxrt.aio (issue 14
item 8, issue 23 item 4).

Determinism: each test runs a real ``asyncio.run`` (these are plain sync tests, outside
pytest-trio's loop) against real LMDB in a temp dir; nothing waits on the clock.
"""

import asyncio
from pathlib import Path

import pytest

import ctxrt
import ctxrt.aio
from ctxrt import NotTrioError


def test_open_runtime_under_asyncio_points_at_ctxrt_aio_and_opens_nothing(tmp_path: Path) -> None:
    """ctxrt.open_runtime awaited under asyncio raises NotTrioError (a RuntimeError) naming ctxrt.aio,
    before it creates the store (H1)."""
    store = tmp_path / "store"

    async def main() -> None:
        async with ctxrt.open_runtime(store):
            pass

    with pytest.raises(NotTrioError) as caught:
        asyncio.run(main())
    message = str(caught.value)
    assert message.startswith("ctxrt.open_runtime was awaited under asyncio, but ctxrt.open_runtime runs on trio.")
    assert "ctxrt.aio.open_runtime(path)" in message and "trio.run(main)" in message
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ctxrt.CtxrtError)
    assert not store.exists()


def test_the_front_the_error_points_at_works_from_asyncio(tmp_path: Path) -> None:
    """asyncio code that follows the error, ctxrt.aio.open_runtime, stores and reads back (H1)."""

    async def main() -> list[str]:
        async with ctxrt.aio.open_runtime(tmp_path / "store") as runtime:
            manager = await runtime.open("agents/ann")
            await manager.add_message("user", "hello from asyncio")
            return [block.text for message in await manager.get_all_messages() for block in message.content]

    assert asyncio.run(main()) == ["hello from asyncio"]
