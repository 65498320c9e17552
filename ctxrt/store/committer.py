"""Committers: how a batch the store actor gathered gets committed, one kind per engine.

As httpx's client hides its transports, the store actor sees only ``Committer``: the engine hands
it one (``StoreEngine.committer``) and the actor has one commit path whatever the engine. Each
commits the whole batch in one write transaction and returns each command's ``(ok, result or
error)`` with the committed operations, or raises what refused the whole batch
(``StoreFullError``, ``StoreCorruptError``, ``StoreUnavailableError``).

- ``InlineCommitter``: the commit is quick (LMDB under durability "os": nothing is flushed), so it
  runs on the trio thread, in the actor or in a lone caller's own task (``commit_now``).
- ``WorkerCommitter``: the commit waits on a server (PostgreSQL): the whole batch on a worker
  thread while the loop runs on, handed there by the actor or by a lone caller's own task.
- LMDB's durable committer (store/committer_lmdb.py): its writer thread, with turn-giving and the
  map's growth; an idle loop blocks for a commit whose flush measures fast.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from .records import Operation

logger = logging.getLogger("ctxrt.store")

Applied = tuple[list[tuple[bool, Any]], list[Operation]]
Apply = Callable[[list[Any]], Applied]
# A lone caller's commit from its own task, given the commands and what to do with what landed
# (publish it) in whichever task lands it: the commit under way, or None when it can't be taken now.
CommitLone = Callable[[list[Any], Callable[[Applied], None]], Awaitable[Applied] | None]
FLUSH_INTERVAL_S = 1.0  # durability "os": commits are not flushed; flush them at least this often


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


class WorkerCommitter:
    """Commits the whole batch on a worker thread: the commit waits on a server, the loop doesn't.
    A lone caller hands its batch to the thread from its own task (``commit_lone``), sparing it the
    hop to the actor and back (measured: 0.06-0.16 ms of a 1.1 ms PostgreSQL append)."""

    def __init__(self, apply: Apply) -> None:
        self._apply = apply
        self.commit_now: Apply | None = None
        self.commit_lone: CommitLone | None = self._commit_lone
        self._out = trio.Lock()  # one batch on the thread at a time, the actor's or a lone caller's

    def start(self) -> None:
        """Nothing to start: trio's worker threads."""

    def stop(self) -> None:
        """Nothing to stop."""

    async def settle(self) -> None:
        """Wait for a lone caller's batch still on the thread to land."""
        with trio.CancelScope(shield=True):
            async with self._out:
                pass

    async def commit(self, commands: list[Any]) -> Applied:
        async with self._out:
            return await trio.to_thread.run_sync(self._apply, commands)

    def _commit_lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Awaitable[Applied] | None:
        """``commit`` from a lone caller's task; None while a batch is on the thread. Not
        cancellable once handed over: a caller cancelled meanwhile leaves once it landed."""
        if self._out.locked():
            return None
        return self._lone(commands, on_landed)

    async def _lone(self, commands: list[Any], on_landed: Callable[[Applied], None]) -> Applied:
        async with self._out:
            applied = await trio.to_thread.run_sync(self._apply, commands)
            on_landed(applied)
            return applied

    async def tend(self) -> None:
        """Nothing to tend: the server flushes its own log."""
