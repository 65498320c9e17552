"""Queries over a slot (docs/api.md, Reading messages; issue 13 item 9): by participant, dotted
metadata, time range and external id, with limits, oldest or newest first, served from the slot
cache. ``MessageQuery`` is tested as plain code by property; the manager against a real store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

import ctxrt
from ctxrt import Message, Text
from ctxrt.queries import MessageQuery

GUARD_S = 30

metadata = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "task": st.fixed_dictionaries({"id": st.sampled_from(["a", "b"])}),
    "external": st.fixed_dictionaries({"id": st.sampled_from(["x1", "x2"])}),
}))
messages = st.lists(st.builds(
    lambda i, who, meta, ts: Message(str(i), i, who, (Text("m"),), meta, ts),
    st.integers(1, 10**6), st.sampled_from(["user", "Claude"]), metadata, st.integers(0, 100)), max_size=30)
queries = st.builds(MessageQuery, st.sampled_from([None, "user", "Claude"]),
                    st.sampled_from([None, {}, {"task.id": "a"}, {"task": {"id": "b"}}]),
                    st.one_of(st.none(), st.integers(0, 100)), st.one_of(st.none(), st.integers(0, 100)),
                    st.sampled_from([None, "x1", "x2"]))


def naive(query: MessageQuery, message: Message) -> bool:
    meta: Any = message.metadata or {}
    return ((query.participant is None or message.participant == query.participant)
            and (query.since_ms is None or message.timestamp_ms >= query.since_ms)
            and (query.until_ms is None or message.timestamp_ms <= query.until_ms)
            and (query.external_id is None or meta.get("external", {}).get("id") == query.external_id)
            and all((meta.get("task", {}).get("id") if path == "task.id" else meta.get(path)) == value
                    for path, value in (query.metadata or {}).items()))


@given(queries, messages)
def test_a_query_matches_exactly_the_messages_meeting_every_condition(query: MessageQuery, found: list[Message]) -> None:
    """Item 9: a conjunction; an unset condition matches everything."""
    assert [m for m in found if query.matches(m)] == [m for m in found if naive(query, m)]


async def test_queries_by_time_external_id_and_metadata_with_limits_and_order(tmp_path: Path) -> None:
    """Item 9: through the manager; a reverse query with a limit reads back only to its matches (L7)."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            writer = await rt.open("writer")
            for i in range(500):
                await writer.add_message("user" if i % 2 else "Claude", f"m{i}",
                                         metadata={"external": {"id": f"ext-{i}"}, "task": {"id": i % 3}},
                                         timestamp_ms=1_000 + i)
        async with ctxrt.open_runtime(tmp_path / "store") as rt:
            manager = await rt.open("reader")
            newest = await manager.query_messages(participant="user", reverse=True, limit=2)
            assert [m.content[0].text for m in newest] == ["m499", "m497"]  # type: ignore[union-attr]
            assert (await manager.inspect()).caches[0].decoded <= 64
            window = await manager.query_messages(since_ms=1_010, until_ms=1_014)
            assert [m.timestamp_ms for m in window] == [1_010, 1_011, 1_012, 1_013, 1_014]
            assert [m.content[0].text for m in await manager.query_messages(external_id="ext-7")] == ["m7"]  # type: ignore[union-attr]
            by_task = await manager.query_messages(metadata={"task.id": 2}, since_ms=1_400, limit=3)
            assert [m.timestamp_ms for m in by_task] == [1_401, 1_404, 1_407]
            assert await manager.query_messages(external_id="nothing") == []
            assert await manager.query_messages(limit=0) == []
