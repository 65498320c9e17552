"""The context manager through the public API (M1-M6, P1-P7, T1, T2, R1).

Every test uses ``import ctxrt`` and ``rt.open(...)``; where a test must see what the store
holds (blobs stored once, the context log), it reads through the runtime's engine in a read
transaction, never around the actors. Token arithmetic: a 29-character prose text costs 10
tokens (``ceil(29 / 2.9)``), so ``say(i)`` messages cost 10 tokens each.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import anthropic
import pytest
import trio
from pydantic import TypeAdapter

import ctxrt
from ctxrt import Budget, Entry, Image, Injection, MessageInjection, Runtime, Text, ToolResult, ToolUse
from ctxrt.testing import ApiReply, keys, open_messages_api_server, states

GUARD_S = 20
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(200))).decode()
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
# Kept for the module's life: pydantic-core's lazy iterators need their adapter alive.
MESSAGE_PARAMS = TypeAdapter(list[anthropic.types.MessageParam])


def say(i: int) -> str:
    """A 29-character prose text: 10 tokens."""
    return f"message number {i:06d} here."[:29].ljust(29, ".")


def budget(tokens: int) -> Budget:
    return Budget(max_tokens=tokens, reserve_for_response=0)


def texts(messages: Any) -> list[str]:
    return [b.text for m in messages for b in m.content if isinstance(b, Text)]


def source_ids(result: ctxrt.CompileResult) -> list[str]:
    return [s.id for sources in result.provenance.messages for s in sources if s.kind == "message"]


async def add_many(manager: ctxrt.ContextManager, count: int, *, start: int = 0) -> list[str]:
    return [await manager.add_message("user", say(i)) for i in range(start, start + count)]


def context_log(rt: Runtime, namespace: str, branch: str = "main") -> list[ctxrt.Message]:
    """The namespace's context log as stored (read-only engine read)."""
    from ctxrt.testing import codec

    items = rt.engine.read_log(states.context_state(namespace), rt.engine.branch(branch).id)
    return [codec.message_from_json(item.data, sequence=item.sequence, store="test") for item in items]


def blob_count(rt: Runtime) -> int:
    with rt.engine.reader() as txn:
        return txn.stat(rt.engine.dbs[keys.DB_BLOBS])["entries"]


class LoggingStrategy(ctxrt.Strategy):
    """Selects every message; the first time it sees one, logs a copy, a derived and a referenced entry."""

    name = "logging"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.logged: set[str] = set()

    def select(self, view: ctxrt.MessageView, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
        messages = view.get_all()
        for m in messages:
            if m.id in self.logged or options.dry_run or options.context is None:
                continue
            self.logged.add(m.id)
            options.context.append_context(Entry(m.participant, m.content, (m.id,), "copy"))
            options.context.append_context(Entry("Claude", (Text(f"summary of {m.id}"),), (m.id,), "derived"))
            options.context.append_context(Entry(m.participant, m.content, (m.id,), "referenced"))
        return [Entry(m.participant, m.content, (m.id,)) for m in messages]


class MarkingStrategy(ctxrt.Strategy):
    """Every message raw, each entry carrying a cache marker (for P5)."""

    name = "marking"
    marks_compression_reads = True

    def select(self, view: ctxrt.MessageView, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,), cache_marker=True) for m in view.get_all()]


class BlockingModel:
    """A model whose reply waits for ``release``; ``entered`` is set when a request arrives."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    async def complete(self, request: ctxrt.ModelRequest) -> ctxrt.ModelResponse:
        self.entered.set()
        await self.release.wait()
        return ctxrt.ModelResponse((Text("done"),), "end_turn", ctxrt.Usage(1, 1))


class CompressingStrategy(ctxrt.Strategy):
    """Passthrough selection; each tick makes one model call through the context (for P1)."""

    name = "compressing"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.replies: list[str] = []

    def select(self, view: ctxrt.MessageView, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
        return [Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]

    def next_unit(self, ctx: ctxrt.StrategyContext) -> ctxrt.Unit:
        return ctxrt.Unit("call", 0)

    def request_for(self, unit: ctxrt.Unit, ctx: ctxrt.StrategyContext) -> ctxrt.ModelRequest:
        return ctxrt.ModelRequest("test-model", None, [], 16)

    def apply_unit(self, unit: ctxrt.Unit, outcome: Any, ctx: ctxrt.StrategyContext) -> bool:
        self.replies.append(outcome.text)
        return True


# -- M1: what a message carries ------------------------------------------------------------------


async def test_add_message_returns_the_id_and_stores_every_field(runtime: Runtime) -> None:
    """M1: the message carries participant, content, metadata, caused_by, timestamp_ms and its store sequence."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        first = await m.add_message("user", "hello")
        second = await m.add_message(
            "Claude",
            [{"type": "text", "text": "hi"}, Text("there")],
            metadata={"turn": 2, "tags": ["x"], "nested": {"k": None}},
            caused_by=[first],
            timestamp_ms=1_700_000_000_123,
        )
        stored = await m.get_message(second)
        assert stored == ctxrt.Message(
            second, int(second), "Claude", (Text("hi"), Text("there")),
            {"turn": 2, "tags": ["x"], "nested": {"k": None}}, 1_700_000_000_123, (first,),
        )
        assert int(first) < int(second)
        assert stored.id == str(stored.sequence)


async def test_timestamp_defaults_to_now(runtime: Runtime) -> None:
    """M1: without timestamp_ms the message is stamped with the current epoch milliseconds."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        before = int(time.time() * 1000)
        stored = await m.get_message(await m.add_message("user", "now"))
        after = int(time.time() * 1000)
        assert before <= stored.timestamp_ms <= after


@pytest.mark.parametrize("value", [-1, 1.5, "1700000000000", True, 2**60], ids=repr)
async def test_a_bad_timestamp_is_refused_and_stores_nothing(runtime: Runtime, value: Any) -> None:
    """M1, M6: timestamp_ms must be an integer epoch millisecond; anything else raises MalformedContentError."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        await m.add_message("user", "kept")
        with pytest.raises(ctxrt.MalformedContentError) as caught:
            await m.add_message("user", "refused", timestamp_ms=value)
        assert caught.value.path == "timestamp_ms"
        assert await m.message_count() == 1


# -- M6: bad input stores nothing ------------------------------------------------------------------

BAD_INPUTS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown block type": ({"content": [{"type": "bogus"}]}, "content[0]"),
    "wrong field type": ({"content": [{"type": "text", "text": 5}]}, "content[0].text"),
    "tool_result without tool_use_id": ({"content": [{"type": "tool_result", "content": "x"}]}, "content[0]"),
    "lone surrogate": ({"content": "bad \ud800 text"}, "content"),
    "empty content": ({"content": []}, "content"),
    "empty participant": ({"participant": ""}, "participant"),
    "participant not a string": ({"participant": 7}, "participant"),
    "metadata not JSON": ({"metadata": {"when": object()}}, "metadata"),
    "metadata NaN": ({"metadata": {"x": float("nan")}}, "metadata"),
    "metadata not an object": ({"metadata": [1, 2]}, "metadata"),
    "caused_by a string": ({"caused_by": "1"}, "caused_by"),
    "metadata integer too large to store": ({"metadata": {"a": 10**5000}}, "metadata.a"),
    "tool input integer too large to store": (
        {"content": [{"type": "tool_use", "id": "t1", "name": "n", "input": {"x": [-(10**5000)]}}]}, "content[0].input.x[0]"),
}


HUGE = 10**5000  # past Python's 4,300-digit limit for printing an int


async def test_a_huge_integer_argument_is_refused_naming_its_parameter(runtime: Runtime) -> None:
    """M6 (second attack round): an integer too long to print, given to a numeric parameter, gets
    the parameter's own error naming it (not Python's ValueError from printing the number), and
    nothing is stored."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        await m.add_message("user", "kept")
        last = runtime.engine.last_sequence
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "timestamp_ms": lambda: m.add_message("user", "x", timestamp_ms=HUGE),
            "hold_compression": lambda: m.add_message("user", "x", hold_compression=HUGE),
            "at_sequence": lambda: m.derive(branch="d", at_sequence=HUGE),
            "limit": lambda: m.get_message_window(0, -HUGE),
        }
        for parameter, call in calls.items():
            with pytest.raises(ValueError, match=rf"^{parameter}:? .*an integer of 16,610 bits"):
                await call()
        with pytest.raises(ValueError, match=r"^at_sequence: .*an integer of 16,610 bits"):
            await runtime.create_branch("c", at_sequence=HUGE)
        with pytest.raises(ValueError, match=r"reserve_for_response .*an integer of 16,610 bits"):
            Budget(max_tokens=10, reserve_for_response=-HUGE)
        with pytest.raises(ValueError, match=r"^depth .*an integer of 16,610 bits"):
            MessageInjection("user", "x", depth=-HUGE)
        assert runtime.engine.last_sequence == last
        assert [b.name for b in await runtime.list_branches()] == ["main"]


async def test_a_large_integer_within_the_bound_is_stored_exactly(runtime: Runtime) -> None:
    """M1, M6: integers up to the bound (here 400 digits, and a u64) are kept exactly, not rounded."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        mid = await m.add_message("user", "big numbers", metadata={"big": 10**400, "u64": 2**64 - 1})
        assert (await m.get_message(mid)).metadata == {"big": 10**400, "u64": 2**64 - 1}
        async with ctxrt.open_runtime(runtime.path, readonly=True) as reader:  # decoded from the store
            stored = await (await reader.open("a")).get_message(mid)
            assert stored is not None and stored.metadata == {"big": 10**400, "u64": 2**64 - 1}


@pytest.mark.parametrize(("kwargs", "path"), list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
async def test_bad_input_raises_malformed_content_and_stores_nothing(
    runtime: Runtime, kwargs: dict[str, Any], path: str
) -> None:
    """M6: malformed content, participant, metadata or caused_by raises MalformedContentError naming the place."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        await m.add_message("user", "kept")
        last = runtime.engine.last_sequence
        call = {"participant": "user", "content": "fine", **kwargs}
        with pytest.raises(ctxrt.MalformedContentError) as caught:
            await m.add_message(call.pop("participant"), call.pop("content"), **call)
        assert caught.value.path.startswith(path)
        assert await m.message_count() == 1
        assert runtime.engine.last_sequence == last


async def test_a_bad_edit_changes_nothing(runtime: Runtime) -> None:
    """M6: an edit with malformed content raises and leaves the message as it was."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        mid = await m.add_message("user", "original")
        last = runtime.engine.last_sequence
        with pytest.raises(ctxrt.MalformedContentError):
            await m.edit_message(mid, [{"type": "image", "source": {"type": "base64"}}])
        assert (await m.get_message(mid)).content == (Text("original"),)
        assert runtime.engine.last_sequence == last


async def test_an_id_with_a_leading_zero_names_no_message(runtime: Runtime) -> None:
    """M1: an id is the sequence in decimal; "0" + an id is no second name for that message (from a
    host-style attack: "002" read, edited and removed message 2). Refused lookups change nothing."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        mid = await m.add_message("user", "original")
        alias = "00" + mid
        last = runtime.engine.last_sequence
        assert await m.get_message(alias) is None
        with pytest.raises(ctxrt.MessageNotFoundError):
            await m.edit_message(alias, "edited through an alias")
        with pytest.raises(ctxrt.MessageNotFoundError):
            await m.remove_messages(alias, alias)
        with pytest.raises(ctxrt.MessageNotFoundError):
            await m.branch_at(alias)
        assert runtime.engine.last_sequence == last
        assert [message.content for message in await m.get_all_messages()] == [(Text("original"),)]
        assert (await m.get_message(mid)).content == (Text("original"),)


# -- M2, M3: namespaces and slots ---------------------------------------------------------------


async def test_two_namespaces_share_the_slot_and_compile_independently(runtime: Runtime) -> None:
    """M2: managers in two namespaces see the same messages; each compiles with its own strategy and state."""
    with trio.fail_after(GUARD_S):
        full = await runtime.open("full")
        windowed = await runtime.open("win", strategy=ctxrt.WindowedPassthrough(re_anchor_fraction=0.5))
        ids = await add_many(full, 6)
        ids += await add_many(windowed, 6, start=6)
        assert await full.get_all_messages() == await windowed.get_all_messages()
        assert source_ids(await full.compile(budget(100))) == ids[-10:]
        assert source_ids(await windowed.compile(budget(100))) == ids[-5:]
        assert source_ids(await full.compile()) == ids  # the windowed anchor is not full's state
        names = {info.namespace for info in await runtime.list_namespaces()}
        assert {"full", "win"} <= names


async def test_an_isolated_namespace_has_its_own_slot(runtime: Runtime) -> None:
    """M3: isolate=True writes and reads <ns>/messages; the shared slot's managers never see it."""
    with trio.fail_after(GUARD_S):
        shared = await runtime.open("a")
        isolated = await runtime.open("iso", isolate=True)
        await shared.add_message("user", "shared")
        await isolated.add_message("user", "private")
        assert texts(await isolated.get_all_messages()) == ["private"]
        assert texts((await shared.compile()).messages) == ["shared"]
        assert texts((await isolated.compile()).messages) == ["private"]


async def test_auxiliary_views_are_merged_read_only_into_the_compile(runtime: Runtime) -> None:
    """M3: an auxiliary slot's messages join the compile by sequence, but writes and reads stay in the own slot."""
    with trio.fail_after(GUARD_S):
        shared = await runtime.open("a")
        isolated = await runtime.open("iso", isolate=True, auxiliary_views=[None])
        one = await shared.add_message("user", "s1")
        two = await isolated.add_message("Claude", "i1")
        three = await shared.add_message("user", "s2")
        assert source_ids(await isolated.compile()) == [one, two, three]
        assert await isolated.message_count() == 1
        with pytest.raises(ctxrt.MessageNotFoundError):
            await isolated.edit_message(one, "not mine")
        assert await shared.message_count() == 2


async def test_naming_the_own_slot_as_an_auxiliary_view_is_refused(runtime: Runtime) -> None:
    """M3: naming the manager's own slot as auxiliary raises ValueError."""
    with trio.fail_after(GUARD_S):
        with pytest.raises(ValueError):
            await runtime.open("iso", isolate=True, auxiliary_views=["iso"])
        with pytest.raises(ValueError):
            await runtime.open("a", auxiliary_views=[None])


# -- M4: media stored once -------------------------------------------------------------------------


async def test_base64_media_is_stored_once_and_survives_another_messages_removal(store_path: Path) -> None:
    """M4: one blob per distinct image (SHA-256); removing one message keeps the other's media, after a reopen too."""
    image = Image({"type": "base64", "media_type": "image/png", "data": PNG})
    document = ctxrt.Document({"type": "base64", "media_type": "application/pdf", "data": PDF}, title="t")
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("a")
            first = await m.add_message("user", [Text("look"), image])
            second = await m.add_message("user", [image, document])
            assert blob_count(rt) == 2
            engine = rt.engine
            with engine.reader() as txn:
                raw = [bytes(i.data) for i in engine.log_items(txn, "messages", engine.branch("main"))]
            assert all(PNG.encode() not in data and b"blob_ref" in data for data in raw)
            await m.remove_message(first)
            assert (await m.get_message(second)).content == (image, document)
            assert (await m.compile()).messages[0].content == (image, document)
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("a")
            assert (await m.get_message(second)).content == (image, document)
            assert blob_count(rt) == 2


# -- M5: edits reach copies in the context log ---------------------------------------------------


async def test_edits_reach_copy_entries_of_the_context_log_only(runtime: Runtime) -> None:
    """M5: an edit rewrites the context log's copy entry; derived and referenced entries keep what they said."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("log", strategy=LoggingStrategy())
        target = await m.add_message("user", "before")
        other = await m.add_message("user", "untouched")
        await m.compile()
        await m.edit_message(target, "after")
        entries = context_log(runtime, "log")
        by_relation = {
            (e.metadata["relation"], tuple(e.metadata["source_ids"])): texts([e]) for e in entries
        }
        assert by_relation[("copy", (target,))] == ["after"]
        assert by_relation[("derived", (target,))] == [f"summary of {target}"]
        assert by_relation[("referenced", (target,))] == ["before"]
        assert by_relation[("copy", (other,))] == ["untouched"]


async def test_removals_drop_copy_entries_of_the_context_log_only(runtime: Runtime) -> None:
    """M5: removing a message drops its copy entry; its derived and referenced entries stay."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("log", strategy=LoggingStrategy())
        target = await m.add_message("user", "gone soon")
        await m.compile()
        await m.remove_message(target)
        relations = sorted(e.metadata["relation"] for e in context_log(runtime, "log"))
        assert relations == ["derived", "referenced"]


async def test_a_context_entry_with_an_audience_is_refused(runtime: Runtime) -> None:
    """B3: the context log refuses an entry carrying an audience, writing nothing."""

    class Leaky(LoggingStrategy):
        def select(self, view: Any, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
            options.context.append_context(Entry("user", (Text("x", audience=("a",)),), ()))
            return []

    with trio.fail_after(GUARD_S):
        m = await runtime.open("leaky", strategy=Leaky())
        await m.add_message("user", "hi")
        with pytest.raises(ctxrt.MalformedContentError):
            await m.compile()
        assert context_log(runtime, "leaky") == []


# -- P1: compile never waits for compression ----------------------------------------------------


async def test_compile_does_not_wait_for_a_tick_in_progress(runtime: Runtime) -> None:
    """P1: while a tick waits on its model, compile and add_message go through."""
    model = BlockingModel()
    strategy = CompressingStrategy()
    with trio.fail_after(GUARD_S):
        m = await runtime.open("busy", strategy=strategy, model=model)
        await m.add_message("user", "one")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.tick)
            await model.entered.wait()
            with trio.fail_after(2):
                await m.add_message("user", "two")
                result = await m.compile()
            assert texts(result.messages) == ["one", "two"]
            assert strategy.replies == []
            model.release.set()
        assert strategy.replies == ["done"]


# -- P3: injections ------------------------------------------------------------------------------


async def test_injections_are_placed_around_the_last_user_message(runtime: Runtime) -> None:
    """P3: system -> system_injections; before_user before the last "user" message; after_user after it; order kept."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("inj")
        await m.add_message("User", "u1")
        await m.add_message("Claude", "a1")
        await m.add_message("user", "u2")
        await m.add_message("Claude", "a2")
        result = await m.compile(
            injections=[
                Injection("host", "before_user", "b1"),
                Injection("host", "system", "s1"),
                Injection("host", "after_user", "x1"),
                Injection("other", "before_user", "b2"),
                Injection("host", "system", [Text("s2")]),
            ]
        )
        assert texts(result.messages) == ["u1", "a1", "b1", "b2", "u2", "x1", "a2"]
        assert result.messages[2].participant == "system_context:host"
        assert result.messages[3].participant == "system_context:other"
        assert result.system_injections == [Text("s1"), Text("s2")]
        assert [s.kind for (s,) in result.provenance.messages[2:4]] == ["injection", "injection"]
        assert "s1\n\ns2" in result.to_anthropic(assistant="Claude", system="base")["system"]


async def test_without_a_user_message_before_user_is_dropped_and_after_user_goes_last(runtime: Runtime) -> None:
    """P3: with no "user" message, before_user injections are dropped and after_user ones go at the end."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("inj")
        await m.add_message("Claude", "a1")
        await m.add_message("Gemini", "g1")
        result = await m.compile(
            injections=[Injection("h", "before_user", "dropped"), Injection("h", "after_user", "last")]
        )
        assert texts(result.messages) == ["a1", "g1", "last"]


async def test_message_injections_sit_depth_messages_from_the_end(runtime: Runtime) -> None:
    """P3: a MessageInjection at depth d is placed d messages from the end."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("inj")
        for text in ("a", "b", "c"):
            await m.add_message("Claude", text)
        result = await m.compile(
            message_injections=[MessageInjection("host", "at end"), MessageInjection("host", "two back", depth=2)]
        )
        assert texts(result.messages) == ["a", "two back", "b", "c", "at end"]


async def test_an_injection_with_an_audience_is_refused(runtime: Runtime) -> None:
    """B4: compile refuses an injection carrying an audience, naming the place."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("inj")
        await m.add_message("user", "u")
        with pytest.raises(ctxrt.MalformedContentError) as caught:
            await m.compile(injections=[Injection("h", "after_user", [Text("x", audience=("bob",))])])
        assert caught.value.path == "injections[0].content[0]"


# -- P5: cache breakpoints -----------------------------------------------------------------------


async def test_at_most_three_message_breakpoints_first_and_last_kept(runtime: Runtime) -> None:
    """P5: of six marked messages the compile keeps three breakpoints: the first (head window end) and the last two."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("marks", strategy=MarkingStrategy())
        for i in range(6):
            await m.add_message("user" if i % 2 == 0 else "Claude", f"t{i}")
        result = await m.compile()
        assert [c.cache_breakpoint for c in result.messages] == [True, False, False, False, True, True]
        body = result.to_anthropic(assistant="Claude")
        marked = [b for turn in body["messages"] for b in turn["content"] if "cache_control" in b]
        assert [b["text"] for b in marked] == ["t0", "t4", "t5"]
        assert all(b["cache_control"] == {"type": "ephemeral"} for b in marked)


async def test_a_breakpoint_on_a_split_message_goes_on_its_last_part(runtime: Runtime) -> None:
    """P5, P4: a mixed assistant message split around its tool_result carries its breakpoint on the last part."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("marks", strategy=MarkingStrategy())
        await m.add_message("user", "question")
        await m.add_message("Claude", [ToolUse("t1", "search", {"q": "x"})])
        await m.add_message("Claude", [ToolResult("t1", "found"), Text("so the answer is")])
        result = await m.compile()
        parts = [(c.participant, type(c.content[0]).__name__, c.cache_breakpoint) for c in result.messages]
        assert parts[-2:] == [("user", "ToolResult", False), ("Claude", "Text", True)]


# -- P6: provenance ------------------------------------------------------------------------------


async def test_provenance_lists_sources_raw_bodies_and_completeness(runtime: Runtime) -> None:
    """P6: each compiled message names its stored message; raw bodies are the stored messages; all complete."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("prov")
        ids = await add_many(m, 3)
        result = await m.compile()
        assert [[(s.kind, s.id, s.complete) for s in sources] for sources in result.provenance.messages] == [
            [("message", i, True)] for i in ids
        ]
        assert result.provenance.raw_bodies == {i: await m.get_message(i) for i in ids}
        assert result.provenance.completeness == {i: True for i in ids}
        assert (result.provenance.namespace, result.provenance.branch, result.provenance.reader) == ("prov", "main", None)


async def test_provenance_is_judged_in_the_readers_view_and_marks_truncation_incomplete(runtime: Runtime) -> None:
    """P6, A4: raw bodies are as the reader sees them; a message truncated by max_message_tokens is incomplete."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open(
            "prov", view_reader="bob", strategy=ctxrt.WindowedPassthrough(max_message_tokens=60)
        )
        shown = await m.add_message("user", [Text("secret", audience=("alice",)), Text("for everyone")])
        long = await m.add_message("user", "word " * 400)
        result = await m.compile()
        assert result.provenance.reader == "bob"
        assert result.provenance.raw_bodies[shown].content == (Text("for everyone"),)
        assert result.provenance.completeness == {shown: True, long: False}
        assert "truncated" in result.messages[1].content[0].text


# -- P7: the Anthropic request form ---------------------------------------------------------------


async def test_to_anthropic_is_accepted_by_the_anthropic_sdk(runtime: Runtime) -> None:
    """P7: the body validates against the SDK's MessageParam types, alternates roles, and goes through messages.create."""
    image = Image({"type": "base64", "media_type": "image/png", "data": PNG})
    with trio.fail_after(GUARD_S):
        m = await runtime.open("api", strategy=MarkingStrategy())
        await m.add_message("Claude", "I start")  # a leading assistant turn
        await m.add_message("user", [Text("look"), image])
        await m.add_message("Alice", "me too")  # consecutive user-role speakers merge
        await m.add_message("Claude", [Text("checking"), ToolUse("tu_1", "lookup", {"q": "png"})])
        await m.add_message("Claude", [ToolResult("tu_1", "a picture"), Text("It is a picture.")])
        result = await m.compile(injections=[Injection("host", "system", "be brief")])
        body = result.to_anthropic(assistant="Claude", system="You are Claude.")
        validated = MESSAGE_PARAMS.validate_python(body["messages"])
        for turn in validated:
            list(turn["content"])  # the SDK's content union is checked lazily
        roles = [turn["role"] for turn in body["messages"]]
        assert roles[0] == "user"
        assert all(a != b for a, b in zip(roles, roles[1:]))
        assert body["system"] == "You are Claude.\n\nbe brief"
        assert "audience" not in json.dumps(body)
        async with open_messages_api_server([ApiReply.text("ok")]) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
                reply = await client.messages.create(**body, model="claude-test", max_tokens=64)
        assert reply.content[0].text == "ok"
        assert server.requests[0]["messages"] == body["messages"]


# -- T1: passthrough ------------------------------------------------------------------------------


async def test_passthrough_keeps_everything_that_fits(runtime: Runtime) -> None:
    """T1: when everything fits, Passthrough compiles every message in order."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("pt")
        ids = await add_many(m, 10)
        assert source_ids(await m.compile(budget(100))) == ids


async def test_passthrough_takes_the_longest_suffix_and_never_a_gap(runtime: Runtime) -> None:
    """T1: over budget, Passthrough keeps the longest fitting suffix and stops at a message that doesn't fit."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("pt")
        old = await add_many(m, 5)
        big = await m.add_message("user", "x" * 29 * 5)  # 50 tokens
        recent = await add_many(m, 3, start=10)
        assert source_ids(await m.compile(budget(79))) == recent  # 4 older messages would fit, past the gap
        assert source_ids(await m.compile(budget(89))) == [big, *recent]
        assert source_ids(await m.compile(budget(100))) == [old[-2], old[-1], big, *recent]
        assert source_ids(await m.compile(budget(1000))) == [*old, big, *recent]


# -- T2: windowed passthrough ---------------------------------------------------------------------


def unmarked(messages: list[Any]) -> list[Any]:
    return [attrs.evolve(m, cache_breakpoint=False) for m in messages]


def unmarked_body(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**turn, "content": [{k: v for k, v in block.items() if k != "cache_control"} for block in turn["content"]]}
            for turn in turns]


async def test_windowed_prompt_is_a_byte_stable_prefix_between_overflows(runtime: Runtime) -> None:
    """T2: the anchor moves only on overflow, so each compile extends the previous one until the next overflow."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("win", strategy=ctxrt.WindowedPassthrough(re_anchor_fraction=0.5))
        ids = await add_many(m, 10)
        first = await m.compile(budget(100))
        assert source_ids(first) == ids
        ids += await add_many(m, 1, start=10)  # 110 tokens: overflow, re-anchor at half the budget
        anchored = await m.compile(budget(100))
        assert source_ids(anchored) == ids[-5:]
        previous = anchored
        for i in range(5):
            ids += await add_many(m, 1, start=20 + i)
            current = await m.compile(budget(100))
            # P9: the tail's breakpoint moves on to the new tail; all else before it is unchanged.
            assert unmarked(current.messages[: len(previous.messages)]) == unmarked(previous.messages)
            assert current.messages[0].cache_breakpoint and current.messages[-1].cache_breakpoint
            body_before = json.dumps(unmarked_body(previous.to_anthropic(assistant="Claude")["messages"]))
            body_now = json.dumps(unmarked_body(current.to_anthropic(assistant="Claude")["messages"]))
            assert body_now.startswith(body_before[: -len("}]}]")])  # the request bytes only grow, markers aside
            previous = current
        assert source_ids(previous) == ids[-10:]
        ids += await add_many(m, 1, start=30)  # overflow again
        assert source_ids(await m.compile(budget(100))) == ids[-5:]


async def test_windowed_anchor_is_persisted(store_path: Path) -> None:
    """T2: the anchor is stored in the namespace's state and reloaded after a restart, not recomputed."""
    strategy = ctxrt.WindowedPassthrough(re_anchor_fraction=0.5)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("win", strategy=strategy)
            ids = await add_many(m, 11)
            await m.compile(budget(100))  # overflow: anchored at ids[6]
            ids += await add_many(m, 3, start=11)
            kept = source_ids(await m.compile(budget(100)))
            assert kept == ids[6:]
            engine = rt.engine
            with engine.reader() as txn:
                anchor, _ = engine.get_value(txn, "win/windowed:anchor", engine.branch("main"))
            assert anchor == int(ids[6])
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("win", strategy=strategy)
            assert source_ids(await m.compile(budget(100))) == kept


async def test_windowed_newest_message_alone_over_budget_raises(runtime: Runtime) -> None:
    """T2: OverBudgetError, with the budget and the newest message's cost, when it alone overflows."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("win", strategy=ctxrt.WindowedPassthrough())
        await add_many(m, 3)
        await m.add_message("user", "x" * 29 * 20)  # 200 tokens
        with pytest.raises(ctxrt.OverBudgetError) as caught:
            await m.compile(budget(100))
        assert (caught.value.budget, caught.value.actual) == (100, 200)
        assert await m.message_count() == 4


# -- R1: branches move only the manager -----------------------------------------------------------


async def test_fork_moves_only_the_forking_manager(runtime: Runtime) -> None:
    """R1: fork branches at the head and switches this manager; a sibling on the namespace stays on main."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("x")
        b = await runtime.open("x")
        ids = await add_many(a, 3)
        name = await a.fork("f")
        assert (name, a.branch, b.branch) == ("f", "f", "main")
        on_fork = await a.add_message("user", "fork only")
        on_main = await b.add_message("user", "main only")
        assert source_ids(await a.compile()) == [*ids, on_fork]
        assert source_ids(await b.compile()) == [*ids, on_main]
        info = {i.name: i for i in await a.list_branches()}
        assert info["f"].parent == "main" and info["f"].fork_sequence == int(ids[-1])


async def test_branch_at_does_not_switch_and_holds_the_message(runtime: Runtime) -> None:
    """R1: branch_at(message_id) branches at that message's sequence without moving the manager."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("x")
        ids = await add_many(a, 4)
        name = await a.branch_at(ids[1], "at-1")
        assert (name, a.branch) == ("at-1", "main")
        c = await runtime.open("x", branch="at-1")
        assert source_ids(await c.compile()) == ids[:2]
        assert source_ids(await a.compile()) == ids


async def test_branch_at_without_a_name_twice_at_once_makes_two_branches(runtime: Runtime) -> None:
    """R1: two unnamed branch_at calls on one message at the same moment each make a branch of their own
    (the generated name was the time and the sequence only, so the second raised BranchExistsError)."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("x")
        ids = await add_many(a, 2)
        names: list[str] = []

        async def branch() -> None:
            names.append(await a.branch_at(ids[0]))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(branch)
        assert len(set(names)) == 4
        assert set(names) <= {b.name for b in await runtime.list_branches()}


async def test_switch_branch_moves_only_this_manager(runtime: Runtime) -> None:
    """R1: switch_branch moves this manager; others on the old and the new branch stay where they are."""
    with trio.fail_after(GUARD_S):
        a = await runtime.open("x")
        b = await runtime.open("x")
        await add_many(a, 2)
        await runtime.create_branch("side")
        c = await runtime.open("x", branch="side")
        side_only = await c.add_message("user", "side")
        await a.switch_branch("side")
        assert (a.branch, b.branch, c.branch) == ("side", "main", "side")
        assert (await a.get_all_messages())[-1].id == side_only
        assert await b.get_message(side_only) is None
        await a.switch_branch("main")
        assert (a.branch, c.branch) == ("main", "side")
        with pytest.raises(ctxrt.BranchNotFoundError):
            await a.switch_branch("nowhere")
        assert a.branch == "main"


# -- restart --------------------------------------------------------------------------------------


async def test_every_manager_compiles_the_same_after_a_restart(store_path: Path) -> None:
    """R1, T2: close the runtime and reopen it; every manager compiles exactly what it compiled before."""
    setups: list[tuple[str | None, dict[str, Any]]] = [
        (None, {}),
        ("win", {"strategy": ctxrt.WindowedPassthrough(re_anchor_fraction=0.5)}),
        ("iso", {"isolate": True, "auxiliary_views": [None]}),
        ("bob", {"view_reader": "bob"}),
        ("forked", {"branch": "side"}),
    ]
    small = budget(100)
    before: list[list[ctxrt.CompiledMessage]] = []
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            await rt.create_branch("side")
            managers = [await rt.open(ns, **kwargs) for ns, kwargs in setups]
            default, win, iso, bob, forked = managers
            for i in range(12):
                await default.add_message("user" if i % 2 else "Claude", say(i))
                await win.compile(small)
            await iso.add_message("user", "isolated")
            await bob.add_message("user", [Text("for bob", audience=("bob",)), Text("for all")])
            await forked.add_message("user", "on the side")
            await add_many(default, 2, start=50)  # the windowed anchor now sits behind a fresh re-anchor
            for manager in managers:
                before.append((await manager.compile(small)).messages)
        async with ctxrt.open_runtime(store_path) as rt:
            managers = [await rt.open(ns, **kwargs) for ns, kwargs in setups]
            after = [(await manager.compile(small)).messages for manager in managers]
            assert await managers[3].compile(small) is not None
            assert managers[3].view_reader == "bob"
    assert after == before
    assert len(before[1]) == 9  # the persisted anchor's window; a fresh re-anchor would keep 5
    assert {"for bob", "for all"} <= set(texts(before[3]))  # bob's compile, in bob's view
    assert "for all" in texts(before[1]) and "for bob" not in texts(before[1])


# -- errors ---------------------------------------------------------------------------------------


async def test_a_closed_manager_refuses_every_call(runtime: Runtime) -> None:
    """API: after aclose every call raises ManagerClosedError; aclose is idempotent; siblings keep working."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("x")
        sibling = await runtime.open("x")
        mid = await m.add_message("user", "hi")
        await m.aclose()
        await m.aclose()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: m.add_message("user", "x"),
            lambda: m.edit_message(mid, "y"),
            lambda: m.remove_message(mid),
            lambda: m.get_message(mid),
            lambda: m.get_all_messages(),
            lambda: m.message_count(),
            lambda: m.compile(),
            lambda: m.tick(),
            lambda: m.fork("nope"),
            lambda: m.derive(branch="nope2"),
        ]
        for call in calls:
            with pytest.raises(ctxrt.ManagerClosedError):
                await call()
        assert await sibling.message_count() == 1
        assert [b.name for b in await runtime.list_branches()] == ["main"]


async def test_unknown_ids_raise_message_not_found(runtime: Runtime) -> None:
    """API: edit, remove and branch_at of an unknown id raise MessageNotFoundError; get_message returns None."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("x")
        known = await m.add_message("user", "hi")
        for call in (
            lambda: m.edit_message("999", "x"),
            lambda: m.remove_message("999"),
            lambda: m.remove_messages(known, "999"),
            lambda: m.branch_at("not-an-id"),
        ):
            with pytest.raises(ctxrt.MessageNotFoundError):
                await call()
        assert await m.get_message("999") is None
        assert await m.message_count() == 1


async def test_remove_messages_refuses_a_reversed_range(runtime: Runtime) -> None:
    """API: remove_messages with from_id after to_id raises ValueError and removes nothing."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("x")
        ids = await add_many(m, 3)
        with pytest.raises(ValueError):
            await m.remove_messages(ids[2], ids[0])
        assert await m.message_count() == 3
        await m.remove_messages(ids[0], ids[1])
        assert [x.id for x in await m.get_all_messages()] == [ids[2]]


async def test_another_strategy_on_a_running_namespace_is_a_config_conflict(runtime: Runtime) -> None:
    """API: an open naming a different strategy, or another view_filter, for a running namespace raises ConfigConflictError."""
    with trio.fail_after(GUARD_S):
        first = await runtime.open("x", strategy=ctxrt.Passthrough())
        with pytest.raises(ctxrt.ConfigConflictError):
            await runtime.open("x", strategy=ctxrt.WindowedPassthrough())
        with pytest.raises(ctxrt.ConfigConflictError):
            await runtime.open("x", view_filter=lambda message: True)
        same = await runtime.open("x", strategy=ctxrt.Passthrough())
        unspecified = await runtime.open("x")
        assert same.strategy == unspecified.strategy == first.strategy == ctxrt.Passthrough()


async def test_a_windowed_dry_run_moves_no_anchor(store_path: Path) -> None:
    """T2: a dry-run compile over budget shows the re-anchored window but stores and keeps no anchor."""
    strategy = ctxrt.WindowedPassthrough(re_anchor_fraction=0.5)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("win", strategy=strategy)
            ids = await add_many(m, 11)
            assert source_ids(await m.compile(budget(100), dry_run=True)) == ids[-5:]
            assert source_ids(await m.compile(budget(200))) == ids  # the dry run left the anchor at 0
            real = source_ids(await m.compile(budget(100)))
            assert real == ids[-5:]
            assert source_ids(await m.compile(budget(200))) == real  # a real overflow moved it
        async with ctxrt.open_runtime(store_path) as rt:
            m = await rt.open("win", strategy=strategy)
            assert source_ids(await m.compile(budget(200))) == real


async def test_a_derive_made_through_a_view_filter_reopens_filtered_or_warns_that_it_widens(store_path: Path) -> None:
    """R2: a child derived from a manager with a view filter records so; reopened after a
    restart with view_filter= it compiles the filtered view again, and reopened without one it
    warns that its view widens (it once widened silently)."""

    def visible(message: ctxrt.Message) -> bool:
        return "tuned out" not in message.content[0].text

    async with ctxrt.open_runtime(store_path) as rt:
        parent = await rt.open("agents/ann", view_reader="ann", view_filter=visible)
        await parent.add_message("user", "visible")
        await parent.add_message("user", "tuned out")
        child = await parent.derive(branch="child")
        assert child.derivation is not None and child.derivation.filtered
        saved = json.dumps(attrs.asdict(child.derivation))
    async with ctxrt.open_runtime(store_path) as rt:
        derivation = ctxrt.Derivation(**json.loads(saved))
        reopened = await rt.reopen_derived(derivation, view_filter=visible)
        assert [m.content[0].text for m in (await reopened.compile(ctxrt.Budget())).messages] == ["visible"]
        await reopened.aclose()
        with pytest.warns(RuntimeWarning, match=r"view filter.*pass view_filter="):
            widened = await rt.reopen_derived(derivation)
        assert [m.content[0].text for m in (await widened.compile(ctxrt.Budget())).messages] == ["visible", "tuned out"]
