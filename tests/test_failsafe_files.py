"""Damaged and foreign store files are refused at open, and ``verify`` reports damage (K7).

Determinism rules: one store is built per test through the runtime (messages with media
blobs and overflow-sized text, values, a fork, an edit and a removal), then damaged on a copy
with plain file writes: truncated, emptied, deleted, a page zeroed, a bit of a meta page's txnid
flipped. Every open of a damaged copy runs in a forked child of ``failsafe_child.py``'s fork
server, so a SIGBUS or an abort would kill only the child; the server reports how each child
ended. The damaged offsets are fixed lists (every page under ``CTXRT_SOAK=1``), never random;
the txnid-flip property draws its bits through Hypothesis, derandomized in ``make test``. A
``trio.fail_after`` guard bounds every test.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import lmdb
import pytest
import trio
from lmdb import verify as structural

from ctxrt.errors import StoreCorruptError, StoreFormatError
from ctxrt import open_runtime
from ctxrt.testing import (
    AppendItem,
    CreateBranch,
    EditItem,
    FORMAT_VERSION,
    RegisterState,
    RemoveItems,
    SetValue,
    files,
    keys,
    open_environments,
    prepare_append,
    verify_in_child,
    verify_store,
)
from support import LineReader

CHILD_SCRIPT = Path(__file__).with_name("failsafe_child.py")
PAGE = 4096
GUARD_S = 60


class ForkServer:
    """One line out, one line back: see failsafe_child.py."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._lines = LineReader(process.stdout)

    async def ask(self, line: str) -> str:
        await self._stdin.send_all((line + "\n").encode())
        return await self._lines.next_line()

    async def open(self, path: Path, mode: str) -> str:
        return await self.ask(f"open {path} {mode}")

    async def verify(self, path: Path) -> dict:  # type: ignore[type-arg]
        answer = await self.ask(f"verify {path}")
        assert answer.startswith("report "), f"verify of {path} ended with {answer!r}"
        return json.loads(answer.removeprefix("report "))


@asynccontextmanager
async def fork_server() -> AsyncIterator[ForkServer]:
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(trio.run_process, [sys.executable, str(CHILD_SCRIPT)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, check=False)
        )
        try:
            yield ForkServer(process)
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()


def message(i: int) -> AppendItem:
    """Message ``i``: mostly short text, some long enough for overflow pages, some with an image."""
    text = f"message {i} " + "lorem ipsum " * (400 if i % 17 == 0 else 3)
    content: list[dict] = [{"type": "text", "text": text}]  # type: ignore[type-arg]
    if i % 25 == 0:
        picture = hashlib.sha256(str(i).encode()).digest() * 40
        content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                    "data": base64.b64encode(picture).decode()}})
    data, blobs, appended = prepare_append("user", content)
    return AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs), attachment=appended)


async def build_store(path: Path, count: int = 300) -> None:
    """A store with every kind of record: messages (blobs, overflow pages), values, a fork, an edit, a removal.
    Its writes are flushed as the runtime closes, not each on its own (nothing here is about a crash)."""
    async with open_runtime(path, durability="os") as rt:
        await rt.store.ask(RegisterState(name="messages", kind="log"))
        await rt.store.ask(RegisterState(name="ns/reader", kind="value"))
        sequences = []
        for i in range(count):
            sequences.append((await rt.store.ask(message(i))).sequence)
            if i % 60 == 0:
                await rt.store.ask(SetValue(state="ns/reader", branch="main", value={"reader": f"r{i}"}))
        await rt.store.ask(CreateBranch(name="side", from_branch="main", at_sequence=sequences[count // 2]))
        side = message(count)
        await rt.store.ask(AppendItem(state="messages", branch="side", data=side.data, blobs=side.blobs))
        edited = message(count + 1)
        await rt.store.ask(EditItem(state="messages", branch="main", item_sequence=sequences[3], data=edited.data,
                                    blobs=edited.blobs))
        await rt.store.ask(RemoveItems(state="messages", branch="main", from_sequence=sequences[10],
                                       to_sequence=sequences[12]))
    assert open_environments() == []


def damaged_copy(original: Path, target: Path, damage: Callable[[Path], None]) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(original, target)
    damage(target / files.DATA_NAME)
    return target


def truncate_to(size: int) -> Callable[[Path], None]:
    return lambda data: os.truncate(data, size)


def zero_page(page: int) -> Callable[[Path], None]:
    def damage(data: Path) -> None:
        with open(data, "r+b") as file:
            file.seek(page * PAGE)
            file.write(bytes(PAGE))
    return damage


def live_pages(store: Path) -> set[int]:
    """The pages a sound store's trees reach (meta pages included), per py-lmdb's page walker."""
    walker = structural._Verifier(open(store / files.DATA_NAME, "rb"), (store / files.DATA_NAME).stat().st_size)
    try:
        assert walker.verify() == []
        return {0, 1} | {number for number, live in enumerate(walker.live) if live}
    finally:
        walker.f.close()


def is_ctxrt_refusal(answer: str) -> bool:
    return answer.startswith(("error ctxrt.errors.StoreCorruptError ", "error ctxrt.errors.StoreFormatError "))


# -- truncated, emptied, missing -----------------------------------------------------------------------


@pytest.mark.soak
async def test_a_truncated_data_file_is_refused_at_open_never_a_sigbus(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """A data file cut short of the pages in use is refused with StoreCorruptError by writers and readers (K7)."""
    store = tmp_path / "store"
    await build_store(store)
    size = (store / files.DATA_NAME).stat().st_size
    last_live = max(live_pages(store))
    sizes = [100, PAGE, 2 * PAGE, 8 * 1024 + 1, size // 2, last_live * PAGE, (last_live + 1) * PAGE - 1]
    if soak_scale(0, 1):
        sizes += list(range(2 * PAGE, (last_live + 1) * PAGE, PAGE))
    with trio.fail_after(60 + len(sizes)):
        async with fork_server() as children:
            for cut in sizes:
                copy = damaged_copy(store, tmp_path / "copy", truncate_to(cut))
                for mode in ("ro", "rw"):
                    answer = await children.open(copy, mode)
                    assert answer.startswith("error ctxrt.errors.StoreCorruptError "), f"cut to {cut}, {mode}: {answer}"
                    assert "truncated" in answer or "too short" in answer or "destroyed" in answer, answer
                assert (copy / files.DATA_NAME).stat().st_size == cut, "a refused open wrote to the file"


async def test_cutting_only_free_pages_off_the_end_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """LMDB may leave freed pages past the end of the file; the size check allows exactly those (K7).

    A raw LMDB workload that frees pages it allocated in the same transaction ends, at one
    commit, with a file shorter than the pages in use; the check reads the free-page table and
    accepts it, and LMDB reads the environment as it is.
    """
    import random

    env_path = tmp_path / "raw"
    env = lmdb.open(str(env_path), map_size=1 << 28, max_dbs=2)
    table = env.open_db(b"x")
    rng = random.Random(1)
    short = None
    try:
        for _ in range(3000):
            with env.begin(write=True) as txn:
                for _ in range(rng.randint(1, 20)):
                    key = rng.randbytes(rng.choice([4, 16]))
                    if rng.random() < 0.6:
                        txn.put(key, rng.randbytes(rng.choice([10, 100, 3000, 9000])), db=table)
                    else:
                        cursor = txn.cursor(db=table)
                        if cursor.set_range(key):
                            cursor.delete()
            if (env_path / files.DATA_NAME).stat().st_size < (env.info()["last_pgno"] + 1) * PAGE:
                short = files.read_meta(env_path)
                break
    finally:
        env.close()
    assert short is not None, "the workload never left freed pages past the end of the file"
    assert (env_path / files.DATA_NAME).stat().st_size < short.used_bytes
    assert structural.verify(str(env_path)) == []


@pytest.mark.parametrize("emptied", ["emptied", "deleted"])
async def test_an_emptied_or_deleted_data_file_is_refused_never_a_new_empty_store(tmp_path: Path, emptied: str) -> None:
    """A 0-byte or missing data.mdb beside a store's other files is refused, never reopened as a new store (K7)."""
    store = tmp_path / "store"
    await build_store(store)
    data = store / files.DATA_NAME
    if emptied == "emptied":
        os.truncate(data, 0)
    else:
        data.unlink()
    state = "empty (0 bytes)" if emptied == "emptied" else "missing"
    with trio.fail_after(30):
        async with fork_server() as children:
            for mode in ("rw", "ro"):
                answer = await children.open(store, mode)
                assert answer.startswith(
                    f"error ctxrt.errors.StoreCorruptError store file {data} is damaged: it is {state}, though "
                    f"{files.MARKER_NAME} shows a store lives here"
                ), answer
        assert (data.stat().st_size == 0) if emptied == "emptied" else not data.exists(), "a refused open wrote"
        report = verify_in_child(store)
    assert report.status == "damaged" and report.exit_code == 1
    assert report.damage[0].place == files.DATA_NAME and state in report.damage[0].what


async def test_a_store_made_before_the_marker_is_refused_when_emptied_by_its_lmdb_lock_file(tmp_path: Path) -> None:
    """Without the format marker (an older store), LMDB's lock file is what shows a store lived there (K7)."""
    store = tmp_path / "store"
    await build_store(store, count=20)
    (store / files.MARKER_NAME).unlink()
    os.truncate(store / files.DATA_NAME, 0)
    with trio.fail_after(10):
        for readonly in (False, True):
            with pytest.raises(StoreCorruptError, match=rf"it is empty \(0 bytes\), though {files.LMDB_LOCK_NAME} shows"):
                async with open_runtime(store, readonly=readonly):
                    pytest.fail("an emptied store was opened")
    assert (store / files.DATA_NAME).stat().st_size == 0 and not (store / files.MARKER_NAME).exists()


async def test_a_writer_opening_a_sound_store_without_a_marker_adds_it(tmp_path: Path) -> None:
    """A store from before the format marker opens as ever, and its first writer records the marker (K7)."""
    store = tmp_path / "store"
    await build_store(store, count=20)
    (store / files.MARKER_NAME).unlink()
    with trio.fail_after(10):
        async with open_runtime(store, readonly=True):
            assert not (store / files.MARKER_NAME).exists(), "a read-only runtime wrote the marker"
        async with open_runtime(store):
            pass
    assert (store / files.MARKER_NAME).read_text() == f"ctxrt store format {FORMAT_VERSION}\n"


# -- zeroed pages -------------------------------------------------------------------------------------


@pytest.mark.soak
async def test_zeroed_pages_are_refused_at_open_or_reported_by_verify(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """A zeroed page anywhere: the opening child ends with a ctxrt error or reads the store intact, and
    verify reports every zeroed page the store was using (K7).

    Damage deep in a table can't be seen by a constant-cost open; what must hold is that a
    process opening the store never crashes where verify would have said nothing, and that
    verify names every zeroed live page.
    """
    store = tmp_path / "store"
    await build_store(store, count=soak_scale(300, 2000))
    pages = (store / files.DATA_NAME).stat().st_size // PAGE
    live = live_pages(store)
    sample = sorted({0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, pages - 1, *sorted(live)[2::max(1, len(live) // 12)]})
    chosen = list(range(pages)) if soak_scale(0, 1) else [page for page in sample if page < pages]
    with trio.fail_after(60 + len(chosen)):
        async with fork_server() as children:
            intact = await children.open(store, "ro")
            assert intact.startswith("ok "), intact
            for page in chosen:
                copy = damaged_copy(store, tmp_path / "copy", zero_page(page))
                report = await children.verify(copy)
                context = f"page {page} ({'live' if page in live else 'free'}) zeroed: {report}"
                if page in live:
                    assert report["status"] == "damaged", context
                else:
                    assert report["status"] == "sound", context
                for mode in ("ro", "rw"):
                    answer = await children.open(damaged_copy(store, tmp_path / "copy", zero_page(page)), mode)
                    survived = answer == intact or is_ctxrt_refusal(answer) or answer.startswith(
                        "error ctxrt.errors.StoreFormatError ")
                    assert survived or report["status"] == "damaged", f"{context}; {mode} open: {answer}"


async def test_verify_reports_a_sound_store_as_sound_and_counts_what_it_read(tmp_path: Path) -> None:
    """verify walks every page and record of a sound store and finds nothing (K7)."""
    store = tmp_path / "store"
    await build_store(store)
    with trio.fail_after(30):
        report = verify_in_child(store)
    assert report.status == "sound", report.lines()
    assert report.exit_code == 0 and report.damage == ()
    assert report.pages == (store / files.DATA_NAME).stat().st_size // PAGE
    assert report.records > 300


async def test_verify_in_a_child_survives_a_store_that_crashes_lmdb(tmp_path: Path) -> None:
    """A store whose reading aborts LMDB kills only verify's child, and the caller gets that as damage (K7).

    While a writer holds the owner lock the page walk is skipped (the pages move under it), so
    the record walk reads a zeroed leaf page through LMDB, whose cursor asserts and aborts.
    """
    store = tmp_path / "store"
    await build_store(store)
    live = sorted(live_pages(store))
    crashed = None
    with trio.fail_after(120):
        for page in live[2:]:
            copy = damaged_copy(store, tmp_path / "copy", zero_page(page))
            lock = os.open(copy / files.OWNER_LOCK_NAME, os.O_RDWR)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # stands in for a running writer
                report = await trio.to_thread.run_sync(verify_in_child, copy)
            finally:
                os.close(lock)
            assert report.status == "damaged", f"page {page}: {report.lines()}"
            if any("killed the checking process" in item.what for item in report.damage):
                crashed = report
                break
    assert crashed is not None, "no zeroed page made LMDB crash the checker"
    assert crashed.exit_code == 1
    assert any(note.startswith("a writer holds the store") for note in crashed.notes), crashed.notes


# -- foreign environments and other files -----------------------------------------------------------------


def foreign_environment(path: Path) -> None:
    env = lmdb.open(str(path), max_dbs=4)
    try:
        accounts = env.open_db(b"accounts")
        with env.begin(write=True) as txn:
            txn.put(b"someone", b"else's data")
            txn.put(b"alice", b"100", db=accounts)
    finally:
        env.close()


def tree_bytes(path: Path) -> dict[str, bytes]:
    return {entry.name: entry.read_bytes() for entry in sorted(path.iterdir())}


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "reader"])
async def test_a_foreign_lmdb_environment_is_refused_before_anything_is_written(tmp_path: Path, readonly: bool) -> None:
    """Someone else's LMDB environment is refused with StoreFormatError by writers too, and every file
    beside it is left as it was: no owner lock, no lock file extended (K7)."""
    store = tmp_path / "foreign"
    foreign_environment(store)
    before = tree_bytes(store)
    with trio.fail_after(10):
        with pytest.raises(StoreFormatError, match=r"is not a ctxrt store: it is another LMDB environment, whose main "
                                                   r"table holds b'accounts', b'someone'; nothing was written to it$"):
            async with open_runtime(store, readonly=readonly):
                pytest.fail("a foreign environment was opened")
    assert tree_bytes(store) == before, "a file beside the foreign environment was created or changed"
    assert open_environments() == []


async def test_a_foreign_table_named_like_ctxrts_is_refused_by_a_writer(tmp_path: Path) -> None:
    """A plain key named like a ctxrt table (b"meta") is not mistaken for one (K7)."""
    store = tmp_path / "foreign"
    env = lmdb.open(str(store), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(keys.DB_META, b"not a table")
    env.close()
    before = tree_bytes(store)
    with trio.fail_after(10):
        with pytest.raises(StoreFormatError, match=r"is not a ctxrt store"):
            async with open_runtime(store):
                pytest.fail("a foreign environment was opened")
    assert tree_bytes(store) == before


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "reader"])
async def test_a_data_file_that_is_not_lmdb_is_refused_as_not_a_store(tmp_path: Path, readonly: bool) -> None:
    """A data.mdb that isn't an LMDB file at all is StoreFormatError; beside a store's marker it is StoreCorruptError (K7)."""
    store = tmp_path / "store"
    store.mkdir()
    (store / files.DATA_NAME).write_bytes(b"just some text, not a database\n" * 400)
    with trio.fail_after(10):
        with pytest.raises(StoreFormatError, match=r"is not an LMDB data file, so not a ctxrt store \(no LMDB magic"):
            async with open_runtime(store, readonly=readonly):
                pytest.fail("a text file was opened")
        (store / files.MARKER_NAME).write_text("ctxrt store format 1\n")
        with pytest.raises(StoreCorruptError, match=r"its first meta page is destroyed"):
            async with open_runtime(store, readonly=readonly):
                pytest.fail("a text file was opened")
    assert (store / files.DATA_NAME).read_bytes() == b"just some text, not a database\n" * 400


async def test_verify_refuses_a_foreign_environment_without_calling_it_damaged(tmp_path: Path) -> None:
    """verify says a foreign environment was not checked (exit 2) rather than damaged (K7)."""
    store = tmp_path / "foreign"
    foreign_environment(store)
    report = verify_store(store)
    assert report.status == "not checked" and report.exit_code == 2
    assert "is not a ctxrt store" in report.notes[-1]


# -- the meta pages' transaction ids ---------------------------------------------------------------------

TXNID_AT = 16 + 128  # mm_txnid: after the 16-byte page header and 128 bytes of MDB_meta


def meta_txnids(store: Path) -> tuple[int, int]:
    data = (store / files.DATA_NAME).read_bytes()[: PAGE + TXNID_AT + 8]
    return (int.from_bytes(data[TXNID_AT : TXNID_AT + 8], sys.byteorder),
            int.from_bytes(data[PAGE + TXNID_AT : PAGE + TXNID_AT + 8], sys.byteorder))


def flip_txnid_bit(page: int, bit: int) -> Callable[[Path], None]:
    """Flip one bit of meta page ``page``'s txnid, on disk."""
    def damage(data: Path) -> None:
        at = page * PAGE + TXNID_AT + (bit // 8 if sys.byteorder == "little" else 7 - bit // 8)
        with open(data, "r+b") as file:
            file.seek(at)
            byte = file.read(1)[0]
            file.seek(at)
            file.write(bytes([byte ^ 1 << bit % 8]))
    return damage


async def two_messages(store: Path) -> None:
    async with open_runtime(store) as rt:
        manager = await rt.open("a")
        await manager.add_message("user", "first")
        await manager.add_message("user", "the last acknowledged write")
    assert open_environments() == []


async def messages_read(store: Path, **options: bool) -> list[str]:
    async with open_runtime(store, **options) as rt:
        manager = await rt.open("a")
        return [message.content[0].text for message in await manager.get_all_messages()]  # type: ignore[union-attr]


TXNIDS_APART = (r"meta page 0 records transaction \d+ and meta page 1 transaction \d+, but LMDB writes them "
                r"alternately, one commit apart: one meta page is damaged, so which commit is the last can't be told")


@pytest.mark.parametrize("which", ["older made newer", "newer made older"])
async def test_a_flipped_bit_in_a_meta_pages_txnid_is_refused_never_serving_an_older_commit(
    tmp_path: Path, which: str
) -> None:
    """One flipped txnid bit would make LMDB serve the commit before the last, silently dropping an
    acknowledged write (K3); writers, read-only opens that check every page and verify all refuse
    or report it, naming both txnids, and nothing is written to the file (K7)."""
    store = tmp_path / "store"
    await two_messages(store)
    txnids = meta_txnids(store)
    newer = txnids.index(max(txnids))
    # The older page gains 65536; the newer one loses its highest set bit (5 -> 1, 7 -> 3, ...).
    page, bit = (1 - newer, 16) if which == "older made newer" else (newer, txnids[newer].bit_length() - 1)
    flip_txnid_bit(page, bit)(store / files.DATA_NAME)
    flipped = meta_txnids(store)
    assert max(flipped) == flipped[1 - newer] and abs(flipped[0] - flipped[1]) > 1  # LMDB would pick the older commit
    before = tree_bytes(store)
    expected = (f"store file {store / files.DATA_NAME} is damaged: meta page 0 records transaction {flipped[0]} and "
                f"meta page 1 transaction {flipped[1]}, but LMDB writes them alternately, one commit apart: one meta "
                f"page is damaged, so which commit is the last can't be told")
    with trio.fail_after(60):
        async with fork_server() as children:
            for mode in ("ro", "rw"):
                answer = await children.open(store, mode)
                assert answer == f"error ctxrt.errors.StoreCorruptError {expected}", f"{mode}: {answer}"
        with pytest.raises(StoreCorruptError) as refused:
            await messages_read(store, readonly=True, check_pages=True)
        assert str(refused.value) == expected and refused.value.path == str(store / files.DATA_NAME)
        report = verify_in_child(store)
        result = await trio.run_process([sys.executable, "-m", "ctxrt", "verify", str(store)], capture_stdout=True,
                                        capture_stderr=True, check=False)
    assert report.status == "damaged" and report.exit_code == 1, report.lines()
    assert [(item.place, item.what) for item in report.damage] == [(files.DATA_NAME, expected.split(": ", 1)[1])]
    out = result.stdout.decode()
    assert result.returncode == 1 and f"damaged: data.mdb: {expected.split(': ', 1)[1]}" in out, out
    assert tree_bytes(store) == before, "a refused open wrote to the store"
    flip_txnid_bit(page, bit)(store / files.DATA_NAME)  # undone: the store is whole again
    assert await messages_read(store) == ["first", "the last acknowledged write"]


async def test_stores_lmdb_wrote_have_meta_txnids_one_commit_apart_and_open(tmp_path: Path) -> None:
    """No store LMDB wrote is refused by the txnid check: one never committed (both 0), a ctxrt store
    after its first commit and after many, and copies made by mdb_env_copy, plain and compacting (K7)."""
    raw = tmp_path / "raw"
    lmdb.open(str(raw), max_dbs=2).close()
    assert meta_txnids(raw) == (0, 0) and files.read_meta(raw).is_empty
    store = tmp_path / "store"
    with trio.fail_after(60):
        async with open_runtime(store):
            pass
        first = meta_txnids(store)
        assert sorted(first) == [0, 1]
        async with open_runtime(store, durability="os") as rt:
            manager = await rt.open("a")
            for i in range(40):
                await manager.add_message("user", f"m{i} " + "word " * (i * 30))
        many = meta_txnids(store)
        assert abs(many[0] - many[1]) == 1 and max(many) > 40
        env = lmdb.open(str(store), max_dbs=len(keys.ALL_DBS) + 2, readonly=True)
        try:
            for compact in (False, True):
                (tmp_path / f"copy-{compact}").mkdir()
                env.copy(str(tmp_path / f"copy-{compact}"), compact=compact)
        finally:
            env.close()
        assert meta_txnids(tmp_path / "copy-False") == many
        assert meta_txnids(tmp_path / "copy-True") == (0, 1)
        expected = [f"m{i} " + "word " * (i * 30) for i in range(40)]
        for copy in (store, tmp_path / "copy-False", tmp_path / "copy-True"):
            files.read_meta(copy)
            assert await messages_read(copy, readonly=True, check_pages=True) == expected
            assert await messages_read(copy) == expected


COMMITS_READ_ACROSS = 5000  # the checks run again and again while the writer commits this often
WRITER_SCRIPT = """
import sys, lmdb
env = lmdb.open(sys.argv[1], sync=False, metasync=False, max_dbs=2)
table = env.open_db(b"x")
print("ready", flush=True)
i = 0
while True:
    with env.begin(write=True) as txn:
        txn.put(b"k%d" % (i % 300), b"v" * (i % 700), db=table)
    i += 1
"""


def test_checking_a_store_while_another_process_commits_never_refuses_it(tmp_path: Path) -> None:
    """The open's checks run while a writer in another process commits as fast as LMDB can (no
    fsync): they never refuse that sound store (K7), nor take it for another LMDB environment (K5).

    Reading the two meta pages at two moments could show txnids commits apart, and a root page a
    meta page names may be reused by the time it is read: the meta pages are read in one pread,
    and a finding with a commit between its reads is read again before it refuses anything.
    """
    env_path = tmp_path / "raw"
    writer = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(env_path)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        start = files.read_meta(env_path).txnid
        deadline = time.monotonic() + GUARD_S
        while files.read_meta(env_path).txnid - start <= COMMITS_READ_ACROSS:  # the writer commits all along
            assert files.foreign_entries(env_path, [b"x"]) == []  # never someone else's environment
            assert time.monotonic() < deadline, "the writer stopped committing"
    finally:
        writer.kill()
        writer.wait()


def test_a_torn_read_of_the_meta_pages_is_read_again_before_refusing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta pages read as txnids commits apart once, then one apart, are a writer's commit seen mid-way:
    accepted; read the same way twice in a row, they are refused (K7)."""
    env_path = tmp_path / "raw"
    env = lmdb.open(str(env_path), max_dbs=2)
    for i in range(5):
        with env.begin(write=True) as txn:
            txn.put(b"k", b"%d" % i)
    env.close()
    real_read = files._read
    torn = {"left": 0}

    def read(fd: int, offset: int, length: int) -> bytes:
        data = bytearray(real_read(fd, offset, length))
        if offset == 0 and length > PAGE and torn["left"]:
            torn["left"] -= 1
            at = PAGE + TXNID_AT
            data[at : at + 8] = (int.from_bytes(data[at : at + 8], sys.byteorder) + 4).to_bytes(8, sys.byteorder)
        return bytes(data)

    monkeypatch.setattr(files, "_read", read)
    torn["left"] = 1
    assert files.read_meta(env_path).txnid == 5 and torn["left"] == 0
    torn["left"] = 2
    with pytest.raises(StoreCorruptError, match=r"meta page 0 records transaction 4 and meta page 1 transaction 9, "):
        files.read_meta(env_path)


def test_any_flipped_txnid_bit_is_refused_or_read_as_the_last_commit_but_for_bit_1(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """After any number of commits, a flip of any one txnid bit of either meta page is refused, or the
    store reads as its last commit (K7, K3): the only flips the txnid check can't see are of bit 1
    (a txnid moved by 2 past its neighbour's looks like a sound pair), and those read as the last or
    the previous commit. Opened in this process: a flipped txnid leaves both commits' pages whole, so
    LMDB reading either can't crash.
    """
    from hypothesis import given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("txnid-flips")
    built: dict[int, Path] = {}

    async def build(store: Path, count: int) -> None:
        async with open_runtime(store, durability="os") as rt:
            manager = await rt.open("a")
            for i in range(count):
                await manager.add_message("user", f"m{i}")

    @settings(max_examples=80)
    @given(count=st.integers(1, 6), page=st.integers(0, 1), bit=st.integers(0, 63))
    def flip(count: int, page: int, bit: int) -> None:
        if count not in built:
            built[count] = root / f"built-{count}"
            trio.run(build, built[count], count)
        copy = damaged_copy(built[count], root / "copy", flip_txnid_bit(page, bit))
        txnids = meta_txnids(copy)
        try:
            read = trio.run(partial(messages_read, copy, readonly=True))
        except StoreCorruptError as exc:
            assert not files.one_commit_apart(*txnids) or "no tables" in exc.what, exc.what
            if not files.one_commit_apart(*txnids):
                assert re.fullmatch(TXNIDS_APART, exc.what), exc.what
            return
        finally:
            assert open_environments() == []
        assert files.one_commit_apart(*txnids), f"{txnids} were not refused"
        last = [f"m{i}" for i in range(count)]
        assert read == last or (bit == 1 and read == last[:-1]), (txnids, read)

    flip()
