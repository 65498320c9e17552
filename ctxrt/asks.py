"""``Ask`` and ``Reply``: a command and its answer as data, with no event loop.

The pure cores (the namespace machine, its effects, the store's commands) hold these and pass
them on; they never wait on one. The waiting is the mailbox's (``ctxrt.mailbox``): its ``Reply``
adds parking the caller's task to this one, so nothing here imports trio.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from . import tracing

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Ask(Generic[R_co]):
    """A command answered with an ``R``: ``Mailbox.ask`` returns what the actor answers it with."""

    __slots__ = ()


class Reply(Generic[R]):
    """One command's answer. The actor resolves it once (later resolves are ignored); the caller
    takes it with ``unwrap``. It carries its sender's trace context (``trace``) to the actor:
    trio gives the actor's task its own context, not the sender's."""

    __slots__ = ("_done", "ok", "value", "trace")

    def __init__(self) -> None:
        self._done = False
        self.ok = False
        self.value: Any = None
        self.trace: Any = tracing.current()  # made in the sender's task; None while tracing is off

    @property
    def done(self) -> bool:
        return self._done

    def resolve(self, ok: bool, value: Any) -> None:
        if self._done:
            return
        self.ok, self.value, self._done = ok, value, True
        self._answered()

    def _answered(self) -> None:
        """What the first resolve does besides recording the answer: nothing here; the mailbox's
        reply wakes its waiting caller."""

    def unwrap(self) -> R:
        """The answer, or the error the command was refused with, raised."""
        if self.ok:
            return self.value  # type: ignore[no-any-return]  # an R by the command's type
        raise self.value
