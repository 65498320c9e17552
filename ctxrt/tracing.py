"""Traces and metrics through ``opentelemetry-api`` (``pip install 'ctxrt[otel]'``).

Spans: ``ctxrt.compile`` per compile (namespace, reader, budget, tokens per zone, what was kept,
summarised and dropped, ``stable_prefix_tokens``); ``ctxrt.compression_unit`` per compression
unit (level, sequence range, outcome) wrapping the GenAI ``chat {model}`` span of its model call
(``gen_ai.*`` attributes, usage with cache-read and cache-creation tokens); ``ctxrt.store.commit``
per write transaction (engine, batch size; its duration is the span's); a request ledger entry's
id (``ctxrt.request.id``) on the span it was recorded under (the unit's for a compression call,
the caller's current one for ``record_request``; the entry keeps the span's ids). Metrics: each
``health()`` answer sets the namespace's gauges.

Everything here is a no-op, at the cost of a function call, until a tracer or meter provider
from an SDK is installed (``opentelemetry.trace.set_tracer_provider``, or ``configure``), and
without ``opentelemetry-api`` installed at all. trio gives each task a copy of the context it
was started with, so an actor's task doesn't see its caller's span: the caller's context
travels in the envelope of each command (``current`` when sent, ``resumed`` while handled), and
a commit that serves several callers links to each of their spans.

Message content stays out of spans unless ``configure(capture_content=True)`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``; then a compile span carries the
compiled request and a chat span the compression request and reply: both in the namespace's
reader's view, so never a block another reader's audience keeps from it.

Tracing never changes what ctxrt does: every call a hook makes into the API or an SDK (a span's
start and end run the host's span processors, a gauge's set its metric readers) is guarded. One
that raises leaves that span or gauge out, is logged once per kind (a WARNING on the
``ctxrt.tracing`` logger with its traceback; later ones at DEBUG), and the call it traced
answers as it would untraced.

It sits in the lowest layer (the store actor calls it), so what it is handed from above
(compile results, units, model requests, health) is typed ``Any`` and read by attribute.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .content.blocks import Block, Document, Image, RedactedThinking, Text, Thinking, ToolResult, ToolUse

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
except ImportError:  # the optional extra isn't installed: every hook is a no-op
    otel_context = otel_metrics = otel_trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

logger = logging.getLogger("ctxrt.tracing")

SCOPE = "ctxrt"
LOOK_INTERVAL_S = 1.0  # how often the off path asks the API whether a global provider was installed
CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# The kinds a failing hook is logged once for.
_PROVIDER, _CONTEXT = "the tracer provider", "the trace context"
_COMPILE, _UNIT, _CHAT, _COMMIT = ("the ctxrt.compile span", "the ctxrt.compression_unit span", "the chat span",
                                   "the ctxrt.store.commit span")
_GAUGES = "the namespace gauges"
_LEDGER = "a ledger entry's span"


class _Settings:
    """Which providers ctxrt uses (None: the global ones) and what it made from them."""

    def __init__(self) -> None:
        self.tracer_provider: TracerProvider | None = None
        self.meter_provider: MeterProvider | None = None
        self.capture: bool | None = None  # None: the environment variable decides
        self.tracer: Tracer | None = None
        self.instruments: _Instruments | None = None
        self.next_look = 0.0  # when to ask the API for a global tracer provider again (time.monotonic)
        self.next_meter_look = 0.0
        self.failed: set[str] = set()  # the kinds of hook whose failure was logged (once each)


_settings = _Settings()


def configure(
    *, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
    capture_content: bool | None = None,
) -> None:
    """Which providers ctxrt reports to (None: OpenTelemetry's global ones, set by the host or its
    SDK's auto-configuration, looked for at most once a second until found) and whether spans carry
    message content (None: as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says; off
    unless it is ``true``). Each call replaces all three settings."""
    _settings.tracer_provider, _settings.meter_provider, _settings.capture = (
        tracer_provider, meter_provider, capture_content)
    _settings.tracer = None if tracer_provider is None or otel_trace is None else tracer_provider.get_tracer(SCOPE)
    _settings.instruments = None if meter_provider is None or otel_metrics is None else _Instruments(
        meter_provider.get_meter(SCOPE))
    _settings.next_look = _settings.next_meter_look = 0.0
    _settings.failed = set()


def _failed(kind: str, exc: Exception) -> None:
    """A call into the API or an SDK raised in a hook (``kind`` says which span, gauge or context):
    logged once per kind, never passed on."""
    if kind in _settings.failed:
        logger.debug("tracing: %s failed again: %r", kind, exc)
        return
    _settings.failed.add(kind)
    logger.warning("tracing: %s failed, left out; ctxrt goes on untraced there (logged once per kind)", kind,
                   exc_info=exc)


def _tracer() -> Tracer | None:
    """The tracer, or None while no SDK's provider is installed (the cheap test every hook makes)."""
    if _settings.tracer_provider is not None:
        return _settings.tracer
    if _settings.tracer is not None or otel_trace is None:
        return _settings.tracer  # a global provider, once set, is never replaced (the API refuses to)
    now = time.monotonic()
    if now < _settings.next_look:  # asking the API costs a microsecond (an environment lookup): once a second
        return None
    _settings.next_look = now + LOOK_INTERVAL_S
    try:
        provider = otel_trace.get_tracer_provider()
        if not isinstance(provider, (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)):
            _settings.tracer = provider.get_tracer(SCOPE)
    except Exception as exc:  # noqa: BLE001 - a host's provider that raises: untraced, asked again later
        _failed(_PROVIDER, exc)
    return _settings.tracer


def capturing() -> bool:
    if _settings.capture is not None:
        return _settings.capture
    return os.environ.get(CAPTURE_VARIABLE, "").strip().lower() == "true"


# -- across the mailboxes ---------------------------------------------------------------------


def current() -> Any:
    """The caller's context, to send with a command to an actor's task; None while tracing is off."""
    if _tracer() is None:
        return None
    try:
        return otel_context.get_current()
    except Exception as exc:  # noqa: BLE001 - a host's runtime context that raises: nothing carried
        _failed(_CONTEXT, exc)
        return None


class _Nothing:
    """A context manager that does nothing and yields None: the off path of every hook."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOTHING = _Nothing()


class _Current:
    """A span current around a block, as ``start_as_current_span`` makes it, but with its start and
    end guarded: a span that fails to start leaves the block untraced (yields None), one that fails
    to end is logged; neither changes what the block does or raises."""

    __slots__ = ("kind", "tracer", "name", "attributes", "parent", "span_kind", "records", "span", "token")

    def __init__(self, kind: str, tracer: Tracer, name: str, attributes: dict[str, Any], parent: Any,
                 span_kind: Any, records: bool) -> None:
        self.kind, self.tracer, self.name, self.attributes = kind, tracer, name, attributes
        self.parent, self.span_kind, self.records = parent, span_kind, records  # records: an exception leaving it
        self.span: Span | None = None
        self.token: Any = None

    def __enter__(self) -> Span | None:
        try:
            self.span = self.tracer.start_span(self.name, context=self.parent, kind=self.span_kind,
                                               attributes=self.attributes)
            self.token = otel_context.attach(otel_trace.set_span_in_context(self.span))
        except Exception as exc:  # noqa: BLE001 - the block runs untraced
            _failed(self.kind, exc)
            self._end()
            self.span = None
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)  # the API logs a detach that fails; it never raises
        span = self.span
        if span is None:
            return
        try:
            # As the API's use_span: an Exception is an error, a cancellation (a BaseException) isn't.
            if self.records and isinstance(exc, Exception) and span.is_recording():
                span.record_exception(exc)
                span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        except Exception as failure:  # noqa: BLE001 - the block's own exception goes on, unchanged
            _failed(self.kind, failure)
        self._end()

    def _end(self) -> None:
        try:
            if self.span is not None:
                self.span.end()
        except Exception as exc:  # noqa: BLE001 - the span's end ran the host's processors: logged, not raised
            _failed(self.kind, exc)


def resumed(carried: Any) -> Any:
    """A context manager making a command's carried context current while an actor handles it."""
    if carried is None:
        return _NOTHING
    return _attached(carried)


@contextmanager
def _attached(carried: Any) -> Iterator[None]:
    try:
        token = otel_context.attach(carried)
    except Exception as exc:  # noqa: BLE001 - the command is handled in the actor's own context
        _failed(_CONTEXT, exc)
        yield
        return
    try:
        yield
    finally:
        otel_context.detach(token)  # the API logs a detach that fails; it never raises


# -- compile ----------------------------------------------------------------------------------


def compiling(namespace: str, branch: str, reader: str | None, strategy: str, command: Any) -> Any:
    """A context manager around one compile in the namespace actor: yields its span (current, so
    the commits it makes are its children), or None while tracing is off."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    attributes: dict[str, Any] = {
        "ctxrt.namespace": namespace, "ctxrt.branch": branch, "ctxrt.strategy": strategy,
        "ctxrt.budget.max_tokens": command.budget.max_tokens,
        "ctxrt.budget.reserve_for_response": command.budget.reserve_for_response,
        "ctxrt.compile.dry_run": command.dry_run, "ctxrt.compile.strict": command.strict,
    }
    if reader is not None:
        attributes["ctxrt.reader"] = reader
    return _Current(_COMPILE, tracer, "ctxrt.compile", attributes, None, otel_trace.SpanKind.INTERNAL, True)


def compiled(span: Span | None, result: Any, strategy: Any) -> None:
    """What the compile made: messages, what they came from, tokens per zone, what was dropped."""
    try:
        if span is not None and span.is_recording():
            span.set_attributes(_compiled_attributes(result, strategy))
    except Exception as exc:  # noqa: BLE001 - the compile's answer is its caller's whatever its span says
        _failed(_COMPILE, exc)


def _compiled_attributes(result: Any, strategy: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {  # each known without a walk of the messages: a compile's cost stays its own
        "ctxrt.compile.messages": len(result.messages), "ctxrt.compile.stable_prefix_tokens": result.stable_prefix_tokens,
    }
    stats = strategy.render_stats()  # the select this compile ran
    if stats is not None:
        attributes.update({
            "ctxrt.compile.tokens": stats.total_tokens, "ctxrt.compile.head_tokens": stats.head_tokens,
            "ctxrt.compile.summary_tokens": stats.summary_tokens,
            "ctxrt.compile.middle_raw_tokens": stats.middle_raw_tokens, "ctxrt.compile.tail_tokens": stats.tail_tokens,
            "ctxrt.compile.summary_levels": [level for level, _ in stats.summaries],
            "ctxrt.compile.summaries_per_level": [count for _, count in stats.summaries],
            "ctxrt.compile.pending_units": stats.pending_units, "ctxrt.compile.dropped": len(stats.dropped_ids),
        })
        if stats.dropped_reason:
            attributes["ctxrt.compile.dropped_reason"] = stats.dropped_reason
    if capturing():  # the compile is in the reader's view: nothing another reader's audience keeps from it
        attributes["ctxrt.compile.request"] = json.dumps(
            [{"participant": m.participant, "parts": _parts(m.content)} for m in result.messages], ensure_ascii=False)
    return attributes


# -- the request ledger (V8, Q7) ----------------------------------------------------------------


def request_span(span: Span | None = None) -> tuple[Any, str | None, str | None]:
    """The span a ledger entry is recorded under (``span``, else the caller's current one, if
    recording) with its trace and span ids in hex; (None, None, None) while tracing is off."""
    if _tracer() is None:
        return None, None, None
    try:
        if span is None:
            span = otel_trace.get_current_span()
        if span is None or not span.is_recording():
            return None, None, None
        context = span.get_span_context()
        return span, format(context.trace_id, "032x"), format(context.span_id, "016x")
    except Exception as exc:  # noqa: BLE001 - the entry is recorded without its span
        _failed(_LEDGER, exc)
        return None, None, None


def recorded(span: Any, request_id: str) -> None:
    """The span carries the id of the ledger entry recorded under it (``ctxrt.request.id``)."""
    try:
        if span is not None:
            span.set_attribute("ctxrt.request.id", request_id)
    except Exception as exc:  # noqa: BLE001 - the entry stands whatever its span does
        _failed(_LEDGER, exc)


# -- compression units and their model calls --------------------------------------------------


def start_unit(unit: Any, kind: str, namespace: str, branch: str, reader: str | None, carried: Any) -> Span | None:
    """The span of one compression unit, from its planning to its reply applied (``end_unit``);
    a tick's is a child of the caller's span (``carried``), the background drain's a root."""
    tracer = _tracer()
    if tracer is None:
        return None
    attributes: dict[str, Any] = {"ctxrt.namespace": namespace, "ctxrt.branch": branch, "ctxrt.unit.key": unit.key,
                                  "ctxrt.unit.kind": kind, "ctxrt.unit.reaches": unit.reaches}
    if reader is not None:
        attributes["ctxrt.reader"] = reader
    level, first, last = unit_shape(unit)
    if level is not None:
        attributes["ctxrt.unit.level"] = level
    if first is not None and last is not None:
        attributes["ctxrt.unit.first_sequence"], attributes["ctxrt.unit.last_sequence"] = first, last
    try:
        return tracer.start_span("ctxrt.compression_unit", context=carried, attributes=attributes)
    except Exception as exc:  # noqa: BLE001 - the unit runs without a span (and its chat span with it)
        _failed(_UNIT, exc)
        return None


def unit_shape(unit: Any) -> tuple[int | None, int | None, int | None]:
    """(the summary level a unit makes, its first and last sequence), as far as its ``work`` says:
    a chunk of messages (``message_ids``, ``first_sequence``, ``last_sequence``) makes level 1; a
    group of summaries (each with ``level``) makes the level above theirs; messages give a range."""
    work = unit.work
    items = work if isinstance(work, tuple) else (work,)
    firsts = [getattr(i, "first_sequence", getattr(i, "sequence", None)) for i in items]
    lasts = [getattr(i, "last_sequence", getattr(i, "sequence", None)) for i in items]
    levels = [v for v in (getattr(i, "level", None) for i in items) if isinstance(v, int)]
    level: int | None = None
    if items and len(levels) == len(items):
        level = max(levels) + 1
    elif items and all(hasattr(i, "message_ids") for i in items):
        level = 1
    known_first = [v for v in firsts if isinstance(v, int)]
    known_last = [v for v in lasts if isinstance(v, int)]
    return level, min(known_first, default=None), max(known_last, default=None)


def end_unit(span: Span | None, outcome: str, error: BaseException | None = None, made: Any = None) -> None:
    """``outcome``: applied, nothing (the reply made no change), discarded (the view changed while
    it was out), failed, or stopped (the actor stopped first). ``made``: what the strategy made of
    the reply (a ``UnitOutcome``: its rung of the refusal ladder and what came of it, T12), if it says."""
    if span is None:
        return
    try:
        span.set_attribute("ctxrt.unit.outcome", outcome)
        if made is not None:
            span.set_attributes(_made_attributes(made))
        if error is not None:
            span.record_exception(error)
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(otel_trace.StatusCode.ERROR, str(error)[:200])
        span.end()
    except Exception as exc:  # noqa: BLE001 - the unit's reply is applied and answered whatever its span does
        _failed(_UNIT, exc)


def _made_attributes(made: Any) -> dict[str, Any]:
    """A ``UnitOutcome`` as the unit span's ``ctxrt.unit.*`` attributes (those it has)."""
    attributes: dict[str, Any] = {"ctxrt.unit.rung": made.rung, "ctxrt.unit.result": made.result,
                                  "ctxrt.unit.attempts": made.attempts, "ctxrt.unit.quarantined": made.quarantined}
    for name in ("half", "failure", "next_rung"):
        value = getattr(made, name)
        if value is not None:
            attributes[f"ctxrt.unit.{name}"] = value
    return attributes


def model_call(unit_span: Span | None, model: Any, request: Any) -> Any:
    """A context manager around a unit's model call yielding its GenAI ``chat {model}`` span (or
    None), current in the task that makes it (so an instrumented SDK's HTTP spans nest under it)."""
    tracer = _tracer()
    if tracer is None or unit_span is None:
        return _NOTHING
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": str(getattr(model, "provider", type(model).__name__)),
        "gen_ai.request.model": request.model, "gen_ai.request.max_tokens": request.max_tokens,
    }
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    if capturing():  # built from the reader's view (A4): only what the reader may see
        if request.system:
            attributes["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": request.system}],
                                                                  ensure_ascii=False)
        attributes["gen_ai.input.messages"] = json.dumps(
            [{"role": "assistant" if m.participant in request.assistant else "user", "parts": _parts(m.content)}
             for m in request.messages], ensure_ascii=False)
    # Its outcome is set by ``answered``: an exception leaving the block (a cancellation) isn't the model's.
    return _Current(_CHAT, tracer, f"chat {request.model}", attributes, otel_trace.set_span_in_context(unit_span),
                    otel_trace.SpanKind.CLIENT, False)


def answered(span: Span | None, outcome: Any) -> None:
    """The model call's outcome on its chat span: usage and finish reason, or the error."""
    try:
        if span is not None and span.is_recording():
            _answer_on(span, outcome)
    except Exception as exc:  # noqa: BLE001 - the outcome goes back to the actor whatever its span does
        _failed(_CHAT, exc)


def _answer_on(span: Span, outcome: Any) -> None:
    usage = getattr(outcome, "usage", None)
    if usage is None:  # a ModelError (or what a host's model raised)
        span.set_attribute("error.type", type(outcome).__qualname__)
        span.set_status(otel_trace.StatusCode.ERROR, str(outcome)[:200])
        return
    span.set_attributes({
        "gen_ai.response.finish_reasons": [str(outcome.stop_reason)],
        "gen_ai.usage.input_tokens": usage.input_tokens, "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
    })
    if capturing():
        span.set_attribute("gen_ai.output.messages", json.dumps(
            [{"role": "assistant", "parts": _parts(outcome.content), "finish_reason": str(outcome.stop_reason)}],
            ensure_ascii=False))


def _parts(blocks: Iterable[Block]) -> list[dict[str, Any]]:
    """Blocks as the GenAI conventions' message parts; media by type only, never its bytes."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, Text):
            parts.append({"type": "text", "content": block.text})
        elif isinstance(block, Thinking):
            parts.append({"type": "reasoning", "content": block.thinking})
        elif isinstance(block, ToolUse):
            parts.append({"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input})
        elif isinstance(block, ToolResult):
            response = block.content if isinstance(block.content, str) else _parts(block.content)
            parts.append({"type": "tool_call_response", "id": block.tool_use_id, "response": response})
        elif isinstance(block, (Image, Document)):
            parts.append({"type": "blob", "modality": "image" if isinstance(block, Image) else "document"})
        elif isinstance(block, RedactedThinking):
            parts.append({"type": "reasoning", "content": ""})
    return parts


# -- store commits ----------------------------------------------------------------------------


def committing(engine: Any, size: int, carried: Sequence[Any] = ()) -> Any:
    """A context manager around one write transaction of the store actor; yields its span or None.

    A commit made in its caller's task (the store's idle fast path) is a child of the caller's
    span; a batch from the mailbox is a child of its one caller's carried context, or linked to
    each caller's when several shared it."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    try:
        contexts = [c for c in carried if c is not None]
        parent, links = None, []
        if len({id(c) for c in contexts}) == 1:
            parent = contexts[0]
        else:
            for found in contexts:
                span_context = otel_trace.get_current_span(found).get_span_context()
                if span_context.is_valid:
                    links.append(otel_trace.Link(span_context))
        attributes: dict[str, Any] = {"db.system.name": _engine_name(engine), "ctxrt.store.batch_size": size}
        return _CommitSpan(tracer.start_span("ctxrt.store.commit", context=parent, links=links, attributes=attributes))
    except Exception as exc:  # noqa: BLE001 - the write commits untraced
        _failed(_COMMIT, exc)
        return _NOTHING


class _CommitSpan:
    """A commit's span, neither made current (nothing nests in a commit) nor a generator: the
    commit path is the one every durable append takes."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: object) -> None:
        try:
            if exc is not None:
                self.span.record_exception(exc)
                self.span.set_status(otel_trace.StatusCode.ERROR, str(exc)[:200])
            self.span.end()
        except Exception as failure:  # noqa: BLE001 - the write committed (or was refused) as it would untraced
            _failed(_COMMIT, failure)


def _engine_name(engine: Any) -> str:
    return "postgresql" if type(engine).__module__.endswith("postgres") else "lmdb"


# -- metrics ----------------------------------------------------------------------------------


class _Instruments:
    def __init__(self, meter: Meter) -> None:
        gauge = meter.create_gauge
        self.health = {
            "mailbox_depth": gauge("ctxrt.namespace.mailbox_depth", unit="{command}",
                                   description="Commands queued for the namespace actor"),
            "in_flight_model_calls": gauge("ctxrt.namespace.model_calls", unit="{call}",
                                           description="Compression model calls out"),
            "pending_units": gauge("ctxrt.namespace.pending_units", unit="{unit}",
                                   description="Compression units queued"),
            "compression_debt_tokens": gauge("ctxrt.namespace.compression_debt", unit="{token}",
                                             description="Tokens of the messages queued compression covers"),
            "quarantined": gauge("ctxrt.namespace.quarantined_units", unit="{unit}",
                                 description="Compression units given up on"),
            "ready": gauge("ctxrt.namespace.ready", unit="1", description="1 when no compression work is queued"),
            "narrowing_floor": gauge("ctxrt.namespace.narrowing_floor", unit="{sequence}",
                                     description="The newest sequence compression may have read"),
            "last_compile_ms": gauge("ctxrt.namespace.last_compile.duration", unit="ms",
                                     description="How long the namespace actor's last compile took"),
        }


def _instruments() -> _Instruments | None:
    if _settings.meter_provider is not None or _settings.instruments is not None or otel_metrics is None:
        return _settings.instruments
    now = time.monotonic()
    if now < _settings.next_meter_look:
        return None
    _settings.next_meter_look = now + LOOK_INTERVAL_S
    provider = otel_metrics.get_meter_provider()
    # Until an SDK's provider is set the API hands out a proxy (a private class, known by name).
    if not isinstance(provider, otel_metrics.NoOpMeterProvider) and type(provider).__name__ != "_ProxyMeterProvider":
        _settings.instruments = _Instruments(provider.get_meter(SCOPE))
    return _settings.instruments


def record_health(health: Any) -> None:
    """Set the namespace's gauges from one ``health()`` answer."""
    try:
        _set_gauges(health)
    except Exception as exc:  # noqa: BLE001 - health() answers whatever a meter or its readers do
        _failed(_GAUGES, exc)


def _set_gauges(health: Any) -> None:
    instruments = _instruments()
    if instruments is None:
        return
    labels = {"ctxrt.namespace": health.namespace, "ctxrt.branch": health.branch}
    values: dict[str, float | int | None] = {
        "mailbox_depth": health.mailbox_depth, "in_flight_model_calls": health.in_flight_model_calls,
        "pending_units": health.pending_units, "compression_debt_tokens": health.compression_debt_tokens,
        "quarantined": len(health.quarantined), "ready": int(health.ready), "narrowing_floor": health.narrowing_floor,
        "last_compile_ms": health.last_compile_ms,
    }
    for name, value in values.items():
        if value is not None:
            instruments.health[name].set(value, labels)

