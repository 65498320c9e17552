"""Autobiographical compression: head window, recent window, persisted chunks, hierarchical
summaries made by a model (docs/behaviours.md T3-T6).

Zones over the reader's view: a verbatim head window, a raw recent window (evicted newest
first, emitted chronologically), and the middle, cut into chunks that close at
``target_chunk_tokens`` (at least 4 messages, never right after a tool_use). Closed chunks are
persisted, so boundaries are stable across restarts; each is compressed into an L1 summary
"as of" the chunk, and L1s merge into L2 (L2 into L3) at ``merge_threshold``. The narrowing
floor is raised before every compression read (docs/behaviours.md D2, D4).
"""

from __future__ import annotations

import logging
import re
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..selection import Entry, PreviewResult, non_negative_int
from ..content import (
    CompiledMessage,
    Document,
    Image,
    Message,
    Text,
    ToolResult,
    ToolUse,
    has_block,
    sequence_key,
)
from ..errors import MessageNotFoundError, ModelError, OverBudgetError
from ..model import ModelRequest, ModelResponse
from ..tokens import estimate_text
from .base import (
    Backlog,
    Pin,
    RenderStats,
    SelectOptions,
    Strategy,
    StrategyContext,
    Unit,
    optional_count,
    optional_text,
    raw_entry,
)
from .live import MIB, LiveMemo, apply_live_policy
from .shaping import shape

if TYPE_CHECKING:
    from ..selection import Budget
    from ..views import MessageView

logger = logging.getLogger("ctxrt.autobiographical")

MANAGER = "Context Manager"
TRANSITION_PREFIX = "[Topic Transition]"
SYSTEM = "You are forming autobiographical memories of a conversation."
MIN_CHUNK_MESSAGES = 4
WITNESSED_INSTRUCTION = (
    "These events happened before you joined this conversation: you did not take part in them. Remember "
    "them as a record you have read, in the first person as the reader (\"I read that ...\"), never as your "
    "own actions or words."
)
SUMMARY_HEADER_TOKENS = 20  # what a shown summary's recall header and turn cost besides its text
MAX_ATTEMPTS = 3  # refusals and failures a unit may have before it is quarantined
RETRYABLE_STREAK_LIMIT = 12  # consecutive retryable failures that count as one attempt
BACKOFF_S = 0.5  # the drain's first wait after a retryable failure, doubling
MAX_BACKOFF_S = 60.0
LEVEL_BUDGET_TOKENS = 30000  # per-level summary budgets (levels 1, 2 and 3)
RECALL_BUDGET_TOKENS = 100_000  # recall pairs in a compression request, newest first
RECALL_PAIR_OVERHEAD_TOKENS = 50
SEPARATOR = "\n\n---\n\n"


@attrs.frozen
class Summary:
    id: str
    level: int
    content: str
    tokens: int
    source_ids: tuple[str, ...]  # message ids for L1, child summary ids above
    first_sequence: int
    last_sequence: int
    first_id: str
    last_id: str
    created_ms: int
    parent_id: str | None = None
    phase: str | None = None  # Knowledge's dominant phase of an L1's chunk
    witnessed: bool = False  # written in the witnessed voice: its events came before the resident


@attrs.frozen
class SummaryMatch:
    summary: Summary
    matches: int


@attrs.frozen
class Chunk:
    id: str
    message_ids: tuple[str, ...]
    first_sequence: int
    last_sequence: int


def render_transcript(messages: Sequence[Message]) -> str:
    """Messages as plain transcript text for a compression request."""
    parts: list[str] = []
    previous = None
    for message in messages:
        lines = []
        for block in message.content:
            if type(block) is Text:
                lines.append(block.text)
            elif type(block) is ToolUse:
                lines.append(f"[Tool: {block.name}]")
            elif type(block) is ToolResult:
                body = block.content if isinstance(block.content, str) else " ".join(
                    b.text for b in block.content if type(b) is Text
                )
                lines.append(f"[Tool Result] {body}")
            elif type(block) in (Image, Document):
                lines.append("[Image]" if type(block) is Image else "[Document]")
        text = "\n".join(lines)
        if not text:
            continue
        if message.participant == previous:
            parts.append(f"---\n\n{text}")
        else:
            parts.append(f"# {message.participant.upper()}\n{text}")
        previous = message.participant
    return "<earlier_in_conversation>\n" + "\n\n".join(parts) + "\n</earlier_in_conversation>"


_TRANSIENT = object()  # a retryable model failure: the unit stays queued, uncounted, and the drain backs off



class AutobiographicalStrategy(Strategy):
    name = "autobio"
    marks_compression_reads = True
    keeps_memory = True  # its summaries and chunks (one process serves it on a shared store)
    transition_participant = MANAGER

    def __init__(self, config: Any) -> None:
        self.config = config
        self.auto_tick = config.auto_tick
        self.chunks: list[Chunk] = []
        self.summaries: list[Summary] = []
        self.attempts: dict[str, int] = {}
        self.head_start_id: str | None = None
        self._compressed: set[str] = set()  # chunk ids with an L1
        # Kept incrementally, so a tick costs what is pending, not what the namespace holds:
        self._pending: dict[str, Chunk] = {}  # closed chunks without an L1, not quarantined, oldest first
        self._unmerged: dict[int, list[Summary]] = {}  # per level, summaries without a parent, oldest first
        self._leaf_cache: dict[str, tuple[str, ...]] = {}  # summary id -> the message ids it covers
        self._dirty = True  # new messages since the chunks were last rebuilt
        self._retryable_streak = 0
        self._backoff_until = 0.0
        self._built_holds: int | None = None  # the hold floor the chunks were last rebuilt under
        self._ctx: StrategyContext | None = None
        self._stats: RenderStats | None = None  # what the last compile showed and left out
        self.pins: list[Pin] = []
        self._next_pin = 0
        self._prices: dict[str, int] = {}  # summary id -> what showing it costs, at one pricing
        self._priced_at: object = None
        self._live_memo: LiveMemo = {}

    # -- state ------------------------------------------------------------------------------

    def initialize(self, ctx: StrategyContext) -> None:
        self._ctx = ctx
        self.chunks = [Chunk(c["id"], tuple(c["ids"]), c["first"], c["last"]) for c in ctx.read_log("chunks")]
        raw = ctx.read_log("summaries")
        children: dict[str, str] = {}
        for item in raw:
            for source in item["source_ids"] if item["level"] > 1 else ():
                children[source] = item["id"]
        self.summaries = [
            Summary(
                item["id"], item["level"], item["content"], item["tokens"], tuple(item["source_ids"]),
                item["first_sequence"], item["last_sequence"], item["first_id"], item["last_id"], item["created_ms"],
                children.get(item["id"]), item.get("phase"), item.get("witnessed") is True,
            )
            for item in raw
        ]
        by_ids = {chunk.message_ids: chunk.id for chunk in self.chunks}
        self._compressed = {by_ids[s.source_ids] for s in self.summaries if s.level == 1 and s.source_ids in by_ids}
        self._leaf_cache = {}
        attempts = ctx.get_value("attempts", {})
        self.attempts = attempts if isinstance(attempts, dict) else {}
        self._pending = {c.id: c for c in self.chunks
                         if c.id not in self._compressed and self.attempts.get(c.id, 0) < MAX_ATTEMPTS}
        self._unmerged = {}
        for summary in self.summaries:
            if summary.parent_id is None:
                self._unmerged.setdefault(summary.level, []).append(summary)
        self.head_start_id = ctx.get_value("head_start")
        self.pins, self._next_pin = _pins_from(ctx.get_value("pins"))
        # initialize writes nothing (the actor drops what it buffers): chunks that can close now
        # close, with their records and the floor, at the next next_unit or select.
        self._built_holds = ctx.hold_floor()
        self._dirty = bool(self._closing(ctx))

    # -- zones ------------------------------------------------------------------------------

    def _head(self, messages: Sequence[Message], view: MessageView) -> tuple[int, int]:
        start = 0
        if self.head_start_id is not None:
            index = view.index_of(self.head_start_id)
            start = index if index is not None else 0
        if self.config.head_window_tokens <= 0:
            return start, start
        total, end = 0, start
        while end < len(messages) and total + view.estimate_tokens(messages[end]) <= self.config.head_window_tokens:
            total += view.estimate_tokens(messages[end])
            end += 1
        if end > start and end < len(messages) and has_block(messages[end - 1], ToolUse):
            end -= 1  # don't split a tool pair at the head's edge
        return start, end

    def _recent_start(self, messages: Sequence[Message], view: MessageView, floor: int) -> int:
        total, start = 0, len(messages)
        for index in range(len(messages) - 1, floor - 1, -1):
            cost = view.estimate_tokens(messages[index])
            if total + cost > self.config.recent_window_tokens:
                break
            total += cost
            start = index
        if floor < start < len(messages) and has_block(messages[start], ToolResult):
            start -= 1
        return start

    def _compressible_end(self, messages: Sequence[Message], ctx: StrategyContext) -> int:
        """Chunks close only below the recent window and below the earliest held message (T5)."""
        view = ctx.view
        _, head_end = self._head(messages, view)
        end = self._recent_start(messages, view, head_end)
        held = ctx.hold_floor()
        if held is not None:
            end = min(end, bisect_left(messages, held, key=sequence_key))
        return end

    def _rebuild(self, ctx: StrategyContext) -> None:
        """Close and persist the chunks ``_closing`` finds (only whole chunks; T3)."""
        # Chunk records and the floor mark commit after this returns; if they can't (D4), the actor
        # reloads the strategy from what is stored, so the frontier waits for the next try.
        self._dirty, self._built_holds = False, ctx.hold_floor()
        for chunk in self._closing(ctx):
            # The floor rises before (in the same commit as) the chunk's record: it may be read for
            # compression from then on (D2).
            ctx.mark_compression_read(chunk.last_sequence)
            ctx.append_log("chunks", {"id": chunk.id, "ids": list(chunk.message_ids),
                                      "first": chunk.first_sequence, "last": chunk.last_sequence})
            self.chunks.append(chunk)
            self._pending[chunk.id] = chunk

    def _closing(self, ctx: StrategyContext) -> list[Chunk]:
        """The chunks that close now over the frontier, oldest first; changes nothing.

        The compressible zone is ``[0, head_start) + [head_end, end)``: after a head-window reset
        (T6) the stretch before the transition message is compressed too; its remainder closes at
        the head's edge, an ownership seam nothing more can join.
        """
        view = ctx.view
        messages = view.get_all()
        head_start, head_end = self._head(messages, view)
        end = self._compressible_end(messages, ctx)
        last = self.chunks[-1].last_sequence if self.chunks else 0
        start = bisect_left(messages, last + 1, key=sequence_key)
        closing: list[Chunk] = []
        if start < head_start < head_end and end >= head_start:
            closing += self._walk(ctx, messages[start:head_start], seam=True, number=len(self.chunks))
            if closing:
                start = bisect_left(messages, closing[-1].last_sequence + 1, key=sequence_key)
        if start >= head_start:
            start = max(start, head_end)
        closing += self._walk(ctx, messages[start:end], seam=False, number=len(self.chunks) + len(closing))
        return closing

    def _stale(self, ctx: StrategyContext | None) -> bool:
        """Whether chunks may close now that didn't at the last rebuild: new messages, or a hold
        released or timed out since (T5)."""
        return self._dirty or (ctx is not None and ctx.hold_floor() != self._built_holds)

    def _walk(self, ctx: StrategyContext, frontier: Sequence[Message], *, seam: bool, number: int) -> list[Chunk]:
        """The chunks ``frontier`` closes into, the first numbered ``number``."""
        view = ctx.view
        closed: list[Chunk] = []
        pending: list[Message] = []
        tokens = 0
        for index, message in enumerate(frontier):
            pending.append(message)
            tokens += view.estimate_tokens(message)
            following = frontier[index + 1] if index + 1 < len(frontier) else None
            closes = self._closes(pending, tokens, following) and not has_block(message, ToolUse)
            if closes or (seam and following is None):
                closed.append(Chunk(f"c-{number + len(closed)}", tuple(m.id for m in pending), pending[0].sequence,
                                    pending[-1].sequence))
                pending, tokens = [], 0
        return closed

    def _closes(self, pending: Sequence[Message], tokens: int, following: Message | None) -> bool:
        """Whether the chunk ``pending`` closes here (never right after a tool_use: checked by the caller).

        Called once for each message of a frontier walk, in order, as ``pending`` grows.
        """
        return tokens >= self.config.target_chunk_tokens and len(pending) >= MIN_CHUNK_MESSAGES

    def _instruction(self, chunk_messages: Sequence[Message]) -> str:
        if self._witnessed(chunk_messages):
            voice = self.config.witnessed_instruction or WITNESSED_INSTRUCTION
            return self._remind(f"{voice} Aim for about {self.config.summary_target_tokens} tokens.")
        return self._remind(
            f"Starting from my last message, please describe everything that has happened. Aim for about "
            f"{self.config.summary_target_tokens} tokens. Describe it as you would to yourself, as if you are "
            f"remembering what has happened."
        )

    def _witnessed(self, chunk_messages: Sequence[Message]) -> bool:
        """Whether a chunk's events all came before ``witnessed_before_sequence`` (before the resident)."""
        before = self.config.witnessed_before_sequence
        return before is not None and bool(chunk_messages) and chunk_messages[-1].sequence < before

    def _remind(self, instruction: str) -> str:
        reminder = self.config.identity_reminder
        return f"{instruction}\n\n{reminder}" if reminder else instruction

    def _phase_for(self, chunk_messages: Sequence[Message]) -> str | None:
        return None

    def _choose_l1(self, candidates: list[Summary], allowance: int, price: Callable[[Summary], int]) -> list[Summary]:
        """Which frontier L1 summaries to show within ``allowance`` tokens (a subclass hook)."""
        return self._choose(candidates, allowance, price)

    def _choose(self, candidates: list[Summary], allowance: int, price: Callable[[Summary], int]) -> list[Summary]:
        """Summaries to show within ``allowance`` tokens at ``price``, the newest first (what doesn't
        fit is the oldest history), returned oldest first."""
        chosen = []
        for summary in reversed(candidates):
            if price(summary) > allowance:
                break  # older ones may be smaller, but showing them would leave a newer gap
            chosen.append(summary)
            allowance -= price(summary)
        return chosen[::-1]

    def _pricer(self, view: MessageView) -> Callable[[Summary], int]:
        """What a shown summary costs (its recall header and its text) as ``view`` prices text:
        the plain ``tokens + 20`` unless the namespace's estimator is calibrated."""
        if view.pricing != self._priced_at:
            self._prices, self._priced_at = {}, view.pricing
        prices = self._prices

        def price(summary: Summary) -> int:
            found = prices.get(summary.id)
            if found is None:
                priced = view.estimate_tokens(Message(summary.id, 0, self.config.summary_participant,
                                                      (Text(summary.content),)))
                ratio = priced / summary.tokens if summary.tokens else 1.0
                found = prices[summary.id] = priced + round(SUMMARY_HEADER_TOKENS * ratio)
            return found

        return price

    def on_new_message(self, message: Message, ctx: StrategyContext) -> None:
        # Chunks close at the next tick or compile: one frontier walk per batch of new messages.
        self._dirty = True

    # -- queues -----------------------------------------------------------------------------

    def _l1_queue(self, closing: Sequence[Chunk] = ()) -> list[Chunk]:
        """The chunks waiting for an L1, oldest first; ``closing``: chunks about to close, counted too."""
        waiting = [*self._pending.values(), *closing]
        holdback = self.config.l1_holdback_chunks
        chunks = [*self.chunks, *closing]
        if holdback > 0 and chunks:
            newest = {c.id for c in chunks[-holdback:]}
            waiting = [c for c in waiting if c.id not in newest]
        return waiting

    def _merge_queue(self) -> list[Summary] | None:
        if not self.config.hierarchical:
            return None
        # A quarantined group's first summary is sealed: it stays unmerged and later groups start
        # after it, so one refused merge doesn't stop its level for good.
        sealed = {key.split(",")[0] for key, count in self.attempts.items() if count >= MAX_ATTEMPTS and "," in key}
        for level in (1, 2):
            frontier = self._unmerged.get(level, [])
            start = 0
            while start < len(frontier) and frontier[start].id in sealed:
                start += 1
            group = frontier[start : start + self.config.merge_threshold]
            key = ",".join(s.id for s in group)
            if len(group) >= self.config.merge_threshold and self.attempts.get(key, 0) < MAX_ATTEMPTS:
                return group
        return None

    def wake_at(self) -> float | None:
        """When the drain may try again after a transient model failure (the context's clock), or None."""
        return self._backoff_until or None

    def is_ready(self) -> bool:
        # New messages are work only if they close a chunk (counted dry, as backlog counts them).
        ctx = self._ctx
        closing = self._closing(ctx) if ctx is not None and self._stale(ctx) else ()
        return not self._l1_queue(closing) and self._merge_queue() is None

    def quarantined(self) -> list[str]:
        return [key for key, count in self.attempts.items() if count >= MAX_ATTEMPTS]

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
        queue = self._l1_queue(self._closing(ctx) if self._stale(ctx) else ())
        group = self._merge_queue()
        tokens = 0
        for chunk in queue:
            for message_id in chunk.message_ids:
                message = ctx.view.get(message_id)
                tokens += 0 if message is None else ctx.view.estimate_tokens(message)
        return Backlog(len(queue) + (group is not None), tokens)

    # -- compression ------------------------------------------------------------------------

    def next_unit(self, ctx: StrategyContext) -> Unit | None:
        """Close what chunks can close, then the oldest chunk without an L1, else a merge group."""
        if self._stale(ctx):
            self._rebuild(ctx)
        queue = self._l1_queue()
        if queue:
            chunk = queue[0]
            return Unit(chunk.id, chunk.last_sequence, chunk)
        group = self._merge_queue()
        if group is not None:
            return Unit(",".join(s.id for s in group), max(s.last_sequence for s in group), tuple(group))
        return None

    def request_for(self, unit: Unit, ctx: StrategyContext) -> ModelRequest:
        if isinstance(unit.work, Chunk):
            messages = self._l1_request(ctx, unit.work)
        elif isinstance(unit.work, tuple) and unit.work and isinstance(unit.work[0], Summary):
            messages = self._merge_request(unit.work)
        else:
            messages = self._transition_request(unit.work)
        return ModelRequest(
            self.config.compression_model, ctx.system_prompt or SYSTEM, tuple(messages),
            int(self.config.summary_target_tokens * 1.5),
            assistant=frozenset({self.config.summary_participant}), tools=tuple(ctx.tools),
        )

    def apply_unit(self, unit: Unit, outcome: ModelResponse | ModelError, ctx: StrategyContext) -> bool:
        text = self._reply_text(ctx, outcome)
        if text is _TRANSIENT:
            return False  # queued as it was: an outage is not the unit's fault
        if not isinstance(text, str):
            return self._fail(ctx, unit.key)
        if isinstance(unit.work, Chunk):
            self._apply_l1(ctx, unit.work, text)
        else:
            self._apply_merge(ctx, list(unit.work), text)
        return True

    def _recall_pairs(self, before: int) -> list[CompiledMessage]:
        """The frontier summaries wholly before ``before``, in store order, capped newest first by
        ``RECALL_BUDGET_TOKENS`` (a backlog of unmerged L1s must not grow every request)."""
        earlier = sorted((s for s in self._frontier() if s.last_sequence < before), key=lambda s: s.first_sequence)
        left, start = RECALL_BUDGET_TOKENS, len(earlier)
        while start > 0 and earlier[start - 1].tokens + RECALL_PAIR_OVERHEAD_TOKENS <= left:
            start -= 1
            left -= earlier[start].tokens + RECALL_PAIR_OVERHEAD_TOKENS
        pairs = []
        for summary in earlier[start:]:
            pairs.append(CompiledMessage(MANAGER, (Text(f"[Recall {summary.id}]"),)))
            pairs.append(CompiledMessage(self.config.summary_participant, (Text(summary.content),)))
        return pairs

    def _frontier(self) -> list[Summary]:
        return [summary for level in sorted(self._unmerged) for summary in self._unmerged[level]]

    def _reply_text(self, ctx: StrategyContext, outcome: ModelResponse | ModelError | None) -> Any:
        """A reply's summary text; None for a failure that counts; ``_TRANSIENT`` for an outage."""
        if isinstance(outcome, ModelError):
            logger.warning("compression request in %r failed: %s", ctx.namespace, outcome)
            if outcome.retryable:
                self._retryable_streak += 1
                delay = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (self._retryable_streak - 1))
                self._backoff_until = ctx.now() + delay  # the drain waits this out
                if self._retryable_streak % RETRYABLE_STREAK_LIMIT:
                    return _TRANSIENT  # every RETRYABLE_STREAK_LIMIT in a row count as one attempt
            return None
        if outcome is None:
            return None
        self._retryable_streak = 0
        self._backoff_until = 0.0
        text = outcome.text.strip()
        if outcome.stop_reason != "end_turn" or not text:
            logger.warning("compression in %r gave %r with %d chars: not a memory", ctx.namespace,
                           outcome.stop_reason, len(text))
            return None  # only a complete end_turn with text becomes a summary (T4)
        return text

    def _fail(self, ctx: StrategyContext, key: str) -> bool:
        self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.attempts[key] >= MAX_ATTEMPTS:
            logger.error("quarantined %s in namespace %r after %d failed attempts; it stays raw", key,
                         ctx.namespace, self.attempts[key])
            self._pending.pop(key, None)
        ctx.set_value("attempts", self.attempts)
        return True  # an attempt is progress: the next unit may differ

    def _l1_request(self, ctx: StrategyContext, chunk: Chunk) -> list[CompiledMessage]:
        """"As of" the chunk: head, prior recall pairs, the chunk, the instruction; nothing after (T4)."""
        view = ctx.view
        messages = view.get_all()
        chunk_messages = [m for m in (view.get(i) for i in chunk.message_ids) if m is not None]
        head_start, head_end = self._head(messages, view)
        head = [m for m in messages[head_start:head_end] if m.sequence < chunk.first_sequence]
        request: list[CompiledMessage] = []
        if head:
            request.append(CompiledMessage(MANAGER, (Text(render_transcript(head)),)))
            request.append(CompiledMessage(self.config.summary_participant, (Text("I remember."),)))
        request += self._recall_pairs(chunk.first_sequence)
        instruction = (
            f"[{MANAGER}] We are ready to form a long-term memory. Here is the conversation to remember:\n\n"
            f"{render_transcript(chunk_messages)}\n\n{self._instruction(chunk_messages)}"
        )
        request.append(CompiledMessage(MANAGER, (Text(instruction),)))
        return request

    def _apply_l1(self, ctx: StrategyContext, chunk: Chunk, text: str) -> None:
        view = ctx.view
        chunk_messages = [m for m in (view.get(i) for i in chunk.message_ids) if m is not None]
        first, last = chunk_messages[0] if chunk_messages else None, chunk_messages[-1] if chunk_messages else None
        summary = Summary(
            f"L1-{len(self.summaries)}", 1, text, estimate_text(text), chunk.message_ids, chunk.first_sequence,
            chunk.last_sequence, first.id if first else chunk.message_ids[0],
            last.id if last else chunk.message_ids[-1], int(time.time() * 1000), None,
            self._phase_for(chunk_messages), self._witnessed(chunk_messages),
        )
        self._store(ctx, summary)
        self._compressed.add(chunk.id)
        self._pending.pop(chunk.id, None)

    def _merge_request(self, group: Sequence[Summary]) -> list[CompiledMessage]:
        request = [CompiledMessage(self.config.summary_participant, (Text(s.content),)) for s in group]
        request.append(CompiledMessage(MANAGER, (Text(self._remind(
            f"[{MANAGER}] Please consolidate the memories since my last message into a single cohesive memory. "
            f"Aim for about {self.config.summary_target_tokens} tokens. Write as you would to yourself — this is "
            f"your autobiography, capturing the arc of what happened.")),)))
        return request

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
        record = attrs.asdict(summary, recurse=False)
        record.pop("parent_id")
        record["source_ids"] = list(summary.source_ids)
        ctx.append_log("summaries", record)
        self.summaries.append(summary)
        self._unmerged.setdefault(summary.level, []).append(summary)

    # -- selection --------------------------------------------------------------------------

    def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        if not options.dry_run and options.context is not None and self._stale(options.context):
            self._rebuild(options.context)  # bookkeeping: if it can't commit, the compile goes on (P1, D4)
        entries, *_, stats = self._plan(view, budget)
        if options.strict and stats.dropped_ids:
            raise OverBudgetError(f"strict compile refused: {stats.dropped_reason}", budget=budget.usable,
                                  actual=stats.total_tokens)
        if not options.dry_run:
            self._stats = stats
        return entries

    def preview(self, view: MessageView, budget: Budget, options: SelectOptions) -> PreviewResult:
        _, head, middle, tail, total, _ = self._plan(view, budget)
        return PreviewResult(total <= budget.usable, total, budget.usable, head, tail, middle)

    def render_stats(self) -> RenderStats | None:
        return self._stats

    def _plan(self, view: MessageView, budget: Budget) -> tuple[list[Entry], int, int, int, int, RenderStats]:
        messages = view.get_all()
        usable = budget.usable
        cap = self.config.max_message_tokens
        head_start, head_end = self._head(messages, view)
        recent_start = self._recent_start(messages, view, head_end)
        entries_head: list[Entry] = []
        spent = 0
        for message in messages[head_start:head_end]:
            shaped, cost = shape(message, cap, view.estimate_tokens)
            if spent + cost > usable:
                break
            entries_head.append(raw_entry(shaped))
            spent += cost
        if entries_head:
            entries_head[-1] = attrs.evolve(entries_head[-1], cache_marker=True)
        head_tokens = spent
        middle_messages = [*messages[:head_start], *messages[head_end:recent_start]]  # T6: before a reset head
        in_head = {entry.source_ids[0] for entry in entries_head}
        # Pinned raw ranges outside the head come next, whatever the pressure, oldest first.
        raw_pins = [(pin.first_sequence, pin.last_sequence) for pin in self.pins if pin.level is None]

        def pinned(sequence: int) -> bool:
            return any(first <= sequence <= last for first, last in raw_pins)

        pinned_entries: list[tuple[int, list[Entry]]] = []
        pinned_ids: set[str] = set()
        for message in (m for m in messages if m.id not in in_head and pinned(m.sequence)) if raw_pins else ():
            pinned_ids.add(message.id)
            shaped, cost = shape(message, cap, view.estimate_tokens)
            if spent + cost <= usable:
                pinned_entries.append((message.sequence, [raw_entry(shaped)]))
                spent += cost
        pinned_tokens = spent - head_tokens
        # Recent window: evicted newest-first within budget, emitted chronologically.
        recent: list[tuple[int, list[Entry]]] = []
        for message in reversed(messages[recent_start:]):
            if message.id in pinned_ids:
                continue  # placed with the pins
            shaped, cost = shape(message, cap, view.estimate_tokens)
            if spent + cost > usable:
                break
            recent.append((message.sequence, [raw_entry(shaped)]))
            spent += cost
        tail_tokens = spent - head_tokens - pinned_tokens
        price = self._pricer(view)
        # The middle: shown summaries (anti-redundant: the frontier) and uncovered raw messages.
        frontier = [s for s in self._frontier_under_pins()
                    if not raw_pins or not all(pinned(int(leaf)) for leaf in self._leaves(s))]
        covered: set[str] = set()
        shown: list[Summary] = []
        budgets = {3: LEVEL_BUDGET_TOKENS, 2: LEVEL_BUDGET_TOKENS, 1: LEVEL_BUDGET_TOKENS}
        carry = 0
        for level in (1, 2, 3):  # the newest history first: under pressure the oldest summaries go
            allowance = min(budgets[level] + carry, usable - spent)
            candidates = sorted((s for s in frontier if s.level == level), key=lambda s: s.first_sequence)
            chosen = (self._choose_l1(candidates, allowance, price) if level == 1
                      else self._choose(candidates, allowance, price))
            cost = sum(price(summary) for summary in chosen)
            shown += chosen
            spent += cost
            carry = max(0, allowance - cost)
        for summary in shown:
            covered.update(self._leaves(summary))
        middle: list[tuple[int, list[Entry]]] = []
        for summary in shown:
            middle.append((summary.first_sequence, [
                # The header names its summary only; the answer carries the coverage (P6).
                Entry(MANAGER, (Text(f"[Recall {summary.id}]"),), (), "derived", (summary.id,)),
                # P9: a breakpoint at each summary seam, so a new summary invalidates only what follows it.
                Entry(self.config.summary_participant, (Text(summary.content),), self._leaves(summary), "derived",
                      (summary.id,), cache_marker=True),
            ]))
        summary_tokens = spent - head_tokens - tail_tokens - pinned_tokens
        uncovered = [m for m in middle_messages if m.id not in covered and m.id not in pinned_ids]
        kept: list[tuple[int, list[Entry]]] = []
        for message in reversed(uncovered):  # compression debt: keep the newest raw that fit
            shaped, cost = shape(message, cap, view.estimate_tokens)
            if spent + cost > usable:
                logger.info("compression debt: %d uncovered middle message(s) left out of the compile",
                            len(uncovered) - len(kept))
                break
            kept.append((message.sequence, [raw_entry(shaped)]))
            spent += cost
        # No silent drops: every message of the view is shown raw or covered by a shown summary,
        # or it is reported, with why.
        shown_raw = in_head | {e.source_ids[0] for _, group in (*pinned_entries, *recent, *kept) for e in group}
        dropped = tuple(m.id for m in messages if m.id not in shown_raw and m.id not in covered)
        debt = 0
        if dropped:
            summarised = {leaf for summary in frontier for leaf in self._leaves(summary)}
            debt = sum(1 for message_id in dropped if message_id not in summarised and message_id not in pinned_ids)
        levels: dict[int, int] = {}
        for summary in shown:
            levels[summary.level] = levels.get(summary.level, 0) + 1
        stats = RenderStats(
            head_tokens=head_tokens, summary_tokens=summary_tokens,
            middle_raw_tokens=spent - head_tokens - tail_tokens - summary_tokens, tail_tokens=tail_tokens,
            summaries=tuple(sorted(levels.items())),
            pending_units=len(self._l1_queue()) + (self._merge_queue() is not None),
            dropped_ids=dropped,
            dropped_reason=(f"{len(dropped)} message(s) left out that no shown summary covers, within the budget "
                            f"({usable:,} tokens): {debt} not compressed yet (tick or wait_ready), "
                            f"{len(dropped) - debt} whose summaries, pins or recent window didn't fit (raise the "
                            f"budget, or lower recent_window_tokens)") if dropped else None,
        )
        middle += kept + pinned_entries + recent
        middle.sort(key=lambda item: item[0])
        entries = entries_head + [entry for _, group in middle for entry in group]
        if entries and not entries[-1].cache_marker:
            # P9: the tail carries a breakpoint too, so the next compile reads everything up to
            # this one's newest message from the provider's cache. P5's cap of 3 keeps the head
            # window's end (the first), the latest summary seam and this tail (the last two).
            entries[-1] = attrs.evolve(entries[-1], cache_marker=True)
        middle_tokens = spent - head_tokens - tail_tokens
        return apply_live_policy(entries, self.config, self._live_memo), head_tokens, middle_tokens, tail_tokens, spent, stats

    def _frontier_under_pins(self) -> list[Summary]:
        """The frontier, with any summary above a level pin it overlaps opened into its children."""
        frontier = self._frontier()
        level_pins = [pin for pin in self.pins if pin.level is not None]
        if not level_pins:
            return frontier
        children: dict[str, list[Summary]] = {}
        for summary in self.summaries:
            if summary.parent_id is not None:
                children.setdefault(summary.parent_id, []).append(summary)
        out: list[Summary] = []
        stack = list(frontier)
        while stack:
            summary = stack.pop()
            too_deep = any(pin.level is not None and summary.level > pin.level and summary.first_sequence
                           <= pin.last_sequence and pin.first_sequence <= summary.last_sequence for pin in level_pins)
            if too_deep and children.get(summary.id):
                stack.extend(children[summary.id])
            else:
                out.append(summary)
        return out

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

    def _store_pins(self, ctx: StrategyContext) -> None:
        ctx.set_value("pins", {"next": self._next_pin, "pins": [attrs.asdict(pin) for pin in self.pins]})

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

    def _transition_request(self, head: Sequence[Message]) -> list[CompiledMessage]:
        prompt = render_transcript(head)[:8000]
        return [CompiledMessage(MANAGER, (Text(f"{prompt}\n\nSummarize the prior conversation context in 2-3 paragraphs."),))]

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


def _pins_from(stored: Any) -> tuple[list[Pin], int]:
    """Pins as ``_store_pins`` wrote them; a record this version can't read is logged and ignored."""
    if stored is None:
        return [], 0
    try:
        pins = [Pin(**record) for record in stored["pins"]]
        return pins, int(stored["next"])
    except (KeyError, TypeError, ValueError):
        logger.error("the stored pins %r can't be read; starting with none", stored)
        return [], 0



@attrs.frozen
class Autobiographical:
    """Config of ``AutobiographicalStrategy`` (docs/api.md, Strategies)."""

    compression_model: str
    target_chunk_tokens: int = 3000
    head_window_tokens: int = 0
    recent_window_tokens: int = 30000
    hierarchical: bool = True
    merge_threshold: int = 6
    summary_target_tokens: int = 2000
    auto_tick: bool = False
    summary_participant: str = "Claude"
    max_message_tokens: int = 0
    l1_holdback_chunks: int = 1
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

    def create(self) -> AutobiographicalStrategy:
        return AutobiographicalStrategy(self)
