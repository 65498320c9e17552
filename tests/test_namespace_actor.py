"""The namespace actor as a host drives it: cancelled callers, deleted branches, a busy store.

A request is handled whole in the actor's task, so a cancelled caller loses only its answer and
the actor's memory always agrees with the store (L4); a deleted branch retires its
actors and managers, and a later branch of the name is another branch (L5).

Determinism: real LMDB in a temp dir, the real clock under ``trio.fail_after``. Cancellation
points are swept (a sibling cancels the call after k checkpoints, for every k up to a bound)
rather than drawn at random, while background writers keep the store actor busy.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import ctxrt
from ctxrt import Autobiographical, Budget, Runtime
from ctxrt.testing import ScriptedModel, SetValue, states
from support import hold_edits, wait_until

GUARD_S = 60
BIG = Budget(max_tokens=200_000, reserve_for_response=0)
MARKER = re.compile(r"\b(?:ANN|BOB)-ONLY-\d+\b")


def block(text: str, *audience: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "audience": list(audience)} if audience else {"type": "text", "text": text}


def echo_markers(request: ctxrt.ModelRequest) -> str:
    """A summary naming every audience marker its request showed, so a leak shows."""
    text = " ".join(getattr(b, "text", "") for m in request.messages for b in m.content)
    return "SUMMARY " + " ".join(dict.fromkeys(MARKER.findall(text))) + " remembered" * 30


def memory() -> Autobiographical:
    return Autobiographical("test-model", target_chunk_tokens=200, recent_window_tokens=0, head_window_tokens=0,
                            l1_holdback_chunks=0)


def stored_record(rt: Runtime, namespace: str, branch: str = "main") -> Any:
    return rt.engine.read_value(states.reader_state(namespace), rt.engine.branch(branch).id)


@asynccontextmanager
async def busy_store(rt: Runtime) -> AsyncIterator[None]:
    """Writers on another namespace keep the store actor's mailbox from ever being idle."""
    noise = await rt.open("noise", isolate=True)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_write_forever, noise)
        yield
        nursery.cancel_scope.cancel()
    await noise.aclose()


async def _write_forever(manager: ctxrt.ContextManager) -> None:
    while True:
        await manager.add_message("user", "noise")


async def cancelled_after(checkpoints: int, call: Callable[[], Awaitable[Any]]) -> bool:
    """Run ``call``, cancelled once a sibling has passed ``checkpoints`` checkpoints (-1: cancelled as it
    begins); True if it was cut short."""
    scope = trio.CancelScope()
    if checkpoints < 0:
        scope.cancel()

    async def cancel_later() -> None:
        for _ in range(checkpoints):
            await trio.lowlevel.checkpoint()
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_later)
        with scope:
            try:
                await call()
            except ctxrt.CtxrtError:
                pass  # a refusal that won the race against the cancel is an answer too
            except BaseExceptionGroup as group:  # a host's ``except trio.Cancelled`` would miss it
                raise AssertionError(f"the cancelled call raised a group, not Cancelled: {group!r}") from group
        nursery.cancel_scope.cancel()
    return scope.cancelled_caught


# -- L4: the reproduction of a claim cancelled after its commit ----------------------------------


async def test_an_open_cancelled_after_its_claim_committed_leaves_a_claimed_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L4, C1, C8, C13: the host's move_on_after cancels open(view_reader="ann") the moment its claim
    commits; the namespace is claimed in the store and in the actor alike, so the no-reader manager
    already on it is refused and bob's open is refused."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            plain = await rt.open("ns")
            await plain.add_message("user", "hello")
            store = rt.store
            ask = store.ask
            with trio.CancelScope() as scope:

                async def ask_then_cancel(command: Any) -> Any:
                    result = await ask(command)
                    if isinstance(command, SetValue) and command.state == states.reader_state("ns"):
                        scope.cancel()  # the claim is committed; the caller goes before its answer
                    return result

                monkeypatch.setattr(store, "ask", ask_then_cancel)
                await rt.open("ns", view_reader="ann")
            monkeypatch.undo()
            assert scope.cancelled_caught
            assert stored_record(rt, "ns") == "ann"
            assert (await plain.inspect()).record == "ann"
            with pytest.raises(ctxrt.ReaderConflictError, match="records reader 'ann'"):
                await plain.compile()
            with pytest.raises(ctxrt.ReaderConflictError, match="refuses reader 'bob'"):
                await rt.open("ns", view_reader="bob")
            ann = await rt.open("ns", view_reader="ann")
            assert [m.content[0].text for m in (await ann.compile()).messages] == ["hello"]
            assert stored_record(rt, "ns") == "ann"


async def test_claims_cancelled_at_every_checkpoint_under_a_busy_store_keep_store_and_actor_agreeing(
    tmp_path: Path,
) -> None:
    """L4, C1, C8, C13: for every cancellation point of a racing pair of opens (ann's and bob's) on a
    fresh namespace, at most one reader is recorded, the actor enforces exactly what the store records,
    and the runtime keeps serving."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt, busy_store(rt):
            outcomes: set[tuple[bool, Any]] = set()
            for k in range(40):
                namespace = f"ns-{k}"
                # Half the rounds race on a running actor (the claim is the attach's first step), half
                # on none (the open that starts the actor can be cut short before it claims anything).
                early = await rt.open(namespace) if k % 2 else None
                cut: list[bool] = []

                async def race(reader: str) -> None:
                    opened: list[ctxrt.ContextManager] = []

                    async def open_it() -> None:
                        opened.append(await rt.open(namespace, view_reader=reader))

                    cut.append(await cancelled_after(k // 2, open_it))
                    for manager in opened:
                        await manager.aclose()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(race, "ann")
                    nursery.start_soon(race, "bob")
                plain = early or await rt.open(namespace)
                enforced = (await plain.inspect()).record  # answered after whatever the racers left queued
                record = stored_record(rt, namespace)
                assert enforced == record
                assert record in (None, "ann", "bob")
                outcomes.add((any(cut), record is not None))
                if record is None:
                    await plain.compile()
                else:
                    if early is not None:  # C8: a manager from before the claim is refused from the claim on
                        with pytest.raises(ctxrt.ReaderConflictError):
                            await plain.compile()
                    other = "bob" if record == "ann" else "ann"
                    with pytest.raises(ctxrt.ReaderConflictError):
                        await rt.open(namespace, view_reader=other)
                    owner = await rt.open(namespace, view_reader=record)
                    await owner.compile()
                    await owner.aclose()
                await plain.aclose()
            # The sweep reached opens cut short after a claim, and rounds where the claim was answered.
            assert {(False, True), (True, True)} <= outcomes, outcomes
            assert [s.namespace for s in rt.statistics().namespaces] == ["noise"]  # nothing leaked


async def test_racing_opens_with_one_cancelled_at_any_checkpoint_each_end_with_a_manager_or_a_refusal(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """L3, L4, C1: two to six opens of a fresh namespace for different readers race while the store is
    busy, the first cancelled after k checkpoints for every k up to 30: every other open ends, within
    a deadline, with a manager or ``ReaderConflictError``; exactly one reader is recorded, and it is
    the one whose open got a manager. (An actor started by an open cancelled as it started was left in
    that open's cancelled scope, and the other opens queued on it hung or got ManagerClosedError.)"""
    with trio.fail_after(GUARD_S * soak_scale(1, 20)):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt, busy_store(rt):
            for repeat in range(soak_scale(2, 40)):
                for openers in range(2, 7):
                    for k in range(31):
                        namespace = f"ns-{repeat}-{openers}-{k}"
                        got: dict[str, str] = {}

                        async def open_it(reader: str) -> None:
                            try:
                                manager = await rt.open(namespace, view_reader=reader)
                            except ctxrt.ReaderConflictError:
                                got[reader] = "refused"
                            else:
                                got[reader] = "manager"
                                await manager.aclose()

                        with trio.fail_after(5):  # a hung open fails the test here, naming the round
                            async with trio.open_nursery() as nursery:
                                nursery.start_soon(cancelled_after, k, lambda: open_it("r0"))
                                for i in range(1, openers):
                                    nursery.start_soon(open_it, f"r{i}")
                        assert len(got) >= openers - 1, (openers, k, got)
                        owners = [reader for reader, outcome in got.items() if outcome == "manager"]
                        record = stored_record(rt, namespace)
                        assert len(owners) == 1 and owners == [record] or not owners and record == "r0", \
                            (openers, k, got, record)
            assert [s.namespace for s in rt.statistics().namespaces] == ["noise"]  # no actor left behind


async def test_an_open_cancelled_while_its_actor_starts_claims_nothing_and_leaves_no_actor(tmp_path: Path) -> None:
    """L3, L4, C1: an open of a fresh namespace cancelled as it begins or at any checkpoint ends with a
    manager claiming for its reader, or cut short with no actor left behind: before its claim nothing
    is recorded and another reader's open gets the namespace; after it, the claim stands."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", durability="os") as rt:
            outcomes = set()
            for k in range(-1, 30):
                namespace = f"ns-{k}"
                opened: list[ctxrt.ContextManager] = []

                async def open_it() -> None:
                    opened.append(await rt.open(namespace, view_reader="ann"))  # noqa: B023 - called in this round

                cut = await cancelled_after(k, open_it)
                await trio.testing.wait_all_tasks_blocked()
                actors = [s.namespace for s in rt.statistics().namespaces]
                if opened:
                    assert stored_record(rt, namespace) == "ann" and actors == [namespace]
                    await opened[0].aclose()
                    outcomes.add("manager")
                else:  # cut short: no actor left, and a claim that committed stands (L4)
                    record = stored_record(rt, namespace)
                    assert cut and actors == [] and record in (None, "ann"), (k, actors, record)
                    outcomes.add(f"cut, record {record}")
                    if record is None:
                        bob = await rt.open(namespace, view_reader="bob")
                        await bob.aclose()
                    else:
                        with pytest.raises(ctxrt.ReaderConflictError):
                            await rt.open(namespace, view_reader="bob")
            assert outcomes == {"manager", "cut, record None", "cut, record ann"}  # the sweep reached each


async def test_a_call_in_service_when_the_runtime_is_cancelled_is_answered_not_stranded(tmp_path: Path) -> None:
    """L3, L4: a host task outside the runtime's scope edits through a manager while the runtime's own
    scope is cancelled after k checkpoints; whatever the actor was awaiting, the edit ends with
    ``ManagerClosedError`` (or succeeds) within a deadline, never left waiting for an answer."""
    with trio.fail_after(GUARD_S):
        for k in range(0, 60, 3):
            async with trio.open_nursery() as outer:

                async def host(task_status: trio.TaskStatus[tuple[trio.CancelScope, ctxrt.ContextManager]]) -> None:
                    with trio.CancelScope() as scope:
                        async with ctxrt.open_runtime(tmp_path / f"s{k}") as rt:  # noqa: B023 - this round's
                            manager = await rt.open("ns")
                            task_status.started((scope, manager))
                            await trio.sleep_forever()

                scope, manager = await outer.start(host)
                target = await manager.add_message("user", "first")
                ended: list[str] = []

                async def edit_until_closed() -> None:
                    for i in range(1000):
                        try:
                            await manager.edit_message(target, f"edit {i}")  # noqa: B023 - this round's
                        except ctxrt.ManagerClosedError:
                            ended.append("closed")  # noqa: B023 - this round's
                            return

                outer.start_soon(edit_until_closed)
                for _ in range(k):
                    await trio.lowlevel.checkpoint()
                scope.cancel()
                with trio.fail_after(5):
                    await wait_until(lambda: bool(ended))
            assert ended == ["closed"]


# -- L4: every method, cancelled at every checkpoint ---------------------------------------------


def calls(manager: ctxrt.ContextManager, target: str, step: int) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every public method that talks to a namespace actor, ready to call once."""
    return {
        "compile": lambda: manager.compile(BIG),
        "preview_context": lambda: manager.preview_context(BIG),
        "tick": lambda: manager.tick(),
        "is_ready": lambda: manager.is_ready(),
        "wait_ready": lambda: manager.wait_ready(),
        "health": lambda: manager.health(),
        "add_message": lambda: manager.add_message("user", [block(f"ANN-ONLY-{step}", "ann"), block("x" * 400)]),
        "edit_message": lambda: manager.edit_message(target, [block(f"edited {step}"), block("y" * 300)]),
        "hold_compression": lambda: manager.hold_compression([target], timeout_s=0.05),
        "release_compression": lambda: manager.release_compression([target]),
        "search_summaries": lambda: manager.search_summaries(),
        "get_summary": lambda: manager.get_summary("L1-0"),
        "get_summaries_in_range": lambda: manager.get_summaries_in_range(),
        "set_strategy": lambda: manager.set_strategy(memory()),
        "reset_head_window": lambda: manager.reset_head_window(f"moving on {step}"),
        "fork": lambda: manager.fork(f"fork-{step}"),
        "switch_branch": lambda: manager.switch_branch("main"),
        "derive": lambda: manager.derive(branch=f"derived-{step}"),
        "remove_message": lambda: manager.remove_message(target),
    }


@pytest.mark.parametrize("method", sorted(calls(None, "", 0)))  # type: ignore[arg-type]
async def test_a_call_cancelled_at_any_checkpoint_leaves_the_actor_agreeing_with_the_store(
    tmp_path: Path, method: str
) -> None:
    """L4, L3, C1, C8, C13: each method, cancelled after k checkpoints for k = 0..24 with the store busy:
    the record in the store is the one the actor enforces, other readers stay refused, the runtime
    keeps serving ann's manager and a fresh one, and a call cut short raises ``trio.Cancelled`` itself,
    never inside an exception group."""
    model = ScriptedModel(echo_markers)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt, busy_store(rt):
            ann = await rt.open("agents", view_reader="ann", strategy=memory())
            plain_on_main = await rt.open("agents")  # compiles for the record: ann
            for i in range(12):
                await ann.add_message("user", [block(f"ANN-ONLY-{i}", "ann"), block("filler " * 40)])
            for k in range(25):
                target = await ann.add_message("user", [block("target", "ann"), block("filler " * 10)])
                await cancelled_after(k, calls(ann, target, k)[method])
                branch = ann.branch  # a fork may have moved it, before or after the cancel
                assert stored_record(rt, "agents", branch) == "ann"
                assert (await ann.inspect()).record == "ann"
                with pytest.raises(ctxrt.ReaderConflictError):
                    await rt.open("agents", view_reader="bob", branch=branch)
                if branch != "main":
                    await ann.switch_branch("main")
                await ann.compile(BIG)
            assert stored_record(rt, "agents") == "ann"
            assert (await plain_on_main.compile(BIG)).messages
            fresh = await rt.open("fresh", isolate=True)
            await fresh.add_message("user", "still served")
            assert (await fresh.compile()).messages[-1].content[0].text == "still served"


# -- L5: branches with an identity ---------------------------------------------------------------


async def test_a_deleted_branch_retires_its_managers_and_a_new_branch_of_its_name_is_another(tmp_path: Path) -> None:
    """L5, C1, C2: ann's manager on x, x deleted and made again from bob's branch: every later call of
    ann's raises BranchNotFoundError (nothing reads or writes the new x for her), her refused fork
    leaves no branch, and bob's audience-only summaries never reach anything of ann's."""
    model = ScriptedModel(echo_markers)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=model) as rt:
            await rt.create_branch("bobs")
            bob = await rt.open("agents", view_reader="bob", branch="bobs", strategy=memory())
            for i in range(20):
                await bob.add_message("user", [block(f"BOB-ONLY-{i}", "bob"), block("filler " * 40)])
            await bob.wait_ready()
            assert await bob.search_summaries(regex="BOB-ONLY")
            await rt.create_branch("x")
            ann = await rt.open("agents", view_reader="ann", branch="x", strategy=memory())
            await ann.add_message("user", [block("ANN-ONLY-1", "ann"), block("filler " * 40)])
            before = {b.name for b in await rt.list_branches()}
            await rt.delete_branch("x")
            await rt.create_branch("x", from_branch="bobs")
            retired = {
                "compile": lambda: ann.compile(BIG),
                "add_message": lambda: ann.add_message("user", "to which x?"),
                "get_all_messages": ann.get_all_messages,
                "message_count": ann.message_count,
                "set_strategy": lambda: ann.set_strategy(memory()),
                "derive": lambda: ann.derive(branch="ann-derived"),
                "fork": lambda: ann.fork("ann-fork"),
                "tick": ann.tick,
                "search_summaries": lambda: ann.search_summaries(),
                "health": ann.health,
            }
            for name, call in retired.items():
                with pytest.raises(ctxrt.BranchNotFoundError):
                    await call()
            after = {b.name for b in await rt.list_branches()}
            assert after == before, "a refused fork or derive wrote no branch"
            assert "ann-fork" not in after and "ann-derived" not in after
            await ann.aclose()
            # The new x records bob's reader, inherited from bobs: ann is refused there, not let in.
            with pytest.raises(ctxrt.ReaderConflictError):
                await rt.open("agents", view_reader="ann", branch="x")
            for request in model.requests:
                assert "ANN-ONLY" not in " ".join(getattr(b, "text", "") for m in request.messages for b in m.content)
            assert rt.statistics().namespace_actors == 1  # bob's; ann's x actor is gone


async def test_deleting_a_branch_stops_its_actors_and_drops_its_caches(tmp_path: Path) -> None:
    """L5, S1: a deleted branch's namespace actors and slot caches are gone at once, and its managers
    raise BranchNotFoundError on reads as on requests."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            keeper = await rt.open("a")
            await keeper.add_message("user", "on main")
            side = await rt.open("a")
            await side.fork("side")
            other = await rt.open("b", branch="side")
            assert rt.statistics().namespace_actors == 3 and rt.statistics().slot_caches == 2
            await rt.delete_branch("side")
            await trio.testing.wait_all_tasks_blocked()
            assert rt.statistics().namespace_actors == 1 and rt.statistics().slot_caches == 1
            for manager in (side, other):
                with pytest.raises(ctxrt.BranchNotFoundError, match="'side' was deleted"):
                    await manager.get_all_messages()
                with pytest.raises(ctxrt.BranchNotFoundError):
                    await manager.compile()
                await manager.aclose()  # never raises
            assert [m.content[0].text for m in (await keeper.compile()).messages] == ["on main"]


async def test_a_unit_out_when_its_branch_is_deleted_writes_nothing(tmp_path: Path) -> None:
    """L5, C9: a compression request waiting on its model when the branch goes: its tick raises
    BranchNotFoundError and its reply is never applied anywhere."""
    entered, release = trio.Event(), trio.Event()

    async def slow(request: ctxrt.ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "too late"

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(slow)) as rt:
            await rt.create_branch("x")
            m = await rt.open("agents", view_reader="ann", branch="x", strategy=memory())
            for i in range(10):
                await m.add_message("user", [block(f"line {i} " + "filler " * 40)])
            outcome: list[BaseException] = []

            async def tick() -> None:
                try:
                    await m.tick()
                except ctxrt.BranchNotFoundError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                await entered.wait()
                assert (await m.health()).in_flight_model_calls == 1
                await rt.delete_branch("x")
                release.set()
            assert outcome and isinstance(outcome[0], ctxrt.BranchNotFoundError)
            summaries = states.strategy_state("agents", "autobio", "summaries")
            assert not any(rt.engine.read_log(summaries, row.id) for row in rt.engine.list_branches())


@pytest.mark.parametrize("move", ["switch_branch", "fork"])
async def test_a_tick_pending_when_its_manager_moves_finishes_on_the_branch_it_was_sent_on(
    tmp_path: Path, move: str
) -> None:
    """L4, R1, T8: a manager's tick is waiting on its model when the manager moves (its last manager
    leaves main's actor): the tick isn't refused as if the manager had closed; its unit finishes on
    main, where its summary is stored, and the tick returns True; the manager then compiles on the
    branch it moved to, and main's actor stops once it owes nothing."""
    entered, release = trio.Event(), trio.Event()

    async def slow(request: ctxrt.ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "a summary " * 30

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(slow)) as rt:
            m = await rt.open("agents", view_reader="ann", strategy=memory())
            for i in range(10):
                await m.add_message("user", [block(f"line {i} " + "filler " * 40)])
            await rt.create_branch("side")
            outcome: list[bool] = []

            async def tick() -> None:
                outcome.append(await m.tick())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                await entered.wait()
                if move == "fork":
                    await m.fork("forked")
                else:
                    await m.switch_branch("side")
                assert m.branch != "main"
                release.set()
            assert outcome == [True]
            summaries = states.strategy_state("agents", "autobio", "summaries")
            assert rt.engine.read_log(summaries, rt.engine.branch("main").id)  # stored where it was sent
            assert (await m.compile(BIG)).messages
            await trio.testing.wait_all_tasks_blocked()
            assert [(s.namespace, s.branch) for s in rt.statistics().namespaces] == [("agents", m.branch)]


# -- the mailbox ------------------------------------------------------------------------------------


async def test_health_and_statistics_report_each_namespace_mailbox_and_model_calls(tmp_path: Path) -> None:
    """Issue 9 (7): Runtime.statistics() lists every namespace actor with its mailbox depth and model
    calls out; ContextManager.health() says the same of its own."""
    entered, release = trio.Event(), trio.Event()

    async def slow(request: ctxrt.ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "a memory " * 10

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(slow)) as rt:
            m = await rt.open("agents", view_reader="ann", strategy=memory())
            idle = await m.health()
            assert (idle.namespace, idle.branch, idle.reader, idle.managers) == ("agents", "main", "ann", 1)
            assert idle.mailbox_depth == 0 and idle.in_flight_model_calls == 0
            for i in range(10):
                await m.add_message("user", [block(f"line {i} " + "filler " * 40)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(m.tick)
                await entered.wait()
                (stats,) = rt.statistics().namespaces
                assert (stats.namespace, stats.branch, stats.in_flight_model_calls) == ("agents", "main", 1)
                assert (await m.health()).in_flight_model_calls == 1
                assert (await m.compile(BIG)).messages  # compiles are served while the call is out (P1)
                release.set()
            assert (await m.health()).in_flight_model_calls == 0
            assert len(await m.search_summaries()) == 1


async def test_a_read_only_runtime_retires_managers_on_a_branch_the_writer_deleted(tmp_path: Path) -> None:
    """L5: a read-only runtime hears of no deletion, so its managers ask: once the writer deletes the
    branch (and makes another of the name), each call raises BranchNotFoundError, never reading the new one."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            writer = await rt.open("a")
            await writer.add_message("user", "on main")
            await writer.fork("side")
            await writer.add_message("user", "old side")
            async with ctxrt.open_runtime(tmp_path / "s", readonly=True) as ro:
                reader = await ro.open("a", branch="side")
                assert [m.content[0].text for m in await reader.get_all_messages()] == ["on main", "old side"]
                await writer.switch_branch("main")
                await rt.delete_branch("side")
                await rt.create_branch("side")
                for call in (reader.get_all_messages, reader.compile, reader.message_count):
                    with pytest.raises(ctxrt.BranchNotFoundError, match="'side' was deleted"):
                        await call()
                fresh = await ro.open("a", branch="side")
                assert [m.content[0].text for m in await fresh.get_all_messages()] == ["on main"]


class ExplodingBackoff(ctxrt.Strategy):
    """A host strategy whose wake_at breaks its contract."""

    name = "exploding-backoff"
    marks_compression_reads = True
    auto_tick = True

    def __init__(self, wake: Any) -> None:
        self.wake = wake

    def select(self, view: Any, budget: Any, options: Any) -> list[ctxrt.Entry]:
        return [ctxrt.Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]

    def wake_at(self) -> float | None:
        if isinstance(self.wake, Exception):
            raise self.wake
        return self.wake  # type: ignore[no-any-return]


@pytest.mark.parametrize("wake", [RuntimeError("boom"), "soon", 10**400, float("nan")], ids=["raises", "a string",
                                                                                             "too big", "nan"])
async def test_a_strategy_whose_backoff_breaks_never_stops_the_runtime(tmp_path: Path, wake: Any) -> None:
    """L2, L3: a host strategy's wake_at that raises or answers nonsense is logged and ignored; the actor
    and the runtime keep serving."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            m = await rt.open("a", strategy=ExplodingBackoff(wake))
            for i in range(3):
                await m.add_message("user", f"line {i}")
            assert len((await m.compile()).messages) == 3
            assert (await m.health()).managers == 1


# -- the write lane: a compile waits for no flush it didn't ask for -------------------------------


async def test_a_compile_is_answered_while_a_siblings_edit_is_still_committing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P13, L4: a sibling manager's edit is held at the store's door; a compile of the same
    namespace sent meanwhile is answered at once, from the message as it was, and the edit is answered
    once its commit lands. (The compile waited for the edit's commit before the lane.)"""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            editor, reader = await rt.open("ns"), await rt.open("ns")
            target = await editor.add_message("user", "before")
            gate = hold_edits(rt, monkeypatch)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(editor.edit_message, target, "after")
                await gate.entered.wait()
                with trio.fail_after(5):  # before the lane: held until the gate opened, never
                    compiled = await reader.compile()
                assert [m.content[0].text for m in compiled.messages] == ["before"]
                gate.opened.set()
            assert [m.content[0].text for m in (await reader.compile()).messages] == ["after"]


# -- a refused fork leaves no branch ------------------------------------------------------------


@pytest.fixture(params=["lmdb", "postgres"])
def either_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """An LMDB store's directory, or a PostgreSQL store's URL (a database of the test cluster)."""
    return tmp_path / "s" if request.param == "lmdb" else request.getfixturevalue("pg_url")


async def test_refuses_a_fork_when_the_head_records_another_reader_and_leaves_no_branch(
    either_store: Path | str,
) -> None:
    """C2, C1: ann's manager forks while its head records bob (a raw write: no public call makes
    it): the fork is refused with ReaderConflictError naming bob, and no branch is left behind, on
    either engine. (The branch was made, then the move onto it refused.)"""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(either_store) as rt:
            ann = await rt.open("ns", view_reader="ann")
            await ann.add_message("user", "hello")
            await rt.store.ask(SetValue(state=states.reader_state("ns"), branch="main", value="bob"))
            before = [branch.name for branch in await rt.list_branches()]
            with pytest.raises(ctxrt.ReaderConflictError, match="'bob'"):
                await ann.fork("side")
            assert [branch.name for branch in await rt.list_branches()] == before == ["main"]


async def test_a_fork_cancelled_at_any_checkpoint_moves_its_manager_onto_the_branch_or_makes_none(
    either_store: Path | str,
) -> None:
    """L4, C2: a fork whose caller is cancelled after k of another task's checkpoints, for each k, is
    carried out whole (the branch made and the manager on it) or not at all (no branch, the
    manager where it was); never a branch left behind with the manager elsewhere, on either
    engine. (Cancelled between making the branch and moving, it once left the branch.)"""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(either_store) as rt:
            manager = await rt.open("ns", view_reader="ann")
            await manager.add_message("user", "hello")
            outcomes = set()
            for k in range(12):
                home = manager.branch
                with trio.CancelScope() as scope:

                    async def cancel_after(k: int = k, scope: trio.CancelScope = scope) -> None:
                        for _ in range(k):
                            await trio.lowlevel.checkpoint()
                        scope.cancel()

                    if k == 0:
                        scope.cancel()  # cancelled before it starts: nothing
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(cancel_after)
                        await manager.fork(f"cancelled-{k}")
                names = {branch.name for branch in await rt.list_branches()}
                if manager.branch == f"cancelled-{k}":
                    outcomes.add("whole")
                    assert manager.branch in names
                else:
                    outcomes.add("nothing")
                    assert manager.branch == home and f"cancelled-{k}" not in names, (k, manager.branch, names)
            assert outcomes == {"whole", "nothing"}
