"""A store damaged while a read-only runtime serves it (``ctxrt serve``, ``ctxrt inspect``, a host's
reader): what LMDB reports of a page damaged after the open is ``StoreCorruptError`` naming the
data file, never LMDB's own error (K7).

Each damage is to the main table, where LMDB looks each table up at a read transaction's first
use of it, so every read meets it the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt.testing import files
from support import clear_items_table_flags, damage, point_main_root_past_the_pages, rename_items_table

GUARD_S = 30


async def build(store: Path) -> None:
    async with ctxrt.open_runtime(store, durability="os") as rt:
        manager = await rt.open("a")
        for i in range(20):
            await manager.add_message("user", f"message {i}")


@pytest.mark.parametrize("change", [rename_items_table, clear_items_table_flags, point_main_root_past_the_pages])
async def test_a_store_damaged_while_served_read_only_is_store_corrupt_naming_the_file(
    tmp_path: Path, change: Callable[[bytearray, files.Meta], None]
) -> None:
    """K7: a read-only runtime whose data file is damaged after its open answers each read with
    StoreCorruptError naming the file, not LMDB's BadDbiError, IncompatibleError or BadTxnError."""
    store = tmp_path / "store"
    with trio.fail_after(GUARD_S):
        await build(store)
        async with ctxrt.open_runtime(store, readonly=True) as rt:
            damage(store, change)
            engine = rt.engine
            reads: list[Callable[[], Awaitable[Any]]] = [rt.list_branches, rt.list_namespaces, lambda: rt.open("a")]
            for read in reads:
                with pytest.raises(ctxrt.StoreCorruptError) as caught:
                    await read()
                assert caught.value.path == str(files.data_path(store))
            for sync_read in (engine.list_states, lambda: engine.read_log("messages", 1)):
                with pytest.raises(ctxrt.StoreCorruptError) as caught:
                    sync_read()
                assert caught.value.path == str(files.data_path(store))
