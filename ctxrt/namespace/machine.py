"""``NamespaceMachine``: a namespace actor's state and every decision it makes, with no I/O.

h11's shape: the machine holds the actor's state (the reader record, the narrowing floor, the
view epoch, the strategy, the holds, the wait for an unreachable store, the write lane), with
three components for the rest: its ``Drain`` (``namespace/drain.py``: the units, the ticks
waiting for one, the background drain), its ``ReaderViews`` (``namespace/views.py``, rebuilt at
each epoch) and its ``Lease`` (``namespace/lease.py``). The protocol is one table,
``PROTOCOL``: each command's kind (below) and its handler. ``handle(message, inputs)`` returns
the effects the loop in ``namespace/actor.py`` carries out (``namespace/effects.py``):
``Commit`` a store command, ``CallModel``, ``Answer`` a caller, take, look at or give back the
lease, ``SetTimer``, ``Publish`` a status. What the store, the model and the lease answer comes
back as messages (``Committed``, ``UnitDone``, ``LeaseAnswer``). Nothing here awaits, imports
trio or reads a clock: the time, the mailbox's depth and the store's committed state (a
``StoreReads`` port) come in with each message, so its tests can drive it with no store at all.

A handler that writes is a generator: it yields a ``Write`` and is resumed with the store's
result (or has the store's error raised into it) when ``Committed`` comes back; one that asks
the loop (its slot caches, the lease) yields that effect and is resumed with the answer.

Ordering (docs/architecture.md, Namespace actors). Messages are taken in arrival order. Writes
go out through one lane, one commit at a time, in the order they were made. A command is one of:

- a *read* (compile, preview, is_ready, health, summary queries, pins, holds, ticks queued, ...):
  handled at once, even while the lane has a commit out; its own writes (a compile's bookkeeping)
  join the lane and it is answered once they are committed;
- an *exclusive write* (edit, remove, fork, derive): handled when its turn in the lane comes, so
  it is judged against everything written before it; reads go on while its commit is out;
- a *barrier* (attach, set_strategy): handled at its turn in the lane, and everything
  that arrives after it waits until it is answered.

Strategy writes in the lane were made from the strategy's memory: if a commit before them fails
and the strategy is reloaded from the store, they are dropped, never committed on their own.
"""

from __future__ import annotations

import copy
import enum
import logging
import math
from collections import deque
from collections.abc import Callable
from types import GeneratorType
from typing import Any

import attrs

from ..content import codec
from .. import tracing
from ..compile.pipeline import build_compile_result
from ..compile.injections import validate_injections
from ..content.blocks import Message, hidden_by_edit
from ..errors import (
    BranchNotFoundError,
    ConfigConflictError,
    MessageNotFoundError,
    ReaderConflictError,
    ReadOnlyStoreError,
    RuntimeClosedError,
    StoreCorruptError,
    StoreUnavailableError,
    StrategyRefusedError,
    ValueConflictError,
)
from ..asks import Reply
from ..slots import Appended, SlotCache, parse_id
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
from ..budget import Budget
from ..strategies import catalog, settings
from ..strategies.base import (
    Backlog,
    Pinning,
    SelectOptions,
    Strategy,
    SummaryReader,
)
from ..content.tokens import CalibratedEstimator
from ..strategies.windowed import WindowedPassthroughStrategy
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
from .drain import (
    LATER,
    AwaitStore,
    CommitStrategy,
    Decision,
    Decisions,
    Drain,
    FlushNew,
    Moment,
    Report,
    RequireStrategy,
    Resumed,
)
from .effects import (
    Acquire,
    Acquired,
    Answer,
    CallModel,
    Commit,
    Committed,
    Effect,
    Gen,
    Inputs,
    LeaseAnswer,
    Listen,
    Publish,
    ReleaseLease,
    SetTimer,
    KeepRecord,
    SoundAlarm,
    Stop,
    StoreReads,
    TakeLease,
    TimerFired,
    Write,
)
from ..store.protocol import append_after, append_result
from .lease import Lease
from .protocol import (
    ActorRetired,
    AppendAndHold,
    Attach,
    Attached,
    CheckReady,
    Compile,
    CompileMetadata,
    CompressionHold,
    DescribeCompile,
    FindMaxSummaryLevel,
    Derive,
    Detach,
    Edit,
    Fork,
    GetSummary,
    Hold,
    Inspect,
    ListingFigures,
    ListPins,
    NamespaceConfig,
    NamespaceHealth,
    NamespaceSnapshot,
    NamespaceStatus,
    PinRange,
    Preview,
    QuerySummaries,
    Release,
    Remove,
    ReportHealth,
    ResetHeadWindow,
    Retire,
    ReportAnchor,
    ReportHolds,
    RetryQuarantined,
    SearchSummaries,
    SetAnchor,
    SetStrategy,
    SetSystemPrompt,
    SetTools,
    SlotAppended,
    SummariesInRange,
    Tick,
    UnitDone,
    Unpin,
    UpdateContextSettings,
    refusal_for,
)
from .views import ReaderViews, build_views, flush_new, release_views

logger = logging.getLogger("ctxrt.namespace")



class Kind(enum.Enum):
    """How a command is ordered against the write lane (the module's docstring)."""

    READ = "read"  # handled at once; its own writes join the lane
    EXCLUSIVE = "exclusive"  # handled at its turn in the lane
    BARRIER = "barrier"  # handled at its turn; what arrives after it waits


class _Task:
    """A command (or the machine's own work) being handled: its handler's generator, once it has one."""

    __slots__ = ("command", "reply", "kind", "gen", "own", "trace")

    def __init__(self, command: Any, reply: Reply[Any] | None, kind: Kind, *, own: bool = False) -> None:
        self.command = command
        self.reply = reply
        self.kind = kind
        self.gen: Gen | None = None
        self.own = own  # the machine's own work (a unit, the drain), not a caller's command
        # The trace context its handler runs in and its commits carry: its sender's, from the
        # reply (a compile's own span once it has one).
        self.trace: Any = None if reply is None else reply.trace


@attrs.define
class _Item:
    """A place in the write lane: an exclusive task waiting for its turn (``write`` None), or a write."""

    task: _Task
    write: Write | None
    generation: int


@attrs.define
class _Lane:
    """The write lane and the order of handling: the places waiting (``queue``), the head sent
    until its ``Committed`` (``out``, under ``token``), the exclusive task that has the lane
    (``holder``), barriers taken and not yet answered (``barriers``; later messages wait in
    ``held``), the task waiting for the loop's answer (its slot caches, the lease: ``asking``) and
    the strategy write waiting for the look at the lease before it goes out (``checking``)."""

    queue: deque[_Item] = attrs.Factory(deque)
    out: _Item | None = None
    token: int = 0
    holder: _Task | None = None
    barriers: int = 0
    held: deque[tuple[Any, Reply[Any] | None]] = attrs.Factory(deque)
    asking: _Task | None = None
    checking: _Item | None = None

    def idle(self) -> bool:
        """Nothing waits in the lane, is held behind a barrier or is out."""
        return not self.queue and not self.held and self.out is None and self.checking is None

    def free(self) -> bool:
        """The lane's head may go: nothing is out, and the loop owes no answer."""
        return self.out is None and self.asking is None and self.checking is None


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


def retired(place: Place) -> Callable[[], BaseException]:
    return lambda: ActorRetired(str(place))


def read_only_refusal(place: Place, standby: bool) -> str:
    """Why a write in a read-only runtime is refused (naming a hot standby, which takes none)."""
    where = " on a hot standby (its primary takes the writes)" if standby else ""
    return f"{place} is open in a read-only runtime{where}; it refuses every write"


class NamespaceMachine:
    """One (branch incarnation, namespace)'s actor state. ``handle`` is its only way in."""

    def __init__(
        self, config: NamespaceConfig, place: Place, branch_id: int, lease: Lease, *, writes: bool,
        model_timeout_s: float, standby: bool = False,
    ) -> None:
        self.config = config
        self.place = place
        self.branch_id = branch_id
        self.readonly = not writes
        self.standby = standby  # the store is a hot standby (its primary takes the writes): refusals say so
        self.model_timeout_s = model_timeout_s
        self.inputs: Inputs | None = None  # what came with the message being handled
        self.record: Record = None
        self.floor = 0
        self.epoch = 0
        self.strategy_config: Any = config.strategy
        self.strategy: Strategy = build_strategy(config.strategy)
        self.strategy_started = False
        self.strategy_error: BaseException | None = None
        # The store was unreachable when the strategy started or its memory last changed: that
        # memory is not known to match the store, so the strategy starts again (from what is
        # stored) before its next use. Not a failed start (C5): it ends by itself.
        self.waiting: StoreUnavailableError | None = None
        self.holds = Holds()
        self.settings = Settings()
        self.settings_changes: dict[str, Any] = {}  # the live settings changed, in force (T14)
        self.context_settings = settings.ContextSettings()
        self.managers: set[int] = set()
        self.orphaned = False  # its last manager left; it stops once it owes no caller an answer
        self.caches: list[SlotCache] = []
        self.seen = 0
        self.drain: Drain = Drain(place, branch_id, config, readonly=not writes)
        self.unit_task: _Task | None = None  # the unit being planned or applied: one at a time
        self.last_compile_ms: float | None = None
        self.render_stats: Any = None
        self.stats_compile_id: str | None = None
        self.ledger = False  # the namespace keeps a request ledger on this branch (Q2): read at set-up
        self.lease = lease
        self.stopping: Callable[[], BaseException] | None = None
        self.lane = _Lane()
        self.open: dict[_Task, None] = {}  # every task not yet finished, in order
        self.generation = 0  # the strategy's memory: moves when it is reloaded (a new context)
        self.listening = False
        self.timer = math.inf
        self._ctx: ActorContext | None = None  # the strategy's context: made when the views are first built
        self._held: ReaderViews | None = None  # the views whose hold on a reader's cache is still to give back
        self.published = NamespaceStatus(self.strategy_config)
        self._effects: list[Effect] = []

    # -- the way in -------------------------------------------------------------------------

    def handle(self, message: Any, inputs: Inputs, reply: Reply[Any] | None = None) -> list[Effect]:
        """Take one message (a command with its ``reply``, or one of the loop's) with ``inputs``
        (the time, the mailbox's depth, the store to read); return what the loop must do, in order."""
        self.inputs = inputs
        now = inputs.now
        effects = self._effects = []
        if self.holds.lapse(now):  # a hold whose time is up is gone for every message, not only the
            self.drain.want(self.strategy.auto_tick)  # timer's (then cancelled): work it held back
        if self.stopping is not None:
            if reply is not None:
                self.answer(reply, False, refusal_for(self.stopping, message))
            return effects
        match message:
            case Committed():
                self._committed(message)
            case Acquired():
                task, self.lane.asking = self.lane.asking, None
                if task is not None:
                    self._step(task, message.caches, message.error)
            case LeaseAnswer():
                self._lease_answered(message)
            case Retire():
                self._stop(message.error)
                return effects
            case SlotAppended():
                if self.strategy.auto_tick:
                    self.drain.want(True)
            case TimerFired():
                self.drain.want(self.strategy.auto_tick)
            case _:
                self._take(message, reply)
        self._advance()
        if self.stopping is None:
            self._check_stop()
        if self.stopping is None:
            self._set_timer(now)
            self._publish()
        return effects

    def _take(self, message: Any, reply: Reply[Any] | None) -> None:
        """A command or a unit's reply, in arrival order: it waits behind an unanswered barrier."""
        if self.lane.barriers:
            self.lane.held.append((message, reply))
            return
        if isinstance(message, UnitDone):  # its tick's reply rides with it: answered at a stop too
            reply = None if self.drain.flight is None else self.drain.flight.reply
            task = self.unit_task = _Task(message, reply, Kind.READ, own=True)
            self.open[task] = None
            self._begin_task(task)
            return
        kind = PROTOCOL.get(type(message), (Kind.READ, None))[0]  # one not in it is refused by _dispatch
        task = _Task(message, reply, kind)
        self.open[task] = None
        if kind == Kind.READ:
            self._begin_task(task)
            return
        if kind == Kind.BARRIER:
            self.lane.barriers += 1
        self.lane.queue.append(_Item(task, None, self.generation))

    def _advance(self) -> None:
        """Run whatever may run now: held messages once no barrier is unanswered, the lane's head,
        the next unit."""
        while self.stopping is None:
            if self.lane.held and not self.lane.barriers:
                self._take(*self.lane.held.popleft())
                continue
            if self.lane.free() and self.lane.queue and (
                    self.lane.holder is None or self.lane.queue[0].task is self.lane.holder):
                item = self.lane.queue.popleft()
                if item.write is None:  # an exclusive task's turn
                    self.lane.holder = item.task
                    self._begin_task(item.task)
                else:
                    self._send(item)
                continue
            if self._pump():
                continue
            return

    def _send(self, item: _Item) -> None:
        write = item.write
        assert write is not None
        if write.strategy and item.generation != self.generation:
            # Made from memory the strategy has since reloaded from the store: never committed alone.
            self._step(item.task, error=self._dropped())
            return
        check = self.lease.check() if write.strategy else None
        if check is not None:  # the lease may have gone with a lost connection: looked at first
            self.lane.checking = item
            self._effects.append(check)
            return
        self._go_out(item)

    def _lease_answered(self, answer: LeaseAnswer) -> None:
        """The loop's answer about the lease: to a look before a strategy write, or to a handler."""
        item, self.lane.checking = self.lane.checking, None
        if item is not None:
            if answer.error is not None:  # the store unreachable to look: raised as its commit's refusal
                self._step(item.task, error=answer.error)
            elif not answer.held:
                self._lose_lease(item.task)
            else:
                self._go_out(item)
            return
        task, self.lane.asking = self.lane.asking, None
        if task is not None:
            self._step(task, answer.held, answer.error)

    def _go_out(self, item: _Item) -> None:
        """The lane's head goes out: its command made now, if it is made at its turn."""
        write = item.write
        assert write is not None
        try:
            command = write.command if write.build is None else write.build()
        except Exception as exc:  # noqa: BLE001 - the store unreachable to make it: raised as its commit's refusal
            self._step(item.task, error=exc)
            return
        if command is None:
            self._step(item.task, None)
            return
        self.lane.token += 1
        self.lane.out = item
        self._effects.append(Commit(self.lane.token, command, item.task.trace))

    def _lose_lease(self, task: _Task) -> None:
        """The lease lapsed (or was taken over), and another process may serve the namespace now: the
        write wasn't made (not sent, or refused by the store's fencing check), and the actor stops."""
        refusal = self.lease.forfeit()
        self._step(task, error=refusal())
        self._stop(refusal)

    def _committed(self, committed: Committed) -> None:
        item = self.lane.out
        if item is None or committed.token != self.lane.token:
            return
        self.lane.out = None
        if committed.ok:
            self._step(item.task, committed.value)
        elif item.write is not None and item.write.strategy and self.lease.held and isinstance(committed.value, ConfigConflictError):
            self._lose_lease(item.task)  # the store's fencing check refused it: the lease lapsed or was taken
        else:
            self._step(item.task, error=committed.value)

    def _pump(self) -> bool:
        """Start the next unit when none is being planned, out or applied. True if it started one."""
        if self.unit_task is not None or self.lane.barriers or not self.drain.may_start():
            return False  # no unit can start: the drain needn't be shown the machine (a Moment) to say so
        started = self.drain.next(self._moment())
        if started is None:
            return False
        command, reply, gen = started
        task = self.unit_task = _Task(command, reply, Kind.READ, own=True)  # the tick's reply: answered at a stop
        task.gen = self._drive(gen)
        self.open[task] = None
        self._step(task, None)
        return True

    # -- tasks ------------------------------------------------------------------------------

    def _begin_task(self, task: _Task) -> None:
        """A task's first step: its handler runs until it yields a write or ends."""
        command = task.command
        try:
            if (self.record is None and self.store.shared and self.caches and not task.own
                    and not isinstance(command, ReportHealth)):  # health adopts its own
                self._adopt_claim()
            with tracing.resumed(task.trace):  # trio gave the loop's task its own context, not the sender's
                result = self._dispatch(task)
        except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
            self._finish(task, False, exc)
            return
        if isinstance(result, GeneratorType):
            task.gen = result
            self._step(task, None)
        else:
            self._finish(task, True, result)

    def _step(self, task: _Task, value: Any = None, error: BaseException | None = None) -> None:
        """Resume ``task``'s handler with a write's result (or its error raised into it)."""
        gen = task.gen
        assert gen is not None
        try:
            with tracing.resumed(task.trace):
                yielded = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            self._finish(task, True, stop.value)
            return
        except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
            self._finish(task, False, exc)
            return
        if isinstance(yielded, (Acquire, TakeLease, ReleaseLease)):  # the loop answers
            self.lane.asking = task
            self._effects.append(yielded)
            return
        item = _Item(task, yielded, self.generation)
        if task is self.lane.holder and not yielded.behind:
            self.lane.queue.appendleft(item)  # an exclusive task keeps the lane until it ends
        else:
            if task is self.lane.holder:
                self.lane.holder = None
            self.lane.queue.append(item)

    def _finish(self, task: _Task, ok: bool, value: Any) -> None:
        self.open.pop(task, None)
        if task is self.lane.holder:
            self.lane.holder = None
        if task is self.unit_task:
            self.unit_task = None
        if task.kind == Kind.BARRIER:
            self.lane.barriers -= 1
        if isinstance(task.command, Attach) and not ok and not self.managers:
            self.orphaned = True  # refused with no manager attached: it stops once it owes nothing
        if value is LATER:
            return
        if task.reply is not None:
            self.answer(task.reply, ok, value)
        elif not ok:
            self.report(value, "%s: %s failed", self.place, type(task.command).__name__)

    def answer(self, reply: Reply[Any], ok: bool, value: Any) -> None:
        self._effects.append(Answer(reply, ok, value))

    @property
    def ctx(self) -> ActorContext:
        """The strategy's context (there from the views' first build on, before any strategy call)."""
        assert self._ctx is not None
        return self._ctx

    def _moment(self) -> Moment:
        """What the drain reads of this machine now (its context: none before the views are built)."""
        return Moment(self.now, self.strategy, self.strategy_error, self.waiting, self.orphaned, self.record,
                      self.epoch, self._ctx, self.ledger)

    def _drive(self, decisions: Decisions) -> Gen:
        """Run a drain handler as a task's: carry out each decision it returns, its writes and
        commits through the lane, and resume it with the outcome and the machine as it is then
        (``Resumed``), or raise the error into it."""
        resumed: Resumed | None = None  # a generator's first resume: it was made with its moment
        error: BaseException | None = None
        while True:
            try:
                decision = decisions.send(resumed) if error is None else decisions.throw(error)
            except StopIteration as stop:
                return stop.value
            resumed, error = None, None
            try:
                value = yield from self._carry_out(decision)
            except BaseException as exc:  # noqa: BLE001 - the handler's to catch, as if it had made the call
                error = exc
            else:
                resumed = Resumed(value, self._moment())

    def _carry_out(self, decision: Decision) -> Gen:
        match decision:
            case Write():
                return (yield decision)
            case CommitStrategy():
                return (yield from self.commit(decision.reaches))
            case Answer() | CallModel() | SoundAlarm() | KeepRecord():
                self._effects.append(decision)
            case RequireStrategy():
                self.require_strategy()
            case FlushNew():
                self.flush_new()
            case AwaitStore():
                if self.waiting is None:  # else a failed start said so already
                    self.await_store(decision.error)
            case Report():
                self.report(decision.error, decision.message, *decision.args)
        return None

    def _dropped(self) -> BaseException:
        """The error of a write dropped because the strategy's memory was reloaded before it went out."""
        if self.waiting is not None:
            return StoreUnavailableError(self.waiting.url, self.waiting.reason)
        return StrategyRefusedError(f"the strategy of {self.place} was reloaded from the store while this request "
                                    f"ran; retry it")

    def report(self, exc: BaseException, message: str, *args: Any) -> None:
        """Log a failure no caller hears of. The store or branch gone while this actor is stopping
        (its runtime closing, its branch deleted) is expected then: debug level, no traceback."""
        if self.stopping is not None and isinstance(exc, (RuntimeClosedError, BranchNotFoundError)):
            logger.debug(message + " (the actor is stopping: %s)", *args, exc)
        else:
            logger.error(message, *args, exc_info=exc)

    def _dispatch(self, task: _Task) -> Any:
        kind_and_handler = PROTOCOL.get(type(task.command))
        if kind_and_handler is None:
            raise TypeError(f"not a namespace command: {task.command!r}")
        return kind_and_handler[1](self, task)

    # -- the small commands -----------------------------------------------------------------

    def _preview(self, command: Preview) -> Any:
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        validate_injections((), command.message_injections)
        self.flush_new()
        return self.strategy.preview(self.views.view, command.budget, SelectOptions(dry_run=True, context=self.ctx))

    def _check_ready(self, command: CheckReady) -> bool:
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()  # one that failed to start is never ready: it raises as tick() does
        self.flush_new()
        return self.strategy.is_ready()

    def _detach(self, command: Detach) -> None:
        self.managers.discard(command.token)
        self.orphaned = not self.managers  # it stops once it owes no caller an answer

    def _hold(self, command: Hold) -> None:
        found = (self.caches[0].get(i) for i in command.message_ids)
        self.holds.place([m.sequence for m in found if m is not None], command.timeout_s, self.now)

    def _release(self, command: Release) -> None:
        self.holds.release([s for s in (parse_id(i) for i in command.message_ids) if s is not None])
        self.drain.want(self.strategy.auto_tick)

    def _set_system_prompt(self, command: SetSystemPrompt) -> None:
        self.settings.system_prompt = command.text

    def _set_tools(self, command: SetTools) -> None:
        self.settings.tools = command.tools

    # -- start and stop ---------------------------------------------------------------------

    def _set_up(self) -> Gen:
        """At the first attach, once it is judged: register the namespace's states, load its floor,
        read its slots, take the lease."""
        store, ns = self.store, self.config.namespace
        slots = (self.config.slot, *self.config.auxiliary)
        if self.readonly:
            for name in slots:
                store.check_state(name)  # UnknownStateError names a slot nobody wrote
        else:
            commands = [RegisterState(name=name, kind="log") for name in dict.fromkeys((*slots, states.context_state(ns)))]
            commands += [RegisterState(name=states.reader_state(ns), kind="value"),
                         RegisterState(name=states.floor_state(ns), kind="value"),
                         RegisterState(name=states.config_state(ns), kind="value")]
            if isinstance(self.config.token_estimator, CalibratedEstimator):
                commands.append(RegisterState(name=states.calibration_state(ns), kind="value"))
            missing = tuple(c for c in commands if not store.has_state(c.name))
            if missing:
                yield Write(Atomically(commands=missing))
        self.floor = self._stored_floor() or 0
        self.ledger = store.read_value(states.ledger_flag_state(ns), self.branch_id) is True
        if isinstance(self.config.token_estimator, CalibratedEstimator):  # the calibration so far
            self.config.token_estimator.restore(store.read_value(states.calibration_state(ns), self.branch_id))
        yield from self.lease.follow(self.strategy)  # before the caches: a refused lease leaves the next attach to set up
        caches = yield Acquire(tuple(slots))
        self.caches = list(caches)
        self.seen = store.seen_now(self.caches)
        self._build_views()
        return None

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

    def _stop(self, error: Callable[[], BaseException]) -> None:
        """Stop: answer every request held (``refusal_for(error, command)``), cancel the model call,
        give back the lease; then the loop refuses what is queued and ends."""
        if self.stopping is not None:
            return
        self.stopping = error
        owed: list[tuple[Any, Reply[Any] | None]] = [(task.command, task.reply) for task in self.open]
        owed += list(self.lane.held)
        drain_owes, cancel = self.drain.stop()
        owed += drain_owes
        if cancel is not None:
            self._effects.append(cancel)
        for command, reply in owed:
            if reply is not None:
                self.answer(reply, False, refusal_for(error, command))
        self.open.clear()
        self.lane.held.clear()
        self.lane.queue.clear()
        released = self.lease.give_back()
        if released is not None:
            self._effects.append(released)
        self._effects.append(Stop(error))

    def _check_stop(self) -> None:
        """The last manager left and every call it made is answered: stop. A tick sent before its
        manager moved (switch_branch, fork) finishes here first; a write out comes back first."""
        if not self.orphaned or self.drain.owes_answer() or not self.lane.idle():
            return
        if any(task.reply is not None for task in self.open):
            return
        self._stop(retired(self.place))

    # -- reads of what is stored ------------------------------------------------------------

    def _stored_record(self) -> Record:
        return record_from_value(self.store.read_value(states.reader_state(self.place.namespace), self.branch_id))

    def _stored_floor(self) -> int | None:
        return floor_from_value(self.store.read_value(states.floor_state(self.place.namespace), self.branch_id))

    def _edit_floor(self) -> int | None:
        """The floor an edit is judged against: the stored one (None if unreadable), never below ours."""
        stored = self._stored_floor()
        return None if stored is None else max(stored, self.floor)

    def _other_records(self) -> list[Record]:
        store, own = self.store, states.reader_state(self.place.namespace)
        return [
            record_from_value(store.read_value(name, self.branch_id))
            for name in store.state_names()
            if states.namespace_of_reader_state(name) is not None and name != own
        ]

    def _require_writes(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(read_only_refusal(self.place, self.standby))

    # -- views and the strategy -------------------------------------------------------------

    @property
    def reader(self) -> str | None:
        return self.record if isinstance(self.record, str) else None

    def _build_views(self) -> None:
        epoch, previous = self.epoch, self._held
        self.views = self._held = build_views(self.caches, self.reader, view_filter=self.config.view_filter,
                                              estimator=self.config.token_estimator, guard=lambda: self._guard(epoch),
                                              pricing=self.drain.pricing)
        if previous is not None:  # after the new ones took theirs: the same reader's cache stays
            release_views(previous)
        self._ctx = self._new_context()

    def let_go_of_views(self) -> None:
        """The actor ends, however it ends (its loop's close): its views' hold on the reader's cache
        goes, so the slot cache keeps no reader view nobody reads (P17)."""
        held, self._held = self._held, None
        if held is not None:
            release_views(held)

    def _new_context(self) -> ActorContext:
        self.generation += 1  # strategy writes buffered before this were made from memory it replaces
        return ActorContext(
            place=self.place, branch_id=self.branch_id, reader=self.reader, view=self.views.view,
            store=lambda: self.store, strategy_name=self.strategy.name, writes=not self.readonly,
            holds=self.holds, settings=self.settings, clock=self._clock,
        )

    def _clock(self) -> float:
        return self.now

    @property
    def given(self) -> Inputs:
        """What came with the message being handled: everything here runs while one is."""
        assert self.inputs is not None, "read only while a message is handled"
        return self.inputs

    @property
    def now(self) -> float:
        """Trio time, as it came with the message being handled."""
        return self.given.now

    @property
    def store(self) -> StoreReads:
        """The store's committed state, as it came with the message being handled."""
        return self.given.store

    def _guard(self, epoch: int) -> None:
        """Before every read through the view a strategy holds (C8): a view of an older epoch is dead."""
        if epoch != self.epoch:
            raise ReaderConflictError(f"{self.place} changed its view since this view was made")

    def _start_strategy(self) -> None:
        """Initialise the strategy for the current view (C5: a failure leaves a claim standing; an
        unreachable store is no failure: the start is tried again, see ``await_store``)."""
        self._ctx = self._new_context()
        self.strategy_started = True
        self.strategy_error = None
        try:
            self._load_settings()  # before initialize: chunks close under them
            self.strategy.initialize(self.ctx)
            self.seen = self.store.seen_now(self.caches)
        except StoreUnavailableError as exc:
            self.await_store(exc)
        except Exception as exc:
            self.strategy_error = exc
            logger.warning("strategy %r of %s failed to start: %r", self.strategy.name, self.place, exc)
        else:
            if self.waiting is not None:
                logger.warning("%s: the store answers again; strategy %r started from what it holds", self.place,
                               self.strategy.name)
                self.waiting = None
                self.drain.want(self.strategy.auto_tick)  # work the outage held up
        self._listen(self.strategy.auto_tick and not self.readonly)
        mark, writes = self.ctx.take()
        if mark or writes:  # initialize only reads: writes belong in next_unit or select
            logger.warning("strategy %r of %s wrote during initialize; not committed", self.strategy.name, self.place)

    def _listen(self, every: bool) -> None:
        """Hear of every append of the own slot only while the strategy drains in the background;
        otherwise an append never visits this namespace."""
        if every != self.listening:
            self.listening = every
            self._effects.append(Listen(every))

    def await_store(self, exc: StoreUnavailableError) -> None:
        """The store was unreachable while the strategy started, or while its memory changed (a
        commit, a unit): that memory may be ahead of the store or half made, so it starts again
        from the store before its next use (a command tries at once, an auto-ticking drain after a
        back-off). Work begun on the old memory writes nothing (C9)."""
        if self.waiting is None:
            logger.warning("%s: the store is unreachable (%s); strategy %r starts again once it answers", self.place,
                           exc.reason, self.strategy.name)
            self.epoch += 1  # a unit out now was planned on the memory being dropped
            self._build_views()
        self.drain.back_off(first=self.waiting is None, now=self.now)
        self.waiting = exc

    def require_strategy(self) -> None:
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

    def flush_new(self) -> None:
        """Hand the strategy each message it hasn't seen, in the reader's view (A4)."""
        if self.strategy_error is None and self.waiting is None:
            self.seen = flush_new(self.strategy, self.views.view, self.seen, self.ctx)

    def commit(self, reaches: int = 0) -> Gen:
        """Commit what the strategy buffered, the floor first, in one transaction; True if anything was.

        On failure the strategy is reloaded from what is stored (its memory may be ahead of it),
        and the error raised; with the store unreachable, once it answers again (``await_store``).
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
        context = states.context_state(self.place.namespace)

        def build() -> Atomically:  # when its turn comes: states an earlier write registered aren't again
            kinds: dict[str, StateKind] = {c.state: ("value" if isinstance(c, SetValue) else "log") for c in writes}
            registers = [RegisterState(name=name, kind=kind) for name, kind in kinds.items()
                         if not self.store.has_state(name)]
            return Atomically(commands=(*registers, *commands))

        generation = self.generation
        try:
            yield Write(build=build, strategy=True,
                        copies=any(isinstance(c, AppendItem) and c.state == context for c in writes))
        except Exception as exc:
            # Reloaded already if the write was dropped for an earlier one's failure (the generation
            # moved); the lease lost stops the actor.
            if writes and self.generation == generation and not isinstance(exc, ConfigConflictError):
                if isinstance(exc, StoreUnavailableError):
                    self.await_store(exc)
                else:
                    self._start_strategy()
            raise
        if raise_floor:
            self.floor = max(self.floor, mark)
        return True

    # -- managers ---------------------------------------------------------------------------

    def _attach(self, command: Attach) -> Gen:
        if not self.caches:  # the first attach: judged from the store, before anything is written (C2)
            self.record = self._stored_record()
        resolved = check_attach(self.record, command.reader, compiles_for_none=command.compiles_for_none,
                                place=self.place)
        self._check_config(command)
        require_marking(self.strategy.marks_compression_reads, self.strategy.name, resolved, self.place.namespace)
        if not self.caches:
            yield from self._set_up()
        if resolved is not None and self.record is None and not self.readonly:
            try:  # decided in the store: on a shared store, another process's actor may claim it first
                yield Write(SetValue(state=states.reader_state(self.place.namespace), branch=self.branch_id,
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
        yield from self._record_config()
        yield from self._switch_ledger(command.config.ledger)
        self.managers.add(command.token)
        self.orphaned = False
        return Attached(resolved)

    def _record_config(self) -> Gen:
        """Record the strategy config this namespace runs on its branch, so a reader (``ctxrt compile``)
        compiles with exactly it. A host's own strategy is recorded as absent."""
        if self.readonly:
            return
        state = states.config_state(self.place.namespace)
        described = catalog.describe(self.strategy_config)
        if self.store.read_value(state, self.branch_id) != described:
            yield Write(SetValue(state=state, branch=self.branch_id, value=described))

    def _switch_ledger(self, wanted: bool | None) -> Gen:
        """An open's ``ledger=True`` or ``False`` turns the request ledger on or off for the
        namespace on its branch (stored, so a reopen without it keeps it, Q2)."""
        if wanted is None or wanted == self.ledger or self.readonly:
            return
        flag = states.ledger_flag_state(self.place.namespace)
        yield Write(Atomically(commands=(RegisterState(name=flag, kind="value"),
                                         RegisterState(name=states.ledger_state(self.place.namespace), kind="log"),
                                         SetValue(state=flag, branch=self.branch_id, value=wanted))))
        self.ledger = wanted

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

    def _check_branching(self, reader: str | None, record: Record) -> None:
        """C1, C3, C7, C12: whether a manager compiling for ``reader`` may fork or derive from a head
        that records ``record``."""
        resolve_reader(record, reader, self.place)
        if reader is None and record is not None:
            check_reader(record, None, self.place)
        self.require_strategy()

    def _fork(self, command: Fork) -> Gen:
        # Judged by the record as stored, which the branch inherits and the move onto it is judged
        # by: a record the actor doesn't know (a raw write) refuses the fork before the branch is
        # made, not the move after it (C2).
        self._check_branching(command.reader, self._stored_record())
        self._require_writes()
        return (yield Write(CreateBranch(name=command.name, from_branch=self.branch_id)))

    def _derive(self, command: Derive) -> Gen:
        self.require_strategy()  # C12
        # The head's record decides (C11): a no-reader parent's child takes what the head records.
        child_reader = resolve_reader(self.record, command.reader, self.place)
        config = command.strategy if command.strategy is not None else self.strategy_config
        strategy = build_strategy(config)
        require_marking(strategy.marks_compression_reads, strategy.name, child_reader, self.place.namespace)
        self._require_writes()
        # Written even when None: a child made at an earlier sequence would otherwise keep what that
        # checkpoint recorded, not what the head records (C11, a cleared record included).
        created = yield Write(Atomically(commands=(
            CreateBranch(name=command.name, from_branch=self.branch_id, at_sequence=command.at_sequence),
            SetValue(state=states.reader_state(self.place.namespace), branch=command.name, value=child_reader),
        )))
        return created[0], child_reader

    def _set_strategy(self, command: SetStrategy) -> Gen:
        """Run the new strategy from now on, or refuse it and keep the old one: one that fails to
        start here (``StrategyRefusedError``) or whose lease another process holds."""
        check_reader(self.record, command.reader, self.place)
        strategy = build_strategy(command.config)
        require_marking(strategy.marks_compression_reads, strategy.name, self.reader, self.place.namespace)
        old = self.strategy, self.strategy_config
        self._run_strategy(strategy, command.config)
        try:
            if self.strategy_error is not None:
                raise StrategyRefusedError(
                    f"strategy {strategy.name!r} failed to start on {self.place}: {self.strategy_error!r}; "
                    f"the namespace keeps strategy {old[0].name!r}"
                ) from self.strategy_error
            yield from self.lease.follow(strategy)
        except Exception:
            self._run_strategy(*old)
            raise
        yield from self._record_config()

    def _run_strategy(self, strategy: Strategy, config: Any) -> None:
        self.strategy, self.strategy_config = strategy, config
        self.epoch += 1  # a unit of the strategy running until now writes nothing
        self._build_views()
        self._start_strategy()

    def _update_context_settings(self, command: UpdateContextSettings) -> Gen:
        """Store the changed live settings, then run with them from this turn on (T14)."""
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        settings.refuse_unsupported(self.strategy, self.strategy.name, command.changes)
        self._require_writes()
        changes = {**self.settings_changes, **command.changes}
        state = states.settings_state(self.place.namespace)
        value = settings.record(changes, catalog.describe(self.strategy_config))

        def build() -> Atomically:
            register = () if self.store.has_state(state) else (RegisterState(name=state, kind="value"),)
            return Atomically(commands=(*register, SetValue(state=state, branch=self.branch_id, value=value)))

        yield Write(build=build)
        self.settings_changes = changes
        self.context_settings = settings.apply(self.strategy, changes)
        self._listen(self.strategy.auto_tick and not self.readonly)
        self.drain.want(self.strategy.auto_tick)  # a smaller target or window may make work now
        return self.context_settings

    def _load_settings(self) -> None:
        """Run with the live settings stored for this config (T14)."""
        stored = self.store.read_value(states.settings_state(self.place.namespace), self.branch_id)
        self.settings_changes = settings.in_force(stored, catalog.describe(self.strategy_config), str(self.place))
        self.context_settings = settings.apply(self.strategy, self.settings_changes)

    def _pins(self, command: PinRange | Unpin | ListPins) -> Any:
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        self.flush_new()
        strategy = self.strategy
        if not isinstance(strategy, Pinning):
            if isinstance(command, ListPins):
                return []
            raise StrategyRefusedError(f"strategy {strategy.name!r} does not support pins")
        if isinstance(command, ListPins):
            return strategy.list_pins()
        self._require_writes()  # ReadOnlyStoreError before anything changes
        if isinstance(command, PinRange):
            found: Any = strategy.pin_range(self.ctx, command.first_id, command.last_id, name=command.name,
                                            level=command.level)
        else:
            found = strategy.unpin(self.ctx, command.pin_id)
        return self._then(self.commit(), found)

    # -- the small reads (M10) ----------------------------------------------------------------

    def _report_holds(self) -> list[CompressionHold]:
        now = self.now  # handle() lapsed what is due: every hold here is in force
        return [CompressionHold(str(sequence), None if expires == math.inf else expires - now)
                for sequence, expires in self.holds.in_force()]

    def _max_summary_level(self, command: FindMaxSummaryLevel) -> int:
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        self.flush_new()
        deepest = getattr(self.strategy, "max_summary_level", None)  # strategies without summaries: 0
        return deepest() if callable(deepest) else 0

    def _anchored(self, reader: str | None) -> WindowedPassthroughStrategy:
        check_reader(self.record, reader, self.place)
        self.require_strategy()
        self.flush_new()
        if not isinstance(self.strategy, WindowedPassthroughStrategy):
            raise StrategyRefusedError(f"strategy {self.strategy.name!r} of {self.place} keeps no anchor; "
                                       f"WindowedPassthrough does")
        return self.strategy

    def _set_anchor(self, command: SetAnchor) -> Gen:
        strategy = self._anchored(command.reader)
        self._require_writes()
        strategy.set_anchor(self.ctx, command.message_id)
        return self._then(self.commit(), None)

    def _describe_compile(self, command: DescribeCompile) -> CompileMetadata:
        """A dry run of the strategy's selection, read for its ids: no result is built, nothing
        written, no blob read (M13). An entry a compile prepared is priced off its parts."""
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        self.flush_new()
        entries = self.strategy.select(self.views.view, command.budget,
                                       SelectOptions(dry_run=True, context=self.ctx))
        self.ctx.take()
        raw = [e for e in entries if e.relation == "copy"]
        derived = [e for e in entries if e.relation != "copy"]
        return CompileMetadata(
            tuple(i for e in raw for i in e.source_ids), tuple(dict.fromkeys(i for e in derived for i in e.summary_ids)),
            sum(map(self.views.memo.tokens, raw)), sum(map(self.views.memo.tokens, derived)))

    def _then(self, gen: Gen, result: Any) -> Gen:
        yield from gen
        return result

    def _append_and_hold(self, command: AppendAndHold) -> Gen:
        self._require_writes()
        key = object()
        self.holds.reserve(key, self.store.last_sequence + 1)  # every append from now on is above it
        try:
            operation = append_result((yield Write(append_after(command.writes, command.append))))  # M9: one batch
        finally:
            self.holds.unreserve(key)
        self.holds.place([operation.sequence], command.timeout_s, self.now)
        return operation

    def _retry_quarantined(self, command: RetryQuarantined) -> Gen:
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        self._require_writes()  # ReadOnlyStoreError before anything changes
        keys = self.strategy.retry_quarantined(self.ctx)
        yield from self.commit()
        self.drain.want(True)
        return keys

    def _health(self) -> NamespaceHealth:
        """Answered with the store unreachable too: then ``waiting_for`` says so. A strategy waiting
        for the store tries its start first; the slot's head is looked at (one read on a shared store)."""
        backlog, ready = Backlog(), False
        if self.waiting is not None:
            self._start_strategy()
        outage = self.waiting
        if outage is None:
            try:
                if self.record is None and self.store.shared:
                    self._adopt_claim()
                self.caches[0].count()
                self.flush_new()  # the strategy hears of new messages first, as a compile's would
                if self.strategy_error is None:
                    backlog, ready = self.strategy.backlog(self.ctx), self.strategy.is_ready()
            except StoreUnavailableError as exc:
                outage = exc
        return NamespaceHealth(
            namespace=self.place.namespace, branch=self.place.branch, reader=self.reader,
            managers=len(self.managers), mailbox_depth=self.given.depth,
            in_flight_model_calls=self.drain.model_calls(), ready=ready,
            quarantined=tuple(self.strategy.quarantined()), narrowing_floor=self.floor,
            strategy_error=None if self.strategy_error is None else repr(self.strategy_error),
            pending_units=backlog.units, compression_debt_tokens=backlog.tokens, last_compile_ms=self.last_compile_ms,
            waiting_for=None if outage is None else f"the store: {outage}",
        )

    def _snapshot(self) -> NamespaceSnapshot:
        """Copies of what the actor holds: the strategy with each of its containers copied (what it
        holds in them, frozen messages and records, is shared), the caches' and listing's figures."""
        strategy = copy.copy(self.strategy)
        for name, value in vars(strategy).items() if hasattr(strategy, "__dict__") else ():
            if isinstance(value, (list, dict, set)):
                setattr(strategy, name, copy.copy(value))
        figures = ListingFigures(self.reader, self.views.shared, self.config.slot, self.views.listing.projected)
        return NamespaceSnapshot(strategy, self.record, self.floor, self.epoch,
                                 tuple(cache.figures() for cache in self.caches), figures, self.model_timeout_s)

    # -- compile ----------------------------------------------------------------------------

    def _compile(self, command: Compile, task: _Task) -> Gen:
        if command.budget is None:  # resolved at this turn: one whole setting (T14)
            command = attrs.evolve(command, budget=self.context_settings.default_budget or Budget())
        # Its span is current while it compiles (never across a yield: a context attached in a
        # generator would leak into whatever the loop handles next); its commit carries it.
        with tracing.compiling(self.place.namespace, self.place.branch, self.reader, self.strategy.name,
                               command) as span:
            result = self._build(command)
            tracing.compiled(span, result, self.strategy)
            task.trace = tracing.current()  # the commit it makes is its child
        if not command.dry_run:
            try:
                yield from self.commit()
            except Exception:
                # The strategy's bookkeeping (chunks closing, an anchor) waits; the compile goes on (P1, D4).
                logger.warning("%s: what the strategy wrote during a compile could not commit", self.place,
                               exc_info=True)
        return result

    def _build(self, command: Compile) -> Any:
        """The compile itself: the strategy's selection, built into a result."""
        check_reader(self.record, command.reader, self.place)
        self.require_strategy()
        validate_injections(command.injections, command.message_injections)  # B4: before the strategy runs
        self.flush_new()
        stopwatch, ctx = self.given.stopwatch, self.ctx
        started = stopwatch()
        options = SelectOptions(dry_run=command.dry_run, context=ctx, strict=command.strict)
        assert command.budget is not None  # resolved by _compile
        entries = self.strategy.select(self.views.view, command.budget, options)
        if command.dry_run:
            ctx.take()
        else:
            self.render_stats = self.strategy.render_stats()
        # Built before the bookkeeping commits: one snapshot of the view, whatever lands meanwhile.
        result = build_compile_result(
            entries, namespace=self.place.namespace, branch=self.place.branch, reader=self.reader,
            strategy_name=self.strategy.name, lookup=self.views.raw_body, injections=command.injections,
            message_injections=command.message_injections, memo=self.views.memo,
            stamp=self.views.view.window(1).stamp, media=self.caches[0].media,
        )
        self.last_compile_ms = (stopwatch() - started) * 1000
        if not command.dry_run:
            self.stats_compile_id = result.provenance.compile_id
        return result

    def _query(self, command: QuerySummaries) -> Any:
        check_reader(self.record, command.reader, self.place)  # C10
        self.require_strategy()
        self.flush_new()
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

    def _edit(self, command: Edit) -> Gen:
        check_reader(self.record, command.reader, self.place)
        sequence = parse_id(command.message_id)
        context = states.context_state(self.place.namespace)
        while True:
            # Judged against the message as it is now (D1-D5 compare with what readers saw last), and
            # written only onto that version: another edit, maybe another namespace's or process's,
            # that lands first makes the store refuse this one, and it is judged again.
            found = None if sequence is None else self.store.read_message(self.config.slot, self.branch_id, sequence)
            if found is None:
                raise MessageNotFoundError(f"no message {command.message_id!r} in slot {self.config.slot!r} on "
                                           f"branch {self.place.branch!r}")
            current, version = found
            judge_edit(current, command.content, reader=self.reader, floor=self._edit_floor,
                       others=self._other_records, place=self.place)  # floor and records read only for a narrowing
            self._require_writes()
            data = codec.message_to_json(current.participant, command.stored, current.metadata, current.timestamp_ms,
                                         current.caused_by)
            appended = Appended(current.participant, command.content, current.metadata, current.timestamp_ms,
                                current.caused_by, stored=command.stored)
            narrows = any(hidden_by_edit(current.content, command.content))
            edit = EditItem(state=self.config.slot, branch=self.branch_id, item_sequence=current.sequence, data=data,
                            blobs=command.blobs, attachment=appended, flagged=appended.audience,
                            expect_version=version,
                            # checked again in the write: another process's actor may raise the floor meanwhile
                            floor_state=states.floor_state(self.place.namespace) if narrows else None)
            entries = self.store.context_entries(self.place.namespace, self.branch_id)
            propagation = edit_propagation(entries, current.id, command.content, reader=self.reader,
                                           context_state=context, branch=self.branch_id)
            try:
                yield Write(Atomically(commands=(edit, *propagation)))  # M5, L3: one commit
            except ValueConflictError:
                continue
            break
        message_id, reader = current.id, self.reader
        yield from self._propagate_again(entries, lambda later: edit_propagation(
            later, message_id, command.content, reader=reader, context_state=context, branch=self.branch_id))

    def _remove(self, command: Remove) -> Gen:
        cache = self.caches[0]
        first, last = cache.get(command.first_id), cache.get(command.last_id)
        for given, found in ((command.first_id, first), (command.last_id, last)):
            if found is None:
                raise MessageNotFoundError(f"no message {given!r} in slot {self.config.slot!r} on branch "
                                           f"{self.place.branch!r}")
        assert first is not None and last is not None
        if first.sequence > last.sequence:
            raise ValueError(f"remove_messages: from_id {command.first_id!r} comes after to_id {command.last_id!r}")
        self._require_writes()
        removal = RemoveItems(state=self.config.slot, branch=self.branch_id, from_sequence=first.sequence,
                              to_sequence=last.sequence)
        context = states.context_state(self.place.namespace)
        entries = self.store.context_entries(self.place.namespace, self.branch_id)
        propagation = removal_propagation(entries, first.sequence, last.sequence, context_state=context,
                                          branch=self.branch_id)
        yield Write(Atomically(commands=(removal, *propagation)))
        yield from self._propagate_again(entries, lambda later: removal_propagation(
            later, first.sequence, last.sequence, context_state=context, branch=self.branch_id))

    def _propagate_again(self, seen: list[Message], propagate: Callable[[list[Message]], list[Any]]) -> Gen:
        """An edit or removal landed while reads went on: a context-log copy one of them wrote (made
        from the message as it was) is queued behind it. Once those are committed, carry the change
        to the copies made since ``seen`` (M5), before the caller is answered."""
        if not any(item.write is not None and item.write.copies for item in self.lane.queue):
            return
        last = max((entry.sequence for entry in seen), default=0)

        def build() -> Atomically | None:
            entries = self.store.context_entries(self.place.namespace, self.branch_id)
            commands = propagate([entry for entry in entries if entry.sequence > last])
            return Atomically(commands=tuple(commands)) if commands else None

        yield Write(build=build, behind=True)

    # -- what the loop and managers read -----------------------------------------------------------

    def _set_timer(self, now: float) -> None:
        """When the loop should look again without a message: a hold lapsing, a backoff ending."""
        deadline = self.holds.next_lapse(now)
        if self.strategy.auto_tick:  # else the drain never wakes by itself: it needn't be shown the machine
            deadline = self.drain.deadline(deadline, self._moment())
        if deadline != self.timer:
            self.timer = deadline
            self._effects.append(SetTimer(deadline))

    def _publish(self) -> None:
        """A new status snapshot when what managers read outside the mailbox changed."""
        published, slot = self.published, self.caches[0] if self.caches else None
        calls = self.drain.model_calls()
        if (published.strategy_config is self.strategy_config and published.slot is slot
                and published.model_calls == calls and published.render_stats is self.render_stats
                and published.settings is self.context_settings and published.stats_compile_id == self.stats_compile_id):
            return
        self.published = NamespaceStatus(self.strategy_config, slot, calls, self.render_stats, self.context_settings,
                                         self.stats_compile_id)
        self._effects.append(Publish(self.published))



Handler = Callable[[NamespaceMachine, _Task], Any]

# The protocol: each command's kind (how it is ordered against the write lane, see the module's
# docstring) and its handler, which returns the answer or a generator that yields writes.
PROTOCOL: dict[type, tuple[Kind, Handler]] = {
    # barriers: handled at their turn in the lane; what arrives after them waits
    Attach: (Kind.BARRIER, lambda m, t: m._attach(t.command)),
    SetStrategy: (Kind.BARRIER, lambda m, t: m._set_strategy(t.command)),
    # exclusive writes: handled at their turn in the lane
    Edit: (Kind.EXCLUSIVE, lambda m, t: m._edit(t.command)),
    Remove: (Kind.EXCLUSIVE, lambda m, t: m._remove(t.command)),
    Fork: (Kind.EXCLUSIVE, lambda m, t: m._fork(t.command)),
    Derive: (Kind.EXCLUSIVE, lambda m, t: m._derive(t.command)),
    UpdateContextSettings: (Kind.EXCLUSIVE, lambda m, t: m._update_context_settings(t.command)),
    # reads: handled at once; their own writes join the lane
    Compile: (Kind.READ, lambda m, t: m._compile(t.command, t)),
    Preview: (Kind.READ, lambda m, t: m._preview(t.command)),
    Tick: (Kind.READ, lambda m, t: m._drive(m.drain.queue(t.command, t.reply, m._moment()))),
    ResetHeadWindow: (Kind.READ, lambda m, t: m._drive(m.drain.queue(t.command, t.reply, m._moment()))),
    CheckReady: (Kind.READ, lambda m, t: m._check_ready(t.command)),
    Detach: (Kind.READ, lambda m, t: m._detach(t.command)),
    QuerySummaries: (Kind.READ, lambda m, t: m._query(t.command)),
    AppendAndHold: (Kind.READ, lambda m, t: m._append_and_hold(t.command)),
    Hold: (Kind.READ, lambda m, t: m._hold(t.command)),
    Release: (Kind.READ, lambda m, t: m._release(t.command)),
    SetSystemPrompt: (Kind.READ, lambda m, t: m._set_system_prompt(t.command)),
    SetTools: (Kind.READ, lambda m, t: m._set_tools(t.command)),
    ReportHealth: (Kind.READ, lambda m, t: m._health()),
    PinRange: (Kind.READ, lambda m, t: m._pins(t.command)),
    Unpin: (Kind.READ, lambda m, t: m._pins(t.command)),
    ListPins: (Kind.READ, lambda m, t: m._pins(t.command)),
    RetryQuarantined: (Kind.READ, lambda m, t: m._retry_quarantined(t.command)),
    Inspect: (Kind.READ, lambda m, t: m._snapshot()),
    ReportHolds: (Kind.READ, lambda m, t: m._report_holds()),
    FindMaxSummaryLevel: (Kind.READ, lambda m, t: m._max_summary_level(t.command)),
    SetAnchor: (Kind.READ, lambda m, t: m._set_anchor(t.command)),
    ReportAnchor: (Kind.READ, lambda m, t: m._anchored(t.command.reader).anchor_id(m.ctx)),
    DescribeCompile: (Kind.READ, lambda m, t: m._describe_compile(t.command)),
    UnitDone: (Kind.READ, lambda m, t: m._drive(m.drain.apply(t.command, m._moment()))),  # its tick's reply rides with it (_take)
}
