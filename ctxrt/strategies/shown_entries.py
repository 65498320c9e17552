"""Autobiographical's entries kept between compiles (docs/architecture.md, Strategies).

A compile shows mostly what the last one showed: the same messages and summaries. Compile's
memo reuses what it prepared *by Entry identity*, so the strategy hands back the same ``Entry``
for a message while it is the same ``Message`` object in the view (an edit puts a new object in
the view, so it gets a new entry) and the view prices text as before, and the same pair of
entries for a summary while its text and leaves are as before. Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry
from ..content.blocks import Message, Text
from ..memos import IdMemo
from .prompts import MANAGER, recall_header
from .records import Summary
from .shaping import shaped_entry

if TYPE_CHECKING:
    from ..views import MessageView


class ShownEntries:
    """The entries made for messages (shaped to ``cap``) and summaries (spoken by ``participant``)."""

    def __init__(self, cap: int, participant: str) -> None:
        self._cap = cap
        self._participant = participant
        self._pricing: object = None
        self._raw: IdMemo[Message, tuple[Entry, int]] = IdMemo()  # a message's entry and cost
        self._copies: IdMemo[Message, Entry] = IdMemo()  # the view's copy entries (``MessageView.copies``)
        self._marked: IdMemo[Entry, Entry] = IdMemo()  # an entry's twin with a breakpoint
        self._summaries: dict[str, tuple[str, tuple[str, ...], tuple[Entry, Entry]]] = {}

    def follow(self, view: MessageView, messages: int) -> None:
        """Before a compile over ``view`` of ``messages`` messages: costs made at another pricing
        go, and so does what removed messages left once it outgrows the view."""
        self._copies = view.copies
        if view.pricing != self._pricing:
            self._raw, self._pricing = IdMemo(), view.pricing
        self._raw.bound(messages)
        self._marked.bound(0)  # the markers move with the tail, so old twins go

    def raw(self, message: Message, estimate: Callable[[Message], int]) -> tuple[Entry, int]:
        """``message``'s ``copy`` entry, shaped to the cap, and what it costs as sent."""
        found = self._raw.get(message)
        if found is None:
            found = self._raw.put(message, shaped_entry(message, self._cap, estimate, self._copies))
        return found

    def marked(self, entry: Entry) -> Entry:
        """``entry`` with a cache breakpoint (P9), the same object each time for the same entry."""
        if entry.cache_marker:
            return entry
        found = self._marked.get(entry)
        if found is None:
            found = self._marked.put(entry, attrs.evolve(entry, cache_marker=True))
        return found

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
