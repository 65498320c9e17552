"""Channel indexes: which messages of a slot cache carry each channel (docs/api.md, Channels).

A message's channel is ``metadata["channel_id"]``, else ``metadata["external"]["channel_id"]``
(hosts write either schema): the first of the two that is a non-empty string. The index is
derived, per slot cache (so per branch, and shared by every manager of a runtime reading the
slot): built from the cache's messages at the first channel read, then kept in step with the
cache's own record of what changed (``SlotCache.changes``), so a read costs what it returns plus
a bisect, however long the slot. Nothing is stored: a store of any age opens unchanged.
"""

from __future__ import annotations

import logging
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from typing import Any

from .content.blocks import Message, sequence_key
from .slots import SlotCache

logger = logging.getLogger("ctxrt.channels")
LOGGED_BUILD = 50_000  # a build over at least this many messages is logged, with its progress
PROGRESS_EVERY = 100_000


def channel_of(metadata: Mapping[str, Any] | None) -> str | None:
    """The channel a message's metadata names, or None (either schema; a non-string names none)."""
    if not isinstance(metadata, Mapping):
        return None
    channel = metadata.get("channel_id")
    if isinstance(channel, str) and channel:
        return channel
    external = metadata.get("external")
    channel = external.get("channel_id") if isinstance(external, Mapping) else None
    return channel if isinstance(channel, str) and channel else None


class ChannelIndex:
    """Channel -> the sequences of the slot's messages in it, ascending; as of ``rewrites`` (the
    cache's rewrite count when last brought in step) and ``last`` (the newest sequence indexed)."""

    def __init__(self) -> None:
        self.channels: dict[str, list[int]] = {}
        self.rewrites = -1  # never built
        self.last = 0

    def _add(self, messages: list[Message]) -> None:
        for message in messages:
            channel = channel_of(message.metadata)
            if channel is not None:
                self.channels.setdefault(channel, []).append(message.sequence)

    def _build(self, slot: SlotCache, messages: list[Message]) -> None:
        self.channels = {}
        logged = len(messages) >= LOGGED_BUILD
        if logged:
            logger.info("indexing the channels of %s on branch %d (%d messages)", slot.state, slot.branch_id,
                        len(messages))
        for start in range(0, len(messages), PROGRESS_EVERY):
            self._add(messages[start:start + PROGRESS_EVERY])
            if logged:
                logger.info("indexed %d of %d messages", min(start + PROGRESS_EVERY, len(messages)), len(messages))

    def _patch(self, messages: list[Message], low: int, high: int) -> None:
        """Index sequences ``low``..``high`` (at most ``self.last``) afresh: an edit or a removal."""
        high = min(high, self.last)
        if low > high:
            return
        for channel, sequences in list(self.channels.items()):
            start, stop = bisect_left(sequences, low), bisect_right(sequences, high)
            if start < stop:
                del sequences[start:stop]
                if not sequences:
                    del self.channels[channel]
        changed = messages[bisect_left(messages, low, key=sequence_key):bisect_right(messages, high, key=sequence_key)]
        for message in changed:
            named = channel_of(message.metadata)
            if named is not None:
                sequences = self.channels.setdefault(named, [])
                sequences.insert(bisect_left(sequences, message.sequence), message.sequence)

    def follow(self, slot: SlotCache) -> list[Message]:
        """Bring the index in step with ``slot`` (decoding the whole slot the first time); the
        slot's messages, oldest first, as the index now describes them."""
        messages = slot.current()
        changes = None if self.rewrites < 0 else slot.changes.since(self.rewrites)
        if changes is None:
            self._build(slot, messages)
        else:
            for low, high in changes:
                self._patch(messages, low, high)
            self._add(messages[bisect_right(messages, self.last, key=sequence_key):])
        self.rewrites = slot.changes.count
        self.last = messages[-1].sequence if messages else 0
        return messages

    def sequences(self, channel: str) -> list[int]:
        return self.channels.get(channel, [])


_INDEXES: weakref.WeakKeyDictionary[SlotCache, ChannelIndex] = weakref.WeakKeyDictionary()


def indexed(slot: SlotCache) -> tuple[ChannelIndex, list[Message]]:
    """The slot cache's channel index, in step with it, and the slot's messages."""
    index = _INDEXES.get(slot)
    if index is None:
        index = _INDEXES[slot] = ChannelIndex()
    return index, index.follow(slot)


def in_channel(messages: list[Message], sequences: list[int], *, reverse: bool = False) -> Iterator[Message]:
    """The messages at ``sequences`` (each held by ``messages``, both ascending), in order."""
    for sequence in reversed(sequences) if reverse else sequences:
        yield messages[bisect_left(messages, sequence, key=sequence_key)]
