"""Undo across managers: ``Runtime.switch_branch`` moves every manager of a runtime at one point (R3).

Ten residents share the default slot, each in a namespace of its own. Branch "undo" forks main
after its first ``KEPT`` messages; main then gets ``LATER`` more, so a compile's source ids say
which branch it read, whole or mixed.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

import ctxrt
from ctxrt import Budget, Runtime, open_runtime

GUARD_S = 30
RESIDENTS = 10
KEPT, LATER = 3, 2


@pytest.fixture(params=["lmdb", "postgres"])
async def rt(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[Runtime]:
    store = store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")
    async with open_runtime(store) as opened:
        yield opened


@pytest.fixture
async def lmdb_rt(store_path: Path) -> AsyncIterator[Runtime]:
    async with open_runtime(store_path) as opened:
        yield opened


async def residents(rt: Runtime) -> tuple[list[ctxrt.ContextManager], list[str]]:
    """Ten managers on main, the "undo" branch at the first KEPT messages; every message id."""
    managers = [await rt.open(f"resident-{i}") for i in range(RESIDENTS)]
    ids = [await managers[0].add_message("user", f"message {i}") for i in range(KEPT)]
    await rt.create_branch("undo", at_sequence=int(ids[-1]))
    ids += [await managers[0].add_message("user", f"message {i}") for i in range(KEPT, KEPT + LATER)]
    return managers, ids


def shown(result: ctxrt.CompileResult) -> list[str]:
    return [s.id for sources in result.provenance.messages for s in sources if s.kind == "message"]


def whole(result: ctxrt.CompileResult, ids: list[str]) -> bool:
    """The compile read its provenance's branch whole: main's every message, or undo's first KEPT."""
    return shown(result) == (ids if result.provenance.branch == "main" else ids[:KEPT])


BUDGET = Budget(max_tokens=100_000, reserve_for_response=0)


async def test_switch_branch_moves_every_manager_on_the_branch_and_no_other(rt: Runtime) -> None:
    """R3: all ten move; a manager on another branch stays; each compiles the new branch."""
    with trio.fail_after(GUARD_S):
        managers, ids = await residents(rt)
        await rt.create_branch("elsewhere")
        other = await rt.open("resident-x", branch="elsewhere")
        assert await rt.switch_branch("main", "undo") == RESIDENTS
        assert {m.branch for m in managers} == {"undo"} and other.branch == "elsewhere"
        for manager in managers:
            result = await manager.compile(BUDGET)
            assert result.provenance.branch == "undo" and shown(result) == ids[:KEPT]
        assert await rt.switch_branch("undo", "main") == RESIDENTS  # and back: redo
        for manager in managers:
            assert shown(await manager.compile(BUDGET)) == ids


async def test_compiles_racing_the_switch_never_see_a_mix(lmdb_rt: Runtime) -> None:
    """R3: compiles of every manager race the switch; each reads one branch whole, and at no
    checkpoint are the runtime's managers on both branches."""
    rt = lmdb_rt
    with trio.fail_after(GUARD_S):
        managers, ids = await residents(rt)
        seen: list[set[str]] = []
        results: list[ctxrt.CompileResult] = []
        switched = trio.Event()

        async def watch() -> None:
            while not switched.is_set():
                seen.append({m.branch for m in managers})
                await trio.lowlevel.checkpoint()

        async def compile_loop(manager: ctxrt.ContextManager) -> None:
            while True:
                results.append(await manager.compile(BUDGET))
                if switched.is_set():
                    results.append(await manager.compile(BUDGET))  # one sent after the switch
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            for manager in managers:
                nursery.start_soon(compile_loop, manager)
            await trio.lowlevel.checkpoint()
            await rt.switch_branch("main", "undo")
            switched.set()
        assert all(len(branches) == 1 for branches in seen) and {"main"} in seen
        assert all(whole(result, ids) for result in results)
        assert {r.provenance.branch for r in results} == {"main", "undo"}
        assert {m.branch for m in managers} == {"undo"}


async def test_a_cancelled_switch_moves_all_or_none(lmdb_rt: Runtime) -> None:
    """R3: cancelled after each number of checkpoints, the switch leaves all ten on one branch,
    and every manager still compiles that branch whole."""
    rt = lmdb_rt
    rng = random.Random(37)
    with trio.fail_after(GUARD_S * 2):
        managers, ids = await residents(rt)
        outcomes = set()
        for steps in [*range(12), *rng.sample(range(12, 200), 8)]:
            source = managers[0].branch
            target = "undo" if source == "main" else "main"
            with trio.CancelScope() as scope:
                async def cancel_after(count: int = steps) -> None:
                    for _ in range(count):
                        await trio.lowlevel.checkpoint()
                    scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_after)
                    await rt.switch_branch(source, target)
                    nursery.cancel_scope.cancel()
            branches = {m.branch for m in managers}
            assert len(branches) == 1, (steps, branches)
            outcomes.add(branches == {target})
            for manager in managers:
                assert whole(await manager.compile(BUDGET), ids)
        assert outcomes == {True, False}  # some cancels came before the last step, some after


async def test_an_unknown_branch_is_refused_by_name_and_nothing_moves(lmdb_rt: Runtime) -> None:
    """R3: BranchNotFoundError names the branch; every manager stays."""
    managers, _ = await residents(lmdb_rt)
    with pytest.raises(ctxrt.BranchNotFoundError, match="'nowhere'"):
        await lmdb_rt.switch_branch("main", "nowhere")
    with pytest.raises(ctxrt.BranchNotFoundError, match="'gone'"):
        await lmdb_rt.switch_branch("gone", "main")
    assert {m.branch for m in managers} == {"main"}


async def test_a_manager_that_cannot_attach_there_keeps_every_manager_where_it_was(lmdb_rt: Runtime) -> None:
    """R3, C1: one manager's reader conflicts on the target branch; none moves, and the others'
    attachments there are undone (the target's actors stop)."""
    rt = lmdb_rt
    await rt.create_branch("other")
    claimed = await rt.open("shared", view_reader="bob", branch="other")
    await claimed.aclose()  # "shared" on "other" records bob
    managers, _ = await residents(rt)
    ann = await rt.open("shared", view_reader="ann")
    actors = len(rt.statistics().namespaces)
    with pytest.raises(ctxrt.ReaderConflictError, match="bob"):
        await rt.switch_branch("main", "other")
    assert {m.branch for m in [*managers, ann]} == {"main"}
    with trio.fail_after(GUARD_S):
        await trio.testing.wait_all_tasks_blocked()  # the undone attachments' actors stop
    assert len(rt.statistics().namespaces) == actors
    assert {s.branch for s in rt.statistics().namespaces} == {"main"}


async def test_switch_branch_checks_its_arguments(lmdb_rt: Runtime) -> None:
    """R3, M7: names are checked before anything moves; a switch onto the same branch moves none."""
    with pytest.raises(TypeError, match="from_branch"):
        await lmdb_rt.switch_branch(1, "main")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_branch"):
        await lmdb_rt.switch_branch("main", None)  # type: ignore[arg-type]
    await lmdb_rt.open("a")
    assert await lmdb_rt.switch_branch("main", "main") == 0


async def test_managers_with_readers_keep_them_across_the_switch(lmdb_rt: Runtime) -> None:
    """R3, C7: residents that claimed their namespaces before the fork move with their readers and
    compile for them there."""
    rt = lmdb_rt
    managers = [await rt.open(f"resident-{i}", view_reader=f"agent-{i}") for i in range(RESIDENTS)]
    first = await managers[0].add_message("user", "before the fork")
    await rt.create_branch("undo")
    await managers[0].add_message("user", "after the fork")
    assert await rt.switch_branch("main", "undo") == RESIDENTS
    for i, manager in enumerate(managers):
        assert manager.view_reader == f"agent-{i}" and manager.branch == "undo"
        result = await manager.compile(BUDGET)
        assert result.provenance.reader == f"agent-{i}" and shown(result) == [first]
