"""Entries -> request messages (spec/core.md P2-P7; REF §3.6, §4.7). Pure and synchronous.

A strategy's ``select`` returns entries; ``build_compile_result`` turns them into compiled
messages: mixed tool messages split, cache markers placed, tool pairs repaired, injections
placed, provenance attached. ``CompileResult.to_anthropic`` gives a request body the
``anthropic`` SDK accepts as is; ``to_openai_chat`` and ``to_openai_responses`` the ``openai``
SDK's two forms.
"""

from __future__ import annotations

import hashlib
import operator
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, Union

import attrs

from . import checks
from .anthropic_rules import violations
from .codec import to_jsonable
from .content import (
    Block,
    CompiledMessage,
    ContentLike,
    Document,
    Image,
    Message,
    RedactedThinking,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
)
from .errors import EmptyRequestError, InvalidRequestError, MalformedContentError
from .openai_rules import violations as openai_violations
from .openai_wire import OpenAIBody, SystemRole, to_chat_messages, to_responses_input
from .tokens import estimate_blocks
from .validation import blocks_from_content, find_audience, validate_participant
from .wire import to_anthropic_messages

MAX_MESSAGE_BREAKPOINTS = 3  # one of the provider's 4 is left for the host
INJECTION_PARTICIPANT_PREFIX = "system_context:"
Position = Literal["system", "before_user", "after_user"]
POSITIONS: tuple[str, ...] = ("system", "before_user", "after_user")


Relation = Literal["copy", "derived", "referenced"]


@attrs.frozen
class Entry:
    """One selected piece of context, before compile turns it into request messages.

    ``source_ids`` name the stored messages it carries (raw, for ``copy``) or summarises;
    ``summary_ids`` name the summaries a ``derived`` entry shows.
    """

    participant: str
    content: tuple[Block, ...]
    source_ids: tuple[str, ...] = ()
    relation: Relation = "copy"
    summary_ids: tuple[str, ...] = ()
    cache_marker: bool = False


def non_negative_int(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a non-negative int (not a bool), the field named in the error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative integer, got {checks.shown(value)}")


def _token_count(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # bool is an int to Python, but Budget(max_tokens=True) is a mistake, not one token.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Budget {attribute.name} must be an int (a number of tokens), "
                         f"not {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"Budget {attribute.name} must not be negative, got {checks.shown(value)}")


@attrs.frozen
class Budget:
    """What a compile may spend: strategies fit into ``usable`` tokens (P2).

    Raises:
        ValueError: ``max_tokens`` or ``reserve_for_response`` is not an int, is a bool or is
            negative (the message names the field), or ``max_tokens`` doesn't exceed
            ``reserve_for_response``, which would leave no room for any context.
    """

    max_tokens: int = attrs.field(default=100_000, validator=_token_count)
    reserve_for_response: int = attrs.field(default=4_000, validator=_token_count)

    def __attrs_post_init__(self) -> None:
        # A budget with no room compiles to an empty request, which looks like a bug elsewhere
        # (every message "dropped"); refusing it here says what is wrong where it was made.
        if self.max_tokens <= self.reserve_for_response:
            raise ValueError(
                f"Budget max_tokens {self.max_tokens:,} with reserve_for_response {self.reserve_for_response:,} "
                f"leaves no room for context: max_tokens must exceed reserve_for_response "
                f"(4,000 unless given); raise max_tokens or lower reserve_for_response"
            )

    @property
    def usable(self) -> int:
        return self.max_tokens - self.reserve_for_response


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


@attrs.frozen
class Source:
    """Where a compiled message came from; ``complete`` is set for raw message bodies only (P6)."""

    kind: Literal["message", "summary", "injection"]
    id: str
    complete: bool | None = None


@attrs.frozen
class Provenance:
    """Which stored messages and summaries each compiled message came from, in the reader's view (P6, A4)."""

    compile_id: str
    namespace: str
    branch: str
    reader: str | None
    strategy: str
    messages: tuple[tuple[Source, ...], ...]  # parallel to CompileResult.messages
    raw_bodies: Mapping[str, Message]
    completeness: Mapping[str, bool]


@attrs.frozen
class CompileResult:
    """A compile's messages, system injections and provenance.

    ``stable_prefix_tokens`` (P9): the estimated tokens of the longest prefix of this compile's
    messages that is byte-identical (participants and blocks; the breakpoints themselves aside) to
    a prefix of the previous compile of the same namespace actor and reader view ending at one of
    that compile's cache breakpoints: what the prompt cache the previous request wrote can serve.
    0 for a first compile or when nothing up to a previous breakpoint stayed the same.
    """

    messages: list[CompiledMessage]
    system_injections: list[Block]
    provenance: Provenance
    stable_prefix_tokens: int = 0

    def to_anthropic(
        self, *, assistant: str | Collection[str], system: str | None = None, strict: bool = False
    ) -> dict[str, Any]:
        """``{"system"?, "messages"}`` for ``anthropic.AsyncAnthropic().messages.create(**body, model=..., max_tokens=...)`` (P7, P8).

        Participants in ``assistant`` speak as the assistant, everyone else as the user.

        Raises:
            EmptyRequestError: no message is left to send (P8): the slot is empty in the
                reader's view, the strategy selected nothing (the newest message alone exceeds
                the budget), or nothing selected is sendable (blank text, another's thinking).
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.anthropic_rules`` (a bug in ctxrt: every body should satisfy P8).
        """
        body: dict[str, Any] = {}
        text = self._system_text(system)
        if text:
            body["system"] = text
        body["messages"] = to_anthropic_messages(self.messages, assistant)
        if not body["messages"]:
            self._refuse_empty("the Messages API", "blank text, or thinking outside the assistant's turns")
        if strict:
            found = violations(body)
            if found:
                raise InvalidRequestError(found)
        return body

    def to_openai_chat(
        self, *, assistant: str | Collection[str], system: str | None = None,
        system_role: SystemRole = "system", alternate_roles: bool = False, strict: bool = False,
    ) -> OpenAIBody:
        """``{"messages"}`` for ``openai.AsyncOpenAI().chat.completions.create(**body, model=...)`` (P10, P11).

        Participants in ``assistant`` speak as the assistant (their tool calls as ``tool_calls``),
        everyone else as the user (with ``name``, but for "user"). ``system`` and system
        injections lead as one ``system_role`` message ("system" or "developer"). With
        ``alternate_roles``, runs of one role merge and the first turn is the user's, for servers
        whose chat templates demand it. What the form can't carry is counted in the body's
        ``left_out`` and ``as_text`` (docs/api.md).

        Raises:
            EmptyRequestError: no message is left to send but the system one (P10), as for
                ``to_anthropic``.
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.openai_rules`` (a bug in ctxrt: every body should satisfy P11).
        """
        text = self._system_text(system)
        messages, left_out, as_text = to_chat_messages(self.messages, assistant, system=text, system_role=system_role,
                                                       alternate_roles=alternate_roles)
        if len(messages) == (1 if text else 0):
            self._refuse_empty("Chat Completions", "blank text or thinking only")
        return self._checked(OpenAIBody({"messages": messages}, left_out, as_text), strict, "chat")

    def to_openai_responses(
        self, *, assistant: str | Collection[str], system: str | None = None, strict: bool = False
    ) -> OpenAIBody:
        """``{"instructions"?, "input"}`` for ``openai.AsyncOpenAI().responses.create(**body, model=...)`` (P10, P11).

        Participants in ``assistant`` speak as the assistant (their tool calls as
        ``function_call`` items), everyone else as the user; ``system`` and system injections
        are the ``instructions``. What the form can't carry is counted in the body's
        ``left_out`` and ``as_text`` (docs/api.md).

        Raises:
            EmptyRequestError: no input item is left to send (P10), as for ``to_anthropic``.
            InvalidRequestError: with ``strict=True``, the body breaks a rule of
                ``ctxrt.openai_rules`` (a bug in ctxrt: every body should satisfy P11).
        """
        items, left_out, as_text = to_responses_input(self.messages, assistant)
        if not items:
            self._refuse_empty("the Responses API", "blank text or thinking only")
        text = self._system_text(system)
        body = {"instructions": text, "input": items} if text else {"input": items}
        return self._checked(OpenAIBody(body, left_out, as_text), strict, "responses")

    def _system_text(self, system: str | None) -> str:
        """The host's system prompt and the system injections' text, blank ones left out (the APIs refuse them)."""
        texts = [system] if system and system.strip() else []
        texts += [b.text for b in self.system_injections if isinstance(b, Text) and b.text.strip()]
        return "\n\n".join(texts)

    def _refuse_empty(self, api: str, unsendable: str) -> None:
        if not self.messages:
            why = ("the compile selected no message: the slot is empty in this reader's view, or the "
                   "newest message alone exceeds the budget (raise Budget.max_tokens, or set the "
                   "strategy's max_message_tokens)")
        else:
            why = f"none of the {len(self.messages)} compiled message(s) holds a block the API accepts ({unsendable})"
        raise EmptyRequestError(
            f"no request to send for {self.provenance.namespace!r} on {self.provenance.branch!r}: {why}; "
            f"{api} refuses an empty message list"
        )

    @staticmethod
    def _checked(body: OpenAIBody, strict: bool, api: Literal["chat", "responses"]) -> OpenAIBody:
        if strict:
            found = openai_violations(body, api=api)
            if found:
                raise InvalidRequestError(found, api="Chat Completions" if api == "chat" else "Responses API")
        return body


@attrs.frozen
class PreviewResult:
    fits: bool
    final_tokens: int
    budget_tokens: int
    head_tokens: int
    tail_tokens: int
    middle_tokens: int


# --------------------------------------------------------------------------------------------
# Tool messages (P4; REF §4.7)
# --------------------------------------------------------------------------------------------


def split_mixed_tool_messages(participant: str, content: Sequence[Block]) -> list[tuple[str, tuple[Block, ...]]]:
    """Split a non-"user" message holding tool_results: each run of tool_results becomes a "user" part.

    Blocks before and after a run stay with ``participant``, in order.
    """
    if participant.lower() == "user" or not any(type(b) is ToolResult for b in content):
        return [(participant, tuple(content))]
    parts: list[tuple[str, tuple[Block, ...]]] = []
    run: list[Block] = []
    run_is_results = False
    for block in content:
        is_result = type(block) is ToolResult
        if run and is_result != run_is_results:
            parts.append(("user" if run_is_results else participant, tuple(run)))
            run = []
        run.append(block)
        run_is_results = is_result
    parts.append(("user" if run_is_results else participant, tuple(run)))
    return parts


def _tool_ids(message: CompiledMessage) -> tuple[frozenset[str], frozenset[str]] | None:
    """(tool_use ids, tool_result ids) of a message, or None if it holds no tool block."""
    if not any(type(b) is ToolUse or type(b) is ToolResult for b in message.content):
        return None
    uses = frozenset(b.id for b in message.content if type(b) is ToolUse)
    results = frozenset(b.tool_use_id for b in message.content if type(b) is ToolResult)
    return (uses, results) if uses or results else None


_NO_TOOLS: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())


def _repair_tool_pairing(
    messages: Sequence[CompiledMessage],
    tools: Sequence[tuple[frozenset[str], frozenset[str]] | None] | None = None,
) -> tuple[list[CompiledMessage], list[int]]:
    """``tools`` (parallel to ``messages``, from ``_tool_ids``) spares recomputing what a memo knows."""
    if tools is None:
        tools = [_tool_ids(m) for m in messages]
    if not any(tools):
        return messages, range(len(messages))  # type: ignore[return-value]  # nothing to repair; callers only read them
    out: list[CompiledMessage] = []
    origins: list[int] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        own = tools[i]
        if own is None:
            out.append(message)
            origins.append(i)
            continue
        answered = (tools[i + 1] or _NO_TOOLS)[1] if i < last else frozenset()
        asked = (tools[i - 1] or _NO_TOOLS)[0] if i > 0 else frozenset()
        if own[0] <= answered and own[1] <= asked:
            out.append(message)
            origins.append(i)
            continue
        kept = tuple(
            b
            for b in message.content
            if not (type(b) is ToolUse and b.id not in answered)
            and not (type(b) is ToolResult and b.tool_use_id not in asked)
        )
        if not kept:
            if message.cache_breakpoint and out:  # the cached prefix still ends here
                out[-1] = attrs.evolve(out[-1], cache_breakpoint=True)
            continue
        out.append(attrs.evolve(message, content=kept))
        origins.append(i)
    return out, origins


def repair_tool_pairing(messages: Sequence[CompiledMessage]) -> list[CompiledMessage]:
    """Drop every tool_use not answered in the next message and every tool_result not asked in the previous one (P4).

    A message left empty is dropped (its cache breakpoint moves to the message before it).
    Kept pairs stay adjacent: both halves of a pair keep each other.
    """
    return _repair_tool_pairing(messages)[0]


# --------------------------------------------------------------------------------------------
# Cache breakpoints (P5)
# --------------------------------------------------------------------------------------------


def apply_cache_breakpoints(
    messages: Sequence[CompiledMessage], *, limit: int = MAX_MESSAGE_BREAKPOINTS, marked: list[int] | None = None
) -> list[CompiledMessage]:
    """Keep at most ``limit`` breakpoints: the first (the head window's end) and the last ones (P5)."""
    marked = [i for i, m in enumerate(messages) if m.cache_breakpoint] if marked is None else marked
    if len(marked) <= limit:
        return messages if isinstance(messages, list) else list(messages)
    keep = set(marked[:1] + marked[len(marked) - (limit - 1) :]) if limit > 0 else set()
    return [
        attrs.evolve(m, cache_breakpoint=False) if m.cache_breakpoint and i not in keep else m
        for i, m in enumerate(messages)
    ]


# --------------------------------------------------------------------------------------------
# Injections (P3, B4)
# --------------------------------------------------------------------------------------------


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


def _place_injections(
    messages: Sequence[CompiledMessage],
    injections: Sequence[Injection],
    message_injections: Sequence[MessageInjection],
) -> tuple[list[CompiledMessage], list[Block], list[Origin]]:
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
        before = []  # nothing to go before: dropped, as the reference does (REF §9 item 10)
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
    out, system_blocks, _ = _place_injections(messages, injections, message_injections)
    return out, system_blocks


# --------------------------------------------------------------------------------------------
# Provenance (P6)
# --------------------------------------------------------------------------------------------


def _covers(rendered: Block, stored: Block) -> bool:
    kind = type(stored)
    if type(rendered) is not kind:
        return False
    if type(stored) is Text and type(rendered) is Text:
        return stored.text in rendered.text  # a prefixed header is fine
    if type(stored) is Thinking and type(rendered) is Thinking:
        return rendered.thinking == stored.thinking and rendered.signature == stored.signature
    if type(stored) is RedactedThinking and type(rendered) is RedactedThinking:
        return rendered.data == stored.data
    if type(stored) is Image and type(rendered) is Image:
        return rendered.source == stored.source
    if type(stored) is Document and type(rendered) is Document:
        return rendered.source == stored.source and rendered.title == stored.title
    if type(stored) is ToolUse and type(rendered) is ToolUse:
        return (rendered.id, rendered.name, rendered.input) == (stored.id, stored.name, stored.input)
    if type(stored) is ToolResult and type(rendered) is ToolResult:
        if rendered.tool_use_id != stored.tool_use_id or rendered.is_error != stored.is_error:
            return False
        r, s = rendered.content, stored.content
        if isinstance(s, str) or isinstance(r, str):
            return isinstance(r, str) and isinstance(s, str) and s in r
        return coverage_complete(r, s)
    return False


def coverage_complete(rendered_blocks: Sequence[Block], stored_blocks: Sequence[Block]) -> bool:
    """Whether every stored block is carried unaltered, in order, by the rendered blocks (P6, REF §3.6).

    Text is covered by a rendered text that contains it (empty stored text is ignored); media by
    an exactly equal source; tool blocks by id, name and input; thinking byte for byte.
    """
    j = 0
    for stored in stored_blocks:
        if type(stored) is Text and not stored.text:
            continue
        while j < len(rendered_blocks) and not _covers(rendered_blocks[j], stored):
            j += 1
        if j == len(rendered_blocks):
            return False
        if type(stored) is not Text:  # one rendered text may carry several stored texts (joined shards)
            j += 1
    return True


class _Prepared:
    """One entry made ready to compile: its parts, their tool ids, its sources and raw bodies."""

    __slots__ = ("bodies", "entry", "parts", "sources", "tools")

    def __init__(self, entry: Entry, index: int, lookup: Callable[[str], Message | None]) -> None:
        raw = entry.relation == "copy"
        self.bodies = tuple((sid, lookup(sid)) for sid in entry.source_ids) if raw else ()
        # A body from the reader's view carries no audience: only other content needs the walk.
        if not (len(self.bodies) == 1 and self.bodies[0][1] is not None and entry.content is self.bodies[0][1].content):
            where = find_audience(entry.content, path=f"entries[{index}].content")
            if where is not None:  # the strategy handed over a block outside the reader's view
                raise MalformedContentError(where, "a compiled entry may not carry an audience (spec/audience.md B3, A8)")
        self.entry = entry
        split = split_mixed_tool_messages(entry.participant, entry.content)
        self.parts = [
            CompiledMessage(participant, content, cache_breakpoint=entry.cache_marker and k == len(split) - 1)
            for k, (participant, content) in enumerate(split)
        ]
        self.tools = [_tool_ids(part) for part in self.parts]
        rendered = [block for part in self.parts for block in part.content]
        self.sources = tuple(
            Source("message", sid, body is not None and _complete(rendered, entry.content, body)) if raw
            else Source("message", sid)
            for sid, body in (self.bodies or ((sid, None) for sid in entry.source_ids))
        ) + tuple(Source("summary", sid) for sid in entry.summary_ids)


def _complete(rendered: Sequence[Block], content: Sequence[Block], body: Message) -> bool:
    # An entry carrying the reader's view of the message untouched is complete without a walk.
    if content is body.content or content == body.content:
        return True
    return coverage_complete(rendered, body.content)


class CompileMemo:
    """Entries prepared by earlier compiles, kept by identity: a strategy that hands back the
    same ``Entry`` objects (as the bundled ones do for unchanged messages) pays for each once,
    and a compile whose entries start as the last one's did reuses that stretch whole."""

    def __init__(self) -> None:
        self._prepared: dict[int, _Prepared] = {}
        self._entries: list[Entry] = []
        self._messages: list[CompiledMessage] = []
        self._tools: list[tuple[frozenset[str], frozenset[str]] | None] = []
        self._owners: list[_Prepared] = []
        self._ends: list[int] = []  # _ends[i]: messages made from entries[:i + 1]
        self.marked = False  # whether any part made so far carries a cache breakpoint
        # P9: a chained fingerprint per compiled message (of the system blocks and every message up
        # to it), reused where a compile's messages are the last one's objects, and the last
        # compile's breakpoint positions; so a warm compile pays for what changed, not the slot.
        self._system: bytes = b""
        self._chained: list[CompiledMessage] = []
        self._chain: list[bytes] = []
        self._totals: list[int] = []  # _totals[i]: estimated tokens of messages[:i + 1]
        self._breaks: list[int] = []

    def stable_prefix(self, messages: Sequence[CompiledMessage], system_blocks: Sequence[Block]) -> int:
        """P9: tokens of the longest prefix of ``messages`` identical (markers aside) to a prefix of
        the last compile's that ended at one of its breakpoints (what the cache that request wrote
        can serve). Remembers this compile's for the next one."""
        if not self.marked and not self._breaks:
            return 0  # no breakpoint now nor last time: nothing was or will be cached
        system = hashlib.blake2b(repr(to_jsonable(list(system_blocks))).encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()
        old_chain, old_breaks = self._chain, self._breaks
        if system != self._system:
            start = 0
        else:
            same = list(map(operator.is_, messages, self._chained))  # C speed: the unchanged stretch
            start = same.index(False) if False in same else len(same)
        chain, totals = old_chain[:start], self._totals[:start]
        fingerprint, total = (chain[-1], totals[-1]) if start else (system, 0)
        breaks = [i for i in old_breaks if i < start]
        for index in range(start, len(messages)):
            message = messages[index]
            content = repr((message.participant, to_jsonable(list(message.content)))).encode("utf-8", "surrogatepass")
            fingerprint = hashlib.blake2b(fingerprint + content, digest_size=16).digest()
            total += estimate_blocks(message.content)
            chain.append(fingerprint)
            totals.append(total)
            if message.cache_breakpoint:
                breaks.append(index)
        stable = max((totals[i] for i in old_breaks if i < len(chain) and i < len(old_chain)
                      and chain[i] == old_chain[i]), default=0)
        self._system, self._chained, self._chain, self._totals, self._breaks = (
            system, list(messages), chain, totals, breaks)
        return stable

    def parts(
        self, entries: Sequence[Entry], lookup: Callable[[str], Message | None]
    ) -> tuple[list[CompiledMessage], list[tuple[frozenset[str], frozenset[str]] | None], list[_Prepared]]:
        """The compiled parts of ``entries``, their tool ids and the prepared entry each came from."""
        previous = self._entries
        if len(entries) >= len(previous) and entries[: len(previous)] == previous:
            shared = len(previous)  # the usual warm compile: the last entries, then new ones (C-speed check)
        else:
            # Up to the first entry that differs (a moved tail breakpoint, a new summary): equal
            # entries carry equal parts, so only what follows is prepared again.
            same = list(map(operator.is_, entries, previous))
            shared = same.index(False) if False in same else len(same)
            while shared < len(same) and entries[shared] == previous[shared]:
                shared += 1
        end = self._ends[shared - 1] if shared else 0
        messages, tools, owners = self._messages[:end], self._tools[:end], self._owners[:end]
        ends = self._ends[:shared]
        old_ends = self._ends
        for i in range(shared, len(entries)):
            entry = entries[i]
            if i < len(previous) and (entry is previous[i] or entry == previous[i]):
                # Past a changed entry (an edit inside the window) the rest is often as it was:
                # equal entries carry equal parts, even where a strategy made them anew.
                first, last = old_ends[i - 1] if i else 0, old_ends[i]
                messages += self._messages[first:last]
                tools += self._tools[first:last]
                owners += self._owners[first:last]
            elif entry.content:
                prepared = self.prepare(entry, i, lookup)
                messages += prepared.parts
                tools += prepared.tools
                owners += [prepared] * len(prepared.parts)
                self.marked = self.marked or prepared.entry.cache_marker
            ends.append(len(messages))
        self._entries, self._messages, self._tools, self._owners, self._ends = (
            list(entries), messages, tools, owners, ends
        )
        self.retain_only(entries)
        return messages, tools, owners

    def prepare(self, entry: Entry, index: int, lookup: Callable[[str], Message | None]) -> _Prepared:
        found = self._prepared.get(id(entry))
        if found is None or found.entry is not entry:
            found = self._prepared[id(entry)] = _Prepared(entry, index, lookup)
        return found

    def retain_only(self, entries: Sequence[Entry]) -> None:
        """Forget entries no longer compiled, once the memo has grown well past what is in use."""
        if len(self._prepared) > 2 * len(entries) + 1024:
            live = {id(entry) for entry in entries}
            self._prepared = {key: value for key, value in self._prepared.items() if key in live}


_SOURCES = operator.attrgetter("sources")


class _Lazy(Mapping[str, Any]):
    """A mapping built on first use: most hosts never read a compile's raw bodies."""

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build: Callable[[], dict[str, Any]] | None = build
        self._data: dict[str, Any] = {}

    def _loaded(self) -> dict[str, Any]:
        if self._build is not None:
            self._data, self._build = self._build(), None
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._loaded()[key]

    def __iter__(self) -> Any:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return repr(self._loaded())


def build_compile_result(
    entries: Sequence[Entry],
    *,
    namespace: str,
    branch: str,
    reader: str | None,
    strategy_name: str,
    lookup: Callable[[str], Message | None],
    injections: Sequence[Injection] = (),
    message_injections: Sequence[MessageInjection] = (),
    compile_id: str | None = None,
    memo: CompileMemo | None = None,
) -> CompileResult:
    """Entries -> CompileResult: split, cache markers, tool pairing, injections, provenance (P3-P6).

    ``lookup(id)`` returns a stored message as the reader sees it, or None. With a ``memo``,
    entries seen by an earlier compile are not prepared again.
    """
    memo = memo or CompileMemo()
    messages, tools, owners = memo.parts(entries, lookup)
    repaired, kept = _repair_tool_pairing(messages, tools)
    # A message the repair changed no longer carries its body whole: judge those bodies again.
    altered: set[int] = set()
    if repaired is not messages:
        altered = {id(owners[k]) for k, message in zip(kept, repaired) if message is not messages[k]}
        if len(kept) < len(messages):
            altered |= {id(owners[k]) for k in set(range(len(messages))) - set(kept)}
    sources_of: dict[int, tuple[Source, ...]] = {}
    if altered:
        rendered: dict[str, list[Block]] = {}
        for k, message in zip(kept, repaired):
            if id(owners[k]) in altered:
                for sid, _ in owners[k].bodies:
                    rendered.setdefault(sid, []).extend(message.content)
        for prepared in {id(o): o for o in owners if id(o) in altered}.values():
            sources_of[id(prepared)] = tuple(
                attrs.evolve(source, complete=body is not None and coverage_complete(rendered.get(source.id, []), body.content))
                if source.complete is not None else source
                for source, (_, body) in zip(prepared.sources, prepared.bodies + ((None, None),) * len(prepared.sources))
            )
    marks = [i for i, k in enumerate(kept) if messages[k].cache_breakpoint] if memo.marked else []
    repaired = apply_cache_breakpoints(repaired, marked=marks if repaired is messages else None)
    placed, system_blocks, origins = _place_injections(repaired, injections, message_injections)
    if not sources_of and len(kept) == len(owners) and len(origins) == len(owners):
        per_message = tuple(map(_SOURCES, owners))  # nothing moved: one source tuple per part, as prepared
    else:
        per_message = tuple(
            (origin,) if isinstance(origin, Source)
            else sources_of.get(id(owners[kept[origin]]), owners[kept[origin]].sources)
            for origin in origins
        )
    used = owners  # bodies() dedupes by id as it builds

    def bodies() -> dict[str, Message]:
        return {sid: body for prepared in used for sid, body in prepared.bodies if body is not None}

    def completeness() -> dict[str, bool]:
        found: dict[str, bool] = {}
        for sources in per_message:
            for source in sources:
                if source.complete is not None:
                    found[source.id] = found.get(source.id, True) and source.complete
        return found

    provenance = Provenance(
        compile_id=compile_id or str(uuid.uuid4()),
        namespace=namespace,
        branch=branch,
        reader=reader,
        strategy=strategy_name,
        messages=per_message,
        raw_bodies=_Lazy(bodies),
        completeness=_Lazy(completeness),
    )
    final = placed if placed is not messages else list(placed)
    return CompileResult(final, system_blocks, provenance, memo.stable_prefix(final, system_blocks))
