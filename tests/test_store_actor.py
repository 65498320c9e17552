"""The store actor: group commit, per-caller failures, atomic groups, cancellation, past reads.

Determinism rules: every test uses a real LMDB store under ``tmp_path`` and the real clock,
with a ``trio.fail_after`` hang guard (no autojump clock: a commit takes real time, on the
store's writer thread). Concurrent callers are started in one nursery tick while the actor is
idle, so trio delivers them to the actor as one batch; where a test relies on that, it asserts
it from ``statistics()`` rather than assuming it. "Unchanged" means an identical dump of every LMDB
table plus the engine's cached branches, states and sequence.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from support import dump

from ctxrt.errors import (
    BranchExistsError,
    BranchNotFoundError,
    MalformedContentError,
    MessageNotFoundError,
    RuntimeClosedError,
    StateKindError,
    UnknownStateError,
)
from ctxrt import Runtime, open_runtime
from ctxrt.testing import (
    AppendItem,
    Atomically,
    CreateBranch,
    DeleteBranch,
    EditItem,
    ItemAppended,
    RegisterState,
    RemoveItems,
    SetValue,
    ValueSet,
    keys,
)

# -- helpers ---------------------------------------------------------------------------------




def read_items(rt: Runtime, branch: str = "main", *, state: str = "log", at: int | None = None) -> list[Any]:
    engine = rt.engine
    with engine.reader() as txn:
        return engine.log_items(txn, state, engine.branch(branch), at=at)


def read_value(rt: Runtime, branch: str = "main", *, state: str = "prefs", at: int | None = None) -> tuple[Any, int]:
    engine = rt.engine
    with engine.reader() as txn:
        return engine.get_value(txn, state, engine.branch(branch), at=at)


def append(data: bytes, *, state: str = "log", branch: str = "main") -> AppendItem:
    return AppendItem(state=state, branch=branch, data=data)


async def seed(rt: Runtime) -> list[int]:
    """A log state with three items, a value state, and a branch ``side``; returns the item sequences."""
    await rt.store.ask(RegisterState(name="log", kind="log"))
    await rt.store.ask(RegisterState(name="prefs", kind="value"))
    sequences = [(await rt.store.ask(append(data))).sequence for data in (b"one", b"two", b"three")]
    await rt.store.ask(SetValue(state="prefs", branch="main", value={"theme": "dark"}))
    await rt.create_branch("side")
    return sequences


def assert_log_consistent(rt: Runtime, branch: str = "main") -> list[Any]:
    """The head's length matches the rows, and item sequences strictly increase."""
    engine = rt.engine
    with engine.reader() as txn:
        row = engine.branch(branch)
        head = engine.log_head(txn, "log", row)
        items = engine.log_items(txn, "log", row)
    assert head.length == len(items)
    sequences = [item.sequence for item in items]
    assert sequences == sorted(set(sequences))
    return items


# -- K1, K6: concurrent appenders --------------------------------------------------------------


async def test_concurrent_appenders_lose_nothing_and_each_reads_its_own_write(runtime: Runtime) -> None:
    """100 tasks appending at once lose no item, and each reads back its own write at once (K1, K6)."""
    await runtime.store.ask(RegisterState(name="log", kind="log"))
    engine = runtime.engine
    acked: dict[int, bytes] = {}

    async def appender(task: int) -> None:
        for counter in range(10):
            payload = f"task {task} item {counter}".encode()
            result = await runtime.store.ask(append(payload))
            assert isinstance(result, ItemAppended)
            assert result.sequence not in acked
            acked[result.sequence] = payload
            with engine.reader() as txn:
                row = engine.branch("main")
                found = engine.find_index(txn, "log", row, result.sequence)
                assert found is not None
                index, _, _ = found
                item = engine.log_item(txn, "log", row, index)
            assert item is not None
            assert (item.sequence, item.data) == (result.sequence, payload)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for task in range(100):
                nursery.start_soon(appender, task)

    items = assert_log_consistent(runtime)
    assert len(items) == 1000
    assert {item.sequence: item.data for item in items} == acked


async def test_on_a_disk_whose_flush_is_fast_every_acknowledged_append_lands_alone_or_together() -> None:
    """K1, K3: on a memory filesystem a durable flush is fast, so an idle loop blocks for each commit
    instead of awaiting it through trio's I/O wait: appends one at a time and 50 at once are each
    answered with their own sequence, and all of them read back after the store is reopened."""
    memory = Path("/dev/shm")
    if not memory.is_dir():
        pytest.skip("no memory filesystem at /dev/shm")
    directory = memory / f"ctxrt-test-{random.getrandbits(48):x}"
    acked: list[int] = []
    try:
        with trio.fail_after(30):
            async with open_runtime(directory) as rt:
                await rt.store.ask(RegisterState(name="log", kind="log"))
                for counter in range(50):
                    acked.append((await rt.store.ask(append(b"alone %d" % counter))).sequence)

                async def appender(counter: int) -> None:
                    acked.append((await rt.store.ask(append(b"together %d" % counter))).sequence)

                async with trio.open_nursery() as nursery:
                    for counter in range(50):
                        nursery.start_soon(appender, counter)
            async with open_runtime(directory) as rt:
                items = assert_log_consistent(rt)
        assert sorted(acked) == [item.sequence for item in items] and len(items) == 100
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_concurrent_appenders_share_commits(runtime: Runtime) -> None:
    """Concurrent appends are group-committed: batches hold many commands (K6)."""
    await runtime.store.ask(RegisterState(name="log", kind="log"))
    before = runtime.statistics()

    async def appender(task: int) -> None:
        for counter in range(5):
            await runtime.store.ask(append(f"{task}/{counter}".encode()))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for task in range(100):
                nursery.start_soon(appender, task)

    after = runtime.statistics()
    commands = after.commands - before.commands
    batches = after.batches - before.batches
    assert commands == 500
    assert after.largest_batch > 1
    assert batches <= commands // 10, f"{commands} commands took {batches} commits"


# -- L3: cancellation ----------------------------------------------------------------------------


async def test_cancelled_caller_leaves_the_actor_serving_and_the_store_consistent(runtime: Runtime) -> None:
    """Callers cancelled before or after sending leave the actor answering and the log consistent (L3)."""
    await runtime.store.ask(RegisterState(name="log", kind="log"))
    acked: dict[int, bytes] = {}
    sent: set[bytes] = set()
    rng = random.Random(1234)

    async def appender(task: int) -> None:
        for counter in range(20):
            payload = f"{task}/{counter}".encode()
            sent.add(payload)
            # 0: cancelled before sending; tiny deadlines: often cancelled while waiting for the reply.
            with trio.move_on_after(rng.choice([0, 0, 1e-5, 1e-4, 5e-4, 1e-3, math.inf])):
                result = await runtime.store.ask(append(payload))
                acked[result.sequence] = payload

    with trio.fail_after(30):
        with trio.move_on_after(0):
            await runtime.store.ask(append(b"cancelled at once"))
        sent.add(b"cancelled at once")
        async with trio.open_nursery() as nursery:
            for task in range(20):
                nursery.start_soon(appender, task)
        # A whole group of callers cancelled part-way through.
        with trio.CancelScope() as group:
            async with trio.open_nursery() as nursery:
                for task in range(20, 40):
                    nursery.start_soon(appender, task)
                for _ in range(3):
                    await trio.sleep(0)
                group.cancel()

        # A batch of cancelled callers may still be committing (a durable commit is awaited off the
        # loop): an append after them is answered once everything sent before it has landed.
        result = await runtime.store.ask(append(b"after"))
    items = assert_log_consistent(runtime)
    stored = {item.sequence: item.data for item in items}
    assert acked.items() <= stored.items(), "an acknowledged append is missing"
    assert set(stored.values()) <= sent | {b"after"}
    assert len(set(stored.values())) == len(stored), "an append landed twice"
    assert result.sequence == max(stored)
    assert stored[result.sequence] == b"after"


async def test_callers_queued_when_the_runtime_is_cancelled_are_answered_not_stranded(store_path: Path) -> None:
    """Requests still in the mailbox when the runtime is cancelled get RuntimeClosedError, never a hang,
    each caller an error of its own: callers raising one object at once pile their tracebacks on it (L3)."""
    outcomes: list[str] = []
    errors: list[RuntimeClosedError] = []

    async def caller(rt: Runtime) -> None:
        try:
            await rt.store.ask(append(b"x"))
        except RuntimeClosedError as exc:
            outcomes.append("closed")
            errors.append(exc)
        else:
            outcomes.append("committed")

    with trio.fail_after(10):
        async with trio.open_nursery() as callers:
            with trio.CancelScope() as scope:
                async with open_runtime(store_path) as rt:
                    await rt.store.ask(RegisterState(name="log", kind="log"))
                    for _ in range(600):  # more than one batch's worth
                        callers.start_soon(caller, rt)
                    await trio.sleep(0)
                    scope.cancel()
                    await trio.sleep_forever()
    assert len(outcomes) == 600
    assert len(errors) > 1 and len({id(error) for error in errors}) == len(errors)
    async with open_runtime(store_path) as rt:
        assert len(assert_log_consistent(rt)) == outcomes.count("committed")


# -- failures go to their own caller -------------------------------------------------------------


async def test_a_bad_command_fails_only_its_own_caller_in_a_shared_batch(runtime: Runtime) -> None:
    """Bad commands sent with good ones in one batch fail alone; the good ones commit (K6)."""
    await seed(runtime)
    side_before = runtime.engine.branch("side")
    commands = {
        "good append 1": append(b"good 1"),
        "unregistered state": append(b"lost", state="ghost"),
        "good append 2": append(b"good 2"),
        "non-JSON value": SetValue(state="prefs", branch="main", value={"bad": {1, 2}}),
        "existing branch": CreateBranch(name="side"),
        "good value": SetValue(state="prefs", branch="main", value={"theme": "light"}),
        "unknown branch": append(b"lost", branch="nowhere"),
        "good branch": CreateBranch(name="twig"),
        "good append 3": append(b"good 3"),
    }
    outcomes: dict[str, tuple[bool, Any]] = {}

    async def send(label: str, command: Any) -> None:
        try:
            outcomes[label] = (True, await runtime.store.ask(command))
        except Exception as exc:  # noqa: BLE001 - the point is to see what each caller got
            outcomes[label] = (False, exc)

    before = runtime.statistics()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for label, command in commands.items():
                nursery.start_soon(send, label, command)
    after = runtime.statistics()
    assert after.batches - before.batches == 1, "the commands were meant to share one commit"
    assert after.last_batch_size == len(commands)

    failed = {label: type(value) for label, (ok, value) in outcomes.items() if not ok}
    assert failed == {
        "unregistered state": UnknownStateError,
        "non-JSON value": MalformedContentError,
        "existing branch": BranchExistsError,
        "unknown branch": BranchNotFoundError,
    }
    assert str(outcomes["unregistered state"][1]) == "state 'ghost' is not registered; register it before writing"
    assert str(outcomes["unknown branch"][1]) == "no branch named 'nowhere'"
    assert str(outcomes["existing branch"][1]) == "a branch named 'side' already exists"
    assert str(outcomes["non-JSON value"][1]).startswith("prefs: not JSON-serialisable:")

    # The good ones committed, in sequence order, and the bad ones left no trace.
    data = [item.data for item in assert_log_consistent(runtime)]
    assert data[:3] == [b"one", b"two", b"three"]
    assert sorted(data[3:]) == [b"good 1", b"good 2", b"good 3"]
    value, _ = read_value(runtime)
    assert value == {"theme": "light"}
    assert isinstance(outcomes["good value"][1], ValueSet)
    assert runtime.engine.branch("side") == side_before
    assert [info.name for info in await runtime.list_branches()] == ["main", "side", "twig"]
    assert not runtime.engine.has_state("ghost")
    good_sequences = sorted(value.sequence for label, (ok, value) in outcomes.items() if ok and "append" in label)
    assert good_sequences == [item.sequence for item in read_items(runtime)[3:]]


BAD_COMMANDS: list[tuple[str, Any, type[Exception], str]] = [
    ("append to unregistered state", append(b"x", state="ghost"), UnknownStateError,
     r"^state 'ghost' is not registered; register it before writing$"),
    ("set unregistered state", SetValue(state="ghost", branch="main", value=1), UnknownStateError,
     r"^state 'ghost' is not registered; register it before writing$"),
    ("non-JSON value", SetValue(state="prefs", branch="main", value={"when": object()}), MalformedContentError,
     r"^prefs: not JSON-serialisable: Object of type object is not JSON serializable$"),
    ("NaN value", SetValue(state="prefs", branch="main", value=[float("nan")]), MalformedContentError,
     r"^prefs: not JSON-serialisable: Out of range float values are not JSON compliant"),
    ("existing branch", CreateBranch(name="side"), BranchExistsError, r"^a branch named 'side' already exists$"),
    ("branch named main", CreateBranch(name="main"), BranchExistsError, r"^a branch named 'main' already exists$"),
    ("append to unknown branch", append(b"x", branch="nowhere"), BranchNotFoundError, r"^no branch named 'nowhere'$"),
    ("set on unknown branch", SetValue(state="prefs", branch="nowhere", value=1), BranchNotFoundError,
     r"^no branch named 'nowhere'$"),
    ("fork unknown branch", CreateBranch(name="twig", from_branch="nowhere"), BranchNotFoundError,
     r"^no branch named 'nowhere'$"),
    ("delete unknown branch", DeleteBranch(name="nowhere"), BranchNotFoundError, r"^no branch named 'nowhere'$"),
    ("delete main", DeleteBranch(name="main"), MalformedContentError, r"^name: the main branch can't be deleted$"),
    ("empty branch name", CreateBranch(name=""), MalformedContentError,
     r"^name: a branch name must be a non-empty string, not ''$"),
    ("fork before the start", CreateBranch(name="twig", at_sequence=-1), MalformedContentError,
     r"^at_sequence: must be an integer in \[0, \d+\] \(the store's sequence\), not -1$"),
    ("fork in the future", CreateBranch(name="twig", at_sequence=10**6), MalformedContentError,
     r"^at_sequence: must be an integer in \[0, \d+\] \(the store's sequence\), not 1000000$"),
    ("edit unknown item", EditItem(state="log", branch="main", item_sequence=999, data=b"x"), MessageNotFoundError,
     r"^no item 999 in 'log' on branch 'main'$"),
    ("remove unknown item", RemoveItems(state="log", branch="main", from_sequence=1, to_sequence=999),
     MessageNotFoundError, r"^no item 999 in 'log' on branch 'main'$"),
    ("remove backwards range", RemoveItems(state="log", branch="main", from_sequence=3, to_sequence=1),
     MalformedContentError, r"^from_id: 3 is after to_id 1$"),
    ("append to a value state", append(b"x", state="prefs"), StateKindError,
     r"^state 'prefs' holds a value, not an append log$"),
    ("set a log state", SetValue(state="log", branch="main", value=1), StateKindError,
     r"^state 'log' is an append log, not a value$"),
    ("re-register with another kind", RegisterState(name="prefs", kind="log"), StateKindError,
     r"^state 'prefs' is registered as 'value', not 'log'$"),
    ("unknown state kind", RegisterState(name="tree", kind="tree"), StateKindError,  # type: ignore[arg-type]
     r"^state kind must be 'log' or 'value', not 'tree'$"),
    ("empty state name", RegisterState(name="", kind="log"), MalformedContentError,
     r"^state: a state name must be a non-empty string without NUL, not ''$"),
    ("not a command", "append please", TypeError, r"^not a store command: 'append please'$"),
]


@pytest.mark.parametrize(("command", "error", "message"), [case[1:] for case in BAD_COMMANDS],
                         ids=[case[0] for case in BAD_COMMANDS])
async def test_each_bad_input_is_refused_by_name_and_changes_nothing(
    runtime: Runtime, command: Any, error: type[Exception], message: str
) -> None:
    """A refused command raises an error naming what was wrong and leaves the store unchanged (K1)."""
    await seed(runtime)
    before = dump(runtime)
    with trio.fail_after(5):
        with pytest.raises(error, match=message):
            await runtime.store.ask(command)
        with pytest.raises(error, match=message):
            await runtime.store.ask(Atomically(commands=(append(b"first"), command)))
    assert dump(runtime) == before
    # The actor still serves, and no sequence was consumed by the refusals.
    result = await runtime.store.ask(append(b"after"))
    assert result.sequence == before["last_sequence"] + 1


async def test_atomically_rolls_back_every_command_when_one_fails(runtime: Runtime) -> None:
    """An Atomically group commits all of its commands or none of them (K1)."""
    sequences = await seed(runtime)
    before = dump(runtime)
    group = (
        RegisterState(name="extra", kind="value"),
        append(b"four"),
        EditItem(state="log", branch="main", item_sequence=sequences[0], data=b"ONE"),
        RemoveItems(state="log", branch="main", from_sequence=sequences[1], to_sequence=sequences[1]),
        SetValue(state="prefs", branch="main", value={"theme": "light"}),
        CreateBranch(name="twig"),
        DeleteBranch(name="side"),
        append(b"lost", state="ghost"),
    )
    with trio.fail_after(5):
        with pytest.raises(UnknownStateError, match=r"^state 'ghost' is not registered"):
            await runtime.store.ask(Atomically(commands=group))
        assert dump(runtime) == before

        results = await runtime.store.ask(Atomically(commands=group[:-1]))
    assert len(results) == len(group) - 1
    assert [item.data for item in read_items(runtime)] == [b"ONE", b"three", b"four"]
    written = [result.sequence for result in results[1:5]]
    assert written == list(range(before["last_sequence"] + 1, before["last_sequence"] + 5))
    assert [info.name for info in await runtime.list_branches()] == ["main", "twig"]


async def test_a_branch_deleted_and_recreated_in_one_batch_is_the_new_one(runtime: Runtime) -> None:
    """Deleting a branch and creating one of the same name in one batch leaves the new branch usable."""
    await seed(runtime)
    old = runtime.engine.branch("side")
    with trio.fail_after(5):
        await runtime.store.ask(append(b"on old side", branch="side"))
        results = await runtime.store.ask(
            Atomically(commands=(DeleteBranch(name="side"), CreateBranch(name="side"), append(b"new side", branch="side")))
        )
    new = runtime.engine.branch("side")
    assert new.id != old.id and results[2].branch == new.id
    assert [item.data for item in read_items(runtime, "side")] == [b"one", b"two", b"three", b"new side"]


# -- K1: reads in the past -------------------------------------------------------------------------


async def test_reads_at_a_past_sequence_see_the_store_as_it_was(runtime: Runtime) -> None:
    """Item, slice, length and value reads with ``at`` see the state as of that sequence (K1)."""
    one, two, three = await seed(runtime)
    value_seq = read_value(runtime)[1]
    edited = (await runtime.store.ask(EditItem(state="log", branch="main", item_sequence=two, data=b"TWO"))).sequence
    removed = (await runtime.store.ask(RemoveItems(state="log", branch="main", from_sequence=one, to_sequence=one))).sequence
    changed = (await runtime.store.ask(SetValue(state="prefs", branch="main", value=[1, 2]))).sequence
    four = (await runtime.store.ask(append(b"four"))).sequence

    def view(at: int | None) -> list[bytes]:
        return [item.data for item in read_items(runtime, at=at)]

    assert view(0) == []
    assert view(one) == [b"one"]
    assert view(three) == [b"one", b"two", b"three"]
    assert view(edited) == [b"one", b"TWO", b"three"]
    assert view(removed) == view(changed) == [b"TWO", b"three"]
    assert view(None) == view(four) == [b"TWO", b"three", b"four"]

    engine = runtime.engine
    with engine.reader() as txn:
        main = engine.branch("main")
        assert engine.log_head(txn, "log", main, at=three).length == 3
        assert engine.log_head(txn, "log", main, at=removed).length == 2
        past = engine.log_item(txn, "log", main, 1, at=three)
        assert past is not None and (past.sequence, past.data) == (two, b"two")
        assert engine.log_item(txn, "log", main, -1, at=edited).data == b"three"  # type: ignore[union-attr]
        assert engine.log_item(txn, "log", main, 2, at=removed) is None
        assert engine.find_index(txn, "log", main, one, at=three) == (0, 0, engine.log_head(txn, "log", main, at=three))
        assert engine.find_index(txn, "log", main, one) is None
        assert engine.log_items(txn, "log", main, at=edited, start=1, stop=2)[0].data == b"TWO"
        assert engine.get_value(txn, "prefs", main, at=three) == (None, 0)
        assert engine.get_value(txn, "prefs", main, at=value_seq) == ({"theme": "dark"}, value_seq)
        assert engine.get_value(txn, "prefs", main, at=four) == ([1, 2], changed)
    # The branch made before the edits still sees the originals.
    assert [item.data for item in read_items(runtime, "side")] == [b"one", b"two", b"three"]


# -- durability "os" -----------------------------------------------------------------------------


async def test_os_durability_keeps_everything_after_close_and_reopen(store_path: Path) -> None:
    """A store written with durability "os" holds every write after close and reopen (K1)."""
    with trio.fail_after(20):
        async with open_runtime(store_path, durability="os") as rt:
            await seed(rt)
            async with trio.open_nursery() as nursery:
                for task in range(10):
                    nursery.start_soon(rt.store.ask, append(f"task {task}".encode()))
            await rt.store.ask(SetValue(state="prefs", branch="side", value="side value"))
            before = dump(rt)
        async with open_runtime(store_path) as rt:
            assert dump(rt) == before
            assert len(read_items(rt)) == 13
            assert read_value(rt, "side")[0] == "side value"
            result = await rt.store.ask(append(b"after"))
            assert result.sequence == before["last_sequence"] + 1
