"""What stays live in a compile: the image policy and tool-output pruning (docs/api.md, Host controls;
issue 13 items 1 and 2; docs/behaviours.md P8 for the API's image limits).

The pure pass (``ctxrt.strategies.live``) is tested on entries; the strategies through the public
API on a real LMDB store, with real PNG bytes, and the bodies sent by the real ``anthropic``
client to the local Messages API server, which applies the API's request rules.
"""

from __future__ import annotations

import base64
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

import ctxrt
from ctxrt import Autobiographical, Budget, Entry, Image, Text, ToolResult, ToolUse, WindowedPassthrough
from ctxrt.anthropic_rules import MAX_IMAGE_DATA_BYTES, violations
from ctxrt.strategies.live import apply_live_policy
from ctxrt.testing import ApiReply, ScriptedModel, open_messages_api_server

GUARD_S = 60
BIG = Budget(max_tokens=400_000, reserve_for_response=4_000)


def png(width: int, height: int, seed: int) -> bytes:
    """A real PNG of random RGB pixels (incompressible, so its size is about 3 bytes a pixel)."""
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b"")


def image_block(width: int = 16, height: int = 16, seed: int = 0) -> dict[str, Any]:
    data = base64.b64encode(png(width, height, seed)).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def image(seed: int = 0, side: int = 16) -> Image:
    block = image_block(side, side, seed)
    return Image(block["source"])


def copy(i: int, *blocks: Any, participant: str = "user") -> Entry:
    return Entry(participant, tuple(blocks), (str(i),), "copy")


def live_images(entries: list[Entry]) -> list[int]:
    """The indexes of entries that still hold an image (top level or in a tool result)."""
    def holds(block: Any) -> bool:
        return type(block) is Image or (type(block) is ToolResult and not isinstance(block.content, str)
                                        and any(type(b) is Image for b in block.content))
    return [i for i, e in enumerate(entries) if any(holds(b) for b in e.content)]


# -- the pure pass ------------------------------------------------------------------------------


def test_the_newest_images_stay_and_older_ones_become_text_naming_them() -> None:
    """Item 1: past the newest max_live_images, an image becomes a placeholder naming its message;
    the line moves in steps of half the limit (here 3), so between 4 and 6 stay."""
    entries = [copy(i, Text(f"shot {i}"), image(i)) for i in range(9)]
    out = apply_live_policy(entries, WindowedPassthrough(max_live_images=6))
    assert live_images(out) == [3, 4, 5, 6, 7, 8]
    placeholder = out[0].content[1]
    assert type(placeholder) is Text and "image dropped from live context" in placeholder.text
    assert "message 0" in placeholder.text and "image/png" in placeholder.text
    assert all(out[i] is entries[i] for i in range(3, 9))  # untouched entries are the same objects
    more = apply_live_policy([*entries, copy(9, image(9))], WindowedPassthrough(max_live_images=6))
    assert live_images(more) == [6, 7, 8, 9]  # the next step: 4 stay


def test_the_live_line_moves_in_steps_so_a_growing_loops_prefix_stays_the_same() -> None:
    """Item 1, P9 (from the controls benchmark): with one screenshot and one tool result per turn,
    what is dropped changes once every few turns, not every turn, so the prefix a provider cached
    stays byte-identical between steps; and a memo hands back the same entry objects."""
    options = WindowedPassthrough(max_live_images=6, tool_result_max_last_n=10)
    memo: dict[Any, Any] = {}
    turns: list[Entry] = []
    changes = 0
    previous: list[Entry] | None = None
    for i in range(60):
        turns.append(copy(2 * i, ToolUse(f"t{i}", "shot", {}), participant="Claude"))
        turns.append(copy(2 * i + 1, ToolResult(f"t{i}", (Text("x " * 300), image(i % 5)))))
        out = apply_live_policy(turns, options, memo)
        if previous is not None:
            same = sum(1 for a, b in zip(out, previous) if a is b)
            changes += same < len(previous)
        previous = out
        assert len(live_images(out)) <= 6
    # Once per step of 3 images and once per step of 5 tool results at most (every turn, 59, before).
    assert changes <= 60 // 3 + 60 // 5 + 1


def test_the_byte_wall_and_the_depth_leave_out_older_images() -> None:
    """Item 1: images past max_live_image_bytes in all, or deeper than image_strip_depth_tokens, go."""
    entries = [copy(i, image(i, side=64)) for i in range(5)]
    size = len(image(0, side=64).source["data"])
    out = apply_live_policy(entries, WindowedPassthrough(max_live_image_bytes=2 * size))
    assert live_images(out) == [3, 4]
    deep = [copy(0, image(0)), copy(1, Text("word " * 4_000)), copy(2, image(2))]
    out = apply_live_policy(deep, WindowedPassthrough(image_strip_depth_tokens=1_000))
    assert live_images(out) == [2]


def test_an_image_over_the_apis_limit_is_never_sent() -> None:
    """Item 1, P8: one image over the API's 5 MB would fail every request that held it."""
    huge = Image({"type": "base64", "media_type": "image/png", "data": "A" * (MAX_IMAGE_DATA_BYTES + 4)})
    out = apply_live_policy([copy(0, Text("see"), huge)], WindowedPassthrough())
    assert live_images(out) == [] and "5 MB" in out[0].content[1].text  # type: ignore[union-attr]


def test_screenshots_in_tool_results_count_and_tool_pairs_stay_whole() -> None:
    """Items 1 and 2: images nested in tool results are live images too; pruning keeps every block,
    so each tool_use keeps its tool_result."""
    entries = []
    for i in range(8):
        entries.append(copy(2 * i, ToolUse(f"t{i}", "screenshot", {"n": i}), participant="Claude"))
        entries.append(copy(2 * i + 1, ToolResult(f"t{i}", (Text(f"shot {i}"), image(i)))))
    out = apply_live_policy(entries, WindowedPassthrough(max_live_images=2, tool_result_max_last_n=3))
    assert live_images(out) == [13, 15]
    results = [b for e in out for b in e.content if type(b) is ToolResult]
    assert [r.tool_use_id for r in results] == [f"t{i}" for i in range(8)]
    assert [isinstance(r.content, str) and "pruned" in r.content for r in results] == [True] * 5 + [False] * 3


def test_tool_inputs_over_the_cap_are_replaced_with_a_note() -> None:
    """Item 2: a tool_use input estimated over tool_use_input_max_tokens becomes a short note."""
    big = ToolUse("t1", "write_file", {"text": "x" * 4_000})
    small = ToolUse("t2", "read_file", {"path": "a"})
    out = apply_live_policy([copy(0, big, small, participant="Claude")], WindowedPassthrough(tool_use_input_max_tokens=100))
    pruned, kept = out[0].content
    assert type(pruned) is ToolUse and pruned.id == "t1" and "pruned" in str(pruned.input)
    assert kept is small


@pytest.mark.parametrize("field", ["max_live_images", "max_live_image_bytes", "image_strip_depth_tokens",
                                   "tool_result_max_last_n", "tool_use_input_max_tokens"])
def test_a_bad_option_is_refused_naming_it(field: str) -> None:
    """Bad input is refused where it is made, naming the field."""
    with pytest.raises(ValueError, match=field):
        WindowedPassthrough(**{field: -1})
    with pytest.raises(ValueError, match=field):
        Autobiographical(compression_model="m", **{field: True})


# -- through the public API ---------------------------------------------------------------------


async def test_a_long_screenshot_loop_compiles_to_bodies_the_api_accepts(tmp_path: Path) -> None:
    """Item 1, P8: 120 real PNG screenshots (over the API's 100 per request) compile, with the
    image policy on, to bodies that hold the newest 6 and that the local server accepts."""
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os") as rt:
            manager = await rt.open("agent", strategy=WindowedPassthrough())
            for i in range(120):
                await manager.add_message("Claude", [{"type": "tool_use", "id": f"t{i}", "name": "screenshot",
                                                      "input": {}}])
                await manager.add_message("user", [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                    "content": [image_block(32, 32, i)]}])
            body = (await manager.compile(BIG)).to_anthropic(assistant="Claude", strict=True)
            assert violations(body) == []
            shots = [b for m in body["messages"] for block in m["content"] if block["type"] == "tool_result"
                     for b in block["content"] if b["type"] == "image"]
            assert len(shots) == 6
            newest = base64.b64encode(png(32, 32, 119)).decode()
            assert shots[-1]["source"]["data"] == newest
            async with open_messages_api_server(lambda _: ApiReply.text("ok")) as server:
                client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0)
                reply = await client.messages.create(model="m", max_tokens=5, **body)
                assert reply.content[0].text == "ok"  # type: ignore[union-attr]
                everything = [{"role": "user", "content": [image_block(8, 8, i) for i in range(101)]}]
                with pytest.raises(anthropic.BadRequestError, match="too many images"):
                    await client.messages.create(model="m", max_tokens=5, messages=everything)  # type: ignore[arg-type]
                await client.close()


async def test_autobiographical_prunes_old_tool_output_in_its_recent_window(tmp_path: Path) -> None:
    """Item 2: with tool_result_max_last_n, an agent loop's older tool output is a one-line note."""
    strategy = Autobiographical(compression_model="m", tool_result_max_last_n=2, recent_window_tokens=100_000)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(tmp_path / "store", durability="os", model=ScriptedModel(lambda _: "summary")) as rt:
            manager = await rt.open("agent", strategy=strategy)
            for i in range(6):
                await manager.add_message("Claude", [{"type": "tool_use", "id": f"t{i}", "name": "run", "input": {}}])
                await manager.add_message("user", [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                    "content": f"output {i} " * 200}])
            result = await manager.compile(BIG)
            results = [b for m in result.messages for b in m.content if type(b) is ToolResult]
            assert [r.tool_use_id for r in results] == [f"t{i}" for i in range(6)]
            assert [("pruned" in r.content) for r in results if isinstance(r.content, str)] == [True] * 4 + [False] * 2
            stored = await manager.get_all_messages()
            assert all("output" in b.content for m in stored for b in m.content if type(b) is ToolResult)
            assert violations(result.to_anthropic(assistant="Claude")) == []


def test_images_in_pruned_tool_results_dont_count_against_the_live_limit() -> None:
    """Item 1 (from a review): the limit counts what could stay live, not images a pruned tool
    result takes with it."""
    entries = [copy(i, image(i)) for i in range(6)]
    entries += [copy(10 + i, ToolResult(f"t{i}", (Text("shot"), image(10 + i)))) for i in range(2)]
    out = apply_live_policy(entries, WindowedPassthrough(max_live_images=6, tool_result_max_last_n=0))
    assert live_images(out) == [0, 1, 2, 3, 4, 5]
