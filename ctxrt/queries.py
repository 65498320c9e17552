"""Which messages a query asks for (docs/api.md, Reading messages). Pure and synchronous."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .content.blocks import Message

_MISSING = object()


def dotted(metadata: Mapping[str, Any] | None, path: str) -> Any:
    """The value at a dotted ``path`` ("task.id") of ``metadata``, or a marker matching nothing."""
    value: Any = metadata
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _same(stored: Any, wanted: Any) -> bool:
    """JSON equality: true and 1 are different values (Python's == says they are equal)."""
    return stored == wanted and isinstance(stored, bool) == isinstance(wanted, bool)


@attrs.frozen
class MessageQuery:
    """A conjunction of conditions on a stored message; an unset condition matches everything.

    ``since_ms``/``until_ms`` bound ``timestamp_ms`` inclusively; ``metadata`` maps dotted paths
    to values compared by equality; ``external_id`` is ``metadata["external"]["id"]`` (the id a
    host's source system gave the message).
    """

    participant: str | None = None
    metadata: Mapping[str, Any] | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    external_id: str | None = None

    def matches(self, message: Message) -> bool:
        if self.participant is not None and message.participant != self.participant:
            return False
        if self.since_ms is not None and message.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and message.timestamp_ms > self.until_ms:
            return False
        if self.external_id is not None and dotted(message.metadata, "external.id") != self.external_id:
            return False
        return not self.metadata or all(_same(dotted(message.metadata, path), value) for path, value in self.metadata.items())


@attrs.frozen
class ChannelTokens:
    """One channel's figures in a reader's view (``ContextManager.channel_token_stats``): how many
    of its messages the reader sees a block of, and the plain token estimate of those blocks."""

    count: int
    tokens: int
