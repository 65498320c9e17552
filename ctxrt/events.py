"""What ``ContextManager.subscribe()`` delivers: each change to a slot, once, in sequence order
(docs/api.md, Host controls), and, to a subscriber that asks, its namespace's quarantine alarms. Pure data, and the diff a read-only runtime makes of a slot it
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


@attrs.frozen
class QuarantineAlarm:
    """A compression unit of ``namespace`` on ``branch`` was quarantined (docs/behaviours.md T13):
    ``unit_key`` (a chunk id, or a merge group's summary ids), its counted failures (``attempts``),
    the rung of the refusal ladder its last request was made at (``last_rung``: "full" for the
    request as planned) and why its last reply was not a memory (``last_error``). Its messages
    stay raw until ``retry_quarantined``. Delivered by ``subscribe(alarms=True)``."""

    namespace: str
    branch: str
    unit_key: str
    attempts: int
    last_rung: str
    last_error: str


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
