"""The main job: a multi-resident channel on the embedded store (``python -m ctxrt demo``).

Three residents share one message slot, each in a namespace of its own that records its
reader. Lines addressed to one resident carry an audience; tool cycles run between them;
autobiographical compression drains in the background; a fork and a derive branch off the
conversation. At the end each reader's compile is shown (token split, audience blocks seen)
and checked: no reader's compile, summary or model request holds another reader's lines, and
compression made summaries. 2,000 turns take a few seconds offline on a 2-core machine,
longer with a real model. Offline by default (``OfflineModel``); with
``ANTHROPIC_API_KEY`` set it uses ``AnthropicModel``.

The demo deletes only what it made: it writes a marker file into a store directory it creates
(or finds empty), and on a later run replaces only a marked directory's store files, after
checking that no other runtime holds the store. The marker names every file a store makes
before the runtime makes any, and stays while they are deleted, so a run stopped anywhere
leaves a store the next run replaces.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .budget import Budget
from .content.blocks import CompiledMessage, Text
from .errors import CtxrtError, ModelError, StoreLockedError
from .models.model import AnthropicModel, OfflineModel
from .models.model_types import ModelRequest, ModelResponse
from .runtime import open_runtime
from .strategies.autobiographical import Autobiographical
from .verification import BACKEND_ERRORS, STORE_FILE_NAMES

RESIDENTS = ("ann", "bob", "cy")
MARKER = re.compile(r"\[for (ann|bob|cy) #\d+\]")
TOPICS = ("the migration plan", "the flaky test", "the release notes", "the cache budget", "the on-call rota",
          "the schema change", "the latency regression", "the onboarding doc")
STORE_MARKER = ".ctxrt-demo"  # written into a store directory the demo made; nothing else is deleted


class DemoStoreError(CtxrtError):
    """The demo refused a store path: one it didn't make (it deletes only its own stores)."""


class DemoModelError(CtxrtError):
    """The compression model failed the demo's first request, so the demo would compress nothing."""


@attrs.define
class ReaderReport:
    """One reader's compile at the end of the demo, and what its namespace stores."""

    reader: str
    branch: str
    stored_messages: int  # in the shared slot on this branch: what `ctxrt inspect` lists per slot
    raw_messages: int  # stored messages the compile sends verbatim
    head_tokens: int
    summary_tokens: int
    recent_tokens: int
    audience_blocks_seen: int
    summaries_per_level: dict[int, int]  # stored on this branch: what `ctxrt inspect` lists per namespace
    summaries_used: int  # of those, the ones the compile sends
    foreign_markers: list[str]

    @property
    def summaries(self) -> int:
        return sum(self.summaries_per_level.values())


@attrs.define
class Sample:
    """One turn's message as two readers' requests carry it, and a summary one reader's sends."""

    message_id: str  # a message holding a line meant for ``reader`` alone
    reader: str
    other: str
    as_reader: list[str]  # its text blocks in ``reader``'s compiled request
    as_other: list[str]  # and in ``other``'s
    summary_id: str | None  # a summary ``reader``'s compile sends, what it covers, its opening
    summary_covers: str | None
    summary_text: str | None


@attrs.define
class DemoReport:
    store: Path
    messages: int  # turns written: a tool cycle is one turn of two messages, a call and its result
    model: str
    readers: list[ReaderReport]
    fork: str
    derived: str
    model_requests: int
    model_failures: int
    last_model_error: str | None
    leaks: list[str]
    written: int = 0  # messages written on main: the turns plus one result per tool cycle
    tool_cycles: int = 0
    sample: Sample | None = None

    @property
    def private(self) -> bool:
        return not self.leaks and all(not r.foreign_markers for r in self.readers)

    @property
    def problems(self) -> list[str]:
        """What went wrong, one line each; empty when the demo showed what it is for."""
        found = []
        if not self.private:
            found.append("privacy check failed: " + "; ".join(
                [*self.leaks[:3], *(f"{r.reader} on {r.branch} saw {m}" for r in self.readers
                                    for m in r.foreign_markers[:3])]))
        bare = [f"{r.reader} on {r.branch}" for r in self.readers if not r.summaries]
        if bare:
            if self.model_failures:
                why = (f"{self.model_failures} of {self.model_requests} compression requests to {self.model} failed"
                       + (f" (last: {self.last_model_error})" if self.last_model_error else ""))
            elif not self.model_requests:
                why = f"{self.messages} messages were too few to compress; try --messages 300 or more"
            else:
                why = f"{self.model} answered {self.model_requests} compression requests with no usable summary"
            found.append(f"compression made no summaries for {', '.join(bare)}: {why}")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems


class _Recording:
    """Wraps the model for one reader's namespace: every compression request it sends is
    checked for lines meant for someone else, and its failures are counted."""

    def __init__(self, model: Any, reader: str) -> None:
        self.model = model
        self.reader = reader
        self.requests = 0
        self.failures = 0
        self.last_error: str | None = None
        self.leaks: list[str] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        text = " ".join(getattr(b, "text", "") for m in request.messages for b in m.content)
        self.requests += 1
        self.leaks += [f"{self.reader} request saw a line for {other}" for other in MARKER.findall(text)
                       if other != self.reader]
        try:
            response: ModelResponse = await self.model.complete(request)
            return response
        except ModelError as exc:
            self.failures += 1
            self.last_error = str(exc)
            raise


def _line(rng: random.Random, index: int, speaker: str) -> str:
    topic = rng.choice(TOPICS)
    return f"{speaker.capitalize()} on {topic}: point {index} — " + " ".join(
        rng.choice(("we", "should", "check", "the", "numbers", "again", "before", "shipping", "it", "today"))
        for _ in range(rng.randint(8, 24))
    )


def choose_model() -> tuple[Any, str]:
    if os.environ.get("ANTHROPIC_API_KEY"):
        name = os.environ.get("CTXRT_DEMO_MODEL", "claude-sonnet-4-6")
        return AnthropicModel(), name
    return OfflineModel(), "offline"


# -- the store directory ----------------------------------------------------------------------


def _made_by_demo(store: Path) -> set[str]:
    """The names in ``store`` the demo may replace; raises DemoStoreError if it may not touch it.

    Raises:
        DemoStoreError: ``store`` is a file, or a non-empty directory without the demo's marker,
            or a marked one holding something the demo didn't make.
    """
    if not store.exists():
        return set()
    if not store.is_dir():
        raise DemoStoreError(f"demo store {store} is a file, not a directory; choose another --store")
    present = {entry.name for entry in store.iterdir()}
    if not present:
        return set()
    marker = store / STORE_MARKER
    if not marker.is_file():
        raise DemoStoreError(
            f"demo store {store} is not empty and is not a store the demo made (no {STORE_MARKER} marker in it); "
            f"the demo deletes only stores it made: choose another --store, or a new or empty directory")
    try:
        recorded = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError):
        recorded = []
    made = {STORE_MARKER, *STORE_FILE_NAMES, *(name for name in recorded if isinstance(name, str))}
    foreign = sorted(present - made)
    if foreign or any((store / name).is_dir() for name in present):
        shown = ", ".join(foreign[:5]) or "a directory"
        raise DemoStoreError(
            f"demo store {store} holds {shown}, which the demo didn't make; not replacing it: choose another --store")
    return present


async def _replace_own_store(store: Path, made: set[str]) -> None:
    """Delete the previous run's store files, unless another runtime holds the store.

    Raises:
        StoreLockedError: another runtime (a host, another demo) writes this store.
    """
    # Opening it as a writer takes the store's lock, so a store in use is refused before
    # anything is deleted. A store this version can't open at all is still the demo's own.
    try:
        async with open_runtime(store):
            pass
    except StoreLockedError as exc:
        raise StoreLockedError(exc.path, "the demo replaces its old store only when no runtime holds it; "
                                         "nothing was deleted") from None
    except (CtxrtError, *BACKEND_ERRORS):  # type: ignore[misc]  # a tuple of exception classes
        pass
    for name in sorted(made - {STORE_MARKER}):  # the marker stays, so a run interrupted here leaves the demo's store
        (store / name).unlink(missing_ok=True)


def _mark(store: Path, files: list[str]) -> None:
    store.mkdir(parents=True, exist_ok=True)
    (store / STORE_MARKER).write_text(json.dumps({"made_by": "ctxrt demo", "files": files}) + "\n")


async def _check_model(model: Any, name: str) -> None:
    """One small request before the run, so an unusable model fails in seconds, not after it.

    Raises:
        DemoModelError: the model raised ModelError (no credentials, unreachable, refused).
    """
    request = ModelRequest(name, "Reply with one word.", (CompiledMessage("user", (Text("Ready?"),)),), 16)
    try:
        await model.complete(request)
    except ModelError as exc:
        hint = "; unset ANTHROPIC_API_KEY to run the demo offline" if isinstance(model, AnthropicModel) else ""
        raise DemoModelError(f"compression model {name!r} failed a first request, so the demo would compress "
                             f"nothing: {exc}{hint}") from exc


# -- the run ----------------------------------------------------------------------------------


async def run_demo(
    store: Path, *, messages: int = 2000, seed: int = 7, progress: Callable[[int, int], None] | None = None,
    model: Any = None, model_name: str = "offline",
) -> DemoReport:
    """Run the demo into ``store`` (made, or replaced if an earlier run made it) and report.

    Raises:
        DemoStoreError: ``store`` is not new, empty or a store an earlier demo run made.
        StoreLockedError: another runtime holds ``store``; nothing was deleted.
        DemoModelError: the model failed a first small request; nothing was written.
    """
    made = _made_by_demo(store)  # refuse before anything else: the model check can take seconds
    rng = random.Random(seed)
    if model is None:
        model, model_name = choose_model()
    try:
        await _check_model(model, model_name)
        if made:
            await _replace_own_store(store, made)
        _mark(store, list(STORE_FILE_NAMES))  # before the runtime makes anything: a crashed run stays the demo's
        report = await _run(store, messages, rng, progress, model, model_name)
    finally:
        if isinstance(model, AnthropicModel):
            await model.aclose()  # handed to the namespaces, not to the runtime, so closed here
    _mark(store, sorted({*STORE_FILE_NAMES, *(entry.name for entry in store.iterdir())} - {STORE_MARKER}))
    return report


async def _run(store: Path, messages: int, rng: random.Random, progress: Callable[[int, int], None] | None,
               model: Any, model_name: str) -> DemoReport:
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
        tool_cycles = 0
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
                tool_cycles += 1
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
        sample = await _sample(managers["ann"], managers["bob"])
        fork = await managers["bob"].fork("demo-fork")
        await managers["bob"].add_message("bob", "A line only on the fork.")
        child = await managers["cy"].derive(branch="demo-derived")
        await child.add_message("cy", [{"type": "text", "text": "[for cy #-1] on the derived branch", "audience": ["cy"]}])
        reports = [await _reader_report(name, manager) for name, manager in (*managers.items(), ("cy", child))]
        if progress is not None:
            progress(messages, messages)
        await child.aclose()
        for manager in managers.values():
            await manager.aclose()
    return DemoReport(store, messages, model_name, reports, fork, "demo-derived",
                      sum(r.requests for r in recordings.values()), sum(r.failures for r in recordings.values()),
                      next((r.last_error for r in recordings.values() if r.last_error), None),
                      [leak for r in recordings.values() for leak in r.leaks],
                      messages + tool_cycles, tool_cycles, sample)


DEMO_BUDGET = Budget(max_tokens=12000, reserve_for_response=1000)


async def _sample(reader: Any, other: Any) -> Sample | None:
    """The newest message holding a line for ``reader`` alone, as each one's request carries it."""
    name = reader.view_reader
    mine, theirs = await reader.compile(DEMO_BUDGET), await other.compile(DEMO_BUDGET)
    stored = {m.id: m for m in await reader.get_all_messages()}

    def blocks(result: Any, message_id: str) -> list[str]:
        return [getattr(b, "text", f"[{b.type}]") for m, sources in zip(result.messages, result.provenance.messages)
                if any(s.id == message_id for s in sources) for b in m.content]

    sampled = next((message_id for sources in reversed(mine.provenance.messages) for s in sources
                    if s.kind == "message" and (message_id := s.id) in stored
                    and any(getattr(b, "audience", None) == (name,) for b in stored[message_id].content)
                    and blocks(theirs, message_id)), None)
    if sampled is None:
        return None
    summary = next((s for sources in mine.provenance.messages for s in sources if s.kind == "summary"), None)
    found = await reader.get_summary(summary.id) if summary is not None else None
    return Sample(sampled, name, other.view_reader, blocks(mine, sampled), blocks(theirs, sampled),
                  found.id if found else None, f"messages {found.first_id} to {found.last_id}" if found else None,
                  found.content if found else None)


async def _reader_report(name: str, manager: Any) -> ReaderReport:
    budget = DEMO_BUDGET
    result = await manager.compile(budget)
    preview = await manager.preview_context(budget)
    text = " ".join(getattr(b, "text", "") for m in result.messages for b in m.content)
    seen = MARKER.findall(text)
    # Every stored summary, merged ones too, as `ctxrt inspect` counts them (the default limit is 50).
    summaries = await manager.search_summaries(include_merged=True, limit=1 << 30)
    foreign = [m for m in re.findall(r"\[for (?:ann|bob|cy) #-?\d+\]", text) if f"[for {name} " not in m]
    foreign += [s.summary.id for s in summaries
                if any(other != name for other in MARKER.findall(s.summary.content))]
    sources = [source for sources in result.provenance.messages for source in sources]
    return ReaderReport(
        name, manager.branch, await manager.message_count(),
        len({s.id for s in sources if s.kind == "message" and s.complete is not None}),  # set for raw bodies only
        preview.head_tokens if preview else 0, preview.middle_tokens if preview else 0,
        preview.tail_tokens if preview else 0, sum(1 for r in seen if r == name),
        dict(sorted(Counter(s.summary.level for s in summaries).items())),
        len({s.id for s in sources if s.kind == "summary"}), foreign,
    )
