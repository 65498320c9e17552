"""The reader's view of blocks and of listings, by property (A2, A3, A5, D1; F3).

Pure: no LMDB, no event loop. Listings are driven through random appends and rewrites and
compared, after every step, with the same view computed from scratch.
"""

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import FakeSlot

from ctxrt import Message, Text, Thinking, ToolUse, content_for_reader
from ctxrt.testing import FULL, FilteredListing, MergedListing, ReaderListing, hidden_by_edit

READERS = ("ann", "bob", "cy")
audiences = st.none() | st.lists(st.sampled_from(READERS), min_size=1, max_size=3, unique=True).map(tuple)
raws = st.none() | st.sampled_from(["r1", "r2"])


@st.composite
def blocks(draw: Any) -> Any:
    kind = draw(st.sampled_from(["text", "thinking", "tool"]))
    if kind == "tool":
        return ToolUse(draw(st.text(min_size=1, max_size=3)), "look", {}, raw=draw(raws))
    cls = Text if kind == "text" else Thinking
    return cls(draw(st.text(max_size=5)), audience=draw(audiences), raw=draw(raws))


readers = st.none() | st.sampled_from(READERS + ("dee",))


@given(st.lists(st.sampled_from(READERS), max_size=3))
def test_an_audience_given_as_a_list_is_kept_as_a_tuple_so_the_block_stays_hashable(names: list[str]) -> None:
    """A2, M6: Text and Thinking made with audience=[...] hold a tuple, hash, and equal the tuple form."""
    for cls in (Text, Thinking):
        block = cls("x", audience=names)
        assert block.audience == tuple(names) and isinstance(block.audience, tuple)
        assert hash(block) == hash(cls("x", audience=tuple(names)))
        assert {block} == {cls("x", audience=tuple(names))}


@given(st.lists(blocks(), max_size=6), readers)
def test_a_reader_keeps_exactly_the_blocks_addressed_to_it_without_the_field(content: list[Any], reader: Any) -> None:
    """A2, A8: kept = no audience or one naming the reader, in order, never carrying an audience field."""
    kept = content_for_reader(content, reader)
    expected = [b for b in content if getattr(b, "audience", None) is None or reader in b.audience]
    assert [attrs.evolve(b, raw=None) for b in kept] == [
        attrs.evolve(b, **({"audience": None} if hasattr(b, "audience") else {}), raw=None) for b in expected
    ]
    assert all(getattr(b, "audience", None) is None for b in kept)


@given(st.lists(blocks(), max_size=6), readers)
def test_no_kept_block_carries_a_raw_form_a_hidden_block_shares(content: list[Any], reader: Any) -> None:
    """A5: a raw replay form shared with a hidden block is taken off the blocks that remain."""
    kept = content_for_reader(content, reader)
    hidden_raws = {b.raw for b in content if b.raw is not None and getattr(b, "audience", None) is not None
                   and reader not in b.audience}
    assert not {b.raw for b in kept} & hidden_raws


@given(st.lists(blocks(), max_size=5), st.lists(blocks(), max_size=5))
def test_an_edit_narrows_for_a_reader_exactly_when_that_reader_loses_a_block_in_place(old: list[Any], new: list[Any]) -> None:
    """D1: blocks compared by position, over the positions both hold; a reader is hidden from iff a block it saw
    there is no longer its own (a block the edit leaves out is a deletion, not a narrowing)."""
    names, others = hidden_by_edit(old, new)

    def sees(block: Any, reader: str | None) -> bool:
        audience = getattr(block, "audience", None)
        return audience is None or (reader is not None and reader in audience)

    for reader in READERS + ("dee", None):
        lost = any(
            sees(block, reader) and not sees(after, reader) for block, after in zip(old, new)
        )
        if lost:
            assert reader in names or others, (reader, old, new)
        if not others and reader is not None:
            assert (reader in names) == lost, (reader, old, new)
    if not names and not others:  # hides nothing in place: every reader keeps every block it saw that stays
        assert all(sees(new[i], r) for r in READERS for i, b in enumerate(old[: len(new)]) if sees(b, r))


# -- listings: incremental equals from scratch (F3) -----------------------------------------------


def keep(message: Message) -> bool:
    return message.participant != "filtered"


class ListingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.slots = [FakeSlot(), FakeSlot()]
        self.sequence = 0
        merged = MergedListing(self.slots)
        self.views = {reader: ReaderListing(FilteredListing(merged, keep), reader) for reader in ("ann", "bob", None)}

    @rule(slot=st.integers(0, 1), participant=st.sampled_from(["user", "filtered"]),
          content=st.lists(st.builds(Text, st.text(max_size=3), audience=audiences), min_size=1, max_size=3))
    def append(self, slot: int, participant: str, content: list[Text]) -> None:
        self.sequence += 1
        target = self.slots[slot]
        target.append(Message(str(self.sequence), self.sequence, participant, tuple(content)))
        target.audience = target.audience or any(b.audience is not None for b in content)

    @precondition(lambda self: any(s.messages for s in self.slots))
    @rule(data=st.data())
    def rewrite(self, data: Any) -> None:
        target = data.draw(st.sampled_from([s for s in self.slots if s.messages]))
        index = data.draw(st.integers(0, len(target.messages) - 1))
        messages = list(target.messages)
        if data.draw(st.booleans()):
            del messages[index]
        else:
            messages[index] = attrs.evolve(messages[index], content=(Text("edited", audience=("bob",)),))
            target.audience = True
        target.rewrite(messages)

    @rule(reader=st.sampled_from(["ann", "bob", None]), count=st.integers(1, 8))
    def read_back(self, reader: str | None, count: int) -> None:
        """A window holds at least ``count`` of the newest messages, or all of them, and is a
        suffix of the whole listing."""
        window = self.views[reader].window(count)
        expected = self.expected(reader)
        assert window.messages == expected[len(expected) - len(window.messages) :]
        assert len(window.messages) >= min(count, len(expected))
        assert not window.complete or window.messages == expected

    def expected(self, reader: str | None) -> list[Message]:
        everything = sorted((m for s in self.slots for m in s.messages), key=lambda m: m.sequence)
        expected = []
        for message in everything:
            if not keep(message):
                continue
            content = content_for_reader(message.content, reader)
            if content:
                expected.append(message if content == message.content else attrs.evolve(message, content=content))
        return expected

    @invariant()
    def incremental_views_equal_fresh_ones(self) -> None:
        for reader, view in self.views.items():
            assert view.window(FULL).messages == self.expected(reader)


ListingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_listings_extended_on_appends_equal_listings_built_from_scratch = ListingMachine.TestCase
