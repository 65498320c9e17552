"""``ContextManager``: the public handle a resident holds. It validates, then asks the actors.

A manager is bound to one branch incarnation; ``switch_branch`` and ``fork`` move only this
manager (they attach it to the other branch's namespace actor, then detach it from this one);
``switch_managers`` (``Runtime.switch_branch``) moves all of a runtime's managers on a branch at once.
Messages are written through the store actor; everything the reader check guards goes through
the namespace actor, in its mailbox order. Once its branch is deleted, every call raises
``BranchNotFoundError`` (L5). What a move, fork or derive does past validating is
in ``branching.py``; a subscription's event stream is in ``subscriptions.py``.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import attrs
import trio

from . import branching, channels, checks, request_ledger, tracing
from . import host_state as host_states
from .content import validation
from .content.blobs import extract_blobs
from .branching import Derivation
from .compile.result import CompileResult
from .compile.injections import Injection, MessageInjection
from .budget import Budget, PreviewResult
from .content.blocks import Block, ContentLike, Message, content_for_reader
from .errors import (
    BranchNotFoundError,
    ConfigConflictError,
    LedgerOffError,
    ManagerClosedError,
    MessageNotFoundError,
    ReaderConflictError,
    StoreUnavailableError,
    StrategyRefusedError,
)
from .events import MessageEvent, QuarantineAlarm
from .models.model import Model
from .models.model_types import DEFAULT_ASSISTANT, Usage
from .namespace import states
from .namespace.protocol import (
    AppendAndHold,
    CheckReady,
    Compile,
    CompileMetadata,
    CompressionHold,
    DescribeCompile,
    FindMaxSummaryLevel,
    Detach,
    Edit,
    GetSummary,
    Hold,
    Inspect,
    ListPins,
    NamespaceHealth,
    NamespaceSnapshot,
    PinRange,
    Preview,
    QuerySummaries,
    Release,
    Remove,
    ReportHealth,
    ResetHeadWindow,
    ReportAnchor,
    ReportHolds,
    RetryQuarantined,
    SearchSummaries,
    SetAnchor,
    SetStrategy,
    SetSystemPrompt,
    SetTools,
    SummariesInRange,
    Tick,
    Unpin,
    UpdateContextSettings,
)
from .namespace.ref import NamespaceRef
from .namespace.registry import NOTHING_TAKEN, NamespaceRegistry
from .queries import ChannelTokens, MessageQuery
from .slots import SlotCache, decode_stored, parse_id, prepare_append
from .request_ledger import RebuiltRequest, RequestRecord, RequestUsage
from .store.protocol import AppendItem, Atomically, BranchInfo, BranchSwitched, RecordSwitch, RegisterState
from .store.protocol import describe_branches
from .store.protocol import append_after, append_result
from .store.records import BranchRow, Item
from .strategies import settings
from .strategies.base import Pin, RenderStats, Strategy, StrategyConfig
from .strategies.settings import ContextSettings
from .subscriptions import POLL_INTERVAL_S, subscription

if TYPE_CHECKING:
    from .strategies.records import Summary, SummaryMatch


logger = logging.getLogger("ctxrt.manager")

CLOSE_WAIT_S = 10.0
REBUILD_READS = 8  # messages rebuild_request reads between two schedule points (~1 ms on LMDB)
LEDGER_WAITING = 64  # request records waiting for a write to ride with: at this many they commit by themselves  # how long aclose waits for its namespace actor to take the detach


@attrs.frozen
class MessageWindow:
    messages: tuple[Message, ...]
    start_index: int
    total_count: int


class ContextManager:
    """One resident's view of a namespace on a branch. Made by ``Runtime.open``.

    Every method raises ``ManagerClosedError`` once the manager (or its runtime) is closed, and
    ``BranchNotFoundError`` once its branch is deleted. Reads of messages return them as stored
    (A7); everything compiled is in the reader's view. A call cancelled after
    it reached the namespace actor is still carried out whole; only its answer is lost (L4).

    Every async method but ``switch_branch``, ``list_branches`` and ``aclose`` first follows a
    switch of its branch that another runtime recorded since this manager was bound there (R4),
    raising what ``switch_branch`` raises (``ReaderConflictError``, ``StrategyRefusedError``,
    ``BranchNotFoundError``) when it can't.
    """

    def __init__(
        self, registry: NamespaceRegistry, ref: NamespaceRef, token: int, *, reader: str | None,
        explicit_reader: str | None, isolate: bool, auxiliary_views: tuple[str | None, ...],
        derivation: Derivation | None = None,
    ) -> None:
        self._registry = registry
        self._ref = ref
        self._token = token
        self._reader = reader
        self._explicit_reader = explicit_reader
        self._isolate = isolate
        self._auxiliary_views = auxiliary_views
        self.derivation = derivation
        self._closed = False
        self._moving = trio.Lock()  # one move (switch, fork) of this manager at a time
        # Its branch's count of recorded switches when it was bound there: later ones it follows (R4).
        self._seen = _switches(registry, ref.branch_id)
        self._subscriptions: set[Callable[[], None]] = set()  # each open subscription's end
        self._budgets: dict[str, int | None] = {}  # the last compile's id -> its budget (record_request's)
        registry.managers.add(self)

    # -- identity ---------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self._ref.namespace

    @property
    def branch(self) -> str:
        return self._ref.branch_name

    @property
    def store_path(self) -> Path | str:
        """The store this manager's runtime opened: its ``Runtime.path`` (a directory, or a
        database URL without its password), so an adapter can name it in a config."""
        return self._registry.store_path

    @property
    def view_reader(self) -> str | None:
        """The reader this manager compiles for: the one it was opened with, else the one its
        namespace records on its branch (C6, C11)."""
        return self._reader

    @property
    def strategy(self) -> StrategyConfig | Strategy:
        """The strategy config the namespace runs (``set_strategy`` by any of its managers changes it),
        or the ``Strategy`` instance it was given."""
        return self._ref.status.strategy_config

    def _live(self) -> NamespaceRef:
        if self._closed or self._registry.closed:
            raise ManagerClosedError(f"the manager of namespace {self.namespace!r} on branch {self.branch!r} is closed")
        ref = self._ref
        if ref.retired is None and self._registry.store is None and self._registry.engine.branch_deleted(ref.branch_id):
            # A read-only runtime hears of no deletion (the writer may be another process): it asks.
            self._registry.retire_branch(ref.branch_id, ref.branch_name)
        retired = ref.retired
        if retired is not None:
            raise retired()
        return ref

    def _slot(self) -> SlotCache:
        slot = self._live().status.slot
        assert slot is not None  # set before the actor answered the attach that made this manager
        return slot

    async def _followed(self) -> NamespaceRef:
        """This manager's namespace ref, once it has followed every switch of its branch recorded in
        the store (by any runtime, ``Runtime.switch_branch``) since it was bound there (R4): a
        switch it hasn't seen moves it as its own ``switch_branch`` would, before the call runs."""
        ref = self._live() if self._closed or self._registry.closed else self._ref
        engine = self._registry.engine
        branch_id, seen = ref.branch_id, self._seen
        try:
            # Hops to each later switch's target; each record followed was made after the one before
            # it, so the walk ends (a switch back included: the target's count then is what was seen).
            while (row := engine.fresh_branch(branch_id)) is not None and row.switches > seen and row.switched_to:
                branch_id, seen = row.switched_to
        except StoreUnavailableError:  # a switch the store can't show yet is followed once it answers
            return self._live()
        if branch_id == ref.branch_id:  # none, or switched away and back: it stays, past those switches
            if self._ref is ref:
                self._seen = seen
            return self._live()
        async with self._moving:
            if self._ref is ref:  # not moved meanwhile (its own switch, or another call that followed)
                await self._follow(ref, branch_id, seen)
        return self._live()

    async def _follow(self, ref: NamespaceRef, branch_id: int, seen: int) -> None:
        target = self._registry.engine.fresh_branch(branch_id)
        what = f"branch {ref.branch_name!r} was switched to branch"
        if target is None or target.deleted:
            name = "?" if target is None else target.name
            raise BranchNotFoundError(f"{what} {name!r} (id {branch_id}), which was deleted")
        try:
            moved = await branching.move(self._registry, ref, self._token, target, reader=self._reader,
                                         explicit_reader=self._explicit_reader)
        except (ReaderConflictError, StrategyRefusedError, ConfigConflictError) as exc:
            raise type(exc)(f"{what} {target.name!r}; this manager can't follow: {exc}") from exc
        self._ref, self._token, self._reader, self._seen = moved.ref, moved.token, moved.reader, seen

    async def _followed_slot(self) -> SlotCache:
        slot = (await self._followed()).status.slot
        assert slot is not None  # as in _slot
        return slot

    # -- messages ---------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection  # Ctrl-C between taking request records and handing them over would lose them
    async def add_message(
        self, participant: str, content: ContentLike, *, metadata: Mapping[str, Any] | None = None,
        caused_by: Sequence[str] = (), hold_compression: bool | float = False, timestamp_ms: int | None = None,
        host_state: Mapping[str, Any] | None = None,
    ) -> str:
        """Append a message to this manager's slot; returns its id (M1).

        ``hold_compression`` True (or a timeout in seconds) keeps it and everything after it raw
        until released (T5). ``host_state`` ``{name: value}`` sets each of the host's states
        (``Runtime.host_state``) in the message's own transaction, just before it: both commit or
        neither (M9).

        Raises:
            MalformedContentError: bad content, participant, metadata, caused_by, timestamp or
                host_state (a name or a value that isn't JSON), naming the place (M6, B1, M9);
                nothing is stored.
            TypeError: ``host_state`` isn't a mapping.
            ValueError: a ``hold_compression`` that is neither a bool nor a positive finite timeout.
            BranchNotFoundError, ManagerClosedError: the branch was deleted; the manager is closed.

        If cancelled after sending, the message may still be stored; its id is lost. Carrying
        request records (Q1), it is sent whatever comes: a cancel then takes effect once it is stored.
        """
        # A plain append follows a switch (R4) only once its batch refused it for one (BranchSwitched):
        # no read of the branch row per call, a round trip on PostgreSQL.
        ref = self._live() if hold_compression is False else await self._followed()
        stored, blobs, appended = prepare_append(participant, content, metadata, caused_by, timestamp_ms)
        hold = hold_compression
        if hold is not False and hold is not True:
            hold = checks.timeout(hold, "hold_compression")  # True, False, or a bounded timeout in seconds
        writes = () if host_state is None else host_states.message_writes(host_state, ref.branch_id)
        registry = self._registry
        store = registry.store_ref()
        append = AppendItem(state=ref.config.slot, branch=ref.branch_id, data=stored,
                            blobs=tuple(blobs) if blobs else (), attachment=appended, flagged=appended.audience,
                            followed=self._seen if hold is False else None)
        if hold is not False:  # the hold rides the append through the namespace actor, in place before it commits
            # It takes no request record: its batch may commit after a later one's (Q11).
            operation = await ref.ask(AppendAndHold(append, None if hold is True else hold, writes))
            return str(operation.sequence)
        ledger = registry.ledger
        taken = ledger.take(registry.engine)
        if taken is NOTHING_TAKEN and not writes:  # the common append: no record rides it to land, lose or return
            try:
                return str((await store.ask(append)).sequence)
            except BranchSwitched:  # nothing committed: follow the switch, then append there as below
                append, writes = await self._switched(append, host_state)
                taken = ledger.take(registry.engine)
        retried = False
        while True:
            try:
                # The request records waiting commit with it (Q1); taken, they are sent whatever comes (Q11).
                command = append_after((*taken.commands, *writes), append)
                if taken.commands:  # sent and settled by the ledger's system task, whatever comes here
                    operation = append_result(await ledger.carry(store, command, taken))
                else:
                    operation = append_result(await store.ask(command))
            except BranchNotFoundError:
                # A branch deleted meanwhile, the message's or a record's: nothing committed, the
                # records wait again. Once more, the deleted branch's records dropped: a record's
                # branch must not refuse the message (Q11). (Records sent were settled by ``carry``.)
                if not taken.commands:
                    ledger.returned(taken)
                if retried or not taken.commands:
                    raise
                retried = True
                taken = ledger.take(registry.engine)
                continue
            except BranchSwitched:  # nothing committed: follow the switch, then append there
                if not taken.commands:
                    ledger.returned(taken)
                append, writes = await self._switched(append, host_state)
                taken = ledger.take(registry.engine)
                continue
            except BaseException:
                if not taken.commands:
                    ledger.lost(taken)
                raise
            if taken.commands:
                await trio.lowlevel.checkpoint_if_cancelled()  # a cancel while it committed: the message is stored
            else:
                ledger.landed(taken)
            return str(operation.sequence)

    async def _switched(
        self, append: AppendItem, host_state: Mapping[str, Any] | None,
    ) -> tuple[AppendItem, tuple[Any, ...]]:
        """Follow the switch a batch refused ``append`` for (R4): the append and host-state writes
        for the branch followed to."""
        seen = self._seen
        ref = await self._followed()
        if ref.branch_id == append.branch and self._seen == seen:  # the switch can't be read now
            raise StoreUnavailableError(str(self._registry.store_path), "a switch of its branch "
                                        "couldn't be read to follow") from None
        writes = () if host_state is None else tuple(host_states.message_writes(host_state, ref.branch_id))
        return attrs.evolve(append, state=ref.config.slot, branch=ref.branch_id, followed=self._seen), writes

    async def edit_message(self, message_id: str, content: ContentLike) -> None:
        """Replace a message's content. Edits reach ``copy`` entries of the context log, never summaries.

        A block the edit leaves out is a deletion, never refused; hiding a block in place from a
        reader (an audience given, a name taken out) is a narrowing (D1).

        Raises:
            MessageNotFoundError: no such message in this manager's slot.
            MalformedContentError: bad content; nothing changes.
            NarrowingRefusedError: the edit would hide a block compression may have read (D1-D5).
            ReaderConflictError: the namespace records a reader this manager doesn't compile for.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        checks.name(message_id, "message_id")
        blocks = validation.blocks_from_content(content)
        stored, blobs = extract_blobs(blocks)
        await ref.ask(Edit(self._reader, message_id, tuple(blocks), tuple(stored), tuple(blobs)))

    async def remove_message(self, message_id: str) -> None:
        """Remove one message. Never refused for narrowing: nothing takes a block out of a summary
        already written or a request already sent, a removal included (D1).

        Raises:
            MessageNotFoundError, BranchNotFoundError, ManagerClosedError.
        """
        ref = await self._followed()
        checks.name(message_id, "message_id")
        await ref.ask(Remove(message_id, message_id))

    async def remove_messages(self, from_id: str, to_id: str) -> None:
        """Remove the messages from ``from_id`` through ``to_id``, inclusive.

        Raises:
            MessageNotFoundError: either id is absent.
            ValueError: ``from_id`` comes after ``to_id``.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        checks.name(from_id, "from_id")
        checks.name(to_id, "to_id")
        await ref.ask(Remove(from_id, to_id))

    async def get_message(self, message_id: str) -> Message | None:
        """The message as stored (every block with its audience, A7), or None.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        checks.text(message_id, "message_id")
        await trio.lowlevel.checkpoint()
        found = slot.get(message_id)
        return None if found is None else slot.public(found)

    async def get_all_messages(self) -> Sequence[Message]:
        """Every message of this manager's slot, as stored (A7), oldest first.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        await trio.lowlevel.checkpoint()
        return slot.public_all(slot.current())

    async def message_count(self) -> int:
        """How many messages this manager's slot holds on its branch.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        await trio.lowlevel.checkpoint()
        return slot.count()

    async def get_message_window(self, offset: int, limit: int) -> MessageWindow:
        """``limit`` messages from ``offset`` (negative counts from the end), as stored.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        checks.integer(offset, "offset")
        checks.integer(limit, "limit", minimum=0)
        await trio.lowlevel.checkpoint()
        messages, start, total = slot.window(offset, limit)
        return MessageWindow(slot.public_all(messages), start, total)

    async def query_messages(
        self, *, participant: str | None = None, metadata: Mapping[str, Any] | None = None,
        since_ms: int | None = None, until_ms: int | None = None, external_id: str | None = None,
        limit: int | None = None, reverse: bool = False, channel: str | None = None,
    ) -> list[Message]:
        """Messages of this manager's slot matching every condition given, as stored, oldest first
        (newest first with ``reverse``), at most ``limit``.

        ``participant`` exactly; each dotted ``metadata`` path (``"task.id"``) by equality;
        ``timestamp_ms`` within ``since_ms``..``until_ms`` inclusive; ``external_id`` against
        ``metadata["external"]["id"]``; ``channel`` against the message's channel
        (``metadata["channel_id"]``, else ``metadata["external"]["channel_id"]``), served by the
        slot's channel index so it costs what it returns (M11). Served from the slot cache; a
        ``reverse`` query with a ``limit`` reads back only as far as it finds its matches (L7).

        Raises:
            TypeError, ValueError: an argument of the wrong type or out of range, naming it.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        checks.optional_text(participant, "participant")
        checks.mapping_with_names(metadata, "metadata")
        checks.optional_integer(since_ms, "since_ms", minimum=0)
        checks.optional_integer(until_ms, "until_ms", minimum=0)
        checks.optional_text(external_id, "external_id")
        checks.optional_integer(limit, "limit", minimum=0)
        checks.flag(reverse, "reverse")
        checks.optional_text(channel, "channel")
        query = MessageQuery(participant, metadata, since_ms, until_ms, external_id)
        await trio.lowlevel.checkpoint()
        found: list[Message] = []
        if limit == 0:
            return found
        if channel is not None:
            listed = channels.channel_messages(slot, channel)
            candidates: Iterable[Message] = reversed(listed) if reverse else listed
        else:
            candidates = slot.newest_first() if reverse else slot.current()
        for message in candidates:
            if query.matches(message):
                found.append(slot.public(message))
                if limit is not None and len(found) >= limit:
                    break
        return found

    async def channel_counts(self) -> dict[str, int]:
        """How many of this manager's slot's messages each channel holds, in its reader's view: a
        message the reader sees no block of is not counted, and a channel only such messages hold
        is not named (M11). Messages with no channel are not counted. Read from the slot's stored
        channel index (K10), decoding no message the reader sees whole.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        await trio.lowlevel.checkpoint()
        return channels.channel_counts(slot, self._reader)

    async def channel_token_stats(
        self, since_ms: int | None = None, until_ms: int | None = None,
    ) -> dict[str, ChannelTokens]:
        """Per channel, ``ChannelTokens(count, tokens)`` of this manager's slot's messages with a
        ``timestamp_ms`` within ``since_ms``..``until_ms`` inclusive, in its reader's view (as
        ``channel_counts``): ``tokens`` is the plain estimate of the blocks the reader sees (M11),
        folded from the slot's stored channel index (K10).

        Raises:
            TypeError, ValueError: a bound of the wrong type or negative, naming it.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        checks.optional_integer(since_ms, "since_ms", minimum=0)
        checks.optional_integer(until_ms, "until_ms", minimum=0)
        await trio.lowlevel.checkpoint()
        return channels.channel_token_stats(slot, self._reader, since_ms, until_ms)

    # -- compiling --------------------------------------------------------------------------

    async def compile(
        self, budget: Budget | None = None, *, injections: Sequence[Injection] = (),
        message_injections: Sequence[MessageInjection] = (), dry_run: bool = False, strict: bool = False,
    ) -> CompileResult:
        """Compile this manager's context in its reader's view. Never waits for compression (P1).

        What it showed and left out is ``render_stats()`` afterwards (not after a dry run). With
        ``strict``, a compile that would leave out history no shown summary covers is refused.

        Raises:
            ReaderConflictError: the namespace records a reader this manager doesn't compile for (C8).
            MalformedContentError: an injection carries an audience or is malformed (B4).
            StrategyRefusedError: the strategy failed to start.
            TypeError: the namespace's ``token_estimator`` estimated a message at something other than a
                non-negative int (named).
            OverBudgetError: even the newest message doesn't fit (windowed strategies), or with
                ``strict``, uncovered history doesn't fit (Autobiographical; the message says what).
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        command = Compile(
            self._reader, checks.optional_instance(budget, "budget", Budget),
            checks.instances(injections, "injections", Injection),
            checks.instances(message_injections, "message_injections", MessageInjection), checks.flag(dry_run, "dry_run"),
            checks.flag(strict, "strict"),
        )
        result: CompileResult = await ref.ask(command)
        if not dry_run:  # what record_request names as the record's budget
            self._budgets = {result.provenance.compile_id: None if budget is None else budget.max_tokens}
        self._registry.ledger.compiled(result)  # record_request keeps only this runtime's results (Q9)
        return result

    async def preview_context(
        self, budget: Budget, *, message_injections: Sequence[MessageInjection] = ()
    ) -> PreviewResult | None:
        """What a compile would spend, without committing anything; None if the strategy can't tell.

        Raises:
            ReaderConflictError, StrategyRefusedError, BranchNotFoundError, ManagerClosedError: as ``compile``.
            MalformedContentError: a message injection carries an audience or is malformed (B4).
        """
        ref = await self._followed()
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, not {type(budget).__name__}")
        preview: PreviewResult | None = await ref.ask(
            Preview(self._reader, budget, checks.instances(message_injections, "message_injections", MessageInjection))
        )
        return preview

    async def tick(self) -> bool:
        """One unit of strategy work; True if it made progress. Compiles go on while its model call
        is out (P1); a unit under way (the background drain's) is waited for first.

        Raises:
            ReaderConflictError, StrategyRefusedError, BranchNotFoundError, ManagerClosedError: as ``compile``.
            The store's error if the unit's bookkeeping (the narrowing floor, chunk records) can't commit (D4).

        If cancelled, the unit still runs to its end in the namespace actor; only the answer is lost.
        If this manager moves (``switch_branch``, ``fork``) while the tick waits, the unit finishes on
        the branch the tick was sent on and the tick answers as it would have.
        """
        progress: bool = await (await self._followed()).ask(Tick(self._reader))
        return progress

    async def is_ready(self) -> bool:
        """Whether the strategy has no background work queued (advisory: compile never waits, P1).

        Raises:
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
            StrategyRefusedError: the strategy failed to start (or the ``StoreCorruptError`` that
                stopped it; ``StoreUnavailableError`` while a PostgreSQL store's server is away), as
                ``tick`` raises.
        """
        ready: bool = await (await self._followed()).ask(CheckReady(self._reader))
        return ready

    async def wait_ready(self) -> None:
        """Drive ``tick()`` until the strategy is ready or stops making progress (T8).

        Raises:
            ReaderConflictError, StrategyRefusedError, BranchNotFoundError, ManagerClosedError: as ``tick``.
        """
        while not await self.is_ready():
            if not await self.tick():
                return

    @overload
    def subscribe(
        self, *, poll_interval_s: float = ..., alarms: Literal[False] = ...,
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[MessageEvent]]: ...

    @overload
    def subscribe(
        self, *, poll_interval_s: float = ..., alarms: Literal[True],
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[MessageEvent | QuarantineAlarm]]: ...

    @asynccontextmanager
    async def subscribe(
        self, *, poll_interval_s: float = POLL_INTERVAL_S, alarms: bool = False,
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Any]]:  # Any: the overloads above say which events
        """Every change to this manager's slot from now on, each once, in order: ``Added(message)``,
        ``Edited(message, previous)``, ``Removed(ids)``, as stored (A7), writes of other managers
        included. In a writing runtime on LMDB they come from each commit; a read-only runtime, or
        any runtime on a PostgreSQL store (other processes write it), looks at the slot's head every
        ``poll_interval_s`` and reports what changed since (another process's
        appends in order; a rewrite as its removals, edits and appends; through an outage it keeps
        looking, L10). The channel buffers without
        bound (a slow reader costs memory, never an event) and closes (a reader's ``async for``
        ends, after the events already sent) when the block exits, when this manager or its
        runtime closes, when the branch is deleted (a read-only runtime notices that at its
        next look), or when this manager moves to another branch (``fork``, ``switch_branch``,
        ``Runtime.switch_branch``: subscribe again there). With ``alarms=True`` the channel also carries a ``QuarantineAlarm`` each time
        this namespace's actor in this runtime quarantines a compression unit (T13), as it
        happens; without it, only the message events (a host matching on those three is never
        handed a fourth kind).

        Raises:
            TypeError, ValueError: ``poll_interval_s`` not a positive finite number of seconds.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        slot = await self._followed_slot()
        interval = checks.timeout(poll_interval_s, "poll_interval_s")
        namespace = self.namespace if alarms else None
        async with subscription(self._registry, slot, interval, self._subscriptions, namespace) as receive:
            yield receive

    async def health(self) -> NamespaceHealth:
        """The namespace actor's state: reader, managers, mailbox depth, model calls out, readiness,
        quarantined units, narrowing floor, pending compression units and the tokens they cover,
        the last compile's duration. Answered in mailbox order.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        health: NamespaceHealth = await (await self._followed()).ask(ReportHealth())
        tracing.record_health(health)  # the namespace's gauges, when a meter provider is installed
        return health

    def render_stats(self) -> RenderStats | None:
        """What this namespace's last compile (by any of its managers, not a dry run) showed and
        left out: tokens per zone, summaries per level, pending units, and the messages left out
        that no summary covers with why. None before the first compile or for a strategy that
        doesn't report.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        return self._live().status.render_stats

    async def pin_range(
        self, first_id: str, last_id: str, *, name: str | None = None, level: int | None = None
    ) -> Pin:
        """Keep ``first_id``..``last_id`` raw (``level`` None) or shown at summary level ``level`` at
        most, whatever the budget pressure; stored with the namespace (Autobiographical, Knowledge).

        Raises:
            StrategyRefusedError: the strategy keeps no pins.
            ReadOnlyStoreError: the runtime is read-only (nothing changes).
            MessageNotFoundError: an id names no message in this manager's view.
            ValueError: ``first_id`` comes after ``last_id``, or ``level`` isn't None or an int >= 1.
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        ref = await self._followed()
        command = PinRange(self._reader, checks.text(first_id, "first_id"), checks.text(last_id, "last_id"),
                           checks.optional_text(name, "name"), checks.optional_integer(level, "level", minimum=1))
        pin: Pin = await ref.ask(command)
        return pin

    async def unpin(self, pin_id: str) -> bool:
        """Remove pin ``pin_id``; False if there is none of that id.

        Raises:
            StrategyRefusedError, ReadOnlyStoreError, ReaderConflictError, BranchNotFoundError,
                ManagerClosedError: as ``pin_range``.
        """
        removed: bool = await (await self._followed()).ask(Unpin(self._reader, checks.text(pin_id, "pin_id")))
        return removed

    async def list_pins(self) -> list[Pin]:
        """The namespace's pins, oldest first ([] for a strategy that keeps none).

        Raises:
            StrategyRefusedError, ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        pins: list[Pin] = await (await self._followed()).ask(ListPins(self._reader))
        return pins

    async def retry_quarantined(self) -> list[str]:
        """Put the strategy's quarantined compression units back in its queue (their failure counts
        reset) and start the drain; the keys retried ([] if none or the strategy keeps none).

        Raises:
            ReadOnlyStoreError: the runtime is read-only (nothing changes).
            ReaderConflictError, StrategyRefusedError, BranchNotFoundError, ManagerClosedError: as ``tick``.
        """
        keys: list[str] = await (await self._followed()).ask(RetryQuarantined(self._reader))
        return keys

    async def inspect(self) -> NamespaceSnapshot:
        """For tests and debugging: copies of the namespace actor's state at one turn (its strategy,
        record, floor, epoch, its slot caches' and reader listing's figures); changing them changes
        nothing in the actor.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        snapshot: NamespaceSnapshot = await (await self._followed()).ask(Inspect())
        return snapshot

    # -- holds ------------------------------------------------------------------------------

    async def hold_compression(self, message_ids: Sequence[str], *, timeout_s: float | None = None) -> None:
        """Keep these messages (and everything after the earliest) raw until released (T5).

        Unknown ids are ignored. Holds live in memory, in this namespace actor: a reopen has none.

        Raises:
            ValueError: a timeout that isn't positive and finite.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        ids = checks.names(message_ids, "message_ids")
        seconds = None if timeout_s is None else checks.timeout(timeout_s, "timeout_s")
        await ref.ask(Hold(ids, seconds))

    async def release_compression(self, message_ids: Sequence[str]) -> None:
        """Release holds (idempotent; unknown ids are ignored).

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        await ref.ask(Release(checks.names(message_ids, "message_ids")))

    # -- branches ---------------------------------------------------------------------------

    async def list_branches(self) -> list[BranchInfo]:
        """Every live branch of the store.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        self._live()
        await trio.lowlevel.checkpoint()
        return describe_branches(self._registry.engine)

    async def _move_to(self, row: BranchRow) -> None:
        """Attach to ``row``'s namespace actor, then detach from this one (C2: a refusal stays put)."""
        async with self._moving:
            await self._move_once(row)

    async def _move_once(self, row: BranchRow) -> None:
        moved = await branching.move(self._registry, self._live(), self._token, row, reader=self._reader,
                                     explicit_reader=self._explicit_reader)
        self._take(moved.ref, moved.token, moved.reader)
        self._seen = _switches(self._registry, row.id)  # a switch made from there before it came isn't followed

    def _take(self, ref: NamespaceRef, token: int, reader: str | None) -> None:
        """Take a place (fork, switch_branch, Runtime.switch_branch); no checkpoint. A move to another
        branch ends this manager's subscriptions, as a deleted branch does: they watch the slot it
        left, and going on with them would hand its host the old branch's events as its own."""
        if ref.branch_id != self._ref.branch_id:
            for end in list(self._subscriptions):
                end()
        self._ref, self._token, self._reader = ref, token, reader

    async def switch_branch(self, name: str) -> None:
        """Move this manager (only) to branch ``name``.

        Raises:
            BranchNotFoundError: no such branch (or this manager's branch was deleted).
            ReaderConflictError: the namespace there records another reader, or a reader where this
                manager compiles for none (C1, C7); the manager stays where it was.
            StrategyRefusedError: the strategy doesn't mark compression reads under a reader (D6).
            ManagerClosedError: the manager is closed.
        """
        self._live()
        await self._move_to(self._registry.engine.branch(checks.name(name, "name")))

    async def fork(self, name: str | None = None) -> str:
        """Branch at the head and switch this manager to it (R1); returns the branch's name.

        Raises as ``switch_branch`` does, before making the branch (C2, C7), and
        ``StrategyRefusedError`` when the strategy failed to start (C12); ``BranchExistsError``
        when ``name`` is taken.
        """
        ref = await self._followed()
        asked = checks.optional_name(name, "name")
        await trio.lowlevel.checkpoint_if_cancelled()
        # Whole or not at all (L4): a caller cancelled once the branch is asked for still gets the
        # manager moved onto it, or the branch would be left behind with the manager elsewhere.
        with trio.CancelScope(shield=True):
            await self._registry.commit_ledger()  # a fork holds the request records made before it (Q3)
            made, row = await branching.fork(ref, self._reader, asked)
            await self._move_to(row)
        await trio.lowlevel.checkpoint_if_cancelled()
        return made

    async def branch_at(self, message_id: str, name: str | None = None) -> str:
        """Branch at that message's sequence (the branch holds it) without switching (R1).

        Raises:
            MessageNotFoundError: no such message in this manager's slot.
            BranchExistsError: ``name`` is taken.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        checks.optional_name(name, "name")
        await self._registry.commit_ledger()
        return await branching.branch_at(self._registry, ref, self._slot(), checks.text(message_id, "message_id"), name)

    async def derive(
        self, *, branch: str, strategy: StrategyConfig | Strategy | None = None, at_sequence: int | None = None,
        model: Model | None = None,
    ) -> ContextManager:
        """A child manager on a new branch holding this namespace's states but not its queues,
        holds or in-flight work (R2, C11, C12).

        Raises:
            ManagerClosedError: this manager is closed (nothing is written).
            StrategyRefusedError: this manager's strategy failed to start, or the child's strategy
                doesn't mark compression reads under a reader (D6).
            ReaderConflictError: the head records another reader, or a record that isn't a name (C11).
            BranchExistsError: ``branch`` is taken.
            BranchNotFoundError: this manager's branch was deleted.
        """
        ref = await self._followed()
        checks.name(branch, "branch")
        checks.optional_integer(at_sequence, "at_sequence", minimum=0)
        if model is not None and not isinstance(model, Model):
            raise TypeError(f"model must be a Model or None, not {type(model).__name__}")
        await self._registry.commit_ledger()
        child = await branching.derive(
            self._registry, ref, reader=self._reader, branch=branch, strategy=strategy, at_sequence=at_sequence,
            model=model, isolate=self._isolate, auxiliary_views=self._auxiliary_views,
        )
        attached = child.attachment
        return ContextManager(
            self._registry, attached.ref, attached.token, reader=attached.reader, explicit_reader=None,
            isolate=self._isolate, auxiliary_views=self._auxiliary_views, derivation=child.derivation,
        )

    async def set_strategy(self, strategy: StrategyConfig | Strategy) -> None:
        """Replace the namespace's strategy (for every manager on it).

        Raises:
            StrategyRefusedError: it doesn't mark compression reads under a reader (D6), or it fails
                to start on this namespace's memory (C5): the old one stays, nothing recorded.
            ConfigConflictError: another process serves the namespace with a strategy that keeps
                its memory there.
            TypeError: not a strategy config.
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as for ``compile``.
        """
        await (await self._followed()).ask(SetStrategy(self._reader, strategy))

    # -- summaries --------------------------------------------------------------------------

    async def search_summaries(
        self, *, text: str | None = None, regex: str | None = None, levels: Sequence[int] | None = None,
        limit: int = 50, include_merged: bool = False,
    ) -> list[SummaryMatch]:
        """Summaries matching ``text`` or ``regex`` ([] for a strategy without summaries). Checked (C10).

        The bundled strategies answer ``SummaryMatch`` items; a host's own ``SummaryReader``
        answers what it makes, passed through unchanged (so its items are typed as the bundled ones'
        only by convention).

        Raises:
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
            re.error: an invalid ``regex``.
        """
        ref = await self._followed()
        checks.optional_text(text, "text")
        if regex is not None:
            try:
                re.compile(checks.text(regex, "regex"))  # re.error before anything is sent
            except (OverflowError, RecursionError) as exc:  # the re module's other refusals
                raise re.error(f"regex can't be compiled: {exc}") from None
        if levels is not None:
            levels = tuple(checks.integer(level, f"levels[{i}]", minimum=1)
                           for i, level in enumerate(checks.sequence(levels, "levels")))
        query = SearchSummaries(text, regex, levels, checks.integer(limit, "limit", minimum=0),
                                checks.flag(include_merged, "include_merged"))
        result: list[SummaryMatch] | None = await ref.ask(QuerySummaries(self._reader, query))
        return [] if result is None else result

    async def get_summaries_in_range(
        self, *, from_ms: int | None = None, to_ms: int | None = None, level: int | None = None
    ) -> list[Summary]:
        """Summaries whose messages' timestamps overlap [from_ms, to_ms], oldest first. Checked (C10).

        ``Summary`` items from the bundled strategies; a host's own ``SummaryReader``'s as it makes them.

        Raises:
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        ref = await self._followed()
        query = SummariesInRange(checks.optional_integer(from_ms, "from_ms"), checks.optional_integer(to_ms, "to_ms"),
                                 checks.optional_integer(level, "level", minimum=1))
        result: list[Summary] | None = await ref.ask(QuerySummaries(self._reader, query))
        return [] if result is None else result

    async def get_summary(self, summary_id: str) -> Summary | None:
        """One summary by id, or None (None too for a strategy without summaries). Checked (C10).

        A ``Summary`` from the bundled strategies; a host's own ``SummaryReader``'s as it makes it.

        Raises:
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        ref = await self._followed()
        summary: Summary | None = await ref.ask(
            QuerySummaries(self._reader, GetSummary(checks.text(summary_id, "summary_id")))
        )
        return summary

    async def reset_head_window(self, transition_text: str | None = None) -> str:
        """Start a new head window at a topic-transition message; returns its id (T6).

        Raises:
            StrategyRefusedError: the strategy has no head window.
            ModelError: no transition text was given and the model made none.
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        ref = await self._followed()
        message_id: str = await ref.ask(
            ResetHeadWindow(self._reader, checks.optional_text(transition_text, "transition_text"))
        )
        return message_id

    # -- live settings ----------------------------------------------------------------------

    def set_tool_definitions(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """Tool definitions the namespace's compression requests carry (in mailbox order).

        Raises:
            TypeError: ``tools`` not a sequence of mappings.
            MalformedContentError: a definition that isn't JSON a model request can carry (a key
                that isn't a string, NaN, an object that isn't JSON), naming the place.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = self._live()
        tools = checks.sequence(tools, "tools")
        checked: list[Mapping[str, Any]] = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise TypeError(f"tools[{index}] must be a mapping (a Messages API tool definition), not "
                                f"{type(tool).__name__}")
            # A JSON-native copy: it goes into model requests as JSON, and the host may change its own.
            copy = validation.validate_metadata(tool, path=f"tools[{index}]")
            assert copy is not None  # the copy of a mapping
            checked.append(copy)
        if checked:
            ref.tell(SetTools(tuple(checked)))

    async def update_context_settings(self, **changes: Any) -> ContextSettings:
        """Change the namespace's live settings (for every manager on it); returns those in force (T14).

        ``default_budget`` (a ``Budget``, or None for ``Budget()``): what ``compile()`` without a
        budget uses. ``head_window_tokens``, ``recent_window_tokens``, ``target_chunk_tokens``,
        ``merge_threshold``, ``auto_tick``: as the strategy config's fields of those names, which
        they override. In force from the namespace's next command on, stored with it (a reopen
        with the same strategy config and a fork keep them); the strategy isn't started again:
        chunks closed stay closed and work in flight lands.

        Raises:
            TypeError: a name that isn't a setting (named); nothing changes.
            ValueError: a value the setting refuses (named); nothing changes.
            StrategyRefusedError: the strategy has no such setting (named: Passthrough and
                WindowedPassthrough take ``default_budget`` only), or failed to start.
            ReadOnlyStoreError: the runtime is read-only (nothing changes).
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        ref = await self._followed()
        checked = settings.checked(changes)
        if not checked:
            return self.context_settings()
        found: ContextSettings = await ref.ask(UpdateContextSettings(self._reader, checked))
        return found

    def context_settings(self) -> ContextSettings:
        """The namespace's live settings in force (T14): its config's, as ``update_context_settings``
        changed them; a setting its strategy doesn't have is None.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        found = self._live().status.settings
        return ContextSettings() if found is None else found

    def set_system_prompt(self, text: str | None) -> None:
        """The system prompt of the namespace's compression requests (in mailbox order)."""
        ref = self._live()
        checked = checks.optional_text(text, "text")
        if checked:
            ref.tell(SetSystemPrompt(checked))

    # -- the small reads a host's UI makes (M10) ---------------------------------------------

    async def get_message_at(self, message_id: str, at_sequence: int) -> Message:
        """The message as it was at store sequence ``at_sequence``: the version an edit after it
        had not yet replaced, there even if removed since; as stored (A7), from this manager's slot.

        Raises:
            MessageNotFoundError: the slot held no such message at that sequence (written after it,
                removed by then, or never).
            TypeError, ValueError: ``at_sequence`` is not a non-negative integer.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        checks.text(message_id, "message_id")
        at = checks.integer(at_sequence, "at_sequence", minimum=0)
        await trio.lowlevel.checkpoint()
        engine, sequence = self._registry.engine, parse_id(message_id)
        item = None if sequence is None or sequence > at else engine.read_item(
            ref.config.slot, ref.branch_id, sequence, at=at)
        if item is None:
            raise MessageNotFoundError(f"no message {message_id!r} in slot {ref.config.slot!r} on branch "
                                       f"{ref.branch_name!r} at sequence {at}")
        return decode_stored(engine, item.data, item.sequence)

    async def compression_holds(self) -> list[CompressionHold]:
        """The holds in force (T5), oldest message first: each message's id and the seconds left
        until its hold lapses (None: until released). Held in memory by the namespace actor.

        Raises:
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        holds: list[CompressionHold] = await (await self._followed()).ask(ReportHolds())
        return holds

    async def max_summary_level(self) -> int:
        """The deepest level of the namespace's summaries (0: none, or a strategy without summaries).

        Raises:
            StrategyRefusedError, ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        level: int = await (await self._followed()).ask(FindMaxSummaryLevel(self._reader))
        return level

    async def mark_document(self, first_id: str, last_id: str, title: str | None = None) -> Pin:
        """Pin ``first_id``..``last_id`` as a document: a ``pin_range`` named ``title`` (default
        ``"document"``) with no level, so the range is always shown raw (Autobiographical).

        Raises:
            StrategyRefusedError: the strategy keeps no pins.
            MessageNotFoundError: an id not in the view; ``ValueError``: ``first_id`` after ``last_id``.
            ReadOnlyStoreError, ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``pin_range``.
        """
        first, last = checks.text(first_id, "first_id"), checks.text(last_id, "last_id")
        name = "document" if title is None else checks.text(title, "title")
        pin: Pin = await (await self._followed()).ask(PinRange(self._reader, first, last, name, None))
        return pin

    async def set_anchor(self, message_id: str) -> None:
        """Start a WindowedPassthrough window at ``message_id`` (stored); an overflow re-anchors as ever (T2).

        Raises:
            StrategyRefusedError: the namespace's strategy is not WindowedPassthrough.
            MessageNotFoundError: no such message in the view.
            ReadOnlyStoreError, ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        await (await self._followed()).ask(SetAnchor(self._reader, checks.text(message_id, "message_id")))

    async def anchor(self) -> str | None:
        """The id of the message a WindowedPassthrough window starts at (None: the oldest, never anchored).

        Raises:
            StrategyRefusedError: the namespace's strategy is not WindowedPassthrough.
            ReaderConflictError, BranchNotFoundError, ManagerClosedError: as ``compile``.
        """
        found: str | None = await (await self._followed()).ask(ReportAnchor(self._reader))
        return found

    async def compile_metadata(self, budget: Budget) -> CompileMetadata:
        """What ``compile(budget)`` would show, without building it: the ids of the messages shown
        raw and of the summaries, and the strategy's figures (tokens per zone). It builds no request
        message, reads no blob and writes nothing (a dry run: an anchor it would move stays).

        Raises:
            TypeError: ``budget`` is not a ``Budget``.
            OverBudgetError, StrategyRefusedError, ReaderConflictError, BranchNotFoundError,
                ManagerClosedError: as ``compile``.
        """
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, not {type(budget).__name__}")
        found: CompileMetadata = await (await self._followed()).ask(DescribeCompile(self._reader, budget))
        return found

    # -- the request ledger (Q) ------------------------------------------------------------------

    # Ctrl-C deferred to its checkpoints: one between the stores of the encoder's or the digest
    # memo's bookkeeping would keep the next record against parts not its base's (a record that
    # doesn't decode), or digest the next body against another's digests.
    @trio.lowlevel.enable_ki_protection
    async def record_request(
        self, result: CompileResult, *, form: str, model: str | None = None,
        usage: RequestUsage | Usage | Mapping[str, Any] | None = None, latency_ms: float | None = None,
        response: str | None = None, options: Mapping[str, Any] | None = None,
    ) -> RequestRecord:
        """Keep in the namespace's request ledger what ``result`` sent (Q1): its reader, the ids and
        versions of the messages and summaries it held, tokens per zone, the stable prefix, the
        digest of the body ``form`` makes of it, and ``model``, ``usage`` (a ``RequestUsage``, the
        ``ctxrt.Usage`` a model reports, or a mapping of ``RequestUsage`` fields), ``latency_ms``
        and a digest of the ``response`` text (never the text). ``form`` is the result's method
        that made the body, without ``to_``: "anthropic", "openai_chat" or "openai_responses";
        ``options`` its keyword arguments (default ``assistant={"Claude", "assistant"}``), so the
        body can be rebuilt (``rebuild_request``). A live trace span carries its id
        (``ctxrt.request.id``, V8).

        The record costs no commit of its own: it commits in the batch of the runtime's next
        ``add_message`` without ``hold_compression`` (so a reply added next lands with its
        request's record), or when
        ``requests()`` reads, a manager or the runtime closes, or ``LEDGER_WAITING`` records wait.
        A process that dies first loses the records still waiting. Cancelled, it keeps nothing,
        unless the cancel comes while it commits the ``LEDGER_WAITING``-th: then it is kept all
        the same, with those waiting (Q11). A Ctrl-C meanwhile is raised at a schedule point (trio's
        KeyboardInterrupt protection), never between the steps of its bookkeeping. It is kept as what it adds to
        the namespace's last record (the messages after those they share), so its cost follows
        the turn, not the size of the request.

        Raises:
            LedgerOffError: the namespace keeps no ledger on this branch (open it with ``ledger=True``).
            ValueError: ``result`` was compiled for another namespace, branch or reader (a record
                holds only what this namespace's reader could see, Q4), or by another runtime's
                manager (Q9); nothing is kept; a ``form`` not named above;
                bad ``usage`` or ``latency_ms``.
            TypeError: an argument of the wrong type; ``options`` the form's method doesn't take.
            EmptyRequestError, InvalidRequestError: as the form's method raises them.
            ReadOnlyStoreError, BranchNotFoundError, ManagerClosedError: as ``add_message``.
            StoreUnavailableError: a PostgreSQL store's server can't be reached (the record names
                the store's horizon); nothing is kept.
        """
        ref = await self._followed()
        if not isinstance(result, CompileResult):
            raise TypeError(f"result must be a CompileResult, not {type(result).__name__}")
        form = request_ledger.check_form(form)
        provenance = result.provenance
        place = self._registry.ledger.compiled_for(result)
        if place is None:
            raise ValueError(
                f"result (compile {provenance.compile_id!r} of namespace {provenance.namespace!r}) was not compiled by "
                f"a manager of this runtime: record it with the runtime that compiled it, whose store holds the "
                f"messages it names (Q9)")
        # Where this runtime compiled it, whatever its provenance now says (Q4).
        if place != (self.namespace, ref.branch_name, self._reader):
            namespace, branch, reader = place
            raise ValueError(
                f"result was compiled for namespace {namespace!r} on branch {branch!r} for reader {reader!r}; this "
                f"manager's ledger keeps only {self.namespace!r} on {ref.branch_name!r} for {self._reader!r} (Q4)")
        checks.optional_text(model, "model")
        checks.optional_text(response, "response")
        kept = request_ledger.RequestUsage.of(usage)
        latency = request_ledger.check_latency(latency_ms)
        await trio.lowlevel.checkpoint()  # before anything is kept: a cancelled call keeps nothing
        ref = self._live()
        engine, ledger = self._registry.engine, self._registry.ledger
        encoder = ledger.encoder(ref.branch_id, self.namespace)
        if not ledger.flag_known(encoder, engine):
            if engine.read_value(states.ledger_flag_state(self.namespace), ref.branch_id) is not True:
                raise LedgerOffError(
                    f"namespace {self.namespace!r} keeps no request ledger on branch {ref.branch_name!r}: open it "
                    f"with rt.open(..., ledger=True) to record its requests")
            ledger.flag_read_on(encoder)
        self._registry.store_ref()  # ReadOnlyStoreError before anything is made
        given = dict(options) if options is not None else {"assistant": sorted(DEFAULT_ASSISTANT)}
        body = request_ledger.make_body(result, form, given)
        stored = request_ledger.stored_options(given, result)
        status = ref.status
        stats = status.render_stats if status.stats_compile_id == provenance.compile_id else None
        zones = request_ledger.zones_of_stats(stats) if stats is not None else request_ledger.zone_tokens_of(result)
        sequence = engine.last_sequence
        base, shared, head, tail, parts = encoder.encode(result, sequence)
        span, trace_id, span_id = tracing.request_span()
        record = request_ledger.RequestRecord(
            id=uuid.uuid4().hex, at_ms=int(time.time() * 1000), sequence=sequence, namespace=self.namespace,
            branch=ref.branch_name, reader=self._reader, form=form, model=model,
            budget=self._budgets.get(provenance.compile_id), zone_tokens=zones, total_tokens=sum(zones.values()),
            stable_prefix_tokens=result.stable_prefix_tokens,
            body_digest=request_ledger.body_digest(body, encoder.bodies, request_ledger.made_from(result, body)),
            held=parts.held, usage=kept,
            latency_ms=latency, response=None if response is None else request_ledger.text_digest(response),
            response_chars=None if response is None else len(response), trace_id=trace_id, span_id=span_id,
            options=stored, parts=parts.parts)
        data = request_ledger.encode_record(record, base=base, shared=shared, head=head, tail=tail)
        ledger.add(encoder, record.id, AppendItem(state=states.ledger_state(self.namespace), branch=ref.branch_id,
                                                  data=data))
        tracing.recorded(span, record.id)
        if len(ledger.pending) >= LEDGER_WAITING:
            await self._registry.commit_ledger()
        return record

    async def requests(
        self, *, since: int | None = None, limit: int = 50, holding: str | None = None,
    ) -> list[RequestRecord]:
        """The namespace's recorded requests on this branch (its parent's up to the fork point
        included, R1), oldest first: the newest ``limit``, or with ``since`` (a store sequence,
        such as a record's ``sequence``) the first ``limit`` recorded after it and any more at the
        last one's sequence, so a reader pages forward with ``since=records[-1].sequence`` and
        misses none. ``holding``: only those that held that message
        or summary id (an audit: it reads every record's header, decoding only those whose own
        parts name the id). A namespace whose ledger is off answers what it recorded while on.
        The records waiting to commit (``record_request``) are committed first (after a batch
        carrying records that is out), and the ledger reads in its order (Q11).

        Raises:
            TypeError, ValueError: ``since`` or ``limit`` not a non-negative (positive) integer.
            StoreCorruptError: a record is damaged (it is named).
            StoreFullError, StoreUnavailableError: the records waiting could not commit (they are lost).
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        since = checks.optional_integer(since, "since", minimum=0)
        limit = checks.integer(limit, "limit", minimum=1)
        if holding is not None:
            checks.text(holding, "holding")
        if self._registry.ledger.pending:
            await self._registry.commit_ledger()
        await trio.lowlevel.checkpoint()
        engine, state = self._registry.engine, states.ledger_state(self.namespace)
        if not engine.has_state(state):
            return []
        return request_ledger.read_records(engine, state, ref.branch_id, since=since, limit=limit, holding=holding)

    async def rebuild_request(self, record: RequestRecord) -> RebuiltRequest:
        """``record``'s body made again from the store (Q5): each message it carried as stored read
        as of the record (``get_message_at``), in the record's reader's view, the rest as the record
        keeps it. ``edited`` names the held messages edited or removed since; ``matches`` says the
        body's digest is the recorded one. The loop runs meanwhile (Q10): it reads a few messages
        between schedule points, and makes the body on a worker thread.

        Raises:
            TypeError: ``record`` is not a ``RequestRecord``.
            ValueError: ``record`` is another namespace's, names another reader, or is another
                branch's that this branch doesn't see (one made after this branch forked from it).
            MessageNotFoundError: a message it carried is no longer in the store's history.
            BranchNotFoundError, ManagerClosedError: as ``add_message``.
        """
        ref = await self._followed()
        if not isinstance(record, RequestRecord):
            raise TypeError(f"record must be a RequestRecord, not {type(record).__name__}")
        if record.namespace != self.namespace:
            raise ValueError(f"record {record.id!r} is namespace {record.namespace!r}'s, not {self.namespace!r}'s")
        if record.reader != self._reader:  # a record's messages are read in its reader's view: only this one's (Q4)
            raise ValueError(f"record {record.id!r} is for reader {record.reader!r}; this manager reads for "
                             f"{self._reader!r} (Q4)")
        engine = self._registry.engine
        # Its messages are read on this branch: only a record this branch sees (its own, or an
        # ancestor's up to the fork point) names messages this branch holds as the record did.
        row = engine.branch_by_id(ref.branch_id)
        if record.branch != row.name and not any(
                engine.branch_by_id(level).name == record.branch and record.sequence <= bound
                for level, bound in row.lineage):
            raise ValueError(f"record {record.id!r} was made on branch {record.branch!r}, which branch {row.name!r} "
                             f"doesn't see it on (made after the fork, or on no branch it forked from): rebuild it "
                             f"with a manager on {record.branch!r}")
        slots = (ref.config.slot, *ref.config.auxiliary)
        versions = {item.id: item.version for item in record.held if item.kind == "message"}
        named = {part.message for part in record.parts if part.message is not None}

        def find(message_id: str, at: int | None) -> Item | None:
            sequence = parse_id(message_id)
            for slot in slots:
                item = None if sequence is None or not engine.has_state(slot) else engine.read_item(
                    slot, ref.branch_id, sequence, at=at)
                if item is not None:
                    return item
            return None

        # Read a few messages at a time, the loop let run between (Q10): thousands of reads at once
        # would hold it for a third of a second.
        contents: dict[str, tuple[Block, ...]] = {}
        edited = []
        for n, message_id in enumerate(dict.fromkeys([*versions, *named])):
            if n % REBUILD_READS == 0:
                await trio.lowlevel.checkpoint()
                self._live()  # closed meanwhile: its store may be too
            at = versions.get(message_id, record.sequence)
            now = find(message_id, None)
            if message_id in versions and (now is None or now.version > at):
                edited.append(message_id)
            if message_id in named:
                item = now if now is not None and now.version <= at else find(message_id, at)
                if item is None:
                    raise MessageNotFoundError(
                        f"message {message_id!r} of request {record.id!r} is not in the store's history")
                contents[message_id] = content_for_reader(decode_stored(engine, item.data, item.sequence).content,
                                                          record.reader)
        # The body and its digest are pure work on what was read: on a worker thread, off the loop.
        body, matches = await trio.to_thread.run_sync(request_ledger.rebuilt_matching, record, contents.__getitem__)
        return RebuiltRequest(body, tuple(edited), matches)

    async def aclose(self) -> None:
        """Close this manager (idempotent); the namespace actor stops with its last manager, before
        this returns (unless the actor is still busy after ``CLOSE_WAIT_S``: then soon after). Never
        raises, and completes even if cancelled."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        for end in list(self._subscriptions):
            end()
        if self._registry.ledger.pending and not self._registry.closed:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_WAIT_S):
                try:
                    await self._registry.commit_ledger()
                except Exception:  # noqa: BLE001 - a close never raises; the records waiting are lost (Q1)
                    logger.warning("closing a manager: the request records waiting could not commit", exc_info=True)
        # Shielded, so a cancelled close still detaches; bounded, so a close never hangs its host: past
        # the bound the detach stays queued and the actor takes it after what it is doing.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_WAIT_S):
            try:
                await self._ref.ask(Detach(self._token))
            except Exception:  # noqa: BLE001 - its actor already stopped (branch deleted, runtime closed)
                pass

    async def __aenter__(self) -> ContextManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()



def _switches(registry: NamespaceRegistry, branch_id: int) -> int:
    """How many switches are recorded from branch ``branch_id`` now (read afresh on a shared store)."""
    try:
        row = registry.engine.fresh_branch(branch_id)
    except StoreUnavailableError:  # what this process last read of it
        row = registry.engine.branch_by_id(branch_id)
    return 0 if row is None else row.switches


def _on(manager: ContextManager, branch_id: int) -> bool:
    return not manager._closed and manager._ref.retired is None and manager._ref.branch_id == branch_id


async def switch_managers(registry: NamespaceRegistry, source: BranchRow, target: BranchRow) -> int:
    """Move every open manager of ``registry`` on ``source`` to ``target`` at one point (R3); how many moved.

    Each is attached to ``target``'s actor first, still attached where it is (a refusal, a cancel or a
    deleted branch detaches those new attachments and moves none). Then, in one step with no
    checkpoint, each manager takes its new place and leaves its old actor: between two checkpoints
    every manager of the runtime is on one side, so no compile sent after the switch sees the old branch.
    Managers opened on ``source`` while the attaches run are gathered too, before that step.
    """
    moving: dict[ContextManager, branching.Attachment] = {}
    held: list[ContextManager] = []
    async with registry.switching:
        try:
            while pending := [m for m in list(registry.managers) if m not in moving and _on(m, source.id)]:
                for manager in pending:
                    if manager not in held:
                        await manager._moving.acquire()  # its own switch or fork finishes first
                        held.append(manager)
                    if _on(manager, source.id):
                        moving[manager] = await branching.attach_to(
                            registry, manager._ref, target, reader=manager._reader,
                            explicit_reader=manager._explicit_reader)
            for retired in [m._ref.retired for m in moving] + [a.ref.retired for a in moving.values()]:
                if retired is not None:  # either branch was deleted meanwhile
                    raise retired()
            # The record other runtimes' managers follow (R4); it refuses a branch deleted meanwhile.
            # From its send on the switch is made: a cancel waits for it, so this runtime moves too.
            seen = 0
            if registry.store is not None:  # a read-only runtime records nothing: it moves its own
                with trio.CancelScope(shield=True):
                    recorded = await registry.store.ask(RecordSwitch(from_branch=source.id, to_branch=target.id))
                assert recorded.switched_to is not None
                seen = recorded.switched_to[1]
        except BaseException:
            for attachment in moving.values():
                attachment.ref.tell(Detach(attachment.token))
            raise
        finally:
            for manager in held:
                manager._moving.release()
        # One step from here to the return: no manager is seen on either side alone.
        for manager, attachment in moving.items():
            if manager._closed:  # closed while it was attached there: it leaves the new actor too
                attachment.ref.tell(Detach(attachment.token))
                continue
            manager._ref.tell(Detach(manager._token))
            manager._take(attachment.ref, attachment.token, attachment.reader)
            manager._seen = seen
    return len(moving)
