"""``Mailbox``: the one way into an actor, the same for the store actor and the namespace actors.

A command is an ``Ask[R]``: ``ask(command)`` sends it and returns its ``R`` (or raises what
refused it). Every answer goes through one ``Reply``; a caller parks on it with no Event and no
parking lot, and a cancelled caller loses only its answer. (Both as data are in ``ctxrt.asks``,
which the pure cores import; the waiting is here.) ``tell`` sends a message no one waits
for. ``close`` is the one way an actor stops taking commands: later sends raise the refusal it
names, and the actor takes what is queued (a closing ``notice`` first, if one is given), then
sees the end. Senders feel back-pressure: once ``capacity`` envelopes are queued, ``ask`` waits
for room (``tell`` never waits: an actor's own children and the store's publish step must not).

The receiving side is used only by the actor's own task. Like trio's channels, every step that
moves an envelope or a wake-up runs with Ctrl-C deferred, so an interrupt never loses one half way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from . import asks, tracing
from .asks import Ask

R = TypeVar("R")


class Reply(asks.Reply[R]):
    """One command's answer, as ``ctxrt.asks.Reply`` holds it, that its caller can wait for
    (``wait``). Until resolved it counts as unanswered in its mailbox (``mailbox``)."""

    __slots__ = ("_task", "_mailbox")

    def __init__(self, mailbox: Mailbox | None = None) -> None:
        # ``asks.Reply``'s fields, set here rather than by its ``__init__``: a call less per ask.
        self._done = False
        self.ok = False
        self.value: Any = None
        self.trace: Any = tracing.current()
        self._task: trio.lowlevel.Task | None = None
        self._mailbox = mailbox  # counts it unanswered until resolved

    # ``asks.Reply``'s own resolve, with Ctrl-C deferred while it runs (trio marks the function's
    # code, so a pure core's reply defers it too, harmlessly): no override calling it, a call less.
    resolve = trio.lowlevel.enable_ki_protection(asks.Reply.resolve)

    def _answered(self) -> None:
        if self._mailbox is not None:
            self._mailbox._unanswered -= 1
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    @trio.lowlevel.enable_ki_protection
    async def wait(self) -> None:
        """Until resolved; a schedule point and a cancel point either way. Cancelled, the answer is dropped.

        Ctrl-C is deferred from recording the waiting task to parking, as trio's channels defer
        it: a task interrupted in between would be rescheduled by ``resolve`` after it had
        ended, which breaks the trio run (the interrupt goes to the run's main task instead)."""
        if self._done:
            await trio.lowlevel.checkpoint()
            return
        self._task = trio.lowlevel.current_task()
        try:
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        finally:
            self._task = None  # however the wait ended, no later resolve wakes this task

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self._task = None  # resolve won't wake a task that has gone
        return trio.lowlevel.Abort.SUCCEEDED


Envelope = tuple[Any, "Reply[Any] | None"]


@attrs.frozen
class MailboxStatistics:
    """One mailbox's figures, the same for every actor."""

    depth: int  # envelopes queued, not yet taken by the actor
    unanswered: int  # asks sent and not yet answered: queued or in service
    received: int  # envelopes the actor has taken
    capacity: int
    senders_waiting: int  # asks waiting for room


class Mailbox:
    """An actor's mailbox. ``refusal(command)`` makes the error a send meets once it is closed."""

    def __init__(self, capacity: int, refusal: Callable[[Any], BaseException]) -> None:
        self.capacity = capacity
        self._queue: deque[Envelope] = deque()
        self._receiver: trio.lowlevel.Task | None = None
        self._room = trio.lowlevel.ParkingLot()
        self._refusal = refusal
        self._closed = False
        self._unanswered = 0
        self._received = 0
        self._asking = 0  # callers in ask, answered or not: while any is, none runs ``alone``
        self._senders_waiting = 0  # asks parked for room (a count: a parking lot's truth is a call)

    # -- senders ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def refuse(self, command: Any) -> BaseException:
        """The error ``command`` meets now that the mailbox is closed."""
        return self._refusal(command)

    @trio.lowlevel.enable_ki_protection  # Ctrl-C never leaves a caller counted in ask (the count gates ``alone``)
    async def ask(
        self, command: Ask[R], *, alone: Callable[[Any], Awaitable[tuple[bool, Any] | None]] | None = None
    ) -> R:
        """Send ``command`` and wait for its answer.

        Raises what the actor answered with, or the refusal once the mailbox is closed. A caller
        cancelled already sends nothing; cancelled after sending, the command is still handled and
        only its answer is lost (answered just as it was cancelled, it leaves cancelled too).

        ``alone``: the actor's own handling, which a caller that finds nobody else in ``ask`` (one
        answered but not yet back included) and nothing unanswered may run in its own task instead
        of waking the actor (one schedule point first, so callers that are ready arrive and all go
        through the actor): ``(ok, answer or error)``, or None if it can't be done alone now. A
        caller that finds others arrived meanwhile, or gets None, sends its command; callers
        arriving while a step runs alone do.

        Runs with Ctrl-C deferred (trio delivers it to the host's main task), as ``put`` and the
        wait do: an interrupt between counting a caller in and out would leave later lone callers
        going to the actor for good. ``alone`` runs so too unless its code says otherwise.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise self._refusal(command)
        # Nobody else asking, not even a caller answered but not yet back (it most often asks again
        # at once: then the two should meet at the actor), and nothing unanswered.
        lone = self._asking == 0 and self._unanswered == 0
        self._asking += 1
        try:
            if alone is not None and lone:
                await trio.lowlevel.checkpoint()
                answer = await alone(command) if self._unanswered == 0 and not self._closed else None
                if answer is not None:
                    if answer[0]:
                        return answer[1]  # type: ignore[no-any-return]  # an R by the command's type
                    raise answer[1]
            else:
                await trio.lowlevel.checkpoint_if_cancelled()  # others in flight: join them without a schedule point
            reply: Reply[R] = self._sent(command) or await self.put(command)  # ``put``'s coroutine only when full
            # ``reply.wait()`` without a coroutine of its own: just sent, the reply isn't resolved yet.
            # Cancelled here, the command is still handled; its answer is dropped.
            reply._task = trio.lowlevel.current_task()
            try:
                await trio.lowlevel.wait_task_rescheduled(reply._abort)
            finally:
                reply._task = None
            await trio.lowlevel.checkpoint_if_cancelled()
        finally:
            self._asking -= 1
        if reply.ok:  # ``unwrap``, read here: an ask is the hottest path there is
            return reply.value  # type: ignore[no-any-return]  # an R by the command's type
        raise reply.value

    @trio.lowlevel.enable_ki_protection
    async def put(self, command: Any) -> Reply[Any]:
        """Queue ``command`` (waiting for room while the mailbox is full) and return its reply.
        No schedule point when there is room. Raises the refusal once the mailbox is closed."""
        while (reply := self._sent(command)) is None:
            if self._closed:
                raise self._refusal(command)
            self._senders_waiting += 1
            try:
                await self._room.park()
            finally:
                self._senders_waiting -= 1
        return reply

    def _sent(self, command: Any) -> Reply[Any] | None:
        """``command`` queued and the actor woken: its reply; None, sending nothing, while the mailbox
        is full or once it is closed."""
        if len(self._queue) >= self.capacity or self._closed:
            return None
        reply: Reply[Any] = Reply(self)
        self._unanswered += 1
        self._queue.append((command, reply))
        self._wake()
        return reply

    @trio.lowlevel.enable_ki_protection
    def tell(self, message: Any) -> None:
        """Send ``message`` without waiting, whatever the mailbox holds; dropped once it is closed."""
        if not self._closed:
            self._queue.append((message, None))
            self._wake()

    def _wake(self) -> None:
        task = self._receiver
        if task is not None:
            self._receiver = None
            trio.lowlevel.reschedule(task)

    @trio.lowlevel.enable_ki_protection
    def close(self, refusal: Callable[[Any], BaseException] | None = None, notice: Any = None) -> None:
        """Refuse every later send (with ``refusal``, if given); the actor takes ``notice`` (if
        given) before what is queued, then what is queued, then sees the end. Idempotent: the
        first close's refusal stands."""
        if self._closed:
            return
        self._closed = True
        if refusal is not None:
            self._refusal = refusal
        if notice is not None:
            self._queue.appendleft((notice, None))
        self._room.unpark_all()
        self._wake()

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(depth=len(self._queue), unanswered=self._unanswered, received=self._received,
                                 capacity=self.capacity, senders_waiting=self._senders_waiting)

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def unanswered(self) -> int:
        return self._unanswered

    # -- the actor --------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def receive_nowait(self) -> Envelope:
        """The next envelope. Raises ``trio.WouldBlock`` when none is queued, ``trio.EndOfChannel``
        once the mailbox is closed and empty."""
        if self._queue:
            envelope = self._queue.popleft()
            self._received += 1
            if self._senders_waiting and len(self._queue) < self.capacity:
                self._room.unpark()
            return envelope
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    @trio.lowlevel.enable_ki_protection
    def receive_queued(self, taken: list[Envelope], most: int, weigh: Callable[[Any], int], budget: int) -> None:
        """Move queued envelopes to ``taken``, oldest first and without waiting, until it holds ``most``,
        or their commands' ``weigh`` adds up to ``budget`` (the one that reaches it is moved too), or
        none is left. One call for a whole batch, not a ``receive_nowait`` per envelope."""
        queue, before = self._queue, len(taken)
        while queue and len(taken) < most and budget > 0:
            envelope = queue.popleft()
            taken.append(envelope)
            budget -= weigh(envelope[0])
        moved = len(taken) - before
        self._received += moved
        if self._senders_waiting and moved:
            self._room.unpark(count=moved)

    @trio.lowlevel.enable_ki_protection
    async def receive(self) -> Envelope:
        """The next envelope, waiting for one; ``trio.EndOfChannel`` once closed and empty. A
        schedule point either way, as a trio channel's receive is."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            envelope = self.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return envelope
        while True:
            self._receiver = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_receive)
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                continue

    def _abort_receive(self, _: Any) -> trio.lowlevel.Abort:
        self._receiver = None
        return trio.lowlevel.Abort.SUCCEEDED

    def __aiter__(self) -> Mailbox:
        return self

    async def __anext__(self) -> Envelope:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    @trio.lowlevel.enable_ki_protection
    def drain(self, refusal: Callable[[Any], BaseException] | None = None) -> list[Envelope]:
        """Close the mailbox and take everything still queued; each ask among it is answered with
        ``refusal(command)`` (by default the mailbox's refusal). Returns the envelopes taken."""
        self.close()
        refuse = refusal or self._refusal
        taken = list(self._queue)
        self._queue.clear()
        self._received += len(taken)
        for command, reply in taken:
            if reply is not None:
                reply.resolve(False, refuse(command))
        return taken
