"""The compile pipeline written to be read: entries -> a compile result, every step done afresh (P3-P6, P9, P16).

``ctxrt.compile`` runs these steps through ``CompileMemo``, which copies the parts of the entries
the last compile already made and skips the steps that would change nothing; what it returns
must be what this module returns. Here every entry is split, every part repaired, every source
judged, each time, with no cache at all: the property tests compare the two
(tests/test_compile_reference.py), and ``build_compile_result(strict=True)`` compiles both ways
and raises ``ReferenceMismatch`` on a difference, as ``to_anthropic(strict=True)`` does for bodies.

The steps, in order:

1. split: each entry becomes its parts, a non-"user" message holding tool results cut so each
   run of results is a "user" part; the entry's cache marker goes on its last part (P4, P5);
2. repair: tool calls not answered by the next part and results not asked by the one before
   are dropped, a part left empty with them (``ctxrt.compile.tool_pairing``, P4);
3. breakpoints: at most three cache breakpoints kept, the first and the last ones (P5);
4. injections: placed around the last user message, at depths, and into system blocks (P3);
5. provenance: each message's sources, raw bodies judged complete or not (P6).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from .breakpoints import apply_cache_breakpoints
from ..content.codec import to_jsonable
from .result import CompileResult
from ..content.blobs import MediaCache
from ..content.blocks import Block, CompiledMessage, Message
from ..errors import MalformedContentError
from .injections import Injection, MessageInjection, place_with_origins
from .provenance import Provenance, Source, coverage_complete
from ..budget import Entry
from ..content.tokens import estimate_blocks
from .tool_pairing import repair_with_origins, split_mixed_tool_messages
from ..content.validation import find_audience

Lookup = Callable[[str], Message | None]
Bodies = tuple[tuple[str, Message | None], ...]  # a copy entry's stored messages, by id (None: not found)


class ReferenceMismatch(AssertionError):
    """``build_compile_result(strict=True)``: the memo's compile differs from the reference's (a bug in ctxrt)."""


@attrs.frozen
class _Part:
    """One compiled message and the entry it was split from."""

    message: CompiledMessage
    entry: Entry


def split_entry(entry: Entry, index: int) -> list[CompiledMessage]:
    """Step 1 (P4, P5): ``entries[index]`` as compiled messages; none for empty content.

    Raises:
        MalformedContentError: a block carries an audience: a strategy handed over content
            outside the reader's view (B3, A8).
    """
    where = find_audience(entry.content, path=f"entries[{index}].content")
    if where is not None:
        raise MalformedContentError(where, "a compiled entry may not carry an audience (B3, A8)")
    split = split_mixed_tool_messages(entry.participant, entry.content) if entry.content else []
    last = len(split) - 1
    return [CompiledMessage(participant, content, cache_breakpoint=entry.cache_marker and k == last)
            for k, (participant, content) in enumerate(split)]


def bodies_of(entry: Entry, lookup: Lookup) -> Bodies:
    """The stored messages a raw copy carries, as the reader sees them; none for other entries."""
    return tuple((sid, lookup(sid)) for sid in entry.source_ids) if entry.relation == "copy" else ()


def sources_of(entry: Entry, bodies: Bodies, rendered: Mapping[str, Sequence[Block]]) -> tuple[Source, ...]:
    """Step 5 (P6): where ``entry`` came from: each stored message, then each summary. A raw
    copy's message is complete when ``rendered[id]`` carries its body whole (one not found isn't)."""
    if entry.relation == "copy":
        messages = tuple(
            Source("message", sid, body is not None and coverage_complete(rendered.get(sid, ()), body.content))
            for sid, body in bodies)
    else:
        messages = tuple(Source("message", sid) for sid in entry.source_ids)
    return messages + tuple(Source("summary", sid) for sid in entry.summary_ids)


def compile_reference(
    entries: Sequence[Entry],
    *,
    namespace: str,
    branch: str,
    reader: str | None,
    strategy_name: str,
    lookup: Lookup,
    injections: Sequence[Injection] = (),
    message_injections: Sequence[MessageInjection] = (),
    compile_id: str,
    previous: CompileResult | None = None,
    media: MediaCache | None = None,
) -> CompileResult:
    """What ``build_compile_result`` must return for ``entries``; ``previous``: the compile before
    it of the same memo, for ``stable_prefix_tokens`` (0 without one); ``media``: where media
    references are read back (every entry and body with its media as base64 first, M13)."""
    if media is not None:
        entries, lookup = _resolved(entries, lookup, media)
    parts = [_Part(message, entry) for index, entry in enumerate(entries) for message in split_entry(entry, index)]
    bodies = {id(part.entry): bodies_of(part.entry, lookup) for part in parts}
    repaired, kept = repair_with_origins([part.message for part in parts])
    sources = _judged(parts, repaired, kept, bodies)
    marked = apply_cache_breakpoints(repaired)
    placed, system_blocks, origins = place_with_origins(marked, injections, message_injections)
    per_message = tuple((origin,) if isinstance(origin, Source) else sources[kept[origin]] for origin in origins)
    provenance = Provenance(
        compile_id=compile_id, namespace=namespace, branch=branch, reader=reader, strategy=strategy_name,
        messages=per_message,
        # Every body an entry that made a part carries, the repair's drops included (it was selected).
        raw_bodies={sid: body for row in bodies.values() for sid, body in row if body is not None},
        completeness=completeness_of(per_message),
    )
    return CompileResult(placed, system_blocks, provenance, stable_prefix_tokens(previous, placed, system_blocks))


def _resolved(entries: Sequence[Entry], lookup: Lookup, media: MediaCache) -> tuple[list[Entry], Lookup]:
    # One resolved entry per Entry object, however often it is given (the judging is by object).
    made: dict[int, Entry] = {}
    for entry in entries:
        if id(entry) not in made:
            made[id(entry)] = attrs.evolve(entry, content=media.resolve(entry.content))

    def found(sid: str) -> Message | None:
        body = lookup(sid)
        return None if body is None else media.message(body)

    return [made[id(entry)] for entry in entries], found


def completeness_of(per_message: Sequence[tuple[Source, ...]]) -> dict[str, bool]:
    """Whether each raw body is carried whole by every message made of it (P6)."""
    found: dict[str, bool] = {}
    for sources in per_message:
        for source in sources:
            if source.complete is not None:
                found[source.id] = found.get(source.id, True) and source.complete
    return found


def _judged(parts: Sequence[_Part], repaired: Sequence[CompiledMessage], kept: Sequence[int],
            bodies: dict[int, Bodies]) -> list[tuple[Source, ...]]:
    """Each part's sources. An entry (one ``Entry`` object, however often it is given) is judged
    against its own content, unless the repair rewrote or dropped one of its parts: then each of
    its stored messages is judged against what the repair kept of every entry so changed that
    carries that message."""
    survived = set(kept)
    changed = {id(parts[k].entry) for k, message in zip(kept, repaired) if message is not parts[k].message}
    changed |= {id(part.entry) for k, part in enumerate(parts) if k not in survived}
    rendered: dict[str, list[Block]] = {}
    for k, message in zip(kept, repaired):
        if id(parts[k].entry) in changed:
            for sid, _ in bodies[id(parts[k].entry)]:
                rendered.setdefault(sid, []).extend(message.content)
    return [sources_of(part.entry, bodies[id(part.entry)],
                       rendered if id(part.entry) in changed else dict.fromkeys(part.entry.source_ids, part.entry.content))
            for part in parts]


def stable_prefix_tokens(previous: CompileResult | None, messages: Sequence[CompiledMessage],
                         system_blocks: Sequence[Block]) -> int:
    """P9 as written: the tokens of the longest prefix of ``messages`` the same (markers aside)
    as ``previous``'s up to one of its breakpoints, with the same system blocks."""
    if previous is None or to_jsonable(list(previous.system_injections)) != to_jsonable(list(system_blocks)):
        return 0
    old = previous.messages
    best = 0
    for end, message in enumerate(old):
        if message.cache_breakpoint and end < len(messages) and all(_same(messages[i], old[i]) for i in range(end + 1)):
            best = sum(estimate_blocks(m.content) for m in messages[: end + 1])
    return best


def _same(a: CompiledMessage, b: CompiledMessage) -> bool:
    return (a.participant, to_jsonable(list(a.content))) == (b.participant, to_jsonable(list(b.content)))


def differences(result: CompileResult, reference: CompileResult) -> list[str]:
    """Where ``result`` differs from ``reference``, one line each; the stable prefix aside (the
    reference knows it only given the compile before)."""
    found: list[str] = []
    if result.messages != reference.messages:
        at = next((k for k, (a, b) in enumerate(zip(result.messages, reference.messages)) if a != b),
                  min(len(result.messages), len(reference.messages)))
        found.append(f"messages[{at}] (of {len(result.messages)} against {len(reference.messages)})")
    if result.system_injections != reference.system_injections:
        found.append("system_injections")
    mine, theirs = result.provenance, reference.provenance
    if mine.messages != theirs.messages:
        at = next((k for k, (a, b) in enumerate(zip(mine.messages, theirs.messages)) if a != b),
                  min(len(mine.messages), len(theirs.messages)))
        found.append(f"provenance.messages[{at}]")
    if dict(mine.raw_bodies) != dict(theirs.raw_bodies):
        found.append("provenance.raw_bodies")
    if dict(mine.completeness) != dict(theirs.completeness):
        found.append("provenance.completeness")
    return found
