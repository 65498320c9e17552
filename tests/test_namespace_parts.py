"""The namespace machine's components on their own, without the machine or an event loop: its
``Lease`` on a real PostgreSQL store, its ``Drain`` driven with plain values (the decisions it
returns), and its reader views over real slot caches of a real LMDB store. Each test cites the behaviour it checks (docs/behaviours.md);
the machine's tests (tests/test_namespace_machine.py) check the same rules through ``handle``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import ctxrt
from ctxrt.namespace.actor import answer_lease
from ctxrt.namespace.core import Place
from ctxrt.namespace.drain import (
    LATER,
    STORE_RETRY_MAX_S,
    STORE_RETRY_S,
    AwaitStore,
    CommitStrategy,
    Decisions,
    Drain,
    FlushNew,
    Moment,
    RequireStrategy,
    Resumed,
)
from ctxrt.namespace.effects import Answer, CallModel
from ctxrt.namespace.protocol import NamespaceConfig, Tick, UnitDone
from ctxrt.namespace.lease import Lease
from ctxrt.namespace.views import build_views, seen_now
from ctxrt.testing import (
    AppendItem,
    RegisterState,
    SlotRegistry,
    StoreHandle,
    close_store,
    execute,
    open_store,
    Reply,
    prepare_append,
)
from ctxrt import Strategy, Unit
from ctxrt.store.interface import StoreEngine


def memory(*, auto_tick: bool = False) -> Strategy:
    """A strategy that keeps its memory in the process."""
    return ctxrt.Autobiographical("test-model", target_chunk_tokens=200, recent_window_tokens=0,
                                  head_window_tokens=0, l1_holdback_chunks=0, auto_tick=auto_tick).create()


def follow(lease: Lease, engine: StoreEngine, branch: int, strategy: Strategy) -> None:
    """``lease.follow(strategy)`` with its effects carried out on ``engine``, as the actor's loop does."""
    steps = lease.follow(strategy)
    try:
        effect = next(steps)
        while True:
            answer = answer_lease(engine, branch, effect)
            effect = steps.send(answer.held) if answer.error is None else steps.throw(answer.error)
    except StopIteration:
        pass


def test_a_lease_held_in_one_process_refuses_another_until_given_back(pg_url: str) -> None:
    """K4: a namespace whose strategy keeps its memory is served by one process at a time: the
    second lease is refused with ConfigConflictError and holds nothing, until the first is given
    back (a strategy that keeps none gives it back too)."""
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        branch = first.engine.branch("main").id
        place = Place("ns", "main")
        mine, theirs = Lease(place, readonly=False), Lease(place, readonly=False)
        follow(mine, first.engine, branch, memory())
        check = mine.check()
        assert mine.held and check is not None and answer_lease(first.engine, branch, check).held
        with pytest.raises(ctxrt.ConfigConflictError, match="served by another process"):
            follow(theirs, second.engine, branch, memory())
        assert not theirs.held
        follow(mine, first.engine, branch, ctxrt.Passthrough().create())  # keeps no memory: the lease goes back
        assert not mine.held and mine.check() is None
        follow(theirs, second.engine, branch, memory())
        assert theirs.held
        released = theirs.give_back()
        assert not theirs.held and released is not None
        assert answer_lease(second.engine, branch, released).error is None
        follow(mine, first.engine, branch, memory())
        assert mine.held
    finally:
        close_store(second)
        close_store(first)


def test_a_read_only_lease_is_never_taken(pg_url: str) -> None:
    """K4: a read-only runtime serves no namespace's memory: it takes no lease, so a writer's is free."""
    writer = open_store(pg_url)
    try:
        branch = writer.engine.branch("main").id
        reading = Lease(Place("ns", "main"), readonly=True)
        follow(reading, writer.engine, branch, memory())
        assert not reading.held
        writing = Lease(Place("ns", "main"), readonly=False)
        follow(writing, writer.engine, branch, memory())
        assert writing.held
    finally:
        close_store(writer)


def drain_of(strategy: Any) -> Drain:
    """A drain of a writable namespace "ns" on branch "main" configured with ``strategy``."""
    config = NamespaceConfig(namespace="ns", slot="messages", auxiliary=(), view_filter=None, strategy=strategy,
                             model=None)
    return Drain(Place("ns", "main"), 1, config, readonly=False)


CONTEXT: Any = object()  # the strategy's context, a stand-in: the strategies here read none of it


class Planner:
    """A strategy that plans one unit reading up to sequence 7 and asks the model a fixed request."""

    name = "planner"
    auto_tick = False
    unit = Unit("chunk-1", 7)

    def next_unit(self, ctx: Any) -> Unit:
        return self.unit

    def request_for(self, unit: Unit, ctx: Any) -> str:
        return "request"


def decisions_of(handler: Decisions, outcomes: dict[type, Any], moment: Moment) -> tuple[list[Any], Any]:
    """Drive a drain handler as the machine does, resuming each decision with ``outcomes[type]`` and
    ``moment`` (an exception there is raised into it; a ``Resumed`` there is sent as it is): the
    decisions in order, and what it returned."""
    made: list[Any] = []
    value: Any = None
    while True:
        try:
            decision = handler.throw(value) if isinstance(value, BaseException) else handler.send(value)
        except StopIteration as stop:
            return made, stop.value
        made.append(decision)
        value = outcomes.get(type(decision))
        if not isinstance(value, (BaseException, Resumed)):
            value = Resumed(value, moment)


def test_a_tick_raises_the_floor_to_its_unit_before_the_model_is_asked() -> None:
    """D2, D4: a manager's tick plans its unit, commits with the floor at the unit's reach, and
    only then asks the model; a floor raise that fails sends no request and answers the tick."""
    reply: Reply[Any] = Reply()
    moment = Moment(now=0.0, strategy=Planner(), ctx=CONTEXT)  # type: ignore[arg-type]
    drain = drain_of(Planner())
    queued, later = decisions_of(drain.queue(Tick(reader=None), reply, moment), {}, moment)
    assert queued == [RequireStrategy()] and later is LATER
    started = drain.next(moment)
    assert started is not None
    made, _ = decisions_of(started[2], {CommitStrategy: True}, moment)
    assert [type(d) for d in made] == [RequireStrategy, FlushNew, CommitStrategy, CallModel]
    assert made[2] == CommitStrategy(reaches=7) and made[3].request == "request" and made[3].epoch == 0
    assert drain.model_calls() == 1

    failing = drain_of(Planner())
    decisions_of(failing.queue(Tick(reader=None), reply, moment), {}, moment)
    started = failing.next(moment)
    assert started is not None
    down = ctxrt.StoreUnavailableError("postgresql://x", "down")
    made, _ = decisions_of(started[2], {CommitStrategy: down}, moment)
    assert [type(d) for d in made] == [RequireStrategy, FlushNew, CommitStrategy, Answer]
    assert made[3] == Answer(reply, False, down) and failing.flight is None and failing.model_calls() == 0


class StoreGoneAtTheRequest(Planner):
    """A planner whose request reads the store as it goes away (a message's blobs, say)."""

    auto_tick = True

    def request_for(self, unit: Unit, ctx: Any) -> str:
        raise ctxrt.StoreUnavailableError("postgresql://x", "down")


def test_a_store_gone_while_the_request_is_made_leaves_no_unit_that_blocks_the_next() -> None:
    """K9, L10: the store going away after the floor's commit, while the unit's request is made,
    sends no request and leaves no unit standing: the drain waits for the store, and once it is
    wanted again (the store back) the next unit starts."""
    strategy = StoreGoneAtTheRequest()
    moment = Moment(now=0.0, strategy=strategy, ctx=CONTEXT)  # type: ignore[arg-type]
    drain = drain_of(strategy)
    drain.wanted = True
    started = drain.next(moment)
    assert started is not None and started[0] is None
    made, _ = decisions_of(started[2], {CommitStrategy: True}, moment)
    assert [type(d) for d in made] == [RequireStrategy, FlushNew, CommitStrategy, AwaitStore]
    assert drain.flight is None and drain.model_calls() == 0 and not drain.wanted
    drain.wanted = True  # the strategy started again from the store
    assert drain.may_start() and drain.next(moment) is not None


class NothingToDo:
    """An auto-ticking strategy with no unit to plan (its backlog too short, say)."""

    name = "idle"
    auto_tick = True

    def next_unit(self, ctx: Any) -> None:
        return None

    def wake_at(self) -> None:
        return None


def test_a_message_appended_while_a_drain_with_nothing_to_do_commits_leaves_it_wanted() -> None:
    """D2, L10: a drain that found no unit in the messages its planning saw goes idle, unless a
    message was appended (``want``) while its commit was out: that message's wish is not lost (the
    drain dropped it, and an auto-ticking namespace sat idle with units to compress), and the drain
    looks again; with no message meanwhile, it goes idle."""
    strategy = NothingToDo()
    moment = Moment(now=0.0, strategy=strategy, ctx=CONTEXT)  # type: ignore[arg-type]
    drain = drain_of(strategy)
    drain.want(True)
    started = drain.next(moment)
    assert started is not None
    handler = started[2]
    assert handler.send(None) == RequireStrategy()
    assert handler.send(Resumed(None, moment)) == FlushNew()
    assert handler.send(Resumed(None, moment)) == CommitStrategy()
    drain.want(True)  # a message appended while the commit is out: after what the planning saw
    with pytest.raises(StopIteration):
        handler.send(Resumed(False, moment))
    assert drain.wanted
    again = drain.next(moment)
    assert again is not None
    made, _ = decisions_of(again[2], {CommitStrategy: False}, moment)
    assert made == [RequireStrategy(), FlushNew(), CommitStrategy()]
    assert not drain.wanted and drain.next(moment) is None


def test_a_reply_that_comes_back_after_the_view_moved_is_discarded() -> None:
    """C9: a unit's reply for an older epoch applies and commits nothing; its tick is answered
    False (no progress)."""
    reply: Reply[Any] = Reply()
    moment = Moment(now=0.0, strategy=Planner(), ctx=CONTEXT)  # type: ignore[arg-type]
    drain = drain_of(Planner())
    decisions_of(drain.queue(Tick(reader=None), reply, moment), {}, moment)
    started = drain.next(moment)
    assert started is not None
    decisions_of(started[2], {CommitStrategy: True}, moment)
    moved = attrs.evolve(moment, epoch=1)  # a claim landed while the call was out
    made, returned = decisions_of(drain.apply(UnitDone(epoch=0, unit=Planner.unit, outcome="summary"), moved), {},
                                  moved)
    assert made == [Answer(reply, True, False)] and returned is LATER and drain.flight is None


def test_a_unit_is_planned_on_the_strategy_and_epoch_as_they_are_when_its_handler_resumes() -> None:
    """C9: what a handler reads of the machine comes with each resume: a strategy started again
    while the handler waited (a new epoch) plans the unit, and the unit is planned at that epoch."""
    reply: Reply[Any] = Reply()
    before = Moment(now=0.0, strategy=memory(auto_tick=False))
    after = Moment(now=0.0, strategy=Planner(), epoch=2, ctx=CONTEXT)  # type: ignore[arg-type]
    drain = drain_of(Planner())
    decisions_of(drain.queue(Tick(reader=None), reply, before), {}, before)
    started = drain.next(before)
    assert started is not None
    made, _ = decisions_of(started[2], {RequireStrategy: Resumed(None, after), CommitStrategy: True}, after)
    assert [type(d) for d in made] == [RequireStrategy, FlushNew, CommitStrategy, CallModel]
    assert made[3].request == "request" and made[3].epoch == 2


def test_the_drain_backs_off_doubling_up_to_its_maximum_while_the_store_is_unreachable() -> None:
    """K9: with the store unreachable, an auto-ticking namespace's drain tries again after 0.25 s,
    doubling to 5 s; a new outage starts from 0.25 s again; meanwhile the timer wakes it then."""
    down = ctxrt.StoreUnavailableError("postgresql://x", "down")
    drain = drain_of(memory(auto_tick=True))
    delays = []
    now = 0.0
    for attempt in range(8):
        drain.back_off(first=attempt == 0, now=now)
        delays.append(drain.retry_delay)
        moment = Moment(now=now, strategy=memory(auto_tick=True), waiting=down)
        assert drain.wake_at(moment) == now + drain.retry_delay
        assert drain.deadline(1e9, moment) == now + drain.retry_delay
        now += drain.retry_delay
    assert delays == [STORE_RETRY_S * 2 ** i for i in range(5)] + [STORE_RETRY_MAX_S] * 3
    drain.back_off(first=True, now=now)
    assert drain.retry_delay == STORE_RETRY_S


def test_a_message_after_the_back_off_ends_starts_the_drain_before_the_timer_does() -> None:
    """K9, D2: work held back by a back-off stays wanted: a look at the drain after the back-off's
    end (a message that came before the timer's turn, which then is cancelled) starts it, and a look
    during the back-off starts nothing but sets the timer for its end."""
    down = ctxrt.StoreUnavailableError("postgresql://x", "down")
    drain = drain_of(memory(auto_tick=True))
    drain.wanted = True
    drain.back_off(first=True, now=0.0)
    during = Moment(now=0.1, strategy=memory(auto_tick=True), waiting=down)
    assert drain.next(during) is None
    assert drain.deadline(1e9, during) == STORE_RETRY_S
    after = Moment(now=STORE_RETRY_S + 0.01, strategy=memory(auto_tick=True), waiting=down)
    assert drain.deadline(1e9, after) == 1e9  # the timer goes: nothing left to wake for
    started = drain.next(after)
    assert started is not None and started[0] is None  # the drain's own work, not a manager's tick



def append(handle: StoreHandle, slots: SlotRegistry, branch: int, *blocks: dict[str, Any]) -> None:
    data, blobs, appended = prepare_append("user", list(blocks))
    [(ok, _)], operations = handle.engine.apply(
        [AppendItem(state="messages", branch=branch, data=data, blobs=tuple(blobs), attachment=appended,
                    flagged=appended.audience)], execute)
    assert ok
    slots.publish(operations)


def test_reader_views_show_each_reader_only_its_blocks_and_die_when_their_guard_says(handle: StoreHandle) -> None:
    """A4, C8: a namespace's views are in its reader's view (a block for another reader is left
    out, the raw body too), and every read through the view runs its guard first."""
    engine = handle.engine
    engine.apply([RegisterState(name="messages", kind="log")], execute)
    branch = engine.branch("main").id
    slots = SlotRegistry(engine, live=True)
    cache = slots.acquire("messages", branch)
    append(handle, slots, branch, {"type": "text", "text": "for all"},
           {"type": "text", "text": "for bob", "audience": ["bob"]})
    dead = False

    def guard() -> None:
        if dead:
            raise ctxrt.ReaderConflictError("the view changed")

    views = build_views([cache], "ann", view_filter=None, estimator=None, guard=guard, pricing=lambda: 0)
    assert views.shared
    [message] = views.view.after(0)
    assert [block.text for block in message.content] == ["for all"]
    raw = views.raw_body(message.id)
    assert raw is not None and [block.text for block in raw.content] == ["for all"]
    assert seen_now(engine, [cache]) == message.sequence
    dead = True
    with pytest.raises(ctxrt.ReaderConflictError):
        views.view.after(0)
