"""``serve_namespace``: the loop that runs one namespace actor, one task per live (branch
incarnation, namespace).

Everything the actor knows and decides is in its ``NamespaceMachine`` (``namespace/machine.py``);
this loop is the I/O around it. It takes each message off the mailbox, hands it to the machine
with the time, and carries out the effects it gets back (``namespace/effects.py``): answers
callers, sends commits to the store actor, starts model calls in child tasks, keeps one timer,
publishes the status, and stops. What the store and the model answer comes back to the machine
as messages (``Committed``, ``UnitDone``) from child tasks, so the loop never waits for a commit or
a model call: it goes on taking messages, and the machine decides what may run meanwhile.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import trio

from .. import tracing
from ..content.blobs import MediaCache
from ..content.blocks import Message
from ..errors import CtxrtError, ManagerClosedError, ModelError, ReadOnlyStoreError, StoreUnavailableError
from ..mailbox import Reply
from ..models.model_types import ModelRequest
from ..slots import SlotCache, SlotRegistry, decode_stored
from ..store.actor import StoreRef
from ..store.interface import StoreEngine
from ..store.records import Item
from ..strategies.base import Unit
from . import views
from .core import Place
from .effects import (
    Acquire,
    Acquired,
    Answer,
    CallModel,
    CancelModel,
    CheckLease,
    Commit,
    Committed,
    Effect,
    Inputs,
    LeaseAnswer,
    Listen,
    Publish,
    ReleaseLease,
    SetTimer,
    KeepRecord,
    SoundAlarm,
    Stop,
    TakeLease,
    TimerFired,
)
from .lease import Lease
from .machine import NamespaceMachine, read_only_refusal
from .protocol import Retire, SlotAppended, UnitDone
from .ref import NamespaceRef

logger = logging.getLogger("ctxrt.namespace")

MODEL_TIMEOUT_S = 300.0
FAIRNESS_STREAK = 32  # messages taken without waiting before the actor yields once


@attrs.frozen
class Services:
    """What every namespace actor of one runtime shares."""

    engine: StoreEngine
    store: StoreRef | None  # None in a read-only runtime
    slots: SlotRegistry
    model: Any  # the runtime's default model
    forget: Callable[[NamespaceRef], None]  # the registry drops a stopped actor's ref
    model_timeout_s: float = MODEL_TIMEOUT_S  # a unit's model call fails (retryably) after this
    alarm: Callable[[int, str, Any], None] = attrs.field(default=lambda branch, namespace, event: None, kw_only=True)
    # Keeps a request record (the ledger's, Q6) waiting for the runtime's next write.
    keep_record: Callable[[int, str, Any], None] = attrs.field(default=lambda branch, namespace, record: None,
                                                               kw_only=True)


@attrs.frozen
class EngineReads:
    """The machine's ``StoreReads`` over a store engine's committed state."""

    engine: StoreEngine

    @property
    def shared(self) -> bool:
        return self.engine.shared

    @property
    def last_sequence(self) -> int:
        return self.engine.last_sequence

    def read_value(self, state: str, branch_id: int, default: Any = None) -> Any:
        return self.engine.read_value(state, branch_id, default)

    def read_log(self, state: str, branch_id: int) -> list[Item]:
        return self.engine.read_log(state, branch_id)

    def read_message(self, slot: str, branch_id: int, sequence: int) -> tuple[Message, int] | None:
        item = self.engine.read_item(slot, branch_id, sequence)
        return None if item is None else (decode_stored(self.engine, item.data, item.sequence), item.version)

    def context_entries(self, namespace: str, branch_id: int) -> list[Message]:
        return views.context_entries(self.engine, namespace, branch_id)

    def state_names(self) -> list[str]:
        return [info.name for info in self.engine.list_states()]

    def has_state(self, name: str) -> bool:
        return self.engine.has_state(name)

    def check_state(self, name: str) -> None:
        self.engine.state(name)

    def seen_now(self, caches: Sequence[SlotCache]) -> int:
        return views.seen_now(self.engine, caches)


def answer_lease(engine: StoreEngine, branch_id: int, effect: TakeLease | CheckLease | ReleaseLease) -> LeaseAnswer:
    """The loop's half of the lease (``namespace/lease.py``): carry out ``effect`` on ``engine``;
    whether the lease is held after it, or the error the engine raised."""
    try:
        match effect:
            case TakeLease():
                return LeaseAnswer(engine.hold(branch_id, effect.state))
            case CheckLease():
                return LeaseAnswer(engine.holds(branch_id, effect.state))
            case ReleaseLease():
                engine.release(branch_id, effect.state)
                return LeaseAnswer(False)
    except Exception as exc:  # noqa: BLE001 - the machine's to judge
        return LeaseAnswer(False, exc)


def _runtime_closed(place: Place) -> Callable[[], BaseException]:
    return lambda: ManagerClosedError(f"the runtime closed; the manager of {place} is closed")


class _Loop:
    """The I/O of one actor: its mailbox, children, timer, slot caches and store calls."""

    def __init__(self, services: Services, ref: NamespaceRef, children: trio.Nursery) -> None:
        self.services = services
        self.ref = ref
        self.children = children
        self.place = Place(ref.namespace, ref.branch_name)
        writes = services.store is not None
        self.machine = NamespaceMachine(ref.config, self.place, ref.branch_id, Lease(self.place, readonly=not writes),
                                        writes=writes, model_timeout_s=services.model_timeout_s,
                                        standby=bool(getattr(services.engine, "standby", False)))
        self.reads = EngineReads(services.engine)
        config = ref.config
        self.model = config.model if config.model is not None else services.model
        self.deadline = math.inf
        self.caches: list[SlotCache] = []
        self.call_scope: trio.CancelScope | None = None
        self.stopped: Callable[[], BaseException] | None = None
        self._streak = 0

    async def run(self) -> None:
        while self.stopped is None:
            envelope = await self._next()
            message, reply = (TimerFired(), None) if envelope is None else envelope
            self.apply(self.machine.handle(message, self._inputs(), reply))

    async def _next(self) -> tuple[Any, Reply[Any] | None] | None:
        """The next envelope; None when the timer came first."""
        mailbox = self.ref.mailbox
        try:
            envelope = mailbox.receive_nowait()
        except trio.WouldBlock:
            self._streak = 0
            try:
                if self.deadline == math.inf:  # no timer: no cancel scope to pay for
                    return await mailbox.receive()
                with trio.move_on_at(self.deadline):
                    return await mailbox.receive()
                return None
            except trio.EndOfChannel:
                return Retire(self.ref.retired or _runtime_closed(self.place)), None
        except trio.EndOfChannel:
            return Retire(self.ref.retired or _runtime_closed(self.place)), None
        self._streak += 1
        if self._streak >= FAIRNESS_STREAK:  # a long queue still lets the host's other tasks run
            self._streak = 0
            await trio.lowlevel.checkpoint()
        return envelope

    def _inputs(self) -> Inputs:
        """What the machine takes with a message: the time, the mailbox's depth, the store."""
        return Inputs(trio.current_time(), self.reads, self.ref.mailbox.depth, stopwatch=time.perf_counter)

    def apply(self, effects: Iterable[Effect]) -> None:
        """Carry out ``effects`` in order. None waits: a commit and a model call run in child tasks
        and come back as messages."""
        queue = deque(effects)
        while queue:
            effect = queue.popleft()
            match effect:
                case Answer():
                    effect.reply.resolve(effect.ok, effect.value)
                case Commit():
                    self.children.start_soon(self._commit, effect.token, effect.command, effect.trace)
                case CallModel():
                    scope = self.call_scope = trio.CancelScope()
                    self.children.start_soon(_complete, self.ref, self.model, effect.request, self.services.slots.media,
                                             effect.unit, effect.epoch, self.services.model_timeout_s, scope, effect.span)
                case CancelModel():
                    if self.call_scope is not None:
                        self.call_scope.cancel()
                case Acquire():
                    queue.extend(self.machine.handle(self._acquire(effect.slots), self._inputs()))
                case TakeLease() | CheckLease() | ReleaseLease():
                    queue.extend(self._lease(effect))
                case Listen():
                    if effect.every:
                        self.caches[0].listen(self.appended)
                    else:
                        self.caches[0].unlisten(self.appended)
                case SetTimer():
                    self.deadline = effect.at
                case Publish():
                    self.ref.status = effect.status
                case SoundAlarm():
                    self.services.alarm(self.ref.branch_id, self.ref.namespace, effect.event)
                case KeepRecord():
                    self.services.keep_record(self.ref.branch_id, self.ref.namespace, effect.record)
                case Stop():
                    self.stopped = effect.error
                    self.ref.retire(effect.error)  # later asks are refused with it
                    self.ref.mailbox.drain()  # what is queued, answered the same way
                    self.services.forget(self.ref)
                    if self.call_scope is not None:
                        self.call_scope.cancel()

    def _lease(self, effect: TakeLease | CheckLease | ReleaseLease) -> list[Effect]:
        """A lease effect carried out on the engine, at once; what the machine makes of the answer
        (nothing for the give-back at its stop)."""
        answer = answer_lease(self.services.engine, self.ref.branch_id, effect)
        if not (isinstance(effect, ReleaseLease) and effect.at_stop):
            return self.machine.handle(answer, self._inputs())
        if answer.error is not None:  # the store unreachable: the lease lapses at its expiry
            logger.warning("couldn't give back the lease of %s", self.place, exc_info=answer.error)
        return []

    async def _commit(self, token: int, command: Any, trace: Any) -> None:
        """A child task: one commit through the store actor; its outcome goes back as ``Committed``.
        It sends the command in ``trace``, the context of the command that made it."""
        store = self.services.store
        if store is None:
            outcome: tuple[bool, Any] = (False, ReadOnlyStoreError(
                read_only_refusal(self.place, self.machine.standby)))
        else:
            try:
                with tracing.resumed(trace):
                    outcome = (True, await store.ask(command))
            except Exception as exc:  # noqa: BLE001 - the machine's to judge
                outcome = (False, exc)
        self.ref.tell(Committed(token, *outcome))

    def _acquire(self, slots: tuple[str, ...]) -> Acquired:
        """The slots' caches, or the error the first read of one raised (a damaged store), answered
        to the handler that asked rather than ending the actor (and the runtime with it)."""
        held = len(self.caches)
        try:
            for name in slots:
                self.caches.append(self.services.slots.acquire(name, self.ref.branch_id))
        except CtxrtError as exc:
            for cache in self.caches[held:]:
                self.services.slots.release(cache)
            del self.caches[held:]
            return Acquired((), exc)
        return Acquired(tuple(self.caches))

    def appended(self, sequence: int) -> None:
        """What the own slot's cache calls after each append it commits, while the machine listens."""
        self.ref.tell(SlotAppended(sequence))

    def close(self) -> None:
        """The loop ends, however it ends: the machine answers what it holds, the mailbox what is
        queued, and the slot caches (and the reader's view of them) are given back."""
        if self.stopped is None:  # the runtime closing (Cancelled) or an interrupt
            self.apply(self.machine.handle(Retire(self.ref.retired or _runtime_closed(self.place)), self._inputs()))
        self.machine.let_go_of_views()  # the slot cache may outlive this actor: its reader view need not
        for cache in self.caches:
            cache.unlisten(self.appended)
            self.services.slots.release(cache)
        self.caches = []


def _with_media(request: ModelRequest, media: MediaCache) -> ModelRequest:
    """``request`` with its messages' media references read back as base64 (M13)."""
    messages = tuple(message if (content := media.resolve(message.content)) is message.content
                     else attrs.evolve(message, content=content) for message in request.messages)
    changed = any(a is not b for a, b in zip(messages, request.messages))
    return attrs.evolve(request, messages=messages) if changed else request


async def _complete(
    ref: NamespaceRef, model: Any, request: Any, media: MediaCache, unit: Unit, epoch: int, timeout_s: float,
    scope: trio.CancelScope, span: Any = None,
) -> None:
    """The child task of one unit: the model call, outside the mailbox; its outcome goes back as
    UnitDone. Its chat span (inside the unit's ``span``) is current while it calls. The images'
    bytes are read back here (M13), not in the loop: a store gone meanwhile is the unit's outcome
    (its drain waits for the store), never the actor's end."""
    try:
        request = _with_media(request, media)
    except StoreUnavailableError as exc:
        ref.tell(UnitDone(epoch, unit, exc, 0.0))
        return
    except CtxrtError as exc:  # a damaged blob: the unit fails, as a model's error, and the actor goes on
        ref.tell(UnitDone(epoch, unit, ModelError(f"the request's media couldn't be read: {exc}", retryable=False), 0.0))
        return
    with scope, tracing.model_call(span, model, request) as call:
        outcome: Any
        started = trio.current_time()
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
        tracing.answered(call, outcome)
        ref.tell(UnitDone(epoch, unit, outcome, (trio.current_time() - started) * 1000))


async def serve_namespace(services: Services, ref: NamespaceRef, started: Reply[None]) -> None:
    """Serve one namespace actor until it stops: its last manager leaves (or its first attach is
    refused), its branch is deleted, or the runtime closes. ``started`` is answered once it serves
    (its opener waits for that before it sends its attach).

    It runs in the runtime's nursery, never in an opener's scope: trio leaves a task started
    with ``nursery.start`` in the opener's scope when the opener is cancelled as it starts, and
    an actor cancelled with its opener strands every other caller's request (L3, L4)."""
    failed: BaseException | None = None
    try:
        async with trio.open_nursery() as children:
            loop = _Loop(services, ref, children)
            started.resolve(True, None)
            try:
                await loop.run()
            except BaseException as exc:
                # The runtime closing (Cancelled) or an interrupt: raised once out of the nursery as
                # itself, not in a group, so the runtime's scope and a host's ``except`` see it.
                failed = exc
            finally:
                loop.close()
                children.cancel_scope.cancel()
    except BaseException as unwinding:
        # The children's unwinding: with the runtime's scope cancelled too (its host answered as
        # closed), their Cancelled belongs to that scope and leaves the nursery. The actor's own
        # ending outranks it, or an interrupt would be lost to a cancel it caused (L8).
        if failed is None or _holds_interrupt(unwinding):
            raise
    if failed is not None:
        raise failed


def _holds_interrupt(error: BaseException) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return error.split(KeyboardInterrupt)[0] is not None
    return isinstance(error, KeyboardInterrupt)
