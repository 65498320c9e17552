"""The namespace actor's machine, driven by hand: no trio, no event loop, a real store.

``NamespaceMachine.handle(message, inputs)`` returns effects; these tests read them and play the
loop's part themselves: a ``Commit`` is applied to a real LMDB store (or a real PostgreSQL
database) with the store's own ``execute`` and published to real slot caches, and its outcome
fed back as ``Committed`` when the test chooses, so what happens while a write is out is
decided by the test, not by a scheduler. Each test cites the behaviour it checks
(docs/behaviours.md); the rules' end-to-end forms are in tests/spec/test_audience.py and
tests/test_namespace_actor.py. C4 and C12's closed manager are the manager's to refuse
(tests/test_manager.py): no command reaches the machine.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import ctxrt
from ctxrt import ModelResponse, Text, Usage
from ctxrt.testing import (
    AppendItem,
    Atomically,
    Cluster,
    CreateBranch,
    EditItem,
    Reply,
    SetValue,
    SlotRegistry,
    StoreHandle,
    close_store,
    execute,
    open_store,
    prepare_append,
    record_from_value,
    states,
)
from ctxrt.namespace.actor import EngineReads, answer_lease
from ctxrt.namespace.core import Place
from ctxrt.namespace.effects import (
    Acquire,
    Acquired,
    Answer,
    CallModel,
    CheckLease,
    Commit,
    Committed,
    Effect,
    Inputs,
    Listen,
    Publish,
    ReleaseLease,
    SetTimer,
    Stop,
    TakeLease,
)
from ctxrt.namespace.lease import Lease
from ctxrt.namespace.machine import NamespaceMachine
from ctxrt.namespace.protocol import (
    AppendAndHold,
    Attach,
    Compile,
    Derive,
    Detach,
    Edit,
    Fork,
    Hold,
    NamespaceConfig,
    QuerySummaries,
    ResetHeadWindow,
    Retire,
    SearchSummaries,
    SetStrategy,
    SlotAppended,
    Tick,
    UnitDone,
)

BIG = ctxrt.Budget(max_tokens=200_000, reserve_for_response=0)


def memory() -> ctxrt.Autobiographical:
    return ctxrt.Autobiographical("test-model", target_chunk_tokens=200, recent_window_tokens=0,
                                  head_window_tokens=0, l1_holdback_chunks=0)


def text(value: str, *audience: str) -> dict[str, Any]:
    return {"type": "text", "text": value, "audience": list(audience)} if audience else {"type": "text", "text": value}


def reply_to(request: Any) -> ModelResponse:
    return ModelResponse((Text("SUMMARY " + "remembered " * 30),), "end_turn", Usage(100, 40))


class Driven:
    """One machine, its loop played by hand. Commits wait in ``commits`` until ``commit()``."""

    def __init__(self, handle: StoreHandle, namespace: str = "ns", strategy: Any = None, *, branch: str = "main",
                 writes: bool = True) -> None:
        self.engine = handle.engine
        self.slots = SlotRegistry(self.engine, live=True)
        self.config = NamespaceConfig(namespace, "messages", (), None, strategy or ctxrt.Passthrough(), None)
        self.branch_id = self.engine.branch(branch).id
        place = Place(namespace, branch)
        self.machine = NamespaceMachine(self.config, place, self.branch_id,
                                        Lease(place, readonly=not writes),
                                        writes=writes, model_timeout_s=1.0)
        self.reads = EngineReads(self.engine)
        self.now = 0.0
        self.effects: list[Effect] = []
        self.commits: deque[Commit] = deque()
        self.calls: list[CallModel] = []
        self.listening = False
        self.timer = math.inf
        self.stopped: Stop | None = None
        self.tokens = iter(range(1, 10_000))

    def tell(self, message: Any, reply: Reply[Any] | None = None) -> list[Effect]:
        effects = self.machine.handle(message, Inputs(self.now, self.reads), reply)
        self.effects += effects
        for effect in effects:
            match effect:
                case Answer():
                    effect.reply.resolve(effect.ok, effect.value)
                case Commit():
                    self.commits.append(effect)
                case CallModel():
                    self.calls.append(effect)
                case Acquire():
                    self.tell(Acquired([self.slots.acquire(name, self.branch_id) for name in effect.slots]))
                case TakeLease() | CheckLease() | ReleaseLease():
                    answer = answer_lease(self.engine, self.branch_id, effect)
                    if not (isinstance(effect, ReleaseLease) and effect.at_stop):
                        self.tell(answer)
                case Listen():
                    self.listening = effect.every
                case SetTimer():
                    self.timer = effect.at
                case Stop():
                    self.stopped = effect
        return effects

    def ask(self, command: Any) -> Reply[Any]:
        reply: Reply[Any] = Reply()
        self.tell(command, reply)
        return reply

    def start(self, reader: str | None = None, **attach: Any) -> Reply[Any]:
        """The first attach: judged, then the namespace's states registered, its slots read."""
        return self.attach(reader, **attach)

    def attach(self, reader: str | None = None, **options: Any) -> Reply[Any]:
        reply = self.ask(Attach(next(self.tokens), reader, self.config, **options))
        self.settle()
        return reply

    def apply(self, command: Any) -> tuple[bool, Any]:
        """What the store actor does with ``command``: one transaction, then the caches hear of it."""
        [(ok, value)], operations = self.engine.apply([command], execute)
        self.slots.publish(operations)
        return ok, value

    def commit(self, refuse: BaseException | None = None) -> Commit:
        commit = self.commits.popleft()
        ok, value = (False, refuse) if refuse is not None else self.apply(commit.command)
        self.tell(Committed(commit.token, ok, value))
        return commit

    def settle(self) -> None:
        while self.commits:
            self.commit()

    def append(self, *blocks: dict[str, Any]) -> str:
        """Another manager's append, straight to the store (as ``add_message`` without a hold)."""
        data, blobs, appended = prepare_append("user", list(blocks))
        ok, operation = self.apply(AppendItem(state="messages", branch=self.branch_id, data=data, blobs=tuple(blobs),
                                              attachment=appended, flagged=appended.audience))
        assert ok
        if self.listening:
            self.tell(SlotAppended(operation.sequence))
        return str(operation.sequence)

    def fill(self, count: int = 10) -> list[str]:
        return [self.append(text(f"line {i} " + "filler " * 40)) for i in range(count)]


def value(reply: Reply[Any]) -> Any:
    assert reply.done, "not answered"
    return reply.unwrap()


def refused(reply: Reply[Any], kind: type[BaseException], match: str = "") -> BaseException:
    assert reply.done and not reply.ok, (reply.done, reply.value)
    assert isinstance(reply.value, kind) and match in str(reply.value), reply.value
    return reply.value


def texts(result: Any) -> list[str]:
    return [block.text for message in result.messages for block in message.content]


def floor_writes(commit: Commit) -> list[int]:
    commands = commit.command.commands if isinstance(commit.command, Atomically) else (commit.command,)
    return [c.value for c in commands if isinstance(c, SetValue) and c.state == states.floor_state("ns")]



# -- the write lane: what runs while a commit is out -------------------------------------------


def test_a_compile_is_answered_while_a_sibling_edit_commits_and_the_edit_after_it(handle: StoreHandle) -> None:
    """P13, D5: a compile sent while an edit's commit is out is answered at once, from the
    message as it was; the edit is answered when its commit comes back, and a second edit sent
    meanwhile is judged only then, against the message as the first left it."""
    ns = Driven(handle)
    value(ns.start())
    target = ns.append(text("before"))
    first = ns.ask(Edit(None, target, (Text("first"),), (Text("first"),), ()))
    assert len(ns.commits) == 1 and not first.done
    second = ns.ask(Edit(None, target, (Text("second"),), (Text("second"),), ()))
    compiled = ns.ask(Compile(None, BIG, (), (), False))
    assert texts(value(compiled)) == ["before"] and len(ns.commits) == 1  # the second edit waits its turn
    edit = ns.commit()
    assert value(first) is None and len(ns.commits) == 1
    assert ns.commits[0].command.commands[0].expect_version != edit.command.commands[0].expect_version
    ns.commit()
    assert value(second) is None
    assert texts(value(ns.ask(Compile(None, BIG, (), (), False)))) == ["second"]


def test_a_claim_out_holds_back_what_comes_after_it(handle: StoreHandle) -> None:
    """C8, C13: while ann's claim commits, a no-reader compile and bob's attach wait behind it, then are
    judged against the record the claim left: both refused; nothing of bob's is written (C2)."""
    ns = Driven(handle)
    value(ns.start())
    ns.append(text("hello"))
    claim = ns.ask(Attach(1, "ann", ns.config))
    assert len(ns.commits) == 1
    compiled = ns.ask(Compile(None, BIG, (), (), False))
    bob = ns.ask(Attach(2, "bob", ns.config))
    assert not compiled.done and not bob.done
    ns.commit()
    assert value(claim).reader == "ann"
    refused(compiled, ctxrt.ReaderConflictError, "records reader 'ann'")
    refused(bob, ctxrt.ReaderConflictError, "refuses reader 'bob'")
    assert not ns.commits
    assert texts(value(ns.ask(Compile("ann", BIG, (), (), False)))) == ["hello"]


def test_strategy_writes_queued_behind_a_failed_commit_are_dropped_and_the_strategy_reloaded(
    handle: StoreHandle
) -> None:
    """L4 (the actor's memory agrees with the store): two compiles' bookkeeping queue behind an edit;
    the first fails, so the strategy is reloaded from the store and the second, made from the memory
    it dropped, is never committed alone; both compiles are still answered (P1)."""
    strategy = Bookkeeping()
    ns = Driven(handle, strategy=strategy)
    value(ns.start())
    target = ns.append(text("x"))
    edit = ns.ask(Edit(None, target, (Text("y"),), (Text("y"),), ()))
    first = ns.ask(Compile(None, BIG, (), (), False))
    second = ns.ask(Compile(None, BIG, (), (), False))
    assert not first.done and not second.done and len(ns.commits) == 1
    ns.commit()
    assert value(edit) is None
    starts = strategy.starts
    ns.commit(refuse=ctxrt.StoreFullError("disk", "full"))
    assert strategy.starts == starts + 1  # reloaded from what is stored
    assert not ns.commits  # the second compile's write went with the memory it came from
    assert texts(value(first)) == ["x"] and texts(value(second)) == ["x"]
    assert ns.engine.read_value(states.strategy_state("ns", "bookkeeping", "count"), ns.branch_id) is None


def test_a_copy_made_while_an_edit_commits_gets_the_edit_before_the_edit_is_answered(handle: StoreHandle) -> None:
    """M5: a strategy copies each new message into the context log; a compile served while an edit of a
    message it had not seen commits copies it as it was (and is answered once its copy is stored).
    The edit carries itself to that copy once the copy is stored, and only then answers."""
    ns = Driven(handle, strategy=Copying())
    value(ns.start())
    target = ns.append(text("old"))
    edit = ns.ask(Edit(None, target, (Text("new"),), (Text("new"),), ()))
    compiled = ns.ask(Compile(None, BIG, (), (), False))  # served while the edit is out; its copy queues
    assert len(ns.commits) == 1
    ns.commit()
    assert not edit.done
    ns.settle()
    assert value(edit) is None and texts(value(compiled)) == ["old"]
    copies = ns.engine.read_log(states.context_state("ns"), ns.branch_id)
    assert [json.loads(item.data)["content"][0]["text"] for item in copies] == ["new"]


# -- units: the floor before the request, epochs -----------------------------------------------


def test_the_floor_covers_a_unit_before_its_request_exists(handle: StoreHandle) -> None:
    """D2, D4: a tick's first commit raises the narrowing floor to what the unit reads; no model call
    goes out until it has committed, and none at all when it fails (the tick gets the error)."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    ns.fill()
    tick = ns.ask(Tick("ann"))
    assert len(ns.commits) == 1 and not ns.calls
    [floor] = floor_writes(ns.commits[0])
    ns.commit(refuse=ctxrt.StoreFullError("disk", "full"))
    refused(tick, ctxrt.StoreFullError)
    assert not ns.calls
    tick = ns.ask(Tick("ann"))
    assert floor_writes(ns.commits[0]) == [floor]
    ns.commit()
    [call] = ns.calls
    assert call.unit.reaches <= floor and ns.machine.floor == floor
    assert ns.engine.read_value(states.floor_state("ns"), ns.branch_id) == floor
    ns.tell(UnitDone(call.epoch, call.unit, reply_to(call.request)))
    ns.settle()
    assert value(tick) is True
    assert value(ns.ask(QuerySummaries("ann", SearchSummaries(None, None, None, 50, False))))


def test_a_manager_with_no_reader_raises_no_floor(handle: StoreHandle) -> None:
    """D7: a unit of a namespace that records no reader commits no floor."""
    ns = Driven(handle, strategy=memory())
    value(ns.start())
    ns.fill()
    ns.ask(Tick(None))
    assert floor_writes(ns.commits[0]) == []


def test_a_reply_for_an_older_view_is_discarded(handle: StoreHandle) -> None:
    """C9, C14: a unit out when the strategy is replaced (a new view epoch) comes back to nothing: no
    commit, its tick answered False; the namespace goes on."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    ns.fill()
    tick = ns.ask(Tick("ann"))
    ns.settle()
    [call] = ns.calls
    value(ns.ask(SetStrategy("ann", memory())))
    ns.settle()
    ns.tell(UnitDone(call.epoch, call.unit, reply_to(call.request)))
    assert not ns.commits and value(tick) is False
    assert value(ns.ask(QuerySummaries("ann", SearchSummaries(None, None, None, 50, False)))) == []


def test_a_unit_begun_before_a_claim_writes_nothing(handle: StoreHandle) -> None:
    """C9: a unit planned for the unclaimed view is out when ann claims: its reply is discarded."""
    ns = Driven(handle, strategy=memory())
    value(ns.start())
    ns.fill()
    tick = ns.ask(Tick(None))
    ns.settle()
    [call] = ns.calls
    value(ns.attach("ann"))
    ns.tell(UnitDone(call.epoch, call.unit, reply_to(call.request)))
    assert not ns.commits and value(tick) is False


def test_a_transition_summary_is_stored_for_the_reader(handle: StoreHandle) -> None:
    """D8, D2: reset_head_window without text raises the floor, then calls the model; the summary is
    appended for the reader alone. With text, the text is stored as given, with no model call."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    ns.fill(4)
    reset = ns.ask(ResetHeadWindow("ann", None))
    assert floor_writes(ns.commits[0]) and not ns.calls
    ns.settle()
    [call] = ns.calls
    ns.tell(UnitDone(call.epoch, call.unit, reply_to(call.request)))
    append = ns.commits[0].command
    assert isinstance(append, AppendItem) and json.loads(append.data)["content"][0]["audience"] == ["ann"]
    ns.settle()
    message_id = value(reset)
    given = ns.ask(ResetHeadWindow("ann", "moving on"))
    assert isinstance(ns.commits[0].command, AppendItem) and len(ns.calls) == 1
    ns.settle()
    assert value(given) != message_id


# -- claims and the read-time check ----------------------------------------------------------


def test_claims_and_the_read_time_check(handle: StoreHandle) -> None:
    """C1, C6, C7, C8, C10, D6: the first reader is recorded; a manager for no reader then compiles for
    it, one that insists on no reader is refused, another reader is refused everywhere (attach,
    compile, summaries, set_strategy, fork, derive), and so is a strategy that doesn't mark reads."""
    ns = Driven(handle, strategy=memory())
    assert value(ns.start("ann")).reader == "ann"
    assert value(ns.attach(None)).reader == "ann"  # C6
    refused(ns.attach(None, compiles_for_none=True), ctxrt.ReaderConflictError)  # C7
    refused(ns.attach("bob"), ctxrt.ReaderConflictError, "refuses reader 'bob'")  # C1
    for command in (Compile("bob", BIG, (), (), False), QuerySummaries("bob", SearchSummaries(None, None, None, 5, False)),
                    SetStrategy("bob", memory()), Fork("bob", "f"), Derive("bob", "d", None, None),
                    Compile(None, BIG, (), (), False)):
        refused(ns.ask(command), ctxrt.ReaderConflictError)  # C8, C10
    refused(ns.ask(SetStrategy("ann", Unmarking())), ctxrt.StrategyRefusedError, "marks_compression_reads")  # D6
    assert not ns.commits  # nothing refused wrote anything (C2)


def test_a_corrupt_record_refuses_branching_and_strategy_changes(handle: StoreHandle) -> None:
    """C3: a record that isn't a reader's name refuses attach, fork, derive and set_strategy, saying so;
    a first attach refused leaves an actor that stops at once, having written nothing (C2)."""
    ns = Driven(handle)
    value(ns.start())
    ns.apply(SetValue(state=states.reader_state("ns"), branch=ns.branch_id, value=42))
    ns.machine.record = record_from_value(42)  # as a shared store's actor adopts another process's write
    refused(ns.attach("ann"), ctxrt.ReaderConflictError, "not a reader's name")
    for command in (Fork(None, "f"), Derive(None, "d", None, None), SetStrategy(None, ctxrt.Passthrough())):
        refused(ns.ask(command), ctxrt.ReaderConflictError, "not a reader's name")
    assert not ns.commits
    fresh = Driven(handle)
    refused(fresh.attach("ann"), ctxrt.ReaderConflictError, "not a reader's name")
    assert not fresh.commits and fresh.stopped is not None


def test_a_claim_stands_when_the_strategy_then_fails_to_start(handle: StoreHandle) -> None:
    """C5, C12: the strategy raises as it starts: the claim is recorded and answered; compiles and
    derives are then refused with StrategyRefusedError, writing nothing."""
    ns = Driven(handle, strategy=Broken())
    assert value(ns.start("ann")).reader == "ann"
    assert ns.engine.read_value(states.reader_state("ns"), ns.branch_id) == "ann"
    refused(ns.ask(Compile("ann", BIG, (), (), False)), ctxrt.StrategyRefusedError, "failed to start")
    refused(ns.ask(Derive("ann", "d", None, None)), ctxrt.StrategyRefusedError)
    assert not ns.commits


def test_derive_records_the_parents_reader_on_the_child(handle: StoreHandle) -> None:
    """C11: a derive writes the branch and the child's record in one commit, the head's record for a
    no-reader manager."""
    ns = Driven(handle)
    value(ns.start("ann"))
    derive = ns.ask(Derive(None, "child", None, None))
    [commit] = ns.commits
    create, record = commit.command.commands
    assert isinstance(create, CreateBranch) and record.value == "ann"
    ns.settle()
    assert value(derive)[1] == "ann"


# -- narrowing ---------------------------------------------------------------------------------


def test_narrowing_verdicts(handle: StoreHandle) -> None:
    """D1, D3, D5: hiding a block from the own reader is refused at or below the floor and goes through
    above it; hiding one from other readers is refused wherever it is; deleting a block and widening go
    through. Nothing refused is written."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    early = ns.append(text("mine " + "filler " * 40, "ann"), text("shared"))
    ns.fill()
    ns.ask(Tick("ann"))
    ns.commit()  # the floor, before the unit's request
    floor = ns.machine.floor
    late = ns.append(text("mine", "ann"), text("shared"))
    assert int(early) <= floor < int(late)

    def edit(message_id: str, *blocks: Text) -> Reply[Any]:
        return ns.ask(Edit("ann", message_id, blocks, blocks, ()))

    refused(edit(early, Text("mine", audience=("bob",)), Text("shared")), ctxrt.NarrowingRefusedError,
            "narrowing floor")  # D3
    refused(edit(late, Text("mine", audience=("ann",)), Text("shared", audience=("ann",))),
            ctxrt.NarrowingRefusedError, "readers it doesn't name")  # D5
    assert not ns.commits
    for blocks in ((Text("mine", audience=("bob",)), Text("shared")),  # D3: above the floor
                   (Text("shared"),),  # D1: a deletion
                   (Text("shared"), Text("more"))):  # a widening
        reply = edit(late, *blocks)
        ns.commit()
        assert value(reply) is None
    widened = edit(early, Text("mine"), Text("shared"))  # widening at or below the floor too
    ns.commit()
    assert value(widened) is None


def test_an_edit_another_edit_overtook_is_judged_again(handle: StoreHandle) -> None:
    """D5: the store refuses an edit written onto a version another edit replaced
    (ValueConflictError): the machine judges it again against the message as it is, and writes it."""
    ns = Driven(handle)
    value(ns.start())
    target = ns.append(text("x"))
    edit = ns.ask(Edit(None, target, (Text("mine"),), (Text("mine"),), ()))
    ns.apply(EditItem(state="messages", branch=ns.branch_id, item_sequence=int(target), data=prepare_append(
        "user", "theirs")[0]))  # another namespace's edit lands first
    ns.commit()  # refused by the store: written onto the old version
    assert not edit.done and len(ns.commits) == 1
    ns.commit()
    assert value(edit) is None
    assert texts(value(ns.ask(Compile(None, BIG, (), (), False)))) == ["mine"]


# -- holds -------------------------------------------------------------------------------------


def test_a_message_held_as_it_is_appended_is_never_planned_while_it_commits(handle: StoreHandle) -> None:
    """T5: an append with a hold holds from before its commit: a unit planned while it is out reads
    nothing from it on; once written, the hold names its message, and lapses at its timeout."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    ns.fill(3)
    data, blobs, appended = prepare_append("user", "held " + "filler " * 40)
    held = ns.ask(AppendAndHold(AppendItem(state="messages", branch=ns.branch_id, data=data, attachment=appended),
                                5.0))
    assert ns.machine.holds.floor() == ns.engine.last_sequence + 1
    ns.commit()
    sequence = value(held).sequence
    assert ns.machine.holds.floor() == sequence and ns.timer == 5.0
    ns.now = 6.0
    ns.tell(ctxrt.namespace.effects.TimerFired())
    assert ns.machine.holds.floor() is None
    value(ns.ask(Hold((str(sequence),), None)))
    assert ns.machine.holds.floor() == sequence


def test_a_draining_strategy_listens_to_its_slot_and_plans_on_an_append(handle: StoreHandle) -> None:
    """An auto-ticking strategy asks to hear of every append; an append then starts the drain."""
    strategy = ctxrt.Autobiographical("m", auto_tick=True, target_chunk_tokens=200, recent_window_tokens=0,
                                      head_window_tokens=0, l1_holdback_chunks=0)
    ns = Driven(handle, strategy=strategy)
    value(ns.start("ann"))
    assert ns.listening
    ns.fill()
    assert ns.commits and floor_writes(ns.commits[0])  # the drain planned a unit: its floor first


# -- stopping: every caller answered, whatever was out -----------------------------------------


def test_a_stop_at_any_point_answers_every_caller_and_writes_no_more(handle: StoreHandle) -> None:
    """L3, L4: a scripted run (claim, ticks, edits, compiles) stopped after each of its steps: every
    request sent is answered by the Stop (the one whose commit is out included), the Stop is the last
    effect, and nothing more is sent to the store or the model."""
    for cut in range(12):
        ns = Driven(handle, namespace=f"ns{cut}", strategy=memory())
        replies: list[Reply[Any]] = []
        steps: list[Callable[[], Any]] = [
            lambda: replies.append(ns.ask(Attach(1, "ann", ns.config))),
            lambda: ns.settle(),
            lambda: ns.fill(6),
            lambda: replies.append(ns.ask(Tick("ann"))),
            lambda: replies.append(ns.ask(Compile("ann", BIG, (), (), False))),
            lambda: ns.commit() if ns.commits else None,
            lambda: ns.commit() if ns.commits else None,
            lambda: replies.append(ns.ask(Edit("ann", "1", (Text("e"),), (Text("e"),), ()))),
            lambda: replies.append(ns.ask(Tick("ann"))),
            lambda: ns.commit() if ns.commits else None,
            lambda: [ns.tell(UnitDone(c.epoch, c.unit, reply_to(c.request))) for c in ns.calls[-1:]],
            lambda: replies.append(ns.ask(Detach(1))),
        ]
        for step in steps[:cut]:
            step()
        out = len(ns.commits)
        effects = ns.tell(Retire(lambda: ctxrt.BranchNotFoundError("gone")))
        assert isinstance(effects[-1], Stop) and ns.stopped is not None
        assert all(reply.done for reply in replies), cut
        assert len(ns.commits) == out
        late = ns.ask(Compile("ann", BIG, (), (), False))
        refused(late, ctxrt.BranchNotFoundError)
        assert not [e for e in ns.tell(Committed(99, True, None)) if not isinstance(e, Answer)]


def test_the_last_manager_leaving_stops_the_actor_once_it_owes_nothing(handle: StoreHandle) -> None:
    """L4: a detach while a manager's edit commits stops the machine only when the edit is answered."""
    ns = Driven(handle)
    value(ns.start())
    target = ns.append(text("x"))
    edit = ns.ask(Edit(None, target, (Text("y"),), (Text("y"),), ()))
    value(ns.ask(Detach(1)))
    assert ns.stopped is None
    ns.commit()
    assert value(edit) is None and ns.stopped is not None
    assert isinstance(ns.stopped.error(), ctxrt.namespace.protocol.ActorRetired)


def test_status_is_published_as_a_frozen_snapshot(handle: StoreHandle) -> None:
    """What managers read outside the mailbox (the slot, the strategy config, model calls out, the last
    compile's stats) comes as a new frozen snapshot when it changes, never as a changed field."""
    ns = Driven(handle, strategy=memory())
    value(ns.start("ann"))
    ns.fill()
    ns.ask(Tick("ann"))
    ns.settle()
    snapshots = [e.status for e in ns.effects if isinstance(e, Publish)]
    assert snapshots[-1].model_calls == 1 and snapshots[-1].slot is not None
    with pytest.raises(AttributeError):
        snapshots[-1].model_calls = 0  # type: ignore[misc]


# -- the lease (PostgreSQL) --------------------------------------------------------------------


def test_a_lease_taken_over_refuses_the_next_strategy_write_and_stops_the_machine_without_writing(pg_url: str) -> None:
    """K4, K12: a remembering namespace's lease lapsed and another process took it over (its fencing
    token raised) while this process still counts it held: the next strategy write goes out and the
    store's fencing check refuses it, writing nothing; its caller and every other get
    ConfigConflictError, and the machine stops."""
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        ns = Driven(first, strategy=memory())
        value(ns.start("ann"))
        ids = ns.fill(3)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE ctxrt_leases SET expires = now() - interval '1 second'")  # its holder cut off
            written = conn.execute("SELECT (SELECT count(*) FROM ctxrt_values) + (SELECT count(*) FROM ctxrt_items)").fetchone()
        assert second.engine.hold(ns.branch_id, states.context_state("ns"))
        pin = ns.ask(ctxrt.namespace.protocol.PinRange("ann", ids[0], ids[1], None, None))
        ns.commit()
        refused(pin, ctxrt.ConfigConflictError, "lost its lease")
        assert not ns.commits and ns.stopped is not None
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT (SELECT count(*) FROM ctxrt_values) + (SELECT count(*) FROM ctxrt_items)").fetchone() == written
    finally:
        close_store(second)
        close_store(first)


def test_a_store_gone_when_the_lease_is_looked_at_fails_that_write_and_the_machine_goes_on(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """L10, C5: the server goes down while a remembering namespace's pin write waits behind an edit; when
    its turn comes the machine looks at its lease: the write fails as its commit would (StoreUnavailableError to its
    caller, the strategy waiting for the store, health saying so); nothing escapes the machine, and
    once the server is back the next call starts the strategy again. (The lease's look raised out of
    the machine, and its actor died.)"""
    handle = open_store(pg_url)
    try:
        ns = Driven(handle, strategy=memory())
        value(ns.start("ann"))
        ids = ns.fill(3)
        edit = ns.ask(Edit("ann", ids[2], (Text("edited"),), (Text("edited"),), ()))
        pin = ns.ask(ctxrt.namespace.protocol.PinRange("ann", ids[0], ids[1], None, None))  # queued behind it
        with pg_cluster.down():
            ns.commit(refuse=ctxrt.StoreUnavailableError(pg_url, "the server is down"))  # as the store answers
            refused(edit, ctxrt.StoreUnavailableError)
            refused(pin, ctxrt.StoreUnavailableError)
            assert ns.stopped is None and not ns.commits
            waiting = value(ns.ask(ctxrt.namespace.protocol.ReportHealth())).waiting_for
            assert waiting is not None and waiting.startswith("the store: ")
        pin = ns.ask(ctxrt.namespace.protocol.PinRange("ann", ids[0], ids[1], None, None))
        ns.settle()
        assert value(pin).first_id == ids[0]
        assert value(ns.ask(ctxrt.namespace.protocol.ReportHealth())).waiting_for is None
    finally:
        close_store(handle)


# -- strategies these tests use -----------------------------------------------------------------


class Bookkeeping(ctxrt.Strategy):
    """Passthrough that writes a counter at every compile and counts its starts."""

    name = "bookkeeping"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.starts = 0
        self.count = 0

    def initialize(self, ctx: Any) -> None:
        self.starts += 1
        self.count = ctx.get_value("count", 0)

    def select(self, view: Any, budget: Any, options: Any) -> list[ctxrt.Entry]:
        self.count += 1
        if options.context is not None:
            options.context.set_value("count", self.count)
        return [ctxrt.Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


class Copying(ctxrt.Strategy):
    """Passthrough that copies each message it is handed into the context log."""

    name = "copying"
    marks_compression_reads = True

    def on_new_message(self, message: ctxrt.Message, ctx: Any) -> None:
        ctx.append_context(ctxrt.Entry(message.participant, message.content, (message.id,), "copy"))

    def select(self, view: Any, budget: Any, options: Any) -> list[ctxrt.Entry]:
        return [ctxrt.Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


class Unmarking(Copying):
    name = "unmarking"
    marks_compression_reads = False


class Broken(Copying):
    name = "broken"

    def initialize(self, ctx: Any) -> None:
        raise RuntimeError("broken on purpose")


def test_set_strategy_refuses_one_that_fails_to_start_and_keeps_the_old(handle: StoreHandle) -> None:
    """C5: a strategy that raises as it starts is refused by set_strategy (StrategyRefusedError
    naming it and its error) and the namespace keeps compiling with the old one, its config
    unrecorded."""
    ns = Driven(handle)
    value(ns.start("ann"))
    ns.append(text("hello"))
    described = ns.engine.read_value(states.config_state("ns"), ns.branch_id)
    refused(ns.ask(SetStrategy("ann", Broken())), ctxrt.StrategyRefusedError, "broken on purpose")
    assert ns.engine.read_value(states.config_state("ns"), ns.branch_id) == described
    result = value(ns.ask(Compile("ann", BIG, (), (), False)))
    assert [m.content[0].text for m in result.messages] == ["hello"]
