"""The namespace's pure decisions, as plain synchronous code: no trio, no store (DESIGN §6)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxrt import Message, NarrowingRefusedError, ReaderConflictError, StrategyRefusedError, Text
from ctxrt.testing import CorruptRecord, EditItem, Holds, RemoveItems, record_from_value, states
from ctxrt.namespace.core import (
    Place,
    check_attach,
    check_reader,
    edit_propagation,
    floor_from_value,
    judge_edit,
    removal_propagation,
    require_marking,
    resolve_reader,
)

HERE = Place("agents", "main")


def message(sequence: int, *blocks: Text, participant: str = "user", metadata: object = None) -> Message:
    return Message(str(sequence), sequence, participant, tuple(blocks), metadata, 0, ())  # type: ignore[arg-type]


def test_a_record_is_a_readers_name_none_or_corrupt() -> None:
    """C3: anything but a non-empty string or nothing is a record that names no reader."""
    assert record_from_value("ann") == "ann"
    assert record_from_value(None) is None
    assert record_from_value("") == CorruptRecord("")
    assert record_from_value(["ann"]) == CorruptRecord(["ann"])


def test_a_floor_is_a_non_negative_sequence_or_unreadable() -> None:
    """D2, D5: an unset floor is 0; a value that is not a sequence reads as None (unreadable)."""
    assert floor_from_value(None) == 0
    assert floor_from_value(17) == 17
    assert floor_from_value(True) is None
    assert floor_from_value(-1) is None
    assert floor_from_value("17") is None


def test_resolving_a_reader_takes_the_record_or_refuses_another_naming_both() -> None:
    """C1, C3, C6: no reader means the record's; the record's own passes; another is refused naming both."""
    assert resolve_reader("ann", None, HERE) == "ann"
    assert resolve_reader(None, "bob", HERE) == "bob"
    assert resolve_reader("ann", "ann", HERE) == "ann"
    with pytest.raises(ReaderConflictError, match=r"'ann'.*'bob'.*namespace of its own"):
        resolve_reader("ann", "bob", HERE)
    with pytest.raises(ReaderConflictError, match="not a reader's name"):
        resolve_reader(CorruptRecord(5), None, HERE)


def test_the_read_time_check_refuses_any_mismatch() -> None:
    """C8: the record must name exactly the manager's reader; no reader is refused once one is recorded."""
    check_reader("ann", "ann", HERE)
    check_reader(None, None, HERE)
    for record, reader in [("ann", None), ("ann", "bob"), (None, "ann"), (CorruptRecord(1), None)]:
        with pytest.raises(ReaderConflictError, match="namespace 'agents' on branch 'main'"):
            check_reader(record, reader, HERE)


def test_an_attach_that_compiles_for_no_reader_is_refused_where_a_reader_is_recorded() -> None:
    """C7: moving a no-reader manager onto a claimed namespace is refused; an open without a reader takes the record."""
    assert check_attach("ann", None, compiles_for_none=False, place=HERE) == "ann"
    with pytest.raises(ReaderConflictError):
        check_attach("ann", None, compiles_for_none=True, place=HERE)
    assert check_attach(None, None, compiles_for_none=True, place=HERE) is None


def test_a_reader_refuses_a_strategy_that_does_not_mark_its_reads() -> None:
    """D6: only under a reader."""
    require_marking(False, "lazy", None, "agents")
    require_marking(True, "careful", "ann", "agents")
    with pytest.raises(StrategyRefusedError, match="marks_compression_reads"):
        require_marking(False, "lazy", "ann", "agents")


def test_an_edit_that_hides_nothing_widens_or_deletes_goes_through_for_anyone() -> None:
    """D1: widening, unchanged blocks and deleted blocks are never narrowings, whatever the floor."""
    old = message(5, Text("a", audience=("ann",)), Text("b"))
    for new in [(Text("a"), Text("b")), (Text("a", audience=("ann", "bob")),), (Text("x", audience=("ann",)), Text("y"))]:
        judge_edit(old, new, reader=None, floor=lambda: 100, others=lambda: (), place=HERE)


def test_a_narrowing_is_judged_against_the_reader_the_floor_and_the_other_namespaces() -> None:
    """D3, D5: hiding a block from the own reader passes above the floor only, and never while another
    namespace records the same reader or a corrupt record; hiding from anyone else is always refused."""
    old = message(5, Text("a", audience=("ann", "bob")))
    from_bob = (Text("a", audience=("ann",)),)
    from_ann = (Text("a", audience=("bob",)),)
    with pytest.raises(NarrowingRefusedError, match="no reader"):
        judge_edit(old, from_bob, reader=None, floor=lambda: 0, others=lambda: (), place=HERE)
    with pytest.raises(NarrowingRefusedError, match="'bob', other readers than 'ann'"):
        judge_edit(old, from_bob, reader="ann", floor=lambda: 0, others=lambda: (), place=HERE)
    judge_edit(old, from_ann, reader="ann", floor=lambda: 4, others=lambda: ("carl", None), place=HERE)
    with pytest.raises(NarrowingRefusedError, match="narrowing floor 5"):
        judge_edit(old, from_ann, reader="ann", floor=lambda: 5, others=lambda: (), place=HERE)
    with pytest.raises(NarrowingRefusedError, match="can't be read"):
        judge_edit(old, from_ann, reader="ann", floor=lambda: None, others=lambda: (), place=HERE)
    for other in ("ann", CorruptRecord(3)):
        with pytest.raises(NarrowingRefusedError, match="another namespace"):
            judge_edit(old, from_ann, reader="ann", floor=lambda: 0, others=lambda: (other,), place=HERE)
    with pytest.raises(NarrowingRefusedError, match="readers it doesn't name"):
        judge_edit(message(5, Text("a")), (Text("a", audience=("ann",)),), reader="ann", floor=lambda: 0, others=lambda: (),
                   place=HERE)


def test_an_edit_reaches_copy_entries_as_the_reader_sees_it_and_drops_those_it_sees_nothing_of() -> None:
    """M5, A6: copies are rewritten in the reader's view, derived and referenced entries untouched."""
    entries = [
        message(10, Text("old"), metadata={"source_ids": ["5"], "relation": "copy"}),
        message(11, Text("sum"), metadata={"source_ids": ["5"], "relation": "derived"}),
        message(12, Text("other"), metadata={"source_ids": ["6"], "relation": "copy"}),
    ]
    state = states.context_state("agents")
    visible = edit_propagation(entries, "5", (Text("new", audience=("ann",)), Text("all")), reader="ann",
                               context_state=state, branch=1)
    assert [type(c) for c in visible] == [EditItem] and visible[0].item_sequence == 10
    assert b'"audience"' not in visible[0].data and b'"new"' in visible[0].data
    hidden = edit_propagation(entries, "5", (Text("new", audience=("bob",)),), reader="ann", context_state=state,
                              branch=1)
    assert hidden == [RemoveItems(state=state, branch=1, from_sequence=10, to_sequence=10)]
    removed = removal_propagation(entries, 5, 6, context_state=state, branch=1)
    assert [c.from_sequence for c in removed] == [10, 12]


def test_holds_keep_the_lowest_held_sequence_until_released_or_lapsed() -> None:
    """T5: a hold with no timeout stays until released; a timed one lapses at its time."""
    holds = Holds()
    holds.place([9, 4], None, now=0.0)
    holds.place([7], 5.0, now=10.0)
    assert holds.floor() == 4 and holds.next_lapse(10.0) == 15.0
    holds.release([4])
    assert holds.floor() == 7
    assert holds.lapse(14.9) == 0 and holds.lapse(15.0) == 1
    assert holds.floor() == 9 and holds.next_lapse(15.0) == math.inf


@given(st.lists(st.one_of(
    st.tuples(st.just("place"), st.lists(st.integers(0, 6), max_size=3), st.none() | st.integers(0, 4)),
    st.tuples(st.just("release"), st.lists(st.integers(0, 6), max_size=3)),
    st.tuples(st.just("wait"), st.integers(0, 3)),
), max_size=30))
def test_holds_lapse_each_timed_hold_at_its_time_whatever_was_placed_and_released(steps: list[tuple[Any, ...]]) -> None:
    """T5: checked at every message (lapse, then next_lapse), holds placed, replaced and released
    in any order lapse as a plain table of them says: the ones whose time is up, and no other."""
    holds, now = Holds(), 0.0
    table: dict[int, float] = {}  # each hold's lapse time
    for step in steps:
        match step:
            case ("place", sequences, timeout):
                holds.place(sequences, None if timeout is None else float(timeout), now)
                table.update(dict.fromkeys(sequences, math.inf if timeout is None else now + timeout))
            case ("release", sequences):
                holds.release(sequences)
                for sequence in sequences:
                    table.pop(sequence, None)
            case ("wait", seconds):
                now += seconds
        lapsed = [sequence for sequence, at in table.items() if at <= now]
        assert holds.lapse(now) == len(lapsed)
        for sequence in lapsed:
            del table[sequence]
        assert len(holds) == len(table)
        assert holds.floor() == min(table, default=None)
        assert holds.next_lapse(now) == min((at for at in table.values() if at > now), default=math.inf)


def test_state_ids_are_built_in_one_place_and_read_back() -> None:
    """DESIGN §6: the omitted namespace, "" and "default" are one; reader states map back to their namespace."""
    assert states.normalise_namespace(None) == states.normalise_namespace("") == "default"
    assert states.namespace_of_reader_state(states.reader_state("agents/ann")) == "agents/ann"
    assert states.namespace_of_reader_state(states.floor_state("agents")) is None
    assert states.auxiliary_state(None) == states.slot_state("x", isolate=False)
    with pytest.raises(ValueError, match="lone surrogate"):
        states.normalise_namespace("\ud800")
    with pytest.raises(TypeError, match="namespace must be a string"):
        states.normalise_namespace(5)


def test_slots_and_strategy_states_are_recognised_by_their_ids() -> None:
    """DESIGN §6: readers of a store (the CLI) tell slots and a namespace's strategy states by the ids states.py builds."""
    assert states.is_slot(states.slot_state("agents", isolate=True)) and states.is_slot(states.SHARED_SLOT)
    assert not states.is_slot(states.context_state("agents"))
    summaries = states.strategy_state("team/ann", "autobio", "summaries")
    assert states.namespace_of_strategy_state(summaries, "summaries") == "team/ann"
    assert states.namespace_of_strategy_state(summaries, "chunks") is None
