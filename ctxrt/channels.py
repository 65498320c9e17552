"""Channel indexes: which messages of a slot carry each channel (docs/api.md, Channels; M11, K10).

A message's channel is ``metadata["channel_id"]``, else ``metadata["external"]["channel_id"]``
(hosts write either schema): the first of the two that is a non-empty string.

The index is stored (K10): each message with a channel files an entry in its slot's index log for
that channel (``store.records.index_state``, keyed by a digest of the channel) in the message's own
append, and its edit rewrites the entry, its removal removes it, in the same batch; a fork sees
its parent's entries up to the fork point, as it sees its messages. An entry holds what channel
reads need without decoding the message: the channel, its ``timestamp_ms``, the plain token
estimate of its content and whether every reader sees all of it. A channel read reads the slot's
index as of the revision its slot cache holds, so the two agree, and decodes only the messages it
returns (or, for counts, the messages some reader sees only part of).

A slot whose index doesn't cover it (written before the index existed, or with items written
below the slot layer since: ``store.records.index_marker``) is served as before the index
existed: an index derived from the slot cache (``ChannelIndex``), built by decoding the whole
slot at the first channel read (logged with its progress), then kept in step with the cache.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right, insort

from .channel_entries import KEY_BYTES, ChannelEntry, channel_key, channel_of
from .content.blocks import Message, content_for_reader, sequence_key
from .content.tokens import estimate_blocks, estimate_message
from .queries import ChannelTokens, MessageQuery
from .slots import SlotCache
from .store.interface import StoreEngine
from .store.records import Item, LogHead, index_key, index_marker, index_state, split_index_item

logger = logging.getLogger("ctxrt.channels")
LOGGED_BUILD = 50_000  # a build over at least this many messages is logged, with its progress
PROGRESS_EVERY = 100_000
_HEX = frozenset("0123456789abcdef")


# -- reading the stored index ---------------------------------------------------------------------


def covered(slot: SlotCache) -> bool:
    """Whether the slot's stored index covers it, as of the revision its cache holds (after a look
    at the head where the cache needs one)."""
    slot.suffix(0)  # brings the cache up to date (a read-only or shared store's look at the head)
    if not slot.revision:
        return True  # nothing written yet: an index of nothing
    return slot.engine.read_value(index_marker(slot.state), slot.branch_id, False, at=slot.revision) is True


def index_logs(engine: StoreEngine, slot: str) -> list[tuple[str, str]]:
    """(key, state name) of each of the slot's channel index logs (on any branch: one may be empty
    on a given branch)."""
    found = []
    for info in engine.list_states():
        key = index_key(slot, info.name)
        if info.kind == "log" and key is not None and len(key) == 2 * KEY_BYTES and all(c in _HEX for c in key):
            found.append((key, info.name))
    return found


def _index_logs(slot: SlotCache) -> list[str]:
    return [name for _, name in index_logs(slot.engine, slot.state)]


def _entry(item: Item) -> ChannelEntry:
    return ChannelEntry.decode(split_index_item(item.data)[1])


def _entries(slot: SlotCache, state: str) -> list[Item]:
    return slot.engine.read_items(state, slot.branch_id, at=slot.revision)


class ChannelReads:
    """What channel reads keep of one slot cache, owned by it (``SlotCache.channel_reads``), so
    they go with it: the messages they decoded by sequence, with the version decoded (an index
    entry's version is its message's: an edit rewrites both at its own sequence), at most one per
    message of the slot; each channel's messages as last read, with the cache's revision and
    rewrite count then (a repeated read of an unchanged slot reads nothing); and the derived index
    of a slot the stored one doesn't cover."""

    def __init__(self) -> None:
        self.decoded: dict[int, tuple[int, Message]] = {}
        self.read: dict[str, tuple[int, int, list[Message]]] = {}
        self.index: ChannelIndex | None = None


def _reads(slot: SlotCache) -> ChannelReads:
    found = slot.channel_reads
    if not isinstance(found, ChannelReads):
        found = slot.channel_reads = ChannelReads()
    return found


def _message(slot: SlotCache, entry: Item, head: LogHead) -> Message:
    """The message an index entry stands for, as of the slot cache's revision (``head``: the slot's
    head then), read by its ordinal (no search) unless the cache holds it."""
    held = slot.held(entry.sequence)
    if held is not None:
        return held
    decoded = _reads(slot).decoded
    known = decoded.get(entry.sequence)
    if known is not None and known[0] == entry.version:
        return known[1]
    index = head.ordinal_to_index(split_index_item(entry.data)[0])
    items = [] if index is None else slot.engine.read_items(slot.state, slot.branch_id, at=slot.revision, start=index,
                                                           stop=index + 1)
    if not items or items[0].sequence != entry.sequence:
        raise LookupError(f"channel index entry {entry.sequence} of {slot.state!r} on branch {slot.branch_id} "
                          "names no message there")
    message = slot.decode(items[0].data, items[0].sequence)  # media as references: a host's read goes through the media cache
    decoded[entry.sequence] = (items[0].version, message)
    return message


def _slot_head(slot: SlotCache) -> LogHead:
    return slot.engine.read_head(slot.state, slot.branch_id, at=slot.revision)


def channel_messages(slot: SlotCache, channel: str) -> list[Message]:
    """The channel's messages, oldest first (a list not to be changed): from the stored index where
    it covers the slot (decoding only those), else from the cache's derived index."""
    slot.suffix(0)  # up to date first: the revision below is the slot's now
    read = _reads(slot).read
    last = read.get(channel)
    if last is not None and last[0] == slot.revision and last[1] == slot.rewrites:
        return last[2]
    if not covered(slot):
        return indexed(slot).messages(channel)
    state = index_state(slot.state, channel_key(channel))
    if not slot.engine.has_state(state):
        return []
    entries = _entries(slot, state)
    head = _slot_head(slot) if entries else LogHead()
    messages = [_message(slot, entry, head) for entry in entries]
    read[channel] = (slot.revision, slot.rewrites, messages)
    return messages


def channel_counts(slot: SlotCache, reader: str | None) -> dict[str, int]:
    """Per channel, how many of the slot's messages ``reader`` sees a block of (M11)."""
    if covered(slot) and not slot.may_hold_audience:  # every message is whole in every view: the heads say
        counts = {}
        for state in _index_logs(slot):
            length = slot.engine.read_head(state, slot.branch_id, at=slot.revision).length
            if length:
                first = slot.engine.read_items(state, slot.branch_id, at=slot.revision, stop=1)[0]
                counts[_entry(first).channel] = length
        return counts
    return {channel: figures.count for channel, figures in channel_token_stats(slot, reader, None, None).items()}


def channel_token_stats(
    slot: SlotCache, reader: str | None, since_ms: int | None, until_ms: int | None,
) -> dict[str, ChannelTokens]:
    """Per channel, ``ChannelTokens`` of the slot's messages within the bounds in ``reader``'s view
    (M11): folded from the index entries, decoding only a message some reader sees part of."""
    query = MessageQuery(since_ms=since_ms, until_ms=until_ms)
    stats: dict[str, ChannelTokens] = {}
    if not covered(slot):
        index = indexed(slot)
        for channel, listed in index.channels.items():
            figures = [_seen(slot, message, reader) for message in listed if query.matches(message)]
            _add(stats, channel, figures)
        return stats
    head = _slot_head(slot)
    for state in _index_logs(slot):
        entries = [(item, _entry(item)) for item in _entries(slot, state)]
        if entries:
            _add(stats, entries[0][1].channel, [
                entry.tokens if entry.whole else _seen(slot, _message(slot, item, head), reader)
                for item, entry in entries
                if (since_ms is None or entry.timestamp_ms >= since_ms) and (until_ms is None or entry.timestamp_ms <= until_ms)
            ])
    return stats


def _seen(slot: SlotCache, message: Message, reader: str | None) -> int | None:
    """The plain estimate of the blocks of ``message`` the reader sees, or None if it sees none."""
    seen = content_for_reader(message.content, reader) if slot.may_hold_audience else message.content
    if not seen:
        return None
    return estimate_blocks(seen) if seen is not message.content else estimate_message(message)


def _add(stats: dict[str, ChannelTokens], channel: str, figures: list[int | None]) -> None:
    seen = [tokens for tokens in figures if tokens is not None]
    if seen:
        stats[channel] = ChannelTokens(len(seen), sum(seen))


# -- the derived index, for a slot the stored one doesn't cover -----------------------------------


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


def indexed(slot: SlotCache) -> ChannelIndex:
    """The slot cache's channel index, in step with it."""
    reads = _reads(slot)
    index = reads.index
    if index is None:
        logger.info("the stored channel index doesn't cover %s on branch %d (written before it, or below the slot "
                    "layer): its channel reads are served from its messages", slot.state, slot.branch_id)
        index = reads.index = ChannelIndex()
    index.follow(slot)
    return index
