"""Injections (P3, B4): content a host adds at compile time, checked and placed among compiled messages.

``Injection`` (at a named position) and ``MessageInjection`` (at a depth) are what a host
passes to a compile; ``validate_injections`` refuses bad ones before a strategy selects
anything, ``place_injections`` puts them in place. They stand alone because the namespace
validates injections apart from compiling, and placing is a pure rule worth testing by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Union

import attrs

from ..content.validation import blocks_from_content, find_audience, validate_participant
from ..content.blocks import Block, CompiledMessage, ContentLike, Text, ToolResult, ToolUse
from ..errors import MalformedContentError
from .provenance import Source
from ..budget import non_negative_int

INJECTION_PARTICIPANT_PREFIX = "system_context:"
Position = Literal["system", "before_user", "after_user"]
POSITIONS: tuple[str, ...] = ("system", "before_user", "after_user")


@attrs.frozen
class Injection:
    """Content a host adds at compile time at a named position (P3)."""

    namespace: str
    position: Position = attrs.field(validator=attrs.validators.in_(POSITIONS))
    content: ContentLike


@attrs.frozen
class MessageInjection:
    """A message a host adds at compile time, ``depth`` messages from the end."""

    participant: str
    content: ContentLike
    depth: int = attrs.field(default=0, validator=non_negative_int)



def refuse_audience_in_injections(
    injections: Sequence[Injection], message_injections: Sequence[MessageInjection]
) -> None:
    """Raise ``MalformedContentError`` naming the first injected block that carries an audience (B4)."""
    groups: tuple[tuple[str, Sequence[Injection | MessageInjection]], ...] = (
        ("injections", injections), ("message_injections", message_injections),
    )
    for label, items in groups:
        for i, injection in enumerate(items):
            where = find_audience(injection.content, path=f"{label}[{i}].content")
            if where is not None:
                raise MalformedContentError(
                    where, "an injection may not carry an audience: injected content is seen by whoever "
                    "the compile is for, so restrict it by not injecting it"
                )


def _injection_blocks(
    injections: Sequence[Injection], message_injections: Sequence[MessageInjection]
) -> tuple[list[tuple[Block, ...]], list[tuple[Block, ...]]]:
    refuse_audience_in_injections(injections, message_injections)
    placed = []
    for i, injection in enumerate(injections):
        if not isinstance(injection.namespace, str):
            raise MalformedContentError(f"injections[{i}].namespace", f"must be a string, not {injection.namespace!r}")
        validate_participant(INJECTION_PARTICIPANT_PREFIX + injection.namespace, path=f"injections[{i}].namespace")
        blocks = blocks_from_content(injection.content, path=f"injections[{i}].content")
        if injection.position == "system":
            for j, block in enumerate(blocks):
                if type(block) is not Text:
                    raise MalformedContentError(
                        f"injections[{i}].content[{j}]", f"a system injection may hold only text blocks, not {block.type}"
                    )
        _refuse_tool_blocks(blocks, f"injections[{i}]")
        placed.append(blocks)
    messages = []
    for i, message_injection in enumerate(message_injections):
        validate_participant(message_injection.participant, path=f"message_injections[{i}].participant")
        blocks = blocks_from_content(message_injection.content, path=f"message_injections[{i}].content")
        _refuse_tool_blocks(blocks, f"message_injections[{i}]")
        messages.append(blocks)
    return placed, messages


def _refuse_tool_blocks(blocks: Sequence[Block], place: str) -> None:
    """P8: an injection is placed after tool pairs are repaired, so a call or result in it could
    never be answered or answer anything: refused, naming the block."""
    for j, block in enumerate(blocks):
        if type(block) is ToolUse or type(block) is ToolResult:
            raise MalformedContentError(
                f"{place}.content[{j}]", f"an injection may not carry a {block.type} block: nothing could pair it"
            )


def validate_injections(injections: Sequence[Injection], message_injections: Sequence[MessageInjection]) -> None:
    """Refuse audiences (B4) and malformed content in injections, before a strategy selects anything."""
    _injection_blocks(injections, message_injections)


Origin = Union[int, Source]


def place_with_origins(
    messages: Sequence[CompiledMessage],
    injections: Sequence[Injection],
    message_injections: Sequence[MessageInjection],
) -> tuple[list[CompiledMessage], list[Block], list[Origin]]:
    """``place_injections``, with where each placed message came from: its index in ``messages``,
    or the ``Source`` of the injection that made it."""
    if not injections and not message_injections:
        return list(messages), [], list(range(len(messages)))
    placed, injected = _injection_blocks(injections, message_injections)
    system_blocks: list[Block] = []
    before: list[tuple[CompiledMessage, Origin]] = []
    after: list[tuple[CompiledMessage, Origin]] = []
    for injection, blocks in zip(injections, placed):
        if injection.position == "system":
            system_blocks.extend(blocks)
            continue
        item = (
            CompiledMessage(INJECTION_PARTICIPANT_PREFIX + injection.namespace, blocks),
            Source("injection", injection.namespace),
        )
        (before if injection.position == "before_user" else after).append(item)
    n = len(messages)
    uses = [{b.id for b in m.content if type(b) is ToolUse} for m in messages]

    def clear_of_pairs(slot: int) -> int:
        # A slot between a tool_use and its tool_result retreats one message rather than cut the
        # pair (P4), as window boundaries do.
        while 0 < slot < n and any(
            type(b) is ToolResult and b.tool_use_id in uses[slot - 1] for b in messages[slot].content
        ):
            slot -= 1
        return slot

    at_depth: dict[int, list[tuple[CompiledMessage, Origin]]] = {}
    for i, (message_injection, blocks) in enumerate(zip(message_injections, injected)):
        at_depth.setdefault(clear_of_pairs(max(0, n - message_injection.depth)), []).append(
            (CompiledMessage(message_injection.participant, blocks), Source("injection", f"message_injections[{i}]"))
        )
    last_user = max((i for i, m in enumerate(messages) if m.participant.lower() == "user"), default=None)
    if last_user is None:
        before = []  # nothing to go before: dropped, as the reference does
        before_slot, after_slot = -1, n
    else:
        before_slot, after_slot = clear_of_pairs(last_user), clear_of_pairs(last_user + 1)
    out: list[CompiledMessage] = []
    origins: list[Origin] = []
    for slot in range(n + 1):
        # In one slot: what follows the user message hugs it, what precedes the next one hugs that.
        group = (after if slot == after_slot else []) + at_depth.get(slot, []) + (before if slot == before_slot else [])
        for message, origin in group:
            out.append(message)
            origins.append(origin)
        if slot < n:
            out.append(messages[slot])
            origins.append(slot)
    return out, system_blocks, origins


def place_injections(
    messages: Sequence[CompiledMessage],
    injections: Sequence[Injection] = (),
    message_injections: Sequence[MessageInjection] = (),
) -> tuple[list[CompiledMessage], list[Block]]:
    """Place injections (P3): ``system`` ones into the returned system blocks; ``before_user`` ones before the
    last "user" message (case-insensitive; dropped if none); ``after_user`` ones after it (at the end if none);
    message injections ``depth`` messages from the end. Order within a position is kept. A place
    between a tool_use and the tool_result answering it moves before the tool_use (P4).
    """
    out, system_blocks, _ = place_with_origins(messages, injections, message_injections)
    return out, system_blocks
