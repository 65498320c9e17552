"""OpenAI request forms of a compile, made from the last body's parts (P10, P14, P15).

``openai_wire.to_chat_messages`` and ``to_responses_input`` make a body from scratch, message by
message. Here the same items are assembled from what the last body of the same form and assistant
set was made of: each compiled message's items (a ``_Part``, reused while the message is the same
object and, for a message with tool blocks, while a replay of the request's walk over its
tool-bearing messages, ``replay_ids``, shows it the same calls and call ids), taken by list slices
over the runs of unchanged parts. So a body costs a list of references plus what changed. The
cache's items are never edited once made: the last item is always a fresh copy (the host's to
edit, docs/api.md), and alternated roles are merged on copies.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Collection, Sequence
from functools import partial
from itertools import accumulate
from typing import Any, cast

from .body_runs import BodyCache, SharedParts, carried, runs, shifted
from ..content.blocks import CompiledMessage
from .openai_wire import Api, SystemRole, call_ids, chat_finish, check_system_role, message_items, replay_ids
from .wire import ForeignCalls

Counts = dict[str, int]


class _Part:
    """One compiled message's items, with the walk's answers it was made under and what it left out."""

    __slots__ = ("as_text", "items", "left_out", "looked", "message", "sent")

    def __init__(
        self, api: Api, message: CompiledMessage, assistant: bool,
        looked: tuple[str | None, ...] = (), sent: tuple[str, ...] = (),
    ) -> None:
        self.message, self.looked, self.sent = message, looked, sent
        self.items, self.left_out, self.as_text = message_items(api, message, assistant, looked, sent)


class _Body:
    """What one body was made of: its messages, their parts, where the tool-bearing ones and those
    with counts are, and the items in order. Most messages make one item: where each message's
    items start is kept only for the others (``odd``, sorted, with their item counts), so taking a
    run of messages copies the items and a few positions, not a position per message."""

    __slots__ = ("counted", "counts", "items", "messages", "odd", "parts", "shift", "size", "tools")

    def __init__(self) -> None:
        self.messages: list[CompiledMessage] = []
        self.parts: list[_Part] = []
        self.tools: list[int] = []
        self.counted: list[int] = []
        self.items: list[dict[str, Any]] = []
        self.size = 0  # messages added so far
        self.odd: list[int] = []
        self.counts: list[int] = []
        self.shift: list[int] = [0]  # shift[t]: the items beyond one per message made by the first t odd ones

    def start(self, message: int) -> int:
        """Where the items of ``message`` (or, past the last, the end) start."""
        return message + self.shift[bisect_left(self.odd, message)]

    def add(self, part: _Part) -> None:
        """The next message's items."""
        self.items += part.items
        if len(part.items) != 1:
            self.odd.append(self.size)
            self.counts.append(len(part.items))
        self.size += 1

    def take(self, old: _Body, first: int, end: int) -> None:
        """The items of ``old``'s messages ``first``..``end - 1``, as the next messages."""
        lo, hi = bisect_left(old.odd, first), bisect_left(old.odd, end)
        if self.items:
            self.items += old.items[old.start(first):old.start(end)]
        else:  # the first items: one copy, not a copy appended
            self.items = old.items[old.start(first):old.start(end)]
        if lo < hi:
            self.odd += [k - first + self.size for k in old.odd[lo:hi]]
            self.counts += old.counts[lo:hi]
        self.size += end - first

    def finish(self) -> None:
        self.shift = [0, *accumulate(count - 1 for count in self.counts)]


def _assemble(api: Api, messages: Sequence[CompiledMessage], speakers: Collection[str], old: _Body | None,
              shared: SharedParts) -> _Body:
    body = _Body()
    body.messages = new = list(messages)  # the host may change its list; the record keeps this one
    found = runs(new, old.messages) if old is not None else []
    parts, gaps, body.tools = carried(found, old.parts if old is not None else [], old.tools if old is not None else [], new)
    # Replay the request's walk over its tool-bearing messages only: a part made under other calls is made again.
    foreign, ids = ForeignCalls(), call_ids(api)
    remade: list[int] = []
    for t in body.tools:
        message = new[t]
        assistant = message.participant in speakers
        looked, sent = replay_ids(foreign, ids, message, assistant)
        held = parts[t]
        if held is None or held.looked != looked or held.sent != sent:
            remade.append(t)
            parts[t] = _Part(api, message, assistant, looked, sent)
    for k in gaps:
        if parts[k] is None:  # found in no run and without tool blocks
            message, assistant = new[k], new[k].participant in speakers
            parts[k] = shared.part((api, id(message), assistant), message, partial(_Part, api, message, assistant))
    body.parts = made = cast(list[_Part], parts)  # every position has its part now
    position = 0
    for i, j, length in found:
        assert old is not None
        for k in range(position, i):
            body.add(made[k])
        bounds = [i] + [b for t in remade if i <= t < i + length for b in (t, t + 1)] + [i + length]
        for start, end in zip(bounds[::2], bounds[1::2]):  # stretches of old parts, a remade one after each but the last
            body.take(old, start - i + j, end - i + j)
            if end < i + length:
                body.add(made[end])
        position = i + length
    for k in range(position, len(new)):
        body.add(made[k])
    body.finish()
    # Where counts are: the runs' as they were, and the parts made here, none twice.
    kept = [k for i, j, length in found for k in shifted(old.counted, j, length, i - j)] if old else []
    body.counted = sorted({k for k in kept + gaps + remade if made[k].left_out or made[k].as_text})
    return body


def _summed(parts: Sequence[_Part], counted: list[int]) -> tuple[Counts, Counts]:
    left_out: Counts = {}
    as_text: Counts = {}
    for k in counted:
        for total, counts in ((left_out, parts[k].left_out), (as_text, parts[k].as_text)):
            for kind, n in counts.items():
                total[kind] = total.get(kind, 0) + n
    return left_out, as_text


def _made(
    api: Api, messages: Sequence[CompiledMessage], assistant: str | Collection[str], cache: BodyCache
) -> tuple[list[dict[str, Any]], Counts, Counts]:
    speakers = frozenset({assistant} if isinstance(assistant, str) else assistant)
    key = (api, speakers)
    body = cache.made_of(key, messages)
    if body is None:
        body = _assemble(api, messages, speakers, cache.get(key), cache.shared)
    cache.put(key, body, body.messages)
    return (list(body.items), *_summed(body.parts, body.counted))


def _last_copied(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if out:
        out[-1] = copy.deepcopy(out[-1])  # the host's to edit
    return out


def chat_messages(
    messages: Sequence[CompiledMessage], assistant: str | Collection[str], cache: BodyCache, *,
    system: str | None = None, system_role: SystemRole = "system", alternate_roles: bool = False,
) -> tuple[list[dict[str, Any]], Counts, Counts]:
    """``openai_wire.to_chat_messages``, made from the parts of the last Chat Completions body
    ``cache`` holds for the same assistant set; its items but the last are shared with it."""
    check_system_role(system_role)
    out, left_out, as_text = _made("chat", messages, assistant, cache)
    # Alternation merges runs into new dicts and lists, never editing a cached item.
    return _last_copied(chat_finish(out, system, system_role, alternate_roles)), left_out, as_text


def responses_input(
    messages: Sequence[CompiledMessage], assistant: str | Collection[str], cache: BodyCache
) -> tuple[list[dict[str, Any]], Counts, Counts]:
    """``openai_wire.to_responses_input``, made from the parts of the last Responses body ``cache``
    holds for the same assistant set; its items but the last are shared with it."""
    out, left_out, as_text = _made("responses", messages, assistant, cache)
    return _last_copied(out), left_out, as_text
