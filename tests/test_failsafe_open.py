"""Read-only runtimes beside writers: a growing map, a writer's first open, open order (K4, K5).

Determinism rules: real LMDB stores under ``tmp_path``, the real clock, a ``trio.fail_after``
guard. Writers in other processes are ``sys.executable`` children run to completion between
the test's steps, or forked children of ``failsafe_child.py``'s fork server (the race test
reads while such a child creates a store; the assertion is about which errors may appear,
whatever the interleaving). Rounds scale with ``soak_scale``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from ctxrt.errors import ReadOnlyStoreError, StoreLockedError
from ctxrt import Runtime, open_runtime
from ctxrt.testing import AppendItem, RegisterState, close_store, files, open_environments, open_store
from test_failsafe_files import fork_server

WRITER_CHILD = """
import sys, trio
from ctxrt import open_runtime
from ctxrt.testing import AppendItem

async def main(path, count, size):
    async with open_runtime(path) as rt:
        for i in range(count):
            await rt.store.ask(AppendItem(state="log", branch="main", data=bytes([i % 256]) * size))

trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
"""


def items(rt: Runtime, state: str = "log") -> list[bytes]:
    engine = rt.engine
    with engine.reader() as txn:
        return [bytes(item.data) for item in engine.log_items(txn, state, engine.branch("main"))]


async def write_in_another_process(store: Path, count: int, size: int) -> None:
    await trio.run_process([sys.executable, "-c", WRITER_CHILD, str(store), str(count), str(size)],
                           capture_stderr=True)


async def seed(store: Path) -> None:
    async with open_runtime(store) as rt:
        await rt.store.ask(RegisterState(name="log", kind="log"))
        await rt.store.ask(AppendItem(state="log", branch="main", data=b"first"))


async def test_a_reader_with_a_small_map_keeps_reading_while_a_writer_grows_the_store(tmp_path: Path) -> None:
    """A read-only runtime opened with a small map_size adopts the map a writer in another process grew
    past it, and reads on, never failing with MDB_MAP_RESIZED (K4)."""
    store = tmp_path / "store"
    with trio.fail_after(60):
        await seed(store)
        async with open_runtime(store, readonly=True, map_size=1 << 16) as reader:
            before = reader.engine.env.info()["map_size"]
            assert items(reader) == [b"first"]
            await write_in_another_process(store, 40, 100_000)  # 4 MB: far past the reader's map
            assert (store / files.DATA_NAME).stat().st_size > before
            for _ in range(3):  # every read works, not just the first after the resize
                assert items(reader) == [b"first"] + [bytes([i]) * 100_000 for i in range(40)]
            assert len(await reader.list_branches()) == 1
            assert reader.engine.env.info()["map_size"] > before


@pytest.mark.soak
async def test_read_only_opens_racing_a_writers_first_open_never_see_a_half_made_store(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """A read-only open while another process creates the store finds nothing yet or the whole store,
    never StoreFormatError or StoreCorruptError (K4, K5)."""
    rounds = soak_scale(30, 400)
    raced = 0
    with trio.fail_after(60 + rounds):
        async with fork_server() as children:
            for round_ in range(rounds):
                store = tmp_path / f"store-{round_}"
                answer = await children.ask(f"create {store}")
                assert answer.startswith("created "), answer
                while True:
                    unfinished = not files.has_marker(store)
                    try:
                        handle = open_store(store, readonly=True)
                    except FileNotFoundError:
                        continue  # nothing there yet
                    raced += unfinished and (store / files.OWNER_LOCK_NAME).exists()
                    break
                try:
                    # The whole store or nothing: its first transaction made the tables, the format and main.
                    assert [row.name for row in handle.engine.list_branches()] == ["main"], f"round {round_}"
                finally:
                    close_store(handle)
                assert await children.ask(f"reap {answer.split()[1]}") == "reaped 0"
    assert raced > 0, "no read-only open ever overlapped a writer's first open"
    assert open_environments() == []


async def test_a_read_only_runtime_closed_beside_a_writer_in_this_process_leaves_the_writer_committing(
    tmp_path: Path,
) -> None:
    """A read-only runtime opened and closed while a writer in this process serves the same store
    leaves the writer's commits going (K4): closing a store stops the writer thread only for the
    writer's own close (a reader's close once stopped it, and the writer's next commit hung)."""
    store = tmp_path / "store"
    with trio.fail_after(60):
        await seed(store)
        async with open_runtime(store) as writer:
            for round_ in range(3):
                async with open_runtime(store, readonly=True) as reader:
                    assert items(reader)[0] == b"first"
                await writer.store.ask(AppendItem(state="log", branch="main", data=bytes([round_])))
            assert items(writer) == [b"first", b"\x00", b"\x01", b"\x02"]
    assert open_environments() == []


async def test_a_read_only_runtime_opened_first_lets_a_writer_in_this_process_open(tmp_path: Path) -> None:
    """Open order in one process doesn't matter: a writer opens beside a read-only runtime opened
    before it, the reader sees its commits, and reads on after it closes (K4)."""
    store = tmp_path / "store"
    with trio.fail_after(60):
        await seed(store)
        async with open_runtime(store, readonly=True) as reader:
            async with open_runtime(store) as writer:
                await writer.store.ask(AppendItem(state="log", branch="main", data=b"second"))
                assert items(reader) == [b"first", b"second"]
                assert items(writer) == [b"first", b"second"]
                with pytest.raises(StoreLockedError):
                    async with open_runtime(store):
                        pytest.fail("a second writer opened")
            with pytest.raises(ReadOnlyStoreError):
                reader.store  # noqa: B018 - the reader is still read-only
            # The writer is gone: another process may write now, and this reader sees it.
            await write_in_another_process(store, 2, 10)
            assert items(reader) == [b"first", b"second", bytes([0]) * 10, bytes([1]) * 10]
            # And a writer in this process may come back.
            async with open_runtime(store, durability="os") as writer:
                await writer.store.ask(AppendItem(state="log", branch="main", data=b"last"))
            assert items(reader)[-1] == b"last"
    assert open_environments() == []


async def test_a_writer_refused_by_another_process_leaves_this_processs_reader_reading(tmp_path: Path) -> None:
    """A read-only runtime opened first keeps working when a writer in this process is refused
    because another process holds the store (K4)."""
    store = tmp_path / "store"
    holder = """
import sys, trio
from ctxrt import open_runtime
async def main(path):
    async with open_runtime(path):
        print("holding", flush=True)
        sys.stdin.readline()
trio.run(main, sys.argv[1])
"""
    with trio.fail_after(60):
        await seed(store)
        async with open_runtime(store, readonly=True) as reader:
            async with trio.open_nursery() as nursery:
                process = await nursery.start(lambda task_status: trio.run_process(
                    [sys.executable, "-c", holder, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    task_status=task_status))
                assert (await process.stdout.receive_some()).startswith(b"holding")
                with pytest.raises(StoreLockedError):
                    async with open_runtime(store):
                        pytest.fail("a second writer opened")
                assert items(reader) == [b"first"]
                await process.stdin.send_all(b"done\n")
            assert items(reader) == [b"first"]


async def test_a_second_writer_is_refused_even_after_the_owner_lock_file_is_deleted(tmp_path: Path) -> None:
    """K3, K4 (from a host-style attack): an operator deletes owner.lock while its writer runs (a
    "stale lock" habit); a writer in another process and one in this process are still refused
    with StoreLockedError, and every write the first writer acknowledged is stored. (Before, the
    other process wrote beside it and lost 49 of its 50 later acknowledged writes.)"""
    store = tmp_path / "store"
    second = """
import sys, trio, ctxrt
async def main(path):
    try:
        async with ctxrt.open_runtime(path) as rt:
            await (await rt.open("b")).add_message("user", "second writer")
            print("opened", flush=True)
    except ctxrt.StoreLockedError:
        print("refused", flush=True)
trio.run(main, sys.argv[1])
"""
    with trio.fail_after(60):
        async with open_runtime(store) as rt:
            first = await rt.open("a")
            written = [await first.add_message("user", f"first {i}") for i in range(5)]
            (store / "owner.lock").unlink()
            other = await trio.run_process([sys.executable, "-c", second, str(store)], capture_stdout=True)
            assert other.stdout.decode().strip() == "refused"
            with pytest.raises(StoreLockedError, match="data.mdb"):
                async with open_runtime(store):
                    pytest.fail("a second writer opened in this process")
            written += [await first.add_message("user", f"first after {i}") for i in range(5)]
        async with open_runtime(store, readonly=True) as reader:
            stored = await (await reader.open("a")).get_all_messages()
            assert [m.id for m in stored] == written
    assert open_environments() == []


async def test_a_writer_is_seen_by_its_data_lock_when_its_owner_lock_file_is_gone(tmp_path: Path) -> None:
    """K4, K7 (from a host-style attack): with owner.lock deleted under a running writer, the
    checks that must not walk pages a writer is moving (check_pages, verify) still see the writer
    by its lock on data.mdb; before, verify and inspect called the sound store damaged 12 of 12
    times."""
    from ctxrt.testing import files

    store = tmp_path / "store"
    with trio.fail_after(60):
        async with open_runtime(store) as rt:
            await (await rt.open("a")).add_message("user", "written")
            (store / "owner.lock").unlink()
            assert files.writer_holds_lock(store) is True
        assert files.writer_holds_lock(store) is False
