"""What the namespace machine asks its loop to do (effects), what the loop tells it back, and
what a handler yields to the machine (``Write``).

``NamespaceMachine.handle(message, now)`` returns a list of these; the loop in
``namespace/actor.py`` carries them out in order. They are plain data: the machine never awaits,
sleeps, starts a task or writes; its tests read the effects and feed the outcomes back by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ..asks import Reply
    from ..slots import SlotCache
    from ..strategies.base import Unit
    from .protocol import NamespaceStatus


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
class Listen:
    """Hear of every append to the own slot (``every``), or stop hearing of them."""

    every: bool


@attrs.frozen
class SetTimer:
    """Send ``TimerFired`` at trio time ``at`` unless a message comes first (``inf``: no timer)."""

    at: float


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


Effect = Answer | Commit | CallModel | CancelModel | Acquire | Listen | SetTimer | Publish | Stop


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


# A handler that writes: it yields a ``Write`` (or an ``Acquire``) and is resumed with the store's
# result, or has the store's error raised into it.
Gen = Generator[Write | Acquire, Any, Any]
