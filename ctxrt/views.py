"""What a strategy reads: listings over slot caches, merged, filtered and projected for a reader.

A *listing* gives a ``Window``: its newest messages in sequence order, as many as asked for,
plus a stamp that changes whenever the listing changed other than by appending. A slot's
listing decodes older messages only when a window reaches them, so a compile reads what its
budget holds, not the whole history (docs/behaviours.md L7). Each derived listing (merge,
filter, reader projection) memoises its own list and, while its source only appended, extends
it with just the new tail, so a compile at 20,000 messages doesn't re-filter 20,000 messages
(F3). ``MessageView`` is the read interface strategies get (docs/api.md, Writing a strategy).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import attrs

from .content.blocks import Message, content_for_reader, sequence_key
from .memos import IdMemo
from .slots import FULL, MIN_LOAD, Change, ChangeLog, SlotCache, parse_id
from .content.tokens import estimate_message


class Window(NamedTuple):
    """The newest messages of a listing, oldest first.

    ``messages`` is the listing's own list: immutable by contract, extended in place by appends and
    replaced when older messages are added or the listing changes. ``complete``: they are all of
    it. ``stamp`` changes whenever the listing changed other than by appending (or by holding more
    of its older messages).
    """

    messages: list[Message]
    complete: bool
    stamp: object  # names its listing too: two listings' stamps never compare equal


class Listing(Protocol):
    def window(self, count: int) -> Window:
        """At least the newest ``count`` messages (all of them if there are fewer)."""
        ...

    def changes(self, stamp: object) -> list[Change] | None:
        """The sequences changed other than by appending since the window that carried ``stamp``,
        oldest change first; None when they can't be named (start over)."""
        ...

    def may_hold_audience(self) -> bool: ...


class SlotListing:
    """A slot cache as a listing."""

    def __init__(self, cache: SlotCache) -> None:
        self.cache = cache

    def window(self, count: int) -> Window:
        cache = self.cache
        messages = cache.suffix(count)
        return Window(messages, cache.complete, (cache, cache.rewrites))

    def changes(self, stamp: object) -> list[Change] | None:
        cache, count = stamp if isinstance(stamp, tuple) else (None, 0)
        return self.cache.changes.since(count) if cache is self.cache else None

    def may_hold_audience(self) -> bool:
        return self.cache.may_hold_audience


class StaticListing:
    """A plain list of messages (in sequence order) as a listing: for strategies tested without a
    store. Appending to the list in place is seen as appends; replace the list to rewrite."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def window(self, count: int) -> Window:
        return Window(self.messages, True, (self, id(self.messages)))

    def changes(self, stamp: object) -> list[Change] | None:
        return None  # a replaced list names no change

    def may_hold_audience(self) -> bool:
        return True  # project every message: exact for any content, and the cost is a test's


class _Derived:
    """A memoised listing derived message by message from ``source``, held for the newest source
    messages asked for so far: it extends itself with the source's appends and reads further
    back only when a window asks for more than it holds."""

    def __init__(self, source: Listing) -> None:
        self.source = source
        self._stamp: object = None
        self._messages: list[Message] = []
        self._oldest: int | None = None  # sequence of the oldest source message taken
        self._newest = -1  # and of the newest
        self._taken = 0  # how many source messages were taken
        self._complete = False
        self._log = ChangeLog()
        self.projected = 0  # messages transformed so far (F3 is measured with it)

    def _transform(self, messages: Sequence[Message]) -> list[Message]:
        raise NotImplementedError

    def window(self, count: int) -> Window:
        source = self.source.window(1)
        if source.stamp != self._stamp and not self._patched(source):
            self._stamp, self._messages, self._oldest, self._newest, self._taken = source.stamp, [], None, -1, 0
            self._complete = False
            self._log.add(None)
        elif source.messages and source.messages[-1].sequence > self._newest:
            tail = source.messages[bisect_right(source.messages, self._newest, key=sequence_key) :]
            self._messages.extend(self._transform(tail))
            self._take(tail, self._complete)
        while (self._oldest is None or len(self._messages) < count) and not self._complete:
            if self._oldest is not None:
                source = self.source.window(max(2 * self._taken, count, 2 * MIN_LOAD))
                if source.stamp != self._stamp:
                    return self.window(count)  # the source changed as it read back: start over
            cut = len(source.messages) if self._oldest is None else bisect_left(
                source.messages, self._oldest, key=sequence_key)
            # Only what is asked for (at least doubling what is held), though the source may hold
            # far more (a slot cache holds every message appended in its process): what is held
            # here is what a rewrite's patch copies.
            first = max(0, cut - max(count - len(self._messages), self._taken, MIN_LOAD))
            older = source.messages[first:cut]
            self._messages = self._transform(older) + self._messages
            self._take(older, source.complete and first == 0)
        return Window(self._messages, self._complete, (self, self._log.count))

    def _patched(self, source: Window) -> bool:
        """Bring what is held up to ``source`` by the source's changes since it was read; False if
        they can't be named or the source no longer holds them (the caller starts over)."""
        changes = None if self._oldest is None else self.source.changes(self._stamp)
        if changes is None:
            return False
        held = source.messages
        for low, high in changes:
            low, high = max(low, self._oldest or 0), min(high, self._newest)  # appends not taken wait
            if low > high:
                continue  # older than anything held here
            if not source.complete and (not held or held[0].sequence > low):
                return False
            fresh = held[bisect_left(held, low, key=sequence_key) : bisect_right(held, high, key=sequence_key)]
            patched = self._messages.copy()  # a new list: windows handed out before stay as they were
            start, stop = bisect_left(patched, low, key=sequence_key), bisect_right(patched, high, key=sequence_key)
            patched[start:stop] = self._transform(fresh)
            self._messages = patched
            self.projected += len(fresh)
            self._log.add((low, high))
        self._stamp = source.stamp
        return True

    def changes(self, stamp: object) -> list[Change] | None:
        owner, count = stamp if isinstance(stamp, tuple) else (None, 0)
        return self._log.since(count) if owner is self else None

    def _take(self, messages: Sequence[Message], complete: bool) -> None:
        if messages:
            self._oldest = messages[0].sequence if self._oldest is None else min(self._oldest, messages[0].sequence)
            self._newest = max(self._newest, messages[-1].sequence)
        elif self._oldest is None:
            self._oldest = self._newest + 1
        self._taken += len(messages)
        self.projected += len(messages)
        self._complete = complete

    def may_hold_audience(self) -> bool:
        return self.source.may_hold_audience()


class MergedListing:
    """Several slots merged by sequence (M3). Messages appended after a merge always carry
    higher sequences than everything merged before (the sequence is global), so appends
    extend the merge with the sorted new tails. Held back to the newest sequence below which
    some source isn't held yet."""

    def __init__(self, sources: Sequence[Listing]) -> None:
        self.sources = list(sources)
        self._messages: list[Message] = []
        self._stamps: list[object] = []
        self._newest: list[int] = []
        self._complete = False
        self._rewrites = 0

    def window(self, count: int) -> Window:
        current = [source.window(1) for source in self.sources]
        stamps = [window.stamp for window in current]
        if stamps == self._stamps:
            tails = [w.messages[bisect_right(w.messages, newest, key=sequence_key) :]
                     for w, newest in zip(current, self._newest)]
            if any(tails):
                self._messages.extend(heapq.merge(*tails, key=sequence_key))
                self._newest = [w.messages[-1].sequence if w.messages else -1 for w in current]
            if len(self._messages) >= count or self._complete:
                return Window(self._messages, self._complete, (self, self._rewrites))
        wanted = max(count, 2 * len(self._messages)) if stamps == self._stamps else count
        while True:
            current = [source.window(wanted) for source in self.sources]
            # Below the oldest message a source holds, it may hold more not read yet: merged, the
            # held stretch starts at the newest such floor.
            floor = max((w.messages[0].sequence for w in current if not w.complete and w.messages), default=None)
            parts = [w.messages if floor is None else w.messages[bisect_left(w.messages, floor, key=sequence_key) :]
                     for w in current]
            merged = list(heapq.merge(*parts, key=sequence_key))
            if floor is None or len(merged) >= count:
                break
            wanted *= 2
        self._messages, self._complete = merged, floor is None
        stamps = [window.stamp for window in current]
        if stamps != self._stamps:  # rewritten before or while it read back: a new stamp
            self._rewrites += 1
        self._stamps = stamps
        self._newest = [w.messages[-1].sequence if w.messages else -1 for w in current]
        return Window(self._messages, self._complete, (self, self._rewrites))

    def changes(self, stamp: object) -> list[Change] | None:
        return None  # a consumer of merged slots starts over after a rewrite

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

    def window(self, count: int) -> Window:
        if not self.source.may_hold_audience():
            window = self.source.window(count)
            if not self.source.may_hold_audience():  # reading back may have found an audience
                return window
        return super().window(count)

    def changes(self, stamp: object) -> list[Change] | None:
        owner = stamp[0] if isinstance(stamp, tuple) else None
        # A stamp it passed through from its source (no audience yet): unprojected messages were
        # their own reader view, so the source's changes are the view's.
        return super().changes(stamp) if owner is self else self.source.changes(stamp)

    def _transform(self, messages: Sequence[Message]) -> list[Message]:
        reader = self.reader
        return [seen for message in messages if (seen := reader_view_of(message, reader)) is not None]


class MessageView:
    """The read interface a strategy gets. ``guard`` runs before every read (docs/behaviours.md C8).

    Returned lists are shared caches: immutable by contract. ``window``, ``get_tail``, ``get`` and
    ``after`` read back from the newest message only as far as they need (L7); ``get_all``,
    ``length``, ``get_from`` and ``index_of`` need the whole view and decode all of it.

    ``copies``: each message's ``copy`` entry (``strategies.base.raw_entry``), owned by whoever
    owns the listing (a slot's reader view shares one among its namespaces, so what compile makes
    of an entry is made once, P16), held for the messages the listing holds.
    """

    def __init__(
        self, listing: Listing, guard: Callable[[], None] | None = None,
        estimate: Callable[[Message], int] = estimate_message, pricing: Callable[[], object] = lambda: 0,
        copies: IdMemo[Message, Any] | None = None,
    ) -> None:
        self._listing = listing
        self._guard = guard
        self._estimate = estimate
        self._pricing = pricing
        # Values are ``budget.Entry`` (a layer above views, not named here).
        self.copies: IdMemo[Message, Any] = IdMemo() if copies is None else copies
        self._bounded: tuple[list[Message] | None, int] = (None, 0)  # the window ``copies`` was last bounded by

    @property
    def pricing(self) -> object:
        """Changes whenever ``estimate_tokens`` may price a message differently (a calibration):
        a strategy that keeps token counts across compiles starts them over when it changes."""
        return self._pricing()

    def window(self, count: int) -> Window:
        """At least the newest ``count`` messages of the view, with whether they are all of it and a
        stamp that changes when the view changed other than by appending."""
        if self._guard is not None:
            self._guard()
        window = self._listing.window(count)
        messages = window.messages
        bounded, length = self._bounded
        # A window holds all the listing holds. The same list at the same length holds the same
        # messages (``Window``: a list is replaced on any change but an append), so every entry
        # made since is of one of them: the table is bounded as it was. A compile reads its
        # window a dozen times, and a layered table's bound looks at two tables.
        if messages is not bounded or len(messages) != length:
            self.copies.bound(len(messages), messages)
            self._bounded = (messages, len(messages))
        return window

    def changes(self, stamp: object) -> list[Change] | None:
        """The sequences changed other than by appending since the window that carried ``stamp``
        (``Listing.changes``): a strategy holding what it read patches just those."""
        return self._listing.changes(stamp)

    def _reaching(self, sequence: int) -> list[Message]:
        """The newest messages, back to the one at ``sequence`` or older (or all of them)."""
        window = self.window(1)
        while not window.complete and window.messages[0].sequence > sequence:
            window = self.window(2 * len(window.messages))
        return window.messages

    def get_all(self) -> Sequence[Message]:
        return self.window(FULL).messages

    def length(self) -> int:
        return len(self.get_all())

    def get_from(self, index: int) -> Sequence[Message]:
        return self.get_all()[index:]

    def get_tail(self, count: int) -> Sequence[Message]:
        if count <= 0:
            return []
        messages = self.window(count).messages
        return messages[max(0, len(messages) - count) :]

    def index_of(self, message_id: str) -> int | None:
        messages = self.get_all()
        sequence = parse_id(message_id)
        if sequence is None:
            return None
        index = bisect_left(messages, sequence, key=sequence_key)
        return index if index < len(messages) and messages[index].sequence == sequence else None

    def get(self, message_id: str) -> Message | None:
        sequence = parse_id(message_id)
        if sequence is None:
            return None
        messages = self._reaching(sequence)
        index = bisect_left(messages, sequence, key=sequence_key)
        return messages[index] if index < len(messages) and messages[index].sequence == sequence else None

    def sequence_of(self, message_id: str) -> int | None:
        message = self.get(message_id)
        return None if message is None else message.sequence

    def after(self, sequence: int) -> Sequence[Message]:
        """Messages with a sequence above ``sequence``."""
        messages = self._reaching(sequence)
        return messages[bisect_right(messages, sequence, key=sequence_key) :]

    def estimate_tokens(self, message: Message) -> int:
        return self._estimate(message)
