"""A strategy's incremental compile equals a from-scratch one (docs/behaviours.md T9).

Store-backed: a real LMDB store in a temp dir, written through the public API by random steps
(text, tool pairs by the assistant and by others, images, audience blocks, edits, removals,
compression, budget changes). After each step the writer's compile (its strategy's kept state,
compile's memo) is compared with the compile of a fresh read-only runtime opened on the same
store, whose strategy starts from what is stored: the messages, the provenance's sources and
completeness, and the render stats. Bounded in the normal run (a few examples, seconds); ``CTXRT_SOAK=1`` runs the long form.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt.testing import ScriptedModel

READER = "Claude"
NAMESPACE = "inc"
LIVE = {"max_live_images": 2, "image_strip_depth_tokens": 2000, "tool_result_max_last_n": 2,
        "tool_use_input_max_tokens": 12}
COMPRESSING = {"target_chunk_tokens": 40, "recent_window_tokens": 120, "head_window_tokens": 30,
               "merge_threshold": 2, "summary_target_tokens": 10, "l1_holdback_chunks": 0}
CONFIGS: dict[str, Callable[[int], Any]] = {
    "passthrough": lambda cap: ctxrt.Passthrough(),
    "windowed": lambda cap: ctxrt.WindowedPassthrough(max_message_tokens=cap, **LIVE),
    "autobiographical": lambda cap: ctxrt.Autobiographical("m", max_message_tokens=cap, **LIVE, **COMPRESSING),
    "knowledge": lambda cap: ctxrt.Knowledge("m", max_message_tokens=cap, **LIVE, **COMPRESSING),
}
WORDS = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "x" * 40, "1234567", "def f(): pass"]),
                 min_size=1, max_size=12).map(" ".join)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()


def _image() -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


class Session:
    """The writer's side: what it added (ids still in the store) and how many tool calls it made."""

    def __init__(self, cm: Any, data: st.DataObject) -> None:
        self.cm, self.data = cm, data
        self.ids: list[str] = []
        self.hidden: list[tuple[str, str]] = []  # messages the reader sees nothing of, with bob's text
        self.calls = 0
        self.budget = ctxrt.Budget(max_tokens=data.draw(st.integers(3000, 12000), label="budget"), reserve_for_response=0)

    async def add(self, participant: str, content: Any) -> None:
        self.ids.append(await self.cm.add_message(participant, content))

    async def step(self) -> str:
        draw = self.data.draw
        kind = draw(st.sampled_from(["text", "text", "text", "tools", "tools", "image", "image", "audience",
                                     "audience", "reveal", "reveal", "edit", "remove", "compress", "budget"]), label="step")
        if kind == "text":
            await self.add(draw(st.sampled_from(["user", READER, "bob"])), draw(WORDS))
        elif kind == "tools":
            self.calls += 1
            caller = draw(st.sampled_from([READER, "bob"]))
            tool_id = f"t{self.calls}"
            await self.add(caller, [{"type": "text", "text": draw(WORDS)},
                                    {"type": "tool_use", "id": tool_id, "name": "search", "input": {"q": draw(WORDS)}}])
            result: Any = draw(WORDS) if draw(st.booleans()) else [{"type": "text", "text": "seen"}, _image()]
            await self.add("user", [{"type": "tool_result", "tool_use_id": tool_id, "content": result}])
        elif kind == "image":
            await self.add("user", [{"type": "text", "text": draw(WORDS)}, _image()])
        elif kind == "audience":
            audience, plain, text = draw(st.sampled_from([READER, "bob"])), draw(st.booleans()), draw(WORDS)
            await self.add(draw(st.sampled_from(["user", "bob"])), [
                {"type": "text", "text": text, "audience": [audience]},
                *([{"type": "text", "text": draw(WORDS)}] if plain else []),
            ])
            if audience != READER and not plain:
                self.hidden.append((self.ids[-1], text))
        elif kind == "reveal" and self.hidden:
            # Into view, maybe inside a chunk a summary covers: not one of its leaves.
            target, text = self.hidden.pop(draw(st.integers(0, len(self.hidden) - 1)))
            if target in self.ids:  # bob's block stays: narrowing refuses to take it from him (D1)
                try:
                    await self.cm.edit_message(target, [{"type": "text", "text": text, "audience": ["bob"]},
                                                        {"type": "text", "text": draw(WORDS), "audience": [READER]}])
                except ctxrt.NarrowingRefusedError:
                    pass  # an edit step made it plain since, and compression read it (D1): refused, unchanged
        elif kind == "edit" and self.ids:
            target = draw(st.sampled_from(self.ids))
            message = await self.cm.get_message(target)
            if message is not None and not any(type(b) in (ctxrt.ToolUse, ctxrt.ToolResult) for b in message.content):
                audience = draw(st.sampled_from([None, READER, "bob"]))
                block: dict[str, Any] = {"type": "text", "text": draw(WORDS)}
                if audience is not None:
                    block["audience"] = [audience]
                try:
                    await self.cm.edit_message(target, [block])
                except ctxrt.NarrowingRefusedError:
                    pass  # compression read it (D1): refused, the store unchanged
        elif kind == "remove" and self.ids:
            target = draw(st.sampled_from(self.ids))
            try:
                await self.cm.remove_message(target)
            except ctxrt.NarrowingRefusedError:
                return "refused removal"
            self.ids.remove(target)
        elif kind == "compress":
            if draw(st.booleans()):
                await self.cm.wait_ready()
            else:
                await self.cm.tick()
        elif kind == "budget":
            self.budget = ctxrt.Budget(max_tokens=draw(st.integers(2500, 15000)), reserve_for_response=0)
        return kind


def _sources(result: Any) -> list[Any]:
    provenance = result.provenance
    return [provenance.messages, provenance.completeness, provenance.raw_bodies]


async def _compiled(cm: Any, budget: Any) -> Any:
    try:
        return await cm.compile(budget)
    except ctxrt.OverBudgetError as error:
        return ("over budget", str(error))


def _summary(reply: Any) -> str:
    return f"summary {len(reply.messages)}"


async def _run(name: str, data: st.DataObject, steps: int, store: Path) -> None:
    cap = data.draw(st.sampled_from([0, 0, 40]), label="max_message_tokens")
    config = CONFIGS[name](cap)
    model = ScriptedModel(_summary)
    async with ctxrt.open_runtime(store, model=model, durability="os") as runtime:
        cm = await runtime.open(NAMESPACE, strategy=config, view_reader=READER)
        session = Session(cm, data)
        for _ in range(steps):
            kind = await session.step()
            kept = await _compiled(cm, session.budget)
            async with ctxrt.open_runtime(store, readonly=True) as fresh:
                afresh = await _compiled(await fresh.open(NAMESPACE, strategy=config, view_reader=READER),
                                         session.budget)
                fresh_stats = (await fresh.open(NAMESPACE, strategy=config, view_reader=READER)).render_stats()
            if isinstance(kept, tuple) or isinstance(afresh, tuple):
                assert kept == afresh, f"after {kind}"
                continue
            assert kept.messages == afresh.messages, f"after {kind}"
            assert _sources(kept) == _sources(afresh), f"after {kind}"
            assert cm.render_stats() == fresh_stats, f"after {kind}"


def _check(name: str, examples: int, steps: int) -> None:
    @settings(max_examples=examples, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        with tempfile.TemporaryDirectory() as directory:
            trio.run(_run, name, data, steps, Path(directory) / "store")

    check()


@pytest.mark.soak
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_incremental_compile_equals_a_compile_from_scratch(name: str, soak_scale: Callable[[int, int], int]) -> None:
    """(T9) After random appends, edits, removals, compression and budget changes, each compile of a
    namespace equals a fresh runtime's compile of the same stored state, render stats included."""
    _check(name, examples=soak_scale(5, 300), steps=soak_scale(30, 150))


def test_summary_coverage_leaves_out_a_message_revealed_inside_its_range() -> None:
    """(T9) A message edited into view inside a summary's range is not covered by it: its coverage
    runs skip it, and the view's other messages in the range stay covered."""
    from ctxrt import Message, Text
    from ctxrt.strategies.coverage import Coverage, count_outside, covers, outside
    from ctxrt import Summary

    messages = [Message(str(n), n, "user", (Text(f"m{n}"),)) for n in range(1, 11)]
    summary = Summary("L1-0", 1, "s", 1, ("3", "4", "6"), 3, 6, "3", "6", 0, None)
    runs = Coverage().runs([summary], messages, "stamp", lambda s: s.source_ids, lambda stamp: None)
    assert [covers(runs, index) for index in range(10)] == [i in (2, 3, 5) for i in range(10)]
    assert list(outside(runs, 0, 10)) == [9, 8, 7, 6, 4, 1, 0]
    assert count_outside(runs, 0, 10) == 7


def test_a_windowed_compile_of_an_emptied_view_reports_what_a_fresh_one_does() -> None:
    """(T9) After its last message is removed, WindowedPassthrough's render stats are a fresh
    strategy's on the same state (nothing shown), not the last compile's before the removal."""
    from ctxrt import SelectOptions
    from ctxrt.testing import PlainContext

    config = ctxrt.WindowedPassthrough()
    budget = ctxrt.Budget(max_tokens=1000, reserve_for_response=0)
    strategy = config.create()
    ctx = PlainContext([ctxrt.Message("1", 1, "user", (ctxrt.Text("hello there"),))])
    strategy.initialize(ctx)
    strategy.select(ctx.view, budget, SelectOptions(context=ctx))
    emptied = PlainContext()
    emptied.values = ctx.values
    strategy.select(emptied.view, budget, SelectOptions(context=emptied))
    fresh = config.create()
    fresh.initialize(emptied)
    fresh.select(emptied.view, budget, SelectOptions(context=emptied))
    assert strategy.render_stats() == fresh.render_stats() == ctxrt.RenderStats()


@pytest.mark.parametrize("config", [ctxrt.WindowedPassthrough(max_message_tokens=20),
                                    ctxrt.Autobiographical("m", recent_window_tokens=50_000, max_message_tokens=20)],
                         ids=["windowed", "autobiographical"])
async def test_an_edit_past_a_truncation_cut_shows_the_edited_message_in_provenance(config: Any) -> None:
    """P16, P6: a message truncated in the compile is edited past the cut, so its entry comes out
    the same as before; the compile's raw body and completeness are the edited message's, as a
    fresh read-only runtime's are (the memo judged the old body again before)."""
    with tempfile.TemporaryDirectory() as path:
        with trio.fail_after(30):
            async with ctxrt.open_runtime(path, durability="os", model=ScriptedModel(lambda request: "s")) as rt:
                cm = await rt.open(NAMESPACE, strategy=config, view_reader=READER)
                await cm.add_message("user", "hi")
                target = await cm.add_message("user", "start " + "word " * 200 + "END-ONE")
                await cm.add_message(READER, "ok")
                before = await cm.compile()
                await cm.edit_message(target, "start " + "word " * 200 + "END-TWO")
                after = await cm.compile()
                stored = await cm.get_message(target)
            async with ctxrt.open_runtime(path, readonly=True) as ro:
                fresh = await (await ro.open(NAMESPACE, strategy=config, view_reader=READER)).compile()
    assert after.messages == before.messages == fresh.messages  # what was shown is the same
    assert after.provenance.raw_bodies[target] == stored == fresh.provenance.raw_bodies[target]
    assert dict(after.provenance.completeness) == dict(fresh.provenance.completeness)
