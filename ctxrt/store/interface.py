"""The engine interface: all that the layers above the store see of an engine.

Two engines implement it: ``engine.Engine`` (LMDB, embedded, one writing process) and
``postgres.PostgresEngine`` (many writing processes). Reads are synchronous and run on the
caller's thread; writes go only through the committer the engine hands the store actor
(``committer``: store/committer.py), which calls ``apply`` (LMDB: ``prepare`` and a commit,
on its writer thread or inline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .records import BranchRow, Item, LogHead, Operation, StateInfo

if TYPE_CHECKING:  # the committers wait on trio; the interface is read by pure cores
    from .committer import Committer


class StoreEngine(Protocol):
    """A store engine: branches, states, the read API, and ``apply`` for the store actor."""

    data_path: str  # where it lives, for messages (a database URL without its password)
    # Other processes write it too: a slot cache checks the head before every read, and the
    # process's own commit events don't tell it everything.
    shared: bool

    @property
    def last_sequence(self) -> int: ...

    def branch(self, name: str) -> BranchRow: ...
    def branch_by_id(self, branch_id: int) -> BranchRow: ...
    def list_branches(self) -> list[BranchRow]: ...
    def branch_deleted(self, branch_id: int) -> bool: ...
    def fresh_branch(self, branch_id: int) -> BranchRow | None: ...
    def head_sequence(self, branch: BranchRow) -> int: ...
    def state(self, name: str) -> StateInfo: ...
    def has_state(self, name: str) -> bool: ...
    def list_states(self) -> list[StateInfo]: ...

    def read_value(self, state: str, branch_id: int, default: Any = None, *, at: int | None = None) -> Any: ...
    def read_log(self, state: str, branch_id: int) -> list[Item]: ...
    def read_head(self, state: str, branch_id: int, at: int | None = None) -> LogHead: ...
    def read_items(
        self, state: str, branch_id: int, *, at: int | None = None, start: int = 0, stop: int | None = None,
    ) -> list[Item]: ...
    def read_tail(self, state: str, branch_id: int, start: int) -> tuple[LogHead, list[Item]]: ...
    def read_item(self, state: str, branch_id: int, sequence: int, *, at: int | None = None) -> Item | None: ...
    def read_items_appended(
        self, state: str, branch_id: int, first: int, last: int, *, at: int | None = None,
    ) -> list[Item]: ...
    def read_blob(self, sha256: str) -> tuple[bytes, str] | None: ...

    def apply(
        self, commands: Sequence[Any], execute: Callable[[Any, Any], Any],
        unnested: Callable[[Any], bool] | None = None,
    ) -> tuple[list[tuple[bool, Any]], list[Operation]]: ...

    def committer(self, execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool]) -> Committer:
        """What the store actor commits its batches through (``execute(batch, command)`` applies one
        command; ``unnested(command)`` marks one that needs no nested transaction): one per actor."""

    def hold(self, branch_id: int, name: str) -> bool:
        """Take this process's lease on ``name`` on a branch (a namespace that keeps its strategy's
        memory); False while another process holds it. Released by ``release``, or lapses when this
        process stops renewing it (it died; PostgreSQL: K12)."""

    def holds(self, branch_id: int, name: str) -> bool:
        """Whether this process still holds a lease ``hold`` took, as the engine counts it (no round
        trip; a write under a lease lost since is refused by the store, K12)."""

    def release(self, branch_id: int, name: str) -> None:
        """Give a lease ``hold`` took back."""

    def sync(self) -> None:
        """Flush what was committed without waiting for the disk (durability="os")."""

    def close(self) -> None:
        """Let go of what the engine holds itself (connections); the store stays as committed."""
