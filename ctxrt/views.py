"""What a strategy reads: listings over slot caches, merged, filtered and projected for a reader.

A *listing* is a list of messages in sequence order plus a ``rewrites`` stamp that changes
whenever the list changed other than by appending. Each derived listing (merge, filter, reader
projection) memoises its own list and, while its source only appended, extends it with just
the new tail, so a compile at 20,000 messages doesn't re-filter 20,000 messages (docs/behaviours.md
F3). ``MessageView`` is the read interface strategies get (docs/api.md, Writing a strategy).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from .content import Message, content_for_reader
from .slots import SlotCache, _sequence, parse_id
from .tokens import estimate_message


class Listing(Protocol):
    def listing(self) -> tuple[list[Message], int]:
        """(messages in sequence order, rewrites stamp)."""
        ...

    def may_hold_audience(self) -> bool: ...


class SlotListing:
    """A slot cache as a listing."""

    def __init__(self, cache: SlotCache) -> None:
        self.cache = cache

    def listing(self) -> tuple[list[Message], int]:
        messages = self.cache.current()
        return messages, self.cache.rewrites

    def may_hold_audience(self) -> bool:
        return self.cache.may_hold_audience


class StaticListing:
    """A plain list of messages (in sequence order) as a listing: for strategies tested without a
    store. Appending to the list in place is seen as appends; replace the list to rewrite."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def listing(self) -> tuple[list[Message], int]:
        return self.messages, id(self.messages)

    def may_hold_audience(self) -> bool:
        return True  # project every message: exact for any content, and the cost is a test's


class _Derived:
    """A memoised listing derived from ``source`` that can extend itself on appends."""

    def __init__(self, source: Listing) -> None:
        self.source = source
        self._messages: list[Message] = []
        self._source_stamp: object = None
        self._seen = 0
        self._rewrites = 0
        self.projected = 0  # messages transformed so far (F3 is measured with it)

    def _transform(self, messages: Sequence[Message]) -> list[Message]:
        raise NotImplementedError

    def listing(self) -> tuple[list[Message], int]:
        source, stamp = self.source.listing()
        if stamp != self._source_stamp or len(source) < self._seen:
            self._messages = self._transform(source)
            self._source_stamp = stamp
            self._rewrites += 1
            self.projected += len(source)
        elif len(source) > self._seen:
            tail = source[self._seen :]
            self._messages.extend(self._transform(tail))
            self.projected += len(tail)
        self._seen = len(source)
        return self._messages, self._rewrites

    def may_hold_audience(self) -> bool:
        return self.source.may_hold_audience()


class MergedListing:
    """Several slots merged by sequence (M3). Messages appended after a merge always carry
    higher sequences than everything merged before (the sequence is global), so appends
    extend the merge with the sorted new tails."""

    def __init__(self, sources: Sequence[Listing]) -> None:
        self.sources = list(sources)
        self._messages: list[Message] = []
        self._stamps: list[int] = []
        self._seen: list[int] = []
        self._rewrites = 0

    def listing(self) -> tuple[list[Message], int]:
        current = [source.listing() for source in self.sources]
        stamps = [stamp for _, stamp in current]
        lengths = [len(messages) for messages, _ in current]
        if stamps != self._stamps or any(n < seen for n, seen in zip(lengths, self._seen)):
            self._messages = list(heapq.merge(*(messages for messages, _ in current), key=_sequence))
            self._rewrites += 1
        elif lengths != self._seen:
            tails = [messages[seen:] for (messages, _), seen in zip(current, self._seen)]
            self._messages.extend(heapq.merge(*tails, key=_sequence))
        self._stamps, self._seen = stamps, lengths
        return self._messages, self._rewrites

    def may_hold_audience(self) -> bool:
        return any(source.may_hold_audience() for source in self.sources)


class FilteredListing(_Derived):
    """``view_filter`` applied to messages as stored (A3: the filter sees each message as stored)."""

    def __init__(self, source: Listing, keep: Callable[[Message], bool]) -> None:
        super().__init__(source)
        self.keep = keep

    def _transform(self, messages: Sequence[Message]) -> list[Message]:
        return [message for message in messages if self.keep(message)]


def reader_view_of(message: Message, reader: str | None) -> Message | None:
    """One message as ``reader`` sees it, or None if it sees nothing of it."""
    content = content_for_reader(message.content, reader)
    if content == message.content:
        return message
    return attrs.evolve(message, content=content) if content else None


class ReaderListing(_Derived):
    """The reader's view (A2, A3, E1): each message through ``content_for_reader``; a message
    left with no block drops out. While no source may hold an audience block, it is the
    source listing itself, at no cost."""

    def __init__(self, source: Listing, reader: str | None) -> None:
        super().__init__(source)
        self.reader = reader

    def listing(self) -> tuple[list[Message], int]:
        if not self.source.may_hold_audience():
            return self.source.listing()
        return super().listing()

    def _transform(self, messages: Sequence[Message]) -> list[Message]:
        reader = self.reader
        return [seen for message in messages if (seen := reader_view_of(message, reader)) is not None]


class MessageView:
    """The read interface a strategy gets. ``guard`` runs before every read (docs/behaviours.md C8).

    Returned lists are shared caches: immutable by contract.
    """

    def __init__(self, listing: Listing, guard: Callable[[], None] | None = None) -> None:
        self._listing = listing
        self._guard = guard

    def _messages(self) -> list[Message]:
        if self._guard is not None:
            self._guard()
        return self._listing.listing()[0]

    def get_all(self) -> Sequence[Message]:
        return self._messages()

    def length(self) -> int:
        return len(self._messages())

    def get_from(self, index: int) -> Sequence[Message]:
        return self._messages()[index:]

    def get_tail(self, count: int) -> Sequence[Message]:
        messages = self._messages()
        return messages[max(0, len(messages) - count) :] if count > 0 else []

    def index_of(self, message_id: str) -> int | None:
        messages = self._messages()
        sequence = parse_id(message_id)
        if sequence is None:
            return None
        index = bisect_left(messages, sequence, key=_sequence)
        return index if index < len(messages) and messages[index].sequence == sequence else None

    def get(self, message_id: str) -> Message | None:
        messages = self._messages()
        sequence = parse_id(message_id)
        if sequence is None:
            return None
        index = bisect_left(messages, sequence, key=_sequence)
        return messages[index] if index < len(messages) and messages[index].sequence == sequence else None

    def sequence_of(self, message_id: str) -> int | None:
        message = self.get(message_id)
        return None if message is None else message.sequence

    def after(self, sequence: int) -> Sequence[Message]:
        """Messages with a sequence above ``sequence``."""
        messages = self._messages()
        return messages[bisect_right(messages, sequence, key=_sequence) :]

    def estimate_tokens(self, message: Message) -> int:
        return estimate_message(message)
