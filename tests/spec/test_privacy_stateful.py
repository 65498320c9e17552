"""Privacy as a state machine (A2-A8, C6, C11, D1-D5): nothing reaches a reader it
isn't named for, and nothing named for a reader is lost to it.

Three readers (ann, bob, cy), each in its own namespace, and a namespace compiling for no reader,
all over the shared slot, under Autobiographical with small chunks. Rules add messages whose
blocks carry random audiences (text, and every other kind: audio, video, generated images, tool
attempts and tool notices with audiences; tool uses, tool results, images and documents, which
carry none (B1), beside them, their host-only fields holding the marker too), edit audiences (narrowing and widening; refusals must leave the
message unchanged, and an edit that hides nothing is never refused), remove messages, compile,
tick, fork, derive and reopen derived managers, add a message with a host state (M9: each branch
holds the one last set on it or before its fork, and none reaches a compile or a request), and
have the model refuse compression replies or answer them with a tool call (each unit then walks its refusal ladder, T12); a run may fold its middle by adaptive resolution (T10), kv-stable or flat. Every block's text holds a unique marker
``AUD[ann,bob]#17`` (the audience it was written with, then a number); the machine keeps, per
branch, every version of every message, so it knows who each marker was ever visible to.

After every step, for every live manager (reader r, branch b):
  * its compile, its three request bodies (Anthropic, Chat Completions, Responses), its provenance
    bodies, its summaries and every model request its namespaces sent hold no ``audience`` field
    and no marker r was never named for; a raw (not summarised)
    compiled block's marker is visible to r now;
  * its compile holds every marker visible to r in every version of its message on b, raw or
    inside a summary (the ScriptedModel echoes the markers it was shown into each summary); a
    tool use or result left unpaired, and an image's or a document's marker (in fields no
    summarising model is shown), aside.

Branches come and go under live managers (L5): a rule deletes a branch and
creates one of the same name from another branch. Every manager on the deleted branch is
retired: from then on each of its calls raises ``BranchNotFoundError`` and writes nothing, on
the new incarnation least of all; a manager opened on the new branch reads only what that
branch holds.

Calls are cancelled at random checkpoints (L3, L4): a compile, add_message, edit,
tick or open runs in a cancel scope a sibling task cancels after k ``trio.lowlevel.checkpoint()``s.
A request that reached an actor is carried out whole, so once the actors have caught up the
machine records what landed (a message, an edit), and the store's reader record is what the
namespace actor enforces: its memory agrees with the store, a manager for another reader is
refused, and a manager opened with no reader before a claim that landed is refused from then on.

The runtime lives in a trio loop on a background thread; rules call into it with
``trio.from_thread.run``. Bounded in ``make test`` (10 examples of 25 steps on LMDB, 7 on PostgreSQL);
``CTXRT_SOAK=1`` scales the examples and steps (150 of 60 on each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import base64
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import PostgresSchema

import ctxrt
from ctxrt import (
    Audio,
    Autobiographical,
    Budget,
    Document,
    GeneratedImage,
    Image,
    ModelResponse,
    Text,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Usage,
    Video,
)
from ctxrt.testing import (
    Atomically,
    CorruptRecord,
    ScriptedModel,
    blocks_from_content,
    hidden_by_edit,
    record_from_value,
    states,
)

SOAK = os.environ.get("CTXRT_SOAK") == "1"
GUARD_S = 60
READERS = ("ann", "bob", "cy")
BIG = Budget(max_tokens=10_000_000, reserve_for_response=0)
MARKER = re.compile(r"AUD\[[a-z,*]*\]#(\d+)")
FILLER = " and then some ordinary words follow here"
HOST_SECRET = "HOST-STATE-SECRET-"  # what the host state holds (M9): never in a compile or a request

T = TypeVar("T")
Audience = tuple[str, ...] | None
Version = dict[int, Audience]  # marker number -> its block's audience, for one version of a message


def visible(reader: str | None, audience: Audience) -> bool:
    return audience is None or (reader is not None and reader in audience)


def markers_in(text: str) -> list[int]:
    return [int(n) for n in MARKER.findall(text)]


def text_of(block: Any) -> str:
    """Every string a block holds, in any field (a transcript, a prompt, a tool call's raw XML, an
    image's source URL, a document's file name...), nested blocks and mappings included."""
    if type(block) is Text:  # the most of them, first
        return block.text
    if isinstance(block, str):
        return block
    if isinstance(block, Mapping):
        return " ".join(text_of(value) for value in block.values())
    if isinstance(block, (tuple, list)):
        return " ".join(text_of(value) for value in block)
    if attrs.has(type(block)):
        return " ".join(text_of(getattr(block, field.name)) for field in attrs.fields(type(block))
                        if field.name not in ("audience", "source"))
    return ""


def marker_of(block: Any) -> int:
    """The marker number the machine wrote into the block (each block it writes holds one)."""
    return markers_in(text_of(block))[0]


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

    def run_cancelled(self, checkpoints: int, fn: Callable[..., Awaitable[T]], *args: Any) -> tuple[str, Any]:
        """Run ``fn(*args)`` in a cancel scope that a sibling task cancels after ``checkpoints``
        checkpoints of its own; returns ("returned", value), ("raised", error) or ("cancelled", None)."""

        async def cancelled() -> tuple[str, Any]:
            outcome: list[tuple[str, Any]] = []
            scope = trio.CancelScope()

            async def call() -> None:
                with scope:
                    try:
                        outcome.append(("returned", await fn(*args)))
                    except ctxrt.CtxrtError as exc:
                        outcome.append(("raised", exc))

            async def cancel() -> None:
                for _ in range(checkpoints):
                    await trio.lowlevel.checkpoint()
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                nursery.start_soon(cancel)
            return outcome[0] if outcome else ("cancelled", None)

        return self.run(cancelled)

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
    kind: str  # "main", "fork", "derived", "recreated" (on a branch made again under its name) or "fresh"

    @property
    def branch(self) -> str:
        return self.manager.branch


# How many checkpoints a cancelled call gets: most calls finish within a handful, so small
# counts cut them at every await on their way (in the caller, the actor's mailbox, the store).
CHECKPOINTS = st.one_of(st.integers(0, 6), st.integers(0, 30))

# The kinds a message may hold besides text. The first five carry an audience; a tool use, a tool
# result, an image and a document can't (B1): every reader's, their host-only fields (raw_xml,
# unparseable_input, tool_name, source_url, filename) still hold the block's marker.
KINDS = ("audio", "video", "generated_image", "tool_attempt", "tool_notice", "tool_use", "tool_result", "image",
         "document")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()


def other_block(kind: str, marker: str, audience: Audience) -> Any:
    """A block of ``kind`` holding ``marker`` in each of its strings."""
    media = {"type": "base64", "data": base64.b64encode(marker.encode()).decode()}
    text = f"{marker}{FILLER}"
    if kind in ("audio", "video"):
        cls = Audio if kind == "audio" else Video
        return cls({**media, "media_type": f"{kind}/{'wav' if kind == 'audio' else 'mp4'}"}, transcript=text,
                   audience=audience)
    if kind == "generated_image":
        return GeneratedImage({"type": "base64", "media_type": "image/png", "data": PNG}, prompt=text, audience=audience)
    if kind == "tool_attempt":
        return ToolAttempt("lookup", {"q": marker}, raw_xml=f"<lookup>{marker}</lookup>", reason=text, audience=audience)
    if kind == "tool_notice":
        return ToolNotice([text], tool_name="lookup", audience=audience)
    number = markers_in(marker)[0]
    if kind == "tool_use":
        return ToolUse(f"toolu_{number}", "lookup", {"q": marker}, raw_xml=f"<lookup>{marker}</lookup>",
                       unparseable_input=f"{{{marker}")
    if kind == "tool_result":
        return ToolResult(f"toolu_{number}", text, tool_name=f"lookup {marker}")
    if kind == "image":
        return Image({"type": "base64", "media_type": "image/png", "data": PNG}, token_estimate=40,
                     source_url=f"https://example.com/{marker}")
    return Document({"type": "text", "media_type": "text/plain", "data": "a document"}, title=text,
                    filename=f"{marker}.txt")


audiences = st.one_of(
    st.none(), st.lists(st.sampled_from(READERS), min_size=1, max_size=3, unique=True).map(tuple)
)


class PrivacyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="ctxrt-privacy-")
        self.loop = TrioLoop(self.location())
        self.refusing = 0  # the next model replies refused or calling a tool: the ladder's rungs (T12)
        self.models = {reader: ScriptedModel(self.reply) for reader in (*READERS, None)}
        self.checked = {reader: 0 for reader in self.models}  # requests already checked, per model
        self.handles: list[Handle] = []
        self.history: dict[str, dict[str, list[Version]]] = {"main": {}}  # branch -> message id -> versions
        self.next_marker = 0
        self.branches = 0
        self.retired: list[Handle] = []  # managers on a deleted branch: every call raises BranchNotFoundError
        self.graveyard: list[dict[str, list[Version]]] = []  # the histories of deleted branches
        self.recreated = 0
        self.fresh = 0  # namespaces opened (and claimed, or not) under a cancelled open
        self.attempts = 0  # names of branches a retired manager tried to make
        self.host: dict[str, Any] = {"main": None}  # branch -> the host state "privacy" it holds (M9)

    # -- set-up and teardown ----------------------------------------------------------------

    @initialize(seed=st.lists(st.lists(audiences, min_size=1, max_size=3), min_size=10, max_size=30),
                folding=st.sampled_from((None, "kv-stable", "flat")))
    def open_managers(self, seed: list[list[Audience]], folding: str | None) -> None:
        # folding: adaptive resolution (T10) picks which summaries a small compile shows, and
        # asks for the summaries it lacks (merges of its own): none may carry a block past its audience.
        config = Autobiographical("privacy-model", target_chunk_tokens=60, recent_window_tokens=60,
                                  head_window_tokens=0, merge_threshold=3, l1_holdback_chunks=0,
                                  adaptive_resolution=folding is not None, folding=folding or "kv-stable")
        self.config = config
        rt = self.loop.runtime
        for reader in (*READERS, None):
            namespace = f"agents/{reader or 'nobody'}"
            manager = self.loop.run(lambda: rt.open(namespace, strategy=config, view_reader=reader,
                                                    model=self.models[reader]))
            assert manager.view_reader == reader
            self.handles.append(Handle(manager, reader, "main"))
        for index, blocks in enumerate(seed):
            self.add(index, [blocks], "user" if index % 2 else "Claude")

    def location(self) -> str:
        """Where the runtime's store is: a directory (``PostgresPrivacyMachine``: a database)."""
        return os.path.join(self.directory, "store")

    def teardown(self) -> None:
        try:
            self.loop.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------

    def pick(self, index: int) -> Handle:
        return self.handles[index % len(self.handles)]

    def new_block(self, audience: Audience, kind: str = "text") -> tuple[int, Any]:
        number = self.next_marker
        self.next_marker += 1
        if kind not in ("text", *KINDS[:5]):
            audience = None  # B1: this kind carries none
        label = ",".join(audience) if audience else "*"
        if kind != "text":
            return number, other_block(kind, f"AUD[{label}]#{number}", audience)
        block: dict[str, Any] = {"type": "text", "text": f"AUD[{label}]#{number}{FILLER}"}
        if audience is not None:
            block["audience"] = list(audience)
        return number, block

    def stored(self, handle: Handle) -> list[ctxrt.Message]:
        return list(self.loop.run(handle.manager.get_all_messages))

    def versions_of(self, branch: str, marker: int) -> list[Version]:
        return [v for versions in self.history[branch].values() for v in versions if marker in v]

    def ever_visible(self, reader: str | None) -> set[int]:
        """The markers whose block was visible to ``reader`` in some version, on some branch (one
        pass over the history, not one per marker looked up: that search was a sixth of a run)."""
        return {
            marker
            for messages in (*self.history.values(), *self.graveyard)
            for versions in messages.values() for version in versions
            for marker, audience in version.items() if visible(reader, audience)
        }

    def copy_history(self, parent: str, child: str) -> None:
        self.history[child] = {mid: list(versions) for mid, versions in self.history[parent].items()}
        self.host[child] = self.host[parent]  # every branch is made at its parent's head

    def record_edit(self, handle: Handle, message: ctxrt.Message, new_content: Any) -> None:
        """An edit that went through: legal (D1, D5), and a new version of the message on its branch."""
        names, others = hidden_by_edit(message.content, new_content)
        assert not (handle.reader is None and (names or others)), "a manager for no reader may only widen (D5)"
        assert not (others or names - {handle.reader}), "hiding from another reader is always refused (D5)"
        version = {marker_of(b): getattr(b, "audience", None) for b in new_content}
        self.history[handle.branch].setdefault(message.id, []).append(version)

    def edited_blocks(self, message: ctxrt.Message, position: int, audience: Audience,
                      append: Audience | None) -> list[Any]:
        """The message's blocks with the one at ``position`` given ``audience`` (and a block appended);
        a kind that carries no audience (B1) stays as it is."""
        blocks: list[Any] = [
            {"type": "text", "text": b.text, **({"audience": list(b.audience)} if b.audience else {})}
            if isinstance(b, Text) else b for b in message.content
        ]
        slot = position % len(blocks)
        if isinstance(blocks[slot], dict):
            blocks[slot] = {"type": "text", "text": blocks[slot]["text"], **({"audience": list(audience)} if audience else {})}
        elif isinstance(blocks[slot], (Audio, Video, GeneratedImage, ToolAttempt, ToolNotice)):
            blocks[slot] = attrs.evolve(blocks[slot], audience=audience)
        if append is not None:
            blocks.append(self.new_block(append)[1])
        return blocks

    def record(self, namespace: str, branch: str) -> Any:
        """The reader record the store holds for ``namespace`` on ``branch``."""
        engine = self.loop.runtime.engine
        return record_from_value(engine.read_value(states.reader_state(namespace), engine.branch(branch).id))

    def live_branches(self) -> list[str]:
        return sorted(self.history)

    async def caught_up(self, manager: ctxrt.ContextManager) -> None:
        """Wait until the store actor and ``manager``'s namespace actor have handled everything sent
        before: an empty transaction queues behind any write still in the store's mailbox, and a
        health report behind any command still in the namespace actor's (L4)."""
        await self.loop.runtime.store.ask(Atomically(commands=()))
        await manager.health()

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

    @rule(who=st.integers(0, 50), participant=st.sampled_from(["user", "Claude"]),
          blocks=st.lists(st.tuples(st.sampled_from(("text", *KINDS)), audiences), min_size=1, max_size=4))
    def add_other_kinds(self, who: int, participant: str, blocks: list[tuple[str, Audience]]) -> None:
        """A2-A8 for every kind of block: audio, video, a generated image, a tool attempt and a tool
        notice for their audiences; a tool use, a tool result, an image and a document beside them."""
        handle = self.pick(who)
        made = [self.new_block(audience, kind) for kind, audience in blocks]
        mid = self.loop.run(handle.manager.add_message, participant, [b for _, b in made])
        self.history[handle.branch][mid] = [{number: (tuple(b["audience"]) if b.get("audience") else None)
                                             if isinstance(b, dict) else getattr(b, "audience", None)
                                             for number, b in made}]

    @rule(who=st.integers(0, 50), which=st.integers(0, 1000), position=st.integers(0, 10),
          audience=audiences, append=st.one_of(st.none(), audiences))
    def edit(self, who: int, which: int, position: int, audience: Audience, append: Audience | None) -> None:
        handle = self.pick(who)
        messages = self.stored(handle)
        if not messages:
            return
        message = messages[which % len(messages)]
        blocks = self.edited_blocks(message, position, audience, append)
        new_content = blocks_from_content(blocks)
        names, others = hidden_by_edit(message.content, new_content)
        try:
            self.loop.run(handle.manager.edit_message, message.id, blocks)
        except ctxrt.NarrowingRefusedError:
            assert names or others, "an edit that hides nothing is never refused (D1)"
            assert self.loop.run(handle.manager.get_message, message.id) == message, "a refusal changes nothing"
            return
        self.record_edit(handle, message, new_content)

    @rule(who=st.integers(0, 50), which=st.integers(0, 1000))
    def remove(self, who: int, which: int) -> None:
        handle = self.pick(who)
        messages = self.stored(handle)
        if messages:
            self.loop.run(handle.manager.remove_message, messages[which % len(messages)].id)  # never refused (D1)

    @rule(who=st.integers(0, 50), audience=audiences)
    def add_with_host_state(self, who: int, audience: Audience) -> None:
        """M9: a message and the host state set with it; the state is the host's, never compiled."""
        handle = self.pick(who)
        number, block = self.new_block(audience)
        value = {"secret": f"{HOST_SECRET}{number}"}
        mid = self.loop.run(lambda: handle.manager.add_message("user", [block], host_state={"privacy": value}))
        self.history[handle.branch][mid] = [{number: audience}]
        self.host[handle.branch] = value

    @rule(who=st.integers(0, 50), ticks=st.integers(1, 4))
    def tick(self, who: int, ticks: int) -> None:
        handle = self.pick(who)
        for _ in range(ticks):
            self.loop.run(handle.manager.tick)

    def reply(self, request: ctxrt.ModelRequest) -> ModelResponse | str:
        if self.refusing > 0:
            self.refusing -= 1
            if self.refusing % 2:
                return ModelResponse((Text("I can't help with that."),), "refusal", Usage(1, 1))
            return ModelResponse((ToolUse("t1", "lookup", {}),), "tool_use", Usage(1, 1))
        return echo_markers(request)

    @rule(count=st.integers(1, 12))
    def refuse(self, count: int) -> None:
        """The next ``count`` compression replies are refusals or tool calls: every rung's request
        (plain text, source only, the split halves) is checked as every request is (T12, A1)."""
        self.refusing = count

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

    @rule(who=st.integers(0, 50), head=st.integers(0, 120), recent=st.integers(0, 200), chunk=st.integers(20, 120),
          threshold=st.integers(2, 4))
    def change_settings(self, who: int, head: int, recent: int, chunk: int, threshold: int) -> None:
        """Live settings (T14) move the zones and the chunking mid-run; what was made stays."""
        manager = self.pick(who).manager

        def change() -> Awaitable[ctxrt.ContextSettings]:
            return manager.update_context_settings(head_window_tokens=head, recent_window_tokens=recent,
                                                   target_chunk_tokens=chunk, merge_threshold=threshold)

        if isinstance(manager.strategy, Autobiographical):
            self.loop.run(change)
        else:  # a derived namespace reopened without a strategy runs Passthrough: it has no windows
            with pytest.raises(ctxrt.StrategyRefusedError, match="head_window_tokens"):
                self.loop.run(change)

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

    @precondition(lambda self: self.recreated < 3 and len(self.history) > 1)
    @rule(which=st.integers(0, 50), source=st.integers(0, 50), reader=st.sampled_from((*READERS, None)))
    def delete_and_recreate_branch(self, which: int, source: int, reader: str | None) -> None:
        """L5: delete a branch under its live managers, then make a branch of the same name from another."""
        rt = self.loop.runtime
        name = [b for b in self.live_branches() if b != "main"][which % (len(self.history) - 1)]
        on_it = [h for h in self.handles if h.branch == name]
        self.loop.run(rt.delete_branch, name)
        self.handles = [h for h in self.handles if h not in on_it]
        self.retired += on_it
        self.graveyard.append(self.history.pop(name))
        parent = self.live_branches()[source % len(self.history)]
        self.loop.run(lambda: rt.create_branch(name, from_branch=parent))
        self.copy_history(parent, name)
        self.recreated += 1
        for handle in on_it:  # the new incarnation changes nothing for them (the invariant checks again)
            self.check_retired(handle)
        namespace = f"agents/{reader or 'nobody'}"
        manager = self.loop.run(lambda: rt.open(namespace, view_reader=reader, branch=name, strategy=self.config,
                                                model=self.models[reader]))
        assert manager.view_reader == reader and manager.branch == name
        self.handles.append(Handle(manager, reader, "recreated"))

    @rule(who=st.integers(0, 50), call=st.sampled_from(["compile", "add", "edit", "tick"]),
          checkpoints=CHECKPOINTS, which=st.integers(0, 1000), position=st.integers(0, 10),
          audience=audiences, append=st.one_of(st.none(), audiences))
    def cancelled_call(self, who: int, call: str, checkpoints: int, which: int, position: int, audience: Audience,
                       append: Audience | None) -> None:
        """L3, L4: a call cancelled at a random checkpoint is carried out whole or not at all."""
        handle = self.pick(who)
        manager = handle.manager
        if call == "compile":
            outcome, value = self.loop.run_cancelled(checkpoints, manager.compile, BIG)
            assert outcome != "raised", value
        elif call == "tick":  # a unit that began runs to its end in the actor; only the answer is lost
            outcome, value = self.loop.run_cancelled(checkpoints, manager.tick)
            assert outcome != "raised", value
        elif call == "add":
            made = [self.new_block(audience), *([self.new_block(append)] if append is not None else [])]
            outcome, value = self.loop.run_cancelled(checkpoints, manager.add_message, "user", [b for _, b in made])
            assert outcome != "raised", value
            self.loop.run(self.caught_up, manager)
            numbers = {number for number, _ in made}
            landed = [m for m in self.stored(handle) if any(marker_of(b) in numbers for b in m.content)]
            assert len(landed) <= 1
            if landed:
                assert [marker_of(b) for b in landed[0].content] == [n for n, _ in made]
                self.history[handle.branch][landed[0].id] = [{number: a for (number, _), a in
                                                              zip(made, [audience, append])}]
        else:
            messages = self.stored(handle)
            if not messages:
                return
            message = messages[which % len(messages)]
            blocks = self.edited_blocks(message, position, audience, append)
            new_content = blocks_from_content(blocks)
            outcome, value = self.loop.run_cancelled(checkpoints, manager.edit_message, message.id, blocks)
            assert outcome != "raised" or isinstance(value, ctxrt.NarrowingRefusedError), value
            self.loop.run(self.caught_up, manager)
            after = self.loop.run(manager.get_message, message.id)
            assert after is not None
            if after != message:
                assert after.content == new_content, "an edit lands whole or not at all"
                self.record_edit(handle, message, new_content)
        self.check_record_enforced(handle.manager, handle.manager.namespace, handle.branch)

    @precondition(lambda self: self.fresh < 3)
    @rule(reader=st.sampled_from((*READERS, None)), checkpoints=CHECKPOINTS, holder=st.booleans(),
          where=st.integers(0, 50))
    def cancelled_open(self, reader: str | None, checkpoints: int, holder: bool, where: int) -> None:
        """L4, C1, C8, C13: an open of an unclaimed namespace cancelled at a random checkpoint leaves it
        claimed or not; either way the actor enforces what the store records."""
        rt = self.loop.runtime
        branch = self.live_branches()[where % len(self.history)]
        namespace = f"agents/fresh-{self.fresh}"
        self.fresh += 1
        # The model of the reader it may be claimed for: its requests are checked against that
        # reader, and a request for the no-reader view holds only what every reader sees.
        model = self.models[reader]

        def open_for(view_reader: str | None) -> Callable[[], Awaitable[ctxrt.ContextManager]]:
            return lambda: rt.open(namespace, view_reader=view_reader, branch=branch, strategy=self.config,
                                   model=model)

        before = self.loop.run(open_for(None)) if holder else None  # keeps the actor up across the claim
        outcome, opened = self.loop.run_cancelled(checkpoints, open_for(reader))
        assert outcome != "raised", opened
        probe = opened if outcome == "returned" else self.loop.run(open_for(None))  # queued behind the open
        record = self.record(namespace, branch)
        assert record in (None, reader), f"the record is the cancelled open's claim or none: {record!r}"
        if outcome == "returned":
            assert record == reader, "a completed open claimed"
        assert probe.view_reader == record, "a manager opened with no reader compiles for the record (C6)"
        self.check_record_enforced(probe, namespace, branch)
        if before is not None:
            if record is None:
                self.loop.run(before.compile, BIG)
            else:
                with pytest.raises(ctxrt.ReaderConflictError):  # opened before the claim: refused from it on (C8)
                    self.loop.run(before.compile, BIG)
            self.loop.run(before.aclose)
        self.handles.append(Handle(probe, record, "fresh"))

    # -- checks -----------------------------------------------------------------------------

    def check_record_enforced(self, manager: ctxrt.ContextManager, namespace: str, branch: str) -> None:
        """The namespace actor's record is the store's, and a manager for another reader is refused (L4, C1)."""
        record = self.record(namespace, branch)
        assert not isinstance(record, CorruptRecord)
        snapshot = self.loop.run(manager.inspect)
        assert snapshot.record == record, f"the actor enforces {snapshot.record!r}, the store records {record!r}"
        if record is None:
            return  # any reader's open would claim it: nothing to refuse
        rt = self.loop.runtime
        for other in READERS:
            if other != record:
                with pytest.raises(ctxrt.ReaderConflictError):
                    self.loop.run(lambda other=other: rt.open(namespace, view_reader=other, branch=branch))
        assert self.record(namespace, branch) == record

    def retired_calls(self, manager: ctxrt.ContextManager) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        """Every call of a manager, each meant to raise BranchNotFoundError once its branch is deleted
        (``list_branches`` too: its own test below; ``aclose`` never raises)."""
        self.attempts += 1
        made = f"retired-attempt-{self.attempts}"
        mid = "1"

        async def sync(fn: Callable[[], Any]) -> Any:
            return fn()

        return [
            ("compile", lambda: manager.compile(BIG)),
            ("preview_context", lambda: manager.preview_context(BIG)),
            ("add_message", lambda: manager.add_message("user", "RETIRED-WRITE")),
            ("edit_message", lambda: manager.edit_message(mid, "RETIRED-WRITE")),
            ("remove_message", lambda: manager.remove_message(mid)),
            ("remove_messages", lambda: manager.remove_messages(mid, mid)),
            ("get_message", lambda: manager.get_message(mid)),
            ("get_all_messages", manager.get_all_messages),
            ("message_count", manager.message_count),
            ("get_message_window", lambda: manager.get_message_window(0, 10)),
            ("query_messages", manager.query_messages),
            ("tick", manager.tick),
            ("is_ready", manager.is_ready),
            ("wait_ready", manager.wait_ready),
            ("health", manager.health),
            ("inspect", manager.inspect),
            ("hold_compression", lambda: manager.hold_compression([mid])),
            ("release_compression", lambda: manager.release_compression([mid])),
            ("search_summaries", manager.search_summaries),
            ("get_summaries_in_range", manager.get_summaries_in_range),
            ("get_summary", lambda: manager.get_summary("L1-0")),
            ("reset_head_window", lambda: manager.reset_head_window("RETIRED-WRITE")),
            ("set_strategy", lambda: manager.set_strategy(self.config)),
            ("switch_branch", lambda: manager.switch_branch("main")),
            ("fork", lambda: manager.fork(made + "-fork")),
            ("branch_at", lambda: manager.branch_at(mid, made + "-at")),
            ("derive", lambda: manager.derive(branch=made + "-derived")),
            ("set_system_prompt", lambda: sync(lambda: manager.set_system_prompt("RETIRED-WRITE"))),
            ("set_tool_definitions", lambda: sync(lambda: manager.set_tool_definitions([{"name": "retired"}]))),
        ]

    def check_retired(self, handle: Handle) -> None:
        """L5: every call of a manager on a deleted branch raises BranchNotFoundError and writes nothing."""
        engine = self.loop.runtime.engine
        before = engine.last_sequence
        for name, call in self.retired_calls(handle.manager):
            with pytest.raises(ctxrt.BranchNotFoundError):
                self.loop.run(call)
            assert engine.last_sequence == before, f"{name} on a retired manager wrote to the store"
        branches = {b.name for b in engine.list_branches()}
        assert not any(b.startswith("retired-attempt-") for b in branches)

    def check_leaks(self, handle: Handle, result: ctxrt.CompileResult) -> None:
        """No audience field, no marker the reader was never named for; raw blocks visible now."""
        reader = handle.reader
        ever_visible = self.ever_visible(reader)
        forms = (lambda: result.to_anthropic(assistant="Claude", strict=True),
                 lambda: result.to_openai_chat(assistant="Claude"), lambda: result.to_openai_responses(assistant="Claude"))
        for form in forms:  # the request bodies, each form's own rendering of every kind of block
            try:
                body = json.dumps(form())
            except ctxrt.EmptyRequestError:  # P8: a reader who sees nothing has nothing to send
                assert not any(b for m in result.messages for b in m.content if getattr(b, "text", "x").strip())
                continue
            assert '"audience"' not in body
            assert set(markers_in(body)) <= ever_visible, f"a marker reached {reader!r}'s request body"
        current = {number: audience for m in self.stored(handle) for b in m.content
                   for number, audience in [(marker_of(b), getattr(b, "audience", None))]}
        for message, sources in zip(result.messages, result.provenance.messages):
            assert all(getattr(b, "audience", None) is None for b in message.content)
            summarised = any(s.kind == "summary" for s in sources)
            for number in markers_in(" ".join(text_of(b) for b in message.content)):
                assert number in ever_visible, f"marker #{number} reached {reader!r}'s compile"
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
    def host_state_is_branched_and_never_sent(self) -> None:
        """M9: each branch holds the host state last set on it or on its parent before the fork,
        and no model request ever holds it (nor a compile: ``nothing_leaks_and_nothing_is_lost``)."""
        for branch in self.live_branches():
            state = self.loop.run(lambda: self.loop.runtime.host_state("privacy", branch=branch))
            assert self.loop.run(state.get) == self.host[branch], branch
        for model in self.models.values():
            assert not any(HOST_SECRET in text_of(b) for r in model.requests for m in r.messages for b in m.content)

    @invariant()
    def retired_managers_stay_retired(self) -> None:
        for handle in self.retired:
            self.check_retired(handle)

    @invariant()
    def nothing_leaks_and_nothing_is_lost(self) -> None:
        for handle in self.handles:
            reader = handle.reader
            result = self.loop.run(handle.manager.compile, BIG)
            self.check_leaks(handle, result)
            compiled_text = " ".join(text_of(b) for m in result.messages for b in m.content)
            assert HOST_SECRET not in compiled_text, "a host state reached a compile (M9)"
            compiled = set(markers_in(compiled_text))
            for message in self.stored(handle):
                assert message.id in self.history[handle.branch], (
                    f"message {message.id} on {handle.branch!r} was written by no call the machine made"
                )
                versions = self.history[handle.branch].get(message.id, [])
                for b in message.content:
                    number = marker_of(b)
                    if isinstance(b, (ToolUse, ToolResult, Image, GeneratedImage, Document)):
                        # A call or result without its pair is left out of a compile (P8); an image's or
                        # a document's marker sits where a summarising model isn't shown it (a source
                        # URL, a prompt, a title, a file name), so its summary can't echo it: no loss.
                        continue
                    if versions and all(number in v and visible(reader, v[number]) for v in versions):
                        assert number in compiled, (
                            f"#{number}, visible to {reader!r} in every version of message {message.id}, is "
                            f"missing from its compile on {handle.branch!r}"
                        )
            summaries = self.loop.run(lambda: handle.manager.search_summaries(limit=1_000_000, include_merged=True))
            ever_visible = self.ever_visible(reader)
            for match in summaries:
                for number in markers_in(match.summary.content):
                    assert number in ever_visible, f"#{number} in a summary for {reader!r}"
        for reader, model in self.models.items():
            ever_visible = self.ever_visible(reader)
            for request in model.requests[self.checked[reader]:]:
                assert all(getattr(b, "audience", None) is None for m in request.messages for b in m.content)
                text = " ".join(text_of(b) for m in request.messages for b in m.content)
                for number in markers_in(text):
                    assert number in ever_visible, f"#{number} in a request for {reader!r}"
            self.checked[reader] = len(model.requests)

    @rule(who=st.integers(0, 50), tokens=st.integers(50, 2000))
    def record_request(self, who: int, tokens: int) -> None:
        """Q4: a request recorded in a namespace's ledger (turned on here for the namespace, with its
        compression calls from then on) holds nothing its reader was never named for: its record,
        read back, and the body rebuilt from it."""
        handle = self.pick(who)
        manager, rt = handle.manager, self.loop.runtime
        on = self.loop.run(lambda: rt.open(manager.namespace, branch=manager.branch, ledger=True))
        self.loop.run(on.aclose)
        result = self.loop.run(manager.compile, Budget(max_tokens=tokens, reserve_for_response=0))
        try:
            self.loop.run(lambda: manager.record_request(result, form="anthropic", options={"assistant": "Claude"}))
        except ctxrt.EmptyRequestError:  # P8: nothing to send, nothing recorded
            return
        self.check_ledger(handle)

    def check_ledger(self, handle: Handle) -> None:
        """Q4: no entry of the handle's ledger (records, compression calls) names or holds a marker
        its reader was never named for, nor an audience; rebuilt, none carries one either."""
        reader, manager = handle.reader, handle.manager
        ever_visible = self.ever_visible(reader)
        for record in self.loop.run(lambda: manager.requests(limit=1_000_000)):
            assert record.reader == reader and record.namespace == manager.namespace
            kept = repr(attrs.asdict(record))
            assert "audience" not in kept, f"a ledger entry of {reader!r} holds an audience"
            for number in markers_in(kept):
                assert number in ever_visible, f"#{number} in a ledger entry of {reader!r}"
            if record.form == "anthropic":
                body = json.dumps(self.loop.run(lambda r=record: manager.rebuild_request(r)).body)
                assert '"audience"' not in body
                for number in markers_in(body):
                    assert number in ever_visible, f"#{number} in a rebuilt request of {reader!r}"


async def test_list_branches_of_a_manager_on_a_deleted_branch_raises_branch_not_found(
    runtime: ctxrt.Runtime,
) -> None:
    """L5: list_branches is one of a retired manager's calls: it raises BranchNotFoundError, after a branch of the same name is made too."""
    manager = await runtime.open("agents/ann", view_reader="ann")
    await manager.fork("doomed")
    await runtime.delete_branch("doomed")
    with pytest.raises(ctxrt.BranchNotFoundError):
        await manager.list_branches()
    await runtime.create_branch("doomed")
    with pytest.raises(ctxrt.BranchNotFoundError):
        await manager.list_branches()


PrivacyMachine.TestCase.settings = settings(
    max_examples=150 if SOAK else 10,
    stateful_step_count=60 if SOAK else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPrivacy = pytest.mark.soak(PrivacyMachine.TestCase)


class PostgresPrivacyMachine(PrivacyMachine):
    """The same rules with the store in PostgreSQL: each example in a schema of its own."""

    def __init__(self, database_url: str) -> None:
        self.schema = PostgresSchema(database_url)
        super().__init__()

    def location(self) -> str:
        return self.schema.url

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.schema.drop()


# A PostgreSQL example costs about twice an LMDB one, so the bounded run has 7 (LMDB's has 10):
# between them they run every rule (fewer left edit or fork out); make soak runs 150.
POSTGRES_SETTINGS = settings(PrivacyMachine.TestCase.settings, max_examples=150 if SOAK else 7)


@pytest.mark.soak
def test_privacy_holds_with_the_store_in_postgres(pg_url: str) -> None:
    """A1-A7, C1-C12, D1-D7 on the PostgreSQL engine: the stateful privacy machine, run on it."""
    run_state_machine_as_test(lambda: PostgresPrivacyMachine(pg_url), settings=POSTGRES_SETTINGS)
