"""A durable commit's flush doesn't stop the trio thread, and its callers wait for it (K3, K9).

Determinism rules: "the disk holds the commit" is made real by freezing the filesystem the store
lives on (``fsfreeze``; a 32 MiB ext4 image mounted on a loop device for the test, as root;
without the right to mount, the test is skipped and says why). A write to a frozen filesystem
waits until it is thawed, so a commit is out for exactly as long as the test keeps it frozen. A
thread thaws it after ``THAW_S`` whatever happens, so code that blocks the trio thread in the
commit finishes the test (and fails it) instead of hanging. Assertions are about what was
answered while frozen, never about timing. Every test has a ``trio.fail_after`` guard. Each test
runs twice: the image on /tmp, and in /dev/shm, where the flush measures fast and a lone caller
commits from its own task.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from ctxrt import Budget, open_runtime

THAW_S = 5.0
WARM = 5  # appends before a freeze
EVERYTHING = Budget(max_tokens=100_000, reserve_for_response=0)


class Disk:
    """A small ext4 filesystem of its own, which a test can freeze and thaw."""

    def __init__(self, mount_point: Path) -> None:
        self.mount_point = mount_point
        self._lock = threading.Lock()
        self.frozen = False
        self.thawed_by_timer = False

    def freeze(self) -> threading.Timer:
        """Freeze it; a timer thaws it after ``THAW_S`` if the test hasn't (cancel it when done)."""
        subprocess.run(["fsfreeze", "-f", str(self.mount_point)], check=True)
        self.frozen = True
        timer = threading.Timer(THAW_S, self.thaw, kwargs={"by_timer": True})
        timer.start()
        return timer

    def thaw(self, *, by_timer: bool = False) -> None:
        with self._lock:
            if self.frozen:
                self.frozen = False
                self.thawed_by_timer = by_timer
                subprocess.run(["fsfreeze", "-u", str(self.mount_point)], check=True)


@pytest.fixture(params=["tmp", "shm"])
def disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Disk]:
    """A frozen-able disk; "shm": its image in /dev/shm (memory), so the flush measures fast and a
    lone caller commits from its own task (L3, K9)."""
    image, mount_point = tmp_path / "disk.img", tmp_path / "disk"
    if request.param == "shm":
        if not Path("/dev/shm").is_dir():
            pytest.skip("no /dev/shm here: a disk whose flush measures fast needs one")
        shm = Path(tempfile.mkdtemp(prefix="ctxrt-flush-", dir="/dev/shm"))
        request.addfinalizer(lambda: shutil.rmtree(shm, ignore_errors=True))
        image = shm / "disk.img"
    mount_point.mkdir()
    with image.open("wb") as out:
        out.truncate(32 << 20)
    # In memory, without a journal (whose commit thread makes a flush take milliseconds under load):
    # the flush measures fast, about 0.2 ms.
    fast = ["-O", "^has_journal"] if request.param == "shm" else []
    made = subprocess.run(["mkfs.ext4", "-q", "-F", *fast, str(image)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"can't make an ext4 image here: {made.stderr.strip()}")
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True, text=True,
                             check=False)
    if mounted.returncode != 0:
        pytest.skip(f"can't mount a loop device here: {mounted.stderr.strip()}")
    disk = Disk(mount_point)
    try:
        yield disk
    finally:
        disk.thaw()
        if subprocess.run(["umount", str(mount_point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)  # a failed test may leave it busy


async def test_the_loop_idles_and_serves_a_compile_while_a_durable_append_waits_for_the_disk(disk: Disk) -> None:
    """While a durable commit waits for the disk, the loop goes idle and serves a compile; the
    append's caller is answered only once the disk took it, and it reads back after (K9)."""
    with trio.fail_after(THAW_S * 4):
        async with open_runtime(disk.mount_point / "store") as rt:
            reader = await rt.open("reader", isolate=True)
            await reader.add_message("user", "an earlier message")
            before = await reader.compile(EVERYTHING)
            appender = await rt.open("appender", isolate=True)
            await appender.add_message("user", "warm")
            answered: list[str] = []

            async def append() -> None:
                await appender.add_message("user", "written while the disk is frozen")
                answered.append("append")

            timer = disk.freeze()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(append)
                    # the loop goes idle with the commit out; a loop stuck in the commit idles only after the thaw
                    await trio.testing.wait_all_tasks_blocked()
                    compiled = await reader.compile(EVERYTHING)
                    answered.append("compile")
                    assert not disk.thawed_by_timer, "the loop waited for the disk: nothing ran until the thaw"
                    assert answered == ["compile"], "the append was answered before the disk took its commit"
                    disk.thaw()
            finally:
                timer.cancel()
            assert answered == ["compile", "append"]
            assert [m.content for m in compiled.messages] == [m.content for m in before.messages]
            assert (await appender.compile(EVERYTHING)).messages[-1].content[0].text == "written while the disk is frozen"


async def test_appenders_that_arrive_during_a_commit_share_the_next_one_and_all_land(disk: Disk) -> None:
    """Appends sent while a durable commit waits for the disk queue up and land together after it
    (group commit), each caller answered with its own message, none before the disk took it (K6, K9)."""
    with trio.fail_after(THAW_S * 4):
        async with open_runtime(disk.mount_point / "store") as rt:
            managers = [await rt.open(f"w{n}", isolate=True) for n in range(20)]
            for manager in managers:
                await manager.add_message("user", "warm")
            answered: list[int] = []

            async def append(n: int) -> None:
                await managers[n].add_message("user", f"append {n}")
                answered.append(n)

            timer = disk.freeze()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(append, 0)
                    await trio.testing.wait_all_tasks_blocked()  # the first commit is out, held by the disk
                    for n in range(1, len(managers)):
                        nursery.start_soon(append, n)
                    await trio.testing.wait_all_tasks_blocked()  # they all wait on the commit's end
                    assert not disk.thawed_by_timer, "the loop waited for the disk: nothing ran until the thaw"
                    assert answered == [], "an append was answered before the disk took its commit"
                    batches = rt.store.statistics().batches
                    disk.thaw()
            finally:
                timer.cancel()
            assert sorted(answered) == list(range(len(managers)))
            assert rt.store.statistics().batches - batches == 2, "the appends that waited didn't share one commit"
            for n, manager in enumerate(managers):
                assert (await manager.compile(EVERYTHING)).messages[-1].content[0].text == f"append {n}"


async def test_closing_the_runtime_while_a_commit_waits_for_the_disk_waits_for_it(disk: Disk) -> None:
    """A caller that gives up while its commit waits for the disk leaves the commit going; closing the
    runtime waits for it, and the store reopens with the write in it (K3, K9, L3). On a disk whose
    flush measures fast the caller commits from its own task (the lone path): it leaves at its
    timeout all the same, not when the disk thaws."""
    store = disk.mount_point / "store"
    with trio.fail_after(THAW_S * 4):
        async with open_runtime(store) as rt:
            appender = await rt.open("appender", isolate=True)
            for _ in range(WARM):  # the flush's moving average settles (fast on /dev/shm)
                await appender.add_message("user", "warm")
            timer = disk.freeze()
            thaw = threading.Timer(0.5, disk.thaw)
            try:
                with trio.move_on_after(0.2) as gave_up:
                    await appender.add_message("user", "sent before the caller gave up")
                assert gave_up.cancelled_caught, "the append was answered while the disk was frozen"
                thaw.start()  # the runtime's close below waits for the commit, which waits for this
            finally:
                timer.cancel()
        thaw.join()
        assert not disk.thawed_by_timer
        async with open_runtime(store) as rt:
            appender = await rt.open("appender", isolate=True)
            texts = [m.content[0].text for m in (await appender.compile(EVERYTHING)).messages]
    assert texts == ["warm"] * WARM + ["sent before the caller gave up"]
