"""An engine's catalog: the branch and state tables as the engine last read them, and the log heads
its writer last committed. Both engines keep one (``Catalog`` is their base): the lookups the
layers above make in it, installing a fresh read of the tables, and taking a committed batch's
rows are the same whatever keeps the rows, so they live here once; reading and decoding the
tables' rows (``reload``) is each engine's own. It stands below ``batch.py``, which reads it.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import BranchNotFoundError, StateKindError, UnknownStateError
from .records import BranchRow, LogHead, StateInfo


class Written(Protocol):
    """What a committed batch changed in the catalog (``Batch`` has it)."""

    new_states: dict[str, StateInfo]
    branches: dict[int, BranchRow]  # rows it created or changed
    heads: dict[tuple[int, int], LogHead]  # log heads it wrote


class Catalog:
    """The branch and state tables, and the writer's current log heads, (state number, branch id) ->
    head. The tables' dicts are replaced, never changed in place: a reader on another thread (a
    PostgreSQL engine's batch runs on a worker) sees the old ones or the new, never half of one."""

    def __init__(self) -> None:
        self.known_branches: dict[int, BranchRow] = {}
        self.known_branch_ids: dict[str, int] = {}
        self.known_states: dict[str, StateInfo] = {}
        self.known_heads: dict[tuple[int, int], LogHead] = {}

    def reload(self) -> None:
        """Read the branch and state tables again (after another process wrote) and ``install`` them."""
        raise NotImplementedError

    def rereads(self) -> bool:
        """Whether a name not found here, and every listing, reads the tables again first (another
        process may have written them since)."""
        raise NotImplementedError

    def install(self, branches: dict[int, BranchRow], states: dict[str, StateInfo]) -> None:
        """The tables as just read; the cached heads are forgotten (another process may have moved them)."""
        self.known_branches = branches
        self.known_branch_ids = {row.name: row.id for row in branches.values() if not row.deleted}
        self.known_states = states
        self.known_heads = {}

    def take_batch(self, batch: Written) -> None:
        """A committed batch's states, branch rows and heads. The heads change in place: only
        batches read them, one at a time."""
        self.known_heads.update(batch.heads)
        if batch.new_states:
            self.known_states = {**self.known_states, **batch.new_states}
        if batch.branches:
            branches, names = dict(self.known_branches), dict(self.known_branch_ids)
            deleted = set()
            for row in batch.branches.values():
                branches[row.id] = row
                if row.deleted:
                    names.pop(row.name, None)
                    deleted.add(row.id)
                else:
                    names[row.name] = row.id
            self.known_branches, self.known_branch_ids = branches, names
            if deleted:  # no batch writes a deleted branch again: a host forking and deleting keeps none
                for key in [key for key in self.known_heads if key[1] in deleted]:
                    del self.known_heads[key]

    # -- lookups ----------------------------------------------------------------------------

    def branch(self, name: str) -> BranchRow:
        branch_id = self.known_branch_ids.get(name)
        if branch_id is None and self.rereads():
            self.reload()  # another process may have made it
            branch_id = self.known_branch_ids.get(name)
        if branch_id is None:
            raise BranchNotFoundError(f"no branch named {name!r}")
        return self.known_branches[branch_id]

    def list_branches(self) -> list[BranchRow]:
        if self.rereads():
            self.reload()
        return sorted((row for row in self.known_branches.values() if not row.deleted), key=lambda row: row.id)

    def state(self, name: str) -> StateInfo:
        info = self.known_states.get(name)
        if info is None and self.rereads():
            self.reload()
            info = self.known_states.get(name)
        if info is None:
            raise UnknownStateError(f"state {name!r} is not registered")
        return info

    def has_state(self, name: str) -> bool:
        if name not in self.known_states and self.rereads():
            self.reload()  # another process may have registered it since
        return name in self.known_states

    def list_states(self) -> list[StateInfo]:
        if self.rereads():
            self.reload()
        return sorted(self.known_states.values(), key=lambda info: info.name)


def log_state(info: StateInfo) -> StateInfo:
    """``info``, refused (``StateKindError``) unless it is an append log."""
    if info.kind != "log":
        raise StateKindError(f"state {info.name!r} holds a value, not an append log")
    return info


def value_state(info: StateInfo) -> StateInfo:
    """``info``, refused (``StateKindError``) unless it holds a value."""
    if info.kind != "value":
        raise StateKindError(f"state {info.name!r} is an append log, not a value")
    return info
