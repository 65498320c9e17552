"""Switches other runtimes follow (R4): ``Runtime.switch_branch`` records the switch in the store,
and a manager of another runtime on the branch moves at its next call.

Two runtimes in this process stand for two processes: on PostgreSQL each has its own engine and
connections; on LMDB the second is a read-only runtime (one writer per store). Branch "undo" forks
main after its first ``KEPT`` messages, so a compile's source ids say which branch it read.
``test_switch_processes.py`` runs the same with real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt import Budget, Runtime, open_runtime

GUARD_S = 30
KEPT, LATER = 3, 2
BUDGET = Budget(max_tokens=100_000, reserve_for_response=0)


@pytest.fixture(params=["lmdb", "postgres"])
async def runtimes(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """The runtime that switches, and another on the same store."""
    postgres = request.param == "postgres"
    store = request.getfixturevalue("pg_url") if postgres else store_path
    async with AsyncExitStack() as stack:
        rt = await stack.enter_async_context(open_runtime(store))
        yield rt, await stack.enter_async_context(open_runtime(store, readonly=not postgres))


@pytest.fixture
async def pg_runtimes(pg_url: str) -> AsyncIterator[tuple[Runtime, Runtime]]:
    async with open_runtime(pg_url) as rt, open_runtime(pg_url) as other:
        yield rt, other


async def history(rt: Runtime) -> list[str]:
    """Main's message ids; "undo" holds the first KEPT."""
    writer = await rt.open("writer")
    ids = [await writer.add_message("user", f"message {i}") for i in range(KEPT)]
    await rt.create_branch("undo", at_sequence=int(ids[-1]))
    return ids + [await writer.add_message("user", f"message {i}") for i in range(KEPT, KEPT + LATER)]


def shown(result: ctxrt.CompileResult) -> list[str]:
    return [s.id for sources in result.provenance.messages for s in sources if s.kind == "message"]


def on(result: ctxrt.CompileResult, ids: list[str]) -> str:
    """The branch the compile read, checked whole: main's every message, or undo's first KEPT."""
    assert shown(result) == (ids if result.provenance.branch == "main" else ids[:KEPT]), result.provenance.branch
    return result.provenance.branch


async def test_another_runtimes_manager_follows_the_switch_at_its_next_call(runtimes: tuple[Runtime, Runtime]) -> None:
    """R4: the other runtime's manager on main compiles undo at its first call after the switch,
    and main again after the switch back; one on another branch stays."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        follower = await other.open("follower")
        await rt.create_branch("elsewhere")
        bystander = await other.open("bystander", branch="elsewhere")
        assert on(await follower.compile(BUDGET), ids) == "main"
        await rt.switch_branch("main", "undo")
        assert on(await follower.compile(BUDGET), ids) == "undo" and follower.branch == "undo"
        await bystander.compile(BUDGET)
        assert bystander.branch == "elsewhere"
        await rt.switch_branch("undo", "main")
        assert on(await follower.compile(BUDGET), ids) == "main" and follower.branch == "main"


async def test_a_manager_that_slept_through_several_switches_lands_where_the_last_one_went(
    runtimes: tuple[Runtime, Runtime],
) -> None:
    """R4: main -> undo -> main -> undo -> side while it made no call: it follows them in order,
    ending on "side"; one that slept through a switch and its switch back ends where it was."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        await rt.create_branch("side", from_branch="undo")
        sleeper, there_and_back = await other.open("sleeper"), await other.open("there-and-back")
        await rt.switch_branch("main", "undo")
        await rt.switch_branch("undo", "main")
        assert on(await there_and_back.compile(BUDGET), ids) == "main"
        await rt.switch_branch("main", "undo")
        await rt.switch_branch("undo", "side")
        assert (await sleeper.compile(BUDGET)).provenance.branch == "side"
        assert shown(await sleeper.compile(BUDGET)) == ids[:KEPT]
        assert there_and_back.branch == "main"  # it moves at its next call, not before
        await there_and_back.message_count()
        assert there_and_back.branch == "side"


async def test_a_deleted_target_raises_branch_not_found_and_names_it(runtimes: tuple[Runtime, Runtime]) -> None:
    """R4, L5: the switch's target was deleted before the manager's next call: that call raises
    BranchNotFoundError naming both branches, every time, without looping."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        await history(rt)
        follower = await other.open("follower")
        await rt.switch_branch("main", "undo")
        await rt.delete_branch("undo")
        for _ in range(2):
            with pytest.raises(ctxrt.BranchNotFoundError, match="'main' was switched to branch 'undo'.*deleted"):
                await follower.compile(BUDGET)
        assert follower.branch == "main"


async def test_a_manager_opened_on_the_branch_after_the_switch_stays_there(runtimes: tuple[Runtime, Runtime]) -> None:
    """R4: a manager opened on main after the switch was asked for main: it stays, and follows
    only a later switch."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        await rt.switch_branch("main", "undo")
        late = await other.open("late")
        own_late = await rt.open("own-late")
        assert on(await late.compile(BUDGET), ids) == "main"
        assert on(await own_late.compile(BUDGET), ids) == "main"
        await rt.switch_branch("main", "undo")  # a second switch: both were on main before it
        assert on(await late.compile(BUDGET), ids) == "undo" and own_late.branch == "undo"


async def test_a_manager_switched_by_hand_follows_only_later_switches_of_its_new_branch(
    runtimes: tuple[Runtime, Runtime],
) -> None:
    """R4, R1: after main -> undo was recorded, a manager that moves itself onto main stays there;
    its own switch_branch never follows first."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        manager = await other.open("by-hand", branch="undo")
        await rt.switch_branch("main", "undo")
        await manager.switch_branch("main")
        assert on(await manager.compile(BUDGET), ids) == "main"


async def test_a_follow_refused_for_its_reader_raises_and_leaves_the_manager_where_it_was(
    pg_runtimes: tuple[Runtime, Runtime],
) -> None:
    """R4, C1: "shared" on undo records bob; the other runtime's manager of "shared" for ann can't
    follow: each call raises ReaderConflictError naming the switch until it moves itself."""
    rt, other = pg_runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        await (await rt.open("shared", view_reader="bob", branch="undo")).aclose()
        ann = await other.open("shared", view_reader="ann")
        await rt.switch_branch("main", "undo")
        for _ in range(2):
            with pytest.raises(ctxrt.ReaderConflictError, match="'main' was switched to branch 'undo'.*bob"):
                await ann.add_message("user", "not stored")
        assert ann.branch == "main"
        await ann.switch_branch("main")  # the way to stay: a move of its own
        assert on(await ann.compile(BUDGET), ids) == "main"


async def test_an_append_after_another_runtimes_switch_lands_on_its_target(pg_runtimes: tuple[Runtime, Runtime]) -> None:
    """R4, M1: the other runtime's manager on main whose first call after the switch is add_message
    appends on undo (its batch refused the append on main: it followed, then appended); after a
    switch away and back it stays on undo, and so do its appends."""
    rt, other = pg_runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        follower = await other.open("follower")
        await rt.switch_branch("main", "undo")
        first = await follower.add_message("user", "after the switch")
        assert follower.branch == "undo"
        await rt.switch_branch("undo", "main")
        await rt.switch_branch("main", "undo")
        later = [await follower.add_message("user", f"later {i}") for i in range(2)]
        assert follower.branch == "undo"
        assert shown(await follower.compile(BUDGET)) == [*ids[:KEPT], first, *later]



async def test_compiles_of_another_runtime_racing_switches_each_read_one_branch(
    runtimes: tuple[Runtime, Runtime],
) -> None:
    """R4: three managers of the other runtime compile without pause while this one switches main and
    undo back and forth; every compile reads one branch whole, and once the switching stops each
    compiles where the last switch went."""
    rt, other = runtimes
    with trio.fail_after(GUARD_S):
        ids = await history(rt)
        followers = [await other.open(f"follower-{i}") for i in range(3)]
        branches: set[str] = set()
        done = trio.Event()

        async def compile_loop(manager: ctxrt.ContextManager) -> None:
            while not done.is_set():
                branches.add(on(await manager.compile(BUDGET), ids))

        async with trio.open_nursery() as nursery:
            for manager in followers:
                nursery.start_soon(compile_loop, manager)
            for turn in range(9):
                await rt.switch_branch(*(("main", "undo") if turn % 2 == 0 else ("undo", "main")))
                await trio.lowlevel.checkpoint()
            done.set()
        for manager in followers:
            assert on(await manager.compile(BUDGET), ids) == "undo"
        assert branches <= {"main", "undo"}
