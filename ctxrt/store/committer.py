"""Committers: how a batch the store actor gathered gets committed, one kind per engine.

As httpx's client hides its transports, the store actor sees only ``Committer``: the engine hands
it one (``StoreEngine.committer``) and the actor has one commit path whatever the engine. Each
commits the whole batch in one write transaction and returns each command's ``(ok, result or
error)`` with the committed operations, or raises what refused the whole batch
(``StoreFullError``, ``StoreCorruptError``, ``StoreUnavailableError``).

- ``InlineCommitter``: the commit is quick (LMDB under durability "os": nothing is flushed), so it
  runs on the trio thread, in the actor or in a lone caller's own task (``commit_now``).
- ``ThreadCommitter``: the commit waits on a server (PostgreSQL): the whole batch on a commit
  thread of its own (store/writer.py) while the loop runs on, handed there by the actor or by a
  lone caller's own task.
- LMDB's durable committer (store/committer_lmdb.py): its writer thread, with turn-giving and the
  map's growth.

A commit thread's commit is awaited through trio's I/O wait (``await_commit``: its ``ready``
descriptor), and ``GiveTurns`` hands the thread the GIL: before a busy scheduler pass when the
thread wants it, and, when the loop has nothing else to do (it is about to sleep in ``epoll``) and
the commit measures fast, by blocking for the commit right there, the GIL released, for at most
``IDLE_WAIT_S`` and never past the next deadline. That spares a lone commit the sleep in ``epoll``
and the wake-ups after it (PostgreSQL's append: 0.23 ms of trio's worker-thread hop, measured), and
a commit that stalls holds the loop no longer than that bound. Only the scheduler knows the loop is
idle: a task that blocked when ``current_statistics()`` counted nothing runnable held up the tasks
later in its own batch, which trio doesn't count (a compile under a task appending durably took 2x
as long).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from .records import Operation
from .writer import CommitThread

logger = logging.getLogger("ctxrt.store")

Applied = tuple[list[tuple[bool, Any]], list[Operation]]
Apply = Callable[[list[Any]], Applied]
# A lone caller's commit from its own task, given the commands and what to do with what landed
# (publish it) in whichever task lands it: the commit under way, or None when it can't be taken now.
CommitLone = Callable[[list[Any], Callable[[Applied], None]], Awaitable[Applied] | None]
FLUSH_INTERVAL_S = 1.0  # durability "os": commits are not flushed; flush them at least this often
# A scheduler pass that will sleep in epoll at least this long lets a commit thread take the GIL by
# itself; a shorter one hands it its turn (GiveTurns).
BUSY_WAIT_S = 0.001
# An idle loop blocks for a commit that measures fast for at most IDLE_WAIT_S: what an arrival
# meanwhile (a request, a thread's message) may wait.
IDLE_WAIT_S = 0.002


class Committer(Protocol):
    """What the store actor commits its batches through (one per engine and actor)."""

    # A commit on the trio thread, synchronous, that a lone caller may run in its own task instead
    # of waking the actor; None for a committer whose commits wait (a flush, a server).
    commit_now: Apply | None
    # A commit that waits (a flush on a thread of its own) which a lone caller may hand over from
    # its own task instead of waking the actor; None for a committer without it.
    commit_lone: CommitLone | None

    def start(self) -> None:
        """Before the first commit (a thread of its own, say)."""

    def stop(self) -> None:
        """After the last: nothing of it is left running, and the store may be closed. Idempotent."""

    def closing(self, interrupted: bool) -> None:
        """The runtime begins to close (``interrupted``: for a Ctrl-C): a commit that waits on a
        server is not waited for without end (``ThreadCommitter``); the others need nothing."""

    async def settle(self) -> None:
        """Before ``stop``: wait (shielded from cancellation) for a commit a lone caller handed over
        from its own task (``commit_lone``) to land."""

    async def commit(self, commands: list[Any]) -> Applied:
        """Commit ``commands``; the loop may serve others meanwhile. Not cancellable: once it began,
        its callers get what it did."""

    async def tend(self) -> None:
        """The committer's own work for the actor's life (a periodic flush), cancelled at its end;
        returns at once when there is none."""


class InlineCommitter:
    """Commits on the trio thread: a commit that doesn't wait (nothing to flush). ``flush`` is
    called every ``FLUSH_INTERVAL_S`` (what ``errors`` it raises is logged and retried)."""

    def __init__(self, apply: Apply, flush: Callable[[], None], errors: tuple[type[BaseException], ...]) -> None:
        self._apply = apply
        self.commit_now: Apply | None = apply
        self.commit_lone: CommitLone | None = None
        self._flush = flush
        self._errors = errors

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def closing(self, interrupted: bool) -> None:
        """Nothing waits on a server."""

    async def settle(self) -> None:
        """Nothing to wait for: a lone caller's commit (``commit_now``) is over when it returns."""

    async def commit(self, commands: list[Any]) -> Applied:
        return self._apply(commands)

    @trio.lowlevel.enable_ki_protection  # a task of its own: not covered by serve_store's protection
    async def tend(self) -> None:
        while True:
            await trio.sleep(FLUSH_INTERVAL_S)
            try:
                self._flush()
            except self._errors as exc:  # a full or failing disk: the next flush tries again
                logger.warning("flushing the store failed: %s", exc)


class ThreadCommitter:
    """Commits the whole batch on a commit thread of its own (store/writer.py): the commit waits on
    a server, the loop doesn't; an idle loop blocks for a commit that measures within ``IDLE_WAIT_S``
    (the module doc). A lone caller hands its batch to the thread from its own task
    (``commit_lone``), sparing it the hop to the actor and back."""

    def __init__(self, apply: Apply, *, cut: Callable[[bool], None] | None = None,
                 cut_after_s: tuple[float, float, float] = (0.0, 0.0, 0.0),
                 answered: Callable[[], float] = lambda: 0.0) -> None:
        self._apply = apply
        # A batch the server hasn't answered in ``cut_after_s`` (the first while the runtime runs,
        # the second from its close on, the third when a Ctrl-C closes it: its host wants out) is
        # cut (``cut``, from a timer's thread: it fails the batch's wait; from the close on, the
        # engine sends no later one), so a stalled server holds no caller, nor the close, nor the
        # Ctrl-C it defers, for good: a caller the runtime shields (a fork, an append carrying
        # request records) waited for ever, and the close, which begins once the host's block
        # ends, never began. ``answered``: when the server last answered the batch out (monotonic).
        self._cut = cut
        self._cut_after_s = cut_after_s[0]
        self._cut_bounds = cut_after_s
        self._answered = answered
        self._closing = False
        self._cutter: threading.Timer | None = None
        self._arming = threading.Lock()  # the timer is re-armed from its own thread and the loop's
        self._thread = CommitThread()
        self._turns = GiveTurns(self._thread, self._fast)
        self._instrumented = False
        self.commit_now: Apply | None = None
        self.commit_lone: CommitLone | None = self._commit_lone
        # One batch on the thread at a time, the actor's or a lone caller's: from its hand-over to
        # the reading of what it did (``_landed``).
        self._out = False
        self._out_since = 0.0
        self._released = trio.lowlevel.ParkingLot()
        self._applied: Applied | None = None  # what the batch on the thread did, set there

    def start(self) -> None:
        self._thread.start()
        trio.lowlevel.add_instrument(self._turns)
        self._instrumented = True
        if self._cut is not None:
            self._arm(self._cut_after_s)

    def stop(self) -> None:
        """Waits for a batch still on the thread, and ends the thread."""
        with self._arming:
            if self._cutter is not None:
                self._cutter.cancel()
            self._cut = None  # a timer running now arms no other
        if self._instrumented:
            drop_instrument(self._turns)
            self._instrumented = False
        self._thread.stop()

    def closing(self, interrupted: bool) -> None:
        """From now on, a batch out longer than the close's bound (a lone caller's, the actor's, the
        request records') is cut, and later ones refused by the engine."""
        if self._cut is not None and not self._closing:
            self._closing = True
            self._cut_after_s = self._cut_bounds[1 + interrupted]
            self._arm(self._cut_after_s)

    def _arm(self, after_s: float, closing: bool | None = None) -> None:
        """Look at the batch out in ``after_s``; from the timer's own look at ``closing``, unless the
        close began since (``closing`` armed its own timer then)."""
        with self._arming:
            if self._cut is None or closing not in (None, self._closing):
                return
            if self._cutter is not None:
                self._cutter.cancel()
            self._cutter = threading.Timer(after_s, self._cut_out)
            self._cutter.daemon = True
            self._cutter.start()

    def _cut_out(self) -> None:
        """The timer's thread: cut the batch out if the server hasn't answered it in the bound, else
        look again when it (or the next batch) would have been out that long unanswered."""
        cut, closing, bound = self._cut, self._closing, self._cut_after_s
        if cut is None:
            return
        waited = time.monotonic() - max(self._out_since, self._answered())
        if not self._out or waited < bound:
            self._arm(bound - waited if self._out else bound, closing)
            return
        if closing:
            logger.warning("closing the store: the server hasn't answered a batch in %g s; cutting it (whether it "
                           "committed is for the server to say) and refusing any later one", bound)
        else:
            logger.warning("the server hasn't answered a batch in %g s; cutting it (whether it committed is for "
                           "the server to say)", bound)
            self._arm(bound, closing)
        cut(closing)

    async def settle(self) -> None:
        """Wait, shielded, for a lone caller's batch still on the thread to land."""
        with trio.CancelScope(shield=True):
            while self._out:
                await self._released.park()

    async def commit(self, commands: list[Any]) -> Applied:
        while self._out:  # a lone caller's batch is out: it lands first
            await self._released.park()
        self._out, self._out_since = True, time.monotonic()
        try:
            return self._landed(await await_commit(self._thread, self._hand_over(commands)))
        finally:
            self._release()

    def _commit_lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Awaitable[Applied] | None:
        """``commit`` from a lone caller's task; None while a batch is on the thread. A caller
        cancelled (or interrupted) meanwhile leaves at once: a system task lands its batch, and
        ``on_landed`` gets what landed in whichever task landed it, before the caller is answered."""
        if self._out:
            return None
        self._out, self._out_since = True, time.monotonic()
        return self._lone(commands, on_landed)

    async def _lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Applied:
        self._hand_over(commands)()
        try:
            # Not shielded: a caller cancelled meanwhile (its timeout, while the server stalls)
            # leaves now, as through the actor; the batch is out, and a system task lands it.
            await trio.lowlevel.wait_readable(self._thread.ready)
        except BaseException:  # cancelled, or a KeyboardInterrupt
            trio.lowlevel.spawn_system_task(self._land, on_landed, name="ctxrt-store-landing")
            raise
        try:
            applied = self._landed(self._thread.landed())
            on_landed(applied)
            return applied
        finally:
            self._release()

    async def _land(self, on_landed: Callable[[Applied], None]) -> None:
        """A system task: land a lone caller's batch whose caller left, and publish what it did."""
        try:
            on_landed(self._landed(await await_commit(self._thread)))
        except Exception as exc:  # noqa: BLE001 - nobody waits for it: its caller left
            logger.warning("a batch whose caller left failed: %s", exc)
        finally:
            self._release()

    def _hand_over(self, commands: list[Any]) -> Callable[[], None]:
        """What hands ``commands`` over to the thread, which keeps what the batch did."""
        def run() -> None:
            self._applied = self._apply(commands)

        return lambda: self._thread.hand_over(run)

    def _landed(self, error: BaseException | None) -> Applied:
        """What the batch out did, once it ended (``error``: what it raised, raised here)."""
        if error is not None:
            raise error
        applied, self._applied = self._applied, None
        assert applied is not None
        return applied

    def _release(self) -> None:
        self._out = False
        if self._released:  # most often nobody waits: no unpark_all, a list and a generator per batch
            self._released.unpark_all()

    def _fast(self) -> bool:
        """Whether a commit measures fast enough for an idle loop to block for it."""
        return self._thread.commit_s <= IDLE_WAIT_S

    async def tend(self) -> None:
        """Nothing to tend: the server flushes its own log."""


async def await_commit(thread: CommitThread, hand_over: Callable[[], None] | None = None) -> BaseException | None:
    """Hand the commit to ``thread`` (``hand_over``, unless it was already) and wait for it through
    trio's I/O wait (``GiveTurns`` may block for it when the loop is idle): what it raised, or None.
    Not cancellable: the commit is underway, and its callers get what it did."""
    if hand_over is not None:
        hand_over()
    with trio.CancelScope(shield=True):
        await trio.lowlevel.wait_readable(thread.ready)
    return thread.landed()


class GiveTurns(trio.abc.Instrument):
    """While a commit is out: before a scheduler pass that won't sleep, if the commit thread waits
    for the GIL, hand it its turn (store/writer.py says why: otherwise the thread may wait for
    seconds behind a busy loop). A pass that sleeps in ``epoll`` leaves the GIL free anyway, and
    blocks for the commit instead while ``idle_block()`` says so (the module doc). Installed for the
    committer's life: between commits a pass costs it one attribute check."""

    def __init__(self, thread: CommitThread, idle_block: Callable[[], bool] = lambda: False) -> None:
        self._thread = thread
        self._idle_block = idle_block

    def before_io_wait(self, timeout: float) -> None:
        if timeout < BUSY_WAIT_S:
            self._thread.offer_turn()
        elif self._idle_block():
            self._thread.wait(min(timeout, IDLE_WAIT_S))


def drop_instrument(instrument: trio.abc.Instrument) -> None:
    """Remove ``instrument``, unless trio already did: it drops one whose hook raised, and asyncio's
    second Ctrl-C raises wherever the loop's thread is, a hook included (the KeyError trio then
    raised skipped the rest of a close: the writer's stop, the store's)."""
    try:
        trio.lowlevel.remove_instrument(instrument)
    except KeyError:
        pass
