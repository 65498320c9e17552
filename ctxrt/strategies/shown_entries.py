"""Autobiographical's entries kept between compiles (docs/architecture.md, Strategies).

A compile shows mostly what the last one showed: the same messages and summaries. Compile's
memo reuses what it prepared *by Entry identity*, so the strategy hands back the same ``Entry``
for a message while it is the same ``Message`` object in the view (an edit puts a new object in
the view, so it gets a new entry) and the view prices text as before, and the same pair of
entries for a summary while its text and leaves are as before. Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..budget import Entry
from ..content import Message, Text
from .prompts import MANAGER, recall_header
from .records import Summary
from .shaping import shaped_entry

_MARKED_MAX = 256  # marked twins kept: the markers move with the tail, so old twins go


class ShownEntries:
    """The entries made for messages (shaped to ``cap``) and summaries (spoken by ``participant``)."""

    def __init__(self, cap: int, participant: str) -> None:
        self._cap = cap
        self._participant = participant
        self._pricing: object = None
        self._raw: dict[str, tuple[Message, Entry, int]] = {}  # message id -> (message, entry, cost)
        self._marked: dict[int, tuple[Entry, Entry]] = {}  # id(entry) -> (entry, its twin with a breakpoint)
        self._summaries: dict[str, tuple[str, tuple[str, ...], tuple[Entry, Entry]]] = {}

    def follow(self, pricing: object, messages: int) -> None:
        """Before a compile over a view of ``messages`` messages priced at ``pricing``: costs made
        at another pricing go, and so does what removed messages left once it outgrows the view."""
        if pricing != self._pricing:
            self._raw, self._pricing = {}, pricing
        if len(self._raw) > 2 * messages + 256:
            self._raw = {}
        if len(self._marked) > _MARKED_MAX:
            self._marked = {}

    def raw(self, message: Message, estimate: Callable[[Message], int]) -> tuple[Entry, int]:
        """``message``'s ``copy`` entry, shaped to the cap, and what it costs as sent."""
        found = self._raw.get(message.id)
        if found is not None and found[0] is message:
            return found[1], found[2]
        entry, cost = shaped_entry(message, self._cap, estimate)
        self._raw[message.id] = (message, entry, cost)
        return entry, cost

    def marked(self, entry: Entry) -> Entry:
        """``entry`` with a cache breakpoint (P9), the same object each time for the same entry."""
        if entry.cache_marker:
            return entry
        found = self._marked.get(id(entry))
        if found is not None and found[0] is entry:
            return found[1]
        twin = attrs.evolve(entry, cache_marker=True)
        self._marked[id(entry)] = (entry, twin)
        return twin

    def summary(self, summary: Summary, leaves: tuple[str, ...]) -> tuple[Entry, Entry]:
        """A shown summary's recall header and its text (with a breakpoint at its seam, P9)."""
        found = self._summaries.get(summary.id)
        if found is not None and found[0] == summary.content and (found[1] is leaves or found[1] == leaves):
            return found[2]
        pair = (
            # The header names its summary only; the answer carries the coverage (P6).
            Entry(MANAGER, (Text(recall_header(summary.id)),), (), "derived", (summary.id,)),
            # P9: a breakpoint at each summary seam, so a new summary invalidates only what follows it.
            Entry(self._participant, (Text(summary.content),), leaves, "derived", (summary.id,), cache_marker=True),
        )
        self._summaries[summary.id] = (summary.content, leaves, pair)
        return pair
