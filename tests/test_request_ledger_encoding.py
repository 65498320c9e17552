"""The request ledger's encoding (``ctxrt.request_ledger``, a pure part; Q1, Q3): a record kept as
the run of parts it shares with the last one and its own decodes to exactly the parts and held
items the request had, and a body digested item by item against the last body is the digest made
afresh, whatever the turns between did (append, a window sliding, an edit, a re-rendered first
message). Property tests: sequences of requests drawn by hypothesis."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrt import Budget, CompiledMessage, CompileResult, Message, Provenance, Source, Text, open_runtime
from ctxrt.errors import StoreCorruptError
from ctxrt.request_ledger import (
    BodyDigests,
    Chunked,
    Parts,
    RequestEncoder,
    RequestRecord,
    Shared,
    body_digest,
    body_digest_v1,
    canonical_json,
    decode_record,
    encode_record,
    item_digest,
)
from ctxrt.testing import AppendItem, verify

# One step between two requests: (messages a window drops at the front, messages appended, an edit
# at a position (as a fraction of the request), whether the first message is rendered afresh, and
# whether its record is refused after it was encoded: the next is kept against the one before).
steps = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.none() | st.floats(0, 0.999), st.booleans(),
                           st.booleans()), min_size=1, max_size=40)


class Turns:
    """Requests as a compile makes them: the same objects for what is unchanged."""

    def __init__(self) -> None:
        self.next = 1
        self.window: list[tuple[CompiledMessage, tuple[Source, ...], Message]] = []

    def made(self, text: str) -> tuple[CompiledMessage, tuple[Source, ...], Message]:
        sequence, self.next = self.next, self.next + 1
        content = (Text(text),)
        stored = Message(str(sequence), sequence, "user" if sequence % 2 else "Claude", content)
        if sequence % 7 == 0:  # a message split in two parts (its calls and its text): held once
            return (CompiledMessage(stored.participant, (Text(f"part of {text}"),)),
                    (Source("message", str(sequence - 1), False),), stored)
        if sequence % 5 == 0:  # a summary's message: kept whole, not named
            return CompiledMessage("user", (Text(f"summary {text}"),)), (Source("summary", f"S{sequence}"),), stored
        if sequence % 11 == 0:  # an injected message: it holds no item
            return CompiledMessage("user", (Text(f"note {text}"),)), (Source("injection", f"I{sequence}"),), stored
        if sequence % 13 == 0:  # a message and a summary merged in one: it holds both
            return (CompiledMessage(stored.participant, (Text(f"both {text}"),)),
                    (Source("summary", f"S{sequence}"), Source("message", str(sequence), False)), stored)
        return CompiledMessage(stored.participant, content), (Source("message", str(sequence), True),), stored

    def step(self, drop: int, append: int, edit: float | None, fresh_first: bool) -> CompileResult:
        self.window = self.window[drop:] + [self.made(f"line {self.next}") for _ in range(append)]
        if edit is not None and self.window:
            at = int(edit * len(self.window))
            old = self.window[at]
            content = (Text(f"edited {old[2].id}"),)
            stored = Message(old[2].id, old[2].sequence, old[2].participant, content)
            self.window[at] = (CompiledMessage(stored.participant, content), old[1], stored)
        if fresh_first and self.window:
            first = self.window[0]
            self.window[0] = (CompiledMessage(first[0].participant, first[0].content), first[1], first[2])
        raw = {stored.id: stored for _, _, stored in self.window}
        provenance = Provenance("c", "agents/ann", "main", "ann", "passthrough",
                                tuple(sources for _, sources, _ in self.window), raw, {})
        return CompileResult([message for message, _, _ in self.window], [], provenance)


def record(record_id: str, parts: Parts, sequence: int) -> RequestRecord:
    return RequestRecord(id=record_id, at_ms=0, sequence=sequence, namespace="agents/ann", branch="main",
                         reader="ann", form="anthropic", zone_tokens={}, held=parts.held, options={},
                         parts=parts.parts)


def held_afresh(result: CompileResult) -> list[str]:
    seen: dict[str, None] = {}
    for sources in result.provenance.messages:
        seen.update((s.id, None) for s in sources if s.kind != "injection")
    return list(seen)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_records_kept_against_the_last_decode_to_the_request_they_recorded(turns: list[Any]) -> None:
    """Q1, Q3: each record, decoded against the one it names, has the request's parts (a stored
    message named, anything else kept whole; a part may hold no item, or two) and held items in
    order, with versions as of the record that first held them; a record refused after it was
    encoded leaves the next one kept against the one before it, as exactly."""
    made, encoder, decoded = Turns(), RequestEncoder(), {}
    for n, (drop, append, edit, fresh_first, refused) in enumerate(turns):
        result = made.step(drop, append, edit, fresh_first)
        base, shared, head, tail, parts = encoder.encode(result, n)
        if refused:
            continue
        data = encode_record(record(f"r{n}", parts, n), base=base, shared=shared, head=head, tail=tail)
        encoder.wrote(f"r{n}")
        back, state = decode_record(data, None if base is None else decoded[base])
        decoded[f"r{n}"] = state
        assert back.parts == parts.parts and back.held == parts.held
        assert [item.id for item in back.held] == held_afresh(result)
        assert len(back.parts) == len(result.messages)
        for part, message, sources in zip(back.parts, result.messages, result.provenance.messages):
            assert part.participant == message.participant
            assert part.message is None or sources[0].kind == "message"
            assert part.version <= n


item = st.builds(lambda n, text: {"role": "user" if n % 2 else "assistant", "content": text},
                 st.integers(0, 3), st.text(max_size=8))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(item, max_size=3), st.booleans()), min_size=1, max_size=20))
def test_a_body_digested_against_the_last_is_the_digest_made_afresh(changes: list[Any]) -> None:
    """Q1: the digest of a body sharing items with the last (a window that slid, items appended,
    the last item edited in place by the host) is the digest of the body made afresh."""
    memo, items = BodyDigests(), []
    for drop, appended, edit_last in changes:
        items = items[drop:] + appended
        if edit_last and items:
            items[-1]["content"] = items[-1]["content"] + "!"  # the host's to edit (P14)
        body = {"system": "s", "messages": list(items)}
        assert body_digest(body, memo) == body_digest(body)


# One step between two bodies whose items merge runs of blocks (every message a user's, say): blocks
# a window drops from the first item, items dropped at the front, blocks appended to the last item,
# items appended, and the host's edits of the last item in place (its last block, its block list).
merged_steps = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 3), st.integers(0, 2),
                                  st.booleans(), st.booleans()), min_size=1, max_size=20)


@settings(max_examples=80, deadline=None)
@given(merged_steps)
def test_a_merged_turn_digested_block_by_block_against_the_last_is_the_digest_made_afresh(steps: list[Any]) -> None:
    """Q1, P14: a body whose items merge many blocks, digested against the last (a turn trimmed at
    the front, grown at the back, the host's cache_control set on the last block in place, a block
    added to the last item's list), is the digest made afresh; an item's digest is of its blocks'."""
    memo, counter = BodyDigests(), iter(range(10_000))
    block = lambda: {"type": "text", "text": f"b{next(counter)}"}  # noqa: E731
    items: list[dict[str, Any]] = [{"role": "user", "content": [block() for _ in range(150)]}]  # a few chunks
    for trim, drop, grow, add, mark_last, append_in_place in steps:
        items = [dict(item) for item in items]  # a body's turns are new dicts; their blocks are shared
        if items:
            items[0]["content"] = items[0]["content"][trim:]
            items[-1]["content"] = items[-1]["content"] + [block() for _ in range(grow)]
        items = items[drop:] + [{"role": "user" if n % 2 else "assistant", "content": [block(), block()]}
                                for n in range(add)]
        body = {"system": "s", "messages": items}
        assert body_digest(body, memo) == body_digest(body)
        if items and items[-1]["content"]:
            if mark_last:  # the host's to edit (P15): in place, after the digest
                items[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
            if append_in_place:
                items[-1]["content"].append(block())
            assert body_digest(body, memo) == body_digest(body)
    assert item_digest({"role": "user", "content": []}) != item_digest({"role": "user", "content": ""})


def test_a_format_1_digest_takes_each_item_whole() -> None:
    """Q5: format 1's digest (what older records hold) is the sha256 over the body's canonical JSON
    without its items, the key, then each item's sha256 taken whole; format 2's is another."""
    item = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    body = {"system": "s", "messages": [item]}
    by_hand = hashlib.sha256(b'{"system":"s"}messages' + hashlib.sha256(canonical_json(item)).digest())
    assert body_digest_v1(body) == by_hand.hexdigest() != body_digest(body)


def _digest(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 40), st.integers(0, 3)),
                min_size=1, max_size=12))
def test_chunks_kept_across_a_shared_run_are_the_chunks_made_afresh(steps: list[Any]) -> None:
    """Q1: a list of digests cut into chunks by content, made from the last one's run (a window that
    slid and grew, items new at the front) has the cuts and chunk digests of the list made afresh."""
    counter = iter(range(10**6))
    digests = [_digest(next(counter)) for _ in range(300)]
    chunked = Chunked.of(digests)
    for head, drop, cut_back, grow in steps:
        drop = min(drop, len(digests))
        keep = max(len(digests) - drop - cut_back, 0)
        own_head = [_digest(next(counter)) for _ in range(head)]
        tail = [_digest(next(counter)) for _ in range(grow * 10)]
        chunked = chunked.then(Shared(head, drop, keep), own_head, tail)
        digests = [*own_head, *digests[drop:drop + keep], *tail]
        afresh = Chunked.of(digests)
        assert (chunked.chunks, chunked.ends, chunked.sums) == (afresh.chunks, afresh.ends, afresh.sums)


async def test_verify_reports_a_record_kept_against_one_not_before_it(store_path: Path) -> None:
    """Q3, K7: a record whose base is not before it in the ledger (what a base that committed late,
    or never, left) makes requests() raise StoreCorruptError; verify reports it too, naming the
    ledger and the base."""
    async with open_runtime(store_path) as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        await m.add_message("user", "one")
        record = await m.record_request(await m.compile(Budget(max_tokens=10_000)), form="anthropic")
        orphan = encode_record(attrs.evolve(record, id="orphan"), base="not-there", shared=Shared(0, 0, 1), tail=())
        await rt.store.ask(AppendItem(state="agents/ann/requests", branch="main", data=orphan))
        with pytest.raises(StoreCorruptError, match="agents/ann/requests"):
            await m.requests()
        await m.aclose()
    report = verify(str(store_path))
    assert report.status == "damaged"
    assert any("agents/ann/requests" in item.place and "not-there" in item.what for item in report.damage), report


async def test_a_record_of_format_1_reads_back_and_its_rebuild_matches_its_digest(store_path: Path) -> None:
    """Q5, Q3: a record written before format 2 (its digest took each item whole) reads back, and
    its rebuild matches it by format 1's definition; a changed digest matches by neither."""
    async with open_runtime(store_path) as rt:
        m = await rt.open("agents/ann", view_reader="ann", ledger=True)
        await m.add_message("user", "what is the plan?")
        await m.add_message("Claude", "the plan is this")
        result = await m.compile(Budget(max_tokens=10_000))
        body = result.to_anthropic(assistant="Claude")
        made = await m.record_request(result, form="anthropic", options={"assistant": "Claude"})
        for name, digest in (("old", body_digest_v1(body)), ("changed", body_digest_v1({**body, "system": "x"}))):
            old = encode_record(attrs.evolve(made, id=name, body_digest=digest)).replace(b',"f":2,', b',"f":1,')
            await rt.store.ask(AppendItem(state="agents/ann/requests", branch="main", data=old))
        records = {record.id: record for record in await m.requests()}
        assert records["old"].body_digest == body_digest_v1(body) != made.body_digest
        assert (await m.rebuild_request(records["old"])).matches
        assert not (await m.rebuild_request(records["changed"])).matches
        assert (await m.rebuild_request(records[made.id])).matches
        await m.aclose()
    assert verify(str(store_path)).status == "sound"  # verify decodes format-1 records too


def test_chunks_kept_over_thousands_of_turns_are_the_chunks_made_afresh() -> None:
    """Q1: over 3,000 turns of a window that slides and grows (its origin moved tens of thousands
    of digests on), now and then cut short at the back, jumping to ten times its size (a budget
    raised) and back, the chunks kept from the last list are those of the list made afresh."""
    counter = iter(range(10**7))
    digests = [_digest(next(counter)) for _ in range(600)]
    chunked, moved = Chunked.of(digests), 0
    for turn in range(3_000):
        drop, cut, grow = turn % 4, 40 if turn % 97 == 0 else 0, 3 + turn % 3
        if turn % 500 == 250:
            grow = 5_400  # a budget raised: the window jumps
        if len(digests) > 3_000:
            drop = len(digests) - 600  # and back
        keep = max(len(digests) - drop - cut, 0)
        head = [_digest(next(counter)) for _ in range(turn % 29 == 0)]  # now and then a first message re-rendered
        tail = [_digest(next(counter)) for _ in range(grow)]
        chunked = chunked.then(Shared(len(head), drop, keep), head, tail)
        digests = [*head, *digests[drop:drop + keep], *tail]
        moved = max(moved, chunked.origin)
        if turn % 10 == 0 or turn > 2_990:
            afresh = Chunked.of(digests)
            assert (chunked.chunks, chunked.ends, chunked.sums) == (afresh.chunks, afresh.ends, afresh.sums), turn
    assert moved > 10_000
