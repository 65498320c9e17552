"""Privacy as a state machine (spec/audience.md A2-A8, C6, C11, D1-D5): nothing reaches a reader it
isn't named for, and nothing named for a reader is lost to it.

Three readers (ann, bob, cy), each in its own namespace, and a namespace compiling for no reader,
all over the shared slot, under Autobiographical with small chunks. Rules add messages whose
blocks carry random audiences, edit audiences (narrowing and widening; refusals must leave the
message unchanged, and an edit that hides nothing is never refused), remove messages, compile,
tick, fork, derive and reopen derived managers. Every block's text holds a unique marker
``AUD[ann,bob]#17`` (the audience it was written with, then a number); the machine keeps, per
branch, every version of every message, so it knows who each marker was ever visible to.

After every step, for every live manager (reader r, branch b):
  * its compile, its provenance bodies, its summaries and every model request its namespaces
    sent hold no ``audience`` field and no marker r was never named for; a raw (not summarised)
    compiled block's marker is visible to r now;
  * its compile holds every marker visible to r in every version of its message on b, raw or
    inside a summary (the ScriptedModel echoes the markers it was shown into each summary).

The runtime lives in a trio loop on a background thread; rules call into it with
``trio.from_thread.run``. Bounded in ``make test``; ``CTXRT_SOAK=1`` scales the examples and steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import ctxrt
from ctxrt import Autobiographical, Budget, Text, ToolResult, codec
from ctxrt.content import hidden_by_edit
from ctxrt.testing import ScriptedModel

SOAK = os.environ.get("CTXRT_SOAK") == "1"
GUARD_S = 60
READERS = ("ann", "bob", "cy")
BIG = Budget(max_tokens=10_000_000, reserve_for_response=0)
MARKER = re.compile(r"AUD\[[a-z,*]*\]#(\d+)")
FILLER = " and then some ordinary words follow here"

T = TypeVar("T")
Audience = tuple[str, ...] | None
Version = dict[int, Audience]  # marker number -> its block's audience, for one version of a message


def visible(reader: str | None, audience: Audience) -> bool:
    return audience is None or (reader is not None and reader in audience)


def markers_in(text: str) -> list[int]:
    return [int(n) for n in MARKER.findall(text)]


def text_of(block: Any) -> str:
    if isinstance(block, Text):
        return block.text
    if isinstance(block, ToolResult):
        return block.content if isinstance(block.content, str) else " ".join(text_of(b) for b in block.content)
    return getattr(block, "thinking", "")


def echo_markers(request: ctxrt.ModelRequest) -> str:
    """A summary holding every marker the request showed, so whatever it read shows in what it wrote."""
    text = "\n".join(text_of(b) for m in request.messages for b in m.content)
    found = dict.fromkeys(re.findall(r"AUD\[[a-z,*]*\]#\d+", text))
    return "SUMMARY " + " ".join(found) + " remembered."


class TrioLoop:
    """A runtime held by ``trio.run`` on a background thread; ``run`` calls into it."""

    def __init__(self, path: str) -> None:
        self.failure: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(path,), name="ctxrt-privacy-loop", daemon=True)
        self._thread.start()
        if not self._ready.wait(GUARD_S):
            raise RuntimeError("the runtime's trio loop didn't start")
        if self.failure is not None:
            raise self.failure

    def _main(self, path: str) -> None:
        async def serve() -> None:
            async with ctxrt.open_runtime(path, durability="os") as runtime:
                self.runtime = runtime
                self.token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()

        try:
            trio.run(serve)
        except BaseException as exc:  # reported by close() (or at start)
            self.failure = exc
        finally:
            self._ready.set()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async def guarded() -> T:
            with trio.fail_after(GUARD_S):
                return await fn(*args)

        return trio.from_thread.run(guarded, trio_token=self.token)

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
            except trio.RunFinishedError:
                pass  # the loop ended on its own (a crash): its failure is raised below
            self._thread.join(GUARD_S)
        assert not self._thread.is_alive(), "the runtime's trio loop didn't stop"
        if self.failure is not None:
            raise self.failure


@attrs.define
class Handle:
    manager: ctxrt.ContextManager
    reader: str | None
    kind: str  # "main", "fork" or "derived"

    @property
    def branch(self) -> str:
        return self.manager.branch


audiences = st.one_of(
    st.none(), st.lists(st.sampled_from(READERS), min_size=1, max_size=3, unique=True).map(tuple)
)


class PrivacyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="ctxrt-privacy-")
        self.loop = TrioLoop(os.path.join(self.directory, "store"))
        self.models = {reader: ScriptedModel(echo_markers) for reader in (*READERS, None)}
        self.checked = {reader: 0 for reader in self.models}  # requests already checked, per model
        self.handles: list[Handle] = []
        self.history: dict[str, dict[str, list[Version]]] = {"main": {}}  # branch -> message id -> versions
        self.next_marker = 0
        self.branches = 0

    # -- set-up and teardown ----------------------------------------------------------------

    @initialize(seed=st.lists(st.lists(audiences, min_size=1, max_size=3), min_size=10, max_size=30))
    def open_managers(self, seed: list[list[Audience]]) -> None:
        config = Autobiographical("privacy-model", target_chunk_tokens=60, recent_window_tokens=60,
                                  head_window_tokens=0, merge_threshold=3, l1_holdback_chunks=0)
        rt = self.loop.runtime
        for reader in (*READERS, None):
            namespace = f"agents/{reader or 'nobody'}"
            manager = self.loop.run(lambda: rt.open(namespace, strategy=config, view_reader=reader,
                                                    model=self.models[reader]))
            assert manager.view_reader == reader
            self.handles.append(Handle(manager, reader, "main"))
        for index, blocks in enumerate(seed):
            self.add(index, [blocks], "user" if index % 2 else "Claude")

    def teardown(self) -> None:
        try:
            self.loop.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------

    def pick(self, index: int) -> Handle:
        return self.handles[index % len(self.handles)]

    def new_block(self, audience: Audience) -> tuple[int, dict[str, Any]]:
        number = self.next_marker
        self.next_marker += 1
        label = ",".join(audience) if audience else "*"
        block: dict[str, Any] = {"type": "text", "text": f"AUD[{label}]#{number}{FILLER}"}
        if audience is not None:
            block["audience"] = list(audience)
        return number, block

    def stored(self, handle: Handle) -> list[ctxrt.Message]:
        return list(self.loop.run(handle.manager.get_all_messages))

    def versions_of(self, branch: str, marker: int) -> list[Version]:
        return [v for versions in self.history[branch].values() for v in versions if marker in v]

    def ever_visible(self, reader: str | None, marker: int) -> bool:
        """Whether any version of the marker's block, on any branch, was visible to ``reader``."""
        return any(
            marker in version and visible(reader, version[marker])
            for messages in self.history.values() for versions in messages.values() for version in versions
        )

    def copy_history(self, parent: str, child: str) -> None:
        self.history[child] = {mid: list(versions) for mid, versions in self.history[parent].items()}

    # -- rules ------------------------------------------------------------------------------

    @rule(who=st.integers(0, 50),
          messages=st.lists(st.lists(audiences, min_size=1, max_size=3), min_size=1, max_size=8),
          participant=st.sampled_from(["user", "Claude"]))
    def add(self, who: int, messages: list[list[Audience]], participant: str) -> None:
        handle = self.pick(who)
        for blocks in messages:
            made = [self.new_block(audience) for audience in blocks]
            mid = self.loop.run(handle.manager.add_message, participant, [b for _, b in made])
            self.history[handle.branch][mid] = [{number: audience for (number, _), audience in zip(made, blocks)}]

    @rule(who=st.integers(0, 50), which=st.integers(0, 1000), position=st.integers(0, 10),
          audience=audiences, append=st.one_of(st.none(), audiences))
    def edit(self, who: int, which: int, position: int, audience: Audience, append: Audience | None) -> None:
        handle = self.pick(who)
        messages = self.stored(handle)
        if not messages:
            return
        message = messages[which % len(messages)]
        blocks = [
            {"type": "text", "text": b.text, **({"audience": list(b.audience)} if b.audience else {})}
            for b in message.content
        ]
        slot = position % len(blocks)
        blocks[slot] = {"type": "text", "text": blocks[slot]["text"], **({"audience": list(audience)} if audience else {})}
        added: tuple[int, dict[str, Any]] | None = None
        if append is not None:
            added = self.new_block(append)
            blocks.append(added[1])
        new_content = codec.blocks_from_content(blocks)
        names, others = hidden_by_edit(message.content, new_content)
        try:
            self.loop.run(handle.manager.edit_message, message.id, blocks)
        except ctxrt.NarrowingRefusedError:
            assert names or others, "an edit that hides nothing is never refused (D1)"
            assert self.loop.run(handle.manager.get_message, message.id) == message, "a refusal changes nothing"
            return
        assert not (handle.reader is None and (names or others)), "a manager for no reader may only widen (D5)"
        assert not (others or names - {handle.reader}), "hiding from another reader is always refused (D5)"
        version = {markers_in(b.text)[0]: b.audience for b in new_content}  # type: ignore[union-attr]
        self.history[handle.branch].setdefault(message.id, []).append(version)

    @rule(who=st.integers(0, 50), which=st.integers(0, 1000))
    def remove(self, who: int, which: int) -> None:
        handle = self.pick(who)
        messages = self.stored(handle)
        if messages:
            self.loop.run(handle.manager.remove_message, messages[which % len(messages)].id)  # never refused (D1)

    @rule(who=st.integers(0, 50), ticks=st.integers(1, 4))
    def tick(self, who: int, ticks: int) -> None:
        handle = self.pick(who)
        for _ in range(ticks):
            self.loop.run(handle.manager.tick)

    @rule(who=st.integers(0, 50))
    def drain(self, who: int) -> None:
        self.loop.run(self.pick(who).manager.wait_ready)

    @rule()
    def compress_everywhere(self) -> None:
        for handle in self.handles:
            self.loop.run(handle.manager.wait_ready)

    @rule(who=st.integers(0, 50), tokens=st.integers(50, 2000))
    def compile_small(self, who: int, tokens: int) -> None:
        handle = self.pick(who)
        result = self.loop.run(handle.manager.compile, Budget(max_tokens=tokens, reserve_for_response=0))
        self.check_leaks(handle, result)

    @precondition(lambda self: self.branches < 4)
    @rule(reader=st.sampled_from((*READERS, None)))
    def fork(self, reader: str | None) -> None:
        rt = self.loop.runtime
        namespace = f"agents/{reader or 'nobody'}"
        manager = self.loop.run(lambda: rt.open(namespace, view_reader=reader))
        assert manager.view_reader == reader
        self.branches += 1
        name = self.loop.run(manager.fork, f"fork-{self.branches}")
        self.copy_history("main", name)
        self.handles.append(Handle(manager, reader, "fork"))

    @precondition(lambda self: self.branches < 4)
    @rule(who=st.integers(0, 50))
    def derive(self, who: int) -> None:
        parent = self.pick(who)
        self.branches += 1
        name = f"derived-{self.branches}"
        child = self.loop.run(lambda: parent.manager.derive(branch=name))
        assert child.view_reader == parent.reader, "a child compiles for its parent's reader (C11)"
        self.copy_history(parent.branch, name)
        self.handles.append(Handle(child, parent.reader, "derived"))

    @precondition(lambda self: any(h.kind == "derived" for h in self.handles))
    @rule(which=st.integers(0, 50))
    def reopen_derived(self, which: int) -> None:
        derived = [i for i, h in enumerate(self.handles) if h.kind == "derived"]
        index = derived[which % len(derived)]
        old = self.handles[index]
        derivation = old.manager.derivation
        assert derivation is not None
        self.loop.run(old.manager.aclose)
        restored = ctxrt.Derivation(**json.loads(json.dumps(attrs.asdict(derivation))))
        manager = self.loop.run(lambda: self.loop.runtime.reopen_derived(restored))
        assert manager.view_reader == old.reader, "reopened, it compiles for its branch's reader (C11)"
        self.handles[index] = Handle(manager, old.reader, "derived")

    # -- checks -----------------------------------------------------------------------------

    def check_leaks(self, handle: Handle, result: ctxrt.CompileResult) -> None:
        """No audience field, no marker the reader was never named for; raw blocks visible now."""
        reader = handle.reader
        assert '"audience"' not in json.dumps(result.to_anthropic(assistant="Claude"))
        current = {number: audience for m in self.stored(handle) for b in m.content
                   for number, audience in [(markers_in(b.text)[0], b.audience)]}  # type: ignore[union-attr]
        for message, sources in zip(result.messages, result.provenance.messages):
            assert all(getattr(b, "audience", None) is None for b in message.content)
            summarised = any(s.kind == "summary" for s in sources)
            for number in markers_in(" ".join(text_of(b) for b in message.content)):
                assert self.ever_visible(reader, number), f"marker #{number} reached {reader!r}'s compile"
                if not summarised:
                    assert number in current and visible(reader, current[number]), (
                        f"raw marker #{number} in {reader!r}'s compile is not visible to it now"
                    )
        for body in result.provenance.raw_bodies.values():
            for b in body.content:
                assert getattr(b, "audience", None) is None
                for number in markers_in(text_of(b)):
                    assert visible(reader, current.get(number, ())), f"raw body #{number} for {reader!r}"

    @invariant()
    def nothing_leaks_and_nothing_is_lost(self) -> None:
        for handle in self.handles:
            reader = handle.reader
            result = self.loop.run(handle.manager.compile, BIG)
            self.check_leaks(handle, result)
            compiled = set(markers_in(" ".join(text_of(b) for m in result.messages for b in m.content)))
            for message in self.stored(handle):
                versions = self.history[handle.branch].get(message.id, [])
                for b in message.content:
                    number = markers_in(b.text)[0]  # type: ignore[union-attr]
                    if versions and all(number in v and visible(reader, v[number]) for v in versions):
                        assert number in compiled, (
                            f"#{number}, visible to {reader!r} in every version of message {message.id}, is "
                            f"missing from its compile on {handle.branch!r}"
                        )
            summaries = self.loop.run(lambda: handle.manager.search_summaries(limit=1_000_000, include_merged=True))
            for match in summaries:
                for number in markers_in(match.summary.content):
                    assert self.ever_visible(reader, number), f"#{number} in a summary for {reader!r}"
        for reader, model in self.models.items():
            for request in model.requests[self.checked[reader]:]:
                assert all(getattr(b, "audience", None) is None for m in request.messages for b in m.content)
                text = " ".join(text_of(b) for m in request.messages for b in m.content)
                for number in markers_in(text):
                    assert self.ever_visible(reader, number), f"#{number} in a request for {reader!r}"
            self.checked[reader] = len(model.requests)


PrivacyMachine.TestCase.settings = settings(
    max_examples=150 if SOAK else 10,
    stateful_step_count=60 if SOAK else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPrivacy = pytest.mark.soak(PrivacyMachine.TestCase)
