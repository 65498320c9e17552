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
from collections.abc import Collection, Sequence
from typing import Any, cast

from .body_runs import BodyCache, runs, shared_part, shifted
from .content import CompiledMessage
from .openai_wire import Api, SystemRole, call_ids, chat_finish, check_system_role, message_items, replay_ids
from .wire import ForeignCalls, holds_tools

Counts = dict[str, int]


class _Part:
    """One compiled message's items, with the walk's answers it was made under and what it left out."""

    __slots__ = ("__weakref__", "as_text", "items", "left_out", "looked", "message", "sent")

    def __init__(
        self, api: Api, message: CompiledMessage, assistant: bool,
        looked: tuple[str | None, ...] = (), sent: tuple[str, ...] = (),
    ) -> None:
        self.message, self.looked, self.sent = message, looked, sent
        self.items, self.left_out, self.as_text = message_items(api, message, assistant, looked, sent)


class _Body:
    """What one body was made of: its messages, their parts, where the tool-bearing ones and those
    with counts are, and the items in order with where each message's items start (``starts``,
    and one past the last)."""

    __slots__ = ("counted", "items", "messages", "parts", "starts", "tools")

    def __init__(self) -> None:
        self.messages: list[CompiledMessage] = []
        self.parts: list[_Part] = []
        self.tools: list[int] = []
        self.counted: list[int] = []
        self.items: list[dict[str, Any]] = []
        self.starts: list[int] = [0]


def _assemble(api: Api, messages: Sequence[CompiledMessage], speakers: Collection[str], old: _Body | None) -> _Body:
    body = _Body()
    body.messages = new = list(messages)  # the host may change its list; the record keeps this one
    found = runs(new, old.messages) if old is not None else []
    parts: list[_Part | None] = [None] * len(new)
    gaps: list[int] = []  # positions in no run
    position = 0
    for i, j, length in found:
        assert old is not None
        gaps += range(position, i)
        body.tools += (k for k in range(position, i) if holds_tools(new[k]))
        parts[i:i + length] = old.parts[j:j + length]
        body.tools += shifted(old.tools, j, length, i - j)
        position = i + length
    gaps += range(position, len(new))
    body.tools += (k for k in range(position, len(new)) if holds_tools(new[k]))
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
            parts[k] = shared_part((api, id(message), assistant), message, lambda: _Part(api, message, assistant))
    body.parts = made = cast(list[_Part], parts)  # every position has its part now
    position = 0
    for i, j, length in found:
        assert old is not None
        for k in range(position, i):
            _add(body, made[k])
        bounds = [i] + [b for t in remade if i <= t < i + length for b in (t, t + 1)] + [i + length]
        for start, end in zip(bounds[::2], bounds[1::2]):  # stretches of old parts, a remade one after each but the last
            first, last = old.starts[start - i + j], old.starts[end - i + j]
            shift = len(body.items) - first
            body.items += old.items[first:last]
            ends = old.starts[start - i + j + 1:end - i + j + 1]
            body.starts += map(shift.__add__, ends) if shift else ends
            if end < i + length:
                _add(body, made[end])
        position = i + length
    for k in range(position, len(new)):
        _add(body, made[k])
    # Where counts are: the runs' as they were, and the parts made here, none twice.
    kept = [k for i, j, length in found for k in shifted(old.counted, j, length, i - j)] if old else []
    body.counted = sorted({k for k in kept + gaps + remade if made[k].left_out or made[k].as_text})
    return body


def _add(body: _Body, part: _Part) -> None:
    body.items += part.items
    body.starts.append(len(body.items))


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
    body = _assemble(api, messages, speakers, cache.get(key))
    cache.put(key, body)
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
