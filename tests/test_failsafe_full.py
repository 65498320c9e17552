"""A full disk or a full map refuses the batch with StoreFullError and the runtime keeps going (L6).

Determinism rules: the full disk is a real 8 MiB tmpfs mounted for the test (tests run as
root; without the right to mount, the test is skipped and says why) and unmounted after it.
A ballast file takes 1 MiB of it up front; deleting it is "space is freed". Writers append
until the store refuses them; the assertions are about who was told what and what the store
holds, never about timing. The full map is made real in a child process whose address space
is capped (RLIMIT_AS), so the map can't grow. Every test has a ``trio.fail_after`` guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ctxrt.errors import StoreFullError
from ctxrt import Runtime, open_runtime
from ctxrt.testing import AppendItem, RegisterState, verify_in_child

DISK_SIZE = "8m"
BALLAST = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs, mounted for this test only."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"can't mount a size-limited tmpfs here (euid {os.geteuid()}): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)  # a failed test may leave it busy


def payload(writer: int, counter: int) -> bytes:
    return f"writer {writer} append {counter};".encode() + bytes([writer]) * 3000


def stored(rt: Runtime) -> dict[int, bytes]:
    engine = rt.engine
    with engine.reader() as txn:
        return {item.sequence: bytes(item.data) for item in engine.log_items(txn, "log", engine.branch("main"))}


@pytest.mark.parametrize("writers", [1, 8])
async def test_a_full_disk_refuses_each_failed_batch_and_the_runtime_keeps_serving(
    small_disk: Path, writers: int
) -> None:
    """On a full disk each refused caller gets StoreFullError; reads go on, writes resume once space is
    freed, and nothing acknowledged is lost (L6)."""
    store = small_disk / "store"
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(BALLAST))
    acked: dict[int, bytes] = {}
    refusals: list[StoreFullError] = []
    with trio.fail_after(60):
        async with open_runtime(store) as rt:
            await rt.store.ask(RegisterState(name="log", kind="log"))

            async def write_until_refused(writer: int) -> None:
                counter = 0
                while True:
                    data = payload(writer, counter)
                    try:
                        result = await rt.store.ask(AppendItem(state="log", branch="main", data=data))
                    except StoreFullError as refused:
                        refusals.append(refused)
                        return
                    acked[result.sequence] = data
                    counter += 1

            async with trio.open_nursery() as nursery:
                for writer in range(writers):
                    nursery.start_soon(write_until_refused, writer)

            assert len(refusals) == writers, "every writer was told its write was refused"
            for refused in refusals:
                assert refused.path == str(store / "data.mdb")
                assert str(refused).startswith(f"the store at {store / 'data.mdb'} can't take the write: ")
                assert str(refused).endswith("; nothing was written")
            assert len({id(refused) for refused in refusals}) == writers, "each caller has its own error"
            assert len(acked) > 100

            # Reads go on, and show exactly the acknowledged writes.
            assert stored(rt) == acked

            # Space freed: the same runtime writes again.
            ballast.unlink()
            for counter in range(5):
                result = await rt.store.ask(AppendItem(state="log", branch="main", data=payload(100, counter)))
                acked[result.sequence] = payload(100, counter)
            assert stored(rt) == acked

        async with open_runtime(store, readonly=True) as reopened:
            assert stored(reopened) == acked, "an acknowledged write was lost, or a refused one landed"
        report = await trio.to_thread.run_sync(verify_in_child, store)
    assert report.status == "sound", report.lines()


async def test_a_full_disk_refuses_a_first_open_cleanly(small_disk: Path) -> None:
    """Creating a store on a disk with no room fails with an error, and the disk's other files are untouched (L6)."""
    filler = small_disk / "filler"
    with open(filler, "wb") as file:
        try:
            while True:
                file.write(bytes(1 << 16))
                file.flush()
        except OSError:
            pass
    with trio.fail_after(30):
        with pytest.raises((StoreFullError, OSError)):
            async with open_runtime(small_disk / "store"):
                pytest.fail("a store was created on a full disk")
    filler.unlink()
    with trio.fail_after(30):
        async with open_runtime(small_disk / "store") as rt:  # room again: the store is created
            await rt.store.ask(RegisterState(name="log", kind="log"))
            await rt.store.ask(AppendItem(state="log", branch="main", data=b"first"))
            assert list(stored(rt).values()) == [b"first"]


MAP_CHILD = """
import os, resource, sys, trio
from ctxrt.errors import StoreFullError
from ctxrt import open_runtime
from ctxrt.testing import AppendItem, Atomically, RegisterState

def address_space():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

def read(rt):
    with rt.engine.reader() as txn:
        return [bytes(item.data) for item in rt.engine.log_items(txn, "log", rt.engine.branch("main"))]

async def main(path):
    acked = []
    async with open_runtime(path, map_size=1 << 20) as rt:
        await rt.store.ask(RegisterState(name="log", kind="log"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (address_space() + (40 << 20), hard))
        try:
            while True:
                group = [f"{len(acked) + i};".encode() + os.urandom(200_000) for i in range(4)]
                await rt.store.ask(Atomically(commands=tuple(AppendItem(state="log", branch="main", data=d) for d in group)))
                acked.extend(group)
        except StoreFullError as refused:
            print("refused", refused.reason)
        with rt.engine.reader() as txn:  # reads go on under the cap (one item: the cap leaves little memory)
            last = rt.engine.log_item(txn, "log", rt.engine.branch("main"), -1)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))  # room again
        print("reads", bytes(last.data) == acked[-1], read(rt) == acked, len(acked))
        group = [os.urandom(200_000) for _ in range(40)]
        await rt.store.ask(Atomically(commands=tuple(AppendItem(state="log", branch="main", data=d) for d in group)))
        acked.extend(group)
        print("resumed", read(rt) == acked, rt.engine.env.info()["map_size"] > (16 << 20))
    async with open_runtime(path, readonly=True) as rt:
        print("reopened", read(rt) == acked)

trio.run(main, sys.argv[1])
"""


async def test_a_map_that_cant_grow_refuses_with_store_full_and_the_runtime_keeps_serving(tmp_path: Path) -> None:
    """When the map is full and this process can't map a bigger one, writes get StoreFullError, reads go on,
    and writes resume when the map can grow again; the process never loses its map (L6)."""
    with trio.fail_after(60):
        child = await trio.run_process([sys.executable, "-c", MAP_CHILD, str(tmp_path / "store")],
                                       capture_stdout=True, capture_stderr=True, check=False)
    lines = child.stdout.decode().splitlines()
    assert child.returncode == 0, child.stderr.decode()[-2000:]
    assert lines[0].startswith("refused the map is full at ") and "this process can't map" in lines[0], lines
    assert lines[1].startswith("reads True True "), lines
    assert lines[2:] == ["resumed True True", "reopened True"], lines
