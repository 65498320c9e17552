"""``ContextManager``: the public handle a resident holds. It validates, then asks the actors.

A manager is bound to one branch; ``switch_branch`` and ``fork`` move only this manager (they
detach it from one namespace actor and attach it to the other branch's). Writes of messages go
to the store actor; everything the reader check guards goes through the namespace actor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import codec
from .compile import Budget, CompileResult, PreviewResult
from .content import ContentLike, Message
from .errors import (
    ManagerClosedError,
    MessageNotFoundError,
    StrategyRefusedError,
)
from .slots import Appended, SlotCache, parse_id, prepare_append
from .store.protocol import AppendItem, BranchInfo, EditItem

if TYPE_CHECKING:
    from .namespace.actor import NamespaceActor
    from .runtime import Runtime


@attrs.frozen
class MessageWindow:
    messages: tuple[Message, ...]
    start_index: int
    total_count: int


@attrs.frozen
class Derivation:
    """How a derived manager was made; plain data, round-trips through JSON (R2)."""

    parent_branch: str
    branch: str
    namespace: str
    at_sequence: int | None
    reader: str | None
    isolate: bool
    auxiliary_views: tuple[str | None, ...]


def _now_ms() -> int:
    return int(time.time() * 1000)


class ContextManager:
    """One resident's view of a namespace on a branch. Made by ``Runtime.open``.

    Every method raises ``ManagerClosedError`` once the manager (or its runtime) is closed.
    Reads of messages return them as stored (spec/audience.md A7); everything compiled is in
    the reader's view.
    """

    def __init__(
        self, runtime: Runtime, actor: NamespaceActor, *, reader: str | None, explicit_reader: str | None,
        isolate: bool, auxiliary_views: tuple[str | None, ...], derivation: Derivation | None = None,
    ) -> None:
        self._runtime = runtime
        self._actor = actor
        self._reader = reader
        self._explicit_reader = explicit_reader
        self._isolate = isolate
        self._auxiliary_views = auxiliary_views
        self.derivation = derivation
        self._closed = False

    # -- identity ---------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self._actor.namespace

    @property
    def branch(self) -> str:
        return self._actor.branch

    @property
    def view_reader(self) -> str | None:
        """The reader this manager compiles for: the one it was opened with, else the one its
        namespace records on its branch (C6, C11)."""
        return self._reader

    @property
    def strategy(self) -> Any:
        return self._actor.strategy_config

    def _open(self) -> NamespaceActor:
        if self._closed or self._runtime._closed:
            raise ManagerClosedError(
                f"the manager of namespace {self.namespace!r} on branch {self.branch!r} is closed"
            )
        return self._actor

    @property
    def _cache(self) -> SlotCache:
        return self._actor._caches[0]

    # -- messages ---------------------------------------------------------------------------

    async def add_message(
        self, participant: str, content: ContentLike, *, metadata: Mapping[str, Any] | None = None,
        caused_by: Sequence[str] = (), hold_compression: bool | float = False, timestamp_ms: int | None = None,
    ) -> str:
        """Append a message to this manager's slot; returns its id (M1).

        ``hold_compression`` True (or a timeout in seconds) keeps it and everything after it raw
        until released (T5).

        Raises:
            MalformedContentError: bad content, participant, metadata, caused_by or timestamp,
                naming the place (M6, B1); nothing is stored.
            ManagerClosedError: the manager is closed.

        If cancelled after sending, the message may still be stored; its id is lost.
        """
        actor = self._open()
        stored, blobs, appended = prepare_append(
            participant, content, metadata, caused_by, timestamp_ms, origin=actor, hold=hold_compression
        )
        operation = await self._runtime.store.ask(
            AppendItem(state=actor.config.slot, branch=actor.branch, data=stored, blobs=tuple(blobs), attachment=appended)
        )
        return str(operation.sequence)

    def _find(self, message_id: str) -> Message:
        message = self._cache.get(message_id)
        if message is None:
            raise MessageNotFoundError(
                f"no message {message_id!r} in slot {self._actor.config.slot!r} on branch {self.branch!r}"
            )
        return message

    async def edit_message(self, message_id: str, content: ContentLike) -> None:
        """Replace a message's content. Edits reach ``copy`` entries of the context log, never summaries.

        Raises:
            MessageNotFoundError: no such message in this manager's slot.
            MalformedContentError: bad content; nothing changes.
            NarrowingRefusedError: the edit would hide a block compression may have read (D1-D5).
            ReaderConflictError: the namespace records a reader this manager doesn't compile for.
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        message = self._find(message_id)
        blocks = codec.blocks_from_content(content)
        stored_blocks, blobs = codec.extract_blobs(blocks)
        data = codec.message_to_json(message.participant, stored_blocks, message.metadata, message.timestamp_ms,
                                     message.caused_by)
        appended = Appended(message.participant, blocks, message.metadata, message.timestamp_ms, message.caused_by)
        command = EditItem(state=actor.config.slot, branch=actor.branch, item_sequence=message.sequence, data=data,
                           blobs=tuple(blobs), attachment=appended)
        await actor.edit(self._reader, message, command)

    async def remove_message(self, message_id: str) -> None:
        """Remove one message. Never refused for narrowing: nothing takes a block out of a summary
        already written or a request already sent, a removal included (D1).

        Raises:
            MessageNotFoundError, ManagerClosedError.
        """
        actor = self._open()
        message = self._find(message_id)
        await actor.remove(message, message)

    async def remove_messages(self, from_id: str, to_id: str) -> None:
        """Remove the messages from ``from_id`` through ``to_id``, inclusive.

        Raises:
            MessageNotFoundError: either id is absent.
            ValueError: ``from_id`` comes after ``to_id``.
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        first, last = self._find(from_id), self._find(to_id)
        if first.sequence > last.sequence:
            raise ValueError(f"remove_messages: from_id {from_id!r} comes after to_id {to_id!r}")
        await actor.remove(first, last)

    async def get_message(self, message_id: str) -> Message | None:
        """The message as stored (every block with its audience, A7), or None.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        await trio.lowlevel.checkpoint()
        return self._cache.get(message_id)

    async def get_all_messages(self) -> Sequence[Message]:
        """Every message of this manager's slot, as stored (A7), oldest first.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        await trio.lowlevel.checkpoint()
        return tuple(self._cache.current())

    async def message_count(self) -> int:
        """How many messages this manager's slot holds on its branch.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        await trio.lowlevel.checkpoint()
        return len(self._cache.current())

    async def get_message_window(self, offset: int, limit: int) -> MessageWindow:
        """``limit`` messages from ``offset`` (negative counts from the end), as stored.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        await trio.lowlevel.checkpoint()
        messages = self._cache.current()
        total = len(messages)
        start = max(0, total + offset) if offset < 0 else min(offset, total)
        return MessageWindow(tuple(messages[start : start + max(0, limit)]), start, total)

    async def query_messages(
        self, *, participant: str | None = None, metadata: Mapping[str, Any] | None = None,
        limit: int | None = None, reverse: bool = False,
    ) -> list[Message]:
        """Messages matching ``participant`` and every dotted ``metadata`` path by equality, as stored.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        await trio.lowlevel.checkpoint()
        messages = list(self._cache.current())
        if reverse:
            messages.reverse()
        found = []
        for message in messages:
            if participant is not None and message.participant != participant:
                continue
            if metadata and not all(_dotted(message.metadata, path) == value for path, value in metadata.items()):
                continue
            found.append(message)
            if limit is not None and len(found) >= limit:
                break
        return found

    # -- compiling --------------------------------------------------------------------------

    async def compile(
        self, budget: Budget | None = None, *, injections: Sequence[Any] = (),
        message_injections: Sequence[Any] = (), dry_run: bool = False,
    ) -> CompileResult:
        """Compile this manager's context in its reader's view. Never waits for compression (P1).

        Raises:
            ReaderConflictError: the namespace records a reader this manager doesn't compile for (C8).
            MalformedContentError: an injection carries an audience or is malformed (B4).
            StrategyRefusedError: the strategy failed to start.
            OverBudgetError: even the newest message doesn't fit (windowed strategies).
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        return await actor.compile(self._reader, budget or Budget(), injections, message_injections, dry_run)

    async def preview_context(self, budget: Budget, *, message_injections: Sequence[Any] = ()) -> PreviewResult | None:
        """What a compile would spend, without committing anything; None if the strategy can't tell.

        Raises:
            ReaderConflictError, StrategyRefusedError, ManagerClosedError: as ``compile``.
            MalformedContentError: a message injection carries an audience or is malformed (B4).
        """
        actor = self._open()
        return await actor.preview(self._reader, budget, message_injections)

    async def tick(self) -> bool:
        """One unit of strategy work; True if it made progress. Compiles go on while its model call
        is out (P1).

        Raises:
            ReaderConflictError, StrategyRefusedError, ManagerClosedError: as ``compile``.

        If cancelled while the model call is out, the reply is discarded and the unit stays queued.
        """
        actor = self._open()
        return await actor.tick(self._reader)

    async def is_ready(self) -> bool:
        """Whether the strategy has no background work queued (advisory: compile never waits, P1).

        Raises:
            ReaderConflictError, ManagerClosedError: as ``compile``.
        """
        actor = self._open()
        return await actor.is_ready(self._reader)

    async def wait_ready(self) -> None:
        """Drive ``tick()`` until the strategy is ready or stops making progress (T8).

        Raises:
            ReaderConflictError, ManagerClosedError: as ``compile``.

        If cancelled, the unit of work under way is abandoned; its reply, if any, is discarded.
        """
        actor = self._open()
        await actor.drain_idle(self._reader)

    # -- holds ------------------------------------------------------------------------------

    async def hold_compression(self, message_ids: Sequence[str], *, timeout_s: float | None = None) -> None:
        """Keep these messages (and everything after the earliest) raw until released (T5).

        Unknown ids are ignored. Holds live in memory, in this namespace actor: a reopen has none.

        Raises:
            ValueError: a timeout that isn't positive and finite.
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"hold_compression: timeout_s must be a positive finite number (got {timeout_s!r})")
        await trio.lowlevel.checkpoint()
        sequences = [m.sequence for m in (self._cache.get(i) for i in message_ids) if m is not None]
        actor.place_holds(sequences, timeout_s)

    async def release_compression(self, message_ids: Sequence[str]) -> None:
        """Release holds (idempotent; unknown ids are ignored).

        Raises:
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        await trio.lowlevel.checkpoint()
        actor.release_holds([s for s in (parse_id(i) for i in message_ids) if s is not None])

    # -- branches ---------------------------------------------------------------------------

    async def list_branches(self) -> list[BranchInfo]:
        """Every live branch of the store.

        Raises:
            ManagerClosedError: the manager is closed.
        """
        self._open()
        return await self._runtime.list_branches()

    async def _move_to(self, branch: str) -> None:
        """Attach to ``branch``'s namespace actor, then detach from this one (C2: a refusal stays put)."""
        actor = self._open()
        config = attrs.evolve(actor.config, strategy=actor.strategy_config)  # set_strategy's, if it ran
        new_actor, reader = await self._runtime._attach(
            branch, config, self._explicit_reader if self._explicit_reader is not None else self._reader,
            compiles_for_none=self._reader is None,
        )
        self._runtime._detach(actor)
        self._actor, self._reader = new_actor, reader

    async def switch_branch(self, name: str) -> None:
        """Move this manager (only) to branch ``name``.

        Raises:
            BranchNotFoundError: no such branch.
            ReaderConflictError: the namespace there records another reader, or a reader where this
                manager compiles for none (C1, C7); the manager stays where it was.
            StrategyRefusedError: the strategy doesn't mark compression reads under a reader (D6).
            ManagerClosedError: the manager is closed.
        """
        self._open()
        self._runtime.engine.branch(name)
        await self._move_to(name)

    async def fork(self, name: str | None = None) -> str:
        """Branch at the head and switch this manager to it (R1); returns the branch's name.

        Raises as ``switch_branch`` does, before making the branch (C2, C7), and
        ``StrategyRefusedError`` when the strategy failed to start (C12).
        """
        actor = self._open()
        self._check_can_branch(actor)
        name = name or f"fork-{_now_ms()}-{actor.runtime.engine.last_sequence}"
        await self._runtime.create_branch(name, from_branch=actor.branch)
        await self._move_to(name)
        return name

    def _check_can_branch(self, actor: NamespaceActor) -> None:
        actor.resolve(self._reader)
        if self._reader is None and actor.record is not None:
            actor.check(None)
        actor._require_strategy()

    async def branch_at(self, message_id: str, name: str | None = None) -> str:
        """Branch at that message's sequence (the branch holds it) without switching (R1).

        Raises:
            MessageNotFoundError: no such message in this manager's slot.
            BranchExistsError: ``name`` is taken.
            ManagerClosedError: the manager is closed.
        """
        actor = self._open()
        message = self._find(message_id)
        name = name or f"branch-{_now_ms()}-{message.sequence}"
        await self._runtime.create_branch(name, from_branch=actor.branch, at_sequence=message.sequence)
        return name

    async def derive(
        self, *, branch: str, strategy: Any = None, at_sequence: int | None = None, model: Any = None
    ) -> ContextManager:
        """A child manager on a new branch holding this namespace's states but not its queues,
        holds or in-flight work (R2, C11, C12).

        Raises:
            ManagerClosedError: this manager is closed (nothing is written).
            StrategyRefusedError: this manager's strategy failed to start, or the child's strategy
                doesn't mark compression reads under a reader (D6).
            ReaderConflictError: the head records another reader, or a record that isn't a name (C11).
            BranchExistsError: ``branch`` is taken.
        """
        return await self._runtime._derive(self, branch=branch, strategy=strategy, at_sequence=at_sequence,
                                           model=model)

    async def set_strategy(self, strategy: Any) -> None:
        """Replace the namespace's strategy (for every manager on it).

        Raises:
            StrategyRefusedError: it doesn't mark compression reads under a reader; the old one stays (D6).
            ReaderConflictError: as for ``compile``.
        """
        actor = self._open()
        await actor.set_strategy(self._reader, strategy)

    # -- summaries --------------------------------------------------------------------------

    async def search_summaries(
        self, *, text: str | None = None, regex: str | None = None, levels: Sequence[int] | None = None,
        limit: int = 50, include_merged: bool = False,
    ) -> list[Any]:
        """Summaries matching ``text`` or ``regex`` ([] for a strategy without summaries). Checked (C10).

        Raises:
            ReaderConflictError, ManagerClosedError: as ``compile``.
            re.error: an invalid ``regex``.
        """
        result = await self._open().call(self._reader, "search_summaries", text=text, regex=regex, levels=levels,
                                          limit=limit, include_merged=include_merged)
        return [] if result is None else result

    async def get_summaries_in_range(
        self, *, from_ms: int | None = None, to_ms: int | None = None, level: int | None = None
    ) -> list[Any]:
        """Summaries whose messages' timestamps overlap [from_ms, to_ms], oldest first. Checked (C10).

        Raises:
            ReaderConflictError, ManagerClosedError: as ``compile``.
        """
        result = await self._open().call(self._reader, "get_summaries_in_range", from_ms=from_ms, to_ms=to_ms,
                                          level=level)
        return [] if result is None else result

    async def get_summary(self, summary_id: str) -> Any:
        """One summary by id, or None (None too for a strategy without summaries). Checked (C10).

        Raises:
            ReaderConflictError, ManagerClosedError: as ``compile``.
        """
        return await self._open().call(self._reader, "get_summary", summary_id)

    async def reset_head_window(self, transition_text: str | None = None) -> str:
        """Start a new head window at a topic-transition message; returns its id (T6).

        Raises:
            StrategyRefusedError: the strategy has no head window.
            ModelError: no transition text was given and the model made none.
            NarrowingRefusedError, ReaderConflictError, ManagerClosedError: as ``compile``.
        """
        actor = self._open()
        if getattr(actor.strategy, "reset_head_window", None) is None:
            raise StrategyRefusedError(f"strategy {actor.strategy.name!r} does not support head window reset")
        return await actor.call(self._reader, "reset_head_window", transition_text)

    # -- live settings ----------------------------------------------------------------------

    def set_tool_definitions(self, tools: Sequence[Mapping[str, Any]]) -> None:
        if tools:
            self._open().tools = tuple(tools)

    def set_system_prompt(self, text: str | None) -> None:
        if text:
            self._open().system_prompt = text

    async def aclose(self) -> None:
        """Close this manager (idempotent); the namespace actor stops with its last manager. Never raises."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._runtime._detach(self._actor)
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ContextManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _dotted(metadata: Mapping[str, Any] | None, path: str) -> Any:
    value: Any = metadata
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()
