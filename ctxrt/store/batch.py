"""What each store operation means, whatever engine keeps the rows: the write side of one
transaction. An engine subclasses ``Batch`` with its row writes and the two reads a write needs
(a log's head, an item's place); the checks, the sequence, heads and operations are here once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any, Literal

import attrs

from .. import checks
from ..errors import (
    BranchExistsError,
    BranchNotFoundError,
    MalformedContentError,
    MessageNotFoundError,
    NarrowingRefusedError,
    StateKindError,
    UnknownStateError,
    ValueConflictError,
)
from .catalog import Catalog, log_state, value_state
from .protocol import ANY, BranchSwitched
from .records import (
    MAIN_BRANCH,
    BranchCreated,
    BranchDeleted,
    BranchRow,
    ItemAppended,
    ItemEdited,
    IndexEntry,
    Item,
    ItemsRemoved,
    LogHead,
    Operation,
    StateInfo,
    StateKind,
    ValueSet,
    encode_json,
    index_item,
    index_key,
    index_marker,
    index_state,
    validate_branch_name,
    validate_state_name,
)

Counter = Literal["state", "branch"]


class Batch:
    """The write side of one transaction; every public method is one store operation."""

    def __init__(self, engine: Catalog, sequence: int) -> None:
        # What the engine knew at the batch's start; this batch's own changes are kept apart until commit.
        self.engine = engine
        self.sequence = sequence  # the store's, when the transaction began
        self.new_states: dict[str, StateInfo] = {}
        self.branches: dict[int, BranchRow] = {}  # rows this batch created or changed
        self.heads: dict[tuple[int, int], LogHead] = {}  # log heads this batch wrote
        self.operations: list[Operation] = []
        self._unwritten: dict[tuple[int, int], tuple[StateInfo, BranchRow]] = {}

    # Unnested appends (apply.run_commands): their heads are written by flush_heads; ``wrote`` says the
    # running append has begun writing (a failure then can't be its alone).
    defer_heads = False
    wrote = False

    def savepoint(self) -> tuple[Any, ...]:
        return self.sequence, dict(self.new_states), dict(self.branches), dict(self.heads), len(self.operations)

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.sequence, self.new_states, self.branches, self.heads, count = saved
        del self.operations[count:]

    # -- what an engine provides ------------------------------------------------------------

    def read_head(self, info: StateInfo, row: BranchRow) -> LogHead:
        """The log's current head on ``row`` as this transaction sees it."""
        raise NotImplementedError

    def locate(
        self, info: StateInfo, row: BranchRow, item_sequence: int, head: LogHead,
    ) -> tuple[int, int, LogHead] | None:
        """(index, ordinal, head) of the visible item appended at ``item_sequence`` under ``head`` (the
        log's current head in this transaction), or None."""
        raise NotImplementedError

    def read_range(self, info: StateInfo, row: BranchRow, head: LogHead, start: int, stop: int) -> list[Item]:
        """The log's visible items ``[start, stop)`` under ``head`` (its current head in this transaction)."""
        raise NotImplementedError

    def read_value(self, info: StateInfo, row: BranchRow) -> tuple[Any, int]:
        """The value state's current value on ``row`` and the sequence that set it ((None, 0) if never)."""
        raise NotImplementedError

    def item_version(self, info: StateInfo, row: BranchRow, located: tuple[int, int, LogHead]) -> int:
        """The current version of the item ``locate`` found (the sequence of its latest write)."""
        raise NotImplementedError

    def next_number(self, counter: Counter) -> int:
        """The next state number (``counter="state"``) or branch id (``"branch"``), taken."""
        raise NotImplementedError

    def put_state(self, info: StateInfo) -> None:
        raise NotImplementedError

    def put_item(self, info: StateInfo, row: BranchRow, ordinal: int, version: int, item_sequence: int,
                 data: bytes) -> None:
        raise NotImplementedError

    def put_head(self, info: StateInfo, row: BranchRow, head: LogHead, version: int | None) -> None:
        """Write the current head (``version`` None) or a versioned copy kept for past views."""
        raise NotImplementedError

    def put_value(self, info: StateInfo, row: BranchRow, version: int, data: bytes) -> None:
        raise NotImplementedError

    def put_branch(self, row: BranchRow, *, created: bool) -> None:
        """Write a branch's row (and, when created, its name; a deleted row frees its name)."""
        raise NotImplementedError

    def put_blob_row(self, sha256: str, data: bytes, media_type: str) -> None:
        """Store a blob unless one with that hash is stored (its bytes are checked already)."""
        raise NotImplementedError

    # -- lookups that see this batch's own changes ------------------------------------------

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def store_sequence(self) -> int:
        """The store's sequence as this batch sees it: a fork's default point, and the bound of an
        explicit one (an engine whose writers commit in parallel settles it first)."""
        return self.sequence

    def state(self, name: str) -> StateInfo:
        info = self.new_states.get(name) or self.engine.known_states.get(name)
        if info is None:
            raise UnknownStateError(f"state {name!r} is not registered; register it before writing")
        return info

    def branch(self, name: str | int) -> BranchRow:
        """The live branch ``name``, or the branch with that id (an incarnation: refused once deleted)."""
        if isinstance(name, int):
            row = self.branches.get(name) or self.engine.known_branches.get(name)
            if row is None or row.deleted:
                what = f"branch {row.name!r} (id {name}) was deleted" if row is not None else f"no branch has id {name}"
                raise BranchNotFoundError(what)
            return row
        # A name deleted and recreated in this batch has a deleted row and a live one: take the live.
        for row in self.branches.values():
            if row.name == name and not row.deleted:
                return row
        branch_id = self.engine.known_branch_ids.get(name)
        if branch_id is not None:
            row = self.branches.get(branch_id) or self.engine.known_branches[branch_id]
            if not row.deleted:
                return row
        raise BranchNotFoundError(f"no branch named {name!r}")

    def _log_head(self, info: StateInfo, row: BranchRow) -> LogHead:
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine.known_heads.get(key)
        return self.read_head(info, row) if head is None else head

    def _set_head(self, info: StateInfo, row: BranchRow, sequence: int, head: LogHead, *, rewrite: bool) -> None:
        key = (info.number, row.id)
        self.heads[key] = head
        if self.defer_heads and not rewrite:
            self._unwritten[key] = (info, row)  # written once by flush_heads, however many appends move it
            return
        self._unwritten.pop(key, None)
        self.put_head(info, row, head, None)
        if rewrite:  # an edit or removal keeps a version, for views of the past
            self.put_head(info, row, head, sequence)

    def flush_heads(self) -> None:
        """Write the current heads the unnested appends left unwritten (in the batch's own transaction)."""
        if self._unwritten:
            unwritten, self._unwritten = self._unwritten, {}
            for key, (info, row) in unwritten.items():
                self.put_head(info, row, self.heads[key], None)

    def _log_target(self, state: str, branch: str | int) -> tuple[StateInfo, BranchRow, LogHead]:
        info = log_state(self.state(state))
        row = self.branch(branch)
        return info, row, self._log_head(info, row)

    def _locate(self, info: StateInfo, row: BranchRow, item_sequence: int, head: LogHead) -> tuple[int, int, LogHead]:
        located = self.locate(info, row, item_sequence, head)
        if located is None:
            raise MessageNotFoundError(f"no item {item_sequence} in {info.name!r} on branch {row.name!r}")
        return located

    # -- operations -------------------------------------------------------------------------

    def register_state(self, name: str, kind: StateKind) -> StateInfo:
        validate_state_name(name)
        if kind not in ("log", "value"):
            raise StateKindError(f"state kind must be 'log' or 'value', not {kind!r}")
        existing = self.new_states.get(name) or self.engine.known_states.get(name)
        if existing is not None:
            if existing.kind != kind:
                raise StateKindError(f"state {name!r} is registered as {existing.kind!r}, not {kind!r}")
            return existing
        info = StateInfo(self.next_number("state"), name, kind)
        self.put_state(info)
        self.new_states[name] = info
        return info

    def append(
        self, state: str, branch: str | int, data: bytes, blobs: Sequence[tuple[str, bytes, str]] = (), attachment: Any = None,
        flagged: bool = False, followed: int | None = None,
    ) -> ItemAppended:
        # Everything it can be refused for is checked before the first write (apply.run_commands).
        info = self.new_states.get(state) or self.engine.known_states.get(state)
        if info is None or info.kind != "log":
            info = log_state(self.state(state))  # raises what refuses it
        row = self.branches.get(branch) or self.engine.known_branches.get(branch) if type(branch) is int else None
        if row is None or row.deleted:
            row = self.branch(branch)  # by name, or raises what refuses it
        if followed is not None and row.switches > followed and row.switched_to:
            raise BranchSwitched(f"branch {row.name!r} records a switch its manager hasn't followed")
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine.known_heads.get(key) or self.read_head(info, row)
        checked = [_checked_blob(*blob) for blob in blobs] if blobs else ()
        self.wrote = True
        for blob in checked:
            self.put_blob_row(*blob)
        sequence = self._next_sequence()
        ordinal = head.next_ordinal
        self.put_item(info, row, ordinal, sequence, sequence, data)
        self._moved(info, row, key, LogHead(head.length + 1, ordinal + 1, head.removed, sequence,
                                            head.rewrite_revision, True if flagged else head.flagged))
        index: tuple[IndexEntry, ...] | None = getattr(attachment, "index", None)
        if index is not None:
            if not ordinal:  # the log's first item on this lineage: its index covers it from the start
                self._mark(state, row, sequence, True)
            if index and self._marker(state) is not None:  # else the log was never indexed: no reader looks
                for entry in index:
                    self._file(state, row, sequence, ordinal, entry)
        elif self._marker(state) is not None:
            self._mark(state, row, sequence, False)  # written below the indexing layer: no longer covered
        operation = ItemAppended(state, row.id, sequence, ordinal, data, attachment, head.revision)
        self.operations.append(operation)
        return operation

    def edit(
        self, state: str, branch: str | int, item_sequence: int, data: bytes,
        blobs: Sequence[tuple[str, bytes, str]] = (), attachment: Any = None, flagged: bool = False,
        floor_state: str | None = None, expect_version: int | None = None,
    ) -> ItemEdited:
        info, row, head = self._log_target(state, branch)
        located = self._locate(info, row, item_sequence, head)
        _, ordinal, head = located
        if expect_version is not None and (version := self.item_version(info, row, located)) != expect_version:
            raise ValueConflictError(
                state, version, f"item {item_sequence} of {state!r} was edited (at sequence {version}) since this edit was judged against "
                f"its version {expect_version}"
            )
        if floor_state is not None:  # a narrowing: compression must not have read the item yet (D2)
            floor, written = self.read_value(self.state(floor_state), row)
            floor = 0 if not written else floor  # never raised: nothing read yet
            if not isinstance(floor, int) or isinstance(floor, bool) or floor >= item_sequence:
                raise NarrowingRefusedError(
                    f"refused: the edit would hide a block of message {item_sequence}, and compression may already "
                    f"have read it (narrowing floor {floor!r}, recorded since the edit was checked)"
                )
        for blob in blobs:
            self.put_blob_row(*_checked_blob(*blob))
        sequence = self._next_sequence()
        self.put_item(info, row, ordinal, sequence, item_sequence, data)
        new_head = attrs.evolve(head, revision=sequence, rewrite_revision=sequence,
                                flagged=True if flagged else head.flagged)
        self._set_head(info, row, sequence, new_head, rewrite=True)
        if self._marker(state) is not None:
            index: tuple[IndexEntry, ...] | None = getattr(attachment, "index", None)
            # An edit keeps its item's keys (the layer above keeps a message's metadata): its entries
            # are rewritten in place. One it can't find there leaves the index uncovered.
            if index is None or not all([self._refile(state, row, sequence, item_sequence, ordinal, entry)
                                         for entry in index]):
                self._mark(state, row, sequence, False)
        operation = ItemEdited(state, row.id, sequence, item_sequence, data, attachment, head.revision)
        self.operations.append(operation)
        return operation

    def remove(self, state: str, branch: str | int, from_sequence: int, to_sequence: int) -> ItemsRemoved:
        """Remove the items appended at ``from_sequence`` through ``to_sequence``, inclusive."""
        info, row, head = self._log_target(state, branch)
        if from_sequence > to_sequence:
            raise MalformedContentError("from_id", f"{from_sequence} is after to_id {to_sequence}")
        first_index, first, head = self._locate(info, row, from_sequence, head)
        last_index, last, head = self._locate(info, row, to_sequence, head)
        count = last_index - first_index + 1
        sequence = self._next_sequence()
        new_head = attrs.evolve(
            head, length=head.length - count, removed=_merged(head.removed, first, last), revision=sequence,
            rewrite_revision=sequence,
        )
        self._set_head(info, row, sequence, new_head, rewrite=True)
        if self._marker(state) is not None:
            self._unfile(state, row, sequence, from_sequence, to_sequence)
        operation = ItemsRemoved(state, row.id, sequence, from_sequence, to_sequence, count, head.revision)
        self.operations.append(operation)
        return operation

    # -- index logs (records.index_state): written at the sequence of the item write they follow ----

    def _moved(self, info: StateInfo, row: BranchRow, key: tuple[int, int], head: LogHead) -> None:
        """An append moved a log's head to ``head``."""
        self.heads[key] = head
        if self.defer_heads:
            self._unwritten[key] = (info, row)  # written once by flush_heads, however many appends move it
        else:
            self._unwritten.pop(key, None)
            self.put_head(info, row, head, None)

    def _marker(self, log: str) -> StateInfo | None:
        """The value saying whether ``log``'s index covers it, if it was ever indexed."""
        name = index_marker(log)
        return self.new_states.get(name) or self.engine.known_states.get(name)

    def _mark(self, log: str, row: BranchRow, sequence: int, covered: bool) -> None:
        info = self._marker(log) or self.register_state(index_marker(log), "value")
        self.put_value(value_state(info), row, sequence, b"true" if covered else b"false")

    def _file(self, log: str, row: BranchRow, sequence: int, item_ordinal: int, entry: IndexEntry) -> None:
        """Append the entry of the item appended at ``sequence`` (``item_ordinal``) to its index log."""
        name = index_state(log, entry.key)
        info = log_state(self.new_states.get(name) or self.engine.known_states.get(name)
                         or self.register_state(name, "log"))
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine.known_heads.get(key) or self.read_head(info, row)
        ordinal = head.next_ordinal
        self.put_item(info, row, ordinal, sequence, sequence, index_item(item_ordinal, entry.data))
        self._moved(info, row, key, LogHead(head.length + 1, ordinal + 1, head.removed, sequence,
                                            head.rewrite_revision, head.flagged))

    def _refile(
        self, log: str, row: BranchRow, sequence: int, item_sequence: int, item_ordinal: int, entry: IndexEntry,
    ) -> bool:
        """Rewrite the entry of item ``item_sequence`` in its index log; False if it isn't there."""
        name = index_state(log, entry.key)
        info = self.new_states.get(name) or self.engine.known_states.get(name)
        if info is None:
            return False
        located = self.locate(info, row, item_sequence, self._log_head(info, row))
        if located is None:
            return False
        _, ordinal, head = located
        self.put_item(info, row, ordinal, sequence, item_sequence, index_item(item_ordinal, entry.data))
        self._set_head(info, row, sequence, attrs.evolve(head, revision=sequence, rewrite_revision=sequence),
                       rewrite=True)
        return True

    def _unfile(self, log: str, row: BranchRow, sequence: int, first: int, last: int) -> None:
        """Remove the entries of the items appended at ``first`` through ``last`` from every index log."""
        states = {**self.engine.known_states, **self.new_states}
        for name, info in states.items():
            if info.kind != "log" or index_key(log, name) is None:
                continue
            head = self._log_head(info, row)
            if not head.length or not self._overlaps(info, row, head, first, last):
                continue
            low, high = self._bound(info, row, head, first), self._bound(info, row, head, last + 1)
            if low == high:
                continue
            start, stop = head.index_to_ordinal(low), head.index_to_ordinal(high - 1)
            self._set_head(info, row, sequence, attrs.evolve(
                head, length=head.length - (high - low), removed=_merged(head.removed, start, stop),
                revision=sequence, rewrite_revision=sequence,
            ), rewrite=True)

    def _overlaps(self, info: StateInfo, row: BranchRow, head: LogHead, first: int, last: int) -> bool:
        """Whether the log's items may include ones appended at ``first`` through ``last`` (two reads:
        most index logs end before a removal of the newest messages, or begin after an old one's)."""
        oldest, = self.read_range(info, row, head, 0, 1)
        newest, = self.read_range(info, row, head, head.length - 1, head.length)
        return oldest.sequence <= last and newest.sequence >= first

    def _bound(self, info: StateInfo, row: BranchRow, head: LogHead, sequence: int) -> int:
        """How many of the log's visible items were appended before ``sequence`` (they are in sequence order)."""
        low, high = 0, head.length
        while low < high:
            middle = (low + high) // 2
            if self.read_range(info, row, head, middle, middle + 1)[0].sequence < sequence:
                low = middle + 1
            else:
                high = middle
        return low

    def set_value(self, state: str, branch: str | int, value: Any, expect: Any = ANY, rising: bool = False) -> ValueSet:
        """Set a value state. ``expect`` makes it conditional (``ValueConflictError`` unless the
        stored value equals it; None is "never set"); ``rising`` keeps the stored value when it is
        higher (a floor that other processes raise too). Both are decided in this transaction."""
        info = value_state(self.state(state))
        row = self.branch(branch)
        data = encode_json(value, path=f"{state}")
        if expect is not ANY or rising:
            stored, _ = self.read_value(info, row)
            if expect is not ANY and stored != expect:
                raise ValueConflictError(state, stored)
            if rising and isinstance(stored, int) and not isinstance(stored, bool) and stored >= value:
                value = stored
                data = encode_json(value, path=f"{state}")
        sequence = self._next_sequence()
        self.put_value(info, row, sequence, data)
        operation = ValueSet(state, row.id, sequence, value)
        self.operations.append(operation)
        return operation

    def create_branch(self, name: str, from_branch: str | int, at_sequence: int | None) -> BranchRow:
        try:
            validate_branch_name(name)
        except ValueError as exc:
            raise MalformedContentError("name", str(exc)) from None
        # The arguments' own faults first, whatever the store holds; then what the store says.
        latest = self.store_sequence()
        fork = latest if at_sequence is None else at_sequence
        if not isinstance(fork, int) or isinstance(fork, bool) or not 0 <= fork <= latest:
            raise MalformedContentError(
                "at_sequence", f"must be an integer in [0, {latest}] (the store's sequence), not {checks.shown(fork)}"
            )
        try:
            self.branch(name)
        except BranchNotFoundError:
            pass
        else:
            raise BranchExistsError(f"a branch named {name!r} already exists")
        parent = self.branch(from_branch)
        lineage = ((parent.id, fork),) + tuple((ancestor, min(fork, bound)) for ancestor, bound in parent.lineage)
        row = BranchRow(self.next_number("branch"), name, parent.id, fork, lineage, int(time.time() * 1000))
        self.put_branch(row, created=True)
        self.branches[row.id] = row
        self.operations.append(BranchCreated(row))
        return row

    def delete_branch(self, name: str) -> BranchRow:
        if name == MAIN_BRANCH:
            raise MalformedContentError("name", "the main branch can't be deleted")
        row = attrs.evolve(self.branch(name), deleted=True)
        # Rows stay: descendants' lineages still read them. Only the name is freed.
        self.put_branch(row, created=False)
        self.branches[row.id] = row
        self.operations.append(BranchDeleted(row))
        return row

    def record_switch(self, from_branch: int, to_branch: int) -> BranchRow:
        """Record on ``from_branch``'s row that its managers moved to ``to_branch`` (R4): the count of
        its switches rises, and the target's own count now is kept, so a manager that follows
        there follows only the target's later switches. Both must be live (``BranchNotFoundError``)."""
        source, target = self.branch(from_branch), self.branch(to_branch)
        row = attrs.evolve(source, switches=source.switches + 1, switched_to=(target.id, target.switches))
        self.put_branch(row, created=False)
        self.branches[row.id] = row
        return row

    def put_blob(self, sha256: str, data: bytes, media_type: str) -> None:
        self.put_blob_row(*_checked_blob(sha256, data, media_type))


def _merged(removed: tuple[tuple[int, int], ...], first: int, last: int) -> tuple[tuple[int, int], ...]:
    """A head's removed intervals with ordinals ``first`` through ``last`` added, sorted and merged."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(removed + ((first, last + 1),)):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return tuple(merged)


def _checked_blob(sha256: str, data: bytes, media_type: str) -> tuple[str, bytes, str]:
    """A blob, refused (MalformedContentError) if the bytes don't hash to ``sha256``."""
    try:
        digest = bytes.fromhex(sha256)
    except (TypeError, ValueError):
        raise MalformedContentError("blob", f"{sha256!r} is not a SHA-256 hex digest") from None
    if hashlib.sha256(data).digest() != digest:
        raise MalformedContentError("blob", f"bytes don't hash to {sha256}")
    return sha256, data, media_type
