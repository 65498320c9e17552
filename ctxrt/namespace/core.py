"""The namespace's pure decisions: reader records, the read-time check, narrowing, propagation, holds.

Synchronous and free of trio and LMDB: each function takes what the actor knows and returns a
verdict or the store commands to send (docs/architecture.md, Namespace actors). The actor owns the state and does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..content import codec
from ..content.blocks import Block, Message, content_for_reader, hidden_by_edit
from ..errors import NarrowingRefusedError, ReaderConflictError, StrategyRefusedError
from ..store.protocol import EditItem, RemoveItems


@attrs.frozen
class CorruptRecord:
    """A reader record that isn't a reader's name (written by something else)."""

    value: Any

    def __str__(self) -> str:
        return f"{self.value!r}, which is not a reader's name"


Record = str | None | CorruptRecord


@attrs.frozen
class Place:
    """Where a decision is made, for error messages: a namespace on a branch."""

    namespace: str
    branch: str

    def __str__(self) -> str:
        return f"namespace {self.namespace!r} on branch {self.branch!r}"


def record_from_value(value: Any) -> Record:
    """The record a stored ``<ns>/reader`` value means."""
    if value is None or (isinstance(value, str) and value):
        return value
    return CorruptRecord(value)


def floor_from_value(value: Any) -> int | None:
    """The narrowing floor a stored value means: 0 if never set, None if it isn't a sequence."""
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def resolve_reader(record: Record, reader: str | None, place: Place) -> str | None:
    """The reader a manager opened with ``reader`` compiles for, given the namespace's record.

    None means the record's reader (C6); another reader than the record's, or a record that is
    not a reader's name, is refused (C1, C3).
    """
    if isinstance(record, CorruptRecord):
        raise ReaderConflictError(f"{place} records {record}")
    if reader is None:
        return record
    if record is not None and record != reader:
        raise ReaderConflictError(
            f"{place} records reader {record!r}, so it refuses reader {reader!r}: its summaries and context "
            f"log hold {record!r}'s view, so another reader would read them. Give each reader a namespace of "
            f"its own"
        )
    return reader


def check_reader(record: Record, reader: str | None, place: Place) -> None:
    """The read-time check (C8): refuse a request from a manager whose reader the record doesn't name."""
    if record == reader:
        return
    if isinstance(record, CorruptRecord):
        raise ReaderConflictError(f"{place} records {record}; refusing to serve it")
    if record is None:
        raise ReaderConflictError(f"{place} records no reader, but this manager compiles for {reader!r}")
    raise ReaderConflictError(
        f"{place} records reader {record!r}; this manager compiles for {reader!r}. Its summaries and context "
        f"log hold {record!r}'s view, so another reader would read them: give each reader a namespace of its own"
    )


def check_attach(record: Record, reader: str | None, *, compiles_for_none: bool, place: Place) -> str | None:
    """An attach's verdict: the reader it compiles for (C1, C3, C6), refusing a manager that
    compiles for no reader where a reader is recorded (C7)."""
    if compiles_for_none and record is not None:
        check_reader(record, None, place)
    return resolve_reader(record, reader, place)


def require_marking(marks_compression_reads: bool, strategy_name: str, reader: str | None, namespace: str) -> None:
    """D6: a manager that compiles for a reader refuses a strategy that doesn't mark compression reads."""
    if reader is not None and not marks_compression_reads:
        raise StrategyRefusedError(
            f"strategy {strategy_name!r} doesn't declare marks_compression_reads = True, so namespace "
            f"{namespace!r} can't compile it for reader {reader!r}: what its compression reads couldn't be "
            f"recorded before an edit narrows it"
        )


_WHY = "nothing takes a block out of a summary already written or a request already sent, a removal included"


def judge_edit(
    message: Message, new_content: Sequence[Block], *, reader: str | None, floor: Callable[[], int | None],
    others: Callable[[], Iterable[Record]], place: Place,
) -> None:
    """The narrowing verdict (D1-D5): return if the edit may go through, else raise.

    ``floor()`` gives the namespace's narrowing floor (None when it can't be read); ``others()``
    the records of the branch's other namespaces. Both are called only for a narrowing that
    hides a block from the manager's own reader: most edits hide nothing and read nothing.
    """
    names, unnamed = hidden_by_edit(message.content, new_content)
    if not names and not unnamed:
        return  # hides nothing, widens, or deletes blocks (D1)
    where = f"message {message.id} in {place}"
    if reader is None:
        raise NarrowingRefusedError(
            f"refused: the edit would hide a block of {where}, and a manager that compiles for no reader can't "
            f"see what any reader's compression has read ({_WHY})"
        )
    if unnamed or names - {reader}:
        hidden = sorted(names - {reader}) + (["readers it doesn't name"] if unnamed else [])
        raise NarrowingRefusedError(
            f"refused: the edit would hide a block of {where} from {', '.join(map(repr, hidden))}, other readers "
            f"than {reader!r}, whose compression this manager can't see ({_WHY})"
        )
    floor_now = floor()
    if floor_now is None:
        raise NarrowingRefusedError(
            f"refused: the edit would hide a block of {where} from reader {reader!r}, and the namespace's record "
            f"of what compression has read can't be read"
        )
    if message.sequence <= floor_now:
        raise NarrowingRefusedError(
            f"refused: the edit would hide a block of {where} from reader {reader!r}, and compression may already "
            f"have read it (narrowing floor {floor_now}; {_WHY})"
        )
    for other in others():
        if other == reader or isinstance(other, CorruptRecord):
            shown = other if isinstance(other, CorruptRecord) else repr(other)
            raise NarrowingRefusedError(
                f"refused: the edit would hide a block of {where} from reader {reader!r}, and another namespace "
                f"on the branch records {shown}, whose compression this manager can't see"
            )


def _copies(entries: Iterable[Message]) -> Iterable[tuple[Message, Mapping[str, Any]]]:
    for entry in entries:
        meta = entry.metadata or {}
        if meta.get("relation", "copy") == "copy":
            yield entry, meta


def edit_propagation(
    entries: Iterable[Message], message_id: str, new_content: Sequence[Block], *, reader: str | None,
    context_state: str, branch: int,
) -> list[EditItem | RemoveItems]:
    """Commands carrying an edit to the context log's ``copy`` entries of ``message_id``, as the
    reader sees it; an entry the reader would see nothing of is removed (M5, A6)."""
    content = content_for_reader(tuple(new_content), reader)
    commands: list[EditItem | RemoveItems] = []
    for entry, meta in _copies(entries):
        if message_id not in meta.get("source_ids", ()):
            continue
        if content:
            data = codec.message_to_json(entry.participant, content, meta, 0, ())
            commands.append(EditItem(state=context_state, branch=branch, item_sequence=entry.sequence, data=data))
        else:
            commands.append(RemoveItems(state=context_state, branch=branch, from_sequence=entry.sequence,
                                        to_sequence=entry.sequence))
    return commands


def removal_propagation(
    entries: Iterable[Message], first: int, last: int, *, context_state: str, branch: int
) -> list[RemoveItems]:
    """Commands removing the context log's ``copy`` entries of messages ``first..last`` (M5)."""
    return [
        RemoveItems(state=context_state, branch=branch, from_sequence=entry.sequence, to_sequence=entry.sequence)
        for entry, meta in _copies(entries)
        if any(first <= int(source) <= last for source in meta.get("source_ids", ()) if source.isdigit())
    ]


class Holds:
    """Messages held from compression (T5): each held sequence and when its hold lapses.

    Plain data with the clock passed in, so the actor's tests and the strategies' need no trio.
    """

    def __init__(self) -> None:
        self._expires: dict[int, float] = {}  # message sequence -> lapse time (inf = until released)
        # No hold lapses before this (a release may leave it early: then a lapse looks once for nothing):
        # the check at every message costs nothing until then.
        self._soonest = math.inf
        # Holds of messages not yet written: each holds from a sequence every later append exceeds.
        self._reserved: dict[object, int] = {}

    def __len__(self) -> int:
        return len(self._expires)

    def place(self, sequences: Iterable[int], timeout_s: float | None, now: float) -> None:
        expires = math.inf if timeout_s is None else now + timeout_s
        for sequence in sequences:
            self._expires[sequence] = expires
        self._soonest = min(self._soonest, expires)

    def release(self, sequences: Iterable[int]) -> None:
        for sequence in sequences:
            self._expires.pop(sequence, None)

    def lapse(self, now: float) -> int:
        """Drop the holds whose time is up; returns how many lapsed."""
        if now < self._soonest:
            return 0
        lapsed = [sequence for sequence, expires in self._expires.items() if expires <= now]
        for sequence in lapsed:
            del self._expires[sequence]
        self._soonest = min(self._expires.values(), default=math.inf)
        return len(lapsed)

    def reserve(self, key: object, sequence: int) -> None:
        """Hold from ``sequence`` on until ``unreserve(key)``: for a message being written, whose
        sequence is not known yet but can't be below it."""
        self._reserved[key] = sequence

    def unreserve(self, key: object) -> None:
        self._reserved.pop(key, None)

    def floor(self) -> int | None:
        """The lowest held sequence (it and everything after stay raw), or None."""
        if not self._reserved:
            return min(self._expires) if self._expires else None
        return min([*self._expires, *self._reserved.values()])

    def in_force(self) -> list[tuple[int, float]]:
        """Each held sequence and its lapse time (inf: until released), oldest first."""
        return sorted(self._expires.items())

    def next_lapse(self, now: float) -> float:
        """When the next hold lapses (inf if none is timed)."""
        if self._soonest == math.inf:
            return math.inf
        return min((e for e in self._expires.values() if e > now), default=math.inf)
