"""Entries -> a compile result (spec/core.md P2-P7; REF §3.6, §4.7). Pure and synchronous.

A strategy's ``select`` returns entries (``ctxrt.budget``); ``build_compile_result`` turns
them into a ``CompileResult`` (``ctxrt.compile_result``): mixed tool messages split and tool
pairs repaired (``ctxrt.tool_pairing``), cache markers trimmed (``ctxrt.breakpoints``),
injections placed (``ctxrt.injections``), provenance attached (``ctxrt.provenance``). What is
here is the pipeline that runs those steps and the ``CompileMemo`` that lets a warm compile pay
only for what changed; the namespace is its only caller.
"""

from __future__ import annotations

import hashlib
import operator
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .body_runs import BodyCache
from .breakpoints import apply_cache_breakpoints
from .codec import to_jsonable
from .compile_result import CompileResult
from .content import Block, CompiledMessage, Message
from .errors import MalformedContentError
from .injections import Injection, MessageInjection, place_with_origins
from .provenance import Provenance, Source, coverage_complete
from .budget import Entry
from .tokens import estimate_blocks
from .tool_pairing import ToolIds, repair_with_origins, split_mixed_tool_messages, tool_ids
from .validation import find_audience


class _Prepared:
    """One entry made ready to compile: its parts, their tool ids, its sources and raw bodies."""

    __slots__ = ("bodies", "entry", "parts", "sources", "tools")

    def __init__(self, entry: Entry, index: int, lookup: Callable[[str], Message | None]) -> None:
        raw = entry.relation == "copy"
        self.bodies = tuple((sid, lookup(sid)) for sid in entry.source_ids) if raw else ()
        # A body from the reader's view carries no audience: only other content needs the walk.
        if not (len(self.bodies) == 1 and self.bodies[0][1] is not None and entry.content is self.bodies[0][1].content):
            where = find_audience(entry.content, path=f"entries[{index}].content")
            if where is not None:  # the strategy handed over a block outside the reader's view
                raise MalformedContentError(where, "a compiled entry may not carry an audience (spec/audience.md B3, A8)")
        self.entry = entry
        split = split_mixed_tool_messages(entry.participant, entry.content)
        self.parts = [
            CompiledMessage(participant, content, cache_breakpoint=entry.cache_marker and k == len(split) - 1)
            for k, (participant, content) in enumerate(split)
        ]
        self.tools = [tool_ids(part) for part in self.parts]
        rendered = [block for part in self.parts for block in part.content]
        self.sources = tuple(
            Source("message", sid, body is not None and _complete(rendered, entry.content, body)) if raw
            else Source("message", sid)
            for sid, body in (self.bodies or ((sid, None) for sid in entry.source_ids))
        ) + tuple(Source("summary", sid) for sid in entry.summary_ids)


def _complete(rendered: Sequence[Block], content: Sequence[Block], body: Message) -> bool:
    # An entry carrying the reader's view of the message untouched is complete without a walk.
    if content is body.content or content == body.content:
        return True
    return coverage_complete(rendered, body.content)


class CompileMemo:
    """Entries prepared by earlier compiles, kept by identity: a strategy that hands back the
    same ``Entry`` objects (as the bundled ones do for unchanged messages) pays for each once,
    and a compile whose entries start as the last one's did reuses that stretch whole."""

    def __init__(self) -> None:
        self._prepared: dict[int, _Prepared] = {}
        self._entries: list[Entry] = []
        self._messages: list[CompiledMessage] = []
        self._tools: list[ToolIds | None] = []
        self._owners: list[_Prepared] = []
        self._ends: list[int] = []  # _ends[i]: messages made from entries[:i + 1]
        self.marked = False  # whether any part made so far carries a cache breakpoint
        # P9: a chained fingerprint per compiled message (of the system blocks and every message up
        # to it), reused where a compile's messages are the last one's objects, and the last
        # compile's breakpoint positions; so a warm compile pays for what changed, not the slot.
        self._system: bytes = b""
        self._chained: list[CompiledMessage] = []
        self._chain: list[bytes] = []
        self._totals: list[int] = []  # _totals[i]: estimated tokens of messages[:i + 1]
        self._breaks: list[int] = []
        self.bodies = BodyCache()  # the request bodies made of its results' parts (§3.D)

    def stable_prefix(self, messages: Sequence[CompiledMessage], system_blocks: Sequence[Block]) -> int:
        """P9: tokens of the longest prefix of ``messages`` identical (markers aside) to a prefix of
        the last compile's that ended at one of its breakpoints (what the cache that request wrote
        can serve). Remembers this compile's for the next one."""
        if not self.marked and not self._breaks:
            return 0  # no breakpoint now nor last time: nothing was or will be cached
        system = hashlib.blake2b(repr(to_jsonable(list(system_blocks))).encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()
        old_chain, old_breaks = self._chain, self._breaks
        if system != self._system:
            start = 0
        else:
            same = list(map(operator.is_, messages, self._chained))  # C speed: the unchanged stretch
            start = same.index(False) if False in same else len(same)
        chain, totals = old_chain[:start], self._totals[:start]
        fingerprint, total = (chain[-1], totals[-1]) if start else (system, 0)
        breaks = [i for i in old_breaks if i < start]
        for index in range(start, len(messages)):
            message = messages[index]
            content = repr((message.participant, to_jsonable(list(message.content)))).encode("utf-8", "surrogatepass")
            fingerprint = hashlib.blake2b(fingerprint + content, digest_size=16).digest()
            total += estimate_blocks(message.content)
            chain.append(fingerprint)
            totals.append(total)
            if message.cache_breakpoint:
                breaks.append(index)
        stable = max((totals[i] for i in old_breaks if i < len(chain) and i < len(old_chain)
                      and chain[i] == old_chain[i]), default=0)
        self._system, self._chained, self._chain, self._totals, self._breaks = (
            system, list(messages), chain, totals, breaks)
        return stable

    def parts(
        self, entries: Sequence[Entry], lookup: Callable[[str], Message | None]
    ) -> tuple[list[CompiledMessage], list[ToolIds | None], list[_Prepared]]:
        """The compiled parts of ``entries``, their tool ids and the prepared entry each came from."""
        previous = self._entries
        if len(entries) >= len(previous) and entries[: len(previous)] == previous:
            shared = len(previous)  # the usual warm compile: the last entries, then new ones (C-speed check)
        else:
            # Up to the first entry that differs (a moved tail breakpoint, a new summary): equal
            # entries carry equal parts, so only what follows is prepared again.
            same = list(map(operator.is_, entries, previous))
            shared = same.index(False) if False in same else len(same)
            while shared < len(same) and entries[shared] == previous[shared]:
                shared += 1
        end = self._ends[shared - 1] if shared else 0
        messages, tools, owners = self._messages[:end], self._tools[:end], self._owners[:end]
        ends = self._ends[:shared]
        old_ends = self._ends
        for i in range(shared, len(entries)):
            entry = entries[i]
            if i < len(previous) and (entry is previous[i] or entry == previous[i]):
                # Past a changed entry (an edit inside the window) the rest is often as it was:
                # equal entries carry equal parts, even where a strategy made them anew.
                first, last = old_ends[i - 1] if i else 0, old_ends[i]
                messages += self._messages[first:last]
                tools += self._tools[first:last]
                owners += self._owners[first:last]
            elif entry.content:
                prepared = self.prepare(entry, i, lookup)
                messages += prepared.parts
                tools += prepared.tools
                owners += [prepared] * len(prepared.parts)
                self.marked = self.marked or prepared.entry.cache_marker
            ends.append(len(messages))
        self._entries, self._messages, self._tools, self._owners, self._ends = (
            list(entries), messages, tools, owners, ends
        )
        self.retain_only(entries)
        return messages, tools, owners

    def prepare(self, entry: Entry, index: int, lookup: Callable[[str], Message | None]) -> _Prepared:
        found = self._prepared.get(id(entry))
        if found is None or found.entry is not entry:
            found = self._prepared[id(entry)] = _Prepared(entry, index, lookup)
        return found

    def retain_only(self, entries: Sequence[Entry]) -> None:
        """Forget entries no longer compiled, once the memo has grown well past what is in use."""
        if len(self._prepared) > 2 * len(entries) + 1024:
            live = {id(entry) for entry in entries}
            self._prepared = {key: value for key, value in self._prepared.items() if key in live}


_SOURCES = operator.attrgetter("sources")


class _Lazy(Mapping[str, Any]):
    """A mapping built on first use: most hosts never read a compile's raw bodies."""

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build: Callable[[], dict[str, Any]] | None = build
        self._data: dict[str, Any] = {}

    def _loaded(self) -> dict[str, Any]:
        if self._build is not None:
            self._data, self._build = self._build(), None
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._loaded()[key]

    def __iter__(self) -> Any:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return repr(self._loaded())


def build_compile_result(
    entries: Sequence[Entry],
    *,
    namespace: str,
    branch: str,
    reader: str | None,
    strategy_name: str,
    lookup: Callable[[str], Message | None],
    injections: Sequence[Injection] = (),
    message_injections: Sequence[MessageInjection] = (),
    compile_id: str | None = None,
    memo: CompileMemo | None = None,
) -> CompileResult:
    """Entries -> CompileResult: split, cache markers, tool pairing, injections, provenance (P3-P6).

    ``lookup(id)`` returns a stored message as the reader sees it, or None. With a ``memo``,
    entries seen by an earlier compile are not prepared again.
    """
    memo = memo or CompileMemo()
    messages, tools, owners = memo.parts(entries, lookup)
    repaired, kept = repair_with_origins(messages, tools)
    # A message the repair changed no longer carries its body whole: judge those bodies again.
    altered: set[int] = set()
    if repaired is not messages:
        altered = {id(owners[k]) for k, message in zip(kept, repaired) if message is not messages[k]}
        if len(kept) < len(messages):
            altered |= {id(owners[k]) for k in set(range(len(messages))) - set(kept)}
    sources_of: dict[int, tuple[Source, ...]] = {}
    if altered:
        rendered: dict[str, list[Block]] = {}
        for k, message in zip(kept, repaired):
            if id(owners[k]) in altered:
                for sid, _ in owners[k].bodies:
                    rendered.setdefault(sid, []).extend(message.content)
        for prepared in {id(o): o for o in owners if id(o) in altered}.values():
            sources_of[id(prepared)] = tuple(
                attrs.evolve(source, complete=body is not None and coverage_complete(rendered.get(source.id, []), body.content))
                if source.complete is not None else source
                for source, (_, body) in zip(prepared.sources, prepared.bodies + ((None, None),) * len(prepared.sources))
            )
    marks = [i for i, k in enumerate(kept) if messages[k].cache_breakpoint] if memo.marked else []
    repaired = apply_cache_breakpoints(repaired, marked=marks if repaired is messages else None)
    placed, system_blocks, origins = place_with_origins(repaired, injections, message_injections)
    if not sources_of and len(kept) == len(owners) and len(origins) == len(owners):
        per_message = tuple(map(_SOURCES, owners))  # nothing moved: one source tuple per part, as prepared
    else:
        per_message = tuple(
            (origin,) if isinstance(origin, Source)
            else sources_of.get(id(owners[kept[origin]]), owners[kept[origin]].sources)
            for origin in origins
        )
    used = owners  # bodies() dedupes by id as it builds

    def bodies() -> dict[str, Message]:
        return {sid: body for prepared in used for sid, body in prepared.bodies if body is not None}

    def completeness() -> dict[str, bool]:
        found: dict[str, bool] = {}
        for sources in per_message:
            for source in sources:
                if source.complete is not None:
                    found[source.id] = found.get(source.id, True) and source.complete
        return found

    provenance = Provenance(
        compile_id=compile_id or str(uuid.uuid4()),
        namespace=namespace,
        branch=branch,
        reader=reader,
        strategy=strategy_name,
        messages=per_message,
        raw_bodies=_Lazy(bodies),
        completeness=_Lazy(completeness),
    )
    final = placed if placed is not messages else list(placed)
    return CompileResult(final, system_blocks, provenance, memo.stable_prefix(final, system_blocks),
                         body_cache=memo.bodies)
