"""The runtime under load and under cancellation (L1, L3).

L1 runs 100 residents, each in its own namespace over the one shared slot, adding 10 messages (50
under ``make soak``) and compiling after each, concurrently, under a ``trio.fail_after(120)`` guard.

L3 cancels calls at random points: ``move_on_after(0)`` (cancelled at the first checkpoint)
and small random timeouts around concurrent batches of add_message, compile, edit_message and
fork, seeded so a failure replays. Afterwards every manager must still answer promptly; then,
once every namespace actor has carried out what the cancelled calls left in it, every slot cache
must equal a fresh load from LMDB, and a reopened runtime must compile exactly what the old one
did. "Consistent" is checked against the store, not against what the callers were told: a
cancelled call may still take effect (L4), and a cancelled edit or fork still in an actor's lane
lands after reads sent later (P13), so the comparison waits for it (``settle``).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import ctxrt
from ctxrt import Budget, Entry, Runtime, Text
from ctxrt.testing import Atomically, EditItem, RemoveItems, states
from support import hold_edits

L1_GUARD_S = 120
L1_RESIDENTS = 100


def compiled_sequences(result: ctxrt.CompileResult) -> list[int]:
    return [int(s.id) for sources in result.provenance.messages for s in sources if s.kind == "message"]


async def l1(store_path: Path, per_resident: int) -> None:
    total = L1_RESIDENTS * per_resident
    seen: list[tuple[int, int]] = []  # (length, last sequence) of every compile
    own: dict[int, list[int]] = {}
    with trio.fail_after(L1_GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            managers = [await rt.open(f"resident-{i}") for i in range(L1_RESIDENTS)]

            async def resident(index: int, manager: ctxrt.ContextManager) -> None:
                mine = own.setdefault(index, [])
                for n in range(per_resident):
                    mine.append(int(await manager.add_message("user", f"resident {index} says {n}")))
                    sequences = compiled_sequences(await manager.compile())
                    assert all(a < b for a, b in zip(sequences, sequences[1:])), "compile out of sequence order"
                    assert mine[-1] in sequences, "a compile lacks its own resident's latest message"
                    seen.append((len(sequences), sequences[-1]))

            async with trio.open_nursery() as nursery:
                for index, manager in enumerate(managers):
                    nursery.start_soon(resident, index, manager)

            everything = [m.sequence for m in await managers[0].get_all_messages()]
            assert len(everything) == total
            assert sorted(s for mine in own.values() for s in mine) == everything  # no message lost
            for manager in managers:
                assert compiled_sequences(await manager.compile()) == everything
    # Every compile was a gap-free prefix of the final slot: it held every message up to its last.
    assert len(seen) == total
    for length, last in seen:
        assert bisect_right(everything, last) == length


@pytest.mark.soak  # make soak: 50 messages each (each compile holds the whole slot, so its cost grows as the square)
async def test_a_hundred_residents_on_one_slot_lose_nothing_and_compile_in_order(
    store_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """L1: 100 residents each adding 10 messages (50 under soak) and compiling after each, concurrently,
    lose none and compile in order."""
    await l1(store_path, per_resident=soak_scale(10, 50))


# -- L3: cancellation ---------------------------------------------------------------------------


class CopyingStrategy(ctxrt.Strategy):
    """Passthrough selection that copies each message it sees into the context log (so edits propagate)."""

    name = "copying"
    marks_compression_reads = True

    def on_new_message(self, message: ctxrt.Message, ctx: ctxrt.StrategyContext) -> None:
        ctx.append_context(Entry(message.participant, message.content, (message.id,), "copy"))

    def select(self, view: ctxrt.MessageView, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


def context_copies(rt: Runtime, namespace: str, branch: str) -> dict[str, tuple[Any, ...]]:
    """source id -> content of the namespace's copy entries on ``branch``."""
    from ctxrt.testing import codec

    items = rt.engine.read_log(states.context_state(namespace), rt.engine.branch(branch).id)
    copies = {}
    for item in items:
        entry = codec.message_from_json(item.data, sequence=item.sequence, store="test")
        for source in entry.metadata["source_ids"]:
            copies[source] = entry.content
    return copies


def snapshot(rt: Runtime) -> dict[tuple[str, str], list[ctxrt.Message]]:
    """(slot, branch name) -> messages, for every slot cache the runtime holds."""
    out = {}
    for cache in rt.slots.caches():
        out[(cache.state, rt.engine.branch_by_id(cache.branch_id).name)] = list(cache.current())
    return out


def plan_round(rng: random.Random, managers: list[ctxrt.ContextManager]) -> list[tuple[ctxrt.ContextManager, str]]:
    """A round of concurrent calls, forks among them (a manager may move while its own calls run)."""
    return [(rng.choice(managers), rng.choices(["add", "compile", "edit", "fork"], [4, 3, 3, 1])[0])
            for _ in range(rng.randint(1, 6))]


async def call(rng_value: float, manager: ctxrt.ContextManager, kind: str, forks: list[int]) -> None:
    if kind == "add":
        await manager.add_message("Claude" if rng_value < 0.5 else "user", f"note {rng_value:.6f}")
    elif kind == "compile":
        tokens = 60 if rng_value < 0.3 else 400 if rng_value < 0.7 else 100_000
        await manager.compile(Budget(max_tokens=tokens, reserve_for_response=0))
    elif kind == "edit":
        messages = await manager.get_all_messages()
        if messages:
            await manager.edit_message(messages[int(rng_value * len(messages))].id, f"edited {rng_value:.6f}")
    else:
        forks[0] += 1
        await manager.fork(f"fork-{forks[0]}")


async def settle(rt: Runtime, setups: list[tuple[str, dict[str, Any]]]) -> None:
    """Wait until every live namespace actor has carried out what cancelled callers left in its lane.

    An edit, removal or fork whose caller was cancelled is still carried out (L4), after any read
    sent later (P13): a compile after the storm may be answered before it lands. An open is
    answered only after every write sent to the actor before it (L4), so one open of each live
    actor, with the options its namespace runs (no second config), settles it."""
    options = dict(setups)
    for actor in rt.statistics().namespaces:
        manager = await rt.open(actor.namespace, branch=actor.branch, **options[actor.namespace])
        await manager.aclose()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_cancelling_calls_at_random_points_leaves_the_runtime_serving_and_consistent(
    store_path: Path, seed: int
) -> None:
    """L3: cancelled add, compile, edit and fork calls leave every actor serving and the store consistent across a reopen."""
    rng = random.Random(seed)
    setups: list[tuple[str, dict[str, Any]]] = [
        ("plain", {}),
        ("plain", {}),  # a sibling on the same namespace actor
        ("windowed", {"strategy": ctxrt.WindowedPassthrough()}),
        ("copying", {"strategy": CopyingStrategy()}),
        ("isolated", {"isolate": True, "auxiliary_views": [None]}),
    ]
    forks = [0]
    cancelled = 0
    budget = Budget(max_tokens=400, reserve_for_response=0)
    with trio.fail_after(60):
        async with ctxrt.open_runtime(store_path) as rt:
            managers = [await rt.open(ns, **kwargs) for ns, kwargs in setups]
            for manager in managers:
                await manager.add_message("user", f"seed for {manager.namespace}")
            for _ in range(150):
                timeout = rng.choice([0.0, rng.uniform(0, 0.0005), rng.uniform(0, 0.002), rng.uniform(0, 0.01)])
                with trio.move_on_after(timeout) as scope:
                    async with trio.open_nursery() as nursery:
                        for manager, kind in plan_round(rng, managers):
                            if rng.random() < 0.2:
                                nursery.start_soon(cancel_at_once, call, rng.random(), manager, kind, forks)
                            else:
                                nursery.start_soon(call, rng.random(), manager, kind, forks)
                cancelled += scope.cancelled_caught
            # Still serving: every manager answers promptly, and sees its own new message.
            with trio.fail_after(5):
                for manager in managers:
                    mid = await manager.add_message("user", "after the storm")
                    assert mid in [s.id for ss in (await manager.compile()).provenance.messages for s in ss]
            await settle(rt, setups)
            # Caches agree with a fresh load from LMDB.
            live = snapshot(rt)
            async with ctxrt.open_runtime(store_path, readonly=True) as reader:
                for (state, branch), messages in live.items():
                    fresh = reader.slots.cache(state, reader.engine.branch(branch).id)
                    assert fresh.current() == messages, (state, branch)
            before = [(m.namespace, m.branch, (await m.compile(budget)).messages) for m in managers]
            branches = {b.name for b in await rt.list_branches()}
        assert cancelled > 0
        async with ctxrt.open_runtime(store_path) as rt:
            assert {b.name for b in await rt.list_branches()} == branches
            for (namespace, kwargs), (_, branch, compiled) in zip(setups, before):
                manager = await rt.open(namespace, branch=branch, **kwargs)
                assert (await manager.compile(budget)).messages == compiled, (namespace, branch)


async def cancel_at_once(function: Callable[..., Any], *args: Any) -> None:
    with trio.move_on_after(0):
        await function(*args)


async def test_an_open_is_answered_only_after_the_edits_cancelled_callers_left_in_the_lane(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L3, L4, P13: two edits whose callers were cancelled (one committing, held at the store; one
    queued behind it) still land; a compile sent meanwhile goes ahead of them, and an open of the
    namespace is answered only once both have landed (what ``settle`` relies on)."""
    def texts(result: ctxrt.CompileResult) -> list[str]:
        return [block.text for message in result.messages for block in message.content if isinstance(block, Text)]

    with trio.fail_after(20):
        manager = await runtime.open("plain")
        target = await manager.add_message("user", "note")
        gate = hold_edits(runtime, monkeypatch)
        with trio.CancelScope() as callers:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(manager.edit_message, target, "edited once")
                await gate.entered.wait()  # the first edit's commit is out, held
                nursery.start_soon(manager.edit_message, target, "edited twice")
                await trio.testing.wait_all_tasks_blocked()  # the second waits in the lane behind it
                callers.cancel()
        assert texts(await manager.compile()) == ["note"]  # the compile went ahead of both (P13)
        opened: list[ctxrt.ContextManager] = []

        async def open_plain() -> None:
            opened.append(await runtime.open("plain"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_plain)
            await trio.testing.wait_all_tasks_blocked()
            assert opened == []  # the open waits behind the edits
            gate.opened.set()
        assert texts(await opened[0].compile()) == texts(await manager.compile()) == ["edited twice"]


@pytest.mark.parametrize("command", [EditItem, RemoveItems], ids=["edit", "remove"])
async def test_a_slot_change_cancelled_after_its_commit_still_reaches_the_context_log(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, command: type
) -> None:
    """L3, M5: cancelling edit_message or remove_message just after the slot commit leaves no stale copy entry."""
    with trio.fail_after(20):
        manager = await runtime.open("copying", strategy=CopyingStrategy())
        target = await manager.add_message("user", "before")
        await manager.compile()  # hands the message to the strategy, which copies it
        assert context_copies(runtime, "copying", "main") == {target: (Text("before"),)}
        store = runtime.store
        ask = store.ask
        with trio.CancelScope() as scope:

            async def ask_then_cancel(cmd: Any) -> Any:
                result = await ask(cmd)
                inner = cmd.commands if isinstance(cmd, Atomically) else (cmd,)
                if any(isinstance(c, command) and c.state == "messages" for c in inner):
                    scope.cancel()  # the caller is cancelled the moment the slot change is committed
                return result

            monkeypatch.setattr(store, "ask", ask_then_cancel)
            if command is EditItem:
                await manager.edit_message(target, "after")
            else:
                await manager.remove_message(target)
        monkeypatch.undo()
        stored = await manager.get_message(target)
        expected = {} if stored is None else {target: stored.content}
        assert context_copies(runtime, "copying", "main") == expected


async def test_closing_a_manager_during_its_compile_raises_no_internal_error(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L3, C9: a compile whose manager closes while the strategy writes either completes or raises ManagerClosedError."""
    with trio.fail_after(20):
        manager = await runtime.open("copying", strategy=CopyingStrategy())
        await manager.add_message("user", "one")
        await manager.add_message("user", "two")  # the compile hands both to on_new_message, one write each
        store = runtime.store
        ask = store.ask
        gate, waiting = trio.Event(), trio.Event()

        async def gated(cmd: Any) -> Any:
            inner = cmd.commands if isinstance(cmd, Atomically) else (cmd,)
            if any(getattr(c, "state", None) == "copying/context" for c in inner):
                waiting.set()
                await gate.wait()
            return await ask(cmd)

        monkeypatch.setattr(store, "ask", gated)
        outcome: list[BaseException | None] = []

        async def compile_now() -> None:
            try:
                await manager.compile()
                outcome.append(None)
            except Exception as exc:  # noqa: BLE001 - the test inspects what came out
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(compile_now)
            await waiting.wait()
            nursery.start_soon(manager.aclose)  # queued behind the compile, which holds the actor's turn
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert outcome[0] is None or isinstance(outcome[0], ctxrt.ManagerClosedError), repr(outcome[0])
