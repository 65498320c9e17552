"""The namespace machine's components on their own, without the machine or an event loop: its
``Lease`` on a real PostgreSQL store, its ``Drain``'s back-off, and its reader views over real
slot caches of a real LMDB store. Each test cites the behaviour it checks (docs/behaviours.md);
the machine's tests (tests/test_namespace_machine.py) check the same rules through ``handle``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import ctxrt
from ctxrt.namespace.actor import answer_lease
from ctxrt.namespace.core import Place
from ctxrt.namespace.drain import STORE_RETRY_MAX_S, STORE_RETRY_S, Drain
from ctxrt.namespace.lease import Lease
from ctxrt.namespace.views import build_views, seen_now
from ctxrt.slots import SlotRegistry, prepare_append
from ctxrt.store.actor import execute
from ctxrt.store.environment import StoreHandle, close_store, open_store
from ctxrt.store.interface import StoreEngine
from ctxrt.store.protocol import AppendItem, RegisterState
from ctxrt.strategies.base import Strategy


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


@attrs.define
class Host:
    """What the drain reads of its machine, for the back-off: the wait for the store."""

    waiting: ctxrt.StoreUnavailableError | None = None
    strategy: Strategy = attrs.field(factory=lambda: memory(auto_tick=True))
    readonly: bool = False
    place: Place = Place("ns", "main")


def test_the_drain_backs_off_doubling_up_to_its_maximum_while_the_store_is_unreachable() -> None:
    """K9: with the store unreachable, an auto-ticking namespace's drain tries again after 0.25 s,
    doubling to 5 s; a new outage starts from 0.25 s again; meanwhile the timer wakes it then."""
    host = Host(waiting=ctxrt.StoreUnavailableError("postgresql://x", "down"))
    drain = Drain(host)  # type: ignore[arg-type]
    delays = []
    now = 0.0
    for attempt in range(8):
        drain.back_off(first=attempt == 0, now=now)
        delays.append(drain.retry_delay)
        assert drain.wake_at() == now + drain.retry_delay
        assert drain.deadline(1e9, now) == now + drain.retry_delay
        now += drain.retry_delay
    assert delays == [STORE_RETRY_S * 2 ** i for i in range(5)] + [STORE_RETRY_MAX_S] * 3
    drain.back_off(first=True, now=now)
    assert drain.retry_delay == STORE_RETRY_S



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
