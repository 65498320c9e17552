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
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from .compile.provenance import Provenance
from .compile.result import CompileResult
from .content.blocks import Block, CompiledMessage, Text
from .content.codec import from_jsonable, to_jsonable
from .content.tokens import estimate_blocks, estimate_text
from .errors import StoreCorruptError
from .models.model_types import ModelRequest, ModelResponse, Usage
from .store.interface import StoreEngine
from .store.records import Item

# The forms a record names: a compile result's request forms (``CompileResult.to_anthropic``,
# ``to_openai_chat``, ``to_openai_responses``), and a compression call the namespace made.
FORMS = ("anthropic", "openai_chat", "openai_responses")
COMPRESSION = "compression"
RECORD_FORMAT = 1


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
        if isinstance(usage, Usage):
            return cls(usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens,
                       usage.cache_creation_input_tokens)
        if not isinstance(usage, Mapping):
            raise TypeError(f"usage must be a RequestUsage, a ctxrt.Usage, a mapping or None, not {type(usage).__name__}")
        fields = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(usage) - fields)
        if unknown:
            raise ValueError(f"usage: unknown field(s) {unknown}; known: {sorted(fields)}")
        for name, value in usage.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"usage[{name!r}] must be a non-negative int or None, not {value!r}")
        return cls(**usage)


@attrs.frozen
class Part:
    """One message of the request as the record keeps it, to rebuild the body: who spoke, whether
    the cache broke after it, and either the stored message it carried unaltered (``message``) or
    its content (summaries, injections, a message shown other than as stored: ``content``, in the
    reader's view, as the codec writes blocks)."""

    participant: str
    cache_breakpoint: bool = False
    message: str | None = None
    content: tuple[Any, ...] | None = None


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
    zone_tokens: Mapping[str, int] = attrs.field(factory=dict)
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
    options: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    parts: tuple[Part, ...] = attrs.field(default=(), repr=False)

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
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def body_digest(body: Any) -> str:
    """sha256 hex of ``body``'s canonical JSON (an ``OpenAIBody`` is its dict)."""
    return hashlib.sha256(canonical_json(dict(body) if isinstance(body, Mapping) else body)).hexdigest()


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


def zone_tokens_of(result: CompileResult) -> dict[str, int]:
    """Tokens per zone read off the result's provenance (as the inspector classes them): head
    (raw before the first summary), summaries, middle (raw among them), recent (raw after the
    last), injections. Used when the namespace's own figures for this compile are gone."""
    sources = result.provenance.messages
    summary_at = [i for i, found in enumerate(sources) if any(s.kind == "summary" for s in found)]
    first, last = (summary_at[0], summary_at[-1]) if summary_at else (len(sources), -1)
    zones: dict[str, int] = {}
    for index, (message, found) in enumerate(zip(result.messages, sources)):
        if any(s.kind == "injection" for s in found):
            zone = "injections"
        elif any(s.kind == "summary" for s in found):
            zone = "summaries"
        elif index < first:
            zone = "head" if summary_at else "recent"
        elif index > last:
            zone = "recent"
        else:
            zone = "middle"
        zones[zone] = zones.get(zone, 0) + estimate_blocks(message.content)
    return zones


def zones_of_stats(stats: Any) -> dict[str, int]:
    """Tokens per zone as a strategy's ``RenderStats`` reports them."""
    return {"head": stats.head_tokens, "summaries": stats.summary_tokens, "middle": stats.middle_raw_tokens,
            "recent": stats.tail_tokens}


def held_and_parts(result: CompileResult, version: int) -> tuple[tuple[HeldItem, ...], tuple[Part, ...]]:
    """What ``result`` held (messages and summaries, once each, in order) and its parts: a message
    carried as stored is named, anything else kept as compiled (in the reader's view)."""
    held: dict[str, HeldItem] = {}
    parts = []
    raw = result.provenance.raw_bodies
    for message, found in zip(result.messages, result.provenance.messages):
        named = None
        for source in found:
            if source.kind == "injection" or source.id in held:
                continue
            held[source.id] = HeldItem(source.id, source.kind, version)
        if len(found) == 1 and found[0].kind == "message" and found[0].complete:
            body = raw.get(found[0].id)
            if body is not None and (body.content is message.content or body.content == message.content):
                named = found[0].id
        parts.append(Part(message.participant, message.cache_breakpoint, named,
                          None if named is not None else tuple(to_jsonable(list(message.content)))))
    return tuple(held.values()), tuple(parts)


def compression_held(request: ModelRequest, unit_work: Any, version: int) -> tuple[HeldItem, ...]:
    """What a compression unit read: the messages of a chunk, or the summaries it merges."""
    items = unit_work if isinstance(unit_work, tuple) else (unit_work,)
    held: dict[str, HeldItem] = {}
    for item in items:
        for message_id in getattr(item, "message_ids", ()) or ():
            held.setdefault(str(message_id), HeldItem(str(message_id), "message", version))
        if hasattr(item, "level") and hasattr(item, "id") and not hasattr(item, "message_ids"):
            held.setdefault(str(item.id), HeldItem(str(item.id), "summary", version))
    return tuple(held.values())


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
        held=compression_held(request, unit_work, sequence), usage=RequestUsage.of(response.usage),
        latency_ms=latency_ms, response=text_digest(text), response_chars=len(text), trace_id=trace_id,
        span_id=span_id,
        options={"model": request.model, "max_tokens": request.max_tokens, "system": request.system,
                 "assistant": sorted(request.assistant)},
        parts=tuple(Part(m.participant, m.cache_breakpoint, None, tuple(to_jsonable(list(m.content))))
                    for m in request.messages),
    )


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


def encode_record(record: RequestRecord) -> bytes:
    """A record as a log item's bytes (compact JSON)."""
    data: dict[str, Any] = {
        "f": RECORD_FORMAT, "id": record.id, "at_ms": record.at_ms, "sequence": record.sequence,
        "namespace": record.namespace, "branch": record.branch, "reader": record.reader, "form": record.form,
        "model": record.model, "budget": record.budget, "zones": dict(record.zone_tokens),
        "total": record.total_tokens, "stable": record.stable_prefix_tokens, "digest": record.body_digest,
        "held": _encode_held(record.held),
        "usage": None if record.usage is None else attrs.astuple(record.usage),
        "latency_ms": record.latency_ms, "response": record.response, "response_chars": record.response_chars,
        "trace_id": record.trace_id, "span_id": record.span_id, "options": dict(record.options),
        "parts": [_encode_part(p) for p in record.parts],
    }
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _encode_held(held: Sequence[HeldItem]) -> list[Any]:
    # [kind, id] pairs and their one version; [kind, id, version] where one differs.
    versions = {item.version for item in held}
    common = next(iter(versions)) if len(versions) == 1 else None
    items = [[item.kind[0], item.id] if common is not None else [item.kind[0], item.id, item.version] for item in held]
    return [common, items]


def _encode_part(part: Part) -> list[Any]:
    return [part.participant, part.cache_breakpoint, part.message, None if part.content is None else list(part.content)]


def decode_record(data: bytes) -> RequestRecord:
    """A record from a log item's bytes. Raises ``ValueError`` (naming what) for bytes that aren't one."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("f") != RECORD_FORMAT:
            raise ValueError(f"not a request record of format {RECORD_FORMAT}")
        common, items = raw["held"]
        held = tuple(HeldItem(str(item[1]), "message" if item[0] == "m" else "summary",
                              int(common if common is not None else item[2])) for item in items)
        usage = None if raw["usage"] is None else RequestUsage(*raw["usage"])
        parts = tuple(Part(str(p[0]), bool(p[1]), p[2], None if p[3] is None else tuple(p[3])) for p in raw["parts"])
        return RequestRecord(
            id=str(raw["id"]), at_ms=int(raw["at_ms"]), sequence=int(raw["sequence"]), namespace=str(raw["namespace"]),
            branch=str(raw["branch"]), reader=raw["reader"], form=str(raw["form"]), model=raw["model"],
            budget=raw["budget"], zone_tokens={str(k): int(v) for k, v in raw["zones"].items()},
            total_tokens=int(raw["total"]), stable_prefix_tokens=int(raw["stable"]), body_digest=str(raw["digest"]),
            held=held, usage=usage, latency_ms=raw["latency_ms"], response=raw["response"],
            response_chars=raw["response_chars"], trace_id=raw["trace_id"], span_id=raw["span_id"],
            options=dict(raw["options"]), parts=parts,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ValueError(f"a request record that doesn't decode: {exc!r}") from None


def rebuilt_body(record: RequestRecord, content_of: Callable[[str], Sequence[Block]]) -> Any:
    """The body ``record`` keeps, made again: its parts' messages (a named message's content from
    ``content_of(id)``) through its form with its options."""
    messages = rebuilt_messages(record.parts, content_of)
    if record.form == COMPRESSION:
        return request_body(compression_request(record, messages))
    options = dict(record.options)
    injections = [Text(text) for text in options.pop(_INJECTIONS, ())]
    provenance = Provenance(f"rebuilt:{record.id}", record.namespace, record.branch, record.reader, "",
                            tuple(() for _ in messages), {}, {})
    return make_body(CompileResult(messages, injections, provenance), record.form, options)


def read_records(engine: StoreEngine, state: str, branch_id: int, *, since: int | None, limit: int,
                 holding: str | None) -> list[RequestRecord]:
    """The records of ledger ``state`` on a branch, oldest first: the newest ``limit`` (with
    ``since``, the first ``limit`` recorded after that sequence), only those holding ``holding`` if
    given. Reads O(limit) items (and O(log n) to find ``since``); ``holding`` looks at the bytes of
    each record, newest first, decoding only those that name the id."""
    length = engine.read_head(state, branch_id).length
    start = 0
    if since is not None:  # the first record whose sequence is above ``since``: records are in sequence order
        low, high = 0, length
        while low < high:
            middle = (low + high) // 2
            if _decoded(engine, state, engine.read_items(state, branch_id, start=middle, stop=middle + 1)[0]).sequence <= since:
                low = middle + 1
            else:
                high = middle
        start = low
    if holding is None:
        window = (start, min(length, start + limit)) if since is not None else (max(start, length - limit), length)
        return [_decoded(engine, state, item) for item in engine.read_items(state, branch_id, start=window[0], stop=window[1])]
    needle = json.dumps(holding, ensure_ascii=False).encode()
    found: list[RequestRecord] = []
    stop = length
    while stop > start and (since is not None or len(found) < limit):
        low = max(start, stop - 256)
        for item in reversed(engine.read_items(state, branch_id, start=low, stop=stop)):
            if needle in item.data:
                record = _decoded(engine, state, item)
                if record.holds(holding):
                    found.append(record)
        stop = low
    found.reverse()
    return found[:limit] if since is not None else found[-limit:]


def _decoded(engine: StoreEngine, state: str, item: Item) -> RequestRecord:
    try:
        return decode_record(item.data)
    except ValueError as exc:
        raise StoreCorruptError(engine.data_path, f"log state {state!r} item @{item.sequence}: {exc}") from None


def rebuilt_messages(parts: Iterable[Part], content_of: Callable[[str], Sequence[Block]]) -> list[CompiledMessage]:
    """The compiled messages of a record's ``parts``: a named message's content from
    ``content_of(id)`` (the reader's view of it now), any other's as kept."""
    messages = []
    for part in parts:
        if part.message is not None:
            content = tuple(content_of(part.message))
        else:
            content = tuple(from_jsonable(list[Block], list(part.content or ())))
        messages.append(CompiledMessage(part.participant, content, part.cache_breakpoint))
    return messages
