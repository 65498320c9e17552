"""``open_runtime`` and ``Runtime``: the root nursery, the store actor, the registries."""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import checks
from .content.blocks import Message
from .host_state import HostState
from .errors import ManagerClosedError, MalformedContentError, ReadOnlyStoreError, RuntimeClosedError
from .mailbox import Mailbox
from .manager import ContextManager, switch_managers
from .models.model import Model
from .namespace import states
from .namespace.actor import MODEL_TIMEOUT_S
from .namespace.machine import build_strategy
from .namespace.protocol import NamespaceConfig
from .namespace.registry import NamespaceRegistry, NamespaceStatistics, new_token
from .slots import SlotRegistry
from .store.actor import StoreRef, StoreStatistics, open_store_actor, serve_store
from .store.committer import drop_instrument
from .store.environment import Durability, StoreHandle, close_store, open_store
from .store.files import check_pages as check_store_pages
from .store.interface import StoreEngine
from .store.protocol import (
    BranchInfo,
    CreateBranch,
    DeleteBranch,
    branch_info,
    describe_branches,
)
from .store.records import BranchDeleted, Operation
from .store.urls import is_postgres_url
from .strategies.base import Strategy, StrategyConfig
from .strategies.passthrough import Passthrough
from .content.tokens import TokenEstimator
from .trio_guard import require_trio

if TYPE_CHECKING:
    from .branching import Derivation

logger = logging.getLogger("ctxrt.runtime")

@attrs.frozen
class NamespaceInfo:
    namespace: str
    reader: str | None
    narrowing_floor: int


@attrs.frozen
class RuntimeStatistics(StoreStatistics):
    """The store actor's figures, how many namespace actors and slot caches are live, and each
    namespace actor's mailbox depth and model calls out."""

    namespace_actors: int
    slot_caches: int
    namespaces: tuple[NamespaceStatistics, ...] = ()


class _TaskSteps(trio.abc.Instrument):
    """Counts the loop's task steps. A step runs without an await, so reads within one see one
    snapshot; a slot cache of a shared store asks for the head at the first read of each step."""

    def __init__(self) -> None:
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += 1

    def counted(self) -> int:
        return self.count


class Runtime:
    """One open store and everything running over it. Made by ``open_runtime``."""

    def __init__(self, handle: StoreHandle, nursery: trio.Nursery, model: Model | None, model_timeout_s: float) -> None:
        self.path: Path | str = handle.path  # a directory, or a database URL without its password
        self.readonly = handle.readonly
        self.model: Model | None = model
        self._handle = handle
        self._store: StoreRef | None = None
        self._store_inbox: Any = None
        if not handle.readonly:
            self._store, self._store_inbox = open_store_actor(handle.engine, self._publish)
        self._closed = False
        # Other processes write a shared store: its caches ask for the slot's head once per task step.
        self._steps = _TaskSteps() if handle.engine.shared else None
        self.slots = SlotRegistry(handle.engine, live=not handle.readonly,
                                  steps=None if self._steps is None else self._steps.counted)
        self._namespaces = NamespaceRegistry(handle.engine, self._store, self.slots, model, nursery,
                                             model_timeout_s=model_timeout_s, store_path=self.path)

    @property
    def engine(self) -> StoreEngine:
        return self._handle.engine

    @property
    def store(self) -> StoreRef:
        """The store actor's handle: for tools and tests that send raw store commands.

        Raises ``RuntimeClosedError`` once closed, ``ReadOnlyStoreError`` in a read-only runtime.
        """
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        if self._store is None:
            standby = " (a hot standby: its primary takes the writes)" if getattr(self._handle.engine, "standby", False) else ""
            raise ReadOnlyStoreError(f"the runtime on {self.path}{standby} was opened read-only; it refuses every write")
        return self._store

    def _publish(self, operations: Sequence[Operation]) -> None:
        """Called by the store actor after each commit: caches bring themselves up to date, and a
        deleted branch's actors, caches and managers are retired (L5)."""
        self.slots.publish(operations)
        for operation in operations:
            if isinstance(operation, BranchDeleted):
                self._namespaces.retire_branch(operation.row.id, operation.row.name)
                self.slots.drop_branch(operation.row.id)

    # -- namespaces and managers ------------------------------------------------------------

    async def open(
        self, namespace: str | None = None, *, strategy: StrategyConfig | Strategy | None = None,
        view_reader: str | None = None, branch: str = "main", isolate: bool = False,
        view_filter: Callable[[Message], bool] | None = None,
        auxiliary_views: Sequence[str | None] = (), model: Model | None = None,
        token_estimator: TokenEstimator | None = None, ledger: bool | None = None,
    ) -> ContextManager:
        """Open a manager on ``namespace`` (None, "" and "default" are one) on ``branch``.

        The first open of a (branch, namespace) starts its namespace actor with this strategy
        (default ``Passthrough()``), view filter, model and token estimator (default the plain
        estimate; ``CalibratedEstimator()`` learns from the usage its compression requests
        report, stored with the namespace); a later open while it runs must pass None or equal
        settings. An open with a ``view_reader`` claims an unclaimed namespace;
        one without compiles for the reader the namespace records (C1, C6). ``ledger=True`` turns
        the namespace's request ledger on (``record_request``, Q2), ``False`` off; either is stored
        on the branch (a fork inherits it), so an open with None (the default) keeps what it
        records (off if never set). A read-only runtime keeps what is stored.

        Raises:
            TypeError: an argument of the wrong type (named), such as a strategy that isn't one.
            MalformedContentError: ``view_reader=""``, a name that a store can't hold (NUL, a lone
                surrogate), naming the parameter; ``ValueError`` for other bad options
                (``isolate`` without a namespace, the own slot among ``auxiliary_views``).
            ReaderConflictError: the namespace records another reader (nothing is written).
            StrategyRefusedError: a strategy that doesn't mark compression reads, under a reader.
            ConfigConflictError: settings that disagree with the running namespace actor.
            BranchNotFoundError: no such branch.
            RuntimeClosedError: the runtime is closed.

        If cancelled, no manager is made; a claim that already committed stands (L4).
        """
        checks.optional_name(view_reader, "view_reader")  # C4: "" is refused
        if strategy is not None:
            build_strategy(strategy)  # TypeError naming it, before any lookup or attach
        name = states.normalise_namespace(namespace)
        checks.name(branch, "branch")
        if isolate and namespace in (None, ""):
            raise ValueError('"isolate" requires a namespace to be set')
        own = states.slot_state(name, checks.flag(isolate, "isolate"))
        checks.callable_or_none(view_filter, "view_filter")
        if ledger is not None:
            checks.flag(ledger, "ledger")
        _check_model(model)
        if token_estimator is not None and not isinstance(token_estimator, TokenEstimator):
            raise TypeError(f"token_estimator must have estimate(message) and observe(model, estimated, actual), "
                            f"not {type(token_estimator).__name__}")
        auxiliary: list[str] = []
        for index, aux in enumerate(checks.sequence(auxiliary_views, "auxiliary_views")):
            if aux is not None:
                checks.name(aux, f"auxiliary_views[{index}]", max_bytes=states.MAX_NAMESPACE_BYTES)
            state = states.auxiliary_state(aux)
            if state == own:
                raise ValueError(
                    f"auxiliary_views[{index}]: {aux!r} is this manager's own message slot {own!r}; merging "
                    f"it would duplicate every message"
                )
            if state not in auxiliary:
                auxiliary.append(state)
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        row = self.engine.branch(branch)
        config = NamespaceConfig(name, own, tuple(auxiliary), view_filter,
                                 strategy if strategy is not None else Passthrough(), model, token_estimator, ledger)
        token = new_token()
        ref, reader = await self._namespaces.attach(row, config, view_reader, token,
                                                    explicit_strategy=strategy is not None)
        return ContextManager(
            self._namespaces, ref, token, reader=reader, explicit_reader=view_reader, isolate=isolate,
            auxiliary_views=tuple(auxiliary_views),
        )

    async def reopen_derived(
        self, derivation: Derivation, *, view_filter: Callable[[Message], bool] | None = None,
        token_estimator: TokenEstimator | None = None, strategy: StrategyConfig | Strategy | None = None,
        model: Model | None = None,
    ) -> ContextManager:
        """Reopen a manager ``derive`` made, after a restart; it compiles for the reader its branch
        records (C11). ``view_filter`` and ``token_estimator`` are the derived manager's as
        ``open`` takes them: functions no ``Derivation`` holds, so a host hands them again. A
        derivation made through a view filter (``derivation.filtered``) reopened without one warns
        (``RuntimeWarning``) that its view now holds what the filter left out (R2).

        Raises:
            TypeError: ``derivation`` is not a ``Derivation``.
            BranchNotFoundError: the derivation's branch is gone.
            ReaderConflictError, StrategyRefusedError, ConfigConflictError: as ``open``.
        """
        from .branching import Derivation

        if not isinstance(derivation, Derivation):
            raise TypeError(f"derivation must be a Derivation, not {type(derivation).__name__}")
        if derivation.filtered and view_filter is None:
            warnings.warn(
                f"the derived manager of {derivation.namespace!r} on branch {derivation.branch!r} was made through a "
                "view filter, and is reopened without one: its view now holds what the filter left out; pass "
                "view_filter= to reopen_derived", RuntimeWarning, stacklevel=2)
        manager = await self.open(
            derivation.namespace, strategy=strategy, branch=derivation.branch, isolate=derivation.isolate,
            auxiliary_views=derivation.auxiliary_views, model=model, view_filter=view_filter,
            token_estimator=token_estimator,
        )
        manager.derivation = derivation
        return manager

    async def list_namespaces(self, branch: str = "main") -> list[NamespaceInfo]:
        """Every namespace with a reader record state on ``branch``, with its reader and floor.

        Raises:
            BranchNotFoundError: no such branch.
        """
        await trio.lowlevel.checkpoint()
        row = self.engine.branch(checks.name(branch, "branch"))
        found = []
        for info in self.engine.list_states():
            namespace = states.namespace_of_reader_state(info.name)
            if namespace is None:
                continue
            reader = self.engine.read_value(info.name, row.id)
            floor = self.engine.read_value(states.floor_state(namespace), row.id, 0)
            found.append(NamespaceInfo(namespace, reader if isinstance(reader, str) else None,
                                       floor if isinstance(floor, int) else 0))
        return found

    async def host_state(self, name: str, *, branch: str = "main") -> HostState:
        """The host's state ``name`` on ``branch``: a JSON value (``get``/``set``) and a log of JSON
        entries (``append``/``entries``), kept in the store and branched like namespace state (M9).

        Raises:
            TypeError: ``name`` or ``branch`` isn't a string.
            MalformedContentError: a name a store can't hold, or one holding ``/`` (naming it).
            BranchNotFoundError: no such branch.
            RuntimeClosedError: the runtime is closed.
        """
        checked = states.host_state_name(name)
        checks.name(branch, "branch")
        await trio.lowlevel.checkpoint()
        return HostState(checked, self._live_engine().branch(branch), self._live_engine, lambda: self.store)

    def _live_engine(self) -> StoreEngine:
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        return self.engine

    # -- branches ---------------------------------------------------------------------------

    async def list_branches(self) -> list[BranchInfo]:
        """Every live branch, oldest first.

        Raises:
            RuntimeClosedError: the runtime is closed.
        """
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        return describe_branches(self.engine)

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
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, not {type(name).__name__}")
        checks.name(from_branch, "from_branch")
        checks.optional_integer(at_sequence, "at_sequence")  # its range is the store's to judge, at commit
        await self._namespaces.commit_ledger()  # a branch holds the request records made before it (Q3)
        row = await self.store.ask(CreateBranch(name=name, from_branch=from_branch, at_sequence=at_sequence))
        # From the row the commit made: on a shared store another process may delete it at once.
        parent = None if row.parent is None else self.engine.branch_by_id(row.parent).name
        return branch_info(row, parent, row.fork_sequence or 0)

    async def delete_branch(self, name: str) -> None:
        """Delete branch ``name``: its name is freed; descendants keep reading its rows. Every
        namespace actor, slot cache and manager on it is retired: those managers raise
        ``BranchNotFoundError`` from then on, even once a new branch takes the name (L5).

        Raises:
            BranchNotFoundError: no such branch.
            MalformedContentError: ``name`` is ``"main"``.
            ReadOnlyStoreError, RuntimeClosedError: as for ``create_branch``.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, not {type(name).__name__}")
        await self.store.ask(DeleteBranch(name=name))

    async def switch_branch(self, from_branch: str, to_branch: str) -> int:
        """Move every open manager of this runtime on ``from_branch`` to ``to_branch`` at one point
        (R3): each is attached to ``to_branch`` first, then all take their new place in one step, so
        a compile sent before it reads ``from_branch`` and one sent after reads ``to_branch``, and
        the runtime's managers are never seen on both. Returns how many moved.

        The switch is recorded on ``from_branch``'s row in the store (one commit; none in a read-only
        runtime): a manager of another runtime (another process on a PostgreSQL store) bound to
        ``from_branch`` before it follows at its next async call (R4).

        Raises:
            BranchNotFoundError: either branch doesn't exist (named), or was deleted during the switch.
            ReaderConflictError, StrategyRefusedError: a manager can't attach there (as its own
                ``ContextManager.switch_branch``).
            RuntimeClosedError: the runtime is closed.

        On any refusal, or if cancelled before the last step, no manager moved (all or nothing).
        """
        checks.name(from_branch, "from_branch")
        checks.name(to_branch, "to_branch")
        if self._closed:
            raise RuntimeClosedError(f"the runtime on {self.path} is closed")
        source, target = self.engine.branch(from_branch), self.engine.branch(to_branch)
        if source.id == target.id:
            await trio.lowlevel.checkpoint()
            return 0
        return await switch_managers(self._namespaces, source, target)

    def statistics(self) -> RuntimeStatistics:
        """The store actor's mailbox depth, last batch size and commit time, and each live
        namespace actor's mailbox depth and model calls out."""
        stats = self._store.statistics() if self._store is not None else StoreStatistics(0, 0, 0.0, 0, 0, 0)
        return RuntimeStatistics(
            **attrs.asdict(stats, recurse=False), namespace_actors=len(self._namespaces), slot_caches=len(self.slots),
            namespaces=self._namespaces.statistics(),
        )


MIN_MAP_SIZE = 1 << 16  # below about 28 KiB LMDB can't even create its tables
MAX_MAP_SIZE = 1 << 46  # 64 TiB: past what one process's address space maps


def _check_open_arguments(
    path: object, model: object, readonly: object, durability: object, map_size: object, model_timeout_s: object
) -> None:
    """open_runtime's arguments, before any file is touched (M7)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ValueError("path must name a directory (a non-empty str path)")
    checks.text(text, "path")
    if "\x00" in text:
        raise MalformedContentError("path", "must not contain NUL")
    if is_postgres_url(text):
        pass  # a database: libpq checks the rest of the URL when it connects
    elif any(len(part.encode("utf-8")) > 255 for part in Path(text).parts):
        raise MalformedContentError("path", "has a name longer than 255 bytes, which no filesystem here takes")
    elif Path(text).exists() and not Path(text).is_dir():
        raise MalformedContentError("path", f"{text!r} is a file; a store is a directory")
    checks.flag(readonly, "readonly")
    if durability not in ("sync", "os"):
        raise ValueError(f'durability must be "sync" or "os", not {durability!r}')
    size = checks.integer(map_size, "map_size", minimum=MIN_MAP_SIZE)
    if size > MAX_MAP_SIZE:
        raise ValueError(f"map_size must be at most {MAX_MAP_SIZE} bytes (2**46, what a process can map), not {size}")
    checks.timeout(model_timeout_s, "model_timeout_s")
    _check_model(model)


def _check_model(model: object) -> None:
    if model is not None and not isinstance(model, Model):
        raise TypeError(f"model must be a Model (with an async complete(request)) or None, not {type(model).__name__}")


# What the runtime's close does to code still running as it stops (cancelled, its calls answered
# as closed): the consequence of an interrupt, not a failure beside it.
_CLOSING = (trio.Cancelled, RuntimeClosedError, ManagerClosedError)


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        inner = inner.exceptions[0]
    return inner


def _interrupted(error: BaseException | None) -> bool:
    """Whether the block ends for a Ctrl-C (raised in it, alone or among others)."""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(KeyboardInterrupt) is not None
    return isinstance(error, KeyboardInterrupt)


@asynccontextmanager
async def _unwrapped(path: object) -> AsyncIterator[None]:
    """Re-raise a lone exception from the runtime's nursery as itself, not as a group of one, and a
    KeyboardInterrupt from any of its tasks as itself, whatever else the group holds (L8)."""
    try:
        yield
    except BaseExceptionGroup as group:
        interrupts, others = group.split(KeyboardInterrupt)
        if interrupts is not None:
            # trio raises Ctrl-C in whichever task is running, an actor's perhaps, and the others
            # stop with it; a host (and the CLI) catches a KeyboardInterrupt, never a group. A
            # real failure beside it is logged, as it can't be raised too.
            failures = None if others is None else others.subgroup(
                lambda exc: not isinstance(exc, (BaseExceptionGroup, *_CLOSING)))
            if failures is not None:
                logger.error("the runtime on %s was interrupted; beside the KeyboardInterrupt it raised:", path,
                             exc_info=failures)
            raise _first_leaf(interrupts) from None
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if inner is group:
            raise
        raise inner from None


async def _serve_to_the_close(
    engine: StoreEngine, ref: StoreRef, inbox: Mailbox, serving: trio.CancelScope, *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The store actor in ``serving``, which shields it, once started, from a cancel of the
    runtime's nursery until the close has committed the request records waiting (Q1): a Ctrl-C
    trio raises in a namespace actor (a host's estimator or filter running there) cancels that
    nursery before the close, and the actor stopped then, losing the records the host was handed.
    The close lifts the shield, so a cancelled runtime's actor still refuses what is queued. Not
    shielded before it started: a start cancelled leaves it in ``start``'s own nursery, which waits for it."""
    with serving:

        class Started:
            def started(self, value: None = None) -> None:
                task_status.started(value)
                # Moved into the runtime's nursery (a start cancelled meanwhile leaves it where it is).
                serving.shield = trio.current_effective_deadline() != -math.inf

        await serve_store(engine, ref, inbox, task_status=Started())


@asynccontextmanager
async def open_runtime(
    path: str | os.PathLike[str],
    *,
    model: Model | None = None,
    readonly: bool = False,
    durability: Durability = "sync",
    map_size: int = 1 << 36,
    model_timeout_s: float = MODEL_TIMEOUT_S,
    check_pages: bool = False,
) -> AsyncIterator[Runtime]:
    """Open the store at ``path`` (creating it unless ``readonly``) and start its store actor.

    ``model_timeout_s`` bounds each compression request's model call (a call past it fails as
    retryable, and the unit stays queued). Leaving the block closes every manager, lets the store
    actor answer what is queued, stops the actors, closes ``model`` (an ``AnthropicModel`` closes
    the client it made; a client handed to it stays its owner's), and syncs and closes the
    environment.

    The open checks the store's files at a constant cost (meta pages, size, table roots). A page
    damaged deep inside a table passes those checks, and LMDB may abort the process that reads
    it; ``check_pages=True`` first walks every page with plain reads (about 10 ms per MB) and
    refuses a damaged store with ``StoreCorruptError``. The CLI's read-only commands do this.

    Raises:
        TypeError, ValueError: an argument of the wrong type or value, named; nothing is touched.
        StoreLockedError: another runtime, in this process or another, writes this store.
        StoreFormatError: not a ctxrt store (a foreign LMDB environment included), or a format
            this version doesn't read.
        StoreCorruptError: the store's files are damaged (truncated, emptied, bad pages found
            by the open checks); ``ctxrt verify`` walks every page and record.
        StoreFullError: the disk is full while a new store is made.
        StorePermissionError: the store's directory or files can't be read or written as needed.
        FileNotFoundError: ``readonly`` and no store is there.
        NotTrioError: awaited under asyncio (or any library but trio); nothing is opened.

    An error raised in the block comes out as itself; only several at once (an actor crashing
    beside the block's own error) come out as an ``ExceptionGroup``. Ctrl-C comes out as a bare
    ``KeyboardInterrupt``, whichever task trio raised it in; another error raised beside it is
    logged, not raised (L8). A cancel from the host's scope comes out as ``trio.Cancelled`` (L9).
    """
    require_trio("ctxrt.open_runtime")
    _check_open_arguments(path, model, readonly, durability, map_size, model_timeout_s)
    if checks.flag(check_pages, "check_pages") and not is_postgres_url(path):
        check_store_pages(Path(os.fspath(path)))
    handle = open_store(path, readonly=readonly, durability=durability, map_size=map_size)
    try:
        async with _unwrapped(handle.path), trio.open_nursery() as nursery:
            runtime = Runtime(handle, nursery, model, model_timeout_s)
            if runtime._store is not None:
                ref, inbox = runtime._store, runtime._store_inbox
                serving = trio.CancelScope()
                await nursery.start(
                    lambda task_status: _serve_to_the_close(handle.engine, ref, inbox, serving, task_status=task_status)
                )
            if runtime._steps is not None:
                trio.lowlevel.add_instrument(runtime._steps)
            try:
                yield runtime
            finally:
                if runtime._steps is not None:
                    drop_instrument(runtime._steps)
                if runtime._store is not None:
                    runtime._store.closing(_interrupted(sys.exc_info()[1]))
                try:
                    if runtime._store is not None and runtime._namespaces.ledger.waiting:
                        with trio.CancelScope(shield=True):  # the request records still waiting (Q1)
                            try:
                                await runtime._namespaces.commit_ledger()
                            except Exception:
                                logger.exception("closing the runtime: the request records waiting could not commit")
                finally:  # a second Ctrl-C above must not leave the store actor serving: it stops only here
                    runtime._closed = True
                    runtime._namespaces.close()
                    if runtime._store is not None:
                        # Let the actor answer what is queued, then stop (cancelled, it refuses what is queued).
                        serving.shield = False
                        runtime._store.close()
                close_model = getattr(model, "aclose", None)
                if close_model is not None:
                    with trio.CancelScope(shield=True):  # the runtime owns its model's client (DESIGN.md §9)
                        await close_model()
    finally:
        if trio.lowlevel.in_trio_run():
            close_store(handle)
        # else a trio run that died without unwinding (a guest run broken by a second Ctrl-C from
        # asyncio's handler) left this frame to the garbage collector: the store's writer thread
        # may hold a transaction it will never end, and closing the environment under it hangs.
        # Every acknowledged write is durable; the process's exit releases the store.
