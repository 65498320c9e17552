"""What each inspector page shows, read from a read-only runtime; no HTML and no web framework here.

Reads are the engine's read API the CLI uses (heads, ranges of items, values) and the public
API (``list_branches``, ``list_namespaces``, a manager's ``compile``, ``render_stats``,
``get_summary``, ``health``). A page reads what it shows: a timeline page reads its messages
by index, a summary page its summaries, never a whole slot or log. A reader's breakdown is the
compile that namespace's reader would get now, read from its ``CompileResult``, provenance and
``render_stats()``, not computed again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from ..content import codec
from ..compile.result import CompileResult
from ..budget import Budget
from ..content.blocks import (
    Audio,
    Block,
    Document,
    GeneratedImage,
    Image,
    Message,
    RedactedThinking,
    Text,
    Thinking,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
    content_for_reader,
    has_audience,
)
from ..content.notes import note
from ..errors import MessageNotFoundError, StoreCorruptError
from ..manager import ContextManager
from ..namespace import states
from ..request_ledger import RequestPart as RecordPart
from ..request_ledger import RequestRecord, part_zones
from ..runtime import Runtime
from ..slots import parse_id
from ..store.records import BranchRow
from ..strategies import catalog
from ..strategies.autobiographical import Autobiographical
from ..strategies.live import IMAGE_DROPPED, TOOL_INPUT_PRUNED, TOOL_RESULT_PRUNED
from ..strategies.passthrough import Passthrough
from ..strategies.queue import MAX_ATTEMPTS
from ..content.tokens import estimate_blocks
from ..views import reader_view_of
from .prices import Price

PAGE = 50  # messages (or summaries) on one page
SUMMARY_STRATEGIES = ("autobio", "knowledge")  # the bundled strategies that keep summaries
_LIVE_NOTES = tuple(template.split("{")[0] for template in (IMAGE_DROPPED, TOOL_RESULT_PRUNED, TOOL_INPUT_PRUNED))


class NotFound(Exception):
    """No branch, slot or namespace of that name: the page says which there are."""


# -- blocks, as a page shows them ---------------------------------------------------------------


@attrs.frozen
class Shown:
    """One block for a page: its type, the text to show (escaped by the template), its audience."""

    type: str
    text: str
    audience: tuple[str, ...] | None = None


def shown(block: Block, audience: Any = None) -> Shown:
    """``block`` for a page; ``audience`` is the one its stored form had, for a reader's copy (whose
    audience fields are stripped)."""
    audience = getattr(block, "audience", None) if audience is None else audience
    audience = tuple(str(name) for name in audience) if isinstance(audience, tuple) else (
        None if audience is None else (repr(audience),))
    if isinstance(block, Text):
        return Shown("text", block.text, audience)
    if isinstance(block, Thinking):
        return Shown("thinking", block.thinking, audience)
    if isinstance(block, RedactedThinking):
        return Shown("redacted_thinking", "(redacted)")
    if isinstance(block, ToolUse):
        unparsed = f" unparsed: {block.unparseable_input[:2000]}" if block.unparseable_input is not None else ""
        return Shown("tool_use", f"{block.name}({json.dumps(block.input, ensure_ascii=False)[:2000]}) "
                                 f"[{block.id}]{unparsed}")
    if isinstance(block, ToolResult):
        inner = block.content if isinstance(block.content, str) else " ".join(shown(b).text for b in block.content)
        name = f" {block.tool_name}" if block.tool_name else ""
        return Shown("tool_result", f"[{block.tool_use_id}]{name}{' error' if block.is_error else ''} {inner}")
    if isinstance(block, Image | Document):
        what = block.source.get('media_type', block.source.get('type', ''))
        named = block.source_url if isinstance(block, Image) else block.title or block.filename
        return Shown(block.type, f"{what} {named}" if named else f"{what}")
    if isinstance(block, Audio | Video | GeneratedImage | ToolAttempt | ToolNotice):
        text = note(block)  # what a request form sends where it has no place for the block
        return Shown(block.type, text if len(text) <= 2000 else f"{text[:2000]}...", audience)
    return Shown(getattr(block, "type", "block"), "")


def badged(blocks: Sequence[Block], stored: Sequence[Message]) -> tuple[Shown, ...]:
    """A reader's copy of ``blocks`` for a page, each block that was private in the stored
    messages it came from shown with the audience it had there (the copy's is stripped)."""
    private = [(attrs.evolve(b, audience=None), getattr(b, "audience"))  # type: ignore[arg-type]  # only AUDIENCE_TYPES carry one
               for message in stored for b in message.content if has_audience(b)]
    return tuple(shown(block, next((audience for copy, audience in private if copy == block), None))
                 for block in blocks)


def reader_blocks(message: Message, reader: str | None) -> tuple[Shown, ...]:
    """What ``reader`` sees of a stored message, each private block with its audience; () for nothing."""
    return badged(content_for_reader(message.content, reader), (message,))


@attrs.frozen
class Row:
    """A stored message on a timeline page."""

    index: int
    id: str
    sequence: int
    participant: str
    timestamp_ms: int
    blocks: tuple[Shown, ...]
    metadata: str  # JSON, as stored


def row_of(index: int, message: Message) -> Row:
    return Row(index, message.id, message.sequence, message.participant, message.timestamp_ms,
               tuple(shown(b) for b in message.content),
               json.dumps(message.metadata, ensure_ascii=False, sort_keys=True) if message.metadata else "")


# -- the store and its branches -------------------------------------------------------------------


def recorded_strategy(runtime: Runtime, namespace: str, branch: str, budget_tokens: int) -> Any:
    """The strategy config ``namespace`` recorded on ``branch`` (what its residents run); for a store
    from before configs were recorded, or a host's own strategy, Autobiographical (a recent window
    of half ``budget_tokens``) if it keeps summaries, else Passthrough."""
    engine = runtime.engine
    recorded = catalog.restore(engine.read_value(states.config_state(namespace), engine.branch(branch).id))
    if recorded is not None:
        return recorded
    if engine.has_state(states.strategy_state(namespace, "autobio", "summaries")):
        return Autobiographical("inspection", recent_window_tokens=budget_tokens // 2)
    return Passthrough()


def quarantined(runtime: Runtime, row: BranchRow, namespace: str) -> list[str]:
    """Compression units a namespace gave up on (chunks, merge groups), from its attempts record."""
    found: list[str] = []
    for name in SUMMARY_STRATEGIES:
        attempts = runtime.engine.read_value(states.strategy_state(namespace, name, "attempts"), row.id)
        if isinstance(attempts, dict):
            found += [key for key, count in attempts.items() if isinstance(count, int) and count >= MAX_ATTEMPTS]
    return found


def branch_row(runtime: Runtime, name: str) -> BranchRow:
    known = [row.name for row in runtime.engine.list_branches()]
    if name not in known:
        raise NotFound(f"no branch {name!r}; the store's branches: {', '.join(known)}")
    return runtime.engine.branch(name)


def slots(runtime: Runtime, row: BranchRow) -> list[tuple[str, int]]:
    """Each slot of the store and how many messages it holds on the branch (its head: one read)."""
    engine = runtime.engine
    return [(state.name, engine.read_head(state.name, row.id).length) for state in engine.list_states()
            if state.kind == "log" and states.is_slot(state.name)]


@attrs.frozen
class NamespaceLine:
    namespace: str
    reader: str | None
    narrowing_floor: int
    strategy: str  # its kind
    settings: tuple[tuple[str, str], ...]  # the recorded config's settings with a value, a line each
    unset: tuple[str, ...]  # and those left None
    summaries: int
    quarantined: tuple[str, ...]
    slot: str
    ledger: bool  # it recorded requests


def setting(value: Any) -> str:
    """A recorded config's value as one line of the branch page: text as it is, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


async def namespaces(runtime: Runtime, row: BranchRow) -> list[NamespaceLine]:
    engine, lines = runtime.engine, []
    for info in await runtime.list_namespaces(row.name):
        described = engine.read_value(states.config_state(info.namespace), row.id)
        recorded = {str(k): v for k, v in described.items() if k != "kind"} if isinstance(described, dict) else {}
        settings = tuple((k, setting(v)) for k, v in recorded.items() if v is not None)
        unset = tuple(k for k, v in recorded.items() if v is None)
        kind = str(described.get("kind", "?")) if isinstance(described, dict) else "not recorded"
        summaries = sum(engine.read_head(name, row.id).length for name in _summary_states(runtime, info.namespace))
        lines.append(NamespaceLine(info.namespace, info.reader, info.narrowing_floor, kind, settings, unset, summaries,
                                   tuple(quarantined(runtime, row, info.namespace)),
                                   slot_of_namespace(runtime, info.namespace), has_ledger(runtime, info.namespace)))
    return lines


def slot_of_namespace(runtime: Runtime, namespace: str) -> str:
    """The slot ``namespace`` reads: its own if it was opened isolated, else the shared one."""
    own = states.slot_state(namespace, True)
    return own if runtime.engine.has_state(own) else states.SHARED_SLOT


def _summary_states(runtime: Runtime, namespace: str) -> list[str]:
    return [name for name in (states.strategy_state(namespace, s, "summaries") for s in SUMMARY_STRATEGIES)
            if runtime.engine.has_state(name)]


async def require_namespace(runtime: Runtime, row: BranchRow, namespace: str) -> str:
    namespace = namespace or "default"
    known = sorted(info.namespace for info in await runtime.list_namespaces(row.name))
    if namespace not in known:
        raise NotFound(f"no namespace {namespace!r} on branch {row.name!r}; its namespaces: "
                       f"{', '.join(known) or 'none yet'}")
    return namespace


# -- the timeline ---------------------------------------------------------------------------------


@attrs.frozen
class Timeline:
    slot: str
    total: int
    start: int
    rows: tuple[Row, ...]
    pages: int
    page: int
    messages: tuple[Message, ...] = attrs.field(eq=False, repr=False)  # the page's messages, as stored


def _slot_of(runtime: Runtime, row: BranchRow, slot: str) -> None:
    known = [name for name, _ in slots(runtime, row)]
    if slot not in known:
        raise NotFound(f"no slot {slot!r}; the store's slots: {', '.join(known) or 'none'}")


def timeline(runtime: Runtime, row: BranchRow, slot: str, page: int | None, at_sequence: int | None = None) -> Timeline:
    """One page of a slot: page ``page`` counting from 0 (None: the newest ``PAGE`` messages), or
    the page holding the first message at or after ``at_sequence``. Reads the head and that
    page's items."""
    _slot_of(runtime, row, slot)
    engine = runtime.engine
    head = engine.read_head(slot, row.id)
    pages = max(1, -(-head.length // PAGE))
    if at_sequence is not None:
        page = index_at(runtime, row, slot, head.revision, head.length, at_sequence) // PAGE
    if page is None:  # the newest: a whole page of the newest messages, not the last page's remainder
        page, start = pages - 1, max(0, head.length - PAGE)
    else:
        page = min(max(page, 0), pages - 1)
        start = page * PAGE
    read = _read(runtime, row, slot, head.revision, start, start + PAGE)
    return Timeline(slot, head.length, start, tuple(row_of(i, m) for i, m in read), pages, page,
                    tuple(m for _, m in read))


def index_at(runtime: Runtime, row: BranchRow, slot: str, revision: int, length: int, sequence: int) -> int:
    """The index of the first message appended at or after ``sequence`` (the last message's if
    none): a binary search of one-item reads, so finding a place costs log(slot) reads, never the slot."""
    return min(_first_index(runtime, row, slot, revision, length, sequence), max(length - 1, 0))


def _first_index(runtime: Runtime, row: BranchRow, slot: str, revision: int, length: int, sequence: int) -> int:
    """The index of the first message at or after ``sequence`` (``length`` if none), by binary search."""
    low, high = 0, length
    while low < high:
        middle = (low + high) // 2
        [item] = runtime.engine.read_items(slot, row.id, at=revision, start=middle, stop=middle + 1)
        if item.sequence < sequence:
            low = middle + 1
        else:
            high = middle
    return low


def _read(runtime: Runtime, row: BranchRow, slot: str, revision: int, start: int, stop: int) -> list[tuple[int, Message]]:
    """Messages ``[start, stop)`` of ``slot`` as of ``revision``, each with its index."""
    engine = runtime.engine
    items = engine.read_items(slot, row.id, at=revision, start=start, stop=stop)
    return [(start + i, codec.message_from_json(item.data, sequence=item.sequence, store=engine.data_path))
            for i, item in enumerate(items)]


# -- as reader X: the breakdown of a compile --------------------------------------------------------


@attrs.frozen
class SummaryShown:
    id: str
    level: int
    tokens: int
    first_id: str
    last_id: str
    first_sequence: int
    last_sequence: int
    source_ids: tuple[str, ...]  # messages for L1, summaries above
    text: str
    parent_id: str | None = None


def summary_shown(summary: Any) -> SummaryShown:
    return SummaryShown(summary.id, summary.level, summary.tokens, summary.first_id, summary.last_id,
                        summary.first_sequence, summary.last_sequence, tuple(summary.source_ids), summary.content,
                        summary.parent_id)


@attrs.frozen
class Part:
    """One message of the compiled request and where it stands in the breakdown."""

    index: int
    zone: str  # head, summary, middle, recent (raw after the last summary), injection
    participant: str
    blocks: tuple[Shown, ...]
    tokens: int
    message_ids: tuple[str, ...]
    summaries: tuple[SummaryShown, ...]
    breakpoint: bool
    notes: tuple[str, ...]  # what the live policy replaced in it


@attrs.frozen
class Breakdown:
    namespace: str
    branch: str
    reader: str | None
    strategy: str
    budget: Budget
    parts: tuple[Part, ...]
    zone_tokens: dict[str, int]  # from render_stats(): head, summary, middle_raw, tail
    summaries_per_level: tuple[tuple[int, int], ...]
    tokens: int  # the compiled messages' estimate
    stable_prefix_tokens: int
    cached_prefix_tokens: int  # up to the last cache breakpoint
    breakpoints: int
    dropped_ids: Sequence[str]
    dropped_reason: str | None
    pending_units: int
    health: Any


async def breakdown(runtime: Runtime, manager: ContextManager, budget: Budget) -> Breakdown:
    """The request ``manager``'s namespace (opened on ``runtime``) would compile now for its
    reader, broken down."""
    result = await manager.compile(budget)  # not a dry run: render_stats() reports this compile (a read-only
    stats = manager.render_stats()  # runtime writes nothing either way)
    parts = await _parts(runtime, manager, result)
    tokens = sum(part.tokens for part in parts)
    marked = [part.index for part in parts if part.breakpoint]
    cached = sum(part.tokens for part in parts if marked and part.index <= marked[-1])
    zones = {} if stats is None else {"head": stats.head_tokens, "summaries": stats.summary_tokens,
                                      "middle (raw)": stats.middle_raw_tokens, "recent": stats.tail_tokens}
    return Breakdown(
        manager.namespace, manager.branch, manager.view_reader, result.provenance.strategy, budget, tuple(parts),
        zones, () if stats is None else stats.summaries, tokens, result.stable_prefix_tokens, cached, len(marked),
        () if stats is None else stats.dropped_ids, None if stats is None else stats.dropped_reason,
        0 if stats is None else stats.pending_units, await manager.health(),
    )


RUN = 64  # slot items read at once when looking up a compile's messages


def _private_sources(runtime: Runtime, manager: ContextManager, ids: Sequence[str]) -> dict[str, Message]:
    """The stored messages among ``ids`` that hold an audience block (a badge's source), read
    straight from the slot, decoded only when their bytes name an audience. A request's raw
    messages come in a few runs (the head, stretches between summaries, the recent window): each
    run costs one binary search and its items read in order, where an await per message would
    re-read the slot's head at each (some 0.25 ms apiece)."""
    engine = runtime.engine
    slot, row = slot_of_namespace(runtime, manager.namespace), engine.branch(manager.branch)
    head = engine.read_head(slot, row.id)
    wanted = sorted({sequence: i for i in ids if (sequence := parse_id(i)) is not None}.items())
    found: dict[str, Message] = {}
    at = 0
    while at < len(wanted):
        index = _first_index(runtime, row, slot, head.revision, head.length, wanted[at][0])
        while at < len(wanted) and index < head.length:
            items = engine.read_items(slot, row.id, at=head.revision, start=index, stop=index + RUN)
            matched = False
            for item in items:
                while at < len(wanted) and wanted[at][0] < item.sequence:
                    at += 1  # not in the slot as of now: nothing to badge
                if at < len(wanted) and wanted[at][0] == item.sequence:
                    if b'"audience"' in bytes(item.data):
                        found[wanted[at][1]] = codec.message_from_json(item.data, sequence=item.sequence,
                                                                       store=engine.data_path)
                    at, matched = at + 1, True
            index += len(items)
            if not matched or not items:
                break  # the next run starts further on: search for it
        else:
            at = len(wanted) if index >= head.length else at
    return found


async def _parts(runtime: Runtime, manager: ContextManager, result: CompileResult) -> list[Part]:
    sources = result.provenance.messages
    private = _private_sources(runtime, manager, [s.id for found in sources for s in found if s.kind == "message"])
    zones = [RECORD_ZONES[zone] for zone in part_zones(result)]
    parts = []
    for index, (message, found, zone) in enumerate(zip(result.messages, sources, zones)):
        summary_ids = [s.id for s in found if s.kind == "summary"]
        summaries = []
        for summary_id in summary_ids:
            summary = await manager.get_summary(summary_id)
            if summary is not None:
                summaries.append(summary_shown(summary))
        notes = tuple(b.text for b in message.content if isinstance(b, Text) and b.text.startswith(_LIVE_NOTES)) if any(
            s.complete is False for s in found) else ()
        stored = [private[s.id] for s in found if s.kind == "message" and s.id in private]
        parts.append(Part(index, zone, message.participant, badged(message.content, stored),
                          estimate_blocks(message.content),
                          tuple(s.id for s in found if s.kind == "message" and s.complete is not None),
                          tuple(summaries), message.cache_breakpoint, notes))
    return parts


ANY_AUDIENCE = "*"  # the audience filter's value for "any private line"
NO_AUDIENCE = "-"  # and for "no private line"


def audience_matches(blocks: Sequence[Shown], audience: str | None) -> bool:
    """Whether blocks pass the audience filter: None passes all; ``*`` wants a private block, ``-``
    none, a name a block whose audience names it."""
    if audience is None:
        return True
    private = [b.audience for b in blocks if b.audience is not None]
    if audience == ANY_AUDIENCE:
        return bool(private)
    if audience == NO_AUDIENCE:
        return not private
    return any(audience in names for names in private)


def text_matches(blocks: Sequence[Shown], text: str | None) -> bool:
    return text is None or any(text.casefold() in b.text.casefold() for b in blocks)


def filter_parts(parts: Sequence[Part], *, zone: str | None = None, participant: str | None = None,
                 audience: str | None = None, text: str | None = None) -> tuple[Part, ...]:
    """The parts of a breakdown that pass each filter given: a zone, a participant exactly, an
    audience (``audience_matches``), a text in a block (case ignored)."""
    return tuple(part for part in parts if (zone is None or part.zone == zone)
                 and (participant is None or part.participant == participant)
                 and audience_matches(part.blocks, audience) and text_matches(part.blocks, text))


def percent(part: int, whole: int) -> int:
    """``part`` of ``whole`` as a whole percentage (0 to 100), for a token bar's width class."""
    return 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))


# -- a summary's covered messages, as its namespace's reader sees them --------------------------------


@attrs.frozen
class ReaderRow:
    index: int
    id: str
    sequence: int
    participant: str
    blocks: tuple[Shown, ...]  # the reader's view, each private block with its audience


@attrs.frozen
class Covered:
    namespace: str
    reader: str | None
    summary: SummaryShown
    slot: str
    total: int  # messages in the covered range
    rows: tuple[ReaderRow, ...]
    hidden: int  # messages of this page the reader sees nothing of (left out)
    pages: int
    page: int


async def covered(runtime: Runtime, row: BranchRow, manager: ContextManager, summary_id: str,
                  page: int | None) -> Covered:
    """One page (50) of the messages summary ``summary_id`` covers, as ``manager``'s reader sees
    them: a message it sees nothing of is left out, counted. Reads the summary, two binary searches
    and the page's items."""
    summary = await manager.get_summary(summary_id)
    if summary is None:
        raise NotFound(f"no summary {summary_id!r} in namespace {manager.namespace!r}")
    shown_summary = summary_shown(summary)
    slot = slot_of_namespace(runtime, manager.namespace)
    head = runtime.engine.read_head(slot, row.id)
    first = _first_index(runtime, row, slot, head.revision, head.length, shown_summary.first_sequence)
    stop = _first_index(runtime, row, slot, head.revision, head.length, shown_summary.last_sequence + 1)
    total = max(0, stop - first)
    pages = max(1, -(-total // PAGE))
    page = 0 if page is None else min(max(page, 0), pages - 1)
    start = first + page * PAGE
    rows, hidden = [], 0
    for index, message in _read(runtime, row, slot, head.revision, start, min(stop, start + PAGE)):
        blocks = reader_blocks(message, manager.view_reader)
        if blocks:
            rows.append(ReaderRow(index, message.id, message.sequence, message.participant, blocks))
        else:
            hidden += 1
    return Covered(manager.namespace, manager.view_reader, shown_summary, slot, total, tuple(rows), hidden, pages, page)


# -- search ----------------------------------------------------------------------------------------

SEARCH_BATCH = 500  # messages read per step of a search, newest first


@attrs.frozen
class Found:
    """A search's page: the matching messages newest first, summaries whose text matches, and where
    the next page's scan starts (None: the slot was read to its start)."""

    slot: str
    namespace: str | None
    reader: str | None
    rows: tuple[ReaderRow, ...]
    summaries: tuple[tuple[str, SummaryShown], ...]  # (namespace, summary)
    next_before: int | None
    scanned: int


def search(runtime: Runtime, row: BranchRow, slot: str, *, namespace: str | None, reader: str | None,
           text: str | None, participant: str | None, audience: str | None, before: int | None,
           summaries_of: Sequence[str]) -> Found:
    """Messages of ``slot`` passing every filter given, newest first, at most ``PAGE`` of them,
    scanning from below index ``before`` (None: the newest). With a ``namespace``, each message
    is what its ``reader`` sees of it, filters and text search included: a line private to
    another reader is never searched, so never found. Summaries of the namespaces ``summaries_of``
    whose text holds ``text`` come with the first page (a text-only search)."""
    _slot_of(runtime, row, slot)
    engine = runtime.engine
    head = engine.read_head(slot, row.id)
    top = head.length if before is None else min(max(before, 0), head.length)
    stop, rows = top, list[ReaderRow]()
    while stop > 0 and len(rows) < PAGE:
        start = max(0, stop - SEARCH_BATCH)
        for index, message in reversed(_read(runtime, row, slot, head.revision, start, stop)):
            blocks = reader_blocks(message, reader) if namespace is not None else tuple(shown(b) for b in message.content)
            if (blocks and (participant is None or message.participant == participant)
                    and audience_matches(blocks, audience) and text_matches(blocks, text)):
                rows.append(ReaderRow(index, message.id, message.sequence, message.participant, blocks))
                if len(rows) == PAGE:
                    stop = index
                    break
        else:
            stop = start
    summaries: list[tuple[str, SummaryShown]] = []
    if text and before is None and participant is None and audience is None:
        for name in summaries_of:
            for state in _summary_states(runtime, name):
                items = engine.read_items(state, row.id, at=engine.read_head(state, row.id).revision)
                summaries += [(name, found) for found in map(_summary_from, (json.loads(i.data) for i in items))
                              if text.casefold() in found.text.casefold()]
    return Found(slot, namespace, reader, tuple(rows), tuple(summaries[:PAGE]), stop if stop > 0 else None, top - stop)


# -- the request ledger: what each request sent, kept --------------------------------------------------

# A record's zones (request_ledger.zones_of_stats, zone_tokens_of) and the class a page colours each by.
RECORD_ZONES = {"head": "head", "summaries": "summary", "middle": "middle", "recent": "recent",
                "injections": "injection"}


def has_ledger(runtime: Runtime, namespace: str) -> bool:
    """Whether ``namespace`` ever recorded a request (on any branch)."""
    return runtime.engine.has_state(states.ledger_state(namespace))


@attrs.frozen
class Entry:
    """One recorded request on a page: its place in the ledger (a link's address), the record,
    its cost (None: no price for its model, or no usage reported)."""

    index: int
    record: RequestRecord
    cost: float | None


def _entry(index: int, record: RequestRecord, prices: dict[str, Price]) -> Entry:
    price = prices.get(record.model) if record.model is not None else None
    usage = record.usage
    cost = None if price is None or usage is None else price.cost(
        usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_creation_tokens)
    return Entry(index, record, cost)


def _recorded_sequence(runtime: Runtime, row: BranchRow, namespace: str, index: int, at: int) -> int:
    """The store sequence record ``index`` of the ledger was recorded at (its JSON's ``sequence``:
    records are in sequence order, several may share one)."""
    state = states.ledger_state(namespace)
    [item] = runtime.engine.read_items(state, row.id, at=at, start=index, stop=index + 1)
    try:
        return int(json.loads(item.data)["sequence"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreCorruptError(runtime.engine.data_path, f"log state {state!r} item @{item.sequence}: {exc!r}") from None


def _first_recorded(runtime: Runtime, row: BranchRow, namespace: str, length: int, at: int, sequence: int) -> int:
    """The index of the first record recorded at ``sequence`` or later (``length`` if none)."""
    low, high = 0, length
    while low < high:
        middle = (low + high) // 2
        if _recorded_sequence(runtime, row, namespace, middle, at) < sequence:
            low = middle + 1
        else:
            high = middle
    return low


async def _ledger_page(runtime: Runtime, row: BranchRow, manager: ContextManager, start: int,
                       count: int) -> list[RequestRecord]:
    """Records ``start`` to ``start + count`` of the namespace's ledger, oldest first, read by
    ``requests(since=...)``: the sequence ``start`` was recorded at and the first record of that
    sequence are found by binary search, and the records sharing it before ``start`` read and left
    out."""
    state = states.ledger_state(manager.namespace)
    head = runtime.engine.read_head(state, row.id)
    sequence = _recorded_sequence(runtime, row, manager.namespace, start, head.revision)
    first = _first_recorded(runtime, row, manager.namespace, head.length, head.revision, sequence)
    # A request holds a message, so it was recorded at sequence 1 or later: ``since`` is never negative.
    found = await manager.requests(since=max(sequence - 1, 0), limit=start - first + count)
    return found[start - first:start - first + count]  # a page runs on through the records sharing its last sequence


@attrs.frozen
class History:
    namespace: str
    total: int
    page: int
    pages: int
    entries: tuple[Entry, ...]  # newest first
    priced: bool  # a price table was given


async def history(runtime: Runtime, row: BranchRow, manager: ContextManager, page: int | None,
                  prices: dict[str, Price]) -> History:
    """One page (50) of the namespace's recorded requests on the branch (its parent's up to the
    fork point included), newest first: page ``page`` counting from the oldest (None: the newest
    50). The newest page is ``requests(limit=50)``; another finds where it starts (``_ledger_page``)."""
    length = ledger_length(runtime, row, manager.namespace)
    if not length:
        return History(manager.namespace, 0, 0, 1, (), bool(prices))
    pages = max(1, -(-length // PAGE))
    if page is None:
        page, start = pages - 1, max(0, length - PAGE)
        records = await manager.requests(limit=PAGE)
    else:
        page = min(max(page, 0), pages - 1)
        start = page * PAGE
        records = await _ledger_page(runtime, row, manager, start, PAGE)
    entries = [_entry(start + i, r, prices) for i, r in enumerate(records)][::-1]
    return History(manager.namespace, length, page, pages, tuple(entries), bool(prices))


def ledger_length(runtime: Runtime, row: BranchRow, namespace: str) -> int:
    """How many requests ``namespace``'s ledger holds on the branch (its head: one read)."""
    state = states.ledger_state(namespace)
    return runtime.engine.read_head(state, row.id).length if runtime.engine.has_state(state) else 0


async def entry(runtime: Runtime, row: BranchRow, manager: ContextManager, index: int,
                prices: dict[str, Price]) -> Entry:
    """The request at ``index`` in the namespace's ledger on the branch (numbered from 0, oldest first)."""
    length = ledger_length(runtime, row, manager.namespace)
    if not 0 <= index < length:
        raise NotFound(f"no request {index} in namespace {manager.namespace!r}'s ledger on branch {row.name!r} "
                       f"(it holds {length}, numbered from 0)")
    [record] = await _ledger_page(runtime, row, manager, index, 1)
    return _entry(index, record, prices)


@attrs.frozen
class AsSent:
    entry: Entry
    body: str  # the rebuilt body, as indented JSON
    edited: tuple[str, ...]
    matches: bool
    problem: str | None  # why it couldn't be rebuilt


async def as_sent(manager: ContextManager, found: Entry) -> AsSent:
    """``found``'s request made again from the store (``rebuild_request``), and the held messages
    edited or removed since; a message no longer in the store's history is said, not raised."""
    try:
        rebuilt = await manager.rebuild_request(found.record)
    except MessageNotFoundError as exc:
        return AsSent(found, "", (), False, str(exc))
    body = json.dumps(rebuilt.body, indent=2, ensure_ascii=False, default=_jsonable)
    return AsSent(found, body, tuple(rebuilt.edited), rebuilt.matches, None)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict | list | tuple):
        return list(value) if not isinstance(value, dict) else dict(value)
    if hasattr(value, "items"):
        return dict(value.items())
    raise TypeError(f"not JSON: {type(value).__name__}")


def part_label(part: RecordPart) -> str:
    """A request's message for a diff: the stored message it carried, or (a summary, an
    injection, a message shown other than as stored) the start of its content as kept."""
    if part.message is not None:
        return f"message {part.message}"
    texts = [str(block.get("text", block.get("type", ""))) for block in part.content or () if isinstance(block, dict)]
    text = " ".join(texts)
    return text if len(text) <= 160 else f"{text[:160]}..."


@attrs.frozen
class PartPair:
    index: int
    a: RecordPart | None
    b: RecordPart | None
    same: bool


@attrs.frozen
class RequestDiff:
    a: Entry
    b: Entry
    joined: tuple[str, ...]  # held by b, not a (ids; a summary's prefixed "summary ")
    left: tuple[str, ...]
    pairs: tuple[PartPair, ...]
    first_change: int | None  # the first message that differs (None: none does)
    cached_a: int  # a's messages up to its last cache breakpoint: the prefix a provider could cache
    prefix_held: bool  # b begins with all of them


async def request_diff(manager: ContextManager, a: Entry, b: Entry) -> RequestDiff:
    """What joined and left between two requests of ``manager``'s namespace (the messages and
    summaries each held), message by message which differ (a message both carried differs when
    it was edited between them: each side is read as of its request, ``get_message_at``), and
    whether the second kept the first's cached prefix (its messages up to its last cache
    breakpoint) or where that broke."""
    held_a = [("summary " if h.kind == "summary" else "") + h.id for h in a.record.held]
    held_b = [("summary " if h.kind == "summary" else "") + h.id for h in b.record.held]
    parts_a, parts_b = a.record.parts, b.record.parts

    async def as_sent(part: RecordPart) -> Any:
        assert part.message is not None
        try:
            return (await manager.get_message_at(part.message, part.version)).content
        except MessageNotFoundError:
            return None  # gone from the store's history: no longer comparable

    pairs = []
    for index in range(max(len(parts_a), len(parts_b))):
        pa = parts_a[index] if index < len(parts_a) else None
        pb = parts_b[index] if index < len(parts_b) else None
        same = pa is not None and pb is not None and (pa.participant, pa.message, pa.content) == (
            pb.participant, pb.message, pb.content)
        if same and pa is not None and pb is not None and pa.message is not None:
            was, now = await as_sent(pa), await as_sent(pb)
            same = was is not None and was == now
        pairs.append(PartPair(index, pa, pb, same))
    first_change = next((pair.index for pair in pairs if not pair.same), None)
    marks = [i for i, part in enumerate(parts_a) if part.cache_breakpoint]
    cached = marks[-1] + 1 if marks else 0
    return RequestDiff(a, b, tuple(i for i in held_b if i not in set(held_a)), tuple(i for i in held_a if i not in set(held_b)),
                       tuple(pairs), first_change, cached, first_change is None or first_change >= cached)


@attrs.frozen
class AuditLine:
    namespace: str
    entries: tuple[Entry, ...]  # oldest first
    more_since: int | None  # the next page's ``since`` (None: no more)


async def audit(runtime: Runtime, row: BranchRow, manager: ContextManager, item_id: str, since: int | None,
                prices: dict[str, Price]) -> AuditLine:
    """The requests of ``manager``'s namespace that held message or summary ``item_id``
    (``requests(holding=...)``), oldest first, ``PAGE`` of them from ``since`` (a store sequence;
    None: from the start), each with its place in the ledger (a binary search by sequence)."""
    if not has_ledger(runtime, manager.namespace):
        return AuditLine(manager.namespace, (), None)
    found = await manager.requests(since=since or 0, limit=PAGE + 1, holding=item_id)
    more = found[PAGE - 1].sequence if len(found) > PAGE else None
    state = states.ledger_state(manager.namespace)
    head = runtime.engine.read_head(state, row.id)

    async def index_of(record: RequestRecord) -> int:  # its place among those recorded at its sequence
        first = _first_recorded(runtime, row, manager.namespace, head.length, head.revision, record.sequence)
        stop = _first_recorded(runtime, row, manager.namespace, head.length, head.revision, record.sequence + 1)
        same = await manager.requests(since=max(record.sequence - 1, 0), limit=stop - first)
        return next(first + i for i, found in enumerate(same) if found.id == record.id)

    return AuditLine(manager.namespace, tuple([_entry(await index_of(r), r, prices) for r in found[:PAGE]]), more)


# -- summaries --------------------------------------------------------------------------------------


@attrs.frozen
class SummaryPage:
    namespace: str
    total: int
    page: int
    pages: int
    summaries: tuple[SummaryShown, ...]
    children: dict[str, tuple[str, ...]]


def summary_page(runtime: Runtime, row: BranchRow, namespace: str, page: int | None,
                 at: str | None = None) -> SummaryPage:
    """One page of a namespace's summaries, newest first, each with its parent and children:
    page ``page`` counting from 0 (None: the newest), or the page holding summary ``at`` (the
    newest page when none holds it)."""
    engine = runtime.engine
    names = _summary_states(runtime, namespace)
    if not names:
        return SummaryPage(namespace, 0, 0, 1, (), {})
    state = names[0]
    head = engine.read_head(state, row.id)
    pages = max(1, -(-head.length // PAGE))

    def page_of(number: int) -> list[SummaryShown]:
        stop = head.length - number * PAGE  # newest first
        items = engine.read_items(state, row.id, at=head.revision, start=max(0, stop - PAGE), stop=stop)
        return [_summary_from(json.loads(item.data)) for item in reversed(items)]

    if at is not None:
        # Summaries are few beside messages (one per chunk and per merge), so a page-by-page look
        # is cheap; a link to a summary can't know its page, since newer summaries push it back.
        for number in range(pages):
            found = page_of(number)
            if any(summary.id == at for summary in found):
                return _summary_page(namespace, head.length, number, pages, found)
    page = 0 if page is None else min(max(page, 0), pages - 1)
    return _summary_page(namespace, head.length, page, pages, page_of(page))


def _summary_page(namespace: str, total: int, page: int, pages: int, found: list[SummaryShown]) -> SummaryPage:
    children = {s.id: s.source_ids for s in found if s.level > 1}
    return SummaryPage(namespace, total, page, pages, tuple(found), children)


def _summary_from(data: dict[str, Any]) -> SummaryShown:
    return SummaryShown(str(data["id"]), int(data["level"]), int(data.get("tokens", 0)), str(data["first_id"]),
                        str(data["last_id"]), int(data["first_sequence"]), int(data["last_sequence"]),
                        tuple(str(i) for i in data.get("source_ids", ())), str(data.get("content", "")),
                        data.get("parent_id"))


# -- two readers' views of one stretch ----------------------------------------------------------------


@attrs.frozen
class DiffRow:
    id: str
    sequence: int
    participant: str
    both: tuple[Shown, ...]  # blocks each reader sees
    only_a: tuple[Shown, ...]
    only_b: tuple[Shown, ...]
    carried_a: str  # how each reader's compile carries it: raw, in summary S (Ln), dropped, not sent
    carried_b: str


@attrs.frozen
class Diff:
    a: str
    b: str
    reader_a: str | None
    reader_b: str | None
    timeline: Timeline
    rows: tuple[DiffRow, ...]


async def diff(runtime: Runtime, row: BranchRow, slot: str, page: int | None, a: ContextManager,
               b: ContextManager, budget: Budget) -> Diff:
    """For one timeline page: what each reader sees of each message, and how its compile carries it."""
    page_of = timeline(runtime, row, slot, page)
    carried = [await _carriage(manager, budget) for manager in (a, b)]
    rows = []
    for message in page_of.messages:
        views = [reader_view_of(message, manager.view_reader) for manager in (a, b)]
        seen = [list(view.content) if view is not None else [] for view in views]
        both = [block for block in seen[0] if block in seen[1]]
        rows.append(DiffRow(
            message.id, message.sequence, message.participant, tuple(shown(x) for x in both),
            tuple(shown(x) for x in seen[0] if x not in both), tuple(shown(x) for x in seen[1] if x not in both),
            *(how(message, views[i]) for i, how in enumerate(carried)),
        ))
    return Diff(a.namespace, b.namespace, a.view_reader, b.view_reader, page_of, tuple(rows))


async def _carriage(manager: ContextManager, budget: Budget) -> Any:
    result = await manager.compile(budget)
    stats = manager.render_stats()
    dropped = set(() if stats is None else stats.dropped_ids)
    # A copy's sources say whether they came complete; a summary's name the messages it covers, without.
    raw = {s.id for found in result.provenance.messages for s in found if s.kind == "message" and s.complete is not None}
    covered: list[SummaryShown] = []
    for summary_id in {s.id for found in result.provenance.messages for s in found if s.kind == "summary"}:
        summary = await manager.get_summary(summary_id)
        if summary is not None:
            covered.append(summary_shown(summary))

    def how(message: Message, view: Message | None) -> str:
        if view is None:
            return "sees nothing of it"
        if message.id in raw:
            return "raw"
        for summary in covered:
            if summary.first_sequence <= message.sequence <= summary.last_sequence:
                return f"in summary {summary.id} (L{summary.level})"
        return "dropped" if message.id in dropped else "not sent"

    return how


def page_numbers(pages: int, page: int, around: int = 3) -> Sequence[int]:
    """The page links a pager shows: the first, the last, and a few around the current one."""
    return sorted({0, pages - 1, *range(max(0, page - around), min(pages, page + around + 1))})
