"""``open_runtime`` and ``Runtime``: the root nursery, the store actor, the registries."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from .errors import ReadOnlyStoreError, RuntimeClosedError
from .store.actor import StoreRef, open_store_actor, serve_store
from .store.engine import Engine, Operation
from .store.environment import Durability, StoreHandle, close_store, open_store
from .store.protocol import BranchInfo, CreateBranch, DeleteBranch, branch_info


@attrs.frozen
class RuntimeStatistics:
    mailbox_depth: int
    last_batch_size: int
    last_commit_ms: float
    batches: int
    commands: int
    largest_batch: int
    namespace_actors: int
    slot_caches: int


class Runtime:
    """One open store and everything running over it. Made by ``open_runtime``."""

    def __init__(self, handle: StoreHandle, nursery: trio.Nursery, model: Any) -> None:
        self.path: Path = handle.path
        self.readonly = handle.readonly
        self.model = model
        self._handle = handle
        self._nursery = nursery
        self._store: StoreRef | None = None
        self._closed = False

    # -- plumbing used by the rest of the package ------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._handle.engine

    @property
    def store(self) -> StoreRef:
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        if self._store is None:
            raise ReadOnlyStoreError(f"the runtime on {self.path} was opened read-only; it refuses every write")
        return self._store

    def _publish(self, operations: Sequence[Operation]) -> None:
        """Called by the store actor after each commit (slot caches subscribe here)."""

    # -- branches ---------------------------------------------------------------------------

    def _info(self, row: Any) -> BranchInfo:
        parent = None if row.parent is None else self.engine.branch_by_id(row.parent).name
        return branch_info(row, parent)

    async def list_branches(self) -> list[BranchInfo]:
        """Every live branch, oldest first.

        Raises:
            RuntimeClosedError: the runtime is closed.
        """
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        return [self._info(row) for row in self.engine.list_branches()]

    async def create_branch(self, name: str, *, from_branch: str = "main", at_sequence: int | None = None) -> BranchInfo:
        """Fork ``from_branch`` as of ``at_sequence`` (default: now) into a new branch ``name``.

        The child sees exactly what the parent held at that sequence; later writes on either
        side are invisible to the other. Costs one row whatever the store holds (K2).

        Raises:
            BranchExistsError: ``name`` is taken.
            BranchNotFoundError: ``from_branch`` doesn't exist.
            MalformedContentError: a bad name or an ``at_sequence`` outside ``[0, now]``.
            ReadOnlyStoreError: the runtime is read-only.
            RuntimeClosedError: the runtime is closed.

        If cancelled after sending, the branch may still be created.
        """
        row = await self.store.ask(CreateBranch(name=name, from_branch=from_branch, at_sequence=at_sequence))
        return self._info(row)

    async def delete_branch(self, name: str) -> None:
        """Delete branch ``name``: its name is freed; descendants keep reading its rows.

        Raises:
            BranchNotFoundError: no such branch.
            MalformedContentError: ``name`` is ``"main"``.
            ReadOnlyStoreError, RuntimeClosedError: as for ``create_branch``.
        """
        await self.store.ask(DeleteBranch(name=name))

    def statistics(self) -> RuntimeStatistics:
        """Mailbox depth, last batch size and commit time of the store actor, and registry sizes."""
        if self._store is None:
            return RuntimeStatistics(0, 0, 0.0, 0, 0, 0, 0, 0)
        stats = self._store.statistics()
        return RuntimeStatistics(
            stats.mailbox_depth,
            stats.last_batch_size,
            stats.last_commit_ms,
            stats.batches,
            stats.commands,
            stats.largest_batch,
            0,
            0,
        )


@asynccontextmanager
async def open_runtime(
    path: str | os.PathLike[str],
    *,
    model: Any = None,
    readonly: bool = False,
    durability: Durability = "sync",
    map_size: int = 1 << 36,
) -> AsyncIterator[Runtime]:
    """Open the store at ``path`` (creating it unless ``readonly``) and start its store actor.

    Leaving the block closes every manager, lets the store actor answer what is queued, stops
    the actors, and syncs and closes the environment.

    Raises:
        StoreLockedError: another runtime, in this process or another, writes this store.
        StoreFormatError: not a ctxrt store, or a format this version doesn't read.
        FileNotFoundError: ``readonly`` and no store is there.

    Like any trio nursery owner, it may raise an ``ExceptionGroup`` if an actor crashes.
    """
    handle = open_store(path, readonly=readonly, durability=durability, map_size=map_size)
    try:
        async with trio.open_nursery() as nursery:
            runtime = Runtime(handle, nursery, model)
            if not readonly:
                ref, inbox = open_store_actor()
                await nursery.start(
                    lambda task_status: serve_store(
                        handle.engine, ref, inbox, publish=runtime._publish, durability=durability,
                        task_status=task_status,
                    )
                )
                runtime._store = ref
            try:
                yield runtime
            finally:
                runtime._closed = True
                if runtime._store is not None:
                    # Let the actor answer what is queued, then stop.
                    runtime._store._send.close()
    finally:
        close_store(handle)
