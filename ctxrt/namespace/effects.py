"""What the namespace machine asks its loop to do (effects), what the loop tells it back, what
it hands the machine with each message (``Inputs``: the time, the mailbox's depth, the store to
read), and what a handler yields to the machine (``Write``).

``NamespaceMachine.handle(message, inputs)`` returns a list of effects; the loop in
``namespace/actor.py`` carries them out in order. They are plain data: the machine never awaits,
sleeps, starts a task, reads a clock or writes; its tests read the effects and feed the outcomes
back by hand, with a store of their own to read (``StoreReads``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from ..content.blocks import Message
    from ..store.records import Item
    from ..asks import Reply
    from ..slots import SlotCache
    from ..strategies.base import Unit
    from .protocol import NamespaceStatus


# -- what the loop hands the machine with each message -------------------------------------------


class StoreReads(Protocol):
    """The store's committed state, as the machine reads it (the actor's reads its engine; a
    test's may be a few dicts). Read only while a message is handled."""

    @property
    def shared(self) -> bool:
        """Other processes write the store too (PostgreSQL): a claim may land there at any time."""
        ...

    @property
    def last_sequence(self) -> int: ...

    def read_value(self, state: str, branch_id: int, default: Any = None) -> Any: ...
    def read_log(self, state: str, branch_id: int) -> list[Item]: ...
    def read_message(self, slot: str, branch_id: int, sequence: int) -> tuple[Message, int] | None:
        """The message at ``sequence`` in ``slot`` as it is now, decoded, with its version."""
        ...
    def context_entries(self, namespace: str, branch_id: int) -> list[Message]:
        """The namespace's context log on the branch, decoded."""
        ...
    def state_names(self) -> list[str]: ...
    def has_state(self, name: str) -> bool: ...
    def check_state(self, name: str) -> None:
        """``UnknownStateError`` if nobody registered ``name``."""
        ...
    def seen_now(self, caches: Sequence[SlotCache]) -> int:
        """The sequence up to which a strategy that just read ``caches`` has been handed the view."""
        ...


@attrs.frozen
class Inputs:
    """What comes with each message besides itself: trio time ``now``, how many messages wait in
    the mailbox behind it, the store to read, and ``stopwatch`` (seconds, for timing a compile)."""

    now: float
    store: StoreReads
    depth: int = 0
    stopwatch: Callable[[], float] = attrs.field(default=lambda: 0.0, kw_only=True)


# -- effects -----------------------------------------------------------------------------------


@attrs.frozen
class Answer:
    """Resolve a caller's reply (a cancelled caller's answer is dropped there)."""

    reply: Reply[Any]
    ok: bool
    value: Any


@attrs.frozen
class Commit:
    """Send ``command`` to the store actor; its outcome comes back as ``Committed(token, ...)``.
    ``trace``: the trace context of the command that made it (its commit span's parent)."""

    token: int
    command: Any
    trace: Any = None


@attrs.frozen
class CallModel:
    """Start a unit's model call outside the mailbox; its outcome comes back as ``UnitDone``.
    ``span``: the unit's trace span, which the call's chat span goes inside."""

    epoch: int
    unit: Unit
    request: Any
    span: Any = None


@attrs.frozen
class CancelModel:
    """Cancel the model call out (the actor stops)."""


@attrs.frozen
class Acquire:
    """Acquire the slot caches of ``slots`` (the own slot first); they come back as ``Acquired``."""

    slots: tuple[str, ...]


@attrs.frozen
class TakeLease:
    """Take this process's lease on the namespace (held under ``state``); whether it was taken
    comes back as ``LeaseAnswer``."""

    state: str


@attrs.frozen
class CheckLease:
    """Look whether the lease is still held, as the engine counts it (before a strategy write goes out;
    no round trip: the write's own transaction checks the fencing token): ``LeaseAnswer``."""

    state: str


@attrs.frozen
class ReleaseLease:
    """Give the lease back: ``LeaseAnswer``; ``at_stop``: the actor stops, nothing comes back (a
    failure is only logged: the lease then lapses at its expiry)."""

    state: str
    at_stop: bool = False


@attrs.frozen
class Listen:
    """Hear of every append to the own slot (``every``), or stop hearing of them."""

    every: bool


@attrs.frozen
class SetTimer:
    """Send ``TimerFired`` at trio time ``at`` unless a message comes first (``inf``: no timer)."""

    at: float


@attrs.frozen
class SoundAlarm:
    """Hand ``event`` (a ``QuarantineAlarm``) to the namespace's subscribers that asked for alarms."""

    event: Any


@attrs.frozen
class KeepRecord:
    """Keep ``record`` (a compression call's) in the namespace's request ledger: it waits with the
    managers' records for the runtime's next write, so the ledger keeps the order they were made
    in (Q6, Q11)."""

    record: Any


@attrs.frozen
class Publish:
    """Put up a new status snapshot for the actor's managers to read."""

    status: NamespaceStatus


@attrs.frozen
class Stop:
    """The actor stops: refuse every later command with ``error()``, answer what is queued the same
    way, give back the slot caches and end the loop. Every request the machine held is answered
    by the effects before this one."""

    error: Callable[[], BaseException]


Effect = (Answer | Commit | CallModel | CancelModel | Acquire | TakeLease | CheckLease | ReleaseLease | Listen
          | SetTimer | Publish | SoundAlarm | KeepRecord | Stop)


# -- what the loop tells the machine back ------------------------------------------------------


@attrs.frozen
class Committed:
    """The outcome of ``Commit(token, ...)``: ``ok`` and the store's result, or the error that refused it."""

    token: int
    ok: bool
    value: Any


@attrs.frozen
class Acquired:
    """The slot caches an ``Acquire`` asked for, in its order; or, none acquired, the error reading
    one raised (a damaged store's ``StoreCorruptError``), raised into the handler that asked."""

    caches: Sequence[SlotCache]
    error: Exception | None = None


@attrs.frozen
class LeaseAnswer:
    """What the engine said to a lease effect: whether the lease is held now, or the error asking
    it raised (the store unreachable)."""

    held: bool
    error: Exception | None = None


@attrs.frozen
class TimerFired:
    """The last ``SetTimer``'s time came before any message."""


# -- what a handler yields -----------------------------------------------------------------------


@attrs.frozen
class Write:
    """What a handler yields to commit: ``command``, or ``build()``'s (None: nothing to commit)
    made when its turn in the lane comes. ``strategy``: made from the strategy's memory (dropped if
    that memory is reloaded first). ``copies``: it appends to the context log. ``behind``: an
    exclusive handler's write that goes to the back of the lane, behind what others queued."""

    command: Any = None
    build: Callable[[], Any] | None = None
    strategy: bool = False
    copies: bool = False
    behind: bool = False


# A handler that writes: it yields a ``Write`` (or asks the loop: ``Acquire``, ``TakeLease``,
# ``ReleaseLease``) and is resumed with the store's result or the loop's answer, or has the error
# raised into it.
Gen = Generator[Write | Acquire | TakeLease | ReleaseLease, Any, Any]
