"""Channels (M11): ``query_messages(channel=)``, ``channel_counts()`` and ``channel_token_stats()``,
served by the slot's stored channel index (K10), on both engines."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import ChannelTokens, Message, Passthrough, Text, content_for_reader
from ctxrt.testing import (
    AppendItem,
    EditItem,
    RemoveItems,
    SlotCache,
    channel_key,
    estimate_blocks,
    index_state,
    prepare_append,
    verify,
)


@pytest.fixture(params=["lmdb", "postgres"])
def store(request: pytest.FixtureRequest, store_path: Path) -> str:
    """A fresh store on each engine: a directory, or a database's URL."""
    return str(store_path) if request.param == "lmdb" else request.getfixturevalue("pg_url")


@pytest.fixture
async def rt(store: str) -> AsyncIterator[ctxrt.Runtime]:
    async with ctxrt.open_runtime(store, durability="os") as runtime:
        yield runtime


async def cache_of(rt: ctxrt.Runtime, manager: ctxrt.ContextManager) -> SlotCache:
    """The slot cache ``manager`` reads (``inspect()`` names it)."""
    figures = (await manager.inspect()).caches[0]
    return rt.slots.cache(figures.state, figures.branch_id)


def top(channel: str, **more: Any) -> dict[str, Any]:
    return {"channel_id": channel, **more}


def external(channel: str, **more: Any) -> dict[str, Any]:
    return {"external": {"channel_id": channel, "id": f"x-{channel}"}, **more}


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


def channel_of(metadata: Any) -> str | None:
    """The rule as docs/api.md states it: the first of the two places holding a non-empty string."""
    metadata = metadata or {}
    external = metadata.get("external")
    for place in (metadata.get("channel_id"), external.get("channel_id") if isinstance(external, dict) else None):
        if isinstance(place, str) and place:
            return place
    return None


async def test_a_channel_is_the_top_level_id_else_the_external_one(rt: ctxrt.Runtime) -> None:
    """M11: metadata["channel_id"] wins, else metadata["external"]["channel_id"]; a non-string names none."""
    m = await rt.open("a")
    both = await m.add_message("ann", "x", metadata={"channel_id": "a", "external": {"channel_id": "b"}})
    outer = await m.add_message("ann", "x", metadata={"external": {"channel_id": "b"}})
    fallback = await m.add_message("ann", "x", metadata={"channel_id": 7, "external": {"channel_id": "b"}})
    await m.add_message("ann", "x", metadata={"channel_id": ""})
    await m.add_message("ann", "x", metadata={"external": "b"})
    assert ids(await m.query_messages(channel="a")) == [both]
    assert ids(await m.query_messages(channel="b")) == [outer, fallback]
    assert await m.channel_counts() == {"a": 1, "b": 2}


async def test_query_by_channel_finds_both_schemas_in_order(rt: ctxrt.Runtime) -> None:
    """M11: messages of either schema are found by their channel, oldest first, with the other conditions."""
    m = await rt.open("a")
    a1 = await m.add_message("ann", "one", metadata=top("general"))
    await m.add_message("bob", "two", metadata=external("random"))
    a2 = await m.add_message("bob", "three", metadata=external("general"))
    await m.add_message("ann", "four")
    a3 = await m.add_message("ann", "five", metadata=top("general", task=1))
    assert ids(await m.query_messages(channel="general")) == [a1, a2, a3]
    assert ids(await m.query_messages(channel="general", participant="bob")) == [a2]
    assert ids(await m.query_messages(channel="general", metadata={"task": 1})) == [a3]
    assert ids(await m.query_messages(channel="general", reverse=True, limit=2)) == [a3, a2]
    assert ids(await m.query_messages(channel="general", limit=0)) == []
    assert await m.query_messages(channel="nowhere") == []
    assert await m.channel_counts() == {"general": 3, "random": 1}


async def test_removals_and_edits_keep_the_index_right(rt: ctxrt.Runtime) -> None:
    """M11, K10: a removal takes messages out of their channel; an edit keeps the channel, is read
    edited and its tokens counted as edited."""
    m = await rt.open("a")
    made = [await m.add_message("ann", f"m{i}", metadata=top("c" if i % 2 else "d")) for i in range(8)]
    assert await m.channel_counts() == {"c": 4, "d": 4}
    await m.remove_messages(made[1], made[3])
    await m.edit_message(made[5], "edited")
    assert ids(await m.query_messages(channel="c")) == [made[5], made[7]]
    assert [b.text for b in (await m.query_messages(channel="c"))[0].content] == ["edited"]  # type: ignore[union-attr]
    assert await m.channel_counts() == {"c": 2, "d": 3}
    await m.edit_message(made[7], "a longer text than the message had " * 3)  # its entry's tokens follow
    listed = await m.query_messages(channel="c")
    assert (await m.channel_token_stats())["c"] == ChannelTokens(2, sum(estimate_blocks(x.content) for x in listed))
    await m.remove_message(made[5])
    await m.remove_message(made[7])
    assert await m.channel_counts() == {"d": 3}
    assert await m.query_messages(channel="c") == []


async def test_a_fork_sees_the_parents_channel_messages_up_to_the_fork(rt: ctxrt.Runtime) -> None:
    """M11: a fork's channel reads hold the parent's messages up to the fork point and its own after."""
    m = await rt.open("a")
    before = await m.add_message("ann", "before", metadata=top("c"))
    assert await m.channel_counts() == {"c": 1}  # the parent's index exists before the fork
    other = await rt.open("b")
    await m.fork("side")
    side = await m.add_message("ann", "on side", metadata=external("c"))
    main = await other.add_message("ann", "on main", metadata=top("c"))
    assert ids(await m.query_messages(channel="c")) == [before, side]
    assert ids(await other.query_messages(channel="c")) == [before, main]
    await m.remove_message(before)
    assert ids(await m.query_messages(channel="c")) == [side]
    assert ids(await other.query_messages(channel="c")) == [before, main]


async def test_counts_and_tokens_are_in_the_readers_view(rt: ctxrt.Runtime) -> None:
    """M11, A7: a message whose every block is hidden from the reader is not counted and its tokens not
    summed; a partly hidden one counts what the reader sees. query_messages stays as stored (A7)."""
    ann = await rt.open("ann", view_reader="ann")
    bob = await rt.open("bob", view_reader="bob")
    hidden = [{"type": "text", "text": "for bob only, a longer line", "audience": ["bob"]}]
    partly = [{"type": "text", "text": "all"}, {"type": "text", "text": "bob's part of it", "audience": ["bob"]}]
    await ann.add_message("host", hidden, metadata=top("c", n=1))
    await ann.add_message("host", partly, metadata=top("c"))
    await ann.add_message("host", hidden, metadata=top("secret"))
    assert await ann.channel_counts() == {"c": 1}
    assert await bob.channel_counts() == {"c": 2, "secret": 1}
    stored = await ann.query_messages(channel="c")
    assert len(stored) == 2 and stored[0].content[0].audience == ("bob",)  # type: ignore[union-attr]
    seen = content_for_reader(stored[1].content, "ann")
    assert await ann.channel_token_stats() == {"c": ChannelTokens(1, estimate_blocks(seen))}
    stats = await bob.channel_token_stats()
    assert stats["c"].count == 2 and stats["c"].tokens == sum(estimate_blocks(m.content) for m in stored)


async def test_token_stats_are_bounded_by_time(rt: ctxrt.Runtime) -> None:
    """M11: channel_token_stats counts messages with timestamp_ms within since_ms..until_ms inclusive."""
    m = await rt.open("a")
    for t, channel in [(100, "c"), (200, "c"), (300, "d"), (400, "c")]:
        await m.add_message("ann", "x" * 40, metadata=top(channel), timestamp_ms=t)
    assert {c: s.count for c, s in (await m.channel_token_stats(since_ms=200, until_ms=300)).items()} == {"c": 1, "d": 1}
    assert {c: s.count for c, s in (await m.channel_token_stats(since_ms=250)).items()} == {"c": 1, "d": 1}
    assert await m.channel_token_stats(until_ms=50) == {}
    with pytest.raises(TypeError, match="since_ms"):
        await m.channel_token_stats(since_ms="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="channel"):
        await m.query_messages(channel=3)  # type: ignore[arg-type]


async def test_a_reopened_store_answers_from_its_stored_index(store_path: Path) -> None:
    """M11, K10: a reopened store, read-only included, answers channel reads from the index its
    writes stored, and goes on indexing its appends."""
    async with ctxrt.open_runtime(store_path, durability="os") as rt:
        m = await rt.open("a")
        made = [await m.add_message("ann", f"m{i}", metadata=(top if i % 2 else external)(f"c{i % 3}")) for i in range(9)]
        await m.remove_message(made[0])
    async with ctxrt.open_runtime(store_path, readonly=True) as rt:
        m = await rt.open("a")
        assert ids(await m.query_messages(channel="c0")) == [made[3], made[6]]
        assert await m.channel_counts() == {"c0": 2, "c1": 3, "c2": 3}
    async with ctxrt.open_runtime(store_path, durability="os") as rt:
        m = await rt.open("a")
        assert await m.channel_counts() == {"c0": 2, "c1": 3, "c2": 3}
        await m.add_message("ann", "new", metadata=top("c0"))
        assert len(await m.query_messages(channel="c0")) == 3


async def test_the_first_channel_read_after_opening_decodes_only_what_it_returns(store: str) -> None:
    """M11, K10: on a reopened store, the first query by channel decodes just the messages it
    returns; counts and token stats (no audience anywhere) decode none."""
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("writer")
        for i in range(300):
            await m.add_message("ann", f"m{i}", metadata=top("probe") if i % 60 == 0 else external(f"c{i % 5}"))
    async with ctxrt.open_runtime(store) as rt:
        m = await rt.open("reader", strategy=Passthrough())
        cache = await cache_of(rt, m)
        before = cache.decoded
        found = await m.query_messages(channel="probe")
        assert [x.content[0].text for x in found] == [f"m{i}" for i in range(0, 300, 60)]  # type: ignore[union-attr]
        assert cache.decoded - before == 5
        assert await m.channel_counts() == {"probe": 5, "c0": 55, **{f"c{k}": 60 for k in range(1, 5)}}
        stats = await m.channel_token_stats()
        assert stats["probe"] == ChannelTokens(5, sum(estimate_blocks(x.content) for x in found))
        assert cache.decoded - before == 5


async def test_a_store_written_before_the_index_is_served_from_its_messages(store: str) -> None:
    """M11, K10: a slot whose first messages were stored without index entries (as before the
    index) is served from its messages, exactly, before and after a reopen; verify finds it sound."""
    made = []
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("a")
        for i in range(6):
            data, _, _ = prepare_append("ann", f"old {i}", {"channel_id": f"c{i % 2}"})
            made.append(str((await rt.store.ask(AppendItem(state="messages", branch="main", data=data))).sequence))
        made.append(await m.add_message("ann", "new", metadata=external("c0")))
        assert ids(await m.query_messages(channel="c0")) == made[0:6:2] + made[6:]
        assert await m.channel_counts() == {"c0": 4, "c1": 3}
        await m.remove_message(made[0])
        assert ids(await m.query_messages(channel="c0")) == made[2:6:2] + made[6:]
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("a")
        assert await m.channel_counts() == {"c0": 3, "c1": 3}
        assert ids(await m.query_messages(channel="c1", reverse=True, limit=1)) == [made[5]]
    assert verify(store).status == "sound"


async def test_an_item_written_below_the_slot_layer_leaves_the_index_aside(rt: ctxrt.Runtime) -> None:
    """K10: an item appended or edited in a slot without its index entries (below the slot layer)
    marks the index as not covering the slot: reads are served from the messages and stay exact."""
    m = await rt.open("a")
    first = await m.add_message("ann", "one", metadata=top("c"))
    data, _, _ = prepare_append("ann", "raw", {"channel_id": "c"})
    raw = str((await rt.store.ask(AppendItem(state="messages", branch="main", data=data))).sequence)
    assert ids(await m.query_messages(channel="c")) == [first, raw]
    await m.add_message("ann", "three", metadata=top("d"))
    longer = "a longer text than it was " * 4
    data, _, _ = prepare_append("ann", longer, {"channel_id": "c"})
    await rt.store.ask(EditItem(state="messages", branch="main", item_sequence=int(first), data=data))
    stored = await m.query_messages(channel="c")
    assert [x.content[0].text for x in stored] == [longer, "raw"]  # type: ignore[union-attr]
    assert await m.channel_token_stats() == {"c": ChannelTokens(2, sum(estimate_blocks(x.content) for x in stored)),
                                             "d": ChannelTokens(1, estimate_blocks([Text("three")]))}


async def test_verify_names_a_missing_or_wrong_index_entry(store: str) -> None:
    """K10, K7: verify reads each covered slot's channel index against its messages and names the
    first entry that differs, per branch: one removed on main, one rewritten on a fork."""
    async with ctxrt.open_runtime(store, durability="os") as rt:
        m = await rt.open("a")
        made = [await m.add_message("ann", f"m{i}", metadata=top("c")) for i in range(4)]
        await m.fork("side")
        assert verify(store).status == "sound"
        state = index_state("messages", channel_key("c"))
        await rt.store.ask(RemoveItems(state=state, branch="main", from_sequence=int(made[1]), to_sequence=int(made[1])))
        await rt.store.ask(EditItem(state=state, branch="side", item_sequence=int(made[2]), data=b'["c",1,1,1]'))
    report = verify(store)
    assert report.status == "damaged"
    found = {damage.place: damage.what for damage in report.damage}
    assert found.keys() == {"the channel index of 'messages' on branch 'main'",
                            "the channel index of 'messages' on branch 'side'"}
    assert found["the channel index of 'messages' on branch 'main'"] == (
        f"message {made[1]} has no entry (the entry there is message {made[2]}'s)")
    assert found["the channel index of 'messages' on branch 'side'"].startswith(
        f"the entry of message {made[2]} is b'[\"c\",1,1,1]', not ")


# -- the index equals a scan over random histories -------------------------------------------------

CHANNELS = ("a", "b")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from((*CHANNELS, None)), st.booleans(), st.booleans()),
        st.tuples(st.just("edit"), st.integers(0, 50)),
        st.tuples(st.just("remove"), st.integers(0, 50), st.integers(0, 2)),
        st.tuples(st.just("fork")),
        st.tuples(st.just("main")),
    ),
    max_size=30,
)


def content(hidden: bool) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "for bob", "audience": ["bob"]}] if hidden else [{"type": "text", "text": "all"}]


async def check(m: ctxrt.ContextManager) -> None:
    everything = list(await m.get_all_messages())
    for channel in CHANNELS:
        scanned = [x for x in everything if channel_of(x.metadata) == channel]
        assert ids(await m.query_messages(channel=channel)) == ids(scanned)
        assert ids(await m.query_messages(channel=channel, reverse=True, limit=2)) == ids(scanned[::-1][:2])
    visible = [x for x in everything if channel_of(x.metadata) and content_for_reader(x.content, "ann")]
    expected: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for x in visible:
        channel = channel_of(x.metadata)
        assert channel is not None
        expected[channel] = expected.get(channel, 0) + 1
        tokens[channel] = tokens.get(channel, 0) + estimate_blocks(content_for_reader(x.content, "ann"))
    assert await m.channel_counts() == expected
    assert await m.channel_token_stats() == {c: ChannelTokens(n, tokens[c]) for c, n in expected.items()}


async def replay(history: list[tuple[Any, ...]], path: Path) -> None:
    async with ctxrt.open_runtime(path, durability="os") as rt:
        m = await rt.open("a", view_reader="ann")
        forks = 0
        for step in history:
            made = [x.id for x in await m.get_all_messages()]
            if step[0] == "add":
                _, channel, schema, hidden = step
                metadata = None if channel is None else (top if schema else external)(channel)
                await m.add_message("host", content(hidden), metadata=metadata)
            elif step[0] == "edit" and made:
                # Shows a hidden message to ann (hiding one would be a narrowing, refused: D1).
                await m.edit_message(made[step[1] % len(made)], [{"type": "text", "text": "edited"}])
            elif step[0] == "remove" and made:
                first = step[1] % len(made)
                await m.remove_messages(made[first], made[min(len(made) - 1, first + step[2])])
            elif step[0] == "fork":
                forks += 1
                await m.fork(f"f{forks}")
            elif step[0] == "main" and m.branch != "main":
                await m.switch_branch("main")
            await check(m)


metadatas = st.sampled_from([None, {}, {"channel_id": "c"}, {"external": {"channel_id": "e"}}, {"channel_id": 7},
                              {"channel_id": "", "external": {"channel_id": "e"}}, {"note": "x"}])
contents = st.one_of(
    st.text(min_size=1, max_size=5).filter(str.strip),
    st.lists(st.builds(lambda text, audience: {"type": "text", "text": text, **audience},
                       st.text(min_size=1, max_size=5).filter(str.strip),
                       st.sampled_from([{}, {"audience": ["ann"]}])), min_size=1, max_size=3),
)


@settings(max_examples=60)
@given(contents, metadatas)
def test_an_append_carries_its_index_entry_and_audience_flag_whatever_shortcut_made_them(
    content: Any, metadata: Any,
) -> None:
    """K10, A2: what an append carries (prepare_append, which skips looking where it knows: a
    string's one block has no audience, no metadata names no channel) is what its content and
    metadata say: the audience flag iff a block has an audience, one index entry under its
    channel's key iff the metadata names a channel."""
    _, _, appended = prepare_append("ann", content, metadata)
    assert appended.audience == any(block.audience is not None for block in appended.content)
    channel = channel_of(metadata)
    assert [entry.key for entry in appended.index] == ([] if channel is None else [channel_key(channel)])


@settings(max_examples=40)
@given(steps)
def test_the_indexed_query_equals_a_scan_over_random_histories(history: list[tuple[Any, ...]]) -> None:
    """M11, K10: over random adds (both schemas, hidden or not), edits, removals, forks and switches,
    checked after each step, the channel reads (queries, counts, token stats) equal a filter over
    every message."""
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(replay, history, Path(tmp) / "store")
