"""The store actor: the only writer. One mailbox, group commit, replies, commit events.

``serve_store`` blocks for one envelope, drains whatever else is queued (up to a cap), applies
the whole batch in ONE LMDB write transaction on the trio thread, commits, publishes the
committed operations to subscribers, then answers every caller with its own result or error.
Appends run unnested in a batch (``Engine.prepare``'s ``unnested``).

A durable store's commit (both of LMDB's flushes) runs on its writer thread (store/writer.py):
the thread begins each transaction, the trio thread fills it, the thread commits it, and the
actor awaits the commit while the loop serves everything else (reads, compiles, timers) and the
next batch gathers in the mailbox. Its callers are answered only after the commit returned, that
is after LMDB's meta page is on disk. Filling the transaction on the trio thread, not the whole
transaction in ``to_thread``, because the thread's Python would meet the GIL convoy at every
step (measured: appends of 130-500 ms under load); the thread needs the GIL only in two short
turns per commit, which the loop hands it (``GiveTurns``) when it is busy. Under durability
"os" a commit flushes nothing and runs inline, all in one synchronous step.

Failures are answered, not fatal (L6). A batch the disk or the map can't take answers each of
its callers ``StoreFullError`` (nothing of it was written) and the actor serves the next one.
Publishing happens after the commit: whatever a subscriber raises is logged and dropped, so a
caller whose write landed always gets its result, and the actor keeps serving.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import lmdb
import trio

from .. import tracing
from ..errors import (
    RuntimeClosedError,
    StoreCorruptError,
    StoreFullError,
    StoreUnavailableError,
)
from ..asks import Ask
from ..mailbox import Envelope, Mailbox
from .batch import Batch
from .engine import Engine
from .interface import StoreEngine
from .protocol import (
    AppendItem,
    Atomically,
    CreateBranch,
    DeleteBranch,
    EditItem,
    RegisterState,
    RemoveItems,
    SetValue,
)
from .records import Operation
from .writer import WriterThread

logger = logging.getLogger("ctxrt.store")
R = TypeVar("R")

MAILBOX_CAPACITY = 1000
MAX_BATCH_COMMANDS = 256
MAX_BATCH_BYTES = 1 << 20  # ~1 MB keeps one durable commit to a few ms of loop time
OS_SYNC_INTERVAL_S = 1.0
# A scheduler pass that will sleep in epoll at least this long lets the writer thread take the
# GIL by itself; a shorter one hands it its turn (GiveTurns).
BUSY_WAIT_S = 0.001
# The map never grows past this (64 TiB), nor past what the data file plus its filesystem's
# free space can hold, nor to a size this process can't map: a failed remap would leave LMDB
# without a map at all.
MAX_MAP_SIZE = 1 << 46
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


@attrs.frozen
class StoreStatistics:
    mailbox_depth: int
    last_batch_size: int
    last_commit_ms: float
    batches: int
    commands: int
    largest_batch: int


@attrs.define(eq=False)
class _Counters:
    last_batch_size: int = 0
    last_commit_ms: float = 0.0
    batches: int = 0
    commands: int = 0
    largest_batch: int = 0


class StoreRef:
    """The handle to a running store actor; the only holder of its mailbox.

    Idle fast path (``inline``): when a caller is the only one in ``ask``, the actor owes no
    answer and the engine commits inline (durability "os"; never a durable LMDB commit, which
    goes to the writer thread, nor PostgreSQL's), it runs the actor's commit step itself instead
    of waking the actor: the same synchronous critical section (one write transaction, publish,
    answer), in the same order, minus a task hop. As soon as two callers overlap, everything goes
    through the mailbox and commits in groups; a caller that finds others in flight sends at once,
    without a schedule point of its own before the send (its wait for the reply is one), so an
    append costs one task switch there.
    """

    def __init__(
        self, mailbox: Mailbox, counters: _Counters, engine: StoreEngine,
        publish: Callable[[Sequence[Operation]], None], *, inline: bool = True,
    ) -> None:
        self._mailbox = mailbox
        self._counters = counters
        self._engine = engine
        self._publish = publish
        self._inline = inline
        self._in_ask = 0  # callers inside ask()

    async def ask(self, command: Ask[R]) -> R:
        """Send ``command`` and wait for its committed result.

        Raises the error that refused the command (the store is then unchanged by it), or
        ``RuntimeClosedError`` if the actor has stopped. If cancelled after sending, the command
        may still commit; its result is dropped.
        """
        mailbox = self._mailbox
        alone = self._in_ask == 0 and mailbox.unanswered == 0
        self._in_ask += 1
        try:
            if alone:
                await trio.lowlevel.checkpoint()  # let callers that are ready arrive, so they can share a commit
            else:
                # Others are in flight: join the next batch at once. Waiting for the reply is this
                # call's schedule point; a caller cancelled already sends nothing.
                await trio.lowlevel.checkpoint_if_cancelled()
            if mailbox.closed:
                raise mailbox.refuse(command)
            if (self._inline and self._in_ask == 1 and mailbox.unanswered == 0
                    and not self._engine.commits_on_thread):
                ok, value = commit_batch(self._engine, [command], self._publish, self._counters)[0]
            else:
                reply = await mailbox.put(command)  # waits for room while the mailbox is full
                await reply.wait()
                # Answered just as the caller was cancelled (its scope, or its runtime closing under
                # it): it leaves cancelled, as a caller whose write is still out does, instead of
                # going on into a runtime that is closing.
                await trio.lowlevel.checkpoint_if_cancelled()
                ok, value = reply.ok, reply.value
        finally:
            self._in_ask -= 1
        if ok:
            return value  # type: ignore[no-any-return]  # an R by the command's type
        raise value

    def close(self) -> None:
        """Refuse new commands; the actor answers what is queued, then stops."""
        self._mailbox.close()

    def statistics(self) -> StoreStatistics:
        counters = self._counters
        return StoreStatistics(
            mailbox_depth=self._mailbox.depth,
            last_batch_size=counters.last_batch_size,
            last_commit_ms=counters.last_commit_ms,
            batches=counters.batches,
            commands=counters.commands,
            largest_batch=counters.largest_batch,
        )


def _size(command: Any) -> int:
    data = getattr(command, "data", b"")
    blobs = getattr(command, "blobs", ())
    return len(data) + sum([len(blob[1]) for blob in blobs]) if blobs else len(data)


def execute(batch: Batch, command: Any) -> Any:
    """Apply one command to ``batch``: the dispatch from protocol to engine."""
    match command:
        case AppendItem():
            return batch.append(command.state, command.branch, command.data, command.blobs, command.attachment,
                                command.flagged)
        case EditItem():
            return batch.edit(
                command.state, command.branch, command.item_sequence, command.data, command.blobs, command.attachment,
                command.flagged, command.floor_state, command.expect_version,
            )
        case RemoveItems():
            return batch.remove(command.state, command.branch, command.from_sequence, command.to_sequence)
        case SetValue():
            return batch.set_value(command.state, command.branch, command.value, command.expect, command.rising)
        case RegisterState():
            return batch.register_state(command.name, command.kind)
        case CreateBranch():
            return batch.create_branch(command.name, command.from_branch, command.at_sequence)
        case DeleteBranch():
            return batch.delete_branch(command.name)
        case Atomically():
            return tuple(execute(batch, inner) for inner in command.commands)
    raise TypeError(f"not a store command: {command!r}")


def open_store_actor(
    engine: StoreEngine, publish: Callable[[Sequence[Operation]], None], *, inline: bool = True
) -> tuple[StoreRef, Mailbox]:
    mailbox = Mailbox(MAILBOX_CAPACITY, lambda command: RuntimeClosedError("the store actor has stopped"))
    return StoreRef(mailbox, _Counters(), engine, publish, inline=inline), mailbox


@trio.lowlevel.enable_ki_protection  # Ctrl-C waits for the commit step's end: never between commit and answer
def commit_batch(
    engine: StoreEngine, commands: list[Any], publish: Callable[[Sequence[Operation]], None], counters: _Counters,
    traces: Sequence[Any] = (),
) -> list[tuple[bool, Any]]:
    """The actor's commit step: one write transaction, then publish what committed. Synchronous.

    Returns each command's ``(ok, result or error)``. A batch the disk or the map refuses gives
    every command its own ``StoreFullError`` (or ``StoreCorruptError``, ``StoreUnavailableError``);
    a failure while publishing is logged and never changes a committed command's result (L6).
    """
    results, operations = apply_batch(engine, commands, counters, traces)
    publish_committed(publish, operations)
    return results


def apply_batch(
    engine: StoreEngine, commands: list[Any], counters: _Counters, traces: Sequence[Any] = (),
) -> tuple[list[tuple[bool, Any]], list[Operation]]:
    """The write transaction of the commit step (safe on a worker thread: it touches no cache).
    ``traces``: the trace contexts its callers sent (none when it runs in its caller's task)."""
    started = time.perf_counter()
    try:
        with tracing.committing(engine, len(commands), traces):
            results, operations = _apply_growing(engine, commands)
    except (StoreFullError, StoreCorruptError, StoreUnavailableError) as refused:
        logger.warning("store batch of %d commands refused: %s", len(commands), refused)
        return [(False, _copy_refusal(refused)) for _ in commands], []
    _count(counters, len(commands), started)
    return results, operations


def _count(counters: _Counters, commands: int, started: float) -> None:
    counters.last_commit_ms = (time.perf_counter() - started) * 1000
    counters.last_batch_size = commands
    counters.batches += 1
    counters.commands += commands
    counters.largest_batch = max(counters.largest_batch, commands)


def publish_committed(publish: Callable[[Sequence[Operation]], None], operations: list[Operation]) -> None:
    if not operations:
        return
    try:
        publish(operations)
    except Exception:  # the write landed: its callers get their results whatever a subscriber did
        logger.exception("publishing %d committed operations failed; the commit stands", len(operations))


def _copy_refusal(refused: StoreFullError | StoreCorruptError | StoreUnavailableError) -> BaseException:
    """One exception object per caller: callers raise theirs concurrently, each with its own traceback."""
    if isinstance(refused, StoreFullError):
        copy: BaseException = StoreFullError(refused.path, refused.reason)
    elif isinstance(refused, StoreUnavailableError):
        copy = StoreUnavailableError(refused.url, refused.reason)
    else:
        copy = StoreCorruptError(refused.path, refused.what)
    copy.__cause__ = refused.__cause__
    return copy


@trio.lowlevel.enable_ki_protection  # Ctrl-C goes to the host's main task, and the actor stops as cancelled
async def serve_store(
    engine: StoreEngine,
    ref: StoreRef,
    inbox: Mailbox,
    *,
    durability: str = "sync",
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the store's mailbox. Returns only when the inbox is closed, or when cancelled.

    The ref's ``publish`` is called synchronously with each batch's committed operations,
    after the commit and before any caller is answered, so a caller that got its reply reads
    caches that already hold its write.
    """
    counters = ref._counters
    pending: list[Envelope] = []
    writer = WriterThread(engine.env) if isinstance(engine, Engine) and engine.commits_on_thread else None
    async with trio.open_nursery() as nursery:
        if durability == "os":
            nursery.start_soon(_sync_periodically, engine)
        if writer is not None:
            writer.start()
            assert isinstance(engine, Engine)  # only LMDB has a writer thread
            engine.stop_writer = writer.stop
            turns = GiveTurns(writer)
            trio.lowlevel.add_instrument(turns)
        task_status.started()
        try:
            async for first in inbox:
                pending = [first]
                # One schedule point first, so the callers woken with the first one's sender join
                # its batch (a caller that finds others in flight sends without yielding first).
                await trio.lowlevel.cancel_shielded_checkpoint()
                size = _size(first[0])
                while len(pending) < MAX_BATCH_COMMANDS and size < MAX_BATCH_BYTES:
                    try:
                        envelope = inbox.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    pending.append(envelope)
                    size += _size(envelope[0])
                commands = [command for command, _ in pending]
                traces = [None if reply is None else reply.trace for _, reply in pending]
                if writer is not None:  # the loop runs on while the writer thread commits
                    results, operations = await _commit_on_writer(engine, writer, commands, counters, traces)
                    publish_committed(ref._publish, operations)
                elif engine.commits_on_thread:  # the loop runs on while the server commits
                    results, operations = await trio.to_thread.run_sync(apply_batch, engine, commands, counters,
                                                                        traces)
                    publish_committed(ref._publish, operations)
                else:
                    results = commit_batch(engine, commands, ref._publish, counters, traces)
                for (_, reply), (ok, value) in zip(pending, results):
                    if reply is not None:
                        reply.resolve(ok, value)
                pending = []
        finally:
            # One error per caller: callers raise theirs at once, each with its own traceback.
            def closed() -> RuntimeClosedError:
                return RuntimeClosedError("the store actor stopped before answering")

            for _, reply in pending:
                if reply is not None:
                    reply.resolve(False, closed())  # ignored by a reply already answered
            # Closing drops what is still queued; answer it first, or its callers wait forever.
            inbox.drain(lambda command: closed())
            if writer is not None:
                trio.lowlevel.remove_instrument(turns)
                writer.stop()  # ends the transaction it held: the store can be closed now
                assert isinstance(engine, Engine)
                engine.stop_writer = None
            nursery.cancel_scope.cancel()


def runs_unnested(command: Any) -> bool:
    """An append checks all it can be refused for before it writes: it needs no nested transaction."""
    return type(command) is AppendItem


def _apply_growing(engine: StoreEngine, commands: list[Any]) -> tuple[list[tuple[bool, Any]], list[Operation]]:
    """Apply a batch, growing the map and retrying when it is full (between batches: no txn open).

    Raises ``StoreFullError`` when the map can't grow (the disk can't hold more, or this
    process can't map more), or when the disk refuses the write.
    """
    while True:
        try:
            return engine.apply(commands, execute, runs_unnested)
        except lmdb.MapFullError:
            assert isinstance(engine, Engine)  # only LMDB has a map
            _grow_map(engine)


async def _commit_on_writer(
    engine: StoreEngine, writer: WriterThread, commands: list[Any], counters: _Counters, traces: Sequence[Any] = (),
) -> tuple[list[tuple[bool, Any]], list[Operation]]:
    """``apply_batch`` with the commit on the writer thread: fill its transaction here, await its
    commit (not cancellable: the commit is underway, and its callers get what it did)."""
    assert isinstance(engine, Engine)  # only LMDB has a writer thread
    started = time.perf_counter()
    try:
        with tracing.committing(engine, len(commands), traces):
            prepared = await _fill_and_commit(engine, writer, commands)
    except (StoreFullError, StoreCorruptError) as refused:
        logger.warning("store batch of %d commands refused: %s", len(commands), refused)
        return [(False, _copy_refusal(refused)) for _ in commands], []
    results, operations = engine.committed(prepared)
    _count(counters, len(commands), started)
    return results, operations


async def _fill_and_commit(engine: Engine, writer: WriterThread, commands: list[Any]) -> Any:
    """Fill the writer thread's transaction with ``commands`` and await its commit, growing the map
    and trying again when it is full; what ``Engine.prepare`` made of them."""
    while True:
        try:
            prepared = engine.prepare(commands, execute, runs_unnested, writer)
        except lmdb.MapFullError:
            writer.end()  # the map can't be resized under an open transaction
            _grow_map(engine)
            continue
        if prepared.txn is None:
            return prepared
        error = await await_commit(writer)
        if error is None:
            return prepared
        if isinstance(error, lmdb.MapFullError):  # the writer holds no transaction now
            _grow_map(engine)
            continue
        refusal = engine.write_refusal(error) if isinstance(error, lmdb.Error) else error
        if refusal is error:
            raise error
        raise refusal from error


async def await_commit(writer: WriterThread) -> BaseException | None:
    """Hand the filled transaction to the writer thread and wait for its commit: what it raised, or None.
    Not cancellable: the commit is underway, and its callers get what it did."""
    writer.commit()
    with trio.CancelScope(shield=True):
        await trio.lowlevel.wait_readable(writer.ready)
    return writer.landed()


class GiveTurns(trio.abc.Instrument):
    """While a commit is out: before a scheduler pass that won't sleep, if the writer thread waits
    for the GIL, hand it its turn (store/writer.py says why: otherwise the thread may wait for
    seconds behind a busy loop). A pass that sleeps in ``epoll`` leaves the GIL free anyway.
    Installed for the store actor's life: between commits a pass costs it one attribute check."""

    def __init__(self, writer: WriterThread) -> None:
        self._writer = writer

    def before_io_wait(self, timeout: float) -> None:
        if timeout < BUSY_WAIT_S:
            self._writer.offer_turn()


def _grow_map(engine: Engine) -> None:
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


@trio.lowlevel.enable_ki_protection  # a task of its own: not covered by serve_store's protection
async def _sync_periodically(engine: StoreEngine) -> None:
    # durability="os": commits are not flushed; flush them at least this often.
    while True:
        await trio.sleep(OS_SYNC_INTERVAL_S)
        try:
            engine.sync()
        except lmdb.Error as exc:  # a full or failing disk: the next flush tries again
            logger.warning("flushing the store failed: %s", exc)
