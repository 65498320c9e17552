"""The store actor: the only writer. One mailbox, group commit, replies, commit events.

``serve_store`` blocks for one envelope, drains whatever else is queued (up to a cap), commits
the whole batch in ONE write transaction, publishes the committed operations to subscribers,
then answers every caller with its own result or error. Appends run unnested in a batch
(``Engine.prepare``'s ``unnested``).

How a batch is committed is the engine's business, as a transport is httpx's: the engine hands
the actor one ``Committer`` (store/committer.py) and the actor has one commit path. LMDB under
durability "os" commits inline (nothing to flush); durably, on its writer thread while the loop
serves everything else, or inline while the flush measures fast and nobody else waits
(store/committer_lmdb.py); PostgreSQL on a worker thread. Callers are answered only after the
commit returned: for a durable LMDB store, after its meta page is on disk.

Failures are answered, not fatal (L6). A batch the disk or the map can't take answers each of
its callers ``StoreFullError`` (nothing of it was written) and the actor serves the next one.
Publishing happens after the commit: whatever a subscriber raises is logged and dropped, so a
caller whose write landed always gets its result, and the actor keeps serving.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import attrs
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
from .committer import Applied, Apply, CommitLone, Committer
from .interface import StoreEngine
from .protocol import (
    AppendItem,
    Atomically,
    CreateBranch,
    DeleteBranch,
    EditItem,
    RecordSwitch,
    RegisterState,
    RemoveItems,
    SetValue,
)
from .records import Operation

logger = logging.getLogger("ctxrt.store")
R = TypeVar("R")

MAILBOX_CAPACITY = 1000
MAX_BATCH_COMMANDS = 256
MAX_BATCH_BYTES = 1 << 20  # ~1 MB keeps one durable commit to a few ms of loop time


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

    ``ask`` is ``Mailbox.ask`` with the actor's commit step as its ``alone`` option: a caller that
    is the only one asking, with nothing unanswered, whose committer would commit on the trio
    thread now (durability "os"; a durable LMDB store whose flush measures fast on an idle loop;
    never PostgreSQL), runs the commit step itself instead of waking the actor: the same
    synchronous critical section (one write transaction, publish, answer), in the same order, minus
    a task hop. As soon as two callers overlap, everything goes through the mailbox and commits in
    groups; a caller that finds others in flight sends at once, without a schedule point of its own
    before the send (its wait for the reply is one), so an append costs one task switch there.
    """

    def __init__(
        self, mailbox: Mailbox, counters: _Counters, engine: StoreEngine, committer: Committer,
        publish: Callable[[Sequence[Operation]], None],
    ) -> None:
        self._mailbox = mailbox
        self._counters = counters
        self._committer = committer
        self._publish = publish
        # A lone caller's own commit step: on the trio thread (durability "os"), else handed to the
        # writer thread from the caller's task (a durable LMDB store, PostgreSQL's worker).
        self._alone: Callable[[Any], Awaitable[tuple[bool, Any] | None]] | None = None
        if committer.commit_now is not None:
            self._alone = functools.partial(commit_alone, engine, committer.commit_now, publish=publish,
                                            counters=counters)
        elif committer.commit_lone is not None:
            self._alone = functools.partial(commit_lone, engine, committer.commit_lone, publish=publish,
                                            counters=counters)

    def ask(self, command: Ask[R]) -> Coroutine[Any, Any, R]:
        """Send ``command`` and wait for its committed result (awaited: the mailbox's own ask,
        handed out as it is, so an append doesn't pay for a coroutine of its own here).

        Raises the error that refused the command (the store is then unchanged by it), or
        ``RuntimeClosedError`` if the actor has stopped. If cancelled after sending, the command
        may still commit; its result is dropped.

        A caller that is the only one asking, with nothing unanswered, runs the actor's commit step
        in its own task (``Mailbox.ask``'s ``alone``): on the trio thread when the committer commits
        there, else handing its commit to the writer thread itself (a durable LMDB store, while its
        flush measures fast and the loop is idle), sparing the hop to the actor and back; callers
        arriving meanwhile go through the mailbox, and the actor fills their transaction once the
        lone commit landed.
        """
        return self._mailbox.ask(command, alone=self._alone)

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
                                command.flagged, command.followed)
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
        case RecordSwitch():
            return batch.record_switch(command.from_branch, command.to_branch)
        case Atomically():
            return tuple(execute(batch, inner) for inner in command.commands)
    raise TypeError(f"not a store command: {command!r}")


def open_store_actor(engine: StoreEngine, publish: Callable[[Sequence[Operation]], None]) -> tuple[StoreRef, Mailbox]:
    """The actor's handle and mailbox, over the committer ``engine`` hands it; ``serve_store`` serves them."""
    mailbox = Mailbox(MAILBOX_CAPACITY, lambda command: RuntimeClosedError("the store actor has stopped"))
    return StoreRef(mailbox, _Counters(), engine, engine.committer(execute, runs_unnested), publish), mailbox


def runs_unnested(command: Any) -> bool:
    """An append checks all it can be refused for before it writes: it needs no nested transaction."""
    return type(command) is AppendItem


_REFUSALS = (StoreFullError, StoreCorruptError, StoreUnavailableError)


@trio.lowlevel.enable_ki_protection  # Ctrl-C waits for the commit step's end: never between commit and answer
async def commit_alone(
    engine: StoreEngine, commit_now: Apply, command: Any, publish: Callable[[Sequence[Operation]], None],
    counters: _Counters,
) -> tuple[bool, Any]:
    """The actor's commit step for a lone caller, in its own task (``Mailbox.ask``'s ``alone``), on
    a committer that commits on the trio thread: its one command's ``(ok, result or error)``."""
    started = time.perf_counter()
    try:
        with tracing.committing(engine, 1):
            results, operations = commit_now([command])
    except _REFUSALS as refused:
        return _refused(refused, 1)[0]
    _count(counters, 1, started)
    publish_committed(publish, operations)
    return results[0]


@trio.lowlevel.enable_ki_protection  # Ctrl-C waits for the commit step's end: never between commit and answer
async def commit_lone(
    engine: StoreEngine, commit_lone: CommitLone, command: Any, publish: Callable[[Sequence[Operation]], None],
    counters: _Counters,
) -> tuple[bool, Any] | None:
    """The actor's commit step for a lone caller, in its own task, on a committer whose commits wait
    (``Mailbox.ask``'s ``alone``): its one command's ``(ok, result or error)``, or None if the committer can't
    take it now (the caller goes through the mailbox). Cancelled, the commit goes on (the committer
    lands it) and publishes; only the answer is lost."""
    started = time.perf_counter()

    def landed(applied: Applied) -> None:
        _count(counters, 1, started)
        publish_committed(publish, applied[1])

    under_way = commit_lone([command], landed)
    if under_way is None:
        return None
    try:
        with tracing.committing(engine, 1):
            results, _ = await under_way
    except _REFUSALS as refused:
        return _refused(refused, 1)[0]
    return results[0]


async def commit(
    engine: StoreEngine, committer: Committer, commands: list[Any], counters: _Counters, traces: Sequence[Any],
) -> tuple[list[tuple[bool, Any]], list[Operation]]:
    """One batch's write transaction through the committer: each command's ``(ok, result or error)``
    and the committed operations. A batch the disk or the map refuses gives every command its own
    ``StoreFullError`` (or ``StoreCorruptError``, ``StoreUnavailableError``), nothing committed.
    ``traces``: the trace contexts its callers sent."""
    started = time.perf_counter()
    try:
        with tracing.committing(engine, len(commands), traces):
            results, operations = await committer.commit(commands)
    except _REFUSALS as refused:
        return _refused(refused, len(commands)), []
    _count(counters, len(commands), started)
    return results, operations


def _refused(refused: StoreFullError | StoreCorruptError | StoreUnavailableError, commands: int) -> list[tuple[bool, Any]]:
    logger.warning("store batch of %d commands refused: %s", commands, refused)
    return [(False, _copy_refusal(refused)) for _ in range(commands)]


def _count(counters: _Counters, commands: int, started: float) -> None:
    counters.last_commit_ms = (time.perf_counter() - started) * 1000
    counters.last_batch_size = commands
    counters.batches += 1
    counters.commands += commands
    counters.largest_batch = max(counters.largest_batch, commands)


def publish_committed(publish: Callable[[Sequence[Operation]], None], operations: list[Operation]) -> None:
    """Hand the committed operations to the subscribers; a failure there is logged and never
    changes a committed command's result (L6)."""
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
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the store's mailbox through the ref's committer. Returns only when the inbox is closed,
    or when cancelled (the inbox is closed then too: a lone caller can't commit past the actor).

    The ref's ``publish`` is called synchronously with each batch's committed operations,
    after the commit and before any caller is answered, so a caller that got its reply reads
    caches that already hold its write.
    """
    counters, committer = ref._counters, ref._committer
    pending: list[Envelope] = []
    async with trio.open_nursery() as nursery:
        committer.start()
        nursery.start_soon(committer.tend)
        task_status.started()
        try:
            async for first in inbox:
                pending = [first]
                # One schedule point first, so the callers woken with the first one's sender join
                # its batch (a caller that finds others in flight sends without yielding first).
                await trio.lowlevel.cancel_shielded_checkpoint()
                inbox.receive_queued(pending, MAX_BATCH_COMMANDS, _size, MAX_BATCH_BYTES - _size(first[0]))
                commands = [command for command, _ in pending]
                traces = [None if reply is None else reply.trace for _, reply in pending]
                # The loop may run on while the committer waits (a writer thread, a server).
                results, operations = await commit(engine, committer, commands, counters, traces)
                publish_committed(ref._publish, operations)
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
            await committer.settle()  # a lone caller's commit out lands before the writer stops
            committer.stop()  # a writer thread ends the transaction it held: the store can be closed now
            nursery.cancel_scope.cancel()
