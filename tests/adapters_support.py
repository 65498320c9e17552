"""What the framework adapters' tests share (tests/test_integration_*.py): two residents over one
slot of a real store, opened from asyncio, a compressing strategy with an offline summariser, and
the lines a run writes. Not a test module.

Each test runs two agents of one framework, ann and bob, each with the framework's own offline
test model; ``SECRET`` is written for ann alone and must never reach bob's model, nor bob's
summaries; ``PUBLIC`` is written for both and must reach both.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
from hypothesis import strategies as st

import ctxrt
import ctxrt.aio
from ctxrt.testing import ScriptedModel

T = TypeVar("T")
GUARD_S = 60
SECRET = "ann's deploy key is K-7781"
PUBLIC = "standup is at ten"
TOOL_SECRET = "ann's result 4417"
# Under budget: a long run's view must be compressed to fit 2,500 usable tokens.
BUDGET = ctxrt.Budget(max_tokens=3_000, reserve_for_response=500)
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def words() -> st.SearchStrategy[str]:
    """A short text with something to say: no surrogates, controls or blank-only strings."""
    return st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Z")), min_size=1, max_size=12)


def memory() -> ctxrt.Autobiographical:
    """Compression that starts after a few turns: small chunks, a small raw recent window."""
    return ctxrt.Autobiographical("summariser", target_chunk_tokens=300, recent_window_tokens=700,
                                  summary_target_tokens=60, merge_threshold=4, summary_participant="memory")


def summarise(request: ctxrt.ModelRequest) -> str:
    """A summary that quotes the words it read, so a secret read would show in it."""
    words = " ".join(getattr(b, "text", "") for m in request.messages for b in m.content).split()
    return "SUMMARY " + " ".join(words[-40:])


def line(speaker: str, turn: int) -> str:
    """A reply of about 60 tokens: a long run's turns fill the budget within a few dozen."""
    return f"{speaker} turn {turn}: " + "the plan moves on by one more careful step, noted for the team. " * 3


@attrs.define
class Residents:
    runtime: Any
    ann: ctxrt.ContextManager
    bob: ctxrt.ContextManager
    summarisers: dict[str, ScriptedModel]

    async def write_for_ann(self, *, image: bool = False) -> None:
        """A line for ann alone and a line for both (with an image: about 1,600 tokens as ctxrt
        prices images, so a run under ``BUDGET`` leaves it out of the budget tests)."""
        await self.ann.add_message("user", [{"type": "text", "text": SECRET, "audience": ["ann"]}])
        picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}
        await self.ann.add_message("user", [{"type": "text", "text": PUBLIC}, *([picture] if image else [])])

    async def settle(self) -> None:
        """Every compression either namespace has queued, done."""
        await self.ann.wait_ready()
        await self.bob.wait_ready()

    @staticmethod
    def within_budget(manager: ctxrt.ContextManager) -> bool:
        """Whether the manager's last compile fit the budget, with nothing left out."""
        stats = manager.render_stats()
        return stats is not None and stats.total_tokens <= BUDGET.usable and not stats.dropped_ids

    def summaries_shown(self, manager: ctxrt.ContextManager) -> int:
        stats = manager.render_stats()
        return sum(shown for _, shown in stats.summaries) if stats is not None else 0


@asynccontextmanager
async def residents(store: Path, *, compress: bool = False) -> AsyncIterator[Residents]:
    """ann and bob, each a namespace with its own reader over the one shared slot; with
    ``compress``, Autobiographical with a scripted summariser each."""
    summarisers = {name: ScriptedModel(summarise) for name in ("ann", "bob")}
    async with ctxrt.aio.open_runtime(store) as rt:
        opened = {}
        for name in ("ann", "bob"):
            opened[name] = await rt.open(f"agents/{name}", view_reader=name,
                                         strategy=memory() if compress else None,
                                         model=summarisers[name] if compress else None)
        yield Residents(rt, opened["ann"], opened["bob"], summarisers)


def holds(value: Any, text: str) -> bool:
    """Whether ``text`` appears anywhere in ``value`` (what a model received, in any form)."""
    return text in json.dumps(value, default=repr)


def summaries_hold(summariser: ScriptedModel, text: str) -> bool:
    """Whether any compression request this summariser got held ``text``."""
    return any(holds([getattr(b, "text", "") for m in r.messages for b in m.content], text)
               for r in summariser.requests)


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``fn(*args)`` in a fresh asyncio loop, under a guard timeout."""
    return asyncio.run(asyncio.wait_for(fn(*args), GUARD_S))
