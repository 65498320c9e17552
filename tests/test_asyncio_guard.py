"""ctxrt awaited from asyncio: a clear error naming trio and the bridges (issue 14 item 8).

Determinism: each test runs a real ``asyncio.run`` (these are plain sync tests, outside
pytest-trio's loop) against real LMDB in a temp dir; nothing waits on the clock.
"""

import asyncio
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt import NotTrioError


def test_open_runtime_under_asyncio_names_trio_and_how_to_bridge_and_opens_nothing(tmp_path: Path) -> None:
    """open_runtime awaited under asyncio raises NotTrioError (a RuntimeError) before it creates the store."""
    store = tmp_path / "store"

    async def main() -> None:
        async with ctxrt.open_runtime(store):
            pass

    with pytest.raises(NotTrioError) as caught:
        asyncio.run(main())
    message = str(caught.value)
    assert message.startswith("ctxrt.open_runtime was awaited under asyncio, but ctxrt runs on trio only.")
    assert "trio.run(main)" in message and "asyncio.to_thread(trio.run, main)" in message
    assert "trio-asyncio" in message
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ctxrt.CtxrtError)
    assert not store.exists()


def test_the_thread_bridge_the_error_suggests_works_from_asyncio(tmp_path: Path) -> None:
    """asyncio code that runs ctxrt's trio code with asyncio.to_thread(trio.run, ...) stores and reads back."""

    async def trio_main() -> list[str]:
        async with ctxrt.open_runtime(tmp_path / "store") as runtime:
            manager = await runtime.open("agents/ann")
            await manager.add_message("user", "hello from asyncio's thread")
            return [block.text for message in await manager.get_all_messages() for block in message.content]

    async def asyncio_main() -> list[str]:
        return await asyncio.to_thread(trio.run, trio_main)

    assert asyncio.run(asyncio_main()) == ["hello from asyncio's thread"]
