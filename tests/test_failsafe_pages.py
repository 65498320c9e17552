"""A page damaged deep inside a table passes the constant-cost open checks; ``check_pages=True``
(what the CLI's read-only commands use) walks every page first, so such a store is refused with
``StoreCorruptError`` and never reaches LMDB's assertions (K7).

Each damaged store is opened by a child process, so a crash would show as its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

import ctxrt
from ctxrt.store.files import page_problems

GUARD_S = 120
PAGE = 4096
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


async def test_a_zeroed_page_anywhere_is_refused_or_read_intact_by_a_checked_open(tmp_path: Path) -> None:
    """K7: with check_pages=True, a page zeroed at any of many offsets ends the child's open with
    StoreCorruptError (or the store reads intact where the page was free); never an abort."""
    store = tmp_path / "store"
    with trio.fail_after(GUARD_S):
        await build(store)
        data = store / "data.mdb"
        pages = data.stat().st_size // PAGE
        outcomes = set()
        for page in range(2, pages, max(1, pages // 10)):
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
            if page_problems(store):
                break  # a page the store uses: the walk sees it
            data.write_bytes(original)
        else:
            raise AssertionError("no live page past the middle: the premise failed")
        result = await trio.run_process([sys.executable, "-m", "ctxrt", "inspect", str(store)], capture_stdout=True,
                                        capture_stderr=True, check=False)
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "data.mdb is damaged" in lines[0]
