"""Entries -> a compile result (P2-P7). Pure and synchronous.

A strategy's ``select`` returns entries (``ctxrt.budget``); ``build_compile_result`` turns
them into a ``CompileResult`` (``ctxrt.compile.result``): mixed tool messages split and tool
pairs repaired (``ctxrt.compile.tool_pairing``), cache markers trimmed (``ctxrt.compile.breakpoints``),
injections placed (``ctxrt.compile.injections``), provenance attached (``ctxrt.compile.provenance``). What is
here is the pipeline that runs those steps and the ``CompileMemo`` that lets a warm compile pay
only for what changed; the namespace is its only caller. ``ctxrt.compile.reference`` runs the
same steps with no memo: what this pipeline returns must be what it returns (``strict=True``).
"""

from __future__ import annotations

import hashlib
import operator
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, compress, count, islice
from typing import Any

import attrs

from ..forms.body_runs import BodyCache, SharedParts, holds, run_length
from .breakpoints import apply_cache_breakpoints, unmarked
from ..content.codec import to_jsonable
from .reference import ReferenceMismatch, compile_reference, completeness_of, differences
from .result import CompileResult, Follows
from ..content.blobs import MediaCache
from ..content.blocks import Block, CompiledMessage, Message
from ..errors import MalformedContentError
from ..memos import IdMemo, outgrown
from .injections import Injection, MessageInjection, Origin, place_with_origins
from .provenance import Provenance, Source, coverage_complete
from ..budget import Entry
from ..content.tokens import estimate_blocks
from .tool_pairing import ToolIds, repair_with_origins, split_mixed_tool_messages, tool_ids
from ..content.validation import find_audience


class _Prepared:
    """One entry made ready to compile: its parts, their tool ids and tokens, its sources and raw
    bodies. Its parts and bodies carry media as base64, read through ``media`` once per entry the
    memo hasn't seen (M13): a result is the host's, whole, even after the runtime closes. Its
    sources are judged against the entry and bodies as held (references) first."""

    __slots__ = ("bodies", "bound", "entry", "parts", "sources", "tokens", "tools")

    def __init__(self, entry: Entry, index: int, lookup: Callable[[str], Message | None],
                 media: MediaCache | None = None) -> None:
        raw = entry.relation == "copy"
        self.bodies = tuple((sid, lookup(sid)) for sid in entry.source_ids) if raw else ()
        # Bound to the bodies it was judged against beyond what its own content says (a copy made
        # of a message other than as the message is): an equal entry made after an edit of that
        # message is not this one. A body from the reader's view carries no audience: only other
        # content needs the walk.
        plain = len(self.bodies) == 1 and self.bodies[0][1] is not None and entry.content is self.bodies[0][1].content
        self.bound = raw and not plain
        if not plain:
            where = find_audience(entry.content, path=f"entries[{index}].content")
            if where is not None:  # the strategy handed over a block outside the reader's view
                raise MalformedContentError(where, "a compiled entry may not carry an audience (B3, A8)")
        self.entry = entry
        split = split_mixed_tool_messages(entry.participant, entry.content)
        resolve = (lambda blocks: blocks) if media is None else media.resolve
        self.parts = [
            CompiledMessage(participant, resolve(content), cache_breakpoint=entry.cache_marker and k == len(split) - 1)
            for k, (participant, content) in enumerate(split)
        ]
        self.tools = [tool_ids(part) for part in self.parts]
        self.tokens = [estimate_blocks(part.content) for part in self.parts]
        rendered = [block for _, content in split for block in content]
        self.sources = tuple(
            Source("message", sid, body is not None and _complete(rendered, entry.content, body)) if raw
            else Source("message", sid)
            for sid, body in (self.bodies or ((sid, None) for sid in entry.source_ids))
        ) + tuple(Source("summary", sid) for sid in entry.summary_ids)
        if media is not None and self.bodies:  # judged again (a repair) against the parts, read back
            self.bodies = tuple((sid, None if body is None else media.message(body)) for sid, body in self.bodies)

    def twin(self, entry: Entry) -> _Prepared | None:
        """``entry`` prepared from this one, if it differs from this one's entry in its cache marker
        at most (a window's tail, marked, then not): the same parts but the last, re-marked. Not for a
        bound one: its content, the same object, says nothing of which body it was judged against."""
        mine = self.entry
        if self.bound or not (entry.content is mine.content and entry.participant == mine.participant
                and entry.source_ids == mine.source_ids and entry.relation == mine.relation
                and entry.summary_ids == mine.summary_ids):
            return None
        if entry.cache_marker == mine.cache_marker:
            return self  # an equal entry (another namespace's for the message): the same parts (P17)
        made = object.__new__(_Prepared)
        made.entry, made.bodies, made.sources, made.tools, made.tokens = entry, self.bodies, self.sources, self.tools, self.tokens
        made.bound = self.bound
        made.parts = list(self.parts)
        if made.parts:
            last = made.parts[-1]
            made.parts[-1] = CompiledMessage(last.participant, last.content, cache_breakpoint=entry.cache_marker)
        return made


def _complete(rendered: Sequence[Block], content: Sequence[Block], body: Message) -> bool:
    # An entry carrying the reader's view of the message untouched is complete without a walk.
    if content is body.content or content == body.content:
        return True
    return coverage_complete(rendered, body.content)


def _moved(positions: list[int], first: int, end: int, to: int) -> list[int]:
    """The sorted ``positions`` within [first, end), moved so that ``first`` lands on ``to``."""
    lo, hi = bisect_left(positions, first), bisect_left(positions, end)
    return [to + p - first for p in positions[lo:hi]] if lo < hi else []


@attrs.frozen
class _Parts:
    """One compile's flat parts (the memo's own lists: read, never changed) and where its marks and tool blocks are."""

    messages: list[CompiledMessage]
    tools: list[ToolIds | None]
    owners: list[_Prepared]
    sources: list[tuple[Source, ...]]  # each part's owner's sources: provenance's row when nothing moved
    tokens: list[int]  # estimated tokens of each part
    marks: list[int]  # positions of the parts carrying a cache breakpoint
    tooled: list[int]  # positions of the parts holding a tool block
    lead: int = 0  # how many first parts are the last compile's first ones
    serial: int = 0  # which compile of the memo made them
    runs: tuple[tuple[int, int, int], ...] = ()  # the stretches copied from the last compile's: (to, from, length)


_NO_PARTS = _Parts([], [], [], [], [], [], [])


class _Gather:
    """One compile's parts as they are gathered, in the lists ``_Parts`` holds: prepared entries'
    parts appended, runs of the last compile's copied by slices. With them, the entries making
    other than one part (``CompileMemo._odd``) and their part counts, and the bound ones."""

    __slots__ = ("bound", "counts", "marks", "messages", "odd", "owners", "runs", "sources", "tokens", "tooled",
                 "tools")

    def __init__(self) -> None:
        self.messages: list[CompiledMessage] = []
        self.tools: list[ToolIds | None] = []
        self.owners: list[_Prepared] = []
        self.sources: list[tuple[Source, ...]] = []
        self.tokens: list[int] = []
        self.marks: list[int] = []
        self.tooled: list[int] = []
        self.odd: list[int] = []
        self.counts: list[int] = []
        self.bound: list[int] = []
        self.runs: list[tuple[int, int, int]] = []

    def add(self, index: int, prepared: _Prepared | None) -> None:
        """Appends the parts of ``entries[index]``, ``prepared`` (None: an empty entry, no part)."""
        start = len(self.messages)
        if prepared is not None:
            parts = prepared.parts
            self.messages += parts
            self.tools += prepared.tools
            self.tokens += prepared.tokens
            if len(parts) == 1:  # most entries: one part, appended without a list made per entry
                self.owners.append(prepared)
                self.sources.append(prepared.sources)
                if parts[0].cache_breakpoint:
                    self.marks.append(start)
                if prepared.tools[0] is not None:
                    self.tooled.append(start)
            else:
                self.owners += [prepared] * len(parts)
                self.sources += [prepared.sources] * len(parts)
                self.marks += [start + k for k, part in enumerate(parts) if part.cache_breakpoint]
                self.tooled += [start + k for k, ids in enumerate(prepared.tools) if ids is not None]
            if prepared.bound:
                self.bound.append(index)
        if len(self.messages) - start != 1:
            self.odd.append(index)
            self.counts.append(len(self.messages) - start)

    def copy(self, was: _Parts, first: int, end: int, last: bool) -> None:
        """Appends ``was``'s parts [first, end); ``last``: nothing follows them."""
        to = len(self.messages)
        self.runs.append((to, first, end - first))
        if to == 0 and first == 0 and end == len(was.messages) and last:
            # All of the last parts, and nothing else: their lists (never changed) serve again.
            self.messages, self.tools, self.owners, self.sources, self.tokens = was.messages, was.tools, was.owners, was.sources, was.tokens
        elif to == 0:  # the first run starts the lists: one copy, not a copy appended
            self.messages, self.tools, self.owners = was.messages[first:end], was.tools[first:end], was.owners[first:end]
            self.sources, self.tokens = was.sources[first:end], was.tokens[first:end]
        else:
            self.messages += was.messages[first:end]
            self.tools += was.tools[first:end]
            self.owners += was.owners[first:end]
            self.sources += was.sources[first:end]
            self.tokens += was.tokens[first:end]
        self.marks += _moved(was.marks, first, end, to)
        if was.tooled:  # most windows hold no tool block
            self.tooled += _moved(was.tooled, first, end, to)

    def parts(self, lead: int, serial: int) -> _Parts:
        return _Parts(self.messages, self.tools, self.owners, self.sources, self.tokens, self.marks, self.tooled, lead,
                      serial, tuple(self.runs))


class _Index:
    """Where an entry not where the last run left off sits among the last compile's entries
    (past a trimmed front or a removed stretch), found by identity: a few steps on first (the
    budget pushes one or two out a turn), then an index, built once, only where the last entries
    go on further than the next few and the entry after isn't among them either (one that
    replaced one is an edit, to prepare)."""

    __slots__ = ("_old", "_where")

    def __init__(self, old: list[Entry]) -> None:
        self._old = old
        self._where: dict[int, int] | None = None

    def find(self, entries: Sequence[Entry], i: int, j: int) -> int | None:
        """Where ``entries[i]`` is among the last entries, looking from ``j``; None: nowhere found."""
        old, entry = self._old, entries[i]
        found = next((k for k in range(j + 1, min(j + 4, len(old))) if old[k] is entry), None)
        if (found is None and j + 4 < len(old)
                and not (i + 1 < len(entries) and any(old[k] is entries[i + 1] for k in range(j, j + 5)))):
            if self._where is None:
                self._where = dict(zip(map(id, old), range(len(old))))
            found = self._where.get(id(entry))
        return found


class ViewShare:
    """What the memos of every namespace reading one slot in one reader view share (P17), their
    raw-body lookups agreeing: the last entry prepared of each content (an entry another such
    namespace hands over for the same message carries the same content: it is that one, or its
    twin) and the request parts made of their messages. Owned by that reader view of the slot
    (``namespace.views``) and dropped with it; a memo of a view no other reads owns its own.

    Keyed by object identity, what it keeps of an edited message is never found again; the rule
    (``memos.outgrown``) lets it go. A rewrite the view's change log can't name (a reload: every
    message a new object) lets all of it go at once. ``changes``: the view's, by stamp."""

    def __init__(self, changes: Callable[[object], Sequence[object] | None] | None = None) -> None:
        # The last prepared of each content, unmarked and marked: an entry is one of them or its twin.
        self.prepared: tuple[IdMemo[Sequence[Block], _Prepared], IdMemo[Sequence[Block], _Prepared]] = (IdMemo(), IdMemo())
        self.parts = SharedParts()
        self._changes = changes
        self._stamp: object = None

    def follow(self, stamp: object) -> None:
        """Before a compile of the view as of ``stamp``."""
        if stamp != self._stamp:
            if self._changes is None or self._changes(self._stamp) is None:
                self.prepared = (IdMemo(), IdMemo())
                self.parts.parts = {}
            self._stamp = stamp


class CompileMemo:
    """The last compile's parts, diffed by runs against the next one's entries: a strategy that
    hands back the same ``Entry`` objects (as the bundled ones do for unchanged messages) pays for
    what changed (a front trim, appends, a splice, a moved marker), the rest copied by slices."""

    def __init__(self, share: ViewShare | None = None) -> None:
        self._prepared: dict[int, _Prepared] = {}  # by id(entry): its prepared one names it
        self._share = ViewShare() if share is None else share
        self._entries: list[Entry] = []
        self._parts = _NO_PARTS
        # Entries making other than one part (split tool messages, empty ones), sorted, with their
        # part counts and _shift[t]: the parts beyond one per entry made by the first t of them.
        self._odd: list[int] = []
        self._counts: list[int] = []
        self._shift: list[int] = [0]
        self._bound: list[int] = []  # the last entries, sorted, whose prepared form is bound (_Prepared.bound)
        self._stamp: object = None  # the view's at the last compile
        # P9: the last compile's messages (the memo's copy), its system blocks' digest, its
        # breakpoint positions and the estimated tokens up to each; digests of messages compared.
        self._system: bytes = b""
        self._chained: list[CompiledMessage] = []
        self._chained_from = -1  # the serial of the parts it was made of by stripping markers alone, if it was
        self._breaks: list[int] = []
        self._break_totals: list[int] = []
        self._digests: IdMemo[CompiledMessage, bytes] = IdMemo()
        self._unmarked: IdMemo[CompiledMessage, CompiledMessage] = IdMemo()  # P5: a marked part's twin
        self.bodies = BodyCache(self._share.parts)  # the request bodies made of its results' parts (to_anthropic reuses them)
        self._plain: tuple[object, int] | None = None  # the last compile's token and length, if plain (``follows``)

    def follows(self, parts: _Parts, plain: bool, messages: list[CompiledMessage],
                sources: tuple[tuple[Source, ...], ...]) -> Follows:
        """How this compile's ``messages`` (the result's list) and ``sources`` follow the last
        one's (``Follows``): known when both were their parts as gathered (``plain``: no repair,
        marker strip nor injection moved any)."""
        made = Follows(messages, sources)
        if plain and self._plain is not None:
            made = Follows(messages, sources, made.token, self._plain[0], self._plain[1], parts.runs)
        self._plain = (made.token, made.length) if plain else None
        return made

    def _offset(self, index: int) -> int:
        """Where the parts of the last compile's ``entries[index]`` start."""
        return index + self._shift[bisect_left(self._odd, index)]

    def parts(self, entries: Sequence[Entry], lookup: Callable[[str], Message | None], stamp: object = None,
              media: MediaCache | None = None) -> _Parts:
        """The compiled parts of ``entries``: runs of the last compile's entries (the same objects,
        or equal ones in place, but for a bound one: the same object only) copied by slices, the
        other entries prepared. ``stamp``: the view's, which changes whenever a message changed
        other than by an append (None: unknown); while it is the last compile's, no bound entry's
        body can have changed, and the bound ones in a run are not looked at."""
        was = self._parts
        rewritten = stamp is None or stamp != self._stamp
        self._share.follow(stamp)
        old = self._entries
        if (not rewritten and len(entries) == len(old) and (not entries or self._continues(entries[0], 0))
                and run_length(entries, 0, old, 0) == len(entries)):
            # The last compile's entries again, nothing changed in the view: its parts serve whole
            # (what the runs below make of them), and no table grew.
            self._parts = _Parts(was.messages, was.tools, was.owners, was.sources, was.tokens, was.marks, was.tooled,
                                 len(was.messages), was.serial + 1, ((0, 0, len(was.messages)),))
            return self._parts
        built = _Gather()
        index = _Index(self._entries)
        lead: int | None = None  # how many first parts are the last compile's first ones, once known
        i, j = 0, 0
        while i < len(entries):
            entry = entries[i]
            if j >= len(old):  # past the last entries (all of them, on a memo's first compile): none to find
                built.add(i, self.prepare(entry, i, lookup, media) if entry.content else None)
                i += 1
                continue
            if not self._continues(entry, j):
                found = index.find(entries, i, j)
                if found is None:
                    built.add(i, self.prepare(entry, i, lookup, media) if entry.content else None)
                    i += 1
                    continue
                j = found
            length = self._copy_run(built, entries, i, j, rewritten)
            if lead is None:
                lead = self._offset(length) if i == j == 0 else 0
            i, j = i + length, j + length
        self._entries, self._stamp = list(entries), stamp
        self._parts = built.parts(lead or 0, was.serial + 1)
        self._odd, self._counts, self._bound = built.odd, built.counts, built.bound
        self._shift = [0, *accumulate(count - 1 for count in built.counts)]
        self.retain_only(entries)
        return self._parts

    def _continues(self, entry: Entry, j: int) -> bool:
        """Whether ``entry`` goes on the run of the last compile's entries at ``j``: the same
        object, or an equal one if the last one there wasn't bound."""
        old = self._entries
        return j < len(old) and (entry is old[j] or (entry == old[j] and not holds(self._bound, j)))

    def _copy_run(self, built: _Gather, entries: Sequence[Entry], i: int, j: int, rewritten: bool) -> int:
        """Copies into ``built`` the run of the last compile's entries from ``j`` that ``entries``
        go on from ``i``; its length. After a rewrite, an equal entry in a bound one's place ends
        the run (it is prepared anew)."""
        bound_before, old = self._bound, self._entries
        # Lists of one length: most often an edit's, the first run found from the end (``_head``).
        length = (_head(entries, old) if i == j == 0 and len(entries) == len(old)
                  else 1 + run_length(entries, i + 1, old, j + 1))
        lo, hi = bisect_left(bound_before, j), bisect_left(bound_before, j + length)
        if rewritten:
            cut = next((k for k in bound_before[lo:hi] if k > j and entries[i + k - j] is not old[k]), None)
            if cut is not None:
                length, hi = cut - j, bisect_left(bound_before, cut)
        built.bound += [i + k - j for k in bound_before[lo:hi]]
        first, end = self._offset(j), self._offset(j + length)
        built.copy(self._parts, first, end, last=i + length == len(entries))
        lo, hi = bisect_left(self._odd, j), bisect_left(self._odd, j + length)
        built.odd += [i + k - j for k in self._odd[lo:hi]]
        built.counts += self._counts[lo:hi]
        return length

    def prepare(self, entry: Entry, index: int, lookup: Callable[[str], Message | None],
                media: MediaCache | None = None) -> _Prepared:
        found = self._prepared.get(id(entry))
        if found is None or found.entry is not entry:
            table, twins = self._share.prepared[entry.cache_marker], self._share.prepared[not entry.cache_marker]
            other = table.get(entry.content) or twins.get(entry.content)
            found = other if other is None or other.entry is entry else other.twin(entry)
            if found is None:
                found = _Prepared(entry, index, lookup, media)
            self._prepared[id(entry)] = table.put(entry.content, found)
        return found

    def tokens(self, entry: Entry) -> int:
        """``estimate_blocks(entry.content)``, read off the parts an earlier compile prepared of this
        very entry when there are some (a dry run of a strategy that keeps its entries hands back
        the ones the last compile built), else estimated."""
        found = self._prepared.get(id(entry))
        if found is not None and found.entry is entry:
            return sum(found.tokens)
        return estimate_blocks(entry.content)

    def retain_only(self, entries: Sequence[Entry]) -> None:
        """Forget entries no longer compiled (``memos.outgrown``), here and in the view's share."""
        if outgrown(len(self._prepared), len(entries)):
            live = {id(entry) for entry in entries}
            self._prepared = {key: value for key, value in self._prepared.items() if key in live}
        for table in self._share.prepared:
            if outgrown(len(table), len(entries)):
                table.bound(len(entries), (entry.content for entry in entries))

    def stable_prefix(
        self, messages: list[CompiledMessage], system_blocks: Sequence[Block], breaks: list[int],
        tokens: Callable[[], Sequence[int]], parts: _Parts | None = None,
    ) -> int:
        """P9: tokens of the longest prefix of ``messages`` identical (markers aside) to a prefix of
        the last compile's that ended at one of its breakpoints (what the cache that request wrote
        can serve). Remembers this compile's for the next one: ``messages`` (the memo's to keep),
        its ``breaks`` (positions of its breakpoints) and ``tokens()`` (the estimate of each).
        ``parts``: what ``messages`` were made of by stripping markers alone, if they were (then
        their first ``lead`` are known to match, when the last compile's were made so too)."""
        if not breaks and not self._breaks:
            return 0  # no breakpoint now nor last time: nothing was or will be cached
        system = _digest(repr(to_jsonable(list(system_blocks)))) if system_blocks else b""
        same = self._same_prefix(messages, parts) if self._breaks and system == self._system else 0
        # The last compile's breakpoints inside the prefix both share, with their totals.
        known = [(index, total) for index, total in zip(self._breaks, self._break_totals) if index < same]
        stable = max((total for _, total in known), default=0)
        self._remember(system, messages, breaks, _totals(breaks, known, tokens()) if breaks else [], parts)
        return stable

    def _remember(self, system: bytes, messages: list[CompiledMessage], breaks: list[int], totals: list[int],
                  parts: _Parts | None) -> None:
        """Keeps this compile's for the next one's ``stable_prefix``: its messages only if they
        hold a breakpoint (else no prefix of them is cached)."""
        self._system, self._chained, self._breaks = system, messages if breaks else [], breaks
        self._chained_from = parts.serial if parts is not None and breaks else -1
        self._break_totals = totals
        self._digests.bound(len(self._chained), self._chained)

    def _same_prefix(self, messages: list[CompiledMessage], parts: _Parts | None) -> int:
        """How many first ``messages`` serialise as the last compile's, markers aside: the
        chained fingerprint's answer in O(changed), the lists compared past their leading run of
        the same objects (or the parts' ``lead``) by digests."""
        old = self._chained
        known = parts.lead if parts is not None and parts.serial == self._chained_from + 1 else 0
        known = min(known, len(messages), len(old))
        same = known + run_length(messages, known, old, known)  # equal messages: the same bytes
        while same < min(len(messages), len(old)) and _same_bytes(messages[same], old[same], self._digest):
            same += 1 + run_length(messages, same + 1, old, same + 1)  # a marker moved: go on past it
        return same

    def unmarked(self, message: CompiledMessage) -> CompiledMessage:
        """``message``'s unmarked twin, the same object while ``message`` is (so what follows a
        stripped breakpoint is still a run of the last compile's messages)."""
        found = self._unmarked.get(message)
        if found is None:
            self._unmarked.bound(len(self._chained))
            found = self._unmarked.put(message, unmarked(message))
        return found

    def _digest(self, message: CompiledMessage) -> bytes:
        found = self._digests.get(message)
        if found is None:
            found = self._digests.put(message, _digest(repr((message.participant, to_jsonable(list(message.content))))))
        return found


_FIRST = operator.itemgetter(0)
_NEWEST = 64  # entries from the newest an edit is looked for first (``_head``)


def _totals(breaks: list[int], known: list[tuple[int, int]], estimates: Sequence[int]) -> list[int]:
    """The estimated tokens up to each of ``breaks``, each from the nearest breakpoint before it
    whose total is known: this compile's, or one of ``known`` (the last compile's inside the prefix
    both share: the same bytes, so the same estimates)."""
    totals: list[int] = []
    last, total = -1, 0
    for index in breaks:
        base = bisect_right(known, index, key=_FIRST) - 1
        if base >= 0 and known[base][0] > last:
            last, total = known[base]
        total += sum(estimates[last + 1:index + 1])
        totals.append(total)
        last = index
    return totals


def _head(new: Sequence[Entry], old: list[Entry]) -> int:
    """``run_length(new, 0, old, 0)`` for lists of one length, found from the end: an edit most
    often replaces an entry near the newest, so the run after it, walked back at C speed, is
    short, and one compare of what precedes the entry it stops at tells whether that entry is the
    only one in between (``run_length`` finds a long run's end by halves). An edit further back
    than ``_NEWEST`` entries is left to ``run_length``."""
    n = len(new)
    tail = next(compress(count(), map(operator.is_not, islice(reversed(new), _NEWEST), reversed(old))), None)
    head = n - 1 - (n if tail is None else tail)
    # An equal entry where the walk stopped, or another change before it: the run as run_length finds it.
    if head < 0 or new[head] == old[head] or new[:head] != old[:head]:
        return run_length(new, 0, old, 0)
    return head


def _same_bytes(a: CompiledMessage, b: CompiledMessage, digest: Callable[[CompiledMessage], bytes]) -> bool:
    """Whether ``a`` and ``b`` serialise alike, markers aside: at once if they carry equal content
    (a moved breakpoint's twins share theirs), else by digests."""
    return (a.participant == b.participant and a.content == b.content) or digest(a) == digest(b)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class _Bodies(Mapping[str, Any]):
    """A compile's raw bodies by source id (the last part's, where two hold one): a lookup reads
    the parts from the newest back only as far as it must (a request ledger asks for a turn's
    newest few), iterating reads them all."""

    def __init__(self, owners: Sequence[Any]) -> None:
        self._owners = owners
        self._found: dict[str, Any] = {}
        self._unread = len(owners)  # owners[:_unread] not read yet

    def __getitem__(self, key: str) -> Any:
        found = self._found
        while key not in found and self._unread:
            self._unread -= 1
            for sid, body in self._owners[self._unread].bodies:
                if body is not None:
                    found.setdefault(sid, body)  # read newest first: a later part's body wins
        return found[key]

    def _all(self) -> dict[str, Any]:
        return {sid: body for prepared in self._owners for sid, body in prepared.bodies if body is not None}

    def __iter__(self) -> Any:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __deepcopy__(self, memo: dict[int, Any]) -> _Bodies:
        # Read-only: a deep copy of a result shares its compile's bodies, so the runtime that
        # compiled it still knows it (a request ledger records only its own compiles, Q9).
        return self


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
    stamp: object = None,
    strict: bool = False,
    media: MediaCache | None = None,
) -> CompileResult:
    """Entries -> CompileResult: split, cache markers, tool pairing, injections, provenance (P3-P6).

    ``lookup(id)`` returns a stored message as the reader sees it, or None. With a ``memo``,
    entries seen by an earlier compile are not prepared again; ``stamp`` is the view's (see
    ``CompileMemo.parts``). ``media``: where the entries' media references are read back as
    base64, in the result's messages and raw bodies (M13; None: the entries hold none). With ``strict``, the result is compared with the one
    ``compile_reference`` makes afresh (its stable prefix aside): ``ReferenceMismatch`` names
    what differs (a bug in ctxrt).
    """
    memo = memo or CompileMemo()
    parts = memo.parts(entries, lookup, stamp, media)
    repaired, kept = _repaired(parts)
    whole = repaired is parts.messages  # every part as made
    judged = {} if whole else _rejudged(parts, entries, repaired, kept)
    marked = apply_cache_breakpoints(repaired, marked=parts.marks if whole else None, strip=memo.unmarked)
    injected = bool(injections or message_injections)
    origins: Sequence[Origin]
    if injected:
        placed, system_blocks, origins = place_with_origins(marked, injections, message_injections)
    else:
        placed, system_blocks, origins = marked, [], range(len(marked))
    per_message = _sources(parts, judged, kept, origins)
    provenance = Provenance(
        compile_id=compile_id or str(uuid.uuid4()),
        namespace=namespace,
        branch=branch,
        reader=reader,
        strategy=strategy_name,
        messages=per_message,
        # Built on first use (most hosts never read them); bodies of the parts the repair dropped included.
        raw_bodies=_Bodies(parts.owners),
        completeness=_Lazy(lambda: completeness_of(per_message)),
    )
    breaks, tokens = _breaks(parts, placed, kept, injected, whole)
    # The memo keeps ``placed`` (its parts list, or one made here): the result's list is the host's to change.
    stable = memo.stable_prefix(placed, system_blocks, breaks, tokens, parts if whole and not injected else None)
    messages = list(placed)
    follows = memo.follows(parts, whole and not injected and placed is parts.messages, messages, per_message)
    result = CompileResult(messages, system_blocks, provenance, stable, body_cache=memo.bodies, follows=follows)
    if strict:
        reference = compile_reference(
            entries, namespace=namespace, branch=branch, reader=reader, strategy_name=strategy_name, lookup=lookup,
            injections=injections, message_injections=message_injections, compile_id=provenance.compile_id,
            media=media)
        found = differences(result, reference)
        if found:
            raise ReferenceMismatch(f"the memo's compile differs from the reference's: {', '.join(found)}")
    return result


def _repaired(parts: _Parts) -> tuple[list[CompiledMessage], Sequence[int]]:
    """The parts with their tool pairs repaired (P4), and the index of the part each came from:
    the memo's list itself when every pair is whole (no tool block: the repair's walk skipped)."""
    messages = parts.messages
    if parts.tooled:
        repaired, kept = repair_with_origins(messages, parts.tools)
        if repaired != messages:
            return repaired, kept
    return messages, range(len(messages))


def _sources(parts: _Parts, judged: dict[int, tuple[Source, ...]], kept: Sequence[int],
             origins: Sequence[Origin]) -> tuple[tuple[Source, ...], ...]:
    """Each placed message's sources (P6): its part's as prepared, or as ``judged`` again."""
    owners = parts.owners
    if not judged and len(kept) == len(owners) and len(origins) == len(owners):
        return tuple(parts.sources)  # nothing moved: one source tuple per part, as prepared
    return tuple(
        (origin,) if isinstance(origin, Source) else judged.get(kept[origin], owners[kept[origin]].sources)
        for origin in origins
    )


def _rejudged(parts: _Parts, entries: Sequence[Entry], repaired: list[CompiledMessage],
              kept: Sequence[int]) -> dict[int, tuple[Source, ...]]:
    """The sources of the parts of the entries the repair changed (a part rewritten or dropped),
    by part: each raw body judged again against what the repair kept of the changed entries
    carrying it (they no longer carry their bodies whole). An entry is one ``Entry`` object,
    however often it is given (as ``compile_reference`` has it): not a part's prepared form,
    which equal entries share."""
    messages, owners = parts.messages, parts.owners
    entry_of: list[Entry] = []  # each part's entry: those with content make their prepared form's parts, in order
    for entry in entries:
        if entry.content:
            entry_of += [entry] * len(owners[len(entry_of)].parts)
    survived = set(kept)
    changed = {id(entry_of[k]) for k, message in zip(kept, repaired) if message is not messages[k]}
    changed |= {id(entry_of[k]) for k in range(len(messages)) if k not in survived}
    rendered: dict[str, list[Block]] = {}
    for k, message in zip(kept, repaired):
        if id(entry_of[k]) in changed:
            for sid, _ in owners[k].bodies:
                rendered.setdefault(sid, []).extend(message.content)
    return {k: _judged_again(owners[k], rendered) for k in range(len(messages)) if id(entry_of[k]) in changed}


def _judged_again(prepared: _Prepared, rendered: Mapping[str, list[Block]]) -> tuple[Source, ...]:
    return tuple(
        attrs.evolve(source, complete=body is not None and coverage_complete(rendered.get(source.id, []), body.content))
        if source.complete is not None else source
        for source, (_, body) in zip(prepared.sources, prepared.bodies + ((None, None),) * len(prepared.sources))
    )


def _breaks(parts: _Parts, placed: list[CompiledMessage], kept: Sequence[int], injected: bool,
            whole: bool) -> tuple[list[int], Callable[[], Sequence[int]]]:
    """Where ``placed``'s breakpoints are, and its estimated tokens (made when asked, P9). With
    the parts one to one with the messages (no repair nor injection moved any), their marks and
    estimates are the memo's; otherwise both are read off the messages."""
    if whole and not injected:
        return [i for i in parts.marks if placed[i].cache_breakpoint], lambda: parts.tokens
    breaks = [i for i, message in enumerate(placed) if message.cache_breakpoint]
    if injected:
        return breaks, lambda: [estimate_blocks(message.content) for message in placed]
    messages = parts.messages  # a repaired part's estimate is made again
    return breaks, lambda: [parts.tokens[k] if message.content is messages[k].content else estimate_blocks(message.content)
                            for message, k in zip(placed, kept)]
