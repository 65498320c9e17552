"""Opening, locking, format checks and branch calls of ``open_runtime`` over a real store.

Determinism rules: a real LMDB store under ``tmp_path``, the real clock and a
``trio.fail_after`` hang guard in every test. Cross-process tests start
``sys.executable -c <script>`` and talk to it over pipes, one line per step, so the
order of events between the processes is fixed by the test, never by timing.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import lmdb
import pytest
import trio

from ctxrt.errors import (
    BranchExistsError,
    BranchNotFoundError,
    MalformedContentError,
    ReadOnlyStoreError,
    RuntimeClosedError,
    StoreFormatError,
    StoreLockedError,
)
from ctxrt import Runtime, open_runtime
from ctxrt.testing import (
    AppendItem,
    EditItem,
    LOCK_NAME,
    RegisterState,
    RemoveItems,
    SetValue,
    keys,
    open_environments,
    seals,
    verify_store,
)
from support import LineReader, dump

# -- helpers ---------------------------------------------------------------------------------




def read_data(rt: Runtime, branch: str = "main") -> list[bytes]:
    engine = rt.engine
    with engine.reader() as txn:
        return [item.data for item in engine.log_items(txn, "log", engine.branch(branch))]


def append(data: bytes, branch: str = "main") -> AppendItem:
    return AppendItem(state="log", branch=branch, data=data)


async def seed(rt: Runtime) -> None:
    await rt.store.ask(RegisterState(name="log", kind="log"))
    await rt.store.ask(RegisterState(name="prefs", kind="value"))
    for data in (b"one", b"two", b"three"):
        await rt.store.ask(append(data))
    await rt.store.ask(SetValue(state="prefs", branch="main", value={"theme": "dark"}))
    await rt.create_branch("side")


def write_format(store_path: Path, raw: bytes) -> None:
    """Overwrite the store's format record with raw LMDB (the store must be closed)."""
    env = lmdb.open(str(store_path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            txn.put(keys.META_FORMAT, raw, db=env.open_db(keys.DB_META, txn=txn))
    finally:
        env.close()




# -- K4: one writer ------------------------------------------------------------------------------

LOCK_CHILD = """
import sys, trio
from ctxrt.errors import StoreLockedError
from ctxrt import open_runtime

async def main():
    try:
        async with open_runtime(sys.argv[1]):
            print("opened")
    except StoreLockedError as exc:
        print("locked", exc.path)

trio.run(main)
"""


async def test_a_second_writer_in_this_process_is_refused_naming_the_lock(store_path: Path) -> None:
    """A second writing runtime on the same store in this process raises StoreLockedError (K4)."""
    lock_path = str(store_path / LOCK_NAME)
    with trio.fail_after(10):
        async with open_runtime(store_path) as first:
            await seed(first)
            with pytest.raises(StoreLockedError) as refused:
                async with open_runtime(store_path):
                    pytest.fail("a second writer opened")
            assert refused.value.path == lock_path
            assert str(refused.value) == f"store is locked by another writing runtime: {lock_path}"
            # The refusal didn't disturb the writer that holds the store.
            await first.store.ask(append(b"four"))
            assert read_data(first) == [b"one", b"two", b"three", b"four"]
        # Once the first closes, a writer may open.
        async with open_runtime(store_path) as second:
            assert read_data(second) == [b"one", b"two", b"three", b"four"]


async def test_a_writer_in_another_process_is_refused(store_path: Path) -> None:
    """A writing runtime in another process is refused while this one holds the store, then allowed (K4)."""
    command = [sys.executable, "-c", LOCK_CHILD, str(store_path)]
    with trio.fail_after(30):
        async with open_runtime(store_path) as rt:
            await seed(rt)
            child = await trio.run_process(command, capture_stdout=True, capture_stderr=True)
            assert child.stdout.decode().split() == ["locked", str(store_path / LOCK_NAME)], child.stderr.decode()
        child = await trio.run_process(command, capture_stdout=True, capture_stderr=True)
    assert child.stdout.decode().split() == ["opened"], child.stderr.decode()


# -- K4: readers beside the writer -----------------------------------------------------------------


async def test_a_reader_in_this_process_sees_committed_data_and_refuses_writes(store_path: Path) -> None:
    """A read-only runtime opens beside the writer in this process, sees its commits and refuses writes (K4)."""
    with trio.fail_after(10):
        async with open_runtime(store_path) as writer:
            await seed(writer)
            async with open_runtime(store_path, readonly=True) as reader:
                assert reader.readonly
                assert read_data(reader) == [b"one", b"two", b"three"]
                await writer.store.ask(append(b"four"))
                await writer.create_branch("later")
                assert read_data(reader) == [b"one", b"two", b"three", b"four"]
                assert [info.name for info in await reader.list_branches()] == ["main", "side", "later"]

                with pytest.raises(ReadOnlyStoreError, match=r"opened read-only; it refuses every write$"):
                    await reader.store.ask(append(b"refused"))
                with pytest.raises(ReadOnlyStoreError):
                    await reader.create_branch("refused")
                with pytest.raises(ReadOnlyStoreError):
                    await reader.delete_branch("side")
                assert reader.statistics().commands == 0
            # Closing the reader leaves the shared environment open for the writer.
            await writer.store.ask(append(b"five"))
            assert read_data(writer)[-1] == b"five"
            assert [info.name for info in await writer.list_branches()] == ["main", "side", "later"]


READER_CHILD = """
import json, sys, trio
from ctxrt.errors import ReadOnlyStoreError
from ctxrt import open_runtime

def report(rt):
    engine = rt.engine
    with engine.reader() as txn:
        items = [item.data.decode() for item in engine.log_items(txn, "log", engine.branch("main"))]
    return {"items": items, "branches": [row.name for row in engine.list_branches()]}

async def main():
    async with open_runtime(sys.argv[1], readonly=True) as rt:
        print(json.dumps(report(rt)), flush=True)
        sys.stdin.readline()  # the writer commits more meanwhile
        print(json.dumps(report(rt)), flush=True)
        try:
            await rt.store.ask(None)
        except ReadOnlyStoreError:
            print("write refused", flush=True)

trio.run(main)
"""


async def test_a_reader_in_another_process_sees_committed_data_and_refuses_writes(store_path: Path) -> None:
    """A read-only runtime in another process opens beside the writer and sees each commit (K4)."""
    with trio.fail_after(30):
        async with open_runtime(store_path) as writer:
            await seed(writer)
            async with trio.open_nursery() as nursery:
                process: trio.Process = await nursery.start(
                    partial(trio.run_process, [sys.executable, "-c", READER_CHILD, str(store_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                )
                assert process.stdin is not None and process.stdout is not None
                lines = LineReader(process.stdout)
                first = json.loads(await lines.next_line())
                assert first == {"items": ["one", "two", "three"], "branches": ["main", "side"]}

                await writer.store.ask(append(b"four"))
                await writer.create_branch("later")
                await process.stdin.send_all(b"go on\n")
                second = json.loads(await lines.next_line())
                assert second == {"items": ["one", "two", "three", "four"], "branches": ["main", "side", "later"]}
                assert await lines.next_line() == "write refused"
            assert process.returncode == 0
            # The writer was never disturbed.
            await writer.store.ask(append(b"five"))


# -- K5: format --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "shown"), [
    (struct.pack(">I", 99), "99"), (seals.seal(keys.META_FORMAT, struct.pack(">I", 4)), "4"), (b"v2!!!", "b'v2!!!'"),
], ids=["format 99", "format 4 sealed", "garbled record"])
@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "reader"])
async def test_an_unknown_store_format_is_refused_naming_it(
    store_path: Path, raw: bytes, shown: str, readonly: bool
) -> None:
    """A store recording a format this version doesn't read is refused with StoreFormatError (K5)."""
    with trio.fail_after(10):
        async with open_runtime(store_path) as rt:
            await seed(rt)
        write_format(store_path, raw)
        message = rf"^{store_path}/? records store format {shown}; this ctxrt reads format 3 \(and a writer moves formats 1, 2 to it\)$"
        for _ in range(2):  # the refusal releases the lock and the environment: a retry is refused the same way
            with pytest.raises(StoreFormatError, match=message):
                async with open_runtime(store_path, readonly=readonly):
                    pytest.fail("an unknown format was opened")
        assert open_environments() == []
        # Nothing was rewritten: restoring the record makes the store readable again.
        write_format(store_path, seals.seal(keys.META_FORMAT, struct.pack(">I", 3)))
        async with open_runtime(store_path, readonly=readonly) as rt:
            assert read_data(rt) == [b"one", b"two", b"three"]


def read_format(store_path: Path) -> bytes:
    env = lmdb.open(str(store_path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return bytes(txn.get(keys.META_FORMAT, db=env.open_db(keys.DB_META, txn=txn, create=False)))
    finally:
        env.close()


def raw_tables(store_path: Path) -> dict[bytes, list[tuple[bytes, bytes]]]:
    env = lmdb.open(str(store_path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=env.open_db(name, txn=txn, create=False))]
                    for name in keys.ALL_DBS}
    finally:
        env.close()


def to_format(store_path: Path, version: int) -> None:
    """Make a format-3 store what format ``version`` (1 or 2) was: every record without its seal
    (format 3 added the seals and nothing else; format 1's heads lacked format 2's flag byte,
    which no move reads)."""
    env = lmdb.open(str(store_path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            for name in keys.ALL_DBS:
                table = env.open_db(name, txn=txn, create=False)
                for key, value in list(txn.cursor(db=table)):
                    assert seals.intact(key, value)
                    txn.put(key, value[: -seals.SIZE], db=table)
            txn.put(keys.META_FORMAT, struct.pack(">I", version), db=env.open_db(keys.DB_META, txn=txn))
    finally:
        env.close()


@pytest.mark.parametrize("old", [1, 2])
async def test_a_format_1_or_2_store_is_refused_read_only_and_its_first_writer_seals_it_into_format_3(
    store_path: Path, old: int
) -> None:
    """K5: format 3 ends every record in a checksum of its key and value. A read-only open refuses
    an older store, saying how to move it, and leaves it alone (verify doesn't check it either); a
    writer's open seals every record, in one transaction, exactly as this version writes them."""
    with trio.fail_after(20):
        async with open_runtime(store_path) as rt:
            await seed(rt)
        assert read_format(store_path) == seals.seal(keys.META_FORMAT, struct.pack(">I", 3))
        sealed = raw_tables(store_path)
        to_format(store_path, old)
        unsealed = raw_tables(store_path)
        refusal = (rf"records store format {old}, whose records carry no checksums; this ctxrt reads format 3\. "
                   rf"Open it once with a writing runtime of this version, which moves it to format 3")
        with pytest.raises(StoreFormatError, match=refusal):
            async with open_runtime(store_path, readonly=True):
                pytest.fail("a store without seals was read")
        report = verify_store(store_path)
        assert report.status == "not checked" and re.search(refusal, report.notes[-1]), report.lines()
        assert raw_tables(store_path) == unsealed
        async with open_runtime(store_path) as rt:
            assert read_data(rt) == [b"one", b"two", b"three"]
            assert rt.engine.read_value("prefs", rt.engine.branch("main").id) == {"theme": "dark"}
        assert raw_tables(store_path) == sealed
        async with open_runtime(store_path, readonly=True) as rt:
            assert read_data(rt, "side") == [b"one", b"two", b"three"]
        assert verify_store(store_path).status == "sound"


MOVE_AND_DIE = """
import logging, os, signal, sys, trio
import ctxrt
from ctxrt.store import engine

class DieAfterABatch(logging.Handler):
    def emit(self, record):
        if "sealed" in record.getMessage():
            os.kill(os.getpid(), signal.SIGKILL)  # right after the first batch committed

engine.MOVE_BATCH = 3
logging.getLogger("ctxrt.store").addHandler(DieAfterABatch())
logging.getLogger("ctxrt.store").setLevel(logging.INFO)

async def main():
    async with ctxrt.open_runtime(sys.argv[1]):
        pass

trio.run(main)
"""


async def test_a_move_to_format_3_that_stops_half_way_is_refused_read_only_and_finished_by_the_next_writer(
    store_path: Path,
) -> None:
    """K5: a store moves to format 3 a batch of records per transaction. A writer killed after its
    first batch leaves a store every read-only open refuses (its records aren't all sealed) and an
    older ctxrt refuses by its format; the next writer's open seals the rest, exactly as this
    version writes them."""
    with trio.fail_after(20):
        async with open_runtime(store_path) as rt:
            await seed(rt)
        sealed = raw_tables(store_path)
        to_format(store_path, 2)
        result = await trio.run_process([sys.executable, "-c", MOVE_AND_DIE, str(store_path)], check=False)
        assert result.returncode == -9
        half = raw_tables(store_path)
        assert dict(half[keys.DB_META])[keys.META_FORMAT] == seals.seal(keys.META_FORMAT, struct.pack(">I", 3))
        assert keys.META_MOVING in dict(half[keys.DB_META])
        assert half != sealed
        with pytest.raises(StoreFormatError, match=r"is being moved to format 3 \(by a writer now, or by one that "
                                                   r"stopped\), its records not all sealed yet; this ctxrt reads "
                                                   r"format 3\. Open it once with a writing runtime"):
            async with open_runtime(store_path, readonly=True):
                pytest.fail("a half-sealed store was read")
        async with open_runtime(store_path) as rt:
            assert read_data(rt) == [b"one", b"two", b"three"]
        assert raw_tables(store_path) == sealed
        assert verify_store(store_path).status == "sound"


async def test_an_lmdb_store_that_is_not_ctxrt_is_refused_read_only(store_path: Path) -> None:
    """A read-only open of an LMDB environment without ctxrt's tables raises StoreFormatError (K5)."""
    env = lmdb.open(str(store_path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"someone", b"else's data")
    env.close()
    with trio.fail_after(10):
        with pytest.raises(StoreFormatError, match=r"is not a ctxrt store"):
            async with open_runtime(store_path, readonly=True):
                pytest.fail("a foreign store was opened")


async def test_opening_nothing_read_only_raises_file_not_found_and_creates_nothing(tmp_path: Path) -> None:
    """A read-only open of a path with no store raises FileNotFoundError and creates nothing."""
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    with trio.fail_after(10):
        for path in (missing, empty):
            with pytest.raises(FileNotFoundError, match=r"^no ctxrt store at .* \(no data.mdb\)$"):
                async with open_runtime(path, readonly=True):
                    pytest.fail("nothing was opened")
    assert not missing.exists()
    assert list(empty.iterdir()) == []


# -- branch API --------------------------------------------------------------------------------------

BRANCH_ERRORS: list[tuple[str, str, dict[str, Any], type[Exception], str]] = [
    ("create existing", "create", {"name": "side"}, BranchExistsError, r"^a branch named 'side' already exists$"),
    ("create main", "create", {"name": "main"}, BranchExistsError, r"^a branch named 'main' already exists$"),
    ("fork unknown", "create", {"name": "twig", "from_branch": "nowhere"}, BranchNotFoundError,
     r"^no branch named 'nowhere'$"),
    ("at_sequence negative", "create", {"name": "twig", "at_sequence": -1}, MalformedContentError,
     r"^at_sequence: must be an integer in \[0, 5\] \(the store's sequence\), not -1$"),
    ("at_sequence in the future", "create", {"name": "twig", "at_sequence": 6}, MalformedContentError,
     r"^at_sequence: must be an integer in \[0, 5\] \(the store's sequence\), not 6$"),
    ("at_sequence not an int", "create", {"name": "twig", "at_sequence": "3"}, TypeError,
     r"^at_sequence must be an integer, not str$"),
    ("at_sequence a bool", "create", {"name": "twig", "at_sequence": True}, TypeError,
     r"^at_sequence must be an integer, not bool$"),
    ("name with NUL", "create", {"name": "a\x00b"}, MalformedContentError, r"^name: branch name 'a\\x00b' holds NUL"),
    ("delete unknown", "delete", {"name": "nowhere"}, BranchNotFoundError, r"^no branch named 'nowhere'$"),
    ("delete main", "delete", {"name": "main"}, MalformedContentError, r"^name: the main branch can't be deleted$"),
]


@pytest.mark.parametrize(("call", "arguments", "error", "message"), [case[1:] for case in BRANCH_ERRORS],
                         ids=[case[0] for case in BRANCH_ERRORS])
async def test_branch_calls_refuse_bad_input_clearly_and_change_nothing(
    runtime: Runtime, call: str, arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    """create_branch and delete_branch refuse bad input with a clear error and change nothing (K2)."""
    await seed(runtime)  # sequences 1..4 (forking allocates none), then 5
    await runtime.store.ask(append(b"four"))
    assert runtime.engine.last_sequence == 5
    before = dump(runtime)
    with trio.fail_after(5):
        with pytest.raises(error, match=message):
            if call == "create":
                await runtime.create_branch(**arguments)
            else:
                await runtime.delete_branch(**arguments)
    assert dump(runtime) == before
    assert [info.name for info in await runtime.list_branches()] == ["main", "side"]


async def test_branch_calls_work_at_the_edges_of_the_sequence_range(runtime: Runtime) -> None:
    """Forks at sequence 0 and at the newest sequence see nothing and everything respectively (K2)."""
    await seed(runtime)
    last = runtime.engine.last_sequence
    with trio.fail_after(5):
        empty = await runtime.create_branch("empty", at_sequence=0)
        full = await runtime.create_branch("full", at_sequence=last)
        grandchild = await runtime.create_branch("grandchild", from_branch="full", at_sequence=2)
        assert (empty.parent, empty.fork_sequence) == ("main", 0)
        assert (full.fork_sequence, grandchild.parent, grandchild.fork_sequence) == (last, "full", 2)
        assert read_data(runtime, "empty") == []
        assert read_data(runtime, "full") == [b"one", b"two", b"three"]
        assert read_data(runtime, "grandchild") == [b"one", b"two"]
        await runtime.delete_branch("full")
        assert read_data(runtime, "grandchild") == [b"one", b"two"]  # a deleted parent's rows stay readable
        reused = await runtime.create_branch("full")
        assert reused.id != full.id


# -- close and reopen --------------------------------------------------------------------------------


async def test_closing_and_reopening_keeps_everything(store_path: Path) -> None:
    """Items, edits, removals, values, branches and the sequence survive close and reopen (K1)."""
    with trio.fail_after(20):
        async with open_runtime(store_path) as rt:
            await seed(rt)
            items = [(await rt.store.ask(append(f"side {n}".encode(), "side"))).sequence for n in range(3)]
            await rt.store.ask(EditItem(state="log", branch="side", item_sequence=items[1], data=b"edited"))
            await rt.store.ask(RemoveItems(state="log", branch="main", from_sequence=1, to_sequence=2))
            await rt.store.ask(SetValue(state="prefs", branch="side", value=["side", 1]))
            await rt.create_branch("doomed")
            await rt.delete_branch("doomed")
            before = dump(rt)
            branches = await rt.list_branches()
            main, side = read_data(rt), read_data(rt, "side")
        assert open_environments() == []

        async with open_runtime(store_path) as rt:
            assert dump(rt) == before
            assert await rt.list_branches() == branches
            assert read_data(rt) == main == [b"three"]
            assert read_data(rt, "side") == side == [b"one", b"two", b"three", b"side 0", b"edited", b"side 2"]
            with rt.engine.reader() as txn:
                assert rt.engine.get_value(txn, "prefs", rt.engine.branch("side"))[0] == ["side", 1]
                assert rt.engine.get_value(txn, "prefs", rt.engine.branch("main"))[0] == {"theme": "dark"}
            result = await rt.store.ask(append(b"after"))
            assert result.sequence == before["last_sequence"] + 1
            await rt.create_branch("doomed")  # a deleted branch's name is free


async def test_a_closed_runtime_refuses_calls(store_path: Path) -> None:
    """Calls on a closed runtime, or through a store handle kept past close, raise RuntimeClosedError."""
    with trio.fail_after(10):
        async with open_runtime(store_path) as rt:
            await seed(rt)
            store = rt.store
        with pytest.raises(RuntimeClosedError):
            rt.store  # noqa: B018 - the property is the call under test
        with pytest.raises(RuntimeClosedError):
            await store.ask(append(b"late"))
        with pytest.raises(RuntimeClosedError):
            await rt.list_branches()
        with pytest.raises(RuntimeClosedError):
            await rt.create_branch("late")
