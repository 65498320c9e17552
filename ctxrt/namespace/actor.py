"""``serve_namespace``: the namespace actor, one task per live (branch incarnation, namespace).

It owns the namespace's reader record, its narrowing floor, the strategy and its state, the
compression holds and the background drain, and nothing outside its task touches them. Every
command is handled whole, in arrival order, before the next (docs/behaviours.md L4): a caller that is
cancelled loses only its answer. A model call is the one thing that leaves the mailbox: the
actor plans the unit (raising the floor first), a child task makes the call, and the reply
comes back as ``UnitDone``, applied only if the view epoch hasn't moved (docs/behaviours.md C9).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import trio

from .. import codec
from ..compile import CompileMemo, build_compile_result, validate_injections
from ..content import Message, hidden_by_edit
from ..errors import (
    BranchNotFoundError,
    ConfigConflictError,
    ManagerClosedError,
    MessageNotFoundError,
    ModelError,
    ReaderConflictError,
    ReadOnlyStoreError,
    RuntimeClosedError,
    StoreCorruptError,
    StoreUnavailableError,
    StrategyRefusedError,
    ValueConflictError,
)
from ..mailbox import Reply
from ..model import ModelRequest, ModelResponse
from ..slots import Appended, SlotRegistry, decode_stored, parse_id, prepare_append
from ..store.actor import StoreRef
from ..store.interface import StoreEngine
from ..store.protocol import (
    AppendItem,
    Atomically,
    CreateBranch,
    EditItem,
    RegisterState,
    RemoveItems,
    SetValue,
)
from ..store.records import StateKind
from ..strategies import catalog
from ..strategies.base import (
    Backlog,
    HeadWindowReset,
    Pinning,
    SelectOptions,
    Strategy,
    SummaryReader,
    Unit,
)
from ..tokens import (
    CalibratedEstimator,
    TokenEstimator,
    estimate_blocks,
    estimate_message,
    estimate_text,
)
from ..views import (
    FilteredListing,
    MergedListing,
    MessageView,
    ReaderListing,
    SlotListing,
    reader_view_of,
    shared_reader_listing,
)
from . import states
from .context import ActorContext, Settings
from .core import (
    Holds,
    Place,
    Record,
    check_attach,
    check_reader,
    edit_propagation,
    floor_from_value,
    judge_edit,
    record_from_value,
    removal_propagation,
    require_marking,
    resolve_reader,
)
from .protocol import (
    ActorRetired,
    Attach,
    Attached,
    CheckReady,
    Compile,
    Derive,
    Detach,
    Edit,
    Fork,
    GetSummary,
    Hold,
    Inspect,
    ListPins,
    NamespaceHealth,
    NamespaceRef,
    NamespaceSnapshot,
    PinRange,
    Preview,
    QuerySummaries,
    Release,
    Remove,
    ReportHealth,
    ResetHeadWindow,
    RetryQuarantined,
    SearchSummaries,
    SetStrategy,
    SetSystemPrompt,
    SetTools,
    SummariesInRange,
    Tick,
    UnitDone,
    Unpin,
    Wake,
)

logger = logging.getLogger("ctxrt.namespace")

MODEL_TIMEOUT_S = 300.0
_LATER = object()  # a handler that answers later (when its unit comes back)
_END = object()  # the mailbox closed
FAIRNESS_STREAK = 32  # commands taken without waiting before the actor yields once
# While the store is unreachable, an auto-ticking namespace tries its strategy's start again after
# this many seconds, doubling up to the maximum (a command tries at once).
STORE_RETRY_S = 0.25
STORE_RETRY_MAX_S = 5.0


@attrs.frozen
class Services:
    """What every namespace actor of one runtime shares."""

    engine: StoreEngine
    store: StoreRef | None  # None in a read-only runtime
    slots: SlotRegistry
    model: Any  # the runtime's default model
    forget: Callable[[NamespaceRef], None]  # the registry drops a stopped actor's ref
    model_timeout_s: float = MODEL_TIMEOUT_S  # a unit's model call fails (retryably) after this


def build_strategy(config: Any) -> Strategy:
    """A strategy instance from a config (``config.create()``) or a strategy given as is.

    Raises ``TypeError`` for anything else.
    """
    if isinstance(config, Strategy):
        return config
    if isinstance(config, type):
        raise TypeError(f"strategy must be a strategy config or Strategy instance (e.g. {config.__name__}(...)), "
                        f"not the class {config.__name__}")
    create = getattr(config, "create", None)
    strategy = create() if callable(create) else None
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a strategy config (with create()) or a Strategy, not {config!r}")
    return strategy


def _runtime_closed(place: Place) -> Callable[[], BaseException]:
    return lambda: ManagerClosedError(f"the runtime closed; the manager of {place} is closed")


def _retired(place: Place) -> Callable[[], BaseException]:
    return lambda: ActorRetired(str(place))


@attrs.define
class _InFlight:
    kind: str  # "tick" (a manager's), "drain" (the actor's own) or "reset" (a transition summary)
    unit: Unit
    epoch: int
    reply: Reply[Any] | None
    scope: trio.CancelScope
    request: Any  # the ModelRequest, for calibration from the usage its reply reports


class _Actor:
    """The namespace actor's state. Lives only inside its ``serve_namespace`` task."""

    def __init__(self, services: Services, ref: NamespaceRef, nursery: trio.Nursery) -> None:
        self.services = services
        self.ref = ref
        self.config = ref.config
        self.children = nursery
        self.branch_id = ref.branch_id
        self.place = Place(ref.namespace, ref.branch_name)
        self.readonly = services.store is None
        self.model = self.config.model if self.config.model is not None else services.model
        self.model_timeout_s = services.model_timeout_s
        self.record: Record = None
        self.floor = 0
        self.epoch = 0
        self.strategy_config: Any = self.config.strategy
        self.strategy: Strategy = build_strategy(self.config.strategy)
        self.strategy_started = False
        self.strategy_error: BaseException | None = None
        # The store was unreachable when the strategy started or its memory last changed: that
        # memory is not known to match the store, so the strategy starts again (from what is
        # stored) before its next use. Not a failed start (C5): it ends by itself.
        self.waiting: StoreUnavailableError | None = None
        self.retry_at = 0.0  # when the drain tries the start again (the trio clock)
        self.retry_delay = STORE_RETRY_S
        self.holds = Holds()
        self.settings = Settings()
        self.managers: set[int] = set()
        self.orphaned = False  # its last manager left; it stops once it owes no caller an answer
        self.caches: list[Any] = []
        self.subscriber = _subscriber(ref)
        self.seen = 0
        self.unit_waiters: deque[tuple[Tick | ResetHeadWindow, Reply[Any]]] = deque()
        self.in_flight: _InFlight | None = None
        self.drain_wanted = False
        self.last_compile_ms: float | None = None
        self.observed = 0  # usage reports the token estimator has heard (its pricing, for a host's own)
        self._streak = 0
        self.serving: tuple[Any, Reply[Any] | None] | None = None  # the command whose handler runs now
        self.stop_error: Callable[[], BaseException] | None = None
        self.leased = False  # this process holds the namespace's lease (Strategy.keeps_memory)

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Register the namespace's states, load its record and floor, read its slots."""
        engine, ns = self.services.engine, self.config.namespace
        slots = (self.config.slot, *self.config.auxiliary)
        if self.readonly:
            for name in slots:
                engine.state(name)  # UnknownStateError names a slot nobody wrote
        else:
            commands = [RegisterState(name=name, kind="log") for name in dict.fromkeys((*slots, states.context_state(ns)))]
            commands += [RegisterState(name=states.reader_state(ns), kind="value"),
                         RegisterState(name=states.floor_state(ns), kind="value"),
                         RegisterState(name=states.config_state(ns), kind="value")]
            if isinstance(self.config.token_estimator, CalibratedEstimator):
                commands.append(RegisterState(name=states.calibration_state(ns), kind="value"))
            missing = tuple(c for c in commands if not engine.has_state(c.name))
            if missing:
                await self._store().ask(Atomically(commands=missing))
        self.record = self._stored_record()
        self.floor = self._stored_floor() or 0
        if isinstance(self.config.token_estimator, CalibratedEstimator):  # the calibration so far
            self.config.token_estimator.restore(engine.read_value(states.calibration_state(ns), self.branch_id))
        for name in slots:
            self.caches.append(self.services.slots.acquire(name, self.branch_id))
        self.caches[0].holders[id(self.ref)] = self.subscriber  # its own appends with a hold
        self.ref.slot = self.caches[0]
        self.seen = self._seen_now()
        self._build_views()
        self._lease(self.strategy)

    def _adopt_claim(self) -> None:
        """On a shared store another process's actor may claim this namespace: before a command of
        an unclaimed one, read the record, and take a claim found as if it were made here (C8:
        managers for no reader are then refused; work begun for no reader writes nothing)."""
        stored = self._stored_record()
        if stored is not None:
            if isinstance(stored, str):  # D6: a reader's namespace compresses only with a marking strategy
                require_marking(self.strategy.marks_compression_reads, self.strategy.name, stored, self.place.namespace)
            self.record = stored
            self.epoch += 1
            self._build_views()
            self._start_strategy()

    def _lease(self, strategy: Strategy) -> None:
        """Hold the namespace's lease while ``strategy`` keeps its memory here (a shared store's other
        processes then can't serve it); give it back otherwise. ConfigConflictError if another
        process holds it: nothing changed."""
        wanted = strategy.keeps_memory and not self.readonly
        engine, name = self.services.engine, states.context_state(self.place.namespace)
        if wanted and not self.leased:
            if not engine.hold(self.branch_id, name):
                raise ConfigConflictError(
                    f"{self.place} is served by another process with a strategy that keeps its memory there "
                    f"({strategy.name!r} here): one process at a time serves such a namespace; open it in that "
                    f"process, or with a strategy that keeps none"
                )
            self.leased = True
        elif not wanted and self.leased:
            engine.release(self.branch_id, name)
            self.leased = False

    def stop(self, error: Callable[[], BaseException]) -> None:
        """Stop taking commands (later asks raise ``error()``, or what the ref was closed with);
        ``release`` answers what is queued."""
        if self.stop_error is not None:
            return
        self.ref.close(error)
        self.stop_error = self.ref.retired
        self.services.forget(self.ref)
        if self.in_flight is not None:
            self.in_flight.scope.cancel()

    def release(self) -> None:
        """Answer everything still queued or waiting, and let go of the slot caches."""
        waiting: list[tuple[Any, Reply[Any] | None]] = [*self.unit_waiters]
        if self.serving is not None:  # its handler was cut short
            waiting.append(self.serving)
        if self.in_flight is not None:
            waiting.append((None, self.in_flight.reply))
        for command, waiter in waiting:
            if waiter is not None:
                waiter.resolve(False, self.ref.refusal(command))
        self.unit_waiters.clear()
        self.ref.mailbox.drain()
        for cache in self.caches:
            if self.subscriber in cache.subscribers:
                cache.subscribers.remove(self.subscriber)
            if cache.holders.get(id(self.ref)) is self.subscriber:
                del cache.holders[id(self.ref)]
            self.services.slots.release(cache)
        self.caches = []
        if self.leased:
            self.leased = False
            try:
                self.services.engine.release(self.branch_id, states.context_state(self.place.namespace))
            except Exception:  # the connection is gone: so is the lease
                logger.warning("couldn't give back the lease of %s", self.place, exc_info=True)

    # -- reads of what is stored ------------------------------------------------------------

    def _stored_record(self) -> Record:
        return record_from_value(self.services.engine.read_value(states.reader_state(self.place.namespace),
                                                                 self.branch_id))

    def _stored_floor(self) -> int | None:
        return floor_from_value(self.services.engine.read_value(states.floor_state(self.place.namespace),
                                                                self.branch_id))

    def _edit_floor(self) -> int | None:
        """The floor an edit is judged against: the stored one (None if unreadable), never below ours."""
        stored = self._stored_floor()
        return None if stored is None else max(stored, self.floor)

    def _other_records(self) -> list[Record]:
        engine, own = self.services.engine, states.reader_state(self.place.namespace)
        return [
            record_from_value(engine.read_value(info.name, self.branch_id))
            for info in engine.list_states()
            if states.namespace_of_reader_state(info.name) is not None and info.name != own
        ]

    def _context_entries(self) -> list[Message]:
        items = self.services.engine.read_log(states.context_state(self.place.namespace), self.branch_id)
        engine = self.services.engine
        return [codec.message_from_json(item.data, sequence=item.sequence, store=engine.data_path) for item in items]

    def _store(self) -> StoreRef:
        if self.services.store is None:
            raise ReadOnlyStoreError(f"{self.place} is open in a read-only runtime; it refuses every write")
        return self.services.store

    # -- views and the strategy -------------------------------------------------------------

    @property
    def reader(self) -> str | None:
        return self.record if isinstance(self.record, str) else None

    def _build_views(self) -> None:
        listings = [SlotListing(cache) for cache in self.caches]
        merged = listings[0] if len(listings) == 1 else MergedListing(listings)
        view_filter = self.config.view_filter
        filtered = merged if view_filter is None else FilteredListing(merged, view_filter)
        if filtered is listings[0]:  # one slot as it is: its reader's projection is shared
            self.reader_listing = shared_reader_listing(self.caches[0], self.reader)
        else:
            self.reader_listing = ReaderListing(filtered, self.reader)
        # Raw bodies are judged in the reader's view of the messages as stored, filter or not: with
        # a filter, one message at a time (compile's memo keeps each), not a second projection.
        if view_filter is None:
            self.raw_body = MessageView(self.reader_listing).get
        else:
            stored, reader = MessageView(merged), self.reader
            self.raw_body = lambda message_id: (
                None if (found := stored.get(message_id)) is None else reader_view_of(found, reader)
            )
        epoch = self.epoch
        self.compile_memo = CompileMemo()  # entries of another view are never reused
        estimator = self.config.token_estimator
        self.view = MessageView(self.reader_listing, guard=lambda: self._guard(epoch),
                                estimate=estimate_message if estimator is None else _checked(estimator),
                                pricing=self._pricing)
        self.ctx = self._new_context()

    def _new_context(self) -> ActorContext:
        return ActorContext(
            place=self.place, branch_id=self.branch_id, reader=self.reader, view=self.view,
            engine=self.services.engine, strategy_name=self.strategy.name, writes=not self.readonly,
            holds=self.holds, settings=self.settings, clock=trio.current_time,
        )

    def _guard(self, epoch: int) -> None:
        """Before every read through the view a strategy holds (C8): a view of an older epoch is dead."""
        if epoch != self.epoch:
            raise ReaderConflictError(f"{self.place} changed its view since this view was made")

    def _start_strategy(self) -> None:
        """Initialise the strategy for the current view (C5: a failure leaves a claim standing; an
        unreachable store is no failure: the start is tried again, see ``_await_store``)."""
        self.ctx = self._new_context()
        self.strategy_started = True
        self.ref.wants_appends = self.strategy.auto_tick and not self.readonly
        _subscribe_every_append(self.caches[0], self.subscriber, self.ref.wants_appends)
        self.ref.strategy_config = self.strategy_config
        self.strategy_error = None
        try:
            self.strategy.initialize(self.ctx)
            self.seen = self._seen_now()
        except StoreUnavailableError as exc:
            self._await_store(exc)
        except Exception as exc:
            self.strategy_error = exc
            logger.warning("strategy %r of %s failed to start: %r", self.strategy.name, self.place, exc)
        else:
            if self.waiting is not None:
                logger.warning("%s: the store answers again; strategy %r started from what it holds", self.place,
                               self.strategy.name)
                self.waiting = None
                self.drain_wanted = self.strategy.auto_tick  # work the outage held up
        mark, writes = self.ctx.take()
        if mark or writes:  # initialize only reads: writes belong in next_unit or select
            logger.warning("strategy %r of %s wrote during initialize; not committed", self.strategy.name, self.place)

    def _await_store(self, exc: StoreUnavailableError) -> None:
        """The store was unreachable while the strategy started, or while its memory changed (a
        commit, a unit): that memory may be ahead of the store or half made, so it starts again
        from the store before its next use (a command tries at once, an auto-ticking drain after a
        back-off). Work begun on the old memory writes nothing (C9)."""
        if self.waiting is None:
            logger.warning("%s: the store is unreachable (%s); strategy %r starts again once it answers", self.place,
                           exc.reason, self.strategy.name)
            self.retry_delay = STORE_RETRY_S
            self.epoch += 1  # a unit out now was planned on the memory being dropped
            self._build_views()
        else:
            self.retry_delay = min(self.retry_delay * 2, STORE_RETRY_MAX_S)
        self.waiting = exc
        self.retry_at = trio.current_time() + self.retry_delay

    def _seen_now(self) -> int:
        """The sequence up to which the strategy has been handed the view. On a shared store other
        processes append at any time: what the caches held when it read them, not the store's now."""
        engine = self.services.engine
        if engine.shared:
            for cache in self.caches:  # each looked at in this step (no await since the strategy read them)
                cache.count()
            return max((cache.revision for cache in self.caches), default=0)
        return engine.last_sequence

    def _require_strategy(self) -> None:
        """The strategy, started: one waiting for the store starts now or raises
        ``StoreUnavailableError``; one that failed to start raises ``StrategyRefusedError``, or,
        when what it read was damaged, the ``StoreCorruptError`` naming the record (another
        strategy wouldn't mend it)."""
        if self.waiting is not None:
            self._start_strategy()
            if self.waiting is not None:
                raise StoreUnavailableError(self.waiting.url, self.waiting.reason)
        if isinstance(self.strategy_error, StoreCorruptError):
            raise StoreCorruptError(self.strategy_error.path, self.strategy_error.what)
        if self.strategy_error is not None:
            raise StrategyRefusedError(
                f"the strategy of {self.place} failed to start: {self.strategy_error!r}; recover with set_strategy() "
                f"or switch_branch()"
            )

    def _take_notes(self) -> None:
        notes = self.ref.take_notes()
        for sequence, hold in notes:
            if hold is not False:
                self.holds.place([sequence], None if hold is True else hold, trio.current_time())
        if notes and self.strategy.auto_tick:
            self.drain_wanted = True

    def _flush_new(self) -> None:
        """Take the notes lane, then hand the strategy each message it hasn't seen, in the reader's view (A4)."""
        self._take_notes()
        if self.strategy_error is not None or self.waiting is not None:
            return
        pending = self.view.after(self.seen)
        for message in pending:
            self.strategy.on_new_message(message, self.ctx)
        if pending:
            self.seen = max(self.seen, pending[-1].sequence)

    async def _commit(self, reaches: int = 0) -> bool:
        """Commit what the strategy buffered, the floor first, in one transaction; True if anything was.

        On failure the strategy is reloaded from what is stored (its memory may be ahead of it),
        and the error raised; with the store unreachable, once it answers again (``_await_store``).
        """
        mark, writes = self.ctx.take()
        mark = max(mark, reaches)
        if self.readonly:
            return False
        commands: list[Any] = []
        raise_floor = self.reader is not None and mark > self.floor  # D7: no reader, no floor
        if raise_floor:
            commands.append(SetValue(state=states.floor_state(self.place.namespace), branch=self.branch_id, value=mark,
                                     rising=True))  # never lowers a floor another process's actor raised
        commands += writes
        if not commands:
            return False
        engine = self.services.engine
        try:
            # Its lease may have gone with a lost connection, and another process serve the namespace now.
            lost = self.leased and not engine.holds(self.branch_id, states.context_state(self.place.namespace))
            if not lost:
                kinds: dict[str, StateKind] = {c.state: ("value" if isinstance(c, SetValue) else "log")
                                               for c in writes}
                registers = [RegisterState(name=name, kind=kind) for name, kind in kinds.items()
                             if not engine.has_state(name)]
                await self._store().ask(Atomically(commands=(*registers, *commands)))
        except StoreUnavailableError as exc:
            if writes:
                self._await_store(exc)
            raise
        except Exception:
            if writes:
                self._start_strategy()
            raise
        if lost:
            def refusal() -> ConfigConflictError:
                return ConfigConflictError(f"{self.place} lost its lease to another process; its managers here "
                                           f"are closed: reopen it where it is served")
            self.leased = False
            self.stop(refusal)
            raise refusal()
        if raise_floor:
            self.floor = max(self.floor, mark)
        return True

    # -- the loop ---------------------------------------------------------------------------

    async def serve(self) -> None:
        while True:
            if self.ref.retired is not None:  # closed from outside: the branch was deleted, the runtime closes
                self.stop(self.ref.retired)
            if self.stop_error is not None:
                return
            envelope = await self._next()
            if envelope is _END:
                continue
            if envelope is None:
                self.holds.lapse(trio.current_time())
                self.drain_wanted = self.strategy.auto_tick
            else:
                command, reply = envelope
                self.serving = envelope
                try:
                    result = await self.handle(command, reply)
                except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
                    if reply is not None:
                        reply.resolve(False, exc)
                    else:
                        self._report(exc, "%s: %s failed", self.place, type(command).__name__)
                else:
                    if reply is not None and result is not _LATER:
                        reply.resolve(True, result)
                self.serving = None
            if self.orphaned and not self.unit_waiters and (self.in_flight is None or self.in_flight.reply is None):
                # The last manager left and every call it made is answered: a tick sent before its
                # manager moved (switch_branch, fork) finishes here first.
                self.stop(_retired(self.place))
                continue
            await self._pump()

    def _report(self, exc: BaseException, message: str, *args: Any) -> None:
        """Log a failure no caller hears of. The store or branch gone while this actor is stopping
        (its runtime closing, its branch deleted) is expected then: debug level, no traceback."""
        if self.ref.retired is not None and isinstance(exc, (RuntimeClosedError, BranchNotFoundError)):
            logger.debug(message + " (the actor is stopping: %s)", *args, exc)
        else:
            logger.error(message, *args, exc_info=exc)

    async def _next(self) -> Any:
        """The next envelope; None when a deadline (a hold lapsing, a backoff ending) came first."""
        inbox = self.ref.mailbox
        try:
            envelope = inbox.receive_nowait()
        except trio.WouldBlock:
            deadline = self._deadline()
            try:
                if deadline == math.inf:  # no timer: no cancel scope to pay for
                    envelope = await inbox.receive()
                else:
                    envelope = None
                    with trio.move_on_at(deadline):
                        envelope = await inbox.receive()
            except trio.EndOfChannel:
                return _END
        except trio.EndOfChannel:
            return _END
        else:
            self._streak += 1
            if self._streak >= FAIRNESS_STREAK:  # a long queue still lets the host's other tasks run
                self._streak = 0
                await trio.lowlevel.checkpoint()
        return envelope

    def _deadline(self) -> float:
        """When the loop should look again without a command: a hold lapsing, a backoff ending."""
        now = trio.current_time()
        deadline = self.holds.next_lapse(now)
        if self.strategy.auto_tick and not self.readonly and self.in_flight is None:
            wake = self._wake_at()
            if wake is not None and wake > now:  # a backoff already over is no reason to wake again
                deadline = min(deadline, wake)
        return deadline

    async def handle(self, command: Any, reply: Reply[Any] | None) -> Any:
        if (self.record is None and self.services.engine.shared
                and not isinstance(command, UnitDone | Wake | ReportHealth)):  # _health adopts its own
            self._adopt_claim()
        match command:
            case Compile():
                return await self._compile(command)
            case Preview():
                check_reader(self.record, command.reader, self.place)
                self._require_strategy()
                validate_injections((), command.message_injections)
                self._flush_new()
                return self.strategy.preview(self.view, command.budget, SelectOptions(dry_run=True, context=self.ctx))
            case Tick() | ResetHeadWindow():
                return self._queue_unit(command, reply)
            case CheckReady():
                check_reader(self.record, command.reader, self.place)
                self._flush_new()
                return self.strategy.is_ready()
            case Edit():
                return await self._edit(command)
            case Remove():
                return await self._remove(command)
            case Attach():
                return await self._attach(command)
            case Detach():
                self.managers.discard(command.token)
                self.orphaned = not self.managers  # it stops once it owes no caller an answer
                return None
            case SetStrategy():
                return await self._set_strategy(command)
            case Fork():
                return await self._fork(command)
            case Derive():
                return await self._derive(command)
            case QuerySummaries():
                return self._query(command)
            case Hold():
                now = trio.current_time()
                cache = self.caches[0]
                found = (cache.get(i) for i in command.message_ids)
                self.holds.place([m.sequence for m in found if m is not None], command.timeout_s, now)
                return None
            case Release():
                self.holds.release([s for s in (parse_id(i) for i in command.message_ids) if s is not None])
                self.drain_wanted = self.strategy.auto_tick
                return None
            case SetSystemPrompt():
                self.settings.system_prompt = command.text
                return None
            case SetTools():
                self.settings.tools = command.tools
                return None
            case ReportHealth():
                return self._health()
            case PinRange() | Unpin() | ListPins():
                return await self._pins(command)
            case RetryQuarantined():
                check_reader(self.record, command.reader, self.place)
                self._require_strategy()
                self._store()  # ReadOnlyStoreError before anything changes
                keys = self.strategy.retry_quarantined(self.ctx)
                await self._commit()
                self.drain_wanted = True
                await self._pump()
                return keys
            case Inspect():
                return NamespaceSnapshot(self.strategy, self.record, self.floor, self.epoch, tuple(self.caches),
                                         self.reader_listing, self.model_timeout_s)
            case UnitDone():
                await self._unit_done(command)
                return None
            case Wake():
                self._take_notes()
                return None
        raise TypeError(f"not a namespace command: {command!r}")

    # -- managers ---------------------------------------------------------------------------

    async def _attach(self, command: Attach) -> Attached:
        resolved = check_attach(self.record, command.reader, compiles_for_none=command.compiles_for_none,
                                place=self.place)
        self._check_config(command)
        require_marking(self.strategy.marks_compression_reads, self.strategy.name, resolved, self.place.namespace)
        if resolved is not None and self.record is None and not self.readonly:
            try:  # decided in the store: on a shared store, another process's actor may claim it first
                await self._store().ask(SetValue(state=states.reader_state(self.place.namespace), branch=self.branch_id,
                                                 value=resolved, expect=None))
            except ValueConflictError:
                check_attach(self._stored_record(), command.reader, compiles_for_none=command.compiles_for_none,
                             place=self.place)  # ReaderConflictError, unless it claimed it for the same reader
            self.record = resolved
            self.epoch += 1  # work begun for the unclaimed view writes nothing (C9)
            self._build_views()
            self._start_strategy()  # a failure here leaves the claim standing (C5)
        if not self.strategy_started:
            self._start_strategy()
        await self._record_config()
        self.managers.add(command.token)
        self.orphaned = False
        return Attached(resolved)

    async def _record_config(self) -> None:
        """Record the strategy config this namespace runs on its branch, so a reader (``ctxrt compile``)
        compiles with exactly it. A host's own strategy is recorded as absent."""
        if self.readonly:
            return
        state = states.config_state(self.place.namespace)
        described = catalog.describe(self.strategy_config)
        if self.services.engine.read_value(state, self.branch_id) != described:
            await self._store().ask(SetValue(state=state, branch=self.branch_id, value=described))

    def _check_config(self, command: Attach) -> None:
        wanted, running = command.config, self.config
        if command.explicit_strategy and wanted.strategy != self.strategy_config:
            raise ConfigConflictError(
                f"{self.place} runs strategy {self.strategy_config!r}; this open asked for {wanted.strategy!r}"
            )
        if wanted.view_filter is not None and wanted.view_filter is not running.view_filter:
            raise ConfigConflictError(f"{self.place} runs with another view_filter")
        if wanted.token_estimator is not None and wanted.token_estimator is not running.token_estimator:
            raise ConfigConflictError(f"{self.place} runs with another token_estimator")
        if (wanted.slot, *wanted.auxiliary) != (running.slot, *running.auxiliary):
            raise ConfigConflictError(
                f"{self.place} reads slots {(running.slot, *running.auxiliary)}; this open asked for "
                f"{(wanted.slot, *wanted.auxiliary)}"
            )

    def _check_branching(self, reader: str | None) -> None:
        """C1, C3, C7, C12: whether a manager compiling for ``reader`` may fork or derive from here."""
        resolve_reader(self.record, reader, self.place)
        if reader is None and self.record is not None:
            check_reader(self.record, None, self.place)
        self._require_strategy()

    async def _fork(self, command: Fork) -> Any:
        self._check_branching(command.reader)
        return await self._store().ask(CreateBranch(name=command.name, from_branch=self.branch_id))

    async def _derive(self, command: Derive) -> tuple[Any, str | None]:
        self._require_strategy()  # C12
        # The head's record decides (C11): a no-reader parent's child takes what the head records.
        child_reader = resolve_reader(self.record, command.reader, self.place)
        config = command.strategy if command.strategy is not None else self.strategy_config
        strategy = build_strategy(config)
        require_marking(strategy.marks_compression_reads, strategy.name, child_reader, self.place.namespace)
        # Written even when None: a child made at an earlier sequence would otherwise keep what that
        # checkpoint recorded, not what the head records (C11, a cleared record included).
        created = await self._store().ask(Atomically(commands=(
            CreateBranch(name=command.name, from_branch=self.branch_id, at_sequence=command.at_sequence),
            SetValue(state=states.reader_state(self.place.namespace), branch=command.name, value=child_reader),
        )))
        return created[0], child_reader

    async def _set_strategy(self, command: SetStrategy) -> None:
        check_reader(self.record, command.reader, self.place)
        strategy = build_strategy(command.config)
        require_marking(strategy.marks_compression_reads, strategy.name, self.reader, self.place.namespace)
        self._lease(strategy)
        self.strategy, self.strategy_config = strategy, command.config
        self.epoch += 1  # a unit of the old strategy writes nothing
        self._build_views()
        self._start_strategy()
        await self._record_config()

    async def _pins(self, command: PinRange | Unpin | ListPins) -> Any:
        check_reader(self.record, command.reader, self.place)
        self._require_strategy()
        self._flush_new()
        strategy = self.strategy
        if not isinstance(strategy, Pinning):
            if isinstance(command, ListPins):
                return []
            raise StrategyRefusedError(f"strategy {strategy.name!r} does not support pins")
        if isinstance(command, ListPins):
            return strategy.list_pins()
        self._store()  # ReadOnlyStoreError before anything changes
        if isinstance(command, PinRange):
            found: Any = strategy.pin_range(self.ctx, command.first_id, command.last_id, name=command.name,
                                            level=command.level)
        else:
            found = strategy.unpin(self.ctx, command.pin_id)
        await self._commit()
        return found

    def _health(self) -> NamespaceHealth:
        """Answered with the store unreachable too: then ``waiting_for`` says so. A strategy waiting
        for the store tries its start first; the slot's head is looked at (one read on a shared store)."""
        backlog, ready = Backlog(), False
        if self.waiting is not None:
            self._start_strategy()
        outage = self.waiting
        if outage is None:
            try:
                if self.record is None and self.services.engine.shared:
                    self._adopt_claim()
                self.caches[0].count()
                self._flush_new()  # the strategy hears of new messages first, as a compile's would
                if self.strategy_error is None:
                    backlog, ready = self.strategy.backlog(self.ctx), self.strategy.is_ready()
            except StoreUnavailableError as exc:
                outage = exc
        return NamespaceHealth(
            namespace=self.place.namespace, branch=self.place.branch, reader=self.reader,
            managers=len(self.managers), mailbox_depth=self.ref.mailbox_depth,
            in_flight_model_calls=0 if self.in_flight is None else 1, ready=ready,
            quarantined=tuple(self.strategy.quarantined()), narrowing_floor=self.floor,
            strategy_error=None if self.strategy_error is None else repr(self.strategy_error),
            pending_units=backlog.units, compression_debt_tokens=backlog.tokens, last_compile_ms=self.last_compile_ms,
            waiting_for=None if outage is None else f"the store: {outage}",
        )

    # -- compile ----------------------------------------------------------------------------

    async def _compile(self, command: Compile) -> Any:
        check_reader(self.record, command.reader, self.place)
        self._require_strategy()
        validate_injections(command.injections, command.message_injections)  # B4: before the strategy runs
        self._flush_new()
        started = time.perf_counter()
        options = SelectOptions(dry_run=command.dry_run, context=self.ctx, strict=command.strict)
        entries = self.strategy.select(self.view, command.budget, options)
        if not command.dry_run:
            self.ref.render_stats = self.strategy.render_stats()
        if command.dry_run:
            self.ctx.take()
        else:
            try:
                await self._commit()
            except Exception:
                # The strategy's bookkeeping (chunks closing, an anchor) waits; the compile goes on (P1, D4).
                logger.warning("%s: what the strategy wrote during a compile could not commit", self.place,
                               exc_info=True)
        result = build_compile_result(
            entries, namespace=self.place.namespace, branch=self.place.branch, reader=self.reader,
            strategy_name=self.strategy.name, lookup=self.raw_body, injections=command.injections,
            message_injections=command.message_injections, memo=self.compile_memo,
        )
        self.last_compile_ms = (time.perf_counter() - started) * 1000
        return result

    def _query(self, command: QuerySummaries) -> Any:
        check_reader(self.record, command.reader, self.place)  # C10
        self._require_strategy()
        self._flush_new()
        strategy, query = self.strategy, command.query
        if not isinstance(strategy, SummaryReader):
            return None
        match query:
            case SearchSummaries():
                return strategy.search_summaries(self.ctx, text=query.text, regex=query.regex, levels=query.levels,
                                                 limit=query.limit, include_merged=query.include_merged)
            case GetSummary():
                return strategy.get_summary(self.ctx, query.summary_id)
            case SummariesInRange():
                return strategy.get_summaries_in_range(self.ctx, from_ms=query.from_ms, to_ms=query.to_ms,
                                                       level=query.level)
        raise TypeError(f"not a summary query: {query!r}")

    # -- edits and removals -----------------------------------------------------------------

    async def _edit(self, command: Edit) -> None:
        check_reader(self.record, command.reader, self.place)
        engine, sequence = self.services.engine, parse_id(command.message_id)
        while True:
            # Judged against the message as it is now (D1-D5 compare with what readers saw last), and
            # written only onto that version: another edit, maybe another namespace's or process's,
            # that lands first makes the store refuse this one, and it is judged again.
            item = None if sequence is None else engine.read_item(self.config.slot, self.branch_id, sequence)
            if item is None:
                raise MessageNotFoundError(f"no message {command.message_id!r} in slot {self.config.slot!r} on "
                                           f"branch {self.place.branch!r}")
            current = decode_stored(engine, item.data, item.sequence)
            judge_edit(current, command.content, reader=self.reader, floor=self._edit_floor,
                       others=self._other_records, place=self.place)  # floor and records read only for a narrowing
            data = codec.message_to_json(current.participant, command.stored, current.metadata, current.timestamp_ms,
                                         current.caused_by)
            appended = Appended(current.participant, command.content, current.metadata, current.timestamp_ms,
                                current.caused_by)
            narrows = any(hidden_by_edit(current.content, command.content))
            edit = EditItem(state=self.config.slot, branch=self.branch_id, item_sequence=current.sequence, data=data,
                            blobs=command.blobs, attachment=appended, flagged=appended.audience,
                            expect_version=item.version,
                            # checked again in the write: another process's actor may raise the floor meanwhile
                            floor_state=states.floor_state(self.place.namespace) if narrows else None)
            propagation = edit_propagation(self._context_entries(), current.id, command.content, reader=self.reader,
                                           context_state=states.context_state(self.place.namespace),
                                           branch=self.branch_id)
            try:
                await self._store().ask(Atomically(commands=(edit, *propagation)))  # M5, L3: one commit
            except ValueConflictError:
                continue
            return

    async def _remove(self, command: Remove) -> None:
        cache = self.caches[0]
        first, last = cache.get(command.first_id), cache.get(command.last_id)
        for given, found in ((command.first_id, first), (command.last_id, last)):
            if found is None:
                raise MessageNotFoundError(f"no message {given!r} in slot {self.config.slot!r} on branch "
                                           f"{self.place.branch!r}")
        assert first is not None and last is not None
        if first.sequence > last.sequence:
            raise ValueError(f"remove_messages: from_id {command.first_id!r} comes after to_id {command.last_id!r}")
        removal = RemoveItems(state=self.config.slot, branch=self.branch_id, from_sequence=first.sequence,
                              to_sequence=last.sequence)
        propagation = removal_propagation(self._context_entries(), first.sequence, last.sequence,
                                          context_state=states.context_state(self.place.namespace),
                                          branch=self.branch_id)
        await self._store().ask(Atomically(commands=(removal, *propagation)))

    # -- units: ticks, the drain, transition summaries --------------------------------------

    def _queue_unit(self, command: Tick | ResetHeadWindow, reply: Reply[Any] | None) -> Any:
        # Checked now and again when its turn comes: a claim may land while it waits (C8).
        check_reader(self.record, command.reader, self.place)
        self._require_strategy()
        self._require_capability(command)
        if reply is None:
            return None
        self.unit_waiters.append((command, reply))
        return _LATER

    def _require_capability(self, command: Tick | ResetHeadWindow) -> None:
        if isinstance(command, ResetHeadWindow) and not isinstance(self.strategy, HeadWindowReset):
            raise StrategyRefusedError(f"strategy {self.strategy.name!r} does not support head window reset")

    async def _pump(self) -> None:
        """Start the next unit when none is out: a manager's first, else the drain's."""
        while self.in_flight is None and self.stop_error is None:
            if self.unit_waiters:
                command, reply = self.unit_waiters.popleft()
                try:
                    await self._begin(command, reply)
                except Exception as exc:
                    reply.resolve(False, exc)
            elif (self.drain_wanted and self.strategy.auto_tick and not self.readonly and self.strategy_error is None
                  and not self.orphaned):
                wake = self._wake_at()
                if wake is not None and wake > trio.current_time():
                    self.drain_wanted = False  # the loop's deadline wakes it when the backoff ends
                    return
                try:
                    started = await self._begin(None, None)
                except StoreUnavailableError as exc:
                    if self.waiting is None:  # else its failed start said so already
                        self._await_store(exc)  # tried again after the back-off (_wake_at)
                    started = False
                except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
                    self._report(exc, "compression drain of %s failed to plan a unit", self.place)
                    started = False
                if not started:
                    self.drain_wanted = False
            else:
                return

    def _wake_at(self) -> float | None:
        """When the drain may run again: after the store's back-off while waiting for the store,
        else the strategy's, if it names a usable time (a host strategy's mistake here is logged
        and ignored, never the end of the actor)."""
        if self.waiting is not None:
            return self.retry_at
        try:
            wake = self.strategy.wake_at()
            if wake is None:
                return None
            wake = float(wake)
        except Exception:
            logger.exception("strategy %r of %s: wake_at() failed; ignoring its backoff", self.strategy.name,
                             self.place)
            return None
        return wake if not math.isnan(wake) else None

    async def _begin(self, command: Tick | ResetHeadWindow | None, reply: Reply[Any] | None) -> bool:
        """Plan the next unit, raise the floor and start its model call; True if a call is out.

        A unit with nothing to call answers its caller at once.
        """
        if command is not None:
            check_reader(self.record, command.reader, self.place)
        self._require_strategy()  # the drain's too: a start waiting for the store is tried here
        if command is not None:
            self._require_capability(command)  # the strategy may have been replaced while it waited
        if self.readonly:
            if reply is not None:
                reply.resolve(True, False)
            return False
        self._flush_new()
        if isinstance(command, ResetHeadWindow):
            return await self._begin_reset(command, reply)
        unit = self.strategy.next_unit(self.ctx)
        if unit is None:
            wrote = await self._commit()
            if reply is not None:
                reply.resolve(True, wrote)
            return False
        await self._commit(unit.reaches)  # the floor covers the unit before its request exists (D2, D4)
        self._call(unit, self.strategy.request_for(unit, self.ctx), "tick" if command else "drain", reply)
        return True

    async def _begin_reset(self, command: ResetHeadWindow, reply: Reply[Any] | None) -> bool:
        strategy = self.strategy
        assert isinstance(strategy, HeadWindowReset)
        if command.text is not None:
            result = await self._transition(strategy.transition_content(self.ctx, command.text, None))
            if reply is not None:
                reply.resolve(True, result)
            return False
        unit = strategy.transition_unit(self.ctx)
        await self._commit(unit.reaches)  # before the transition summary reads the head window (D2, D4)
        self._call(unit, self.strategy.request_for(unit, self.ctx), "reset", reply)
        return True

    async def _transition(self, content: list[dict[str, Any]]) -> str:
        strategy = self.strategy
        assert isinstance(strategy, HeadWindowReset)
        data, blobs, appended = prepare_append(strategy.transition_participant, content, origin=self.ref)
        operation = await self._store().ask(
            AppendItem(state=self.config.slot, branch=self.branch_id, data=data, blobs=tuple(blobs),
                       attachment=appended, flagged=appended.audience)
        )
        message_id = str(operation.sequence)
        strategy.start_head_window(self.ctx, message_id)
        await self._commit()
        return message_id

    def _call(self, unit: Unit, request: Any, kind: str, reply: Reply[Any] | None) -> None:
        scope = trio.CancelScope()
        self.in_flight = _InFlight(kind, unit, self.epoch, reply, scope, request)
        self.ref.in_flight = 1
        self.children.start_soon(_complete, self.ref, self.model, request, unit, self.epoch, self.model_timeout_s,
                                 scope)

    async def _unit_done(self, done: UnitDone) -> None:
        flight, self.in_flight = self.in_flight, None
        self.ref.in_flight = 0
        if flight is None:
            return
        if done.epoch != self.epoch:
            logger.warning("%s: discarded the reply to %s: the namespace's view changed while it was out (C9)",
                           self.place, flight.unit.key)
            if flight.reply is not None:
                flight.reply.resolve(*((True, False) if flight.kind == "tick" else (False, self._moved_error())))
            return
        try:
            if flight.kind == "reset":
                strategy = self.strategy
                assert isinstance(strategy, HeadWindowReset)
                result: Any = await self._transition(strategy.transition_content(self.ctx, None, done.outcome))
            else:
                result = self.strategy.apply_unit(flight.unit, done.outcome, self.ctx)
                await self._commit()
            await self._calibrate(flight.request, done.outcome)
        except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
            if isinstance(exc, StoreUnavailableError) and self.waiting is None:
                self._await_store(exc)  # the unit may be half applied: done again once the store answers
            if flight.reply is not None:
                flight.reply.resolve(False, exc)
            elif not isinstance(exc, StoreUnavailableError):
                self._report(exc, "compression drain of %s failed to apply %s", self.place, flight.unit.key)
            self.drain_wanted = False
            return
        if flight.reply is not None:
            flight.reply.resolve(True, result)
        if flight.kind == "drain" and not result:
            self.drain_wanted = False

    async def _calibrate(self, request: Any, outcome: Any) -> None:
        """Tell the estimator what the model reported for a request against its plain estimate;
        store a bundled estimator's calibration with the namespace. A failure here costs only the
        calibration, never the unit."""
        estimator = self.config.token_estimator
        if estimator is None or not isinstance(outcome, ModelResponse) or not isinstance(request, ModelRequest):
            return
        estimated = estimate_text(request.system or "") + sum(estimate_blocks(m.content) for m in request.messages)
        try:
            estimator.observe(request.model, estimated, outcome.usage.input_tokens)
        except Exception:
            logger.exception("%s: the token estimator failed to observe a reply's usage", self.place)
            return
        self.observed += 1
        if isinstance(estimator, CalibratedEstimator) and not self.readonly:
            try:
                await self._store().ask(SetValue(state=states.calibration_state(self.place.namespace),
                                                 branch=self.branch_id, value=estimator.to_json()))
            except Exception:
                logger.warning("%s: the token calibration could not be stored", self.place, exc_info=True)

    def _pricing(self) -> object:
        """What the view's ``pricing`` reports: the bundled estimator's own version (it may be shared
        by several namespaces), else how many reports this actor's estimator has heard."""
        estimator = self.config.token_estimator
        return estimator.version if isinstance(estimator, CalibratedEstimator) else self.observed

    def _moved_error(self) -> BaseException:
        return StrategyRefusedError(f"the strategy or reader of {self.place} changed while this request ran; retry it")


def _subscribe_every_append(cache: Any, subscriber: Callable[[Message, Appended | None], None], wants: bool) -> None:
    """Hear of every append of the own slot only while the strategy drains in the background
    (``ref.wants_appends``); otherwise the cache calls ``subscriber`` only for this namespace's
    own appends with a hold (``cache.holders``), so an append never visits idle namespaces."""
    if wants and subscriber not in cache.subscribers:
        cache.subscribers.append(subscriber)
    elif not wants and subscriber in cache.subscribers:
        cache.subscribers.remove(subscriber)


def _checked(estimator: TokenEstimator) -> Callable[[Message], int]:
    """A host's estimator, its answers checked: a negative or non-int estimate would let any
    compile 'fit' (or fail deep inside a strategy), so it is refused where it was given."""
    estimate = estimator.estimate

    def checked(message: Message) -> int:
        tokens = estimate(message)
        if type(tokens) is not int or tokens < 0:
            raise TypeError(f"token_estimator {estimator!r} estimated message {message.id} at {tokens!r}: "
                            f"an estimate must be a non-negative int")
        return tokens

    return checked


def _subscriber(ref: NamespaceRef) -> Callable[[Message, Appended | None], None]:
    """What a slot cache calls after a commit: a note of this namespace's own appends (for their
    holds), and a wake-up on every append while its strategy drains in the background. The cache
    calls it for the first only when it is the append's origin (``SlotCache.holders``), for the
    second only while it is subscribed to every append (``_subscribe_every_append``)."""

    def appended(message: Message, attachment: Appended | None) -> None:
        if attachment is not None and attachment.origin is ref and attachment.hold is not False:
            ref.note_appended(message.sequence, attachment.hold)
        elif ref.wants_appends:
            ref.note_appended(message.sequence, False)

    return appended


async def _complete(
    ref: NamespaceRef, model: Any, request: Any, unit: Unit, epoch: int, timeout_s: float, scope: trio.CancelScope
) -> None:
    """The child task of one unit: the model call, outside the mailbox; its outcome goes back as UnitDone."""
    with scope:
        outcome: Any
        if model is None:
            outcome = ModelError(f"namespace {ref.namespace!r} has no model for compression", retryable=False)
        else:
            try:
                with trio.fail_after(timeout_s):
                    outcome = await model.complete(request)
            except trio.TooSlowError:
                outcome = ModelError(f"model {request.model!r} gave no reply within {timeout_s} s", retryable=True)
            except ModelError as exc:
                outcome = exc
            except Exception as exc:  # a host's model that breaks its protocol: the unit fails, the actor goes on
                logger.exception("model call for %s in %r failed", unit.key, ref.namespace)
                outcome = ModelError(f"the model raised {exc!r}", retryable=False)
        ref.tell(UnitDone(epoch, unit, outcome))


async def serve_namespace(services: Services, ref: NamespaceRef, started: Reply[None]) -> None:
    """Serve one namespace actor until it stops: its last manager leaves, its branch is deleted,
    or the runtime closes. Its start's outcome goes to ``started`` (None, or what the start raised).

    It runs in the runtime's nursery, never in an opener's scope: trio leaves a task started
    with ``nursery.start`` in the opener's scope when the opener is cancelled as it starts, and
    an actor cancelled with its opener strands every other caller's request (L3, L4)."""
    failed: BaseException | None = None
    async with trio.open_nursery() as children:
        actor = _Actor(services, ref, children)
        try:
            try:
                await actor.start()
            except Exception as exc:
                actor.stop(_retired(actor.place))  # opens queued meanwhile retry on a fresh actor
                started.resolve(False, exc)
                return
            started.resolve(True, None)
            await actor.serve()
        except BaseException as exc:
            # The runtime closing (Cancelled) or an interrupt: raised once out of the nursery as
            # itself, not in a group, so the runtime's scope and a host's ``except`` see it.
            failed = exc
        finally:
            actor.stop(actor.stop_error or _runtime_closed(actor.place))
            started.resolve(False, actor.ref.refusal(None))  # the runtime closed during the start
            actor.release()
            children.cancel_scope.cancel()
    if failed is not None:
        raise failed
