"""``Lease``: whether this process serves a namespace whose strategy keeps its memory here.

On a shared store (PostgreSQL) several processes may open the same namespace; a strategy that
keeps its memory in the process (``Strategy.keeps_memory``) may run in one of them at a time, so
its actor holds the namespace's lease while it runs such a strategy and gives it back otherwise.
The lease is held through the engine (a session lock on PostgreSQL); it goes with a lost
connection, and another process may then take it. Kept apart from the machine since it is one
small piece of state with its own rules, read by the machine at three points: when the strategy
changes, before a strategy write goes out, and at the stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import ConfigConflictError
from ..store.interface import StoreEngine
from ..strategies.base import Strategy
from . import states
from .core import Place

logger = logging.getLogger("ctxrt.namespace")


class Lease:
    """The lease of ``place``'s namespace on branch ``branch_id``, as this process holds it."""

    def __init__(self, engine: StoreEngine, place: Place, branch_id: int, *, readonly: bool) -> None:
        self.engine = engine
        self.place = place
        self.branch_id = branch_id
        self.readonly = readonly
        self.state = states.context_state(place.namespace)
        self.held = False

    def follow(self, strategy: Strategy) -> None:
        """Hold the lease while ``strategy`` keeps its memory here (a shared store's other processes
        then can't serve it); give it back otherwise. ConfigConflictError if another process holds
        it: nothing changed."""
        wanted = strategy.keeps_memory and not self.readonly
        if wanted and not self.held:
            if not self.engine.hold(self.branch_id, self.state):
                raise ConfigConflictError(
                    f"{self.place} is served by another process with a strategy that keeps its memory there "
                    f"({strategy.name!r} here): one process at a time serves such a namespace; open it in that "
                    f"process, or with a strategy that keeps none"
                )
            self.held = True
        elif not wanted and self.held:
            self.engine.release(self.branch_id, self.state)
            self.held = False

    def lost(self) -> bool:
        """Whether the lease this process held went (with a lost connection): a strategy write
        made here must not go out then. False while none is held. Raises what the engine raises
        when the store can't be asked."""
        return self.held and not self.engine.holds(self.branch_id, self.state)

    def forfeit(self) -> Callable[[], ConfigConflictError]:
        """The lease is gone: forget it; the error its actor stops with."""
        self.held = False
        place = self.place

        def refusal() -> ConfigConflictError:
            return ConfigConflictError(f"{place} lost its lease to another process; its managers here "
                                       f"are closed: reopen it where it is served")
        return refusal

    def give_back(self) -> None:
        """At the actor's stop: give back a lease held (a connection already gone took it with it)."""
        if not self.held:
            return
        self.held = False
        try:
            self.engine.release(self.branch_id, self.state)
        except Exception:  # the connection is gone: so is the lease
            logger.warning("couldn't give back the lease of %s", self.place, exc_info=True)
