"""The sync LMDB engine: states, items, values, branches, lineage, blobs. Nothing here waits.

Design (docs/architecture.md, The store): one global sequence allocated in the write transaction;
branches with an immutable lineage ``[(parent, F), (grandparent, min(F, ...)), ...]``; a row
written on branch ``b`` at sequence ``s`` is visible to a view ``(B, T)`` when ``b`` is a level
of B's lineage and ``s`` is within that level's limit. Append-log states keep versioned item
rows keyed ``(state, branch, ordinal, seq)`` and a versioned head per write; value states keep
one versioned row per write. Creating a branch writes one row: nothing is copied.

Reads take a read transaction the caller opens (``engine.reader()``); writes happen only in
``Engine.prepare`` (``apply`` is prepare + commit on one thread), one write transaction per batch,
each command in a nested transaction so a refused command leaves the others of its batch intact.
The top-level transaction may come from another thread (``WriteTransactions``): the store's
writer thread begins and commits it, so its flushes don't stop the trio thread. ``committer``
hands the store actor what commits its batches (store/committer_lmdb.py, which does the waiting).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import lmdb

from ..errors import (
    StoreCorruptError,
    StoreFormatError,
    StoreFullError,
)
from . import files, keys, seals
from .apply import MISTAKES, UNDECODABLE, Unsafe, damaged_record, run_commands
from .batch import Batch, Counter
from .catalog import Catalog, log_state, value_state
from .committer import Committer, InlineCommitter
from .committer_lmdb import DurableCommitter, growing
from .records import (
    MAIN_BRANCH,
    BranchRow,
    Item,
    LogHead,
    Operation,
    StateInfo,
    StateKind,
)

# 2: log heads may end in the flag byte (LogHead.flagged). 3: every record's value ends in its
# seal (seals.py), so a changed bit is found when the record is read. A writer moves a format-1
# or -2 store to 3 when it opens it, sealing its records in batches; a read-only open refuses one
# (its records carry no seals to check), and an older ctxrt refuses format 3.
logger = logging.getLogger("ctxrt.store")

FORMAT_VERSION = 3
MOVED_FORMATS = (1, 2)  # a writer seals them into format 3
MOVE_BATCH = 20_000  # records sealed per write transaction while a store moves to format 3

_KIND_BYTES: dict[str, bytes] = {"log": b"L", "value": b"V"}
_BYTES_KIND: dict[bytes, StateKind] = {b"L": "log", b"V": "value"}

# What reading damaged bytes raises: LMDB's own findings, and the decoders' (K7).
_LMDB_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError)
# What the backend itself raises, for callers that report errors by kind (the CLI).
BACKEND_ERRORS: tuple[type[BaseException], ...] = (lmdb.Error,)
_DAMAGE = (*_LMDB_DAMAGE, *UNDECODABLE)
# What else LMDB raises in a read transaction that meets a page damaged after the open (a read-only
# runtime's file damaged while it serves): a table's entry in the main table lost its name
# (MDB_BAD_DBI) or its flags (MDB_INCOMPATIBLE), or the transaction already failed on a damaged page
# (MDB_BAD_TXN: LMDB drops the error of the search a cursor makes when it opens). Reads only: a
# write's failures keep ``apply``'s handling.
_LMDB_FAILED_READ = (lmdb.BadDbiError, lmdb.IncompatibleError, lmdb.BadTxnError)
_LMDB_READ_DAMAGE = (*_LMDB_DAMAGE, *_LMDB_FAILED_READ)
_READ_DAMAGE = (*_DAMAGE, *_LMDB_FAILED_READ)

_U64_PACK = keys.U64.pack
_ITEM_KEY_PACK = keys.ITEM_KEY.pack
_intact = seals.intact
_seal = seals.seal
_SEAL = seals.SIZE
_META_ROWS = 16  # more rows than ctxrt's meta table ever holds (3): enough to read it whole
_TABLE_ROWS = {keys.DB_META: "meta record", keys.DB_BRANCHES: "branch row", keys.DB_BRANCH_NAMES: "branch name",
               keys.DB_STATES: "state row", keys.DB_BLOBS: "blob"}



class Engine(Catalog):
    """One LMDB environment's ctxrt data. Reads from any task; writes only through ``apply``.

    A read that meets a record that doesn't decode, or a page LMDB reports as corrupted,
    raises ``StoreCorruptError`` naming the data file and the record (K7).
    """

    shared = False  # one writing process: its commit events tell its caches everything

    def __init__(self, env: lmdb.Environment, *, readonly: bool) -> None:
        super().__init__()
        self.env = env
        self.readonly = readonly
        self.data_path = os.path.join(env.path(), "data.mdb")
        self.last_sequence = 0
        self.dbs = self._open_tables_read_only() if readonly else self._open_tables_for_writing()
        # The store actor's writer thread's stop while it runs: closing the environment under a
        # transaction it holds hangs, so a close the actor didn't see through (a second Ctrl-C
        # from asyncio's handler inside its cleanup) stops it first.
        self.stop_writer: Callable[[], None] | None = None
        self._check_format()
        self.reload()

    def sync(self) -> None:
        """Flush what was committed to the disk (durability="os" commits don't wait for it)."""
        self.env.sync(True)

    def close(self) -> None:
        """Nothing of its own: ``environment.close_store`` closes the LMDB environment it shares."""

    def hold(self, branch_id: int, name: str) -> bool:
        """Always granted: one process writes an LMDB store (its owner lock)."""
        return True

    def holds(self, branch_id: int, name: str) -> bool:
        return True

    def release(self, branch_id: int, name: str) -> None:
        """Nothing to give back (``hold``)."""

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
        self.known_heads = {}

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
        except _LMDB_READ_DAMAGE as exc:
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
                formatted = meta is not None and txn.stat(meta)["entries"] > 0  # _check_format reads it
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
            if not txn.stat(meta)["entries"]:
                main = BranchRow(1, MAIN_BRANCH, None, None, (), int(time.time() * 1000))
                for db, key, value in (
                    (meta, keys.META_FORMAT, keys.encode_u32(FORMAT_VERSION)),
                    (meta, keys.META_NEXT_BRANCH, keys.encode_u32(2)),
                    (meta, keys.META_NEXT_STATE, keys.encode_u32(1)),
                    (dbs[keys.DB_BRANCHES], keys.encode_u32(1), main.to_json()),
                    (dbs[keys.DB_BRANCH_NAMES], MAIN_BRANCH.encode(), keys.encode_u32(1)),
                ):
                    txn.put(key, _seal(key, value), db=db)
        return dbs

    def _check_format(self) -> None:
        """Refuse a store of a format this version doesn't read, and a damaged meta table; a writer
        moves a format-1 or -2 store to format 3, or finishes such a move (a read-only open refuses
        both: their records aren't all sealed)."""
        try:
            with self.reader() as txn:
                cursor = txn.cursor(db=self.dbs[keys.DB_META])
                rows = dict((bytes(key), bytes(value)) for key, value in itertools.islice(cursor, _META_ROWS))
        except _LMDB_READ_DAMAGE as exc:
            raise self._damaged(f"its meta table can't be read: {exc}") from None
        raw = rows.get(keys.META_FORMAT)
        found = keys.decode_u32(raw[:4]) if raw is not None and len(raw) in (4, 4 + _SEAL) else raw
        if raw is not None and len(raw) == 4 and found in MOVED_FORMATS:  # no seals to check yet
            state, resume = f"records store format {found}, whose records carry no checksums", False
            earlier = ", or read it with an earlier ctxrt"
        else:
            broken = [key for key, value in rows.items() if not _intact(key, value)]
            if broken and (raw is None or len(raw) == 4 + _SEAL):  # a sealed store's damage, not another format
                raise self._broken(keys.DB_META, broken[0])
            if raw is None:
                raise StoreFormatError(f"{self.env.path()} is not a ctxrt store (no format record)")
            if found != FORMAT_VERSION or len(raw) != 4 + _SEAL:
                raise StoreFormatError(
                    f"{self.env.path()} records store format {found!r}; this ctxrt reads format {FORMAT_VERSION} "
                    f"(and a writer moves formats {', '.join(map(str, MOVED_FORMATS))} to it)"
                )
            if keys.META_MOVING not in rows:
                return
            state, resume, earlier = (f"is being moved to format {FORMAT_VERSION} (by a writer now, or by one "
                                      f"that stopped), its records not all sealed yet"), True, ""
        if self.readonly:
            raise StoreFormatError(
                f"{self.env.path()} {state}; this ctxrt reads format {FORMAT_VERSION}. Open it once with a "
                f"writing runtime of this version, which moves it to format {FORMAT_VERSION}{earlier}"
            )
        self._move_to_current_format(state, resume=resume)

    def _move_to_current_format(self, state: str, *, resume: bool) -> None:
        """Seal every record not sealed yet: a format-1 or -2 store moves to format 3, or (``resume``)
        a move a writer began is finished. ``state`` says which, for the log.

        ``MOVE_BATCH`` records per write transaction, each recording how far the move got (the
        meta table goes first, with format 3, so an older ctxrt refuses the store from the first
        batch on). A move that stops (its writer died) resumes at the next writer's open; LMDB
        reuses one batch's old pages in the batches after it, so the file grows by about two
        batches, not by the store; readers of this version refuse the store until it is done.
        """
        with self.reader() as txn:
            total = sum(txn.stat(self.dbs[table])["entries"] for table in keys.ALL_DBS)
            moving = self._get(txn, keys.DB_META, keys.META_MOVING) if resume else None
        logger.info("%s: %s; sealing its %d records for format %d", self.env.path(), state, total, FORMAT_VERSION)
        at: tuple[int, bytes] | None = (0, b"") if not moving else (moving[0], moving[1:])
        done = 0
        try:
            while at is not None:
                with self.env.begin(write=True) as txn:  # an open that can't write fails here, as a first open does
                    at, sealed = self._seal_batch(txn, *at)
                done += sealed
                logger.info("%s: sealed %d of %d records", self.env.path(), done, total)
        except lmdb.MapFullError:
            raise StoreFullError(self.data_path, f"the map ({self.env.info()['map_size']} bytes) can't hold the "
                                 f"move to format {FORMAT_VERSION}: open it with a larger map_size") from None
        except lmdb.Error as exc:
            code = getattr(exc, "code", 0)
            if isinstance(code, int) and code > 0:
                raise self._refused_write(code) from exc
            if isinstance(exc, _LMDB_DAMAGE):
                raise self._damaged(f"moving it to format {FORMAT_VERSION} met a damaged page: {exc}") from exc
            raise

    def _seal_batch(self, txn: lmdb.Transaction[bytes], table: int, after: bytes) -> tuple[
            tuple[int, bytes] | None, int]:
        """Seal up to ``MOVE_BATCH`` records from table number ``table`` on, past its key ``after``
        (b"": from its start): (where the next batch starts, or None when all are sealed; how many)."""
        meta = self.dbs[keys.DB_META]
        sealed = 0
        while table < len(keys.ALL_DBS):
            name = keys.ALL_DBS[table]
            cursor = txn.cursor(db=self.dbs[name])
            going = cursor.set_range(after) if after else cursor.first()
            if going and cursor.key() == after:
                going = cursor.next()
            while going:
                if sealed == MOVE_BATCH:  # the rest is for the next batches: say where they start
                    txn.put(keys.META_MOVING, _seal(keys.META_MOVING, bytes([table]) + after), db=meta)
                    return (table, after), sealed
                key, value = cursor.item()
                if name != keys.DB_META or key != keys.META_MOVING:
                    if name == keys.DB_META and key == keys.META_FORMAT:
                        value = keys.encode_u32(FORMAT_VERSION)
                    cursor.put(key, _seal(key, value))
                    sealed += 1
                after = key
                going = cursor.next()
            table, after = table + 1, b""
        txn.delete(keys.META_MOVING, db=meta)
        return None, sealed

    def reload(self) -> None:
        """Re-read the branch and state tables and the sequence (after another process wrote)."""
        try:
            with self.reader() as txn:
                branches = {}
                for key, value in txn.cursor(db=self.dbs[keys.DB_BRANCHES]):
                    row = self.decode_branch_row(key, self._unsealed(keys.DB_BRANCHES, key, value))
                    branches[row.id] = row
                states = {}
                for key, value in txn.cursor(db=self.dbs[keys.DB_STATES]):
                    info = self.decode_state_row(key, self._unsealed(keys.DB_STATES, key, value))
                    states[info.name] = info
                # Decoded and sound: named by them, a damaged head row below says whose it is.
                self.known_branches, self.known_states = branches, states
                # The sequence is the newest head any (state, branch) recorded: every write makes one.
                cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
                last_sequence = max(
                    (self._last_head(cursor, info.number, branch) for info in states.values() for branch in branches),
                    default=0,
                )
        except _READ_DAMAGE as exc:
            raise self._damaged(f"its branch, state or head rows can't be read: {exc!r}") from None
        for row in branches.values():
            for level, _ in ((row.parent, None), *row.lineage):
                if level is not None and level not in branches:
                    raise self._damaged(f"branch {row.id} ({row.name!r}) descends from branch {level}, which has no row")
        self.last_sequence = last_sequence
        self.install(branches, states)

    def rereads(self) -> bool:
        """A read-only engine reads the tables again: the writer is another process."""
        return self.readonly

    def decode_branch_row(self, key: bytes, value: bytes) -> BranchRow:
        """A row of the branches table (its value unsealed); ``StoreCorruptError`` naming it if it
        doesn't decode."""
        try:
            row = BranchRow.from_json(value)
            ints = (row.id, row.created_ms, row.switches, *(n for level in row.lineage for n in level),
                    *(row.switched_to or ()))
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
        """A row of the states table (its value unsealed); ``StoreCorruptError`` naming it if it
        doesn't decode."""
        try:
            name = key.decode()
            kind = _BYTES_KIND.get(value[4:5])
            if len(value) != 5 or kind is None:
                raise ValueError(f"{len(value)} bytes, kind byte {value[4:5]!r}")
        except ValueError as exc:
            raise self._damaged(f"the row of state {key!r} doesn't decode ({exc!r})") from None
        return StateInfo(keys.decode_u32(value[:4]), name, kind)

    # -- seals (format 3) ---------------------------------------------------------------------

    def describe_row(self, table: bytes, key: bytes) -> str:
        """Which record ``key`` names in ``table``, in words (its state and branch by name if known)."""
        if table != keys.DB_ITEMS or len(key) != keys.ITEM_KEY.size:
            shown = key.hex() if table in (keys.DB_BRANCHES, keys.DB_BLOBS) else repr(key)
            return f"the {_TABLE_ROWS.get(table, f'{table!r} row')} {shown}"
        number, branch_id, ordinal, sequence = keys.decode_item_key(key)
        if ordinal != keys.HEAD_ORDINAL:
            return f"the row of item {ordinal} (version {sequence}) of {self._where(number, branch_id)}"
        if sequence == keys.MAX_U64:
            return f"the current head of {self._where(number, branch_id)}"
        info = self._state_numbered(number)
        kept = "value" if info is not None and info.kind == "value" else "head"
        return f"the {kept} written at {sequence} of {self._where(number, branch_id)}"

    def _state_numbered(self, number: int) -> StateInfo | None:
        return next((info for info in self.known_states.values() if info.number == number), None)

    def _where(self, number: int, branch_id: int) -> str:
        """"state 'name' on branch 'name'", by number where a name isn't known (yet, or at all)."""
        info = self._state_numbered(number)
        row = self.known_branches.get(branch_id)
        return (f"{f'state {info.name!r}' if info else f'state number {number}'} on "
                f"{f'branch {row.name!r}' if row else f'branch {branch_id}'}")

    def _broken(self, table: bytes, key: bytes) -> StoreCorruptError:
        return self._damaged(f"{self.describe_row(table, bytes(key))} fails its checksum: a bit of its key or "
                             f"value changed")

    def _unsealed(self, table: bytes, key: bytes, value: bytes) -> bytes:
        """``value`` without its seal; ``StoreCorruptError`` naming the row if the seal doesn't match."""
        if not _intact(key, value):
            raise self._broken(table, key)
        return value[:-_SEAL]

    def _astray(self, table: bytes, key: bytes, near: bytes, value: bytes) -> StoreCorruptError:
        """A search for ``key`` landed beside ``near``, on the wrong side of it: a separator key of a
        branch page (no record, so no seal covers it) sent the search into another leaf. Unless
        ``near``'s own key changed: its seal says which."""
        if not _intact(near, value):
            return self._broken(table, near)
        return self._damaged(f"a search of table {table.decode()} for key {key.hex()} landed beside "
                             f"{self.describe_row(table, bytes(near))}, out of key order: a key of one of the "
                             f"table's branch pages is damaged")

    def _get(self, txn: lmdb.Transaction[bytes], table: bytes, key: bytes) -> bytes | None:
        """The unsealed value of ``key`` in ``table``, or None. A miss is proven (``_seek_le`` says
        how): the rows the search lands between are checked and must bracket the key."""
        cursor = txn.cursor(db=self.dbs[table])
        if cursor.set_range(key):
            found, value = cursor.item()
            unsealed = self._unsealed(table, found, value)
            if found == key:
                return unsealed
            if found < key:
                raise self._astray(table, key, found, value)
            if cursor.prev():
                before, value = cursor.item()
                self._unsealed(table, before, value)
                if before >= key:
                    raise self._astray(table, key, before, value)
        elif cursor.last():
            last, value = cursor.item()
            self._unsealed(table, last, value)
            if last >= key:
                raise self._astray(table, key, last, value)
        return None

    def _seek_le(
        self, cursor: lmdb.Cursor[bytes], key: bytes, prefix: bytes, checked: bool = True,
    ) -> tuple[bytes, bytes] | None:
        """The (key, unsealed value) of the last items row whose key is <= ``key`` and starts with
        ``prefix``, the cursor on it; None if there is none.

        Each row looked at is checked (unless not ``checked``), the one the search lands on
        included. A changed bit in a key leaves the row where it was, so LMDB's search for the row
        lands on it or on the row after it: a changed key can't hide the row this looks for, nor
        let an older version stand in.

        Nor can a changed separator key of a branch page, which no seal covers and which can send
        the search into a neighbouring leaf: LMDB steps from leaf to leaf (``prev``) by the tree's
        shape, not by separators, so the rows in that order are in key order whatever a separator
        says, and the row landed on (at or after ``key``) and the one before it (below ``key``)
        prove no row between them was missed. A search sent astray lands beside rows on the wrong
        side of ``key``: ``StoreCorruptError``. Two key comparisons a search.
        """
        if cursor.set_range(key):
            found, value = cursor.item()
            if checked and not _intact(found, value):
                raise self._broken(keys.DB_ITEMS, found)
            if found == key:
                return found, value[:-_SEAL]
            if found < key:
                raise self._astray(keys.DB_ITEMS, key, found, value)
            if not cursor.prev():
                return None
        elif not cursor.last():
            return None
        found, value = cursor.item()
        if checked and not _intact(found, value):
            raise self._broken(keys.DB_ITEMS, found)
        if found >= key:
            raise self._astray(keys.DB_ITEMS, key, found, value)
        return (found, value[:-_SEAL]) if found[: len(prefix)] == prefix else None

    def _scan_from(self, cursor: lmdb.Cursor[bytes], start: bytes) -> bool:
        """Put ``cursor`` on the first items row at or after ``start`` (False: there is none), having
        checked the row before it: the search lands right after a row whose key changed, and that
        row may be the first one a scan from ``start`` needs. Both bracket ``start`` (``_seek_le``)."""
        if cursor.set_range(start):
            found, value = cursor.item()
            if found < start:
                raise self._astray(keys.DB_ITEMS, start, found, value)
            if cursor.prev():
                found, value = cursor.item()
                if not _intact(found, value):
                    raise self._broken(keys.DB_ITEMS, found)
                if found >= start:
                    raise self._astray(keys.DB_ITEMS, start, found, value)
                cursor.next()
            else:  # it landed on the table's first row; a failed prev leaves the cursor nowhere
                cursor.first()
            return True
        if cursor.last():
            found, value = cursor.item()
            if not _intact(found, value):
                raise self._broken(keys.DB_ITEMS, found)
            if found >= start:
                raise self._astray(keys.DB_ITEMS, start, found, value)
        return False

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

    def branch_by_id(self, branch_id: int) -> BranchRow:
        return self.known_branches[branch_id]

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
        prefix = keys.head_prefix(state, branch)
        found = self._seek_le(cursor, keys.head_key(state, branch, keys.MAX_U64), prefix)
        if found is None:
            return self._level_head(cursor, state, levels, i + 1)  # nothing written here: inherited
        if found[0] != keys.head_key(state, branch, keys.MAX_U64):  # every write leaves a current head
            raise self._damaged(f"the current head of {self._where(state, branch)} is missing, though its head "
                                f"written at {keys.decode_head_key(found[0])[2]} is there")
        current = LogHead.decode(found[1])
        if current.revision <= limit:
            return current
        found = self._seek_le(cursor, keys.head_key(state, branch, limit), prefix)
        if found is not None:
            base = LogHead.decode(found[1])
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

    def _first_version(self, cursor: lmdb.Cursor[bytes], state: int, branch: int, ordinal: int) -> int:
        """The sequence of an ordinal's first version on ``branch``: when it was appended there
        (``MAX_U64`` if it wasn't: an ancestor's ordinal, below the ones appended on ``branch``)."""
        if self._scan_from(cursor, keys.item_key(state, branch, ordinal, 0)):
            found, value = cursor.item()
            if not _intact(found, value):
                raise self._broken(keys.DB_ITEMS, found)
            if found[: keys.ITEM_PREFIX.size] == keys.item_prefix(state, branch, ordinal):
                return keys.decode_item_key(found)[3]
        return keys.MAX_U64

    def _find_head_with_sequence(
        self, txn: lmdb.Transaction[bytes], state: int, levels: Sequence[tuple[int, int]]
    ) -> tuple[bytes, int] | None:
        cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
        for branch, limit in levels:
            found = self._seek_le(cursor, keys.head_key(state, branch, limit), keys.head_prefix(state, branch))
            if found is not None:
                return found[1], keys.decode_head_key(found[0])[2]
        return None

    def _last_head(self, cursor: lmdb.Cursor[bytes], state: int, branch: int) -> int:
        """The sequence of the newest write (state, branch) made itself, or 0."""
        found = self._seek_le(cursor, keys.head_key(state, branch, keys.MAX_U64), keys.head_prefix(state, branch))
        if found is None:
            return 0
        sequence = keys.decode_head_key(found[0])[2]
        # A log state's current-head row is keyed past every sequence; its revision says when.
        return LogHead.decode(found[1]).revision if sequence == keys.MAX_U64 else sequence

    def head_sequence(self, branch: BranchRow) -> int:
        """The sequence of the branch's newest write (its fork point if it wrote nothing)."""
        try:
            with self.reader() as txn:
                cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
                own = max((self._last_head(cursor, info.number, branch.id) for info in self.known_states.values()), default=0)
        except _READ_DAMAGE as exc:
            raise self._unreadable(exc, "the heads", branch) from None
        return max(own, branch.fork_sequence or 0)

    def _unreadable(self, exc: BaseException, what: str, branch: BranchRow) -> StoreCorruptError:
        return self._damaged(f"{what} on branch {branch.name!r} can't be read: {exc!r}")

    def log_head(self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, at: int | None = None) -> LogHead:
        info = log_state(self.state(state))
        if at is None and not self.readonly:
            cached = self.known_heads.get((info.number, branch.id))
            if cached is not None:
                return cached
        try:
            return self._log_head_at(txn, info.number, branch.levels(at))
        except _READ_DAMAGE as exc:
            raise self._unreadable(exc, f"the head of {state!r}", branch) from None

    def get_value(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, at: int | None = None
    ) -> tuple[Any, int]:
        """The state's value on ``branch`` (as of ``at``) and the sequence that set it; (None, 0) if never set."""
        info = value_state(self.state(state))
        try:
            found = self._find_head_with_sequence(txn, info.number, branch.levels(at))
            if found is None:
                return None, 0
            return json.loads(found[0]), found[1]
        except _READ_DAMAGE as exc:
            raise self._unreadable(exc, f"the value of {state!r}", branch) from None

    def _read_ordinal(
        self, cursor: lmdb.Cursor[bytes], state: int, levels: Sequence[tuple[int, int]], ordinal: int,
        checked: bool = True,
    ) -> Item | None:
        for branch, limit in levels:
            found = self._seek_le(cursor, keys.item_key(state, branch, ordinal, limit),
                                  keys.item_prefix(state, branch, ordinal), checked)
            if found is not None:
                key, value = found
                return Item(keys.decode_u64(value[:8]), ordinal, keys.decode_item_key(key)[3], value[8:])
        return None

    def log_item(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, index: int, at: int | None = None
    ) -> Item | None:
        """The item at ``index`` (negative counts from the end), or None out of range."""
        info = log_state(self.state(state))
        levels = branch.levels(at)
        try:
            head = self._log_head_at(txn, info.number, levels)
            if index < 0:
                index += head.length
            if not 0 <= index < head.length:
                return None
            cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
            return self._read_ordinal(cursor, info.number, levels, head.index_to_ordinal(index))
        except _READ_DAMAGE as exc:
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
        info = log_state(self.state(state))
        if head is None:
            head = self.log_head(txn, state, branch, at)
        try:
            return self._log_items(txn, info, branch.levels(at), start, stop, head)
        except _READ_DAMAGE as exc:
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
            if not self._scan_from(cursor, keys.item_key(info.number, branch_id, first, 0)):
                continue
            level: dict[int, tuple[int, bytes]] = {}
            for key, value in cursor.iternext():
                # Every row the scan passes is checked, the one it stops at included: a changed key
                # moves no row, so one this scan needs is among them.
                if not _intact(key, value):
                    raise self._broken(keys.DB_ITEMS, key)
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
            items.append(Item(keys.decode_u64(value[:8]), ordinal, version, value[8:-_SEAL]))
        return items

    # Reads without a transaction in hand, for the layers above the store (each is one read txn).

    def read_value(self, state: str, branch_id: int, default: Any = None, *, at: int | None = None) -> Any:
        """The value ``state`` holds on branch ``branch_id`` (as of ``at``, or now), or ``default``
        if it was never set or the state isn't registered."""
        if not self.has_state(state):
            return default
        with self.reader() as txn:
            value, sequence = self.get_value(txn, state, self.known_branches[branch_id], at)
        return default if sequence == 0 else value

    def read_log(self, state: str, branch_id: int) -> list[Item]:
        """Every item of log ``state`` on branch ``branch_id`` ([] if the state isn't registered)."""
        if not self.has_state(state):
            return []
        with self.reader() as txn:
            return self.log_items(txn, state, self.known_branches[branch_id])

    def read_head(self, state: str, branch_id: int, at: int | None = None) -> LogHead:
        """The head of log ``state`` on branch ``branch_id`` (as of sequence ``at``, or now)."""
        with self.reader() as txn:
            return self.log_head(txn, state, self.known_branches[branch_id], at)

    def read_items(
        self, state: str, branch_id: int, *, at: int | None = None, start: int = 0, stop: int | None = None,
    ) -> list[Item]:
        """Items ``[start, stop)`` of log ``state`` on branch ``branch_id``, as of ``at`` (or now)."""
        with self.reader() as txn:
            return self.log_items(txn, state, self.known_branches[branch_id], at=at, start=start, stop=stop)

    def read_tail(self, state: str, branch_id: int, start: int) -> tuple[LogHead, list[Item]]:
        """The head now and the items from index ``start`` to it, in one snapshot (a read-only
        cache's revalidation: usually no item at all)."""
        with self.reader() as txn:
            row = self.known_branches[branch_id]
            head = self.log_head(txn, state, row)
            return head, (self.log_items(txn, state, row, start=start, head=head) if start < head.length else [])

    def read_item(self, state: str, branch_id: int, sequence: int, *, at: int | None = None) -> Item | None:
        """The visible item appended at ``sequence``, as of ``at`` (or now), or None."""
        row = self.known_branches[branch_id]
        with self.reader() as txn:
            found = self.find_index(txn, state, row, sequence, at)
            return None if found is None else self.log_item(txn, state, row, found[0], at)

    def read_items_appended(
        self, state: str, branch_id: int, first: int, last: int, *, at: int | None = None,
    ) -> list[Item]:
        """The visible items appended at sequences ``first`` through ``last`` (both present), as of ``at``."""
        row = self.known_branches[branch_id]
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
        row = self.fresh_branch(branch_id)
        return row is None or row.deleted

    def fresh_branch(self, branch_id: int) -> BranchRow | None:
        """Branch ``branch_id``'s row as stored now (None if there is none). A read-only engine reads
        it afresh: the writer may be another process; a writer's commits keep its own copy current."""
        if not self.readonly:
            return self.known_branches.get(branch_id)
        key = keys.encode_u32(branch_id)
        try:
            with self.reader() as txn:
                raw = self._get(txn, keys.DB_BRANCHES, key)
        except _LMDB_READ_DAMAGE as exc:
            raise self._damaged(f"the row of branch {branch_id} can't be read: {exc!r}") from None
        return None if raw is None else self.decode_branch_row(key, raw)

    def find_index(
        self, txn: lmdb.Transaction[bytes], state: str, branch: BranchRow, sequence: int, at: int | None = None
    ) -> tuple[int, int, LogHead] | None:
        """(index, ordinal, head) of the visible item appended at ``sequence``, or None."""
        info = log_state(self.state(state))
        try:
            return self._locate(txn, info, branch.levels(at), sequence)
        except _READ_DAMAGE as exc:
            raise self._unreadable(exc, f"the items of {state!r}", branch) from None

    def _locate(
        self, txn: lmdb.Transaction[bytes], info: StateInfo, levels: Sequence[tuple[int, int]], sequence: int,
        head: LogHead | None = None,
    ) -> tuple[int, int, LogHead] | None:
        """(index, ordinal, head) of the visible item appended at ``sequence``; ``head`` is the view's
        head when the caller has it already.

        The search's probes skip their seals (about log2(n) rows, of which it reads an origin
        each): the row it settles on is read again, checked, and a search that finds nothing, or
        settles on a row that isn't the item, is made again checking every row it looks at. So a
        changed bit can neither hide the item nor pass for it.
        """
        if head is None:
            head = self._log_head_at(txn, info.number, levels)
        cursor = txn.cursor(db=self.dbs[keys.DB_ITEMS])
        ordinal = self._search(cursor, info, levels, sequence, head, checked=False)
        item = None if ordinal is None else self._read_ordinal(cursor, info.number, levels, ordinal)
        if item is None or item.sequence != sequence:
            ordinal = self._search(cursor, info, levels, sequence, head, checked=True)
        index = None if ordinal is None else head.ordinal_to_index(ordinal)
        return None if ordinal is None or index is None else (index, ordinal, head)

    def _search(
        self, cursor: lmdb.Cursor[bytes], info: StateInfo, levels: Sequence[tuple[int, int]], sequence: int,
        head: LogHead, *, checked: bool,
    ) -> int | None:
        """The ordinal of the item appended at ``sequence``, or None."""
        low, high = 0, head.next_ordinal - 1
        # Ordinals along a lineage were appended in sequence order, so a binary search finds it.
        while low <= high:
            middle = (low + high) // 2
            item = self._read_ordinal(cursor, info.number, levels, middle, checked)
            if item is None:
                if not checked:
                    return None  # the checked search says what is wrong
                raise self._damaged(f"{info.name!r} has no row for ordinal {middle} (levels {levels})")
            if item.sequence == sequence:
                return middle
            if item.sequence < sequence:
                low = middle + 1
            else:
                high = middle - 1
        return None

    def get_blob(self, txn: lmdb.Transaction[bytes], sha256: str) -> tuple[bytes, str] | None:
        try:
            raw = self._get(txn, keys.DB_BLOBS, bytes.fromhex(sha256))
            if raw is None:
                return None
            media_type, _, data = raw.partition(b"\x00")
            return data, media_type.decode()
        except _READ_DAMAGE as exc:
            raise self._damaged(f"blob {sha256} can't be read: {exc!r}") from None

    # -- writes -----------------------------------------------------------------------------

    def apply(
        self, commands: Sequence[Any], execute: Callable[[LmdbBatch, Any], Any],
        unnested: Callable[[Any], bool] | None = None,
    ) -> tuple[list[tuple[bool, Any]], list[Operation]]:
        """Run ``execute(batch, command)`` for each command in ONE write transaction and commit,
        all on the calling thread: ``prepare``, then the commit, then ``committed``.

        Returns each command's ``(ok, result or error)`` and the committed operations. A write the
        disk refuses (full, or any I/O error) raises ``StoreFullError`` for the whole batch, and a
        page LMDB finds corrupted raises ``StoreCorruptError``: nothing of the batch was written
        either way (LMDB aborts the transaction). ``lmdb.MapFullError`` propagates, as does any
        other exception that aborts the batch.
        """
        prepared = self.prepare(commands, execute, unnested)
        self.commit(prepared)
        return self.committed(prepared)

    def commit(self, prepared: Prepared) -> None:
        """Commit ``prepared.txn`` (if any) on this thread; what LMDB refuses raises as ``apply`` says."""
        if prepared.txn is None:
            return
        try:
            prepared.txn.commit()
        except lmdb.Error as exc:
            refusal = self.write_refusal(exc)
            if refusal is exc:
                raise
            raise refusal from exc

    def committer(self, execute: Callable[[LmdbBatch, Any], Any], unnested: Callable[[Any], bool]) -> Committer:
        """The store actor's committer (store/committer_lmdb.py): under durability "sync" the writer
        thread's, or inline while the flush measures fast; under "os" inline, nothing flushed, and
        the store flushed every second."""
        if self.env.flags()["sync"]:
            return DurableCommitter(self, execute, unnested)
        return InlineCommitter(lambda commands: growing(self, lambda: self.apply(commands, execute, unnested)),
                               self.sync, BACKEND_ERRORS)

    def prepare(
        self, commands: Sequence[Any], execute: Callable[[LmdbBatch, Any], Any],
        unnested: Callable[[Any], bool] | None = None, txns: WriteTransactions | None = None,
    ) -> Prepared:
        """Run the batch in ONE write transaction from ``txns`` (default: begun and aborted on this
        thread) and leave it uncommitted: the caller commits ``prepared.txn`` (None: nothing to
        commit), then calls ``committed``. Nothing is visible to readers until that commit.

        ``unnested(command)`` True marks a command that checks everything it can be refused for
        before it writes (an append): in a batch it runs without a nested transaction of its own,
        and the log heads its appends move are written once, before the next nested command and
        before the commit. Should one raise after it started writing, the whole batch is begun
        again with every command nested, so the outcome is the same either way.

        A command raising ``CtxrtError``, ``TypeError`` or ``ValueError`` is rolled back alone
        (nested transaction), and so is one that meets a damaged record (``StoreCorruptError``).
        A write the disk or LMDB refuses raises as ``apply`` says, the transaction aborted.
        """
        txns = txns or _LocalTransactions(self.env)
        try:
            if len(commands) == 1:
                return self._prepare_one(commands[0], execute, txns)
            try:
                return self._prepare_many(commands, execute, unnested, txns)
            except Unsafe:  # nothing of that attempt is left
                return self._prepare_many(commands, execute, None, txns)
        except lmdb.Error as exc:
            refusal = self.write_refusal(exc)
            if refusal is exc:
                raise
            raise refusal from exc

    def write_refusal(self, exc: lmdb.Error) -> BaseException:
        """What a batch's callers are told when LMDB refused its transaction with ``exc``: the
        disk's refusal as ``StoreFullError``, a damaged page as ``StoreCorruptError``, anything
        else (``MapFullError`` included) as itself."""
        if isinstance(exc, lmdb.MapFullError):
            return exc
        code = getattr(exc, "code", 0)
        if isinstance(code, int) and code > 0:  # an errno: the OS refused a write or a sync
            return self._refused_write(code)
        if isinstance(exc, _LMDB_DAMAGE):
            return self._damaged(f"a write met a damaged page: {exc}")
        return exc

    def committed(self, prepared: Prepared) -> tuple[list[tuple[bool, Any]], list[Operation]]:
        """After ``prepared.txn`` committed (or when there was nothing to commit): the engine's
        caches take the batch; returns each command's result and the committed operations."""
        if prepared.txn is None:
            return prepared.results, []
        self.last_sequence = prepared.batch.sequence
        self.take_batch(prepared.batch)
        return prepared.results, prepared.batch.operations

    def _refused_write(self, code: int) -> StoreFullError:
        try:
            stat = os.statvfs(self.env.path())
            free = f"{stat.f_bavail * stat.f_frsize} bytes free on its filesystem"
        except OSError:
            free = "free space unknown"
        name = errno.errorcode.get(code, str(code))
        return StoreFullError(self.data_path, f"the disk refused the write ({os.strerror(code)}, {name}; {free})")

    def _prepare_many(
        self, commands: Sequence[Any], execute: Callable[[LmdbBatch, Any], Any], unnested: Callable[[Any], bool] | None,
        txns: WriteTransactions,
    ) -> Prepared:
        txn = txns.begin()
        try:
            batch = LmdbBatch(self, txn)
            results = run_commands(batch, commands, execute, unnested, _ChildTransactions(self, batch, txn))
        except BaseException:
            txns.abort(txn)
            raise
        return Prepared(results, batch, txn)

    def _prepare_one(self, command: Any, execute: Callable[[LmdbBatch, Any], Any], txns: WriteTransactions) -> Prepared:
        # A batch of one needs no nested transaction: refusing it is aborting the whole.
        txn = txns.begin()
        batch = LmdbBatch(self, txn)
        try:
            value = execute(batch, command)
        except _DAMAGE as exc:
            txns.abort(txn)
            return Prepared([(False, damaged_record(self.data_path, command, exc))], batch, None)
        except MISTAKES as exc:
            txns.abort(txn)
            return Prepared([(False, exc)], batch, None)
        except BaseException:
            txns.abort(txn)
            raise
        return Prepared([(True, value)], batch, txn)



class WriteTransactions(Protocol):
    """Where ``Engine.prepare`` gets a batch's top-level write transaction, and ends one it won't
    hand back (a refused command, an aborted attempt): the calling thread, or the store's writer
    thread (store/writer.py), which must begin and end it itself."""

    def begin(self) -> lmdb.Transaction[bytes]: ...
    def abort(self, txn: lmdb.Transaction[bytes]) -> None: ...


class _LocalTransactions:
    """Begun and aborted on the calling thread."""

    def __init__(self, env: lmdb.Environment) -> None:
        self._env = env

    def begin(self) -> lmdb.Transaction[bytes]:
        return self._env.begin(write=True)

    def abort(self, txn: lmdb.Transaction[bytes]) -> None:
        txn.abort()


@attrs.frozen
class Prepared:
    """A batch run in a write transaction not yet committed (``txn`` None: nothing to commit)."""

    results: list[tuple[bool, Any]]
    batch: LmdbBatch
    txn: lmdb.Transaction[bytes] | None


# What refuses one command of a batch (the others commit): the caller's mistake, or a damaged record.
_REFUSALS = (*_DAMAGE, *MISTAKES)


class _ChildTransactions:
    """A batch's commands nested in child transactions of its one write transaction (apply.Nesting)."""

    refusals: tuple[type[BaseException], ...] = _REFUSALS
    nested_refusals: tuple[type[BaseException], ...] = _REFUSALS

    def __init__(self, engine: Engine, batch: LmdbBatch, txn: lmdb.Transaction[bytes]) -> None:
        self._engine = engine
        self._batch = batch
        self._txn = txn
        self._child: lmdb.Transaction[bytes] | None = None

    def refusal(self, command: Any, exc: BaseException) -> BaseException:
        # A damaged record refuses the command that met it, saying so; a caller's mistake is its own.
        return damaged_record(self._engine.data_path, command, exc) if isinstance(exc, _DAMAGE) else exc

    def begin(self, number: int) -> None:
        self._child = self._batch.txn = self._engine.env.begin(write=True, parent=self._txn)

    def settle(self) -> None:
        """Nothing: the command's rows are in its child transaction already."""

    def keep(self) -> None:
        try:
            self._ended().commit()
        finally:
            self._batch.txn = self._txn

    def undo(self, exc: BaseException) -> BaseException:
        self.abandon()
        return exc

    def abandon(self) -> None:
        self._ended().abort()
        self._batch.txn = self._txn

    def _ended(self) -> lmdb.Transaction[bytes]:
        child, self._child = self._child, None
        assert child is not None  # begun
        return child


class LmdbBatch(Batch):
    """A batch's rows in one LMDB write transaction (``txn``: a nested one while a command runs nested)."""

    def __init__(self, engine: Engine, txn: lmdb.Transaction[bytes]) -> None:
        super().__init__(engine, engine.last_sequence)
        self.lmdb = engine
        self.txn = txn
        self.dbs = engine.dbs
        self._items = engine.dbs[keys.DB_ITEMS]

    def read_head(self, info: StateInfo, row: BranchRow) -> LogHead:
        return self.lmdb._log_head_at(self.txn, info.number, row.levels())

    def locate(
        self, info: StateInfo, row: BranchRow, item_sequence: int, head: LogHead,
    ) -> tuple[int, int, LogHead] | None:
        return self.lmdb._locate(self.txn, info, row.levels(), item_sequence, head)

    def read_range(self, info: StateInfo, row: BranchRow, head: LogHead, start: int, stop: int) -> list[Item]:
        return self.lmdb._log_items(self.txn, info, row.levels(), start, stop, head)

    def read_value(self, info: StateInfo, row: BranchRow) -> tuple[Any, int]:
        return self.lmdb.get_value(self.txn, info.name, row)

    def item_version(self, info: StateInfo, row: BranchRow, located: tuple[int, int, LogHead]) -> int:
        item = self.lmdb._read_ordinal(self.txn.cursor(db=self._items), info.number, row.levels(), located[1])
        assert item is not None  # located in this transaction
        return item.version

    def next_number(self, counter: Counter) -> int:
        key = keys.META_NEXT_STATE if counter == "state" else keys.META_NEXT_BRANCH
        raw = self.lmdb._get(self.txn, keys.DB_META, key)
        if raw is None or len(raw) != 4:
            raise self.lmdb._damaged(f"the meta record {key!r} is {'missing' if raw is None else f'{len(raw)} bytes'}")
        number = keys.decode_u32(raw)
        self.txn.put(key, _seal(key, keys.encode_u32(number + 1)), db=self.dbs[keys.DB_META])
        return number

    def put_state(self, info: StateInfo) -> None:
        key = info.name.encode()
        self.txn.put(key, _seal(key, keys.encode_u32(info.number) + _KIND_BYTES[info.kind]), db=self.dbs[keys.DB_STATES])

    def put_item(self, info: StateInfo, row: BranchRow, ordinal: int, version: int, item_sequence: int,
                 data: bytes) -> None:
        key = _ITEM_KEY_PACK(info.number, row.id, ordinal, version)
        self.txn.put(key, _seal(key, _U64_PACK(item_sequence) + data), db=self._items)

    def put_head(self, info: StateInfo, row: BranchRow, head: LogHead, version: int | None) -> None:
        key = _ITEM_KEY_PACK(info.number, row.id, keys.HEAD_ORDINAL, keys.MAX_U64 if version is None else version)
        self.txn.put(key, _seal(key, head.encode()), db=self._items)

    def put_value(self, info: StateInfo, row: BranchRow, version: int, data: bytes) -> None:
        key = keys.head_key(info.number, row.id, version)
        self.txn.put(key, _seal(key, data), db=self._items)

    def put_branch(self, row: BranchRow, *, created: bool) -> None:
        name = row.name.encode()
        if created:
            self.txn.put(name, _seal(name, keys.encode_u32(row.id)), db=self.dbs[keys.DB_BRANCH_NAMES])
        elif row.deleted:
            self.txn.delete(name, db=self.dbs[keys.DB_BRANCH_NAMES])
        key = keys.encode_u32(row.id)
        self.txn.put(key, _seal(key, row.to_json()), db=self.dbs[keys.DB_BRANCHES])

    def put_blob_row(self, sha256: str, data: bytes, media_type: str) -> None:
        key = bytes.fromhex(sha256)
        self.txn.put(key, _seal(key, media_type.encode() + b"\x00" + data), db=self.dbs[keys.DB_BLOBS],
                     overwrite=False)
