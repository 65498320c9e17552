"""docs/behaviours.md, item by item: audience blocks, reader views, reader records, narrowing.

Every test names the behaviour and cites its number. They go through the public API
(``import ctxrt``, ``rt.open(...)``); where a test must see what the store holds (a reader
record, the narrowing floor, the context log), it reads through the runtime's engine in a read
transaction, never around the actors, and what a namespace actor holds (its reader listing)
only through the documented hook ``await manager.inspect()`` (copies). Strategies defined here are
synchronous, as every strategy is. Three tests act at the store's boundary and say so: two
refuse writes of ``<ns>/narrowing-floor`` (as a full map would), one holds a claim's write.

Determinism: real LMDB (``durability="os"``) and the real clock; a ``trio.fail_after`` guard
wherever a test waits on an event. Model calls go to ``ScriptedModel``, whose responders echo
the ``*-ONLY-n`` markers they were shown, so a block that reached a request or a summary shows.
E3 compares its bytes with ``tests/data/e3-compile-hash.txt``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import lmdb
import pytest
import trio
import trio.testing

import ctxrt
import ctxrt.namespace.core
import ctxrt.views
from ctxrt import (
    Autobiographical,
    Budget,
    Entry,
    Injection,
    MessageInjection,
    Passthrough,
    Runtime,
    Strategy,
    Text,
    Thinking,
    ToolResult,
    content_for_reader,
)
from ctxrt.testing import (
    AppendItem,
    Atomically,
    FULL,
    RegisterState,
    ScriptedModel,
    SetValue,
    codec,
    hidden_by_edit,
    shared_reader_listing,
    to_anthropic_messages,
)
from support import wait_until

GUARD_S = 30
BIG = Budget(max_tokens=10_000_000, reserve_for_response=0)
MARKER = re.compile(r"(?:ANN|BOB|BOTH|STALE)-ONLY-\d+")
E3_HASH_FILE = Path(__file__).resolve().parent.parent / "data" / "e3-compile-hash.txt"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["lmdb", "postgres"])
def audience_store(request: pytest.FixtureRequest, store_path: Path) -> Path | str:
    """Every rule here holds on both engines: an LMDB directory, or a PostgreSQL database's URL."""
    return store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")


@pytest.fixture
async def rt(audience_store: Path | str) -> AsyncIterator[Runtime]:
    async with ctxrt.open_runtime(audience_store, durability="os") as runtime:
        yield runtime


def block(text: str, *audience: str) -> dict[str, Any]:
    """A text block in API dict form, with an audience when readers are named."""
    return {"type": "text", "text": text, "audience": list(audience)} if audience else {"type": "text", "text": text}


def words(i: int) -> dict[str, Any]:
    """About 95 tokens of plain prose numbered ``i``."""
    return block(f"Message {i}. " + "filler words " * 20)


def narrowed(i: int) -> list[dict[str, Any]]:
    """Message ``[words(i), ANN-ONLY-i for ann]`` narrowed in place (D1): ann's name taken out of
    her block's audience (the block kept, for cy), so the edit hides it from ann alone."""
    return [words(i), block(f"ANN-ONLY-{i}", "cy")]


def ann_every_third(i: int) -> list[dict[str, Any]]:
    """Message ``i``: every third holds an ann-only marker block (ANN-ONLY-0 ... for i = 0, 3, ...)."""
    return [block(f"ANN-ONLY-{i // 3}", "ann"), words(i)] if i % 3 == 0 else [words(i)]


def block_text(b: Any) -> str:
    if isinstance(b, Text):
        return b.text
    if isinstance(b, Thinking):
        return b.thinking
    if isinstance(b, ToolResult):
        return b.content if isinstance(b.content, str) else "\n".join(block_text(x) for x in b.content)
    return ""


def request_text(request: ctxrt.ModelRequest) -> str:
    return "\n".join(block_text(b) for m in request.messages for b in m.content)


def echo_markers(request: ctxrt.ModelRequest) -> str:
    """A summary naming every marker the request showed (so a leak or a loss shows)."""
    found = dict.fromkeys(MARKER.findall(request_text(request)))
    return "SUMMARY " + " ".join(found) + " " + "remembered " * 30


def body_json(result: ctxrt.CompileResult) -> str:
    return json.dumps(result.to_anthropic(assistant="Claude"), sort_keys=True, ensure_ascii=False)


def request_json(request: ctxrt.ModelRequest) -> str:
    return json.dumps(
        {"model": request.model, "system": request.system, "max_tokens": request.max_tokens,
         "messages": to_anthropic_messages(request.messages, request.assistant)},
        sort_keys=True, ensure_ascii=False,
    )


def audiences_in(blocks: Sequence[Any]) -> list[Any]:
    """Every non-None audience among ``blocks``, nested tool-result blocks included."""
    found = []
    for b in blocks:
        if getattr(b, "audience", None) is not None:
            found.append(b.audience)
        if isinstance(b, ToolResult) and not isinstance(b.content, str):
            found += audiences_in(b.content)
    return found


def assert_no_audience(result: ctxrt.CompileResult) -> None:
    """A8: no compiled block, system block or provenance body carries an audience, and the body has no such key."""
    assert audiences_in([b for m in result.messages for b in m.content]) == []
    assert audiences_in(result.system_injections) == []
    assert audiences_in([b for m in result.provenance.raw_bodies.values() for b in m.content]) == []
    assert '"audience"' not in body_json(result)


def compiled_texts(result: ctxrt.CompileResult) -> list[str]:
    return [block_text(b) for m in result.messages for b in m.content]


def value_of(rt: Runtime, state: str, branch: str = "main") -> Any:
    """A value state's value on ``branch``; None if unset or unregistered."""
    return rt.engine.read_value(state, rt.engine.branch(branch).id)


def snapshot(rt: Runtime) -> tuple[int, list[str], list[str]]:
    """What the store holds, coarsely: its sequence, its states and its branches."""
    engine = rt.engine
    return (
        engine.last_sequence,
        sorted(s.name for s in engine.list_states()),
        sorted(b.name for b in engine.list_branches()),
    )


def context_log(rt: Runtime, namespace: str, branch: str = "main") -> list[ctxrt.Message]:
    engine = rt.engine
    items = engine.read_log(f"{namespace}/context", engine.branch(branch).id)
    return [codec.message_from_json(item.data, sequence=item.sequence, store="test") for item in items]


def writes_floor(command: Any) -> bool:
    """Whether a store command writes a narrowing floor, alone or inside an ``Atomically`` (the
    namespace actor commits a raised floor in one transaction with the strategy's writes)."""
    if isinstance(command, Atomically):
        return any(writes_floor(c) for c in command.commands)
    return isinstance(command, SetValue) and command.state.endswith("/narrowing-floor")


def fail_floor_writes(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Fault injection: the store refuses every write to a narrowing floor, and with it the
    whole transaction carrying it (as a full map would), while the returned switch holds True."""
    switch = [True]
    store = rt.store
    real = store.ask

    async def ask(command: Any) -> Any:
        if switch[0] and writes_floor(command):
            raise lmdb.MapFullError("injected: the store refuses this write")
        return await real(command)

    monkeypatch.setattr(store, "ask", ask)
    return switch


def memory(**overrides: Any) -> Autobiographical:
    """Small chunks, no recent window: compression reads almost everything."""
    settings: dict[str, Any] = dict(target_chunk_tokens=300, recent_window_tokens=0, head_window_tokens=0,
                                    l1_holdback_chunks=0)
    settings.update(overrides)
    return Autobiographical("test-compression-model", **settings)


@attrs.frozen
class Probe:
    """Config of a passthrough strategy that logs what it is handed.

    ``marks`` is its ``marks_compression_reads``; ``fail_on`` a branch-name prefix where its
    ``initialize`` raises ("" for every branch); ``copy_to_context`` appends a ``copy`` entry of
    each new message to the context log; ``context_audience`` adds an audience block to it;
    ``mark_on_select`` are sequences it marks as read by compression in each ``select``.
    Synchronous, as every strategy is: its context writes are committed by the actor after the
    call returns. It plans no units (no model requests).
    """

    log: list[Any] = attrs.field(factory=list, eq=False, repr=False)
    marks: bool = True
    fail_on: str | None = None
    copy_to_context: bool = False
    context_audience: bool = False
    mark_on_select: tuple[int, ...] = ()

    def create(self) -> ProbeStrategy:
        return ProbeStrategy(self)


class ProbeStrategy(Strategy):
    name = "probe"

    def __init__(self, config: Probe) -> None:
        self.config = config
        self.marks_compression_reads = config.marks
        self.kept: ctxrt.MessageView | None = None

    def initialize(self, ctx: ctxrt.StrategyContext) -> None:
        self.config.log.append(("initialize", ctx.branch))
        if self.config.fail_on is not None and ctx.branch.startswith(self.config.fail_on):
            raise RuntimeError("initialize failed (probe)")

    def on_new_message(self, message: ctxrt.Message, ctx: ctxrt.StrategyContext) -> None:
        self.config.log.append(("new", message))
        if self.config.copy_to_context:
            content = message.content
            if self.config.context_audience:
                content = (*content, Text("private", audience=("ann",)))
            ctx.append_context(Entry(message.participant, content, (message.id,), "copy"))

    def select(self, view: ctxrt.MessageView, budget: Budget, options: ctxrt.SelectOptions) -> list[Entry]:
        self.config.log.append(("select", view))
        self.kept = view
        for sequence in self.config.mark_on_select:
            assert options.context is not None
            options.context.mark_compression_read(sequence)
        return [Entry(m.participant, m.content, (m.id,), "copy") for m in view.get_all()]


def selects(config: Probe) -> int:
    return sum(1 for kind, _ in config.log if kind == "select")


# --------------------------------------------------------------------------------------------
# A. The reader's view
# --------------------------------------------------------------------------------------------


async def test_a_block_carries_its_audience_as_a_tuple_of_reader_names(rt: Runtime) -> None:
    """A1: text and thinking blocks carry an audience, a non-empty tuple of reader names, as written."""
    manager = await rt.open("agents/ann", view_reader="ann")
    mid = await manager.add_message("Claude", [
        block("for both", "ann", "bob"),
        Text("for ann", audience=("ann",)),
        {"type": "thinking", "thinking": "hm", "signature": "sig", "audience": ["bob"]},
        block("for everyone"),
    ])
    stored = await manager.get_message(mid)
    assert stored is not None
    assert [b.audience for b in stored.content] == [("ann", "bob"), ("ann",), ("bob",), None]


def test_content_for_reader_keeps_unaddressed_and_named_blocks_without_the_field() -> None:
    """A2: the reader keeps blocks with no audience and those naming it, audience removed; None keeps only unaddressed."""
    blocks = (Text("all"), Text("ann", audience=("ann",)), Text("bob", audience=("bob",)),
              Text("both", audience=("ann", "bob")))
    assert content_for_reader(blocks, "ann") == (Text("all"), Text("ann"), Text("both"))
    assert content_for_reader(blocks, "bob") == (Text("all"), Text("bob"), Text("both"))
    assert content_for_reader(blocks, "cy") == (Text("all"),)
    assert content_for_reader(blocks, None) == (Text("all"),)


async def test_a_stored_audience_that_is_not_a_list_of_strings_names_no_one_and_never_raises(rt: Runtime) -> None:
    """A2: an audience written by something else that isn't a list of strings is read, never raised on, and names no one."""
    manager = await rt.open("agents/ann", view_reader="ann")
    await manager.add_message("user", "first")
    odd = (Text("string", audience="ann"), Text("mixed", audience=("ann", 3)), Text("empty", audience=()),  # type: ignore[arg-type]
           Text("mapping", audience={"ann": True}), Text("plain"))  # type: ignore[arg-type]
    data = codec.message_to_json("user", odd, None, 0, ())
    await rt.store.ask(AppendItem(state="messages", branch="main", data=data))
    stored = (await manager.get_all_messages())[-1]
    assert [b.text for b in stored.content] == ["string", "mixed", "empty", "mapping", "plain"]
    for reader in ("ann", None):
        assert content_for_reader(stored.content, reader) == (Text("plain"),)
    result = await manager.compile(BIG)
    assert compiled_texts(result) == ["first", "plain"]
    assert_no_audience(result)


async def test_an_audience_nested_in_a_stored_tool_result_follows_the_rule_and_never_leaves_compile(
    rt: Runtime,
) -> None:
    """A2, A8, B1: a store written before the write check may hold an audience inside a tool result;
    ann's compile keeps the nested block meant for her without its audience field, bob's and a no-reader
    compile leave it out, the tool result stays paired with its call, and no audience field is in any
    compiled block, raw body or request body."""
    ann = await rt.open("agents/ann", view_reader="ann")
    bob = await rt.open("agents/bob", view_reader="bob")
    nobody = await rt.open("agents/free")
    await ann.add_message("user", "look it up")
    await ann.add_message("assistant", [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}])
    nested = (ToolResult("t1", (Text("for all"), Text("ANN-ONLY-1", audience=("ann",)))),)
    data = codec.message_to_json("user", nested, None, 0, ())
    await rt.store.ask(AppendItem(state="messages", branch="main", data=data))  # as an older version wrote it
    for manager, expected in ((ann, ["for all", "ANN-ONLY-1"]), (bob, ["for all"]), (nobody, ["for all"])):
        result = await manager.compile(BIG)
        results = [b for m in result.messages for b in m.content if isinstance(b, ToolResult)]
        assert len(results) == 1 and [block_text(b) for b in results[0].content] == expected
        assert any(b.type == "tool_use" for m in result.messages for b in m.content)
        assert_no_audience(result)
        body = result.to_anthropic(assistant="assistant", strict=True)
        assert "ANN-ONLY" not in json.dumps(body) or manager is ann


async def test_view_filter_sees_stored_messages_and_a_message_left_empty_is_never_compiled(rt: Runtime) -> None:
    """A3: the view filter sees each message as stored before the reader view; a message all someone else's drops out."""
    seen: list[ctxrt.Message] = []

    def keep(message: ctxrt.Message) -> bool:
        seen.append(message)
        # Decided on the stored form: drop any message holding a block addressed to bob.
        return not any(getattr(b, "audience", None) and "bob" in b.audience for b in message.content)

    ann = await rt.open("agents/ann", view_reader="ann", view_filter=keep)
    await ann.add_message("user", [block("kept for ann"), block("ann's line", "ann")])
    await ann.add_message("user", [block("dropped by the filter"), block("bob's line", "bob")])
    await ann.add_message("user", [block("cy's only", "cy")])
    await ann.add_message("user", "plain")
    result = await ann.compile(BIG)
    assert compiled_texts(result) == ["kept for ann", "ann's line", "plain"]
    assert all(m.content for m in result.messages)
    assert any(b.audience == ("bob",) for m in seen for b in m.content), "the filter saw the stored form"
    assert_no_audience(result)


async def test_strategy_is_handed_the_readers_view_of_each_new_message_and_none_it_sees_nothing_of(rt: Runtime) -> None:
    """A4: on_new_message gets the reader's view of a message, and isn't called for one the reader sees nothing of."""
    probe = Probe()
    ann = await rt.open("agents/ann", view_reader="ann", strategy=probe)
    await ann.add_message("user", [block("hello"), block("ann's", "ann"), block("bob's", "bob")])
    await ann.add_message("user", [block("bob only", "bob")])
    await ann.add_message("user", [block("ann only", "ann")])
    await ann.compile(BIG)
    handed = [m for kind, m in probe.log if kind == "new"]
    assert [[block_text(b) for b in m.content] for m in handed] == [["hello", "ann's"], ["ann only"]]
    assert audiences_in([b for m in handed for b in m.content]) == []


async def test_summaries_and_their_requests_are_in_the_readers_view(rt: Runtime) -> None:
    """A4: a reader's compression requests and summaries hold only its view: bob's hold none of ann's blocks."""
    model = ScriptedModel(echo_markers)
    bob = await rt.open("agents/bob", view_reader="bob", strategy=memory(), model=model)
    for i in range(40):
        await bob.add_message("user", [block(f"ANN-ONLY-{i}", "ann"), block(f"BOB-ONLY-{i}", "bob"), words(i)])
    await bob.wait_ready()
    assert model.requests, "the premise: bob's namespace compressed"
    for request in model.requests:
        assert "ANN-ONLY" not in request_text(request)
        assert audiences_in([b for m in request.messages for b in m.content]) == []
    summaries = await bob.search_summaries(regex="BOB-ONLY", limit=1000, include_merged=True)
    assert summaries
    assert not await bob.search_summaries(regex="ANN-ONLY", limit=1000, include_merged=True)
    result = await bob.compile(BIG)
    assert "BOB-ONLY-0" in body_json(result) and "ANN-ONLY" not in body_json(result)
    assert any(s.kind == "summary" for sources in result.provenance.messages for s in sources)
    assert_no_audience(result)


@pytest.mark.parametrize("filtered", [False, True], ids=["no_filter", "view_filter"])
async def test_provenance_raw_bodies_and_completeness_are_judged_in_the_readers_view(
    rt: Runtime, filtered: bool
) -> None:
    """A4: compile provenance holds raw bodies as the reader sees them, complete when all of that view was sent, with a view_filter as without."""
    keep = (lambda message: message.participant == "user") if filtered else None
    ann = await rt.open("agents/ann", view_reader="ann", view_filter=keep)
    mid = await ann.add_message("user", [block("hello"), block("ann's", "ann"), block("bob's", "bob")])
    await ann.add_message("someone", "filtered out when the filter is set")
    result = await ann.compile(BIG)
    body = result.provenance.raw_bodies[mid]
    assert [block_text(b) for b in body.content] == ["hello", "ann's"]
    assert result.provenance.completeness[mid] is True
    assert result.provenance.reader == "ann"
    assert len(result.messages) == (1 if filtered else 2)
    assert_no_audience(result)


async def test_thinking_kept_for_replay_is_the_readers_own(rt: Runtime) -> None:
    """A4: a signed thinking block addressed to ann is replayed in ann's request, without its audience, and not in bob's."""
    ann = await rt.open("agents/ann", view_reader="ann")
    bob = await rt.open("agents/bob", view_reader="bob")
    await ann.add_message("user", "question")
    await ann.add_message("Claude", [
        {"type": "thinking", "thinking": "ANN-ONLY-thought", "signature": "sig-1", "audience": ["ann"]},
        block("answer"),
    ])
    ann_body = (await ann.compile(BIG)).to_anthropic(assistant="Claude")
    bob_body = (await bob.compile(BIG)).to_anthropic(assistant="Claude")
    assert ann_body["messages"][1]["content"][0] == {"type": "thinking", "thinking": "ANN-ONLY-thought",
                                                      "signature": "sig-1"}
    assert "ANN-ONLY" not in json.dumps(bob_body)


def test_a_shared_raw_replay_form_is_taken_off_the_blocks_left_when_one_sharing_it_is_hidden() -> None:
    """A5: a raw replay form shared with a hidden block is removed from the blocks the reader keeps."""
    shared, own = {"item": "shared"}, {"item": "own"}
    blocks = (Text("bob's", audience=("bob",), raw=shared), Text("plain", raw=shared), Text("other", raw=own))
    kept = content_for_reader(blocks, "ann")
    assert kept == (Text("plain"), Text("other", raw=own))
    assert content_for_reader(blocks, "bob") == (Text("bob's", raw=shared), Text("plain", raw=shared),
                                                  Text("other", raw=own))


async def test_context_log_copies_of_an_edited_message_are_the_readers_view_or_dropped(rt: Runtime) -> None:
    """A6: an edit rewrites the context log's copies as the reader sees the message, and drops them where it sees nothing."""
    probe = Probe(copy_to_context=True)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=probe)
    widened = await ann.add_message("user", [block("plain"), block("bob's", "bob")])
    hidden = await ann.add_message("user", [block("ann's", "ann")])
    await ann.compile(BIG)
    assert [[block_text(b) for b in e.content] for e in context_log(rt, "agents/ann")] == [["plain"], ["ann's"]]
    await ann.edit_message(widened, [block("plain"), block("bob's", "bob", "ann")])
    await ann.edit_message(hidden, [block("ann's", "bob")])  # hides it from ann alone, before any compression
    entries = context_log(rt, "agents/ann")
    assert [[block_text(b) for b in e.content] for e in entries] == [["plain", "bob's"]]
    assert audiences_in([b for e in entries for b in e.content]) == []


async def test_reads_of_the_store_return_every_block_with_its_audience(rt: Runtime) -> None:
    """A7: get_message, get_all_messages, get_message_window and query_messages return messages as stored."""
    ann = await rt.open("agents/ann", view_reader="ann")
    content = [block("plain"), block("ann's", "ann"), block("bob's", "bob")]
    mid = await ann.add_message("user", content, metadata={"k": 1})
    await ann.add_message("user", [block("bob only", "bob")])
    expected = [None, ("ann",), ("bob",)]
    assert [b.audience for b in (await ann.get_message(mid)).content] == expected  # type: ignore[union-attr]
    everything = await ann.get_all_messages()
    assert len(everything) == 2 and everything[1].content[0].audience == ("bob",)
    window = await ann.get_message_window(0, 10)
    assert [b.audience for b in window.messages[0].content] == expected
    found = await ann.query_messages(metadata={"k": 1})
    assert [b.audience for b in found[0].content] == expected


async def test_two_readers_compile_only_their_blocks_and_a_manager_with_no_reader_holds_none(rt: Runtime) -> None:
    """A8 (the seed's probe): over one store, ann's and bob's compiles hold only their blocks, without the field; no-reader holds none."""
    ann = await rt.open("agents/ann", view_reader="ann")
    bob = await rt.open("agents/bob", view_reader="bob")
    nobody = await rt.open("agents/nobody")
    await ann.add_message("user", [block("[for ann]", "ann"), block("[for bob]", "bob"),
                                   block("[for both]", "ann", "bob"), block("Hello, both.")])
    results = {name: await m.compile(BIG) for name, m in (("ann", ann), ("bob", bob), ("nobody", nobody))}
    assert compiled_texts(results["ann"]) == ["[for ann]", "[for both]", "Hello, both."]
    assert compiled_texts(results["bob"]) == ["[for bob]", "[for both]", "Hello, both."]
    assert compiled_texts(results["nobody"]) == ["Hello, both."]
    for result in results.values():
        assert_no_audience(result)


# --------------------------------------------------------------------------------------------
# B. Where an audience is refused
# --------------------------------------------------------------------------------------------

PNG = "iVBORw0KGgo="
REFUSED_AUDIENCES = [
    pytest.param([block("x"), {"type": "tool_use", "id": "t1", "name": "f", "input": {}, "audience": ["bob"]}],
                 "content[1].audience", id="tool_use"),
    pytest.param([{"type": "tool_result", "tool_use_id": "t1", "content": "r", "audience": ["bob"]}],
                 "content[0].audience", id="tool_result"),
    pytest.param([{"type": "tool_result", "tool_use_id": "t1", "content": [block("inner", "bob")]}],
                 "content[0].content[0].audience", id="nested_in_tool_result"),
    pytest.param([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                   "audience": ["bob"]}], "content[0].audience", id="image"),
    pytest.param([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"},
                   "audience": ["bob"]}], "content[0].audience", id="document"),
    pytest.param([{"type": "redacted_thinking", "data": "xyz", "audience": ["bob"]}], "content[0].audience",
                 id="redacted_thinking"),
    pytest.param([{"type": "text", "text": "x", "audience": "bob"}], "content[0].audience", id="not_a_list"),
    pytest.param([{"type": "text", "text": "x", "audience": []}], "content[0].audience", id="empty_list"),
    pytest.param([{"type": "text", "text": "x", "audience": [""]}], "content[0].audience[0]", id="empty_name"),
    pytest.param([{"type": "text", "text": "x", "audience": [3]}], "content[0].audience[0]", id="not_a_string"),
]


@pytest.mark.parametrize(("content", "place"), REFUSED_AUDIENCES)
async def test_an_audience_is_refused_at_write_outside_top_level_text_and_thinking(
    rt: Runtime, content: list[Any], place: str
) -> None:
    """B1: add_message and edit_message refuse an audience on tool, media, redacted or nested blocks, or a bad one, naming it; nothing is stored."""
    ann = await rt.open("agents/ann", view_reader="ann")
    mid = await ann.add_message("user", "before")
    before = snapshot(rt)
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        await ann.add_message("user", content)
    assert refused.value.path == place
    with pytest.raises(ctxrt.MalformedContentError) as refused_edit:
        await ann.edit_message(mid, content)
    assert refused_edit.value.path == place
    assert snapshot(rt) == before
    assert [b.text for m in await ann.get_all_messages() for b in m.content] == ["before"]


async def test_an_audience_key_inside_tool_data_is_stored_as_written_and_means_nothing(rt: Runtime) -> None:
    """B2: "audience" inside a tool call's input or a tool result's JSON text is data, stored and compiled for every reader."""
    ann = await rt.open("agents/ann", view_reader="ann")
    nobody = await rt.open("agents/nobody")
    result_text = json.dumps({"audience": ["bob"], "value": 1})
    await ann.add_message("Claude", [block("calling"), {"type": "tool_use", "id": "t1", "name": "f",
                                                         "input": {"audience": ["bob"], "q": 1}}])
    await ann.add_message("user", [{"type": "tool_result", "tool_use_id": "t1", "content": result_text}])
    stored = await ann.get_all_messages()
    assert stored[0].content[1].input == {"audience": ["bob"], "q": 1}
    for manager in (ann, nobody):
        body = (await manager.compile(BIG)).to_anthropic(assistant="Claude")
        assert body["messages"][1]["content"][1]["input"] == {"audience": ["bob"], "q": 1}
        assert body["messages"][2]["content"][0]["content"] == result_text


async def test_a_context_log_entry_with_an_audience_is_refused(rt: Runtime) -> None:
    """B3: StrategyContext.append_context refuses an entry carrying an audience, naming the place; none is written."""
    good = await rt.open("agents/good", view_reader="ann", strategy=Probe(copy_to_context=True))
    await good.add_message("user", "hello")
    await good.compile(BIG)
    assert len(context_log(rt, "agents/good")) == 1  # the same strategy writes an entry without one
    bad = await rt.open("agents/bad", view_reader="ann", strategy=Probe(copy_to_context=True, context_audience=True))
    await bad.add_message("user", "hello again")
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        await bad.compile(BIG)
    assert refused.value.path == "entry.content[1]"
    assert context_log(rt, "agents/bad") == []


async def test_compile_and_preview_refuse_an_injection_with_an_audience_before_selecting(rt: Runtime) -> None:
    """B4: an audience in an Injection or MessageInjection is refused before the strategy selects; without one it is placed."""
    probe = Probe()
    ann = await rt.open("agents/ann", view_reader="ann", strategy=probe)
    await ann.add_message("user", "hello")
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        await ann.compile(BIG, injections=[Injection("host", "before_user", [block("secret", "ann")])])
    assert refused.value.path == "injections[0].content[0]"
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        await ann.compile(BIG, message_injections=[MessageInjection("host", [block("ok"), block("s", "bob")])])
    assert refused.value.path == "message_injections[0].content[1]"
    nested = [{"type": "tool_result", "tool_use_id": "t", "content": [block("s", "ann")]}]
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        await ann.preview_context(BIG, message_injections=[MessageInjection("host", nested)])
    assert refused.value.path == "message_injections[0].content[0].content[0]"
    assert selects(probe) == 0
    result = await ann.compile(BIG, injections=[Injection("host", "after_user", [block("INJECTED")])],
                               message_injections=[MessageInjection("host", "ALSO INJECTED")])
    assert "INJECTED" in compiled_texts(result) and "ALSO INJECTED" in compiled_texts(result)
    assert selects(probe) == 1


async def test_a_message_holding_an_audience_block_is_stored_whole(rt: Runtime) -> None:
    """B5: a long message holding an audience block is stored as one message, every block in place."""
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(target_chunk_tokens=100),
                        model=ScriptedModel(echo_markers))
    long_text = "A long paragraph of ordinary words. " * 200
    mid = await ann.add_message("user", [block("ANN-ONLY-0", "ann"), block(long_text)])
    assert await ann.message_count() == 1
    stored = await ann.get_message(mid)
    assert stored is not None and [b.text for b in stored.content] == ["ANN-ONLY-0", long_text]


# --------------------------------------------------------------------------------------------
# C. A namespace's reader
# --------------------------------------------------------------------------------------------


async def test_the_first_reader_is_recorded_per_branch_and_another_is_refused_naming_both(rt: Runtime) -> None:
    """C1: the first view_reader is recorded in <ns>/reader per branch; another reader's open or switch is refused, naming both and why."""
    await rt.create_branch("b")  # before any claim: the namespace is unclaimed there
    ann = await rt.open("agents/x", view_reader="ann")
    assert value_of(rt, "agents/x/reader") == "ann"
    with pytest.raises(ctxrt.ReaderConflictError) as refused:
        await rt.open("agents/x", view_reader="bob")
    text = str(refused.value)
    assert "'ann'" in text and "'bob'" in text
    assert "summaries and context log" in text and "namespace of its own" in text
    await ann.aclose()
    bob = await rt.open("agents/x", view_reader="bob", branch="b")  # the record is per branch
    assert value_of(rt, "agents/x/reader", "b") == "bob"
    assert value_of(rt, "agents/x/reader", "main") == "ann"
    await bob.aclose()
    ann = await rt.open("agents/x", view_reader="ann")
    with pytest.raises(ctxrt.ReaderConflictError) as refused:
        await ann.switch_branch("b")
    assert "'ann'" in str(refused.value) and "'bob'" in str(refused.value)
    assert ann.branch == "main"


async def test_a_second_reader_opening_while_the_first_ones_claim_is_committing_is_refused(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C1, C13: an open for bob while ann's claiming open is still under way (its claim held at the store's boundary) waits its turn, then is refused."""
    gate, reached = trio.Event(), trio.Event()
    real = rt.store.ask

    async def ask(command: Any) -> Any:  # holds the claim's write until the gate opens
        if isinstance(command, SetValue) and command.state == "agents/x/reader":
            reached.set()
            await gate.wait()
        return await real(command)

    monkeypatch.setattr(rt.store, "ask", ask)
    config = Probe()
    opened: dict[str, Any] = {}

    async def open_for(reader: str, strategy: Any) -> None:
        try:
            opened[reader] = await rt.open("agents/x", view_reader=reader, strategy=strategy)
        except ctxrt.ReaderConflictError as exc:
            opened[reader] = exc

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_for, "ann", config)
            await reached.wait()
            nursery.start_soon(open_for, "bob", None)
            await trio.testing.wait_all_tasks_blocked()
            assert opened == {}, "both opens wait on ann's claim"
            gate.set()
    assert isinstance(opened["ann"], ctxrt.ContextManager) and opened["ann"].view_reader == "ann"
    assert isinstance(opened["bob"], ctxrt.ReaderConflictError)
    assert value_of(rt, "agents/x/reader") == "ann"
    assert ("initialize", "main") in config.log


async def test_a_refused_open_registers_and_writes_nothing_auxiliary_slots_included(rt: Runtime) -> None:
    """C2: an open refused for another reader registers no state, auxiliary slots included, and writes nothing."""
    ann = await rt.open("agents/x", view_reader="ann")
    await ann.aclose()  # the namespace actor stops: the refusal is judged from the store
    before = snapshot(rt)
    with pytest.raises(ctxrt.ReaderConflictError):
        await rt.open("agents/x", view_reader="bob", auxiliary_views=["agents/elsewhere"])
    assert snapshot(rt) == before
    assert not rt.engine.has_state("agents/elsewhere/messages")
    live = await rt.open("agents/x", view_reader="ann")  # with the actor running, likewise
    before = snapshot(rt)
    with pytest.raises(ctxrt.ReaderConflictError):
        await rt.open("agents/x", view_reader="bob")
    assert snapshot(rt) == before
    await live.aclose()


async def test_a_refused_switch_stays_put_and_leaves_nothing_running_on_the_other_branch(rt: Runtime) -> None:
    """C2: a refused switch leaves the manager on its branch, working, and leaves no namespace actor behind there."""
    nobody = await rt.open("agents/x")
    await nobody.add_message("user", "hello")
    await rt.create_branch("b")
    claimer = await rt.open("agents/x", view_reader="ann", branch="b")
    await claimer.aclose()
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.switch_branch("b")
    assert nobody.branch == "main"
    assert compiled_texts(await nobody.compile(BIG)) == ["hello"]
    # Nothing the refused switch started stays on "b": another strategy can open there.
    other = await rt.open("agents/x", view_reader="ann", branch="b", strategy=memory())
    assert other.strategy == memory()


async def test_a_refused_fork_leaves_no_branch_and_a_refused_derive_writes_none(rt: Runtime) -> None:
    """C2: a fork refused (C7) makes no branch, and a derive refused (D6) writes no branch."""
    nobody = await rt.open("agents/x")
    ann = await rt.open("agents/x", view_reader="ann")
    await ann.add_message("user", "hello")
    before = snapshot(rt)
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.fork("refused-fork")
    with pytest.raises(ctxrt.StrategyRefusedError):
        await ann.derive(branch="refused-derive", strategy=Probe(marks=False))
    assert snapshot(rt) == before


async def test_a_record_that_is_not_a_readers_name_refuses_open_and_switch_saying_so(rt: Runtime) -> None:
    """C3: a corrupt reader record refuses an open and a switch onto it, saying the record is not a reader's name."""
    await rt.store.ask(RegisterState(name="agents/x/reader", kind="value"))
    await rt.create_branch("corrupt")
    await rt.store.ask(SetValue(state="agents/x/reader", branch="corrupt", value=42))
    for reader in ("ann", None):
        with pytest.raises(ctxrt.ReaderConflictError, match="not a reader's name"):
            await rt.open("agents/x", view_reader=reader, branch="corrupt")
    ann = await rt.open("agents/x", view_reader="ann")
    with pytest.raises(ctxrt.ReaderConflictError, match="not a reader's name"):
        await ann.switch_branch("corrupt")
    assert ann.branch == "main"


async def test_an_empty_reader_is_refused_and_none_empty_and_default_share_one_record(rt: Runtime) -> None:
    """C4: view_reader="" raises ValueError; namespaces None, "" and "default" share one record."""
    with pytest.raises(ValueError):
        await rt.open("agents/x", view_reader="")
    ann = await rt.open(None, view_reader="ann")
    assert (await rt.open("", view_reader="ann")).view_reader == "ann"
    assert (await rt.open("default")).view_reader == "ann"
    for namespace in (None, "", "default"):
        with pytest.raises(ctxrt.ReaderConflictError):
            await rt.open(namespace, view_reader="bob")
    assert [(n.namespace, n.reader) for n in await rt.list_namespaces()] == [("default", "ann")]
    assert ann.namespace == "default"


async def refused_for_its_failed_strategy(manager: ctxrt.ContextManager) -> None:
    """The manager's strategy failed to start: its compile is refused naming the failure, and its health says so."""
    with pytest.raises(ctxrt.StrategyRefusedError, match="initialize failed"):
        await manager.compile(BIG)
    health = await manager.health()
    assert health.strategy_error is not None and "initialize failed" in health.strategy_error


async def test_a_claim_stands_when_the_strategy_then_fails_to_start(rt: Runtime) -> None:
    """C5: the claim an open, a switch or a fork wrote stands though the strategy then fails to start there.

    The manager is made (its namespace actor keeps the failure: every call it guards is refused
    with StrategyRefusedError naming it) and recovers by switching away.
    """
    failed = await rt.open("agents/o", view_reader="ann", strategy=Probe(fail_on=""))
    assert value_of(rt, "agents/o/reader") == "ann"
    await refused_for_its_failed_strategy(failed)

    config = Probe(fail_on="bad")
    ann = await rt.open("agents/s", view_reader="ann", strategy=config)
    await ann.add_message("user", "hello")
    await rt.create_branch("bad-switch")
    await ann.switch_branch("bad-switch")
    assert value_of(rt, "agents/s/reader", "bad-switch") == "ann"
    assert ann.branch == "bad-switch"
    await refused_for_its_failed_strategy(ann)
    await ann.switch_branch("main")
    assert compiled_texts(await ann.compile(BIG)) == ["hello"]
    await ann.fork("bad-fork")
    assert value_of(rt, "agents/s/reader", "bad-fork") == "ann"
    await refused_for_its_failed_strategy(ann)


async def test_an_open_with_no_reader_on_a_claimed_namespace_compiles_and_compresses_for_its_reader(
    rt: Runtime,
) -> None:
    """C6 (the seed's probe): opened with no reader on ann's namespace, a manager compresses for ann: all 20 of her blocks stay in her compile."""
    config = memory()
    ann = await rt.open("agents/ann", view_reader="ann", strategy=config)
    for i in range(60):
        await ann.add_message("user", ann_every_third(i))
    await ann.aclose()  # closed before anything compressed
    model = ScriptedModel(echo_markers)
    nobody = await rt.open("agents/ann", strategy=config, model=model)
    assert nobody.view_reader == "ann"
    await nobody.wait_ready()
    assert model.requests, "the premise: the manager opened with no reader compressed"
    assert any("ANN-ONLY" in request_text(r) for r in model.requests)
    nobody_result = await nobody.compile(BIG)
    await nobody.aclose()
    ann = await rt.open("agents/ann", view_reader="ann", strategy=config)
    result = await ann.compile(BIG)
    body = body_json(result)
    assert {f"ANN-ONLY-{n}" for n in range(20)} <= set(MARKER.findall(body))
    summarised = [b for m, sources in zip(result.messages, result.provenance.messages)
                  if any(s.kind == "summary" for s in sources) for b in m.content]
    assert MARKER.findall("".join(block_text(b) for b in summarised)), "some of her blocks live in summaries"
    assert body == body_json(nobody_result)
    assert_no_audience(result)


async def test_a_manager_for_no_reader_is_refused_switch_fork_and_set_strategy_where_a_reader_is_recorded(
    rt: Runtime,
) -> None:
    """C7: a manager compiling for no reader is refused a switch, fork or set_strategy onto a branch whose namespace records a reader."""
    nobody = await rt.open("agents/x")
    await nobody.add_message("user", "hello")
    await rt.create_branch("claimed")
    await (await rt.open("agents/x", view_reader="ann", branch="claimed")).aclose()
    before = snapshot(rt)
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.switch_branch("claimed")
    ann = await rt.open("agents/x", view_reader="ann")  # claims main under the manager for no reader
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.fork("nobody-fork")
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.set_strategy(Passthrough())
    assert snapshot(rt)[2] == before[2], "the fork was refused before it made its branch"
    assert nobody.branch == "main" and ann.view_reader == "ann"


async def test_every_request_of_a_manager_opened_before_the_claim_is_refused_from_the_claim_on(rt: Runtime) -> None:
    """C8: compile, preview, tick, is_ready, edit and summary reads of a manager with no reader are refused once another reader claims."""
    nobody = await rt.open("agents/x", strategy=memory(), model=ScriptedModel(echo_markers))
    mid = await nobody.add_message("user", [words(0)])
    await nobody.compile(BIG)
    await nobody.tick()
    await rt.open("agents/x", view_reader="ann")
    calls = [
        lambda: nobody.compile(BIG),
        lambda: nobody.preview_context(BIG),
        lambda: nobody.tick(),
        lambda: nobody.is_ready(),
        lambda: nobody.wait_ready(),
        lambda: nobody.edit_message(mid, [words(1)]),
        lambda: nobody.search_summaries(),
        lambda: nobody.get_summaries_in_range(),
        lambda: nobody.get_summary("L1-0"),
        lambda: nobody.set_strategy(memory()),
    ]
    for call in calls:
        with pytest.raises(ctxrt.ReaderConflictError):
            await call()
    assert (await nobody.get_message(mid)).content == (Text(words(0)["text"]),)  # type: ignore[union-attr]


async def test_every_read_through_a_view_a_strategy_kept_is_refused_after_the_claim(rt: Runtime) -> None:
    """C8: each read through the view a strategy holds is answered before a claim and refused after it."""
    probe = Probe()
    nobody = await rt.open("agents/x", strategy=probe)
    mid = await nobody.add_message("user", "hello")
    await nobody.compile(BIG)
    view = next(v for kind, v in reversed(probe.log) if kind == "select")
    reads = [
        lambda: view.get_all(), lambda: view.get(mid), lambda: view.sequence_of(mid), lambda: view.get_from(0),
        lambda: view.get_tail(1), lambda: view.length(),
    ]
    for read in reads:
        read()
    await rt.open("agents/x", view_reader="ann")
    for read in reads:
        with pytest.raises(ctxrt.ReaderConflictError):
            read()
    selected = selects(probe)
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.compile(BIG)
    assert selects(probe) == selected, "refused before the strategy's select runs"


async def test_a_compression_waiting_on_its_model_when_a_claim_lands_writes_nothing(
    rt: Runtime, caplog: pytest.LogCaptureFixture,
) -> None:
    """C9: a drain's request out when the claim lands writes no summary; nothing more is asked for the old view."""
    released = trio.Event()
    stale: list[ctxrt.ModelRequest] = []

    async def responder(request: ctxrt.ModelRequest) -> str:
        if not stale:
            stale.append(request)
            await released.wait()
            return "STALE-ONLY-0 written for the unclaimed view"
        return echo_markers(request)

    model = ScriptedModel(responder)
    config = memory(auto_tick=True, l1_holdback_chunks=1)
    with trio.fail_after(GUARD_S):
        nobody = await rt.open("agents/s", strategy=config, model=model)
        for i in range(30):  # every message holds a marker for ann, hidden from the view for no reader
            await nobody.add_message("user", [block(f"ANN-ONLY-{i}", "ann"), words(i)])
        await wait_until(lambda: bool(stale))
        assert "ANN-ONLY" not in request_text(stale[0]), "the premise: that request is the no-reader view's"
        asked_before_claim = len(model.requests)
        ann = await rt.open("agents/s", view_reader="ann")
        with caplog.at_level(logging.WARNING, logger="ctxrt.namespace"):
            released.set()
            await wait_until(lambda: len(model.requests) > asked_before_claim or any(
                "discarded the reply" in r.getMessage() for r in caplog.records))
            await ann.wait_ready()
    assert any("discarded the reply" in r.getMessage() for r in caplog.records), "the stale reply was discarded, logged"
    assert not await ann.search_summaries(regex="STALE", include_merged=True, limit=1000)
    assert "STALE" not in body_json(await ann.compile(BIG))
    later = model.requests[asked_before_claim:]
    assert later, "compression went on, for ann's view"
    for request in later:
        text = request_text(request)
        for i in re.findall(r"Message (\d+)\.", text):
            assert f"ANN-ONLY-{i}" in text, "every later request reads ann's view, never the old one"
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.tick()


async def test_summary_reads_of_a_manager_whose_reader_no_longer_matches_are_refused(rt: Runtime) -> None:
    """C10: search_summaries, get_summaries_in_range and get_summary by a stale manager are refused, not answered."""
    model = ScriptedModel(echo_markers)
    nobody = await rt.open("agents/s", strategy=memory(), model=model)
    assert await nobody.search_summaries() == [] and await nobody.get_summaries_in_range() == []
    ann = await rt.open("agents/s", view_reader="ann")
    for i in range(30):
        await ann.add_message("user", ann_every_third(i))
    await ann.wait_ready()
    found = await ann.search_summaries(regex="ANN-ONLY", limit=1000)
    assert found, "the premise: ann has summaries holding her blocks"
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.search_summaries(regex="ANN-ONLY")
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.get_summaries_in_range()
    with pytest.raises(ctxrt.ReaderConflictError):
        await nobody.get_summary(found[0].summary.id)


async def test_derive_records_the_parents_reader_on_the_child_which_compiles_for_it_live_and_reopened(
    rt: Runtime,
) -> None:
    """C11: derive records the parent's reader on the child's branch; the child compiles for it, live and after reopen_derived."""
    ann = await rt.open("agents/x", view_reader="ann")
    await ann.add_message("user", [block("plain"), block("ann's", "ann")])
    child = await ann.derive(branch="child")
    assert value_of(rt, "agents/x/reader", "child") == "ann"
    assert child.view_reader == "ann" and child.derivation is not None and child.derivation.reader == "ann"
    assert compiled_texts(await child.compile(BIG)) == ["plain", "ann's"]
    derivation = ctxrt.Derivation(**json.loads(json.dumps(attrs.asdict(child.derivation))))
    await child.aclose()
    reopened = await rt.reopen_derived(derivation)
    assert reopened.view_reader == "ann"
    assert compiled_texts(await reopened.compile(BIG)) == ["plain", "ann's"]


async def test_a_child_of_a_manager_for_no_reader_records_what_the_head_records(rt: Runtime) -> None:
    """C11: a child of a manager compiling for no reader records the head's record, a reader or none, whatever the checkpoint held."""
    free = await rt.open("agents/free")
    await free.add_message("user", "hello")
    free_child = await free.derive(branch="free-child")
    assert free_child.view_reader is None and value_of(rt, "agents/free/reader", "free-child") is None

    stale = await rt.open("agents/x")  # opened before the claim: compiles for no reader
    early = rt.engine.last_sequence
    ann = await rt.open("agents/x", view_reader="ann")
    await ann.add_message("user", [block("plain"), block("ann's", "ann")])
    child = await stale.derive(branch="inspection", at_sequence=early)  # from before the first record
    assert value_of(rt, "agents/x/reader", "inspection") == "ann"
    assert child.view_reader == "ann"
    resolved = await rt.open("agents/x")  # opened with no reader after the claim: compiles for ann
    resolved_child = await resolved.derive(branch="resolved-child")
    assert resolved_child.view_reader == "ann"
    assert compiled_texts(await resolved_child.compile(BIG)) == ["hello", "plain", "ann's"]
    await resolved_child.aclose()
    reopened = await rt.reopen_derived(resolved_child.derivation)  # type: ignore[arg-type]
    assert reopened.view_reader == "ann"


async def test_a_child_made_at_a_checkpoint_that_recorded_a_reader_records_the_heads_cleared_record(
    rt: Runtime,
) -> None:
    """C11 (seed 000: "records on a child what the namespace records at the parent's head, a cleared
    record included"): the head records no reader any more, the checkpoint recorded ann; the child
    records none, so it compiles for no reader and another reader may claim it."""
    ann = await rt.open("agents/x", view_reader="ann")
    await ann.add_message("user", "plain")
    checkpoint = rt.engine.last_sequence
    await ann.aclose()
    await rt.store.ask(SetValue(state="agents/x/reader", branch="main", value=None))  # the head's record cleared
    free = await rt.open("agents/x")
    assert free.view_reader is None
    child = await free.derive(branch="from-the-checkpoint", at_sequence=checkpoint)
    assert value_of(rt, "agents/x/reader", "from-the-checkpoint") is None
    assert child.view_reader is None
    await child.aclose()
    bob = await rt.open("agents/x", view_reader="bob", branch="from-the-checkpoint")
    assert compiled_texts(await bob.compile(BIG)) == ["plain"]


async def test_derive_after_close_or_a_failed_strategy_start_is_refused_writing_nothing(rt: Runtime) -> None:
    """C12 (the seed's probe): derive and fork after aclose() or a failed strategy start are refused, writing nothing."""
    owner = await rt.open("agents/owner")
    await owner.add_message("user", "Hello.")
    closed = await rt.open("agents/x", view_reader="ann")
    await closed.add_message("user", "Hello again.")
    await closed.aclose()
    fenced = await rt.open("agents/y", view_reader="ann")
    await fenced.add_message("user", "Before.")
    with pytest.raises(ctxrt.StrategyRefusedError, match="initialize failed"):
        await fenced.set_strategy(Probe(fail_on=""))  # refused: the namespace keeps its strategy
    await fenced.aclose()
    fenced = await rt.open("agents/y", view_reader="ann", strategy=Probe(fail_on=""))  # fails to start: kept
    await refused_for_its_failed_strategy(fenced)
    before = snapshot(rt)
    with pytest.raises(ctxrt.ManagerClosedError):
        await closed.fork("after-close-fork")
    with pytest.raises(ctxrt.ManagerClosedError):
        await closed.derive(branch="after-close-derive", strategy=Passthrough())
    with pytest.raises(ctxrt.StrategyRefusedError):
        await fenced.fork("fenced-fork")
    with pytest.raises(ctxrt.StrategyRefusedError):
        await fenced.derive(branch="fenced-derive", strategy=Passthrough())
    assert snapshot(rt) == before
    assert value_of(rt, "agents/x/reader", "main") == "ann"


async def test_racing_opens_for_five_readers_record_exactly_one_claim_and_refuse_the_rest(rt: Runtime) -> None:
    """C13: 200 concurrent opens for 5 readers on an unclaimed namespace: one claim, every other reader refused, nothing else written."""
    await (await rt.open("agents/race")).aclose()  # registers the namespace's states, claims nothing
    before = snapshot(rt)
    outcomes: list[tuple[str, Any]] = []

    async def open_for(reader: str) -> None:
        try:
            outcomes.append((reader, await rt.open("agents/race", view_reader=reader)))
        except ctxrt.CtxrtError as exc:
            outcomes.append((reader, exc))

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(open_for, f"reader-{i % 5}")
    winners = {reader for reader, outcome in outcomes if isinstance(outcome, ctxrt.ContextManager)}
    assert len(winners) == 1
    (winner,) = winners
    refused = [(r, o) for r, o in outcomes if not isinstance(o, ctxrt.ContextManager)]
    assert len(refused) == 160 and {r for r, _ in refused} == {f"reader-{i}" for i in range(5)} - {winner}
    assert all(isinstance(o, ctxrt.ReaderConflictError) for _, o in refused)
    assert [(n.namespace, n.reader) for n in await rt.list_namespaces()] == [("agents/race", winner)]
    after = snapshot(rt)
    assert after[1:] == before[1:] and after[0] == before[0] + 1, "the claim is the only write"


async def test_summaries_written_before_a_reader_claims_are_kept_and_used(rt: Runtime) -> None:
    """C14: summaries a manager for no reader wrote before the claim stay, and the claiming reader's compiles use them."""
    model = ScriptedModel(lambda request: "EARLY-SUMMARY " + "remembered " * 30)
    nobody = await rt.open("agents/s", strategy=memory(), model=model)
    for i in range(20):
        await nobody.add_message("user", [words(i)])
    await nobody.wait_ready()
    await nobody.aclose()
    ann = await rt.open("agents/s", view_reader="ann", strategy=memory(), model=model)
    assert await ann.search_summaries(text="EARLY-SUMMARY", limit=100)
    assert "EARLY-SUMMARY" in body_json(await ann.compile(BIG))


# --------------------------------------------------------------------------------------------
# D. Narrowing an audience after compression
# --------------------------------------------------------------------------------------------


def test_narrowing_is_hiding_a_block_in_place_from_a_reader_who_saw_it() -> None:
    """D1: blocks are compared by position, over the positions both versions hold; an audience given or a name taken hides, a widening, a text edit or a block left out (a deletion) doesn't."""
    plain, ann, both = Text("x"), Text("x", audience=("ann",)), Text("x", audience=("ann", "bob"))
    assert hidden_by_edit((plain,), (Text("y"),)) == (frozenset(), False)  # hides nothing
    assert hidden_by_edit((ann,), (both,)) == (frozenset(), False)  # widens
    assert hidden_by_edit((ann,), (plain,)) == (frozenset(), False)  # widens to everyone
    assert hidden_by_edit((both,), (ann,)) == (frozenset({"bob"}), False)  # a name taken out
    assert hidden_by_edit((plain,), (ann,)) == (frozenset(), True)  # an audience given: hidden from the rest
    # Over the positions both versions hold: a block left out is a deletion, never a narrowing.
    assert hidden_by_edit((plain, both), (plain,)) == (frozenset(), False)  # left out
    assert hidden_by_edit((ann, both), ()) == (frozenset(), False)  # every block left out
    # Compared by position: a block moved up is judged where it lands (here an audience given
    # to the first position); the block left out at the end is a deletion.
    assert hidden_by_edit((plain, both), (both,)) == (frozenset(), True)
    assert hidden_by_edit((both, plain), (plain,)) == (frozenset(), False)  # widens position 0; no name taken
    assert hidden_by_edit((both, plain), (ann,)) == (frozenset({"bob"}), False)
    assert hidden_by_edit((plain,), (plain, ann)) == (frozenset(), False)  # a block added hides nothing


async def test_widening_a_text_edit_and_removals_go_through_after_compression(rt: Runtime) -> None:
    """D1: below the floor, an edit that hides nothing, widens or leaves blocks out (a deletion) goes through, and remove_message(s) are never refused."""
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=ScriptedModel(echo_markers))
    ids = [await ann.add_message("user", [block("ann's", "ann"), words(i)]) for i in range(20)]
    await ann.wait_ready()
    floor = value_of(rt, "agents/ann/narrowing-floor")
    assert floor >= int(ids[7]), "the premise: compression has read the first messages"
    await ann.edit_message(ids[0], [block("ann's", "ann", "bob"), words(0)])
    await ann.edit_message(ids[1], [block("ann's"), words(1)])
    await ann.edit_message(ids[2], [block("ann's, reworded", "ann"), words(2)])
    await ann.remove_message(ids[3])
    await ann.remove_messages(ids[4], ids[5])
    await ann.edit_message(ids[6], [block("ann's", "ann")])  # the plain block left out: a deletion
    await ann.edit_message(ids[7], [words(7)])  # ann's block left out: a deletion, like a removal
    stored = {m.id: m for m in await ann.get_all_messages()}
    assert stored[ids[0]].content[0].audience == ("ann", "bob")
    assert stored[ids[1]].content[0].audience is None
    assert stored[ids[2]].content[0].text == "ann's, reworded"
    assert not {ids[3], ids[4], ids[5]} & set(stored)
    assert [(b.text, b.audience) for b in stored[ids[6]].content] == [("ann's", ("ann",))]
    assert [(b.text, b.audience) for b in stored[ids[7]].content] == [(words(7)["text"], None)]


async def test_the_floor_rises_as_chunks_close_before_any_request_and_never_lowers(rt: Runtime) -> None:
    """D2: <ns>/narrowing-floor rises to a closing chunk's last sequence before any request; a later, older mark keeps it."""
    model = ScriptedModel(echo_markers)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=model)
    ids = [await ann.add_message("user", [words(i)]) for i in range(12)]
    assert value_of(rt, "agents/ann/narrowing-floor") is None
    await ann.compile(BIG)  # chunks close as the strategy sees the messages; nothing is asked yet
    floor = value_of(rt, "agents/ann/narrowing-floor")
    assert model.requests == []
    assert floor is not None and int(ids[3]) <= floor <= int(ids[-1])
    assert [n.narrowing_floor for n in await rt.list_namespaces() if n.namespace == "agents/ann"] == [floor]

    marks = Probe(mark_on_select=(40, 7))
    probe = await rt.open("agents/p", view_reader="ann", strategy=marks)
    await probe.compile(BIG)
    assert value_of(rt, "agents/p/narrowing-floor") == 40


async def test_every_compression_request_is_covered_by_the_floor_when_it_is_sent(rt: Runtime) -> None:
    """D2: the floor covers every message a chunk, a merge or a transition request reads by the time the request is sent."""
    sequence_of: dict[str, int] = {}
    uncovered: list[str] = []

    def responder(request: ctxrt.ModelRequest) -> str:
        floor = value_of(rt, "agents/ann/narrowing-floor") or 0
        read = [sequence_of[i] for i in re.findall(r"Message (\d+)\.", request_text(request)) if i in sequence_of]
        if read and max(read) > floor:
            uncovered.append(f"floor {floor} < {max(read)}")
        return echo_markers(request)

    model = ScriptedModel(responder)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(merge_threshold=3), model=model)
    for i in range(40):
        sequence_of[str(i)] = int(await ann.add_message("user", [words(i)]))
    await ann.wait_ready()
    assert any(s.summary.level == 2 for s in await ann.search_summaries(limit=1000, include_merged=True))
    for i in range(40, 46):
        sequence_of[str(i)] = int(await ann.add_message("user", [words(i)]))
    await ann.reset_head_window()
    assert len(model.requests) > 5 and uncovered == []
    assert value_of(rt, "agents/ann/narrowing-floor") >= sequence_of["45"]


async def test_narrowing_away_from_the_reader_is_refused_once_compression_may_have_read_it(rt: Runtime) -> None:
    """D3: an edit hiding a block from the manager's own reader is refused at or below the floor (a closed chunk, no request yet); newer goes through."""
    model = ScriptedModel(echo_markers)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=model)
    ids = [await ann.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(12)]
    await ann.compile(BIG)
    assert model.requests == [], "the premise: only chunks closed"
    floor = value_of(rt, "agents/ann/narrowing-floor")
    assert floor is not None and floor >= int(ids[3])
    before = await ann.get_message(ids[0])
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await ann.edit_message(ids[0], narrowed(0))  # ann's name taken out, the block kept for cy
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await ann.edit_message(ids[1], [words(1), block("ANN-ONLY-1", "bob")])  # ann's name taken out, for bob
    assert await ann.get_message(ids[0]) == before
    sibling = await rt.open("agents/ann")  # another manager on the namespace (it compiles for ann)
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await sibling.edit_message(ids[2], narrowed(2))
    newer = await ann.add_message("user", [words(99), block("ANN-ONLY-new", "ann")])
    await ann.edit_message(newer, [words(99), block("ANN-ONLY-new", "cy")])  # newer than anything compression read
    assert (await ann.get_message(newer)).content == (  # type: ignore[union-attr]
        Text(words(99)["text"]), Text("ANN-ONLY-new", audience=("cy",)))


async def test_chunks_close_at_the_first_compile_not_as_the_strategy_starts(rt: Runtime) -> None:
    """D2, D3 (docs/audience.md, "When chunks close"): an Autobiographical namespace opened over
    messages another namespace added writes no floor as its strategy starts, so a narrowing right
    after the open goes through (no compression can have read the message); its first compile
    closes the chunks and raises the floor, and the same narrowing is refused from then on."""
    writer = await rt.open("agents/writer")
    ids = [await writer.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(12)]
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=ScriptedModel(echo_markers))
    assert value_of(rt, "agents/ann/narrowing-floor") is None
    assert not await ann.is_ready()  # chunks wait to close
    await ann.edit_message(ids[0], narrowed(0))
    await ann.compile(BIG)
    floor = value_of(rt, "agents/ann/narrowing-floor")
    assert floor is not None and floor >= int(ids[3])
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await ann.edit_message(ids[1], narrowed(1))


async def test_narrowing_is_refused_while_a_request_is_out_and_after_one_that_wrote_no_summary(rt: Runtime) -> None:
    """D3: narrowing is refused while a compression request that may carry the message is out, and after it wrote no summary, reopened too."""
    released = trio.Event()
    asked = trio.Event()

    async def responder(request: ctxrt.ModelRequest) -> ctxrt.ModelResponse:
        asked.set()
        await released.wait()
        return ctxrt.ModelResponse((Text("cut off"),), "max_tokens", ctxrt.Usage(1, 1))  # no summary (T4)

    model = ScriptedModel(responder)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=model)
    ids = [await ann.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(12)]
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ann.tick)
            await asked.wait()
            with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
                await ann.edit_message(ids[0], narrowed(0))
            released.set()
    assert await ann.search_summaries() == [], "the premise: the request wrote no summary"
    await ann.aclose()
    reopened = await rt.open("agents/ann", view_reader="ann")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await reopened.edit_message(ids[0], narrowed(0))
    assert (await reopened.get_message(ids[0])).content[1].audience == ("ann",)  # type: ignore[union-attr]


async def test_narrowing_is_decided_on_each_branch_by_its_own_compression(rt: Runtime) -> None:
    """D3: a branch made before compression read a message lets it be narrowed; the branch where compression read it refuses."""
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=ScriptedModel(echo_markers))
    ids = [await ann.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(12)]
    await rt.create_branch("early")  # nothing has closed a chunk yet
    await ann.compile(BIG)
    with pytest.raises(ctxrt.NarrowingRefusedError):
        await ann.edit_message(ids[0], narrowed(0))
    early = await rt.open("agents/ann", view_reader="ann", branch="early", strategy=Passthrough())
    await early.edit_message(ids[0], narrowed(0))
    assert (await early.get_message(ids[0])).content == (  # type: ignore[union-attr]
        Text(words(0)["text"]), Text("ANN-ONLY-0", audience=("cy",)))
    assert (await ann.get_message(ids[0])).content[1].audience == ("ann",)  # type: ignore[union-attr]


async def test_narrowing_a_head_message_older_than_a_closed_chunk_is_refused(rt: Runtime) -> None:
    """D3: a head-window message, never in a chunk, is refused once a later chunk has closed (it is below the floor)."""
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(head_window_tokens=200),
                        model=ScriptedModel(echo_markers))
    ids = [await ann.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(14)]
    await ann.compile(BIG)
    chunked = [i for c in chunk_records(rt, "agents/ann") for i in json.loads(bytes(c.data))["ids"]]
    assert ids[0] not in chunked, "the premise: it is in the head"
    assert chunk_records(rt, "agents/ann"), "the premise: a later chunk closed"
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await ann.edit_message(ids[0], narrowed(0))


async def test_the_floor_refuses_narrowing_across_reopen_strategy_switch_fork_and_derive(rt: Runtime) -> None:
    """D3: the floor holds across a reopen, a switch to Passthrough, a fork and a derive; the message stays as it was."""
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=ScriptedModel(echo_markers))
    ids = [await ann.add_message("user", [words(i), block(f"ANN-ONLY-{i}", "ann")]) for i in range(12)]
    await ann.compile(BIG)
    await ann.aclose()

    reopened = await rt.open("agents/ann", view_reader="ann")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await reopened.edit_message(ids[0], narrowed(0))
    await reopened.set_strategy(Passthrough())  # keeps no summaries
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await reopened.edit_message(ids[0], narrowed(0))
    child = await reopened.derive(branch="derived")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await child.edit_message(ids[0], narrowed(0))
    await reopened.fork("forked")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="compression may"):
        await reopened.edit_message(ids[0], narrowed(0))
    for branch in ("main", "derived", "forked"):
        other = await rt.open("agents/reader-of-" + branch, branch=branch)
        stored = await other.get_message(ids[0])
        assert stored is not None and stored.content[1].audience == ("ann",)


async def test_while_a_floor_raise_fails_no_request_goes_out_and_chunks_wait(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D4: while the store refuses the floor (injected), no compression request is sent and no chunk closes; compiles still answer."""
    model = ScriptedModel(echo_markers)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(), model=model)
    for i in range(12):
        await ann.add_message("user", [block(f"ANN-ONLY-{i}", "ann"), words(i)])
    failing = fail_floor_writes(rt, monkeypatch)
    for _ in range(3):
        with pytest.raises(lmdb.MapFullError):
            await ann.tick()
    assert model.requests == []
    assert chunk_records(rt, "agents/ann") == []
    assert not await ann.is_ready(), "its chunks wait, pending"
    failing[0] = False
    await ann.wait_ready()
    assert model.requests, "once a raise succeeds, requests go out"
    assert value_of(rt, "agents/ann/narrowing-floor") is not None


def chunk_records(rt: Runtime, namespace: str) -> list[Any]:
    """The chunks Autobiographical persisted for ``namespace`` on main."""
    engine = rt.engine
    state = f"{namespace}/autobio:chunks"
    if not engine.has_state(state):
        return []
    return engine.read_log(state, engine.branch("main").id)


async def test_a_transition_summary_whose_read_cannot_be_recorded_makes_no_request(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D4: reset_head_window() makes no request while the floor can't be raised over the head it would read (injected)."""
    model = ScriptedModel(echo_markers)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(target_chunk_tokens=100_000), model=model)
    for i in range(6):
        await ann.add_message("user", [words(i)])
    await ann.compile(BIG)
    count = await ann.message_count()
    fail_floor_writes(rt, monkeypatch)
    with pytest.raises(lmdb.MapFullError):
        await ann.reset_head_window()
    assert model.requests == []
    assert await ann.message_count() == count


async def test_narrowing_away_from_another_reader_or_by_a_manager_for_no_reader_is_always_refused(
    rt: Runtime,
) -> None:
    """D5: hiding a block from any other reader is refused whatever the floor; a manager for no reader may only widen."""
    ann = await rt.open("agents/ann", view_reader="ann")  # Passthrough: its floor stays 0
    mid = await ann.add_message("user", [block("both", "ann", "bob"), block("plain")])
    with pytest.raises(ctxrt.NarrowingRefusedError, match="'bob'"):
        await ann.edit_message(mid, [block("both", "ann"), block("plain")])
    with pytest.raises(ctxrt.NarrowingRefusedError):
        await ann.edit_message(mid, [block("both", "ann", "bob"), block("plain", "ann")])
    nobody = await rt.open("agents/nobody")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="no reader"):
        await nobody.edit_message(mid, [block("both", "ann"), block("plain")])
    with pytest.raises(ctxrt.NarrowingRefusedError):  # an audience given: hidden from the no-reader view
        await nobody.edit_message(mid, [block("both", "ann", "bob"), block("plain", "cy")])
    await nobody.edit_message(mid, [block("both", "ann", "bob", "cy"), block("plain")])  # widens
    await ann.edit_message(mid, [block("both", "ann", "bob", "cy"), block("plain, reworded")])  # hides nothing
    stored = await ann.get_message(mid)
    assert [(b.text, b.audience) for b in stored.content] == [  # type: ignore[union-attr]
        ("both", ("ann", "bob", "cy")), ("plain, reworded", None)]
    other = await ann.add_message("user", [block("kept"), block("for bob", "bob")])
    await nobody.edit_message(other, [block("kept")])  # bob's block left out: a deletion, never refused (D1)
    assert (await nobody.get_message(other)).content == (Text("kept"),)  # type: ignore[union-attr]


async def test_narrowing_away_from_the_reader_is_refused_where_another_namespace_records_it_or_an_unreadable_record(
    rt: Runtime,
) -> None:
    """D5: hiding from the own reader is refused while another namespace on the branch records the same reader, or a record that can't be read."""
    ann = await rt.open("agents/ann", view_reader="ann")
    first = await ann.add_message("user", [block("plain"), block("mine", "ann")])
    second = await ann.add_message("user", [block("plain"), block("mine", "ann")])
    third = await ann.add_message("user", [block("plain"), block("mine", "ann")])
    hidden_from_ann = [block("plain"), block("mine", "cy")]  # ann's name taken out, in place
    await ann.edit_message(first, hidden_from_ann)  # the control: goes through while no one else records ann
    twin = await rt.open("agents/ann-too", view_reader="ann")
    with pytest.raises(ctxrt.NarrowingRefusedError, match="another namespace"):
        await ann.edit_message(second, hidden_from_ann)
    await twin.aclose()
    await rt.store.ask(RegisterState(name="agents/odd/reader", kind="value"))
    await rt.store.ask(SetValue(state="agents/odd/reader", branch="main", value=["not", "a", "name"]))
    with pytest.raises(ctxrt.NarrowingRefusedError):
        await ann.edit_message(third, hidden_from_ann)
    stored = await ann.get_message(third)
    assert stored is not None and stored.content[1].audience == ("ann",)


async def test_narrowing_is_refused_when_the_floor_cannot_be_read(rt: Runtime) -> None:
    """D5: an edit hiding a block from the own reader is refused when <ns>/narrowing-floor holds something that isn't a sequence."""
    ann = await rt.open("agents/ann", view_reader="ann")
    mid = await ann.add_message("user", [block("plain"), block("mine", "ann")])
    await rt.store.ask(SetValue(state="agents/ann/narrowing-floor", branch="main", value="garbage"))
    with pytest.raises(ctxrt.NarrowingRefusedError, match="can't be read"):
        await ann.edit_message(mid, [block("plain"), block("mine", "cy")])  # ann's name taken out, in place
    assert (await ann.get_message(mid)).content[1].audience == ("ann",)  # type: ignore[union-attr]


async def test_a_reader_refuses_a_strategy_that_does_not_mark_compression_reads_before_handing_it_anything(
    rt: Runtime,
) -> None:
    """D6: under a reader, set_strategy (keeping the old), derive, open and reopen_derived refuse a non-marking strategy untouched."""
    unmarked = Probe(marks=False)
    ann = await rt.open("agents/ann", view_reader="ann")
    await ann.add_message("user", "hello")
    with pytest.raises(ctxrt.StrategyRefusedError, match="marks_compression_reads"):
        await ann.set_strategy(unmarked)
    assert ann.strategy == Passthrough() and compiled_texts(await ann.compile(BIG)) == ["hello"]
    before = snapshot(rt)
    with pytest.raises(ctxrt.StrategyRefusedError):
        await ann.derive(branch="child", strategy=unmarked)
    with pytest.raises(ctxrt.StrategyRefusedError):
        await rt.open("agents/fresh", view_reader="ann", strategy=unmarked)
    assert snapshot(rt) == before
    child = await ann.derive(branch="child")
    derivation = child.derivation
    await child.aclose()
    with pytest.raises(ctxrt.StrategyRefusedError):
        await rt.reopen_derived(derivation, strategy=unmarked)  # type: ignore[arg-type]
    assert unmarked.log == [], "the strategy was handed nothing"
    free = await rt.open("agents/free", strategy=unmarked)  # no reader: runs it
    assert compiled_texts(await free.compile(BIG)) == ["hello"]
    assert ("initialize", "main") in unmarked.log


async def test_a_manager_for_no_reader_writes_no_floor(rt: Runtime) -> None:
    """D7: compression under a manager compiling for no reader writes no narrowing floor."""
    model = ScriptedModel(echo_markers)
    nobody = await rt.open("agents/s", strategy=memory(), model=model)
    for i in range(20):
        await nobody.add_message("user", [words(i)])
    await nobody.wait_ready()
    assert model.requests
    never = object()
    assert rt.engine.read_value("agents/s/narrowing-floor", rt.engine.branch("main").id, never) is never
    assert [n.narrowing_floor for n in await rt.list_namespaces()] == [0]


async def test_a_transition_summary_made_from_a_readers_view_is_stored_for_that_reader(rt: Runtime) -> None:
    """D8: reset_head_window() under a reader stores the made summary with the reader's audience; host text is stored as given."""
    model = ScriptedModel(echo_markers)
    ann = await rt.open("agents/ann", view_reader="ann", strategy=memory(target_chunk_tokens=100_000), model=model)
    for i in range(4):
        await ann.add_message("user", [block(f"ANN-ONLY-{i}", "ann"), words(i)])
    made = await ann.reset_head_window()
    stored = await ann.get_message(made)
    assert stored is not None and [b.audience for b in stored.content] == [("ann",)]
    assert "ANN-ONLY-0" in stored.content[0].text
    given = await ann.reset_head_window("the host's own words")
    stored = await ann.get_message(given)
    assert stored is not None and [b.audience for b in stored.content] == [None]
    assert stored.content[0].text.endswith("the host's own words")
    bob = await rt.open("agents/bob", view_reader="bob")
    assert "ANN-ONLY" not in body_json(await bob.compile(BIG))


# --------------------------------------------------------------------------------------------
# E. A store with no audience block
# --------------------------------------------------------------------------------------------


async def test_a_view_is_the_plain_view_until_an_audience_block_is_stored_in_its_slot(rt: Runtime) -> None:
    """E1: may_hold_audience is False until a block with an audience is stored; until then the reader view is the slot's list, projecting nothing."""
    ann = await rt.open("agents/ann", view_reader="ann")
    for i in range(10):
        await ann.add_message("user", f"plain {i}")
    cache = rt.slots.cache("messages", rt.engine.branch("main").id)
    assert (await ann.inspect()).caches[0] == cache.figures()
    assert cache.may_hold_audience is False
    await ann.compile(BIG)
    listing = (await ann.inspect()).reader_listing
    assert listing.projected == 0 and listing.shared
    # The shared projection ann's actor reads passes the cache's own list through.
    assert shared_reader_listing(cache, "ann").window(FULL).messages is cache.current()
    await ann.add_message("user", [block("bob's", "bob"), block("plain 10")])
    assert cache.may_hold_audience is True
    result = await ann.compile(BIG)
    assert (await ann.inspect()).reader_listing.projected == 11
    assert compiled_texts(result)[-1] == "plain 10"


async def test_once_any_manager_stores_an_audience_block_every_view_over_the_slot_takes_the_readers_view(
    rt: Runtime,
) -> None:
    """E2: an audience block stored by one manager turns every view over that slot into the reader's view."""
    ann = await rt.open("agents/ann", view_reader="ann")
    nobody = await rt.open("agents/nobody")
    isolated = await rt.open("agents/own", view_reader="ann", isolate=True)
    await ann.add_message("user", "plain")
    await isolated.add_message("user", "own slot")
    await ann.compile(BIG)
    await isolated.compile(BIG)
    assert await projected(ann) == 0
    await nobody.add_message("user", [block("ANN-ONLY-0", "ann"), block("BOB-ONLY-0", "bob")])
    assert compiled_texts(await ann.compile(BIG)) == ["plain", "ANN-ONLY-0"]
    assert compiled_texts(await nobody.compile(BIG)) == ["plain"]
    assert await projected(ann) > 0 and await projected(nobody) > 0
    await isolated.compile(BIG)
    assert await projected(isolated) == 0, "a slot with no audience block keeps the plain view"


async def projected(manager: ctxrt.ContextManager) -> int:
    """How many messages the manager's namespace actor has projected into its reader's view (E1, F3)."""
    return (await manager.inspect()).reader_listing.projected


def e3_content(i: int) -> Any:
    """Message ``i`` of the E3 run: prose, a tool cycle now and then; no audience anywhere."""
    if i % 25 == 7:
        return [block(f"Looking it up ({i})."), {"type": "tool_use", "id": f"tool-{i}", "name": "search",
                                                   "input": {"q": f"topic {i}"}}]
    if i % 25 == 8:
        return [{"type": "tool_result", "tool_use_id": f"tool-{i - 1}", "content": f"result {i} " * 12}]
    return f"Turn {i}: " + " ".join(f"word{(i * 7 + k) % 97}" for k in range(30 + i % 40))


async def e3_run(path: Path) -> tuple[str, int, int]:
    """A long scripted run with no reader and no audience: (sha256 of every compile and request, compiles, requests)."""
    model = ScriptedModel(lambda r: "Summary: " + " ".join(re.findall(r"Turn \d+", request_text(r))[:40]))
    digest = hashlib.sha256()
    compiles = 0
    async with ctxrt.open_runtime(path, durability="os", model=model) as runtime:
        config = Autobiographical("e3-model", target_chunk_tokens=600, recent_window_tokens=1500,
                                  head_window_tokens=300, merge_threshold=4)
        manager = await runtime.open("agents/e3", strategy=config)
        side = await runtime.open("agents/side")
        for i in range(300):
            participant = "Claude" if i % 25 == 7 or i % 2 else "user"
            if i % 25 == 8:
                participant = "user"
            target = side if i % 50 == 49 else manager
            await target.add_message(participant, e3_content(i), timestamp_ms=1_700_000_000_000 + i * 1000)
            if i % 10 == 9:
                for budget in (Budget(max_tokens=6000, reserve_for_response=500), BIG):
                    digest.update(body_json(await manager.compile(budget)).encode())
                    compiles += 1
                await manager.wait_ready()
        await manager.reset_head_window()
        digest.update(body_json(await manager.compile(BIG)).encode())
        compiles += 1
    for request in model.requests:
        digest.update(request_json(request).encode())
    return digest.hexdigest(), compiles, len(model.requests)


async def test_with_no_reader_and_no_audience_compiles_and_requests_are_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """E3: with no reader and no audience, every compile and model request is byte-identical to a run with the feature off, and to the recorded hash."""
    on = await e3_run(tmp_path / "on")
    with monkeypatch.context() as off:
        off.setattr(ctxrt.views.ReaderListing, "window", lambda self, count: self.source.window(count))
        off.setattr(ctxrt.views, "content_for_reader", lambda blocks, reader: tuple(blocks))
        off.setattr(ctxrt.namespace.core, "content_for_reader", lambda blocks, reader: tuple(blocks))
        switched_off = await e3_run(tmp_path / "off")
    assert on[1] == 61 and on[2] > 20, "the premise: a long run with compression"
    assert on == switched_off
    recorded = [line.strip() for line in E3_HASH_FILE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert recorded == [on[0]], f"E3 bytes changed: the run now hashes to {on[0]} ({E3_HASH_FILE})"
