"""The namespace actor: one per (branch, namespace) in a runtime, shared by its managers.

It owns the namespace's reader record, its narrowing floor, the strategy instance and its
state, the compression holds and the background drain. Its mailbox is a fair FIFO lock:
every request (claim, compile, edit, tick...) is handled whole, in arrival order, before the
next; the one exception is a model call, which a strategy makes through
``StrategyContext.complete``: the mailbox moves on while the request is out, and the reply is
checked against the view epoch when the strategy rejoins (spec/audience.md C9).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..compile import Budget, CompileMemo, CompileResult, build_compile_result, validate_injections
from .. import codec
from ..content import Message, content_for_reader, hidden_by_edit
from ..errors import (
    ManagerClosedError,
    MessageNotFoundError,
    NarrowingRefusedError,
    ReaderConflictError,
    StrategyRefusedError,
)
from ..slots import Appended
from ..store.protocol import Atomically, EditItem, RegisterState, RemoveItems, SetValue
from ..strategies.base import SelectOptions, Strategy
from ..views import FilteredListing, MergedListing, MessageView, ReaderListing, SlotListing, reader_view_of
from .context import StaleEpochError, StrategyContext

if TYPE_CHECKING:
    from ..runtime import Runtime

logger = logging.getLogger("ctxrt.namespace")

DEFAULT_NAMESPACE = "default"
_DRAIN = object()  # a unit of work the drain runs for the namespace itself, not for a manager
MODEL_TIMEOUT_S = 300.0


class ActorRetired(Exception):
    """The namespace actor stopped (its last manager left) before this attach got its turn;
    the caller starts a fresh one. Never reaches the public API."""


class CorruptRecord:
    """A reader record that isn't a reader's name (written by something else)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<record {self.value!r}, not a reader's name>"


def normalise_namespace(namespace: str | None) -> str:
    if namespace is None or namespace == "":
        return DEFAULT_NAMESPACE
    if not isinstance(namespace, str) or "\x00" in namespace:
        raise ValueError(f"a namespace must be a string without NUL, not {namespace!r}")
    return namespace


def slot_state(namespace: str, isolate: bool) -> str:
    return f"{namespace}/messages" if isolate else "messages"


def auxiliary_state(name: str | None) -> str:
    return "messages" if name is None else f"{normalise_namespace(name)}/messages"


def read_record(runtime: Runtime, namespace: str, branch: str) -> str | None | CorruptRecord:
    """The reader ``namespace`` records on ``branch``: a name, None, or a corrupt record."""
    engine = runtime.engine
    state = f"{namespace}/reader"
    if not engine.has_state(state):
        return None
    with engine.reader() as txn:
        value, _ = engine.get_value(txn, state, engine.branch(branch))
    if value is None or (isinstance(value, str) and value):
        return value
    return CorruptRecord(value)


def resolve_reader(record: str | None | CorruptRecord, reader: str | None, namespace: str, branch: str) -> str | None:
    """The reader a manager opened with ``reader`` compiles for, given a namespace's ``record``.

    None means the record's reader (C6); another reader than the record's, or a record that is
    not a reader's name, is refused (C1, C3).
    """
    if isinstance(record, CorruptRecord):
        raise ReaderConflictError(
            f"namespace {namespace!r} on branch {branch!r} records {record.value!r}, which is not a reader's name"
        )
    if reader is None:
        return record
    if record is not None and record != reader:
        raise ReaderConflictError(
            f"namespace {namespace!r} on branch {branch!r} records reader {record!r}, so it refuses reader "
            f"{reader!r}: its summaries and context log hold {record!r}'s view, so another reader would read "
            f"them. Give each reader a namespace of its own"
        )
    return reader


def build_strategy(config: Any) -> Strategy:
    """A strategy instance from a config (``config.create()``) or a strategy given as is."""
    create = getattr(config, "create", None)
    if callable(create):
        return create()
    if callable(getattr(config, "select", None)):
        return config
    raise TypeError(f"not a strategy config or strategy: {config!r}")


def require_marking(strategy: Strategy, reader: str | None, namespace: str) -> None:
    """D6: a manager that compiles for a reader refuses a strategy that doesn't mark compression reads."""
    if reader is not None and not getattr(strategy, "marks_compression_reads", False):
        raise StrategyRefusedError(
            f"strategy {getattr(strategy, 'name', type(strategy).__name__)!r} doesn't declare "
            f"marks_compression_reads = True, so namespace {namespace!r} can't compile it for reader "
            f"{reader!r}: what its compression reads couldn't be recorded before an edit narrows it"
        )


@attrs.frozen
class NamespaceConfig:
    namespace: str
    slot: str
    auxiliary: tuple[str, ...]
    view_filter: Callable[[Message], bool] | None
    strategy: Any
    model: Any


class NamespaceActor:
    def __init__(self, runtime: Runtime, branch: str, config: NamespaceConfig) -> None:
        self.runtime = runtime
        self.branch = branch
        self.config = config
        self.namespace = config.namespace
        self.model = config.model if config.model is not None else runtime.model
        self.model_timeout_s = MODEL_TIMEOUT_S
        self.lock = trio.Lock()  # the mailbox
        self._tick_lock = trio.Lock()  # one unit of strategy work at a time
        self.record: str | None | CorruptRecord = None
        self.floor = 0
        self.epoch = 0
        self.strategy_config: Any = config.strategy
        self.strategy: Strategy = build_strategy(config.strategy)
        self.strategy_error: BaseException | None = None
        self.ctx = StrategyContext(self, 0, self.strategy.name)
        self.holds: dict[int, float] = {}  # message sequence -> expiry (trio clock; inf = none)
        self.managers = 0
        self.stopped = False
        self.system_prompt: str | None = None
        self.tools: Sequence[Mapping[str, Any]] = ()
        self.started = trio.Event()
        self.start_error: BaseException | None = None
        self._caches: list[Any] = []  # the slot caches it reads, acquired at start, released at stop
        self._seen = 0
        self.strategy_started = False
        self._wake = trio.Event()
        self._cancel = trio.CancelScope()

    # -- names of its states ----------------------------------------------------------------

    @property
    def reader_state(self) -> str:
        return f"{self.namespace}/reader"

    @property
    def floor_state(self) -> str:
        return f"{self.namespace}/narrowing-floor"

    @property
    def context_state(self) -> str:
        return f"{self.namespace}/context"

    @property
    def reader(self) -> str | None:
        return self.record if isinstance(self.record, str) else None

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Register the namespace's states, load its record and floor, start the strategy and drain."""
        try:
            store = self.runtime.store if not self.runtime.readonly else None
            states = [self.config.slot, *self.config.auxiliary, self.context_state]
            commands = [RegisterState(name=name, kind="log") for name in dict.fromkeys(states)]
            commands += [RegisterState(name=self.reader_state, kind="value"),
                         RegisterState(name=self.floor_state, kind="value")]
            missing = tuple(c for c in commands if not self.runtime.engine.has_state(c.name))
            if self.runtime.readonly:
                # A read-only runtime registers nothing: it reads what a writer made.
                for name in (self.config.slot, *self.config.auxiliary):
                    self.runtime.engine.state(name)  # UnknownStateError names a slot nobody wrote
            elif missing:
                await store.ask(Atomically(commands=missing))
            self.record = read_record(self.runtime, self.namespace, self.branch)
            self.floor = self._read_floor() or 0
            branch_id = self.runtime.engine.branch(self.branch).id
            for name in (self.config.slot, *self.config.auxiliary):
                self._caches.append(self.runtime.slots.acquire(name, branch_id))
            self._build_views()
            for cache in self._caches:
                cache.subscribers.append(self._appended)
            self._seen = self.runtime.engine.last_sequence
        except BaseException as exc:
            self.start_error = exc
            self.started.set()
            raise
        self.started.set()
        if not self.runtime.readonly:
            self.runtime._nursery.start_soon(self._drain)

    def _read_floor(self) -> int | None:
        """The narrowing floor on this branch: 0 if never set, None if the record isn't a sequence."""
        engine = self.runtime.engine
        if not engine.has_state(self.floor_state):
            return 0
        with engine.reader() as txn:
            value, _ = engine.get_value(txn, self.floor_state, engine.branch(self.branch))
        if value is None:
            return 0
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    def _build_views(self) -> None:
        listings = [SlotListing(cache) for cache in self._caches]
        merged = listings[0] if len(listings) == 1 else MergedListing(listings)
        filtered = merged if self.config.view_filter is None else FilteredListing(merged, self.config.view_filter)
        self._reader_listing = ReaderListing(filtered, self.reader)
        # Raw bodies are judged in the reader's view of the messages as stored, filter or not: with
        # a filter, one message at a time (compile's memo keeps each), not a second projection.
        if self.config.view_filter is None:
            self.raw_body = MessageView(self._reader_listing).get
        else:
            stored, reader = MessageView(merged), self.reader
            self.raw_body = lambda message_id: (
                None if (found := stored.get(message_id)) is None else reader_view_of(found, reader)
            )
        epoch = self.epoch
        self.compile_memo = CompileMemo()  # entries of another view are never reused
        self.view = MessageView(self._reader_listing, guard=lambda: self._guard(epoch))

    async def start_strategy(self) -> None:
        """Initialise the strategy for the current view (C5: a failure leaves the claim standing)."""
        self.ctx = StrategyContext(self, self.epoch, self.strategy.name)
        self.strategy_started = True
        # What initialize reads is what was committed when it began; anything appended during its
        # awaits is handed to on_new_message after (at least once, never lost).
        seen = self.runtime.engine.last_sequence
        try:
            await self.strategy.initialize(self.ctx)
            self.strategy_error = None
        except Exception as exc:
            self.strategy_error = exc
            raise
        self._seen = max(self._seen, seen)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._cancel.cancel()
        for cache in self._caches:
            if self._appended in cache.subscribers:
                cache.subscribers.remove(self._appended)
            self.runtime.slots.release(cache)

    # -- the reader check -------------------------------------------------------------------

    def _guard(self, epoch: int) -> None:
        """Run before every read through the view a strategy holds (C8)."""
        if epoch != self.epoch:
            raise ReaderConflictError(
                f"namespace {self.namespace!r} on branch {self.branch!r} changed its reader since this "
                f"view was made; it now records {self.record!r}"
            )

    def check(self, reader: str | None) -> None:
        """C8: refuse a request from a manager whose reader the record doesn't name."""
        record = self.record
        if isinstance(record, CorruptRecord):
            raise ReaderConflictError(
                f"namespace {self.namespace!r} on branch {self.branch!r} records {record.value!r}, which is "
                f"not a reader's name; refusing to serve it"
            )
        if record != reader:
            if record is None:
                raise ReaderConflictError(
                    f"namespace {self.namespace!r} on branch {self.branch!r} records no reader, but this "
                    f"manager compiles for {reader!r}"
                )
            raise ReaderConflictError(
                f"namespace {self.namespace!r} on branch {self.branch!r} records reader {record!r}; this "
                f"manager compiles for {reader!r}. Its summaries and context log hold {record!r}'s view, "
                f"so another reader would read them: give each reader a namespace of its own"
            )

    @asynccontextmanager
    async def _settled(self) -> AsyncIterator[None]:
        """Turn the internal stale-epoch signal into the public error a caller can act on."""
        record = self.record
        try:
            yield
        except StaleEpochError:
            if self.stopped:
                raise ManagerClosedError(
                    f"namespace {self.namespace!r} on branch {self.branch!r} stopped (its last manager closed or "
                    f"moved) while this request ran"
                ) from None
            if self.record == record:
                raise StrategyRefusedError(
                    f"the strategy of namespace {self.namespace!r} on branch {self.branch!r} was replaced while "
                    f"this request ran; retry it"
                ) from None
            raise ReaderConflictError(
                f"namespace {self.namespace!r} on branch {self.branch!r} changed its reader while this request "
                f"ran; it now records {self.record!r}"
            ) from None

    def _require_strategy(self) -> None:
        if self.strategy_error is not None:
            raise StrategyRefusedError(
                f"the strategy of namespace {self.namespace!r} on branch {self.branch!r} failed to start: "
                f"{self.strategy_error!r}; recover with set_strategy() or switch_branch()"
            )

    # -- claims -----------------------------------------------------------------------------

    async def attach(self, reader: str | None, *, claim: bool = True, compiles_for_none: bool = False) -> str | None:
        """Attach a manager: claim the namespace for ``reader`` if unclaimed (C1, C6, C13).

        Returns the reader the manager compiles for. ``compiles_for_none``: a manager moving
        here that compiles for no reader is refused where a reader is recorded (C7). Raises
        ``ActorRetired`` if the actor stopped while the caller waited its turn.
        """
        async with self.lock:
            if self.stopped:
                raise ActorRetired(self.namespace)
            if compiles_for_none and self.record is not None:
                self.check(None)
            resolved = self.resolve(reader)
            require_marking(self.strategy, resolved, self.namespace)
            if resolved is not None and self.record is None and claim and not self.runtime.readonly:
                await self._claim(resolved)  # stands even if the strategy then fails to start (C5)
            if not self.strategy_started:
                await self.start_strategy()
            self.managers += 1  # only a manager that was handed out counts
            return resolved

    def resolve(self, reader: str | None) -> str | None:
        """The reader a manager opened with ``reader`` compiles for here, or raise (C1, C3, C6)."""
        return resolve_reader(self.record, reader, self.namespace, self.branch)

    async def _claim(self, reader: str) -> None:
        await self.runtime.store.ask(SetValue(state=self.reader_state, branch=self.branch, value=reader))
        self.record = reader
        self.epoch += 1  # work begun for the unclaimed view writes nothing (C9)
        self._build_views()
        await self.start_strategy()  # a failure here leaves the claim standing (C5)

    def detach(self) -> None:
        self.managers -= 1

    # -- new messages and holds -------------------------------------------------------------

    def _appended(self, message: Message, appended: Appended | None) -> None:
        """Called synchronously by a slot cache after a commit: place holds, wake the drain."""
        if appended is not None and appended.origin is self and appended.hold is not False:
            timeout = appended.hold if not isinstance(appended.hold, bool) else None
            self.place_holds([message.sequence], timeout)
        if getattr(self.strategy, "auto_tick", False):
            self._wake.set()  # only a draining strategy has anything to do now

    def place_holds(self, sequences: Sequence[int], timeout_s: float | None) -> None:
        expires = math.inf if timeout_s is None else trio.current_time() + timeout_s
        for sequence in sequences:
            self.holds[sequence] = expires
        if timeout_s is not None:
            self._wake.set()  # the drain re-arms its wait for the hold's lapse (T5)

    def release_holds(self, sequences: Sequence[int]) -> None:
        for sequence in sequences:
            self.holds.pop(sequence, None)
        self._wake.set()

    def hold_floor(self) -> int | None:
        now = trio.current_time()
        expired = [sequence for sequence, expires in self.holds.items() if expires <= now]
        for sequence in expired:
            del self.holds[sequence]
        if expired:
            logger.info("compression hold timeout in %r: releasing %d hold(s)", self.namespace, len(expired))
        return min(self.holds) if self.holds else None

    async def _flush_new(self) -> None:
        """Hand the strategy each message it hasn't seen, in the reader's view (A4)."""
        if self.strategy_error is not None:
            return
        pending = self.view.after(self._seen)
        if not pending:
            self._seen = max(self._seen, self.runtime.engine.last_sequence)
            return
        for message in list(pending):
            await self.strategy.on_new_message(message, self.ctx)
            self._seen = message.sequence

    # -- the floor --------------------------------------------------------------------------

    async def raise_floor(self, sequence: int) -> None:
        if self.reader is None:
            return  # D7
        if sequence <= self.floor:
            return  # never lowers (D2)
        await self.runtime.store.ask(SetValue(state=self.floor_state, branch=self.branch, value=sequence))
        self.floor = max(self.floor, sequence)

    # -- requests ---------------------------------------------------------------------------

    async def compile(
        self, reader: str | None, budget: Budget, injections: Sequence[Any], message_injections: Sequence[Any],
        dry_run: bool,
    ) -> CompileResult:
        async with self.lock, self._settled():
            self.check(reader)
            self._require_strategy()
            validate_injections(injections, message_injections)
            await self._flush_new()
            entries = await self.strategy.select(self.view, budget, SelectOptions(dry_run=dry_run, context=self.ctx))
            return build_compile_result(
                entries,
                namespace=self.namespace,
                branch=self.branch,
                reader=self.reader,
                strategy_name=self.strategy.name,
                lookup=self.raw_body,
                injections=injections,
                message_injections=message_injections,
                memo=self.compile_memo,
            )

    async def preview(self, reader: str | None, budget: Budget, message_injections: Sequence[Any]) -> Any:
        async with self.lock, self._settled():
            self.check(reader)
            self._require_strategy()
            validate_injections((), message_injections)
            await self._flush_new()
            return await self.strategy.preview(self.view, budget, SelectOptions(dry_run=True, context=self.ctx))

    async def tick(self, reader: str | None) -> bool:
        async with self.lock:
            self._require_strategy()
        return await self._tick_once(reader)

    async def _tick_once(self, reader: str | None | object = _DRAIN) -> bool:
        """One unit of work; a manager's unit is checked against the record in the same turn (C8)."""
        async with self._tick_lock:
            async with self.lock:
                if reader is not _DRAIN:
                    self.check(reader)  # type: ignore[arg-type]
                if self.strategy_error is not None or self.stopped:
                    return False
                await self._flush_new()
                try:
                    return await self.strategy.tick(self.ctx)
                except StaleEpochError as exc:
                    logger.warning("discarded: %s", exc)
                    return False

    async def is_ready(self, reader: str | None) -> bool:
        async with self.lock, self._settled():
            self.check(reader)
            await self._flush_new()
            return self.strategy.is_ready()

    async def set_strategy(self, reader: str | None, config: Any) -> None:
        async with self.lock, self._settled():
            self.check(reader)
            strategy = build_strategy(config)
            require_marking(strategy, self.reader, self.namespace)
            self.strategy, self.strategy_config = strategy, config
            self.epoch += 1
            self._build_views()
            await self.start_strategy()

    async def call(self, reader: str | None, method: str, *args: Any, **kwargs: Any) -> Any:
        """A checked call of an optional strategy capability (summary reads...); None if absent."""
        async with self.lock, self._settled():
            self.check(reader)
            self._require_strategy()
            await self._flush_new()
            function = getattr(self.strategy, method, None)
            if function is None:
                return None
            return await function(self.ctx, *args, **kwargs)

    # -- edits and removals ----------------------------------------------------------------

    async def edit(self, reader: str | None, message: Message, command: EditItem) -> None:
        """Edit ``message`` (as stored) into ``command``'s content, refusing a narrowing (D1-D5).

        The slot edit and its context-log copies commit together (M5, L3).
        """
        async with self.lock:
            self.check(reader)
            # Judge the edit against the message as it is now: another edit may have landed while
            # this one waited its turn (D1-D5 compare with what readers saw last).
            current = self._caches[0].get(message.id)
            if current is None:
                raise MessageNotFoundError(
                    f"no message {message.id!r} in slot {self.config.slot!r} on branch {self.branch!r}"
                )
            new_content = command.attachment.content
            self._check_narrowing(current, new_content)
            await self.runtime.store.ask(
                Atomically(commands=(command, *self._propagation(current, new_content)))
            )

    def _check_narrowing(self, message: Message, new_content: Sequence[Any]) -> None:
        names, others = hidden_by_edit(message.content, new_content)
        if not names and not others:
            return  # hides nothing, or widens
        reader = self.reader
        where = f"message {message.id} in namespace {self.namespace!r} on branch {self.branch!r}"
        why = ("nothing takes a block out of a summary already written or a request already sent, "
               "a removal included")
        if reader is None:
            raise NarrowingRefusedError(
                f"refused: the edit would hide a block of {where}, and a manager that compiles for no reader "
                f"can't see what any reader's compression has read ({why})"
            )
        if others or names - {reader}:
            hidden = sorted(names - {reader}) + (["readers it doesn't name"] if others else [])
            raise NarrowingRefusedError(
                f"refused: the edit would hide a block of {where} from {', '.join(map(repr, hidden))}, other "
                f"readers than {reader!r}, whose compression this manager can't see ({why})"
            )
        floor = self._read_floor()
        if floor is None:
            raise NarrowingRefusedError(
                f"refused: the edit would hide a block of {where} from reader {reader!r}, and the namespace's "
                f"record of what compression has read ({self.floor_state!r}) can't be read"
            )
        if message.sequence <= max(floor, self.floor):
            raise NarrowingRefusedError(
                f"refused: the edit would hide a block of {where} from reader {reader!r}, and compression may "
                f"already have read it (narrowing floor {max(floor, self.floor)}; {why})"
            )
        for other in self._other_records():
            if other == reader or isinstance(other, CorruptRecord):
                raise NarrowingRefusedError(
                    f"refused: the edit would hide a block of {where} from reader {reader!r}, and another "
                    f"namespace on the branch records {other!r}, whose compression this manager can't see"
                )

    def _other_records(self) -> list[str | None | CorruptRecord]:
        records = []
        for info in self.runtime.engine.list_states():
            if info.name.endswith("/reader") and info.name != self.reader_state:
                records.append(read_record(self.runtime, info.name[: -len("/reader")], self.branch))
        return records

    async def remove(self, first: Message, last: Message) -> None:
        """Remove the messages from ``first`` to ``last`` of the own slot, with their context-log
        copies, in one commit (D1: never refused for narrowing)."""
        async with self.lock:
            removal = RemoveItems(state=self.config.slot, branch=self.branch, from_sequence=first.sequence,
                                  to_sequence=last.sequence)
            await self.runtime.store.ask(
                Atomically(commands=(removal, *self._removal_propagation(first.sequence, last.sequence)))
            )

    # -- the context log (M5, A6, B3) ------------------------------------------------------

    def _context_entries(self) -> list[Message]:
        engine = self.runtime.engine
        with engine.reader() as txn:
            items = engine.log_items(txn, self.context_state, engine.branch(self.branch))
        return [codec.message_from_json(item.data, sequence=item.sequence) for item in items]

    def _propagation(self, message: Message, new_content: Sequence[Any]) -> list[Any]:
        """Commands that carry an edit to ``copy`` entries of the context log, as the reader sees it (M5, A6)."""
        content = content_for_reader(tuple(new_content), self.reader)
        commands: list[Any] = []
        for entry in self._context_entries():
            meta = entry.metadata or {}
            if meta.get("relation", "copy") != "copy" or message.id not in meta.get("source_ids", ()):
                continue
            if content:
                data = codec.message_to_json(entry.participant, content, meta, 0, ())
                commands.append(EditItem(state=self.context_state, branch=self.branch, item_sequence=entry.sequence,
                                         data=data))
            else:
                commands.append(RemoveItems(state=self.context_state, branch=self.branch,
                                            from_sequence=entry.sequence, to_sequence=entry.sequence))
        return commands

    def _removal_propagation(self, first: int, last: int) -> list[Any]:
        commands: list[Any] = []
        for entry in self._context_entries():
            meta = entry.metadata or {}
            if meta.get("relation", "copy") != "copy":
                continue
            if any(first <= int(source) <= last for source in meta.get("source_ids", ()) if source.isdigit()):
                commands.append(RemoveItems(state=self.context_state, branch=self.branch,
                                            from_sequence=entry.sequence, to_sequence=entry.sequence))
        return commands

    # -- the drain --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Background compression (T8): woken by new messages when the strategy auto-ticks."""
        with self._cancel:
            while not self.stopped:
                # A hold that times out, or a backoff that ends, wakes the drain like a new message (T5, T8).
                now = trio.current_time()
                deadline = min((e for e in self.holds.values() if e > now), default=math.inf)
                backoff = self._backoff()
                with trio.move_on_at(deadline if backoff is None else min(deadline, backoff)):
                    await self._wake.wait()
                self._wake = trio.Event()
                if not getattr(self.strategy, "auto_tick", False) or self._backoff() is not None:
                    continue
                while not self.stopped:
                    try:
                        progressed = await self._tick_once()
                    except Exception:
                        logger.exception("compression drain of %r on %r failed one unit", self.namespace, self.branch)
                        progressed = False
                    if not progressed:
                        break
                    await trio.lowlevel.checkpoint()  # let hosts' requests in between units

    def _backoff(self) -> float | None:
        wake_at = getattr(self.strategy, "wake_at", None)
        return None if wake_at is None else wake_at()

    async def drain_idle(self, reader: str | None) -> None:
        """Drive ticks until the strategy is ready or makes no progress (``wait_ready``)."""
        while True:
            async with self.lock:
                self.check(reader)
                await self._flush_new()
                if self.strategy.is_ready():
                    return
            if not await self._tick_once(reader):
                return
