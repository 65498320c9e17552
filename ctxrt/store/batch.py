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
from .protocol import ANY
from .records import (
    MAIN_BRANCH,
    BranchCreated,
    BranchDeleted,
    BranchRow,
    ItemAppended,
    ItemEdited,
    ItemsRemoved,
    LogHead,
    Operation,
    StateInfo,
    StateKind,
    ValueSet,
    encode_json,
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
        flagged: bool = False,
    ) -> ItemAppended:
        # Everything it can be refused for is checked before the first write (apply.run_commands).
        info = self.new_states.get(state) or self.engine.known_states.get(state)
        if info is None or info.kind != "log":
            info = log_state(self.state(state))  # raises what refuses it
        row = self.branches.get(branch) or self.engine.known_branches.get(branch) if type(branch) is int else None
        if row is None or row.deleted:
            row = self.branch(branch)  # by name, or raises what refuses it
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine.known_heads.get(key) or self.read_head(info, row)
        checked = [_checked_blob(*blob) for blob in blobs] if blobs else ()
        sequence = self.sequence + 1
        self.wrote = True
        for blob in checked:
            self.put_blob_row(*blob)
        self.sequence = sequence
        ordinal = head.next_ordinal
        self.put_item(info, row, ordinal, sequence, sequence, data)
        new_head = LogHead(head.length + 1, ordinal + 1, head.removed, sequence, head.rewrite_revision,
                           True if flagged else head.flagged)
        self.heads[key] = new_head
        if self.defer_heads:
            self._unwritten[key] = (info, row)  # written once by flush_heads, however many appends move it
        else:
            self._unwritten.pop(key, None)
            self.put_head(info, row, new_head, None)
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
        intervals = sorted(head.removed + ((first, last + 1),))
        merged: list[tuple[int, int]] = []
        for start, stop in intervals:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        new_head = attrs.evolve(
            head, length=head.length - count, removed=tuple(merged), revision=sequence, rewrite_revision=sequence
        )
        self._set_head(info, row, sequence, new_head, rewrite=True)
        operation = ItemsRemoved(state, row.id, sequence, from_sequence, to_sequence, count, head.revision)
        self.operations.append(operation)
        return operation

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
        fork = self.sequence if at_sequence is None else at_sequence
        if not isinstance(fork, int) or isinstance(fork, bool) or not 0 <= fork <= self.sequence:
            raise MalformedContentError(
                "at_sequence", f"must be an integer in [0, {self.sequence}] (the store's sequence), not {checks.shown(fork)}"
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


def _checked_blob(sha256: str, data: bytes, media_type: str) -> tuple[str, bytes, str]:
    """A blob, refused (MalformedContentError) if the bytes don't hash to ``sha256``."""
    try:
        digest = bytes.fromhex(sha256)
    except (TypeError, ValueError):
        raise MalformedContentError("blob", f"{sha256!r} is not a SHA-256 hex digest") from None
    if hashlib.sha256(data).digest() != digest:
        raise MalformedContentError("blob", f"bytes don't hash to {sha256}")
    return sha256, data, media_type
