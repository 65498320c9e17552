"""A page damaged deep inside a table passes the constant-cost open checks; ``check_pages=True``
(what the CLI's read-only commands use) walks every page first, and so does a writer's open of a
store its last writer left open, so such a store is refused with ``StoreCorruptError`` and never
reaches LMDB's assertions (K7).

Each damaged store is opened by a child process, so a crash would show as its exit status.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt.testing import files
from support import LineReader

GUARD_S = 120
PAGE = 4096
P_BRANCH, P_LEAF = 0x01, 0x02
FLAGS_AT = 10  # a page header's flags (u16, after its page number and pad)
OPEN_AND_READ = """
import sys, trio, ctxrt
async def main():
    try:
        async with ctxrt.open_runtime(sys.argv[1], readonly=True, check_pages=True) as rt:
            manager = await rt.open("a")
            await manager.compile()
        print("read")
    except ctxrt.StoreCorruptError as exc:
        print("refused", exc.path)
trio.run(main)
"""


async def build(path: Path) -> None:
    async with ctxrt.open_runtime(path, durability="os") as rt:
        manager = await rt.open("a")
        for i in range(1_500):
            await manager.add_message("user", f"message {i} " + "words " * 20)


def zero(data: Path, page: int) -> bytes:
    content = data.read_bytes()
    data.write_bytes(content[: page * PAGE] + bytes(PAGE) + content[(page + 1) * PAGE :])
    return content


def pages_by_kind(content: bytes) -> dict[int, list[int]]:
    """The pages past the two meta pages, by their header's flags (a page of overflow data, which
    has no header of its own, doesn't hold its own number and is left out)."""
    kinds: dict[int, list[int]] = {}
    for page in range(2, len(content) // PAGE):
        if content[page * PAGE : page * PAGE + 8] == page.to_bytes(8, sys.byteorder):
            kinds.setdefault(content[page * PAGE + FLAGS_AT], []).append(page)
    return kinds


def spread(pages: list[int], count: int) -> list[int]:
    """``count`` of ``pages`` spread evenly from the first to the last (all of them if fewer)."""
    if len(pages) <= count:
        return pages
    return sorted({pages[i * (len(pages) - 1) // (count - 1)] for i in range(count)})


@pytest.mark.soak  # make soak: every page
async def test_a_zeroed_page_anywhere_is_refused_or_read_intact_by_a_checked_open(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """K7: with check_pages=True, a zeroed page (leaf and branch pages, from the file's start to its
    end: three of each kind; every page under soak) ends the child's open with StoreCorruptError
    (or the store reads intact where the page was free); never an abort."""
    store = tmp_path / "store"
    with trio.fail_after(soak_scale(GUARD_S, 1200)):
        await build(store)
        data = store / "data.mdb"
        kinds = pages_by_kind(data.read_bytes())
        assert {P_LEAF, P_BRANCH} <= set(kinds), kinds.keys()
        chosen = range(2, data.stat().st_size // PAGE) if soak_scale(0, 1) else sorted(
            page for pages in kinds.values() for page in spread(pages, 3))
        outcomes = set()
        for page in chosen:
            original = zero(data, page)
            result = await trio.run_process([sys.executable, "-c", OPEN_AND_READ, str(store)], capture_stdout=True,
                                            capture_stderr=True, check=False)
            data.write_bytes(original)
            assert result.returncode == 0, (page, result.returncode, result.stderr.decode()[-300:])
            outcomes.add(result.stdout.decode().split()[0])
        assert "refused" in outcomes


async def test_the_cli_names_a_damaged_page_in_one_line_instead_of_aborting(tmp_path: Path) -> None:
    """K7: `ctxrt inspect` on a store with a zeroed leaf page: exit 1, one line on stderr naming the file."""
    store = tmp_path / "store"
    with trio.fail_after(GUARD_S):
        await build(store)
        data = store / "data.mdb"
        for page in range(data.stat().st_size // PAGE // 2, data.stat().st_size // PAGE):
            original = zero(data, page)
            if files.page_problems(store):
                break  # a page the store uses: the walk sees it
            data.write_bytes(original)
        else:
            raise AssertionError("no live page past the middle: the premise failed")
        result = await trio.run_process([sys.executable, "-m", "ctxrt", "inspect", str(store)], capture_stdout=True,
                                        capture_stderr=True, check=False)
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "data.mdb is damaged" in lines[0]


BUILD_AND_WAIT = """
import sys, trio, ctxrt
async def main():
    async with ctxrt.open_runtime(sys.argv[1], durability="os") as rt:
        manager = await rt.open("a")
        for i in range(1_500):
            await manager.add_message("user", f"message {i} " + "words " * 20)
        print("built", flush=True)
        await trio.sleep_forever()
trio.run(main)
"""
WRITE_AND_READ = """
import sys, trio, ctxrt
async def main():
    try:
        async with ctxrt.open_runtime(sys.argv[1]) as rt:
            manager = await rt.open("a")
            await manager.get_all_messages()
            await manager.compile()
            await manager.add_message("user", "one more")
        print("read")
    except ctxrt.StoreCorruptError as exc:
        print("refused", exc.path)
trio.run(main)
"""


@pytest.mark.soak  # make soak: every leaf page
async def test_a_writer_opening_a_store_left_open_refuses_a_damaged_leaf_page_instead_of_aborting(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """K7: a writer killed with the store open leaves the owner lock marked, so the next writer's
    open walks every page before LMDB reads one: a leaf page whose flags say it isn't a leaf (what
    made LMDB's IS_LEAF assertion abort a writer that read it) is refused with StoreCorruptError
    naming the data file, never an abort (6 leaves from the file's start to its end; every leaf
    under soak). A clean close clears the mark."""
    store = tmp_path / "store"
    data = store / files.DATA_NAME
    with trio.fail_after(soak_scale(GUARD_S, 1200)):
        async with trio.open_nursery() as nursery:
            writer: trio.Process = await nursery.start(partial(
                trio.run_process, [sys.executable, "-c", BUILD_AND_WAIT, str(store)], stdout=subprocess.PIPE,
                check=False))
            assert writer.stdout is not None
            assert await LineReader(writer.stdout).next_line() == "built"
            writer.kill()
        assert (store / files.OWNER_LOCK_NAME).read_text() == "open  \n"
        leaves = pages_by_kind(data.read_bytes())[P_LEAF]
        outcomes = []
        for page in leaves if soak_scale(0, 1) else spread(leaves, 6):
            copy = tmp_path / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(store, copy)
            with open(copy / files.DATA_NAME, "r+b") as file:
                file.seek(page * PAGE + FLAGS_AT)
                file.write(bytes([P_LEAF ^ 0x03]))  # a branch page's flags
            result = await trio.run_process([sys.executable, "-c", WRITE_AND_READ, str(copy)], capture_stdout=True,
                                            capture_stderr=True, check=False)
            assert result.returncode == 0, (page, result.returncode, result.stderr.decode()[-300:])
            outcome = result.stdout.decode().split()
            assert outcome in (["read"], ["refused", str(copy / files.DATA_NAME)]), (page, outcome)
            outcomes.append(outcome[0])
        assert "refused" in outcomes
        result = await trio.run_process([sys.executable, "-c", WRITE_AND_READ, str(store)], capture_stdout=True,
                                        check=False)
        assert result.stdout.decode().split() == ["read"]
    assert (store / files.OWNER_LOCK_NAME).read_text() == "closed\n"
