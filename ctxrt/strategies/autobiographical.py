"""Autobiographical compression: head window, recent window, persisted chunks, hierarchical
summaries made by a model (docs/behaviours.md T3-T6).

Zones over the reader's view: a verbatim head window, a raw recent window (evicted newest
first, emitted chronologically), and the middle, cut into chunks that close at
``target_chunk_tokens`` (at least 4 messages, never right after a tool_use). Closed chunks are
persisted, so boundaries are stable across restarts; each is compressed into an L1 summary
"as of" the chunk, and L1s merge into L2 (L2 into L3) at ``merge_threshold``. The narrowing
floor is raised before every compression read (docs/behaviours.md D2, D4).

This module holds the strategy's state and its answers to the actor (plan a unit, build its
request, apply the reply; select; pins; summary reads; the head-window reset); the pieces it
runs are the records (records.py), chunking (chunking.py), the queue (queue.py), the prompts
(prompts.py), the selection (selection.py) and, with adaptive resolution, the fold (folding.py,
T10), and what a variant changes is its ``CompressionPolicy`` (policy.py).
"""

from __future__ import annotations

import logging
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import attrs

from ..budget import Entry, PreviewResult, non_negative_int
from ..content.blocks import CompiledMessage, Message, sequence_key
from ..errors import MessageNotFoundError, ModelError, OverBudgetDiagnostics, OverBudgetError
from ..models.model_types import ModelRequest, ModelResponse
from ..content.tokens import estimate_text
from .base import (
    Backlog,
    Pin,
    RenderStats,
    SelectOptions,
    Strategy,
    StrategyContext,
    Unit,
    UnitOutcome,
    at_least,
    flag,
    one_of,
    optional_at_least,
    optional_callable,
    optional_count,
    optional_text,
    ratio,
    text,
)
from .chunking import Boundary, closing, with_boundary
from .ladder import (
    NO_TOOLS,
    PLAIN_TEXT,
    SOURCE_ONLY,
    SPLIT,
    Step,
    ladder_from,
    ladder_record,
    next_rung,
    refusal,
    stitch,
)
from .coverage import Coverage, Runs
from .fold_problem import fold_problem
from .folding import Fold, newest_within, solve
from .live import MIB, LiveMemo
from .policy import AUTOBIOGRAPHICAL, CompressionPolicy
from .prompts import (
    MANAGER,
    SYSTEM,
    TRANSITION_PREFIX,
    PLAIN_TEXT_INSTRUCTION,
    chunk_ask,
    chunk_instruction,
    chunk_request,
    merge_request,
    recall_pairs,
    transition_request,
)
from .queue import (
    MAX_ATTEMPTS,
    Backoff,
    attempts_from,
    group_key,
    l1_queue,
    merge_group,
    quarantined,
    sealed_summaries,
    settled,
    within_span,
)
from .records import (
    Chunk,
    Summary,
    SummaryMatch,
    chunk_record,
    chunks_from,
    pins_from,
    pins_record,
    summaries_from,
    summary_record,
)
from .selection import Folded, LevelBudgets, MiddleFolder, Price, Selection, SummaryPrices, frontier_under_pins, select
from .settings import StrategySettings
from .shown_entries import ShownEntries
from .zones import Zones

if TYPE_CHECKING:
    from ..budget import Budget
    from ..views import MessageView

logger = logging.getLogger("ctxrt.autobiographical")

_TRANSIENT = object()  # a retryable model failure: the unit stays queued, uncounted, and the drain backs off
T = TypeVar("T")


def _half(items: Sequence[T], half: int | None) -> list[T]:
    """The older (1) or newer (2) half of ``items`` for the ladder's split rung, else all of them."""
    if half is None:
        return list(items)
    middle = len(items) // 2
    return list(items[:middle] if half == 1 else items[middle:])


class _Folding(NamedTuple):
    """A compile's fold (T10): its middle chunks' ids (oldest first), the ``fold`` over them for
    the middle's ``allowance`` and the summaries it lacked as what would make them (``wanted``: a
    chunk's id for its level-1 summary, the ids of the summaries to merge); ``fixed``: the
    middle's tokens in no chunk (shown raw whatever the fold)."""

    chunks: tuple[str, ...]
    fold: Fold
    wanted: tuple[tuple[str, ...], ...]
    allowance: int
    fixed: int


def resolutions_from(stored: Any, where: str = "the namespace") -> dict[str, int] | None:
    """The ``resolutions`` value read back (each chunk's level, raw ones left out); None: no fold yet,
    or a record this version can't read (logged, naming ``where``)."""
    if stored is None:
        return None
    if isinstance(stored, dict) and all(isinstance(k, str) and type(v) is int for k, v in stored.items()):
        return dict(stored)
    logger.error("the stored fold %r of %s can't be read; folding afresh", stored, where)
    return None


def head_start_from(stored: Any, where: str = "the namespace") -> str | None:
    """The ``head_start`` value read back (the head-window reset's message id); None: none, or a
    record this version can't read (logged, naming ``where``: the head starts at the first message)."""
    if stored is None or isinstance(stored, str):
        return stored
    logger.error("the stored head-window start %r of %s can't be read; the head starts at the first message",
                 stored, where)
    return None


class AutobiographicalStrategy(Strategy):
    marks_compression_reads = True
    keeps_memory = True  # its summaries and chunks (one process serves it on a shared store)
    transition_participant = MANAGER

    def __init__(self, config: Any, policy: CompressionPolicy = AUTOBIOGRAPHICAL) -> None:
        self.config = config
        self.policy = policy
        self.name = policy.name
        self.settings = self.default_settings()  # the live settings (T14): read through here, not the config
        self.auto_tick = self.settings.auto_tick
        self.chunks: list[Chunk] = []
        self.summaries: list[Summary] = []
        self.attempts: dict[str, int] = {}
        self.ladder: dict[str, Step] = {}  # units part way down their refusal ladder (T12), stored as "ladder"
        self._outcome: tuple[str, UnitOutcome] | None = None  # the last reply applied: its unit's key and outcome
        self.head_start_id: str | None = None
        self._compressed: set[str] = set()  # chunk ids with an L1
        # Kept incrementally, so a tick costs what is pending, not what the namespace holds:
        self._pending: dict[str, Chunk] = {}  # closed chunks without an L1, not quarantined, oldest first
        self._unmerged: dict[int, list[Summary]] = {}  # per level, summaries without a parent, oldest first
        self._leaf_cache: dict[str, tuple[str, ...]] = {}  # summary id -> the message ids it covers
        self._dirty = True  # new messages since the chunks were last rebuilt
        self._backoff = Backoff()
        self._built_holds: int | None = None  # the hold floor the chunks were last rebuilt under
        self._built_stamp: object = None  # and the view's stamp: an edit or a reveal may let a chunk close
        self._ctx: StrategyContext | None = None
        self._stats: RenderStats | None = None  # what the last compile showed and left out
        self.pins: list[Pin] = []
        self._next_pin = 0
        self._prices = SummaryPrices(config.summary_participant)
        self._live_memo: LiveMemo = {}
        self._coverage = Coverage()  # what summaries cover, as runs of the view
        self._made = ShownEntries(config.max_message_tokens, config.summary_participant)  # reused across compiles
        self._zones = Zones(self._made, self.settings.head_window_tokens, self.settings.recent_window_tokens)
        self._boundary_failed: set[str] = set()  # messages chunk_boundary raised at (logged once each)
        self._boundary_answers: dict[tuple[str, str, str], bool] = {}  # chunk_boundary's, by ids (_remembered)
        self._boundary_stamp: object = None  # the view stamp they were given under
        self.resolutions: dict[str, int] | None = None  # each middle chunk's level in the last compile's fold (T10)
        self._wanted: tuple[tuple[str, ...], ...] = ()  # the units the last compile's fold lacked (_Folding.wanted)

    # -- state ------------------------------------------------------------------------------

    def initialize(self, ctx: StrategyContext) -> None:
        self._ctx = ctx
        # Each record of the strategy's own state is checked as it is read: a log's record this version
        # can't read refuses the start (ValueError: the memory is kept); any other is logged and treated
        # as absent (attempts and ladder steps: their units start afresh).
        where = f"namespace {ctx.namespace!r} on branch {ctx.branch!r}"
        self.chunks = chunks_from(ctx.read_log("chunks"), where)
        self.summaries = summaries_from(ctx.read_log("summaries"), where)
        by_ids = {chunk.message_ids: chunk.id for chunk in self.chunks}
        self._compressed = {by_ids[s.source_ids] for s in self.summaries if s.level == 1 and s.source_ids in by_ids}
        self._leaf_cache = {}
        merged = {s.id for s in self.summaries if s.parent_id is not None}
        # A done unit's entries are dropped (written at the next write of each record).
        self.attempts = {key: count for key, count in attempts_from(ctx.get_value("attempts"), where).items()
                         if not settled(key, self._compressed, merged, count)}
        self.ladder = {key: step for key, step in ladder_from(ctx.get_value("ladder"), where).items()
                       if not settled(key, self._compressed, merged)}
        self._pending = {c.id: c for c in self.chunks
                         if c.id not in self._compressed and self.attempts.get(c.id, 0) < MAX_ATTEMPTS}
        self._unmerged = {}
        for summary in self.summaries:
            if summary.parent_id is None:
                self._unmerged.setdefault(summary.level, []).append(summary)
        self.head_start_id = head_start_from(ctx.get_value("head_start"), where)
        self.pins, self._next_pin = pins_from(ctx.get_value("pins"), where)
        self.resolutions, self._wanted = resolutions_from(ctx.get_value("resolutions"), where), ()
        # initialize writes nothing (the actor drops what it buffers): chunks that can close now
        # close, with their records and the floor, at the next next_unit or select.
        self._built_holds, self._built_stamp = ctx.hold_floor(), ctx.view.window(1).stamp
        self._dirty = bool(self._closing(ctx))

    # -- zones and chunks -------------------------------------------------------------------

    def _head(self, messages: Sequence[Message], view: MessageView) -> tuple[int, int]:
        head = self._zones.head(messages, view, self.head_start_id)
        return head.start, head.end

    def _rebuild(self, ctx: StrategyContext) -> None:
        """Close and persist the chunks ``_closing`` finds (only whole chunks; T3)."""
        # Chunk records and the floor mark commit after this returns; if they can't (D4), the actor
        # reloads the strategy from what is stored, so the frontier waits for the next try.
        self._dirty, self._built_holds, self._built_stamp = False, ctx.hold_floor(), ctx.view.window(1).stamp
        for chunk in self._closing(ctx):
            # The floor rises before (in the same commit as) the chunk's record: it may be read for
            # compression from then on (D2).
            ctx.mark_compression_read(chunk.last_sequence)
            ctx.append_log("chunks", chunk_record(chunk))
            self.chunks.append(chunk)
            self._pending[chunk.id] = chunk

    def _closing(self, ctx: StrategyContext) -> list[Chunk]:
        """The chunks that close now over the frontier, oldest first; changes nothing. They close
        only below the recent window and below the earliest held message (T5)."""
        view = ctx.view
        messages = view.get_all()
        head = self._head(messages, view)
        end = self._zones.recent_start(messages, view, head[1])
        held = ctx.hold_floor()
        if held is not None:
            end = min(end, bisect_left(messages, held, key=sequence_key))
        target, boundary = self.settings.target_chunk_tokens, self._remembered(view.window(1).stamp)
        return closing(messages, view, closed=self.chunks, head=head, end=end,
                       rule=lambda: with_boundary(self.policy.chunk_rule(target), boundary, self._boundary_raised))

    def _remembered(self, stamp: object) -> Boundary | None:
        """The host's ``chunk_boundary``, asked once per pair: each walk re-walks the pending stretch,
        so its answers are kept from one walk to the next (only the last walk's: bounded by the
        stretch). Exact: under one view stamp (the view changed only by appending) a chunk's first
        message, last message and the next message's ids name the same three arguments, and the
        function is pure; an answer that raised isn't kept."""
        boundary = self.config.chunk_boundary
        if boundary is None:
            return None
        known = self._boundary_answers if self._boundary_stamp == stamp else {}
        answers: dict[tuple[str, str, str], bool] = {}
        self._boundary_answers, self._boundary_stamp = answers, stamp

        def asked(previous: Message, following: Message, chunk: Sequence[Message]) -> bool:
            key = (chunk[0].id, previous.id, following.id)
            closes = known[key] if key in known else bool(boundary(previous, following, chunk))
            answers[key] = closes
            return closes

        return asked

    def _boundary_raised(self, message: Message, error: Exception) -> None:
        if message.id not in self._boundary_failed:
            self._boundary_failed.add(message.id)
            logger.warning("chunk_boundary raised after message %s; taken as no boundary", message.id, exc_info=error)

    def _stale(self, ctx: StrategyContext | None) -> bool:
        """Whether chunks may close now that didn't at the last rebuild: new messages, the view
        changed otherwise (an edit or a reveal may lengthen the pending stretch), or a hold released
        or timed out since (T5)."""
        return self._dirty or (ctx is not None and (ctx.hold_floor() != self._built_holds
                                                    or ctx.view.window(1).stamp != self._built_stamp))

    def _instruction(self, chunk_messages: Sequence[Message], *, plain_text: bool = False) -> str:
        """A chunk's instruction; ``plain_text``: and not to call a tool (the ladder's first rung, T12)."""
        plain = chunk_instruction(self.config, witnessed=self._witnessed(chunk_messages))
        detail = self.policy.instruction_detail(chunk_messages)
        said = f"{plain} {detail}" if detail else plain
        return f"{said}\n\n{PLAIN_TEXT_INSTRUCTION}" if plain_text else said

    def _witnessed(self, chunk_messages: Sequence[Message]) -> bool:
        """Whether a chunk's events all came before ``witnessed_before_sequence`` (before the resident)."""
        before = self.config.witnessed_before_sequence
        return before is not None and bool(chunk_messages) and chunk_messages[-1].sequence < before

    def on_new_message(self, message: Message, ctx: StrategyContext) -> None:
        # Chunks close at the next tick or compile: one frontier walk per batch of new messages.
        self._dirty = True

    # -- queues -----------------------------------------------------------------------------

    def _l1_queue(self, closing: Sequence[Chunk] = (), *, capped: bool = True) -> list[Chunk]:
        """The chunks waiting for an L1, oldest first; ``closing``: chunks about to close, counted
        too; ``capped``: only those ``max_speculative_l1s`` lets the queue make now."""
        cap = self.config.max_speculative_l1s if capped else None
        room = None if cap is None else max(0, cap - len(self._unmerged.get(1, ())))
        return l1_queue(self._pending.values(), self.chunks, self.config.l1_holdback_chunks, closing, room=room)

    def _merge_queue(self) -> list[Summary] | None:
        if not self.config.hierarchical:
            return None
        return merge_group(self._unmerged, self.attempts, self.settings.merge_threshold,
                           max_span=self.config.merge_max_source_span_messages, span=self._span)

    def _span(self, summary: Summary) -> int:
        """How many messages ``summary`` covers (what ``merge_max_source_span_messages`` bounds)."""
        return len(self._leaves(summary))

    # -- live settings (T14) -----------------------------------------------------------------

    def default_settings(self) -> StrategySettings:
        c = self.config
        return StrategySettings(c.head_window_tokens, c.recent_window_tokens, c.target_chunk_tokens, c.merge_threshold,
                                c.auto_tick)

    def use_settings(self, settings: StrategySettings) -> None:
        self.settings, self.auto_tick = settings, settings.auto_tick
        self._zones.resize(settings.head_window_tokens, settings.recent_window_tokens)
        self._dirty = True  # a smaller target or window may close chunks now; those closed stay

    def wake_at(self) -> float | None:
        """When the drain may try again after a transient model failure (the context's clock), or None."""
        return self._backoff.until or None

    def is_ready(self) -> bool:
        # New messages are work only if they close a chunk (counted dry, as backlog counts them).
        ctx = self._ctx
        closing = self._closing(ctx) if ctx is not None and self._stale(ctx) else ()
        return not self._l1_queue(closing) and self._merge_queue() is None and self._demanded(None) is None

    def quarantined(self) -> list[str]:
        return quarantined(self.attempts)

    def retry_quarantined(self, ctx: StrategyContext) -> list[str]:
        keys = self.quarantined()
        if not keys:
            return []
        for key in keys:
            del self.attempts[key]
        by_id = {chunk.id: chunk for chunk in self.chunks}
        for key in keys:
            if key in by_id and key not in self._compressed:
                self._pending[key] = by_id[key]
        self._pending = dict(sorted(self._pending.items(), key=lambda item: item[1].first_sequence))
        ctx.set_value("attempts", self.attempts)
        logger.warning("retrying %d quarantined unit(s) in namespace %r: %s", len(keys), ctx.namespace, keys)
        return keys

    def backlog(self, ctx: StrategyContext) -> Backlog:
        # As the next compile or tick would leave it: the chunks that would close count, unclosed.
        # The debt counts the chunks max_speculative_l1s holds back too: they are still raw.
        # So do the units the last fold lacked (T10) that neither queue holds.
        queue = self._l1_queue(self._closing(ctx) if self._stale(ctx) else (), capped=False)
        group = self._merge_queue()
        queued = {chunk.id for chunk in queue} | ({group_key(group)} if group is not None else set())
        lacking = [unit for unit in self._lacking() if unit.key not in queued]
        tokens = 0
        for chunk in [*queue, *(unit.work for unit in lacking if isinstance(unit.work, Chunk))]:
            for message_id in chunk.message_ids:
                message = ctx.view.get(message_id)
                tokens += 0 if message is None else ctx.view.estimate_tokens(message)
        return Backlog(len(queue) + (group is not None) + len(lacking), tokens)

    # -- compression ------------------------------------------------------------------------

    def next_unit(self, ctx: StrategyContext) -> Unit | None:
        """Close what chunks can close, then the oldest chunk without an L1, else a level-1
        summary the last fold lacked (a held-back chunk's), else a merge group, else a merge the
        last fold lacked (T10: of merge_threshold summaries, lined up with its chunks)."""
        if self._stale(ctx):
            self._rebuild(ctx)
        queue = self._l1_queue()
        if queue:
            chunk = queue[0]
            return Unit(chunk.id, chunk.last_sequence, chunk)
        demanded = self._demanded(1)
        if demanded is not None:
            return demanded
        group = self._merge_queue()
        if group is not None:
            return Unit(group_key(group), max(s.last_sequence for s in group), tuple(group))
        return self._demanded(2)

    def _demanded(self, level: int | None) -> Unit | None:
        """The first unit the last fold lacked that can still be made (of ``level``: 1 a chunk's
        level-1 summary, 2 a merge; None either)."""
        lacking = self._lacking(level)
        return lacking[0] if lacking else None

    def _lacking(self, level: int | None = None) -> list[Unit]:
        """The units the last fold lacked that can still be made, in its order: a chunk still
        pending (not quarantined), or a run of unmerged summaries of one level, in order, not
        quarantined as a group."""
        units = []
        for wanted in self._wanted:
            if len(wanted) == 1 and level != 2:
                chunk = self._pending.get(wanted[0])
                if chunk is not None:
                    units.append(Unit(chunk.id, chunk.last_sequence, chunk))
            elif len(wanted) > 1 and level != 1 and self.config.hierarchical:
                group = self._unmerged_run(wanted)
                if group is not None:
                    units.append(Unit(group_key(group), max(s.last_sequence for s in group), tuple(group)))
        return units

    def _unmerged_run(self, ids: tuple[str, ...]) -> list[Summary] | None:
        """The summaries ``ids`` if they are a run of one level's unmerged ones, in order, and
        their merge isn't quarantined."""
        for run in self._unmerged.values():
            at = next((index for index, summary in enumerate(run) if summary.id == ids[0]), None)
            if at is not None:
                group = run[at : at + len(ids)]
                if tuple(s.id for s in group) == ids and self.attempts.get(group_key(group), 0) < MAX_ATTEMPTS:
                    return group
                return None
        return None

    def request_for(self, unit: Unit, ctx: StrategyContext) -> ModelRequest:
        """The unit's request at its rung of the refusal ladder (T12): the full request, then, as
        rungs are taken, a plain-text instruction, no tools, the source alone, one half of it."""
        participant = self.config.summary_participant
        step = self.ladder.get(unit.key, Step())
        messages: list[CompiledMessage]
        if isinstance(unit.work, Chunk):
            messages = self._l1_request(ctx, unit.work, step)
        elif isinstance(unit.work, tuple) and unit.work and isinstance(unit.work[0], Summary):
            group = _half(unit.work, step.half)
            messages = merge_request(self.config, group, participant, plain_text=step.at_least(PLAIN_TEXT))
        else:
            messages = transition_request(unit.work)
        # A namespace's own system prompt comes first: the request is then a prefix of the agent's
        # own (its prompt cache) and keeps its identity; the host's summary prompt stands in for none.
        system = ctx.system_prompt or self.config.summary_system_prompt or SYSTEM
        max_tokens = self.config.compression_max_tokens or int(self.config.summary_target_tokens * 1.5)
        tools = () if step.at_least(NO_TOOLS) else tuple(ctx.tools)
        return ModelRequest(self.config.compression_model, system, tuple(messages), max_tokens,
                            assistant=frozenset({participant}), tools=tools)

    def apply_unit(self, unit: Unit, outcome: ModelResponse | ModelError, ctx: StrategyContext) -> bool:
        """Take a unit's reply: a summary, the next rung of its ladder after a refusal (T12), or a
        failure that counts (T13); an outage changes nothing."""
        step = self.ladder.get(unit.key, Step())
        text = self._reply_text(ctx, outcome)
        if text is _TRANSIENT:
            self._note(unit.key, step, "transient")
            return False  # queued as it was: an outage is not the unit's fault
        if isinstance(text, str):
            if step.half == 1:  # the split's first half: the second is the unit's next request
                self._set_step(ctx, unit.key, attrs.evolve(step, first_half=text))
                self._note(unit.key, step, "half")
                return True
            if step.first_half is not None:
                text = stitch(step.first_half, text)
            if isinstance(unit.work, Chunk):
                self._apply_l1(ctx, unit.work, text)
                done: tuple[set[str], set[str]] = {unit.work.id}, set()
            else:
                self._apply_merge(ctx, list(unit.work), text)
                done = set(), {s.id for s in unit.work}
            self._note(unit.key, step, "summary")
            self._forget_settled(ctx, *done)
            return True
        failure = self._failure(outcome)
        rung = None
        if isinstance(outcome, ModelResponse) and refusal(outcome) is not None:
            rung = next_rung(step, self.config.refusal_fallbacks, lambda name: self._changes(unit, ctx, name))
        if rung is not None:
            logger.warning("compression of %s in %r: %s at rung %r; trying %r", unit.key, ctx.namespace, failure,
                           step.rung, rung)
            self._set_step(ctx, unit.key, Step(rung, step.taken + 1, failure=failure))
            self._note(unit.key, step, "fallback", failure, rung)
            return True  # a rung is progress: the unit's next request differs
        self._set_step(ctx, unit.key, None)  # the next attempt starts from the full request
        return self._fail(ctx, unit.key, step, failure)

    def unit_outcome(self, unit: Unit) -> UnitOutcome | None:
        if self._outcome is None or self._outcome[0] != unit.key:
            return None
        return self._outcome[1]

    def _note(self, key: str, step: Step, result: str, failure: str | None = None, rung: str | None = None) -> None:
        """What became of ``key``'s reply at ``step`` (``unit_outcome``); ``rung``: the one tried next."""
        attempts = self.attempts.get(key, 0)
        self._outcome = key, UnitOutcome(step.rung, result, step.half, failure, rung, attempts,
                                         result == "failure" and attempts >= MAX_ATTEMPTS)

    def _changes(self, unit: Unit, ctx: StrategyContext, rung: str) -> bool:
        """Whether ``rung`` would change ``unit``'s request (one that wouldn't is skipped, uncounted)."""
        work = unit.work
        if rung == NO_TOOLS:
            return bool(ctx.tools)
        if rung == SOURCE_ONLY:  # a merge reads its sources alone already
            return isinstance(work, Chunk) and any(self._l1_context(ctx, work))
        if rung == SPLIT:
            if isinstance(work, Chunk):
                return sum(ctx.view.get(i) is not None for i in work.message_ids) >= 2
            return isinstance(work, tuple) and len(work) >= 2
        return rung == PLAIN_TEXT

    def _set_step(self, ctx: StrategyContext, key: str, step: Step | None) -> None:
        """Store where ``key`` stands on its ladder (None: at the top) beside its attempts, so a
        restart resumes it."""
        if step is None:
            if self.ladder.pop(key, None) is None:
                return
        else:
            self.ladder[key] = step
        ctx.set_value("ladder", ladder_record(self.ladder))

    def _forget_settled(self, ctx: StrategyContext, compressed: set[str], merged: set[str]) -> None:
        """Drop the attempts and ladder steps of the units done now that a chunk's L1 is made
        (``compressed``) or summaries merged (``merged``), this unit's and any other group's that
        can't be made any more, and store each record that changed: neither grows with the run."""
        attempts = {key: count for key, count in self.attempts.items() if not settled(key, compressed, merged, count)}
        if len(attempts) < len(self.attempts):
            self.attempts = attempts
            ctx.set_value("attempts", attempts)
        ladder = {key: step for key, step in self.ladder.items() if not settled(key, compressed, merged)}
        if len(ladder) < len(self.ladder):
            self.ladder = ladder
            ctx.set_value("ladder", ladder_record(ladder))

    def _frontier(self) -> list[Summary]:
        return [summary for level in sorted(self._unmerged) for summary in self._unmerged[level]]

    def _reply_text(self, ctx: StrategyContext, outcome: ModelResponse | ModelError | None) -> Any:
        """A reply's summary text; None for a failure that counts; ``_TRANSIENT`` for an outage."""
        if isinstance(outcome, ModelError):
            logger.warning("compression request in %r failed: %s", ctx.namespace, outcome)
            if outcome.retryable and not self._backoff.failed(ctx.now()):
                return _TRANSIENT  # the drain waits the back-off out
            return None
        if outcome is None:
            return None
        self._backoff.answered()
        text = outcome.text.strip()
        if outcome.stop_reason != "end_turn" or not text or refusal(outcome) is not None:
            logger.warning("compression in %r gave %r with %d chars: not a memory", ctx.namespace,
                           outcome.stop_reason, len(text))
            return None  # only a complete end_turn with text (and no tool call) becomes a summary (T4)
        return text

    @staticmethod
    def _failure(outcome: ModelResponse | ModelError) -> str:
        """Why a reply is not a memory, in a few words."""
        if isinstance(outcome, ModelError):
            return str(outcome)
        return refusal(outcome) or outcome.stop_reason

    def _fail(self, ctx: StrategyContext, key: str, step: Step, failure: str) -> bool:
        self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.attempts[key] >= MAX_ATTEMPTS:
            logger.error("quarantined %s in namespace %r after %d failed attempts (the last: %s at rung %r); it "
                         "stays raw", key, ctx.namespace, self.attempts[key], failure, step.rung)
            self._pending.pop(key, None)
        ctx.set_value("attempts", self.attempts)
        self._note(key, step, "failure", failure)
        return True  # an attempt is progress: the next unit may differ

    def _l1_context(self, ctx: StrategyContext, chunk: Chunk) -> tuple[list[Message], list[CompiledMessage]]:
        """What an L1 request shows before its chunk: the head before it and prior recall pairs (T4)."""
        view = ctx.view
        messages = view.get_all()
        head_start, head_end = self._head(messages, view)
        head = [m for m in messages[head_start:head_end] if m.sequence < chunk.first_sequence]
        recalled = recall_pairs(self._frontier(), chunk.first_sequence, self.config.summary_participant,
                                self.config.recall_budget_tokens)
        return head, recalled

    def _l1_request(self, ctx: StrategyContext, chunk: Chunk, step: Step) -> list[CompiledMessage]:
        """"As of" the chunk: head, prior recall pairs, the chunk, the instruction; nothing after (T4).
        From the ladder's source-only rung on, the chunk alone; on its split rung, one half of it
        (which reads nothing of the other)."""
        view = ctx.view
        chunk_messages = _half([m for m in (view.get(i) for i in chunk.message_ids) if m is not None], step.half)
        head, recalled = ([], []) if step.at_least(SOURCE_ONLY) else self._l1_context(ctx, chunk)
        instruction = self._instruction(chunk_messages, plain_text=step.at_least(PLAIN_TEXT))
        return chunk_request(head, recalled, chunk_ask(self.config, chunk_messages, instruction),
                             self.config.summary_participant)

    def _apply_l1(self, ctx: StrategyContext, chunk: Chunk, text: str) -> None:
        view = ctx.view
        chunk_messages = [m for m in (view.get(i) for i in chunk.message_ids) if m is not None]
        first, last = chunk_messages[0] if chunk_messages else None, chunk_messages[-1] if chunk_messages else None
        summary = Summary(
            f"L1-{len(self.summaries)}", 1, text, estimate_text(text), chunk.message_ids, chunk.first_sequence,
            chunk.last_sequence, first.id if first else chunk.message_ids[0],
            last.id if last else chunk.message_ids[-1], int(time.time() * 1000), None,
            self.policy.phase_of_chunk(chunk_messages), self._witnessed(chunk_messages),
        )
        self._store(ctx, summary)
        self._compressed.add(chunk.id)
        self._pending.pop(chunk.id, None)

    def _apply_merge(self, ctx: StrategyContext, group: list[Summary], text: str) -> None:
        level = group[0].level + 1
        summary = Summary(
            f"L{level}-{len(self.summaries)}", level, text, estimate_text(text), tuple(s.id for s in group),
            group[0].first_sequence, group[-1].last_sequence, group[0].first_id, group[-1].last_id,
            int(time.time() * 1000), witnessed=all(s.witnessed for s in group),
        )
        self._store(ctx, summary)
        members = {s.id for s in group}
        self.summaries = [attrs.evolve(s, parent_id=summary.id) if s.id in members else s for s in self.summaries]
        self._unmerged[group[0].level] = [s for s in self._unmerged[group[0].level] if s.id not in members]

    def _store(self, ctx: StrategyContext, summary: Summary) -> None:
        ctx.append_log("summaries", summary_record(summary))
        self.summaries.append(summary)
        self._unmerged.setdefault(summary.level, []).append(summary)

    # -- selection --------------------------------------------------------------------------

    def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        if not options.dry_run and options.context is not None and self._stale(options.context):
            self._rebuild(options.context)  # bookkeeping: if it can't commit, the compile goes on (P1, D4)
        entries, selection = self._plan(view, budget)
        stats = selection.stats
        if self.config.enforce_budget and stats.dropped_ids:
            raise self._refusal(view, budget, selection, options.context)
        if options.strict and stats.dropped_ids:
            raise OverBudgetError(f"strict compile refused: {stats.dropped_reason}", budget=budget.usable,
                                  actual=stats.total_tokens)
        if not options.dry_run:
            self._stats = stats
            if isinstance(selection.fold, _Folding):
                self._keep_fold(selection.fold, options.context)
        return entries

    def _keep_fold(self, folding: _Folding, ctx: StrategyContext | None) -> None:
        """A compile's fold becomes the previous one (stored as the ``resolutions`` value when it
        changed, so a restart or a fork starts from it), and what it lacked is queued (T10)."""
        self._wanted = folding.wanted
        levels = {chunk: level for chunk, level in zip(folding.chunks, folding.fold.levels) if level}
        if levels != self.resolutions:
            self.resolutions = levels
            if ctx is not None:
                ctx.set_value("resolutions", levels)

    def _refusal(self, view: MessageView, budget: Budget, selection: Selection,
                 ctx: StrategyContext | None) -> OverBudgetError:
        """The ``OverBudgetError`` of an ``enforce_budget`` compile that would leave history out (T11)."""
        stats, folding = selection.stats, selection.fold
        shown = stats.total_tokens
        if isinstance(folding, _Folding):
            fold = folding.fold
            needed = fold.tokens
            actual = shown - stats.summary_tokens - stats.middle_raw_tokens + needed
            levels = tuple(zip(folding.chunks, fold.levels))
            deepest, lacking = fold.deepest, tuple(",".join(wanted) for wanted in folding.wanted)
            reached = "at full folding"
            if fold.least > folding.allowance:  # what it lacks would not make it fit: say so, name none
                top = sum(node.level == 3 for node in fold.shown)
                lacking, reached = (), (
                    f"at full folding (nothing can make it fit: with every level-1 summary and whole merge made, "
                    f"the middle would still need about {fold.least:,} tokens of its {folding.allowance:,}: "
                    f"{folding.fixed:,} for messages no chunk holds yet, and {top} level-3 summaries, which never "
                    f"merge further)")
        else:  # no folding: what is shown and what is left out
            left_out = sum(view.estimate_tokens(m) for m in map(view.get, stats.dropped_ids) if m is not None)
            needed = stats.summary_tokens + stats.middle_raw_tokens + left_out
            actual, levels = shown + left_out, ()
            deepest = max((level for level, _ in stats.summaries), default=0)
            group = self._merge_queue()
            lacking = (*(chunk.id for chunk in self._l1_queue()), *(() if group is None else (group_key(group),)))
            reached = "shown and left out"
        grace = self.config.over_budget_grace_ratio
        where = f" in namespace {ctx.namespace!r}" if ctx is not None else ""
        return OverBudgetError(
            f"compile{where} refused (enforce_budget): {actual:,} tokens {reached} exceed the budget of "
            f"{budget.usable:,} with a grace of {grace:.0%}; {stats.dropped_reason}", budget=budget.usable,
            actual=actual, diagnostics=OverBudgetDiagnostics(
                stats.head_tokens, stats.summary_tokens, stats.middle_raw_tokens, stats.tail_tokens, needed, levels,
                deepest, lacking))

    def preview(self, view: MessageView, budget: Budget, options: SelectOptions) -> PreviewResult:
        _, s = self._plan(view, budget)
        return PreviewResult(s.total_tokens <= budget.usable, s.total_tokens, budget.usable, s.head_tokens,
                             s.tail_tokens, s.middle_tokens)

    def render_stats(self) -> RenderStats | None:
        return self._stats

    def _plan(self, view: MessageView, budget: Budget) -> tuple[list[Entry], Selection]:
        """The selection, and its entries after the live policy."""
        config = self.config
        price = self._prices.pricer(view)
        budgets: LevelBudgets = (config.l1_budget_tokens, config.l2_budget_tokens, config.l3_budget_tokens)
        selection = select(
            view.get_all(), view, budget.usable, made=self._made, zones=self._zones, head_start_id=self.head_start_id,
            pins=self.pins, frontier=frontier_under_pins(self._frontier(), self.summaries, self.pins),
            leaves=self._leaves, price=price, choose_l1=self.policy.choose_l1,
            pending_units=len(self._l1_queue()) + (self._merge_queue() is not None),
            coverage=self._coverage, stamp=view.window(1).stamp, live=config, live_memo=self._live_memo,
            level_budgets=None if budgets == (None, None, None) else budgets,
            folder=self._folder(price, budget.usable) if config.adaptive_resolution else None,
        )
        return selection.entries, selection

    def _folder(self, price: Price, usable: int) -> MiddleFolder:
        """Adaptive resolution (T10): the middle's summaries from the fold ``solve`` picks for
        its allowance after the last compile's; with ``enforce_budget``, a fold that can't fit
        may take the grace (``over_budget_grace_ratio`` of the budget) before the compile refuses."""
        config = self.config

        def fold(messages: Sequence[Message], middle: Runs, pinned: Sequence[int], cost: Callable[[int], int],
                 allowance: int) -> Folded:
            made = fold_problem(messages, middle, pinned, cost, chunks=self.chunks, summaries=self.summaries,
                                pins=self.pins, price=price)
            chunks, problem, nodes = made.chunks, made.problem, made.nodes
            previous = None if self.resolutions is None else [self.resolutions.get(chunk.id, 0) for chunk in chunks]
            found = solve(problem, allowance, previous=previous, folding=config.folding,
                          slack_ratio=config.slack_ratio, merge_span=self.settings.merge_threshold)
            grace = int(usable * config.over_budget_grace_ratio) if config.enforce_budget and not found.fits else 0
            shown_nodes = newest_within(found, allowance + grace)
            by_id = {summary.id: summary for summary in self.summaries}
            shown = [by_id[node.key] for node in shown_nodes]
            wanted: list[tuple[str, ...]] = []
            sealed = sealed_summaries(self.attempts)  # as merge_group: no merge starts from one
            for lack in found.lacking:
                if lack.level == 1:
                    wanted.append((chunks[lack.start].id,))
                elif config.hierarchical:
                    group = [node.key for node in nodes if node.level == lack.level - 1
                             and lack.start <= node.start and node.stop <= lack.stop]
                    if not group or group[0] in sealed:
                        continue  # merge_group's next group starts after it
                    if config.merge_max_source_span_messages is not None:  # as merge_group: T15
                        group = [s.id for s in within_span([by_id[key] for key in group],
                                                           config.merge_max_source_span_messages, self._span)]
                    if len(group) >= 2:
                        wanted.append(tuple(group))
            return Folded(shown, sum(node.tokens for node in shown_nodes), grace,
                          _Folding(tuple(chunk.id for chunk in chunks), found, tuple(wanted), allowance,
                                   problem.fixed))

        return fold

    # -- pins (docs/api.md, Host controls) ---------------------------------------------------

    def pin_range(
        self, ctx: StrategyContext, first_id: str, last_id: str, *, name: str | None, level: int | None
    ) -> Pin:
        view = ctx.view
        first, last = view.get(first_id), view.get(last_id)
        for given, found in ((first_id, first), (last_id, last)):
            if found is None:
                raise MessageNotFoundError(f"no message {given!r} in the view of {ctx.namespace!r} to pin")
        assert first is not None and last is not None
        if first.sequence > last.sequence:
            raise ValueError(f"first_id {first_id!r} comes after last_id {last_id!r}")
        pin = Pin(f"pin-{self._next_pin}", first.id, last.id, first.sequence, last.sequence, name, level,
                  int(time.time() * 1000))
        self.pins.append(pin)
        self._next_pin += 1
        self._store_pins(ctx)
        return pin

    def unpin(self, ctx: StrategyContext, pin_id: str) -> bool:
        kept = [pin for pin in self.pins if pin.id != pin_id]
        if len(kept) == len(self.pins):
            return False
        self.pins = kept
        self._store_pins(ctx)
        return True

    def list_pins(self) -> list[Pin]:
        return list(self.pins)

    def max_summary_level(self) -> int:
        """The deepest level of any summary kept (0: none yet)."""
        return max((summary.level for summary in self.summaries), default=0)

    def _store_pins(self, ctx: StrategyContext) -> None:
        ctx.set_value("pins", pins_record(self.pins, self._next_pin))

    def _leaves(self, summary: Summary) -> tuple[str, ...]:
        """The message ids ``summary`` covers (memoised: a summary's coverage never changes)."""
        if summary.level == 1:
            return summary.source_ids
        leaves = self._leaf_cache.get(summary.id)
        if leaves is None:
            by_id = {s.id: s for s in self.summaries}
            leaves = tuple(leaf for child in summary.source_ids if child in by_id for leaf in self._leaves(by_id[child]))
            self._leaf_cache[summary.id] = leaves
        return leaves

    # -- summary reads (T6) -----------------------------------------------------------------

    def search_summaries(
        self, ctx: StrategyContext, *, text: str | None = None, regex: str | None = None,
        levels: Sequence[int] | None = None, limit: int = 50, include_merged: bool = False,
    ) -> list[SummaryMatch]:
        pattern = re.compile(regex) if regex is not None else None
        found = []
        for summary in self.summaries:
            if summary.parent_id is not None and not include_merged:
                continue
            if levels is not None and summary.level not in levels:
                continue
            if pattern is not None:
                count = len(pattern.findall(summary.content))
            elif text is not None:
                count = summary.content.lower().count(text.lower())
            else:
                count = 1
            if count:
                found.append(SummaryMatch(summary, count))
        found.sort(key=lambda m: (-m.matches, -m.summary.created_ms))
        return found[:limit]

    def get_summary(self, ctx: StrategyContext, summary_id: str) -> Summary | None:
        return next((s for s in self.summaries if s.id == summary_id), None)

    def get_summaries_in_range(
        self, ctx: StrategyContext, *, from_ms: int | None = None, to_ms: int | None = None, level: int | None = None
    ) -> list[Summary]:
        view = ctx.view
        found = []
        for summary in self.summaries:
            if level is not None and summary.level != level:
                continue
            first, last = view.get(summary.first_id), view.get(summary.last_id)
            if first is None or last is None:
                continue
            if (to_ms is None or first.timestamp_ms <= to_ms) and (from_ms is None or last.timestamp_ms >= from_ms):
                found.append((first.timestamp_ms, summary))
        return [summary for _, summary in sorted(found, key=lambda item: item[0])]

    # -- head-window reset (T6) --------------------------------------------------------------

    def transition_unit(self, ctx: StrategyContext) -> Unit:
        """The transition summary's unit: it reads the head window (or the last 20 messages)."""
        view = ctx.view
        messages = view.get_all()
        head_start, head_end = self._head(messages, view)
        head = tuple(messages[head_start:head_end] or messages[-20:])
        return Unit("transition", head[-1].sequence if head else 0, head)

    def transition_content(
        self, ctx: StrategyContext, text: str | None, outcome: ModelResponse | ModelError | None
    ) -> list[dict[str, Any]]:
        """A host's text is stored as given; a made summary stays the reader's (D8)."""
        if text is not None:
            return [{"type": "text", "text": f"{TRANSITION_PREFIX}\n\n{text}"}]
        made = self._reply_text(ctx, outcome)
        if not isinstance(made, str):
            raise ModelError(f"no transition summary could be made for namespace {ctx.namespace!r}")
        block: dict[str, Any] = {"type": "text", "text": f"{TRANSITION_PREFIX}\n\n{made}"}
        if ctx.reader is not None:
            block["audience"] = [ctx.reader]
        return [block]

    def start_head_window(self, ctx: StrategyContext, message_id: str) -> None:
        ctx.set_value("head_start", message_id)
        self.head_start_id = message_id


@attrs.frozen
class Autobiographical:
    """Config of ``AutobiographicalStrategy`` (docs/api.md, Strategies)."""

    compression_model: str = attrs.field(validator=text)
    target_chunk_tokens: int = attrs.field(default=3000, validator=at_least(1))
    head_window_tokens: int = attrs.field(default=0, validator=non_negative_int)
    recent_window_tokens: int = attrs.field(default=30000, validator=non_negative_int)
    hierarchical: bool = attrs.field(default=True, validator=flag)
    merge_threshold: int = attrs.field(default=6, validator=at_least(2))  # a merge of one summary is that summary
    summary_target_tokens: int = attrs.field(default=2000, validator=at_least(1))
    auto_tick: bool = attrs.field(default=False, validator=flag)
    summary_participant: str = attrs.field(default="Claude", validator=text)
    max_message_tokens: int = attrs.field(default=0, validator=non_negative_int)
    l1_holdback_chunks: int = attrs.field(default=1, validator=non_negative_int)
    # What stays live (strategies/live.py), as WindowedPassthrough's.
    max_live_images: int = attrs.field(default=6, validator=non_negative_int)
    max_live_image_bytes: int = attrs.field(default=20 * MIB, validator=non_negative_int)
    image_strip_depth_tokens: int = attrs.field(default=30_000, validator=non_negative_int)
    tool_result_max_last_n: int | None = attrs.field(default=None, validator=optional_count)
    tool_use_input_max_tokens: int = attrs.field(default=0, validator=non_negative_int)
    # Voice (multi-resident): chunks wholly before this sequence happened before the resident
    # joined and are remembered in the witnessed voice; a reminder of who it is ends every
    # compression instruction.
    witnessed_before_sequence: int | None = attrs.field(default=None, validator=optional_count)
    witnessed_instruction: str | None = attrs.field(default=None, validator=optional_text)
    identity_reminder: str | None = attrs.field(default=None, validator=optional_text)

    # Long runs (docs/behaviours.md T10-T15): folding under budget (adaptive resolution), refusing
    # instead of dropping, the refusal ladder, and the knobs a host tunes.
    adaptive_resolution: bool = attrs.field(default=False, validator=flag)
    folding: str = attrs.field(default="kv-stable", validator=one_of("kv-stable", "flat"))
    slack_ratio: float = attrs.field(default=0.1, validator=ratio(0.0, 0.9))
    enforce_budget: bool = attrs.field(default=False, validator=flag)
    over_budget_grace_ratio: float = attrs.field(default=0.0, validator=ratio(0.0, 1.0))
    refusal_fallbacks: int = attrs.field(default=3, validator=non_negative_int)
    l1_budget_tokens: int | None = attrs.field(default=None, validator=optional_count)
    l2_budget_tokens: int | None = attrs.field(default=None, validator=optional_count)
    l3_budget_tokens: int | None = attrs.field(default=None, validator=optional_count)
    recall_budget_tokens: int | None = attrs.field(default=None, validator=optional_count)
    compression_max_tokens: int | None = attrs.field(default=None, validator=optional_at_least(1))
    merge_max_source_span_messages: int | None = attrs.field(default=None, validator=optional_at_least(1))
    max_speculative_l1s: int | None = attrs.field(default=None, validator=optional_count)
    summary_system_prompt: str | None = attrs.field(default=None, validator=optional_text)
    summary_user_prompt: str | None = attrs.field(default=None, validator=optional_text)
    # (previous, next, chunk) -> bool, pure: whether a chunk closes between two messages.
    chunk_boundary: Callable[[Message, Message, Sequence[Message]], bool] | None = attrs.field(
        default=None, validator=optional_callable)

    def create(self) -> AutobiographicalStrategy:
        return AutobiographicalStrategy(self, AUTOBIOGRAPHICAL)
