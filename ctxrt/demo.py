"""The main job: a multi-resident channel on the embedded store (``python -m ctxrt demo``).

Three residents share one message slot, each in a namespace of its own that records its
reader. Lines addressed to one resident carry an audience; tool cycles run between them;
autobiographical compression drains in the background; a fork and a derive branch off the
conversation. At the end each reader's compile is shown (token split, audience blocks seen)
and checked: no reader's compile, summary or model request holds another reader's lines.
Offline by default (``OfflineModel``); with ``ANTHROPIC_API_KEY`` set it uses ``AnthropicModel``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .compile import Budget
from .model import AnthropicModel, ModelRequest, ModelResponse, OfflineModel
from .runtime import open_runtime
from .strategies.autobiographical import Autobiographical

RESIDENTS = ("ann", "bob", "cy")
MARKER = re.compile(r"\[for (ann|bob|cy) #\d+\]")
TOPICS = ("the migration plan", "the flaky test", "the release notes", "the cache budget", "the on-call rota",
          "the schema change", "the latency regression", "the onboarding doc")


@attrs.define
class ReaderReport:
    reader: str
    branch: str
    messages: int
    head_tokens: int
    summary_tokens: int
    recent_tokens: int
    audience_blocks_seen: int
    summaries: int
    foreign_markers: list[str]


@attrs.define
class DemoReport:
    store: Path
    messages: int
    model: str
    readers: list[ReaderReport]
    fork: str
    derived: str
    model_requests: int
    leaks: list[str]

    @property
    def private(self) -> bool:
        return not self.leaks and all(not r.foreign_markers for r in self.readers)


class _Recording:
    """Wraps the model for one reader's namespace: every compression request it sends is
    checked for lines meant for someone else."""

    def __init__(self, model: Any, reader: str) -> None:
        self.model = model
        self.reader = reader
        self.requests = 0
        self.leaks: list[str] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        text = " ".join(getattr(b, "text", "") for m in request.messages for b in m.content)
        self.requests += 1
        self.leaks += [f"{self.reader} request saw a line for {other}" for other in MARKER.findall(text)
                       if other != self.reader]
        return await self.model.complete(request)


def _line(rng: random.Random, index: int, speaker: str) -> str:
    topic = rng.choice(TOPICS)
    return f"{speaker.capitalize()} on {topic}: point {index} — " + " ".join(
        rng.choice(("we", "should", "check", "the", "numbers", "again", "before", "shipping", "it", "today"))
        for _ in range(rng.randint(8, 24))
    )


def choose_model() -> tuple[Any, str]:
    if os.environ.get("ANTHROPIC_API_KEY"):
        name = os.environ.get("CTXRT_DEMO_MODEL", "claude-sonnet-4-5")
        return AnthropicModel(), name
    return OfflineModel(), "offline"


async def run_demo(
    store: Path, *, messages: int = 2000, seed: int = 7, progress: Callable[[int, int], None] | None = None,
    model: Any = None, model_name: str = "offline",
) -> DemoReport:
    if store.exists():
        shutil.rmtree(store)
    rng = random.Random(seed)
    if model is None:
        model, model_name = choose_model()
    recordings = {name: _Recording(model, name) for name in RESIDENTS}
    strategy = Autobiographical(
        model_name, target_chunk_tokens=1200, head_window_tokens=400, recent_window_tokens=3000,
        summary_target_tokens=200, auto_tick=True, merge_threshold=4,
    )
    async with open_runtime(store) as runtime:
        managers = {name: await runtime.open(f"agents/{name}", view_reader=name, strategy=strategy,
                                             model=recordings[name])
                    for name in RESIDENTS}
        writer = managers["ann"]
        for index in range(messages):
            speaker = rng.choice(("user", *RESIDENTS))
            participant = "user" if speaker == "user" else speaker
            if index % 25 == 10:
                call_id = f"call-{index}"
                await writer.add_message(participant, [
                    {"type": "text", "text": f"Looking up {rng.choice(TOPICS)}."},
                    {"type": "tool_use", "id": call_id, "name": "search", "input": {"query": f"q{index}"}},
                ])
                await writer.add_message("user", [
                    {"type": "tool_result", "tool_use_id": call_id, "content": f"result {index}: 3 matches"},
                ])
                continue
            content: list[dict[str, Any]] = [{"type": "text", "text": _line(rng, index, speaker)}]
            if index % 7 == 0:
                to = rng.choice(RESIDENTS)
                content.append({"type": "text", "text": f"[for {to} #{index}] a note only {to} should see",
                                "audience": [to]})
            await writer.add_message(participant, content)
            if progress is not None and index % 10 == 0:
                progress(index, messages)
            if index % 200 == 199:
                await trio.sleep(0)  # let the drains run between bursts
        for manager in managers.values():
            await manager.wait_ready()
        fork = await managers["bob"].fork("demo-fork")
        await managers["bob"].add_message("bob", "A line only on the fork.")
        child = await managers["cy"].derive(branch="demo-derived")
        await child.add_message("cy", [{"type": "text", "text": "[for cy #-1] on the derived branch", "audience": ["cy"]}])
        reports = []
        for name, manager in (*managers.items(), ("cy", child)):
            budget = Budget(max_tokens=12000, reserve_for_response=1000)
            result = await manager.compile(budget)
            preview = await manager.preview_context(budget)
            text = " ".join(getattr(b, "text", "") for m in result.messages for b in m.content)
            seen = MARKER.findall(text)
            summaries = await manager.search_summaries(include_merged=True)
            foreign = [m for m in re.findall(r"\[for (?:ann|bob|cy) #-?\d+\]", text) if f"[for {name} " not in m]
            foreign += [s.summary.id for s in summaries
                        if any(other != name for other in MARKER.findall(s.summary.content))]
            reports.append(ReaderReport(
                name, manager.branch, len(result.messages), preview.head_tokens if preview else 0,
                preview.middle_tokens if preview else 0, preview.tail_tokens if preview else 0,
                sum(1 for r in seen if r == name), len(summaries), foreign,
            ))
        if progress is not None:
            progress(messages, messages)
        await child.aclose()
        for manager in managers.values():
            await manager.aclose()
    if isinstance(model, AnthropicModel):
        await model.aclose()  # handed to the namespaces, not to the runtime, so closed here
    return DemoReport(store, messages, model_name, reports, fork, "demo-derived",
                      sum(r.requests for r in recordings.values()),
                      [leak for r in recordings.values() for leak in r.leaks])
