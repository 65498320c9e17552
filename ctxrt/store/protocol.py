"""Store commands (frozen attrs, one per operation) and the public branch record.

Commands are imperative, each an ``Ask`` of what it is answered with; ``StoreRef.ask(command)`` returns the operation the engine committed
(``ItemAppended``, ``ValueSet``...) or raises the error that refused it. A command's ``branch``
is a branch's name or its id; an id names one incarnation, refused once that branch is deleted
(a later branch of the same name has another id).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..asks import Ask
from ..errors import CtxrtError
from .interface import StoreEngine
from .records import BranchRow, ItemAppended, ItemEdited, ItemsRemoved, StateInfo, StateKind, ValueSet

Blob = tuple[str, bytes, str]  # (sha-256 hex, bytes, media type)
ANY = object()  # SetValue's ``expect`` when it expects nothing (an unconditional write)


@attrs.frozen(kw_only=True)
class RegisterState(Ask[StateInfo]):
    name: str
    kind: StateKind


@attrs.frozen(kw_only=True)
class AppendItem(Ask[ItemAppended]):
    state: str
    branch: str | int
    data: bytes
    blobs: tuple[Blob, ...] = ()
    attachment: Any = attrs.field(default=None, eq=False)
    flagged: bool = False  # the slot layer flags an item that holds an audience block (LogHead.flagged)
    # The count of the branch's recorded switches its sender has followed (R4): refused
    # (``BranchSwitched``) in the write transaction if a later one is recorded. None: no check.
    followed: int | None = None


class BranchSwitched(CtxrtError):
    """An append refused: its branch records a switch its sender hasn't followed (R4). The manager
    follows the switch and appends again; it never reaches the host."""


@attrs.frozen(kw_only=True)
class EditItem(Ask[ItemEdited]):
    state: str
    branch: str | int
    item_sequence: int
    data: bytes
    blobs: tuple[Blob, ...] = ()
    attachment: Any = attrs.field(default=None, eq=False)
    flagged: bool = False  # the slot layer flags an item that holds an audience block (LogHead.flagged)
    # A narrowing names its namespace's floor state: refused (NarrowingRefusedError) in the write
    # transaction if that floor has reached the item, whichever process raised it.
    floor_state: str | None = None
    # The version (the sequence of the write) the edit was judged against: refused
    # (ValueConflictError) if another edit landed since, whichever process made it.
    expect_version: int | None = None


@attrs.frozen(kw_only=True)
class RemoveItems(Ask[ItemsRemoved]):
    state: str
    branch: str | int
    from_sequence: int
    to_sequence: int


@attrs.frozen(kw_only=True)
class SetValue(Ask[ValueSet]):
    """Set a value state; ``expect`` makes it conditional (``ValueConflictError`` unless the stored
    value equals it, None meaning never set), ``rising`` keeps a higher stored integer. Both are
    decided in the write transaction, so they hold across processes sharing a store."""

    state: str
    branch: str | int
    value: Any
    expect: Any = attrs.field(default=ANY, repr=False)
    rising: bool = False


@attrs.frozen(kw_only=True)
class CreateBranch(Ask[BranchRow]):
    name: str
    from_branch: str | int = "main"
    at_sequence: int | None = None


@attrs.frozen(kw_only=True)
class DeleteBranch(Ask[BranchRow]):
    name: str


@attrs.frozen(kw_only=True)
class RecordSwitch(Ask[BranchRow]):
    """Record that the managers on branch ``from_branch`` moved to ``to_branch`` (both ids), for
    other runtimes' managers to follow (R4); answered with ``from_branch``'s new row."""

    from_branch: int
    to_branch: int


@attrs.frozen(kw_only=True)
class Atomically(Ask[tuple[Any, ...]]):
    """Several commands that commit together or not at all; the result is a tuple of theirs."""

    commands: tuple[Any, ...]


def append_after(writes: tuple[Any, ...], append: AppendItem) -> AppendItem | Atomically:
    """``append`` with ``writes`` committed before it in one batch (alone without any)."""
    return Atomically(commands=(*writes, append)) if writes else append


def append_result(result: ItemAppended | tuple[Any, ...]) -> ItemAppended:
    """The append's ``ItemAppended`` in what ``append_after``'s command was answered with."""
    operation: ItemAppended = result[-1] if isinstance(result, tuple) else result
    return operation


StoreCommand = (RegisterState | AppendItem | EditItem | RemoveItems | SetValue | CreateBranch | DeleteBranch
                | RecordSwitch | Atomically)


@attrs.frozen
class BranchInfo:
    """A branch as the public API shows it."""

    name: str
    id: int
    parent: str | None
    fork_sequence: int | None
    head_sequence: int


def branch_info(row: BranchRow, parent_name: str | None, head_sequence: int) -> BranchInfo:
    return BranchInfo(row.name, row.id, parent_name, row.fork_sequence, head_sequence)


def describe_branches(engine: StoreEngine) -> list[BranchInfo]:
    """Every live branch, oldest first, as the public API shows them."""
    infos = []
    for row in engine.list_branches():
        parent = None if row.parent is None else engine.branch_by_id(row.parent).name
        infos.append(branch_info(row, parent, engine.head_sequence(row)))
    return infos
