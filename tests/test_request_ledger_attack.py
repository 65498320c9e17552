"""The request ledger attacked as a host would (Q4, Q9, Q11): results relabelled or copied,
callers racing, cancelled at every schedule point, and branches deleted under a batch carrying
records (on both engines: each refuses such a batch its own way)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import Budget, RequestRecord, Text, open_runtime
from ctxrt.testing import body_digest

BUDGET = Budget(max_tokens=10_000)


@pytest.fixture
async def rt(store_path: Path) -> AsyncIterator[ctxrt.Runtime]:
    async with open_runtime(store_path, durability="os") as runtime:
        yield runtime


@pytest.fixture(params=["lmdb", "postgres"])
async def both(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[ctxrt.Runtime]:
    """A runtime on a fresh LMDB directory, or on a fresh database of the session's PostgreSQL cluster."""
    store = store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")
    async with open_runtime(store, durability="os") as runtime:
        yield runtime


async def test_a_result_relabelled_as_another_namespaces_is_refused(rt: ctxrt.Runtime) -> None:
    """Q4, Q9: this runtime knows which namespace, branch and reader each of its compiles was for:
    ann's result with its provenance relabelled as bob's (the same bodies) is refused by bob's
    ledger, naming where it was compiled, and nothing is kept."""
    ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
    bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
    await ann.add_message("user", [Text("for ann only", audience=("ann",)), Text("for all")])
    result = await ann.compile(BUDGET)
    relabelled = attrs.evolve(result, provenance=attrs.evolve(result.provenance, namespace="agents/bob", reader="bob"))
    with pytest.raises(ValueError, match="compiled for namespace 'agents/ann'"):
        await bob.record_request(relabelled, form="anthropic")
    assert await bob.requests() == []
    await ann.aclose()
    await bob.aclose()


async def test_a_deep_copy_of_this_runtimes_result_is_recorded_as_the_result(rt: ctxrt.Runtime) -> None:
    """Q9: a deep copy of a result this runtime compiled is derived from it: recorded as the
    result itself would be, its body rebuilt exactly."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "hello")
    record = await m.record_request(copy.deepcopy(await m.compile(BUDGET)), form="anthropic")
    assert await m.requests() == [record]
    assert (await m.rebuild_request(record)).matches
    await m.aclose()


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` when ``task`` is scheduled for the ``limit``-th time: each schedule point in turn."""

    def __init__(self, task: trio.lowlevel.Task, scope: trio.CancelScope, limit: int) -> None:
        self.task, self.scope, self.limit, self.steps = task, scope, limit, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.limit:
                self.scope.cancel()


@pytest.mark.parametrize("hold", [False, True])
async def test_a_turn_cancelled_at_each_schedule_point_keeps_the_ledgers_order(rt: ctxrt.Runtime, hold: bool) -> None:
    """Q11: a turn (compile, record_request, add_message, record_request, requests) cancelled at
    each of its schedule points in turn, while another manager of the namespace and one of
    another namespace record: every record acknowledged is read back once, in sequence order,
    each caller's in the order it made them, and each rebuilt exactly."""
    ann = await rt.open("agents/ann", view_reader="ann", ledger=True)
    twin = await rt.open("agents/ann", view_reader="ann")
    bob = await rt.open("agents/bob", view_reader="bob", ledger=True)
    await ann.add_message("user", "hi")
    made: dict[str, list[RequestRecord]] = {"ann": [], "twin": [], "bob": []}
    cancelled = 0
    for limit in range(1, 40):
        async def turn() -> None:
            nonlocal cancelled
            with trio.CancelScope() as scope:
                instrument = _CancelAtStep(trio.lowlevel.current_task(), scope, limit)
                trio.lowlevel.add_instrument(instrument)
                try:
                    made["ann"].append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))
                    await ann.add_message("Claude", f"reply {limit}", hold_compression=hold)
                    made["ann"].append(await ann.record_request(await ann.compile(BUDGET), form="openai_chat"))
                    await ann.requests(limit=1)
                finally:
                    trio.lowlevel.remove_instrument(instrument)
            cancelled += scope.cancelled_caught

        async def others() -> None:
            made["twin"].append(await twin.record_request(await twin.compile(BUDGET), form="anthropic"))
            await twin.add_message("user", f"twin {limit}")
            made["bob"].append(await bob.record_request(await bob.compile(BUDGET), form="anthropic"))
            await bob.add_message("user", f"bob {limit}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn)
            nursery.start_soon(others)
    assert cancelled >= 5  # the sweep reached the turn's schedule points
    for manager, callers in ((ann, ("ann", "twin")), (bob, ("bob",))):
        found = await manager.requests(limit=100_000)
        ids = [r.id for r in found]
        assert len(ids) == len(set(ids))
        assert [r.sequence for r in found] == sorted(r.sequence for r in found)
        for caller in callers:
            assert [r.id for r in made[caller]] == [i for i in ids if i in {r.id for r in made[caller]}]
        for record in found[::7]:
            assert (await manager.rebuild_request(record)).matches
    for manager in (ann, twin, bob):
        await manager.aclose()


async def test_an_append_refused_as_its_branch_is_deleted_loses_no_record_it_carried(both: ctxrt.Runtime) -> None:
    """Q11: an append whose branch is deleted while it is out is refused (BranchNotFoundError);
    the records of other namespaces it took to carry were acknowledged, so they wait for the next
    write and are read back, in order."""
    ann = await both.open("agents/ann", view_reader="ann", ledger=True)
    await ann.add_message("user", "hi")
    made: list[RequestRecord] = []
    refused = 0
    for k in range(30):
        name = (await both.create_branch(f"gone-{k}")).name
        doomed = await both.open("agents/x", branch=name)
        made.append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))

        async def append() -> None:
            nonlocal refused
            for _ in range(k % 5):  # the deletion overtakes it at one point or another
                await trio.lowlevel.checkpoint()
            try:
                await doomed.add_message("user", "on a branch being deleted")
            except ctxrt.errors.BranchNotFoundError:
                refused += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(both.delete_branch, name)
            nursery.start_soon(append)
        await doomed.aclose()
    assert refused
    assert [r.id for r in await ann.requests(limit=1_000)] == [r.id for r in made]
    assert (await ann.rebuild_request(made[-1])).matches
    await ann.aclose()


@pytest.mark.parametrize("write", ["add_message", "requests"])
async def test_a_record_of_a_branch_deleted_while_its_batch_is_out_refuses_no_other_write(
        both: ctxrt.Runtime, write: str) -> None:
    """Q11 (L5): a record waiting on a branch deleted while the batch carrying it is out (a
    message's on a live branch, or the ledger's own flush) refuses neither that write nor the
    records of other branches it carried: the write succeeds, every record of the live branch is
    read back in order."""
    ann = await both.open("agents/ann", view_reader="ann", ledger=True)
    await ann.add_message("user", "hi")
    made: list[RequestRecord] = []
    for k in range(30):
        name = (await both.create_branch(f"gone-{k}")).name
        doomed = await both.open("agents/ann", view_reader="ann", branch=name, ledger=True)
        await doomed.record_request(await doomed.compile(BUDGET), form="anthropic")
        made.append(await ann.record_request(await ann.compile(BUDGET), form="anthropic"))

        async def carry() -> None:
            for _ in range(k % 5):  # the deletion overtakes the batch at one point or another
                await trio.lowlevel.checkpoint()
            if write == "add_message":
                await ann.add_message("user", f"live {k}")
            else:
                await ann.requests(limit=1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(both.delete_branch, name)
            nursery.start_soon(carry)
        await doomed.aclose()
    assert [r.id for r in await ann.requests(limit=1_000)] == [r.id for r in made]
    assert (await ann.rebuild_request(made[-1])).matches
    await ann.aclose()


async def test_a_record_made_after_a_fork_is_refused_by_a_rebuild_on_the_fork(both: ctxrt.Runtime) -> None:
    """Q5 (R1): a branch rebuilds the records it sees (its own, its parent's up to the fork
    point); one its parent made after the fork names messages the fork doesn't hold: refused with
    ValueError naming the record's branch, not a message missing from the store."""
    main = await both.open("agents/ann", view_reader="ann", ledger=True)
    await main.add_message("user", "before the fork")
    before = await main.record_request(await main.compile(BUDGET), form="anthropic")
    fork = await both.open("agents/ann", view_reader="ann", branch=(await both.create_branch("f1")).name)
    await main.add_message("user", "on main after the fork")
    after = await main.record_request(await main.compile(BUDGET), form="anthropic")
    assert (await fork.rebuild_request(before)).matches
    with pytest.raises(ValueError, match="made on branch 'main'.*manager on 'main'"):
        await fork.rebuild_request(after)
    assert (await main.rebuild_request(after)).matches
    await main.aclose()
    await fork.aclose()


async def test_an_open_switching_the_ledger_off_cancelled_after_it_was_sent_leaves_no_record_trusted(
        store_path: Path) -> None:
    """Q2: an open with ``ledger=False`` cancelled after its attach was sent is still handled by
    the namespace's actor, which turns the ledger off: a manager that recorded before (the flag
    it read on, trusted) is refused from then on, as a manager reading the flag afresh (on a fork)
    is. The cancel comes after each of another task's schedule points in turn (durability "sync":
    the flag's commit takes a while)."""
    async with open_runtime(store_path) as rt:
        await _switch_off_cancelled(rt)


async def _switch_off_cancelled(rt: ctxrt.Runtime) -> None:
    reached = 0
    for limit in range(1, 30):
        namespace = f"agents/{limit}"
        manager = await rt.open(namespace, ledger=True)
        await manager.add_message("user", "hi")
        first = await manager.compile(BUDGET)
        await manager.record_request(first, form="anthropic")
        scope = trio.CancelScope()

        async def switch_off() -> None:
            with scope:
                await (await rt.open(namespace, ledger=False)).aclose()

        async def cancel() -> None:
            for _ in range(limit):
                await trio.lowlevel.checkpoint()
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(switch_off)
            nursery.start_soon(cancel)
        reached += scope.cancelled_caught
        with contextlib.suppress(ctxrt.LedgerOffError):  # the actor may be switching it meanwhile: either
            await manager.record_request(first, form="anthropic")
        result = await manager.compile(BUDGET)  # answered after whatever the open sent the actor
        await rt.create_branch(f"probe-{limit}")
        probe = await rt.open(namespace, branch=f"probe-{limit}")
        try:
            await probe.record_request(await probe.compile(BUDGET), form="anthropic")
            on = True
        except ctxrt.LedgerOffError:
            on = False
        try:
            await manager.record_request(result, form="anthropic")
            kept = True
        except ctxrt.LedgerOffError:
            kept = False
        assert kept == on, limit
        await probe.aclose()
        await manager.aclose()
    assert reached >= 5


class _SignalAt:
    """A SIGINT at the ``limit``-th bytecode run in the ledger's functions named ``names``, as
    trio's handler takes one: KeyboardInterrupt raised there unless the code is protected (then
    trio delivers it at the main task's next checkpoint, which would end the test's run: counted
    as ``deferred``). attack/sigint_lines.py sends real signals."""

    def __init__(self, names: set[str], limit: int) -> None:
        self.names, self.limit, self.count, self.deferred = names, limit, 0, False

    def calls(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_name in self.names and frame.f_code.co_filename.endswith("request_ledger.py"):
            frame.f_trace_opcodes = True
            return self.opcodes
        return None

    def opcodes(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            self.count += 1
            if self.count == self.limit:
                if trio.lowlevel.currently_ki_protected():
                    self.deferred = True
                else:
                    raise KeyboardInterrupt
        return self.opcodes


async def test_a_sigint_at_each_step_of_keeping_a_record_leaves_the_next_records_sound(rt: ctxrt.Runtime) -> None:
    """Q1, Q5: a SIGINT at each bytecode of the encoder's and the digest memo's bookkeeping
    (``RequestEncoder.wrote``, ``BodyDigests.digested``), one record of a turn after another, the
    KeyboardInterrupt caught: every record acknowledged reads back, rebuilds and matches (its digest
    is the rebuilt body's from scratch; a turn of one role merged into one item, and growing)."""
    m = await rt.open("agents/ann", ledger=True)
    for n in range(12):
        await m.add_message("user", f"merged {n}")
    made: list[RequestRecord] = []
    interrupted = deferred = 0
    for limit in range(1, 400):
        await m.add_message("user", f"turn {limit}")
        tracer = _SignalAt({"wrote", "digested"}, limit)
        sys.settrace(tracer.calls)
        try:
            await m.record_request(await m.compile(BUDGET), form="anthropic")
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
        deferred += tracer.deferred
        await m.add_message("user", f"after {limit}")
        made.append(await m.record_request(await m.compile(BUDGET), form="anthropic"))
        if tracer.count < limit:
            break
    assert interrupted + deferred >= 100
    found = {record.id: record for record in await m.requests(limit=1000)}
    for record in made:
        assert found[record.id] == record
        assert (await m.rebuild_request(record)).matches
    await m.aclose()


FORMS = {"anthropic": {"assistant": "Claude"}, "openai_chat": {"assistant": ["Claude"], "system": "sys"},
         "openai_responses": {"assistant": "Claude"}}


def _afresh(result: ctxrt.CompileResult, form: str) -> Any:
    """The body ``form`` makes of ``result`` from scratch: a result made by hand has a cache of its own."""
    alone = ctxrt.CompileResult(list(result.messages), list(result.system_injections), result.provenance)
    return getattr(alone, f"to_{form}")(**FORMS[form])


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_a_host_editing_and_growing_its_bodies_leaves_each_records_digest_the_body_made_afresh(
    rt: ctxrt.Runtime, form: str
) -> None:
    """Q1, P14, P15: a host that edits each body it sends as docs/api.md allows (the last item's
    last block marked, a block or key added to it, a turn appended to its list, even after the
    record) and compiles on (runs of one role merged into one item, tool calls, an injection, a
    budget that jumps, an edit of an earlier message): each record's digest is that of the body
    made from scratch, and each rebuild matches; the digest memo keeps no list the host holds."""
    m = await rt.open("agents/ann", ledger=True)
    made: list[tuple[RequestRecord, str]] = []
    first = await m.add_message("user", "the plan")
    for n in range(60):
        if n % 9 == 4:
            await m.add_message("Claude", [Text(f"calling {n}"), ctxrt.ToolUse(f"t{n}", "grep", {"q": n})])
            await m.add_message("user", [ctxrt.ToolResult(f"t{n}", f"found {n}")])
        for k in range(1 + n % 4):  # a run of one role: one merged item
            await m.add_message("user" if n % 2 else "Claude", f"turn {n}.{k} " + "word " * (n % 13))
        if n == 30:
            await m.edit_message(first, "the plan, edited")
        budget = Budget(max_tokens=1_500 if 20 <= n < 40 else 20_000, reserve_for_response=500)
        injections = [ctxrt.Injection("agents/ann", "after_user", f"note {n}")] if n % 5 == 0 else []
        result = await m.compile(budget, injections=injections)
        sent = getattr(result, f"to_{form}")(**FORMS[form])
        items = sent["messages" if "messages" in sent else "input"]
        last = items[-1]
        if isinstance(last.get("content"), list) and last["content"] and isinstance(last["content"][-1], dict):
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}
            last["content"].append({"type": "text", "text": "the host's"})
        else:
            last["host"] = True
        record = await m.record_request(result, form=form, options=FORMS[form])
        items.append({"role": "user", "content": "the host's next"})
        made.append((record, body_digest(_afresh(result, form))))
    for record, afresh in made:
        assert record.body_digest == afresh
    found = {record.id: record for record in await m.requests(limit=1000)}
    for record, _ in made[::7]:
        assert found[record.id] == record
        assert (await m.rebuild_request(record)).matches
    await m.aclose()


async def test_an_injection_joining_a_turn_the_last_body_sent_whole_leaves_the_digest_the_bodys(
        rt: ctxrt.Runtime) -> None:
    """Q1, Q5, P14: an ``after_user`` injection that joins the user turn the last body sent whole
    (that turn made again, the assistant's after it taken as it was): the record's digest is the
    digest of the body the host sent, and the rebuild matches it."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "the question")
    await m.add_message("Claude", "the answer")
    first = await m.compile(BUDGET)
    await m.record_request(first, form="anthropic", options={"assistant": "Claude"})
    second = await m.compile(BUDGET, injections=[ctxrt.Injection("notes", "after_user", "a note")])
    sent = second.to_anthropic(assistant="Claude")
    record = await m.record_request(second, form="anthropic", options={"assistant": "Claude"})
    assert record.body_digest == body_digest(sent) == body_digest(_afresh(second, "anthropic"))
    rebuilt = await m.rebuild_request(record)
    assert rebuilt.matches and rebuilt.body == sent
    await m.aclose()


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_a_message_the_host_added_to_the_results_list_is_recorded_as_sent(
        rt: ctxrt.Runtime, form: str) -> None:
    """Q1, Q5: a host that appends a message of its own to a result's list before recording it
    (the list is the host's): the record keeps that message's content (it came from no stored
    message), its digest is the body's, and the rebuild matches."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "the question")
    await m.record_request(await m.compile(BUDGET), form=form, options=FORMS[form])
    await m.add_message("Claude", "the answer")
    result = await m.compile(BUDGET)
    result.messages.append(ctxrt.CompiledMessage("user", (Text("the host's own"),)))
    sent = getattr(result, f"to_{form}")(**FORMS[form])
    record = await m.record_request(result, form=form, options=FORMS[form])
    assert record.body_digest == body_digest(sent)
    assert record.parts[-1].message is None and record.parts[-1].sources == ()
    assert (await m.rebuild_request(record)).matches
    await m.aclose()


@pytest.mark.parametrize("change", ["put back", "insert", "clear"])
async def test_a_host_changing_a_recorded_results_list_leaves_the_next_record_sound(
        rt: ctxrt.Runtime, change: str) -> None:
    """Q1, Q5: a host that changes the list of a result it recorded (its last message taken off
    before the record and put back after, a message put first, the list cleared) and records the
    next turn: that record is kept against what the last one sent, the ledger reads back, and the
    record rebuilds to the body sent."""
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    for n in range(4):
        await m.add_message("user" if n % 2 else "Claude", f"turn {n}")
    first = await m.compile(BUDGET)
    last = first.messages.pop() if change == "put back" else None
    await m.record_request(first, form="anthropic", options={"assistant": "Claude"})
    if last is not None:
        first.messages.append(last)
    elif change == "insert":
        first.messages.insert(0, first.messages[-1])
    else:
        first.messages.clear()
    await m.add_message("user", "the next turn")
    second = await m.compile(BUDGET)
    sent = second.to_anthropic(assistant="Claude")
    record = await m.record_request(second, form="anthropic", options={"assistant": "Claude"})
    assert [record] == (await m.requests())[-1:]
    rebuilt = await m.rebuild_request(record)
    assert rebuilt.matches and rebuilt.body == sent
    await m.aclose()


# A turn: who speaks next (None: no one), and the injection its compile carries (none, one of each
# position, a message injection at a depth).
_turns = st.lists(st.tuples(st.sampled_from([None, "user", "carol", "Claude"]),
                            st.sampled_from([None, "before_user", "after_user", "system", 0, 1, 2, 3])),
                  min_size=1, max_size=12)
_stores = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_turns)
async def test_records_of_turns_with_injections_each_hold_the_digest_of_the_body_sent(
        store_path: Path, turns: list[Any]) -> None:
    """Q1, Q5, P14: turns of any speakers, each compile with or without an injection (which may join
    a turn the last body sent whole, or part one): each record's digest is the body the host sent,
    and each rebuild matches it."""
    async with open_runtime(store_path / f"s{next(_stores)}", durability="os") as rt:
        await _injected_turns(rt, turns)


async def _injected_turns(rt: ctxrt.Runtime, turns: list[Any]) -> None:
    m = await rt.open("agents/ann", view_reader="ann", ledger=True)
    await m.add_message("user", "the start")
    for n, (speaker, injection) in enumerate(turns):
        if speaker is not None:
            await m.add_message(speaker, f"{speaker} {n}")
        if isinstance(injection, int):
            result = await m.compile(BUDGET, message_injections=[ctxrt.MessageInjection("note", f"m{n}", injection)])
        elif injection is not None:
            result = await m.compile(BUDGET, injections=[ctxrt.Injection("notes", injection, f"i{n % 2}")])
        else:
            result = await m.compile(BUDGET)
        sent = result.to_anthropic(assistant="Claude")
        record = await m.record_request(result, form="anthropic", options={"assistant": "Claude"})
        assert record.body_digest == body_digest(sent)
        assert (await m.rebuild_request(record)).matches
    await m.aclose()
