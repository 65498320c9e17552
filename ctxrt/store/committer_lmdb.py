"""LMDB's committers: the map's growth, and the durable committer with its writer thread.

A durable commit (LMDB's own: the pages, ``fdatasync``, the meta page through its ``O_DSYNC``
descriptor) stops whichever thread runs it for both flushes, so ``DurableCommitter`` has the
store's writer thread (store/writer.py) run it: the thread begins each transaction, the trio
thread fills it, the thread commits it. Filling on the trio thread, not the whole transaction in
``to_thread``, because the thread's Python would meet the GIL convoy at every step (measured:
appends of 130-500 ms under load); the thread needs the GIL only in two short turns per commit,
which the loop hands it (``GiveTurns``) when it is busy.

How the loop waits for the commit it chooses by what it measures, as group commit already does
(store/committer.py's ``await_commit`` and ``GiveTurns``, which PostgreSQL's committer shares): a
task always awaits it through trio's I/O wait, and the loop serves everything else meanwhile
(reads, compiles, timers) while the next batch gathers in the mailbox; an idle loop blocks for it
when the flush measures fast (``FAST_FLUSH_S``, a moving average of the commit's own time, timed
on the thread), for at most ``IDLE_WAIT_S``: a disk that stalls (a frozen filesystem) holds the
loop no longer than that bound.

Either way the callers are answered only after LMDB's commit returned, that is after its meta page
is on disk, and in LMDB's order (data, flush, meta, flush). A map that fills grows between
attempts (no transaction open: the writer thread is told to end the one it holds).
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import lmdb
import trio

from ..errors import StoreFullError
from .committer import BUSY_WAIT_S, IDLE_WAIT_S, Applied, Apply, CommitLone, GiveTurns, await_commit
from .writer import CommitThread, WriterThread

logger = logging.getLogger("ctxrt.store")

# An idle loop blocks for a durable commit whose flush takes at most FAST_FLUSH_S (moving average;
# store/committer.py's GiveTurns). A lone caller commits from its own task only while the flush
# measures that fast.
FAST_FLUSH_S = 0.0002
# A commit runs inline, on the trio thread, at a scheduler pass that would sleep at least twice as
# long as the commit measures, and only while it measures at most INLINE_FLUSH_S: what an arrival
# meanwhile (a request, a thread's message) may wait, as an idle loop's block for the writer thread.
INLINE_FLUSH_S = IDLE_WAIT_S
# The map never grows past this (64 TiB), nor past what the data file plus its filesystem's
# free space can hold, nor to a size this process can't map: a failed remap would leave LMDB
# without a map at all.
MAX_MAP_SIZE = 1 << 46
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


class Writing(Protocol):
    """What LMDB's committers use of ``engine.Engine`` (its writing half)."""

    env: lmdb.Environment
    data_path: str
    stop_writer: Callable[[], None] | None

    def prepare(self, commands: Any, execute: Any, unnested: Any = None, txns: Any = None) -> Any: ...
    def commit(self, prepared: Any) -> None: ...
    def committed(self, prepared: Any) -> Applied: ...
    def write_refusal(self, exc: lmdb.Error) -> BaseException: ...


def growing(engine: Writing, attempt: Callable[[], Applied]) -> Applied:
    """``attempt()``, growing the map and trying again while it is full (no transaction is open then).

    Raises ``StoreFullError`` when the map can't grow (the disk can't hold more, or this
    process can't map more), or when the disk refuses the write.
    """
    while True:
        try:
            return attempt()
        except lmdb.MapFullError:
            grow_map(engine)


class DurableCommitter:
    """LMDB under durability "sync": every commit on the writer thread, waited for by an idle loop
    or through trio's I/O wait (the module doc)."""

    def __init__(self, engine: Writing, execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool]) -> None:
        self._engine = engine
        self._execute = execute
        self._unnested = unnested
        self._writer = WriterThread(engine.env)
        self._turns = InlineTurns(self._writer, self._fast)
        self._instrumented = False
        self.commit_now: Apply | None = None  # the flush is the writer thread's, never the trio thread's
        self.commit_lone: CommitLone | None = self._commit_lone
        # From filling a transaction to its landing: by the actor's batch, or by a lone caller's
        # commit (the actor then waits for it to land before filling the next).
        self._out = False
        self._lone_landed = trio.lowlevel.ParkingLot()

    def start(self) -> None:
        self._turns.open()
        self._writer.start()
        # Closing the environment under a transaction the thread holds hangs: a close the actor
        # didn't see through (a second Ctrl-C from asyncio's handler inside its cleanup) stops it first.
        self._engine.stop_writer = self._writer.stop
        trio.lowlevel.add_instrument(self._turns)
        self._instrumented = True

    def stop(self) -> None:
        if self._instrumented:
            trio.lowlevel.remove_instrument(self._turns)
            self._instrumented = False
        self._writer.stop()  # ends the transaction it held: the store can be closed now
        self._engine.stop_writer = None
        self._turns.close()

    async def commit(self, commands: list[Any]) -> Applied:
        while self._out:  # a lone caller's commit is out: it lands first
            await self._lone_landed.park()
        self._out = True
        try:
            prepared = await self._fill_and_commit(commands)
            return self._engine.committed(prepared)
        finally:
            self._release()

    def _commit_lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Awaitable[Applied] | None:
        """``commit`` from a lone caller's own task, sparing it the hop to the actor; None if a commit
        is out or the flush doesn't measure fast (the caller goes through the mailbox then). A
        cancel or a Ctrl-C while the commit is out hands its landing to a system task, as does a
        commit that failed (it is retried), so that a caller that leaves meanwhile loses only its reply;
        ``on_landed`` gets what landed in whichever task landed it, before the caller is answered."""
        if self._out:
            return None
        inline = self._inline()
        if not inline and not self._fast():
            return None
        self._out = True
        return self._lone(commands, on_landed, inline)

    async def _lone(self, commands: list[Any], on_landed: Callable[[Applied], None], inline: bool) -> Applied:
        landing: Landing | None = None
        try:
            prepared = self._fill(commands, inline)
            if prepared.txn is not None:
                self._hand_over(prepared, inline)
                try:
                    # Not shielded: a caller cancelled meanwhile (its timeout, while the disk stalls)
                    # leaves now, as through the actor; the commit is out, and a system task lands it.
                    await trio.lowlevel.wait_readable(self._turns.ready if inline else self._writer.ready)
                except BaseException:  # cancelled, or a KeyboardInterrupt
                    landing = Landing(prepared, None, inline)
                    raise
                error = self._turns.landed() if inline else self._writer.landed()
                if error is not None:
                    landing = Landing(prepared, error, inline)
            if landing is None:
                applied = self._engine.committed(prepared)
                on_landed(applied)
                return applied
        finally:
            if landing is None:
                self._release()
            else:
                trio.lowlevel.spawn_system_task(self._land, commands, landing, on_landed, name="ctxrt-store-landing")
        await landing.done.wait()
        if landing.failure is not None:
            raise landing.failure
        assert landing.applied is not None
        return landing.applied

    async def _land(self, commands: list[Any], landing: Landing, on_landed: Callable[[Applied], None]) -> None:
        """A system task: land a lone caller's commit still out (or retry one that failed), then answer."""
        try:
            prepared = await self._fill_and_commit(commands, landing)
            landing.applied = self._engine.committed(prepared)
            on_landed(landing.applied)
        except BaseException as exc:  # noqa: BLE001 - the caller (if still waiting) raises it
            landing.failure = exc
        finally:
            self._release()
            landing.done.set()

    def _release(self) -> None:
        self._out = False
        self._lone_landed.unpark_all()

    async def settle(self) -> None:
        """Wait, shielded, for a lone caller's commit out to land: the writer may be stopped then."""
        with trio.CancelScope(shield=True):
            while self._out:
                await self._lone_landed.park()

    async def tend(self) -> None:
        """Nothing to tend: every commit is flushed."""

    def _fast(self) -> bool:
        """Whether the flush measures fast enough for the loop to block for it while idle."""
        return self._writer.commit_s <= FAST_FLUSH_S

    def _inline(self) -> bool:
        """Whether to fill a transaction for an inline commit: the flush measures fast enough and no
        other task is runnable (a hint: trio doesn't count those later in the scheduler's batch, so
        ``InlineTurns`` decides at the pass itself)."""
        return self._writer.commit_s <= INLINE_FLUSH_S and trio.lowlevel.current_statistics().tasks_runnable == 0

    def _fill(self, commands: list[Any], inline: bool = False) -> Any:
        """Fill a transaction with ``commands``, growing the map while it is full: the writer
        thread's, or, ``inline``, one begun on this thread (the thread ends the one it held first:
        LMDB has one writer at a time)."""
        engine, writer = self._engine, self._writer
        if inline and writer.holds:
            writer.end()
        while True:
            try:
                return engine.prepare(commands, self._execute, self._unnested, None if inline else writer)
            except lmdb.MapFullError:
                if not inline:
                    writer.end()  # the map can't be resized under an open transaction
                grow_map(engine)

    def _hand_over(self, prepared: Any, inline: bool) -> None:
        """The filled transaction to its commit: the next scheduler pass's (``InlineTurns``), or the
        writer thread's."""
        if inline:
            self._turns.commit_inline(prepared.txn)
        else:
            self._writer.commit()

    async def _landed(self, inline: bool) -> BaseException | None:
        """Wait, not cancellable, for the commit handed over to end: what it raised, or None."""
        if not inline:
            return await await_commit(self._writer)
        with trio.CancelScope(shield=True):
            await trio.lowlevel.wait_readable(self._turns.ready)
        return self._turns.landed()

    async def _fill_and_commit(self, commands: list[Any], landing: Landing | None = None) -> Any:
        """Fill the writer thread's transaction with ``commands`` and await its commit (the loop
        blocking for it while idle), growing the map and trying again when it is full; what
        ``Engine.prepare`` made of them. ``landing``: a first fill whose commit was handed over already."""
        engine = self._engine
        threaded = False  # a pass declined an inline commit: the writer thread's from here
        while True:
            if landing is None:
                inline = not threaded and self._inline()
                prepared = self._fill(commands, inline)
                if prepared.txn is None:
                    return prepared
                self._hand_over(prepared, inline)
                error = await self._landed(inline)
            else:
                prepared, error = landing.prepared, landing.error
                if error is None:  # still out
                    error = await self._landed(landing.inline)
                landing = None
            if error is None:
                return prepared
            if error is DECLINED:  # aborted, nothing written: fill it again for the thread
                threaded = True
                continue
            if isinstance(error, lmdb.MapFullError):  # no transaction is open now
                grow_map(engine)
                continue
            refusal = engine.write_refusal(error) if isinstance(error, lmdb.Error) else error
            if refusal is error:
                raise error
            raise refusal from error


@attrs.define(eq=False)
class Landing:
    """A lone caller's commit that didn't land within the idle wait, or failed: a system task lands
    (or retries) it, and the caller, if still waiting, takes ``applied`` or raises ``failure``."""

    prepared: Any
    error: BaseException | None  # what the commit raised; None while it is still out
    inline: bool  # the commit is the scheduler pass's (``InlineTurns``), not the writer thread's
    done: trio.Event = attrs.Factory(trio.Event)
    applied: Applied | None = None
    failure: BaseException | None = None


class Declined(Exception):
    """A scheduler pass that won't sleep long enough declined an inline commit: its transaction was
    aborted, nothing of it written, and it is filled again for the writer thread."""


DECLINED = Declined()


class InlineTurns(GiveTurns):
    """``GiveTurns`` for LMDB's writer thread, and the inline commit: a transaction filled on the
    trio thread is committed there at the next scheduler pass, which only the scheduler knows to be
    idle: a pass about to sleep at least twice as long as the commit measures (and at least
    ``BUSY_WAIT_S``) commits it, the flush blocking the loop as b1e9a4f's did, while a busier pass
    aborts it (``DECLINED``). Either way ``ready`` turns readable: ``epoll`` returns at once, and
    the task waiting there calls ``landed``. The commit runs inside trio's run loop, which defers a
    Ctrl-C: it is whole or not at all, and answered by whoever waits for it."""

    def __init__(self, thread: CommitThread, idle_block: Callable[[], bool]) -> None:
        super().__init__(thread, idle_block)
        self._txn: lmdb.Transaction[bytes] | None = None  # the inline commit due at the next pass
        self._outcome: BaseException | None = None
        self._ready_read = self._ready_write = -1

    def open(self) -> None:
        self._ready_read, self._ready_write = os.pipe()

    def close(self) -> None:
        """Idempotent: after the last commit."""
        ready_read, ready_write = self._ready_read, self._ready_write
        self._ready_read = self._ready_write = -1
        if ready_read >= 0:
            os.close(ready_read)
            os.close(ready_write)

    @property
    def ready(self) -> int:
        """A descriptor that turns readable when the inline commit handed over has ended."""
        return self._ready_read

    def commit_inline(self, txn: lmdb.Transaction[bytes]) -> None:
        """Commit ``txn`` (begun and filled on this thread) at the next scheduler pass; returns at once."""
        self._txn = txn

    def landed(self) -> BaseException | None:
        """After ``ready`` turned readable: None, what the commit raised, or ``DECLINED``."""
        os.read(self._ready_read, 1)
        outcome, self._outcome = self._outcome, None
        return outcome

    def before_io_wait(self, timeout: float) -> None:
        txn = self._txn
        if txn is None:
            super().before_io_wait(timeout)
            return
        self._txn = None
        thread = self._thread
        if timeout < max(BUSY_WAIT_S, 2 * thread.commit_s):
            txn.abort()
            self._outcome = DECLINED
        else:
            started = time.perf_counter()
            try:
                txn.commit()
                thread.count(time.perf_counter() - started)
            except BaseException as exc:  # noqa: BLE001 - its waiter raises it (LMDB aborted the transaction)
                self._outcome = exc
        os.write(self._ready_write, b"\0")


def grow_map(engine: Writing) -> None:
    size = engine.env.info()["map_size"]
    page = mmap.PAGESIZE
    limit = MAX_MAP_SIZE
    try:
        stat = os.statvfs(engine.env.path())
        room = os.path.getsize(engine.data_path) + stat.f_bavail * stat.f_frsize
        limit = min(limit, -(-room // page) * page)  # the map can't usefully outgrow the disk
    except OSError:
        pass
    new_size = min(1 << math.ceil(math.log2(size * 2)), limit)
    if new_size <= size:
        raise StoreFullError(
            engine.data_path, f"the map is full at {size} bytes and can't grow (the disk holds at most {limit})"
        )
    if not _can_map(new_size):
        raise StoreFullError(
            engine.data_path, f"the map is full at {size} bytes and this process can't map {new_size}"
        )
    logger.warning("store map full at %d bytes; growing to %d", size, new_size)
    engine.env.set_mapsize(new_size)


def _can_map(size: int) -> bool:
    """Whether ``size`` bytes of address space can be reserved now (LMDB's remap would need them)."""
    try:
        probe = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, prot=0)
    except (OSError, OverflowError, ValueError):
        return False
    probe.close()
    return True
