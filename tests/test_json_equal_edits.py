"""An edit between values Python's ``==`` makes equal but JSON doesn't (``1``, ``1.0``, ``True``)
reaches the next compile, its request bodies and its ledger record: the compile's memo, the body
cache and the ledger's digests reuse what an equal block made, so blocks compare as their JSON
(P14, P16, Q1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ctxrt
from ctxrt import Budget, Image, Text, ToolResult, ToolUse

BUDGET = Budget(max_tokens=20_000, reserve_for_response=500)
SWAPS = [(1, True), (True, 1), (1, 1.0), (0, False), ([1, 2], [True, 2]), ({"k": 1}, {"k": 1.0})]


@pytest.mark.parametrize(("before", "after"), SWAPS, ids=repr)
async def test_an_edit_between_json_distinct_equal_values_reaches_the_next_compile(
        tmp_path: Path, before: Any, after: Any) -> None:
    """P16: the memo's compile after the edit equals a fresh runtime's; P14: so do its bodies;
    Q1: the record's digest is the body's, and the record rebuilds as sent."""
    async with ctxrt.open_runtime(tmp_path / "store") as rt:
        manager = await rt.open("agents/a", ledger=True)
        await manager.add_message("user", "set it")
        call = await manager.add_message("Claude", [Text("calling"), ToolUse("t1", "set", {"n": before})])
        await manager.add_message("user", [ToolResult("t1", "ok")])
        first = await manager.compile(BUDGET)
        first.to_anthropic(assistant="Claude")
        await manager.record_request(first, form="anthropic", options={"assistant": "Claude"})
        await manager.edit_message(call, [Text("calling"), ToolUse("t1", "set", {"n": after})])
        result = await manager.compile(BUDGET)
        sent = result.to_anthropic(assistant="Claude")
        assert sent["messages"][1]["content"][1]["input"] == {"n": after}
        assert repr(sent["messages"][1]["content"][1]["input"]) == repr({"n": after})
        record = await manager.record_request(result, form="anthropic", options={"assistant": "Claude"})
        rebuilt = await manager.rebuild_request(record)  # its digest checked against the body made again
        assert rebuilt.matches and rebuilt.edited == ()
        assert repr(rebuilt.body) == repr(sent)
    async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as rt:
        fresh = (await (await rt.open("agents/a")).compile(BUDGET)).to_anthropic(assistant="Claude")
    assert repr(fresh) == repr(sent)


def test_blocks_compare_as_their_json() -> None:
    """P16: equal blocks make the same request bytes, so True, 1 and 1.0 tell blocks apart."""
    assert ToolUse("t", "f", {"n": 1}) == ToolUse("t", "f", {"n": 1})
    assert ToolUse("t", "f", {"n": 1}) != ToolUse("t", "f", {"n": True})
    assert ToolUse("t", "f", {"n": 1}) != ToolUse("t", "f", {"n": 1.0})
    assert ToolUse("t", "f", {"a": [1, 2], "b": 2}) == ToolUse("t", "f", {"b": 2, "a": (1, 2)})
    assert Text("x", cache_control={"ttl": 1}) != Text("x", cache_control={"ttl": True})
    url = {"type": "url", "url": "https://example.com/a.png"}
    assert Image(dict(url)) == Image(dict(url))
