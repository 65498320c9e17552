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

What the hand-off costs (measured on a disk whose two fdatasyncs take 0.3 ms): a lone
append takes about 1.5x b1e9a4f's, which committed on the trio thread; the difference is the
thread's wake-up (measured: 50 µs for it to take the job) and the loop's after. Committing inline
on an idle loop, decided at the scheduler pass, measured 1.16x, but a disk that stalls then stops the trio
thread for the whole stall (K9: the frozen-disk test fails). Handing a lone caller's commit over
from its own task on such a disk measured 1.28x, but a compile under a task appending took 1.26x
as long (bench.flush (a)): so it stays gated on a fast flush.

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
from .committer import Applied, Apply, CommitLone, GiveTurns, await_commit, drop_instrument
from .writer import WriterThread

logger = logging.getLogger("ctxrt.store")

# An idle loop blocks for a durable commit whose flush takes at most FAST_FLUSH_S (moving average;
# store/committer.py's GiveTurns). A lone caller commits from its own task only while the flush
# measures that fast.
FAST_FLUSH_S = 0.0002
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
        self._turns = GiveTurns(self._writer, self._fast)
        self._instrumented = False
        self.commit_now: Apply | None = None  # the flush is the writer thread's, never the trio thread's
        self.commit_lone: CommitLone | None = self._commit_lone
        # From filling a transaction to its landing: by the actor's batch, or by a lone caller's
        # commit (the actor then waits for it to land before filling the next).
        self._out = False
        self._lone_landed = trio.lowlevel.ParkingLot()

    def start(self) -> None:
        self._writer.start()
        # Closing the environment under a transaction the thread holds hangs: a close the actor
        # didn't see through (a second Ctrl-C from asyncio's handler inside its cleanup) stops it first.
        self._engine.stop_writer = self._writer.stop
        trio.lowlevel.add_instrument(self._turns)
        self._instrumented = True

    def stop(self) -> None:
        if self._instrumented:
            drop_instrument(self._turns)
            self._instrumented = False
        self._writer.stop()  # ends the transaction it held: the store can be closed now
        self._engine.stop_writer = None

    def closing(self, interrupted: bool) -> None:
        """Nothing to cut: a commit out waits on the disk, and a transaction left to a thread would
        stay open under the environment's close (K9): the close waits for it."""

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
        if self._out or not self._fast():
            return None
        self._out = True
        return self._lone(commands, on_landed)

    async def _lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Applied:
        landing: Landing | None = None
        try:
            prepared = self._fill(commands)
            if prepared.txn is not None:
                self._writer.commit()
                try:
                    # Not shielded: a caller cancelled meanwhile (its timeout, while the disk stalls)
                    # leaves now, as through the actor; the commit is out, and a system task lands it.
                    await trio.lowlevel.wait_readable(self._writer.ready)
                except BaseException:  # cancelled, or a KeyboardInterrupt
                    landing = Landing(prepared, None)
                    raise
                error = self._writer.landed()
                if error is not None:
                    landing = Landing(prepared, error)
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
        if self._lone_landed:  # most often nobody waits: no unpark_all, a list and a generator per batch
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

    def _fill(self, commands: list[Any]) -> Any:
        """Fill the writer thread's transaction with ``commands``, growing the map while it is full."""
        engine, writer = self._engine, self._writer
        while True:
            try:
                return engine.prepare(commands, self._execute, self._unnested, writer)
            except lmdb.MapFullError:
                writer.end()  # the map can't be resized under an open transaction
                grow_map(engine)

    async def _fill_and_commit(self, commands: list[Any], landing: Landing | None = None) -> Any:
        """Fill the writer thread's transaction with ``commands`` and await its commit (the loop
        blocking for it while idle), growing the map and trying again when it is full; what
        ``Engine.prepare`` made of them. ``landing``: a first fill whose commit was handed over already."""
        engine, writer = self._engine, self._writer
        while True:
            if landing is None:
                prepared = self._fill(commands)
                if prepared.txn is None:
                    return prepared
                error = await await_commit(writer, writer.commit)
            else:
                prepared, error = landing.prepared, landing.error
                if error is None:  # still out
                    error = await await_commit(writer)
                landing = None
            if error is None:
                return prepared
            if isinstance(error, lmdb.MapFullError):  # the writer holds no transaction now
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
    done: trio.Event = attrs.Factory(trio.Event)
    applied: Applied | None = None
    failure: BaseException | None = None


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
