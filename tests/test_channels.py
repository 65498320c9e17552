"""Channels (M11): ``query_messages(channel=)``, ``channel_counts()`` and ``channel_token_stats()``,
served by a slot cache's channel index, on both engines."""

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
from ctxrt import ChannelTokens, Message, content_for_reader
from ctxrt.testing import estimate_blocks


@pytest.fixture(params=["lmdb", "postgres"])
async def rt(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[ctxrt.Runtime]:
    store = store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")
    async with ctxrt.open_runtime(store, durability="os") as runtime:
        yield runtime


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
    """M11: a removal takes messages out of their channel; an edit keeps the channel and is read edited."""
    m = await rt.open("a")
    made = [await m.add_message("ann", f"m{i}", metadata=top("c" if i % 2 else "d")) for i in range(8)]
    assert await m.channel_counts() == {"c": 4, "d": 4}
    await m.remove_messages(made[1], made[3])
    await m.edit_message(made[5], "edited")
    assert ids(await m.query_messages(channel="c")) == [made[5], made[7]]
    assert [b.text for b in (await m.query_messages(channel="c"))[0].content] == ["edited"]  # type: ignore[union-attr]
    assert await m.channel_counts() == {"c": 2, "d": 3}
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


async def test_a_store_written_before_channels_opens_and_answers(store_path: Path) -> None:
    """M11: nothing is stored for the index, so a store of any age opens unchanged; a reopened store,
    read-only included, answers channel reads from its messages."""
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
    for x in visible:
        expected[channel_of(x.metadata)] = expected.get(channel_of(x.metadata), 0) + 1  # type: ignore[index]
    assert await m.channel_counts() == expected


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


@settings(max_examples=40)
@given(steps)
def test_the_indexed_query_equals_a_scan_over_random_histories(history: list[tuple[Any, ...]]) -> None:
    """M11: over random adds (both schemas, hidden or not), edits, removals, forks and switches, checked
    after each step, the channel reads equal a filter over every message."""
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(replay, history, Path(tmp) / "store")
