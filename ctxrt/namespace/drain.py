"""``Drain``: a namespace's compression units: ticks, the background drain, transition summaries.

One unit at a time is planned, sent to the model and applied: a manager's ``tick`` (queued in
``waiters`` and taken first), else the drain's own when the strategy ticks by itself. Planning
raises the narrowing floor before the unit's request exists (D2, D4); the reply is applied only
if the namespace's view is still the one it was planned on (C9), and its usage calibrates the
token estimator. While the store is unreachable the drain backs off (``back_off``) and the
timer wakes it. The drain holds the state of this work (the queue, the unit out, whether it is
wanted, the back-off, the calibration count) and its handlers, in the machine's generator
style. What they do beyond that they return as decisions (``CommitStrategy``, ``Answer``,
``CallModel``, ``AwaitStore`` ...) that the machine carries out (``NamespaceMachine._drive``).
What never changes (the place, the config, whether the store is read-only) it is given when
made; what it reads of the machine (the time, the strategy and its view, the epoch, the wait for
the store) comes as a ``Moment``: with each call, to a handler when it is made, and to a handler
again with each decision's outcome (``Resumed``), since each can change while it waits for a
write. It holds no reference to the machine, so the units' rules read on their own, apart from
the lane and the dispatch, and its tests drive it with plain values.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Generator
from typing import Any

import attrs

from .. import request_ledger, tracing
from ..errors import StoreUnavailableError, StrategyRefusedError
from ..asks import Reply
from ..models.model_types import ModelRequest, ModelResponse
from ..slots import prepare_append
from ..store.protocol import AppendItem, SetValue
from ..strategies.base import HeadWindowReset, Strategy, Unit
from ..content.tokens import CalibratedEstimator, estimate_blocks, estimate_text
from . import states
from .context import ActorContext
from .core import Place, Record, check_reader
from ..events import QuarantineAlarm
from .effects import Answer, CallModel, CancelModel, KeepRecord, SoundAlarm, Write
from .protocol import NamespaceConfig, ResetHeadWindow, Tick, UnitDone

logger = logging.getLogger("ctxrt.namespace")

# While the store is unreachable, an auto-ticking namespace tries its strategy's start again after
# this many seconds, doubling up to the maximum (a command tries at once).
STORE_RETRY_S = 0.25
STORE_RETRY_MAX_S = 5.0

LATER = object()  # what a handler returns whose caller is answered by someone else (its unit)


@attrs.frozen
class Moment:
    """What the drain reads of the machine at one step: the time, the strategy, whether it failed to
    start (``strategy_error``) or waits for the store, whether the last manager left, the claim
    (``record``), the epoch of the view, and the strategy's context (None until the views are first
    built: nothing plans a unit before)."""

    now: float
    strategy: Strategy
    strategy_error: BaseException | None = None
    waiting: StoreUnavailableError | None = None
    orphaned: bool = False
    record: Record = None
    epoch: int = 0
    ctx: ActorContext | None = None
    ledger: bool = False  # the namespace keeps a request ledger (Q2): its compression calls are recorded

    @property
    def reader(self) -> str | None:
        return self.record if isinstance(self.record, str) else None

    @property
    def context(self) -> ActorContext:
        """The strategy's context, which a handler reads only once the strategy is required."""
        assert self.ctx is not None, "the views are built before a strategy is used"
        return self.ctx


@attrs.frozen
class Resumed:
    """What a drain handler is resumed with after a decision: its outcome (a write's or a commit's
    result, else None) and the machine as it is now."""

    value: Any
    moment: Moment


# -- what the drain's handlers decide, for the machine to carry out ------------------------------


@attrs.frozen
class RequireStrategy:
    """Start a strategy waiting for the store, or raise what keeps it from being used."""


@attrs.frozen
class FlushNew:
    """Hand the strategy each message it hasn't seen, in the reader's view (A4)."""


@attrs.frozen
class CommitStrategy:
    """Commit what the strategy buffered, the floor raised to at least ``reaches`` first; the
    handler is resumed with True if anything was committed, or has the error raised into it."""

    reaches: int = 0


@attrs.frozen
class AwaitStore:
    """The store was unreachable while the strategy's memory changed: start it again once it answers
    (unless it waits for the store already: a failed start said so)."""

    error: StoreUnavailableError


@attrs.frozen
class Report:
    """Log a failure no caller hears of."""

    error: BaseException
    message: str
    args: tuple[Any, ...] = ()


Decision = (Write | Answer | CallModel | RequireStrategy | FlushNew | CommitStrategy | AwaitStore | Report | SoundAlarm
            | KeepRecord)
# A drain handler: it is made with the ``Moment`` it starts at, yields decisions and is resumed
# with each one's ``Resumed``, or has the error raised into it.
Decisions = Generator[Decision, Any, Any]


@attrs.define
class Flight:
    """The unit planned or out: ``kind`` "tick" (a manager's), "drain" (the actor's own) or "reset"
    (a transition summary), planned at ``epoch``; ``reply``: its tick's caller, if any."""

    kind: str
    unit: Unit
    epoch: int
    reply: Reply[Any] | None
    request: Any = None  # the ModelRequest once its call is out, for calibration from its reply's usage
    span: Any = None  # its trace span (tracing.start_unit) once its call is out, ended when its reply is applied


def require_capability(strategy: Strategy, command: Tick | ResetHeadWindow) -> None:
    if isinstance(command, ResetHeadWindow) and not isinstance(strategy, HeadWindowReset):
        raise StrategyRefusedError(f"strategy {strategy.name!r} does not support head window reset")


class Drain:
    """The units of one namespace actor at ``place`` (``branch_id``), with ``config``;
    ``readonly``: the store refuses writes."""

    def __init__(self, place: Place, branch_id: int, config: NamespaceConfig, *, readonly: bool) -> None:
        self.place = place
        self.branch_id = branch_id
        self.config = config
        self.readonly = readonly
        self.waiters: deque[tuple[Tick | ResetHeadWindow, Reply[Any]]] = deque()
        self.flight: Flight | None = None
        self.wanted = False  # the drain should look for work
        # Each time it was wanted (``want``), and that count as of the messages its last unit's
        # planning saw (``FlushNew``): a drain that found nothing to do is wanted again if a wish
        # came after what it saw (a message appended while its commit was out), not left idle.
        self.wishes = 0
        self.seen = 0
        self.retry_at = 0.0  # when the drain tries the strategy's start again, while the store is unreachable
        self.retry_delay = STORE_RETRY_S
        self.observed = 0  # usage reports the token estimator has heard (its pricing, for a host's own)

    # -- what the machine asks ----------------------------------------------------------------

    def queue(self, command: Tick | ResetHeadWindow, reply: Reply[Any] | None, moment: Moment) -> Decisions:
        """A manager's tick or reset at ``moment``: checked now and again when its turn comes (a claim
        may land while it waits, C8). ``LATER``: its unit answers it."""
        check_reader(moment.record, command.reader, self.place)
        resumed = yield RequireStrategy()
        require_capability(resumed.moment.strategy, command)
        if reply is None:
            return None
        self.waiters.append((command, reply))
        return LATER

    def next(self, moment: Moment) -> tuple[Tick | ResetHeadWindow | None, Reply[Any] | None, Decisions] | None:
        """The next unit's handler, when none is out at ``moment``: a manager's first, else the
        drain's (None: none now). The machine runs it as its own task, with the tick's reply."""
        if self.flight is not None:
            return None
        if self.waiters:
            command, reply = self.waiters.popleft()
            return command, reply, self._tick(command, reply, moment)
        if (self.wanted and moment.strategy.auto_tick and not self.readonly and moment.strategy_error is None
                and not moment.orphaned):
            wake = self.wake_at(moment)
            if wake is not None and wake > moment.now:
                # Still wanted: the timer is set for the wake, but any message after it (before
                # the timer's turn, which then is cancelled) must start the drain too.
                return None
            return None, None, self._drain(moment)
        return None

    def want(self, auto_tick: bool) -> None:
        """The drain should look for work (new messages, a hold gone, the timer, the store back),
        if its strategy ticks by itself."""
        self.wanted = auto_tick
        self.wishes += auto_tick

    def _idle(self) -> None:
        """The drain found no work in what its unit's planning saw: not wanted, unless a wish came since."""
        if self.wishes == self.seen:
            self.wanted = False

    def may_start(self) -> bool:
        """Whether ``next`` might start a unit: none is out, and a tick waits or the drain is wanted
        (False: it won't, whatever the moment)."""
        return self.flight is None and (self.wanted or bool(self.waiters))

    def owes_answer(self) -> bool:
        """A manager's tick waits or is out."""
        return bool(self.waiters) or (self.flight is not None and self.flight.reply is not None)

    def stop(self) -> tuple[list[tuple[Any, Reply[Any] | None]], CancelModel | None]:
        """The actor stops: the ticks it owes an answer, and the call out to cancel, if any."""
        owed: list[tuple[Any, Reply[Any] | None]] = list(self.waiters)
        self.waiters.clear()
        if self.flight is None:
            return owed, None
        owed.append((None, self.flight.reply))
        tracing.end_unit(self.flight.span, "stopped")
        return owed, CancelModel()

    def model_calls(self) -> int:
        return 1 if self.flight is not None and self.flight.request is not None else 0

    def deadline(self, lapse: float, moment: Moment) -> float:
        """When the loop should look again without a message at ``moment``: ``lapse`` (a hold's), or
        a backoff ending."""
        if moment.strategy.auto_tick and not self.readonly and self.flight is None:
            wake = self.wake_at(moment)
            if wake is not None and wake > moment.now:  # a backoff already over is no reason to wake again
                return min(lapse, wake)
        return lapse

    def wake_at(self, moment: Moment) -> float | None:
        """When the drain may run again: after the store's back-off while waiting for the store,
        else the strategy's, if it names a usable time (a host strategy's mistake here is logged
        and ignored, never the end of the actor)."""
        if moment.waiting is not None:
            return self.retry_at
        try:
            wake = moment.strategy.wake_at()
            if wake is None:
                return None
            wake = float(wake)
        except Exception:
            logger.exception("strategy %r of %s: wake_at() failed; ignoring its backoff", moment.strategy.name,
                             self.place)
            return None
        return wake if not math.isnan(wake) else None

    def back_off(self, first: bool, now: float) -> None:
        """The store is unreachable at ``now`` (``first``: it just became so): try again after the back-off."""
        self.retry_delay = STORE_RETRY_S if first else min(self.retry_delay * 2, STORE_RETRY_MAX_S)
        self.retry_at = now + self.retry_delay

    def pricing(self) -> object:
        """What the view's ``pricing`` reports: the bundled estimator's own version (it may be shared
        by several namespaces), else how many reports this actor's estimator has heard."""
        estimator = self.config.token_estimator
        return estimator.version if isinstance(estimator, CalibratedEstimator) else self.observed

    # -- the units' handlers ------------------------------------------------------------------

    def _tick(self, command: Tick | ResetHeadWindow, reply: Reply[Any], moment: Moment) -> Decisions:
        try:
            yield from self._begin(command, reply, moment)
        except Exception as exc:  # noqa: BLE001 - answered to its caller
            yield Answer(reply, False, exc)
        return LATER

    def _drain(self, moment: Moment) -> Decisions:
        try:
            started = yield from self._begin(None, None, moment)
        except StoreUnavailableError as exc:
            yield AwaitStore(exc)  # tried again after the back-off (wake_at)
            started = False
        except Exception as exc:  # noqa: BLE001 - reported
            yield Report(exc, "compression drain of %s failed to plan a unit", (self.place,))
            started = False
        if not started:
            self._idle()

    def _begin(self, command: Tick | ResetHeadWindow | None, reply: Reply[Any] | None, moment: Moment) -> Decisions:
        """Plan the next unit, raise the floor, then start its model call; True if a call is out.

        A unit with nothing to call answers its caller at once.
        """
        if command is not None:
            check_reader(moment.record, command.reader, self.place)
        resumed = yield RequireStrategy()  # the drain's too: a start waiting for the store is tried here
        if command is not None:  # the strategy may have been replaced while it waited
            require_capability(resumed.moment.strategy, command)
        if self.readonly:
            if reply is not None:
                yield Answer(reply, True, False)
            return False
        moment = (yield FlushNew()).moment
        self.seen = self.wishes
        if isinstance(command, ResetHeadWindow):
            return (yield from self._begin_reset(command, reply, moment))
        unit = moment.strategy.next_unit(moment.context)
        if unit is None:
            wrote = (yield CommitStrategy()).value
            if reply is not None:
                yield Answer(reply, True, wrote)
            return False
        yield from self._raise_floor("tick" if command else "drain", unit, reply, moment)
        return True

    def _raise_floor(self, kind: str, unit: Unit, reply: Reply[Any] | None, moment: Moment) -> Decisions:
        """The floor covers the unit before its request exists (D2, D4); then its call goes out."""
        flight = self.flight = Flight(kind, unit, moment.epoch, reply)  # planned: no other unit meanwhile
        try:
            moment = (yield CommitStrategy(unit.reaches)).moment
            # The request reads the store (a message's blobs): the store gone here too leaves no
            # flight that never goes out, keeping every later unit from starting.
            flight.request = moment.strategy.request_for(unit, moment.context)
        except BaseException:
            self.flight = None
            raise
        flight.span = tracing.start_unit(unit, kind, self.place.namespace, self.place.branch, moment.reader,
                                         None if reply is None else reply.trace)
        yield CallModel(flight.epoch, unit, flight.request, flight.span)

    def _begin_reset(self, command: ResetHeadWindow, reply: Reply[Any] | None, moment: Moment) -> Decisions:
        strategy = moment.strategy
        assert isinstance(strategy, HeadWindowReset)
        if command.text is not None:
            content = strategy.transition_content(moment.context, command.text, None)
            result = yield from self._transition(strategy, content)
            if reply is not None:
                yield Answer(reply, True, result)
            return False
        unit = strategy.transition_unit(moment.context)
        yield from self._raise_floor("reset", unit, reply, moment)  # before the transition summary reads the head window
        return True

    def _transition(self, strategy: HeadWindowReset, content: list[dict[str, Any]]) -> Decisions:
        data, blobs, appended = prepare_append(strategy.transition_participant, content)
        written = yield Write(AppendItem(state=self.config.slot, branch=self.branch_id, data=data,
                                         blobs=tuple(blobs), attachment=appended, flagged=appended.audience))
        message_id = str(written.value.sequence)
        strategy.start_head_window(written.moment.context, message_id)
        yield CommitStrategy()
        return message_id

    def apply(self, done: UnitDone, moment: Moment) -> Decisions:
        """Apply a unit's reply at ``moment`` (its caller, if a tick, is answered here: the task
        returns ``LATER``)."""
        flight, self.flight = self.flight, None
        if flight is None:
            return LATER
        if done.epoch != moment.epoch:
            logger.warning("%s: discarded the reply to %s: the namespace's view changed while it was out (C9)",
                           self.place, flight.unit.key)
            tracing.end_unit(flight.span, "discarded")
            if flight.reply is not None:
                yield Answer(flight.reply, *((True, False) if flight.kind == "tick" else (False, self._moved_error())))
            return LATER
        made = None  # what the strategy made of the reply: its rung of the refusal ladder and the result (T12)
        try:
            if isinstance(done.outcome, StoreUnavailableError):  # its images couldn't be read back: never sent
                raise done.outcome
            if flight.kind == "reset":
                strategy = moment.strategy
                assert isinstance(strategy, HeadWindowReset)
                content = strategy.transition_content(moment.context, None, done.outcome)
                result: Any = yield from self._transition(strategy, content)
            else:
                result = moment.strategy.apply_unit(flight.unit, done.outcome, moment.context)
                made = moment.strategy.unit_outcome(flight.unit)
                yield CommitStrategy()
                if made is not None and made.quarantined:  # stored: the alarm tells of a lasting quarantine (T13)
                    yield SoundAlarm(QuarantineAlarm(self.place.namespace, self.place.branch, flight.unit.key,
                                                     made.attempts, made.rung, made.failure or ""))
            yield from self._calibrate(flight.request, done.outcome)
            if moment.ledger:
                yield from self._record(flight, done, moment)
        except Exception as exc:  # noqa: BLE001 - answered to its caller, or reported
            tracing.end_unit(flight.span, "failed", exc, made)
            if isinstance(exc, StoreUnavailableError):
                yield AwaitStore(exc)  # the unit may be half applied: done again once the store answers
            if flight.reply is not None:
                yield Answer(flight.reply, False, exc)
            elif not isinstance(exc, StoreUnavailableError):
                yield Report(exc, "compression drain of %s failed to apply %s", (self.place, flight.unit.key))
            self._idle()
            return LATER
        tracing.end_unit(flight.span, "applied" if result else "nothing", made=made)
        if flight.reply is not None:
            yield Answer(flight.reply, True, result)
        if flight.kind == "drain" and not result:
            self._idle()
        return LATER

    def _calibrate(self, request: Any, outcome: Any) -> Decisions:
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
                yield Write(SetValue(state=states.calibration_state(self.place.namespace), branch=self.branch_id,
                                     value=estimator.to_json()))
            except Exception:
                logger.warning("%s: the token calibration could not be stored", self.place, exc_info=True)

    def _record(self, flight: Flight, done: UnitDone, moment: Moment) -> Decisions:
        """Keep a compression call in the namespace's request ledger (Q6): it waits, with the
        managers' records, for the runtime's next write (Q11). A failure there costs only the
        entry, never the unit."""
        request, outcome = flight.request, done.outcome
        if self.readonly or not isinstance(outcome, ModelResponse) or not isinstance(request, ModelRequest):
            return
        span, trace_id, span_id = tracing.request_span(flight.span) if flight.span is not None else (None, None, None)
        record = request_ledger.compression_record(
            record_id=uuid.uuid4().hex, at_ms=int(time.time() * 1000), sequence=0,  # the loop's, as it keeps it
            namespace=self.place.namespace, branch=self.place.branch, reader=moment.reader, request=request,
            response=outcome, unit_work=flight.unit.work, latency_ms=done.latency_ms, trace_id=trace_id,
            span_id=span_id)
        yield KeepRecord(record)
        tracing.recorded(span, record.id)

    def _moved_error(self) -> BaseException:
        return StrategyRefusedError(f"the strategy or reader of {self.place} changed while this request ran; "
                                    f"retry it")
