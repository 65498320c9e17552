"""A store this user may read but not write gives a ctxrt error naming the path, never a raw one.

Determinism rules: permissions are real, never mocked. Tests run as root, who ignores file
modes, so the store is opened by a child process started through ``setpriv`` without the
capabilities that override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER): it is
still uid 0, the files' owner, and the modes below apply to it. Without root, the child is the
same user and the modes apply anyway. The read-only filesystem is a real read-only bind mount
(skipped, saying why, where mounting isn't permitted). Each child prints one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ctxrt.errors import StorePermissionError
from ctxrt import open_runtime
from ctxrt.testing import AppendItem, RegisterState, files

OPEN_CHILD = """
import sys, trio
from ctxrt import open_runtime

async def main(path, mode):
    async with open_runtime(path, readonly=mode == "ro") as rt:
        with rt.engine.reader() as txn:
            items = rt.engine.log_items(txn, "log", rt.engine.branch("main"))
        print("ok", b",".join(bytes(item.data) for item in items).decode())

try:
    trio.run(main, sys.argv[1], sys.argv[2])
except BaseException as exc:
    print("error", type(exc).__module__ + "." + type(exc).__qualname__, getattr(exc, "path", None), "|", exc)
"""


def unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root ignores file modes and setpriv (util-linux) isn't here to drop that power")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


async def open_in_child(path: Path, mode: str) -> str:
    child = await trio.run_process([*unprivileged(), sys.executable, "-c", OPEN_CHILD, str(path), mode],
                                   capture_stdout=True, capture_stderr=True, check=False)
    return child.stdout.decode().strip() or child.stderr.decode()[-2000:]


async def seed(store: Path) -> None:
    async with open_runtime(store) as rt:
        await rt.store.ask(RegisterState(name="log", kind="log"))
        for data in (b"one", b"two"):
            await rt.store.ask(AppendItem(state="log", branch="main", data=data))


@pytest.fixture
def readable_store(tmp_path: Path) -> Iterator[Path]:
    """Where a test makes a store read-only; restores its modes so tmp_path's clean-up can remove it."""
    store = tmp_path / "store"
    yield store
    if store.exists():
        store.chmod(0o755)
        for entry in store.iterdir():
            entry.chmod(0o644)


async def test_a_writer_on_a_store_it_may_only_read_is_refused_naming_the_owner_lock(readable_store: Path) -> None:
    """A writer without write permission gets StorePermissionError naming the file, and changes nothing."""
    store = readable_store
    with trio.fail_after(60):
        await seed(store)
        for entry in store.iterdir():
            entry.chmod(0o444)
        store.chmod(0o555)
        before = {entry.name: entry.read_bytes() for entry in store.iterdir()}
        answer = await open_in_child(store, "rw")
    assert answer.startswith(f"error ctxrt.errors.StorePermissionError {store / files.OWNER_LOCK_NAME} | "), answer
    assert answer.endswith("can't open the owner lock to write the store (Permission denied); readonly=True may "
                           "still read it"), answer
    assert {entry.name: entry.read_bytes() for entry in store.iterdir()} == before


async def test_a_reader_that_cant_use_lmdbs_lock_file_is_refused_naming_it(readable_store: Path) -> None:
    """A read-only runtime needs to write LMDB's lock file: without that it gets StorePermissionError
    naming lock.mdb; with it, it reads a store it may not otherwise write."""
    store = readable_store
    with trio.fail_after(60):
        await seed(store)
        for entry in store.iterdir():
            entry.chmod(0o444)
        store.chmod(0o555)
        refused = await open_in_child(store, "ro")
        (store / files.LMDB_LOCK_NAME).chmod(0o666)
        allowed = await open_in_child(store, "ro")
    assert refused.startswith(f"error ctxrt.errors.StorePermissionError {store / files.LMDB_LOCK_NAME} | "), refused
    assert "a read-only runtime needs to write LMDB's lock file" in refused, refused
    assert allowed == "ok one,two", allowed


async def test_a_writer_that_cant_create_the_store_directory_is_refused_naming_it(tmp_path: Path) -> None:
    """A writer asked to create a store where it may not is refused with StorePermissionError naming the directory."""
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with trio.fail_after(60):
            answer = await open_in_child(parent / "store", "rw")
    finally:
        parent.chmod(0o755)
    assert answer.startswith(f"error ctxrt.errors.StorePermissionError {parent / 'store'} | "), answer
    assert "can't create the store's directory (Permission denied)" in answer, answer
    assert list(parent.iterdir()) == []


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(store, a read-only bind mount of it)."""
    store, view = tmp_path / "store", tmp_path / "view"
    store.mkdir()
    view.mkdir()
    bound = subprocess.run(["mount", "--bind", str(store), str(view)], capture_output=True, text=True, check=False)
    if bound.returncode != 0:
        pytest.skip(f"can't bind-mount here (euid {os.geteuid()}): {bound.stderr.strip()}")
    try:
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True, text=True,
                                   check=False)
        if remounted.returncode != 0:
            pytest.skip(f"can't make a bind mount read-only here: {remounted.stderr.strip()}")
        yield store, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=True)


async def test_on_a_read_only_filesystem_readers_read_and_writers_are_refused_by_name(
    read_only_view: tuple[Path, Path]
) -> None:
    """On a read-only filesystem a read-only runtime reads (without LMDB's locks), and a writer gets
    StorePermissionError naming the owner lock, never a raw lmdb.ReadonlyError."""
    store, view = read_only_view
    with trio.fail_after(30):
        await seed(store)
        async with open_runtime(view, readonly=True) as reader:
            with reader.engine.reader() as txn:
                assert [bytes(item.data) for item in reader.engine.log_items(txn, "log", reader.engine.branch("main"))] \
                    == [b"one", b"two"]
        with pytest.raises(StorePermissionError) as refused:
            async with open_runtime(view):
                pytest.fail("a writer opened a read-only filesystem")
    assert refused.value.path == str(view / files.OWNER_LOCK_NAME)
    assert isinstance(refused.value, PermissionError)
    assert "Read-only file system" in str(refused.value)


async def test_a_writer_that_may_not_write_the_data_file_is_refused_naming_it(readable_store: Path) -> None:
    """With only data.mdb read-only, the writer gets StorePermissionError naming data.mdb, not lmdb's error."""
    store = readable_store
    with trio.fail_after(60):
        await seed(store)
        (store / files.DATA_NAME).chmod(0o444)
        answer = await open_in_child(store, "rw")
        reader = await open_in_child(store, "ro")
    assert answer.startswith(f"error ctxrt.errors.StorePermissionError {store / files.DATA_NAME} | "), answer
    assert "a writer needs to write the store's files; readonly=True may still read it" in answer, answer
    assert reader == "ok one,two", reader


async def test_a_data_file_no_one_may_read_is_refused_by_name_for_writers_and_readers(readable_store: Path) -> None:
    """M7, K7 (from a host-style attack): data.mdb at mode 0 refuses a writer and a reader alike
    with StorePermissionError naming it (before: a bare PermissionError with no path)."""
    store = readable_store
    with trio.fail_after(60):
        await seed(store)
        (store / files.DATA_NAME).chmod(0)
        writer = await open_in_child(store, "rw")
        reader = await open_in_child(store, "ro")
    for answer in (writer, reader):
        assert answer.startswith(f"error ctxrt.errors.StorePermissionError {store / files.DATA_NAME} | "), answer
