"""The store's records, shared by every engine: states, branches, log heads, items, the
committed operations, and the checks of names. No backend here.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any, Literal

import attrs

from ..errors import MalformedContentError
from . import keys

MAIN_BRANCH = "main"
MAX_NAME_BYTES = 200

StateKind = Literal["log", "value"]

_LOG_HEAD = struct.Struct(">QQQQI")  # length, next ordinal, revision, rewrite revision, #removed
_INTERVAL = struct.Struct(">QQ")
# A head's optional last byte (heads written before it existed have none: their flag is unknown).
_UNFLAGGED, _FLAGGED = b"\x01", b"\x02"


@attrs.frozen
class StateInfo:
    number: int
    name: str
    kind: StateKind


@attrs.frozen
class BranchRow:
    id: int
    name: str
    parent: int | None
    fork_sequence: int | None
    # Ancestor levels, nearest first: (branch id, the last sequence of it this branch sees).
    lineage: tuple[tuple[int, int], ...]
    created_ms: int
    deleted: bool = False
    # The switches made from this branch (Runtime.switch_branch, R4), and the last one's target with
    # the target's own count then: another runtime's manager follows a count it hasn't seen.
    switches: int = 0
    switched_to: tuple[int, int] | None = None

    def levels(self, at: int | None = None) -> list[tuple[int, int]]:
        """The (branch, limit) levels a view of this branch at ``at`` reads, leaf first."""
        # An ``at`` past every sequence (a host may pass any integer to get_message_at) reads as now.
        limit = keys.MAX_U64 if at is None else min(at, keys.MAX_U64)
        return [(self.id, limit)] + [(branch, min(limit, bound)) for branch, bound in self.lineage]

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "parent": self.parent,
            "fork": self.fork_sequence,
            "lineage": [list(level) for level in self.lineage],
            "created_ms": self.created_ms,
            "deleted": self.deleted,
        }
        if self.switched_to is not None:  # absent otherwise: a row never switched reads as before
            fields["switches"], fields["switched_to"] = self.switches, list(self.switched_to)
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BranchRow:
        raw = json.loads(data)
        return cls(
            id=raw["id"],
            name=raw["name"],
            parent=raw["parent"],
            fork_sequence=raw["fork"],
            lineage=tuple((level[0], level[1]) for level in raw["lineage"]),
            created_ms=raw["created_ms"],
            deleted=raw["deleted"],
            switches=raw.get("switches", 0),
            switched_to=None if raw.get("switched_to") is None else (raw["switched_to"][0], raw["switched_to"][1]),
        )


@attrs.frozen
class LogHead:
    """The head of an append-log state on one branch, as of one sequence."""

    length: int = 0
    next_ordinal: int = 0
    # Sorted, disjoint, merged [start, stop) ordinal intervals removed on this lineage.
    removed: tuple[tuple[int, int], ...] = ()
    revision: int = 0  # sequence of the last write to the state on this branch
    rewrite_revision: int = 0  # sequence of the last write that was not an append
    # Whether an item written with ``flagged=True`` was ever part of this log on this lineage (so a
    # reader must look at every item to know which hold one); None for a head an older ctxrt wrote,
    # which recorded no flag: unknown, so a reader assumes some may.
    flagged: bool | None = False

    def encode(self) -> bytes:
        if not self.removed:  # the common case: one pack
            packed = _LOG_HEAD.pack(self.length, self.next_ordinal, self.revision, self.rewrite_revision, 0)
            return packed if self.flagged is None else packed + (_FLAGGED if self.flagged else _UNFLAGGED)
        parts = [_LOG_HEAD.pack(self.length, self.next_ordinal, self.revision, self.rewrite_revision, len(self.removed))]
        parts.extend(_INTERVAL.pack(start, stop) for start, stop in self.removed)
        if self.flagged is not None:
            parts.append(_FLAGGED if self.flagged else _UNFLAGGED)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> LogHead:
        length, next_ordinal, revision, rewrite, count = _LOG_HEAD.unpack_from(data)
        end = _LOG_HEAD.size + count * _INTERVAL.size
        removed = tuple(_INTERVAL.unpack_from(data, _LOG_HEAD.size + i * _INTERVAL.size) for i in range(count))
        marker = bytes(data[end : end + 1])
        if marker not in (b"", _FLAGGED, _UNFLAGGED):
            raise struct.error(f"unknown head marker {marker!r}")
        flagged = None if not marker else marker == _FLAGGED
        return cls(length, next_ordinal, removed, revision, rewrite, flagged)

    def index_to_ordinal(self, index: int) -> int:
        ordinal = index
        for start, stop in self.removed:
            if start <= ordinal:
                ordinal += stop - start
            else:
                break
        return ordinal

    def ordinal_to_index(self, ordinal: int) -> int | None:
        """The index of a visible ordinal, or None if it was removed."""
        below = 0
        for start, stop in self.removed:
            if ordinal < start:
                break
            if ordinal < stop:
                return None
            below += stop - start
        return ordinal - below

    def visible_ordinals(self, first: int, last: int) -> Iterator[int]:
        """Visible ordinals in [first, last], ascending."""
        ordinal = first
        for start, stop in self.removed:
            if stop <= ordinal:
                continue
            if start > last:
                break
            yield from range(ordinal, min(start, last + 1))
            ordinal = max(ordinal, stop)
        yield from range(ordinal, last + 1)


@attrs.frozen
class IndexEntry:
    """What a log item files in one of its log's index logs (``index_state``): the index's key and
    the entry's bytes, both the writing layer's own (the store reads neither). An item's entries
    ride its append or edit as its attachment's ``index`` (a tuple of them; absent: not indexed)."""

    key: str
    data: bytes


# A log's index logs: ``<log>#index:<key>``, one per key, each holding the entries its log's items
# filed under that key (``index_item``), oldest first, each item under its own append's sequence (an index entry is
# written at the sequence of the item write that changes it, so a view of the past sees both as
# one). The value ``<log>#index`` says, per branch, whether the index covers every item of the log
# (True: indexed from the log's first item; False: an item was written without its entries).
_INDEX = "#index"


def index_item(ordinal: int, data: bytes) -> bytes:
    """An index log's item: the ordinal of the item it indexes in its log (which never changes: a
    reader finds the item without a search), then the entry's bytes."""
    return keys.encode_u64(ordinal) + data


def split_index_item(item: bytes) -> tuple[int, bytes]:
    """(ordinal of the indexed item, entry bytes) of an index log's item."""
    return keys.decode_u64(item[:8]), item[8:]


def index_marker(log: str) -> str:
    return log + _INDEX


def index_state(log: str, key: str) -> str:
    return f"{log}{_INDEX}:{key}"


def index_key(log: str, state: str) -> str | None:
    """The key of ``log``'s index log named ``state``, or None if it isn't one of its index logs (a
    key holds no ``/``: every namespace state's name does, so none is taken for an index log)."""
    prefix = f"{log}{_INDEX}:"
    if not state.startswith(prefix) or len(state) == len(prefix):
        return None
    key = state[len(prefix):]
    return None if "/" in key else key


@attrs.frozen
class Item:
    """One item of an append-log state as a view sees it."""

    sequence: int  # the sequence of its append (its identity)
    ordinal: int
    version: int  # the sequence of the write that produced this version
    data: bytes


# Committed operations, published to subscribers after the commit (past tense: it happened).


@attrs.frozen
class ItemAppended:
    state: str
    branch: int
    sequence: int
    ordinal: int
    data: bytes
    attachment: Any = None  # the caller's decoded form, so subscribers need not decode
    # The revision of the log's head this write followed (None: not said). A cache at another
    # revision missed a write (another process's, on a shared store) and reloads.
    prior: int | None = None


@attrs.frozen
class ItemEdited:
    state: str
    branch: int
    sequence: int  # the edit's own sequence
    item_sequence: int
    data: bytes
    attachment: Any = None
    prior: int | None = None  # as ItemAppended.prior


@attrs.frozen
class ItemsRemoved:
    state: str
    branch: int
    sequence: int
    from_sequence: int
    to_sequence: int
    count: int
    prior: int | None = None  # as ItemAppended.prior


@attrs.frozen
class ValueSet:
    state: str
    branch: int
    sequence: int
    value: Any


@attrs.frozen
class BranchCreated:
    row: BranchRow


@attrs.frozen
class BranchDeleted:
    row: BranchRow


Operation = ItemAppended | ItemEdited | ItemsRemoved | ValueSet | BranchCreated | BranchDeleted


def encode_json(value: Any, *, path: str = "value") -> bytes:
    """Compact JSON bytes, refusing what JSON can't hold (MalformedContentError naming ``path``)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError as exc:  # a ValueError too: catch it first to say what it is
        raise MalformedContentError(path, f"not valid UTF-8 text: {exc.reason}") from None
    except (TypeError, ValueError) as exc:
        raise MalformedContentError(path, f"not JSON-serialisable: {exc}") from None



def validate_branch_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a branch name must be a non-empty string, not {name!r}")
    if "\x00" in name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ValueError(f"branch name {name!r} holds NUL or is longer than {MAX_NAME_BYTES} bytes")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"branch name {name!r} holds a lone surrogate, which can't be stored") from None
    return name


def validate_state_name(name: object) -> str:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise MalformedContentError("state", f"a state name must be a non-empty string without NUL, not {name!r}")
    if len(name.encode("utf-8", "surrogatepass")) > 400:
        raise MalformedContentError("state", f"state name {name[:40]!r}... is longer than 400 bytes")
    return name
