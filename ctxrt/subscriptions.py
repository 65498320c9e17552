"""A manager's subscriptions: the stream of ``Added``/``Edited``/``Removed`` events of its slot,
and, for a subscriber that asks, its namespace's ``QuarantineAlarm``s.

Two sources feed one unbounded channel: in a writing runtime on LMDB the slot registry's watch
hands over each commit's events as they land; otherwise (a read-only runtime, a PostgreSQL store
other processes write) a poller looks at the slot's head every interval and reports what changed
since. It stands apart from ``ContextManager`` (which keeps ``subscribe`` and its contract) since
it is trio plumbing with its own lifetime: it ends when its block exits, its manager or runtime
closes, or its branch is deleted. Alarms come from the registry, which the namespace's actor in
this runtime sounds them through; they need no store, so they reach a poller's channel too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Union

import trio

from .errors import StoreUnavailableError
from .events import Added, MessageEvent, QuarantineAlarm, diff
from .namespace.registry import NamespaceRegistry
from .slots import SlotCache
from .store.records import LogHead

logger = logging.getLogger("ctxrt.subscriptions")

POLL_INTERVAL_S = 0.05  # how often a read-only runtime's subscription looks at the slot's head

Event = Union[MessageEvent, QuarantineAlarm]  # what a subscription that asked for alarms delivers


@asynccontextmanager
async def subscription(
    registry: NamespaceRegistry, slot: SlotCache, interval: float, ends: set[Callable[[], None]],
    alarms_of: str | None = None,
) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
    """The event channel of ``slot`` from now on, open while the block runs, with the alarms of
    namespace ``alarms_of`` (None: no alarms). Its end is in ``ends`` meanwhile (a manager's close
    calls it) and registered with ``registry``'s close."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    # Closing the manager or the runtime ends the subscription at once: the channel closes (its
    # reader's loop ends, not hangs), commits stop reaching it, and a poller stops looking.
    poller = trio.CancelScope()
    stops: list[Callable[[], None]] = [send.close, poller.cancel]
    if alarms_of is not None:
        stops.append(registry.on_alarm(slot.branch_id, alarms_of, send.send_nowait))

    def end() -> None:
        for stop in stops:
            stop()

    ends.add(end)
    forget = registry.on_close(end)
    try:
        if slot.hears_every_write:
            stops.append(registry.slots.watch(slot.state, slot.branch_id, send.send_nowait, send.close))
            with receive:
                yield receive
            return
        head = slot.head_now()  # from here on: a change before the poller's first look is reported too
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_poll, slot, head, send, interval, poller)
            try:
                with receive:
                    yield receive
            finally:
                end()
    finally:
        end()
        ends.discard(end)
        forget()


async def _poll(
    slot: SlotCache, head: LogHead, send: trio.MemorySendChannel[Event], interval: float,
    scope: trio.CancelScope,
) -> None:
    """A read-only runtime's subscription: at each look, one head read, then what changed between
    the last look's revision and this one's, each read as of its revision (a write landing while
    it looks waits for the next look). Cancelling ``scope`` stops it (the subscription ended).
    While the store is unreachable it keeps looking (L10): what changed meanwhile is reported at
    its first look after, from the last head it saw, so the outage costs no event."""
    waiting = False
    with scope, send:
        while True:
            await trio.sleep(interval)
            try:
                if slot.engine.branch_deleted(slot.branch_id):
                    return  # the branch is gone: the subscription ends
                now = slot.head_now()
                if now.revision == head.revision:
                    events: list[MessageEvent] = []
                elif now.rewrite_revision == head.rewrite_revision:  # appends only: the new tail, oldest first
                    events = [Added(m) for m in slot.as_of(now.revision, start=head.length)]
                else:
                    events = diff(slot.as_of(head.revision), slot.as_of(now.revision))
            except StoreUnavailableError as exc:
                if not waiting:
                    logger.warning("a subscription to %r waits for the store: %s", slot.state, exc.reason)
                waiting = True
                continue
            if waiting:
                logger.warning("a subscription to %r: the store answers again", slot.state)
                waiting = False
            for event in events:
                send.send_nowait(event)
            head = now
