"""Traces and metrics (ctxrt/tracing.py) through the OpenTelemetry SDK's in-memory exporter and
metric reader: the real SDK, real stores, the real Anthropic SDK against the local test server."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import ctxrt
from ctxrt import tracing
from ctxrt.testing import ApiReply, ScriptedModel, open_messages_api_server
from opentelemetry.util.types import Attributes

GUARD_S = 20
SECRET = "ann-only: the vault code is 4417"


class Traces:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.host = self.tracer_provider.get_tracer("host")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def gauges(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@pytest.fixture
def traces() -> Iterator[Traces]:
    made = Traces()
    tracing.configure(tracer_provider=made.tracer_provider, meter_provider=made.meter_provider)
    try:
        yield made
    finally:
        tracing.configure()


def autobio(**overrides: Any) -> ctxrt.Autobiographical:
    config: dict[str, Any] = {"target_chunk_tokens": 40, "recent_window_tokens": 20, "l1_holdback_chunks": 0,
                              "summary_target_tokens": 50, "head_window_tokens": 20}
    return ctxrt.Autobiographical("model-x", **(config | overrides))


def say(i: int) -> str:
    return f"line {i:04d}: we talked it over at some length".ljust(40, ".")


def memory(request: ctxrt.ModelRequest) -> ctxrt.ModelResponse:
    return ctxrt.ModelResponse((ctxrt.Text("a memory of the talk"),), "end_turn", ctxrt.Usage(120, 8, 100, 4))


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def text_of_spans(spans: list[ReadableSpan]) -> str:
    return json.dumps([dict(s.attributes or {}) for s in spans], default=str)


async def test_a_compile_span_is_a_child_of_the_callers_span_and_says_what_was_kept(
    traces: Traces, tmp_path: Path
) -> None:
    """A compile's span crosses the namespace actor's mailbox as a child of the caller's span and
    carries the namespace, reader, budget, tokens per zone, summaries by level, stable prefix and
    what was dropped (V1)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(memory), durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", strategy=autobio())
            for i in range(30):
                await m.add_message("user", say(i))
            await m.wait_ready()
            await m.compile(ctxrt.Budget(10_000, 1_000))
            with traces.host.start_as_current_span("turn") as turn:
                result = await m.compile(ctxrt.Budget(10_000, 1_000))
            stats = m.render_stats()
    [span] = [s for s in traces.spans("ctxrt.compile") if parent_of(s) == turn.get_span_context().span_id]
    assert span.context.trace_id == turn.get_span_context().trace_id
    attributes = dict(span.attributes or {})
    assert stats is not None and stats.summaries
    assert attributes["ctxrt.namespace"] == "agents/ann" and attributes["ctxrt.reader"] == "ann"
    assert attributes["ctxrt.branch"] == "main" and attributes["ctxrt.strategy"] == "autobio"
    assert attributes["ctxrt.budget.max_tokens"] == 10_000 and attributes["ctxrt.budget.reserve_for_response"] == 1_000
    assert attributes["ctxrt.compile.messages"] == len(result.messages)
    assert attributes["ctxrt.compile.tokens"] == stats.total_tokens
    assert attributes["ctxrt.compile.stable_prefix_tokens"] == result.stable_prefix_tokens > 0
    assert list(attributes["ctxrt.compile.summary_levels"]) == [level for level, _ in stats.summaries]
    assert list(attributes["ctxrt.compile.summaries_per_level"]) == [count for _, count in stats.summaries]
    assert attributes["ctxrt.compile.dropped"] == len(stats.dropped_ids) == 0
    assert "ctxrt.compile.request" not in attributes  # content capture is off by default (V4)


async def test_a_ticks_unit_span_wraps_a_genai_chat_span_with_cache_usage(traces: Traces, tmp_path: Path) -> None:
    """A tick's compression unit is a span under the caller's (key, level, sequence range,
    outcome); inside it, the model call is a GenAI ``chat {model}`` client span with the request's
    model and limits and the usage the Messages API reported, cache reads and writes included (V2)."""
    reply = ApiReply.text("a memory of the talk").with_usage(30, 9, cache_read=200, cache_creation=50)
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server(lambda _: reply) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test") as client:
                model = ctxrt.AnthropicModel(client, max_retries=0)
                async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
                    m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
                    for i in range(12):
                        await m.add_message("user", say(i))
                    with traces.host.start_as_current_span("maintenance") as host:
                        assert await m.tick()
    [unit] = traces.spans("ctxrt.compression_unit")
    [chat] = traces.spans("chat model-x")
    assert parent_of(unit) == host.get_span_context().span_id and parent_of(chat) == unit.context.span_id
    unit_attributes, chat_attributes = dict(unit.attributes or {}), dict(chat.attributes or {})
    assert unit_attributes["ctxrt.unit.level"] == 1 and unit_attributes["ctxrt.unit.outcome"] == "applied"
    assert unit_attributes["ctxrt.unit.kind"] == "tick" and unit_attributes["ctxrt.reader"] == "ann"
    assert 1 <= unit_attributes["ctxrt.unit.first_sequence"] <= unit_attributes["ctxrt.unit.last_sequence"]
    assert chat.kind.name == "CLIENT"
    assert chat_attributes["gen_ai.operation.name"] == "chat" and chat_attributes["gen_ai.provider.name"] == "anthropic"
    assert chat_attributes["gen_ai.request.model"] == "model-x"
    assert chat_attributes["gen_ai.usage.input_tokens"] == 30 + 200 + 50  # cached input counted in (GenAI)
    assert chat_attributes["gen_ai.usage.output_tokens"] == 9
    assert chat_attributes["gen_ai.usage.cache_read.input_tokens"] == 200
    assert chat_attributes["gen_ai.usage.cache_creation.input_tokens"] == 50
    assert list(chat_attributes["gen_ai.response.finish_reasons"]) == ["end_turn"]


async def test_a_ledger_entry_links_the_span_it_was_recorded_under(traces: Traces, tmp_path: Path) -> None:
    """V8, Q6: an AnthropicModel compression call kept in the ledger names its unit span, which
    carries the entry's id, with the usage the Messages API reported; a record_request under the
    host's span puts the entry's id on that span and keeps its trace and span ids."""
    reply = ApiReply.text("a memory of the talk").with_usage(30, 9, cache_read=200, cache_creation=50)
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server(lambda _: reply) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test") as client:
                model = ctxrt.AnthropicModel(client, max_retries=0)
                async with ctxrt.open_runtime(tmp_path / "s", model=model, durability="os") as rt:
                    m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False), ledger=True)
                    for i in range(12):
                        await m.add_message("user", say(i))
                    assert await m.tick()
                    with traces.host.start_as_current_span("turn") as turn:
                        recorded = await m.record_request(await m.compile(ctxrt.Budget(10_000, 1_000)), form="anthropic")
                    [compression, again] = await m.requests()
    [unit] = traces.spans("ctxrt.compression_unit")
    assert compression.form == "compression" and compression.model == "model-x"
    assert compression.usage == ctxrt.RequestUsage(30 + 200 + 50, 9, 200, 50) and compression.latency_ms is not None
    assert dict(unit.attributes or {})["ctxrt.request.id"] == compression.id
    assert (compression.trace_id, compression.span_id) == (f"{unit.context.trace_id:032x}", f"{unit.context.span_id:016x}")
    [host] = traces.spans("turn")
    assert again == recorded and dict(host.attributes or {})["ctxrt.request.id"] == recorded.id
    assert (recorded.trace_id, recorded.span_id) == (f"{turn.get_span_context().trace_id:032x}",
                                                     f"{turn.get_span_context().span_id:016x}")


async def test_a_failed_model_call_marks_its_chat_and_unit_spans(traces: Traces, tmp_path: Path) -> None:
    """A model call that fails leaves an error on its chat span (``error.type``) and the unit's
    outcome ``failed`` (V2)."""

    def refuse(request: ctxrt.ModelRequest) -> str:
        raise ctxrt.ModelError("the model is down", retryable=True)

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(refuse), durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
            for i in range(12):
                await m.add_message("user", say(i))
            await m.tick()
    [chat] = traces.spans("chat model-x")
    [unit] = traces.spans("ctxrt.compression_unit")
    assert dict(chat.attributes or {})["error.type"] == "ModelError" and chat.status.status_code.name == "ERROR"
    assert dict(unit.attributes or {})["ctxrt.unit.outcome"] in ("failed", "nothing")


async def test_a_commit_span_is_a_child_of_a_lone_caller_and_links_callers_sharing_a_batch(
    traces: Traces, tmp_path: Path
) -> None:
    """A durable append alone commits in its caller's task, its commit span a child of the caller's
    span; appends that share a batch through the mailbox give one commit span linked to each
    caller's span, with the engine and the batch size (V3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s") as rt:
            m = await rt.open("agents/ann")
            with traces.host.start_as_current_span("alone") as alone:
                await m.add_message("user", "one")
            hosts: list[Any] = []

            async def append(i: int) -> None:
                with traces.host.start_as_current_span(f"caller {i}") as span:
                    hosts.append(span)
                    await m.add_message("user", f"concurrent {i}")

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(append, i)
    commits = traces.spans("ctxrt.store.commit")
    [lone] = [s for s in commits if parent_of(s) == alone.get_span_context().span_id]
    assert dict(lone.attributes or {}) == {"db.system.name": "lmdb", "ctxrt.store.batch_size": 1}
    callers = {span.get_span_context().span_id for span in hosts}
    related = {parent_of(s) for s in commits} | {link.context.span_id for s in commits for link in s.links}
    assert callers <= related  # every caller's append is traced to the commit that carried it
    batched = [s for s in commits if s.links]
    assert batched and all(dict(s.attributes or {})["ctxrt.store.batch_size"] == len(s.links) >= 2 for s in batched)
    assert all(s.end_time is not None and s.start_time is not None and s.end_time >= s.start_time for s in commits)


async def test_a_postgresql_commit_span_names_its_engine(traces: Traces, pg_url: str) -> None:
    """On PostgreSQL the commit runs on a worker thread; its span names the engine and is the
    caller's child, the caller's context carried through the mailbox (V3)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(pg_url) as rt:
            m = await rt.open("agents/ann")
            with traces.host.start_as_current_span("append") as host:
                await m.add_message("user", "to the database")
    [commit] = [s for s in traces.spans("ctxrt.store.commit") if parent_of(s) == host.get_span_context().span_id]
    assert dict(commit.attributes or {})["db.system.name"] == "postgresql"


async def two_readers(tmp_path: Path) -> None:
    async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "noted"), durability="os") as rt:
        ann = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
        bob = await rt.open("agents/bob", view_reader="bob", strategy=autobio(auto_tick=False))
        for i in range(12):
            content: list[dict[str, Any]] = [{"type": "text", "text": say(i)}]
            if i in (2, 11):  # one to be compressed, one in the recent window
                content.append({"type": "text", "text": SECRET, "audience": ["ann"]})
            await ann.add_message("user", content)
        for manager in (ann, bob):
            await manager.tick()
            await manager.compile(ctxrt.Budget(10_000, 1_000))


async def test_spans_carry_no_message_content_unless_capture_is_on(traces: Traces, tmp_path: Path) -> None:
    """Content capture is off by default: no span holds a line of any message (V4)."""
    with trio.fail_after(GUARD_S):
        await two_readers(tmp_path)
    spans = traces.spans()
    assert spans and "line 0003" not in text_of_spans(spans) and SECRET not in text_of_spans(spans)


async def test_captured_content_holds_only_what_the_spans_reader_may_see(traces: Traces, tmp_path: Path) -> None:
    """With capture on, a compile span carries the compiled request and a chat span the compression
    request, each in its namespace's reader's view: ann's hold her audience line, bob's never (V4)."""
    tracing.configure(tracer_provider=traces.tracer_provider, meter_provider=traces.meter_provider,
                      capture_content=True)
    with trio.fail_after(GUARD_S):
        await two_readers(tmp_path)

    def spans_of(namespace: str, name: str) -> list[ReadableSpan]:
        found = []
        for span in traces.spans():
            own = span if span.name != "chat model-x" else next(
                s for s in traces.spans("ctxrt.compression_unit") if s.context.span_id == parent_of(span))
            if (own.attributes or {}).get("ctxrt.namespace") == namespace and span.name.startswith(name):
                found.append(span)
        return found

    for name, key in (("ctxrt.compile", "ctxrt.compile.request"), ("chat", "gen_ai.input.messages")):
        ann, bob = spans_of("agents/ann", name), spans_of("agents/bob", name)
        assert ann and bob
        assert all(key in (s.attributes or {}) for s in ann + bob)
        assert "we talked it over" in text_of_spans(bob)  # content is captured ...
        assert SECRET not in text_of_spans(bob)  # ... but never another reader's line
    assert SECRET in text_of_spans(spans_of("agents/ann", "ctxrt.compile"))
    assert SECRET in text_of_spans(spans_of("agents/ann", "chat"))


async def test_health_sets_the_namespaces_gauges(traces: Traces, tmp_path: Path) -> None:
    """Each health() answer sets the namespace's gauges, labelled with namespace and branch (V5)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "s", model=ScriptedModel(lambda r: "noted"), durability="os") as rt:
            m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
            for i in range(12):
                await m.add_message("user", say(i))
            await m.compile()
            health = await m.health()
    gauges = traces.gauges()
    [pending] = gauges["ctxrt.namespace.pending_units"]
    assert dict(pending.attributes) == {"ctxrt.namespace": "agents/ann", "ctxrt.branch": "main"}
    assert pending.value == health.pending_units > 0
    assert [p.value for p in gauges["ctxrt.namespace.ready"]] == [0]
    assert [p.value for p in gauges["ctxrt.namespace.mailbox_depth"]] == [health.mailbox_depth]
    assert gauges["ctxrt.namespace.last_compile.duration"][0].value == health.last_compile_ms


async def test_without_a_provider_nothing_is_traced_and_nothing_is_carried(tmp_path: Path) -> None:
    """With OpenTelemetry's API but no SDK provider, the hooks make no span and commands carry no
    context (V6)."""
    tracing.configure()
    assert tracing.current() is None
    async with ctxrt.open_runtime(tmp_path / "s") as rt:
        m = await rt.open("agents/ann")
        await m.add_message("user", "hello")
        with tracing.compiling("ns", "main", None, "passthrough", None) as span:  # type: ignore[arg-type]
            assert span is None


class RaisingProcessor(SpanProcessor):
    """A host's span processor that raises at the start or the end of each span whose name starts
    with ``prefix``."""

    def __init__(self, prefix: str, when: str) -> None:
        self.prefix, self.when, self.raised = prefix, when, 0

    def _maybe_raise(self, name: str, now: str) -> None:
        if now == self.when and name.startswith(self.prefix):
            self.raised += 1
            raise RuntimeError(f"the host's processor failed at the {now} of {name}")

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._maybe_raise(span.name, "start")

    def on_end(self, span: ReadableSpan) -> None:
        self._maybe_raise(span.name, "end")


async def answers_of_a_session(path: Path) -> list[Any]:
    """What a session's calls answer: the open's commits, appends, a tick (a unit and its model
    call), a compile and health; then what a fresh runtime reads back from the store."""
    answers: list[Any] = []
    async with ctxrt.open_runtime(path, model=ScriptedModel(memory), durability="os") as rt:
        m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
        for i in range(12):
            answers.append(await m.add_message("user", say(i)))
        answers.append(await m.tick())
        result = await m.compile(ctxrt.Budget(10_000, 1_000))
        answers.append([(message.participant, message.content) for message in result.messages])
        health = await m.health()
        answers.append((health.ready, health.pending_units, health.narrowing_floor, health.quarantined))
    async with ctxrt.open_runtime(path, readonly=True) as rt:
        m = await rt.open("agents/ann", view_reader="ann", strategy=autobio(auto_tick=False))
        answers.append([(message.id, message.content) for message in await m.get_all_messages()])
        result = await m.compile(ctxrt.Budget(10_000, 1_000))  # the summary the tick stored, read back
        answers.append([(message.participant, message.content) for message in result.messages])
    return answers


@pytest.mark.parametrize("when", ["start", "end"])
@pytest.mark.parametrize("prefix", ["ctxrt.store.commit", "ctxrt.compile", "ctxrt.compression_unit", "chat"])
async def test_a_span_processor_that_raises_changes_nothing_ctxrt_does(
    prefix: str, when: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host's span processor that raises at a span's start or end leaves that span out: every
    call answers as it would untraced, nothing hangs, nothing is lost, and the failure is logged
    once, however many spans of its kind failed (V7)."""
    with trio.fail_after(GUARD_S):
        untraced = await answers_of_a_session(tmp_path / "untraced")
    processor = RaisingProcessor(prefix, when)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracing.configure(tracer_provider=provider)
    try:
        with caplog.at_level(logging.WARNING, logger="ctxrt.tracing"), trio.fail_after(GUARD_S):
            traced = await answers_of_a_session(tmp_path / "traced")
    finally:
        tracing.configure()
    assert processor.raised >= 1
    assert traced == untraced
    assert len([r for r in caplog.records if r.name == "ctxrt.tracing"]) == 1


class RaisingExemplarFilter(ExemplarFilter):
    """A host's metrics pipeline that raises on every measurement."""

    def should_sample(self, value: float, time_unix_nano: int, attributes: Attributes, context: Context) -> bool:
        raise RuntimeError("the host's exemplar filter failed")


async def test_a_meter_that_raises_leaves_health_answered(tmp_path: Path) -> None:
    """A meter whose measurements raise leaves the gauges out and health() answered (V7)."""
    tracing.configure(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()],
                                                   exemplar_filter=RaisingExemplarFilter()))
    try:
        with trio.fail_after(GUARD_S):
            async with ctxrt.open_runtime(tmp_path / "s") as rt:
                m = await rt.open("agents/ann")
                await m.add_message("user", "hello")
                health = await m.health()
    finally:
        tracing.configure()
    assert health.namespace == "agents/ann" and health.ready
