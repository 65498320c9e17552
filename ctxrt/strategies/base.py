"""The Strategy protocol, its context, and the entries a strategy selects (DESIGN.md §7)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import attrs

from ..content import Block, Message

if TYPE_CHECKING:
    from ..compile import Budget, PreviewResult
    from ..namespace.context import StrategyContext
    from ..views import MessageView

Relation = Literal["copy", "derived", "referenced"]


@attrs.frozen
class Entry:
    """One selected piece of context, before compile turns it into request messages.

    ``source_ids`` name the stored messages it carries (raw, for ``copy``) or summarises;
    ``summary_ids`` name the summaries a ``derived`` entry shows.
    """

    participant: str
    content: tuple[Block, ...]
    source_ids: tuple[str, ...] = ()
    relation: Relation = "copy"
    summary_ids: tuple[str, ...] = ()
    cache_marker: bool = False


@attrs.frozen
class SelectOptions:
    """What ``select`` is told besides the view and budget. ``dry_run`` commits nothing."""

    dry_run: bool = False
    context: "StrategyContext | None" = None


class Strategy:
    """Base of every strategy (DESIGN.md §7). The namespace actor owns one instance and calls it
    in its mailbox order; ``tick`` runs in the actor's drain, and only the model call inside it
    runs outside that order.

    ``marks_compression_reads`` declares that the strategy calls
    ``ctx.mark_compression_read(sequence)`` before it reads a message for a summary or a model
    request (or makes no such read). A manager with a reader refuses a strategy that doesn't
    (spec/audience.md D6).
    """

    name: str = "strategy"
    marks_compression_reads: bool = False

    async def initialize(self, ctx: "StrategyContext") -> None:
        """Load persisted state for ``ctx``'s branch; called at start and after a view change."""

    async def on_new_message(self, message: Message, ctx: "StrategyContext") -> None:
        """Called once per new message, with the reader's view of it (never for one it sees nothing of)."""

    async def select(self, view: "MessageView", budget: "Budget", options: SelectOptions) -> list[Entry]:
        raise NotImplementedError

    async def preview(self, view: "MessageView", budget: "Budget", options: SelectOptions) -> "PreviewResult | None":
        return None

    async def tick(self, ctx: "StrategyContext") -> bool:
        """One unit of background work; True if it made progress."""
        return False

    def is_ready(self) -> bool:
        return True

    def wake_at(self) -> float | None:
        """A trio-clock time before which the drain shouldn't tick (a backoff), or None."""
        return None



class RawEntries:
    """``copy`` entries and cumulative token counts for a view's messages, kept across compiles.

    Listings grow in place on appends and are replaced on any other change, so the list's
    identity and length say what is new: a warm compile extends these instead of rebuilding
    20,000 entries (and hands back the same ``Entry`` objects, which compile's memo keys on).
    """

    def __init__(self) -> None:
        self._source: Sequence[Message] | None = None
        self.entries: list[Entry] = []
        self.totals: list[int] = [0]  # totals[i] = tokens of messages[:i]

    def update(self, messages: Sequence[Message], estimate: Callable[[Message], int]) -> None:
        if messages is not self._source or len(messages) < len(self.entries):
            self._source, self.entries, self.totals = messages, [], [0]
        total = self.totals[-1]
        for message in messages[len(self.entries):]:
            self.entries.append(Entry(message.participant, message.content, (message.id,), "copy"))
            total += estimate(message)
            self.totals.append(total)

    def suffix_start(self, usable: int) -> int:
        """The start of the longest suffix whose tokens fit ``usable``."""
        return bisect_left(self.totals, self.totals[-1] - usable)
