"""The request ledger's records (Q1-Q8): what a namespace's reader was sent, kept.

``RequestRecord`` is one request as the ledger keeps it: who it was for, the ids and versions of
the messages and summaries it held (``HeldItem``), tokens per zone, the stable prefix, a digest of
the body, the model, its usage (``RequestUsage``) and latency. A record holds no content but the
system text and the injected text of the request (the reader's own request: nothing of another
reader's view), so a request is rebuilt (``RebuiltRequest``) from the stored messages it names.

Pure: records are made from a compile result (``record_of``) or a compression request
(``compression_record``), encoded to and decoded from a log item's bytes, and a body is digested
here; the manager stores them (``ContextManager.record_request``) and the namespace's drain
records its compression calls.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import re
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from .compile.provenance import Provenance
from .compile.result import CompileResult
from .content.blocks import Block, CompiledMessage, Text
from .content.codec import from_jsonable, to_jsonable
from .content.tokens import estimate_blocks, estimate_text
from .errors import StoreCorruptError
from .forms.body_runs import MadeFrom, holds, run_length
from .models.model_types import ModelRequest, ModelResponse, Usage
from .store.interface import StoreEngine
from .store.records import Item

# The forms a record names: a compile result's request forms (``CompileResult.to_anthropic``,
# ``to_openai_chat``, ``to_openai_responses``), and a compression call the namespace made.
FORMS = ("anthropic", "openai_chat", "openai_responses")
COMPRESSION = "compression"
# 2: a body's digest takes its items' digests in chunks cut by content, an item whose content is a
# list its blocks' likewise (``body_digest``, ``item_digest``). Records of format 1 are read as
# ever; their digest is checked by format 1's definition (``body_digest_v1``).
RECORD_FORMAT = 2
FORMATS = (1, 2)


@attrs.frozen
class HeldItem:
    """A message or summary a request held. ``version``: the store sequence as of which it was held
    (``get_message_at(id, version)`` is the message exactly as sent)."""

    id: str
    kind: Literal["message", "summary"]
    version: int


@attrs.frozen
class RequestUsage:
    """What the provider reported a request cost; None where it reported nothing."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None

    @classmethod
    def of(cls, usage: RequestUsage | Usage | Mapping[str, Any] | None) -> RequestUsage | None:
        """A ``RequestUsage`` from one, from ``ctxrt.Usage`` (a model's), or from a mapping with
        this class's field names (TypeError, ValueError otherwise)."""
        if usage is None or isinstance(usage, RequestUsage):
            return usage
        if isinstance(usage, Usage):  # checked as a mapping is: a host's own model may report anything
            usage = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                     "cache_read_tokens": usage.cache_read_input_tokens,
                     "cache_creation_tokens": usage.cache_creation_input_tokens}
        if not isinstance(usage, Mapping):
            raise TypeError(f"usage must be a RequestUsage, a ctxrt.Usage, a mapping or None, not {type(usage).__name__}")
        unknown = sorted(set(usage) - _USAGE_FIELDS)
        if unknown:
            raise ValueError(f"usage: unknown field(s) {unknown}; known: {sorted(_USAGE_FIELDS)}")
        for name, value in usage.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"usage[{name!r}] must be a non-negative int or None, not {value!r}")
        return cls(**usage)


_USAGE_FIELDS = frozenset(field.name for field in attrs.fields(RequestUsage))


@attrs.frozen
class RequestPart:
    """One message of the request as the record keeps it, to rebuild the body: who spoke, whether
    the cache broke after it, and either the stored message it carried unaltered (``message``) or
    its content (summaries, injections, a message shown other than as stored: ``content``, in the
    reader's view, as the codec writes blocks). ``sources``: the (kind, id) of each message and
    summary it came from; ``version``: the store sequence as of which it was held."""

    participant: str
    cache_breakpoint: bool = False
    message: str | None = None
    content: tuple[Any, ...] | None = None
    sources: tuple[tuple[str, str], ...] = ()
    version: int = 0


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One request a namespace's reader was sent, as the ledger keeps it (Q1)."""

    id: str
    at_ms: int  # wall clock, ms since the epoch
    sequence: int  # the store's sequence when it was recorded: what the request saw
    namespace: str
    branch: str
    reader: str | None
    form: str  # one of FORMS, or "compression"
    model: str | None = None
    budget: int | None = None  # Budget.max_tokens of the compile
    zone_tokens: Mapping[str, int]
    total_tokens: int = 0
    stable_prefix_tokens: int = 0
    body_digest: str = ""  # sha256 hex of the body's canonical JSON (``body_digest``)
    held: tuple[HeldItem, ...] = ()
    usage: RequestUsage | None = None
    latency_ms: float | None = None
    response: str | None = None  # sha256 hex of the reply's text: never the text itself
    response_chars: int | None = None
    trace_id: str | None = None
    span_id: str | None = None
    # What a rebuild needs besides the stored messages: the form's options and the request's parts.
    options: Mapping[str, Any] = attrs.field(repr=False)
    parts: tuple[RequestPart, ...] = attrs.field(default=(), repr=False)

    def holds(self, item_id: str) -> bool:
        """Whether the request held the message or summary ``item_id``."""
        return any(item.id == item_id for item in self.held)


@attrs.frozen
class RebuiltRequest:
    """A recorded request's body made again from the store (Q5). ``edited``: the held messages
    edited or removed since (their content now differs from what was sent: the body is made of
    what they hold now); ``matches``: the body's digest is the recorded one."""

    body: Any
    edited: tuple[str, ...]
    matches: bool


# -- digests -----------------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """The canonical JSON a digest is taken of: sorted keys, no spaces, UTF-8."""
    return _CANONICAL.encode(value).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


# Made once: ``json.dumps`` with these options makes an encoder per call (a third of a small item's digest).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def _items_key(body: Mapping[str, Any]) -> str:
    return "input" if "input" in body and "messages" not in body else "messages"


def body_digest(body: Any, memo: BodyDigests | None = None, made: MadeFrom | None = None) -> str:
    """sha256 hex over ``body``'s canonical JSON without its item list (``messages``, or a
    Responses body's ``input``), the list's key, then the digests of the list's chunks
    (``Chunked``: runs of item digests, ``item_digest``, cut where an item's digest says so).
    Items, an item's blocks, and chunks are digested one by one so a body that shares a run of
    items with the last one (P14), or an item that shares a run of blocks with the last body's
    first or last item (a merged turn trimmed or grown), costs what is new (``memo``); the value
    is the same either way (record format 2). ``memo`` keeps the item list: hand it one that no
    one changes after (``record_request``'s own body, made for its digest); ``made``: how that
    list was made (``CompileResult`` knows, for the last body of a form), for ``memo``."""
    body = dict(body)
    key = _items_key(body)
    items = body.pop(key, [])
    chunked = memo.digested(items, made) if memo is not None else Chunked.of([item_digest(i) for i in items])
    whole = hashlib.sha256(canonical_json(body))
    whole.update(key.encode())
    whole.update(b"".join(chunked.sums))
    return whole.hexdigest()


def item_digest(item: Any, blocks: Chunked | None = None) -> bytes:
    """An item's sha256: of its canonical JSON, or for an item whose ``content`` is a list (a turn's
    blocks, a message's parts), of the canonical JSON of the item without it, ``content``, then
    the digests of its blocks' chunks (``Chunked`` of the sha256 of each block's canonical JSON;
    ``blocks``, if known), so a turn merging thousands of blocks costs what changed in it."""
    content = _blocks_of(item)
    if content is None:
        return hashlib.sha256(canonical_json(item)).digest()
    if blocks is None:
        blocks = Chunked.of(_digested(content))
    whole = hashlib.sha256(canonical_json({k: v for k, v in item.items() if k != "content"}))
    whole.update(b"content")
    whole.update(b"".join(blocks.sums))
    return whole.digest()


def body_digest_v1(body: Any) -> str:
    """The digest records of format 1 hold: the sha256 over the body's canonical JSON without its
    item list, the list's key, then the sha256 of each item's canonical JSON. A rebuild checks an
    older record's digest by it."""
    body = dict(body)
    key = _items_key(body)
    items = body.pop(key, [])
    whole = hashlib.sha256(canonical_json(body))
    whole.update(key.encode())
    whole.update(b"".join(_digested(items)))
    return whole.hexdigest()


def _digested(values: Iterable[Any]) -> list[bytes]:
    return [hashlib.sha256(canonical_json(value)).digest() for value in values]


def _blocks_of(item: Any) -> list[Any] | tuple[Any, ...] | None:
    """An item's ``content``, if it is a list of blocks."""
    content = item.get("content") if type(item) is dict or isinstance(item, Mapping) else None
    return content if isinstance(content, (list, tuple)) else None


_CUT = 8  # a digest whose first byte is below this ends a chunk: one in 32
_FEW = 8  # an item of at most this many blocks is digested whole, not looked for in the last body's


class Chunked:
    """A list of digests (items', or an item's blocks') cut into chunks by content: a chunk ends
    after each digest whose first byte is below ``_CUT``, and at the list's end. ``chunks``: the
    digests of each chunk; ``ends``: where each ends in the list; ``sums``: each chunk's sha256
    (of its digests, concatenated). Where a window slid or grew, the cuts are where they were, so
    a list sharing a run with the last one takes the chunks inside the run as they were
    (``then``): a turn digests what it adds, a few chunks, and one digest per chunk. The digests
    are kept chunk by chunk, and the ends counted from a moving ``origin`` (``marks``), so a turn
    moves chunks, not every item's digest, and shifts no end."""

    __slots__ = ("chunks", "marks", "origin", "sums")

    def __init__(self, chunks: list[tuple[bytes, ...]], marks: list[int], sums: list[bytes], origin: int = 0) -> None:
        self.chunks, self.marks, self.sums, self.origin = chunks, marks, sums, origin

    @classmethod
    def of(cls, digests: Sequence[bytes]) -> Chunked:
        chunks, marks = _split(digests, 0)
        return cls(chunks, marks, [hashlib.sha256(b"".join(chunk)).digest() for chunk in chunks])

    @property
    def ends(self) -> list[int]:
        return [mark - self.origin for mark in self.marks]

    def then(self, shared: Shared, head: list[bytes], tail: list[bytes]) -> Chunked:
        """``head``, the run ``shared`` names of these digests, then ``tail``: the chunks wholly
        inside the run kept, the others digested."""
        chunks, marks, origin = self.chunks, self.marks, self.origin
        drop, stop = origin + shared.drop, origin + shared.drop + shared.keep  # as marks count
        first = bisect_right(marks, drop)  # the chunk the run starts in
        last = bisect_right(marks, stop)  # marks[first:last]: the chunks ending inside the run
        if last > first and last == len(marks) and chunks[-1][-1][0] >= _CUT:
            last -= 1  # the list's end, not a cut: the run's last chunk may go on
        if last - first < 2:  # no chunk wholly inside it
            return Chunked.of([*head, *self._digests(drop, stop), *tail])
        moved = drop - len(head)  # the new list's origin: the kept marks count the same items
        # Up to the run's first cut, and from its last on: a piece of one chunk (no cut inside but
        # at its end) with what is new, which alone is looked through for cuts.
        front_piece = self._digests(drop, marks[first])
        front, front_marks = _split([*head, *front_piece], moved, (len(head), len(head) + len(front_piece) - 1))
        rest_piece = self._digests(marks[last - 1], stop)
        rest, rest_marks = _split([*rest_piece, *tail], marks[last - 1], (0, len(rest_piece)))
        digest = hashlib.sha256
        return Chunked([*front, *chunks[first + 1:last], *rest], [*front_marks, *marks[first + 1:last], *rest_marks],
                       [*(digest(b"".join(chunk)).digest() for chunk in front), *self.sums[first + 1:last],
                        *(digest(b"".join(chunk)).digest() for chunk in rest)], moved)

    def _digests(self, start: int, stop: int) -> list[bytes]:
        """The digests from mark ``start`` to mark ``stop``: within one chunk, unless ``then``
        makes all afresh."""
        if start >= stop:
            return []
        marks = self.marks
        at = bisect_right(marks, start)
        if at < len(marks) and stop <= marks[at]:
            begins = marks[at - 1] if at else self.origin
            return list(self.chunks[at][start - begins:stop - begins])
        return list(itertools.chain.from_iterable(self.chunks))[start - self.origin:stop - self.origin]


def _split(digests: Sequence[bytes], offset: int,
           plain: tuple[int, int] = (0, 0)) -> tuple[list[tuple[bytes, ...]], list[int]]:
    """``digests`` cut into chunks, and where each ends (counted from ``offset``). ``plain``: a
    range of them known to hold no cut (a piece of a chunk), not looked through."""
    chunks, ends, start = [], [], 0
    for n in itertools.chain(range(plain[0]), range(plain[1], len(digests))):
        if digests[n][0] < _CUT:
            chunks.append(tuple(digests[start:n + 1]))
            ends.append(offset + n + 1)
            start = n + 1
    if start < len(digests):
        chunks.append(tuple(digests[start:]))
        ends.append(offset + len(digests))
    return chunks, ends


class BodyDigests:
    """The digests of the last body digested: the items it shares with the next one are not
    digested again, nor the blocks an item of the next one shares with its first or last item
    (a turn merging one role's messages, trimmed at the front or grown at the back), nor the
    chunks inside those runs (``Chunked``). The last body's last item, and that item's last
    block, are digested again: the host may have edited them in place (P14, P15)."""

    def __init__(self) -> None:
        self._items: Sequence[Any] = []
        self._made: MadeFrom | None = None  # how the last items were made, if known
        self._chunked = Chunked.of([])
        # The first and last items whose content is a list: the item, its blocks as digested, their
        # digests, and whether it was the last item (its last block the host's).
        self._ends: list[tuple[Any, list[Any], Chunked, bool]] = []

    def digested(self, items: Sequence[Any], source: MadeFrom | None = None) -> Chunked:
        """``items``' chunked digests; ``source``: how they were made (``MadeFrom``, of these very
        items), so the run they share with the last ones is read off it, not looked for."""
        source = source if source is not None and source.items is items else None
        shared = self.followed(items, source)
        if shared is None:
            shared = shared_run(items, self._items)
        keep = shared.keep
        if shared.drop + keep == len(self._items):
            keep = max(keep - 1, 0)
        head = shared.head if keep else 0
        made: dict[int, tuple[list[Any], Chunked]] = {}
        chunked = self._chunked.then(Shared(head, shared.drop, keep), self._digest(items, 0, head, made),
                                     self._digest(items, head + keep, len(items), made))
        ends = []
        for at in dict.fromkeys((0, len(items) - 1)) if items else ():
            found = made.get(at) or next(((blocks, each) for item, blocks, each, _ in self._ends if item is items[at]), None)
            if found is not None:
                ends.append((items[at], *found, at == len(items) - 1))
        self._items, self._made, self._chunked, self._ends = items, source, chunked, ends
        return chunked

    def followed(self, items: Sequence[Any], made: MadeFrom | None) -> Shared | None:
        """What ``shared_run(items, self._items)`` finds, read off the turns ``made`` says its body
        took whole from the last one's (the same objects, but where either list holds a copy): the
        first of ``items``' first few that is one of the last items' first ``_DROP_LOOK``, and the
        run from it. None: not known (the lists are compared)."""
        last = self._made
        if (made is None or last is None or made.items is not items or made.prior is None
                or made.prior is not last.token):
            return None
        for head in range(min(_HEAD_LOOK, len(items))):
            turn = head - made.shift  # the items before the first turn are new: a continued turn
            at = bisect_right(made.runs, (turn, sys.maxsize)) - 1
            if turn < 0 or at < 0 or not made.runs[at][0] <= turn < made.runs[at][0] + made.runs[at][2]:
                continue  # a turn made here: no last item is it
            to, first, count = made.runs[at]
            was = first + turn - to
            if holds(made.copied, turn) or holds(last.copied, was):
                continue  # a copy, here or there
            drop = last.shift + was
            if drop >= _DROP_LOOK or any(map(operator.is_, self._items[:drop], itertools.repeat(items[head]))):
                return None  # not where the scan looks first
            stop = min(to + count, _after(made.copied, turn), _after(last.copied, was) - was + turn)
            return Shared(head, drop, stop - turn)
        return Shared()

    def _digest(self, items: Sequence[Any], start: int, stop: int,
                made: dict[int, tuple[list[Any], Chunked]]) -> list[bytes]:
        out = []
        for at in range(start, stop):
            item = items[at]
            content = _blocks_of(item)
            if content is None:
                out.append(item_digest(item))
                continue
            blocks = list(content)  # as digested: the host may change its list
            each = self._blocks(blocks)
            out.append(item_digest(item, each))
            if at in (0, len(items) - 1):
                made[at] = (blocks, each)
        return out

    def _blocks(self, blocks: list[Any]) -> Chunked:
        """The chunked digests of ``blocks``, those of the longest run it shares with the last
        body's first or last item taken as they were (but the last item's last block)."""
        if len(blocks) <= _FEW:  # digested at once: cheaper than a look for a run
            return Chunked.of(_digested(blocks))
        best, kept = Shared(), None
        for _, old, each, last in self._ends:
            run = shared_run(blocks, old)
            keep = run.keep - (last and run.drop + run.keep == len(old))
            if keep > best.keep:
                best, kept = Shared(run.head, run.drop, keep), each
        if kept is None:
            return Chunked.of(_digested(blocks))
        return kept.then(best, _digested(blocks[:best.head]), _digested(blocks[best.head + best.keep:]))


def _after(positions: list[int], position: int) -> int:
    """The first of the sorted ``positions`` at or after ``position`` (``sys.maxsize`` if none)."""
    at = bisect_left(positions, position)
    return positions[at] if at < len(positions) else sys.maxsize


def made_from(result: CompileResult, body: Any) -> MadeFrom | None:
    """How ``body``'s item list was made (``MadeFrom``), if it is the last one ``result``'s
    bodies made (its memo's, for any result of it): for ``body_digest``."""
    return result._bodies.made_from(body.get("messages") if isinstance(body, dict) else None)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- making records ------------------------------------------------------------------------------


def check_latency(value: object) -> float | None:
    """``latency_ms``: None, or a non-negative finite number of milliseconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"latency_ms must be a number of milliseconds or None, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"latency_ms must be a non-negative finite number, not {value!r}")
    return float(value)


def stored_options(options: Mapping[str, Any], result: CompileResult) -> dict[str, Any]:
    """A form's keyword arguments as a record keeps them (JSON): ``assistant`` as a sorted list,
    and the result's system injections' text (``system_injections``), which a rebuilt result
    carries again."""
    kept = dict(options)
    assistant = kept.get("assistant")
    if assistant is not None and not isinstance(assistant, str):
        if not all(isinstance(name, str) for name in assistant):
            raise TypeError(f"options['assistant'] must be a str or a collection of str, not {assistant!r}")
        kept["assistant"] = sorted(assistant)
    texts = [b.text for b in result.system_injections if isinstance(b, Text)]
    if texts:
        kept[_INJECTIONS] = texts
    return kept


_INJECTIONS = "system_injections"


def make_body(result: CompileResult, form: str, options: Mapping[str, Any]) -> Any:
    """The body ``form`` makes of ``result`` with ``options`` (its keyword arguments)."""
    if form == "anthropic":
        return result.to_anthropic(**options)
    if form == "openai_chat":
        return result.to_openai_chat(**options)
    if form == "openai_responses":
        return result.to_openai_responses(**options)
    raise ValueError(f"form must be one of {FORMS}, not {form!r}")


def check_form(form: object) -> str:
    if not isinstance(form, str):
        raise TypeError(f"form must be a str, not {type(form).__name__}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(map(repr, FORMS))} (the CompileResult method's name "
                         f"without 'to_'), not {form!r}")
    return form


def part_zones(result: CompileResult) -> list[str]:
    """Each message's zone, read off the result's provenance: head (raw before the first summary),
    summaries, middle (raw among them), recent (raw after the last), injections."""
    sources = result.provenance.messages
    summary_at = [i for i, found in enumerate(sources) if any(s.kind == "summary" for s in found)]
    first, last = (summary_at[0], summary_at[-1]) if summary_at else (len(sources), -1)
    zones = []
    for index, found in enumerate(sources):
        if any(s.kind == "injection" for s in found):
            zones.append("injections")
        elif any(s.kind == "summary" for s in found):
            zones.append("summaries")
        elif index < first:
            zones.append("head" if summary_at else "recent")
        elif index > last:
            zones.append("recent")
        else:
            zones.append("middle")
    return zones


def zone_tokens_of(result: CompileResult) -> dict[str, int]:
    """Tokens per zone (``part_zones``), as the inspector classes them. Used when the
    namespace's own figures for this compile are gone."""
    zones: dict[str, int] = {}
    for message, zone in zip(result.messages, part_zones(result)):
        zones[zone] = zones.get(zone, 0) + estimate_blocks(message.content)
    return zones


def zones_of_stats(stats: Any) -> dict[str, int]:
    """Tokens per zone as a strategy's ``RenderStats`` reports them."""
    return {"head": stats.head_tokens, "summaries": stats.summary_tokens, "middle": stats.middle_raw_tokens,
            "recent": stats.tail_tokens}


def part_of(message: CompiledMessage, found: Sequence[Any], raw: Mapping[str, Any], version: int) -> RequestPart:
    """A compiled message as a record keeps it: named, if it carries one stored message unaltered."""
    sources = tuple((s.kind, s.id) for s in found if s.kind != "injection")
    if len(found) == 1 and found[0].kind == "message" and found[0].complete:
        body = raw.get(found[0].id)
        if body is not None and (body.content is message.content or body.content == message.content):
            return RequestPart(message.participant, message.cache_breakpoint, found[0].id, None, sources, version)
    return RequestPart(message.participant, message.cache_breakpoint, None,
                       tuple(to_jsonable(list(message.content))), sources, version)


@attrs.frozen
class Shared:
    """Where a request shares a run of its parts (or body items) with the last one: its first
    ``head`` are its own, then ``keep`` of the last one's from ``drop`` on (a window that slid
    dropped the first ``drop``), then its own again."""

    head: int = 0
    drop: int = 0
    keep: int = 0


def shared_run(new: Sequence[Any], old: Sequence[Any], *, equal: bool = False) -> Shared:
    """The longest run of ``old`` that ``new`` holds, found where a turn leaves it: from ``new``'s
    first few items, at ``old``'s first few (a window sliding drops a few at a time). Its first
    item is found by identity, or failing that, with ``equal``, by equality (a compile's messages
    made again, equal); a run goes on while items are the same or equal. Body items are looked
    for by identity only: one merging thousands of blocks would be compared whole at each look;
    and their runs go on only while they are the same objects: a body item made again is a dict
    that ``==`` finds equal to the old one where their JSON differs (``True`` for ``1``)."""
    best = Shared()
    look = old[:_DROP_LOOK]
    for head in range(min(_HEAD_LOOK, len(new))):
        item = new[head]
        drop = next((k for k, each in enumerate(look) if each is item), None)
        if drop is None and equal:
            drop = next((k for k, each in enumerate(look) if each == item), None)
        if drop is None:
            continue
        keep = run_length(new, head, old, drop)  # slice compares in C: the same object, or an equal one
        if not equal:  # cut at the first equal one that is another object (a loop in C)
            keep = next(itertools.compress(itertools.count(), map(operator.is_not, new[head:head + keep],
                                                                 old[drop:drop + keep])), keep)
        if keep > best.keep:
            best = Shared(head, drop, keep)
        if keep:
            break
    return best


_HEAD_LOOK = 3  # a request's own first parts before the shared run: a re-rendered first message, say
_DROP_LOOK = 64  # how far a window may slide between two records that share a run


_ID = operator.attrgetter("id")


class Parts:
    """A request's parts and the items each held (``held`` is their first appearances, in order).
    ``counts`` (how many parts hold each item id) and ``twice`` (how many ids more than one part
    holds) follow the parts as ``then`` changes them, so a record's ``held`` costs nothing to check
    when no item is held twice, the common case; and while every part holds exactly one item
    (``flat`` is then their items, and ``each`` None: it would be ``flat``'s items one by one),
    ``held`` is a slice of the last one's and what changed, not a walk over every part. ``counts``
    is handed on to the next state, edited in place, not copied (a copy cost every turn O(items));
    a state whose next was refused counts its parts again. So are ``parts`` and ``flat`` as lists
    (``listed``): the next state's are these edited (memory moved), each made a tuple by one copy,
    where a slice and a concatenation took three passes over every part."""

    def __init__(self, parts: tuple[RequestPart, ...] = (), each: tuple[tuple[HeldItem, ...], ...] | None = None,
                 counts: dict[str, int] | None = None, twice: int = 0,
                 flat: tuple[HeldItem, ...] | None = (),
                 listed: tuple[list[RequestPart] | None, list[HeldItem] | None] = (None, None)) -> None:
        self.parts = parts
        self.each = each
        self.counts: dict[str, int] | None = {} if counts is None else counts  # None: handed on
        self.twice = twice
        self.flat = flat
        self.listed = listed  # ``parts`` and ``flat`` as lists, None where not made or handed on

    @property
    def held(self) -> tuple[HeldItem, ...]:
        flat = self.flat
        if flat is None:
            flat = tuple(itertools.chain.from_iterable(self.each or ()))
        if not self.twice:
            return flat
        first: dict[str, HeldItem] = {}
        for item in flat:  # an item twice (a message split in two parts): held once, at its first part
            first.setdefault(item.id, item)
        return tuple(first.values())

    def _items(self, start: int, stop: int | None = None) -> Iterable[HeldItem]:
        """The items the parts from ``start`` to ``stop`` hold."""
        if self.flat is not None:
            return self.flat[start:stop]
        return itertools.chain.from_iterable((self.each or ())[start:stop])

    def then(self, shared: Shared, head: Sequence[RequestPart], tail: Sequence[RequestPart]) -> Parts:
        """``head``, this one's run ``shared`` names, then ``tail``."""
        own = [*head, *tail]
        held = [tuple(HeldItem(i, "summary" if k == "summary" else "message", p.version) for k, i in p.sources)
                for p in own]
        stop = shared.drop + shared.keep
        counts, twice = self.counts, self.twice
        if counts is None:  # handed on to a state made of this one before (its record refused)
            counts = {}
            for item in self._items(0):
                counts[item.id] = counts.get(item.id, 0) + 1
        self.counts = None
        for item in itertools.chain(self._items(0, shared.drop), self._items(stop)):  # the parts it leaves
            counts[item.id] -= 1
            twice -= counts[item.id] == 1
            if not counts[item.id]:
                del counts[item.id]
        for items in held:
            for item in items:
                counts[item.id] = counts.get(item.id, 0) + 1
                twice += counts[item.id] == 2
        listed_parts, listed_flat = self.listed
        self.listed = (None, None)
        parts = _edited(listed_parts, self.parts, shared.drop, stop, head, tail)
        if self.flat is not None and all(len(items) == 1 for items in held):
            flat = _edited(listed_flat, self.flat, shared.drop, stop, [items[0] for items in held[:len(head)]],
                           [items[0] for items in held[len(head):]])
            return Parts(tuple(parts), None, counts, twice, tuple(flat), (parts, flat))
        kept = self.each[shared.drop:stop] if self.each is not None else tuple(
            (item,) for item in (self.flat or ())[shared.drop:stop])
        return Parts(tuple(parts), _spliced(held[:len(head)], kept, held[len(head):]), counts, twice, None,
                     (parts, None))


def _edited(listed: list[Any] | None, whole: tuple[Any, ...], drop: int, stop: int, head: Sequence[Any],
            tail: Sequence[Any]) -> list[Any]:
    """``head``, ``whole[drop:stop]`` and ``tail`` as a list: ``listed`` (``whole`` as a list,
    handed on by its state) edited in place, or ``whole`` listed again when that was handed on
    before (to a state whose record was refused)."""
    items = list(whole) if listed is None else listed
    del items[stop:]
    del items[:drop]
    items[:0] = head
    items += tail
    return items


def _spliced(head: Sequence[Any], kept: tuple[Any, ...], tail: Sequence[Any]) -> tuple[Any, ...]:
    """``head``, ``kept`` and ``tail`` as one tuple, the long ``kept`` copied once (a turn's own
    parts are few: most often none before the run)."""
    return (tuple(head) + kept if head else kept) + tuple(tail)


CHAIN = 256  # a record names at most this many before it back to one kept whole (a whole one costs ~100 turns' records)


class RequestEncoder:
    """A (branch, namespace)'s records, each kept as the run of parts it shares with the last one
    this encoder made (its ``base``: a turn shares all but its newest messages, less those a window
    dropped) and its own parts: a record costs what the turn changed, not the whole request. Every
    ``CHAIN``-th record, and one that shares nothing, is whole."""

    def __init__(self) -> None:
        self.record_id: str | None = None
        self.in_flight = False  # the last record rides a batch not yet known committed: no base
        self.chain = 0
        self.messages: Sequence[Any] = ()
        self.sources: Sequence[Any] = ()
        self.state = Parts()
        self.token: object | None = None  # the compile token (``Follows``) of the last result kept
        self._made: tuple[int, Sequence[Any], Sequence[Any], Parts, object | None] = (0, (), (), Parts(), None)
        self.bodies = BodyDigests()
        self.on_at: int | None = None  # the runtime's ledger switches when its flag was last read on

    def encode(self, result: CompileResult, version: int) -> tuple[str | None, Shared, list[RequestPart],
                                                                   list[RequestPart], Parts]:
        """(base record id, the run shared with it, the parts before it, the parts after it, the
        request's parts) for ``result``, recorded at store sequence ``version``."""
        messages, sources = result.messages, result.provenance.messages
        if len(sources) < len(messages):  # the host added messages to the result's list: from no source
            sources = (*sources, *((),) * (len(messages) - len(sources)))
        shared = Shared()
        if self.record_id is not None and not self.in_flight and self.chain < CHAIN:
            found = self.followed(result)
            if found is not None:
                shared = found
            else:
                shared = shared_run(messages, self.messages, equal=True)
                if shared.keep and (sources[shared.head:shared.head + shared.keep]
                                    != self.sources[shared.drop:shared.drop + shared.keep]):
                    shared = Shared()  # the same messages from other sources: none shared
        raw = result.provenance.raw_bodies
        after = shared.head + shared.keep
        head = [part_of(messages[i], sources[i], raw, version) for i in range(shared.head if shared.keep else 0)]
        tail = [part_of(messages[i], sources[i], raw, version) for i in range(after if shared.keep else 0, len(messages))]
        state = self.state.then(shared, head, tail)
        base = self.record_id if shared.keep else None
        # Taken up by ``wrote`` only: a record refused after this is not the next one's base.
        follows = result._follows
        token = follows.token if follows is not None and follows.describes(result) else None
        # The list copied (pointers, in C): the host may change the result's after it is recorded.
        self._made = (self.chain + 1 if shared.keep else 0, list(messages), sources, state, token)
        return base, shared, head, tail, state

    def followed(self, result: CompileResult) -> Shared | None:
        """The run ``shared_run`` (and the sources' compare) would find between ``result``'s
        messages and the last ones kept, read off what its compile knows (``Follows``: the same
        objects copied from the last result this encoder kept): where it is a run from the first
        message to the end of either list (none past it to look at), checked by one compare in C
        (either list is the host's to change in place). None: the lists are scanned."""
        messages, follows, old = result.messages, result._follows, self.messages
        if (follows is None or follows.prior is None or follows.prior is not self.token or not follows.runs
                or not follows.describes(result) or len(old) != follows.prior_length):
            return None
        head, drop, keep = follows.runs[0]
        if head or not keep or drop >= _DROP_LOOK or (drop + keep != len(old) and keep != len(messages)):
            return None
        first = messages[0]
        if old[drop] is not first or any(map(operator.is_, old[:drop], itertools.repeat(first))):
            return None  # the host changed a list, or the first message is earlier in the last one too
        if messages[:keep] != old[drop:drop + keep]:  # the same objects, or the host changed one
            return None
        return Shared(0, drop, keep)

    def wrote(self, record_id: str) -> None:
        """The record last encoded is kept (waiting) as ``record_id``: the next is kept against it."""
        self.chain, self.messages, self.sources, self.state, self.token = self._made
        self.record_id, self.in_flight = record_id, False

    def flying(self, record_id: str) -> None:
        """Record ``record_id`` was taken into a batch: until it is known committed, the next
        record is kept whole (that batch may commit after the next one, or not at all)."""
        if record_id == self.record_id:
            self.in_flight = True

    def landed(self, record_id: str) -> None:
        if record_id == self.record_id:
            self.in_flight = False

    def lost(self, record_id: str) -> None:
        """Record ``record_id`` was not kept (its write failed or was cancelled): the next is whole."""
        if record_id == self.record_id:
            self.record_id, self.in_flight = None, False


def compression_record(
    *, record_id: str, at_ms: int, sequence: int, namespace: str, branch: str, reader: str | None,
    request: ModelRequest, response: ModelResponse, unit_work: Any, latency_ms: float | None,
    trace_id: str | None = None, span_id: str | None = None,
) -> RequestRecord:
    """The record of a compression call the namespace made (Q6): what its unit read, the request
    as sent (its parts kept whole: the reader's view of the chunk), the usage and latency."""
    tokens = estimate_text(request.system or "") + sum(estimate_blocks(m.content) for m in request.messages)
    text = response.text
    return RequestRecord(
        id=record_id, at_ms=at_ms, sequence=sequence, namespace=namespace, branch=branch, reader=reader,
        form=COMPRESSION, model=request.model, budget=request.max_tokens, zone_tokens={COMPRESSION: tokens},
        total_tokens=tokens, body_digest=body_digest(request_body(request)),
        held=compression_held(unit_work, sequence), usage=RequestUsage.of(response.usage),
        latency_ms=latency_ms, response=text_digest(text), response_chars=len(text), trace_id=trace_id,
        span_id=span_id,
        options={"model": request.model, "max_tokens": request.max_tokens, "system": request.system,
                 "assistant": sorted(request.assistant)},
        parts=tuple(RequestPart(m.participant, m.cache_breakpoint, None, tuple(to_jsonable(list(m.content))),
                                version=sequence) for m in request.messages),
    )


def compression_held(unit_work: Any, version: int) -> tuple[HeldItem, ...]:
    """What a compression unit read: the messages of a chunk, or the summaries it merges."""
    items = unit_work if isinstance(unit_work, tuple) else (unit_work,)
    held: dict[str, HeldItem] = {}
    for item in items:
        for message_id in getattr(item, "message_ids", ()) or ():
            held.setdefault(str(message_id), HeldItem(str(message_id), "message", version))
        if hasattr(item, "level") and hasattr(item, "id") and not hasattr(item, "message_ids"):
            held.setdefault(str(item.id), HeldItem(str(item.id), "summary", version))
    return tuple(held.values())


def compression_request(record: RequestRecord, messages: Sequence[CompiledMessage]) -> ModelRequest:
    """The compression request a record keeps, made again from its options and messages."""
    options = record.options
    return ModelRequest(str(options["model"]), options.get("system"), messages, int(options["max_tokens"]),
                        assistant=frozenset(options.get("assistant", ())))


def request_body(request: ModelRequest) -> dict[str, Any]:
    """A compression request as a JSON body (what its digest is taken of): the Messages API's shape."""
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens,
                            "messages": [{"participant": m.participant, "content": to_jsonable(list(m.content))}
                                         for m in request.messages]}
    if request.system:
        body["system"] = request.system
    return body


# -- encoding --------------------------------------------------------------------------------------
# A record is one log item of compact JSON. Its first fields are its id, its base and how many parts
# it keeps of it ({"id":..,"base":..,"keep":..,...}), so an audit (``holding``) reads them off each
# item's bytes without decoding it. A compression record lists what it held ("held"); any other's
# held items are those of its parts' sources.

_HEADER = re.compile(rb'^\{"id":("(?:[^"\\]|\\.)*"),"base":(null|"(?:[^"\\]|\\.)*"),"shared":\[(\d+),(\d+),(\d+)\],')


def encode_record(record: RequestRecord, *, base: str | None = None, shared: Shared = Shared(),
                  head: Sequence[RequestPart] = (), tail: Sequence[RequestPart] | None = None) -> bytes:
    """``record`` as a log item's bytes: whole, or (``base``) as ``head``, the run ``shared`` of
    that record's parts, and ``tail``."""
    own = [*head, *(record.parts if tail is None else tail)]
    data: dict[str, Any] = {
        "id": record.id, "base": base, "shared": [len(head), shared.drop, shared.keep], "f": RECORD_FORMAT,
        "at_ms": record.at_ms, "sequence": record.sequence, "namespace": record.namespace, "branch": record.branch,
        "reader": record.reader, "form": record.form, "model": record.model, "budget": record.budget,
        "zones": dict(record.zone_tokens), "total": record.total_tokens, "stable": record.stable_prefix_tokens,
        "digest": record.body_digest, "usage": None if (usage := record.usage) is None else [
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_creation_tokens],
        "latency_ms": record.latency_ms, "response": record.response, "response_chars": record.response_chars,
        "trace_id": record.trace_id, "span_id": record.span_id, "options": dict(record.options),
        "parts": [_encode_part(p) for p in own],
    }
    if record.form == COMPRESSION:
        data["held"] = [[item.kind[0], item.id, item.version] for item in record.held]
    return _COMPACT.encode(data).encode()


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # made once, as _CANONICAL


def _encode_part(part: RequestPart) -> list[Any]:
    return [part.participant, int(part.cache_breakpoint), part.message,
            None if part.content is None else list(part.content), [[k[0], i] for k, i in part.sources], part.version]


def header(data: bytes) -> tuple[str, str | None, Shared]:
    """(id, base, the run shared with it) read off a record's bytes; ValueError if they don't
    start as a record's."""
    found = _HEADER.match(data)
    if found is None:
        raise ValueError("not a request record")
    base = found.group(2)
    return (json.loads(found.group(1)), None if base == b"null" else json.loads(base),
            Shared(int(found.group(3)), int(found.group(4)), int(found.group(5))))


def check_record(data: bytes) -> None:
    """Whether ``data`` decodes as a record, its base aside (``verify``): ValueError if not."""
    header(data)
    decode_record(data, alone=True)


def decode_record(data: bytes, base: Parts | None = None, *, alone: bool = False) -> tuple[RequestRecord, Parts]:
    """A record from a log item's bytes, and its parts; ``base``: its base record's (required when
    it names one, unless ``alone``: then its own parts only). Raises ``ValueError`` (naming what)
    for bytes that aren't one."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("f") not in FORMATS:
            raise ValueError(f"not a request record of format {' or '.join(map(str, FORMATS))}")
        own = [RequestPart(str(p[0]), bool(p[1]), p[2], None if p[3] is None else tuple(p[3]),
                           tuple(("summary" if k == "s" else "message", str(i)) for k, i in p[4]), int(p[5]))
               for p in raw["parts"]]
        heads, drop, keep = (int(n) for n in raw["shared"])
        if alone or raw["base"] is None:
            heads, drop, keep, base = 0, 0, 0, Parts()
        elif base is None or len(base.parts) < drop + keep or heads > len(own):
            raise ValueError(f"its base record {raw['base']!r} is missing or short")
        state = base.then(Shared(heads, drop, keep), own[:heads], own[heads:])
        if "held" in raw:
            held = tuple(HeldItem(str(i), "message" if k == "m" else "summary", int(v)) for k, i, v in raw["held"])
        else:
            held = state.held
        usage = None if raw["usage"] is None else RequestUsage(*raw["usage"])
        record = RequestRecord(
            id=str(raw["id"]), at_ms=int(raw["at_ms"]), sequence=int(raw["sequence"]), namespace=str(raw["namespace"]),
            branch=str(raw["branch"]), reader=raw["reader"], form=str(raw["form"]), model=raw["model"],
            budget=raw["budget"], zone_tokens={str(k): int(v) for k, v in raw["zones"].items()},
            total_tokens=int(raw["total"]), stable_prefix_tokens=int(raw["stable"]), body_digest=str(raw["digest"]),
            held=held, usage=usage, latency_ms=raw["latency_ms"], response=raw["response"],
            response_chars=raw["response_chars"], trace_id=raw["trace_id"], span_id=raw["span_id"],
            options=dict(raw["options"]), parts=state.parts,
        )
        return record, state
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ValueError(f"a request record that doesn't decode: {exc!r}") from None


# -- reading ---------------------------------------------------------------------------------------


def read_records(engine: StoreEngine, state: str, branch_id: int, *, since: int | None, limit: int,
                 holding: str | None) -> list[RequestRecord]:
    """The records of ledger ``state`` on a branch, oldest first: the newest ``limit`` (with
    ``since``, the first ``limit`` recorded after that sequence, and any more recorded at the
    last one's sequence), only those holding ``holding`` if
    given. Without ``holding`` it reads the records it returns, those before them they are kept
    against (at most ``CHAIN`` of each writer's), and O(log n) more to find ``since``; with it, the
    header of every record (and the whole of those whose own parts name the id)."""
    reader = _Reader(engine, state, branch_id)
    length = reader.length
    start = 0
    if since is not None:  # the first record whose sequence is above ``since``: records are in sequence order
        low, high = 0, length
        while low < high:
            middle = (low + high) // 2
            if _sequence(reader.item(middle)) <= since:
                low = middle + 1
            else:
                high = middle
        start = low
    if holding is None:
        lo, hi = (start, min(length, start + limit)) if since is not None else (max(start, length - limit), length)
        if since is not None:
            hi = _whole_sequence(reader, range(hi, length), hi)
        return [reader.record(index) for index in range(lo, hi)]
    needle = json.dumps(holding, ensure_ascii=False).encode()
    where: dict[str, int | None] = {}  # record id -> the index of the first part holding it, if any
    found: list[int] = []
    for index in range(length):
        item = reader.item(index)
        record_id, base, shared = reader.header(index)
        at = None
        if base is not None:  # held in the run it keeps of its base?
            kept = where.get(base)
            if kept is not None and shared.drop <= kept < shared.drop + shared.keep:
                at = kept - shared.drop + shared.head
        if at is None and needle in item.data:
            record = reader.record(index)
            at = next((n for n, part in enumerate(record.parts) if any(i == holding for _, i in part.sources)), None)
            if at is None and record.holds(holding):
                at = 0
        where[record_id] = at
        if at is not None and index >= start:
            found.append(index)
    if since is None:
        chosen = found[-limit:]
    else:
        chosen = found[:_whole_sequence(reader, found[limit:], limit, found)]
    return [reader.record(index) for index in chosen]


def _whole_sequence(reader: _Reader, after: Sequence[int], stop: int, indices: Sequence[int] | None = None) -> int:
    """Where a page forward (``since``) ends: ``stop``, past the records ``after`` it (indices) that
    share the last one's sequence, so the next page, ``since`` that sequence, misses none of them
    (records made between two commits share one; at most ``LEDGER_WAITING`` a runtime)."""
    if stop == 0 or not after:
        return stop
    last = _sequence(reader.item(stop - 1 if indices is None else indices[stop - 1]))
    for index in after:
        if _sequence(reader.item(index)) != last:
            break
        stop += 1
    return stop


def _sequence(item: Item) -> int:
    found = re.search(rb',"sequence":(\d+),', item.data)
    if found is None:
        raise ValueError("not a request record")
    return int(found.group(1))


class _Reader:
    """One read of a ledger: items read in pages, records decoded once, each against its base
    (found by id, looking further back as needed)."""

    PAGE = 64

    def __init__(self, engine: StoreEngine, state: str, branch_id: int) -> None:
        self.engine, self.state, self.branch_id = engine, state, branch_id
        self.length = engine.read_head(state, branch_id).length
        self.items: dict[int, Item] = {}
        self.index_of: dict[str, int] = {}  # record id -> its index, for the headers read so far
        self.decoded: dict[int, tuple[RequestRecord, Parts]] = {}

    def item(self, index: int, *, back: bool = False) -> Item:
        """Item ``index``, read with the page after it (``back``: before it)."""
        if index not in self.items:
            low = max(0, index - self.PAGE + 1) if back else index
            for offset, item in enumerate(self.engine.read_items(self.state, self.branch_id, start=low,
                                                                stop=min(self.length, low + self.PAGE))):
                self.items.setdefault(low + offset, item)
        return self.items[index]

    def header(self, index: int, *, back: bool = False) -> tuple[str, str | None, Shared]:
        """Item ``index``'s header (its id, base and shared run); its id is then known."""
        item = self.item(index, back=back)
        try:
            found = header(item.data)
        except ValueError as exc:
            raise self.corrupt(item, exc) from None
        self.index_of[found[0]] = index
        return found

    def corrupt(self, item: Item, exc: Exception) -> StoreCorruptError:
        return StoreCorruptError(self.engine.data_path, f"log state {self.state!r} item @{item.sequence}: {exc}")

    def find(self, record_id: str, before: int) -> int:
        """The index of record ``record_id``, which comes before index ``before`` (usually just
        before: a writer's records follow each other, others' between them)."""
        found = self.index_of.get(record_id)
        index = before
        while (found is None or found >= before) and index > 0:
            index -= 1
            if self.header(index, back=True)[0] == record_id:
                found = index
        if found is None or found >= before:
            raise self.corrupt(self.item(before), ValueError(f"its base record {record_id!r} is not before it"))
        return found

    def record(self, index: int) -> RequestRecord:
        return self._decoded(index)[0]

    def _decoded(self, index: int) -> tuple[RequestRecord, Parts]:
        pending = [index]  # the chain of bases back to one decoded or whole, newest first
        bases: dict[int, int] = {}  # index -> its base's
        while pending[-1] not in self.decoded:
            _, base, _ = self.header(pending[-1])
            if base is None:
                break
            bases[pending[-1]] = self.find(base, pending[-1])
            pending.append(bases[pending[-1]])
        for at in reversed(pending):
            if at in self.decoded:
                continue
            item = self.item(at)
            state = None if at not in bases else self.decoded[bases[at]][1]
            try:
                self.decoded[at] = decode_record(item.data, state)
            except ValueError as exc:
                raise self.corrupt(item, exc) from None
        return self.decoded[index]


# -- rebuilding --------------------------------------------------------------------------------------


def rebuilt_body(record: RequestRecord, content_of: Callable[[str], Sequence[Block]]) -> Any:
    """The body ``record`` keeps, made again: its parts' messages (a named message's content from
    ``content_of(id)``) through its form with its options."""
    messages = rebuilt_messages(record.parts, content_of)
    if record.form == COMPRESSION:
        return request_body(compression_request(record, messages))
    options = dict(record.options)
    injections: list[Block] = [Text(text) for text in options.pop(_INJECTIONS, ())]
    provenance = Provenance(f"rebuilt:{record.id}", record.namespace, record.branch, record.reader, "",
                            tuple(() for _ in messages), {}, {})
    return make_body(CompileResult(messages, injections, provenance), record.form, options)


def rebuilt_matching(record: RequestRecord, content_of: Callable[[str], Sequence[Block]]) -> tuple[Any, bool]:
    """``rebuilt_body``, and whether its digest is the one ``record`` holds: by ``body_digest``, or
    for a record of format 1 (whose digest no format-2 digest equals), by ``body_digest_v1``."""
    body = rebuilt_body(record, content_of)
    digest = record.body_digest
    return body, body_digest(body) == digest or body_digest_v1(body) == digest


def rebuilt_messages(parts: Iterable[RequestPart], content_of: Callable[[str], Sequence[Block]]) -> list[CompiledMessage]:
    """The compiled messages of a record's ``parts``: a named message's content from
    ``content_of(id)`` (the reader's view of it as sent), any other's as kept."""
    messages = []
    for part in parts:
        if part.message is not None:
            content = tuple(content_of(part.message))
        else:
            content = tuple(from_jsonable(list[Block], list(part.content or ())))
        messages.append(CompiledMessage(part.participant, content, part.cache_breakpoint))
    return messages
