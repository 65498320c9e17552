"""A compile with the memo of earlier compiles equals one made from scratch (P16), and its
``stable_prefix_tokens`` is the chained definition's (P9). Pure and synchronous: sequences of
entry lists sharing ``Entry`` objects, as strategies hand them over between turns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrt import (
    CompileResult,
    CompiledMessage,
    Entry,
    Injection,
    Message,
    MessageInjection,
    Text,
    ToolResult,
    ToolUse,
)
from ctxrt.content.codec import to_jsonable
from ctxrt.compile.pipeline import CompileMemo, build_compile_result
from ctxrt.compile.reference import compile_reference, stable_prefix_tokens
from ctxrt.errors import EmptyRequestError
from ctxrt.request_ledger import (
    BodyDigests,
    RequestEncoder,
    RequestRecord,
    body_digest,
    encode_record,
    made_from,
    shared_run,
)
from ctxrt.testing import estimate_blocks

KINDS = ("user", "assistant", "call", "answer", "mixed", "orphan_call", "orphan_result")
VARIANTS = ("canonical", "marked", "shaped", "summary", "empty", "equal")

def _content(kind: str, k: int) -> tuple[Any, ...]:
    said = Text(f"message {k} " + "word " * (k % 5))
    match kind:
        case "call":
            return (said, ToolUse(f"t{k}", "search", {"q": str(k)}))
        case "answer":  # answers the call made just before it, if that message is a call
            return (ToolResult(f"t{k - 1}", f"found {k}"), said)
        case "mixed":  # a non-user message holding a result: split into parts
            return (said, ToolResult(f"t{k - 1}", "late"), Text(f"after {k}"))
        case "orphan_call":
            return (ToolUse(f"lost{k}", "fetch", {"u": "x"}),)
        case "orphan_result":
            return (ToolResult(f"nobody{k}", "stray"),)
    return (said,)

class Pool:
    """Stored messages and the entries a strategy may make of them, each made once (shared)."""

    def __init__(self, kinds: list[str]) -> None:
        self.bodies: dict[str, Message] = {}
        self.entries: dict[tuple[int, str], Entry] = {}
        for k, kind in enumerate(kinds):
            who = "user" if kind in ("user", "answer", "orphan_result") else "assistant"
            message = Message(str(k + 1), k + 1, who, _content(kind, k))
            self.bodies[message.id] = message
            canonical = Entry(who, message.content, (message.id,))
            self.entries[(k, "canonical")] = canonical
            self.entries[(k, "marked")] = attrs.evolve(canonical, cache_marker=True)
            self.entries[(k, "shaped")] = Entry(who, (Text(f"[shortened] {k}"),) + message.content[1:], (message.id,))
            self.entries[(k, "summary")] = Entry("user", (Text(f"summary of {k}"),), (message.id,), "derived",
                                                 (f"s{k}",))
            self.entries[(k, "empty")] = Entry(who, (), (message.id,))

    def edit(self, k: int, entries: list[Entry]) -> list[Entry]:
        """Message ``k`` edited (a new stored body), every entry made of it made anew, as a strategy
        does: the shaped one equal to the last (what was shown didn't change; new content objects,
        as shaping makes), the others with the new content."""
        made = {id(entry): key for key, entry in self.entries.items()}
        old = self.bodies[str(k + 1)]
        edited = self.bodies[old.id] = attrs.evolve(old, content=old.content + (Text(f"edited {k}"),))
        for variant in ("canonical", "marked", "shaped", "empty"):
            entry = self.entries[(k, variant)]
            self.entries[(k, variant)] = attrs.evolve(
                entry, content=tuple(list(entry.content)) if variant in ("shaped", "empty") else edited.content)

        def anew(entry: Entry) -> Entry:
            if id(entry) in made:
                return self.entries[made[id(entry)]]
            if entry.relation == "copy" and entry.source_ids == (old.id,):  # an equal copy made of the old body
                return attrs.evolve(entry, content=edited.content)
            return entry

        return [anew(entry) for entry in entries]

    def entry(self, k: int, variant: str) -> Entry:
        if variant == "equal":  # equal to the canonical entry, another object (a strategy that made it anew)
            return attrs.evolve(self.entries[(k, "canonical")])
        return self.entries[(k, variant)]

picks = st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(VARIANTS + ("canonical",) * 4)), max_size=6)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("trim"), st.integers(1, 4)),
        st.tuples(st.just("append"), picks),
        st.tuples(st.just("splice"), st.integers(0, 40), st.integers(0, 3), picks),
        st.tuples(st.just("mark"), st.integers(0, 40)),
        st.tuples(st.just("renew"), st.integers(0, 40)),
        st.tuples(st.just("edit"), st.integers(0, 40)),
        st.tuples(st.just("inject"), st.sampled_from(("none", "system", "around", "depth"))),
        st.tuples(st.just("again")),
    ),
    min_size=1, max_size=14,
)

def _injections(which: str) -> dict[str, Any]:
    match which:
        case "system":
            return {"injections": [Injection("notes", "system", "remember this")]}
        case "around":
            return {"injections": [Injection("notes", "before_user", "before"), Injection("clock", "after_user", "now")]}
        case "depth":
            return {"message_injections": [MessageInjection("user", "reminder", depth=2)]}
    return {}

def _build(entries: list[Entry], pool: Pool, memo: CompileMemo, injected: dict[str, Any], strict: bool = False,
           stamp: object = None) -> CompileResult:
    return build_compile_result(entries, namespace="ns", branch="main", reader=None, strategy_name="test",
                                lookup=pool.bodies.get, compile_id="c", memo=memo, strict=strict, stamp=stamp,
                                **injected)

def _reference(entries: list[Entry], pool: Pool, injected: dict[str, Any], previous: CompileResult | None) -> CompileResult:
    return compile_reference(entries, namespace="ns", branch="main", reader=None, strategy_name="test",
                             lookup=pool.bodies.get, compile_id="c", previous=previous, **injected)


def _bodies(result: CompileResult) -> list[Any]:
    out: list[Any] = []
    for form in (result.to_anthropic, result.to_openai_chat, result.to_openai_responses):
        try:
            out.append(form(assistant="assistant"))
        except EmptyRequestError:
            out.append(EmptyRequestError)
    return out

def _apply(step: tuple[Any, ...], entries: list[Entry], pool: Pool, size: int) -> tuple[list[Entry], str | None]:
    def made(chosen: list[tuple[int, str]]) -> list[Entry]:
        return [pool.entry(k % size, variant) for k, variant in chosen]

    match step:
        case ("trim", count):  # the budget pushes the oldest out
            return entries[count:], None
        case ("append", chosen):
            return entries + made(chosen), None
        case ("splice", at, count, chosen):  # an edit, removal or summary in the middle
            at = min(at, len(entries))
            return entries[:at] + made(chosen) + entries[at + count:], None
        case ("mark", at) if entries:  # the tail marker moves: the old one back to its canonical entry
            at = at % len(entries)
            out = [pool.entries.get((int(e.source_ids[0]) - 1, "canonical"), e) if e.cache_marker else e for e in entries]
            canonical = out[at]
            out[at] = attrs.evolve(canonical, cache_marker=True) if canonical.content else canonical
            return out, None
        case ("renew", at) if entries:  # one entry made anew, equal to the last one
            at = at % len(entries)
            return entries[:at] + [attrs.evolve(entries[at])] + entries[at + 1:], None
        case ("edit", at):  # a stored message edited: the strategy makes its entries anew
            return pool.edit(at % size, entries), None
        case ("inject", which):
            return entries, which
        case ("again",):  # the same entries compiled again (a warm compile)
            return entries, None
    return entries, None

@settings(max_examples=200)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=30), start=picks, steps=steps,
       stamped=st.booleans())
def test_a_compile_with_the_memo_equals_the_reference(kinds: list[str], start: list[tuple[int, str]],
                                                       steps: list[tuple[Any, ...]], stamped: bool) -> None:
    """P16, P9: after front trims, appends, splices, marker moves, renewed entries, edited messages
    (a shaped entry made anew equal to the last), tool pairs and orphans, split messages,
    injections and the same entries again, each compile through one memo gives what the reference
    compile gives with no memo (messages, system blocks, provenance, the three request bodies,
    ``strict=True`` agreeing), and its stable_prefix_tokens is the chained definition's against the
    compile before it; ``stamped``: the view's stamp given, moved by each edit (else unknown)."""
    pool = Pool(kinds)
    size = len(kinds)
    memo = CompileMemo()
    entries = [pool.entry(k % size, variant) for k, variant in start]
    injected: dict[str, Any] = {}
    previous: CompileResult | None = None
    edits = 0
    for step in [("append", [])] + steps:
        entries, which = _apply(step, entries, pool, size)
        if which is not None:
            injected = _injections(which)
        edits += step[0] == "edit"
        result = _build(entries, pool, memo, injected, strict=True, stamp=edits if stamped else None)
        expected = _reference(entries, pool, injected, previous)
        assert result.messages == expected.messages
        assert result.system_injections == expected.system_injections
        assert result.provenance.messages == expected.provenance.messages
        assert dict(result.provenance.raw_bodies) == dict(expected.provenance.raw_bodies)
        assert dict(result.provenance.completeness) == dict(expected.provenance.completeness)
        assert _bodies(result) == _bodies(expected)
        assert result.stable_prefix_tokens == expected.stable_prefix_tokens
        result.messages.clear()  # the host's list: changing it changes nothing the memo keeps
        previous = expected

class CountedEntry(Entry):
    """An entry that counts the comparisons made of it: how much of a window a compile looked at."""

    __slots__ = ()
    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedEntry.compared += 1
        return Entry.__eq__(self, other)

    __hash__ = Entry.__hash__


def test_a_front_trim_and_an_append_cost_what_changed() -> None:
    """P16: a sliding window (the oldest entry out, one appended) compares a few entries, not the
    window, and every compiled message but the new one is the object the last compile made."""
    pool = Pool(["user", "assistant"] * 200)
    window = [CountedEntry(e.participant, e.content, e.source_ids) for e in (pool.entry(k, "canonical") for k in range(400))]
    memo = CompileMemo()
    first = _build(window[:300], pool, memo, {})
    CountedEntry.compared = 0
    second = _build(window[1:301], pool, memo, {})
    assert CountedEntry.compared <= 4
    assert all(a is b for a, b in zip(second.messages[:-1], first.messages[1:]))


@settings(max_examples=60)
@given(at=st.integers(0, 149), variant=st.sampled_from(("canonical", "shaped", "marked")), stamped=st.booleans())
def test_an_edit_anywhere_in_a_long_window_compiles_as_the_reference_does(at: int, variant: str,
                                                                          stamped: bool) -> None:
    """P16, P9: in a window longer than the stretch from the newest the memo looks at first for an
    edit, an edit of any one message (its entry made anew, or an equal one made anew: shaped)
    compiles as the reference does, and every other message is the object the last compile made."""
    pool = Pool(["user", "assistant"] * 75)
    entries = [pool.entry(k, variant if k == at else "canonical") for k in range(150)]
    memo = CompileMemo()
    first = _build(entries, pool, memo, {}, stamp=0 if stamped else None)
    edited = pool.edit(at, entries)
    second = _build(edited, pool, memo, {}, strict=True, stamp=1 if stamped else None)
    expected = _reference(edited, pool, {}, _reference(entries, pool, {}, None))
    assert second.messages == expected.messages
    assert second.provenance.messages == expected.provenance.messages
    assert second.stable_prefix_tokens == expected.stable_prefix_tokens
    assert all(a is b for k, (a, b) in enumerate(zip(second.messages, first.messages)) if k != at)


def test_the_stable_prefix_after_a_compile_with_an_injection_counts_from_what_that_request_held() -> None:
    """P9, P16: the last compile placed a message injection before its second breakpoint; the next
    one, without it, shares its first entries with the last one's (a run the memo knows) but not
    its messages: the prefix the cache can serve ends at the first breakpoint, as the chained
    definition says, not at the second."""
    pool = Pool(["user", "assistant", "user", "assistant", "user", "assistant"])
    a, b, c, d, f, g = (pool.entry(k, "canonical") for k in range(6))
    marked = [pool.entry(1, "marked"), pool.entry(3, "marked"), pool.entry(5, "marked")]
    memo = CompileMemo()
    first = _build([a, marked[0], c, marked[1], f], pool, memo, _injections("depth"))
    assert [m.cache_breakpoint for m in first.messages] == [False, True, False, False, True, False]
    assert first.messages[3].content == (Text("reminder"),)  # placed before the second breakpoint
    second = _build([a, marked[0], c, marked[1], f, marked[2]], pool, memo, {})
    assert second.stable_prefix_tokens == stable_prefix_tokens(first, second.messages, second.system_injections) > 0


def _compiles(kinds: list[str], start: list[tuple[int, str]], steps: list[tuple[Any, ...]]) -> Iterator[CompileResult]:
    """The results of compiling through one memo the entries ``start`` picks, then after each step."""
    pool = Pool(kinds)
    size = len(kinds)
    memo = CompileMemo()
    entries = [pool.entry(k % size, variant) for k, variant in start]
    injected: dict[str, Any] = {}
    for step in [("append", [])] + steps:
        entries, which = _apply(step, entries, pool, size)
        if which is not None:
            injected = _injections(which)
        yield _build(entries, pool, memo, injected)


@settings(max_examples=150)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=30), start=picks, steps=steps,
       recorded=st.lists(st.sampled_from((True, True, True, False)), min_size=15, max_size=15),
       replaced=st.lists(st.none() | st.floats(0, 0.999), min_size=15, max_size=15))
def test_the_run_a_compile_hands_the_ledger_is_the_run_a_scan_finds(
        kinds: list[str], start: list[tuple[int, str]], steps: list[tuple[Any, ...]], recorded: list[bool],
        replaced: list[float | None]) -> None:
    """Q1, P14: the run of a request's messages shared with the last one recorded, as the compile
    hands it forward (its ``Follows``), makes the record the lists' scan makes, byte for
    byte, whatever came between (trims, appends, splices, moved markers, edits, tool repairs,
    injections, a compile not recorded, the host's list cleared, or a message in it replaced before
    it was recorded); where it is known, the scan finds that same run."""
    hinted, scanned = RequestEncoder(), RequestEncoder()
    for n, result in enumerate(_compiles(kinds, start, steps)):
        if not recorded[n]:  # a compile the host doesn't record (a dry run, say): the next one's hint is not for it
            continue
        at = replaced[n]
        if at is not None and result.messages:  # the host's list, changed in place before it was recorded
            result.messages[int(at * len(result.messages))] = CompiledMessage("user", (Text(f"replaced {n}"),))
        known = hinted.followed(result) if hinted.record_id is not None else None
        made = hinted.encode(result, n)
        alone = scanned.encode(attrs.evolve(result, follows=None), n)
        assert made[:4] == alone[:4] and made[4].parts == alone[4].parts and made[4].held == alone[4].held
        assert known is None or known == alone[1]
        record = RequestRecord(id=f"r{n}", at_ms=0, sequence=n, namespace="ns", branch="main", reader=None,
                               form="anthropic", zone_tokens={}, held=made[4].held, options={}, parts=made[4].parts)
        assert (encode_record(record, base=made[0], shared=made[1], head=made[2], tail=made[3])
                == encode_record(record, base=alone[0], shared=alone[1], head=alone[2], tail=alone[3]))
        hinted.wrote(f"r{n}")
        scanned.wrote(f"r{n}")
        if n % 5 == 4:
            result.messages.clear()  # the host's list, changed after it was recorded: the next one compares


@settings(max_examples=150)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=30), start=picks, steps=steps,
       recorded=st.lists(st.sampled_from(("recorded", "recorded", "host's first", "not recorded")), min_size=15,
                         max_size=15))
def test_the_turns_a_body_takes_from_the_last_give_the_digest_a_scan_gives(
        kinds: list[str], start: list[tuple[int, str]], steps: list[tuple[Any, ...]], recorded: list[str]) -> None:
    """Q1, P14: a body's digest taken with what its assembly knows of the turns it took from the
    last body (``MadeFrom``) is the digest taken by comparing the bodies, and the digest made
    afresh, whatever came between (a body the host made first of the same result, a compile
    whose body was not recorded, trims, splices, moved markers, tool turns, injections); where
    it is known, the run of shared items is the run the scan finds."""
    hinted, scanned = BodyDigests(), BodyDigests()
    last: list[Any] = []  # the items of the last body digested
    for n, result in enumerate(_compiles(kinds, start, steps)):
        try:
            if recorded[n] == "host's first":
                result.to_anthropic(assistant="assistant")
            body = result.to_anthropic(assistant="assistant")
        except EmptyRequestError:
            continue
        if recorded[n] == "not recorded":
            continue
        made = made_from(result, body)
        known = hinted.followed(body["messages"], made)
        if known is not None:
            assert known == shared_run(body["messages"], last)
        assert body_digest(body, hinted, made) == body_digest(body, scanned) == body_digest(body)
        last = body["messages"]
