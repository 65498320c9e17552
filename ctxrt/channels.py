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
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping
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
    """Channel -> the slot's messages in it, oldest first (the cache's own objects: a read walks
    its channel's list and touches nothing else); as of ``rewrites`` (the cache's rewrite count
    when last brought in step) and ``last`` (the newest sequence indexed)."""

    def __init__(self) -> None:
        self.channels: dict[str, list[Message]] = {}
        self.rewrites = -1  # never built
        self.last = 0

    def _add(self, messages: list[Message]) -> None:
        for message in messages:
            channel = channel_of(message.metadata)
            if channel is not None:
                self.channels.setdefault(channel, []).append(message)

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
        for channel, listed in list(self.channels.items()):
            start = bisect_left(listed, low, key=sequence_key)
            stop = bisect_right(listed, high, key=sequence_key)
            if start < stop:
                del listed[start:stop]
                if not listed:
                    del self.channels[channel]
        changed = messages[bisect_left(messages, low, key=sequence_key):bisect_right(messages, high, key=sequence_key)]
        for message in changed:
            named = channel_of(message.metadata)
            if named is not None:
                insort(self.channels.setdefault(named, []), message, key=sequence_key)

    def follow(self, slot: SlotCache) -> None:
        """Bring the index in step with ``slot`` (decoding the whole slot the first time)."""
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

    def messages(self, channel: str) -> list[Message]:
        """The channel's messages, oldest first: the index's own list, not to be changed."""
        return self.channels.get(channel, [])


_INDEXES: weakref.WeakKeyDictionary[SlotCache, ChannelIndex] = weakref.WeakKeyDictionary()


def indexed(slot: SlotCache) -> ChannelIndex:
    """The slot cache's channel index, in step with it."""
    index = _INDEXES.get(slot)
    if index is None:
        index = _INDEXES[slot] = ChannelIndex()
    index.follow(slot)
    return index
