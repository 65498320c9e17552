"""What a message files in its slot's channel index (docs/behaviours.md M11, K10): its channel and
the entry its append writes. Below the slot layer, whose appends carry them (``slots.Appended``);
``channels`` reads them back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs

from .content.blocks import Block, holds_audience
from .content.tokens import estimate_blocks
from .store.records import IndexEntry

KEY_BYTES = 20  # a channel's index key: this many bytes of its digest, in hex


def channel_of(metadata: Mapping[str, Any] | None) -> str | None:
    """The channel a message's metadata names, or None (either schema; a non-string names none)."""
    if metadata is None or not isinstance(metadata, Mapping):  # None first: an ABC's isinstance costs a call
        return None
    channel = metadata.get("channel_id")
    if isinstance(channel, str) and channel:
        return channel
    external = metadata.get("external")
    channel = external.get("channel_id") if isinstance(external, Mapping) else None
    return channel if isinstance(channel, str) and channel else None


def channel_key(channel: str) -> str:
    """The key of a channel's index log: a digest, so any channel fits a state name."""
    return hashlib.blake2b(channel.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).hexdigest()


@attrs.frozen
class ChannelEntry:
    """One message's entry in its channel's index log."""

    channel: str
    timestamp_ms: int
    tokens: int  # the plain estimate of its whole content
    whole: bool  # every reader sees all of it (no block has an audience), so ``tokens`` is each reader's

    def encode(self) -> bytes:
        return json.dumps([self.channel, self.timestamp_ms, self.tokens, int(self.whole)], separators=(",", ":"),
                          ensure_ascii=False).encode()

    @classmethod
    def decode(cls, data: bytes) -> ChannelEntry:
        channel, timestamp_ms, tokens, whole = json.loads(data)
        return cls(channel, timestamp_ms, tokens, bool(whole))


def index_entries(content: tuple[Block, ...], metadata: Any, timestamp_ms: int) -> tuple[IndexEntry, ...]:
    """The index entries a message with this content, metadata and time files (none without a channel)."""
    channel = channel_of(metadata)
    if channel is None:
        return ()
    entry = ChannelEntry(channel, timestamp_ms, estimate_blocks(content), bool(content) and not holds_audience(content))
    return (IndexEntry(channel_key(channel), entry.encode()),)
