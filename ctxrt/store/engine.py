"""The sync LMDB engine: states, items, values, branches, lineage, blobs. No trio here.

Design (docs/architecture.md, The store): one global sequence allocated in the write transaction;
branches with an immutable lineage ``[(parent, F), (grandparent, min(F, ...)), ...]``; a row
written on branch ``b`` at sequence ``s`` is visible to a view ``(B, T)`` when ``b`` is a level
of B's lineage and ``s`` is within that level's limit. Append-log states keep versioned item
rows keyed ``(state, branch, ordinal, seq)`` and a versioned head per write; value states keep
one versioned row per write. Creating a branch writes one row: nothing is copied.

Reads take a read transaction the caller opens (``engine.reader()``); writes happen only in
``Engine.apply``, one write transaction per batch, each command in a nested transaction so a
refused command leaves the others of its batch intact.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import attrs
import lmdb

from ..errors import (
    BranchExistsError,
    BranchNotFoundError,
    CtxrtError,
    MalformedContentError,
    MessageNotFoundError,
    StateKindError,
    StoreCorruptError,
    StoreFormatError,
    StoreFullError,
    UnknownStateError,
)
from . import files, keys

# 2: log heads may end in the flag byte (LogHead.flagged). A writer moves a format-1 store to 2
# when it opens it (the records are the same otherwise), so an older ctxrt refuses it by its
# format rather than reading a flagged head as damage.
logger = logging.getLogger("ctxrt.store")

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
MAIN_BRANCH = "main"
MAX_NAME_BYTES = 200

StateKind = Literal["log", "value"]
_KIND_BYTES: dict[str, bytes] = {"log": b"L", "value": b"V"}
_BYTES_KIND: dict[bytes, StateKind] = {b"L": "log", b"V": "value"}

# What reading damaged bytes raises: LMDB's own findings, and the decoders' (K7).
_LMDB_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError)
# What the backend itself raises, for callers that report errors by kind (the CLI).
BACKEND_ERRORS: tuple[type[BaseException], ...] = (lmdb.Error,)
_DAMAGE = (*_LMDB_DAMAGE, struct.error, UnicodeDecodeError, json.JSONDecodeError)

_U64_PACK = keys.U64.pack
_ITEM_KEY_PACK = keys.ITEM_KEY.pack
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

    def levels(self, at: int | None = None) -> list[tuple[int, int]]:
        """The (branch, limit) levels a view of this branch at ``at`` reads, leaf first."""
        limit = keys.MAX_U64 if at is None else at
        return [(self.id, limit)] + [(branch, min(limit, bound)) for branch, bound in self.lineage]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "id": self.id,
                "name": self.name,
                "parent": self.parent,
                "fork": self.fork_sequence,
                "lineage": [list(level) for level in self.lineage],
                "created_ms": self.created_ms,
                "deleted": self.deleted,
            },
            separators=(",", ":"),
        ).encode()

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


@attrs.frozen
class ItemEdited:
    state: str
    branch: int
    sequence: int  # the edit's own sequence
    item_sequence: int
    data: bytes
    attachment: Any = None


@attrs.frozen
class ItemsRemoved:
    state: str
    branch: int
    sequence: int
    from_sequence: int
    to_sequence: int
    count: int


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


def _seek_le(cursor: lmdb.Cursor[bytes], key: bytes, prefix: bytes) -> bool:
    """Position ``cursor`` on the last key <= ``key`` that starts with ``prefix``."""
    if cursor.set_range(key):
        if cursor.key() == key:
            return True
        if not cursor.prev():
            return False
    elif not cursor.last():
        return False
    return cursor.key()[: len(prefix)] == prefix


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


class Engine:
    """One LMDB environment's ctxrt data. Reads from any task; writes only through ``apply``.

    A read that meets a record that doesn't decode, or a page LMDB reports as corrupted,
    raises ``StoreCorruptError`` naming the data file and the record (K7).
    """

    def __init__(self, env: lmdb.Environment, *, readonly: bool) -> None:
        self.env = env
        self.readonly = readonly
        self.data_path = os.path.join(env.path(), "data.mdb")
        self._branches: dict[int, BranchRow] = {}
        self._branch_ids: dict[str, int] = {}
        self._states: dict[str, StateInfo] = {}
        # The writer's current log heads, (state number, branch id) -> head; set only by commits.
        self._heads: dict[tuple[int, int], LogHead] = {}
        self.last_sequence = 0
        self.dbs = self._open_tables_read_only() if readonly else self._open_tables_for_writing()
        self._check_format()
        self.reload()

    def become_writer(self, env: lmdb.Environment) -> None:
        """Serve a writer from ``env`` (reopened writable) instead of the read-only environment."""
        self.env = env
        self.readonly = False
        self.dbs = self._open_tables_for_writing()
        self._check_format()
        self.reload()

    def become_reader(self) -> None:
        """The writer left while read-only runtimes stay: re-read the tables at each call again."""
        self.readonly = True
        self._heads = {}

    # -- set-up -----------------------------------------------------------------------------

    def _damaged(self, what: str) -> StoreCorruptError:
        return StoreCorruptError(self.data_path, what)

    def _main_table_names(self) -> list[bytes]:
        """The keys of LMDB's main table, where a ctxrt store keeps only its table names (a few)."""
        try:
            with self.reader() as txn:
                cursor = txn.cursor()
                names = []
                for key in cursor.iternext(values=False):
                    names.append(bytes(key))
                    if len(names) > 4 * len(keys.ALL_DBS):
                        break
                return names
        except _LMDB_DAMAGE as exc:
            raise self._damaged(f"its main table can't be read: {exc}") from None

    def _foreign(self, names: Sequence[bytes]) -> StoreFormatError:
        return StoreFormatError(files.foreign_message(self.env.path(), names))

    def _open_tables_read_only(self) -> dict[bytes, Any]:
        # No txn argument: handles opened in a caller's read txn die with it (py-lmdb 3.0.0
        # resets read txns on exit instead of committing them).
        names = self._main_table_names()
        foreign = [name for name in names if name not in keys.ALL_DBS]
        if foreign:
            raise self._foreign(foreign)
        try:
            return {name: self.env.open_db(name, create=False) for name in keys.ALL_DBS}
        except lmdb.NotFoundError:
            raise StoreFormatError(f"{self.env.path()} is not a ctxrt store (no ctxrt tables)") from None
        except lmdb.IncompatibleError:
            raise self._foreign(names) from None

    def _open_tables_for_writing(self) -> dict[bytes, Any]:
        """Open ctxrt's tables, creating them with the format record in ONE transaction if new.

        Whatever isn't a ctxrt store is refused before anything is written (K7): a foreign
        environment's main table holds names other than ctxrt's.
        """
        names = self._main_table_names()
        foreign = [name for name in names if name not in keys.ALL_DBS]
        if foreign:
            raise self._foreign(foreign)
        if names:
            try:
                dbs = {name: self.env.open_db(name, create=False) for name in names}
            except lmdb.IncompatibleError:
                raise self._foreign(names) from None
            with self.reader() as txn:
                meta = dbs.get(keys.DB_META)
                formatted = meta is not None and txn.get(keys.META_FORMAT, db=meta) is not None
                holds_rows = any(txn.stat(db)["entries"] for db in dbs.values())
            if formatted and len(dbs) == len(keys.ALL_DBS):
                return dbs
            if not formatted and holds_rows:
                raise StoreFormatError(f"{self.env.path()} holds ctxrt's tables but records no format")
            # A first open that stopped after creating some tables (older versions made them one
            # transaction at a time), or a format record with tables missing: finish the set-up.
        with self.env.begin(write=True) as txn:
            dbs = {name: self.env.open_db(name, txn=txn, create=True) for name in keys.ALL_DBS}
            meta = dbs[keys.DB_META]
            if txn.get(keys.META_FORMAT, db=meta) is None:
                txn.put(keys.META_FORMAT, keys.encode_u32(FORMAT_VERSION), db=meta)
                txn.put(keys.META_NEXT_BRANCH, keys.encode_u32(2), db=meta)
                txn.put(keys.META_NEXT_STATE, keys.encode_u32(1), db=meta)
                main = BranchRow(1, MAIN_BRANCH, None, None, (), int(time.time() * 1000))
                txn.put(keys.encode_u32(1), main.to_json(), db=dbs[keys.DB_BRANCHES])
                txn.put(MAIN_BRANCH.encode(), keys.encode_u32(1), db=dbs[keys.DB_BRANCH_NAMES])
        return dbs

    def _check_format(self) -> None:
        try:
            with self.reader() as txn:
                raw = txn.get(keys.META_FORMAT, db=self.dbs[keys.DB_META])
                raw = None if raw is None else bytes(raw)
        except _LMDB_DAMAGE as exc:
            raise self._damaged(f"its meta table can't be read: {exc}") from None
        if raw is None:
            raise StoreFormatError(f"{self.env.path()} is not a ctxrt store (no format record)")
        if len(raw) != 4 or keys.decode_u32(raw) not in READABLE_FORMATS:
            found = keys.decode_u32(raw) if len(raw) == 4 else raw
            raise StoreFormatError(
                f"{self.env.path()} records store format {found!r}; this ctxrt reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))}"
            )
        if keys.decode_u32(raw) != FORMAT_VERSION and not self.readonly:
            with self.env.begin(write=True) as txn:  # an open that can't write fails here, as a first open does
                txn.put(keys.META_FORMAT, keys.encode_u32(FORMAT_VERSION), db=self.dbs[keys.DB_META])
            logger.info("%s: store format %d -> %d", self.env.path(), keys.decode_u32(raw), FORMAT_VERSION)

    def reload(self) -> None:
        """Re-read the branch and state tables and the sequence (after another process wrote)."""
        try:
            with self.reader() as txn:
                branches = {}
                for key, value in txn.cursor(db=self.dbs[keys.DB_BRANCHES]):
                    row = self.decode_branch_row(bytes(key), bytes(value))
                    branches[row.id] = row
                states = {}
                for key, value in txn.cursor(db=self.dbs[keys.DB_STATES]):
                    info = self.decode_state_row(bytes(key), bytes(value))
                    states[info.name] = info
                # The sequence is the newest head any (state, branch) recorded: every write makes one.
                cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
                last_sequence = max(
                    (self._last_head(cursor, info.number, branch) for info in states.values() for branch in branches),
                    default=0,
                )
        except _DAMAGE as exc:
            raise self._damaged(f"its branch, state or head rows can't be read: {exc!r}") from None
        for row in branches.values():
            for level, _ in ((row.parent, None), *row.lineage):
                if level is not None and level not in branches:
                    raise self._damaged(f"branch {row.id} ({row.name!r}) descends from branch {level}, which has no row")
        self.last_sequence = last_sequence
        self._branches = branches
        self._branch_ids = {row.name: row.id for row in branches.values() if not row.deleted}
        self._states = states
        self._heads = {}

    def decode_branch_row(self, key: bytes, value: bytes) -> BranchRow:
        """A row of the branches table; ``StoreCorruptError`` naming it if it doesn't decode."""
        try:
            row = BranchRow.from_json(value)
            ints = (row.id, row.created_ms, *(n for level in row.lineage for n in level))
            if not (
                all(type(n) is int for n in ints) and isinstance(row.name, str) and type(row.deleted) is bool
                and all(n is None or type(n) is int for n in (row.parent, row.fork_sequence))
                and key == keys.encode_u32(row.id)
            ):
                raise ValueError("a field has the wrong type, or the id disagrees with the key")
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise self._damaged(f"the row of branch {key.hex()} doesn't decode ({exc!r})") from None
        return row

    def decode_state_row(self, key: bytes, value: bytes) -> StateInfo:
        """A row of the states table; ``StoreCorruptError`` naming it if it doesn't decode."""
        try:
            name = key.decode()
            kind = _BYTES_KIND.get(value[4:5])
            if len(value) != 5 or kind is None:
                raise ValueError(f"{len(value)} bytes, kind byte {value[4:5]!r}")
        except ValueError as exc:
            raise self._damaged(f"the row of state {key!r} doesn't decode ({exc!r})") from None
        return StateInfo(keys.decode_u32(value[:4]), name, kind)

    # -- reads ------------------------------------------------------------------------------

    def reader(self) -> lmdb.Transaction[bytes]:
        """A read transaction; use it as a context manager and never across an ``await``.

        A read-only environment whose map another process's writer has grown past this one's
        map size adopts the new size and begins again (LMDB reports ``MDB_MAP_RESIZED``).
        """
        try:
            return self.env.begin()
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)  # 0 adopts the size the data file's meta page records
            return self.env.begin()

    def branch(self, name: str) -> BranchRow:
        branch_id = self._branch_ids.get(name)
        if branch_id is None and self.readonly:
            self.reload()
            branch_id = self._branch_ids.get(name)
        if branch_id is None:
            raise BranchNotFoundError(f"no branch named {name!r}")
        return self._branches[branch_id]

    def branch_by_id(self, branch_id: int) -> BranchRow:
        return self._branches[branch_id]

    def list_branches(self) -> list[BranchRow]:
        if self.readonly:
            self.reload()
        return sorted((row for row in self._branches.values() if not row.deleted), key=lambda row: row.id)

    def state(self, name: str) -> StateInfo:
        info = self._states.get(name)
        if info is None and self.readonly:
            self.reload()
            info = self._states.get(name)
        if info is None:
            raise UnknownStateError(f"state {name!r} is not registered")
        return info

    def has_state(self, name: str) -> bool:
        if name not in self._states and self.readonly:
            self.reload()  # another process may have registered it since
        return name in self._states

    def list_states(self) -> list[StateInfo]:
        if self.readonly:
            self.reload()
        return sorted(self._states.values(), key=lambda info: info.name)

    def _log_state(self, name: str) -> StateInfo:
        info = self.state(name)
        if info.kind != "log":
            raise StateKindError(f"state {name!r} holds a value, not an append log")
        return info

    def _log_head_at(self, txn: lmdb.Transaction[bytes], state: int, levels: Sequence[tuple[int, int]]) -> LogHead:
        """A log state's head as a view (its levels and limits) sees it.

        Each level keeps its current head in one row (rewritten by every write: it sits right
        after the newest item, so an append dirties one leaf page) and a versioned row per
        rewrite (edit, removal). A past view takes the last rewrite at or before its limit (or
        the head it inherited) and counts the ordinals appended after it by then.
        """
        return self._level_head(txn.cursor(db=self.dbs[keys.DB_ITEMS]), state, levels, 0)

    def _level_head(self, cursor: lmdb.Cursor[bytes], state: int, levels: Sequence[tuple[int, int]], i: int) -> LogHead:
        if i == len(levels):
            return LogHead()
        branch, limit = levels[i]
        if not cursor.set_key(keys.head_key(state, branch, keys.MAX_U64)):
            return self._level_head(cursor, state, levels, i + 1)  # nothing written here: inherited
        current = LogHead.decode(cursor.value())
        if current.revision <= limit:
            return current
        prefix = keys.head_prefix(state, branch)
        if _seek_le(cursor, keys.head_key(state, branch, limit), prefix):
            base = LogHead.decode(cursor.value())
        else:
            base = self._level_head(cursor, state, levels, i + 1)
        # Ordinals [base.next_ordinal, current.next_ordinal) were appended on this level, in sequence
        # order: the ones whose first version is within the limit existed then.
        low, high = base.next_ordinal, current.next_ordinal
        while low < high:
            middle = (low + high) // 2
            if self._first_version(cursor, state, branch, middle) <= limit:
                low = middle + 1
            else:
                high = middle
        appended = low - base.next_ordinal
        if not appended:
            return base
        last = self._first_version(cursor, state, branch, low - 1)  # the newest append within the limit
        # The flag only ever rises (a removal leaves it), so the current one covers any past view.
        return LogHead(base.length + appended, low, base.removed, max(base.revision, last), base.rewrite_revision,
                       current.flagged)

    @staticmethod
    def _first_version(cursor: lmdb.Cursor[bytes], state: int, branch: int, ordinal: int) -> int:
        """The sequence of an ordinal's first version on ``branch``: when it was appended there."""
        cursor.set_range(keys.item_key(state, branch, ordinal, 0))
        return keys.decode_item_key(cursor.key())[3]

    def _find_head_with_sequence(
        self, txn: lmdb.Transaction[bytes], state: int, levels: Sequence[tuple[int, int]]
    ) -> tuple[bytes, int] | None:
        cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
        for branch, limit in levels:
            if _seek_le(cursor, keys.head_key(state, branch, limit), keys.head_prefix(state, branch)):
                return cursor.value(), keys.decode_head_key(cursor.key())[2]
        return None

    @staticmethod
    def _last_head(cursor: lmdb.Cursor[bytes], state: int, branch: int) -> int:
        """The sequence of the newest write (state, branch) made itself, or 0."""
        if _seek_le(cursor, keys.head_key(state, branch, keys.MAX_U64), keys.head_prefix(state, branch)):
            sequence = keys.decode_head_key(cursor.key())[2]
            # A log state's current-head row is keyed past every sequence; its revision says when.
            return LogHead.decode(cursor.value()).revision if sequence == keys.MAX_U64 else sequence
        return 0

    def head_sequence(self, branch: BranchRow) -> int:
        """The sequence of the branch's newest write (its fork point if it wrote nothing)."""
        try:
            with self.reader() as txn:
                cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
                own = max((self._last_head(cursor, info.number, branch.id) for info in self._states.values()), default=0)
        except _DAMAGE as exc:
            raise self._unreadable(exc, "the heads", branch) from None
        return max(own, branch.fork_sequence or 0)

    def _unreadable(self, exc: BaseException, what: str, branch: BranchRow) -> StoreCorruptError:
        return self._damaged(f"{what} on branch {branch.name!r} can't be read: {exc!r}")

    def log_head(self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, at: int | None = None) -> LogHead:
        info = self._log_state(state)
        if at is None and not self.readonly:
            cached = self._heads.get((info.number, branch.id))
            if cached is not None:
                return cached
        try:
            return self._log_head_at(txn, info.number, branch.levels(at))
        except _DAMAGE as exc:
            raise self._unreadable(exc, f"the head of {state!r}", branch) from None

    def get_value(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, at: int | None = None
    ) -> tuple[Any, int]:
        """The state's value on ``branch`` (as of ``at``) and the sequence that set it; (None, 0) if never set."""
        info = self.state(state)
        if info.kind != "value":
            raise StateKindError(f"state {state!r} is an append log, not a value")
        try:
            found = self._find_head_with_sequence(txn, info.number, branch.levels(at))
            if found is None:
                return None, 0
            return json.loads(found[0]), found[1]
        except _DAMAGE as exc:
            raise self._unreadable(exc, f"the value of {state!r}", branch) from None

    def _read_ordinal(
        self, cursor: lmdb.Cursor[bytes], state: int, levels: Sequence[tuple[int, int]], ordinal: int
    ) -> Item | None:
        for branch, limit in levels:
            if _seek_le(cursor, keys.item_key(state, branch, ordinal, limit), keys.item_prefix(state, branch, ordinal)):
                version = keys.decode_item_key(cursor.key())[3]
                value = cursor.value()
                return Item(keys.decode_u64(value[:8]), ordinal, version, bytes(value[8:]))
        return None

    def log_item(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, index: int, at: int | None = None
    ) -> Item | None:
        """The item at ``index`` (negative counts from the end), or None out of range."""
        info = self._log_state(state)
        levels = branch.levels(at)
        try:
            head = self._log_head_at(txn, info.number, levels)
            if index < 0:
                index += head.length
            if not 0 <= index < head.length:
                return None
            cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
            return self._read_ordinal(cursor, info.number, levels, head.index_to_ordinal(index))
        except _DAMAGE as exc:
            raise self._unreadable(exc, f"item {index} of {state!r}", branch) from None

    def log_items(
        self,
        txn: lmdb.Transaction[bytes],
        state: str,
        branch: BranchRow,
        at: int | None = None,
        start: int = 0,
        stop: int | None = None,
        head: LogHead | None = None,
    ) -> list[Item]:
        """Items ``[start, stop)`` in order: one range scan per lineage level that can hold them."""
        info = self._log_state(state)
        if head is None:
            head = self.log_head(txn, state, branch, at)
        try:
            return self._log_items(txn, info, branch.levels(at), start, stop, head)
        except _DAMAGE as exc:
            raise self._unreadable(exc, f"the items of {state!r}", branch) from None

    def _log_items(
        self, txn: lmdb.Transaction[bytes], info: StateInfo, levels: Sequence[tuple[int, int]], start: int,
        stop: int | None, head: LogHead,
    ) -> list[Item]:
        stop = head.length if stop is None else min(stop, head.length)
        start = max(0, start)
        if start >= stop:
            return []
        first = head.index_to_ordinal(start)
        last = head.index_to_ordinal(stop - 1)
        wanted = stop - start
        found: dict[int, tuple[int, bytes]] = {}
        cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
        unpack = keys.ITEM_KEY.unpack
        for branch_id, limit in levels:
            prefix = keys.state_branch_prefix(info.number, branch_id)
            if not cursor.set_range(keys.item_key(info.number, branch_id, first, 0)):
                continue
            level: dict[int, tuple[int, bytes]] = {}
            for key, value in cursor.iternext():
                if key[:8] != prefix:
                    break
                _, _, ordinal, seq = unpack(key)
                if ordinal > last:
                    break
                if seq <= limit and ordinal not in found:
                    level[ordinal] = (seq, value)  # later versions come later: the newest visible wins
            found.update(level)
            if len(found) >= wanted and all(o in found for o in head.visible_ordinals(first, last)):
                break
        items = []
        for ordinal in head.visible_ordinals(first, last):
            row = found.get(ordinal)
            if row is None:
                raise self._damaged(f"{info.name!r} has no row for its visible ordinal {ordinal} (levels {levels})")
            version, value = row
            items.append(Item(keys.decode_u64(value[:8]), ordinal, version, value[8:]))
        return items

    # Reads without a transaction in hand, for the layers above the store (each is one read txn).

    def read_value(self, state: str, branch_id: int, default: Any = None) -> Any:
        """The value ``state`` holds on branch ``branch_id``, or ``default`` if it was never set or
        the state isn't registered."""
        if not self.has_state(state):
            return default
        with self.reader() as txn:
            value, sequence = self.get_value(txn, state, self._branches[branch_id])
        return default if sequence == 0 else value

    def read_log(self, state: str, branch_id: int) -> list[Item]:
        """Every item of log ``state`` on branch ``branch_id`` ([] if the state isn't registered)."""
        if not self.has_state(state):
            return []
        with self.reader() as txn:
            return self.log_items(txn, state, self._branches[branch_id])

    def read_head(self, state: str, branch_id: int, at: int | None = None) -> LogHead:
        """The head of log ``state`` on branch ``branch_id`` (as of sequence ``at``, or now)."""
        with self.reader() as txn:
            return self.log_head(txn, state, self._branches[branch_id], at)

    def read_items(
        self, state: str, branch_id: int, *, at: int | None = None, start: int = 0, stop: int | None = None,
    ) -> list[Item]:
        """Items ``[start, stop)`` of log ``state`` on branch ``branch_id``, as of ``at`` (or now)."""
        with self.reader() as txn:
            return self.log_items(txn, state, self._branches[branch_id], at=at, start=start, stop=stop)

    def read_tail(self, state: str, branch_id: int, start: int) -> tuple[LogHead, list[Item]]:
        """The head now and the items from index ``start`` to it, in one snapshot (a read-only
        cache's revalidation: usually no item at all)."""
        with self.reader() as txn:
            row = self._branches[branch_id]
            head = self.log_head(txn, state, row)
            return head, (self.log_items(txn, state, row, start=start, head=head) if start < head.length else [])

    def read_item(self, state: str, branch_id: int, sequence: int, *, at: int | None = None) -> Item | None:
        """The visible item appended at ``sequence``, as of ``at`` (or now), or None."""
        row = self._branches[branch_id]
        with self.reader() as txn:
            found = self.find_index(txn, state, row, sequence, at)
            return None if found is None else self.log_item(txn, state, row, found[0], at)

    def read_items_appended(
        self, state: str, branch_id: int, first: int, last: int, *, at: int | None = None,
    ) -> list[Item]:
        """The visible items appended at sequences ``first`` through ``last`` (both present), as of ``at``."""
        row = self._branches[branch_id]
        with self.reader() as txn:
            low, high = self.find_index(txn, state, row, first, at), self.find_index(txn, state, row, last, at)
            if low is None or high is None:
                return []
            return self.log_items(txn, state, row, at=at, start=low[0], stop=high[0] + 1)

    def read_blob(self, sha256: str) -> tuple[bytes, str] | None:
        """A blob's bytes and media type, or None."""
        with self.reader() as txn:
            return self.get_blob(txn, sha256)

    def branch_deleted(self, branch_id: int) -> bool:
        """Whether branch ``branch_id`` was deleted. A read-only engine reads the row afresh: the
        writer that deleted it may be another process."""
        if not self.readonly:
            return self._branches[branch_id].deleted
        key = keys.encode_u32(branch_id)
        with self.reader() as txn:
            raw = txn.get(key, db=self.dbs[keys.DB_BRANCHES])
        return raw is None or self.decode_branch_row(key, bytes(raw)).deleted

    def find_index(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, sequence: int, at: int | None = None
    ) -> tuple[int, int, LogHead] | None:
        """(index, ordinal, head) of the visible item appended at ``sequence``, or None."""
        info = self._log_state(state)
        try:
            return self._locate(txn, info, branch.levels(at), sequence)
        except _DAMAGE as exc:
            raise self._unreadable(exc, f"the items of {state!r}", branch) from None

    def _locate(
        self, txn: lmdb.Transaction[bytes], info: StateInfo, levels: Sequence[tuple[int, int]], sequence: int
    ) -> tuple[int, int, LogHead] | None:
        head = self._log_head_at(txn, info.number, levels)
        cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
        low, high = 0, head.next_ordinal - 1
        # Ordinals along a lineage were appended in sequence order, so a binary search finds it.
        while low <= high:
            middle = (low + high) // 2
            item = self._read_ordinal(cursor, info.number, levels, middle)
            if item is None:
                raise self._damaged(f"{info.name!r} has no row for ordinal {middle} (levels {levels})")
            if item.sequence == sequence:
                index = head.ordinal_to_index(middle)
                return None if index is None else (index, middle, head)
            if item.sequence < sequence:
                low = middle + 1
            else:
                high = middle - 1
        return None

    def get_blob(self, txn: lmdb.Transaction[bytes], sha256: str) -> tuple[bytes, str] | None:
        try:
            raw = txn.get(bytes.fromhex(sha256), db=self.dbs[keys.DB_BLOBS])
            if raw is None:
                return None
            media_type, _, data = bytes(raw).partition(b"\x00")
            return data, media_type.decode()
        except _DAMAGE as exc:
            raise self._damaged(f"blob {sha256} can't be read: {exc!r}") from None

    # -- writes -----------------------------------------------------------------------------

    def apply(
        self, commands: Sequence[Any], execute: Callable[[Batch, Any], Any],
        unnested: Callable[[Any], bool] | None = None,
    ) -> tuple[list[tuple[bool, Any]], list[Operation]]:
        """Run ``execute(batch, command)`` for each command in ONE write transaction and commit.

        ``unnested(command)`` True marks a command that checks everything it can be refused for
        before it writes (an append): in a batch it runs without a nested transaction of its own,
        and the log heads its appends move are written once, before the next nested command and
        before the commit. Should one raise after it started writing, the whole batch is begun
        again with every command nested, so the outcome is the same either way.

        Returns each command's ``(ok, result or error)`` and the committed operations. A command
        raising ``CtxrtError``, ``TypeError`` or ``ValueError`` is rolled back alone (nested
        transaction), and so is one that meets a damaged record (``StoreCorruptError``). A
        write the disk refuses (full, or any I/O error) raises ``StoreFullError`` for the whole
        batch, and a page LMDB finds corrupted while committing raises ``StoreCorruptError``:
        nothing of the batch was written either way (LMDB aborts the transaction). Any other
        exception aborts the whole batch and propagates (``lmdb.MapFullError`` included).
        """
        try:
            if len(commands) == 1:
                results, batch = self._apply_one(commands[0], execute)
            else:
                try:
                    results, batch = self._apply_many(commands, execute, unnested)
                except _Unsafe:  # nothing of that attempt was committed
                    results, batch = self._apply_many(commands, execute, None)
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            code = getattr(exc, "code", 0)
            if isinstance(code, int) and code > 0:  # an errno: the OS refused a write or a sync
                raise self._refused_write(code) from exc
            if isinstance(exc, _LMDB_DAMAGE):
                raise self._damaged(f"a write met a damaged page: {exc}") from exc
            raise
        if batch is None:
            return results, []
        self._committed(batch)
        return results, batch.operations

    def _refused_write(self, code: int) -> StoreFullError:
        try:
            stat = os.statvfs(self.env.path())
            free = f"{stat.f_bavail * stat.f_frsize} bytes free on its filesystem"
        except OSError:
            free = "free space unknown"
        name = errno.errorcode.get(code, str(code))
        return StoreFullError(self.data_path, f"the disk refused the write ({os.strerror(code)}, {name}; {free})")

    def _refused_command(self, command: Any, exc: BaseException) -> StoreCorruptError:
        return self._damaged(f"{type(command).__name__} met a record that doesn't decode: {exc!r}")

    def _apply_many(
        self, commands: Sequence[Any], execute: Callable[[Batch, Any], Any], unnested: Callable[[Any], bool] | None
    ) -> tuple[list[tuple[bool, Any]], Batch]:
        with self.env.begin(write=True) as txn:
            batch = Batch(self, txn)
            results: list[tuple[bool, Any]] = []
            for command in commands:
                if unnested is not None and unnested(command):
                    batch.defer_heads = True
                    try:
                        value = execute(batch, command)
                    except _REFUSALS as exc:
                        if batch.wrote:
                            raise _Unsafe from exc  # aborts this attempt; apply runs the batch nested
                        results.append((False, self._refused_command(command, exc) if isinstance(exc, _DAMAGE) else exc))
                    else:
                        results.append((True, value))
                    finally:
                        batch.defer_heads = batch.wrote = False
                    continue
                batch.flush_heads()  # a nested command reads heads from the transaction
                saved = batch.savepoint()
                child = self.env.begin(write=True, parent=txn)
                batch.txn = child
                try:
                    value = execute(batch, command)
                except _DAMAGE as exc:
                    # A damaged record: roll back this command alone and say so to its caller.
                    child.abort()
                    batch.restore(saved)
                    results.append((False, self._refused_command(command, exc)))
                except (CtxrtError, TypeError, ValueError) as exc:
                    # The caller's mistake: roll back this command alone and tell that caller.
                    child.abort()
                    batch.restore(saved)
                    results.append((False, exc))
                except BaseException:
                    child.abort()
                    raise
                else:
                    child.commit()
                    results.append((True, value))
                finally:
                    batch.txn = txn
            batch.flush_heads()
        return results, batch

    def _apply_one(
        self, command: Any, execute: Callable[[Batch, Any], Any]
    ) -> tuple[list[tuple[bool, Any]], Batch | None]:
        # A batch of one needs no nested transaction: refusing it is aborting the whole.
        txn = self.env.begin(write=True)
        batch = Batch(self, txn)
        try:
            value = execute(batch, command)
        except _DAMAGE as exc:
            txn.abort()
            return [(False, self._refused_command(command, exc))], None
        except (CtxrtError, TypeError, ValueError) as exc:
            txn.abort()
            return [(False, exc)], None
        except BaseException:
            txn.abort()
            raise
        txn.commit()
        return [(True, value)], batch

    def _committed(self, batch: Batch) -> None:
        self.last_sequence = batch.sequence
        self._heads.update(batch.heads)
        if batch.new_states:
            self._states.update(batch.new_states)
        for row in batch.branches.values():
            self._branches[row.id] = row
            if row.deleted:
                self._branch_ids.pop(row.name, None)
            else:
                self._branch_ids[row.name] = row.id


class _Unsafe(Exception):
    """An unnested command failed after it had written: the batch is begun again, nested."""


# What refuses one command of a batch (the others commit): the caller's mistake, or a damaged record.
_REFUSALS = (*_DAMAGE, CtxrtError, TypeError, ValueError)


class Batch:
    """The write side of one transaction; every write method is one store operation."""

    def __init__(self, engine: Engine, txn: lmdb.Transaction[bytes]) -> None:
        self.engine = engine
        self.txn = txn
        self.dbs = engine.dbs
        self.sequence = engine.last_sequence
        self.new_states: dict[str, StateInfo] = {}
        self.branches: dict[int, BranchRow] = {}  # rows this batch created or changed
        self.heads: dict[tuple[int, int], LogHead] = {}  # log heads this batch wrote
        self.operations: list[Operation] = []
        self._unwritten: dict[tuple[int, int], None] = {}

    # Unnested appends (Engine.apply): their heads are written by flush_heads; ``wrote`` says the
    # running append has begun writing (a failure then can't be its alone).
    defer_heads = False
    wrote = False

    def savepoint(self) -> tuple[Any, ...]:
        return self.sequence, dict(self.new_states), dict(self.branches), dict(self.heads), len(self.operations)

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.sequence, self.new_states, self.branches, self.heads, count = saved
        del self.operations[count:]


    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    # lookups that see this batch's own changes

    def state(self, name: str) -> StateInfo:
        info = self.new_states.get(name) or self.engine._states.get(name)
        if info is None:
            raise UnknownStateError(f"state {name!r} is not registered; register it before writing")
        return info

    def branch(self, name: str | int) -> BranchRow:
        """The live branch ``name``, or the branch with that id (an incarnation: refused once deleted)."""
        if isinstance(name, int):
            row = self.branches.get(name) or self.engine._branches.get(name)
            if row is None or row.deleted:
                what = f"branch {row.name!r} (id {name}) was deleted" if row is not None else f"no branch has id {name}"
                raise BranchNotFoundError(what)
            return row
        # A name deleted and recreated in this batch has a deleted row and a live one: take the live.
        for row in self.branches.values():
            if row.name == name and not row.deleted:
                return row
        branch_id = self.engine._branch_ids.get(name)
        if branch_id is not None:
            row = self.branches.get(branch_id) or self.engine._branches[branch_id]
            if not row.deleted:
                return row
        raise BranchNotFoundError(f"no branch named {name!r}")

    def _log_head(self, info: StateInfo, row: BranchRow) -> LogHead:
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine._heads.get(key)
        if head is None:
            head = self.engine._log_head_at(self.txn, info.number, row.levels())
        return head

    def _put_head(self, info: StateInfo, row: BranchRow, sequence: int, head: LogHead, *, rewrite: bool) -> None:
        key = (info.number, row.id)
        self.heads[key] = head
        if self.defer_heads and not rewrite:
            self._unwritten[key] = None  # written once by flush_heads, however many appends move it
            return
        self._unwritten.pop(key, None)
        encoded = head.encode()
        items = self.dbs[keys.DB_ITEMS]
        self.txn.put(keys.head_key(info.number, row.id, keys.MAX_U64), encoded, db=items)
        if rewrite:  # an edit or removal keeps a version, for views of the past
            self.txn.put(keys.head_key(info.number, row.id, sequence), encoded, db=items)

    def flush_heads(self) -> None:
        """Write the current heads the unnested appends left unwritten (in the batch's own transaction)."""
        if self._unwritten:
            items = self.dbs[keys.DB_ITEMS]
            for state, branch in self._unwritten:
                self.txn.put(keys.head_key(state, branch, keys.MAX_U64), self.heads[(state, branch)].encode(), db=items)
            self._unwritten = {}

    def _log_target(self, state: str, branch: str | int) -> tuple[StateInfo, BranchRow, LogHead]:
        info = self._log_state(state)
        row = self.branch(branch)
        return info, row, self._log_head(info, row)

    # operations

    def register_state(self, name: str, kind: StateKind) -> StateInfo:
        validate_state_name(name)
        if kind not in _KIND_BYTES:
            raise StateKindError(f"state kind must be 'log' or 'value', not {kind!r}")
        existing = self.new_states.get(name) or self.engine._states.get(name)
        if existing is not None:
            if existing.kind != kind:
                raise StateKindError(f"state {name!r} is registered as {existing.kind!r}, not {kind!r}")
            return existing
        meta = self.dbs[keys.DB_META]
        number = keys.decode_u32(self.txn.get(keys.META_NEXT_STATE, db=meta))  # type: ignore[arg-type]  # written when the store is made
        self.txn.put(keys.META_NEXT_STATE, keys.encode_u32(number + 1), db=meta)
        self.txn.put(name.encode(), keys.encode_u32(number) + _KIND_BYTES[kind], db=self.dbs[keys.DB_STATES])
        info = StateInfo(number, name, kind)
        self.new_states[name] = info
        return info

    def append(
        self, state: str, branch: str | int, data: bytes, blobs: Sequence[tuple[str, bytes, str]] = (), attachment: Any = None,
        flagged: bool = False,
    ) -> ItemAppended:
        # Everything it can be refused for is checked before the first write (Engine.apply).
        info = self.new_states.get(state) or self.engine._states.get(state)
        if info is None or info.kind != "log":
            info = self._log_state(state)  # raises what refuses it
        row = self.branches.get(branch) or self.engine._branches.get(branch) if type(branch) is int else None
        if row is None or row.deleted:
            row = self.branch(branch)  # by name, or raises what refuses it
        key = (info.number, row.id)
        head = self.heads.get(key) or self.engine._heads.get(key) or self._log_head(info, row)
        media = [self._blob_row(sha256, blob, media_type) for sha256, blob, media_type in blobs] if blobs else ()
        sequence = self.sequence + 1
        value = _U64_PACK(sequence) + data
        self.wrote = True
        txn = self.txn
        for blob_key, blob_row in media:
            txn.put(blob_key, blob_row, db=self.dbs[keys.DB_BLOBS], overwrite=False)
        self.sequence = sequence
        ordinal = head.next_ordinal
        txn.put(_ITEM_KEY_PACK(info.number, row.id, ordinal, sequence), value, db=self.dbs[keys.DB_ITEMS])
        new_head = LogHead(head.length + 1, ordinal + 1, head.removed, sequence, head.rewrite_revision,
                           True if flagged else head.flagged)
        self.heads[key] = new_head
        if self.defer_heads:
            self._unwritten[key] = None  # written once by flush_heads, however many appends move it
        else:
            self._unwritten.pop(key, None)
            txn.put(_ITEM_KEY_PACK(info.number, row.id, keys.HEAD_ORDINAL, keys.MAX_U64), new_head.encode(),
                    db=self.dbs[keys.DB_ITEMS])
        operation = ItemAppended(state, row.id, sequence, ordinal, data, attachment)
        self.operations.append(operation)
        return operation

    def _log_state(self, name: str) -> StateInfo:
        info = self.state(name)
        if info.kind != "log":
            raise StateKindError(f"state {name!r} holds a value, not an append log")
        return info

    def _locate(self, info: StateInfo, row: BranchRow, item_sequence: int) -> tuple[int, int, LogHead]:
        located = self.engine._locate(self.txn, info, row.levels(), item_sequence)
        if located is None:
            raise MessageNotFoundError(f"no item {item_sequence} in {info.name!r} on branch {row.name!r}")
        return located

    def edit(
        self, state: str, branch: str | int, item_sequence: int, data: bytes,
        blobs: Sequence[tuple[str, bytes, str]] = (), attachment: Any = None, flagged: bool = False,
    ) -> ItemEdited:
        info, row, head = self._log_target(state, branch)
        _, ordinal, head = self._locate(info, row, item_sequence)
        for sha256, blob, media_type in blobs:
            self.put_blob(sha256, blob, media_type)
        sequence = self._next_sequence()
        self.txn.put(
            keys.item_key(info.number, row.id, ordinal, sequence),
            keys.encode_u64(item_sequence) + data,
            db=self.dbs[keys.DB_ITEMS],
        )
        new_head = attrs.evolve(head, revision=sequence, rewrite_revision=sequence,
                                flagged=True if flagged else head.flagged)
        self._put_head(info, row, sequence, new_head, rewrite=True)
        operation = ItemEdited(state, row.id, sequence, item_sequence, data, attachment)
        self.operations.append(operation)
        return operation

    def remove(self, state: str, branch: str | int, from_sequence: int, to_sequence: int) -> ItemsRemoved:
        """Remove the items appended at ``from_sequence`` through ``to_sequence``, inclusive."""
        info, row, head = self._log_target(state, branch)
        if from_sequence > to_sequence:
            raise MalformedContentError("from_id", f"{from_sequence} is after to_id {to_sequence}")
        first_index, first, head = self._locate(info, row, from_sequence)
        last_index, last, head = self._locate(info, row, to_sequence)
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
        self._put_head(info, row, sequence, new_head, rewrite=True)
        operation = ItemsRemoved(state, row.id, sequence, from_sequence, to_sequence, count)
        self.operations.append(operation)
        return operation

    def set_value(self, state: str, branch: str | int, value: Any) -> ValueSet:
        info = self.state(state)
        if info.kind != "value":
            raise StateKindError(f"state {state!r} is an append log, not a value")
        row = self.branch(branch)
        data = encode_json(value, path=f"{state}")
        sequence = self._next_sequence()
        self.txn.put(keys.head_key(info.number, row.id, sequence), data, db=self.dbs[keys.DB_ITEMS])
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
                "at_sequence", f"must be an integer in [0, {self.sequence}] (the store's sequence), not {fork!r}"
            )
        try:
            self.branch(name)
        except BranchNotFoundError:
            pass
        else:
            raise BranchExistsError(f"a branch named {name!r} already exists")
        parent = self.branch(from_branch)
        meta = self.dbs[keys.DB_META]
        branch_id = keys.decode_u32(self.txn.get(keys.META_NEXT_BRANCH, db=meta))  # type: ignore[arg-type]  # written when the store is made
        self.txn.put(keys.META_NEXT_BRANCH, keys.encode_u32(branch_id + 1), db=meta)
        lineage = ((parent.id, fork),) + tuple((ancestor, min(fork, bound)) for ancestor, bound in parent.lineage)
        row = BranchRow(branch_id, name, parent.id, fork, lineage, int(time.time() * 1000))
        self.txn.put(keys.encode_u32(branch_id), row.to_json(), db=self.dbs[keys.DB_BRANCHES])
        self.txn.put(name.encode(), keys.encode_u32(branch_id), db=self.dbs[keys.DB_BRANCH_NAMES])
        self.branches[branch_id] = row
        self.operations.append(BranchCreated(row))
        return row

    def delete_branch(self, name: str) -> BranchRow:
        if name == MAIN_BRANCH:
            raise MalformedContentError("name", "the main branch can't be deleted")
        row = attrs.evolve(self.branch(name), deleted=True)
        # Rows stay: descendants' lineages still read them. Only the name is freed.
        self.txn.delete(name.encode(), db=self.dbs[keys.DB_BRANCH_NAMES])
        self.txn.put(keys.encode_u32(row.id), row.to_json(), db=self.dbs[keys.DB_BRANCHES])
        self.branches[row.id] = row
        self.operations.append(BranchDeleted(row))
        return row

    def put_blob(self, sha256: str, data: bytes, media_type: str) -> None:
        key, row = self._blob_row(sha256, data, media_type)
        self.txn.put(key, row, db=self.dbs[keys.DB_BLOBS], overwrite=False)

    @staticmethod
    def _blob_row(sha256: str, data: bytes, media_type: str) -> tuple[bytes, bytes]:
        """A blob's key and row, refused (MalformedContentError) if the bytes don't hash to ``sha256``."""
        key = bytes.fromhex(sha256)
        if hashlib.sha256(data).digest() != key:
            raise MalformedContentError("blob", f"bytes don't hash to {sha256}")
        return key, media_type.encode() + b"\x00" + data

