"""``open_runtime`` and ``Runtime``: the root nursery, the store actor, the registries."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .errors import ConfigConflictError, ReaderConflictError, ReadOnlyStoreError, RuntimeClosedError
from .namespace.actor import (
    ActorRetired,
    NamespaceActor,
    NamespaceConfig,
    auxiliary_state,
    build_strategy,
    normalise_namespace,
    read_record,
    require_marking,
    resolve_reader,
    slot_state,
)
from .slots import SlotRegistry
from .store.actor import StoreRef, StoreStatistics, open_store_actor, serve_store
from .store.engine import Engine, Operation
from .store.environment import Durability, StoreHandle, close_store, open_store
from .store.protocol import Atomically, BranchInfo, CreateBranch, DeleteBranch, SetValue, branch_info
from .strategies.passthrough import Passthrough
from .trio_guard import require_trio

if TYPE_CHECKING:
    from .manager import ContextManager, Derivation


@attrs.frozen
class NamespaceInfo:
    namespace: str
    reader: str | None
    narrowing_floor: int


@attrs.frozen
class RuntimeStatistics(StoreStatistics):
    """The store actor's figures plus how many namespace actors and slot caches are live."""

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
        self.slots = SlotRegistry(handle.engine, live=not handle.readonly)
        self._actors: dict[tuple[str, str], NamespaceActor] = {}

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
        """Called by the store actor after each commit: slot caches bring themselves up to date."""
        self.slots.publish(operations)

    # -- namespaces and managers ------------------------------------------------------------

    async def open(
        self, namespace: str | None = None, *, strategy: Any = None, view_reader: str | None = None,
        branch: str = "main", isolate: bool = False, view_filter: Any = None,
        auxiliary_views: Sequence[str | None] = (), model: Any = None,
    ) -> ContextManager:
        """Open a manager on ``namespace`` (None, "" and "default" are one) on ``branch``.

        The first open of a (branch, namespace) starts its namespace actor with this strategy
        (default ``Passthrough()``), view filter and model; a later open while it runs must pass
        None or equal settings. An open with a ``view_reader`` claims an unclaimed namespace;
        one without compiles for the reader the namespace records (spec/audience.md C1, C6).

        Raises:
            ValueError: ``view_reader=""``, or bad options (``isolate`` without a namespace...).
            ReaderConflictError: the namespace records another reader (nothing is written).
            StrategyRefusedError: a strategy that doesn't mark compression reads, under a reader.
            ConfigConflictError: settings that disagree with the running namespace actor.
            BranchNotFoundError: no such branch.
            ReadOnlyStoreError: a read-only runtime (it can't register or claim).
        """
        from .manager import ContextManager

        if view_reader is not None and (not isinstance(view_reader, str) or not view_reader):
            raise ValueError(f"view_reader must be a non-empty string or None, not {view_reader!r}")
        name = normalise_namespace(namespace)
        if isolate and namespace in (None, ""):
            raise ValueError('"isolate" requires a namespace to be set')
        own = slot_state(name, isolate)
        auxiliary: list[str] = []
        for index, aux in enumerate(auxiliary_views):
            state = auxiliary_state(aux)
            if state == own:
                raise ValueError(
                    f"auxiliary_views[{index}]: {aux!r} is this manager's own message slot {own!r}; merging "
                    f"it would duplicate every message"
                )
            if state not in auxiliary:
                auxiliary.append(state)
        self.engine.branch(branch)
        config = NamespaceConfig(name, own, tuple(auxiliary), view_filter, strategy or Passthrough(), model)
        actor, reader = await self._attach(branch, config, view_reader, explicit_strategy=strategy is not None)
        return ContextManager(
            self, actor, reader=reader, explicit_reader=view_reader, isolate=isolate,
            auxiliary_views=tuple(auxiliary_views),
        )

    async def _attach(
        self, branch: str, config: NamespaceConfig, reader: str | None, *, compiles_for_none: bool = False,
        explicit_strategy: bool = False,
    ) -> tuple[NamespaceActor, str | None]:
        key = (branch, config.namespace)
        while True:
            actor = self._actors.get(key)
            if actor is not None:
                await actor.started.wait()
                if actor.start_error is not None:
                    continue  # it failed to start for the open that made it (which raised): try afresh
                self._check_config(actor, config, explicit_strategy)
            else:
                # Refusals come before anything is registered or written (C2).
                record = read_record(self, config.namespace, branch)
                if compiles_for_none and record is not None:
                    resolve_reader(record, None, config.namespace, branch)  # a corrupt record says so
                    raise ReaderConflictError(
                        f"namespace {config.namespace!r} on branch {branch!r} records reader {record!r}; this "
                        f"manager compiles for no reader"
                    )
                target = resolve_reader(record, reader, config.namespace, branch)
                require_marking(build_strategy(config.strategy), target, config.namespace)
                actor = NamespaceActor(self, branch, config)
                self._actors[key] = actor
                try:
                    await actor.start()
                except BaseException:
                    self._actors.pop(key, None)
                    raise
            try:
                # In the actor's mailbox order: C7 and the claim; a refusal stops an actor this attach
                # started, leaving nothing running there (C2).
                resolved = await actor.attach(reader, compiles_for_none=compiles_for_none)
            except ActorRetired:
                continue  # its last manager left while this waited: start a fresh one
            except BaseException:
                if actor.managers == 0:
                    self._stop_actor(actor)
                raise
            return actor, resolved

    def _check_config(self, actor: NamespaceActor, config: NamespaceConfig, explicit_strategy: bool) -> None:
        running = actor.config
        where = f"namespace {config.namespace!r} on branch {actor.branch!r}"
        if explicit_strategy and config.strategy != actor.strategy_config:
            raise ConfigConflictError(
                f"{where} runs strategy {actor.strategy_config!r}; this open asked for {config.strategy!r}"
            )
        if config.view_filter is not None and config.view_filter is not running.view_filter:
            raise ConfigConflictError(f"{where} runs with another view_filter")
        if config.slot != running.slot or config.auxiliary != running.auxiliary:
            raise ConfigConflictError(
                f"{where} reads slots {(running.slot, *running.auxiliary)}; this open asked for "
                f"{(config.slot, *config.auxiliary)}"
            )

    def _detach(self, actor: NamespaceActor) -> None:
        actor.detach()
        if actor.managers <= 0:
            self._stop_actor(actor)

    def _stop_actor(self, actor: NamespaceActor) -> None:
        actor.stop()
        if self._actors.get((actor.branch, actor.namespace)) is actor:
            del self._actors[(actor.branch, actor.namespace)]

    async def _derive(
        self, parent: ContextManager, *, branch: str, strategy: Any, at_sequence: int | None, model: Any
    ) -> ContextManager:
        from .manager import ContextManager, Derivation

        actor = parent._open()
        actor._require_strategy()  # C12
        # The head's record decides (C11): a no-reader parent's child takes what the head records.
        child_reader = resolve_reader(actor.record, parent.view_reader, actor.namespace, actor.branch)
        config = attrs.evolve(
            actor.config, strategy=strategy if strategy is not None else actor.strategy_config,
            model=model if model is not None else actor.config.model,
        )
        require_marking(build_strategy(config.strategy), child_reader, actor.namespace)
        commands: list[Any] = [CreateBranch(name=branch, from_branch=actor.branch, at_sequence=at_sequence)]
        if child_reader is not None:
            commands.append(SetValue(state=actor.reader_state, branch=branch, value=child_reader))
        await self.store.ask(Atomically(commands=tuple(commands)))
        child, resolved = await self._attach(branch, config, child_reader)
        derivation = Derivation(
            parent_branch=actor.branch, branch=branch, namespace=actor.namespace, at_sequence=at_sequence,
            reader=resolved, isolate=parent._isolate, auxiliary_views=parent._auxiliary_views,
        )
        return ContextManager(
            self, child, reader=resolved, explicit_reader=None, isolate=parent._isolate,
            auxiliary_views=parent._auxiliary_views, derivation=derivation,
        )

    async def reopen_derived(self, derivation: Derivation, *, strategy: Any = None, model: Any = None) -> ContextManager:
        """Reopen a manager ``derive`` made, after a restart; it compiles for the reader its branch records (C11).

        Raises:
            BranchNotFoundError: the derivation's branch is gone.
            ReaderConflictError, StrategyRefusedError, ConfigConflictError: as ``open``.
        """
        manager = await self.open(
            derivation.namespace, strategy=strategy, branch=derivation.branch, isolate=derivation.isolate,
            auxiliary_views=derivation.auxiliary_views, model=model,
        )
        manager.derivation = derivation
        return manager

    async def list_namespaces(self, branch: str = "main") -> list[NamespaceInfo]:
        """Every namespace with a reader record state on ``branch``, with its reader and floor.

        Raises:
            BranchNotFoundError: no such branch.
        """
        await trio.lowlevel.checkpoint()
        row = self.engine.branch(branch)
        found = []
        with self.engine.reader() as txn:
            for info in self.engine.list_states():
                if not info.name.endswith("/reader"):
                    continue
                namespace = info.name[: -len("/reader")]
                reader, _ = self.engine.get_value(txn, info.name, row)
                floor_state = f"{namespace}/narrowing-floor"
                floor = self.engine.get_value(txn, floor_state, row)[0] if self.engine.has_state(floor_state) else 0
                found.append(NamespaceInfo(namespace, reader if isinstance(reader, str) else None, floor or 0))
        return found

    # -- branches ---------------------------------------------------------------------------

    def _info(self, row: Any) -> BranchInfo:
        parent = None if row.parent is None else self.engine.branch_by_id(row.parent).name
        return branch_info(row, parent, self.engine.head_sequence(row))

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
            len(self._actors),
            len(self.slots),
        )


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """Re-raise a lone exception from the runtime's nursery as itself, not as a group of one."""
    try:
        yield
    except BaseExceptionGroup as group:
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if inner is group:
            raise
        raise inner from None


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
    the actors, closes ``model`` (an ``AnthropicModel`` closes the client it made; a client
    handed to it stays its owner's), and syncs and closes the environment.

    Raises:
        StoreLockedError: another runtime, in this process or another, writes this store.
        StoreFormatError: not a ctxrt store, or a format this version doesn't read.
        FileNotFoundError: ``readonly`` and no store is there.
        NotTrioError: awaited under asyncio (or any library but trio); nothing is opened.

    An error raised in the block comes out as itself; only several at once (an actor crashing
    beside the block's own error) come out as an ``ExceptionGroup``.
    """
    require_trio("ctxrt.open_runtime")
    handle = open_store(path, readonly=readonly, durability=durability, map_size=map_size)
    try:
        async with _unwrapped(), trio.open_nursery() as nursery:
            runtime = Runtime(handle, nursery, model)
            if not readonly:
                ref, inbox = open_store_actor(handle.engine, runtime._publish)
                await nursery.start(
                    lambda task_status: serve_store(
                        handle.engine, ref, inbox, durability=durability, task_status=task_status
                    )
                )
                runtime._store = ref
            try:
                yield runtime
            finally:
                runtime._closed = True
                for actor in list(runtime._actors.values()):
                    runtime._stop_actor(actor)
                if runtime._store is not None:
                    # Let the actor answer what is queued, then stop.
                    runtime._store.close()
                close_model = getattr(model, "aclose", None)
                if close_model is not None:
                    with trio.CancelScope(shield=True):  # the runtime owns its model's client (DESIGN.md §9)
                        await close_model()
    finally:
        close_store(handle)
