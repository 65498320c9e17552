"""What ``ContextManager.subscribe()`` delivers: each change to a slot, once, in sequence order
(docs/api.md, Host controls). Pure data, and the diff a read-only runtime makes of a slot it
saw rewritten."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import attrs

from .content.blocks import Message


@attrs.frozen
class Added:
    """A message appended, as stored."""

    message: Message


@attrs.frozen
class Edited:
    """A message's content replaced; ``previous`` as it was, or None when nothing in this process
    held it (it is never decoded just to be reported)."""

    message: Message
    previous: Message | None


@attrs.frozen
class Removed:
    """Messages removed, by id, oldest first."""

    ids: tuple[str, ...]


MessageEvent = Union[Added, Edited, Removed]


def diff(old: Sequence[Message], new: Sequence[Message]) -> list[MessageEvent]:
    """The events that turn ``old`` into ``new`` (both oldest first): removals, then edits, then
    appends, each in sequence order. For a read-only runtime, which sees a slot's state, not the
    writes between two looks."""
    before = {message.sequence: message for message in old}
    after = {message.sequence: message for message in new}
    events: list[MessageEvent] = []
    gone = tuple(message.id for message in old if message.sequence not in after)
    if gone:
        events.append(Removed(gone))
    newest = max(before, default=0)
    for message in new:
        previous = before.get(message.sequence)
        if previous is not None and previous.content != message.content:
            events.append(Edited(message, previous))
    events += [Added(message) for message in new if message.sequence not in before and message.sequence > newest]
    return events
