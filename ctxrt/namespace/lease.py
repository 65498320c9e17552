"""``Lease``: whether this process serves a namespace whose strategy keeps its memory here.

On a shared store (PostgreSQL) several processes may open the same namespace; a strategy that
keeps its memory in the process (``Strategy.keeps_memory``) may run in one of them at a time, so
its actor holds the namespace's lease while it runs such a strategy and gives it back otherwise.
The lease is held through the engine (a row on PostgreSQL: a holder, an expiry the engine renews,
and a fencing token every write of the namespace's states checks in its own transaction, K12); it
lapses when its holder stops renewing it, and another process may then take it. Kept apart from
the machine since it is one small piece of state with its own rules, read by the machine at three
points: when the strategy changes, before a strategy write goes out, and at the stop.

Nothing here touches the engine: taking, looking at and giving back the lease are effects
(``TakeLease``, ``CheckLease``, ``ReleaseLease``) the loop carries out (``actor.answer_lease``),
and what the engine said comes back as ``LeaseAnswer``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from ..errors import ConfigConflictError
from ..strategies.base import Strategy
from . import states
from .core import Place
from .effects import CheckLease, ReleaseLease, TakeLease


class Lease:
    """The lease of ``place``'s namespace, as this process holds it."""

    def __init__(self, place: Place, *, readonly: bool) -> None:
        self.place = place
        self.readonly = readonly
        self.state = states.context_state(place.namespace)  # the name it is held under
        self.held = False

    def follow(self, strategy: Strategy) -> Generator[TakeLease | ReleaseLease, bool, None]:
        """Hold the lease while ``strategy`` keeps its memory here (a shared store's other processes
        then can't serve it); give it back otherwise. ConfigConflictError if another process holds
        it: nothing changed. A handler's step: it yields the effect and is resumed with whether the
        lease is held (or has the engine's error raised into it)."""
        wanted = strategy.keeps_memory and not self.readonly
        if wanted and not self.held:
            if not (yield TakeLease(self.state)):
                raise ConfigConflictError(
                    f"{self.place} is served by another process with a strategy that keeps its memory there "
                    f"({strategy.name!r} here): one process at a time serves such a namespace; open it in that "
                    f"process, or with a strategy that keeps none"
                )
            self.held = True
        elif not wanted and self.held:
            yield ReleaseLease(self.state)
            self.held = False

    def check(self) -> CheckLease | None:
        """Before a strategy write goes out: what to ask, whether the lease this process held was
        taken over (the engine's own count, no round trip; the store's fencing check refuses the
        write if it went since); None while none is held."""
        return CheckLease(self.state) if self.held else None

    def forfeit(self) -> Callable[[], ConfigConflictError]:
        """The lease is gone: forget it; the error its actor stops with."""
        self.held = False
        place = self.place

        def refusal() -> ConfigConflictError:
            return ConfigConflictError(f"{place} lost its lease to another process; its managers here "
                                       f"are closed: reopen it where it is served")
        return refusal

    def give_back(self) -> ReleaseLease | None:
        """At the actor's stop: give back a lease held (the loop logs a failure: a connection
        already gone took it with it)."""
        if not self.held:
            return None
        self.held = False
        return ReleaseLease(self.state, at_stop=True)

