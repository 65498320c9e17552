"""The store's part of verifying a store: walk every page and every record, and report what is
damaged, as data (K7).

``walk_store(path, check_item)`` walks in this process: use it only where a crash of this
process is acceptable. ``ctxrt.verification`` composes it: it runs the walk in a child process,
so a damaged file that makes LMDB abort or raise SIGBUS kills only the child (whose stream
``report_from_stream`` reads back), and it hands in ``check_item``, which decodes each log item
as the layers above read it (a message, its blob references): the store checks seals and
structure and never decodes a message.

The walk, in order, stopping where going on could crash:

1. the files, as an open checks them (``files.read_meta``): meta pages, size, table roots;
2. every page, with py-lmdb's pure-Python structural verifier (``lmdb.verify``), which reads
   the file with plain reads and never hands it to LMDB, then every branch page's separators
   against the keys below them (``files.separator_problems``); skipped while a writer holds the
   store (its pages move under the walk), and the record walk is skipped if a page is damaged
   (unless only keys are out of order: a changed bit in a record's key, which LMDB reads
   without harm and the record walk names by the record's seal, or in a separator, which sends
   LMDB's searches astray without harm and the engine's reads refuse where they land);
3. every record of every table, read-only through LMDB in one read transaction: each record's
   seal (its checksum, format 3), then the meta rows, branch rows and names, state rows, every
   head and item row (each log item handed to ``check_item``, the blobs it names looked up), every
   blob against its hash; then every log state of every live branch read whole through the
   engine, and every value state; then whatever ``check_engine``, handed in from above too,
   finds reading through the engine (the channel indexes against their messages, K10).

The child prints one JSON object per line as it goes (``Findings``' ``emit``), so what it found
before a crash survives it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import attrs
import lmdb

from ..errors import CtxrtError, StoreCorruptError, StoreFormatError
from . import files, keys, seals
from .interface import StoreEngine
from .records import LogHead

MAX_DAMAGE = 1000
# Findings of pages LMDB reads without harm: lmdb.verify's leaf key out of order, and a separator
# (or a key below it) out of the range the tree gives it (files.separator_problems): a search
# misdirected by one lands in a sound leaf, and the engine's reads prove where they landed.
_READABLE = re.compile(r"DB: (leaf keys out of order at page \d+|branch page \d+ separator keys out of order at) node \d+$|^table \S+: (branch|leaf) page \d+ (separator|key) \d+ ")
Status = Literal["sound", "damaged", "not checked"]
# What the layer above checks of a log item: given its state's name, its bytes (its origin cut
# off), its origin sequence and its place, the blobs it refers to (sha-256 hex; none for an item
# that isn't a message), or it raises if the item doesn't decode.
ItemCheck = Callable[[str, bytes, int, str], Iterable[str]]
# Reads the store through its engine and yields (place, what is wrong) for each finding.
EngineCheck = Callable[[StoreEngine], Iterable[tuple[str, str]]]


@attrs.frozen
class Damage:
    """One thing found wrong: ``place`` names the file, page, table or record; ``what`` says how."""

    place: str
    what: str


@attrs.frozen
class VerifyReport:
    """What a walk of one store found. ``status`` is "sound", "damaged" or "not checked"."""

    path: str
    status: Status
    damage: tuple[Damage, ...] = ()
    notes: tuple[str, ...] = ()
    pages: int = 0  # pages the structural walk checked (0: skipped)
    records: int = 0  # records the record walk read

    @property
    def exit_code(self) -> int:
        return {"sound": 0, "damaged": 1, "not checked": 2}[self.status]

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        head = {
            "sound": f"{self.path}: sound ({self.pages} pages, {self.records} records checked)",
            "damaged": f"{self.path}: DAMAGED ({len(self.damage)} findings; {self.pages} pages, "
                       f"{self.records} records checked)",
            "not checked": f"{self.path}: not checked",
        }[self.status]
        return [head, *(f"  {item.place}: {item.what}" for item in self.damage), *(f"  note: {n}" for n in self.notes)]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "status": self.status, "pages": self.pages, "records": self.records,
            "damage": [attrs.asdict(item) for item in self.damage], "notes": list(self.notes),
        }


class Findings:
    """What a walk has found so far; ``emit`` streams each finding as it is made."""

    def __init__(self, path: str, emit: Callable[[dict[str, Any]], None] | None) -> None:
        self.path = path
        self.emit = emit
        self.damage: list[Damage] = []
        self.notes: list[str] = []
        self.pages = 0
        self.records = 0
        self.refused: str | None = None  # why the store wasn't checked at all

    def damaged(self, place: str, what: str) -> None:
        if len(self.damage) == MAX_DAMAGE:
            self.note(f"more than {MAX_DAMAGE} findings: the rest are not listed")
        if len(self.damage) >= MAX_DAMAGE:
            return
        self.damage.append(Damage(place, what))
        if self.emit:
            self.emit({"damage": {"place": place, "what": what}})

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.emit:
            self.emit({"note": text})

    def report(self) -> VerifyReport:
        if self.refused is not None:
            status: Status = "not checked"
        else:
            status = "damaged" if self.damage else "sound"
        notes = tuple(self.notes) + ((self.refused,) if self.refused else ())
        return VerifyReport(self.path, status, tuple(self.damage), notes, self.pages, self.records)


def walk_store(path: str | os.PathLike[str], check_item: ItemCheck, *,
               emit: Callable[[dict[str, Any]], None] | None = None,
               check_engine: EngineCheck | None = None) -> VerifyReport:
    """Walk the store at ``path`` in THIS process and report what is damaged, each log item
    checked by ``check_item``, then the store as the engine reads it by ``check_engine``.

    Reading a damaged store through LMDB can crash the process that reads it; walk it in a child
    process unless this process is expendable. Never writes to the store.
    """
    directory = Path(path)
    found = Findings(str(directory), emit)
    meta = _check_files(directory, found)
    if meta is None:
        return found.report()
    writer = files.writer_holds_lock(directory)
    if writer:
        found.note("a writer holds the store: the page walk was skipped (pages move while it writes); "
                   "records were read from one consistent snapshot")
    elif not _walk_pages(directory, meta, found):
        found.note("the record walk was skipped: pages are damaged, and reading them through LMDB could crash")
        return found.report()
    _walk_records(directory, found, check_item, check_engine)
    return found.report()


def _check_files(directory: Path, found: Findings) -> files.Meta | None:
    data = files.data_path(directory)
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        size = None
    except OSError as exc:
        found.refused = f"{data} can't be read: {exc}"
        return None
    if not size:
        evidence = files.store_evidence(directory)
        if evidence is None:
            found.refused = f"no ctxrt store at {directory} (no data.mdb)" if size is None else (
                f"{directory} is not a ctxrt store ({data.name} is empty)")
            return None
        state = "missing" if size is None else "empty (0 bytes)"
        found.damaged(files.DATA_NAME, f"it is {state}, though {evidence} shows a store lives here")
        return None
    try:
        meta = files.read_meta(directory)
    except StoreCorruptError as exc:
        found.damaged(files.DATA_NAME, exc.what)
        return None
    except StoreFormatError as exc:
        found.refused = str(exc)
        return None
    except OSError as exc:
        found.refused = f"{data} can't be read: {exc}"
        return None
    if meta.is_empty:
        if files.has_marker(directory):
            found.damaged(files.DATA_NAME, f"it holds no tables, though {files.MARKER_NAME} shows a store lives here")
        else:
            found.refused = f"{directory} is not a ctxrt store (no ctxrt tables)"
        return None
    return meta


def _walk_pages(directory: Path, meta: files.Meta, found: Findings) -> bool:
    """Check every page's structure without LMDB; True if LMDB may read them (all sound, or only
    keys out of order, in leaves or branch pages)."""
    try:
        problems = files.page_problems(directory)
    except StoreCorruptError as exc:
        found.damaged(files.DATA_NAME, exc.what)
        return False
    except OSError as exc:
        found.damaged(files.DATA_NAME, f"its pages can't be read: {exc}")
        return False
    found.pages = meta.last_page + 1
    for problem in problems:
        found.damaged(f"{files.DATA_NAME} pages", problem)
    return all(_READABLE.search(problem) for problem in problems)


# -- the record walk ----------------------------------------------------------------------------


def _walk_records(directory: Path, found: Findings, check_item: ItemCheck, check_engine: EngineCheck | None) -> None:
    from .environment import close_store, open_store

    try:
        handle = open_store(directory, readonly=True)
    except StoreCorruptError as exc:
        found.damaged(Path(exc.path).name, exc.what)
        return
    except (CtxrtError, OSError) as exc:  # not a ctxrt store, or not one this user may open
        found.refused = str(exc)
        return
    try:
        _Walk(handle.engine, found, check_item).run()
        if check_engine is not None and not found.damage:
            engine_findings(handle.engine, found, check_engine)
    finally:
        close_store(handle)


class _Walk:
    def __init__(self, engine: Any, found: Findings, check_item: ItemCheck) -> None:
        self.engine = engine
        self.found = found
        self.check_item = check_item
        self.branch_ids: set[int] = set()
        self.states: dict[int, Any] = {}  # number -> StateInfo
        self.blob_refs: dict[str, str] = {}  # sha-256 -> where it was referenced first

    def table(self, txn: lmdb.Transaction[bytes], name: bytes) -> Any:
        """Every (key, value without its seal) of a table. A record whose seal doesn't match is a
        finding, and a page LMDB can't read ends the table with one."""
        cursor = txn.cursor(db=self.engine.dbs[name])
        last = None
        try:
            for key, value in cursor:
                last = bytes(key)
                self.found.records += 1
                if not seals.intact(last, value):
                    self.found.damaged(self.engine.describe_row(name, last),
                                       "fails its checksum: a bit of its key or value changed")
                    continue
                yield last, bytes(value[: -seals.SIZE])
        except lmdb.Error as exc:
            after = "its start" if last is None else f"key {last.hex()}"
            self.found.damaged(f"table {name.decode()}", f"can't be walked past {after}: {exc}")

    def run(self) -> None:
        engine = self.engine
        with engine.reader() as txn:
            next_branch, next_state = self.meta(txn)
            branches = self.branches(txn, next_branch)
            self.branch_names(txn, branches)
            self.state_rows(txn, next_state)
            self.items(txn)
            self.blobs(txn)
        self.through_engine()

    def meta(self, txn: lmdb.Transaction[bytes]) -> tuple[int | None, int | None]:
        counters: dict[bytes, int] = {}
        for key, value in self.table(txn, keys.DB_META):
            if key not in (keys.META_FORMAT, keys.META_NEXT_BRANCH, keys.META_NEXT_STATE):
                self.found.damaged("table meta", f"holds an unknown key {key!r}")
            elif len(value) != 4:
                self.found.damaged("table meta", f"{key.decode()} is {len(value)} bytes, not 4")
            else:
                counters[key] = keys.decode_u32(value)
        for key in (keys.META_NEXT_BRANCH, keys.META_NEXT_STATE):
            if key not in counters:
                self.found.damaged("table meta", f"{key.decode()} is missing")
        return counters.get(keys.META_NEXT_BRANCH), counters.get(keys.META_NEXT_STATE)

    def branches(self, txn: lmdb.Transaction[bytes], next_branch: int | None) -> dict[int, Any]:
        rows = {}
        for key, value in self.table(txn, keys.DB_BRANCHES):
            try:
                row = self.engine.decode_branch_row(key, value)
            except StoreCorruptError as exc:
                self.found.damaged(f"branch {key.hex()}", exc.what)
                continue
            rows[row.id] = row
            if next_branch is not None and row.id >= next_branch:
                self.found.damaged(f"branch {row.id}", f"its id is not below next_branch {next_branch}")
        for row in rows.values():
            for level, _ in ((row.parent, None), *row.lineage):
                if level is not None and level not in rows:
                    self.found.damaged(f"branch {row.id} ({row.name!r})", f"descends from branch {level}, which has no row")
            if row.parent is not None and (not row.lineage or row.lineage[0] != (row.parent, row.fork_sequence)):
                self.found.damaged(f"branch {row.id} ({row.name!r})", "its lineage doesn't start at its parent")
        if 1 not in rows:
            self.found.damaged("table branches", "the main branch (1) has no row")
        self.branch_ids = set(rows)
        return rows

    def branch_names(self, txn: lmdb.Transaction[bytes], rows: dict[int, Any]) -> None:
        named: set[int] = set()
        for key, value in self.table(txn, keys.DB_BRANCH_NAMES):
            place = f"branch name {key!r}"
            if len(value) != 4:
                self.found.damaged(place, f"its id is {len(value)} bytes, not 4")
                continue
            branch_id = keys.decode_u32(value)
            row = rows.get(branch_id)
            if row is None:
                self.found.damaged(place, f"names branch {branch_id}, which has no row")
            elif row.deleted or row.name.encode() != key:
                self.found.damaged(place, f"names branch {branch_id}, which is deleted or named {row.name!r}")
            named.add(branch_id)
        for row in rows.values():
            if not row.deleted and row.id not in named:
                self.found.damaged(f"branch {row.id} ({row.name!r})", "has no name entry")

    def state_rows(self, txn: lmdb.Transaction[bytes], next_state: int | None) -> None:
        for key, value in self.table(txn, keys.DB_STATES):
            try:
                info = self.engine.decode_state_row(key, value)
            except StoreCorruptError as exc:
                self.found.damaged(f"state {key!r}", exc.what)
                continue
            if info.number in self.states:
                self.found.damaged(f"state {info.name!r}", f"shares number {info.number} with {self.states[info.number].name!r}")
            if next_state is not None and info.number >= next_state:
                self.found.damaged(f"state {info.name!r}", f"its number {info.number} is not below next_state {next_state}")
            self.states[info.number] = info

    def items(self, txn: lmdb.Transaction[bytes]) -> None:
        for key, value in self.table(txn, keys.DB_ITEMS):
            if len(key) != keys.ITEM_KEY.size:
                self.found.damaged("table items", f"key {key.hex()} is {len(key)} bytes, not {keys.ITEM_KEY.size}")
                continue
            state_number, branch, ordinal, sequence = keys.decode_item_key(key)
            info = self.states.get(state_number)
            where = f"{'head' if ordinal == keys.HEAD_ORDINAL else f'item {ordinal}'} @{sequence}"
            place = f"state {info.name if info else state_number!r} branch {branch} {where}"
            if info is None or branch not in self.branch_ids:
                self.found.damaged(place, "belongs to a state or branch that has no row")
                continue
            try:
                if ordinal == keys.HEAD_ORDINAL and info.kind == "value":
                    json.loads(value)
                elif ordinal == keys.HEAD_ORDINAL:
                    self.check_head(value, place)
                elif info.kind != "log":
                    self.found.damaged(place, "an item row in a value state")
                elif len(value) < 8:
                    self.found.damaged(place, f"the row is {len(value)} bytes, shorter than its 8-byte origin")
                else:
                    origin = keys.decode_u64(value[:8])
                    if origin > sequence:
                        self.found.damaged(place, f"its origin sequence {origin} is after its own {sequence}")
                    else:
                        for sha256 in self.check_item(info.name, value[8:], origin, place):
                            self.note_blob(sha256, place)
            except Exception as exc:  # noqa: BLE001 - a checker reports whatever a record does, and goes on
                self.found.damaged(place, f"doesn't decode: {exc!r}")

    def check_head(self, value: bytes, place: str) -> None:
        check_head(value, place, self.found)

    def note_blob(self, sha256: str, place: str) -> None:
        self.blob_refs.setdefault(sha256, place)

    def blobs(self, txn: lmdb.Transaction[bytes]) -> None:
        stored = set()
        for key, value in self.table(txn, keys.DB_BLOBS):
            place = f"blob {key.hex()}"
            media_type, separator, data = value.partition(b"\x00")
            if len(key) != 32 or not separator:
                self.found.damaged(place, "the row isn't a 32-byte hash holding a media type, NUL and bytes")
            elif hashlib.sha256(data).digest() != key:
                self.found.damaged(place, f"its {len(data)} bytes don't hash to its key")
            stored.add(key.hex())
        for sha256, place in self.blob_refs.items():
            if sha256 not in stored:
                self.found.damaged(place, f"refers to blob {sha256}, which is not stored")

    def through_engine(self) -> None:
        read_through_engine(self.engine, self.found)


def engine_findings(engine: StoreEngine, found: Findings, check_engine: EngineCheck) -> None:
    """Report what ``check_engine`` finds (once the records are sound: it reads through the engine)."""
    try:
        for place, what in check_engine(engine):
            found.damaged(place, what)
    except Exception as exc:  # noqa: BLE001 - a checker reports whatever a record does, and goes on
        found.damaged("the checks through the engine", f"stopped: {exc!r}")


def check_head(value: bytes, place: str, found: Findings) -> None:
    """A log head's bytes decode to a head whose fields agree with each other."""
    head = LogHead.decode(value)
    if head.encode() != bytes(value):  # trailing bytes, or a length that fits no layout
        found.damaged(place, f"the head is {len(value)} bytes for {len(head.removed)} removed intervals")
    previous = -1
    for start, stop in head.removed:
        if not previous < start < stop <= head.next_ordinal:
            found.damaged(place, f"removed interval [{start}, {stop}) is out of order or past next ordinal "
                                 f"{head.next_ordinal}")
            break
        previous = stop
    visible = head.next_ordinal - sum(stop - start for start, stop in head.removed)
    if head.length != visible or head.rewrite_revision > head.revision:
        found.damaged(place, f"the head is inconsistent (length {head.length}, {visible} visible, "
                             f"revision {head.revision}, rewrite revision {head.rewrite_revision})")


def read_through_engine(engine: StoreEngine, found: Findings) -> None:
    """Read every log state of every live branch whole, and every value, as the runtime would."""
    try:
        branches = engine.list_branches()
        states = engine.list_states()
    except CtxrtError as exc:
        found.damaged("branch and state tables", str(exc))
        return
    for branch in branches:
        for info in states:
            place = f"state {info.name!r} on branch {branch.name!r}"
            try:
                if info.kind == "log":
                    head = engine.read_head(info.name, branch.id)
                    items = engine.read_items(info.name, branch.id, at=head.revision)
                    if len(items) != head.length:
                        found.damaged(place, f"{len(items)} items read for a head of {head.length}")
                else:
                    engine.read_value(info.name, branch.id)
            except StoreCorruptError as exc:
                found.damaged(place, exc.what)
            except Exception as exc:  # noqa: BLE001 - a checker reports whatever a record does, and goes on
                found.damaged(place, f"can't be read: {exc!r}")


# -- in a child process -------------------------------------------------------------------------


def report_from_stream(path: str, stdout: str, stderr: str, returncode: int) -> VerifyReport:
    """The report of a walk a child process streamed (``stdout``, one JSON object a line) and
    ended with ``returncode``: its own final report, or what it found before it died, and its
    death as damage."""
    damage: list[Damage] = []
    notes: list[str] = []
    final: dict[str, Any] | None = None
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "damage" in record:
            damage.append(Damage(**record["damage"]))
        elif "note" in record:
            notes.append(record["note"])
        elif "report" in record:
            final = record["report"]
    if final is not None and returncode in (0, 1, 2):
        report = final
        return VerifyReport(path, report["status"], tuple(Damage(**d) for d in report["damage"]),
                            tuple(report["notes"]), report["pages"], report["records"])
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        damage.append(Damage(files.DATA_NAME, f"reading the store killed the checking process ({name}: {last})"))
    else:
        damage.append(Damage("checker", f"the checking process failed (exit status {returncode}: {last})"))
    return VerifyReport(path, "damaged", tuple(damage), tuple(notes))
