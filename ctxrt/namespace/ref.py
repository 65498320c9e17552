"""``NamespaceRef``: the handle to one namespace actor, its mailbox the one way in.

``ask`` sends a command (``ctxrt.namespace.protocol``) and waits for its answer; ``tell`` sends
one and doesn't. Apart from the commands, as the mailbox is trio's and they are plain data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..asks import Ask
from ..mailbox import Mailbox
from .protocol import NamespaceConfig, NamespaceStatus, Retire, refusal_for, stopped

R = TypeVar("R")
MAILBOX_CAPACITY = 256  # asks queued or in service at once; a further ask waits for a place


class NamespaceRef:
    """The handle to one namespace actor: one (branch incarnation, namespace) in a runtime.

    Its ``Mailbox`` is the one way in: commands (``ask`` waits while ``MAILBOX_CAPACITY`` are
    queued, so callers feel backpressure), and messages from the runtime (``SlotAppended``,
    ``Retire``) and from the actor's own children (``UnitDone``, ``Committed``), which never
    wait. ``status`` is the frozen snapshot the actor last published, replaced whole.
    """

    def __init__(self, config: NamespaceConfig, branch_id: int, branch_name: str) -> None:
        self.config = config
        self.branch_id = branch_id
        self.branch_name = branch_name
        self.mailbox = Mailbox(MAILBOX_CAPACITY, self.refusal)
        # When the actor has stopped (or is told to), a factory of the error later requests raise;
        # else None. Set by ``retire`` only. An attribute, not a property: every call reads it.
        self.retired: Callable[[], BaseException] | None = None
        self.status = NamespaceStatus(config.strategy)

    @property
    def namespace(self) -> str:
        return self.config.namespace

    async def ask(self, command: Ask[R]) -> R:
        """Send ``command`` and wait for its answer.

        Raises what the handler raised, or the actor's stop error (``ActorRetired`` for an
        attach, else ``BranchNotFoundError`` or ``ManagerClosedError``) if it stopped first. If
        cancelled after sending, the command is still handled whole; only its answer is lost.
        """
        return await self.mailbox.ask(command)

    def refusal(self, command: Any) -> BaseException:
        """The error a command meets once the actor has stopped: an attach retries on a fresh
        actor; anything else belonged to a manager the stop closed."""
        return refusal_for(self.retired or stopped, command)

    def tell(self, command: Any) -> None:
        """Send ``command`` without waiting; dropped if the actor has stopped."""
        self.mailbox.tell(command)

    def retire(self, error: Callable[[], BaseException]) -> None:
        """Tell the actor to stop now: refuse new commands with ``error()``; the actor takes
        ``Retire`` before anything queued and refuses that the same way."""
        if self.retired is None:
            self.retired = error
            self.mailbox.close(notice=Retire(error))

    @property
    def mailbox_depth(self) -> int:
        return self.mailbox.depth
