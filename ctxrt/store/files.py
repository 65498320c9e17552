"""The store's files on disk, checked with plain reads before LMDB maps them (K7).

LMDB trusts its data file. A file shorter than its meta pages say is in use turns the first
read past the end into a SIGBUS; a root page that isn't a tree page makes a read fail or an
assertion abort the process. So an open parses the two meta pages and the root page of every
table itself, with ``os.pread``, and refuses what doesn't add up before LMDB sees the file:
``StoreCorruptError`` for a damaged ctxrt store, ``StoreFormatError`` for a file that was never
one. These checks read a handful of pages whatever the store's size. Damage deeper in a table
(a zeroed leaf page) is beyond what they can see: ``ctxrt.store.verify`` walks every page and
record, in a child process.

A store also leaves evidence that it exists: the format marker (written once its first
transaction committed) and LMDB's ``lock.mdb``. A data file that is missing or empty beside
either is a damaged store, never a new one.

Layout read here (LMDB 0.9 data version 1, 64-bit, the host's byte order; py-lmdb bundles 0.9):
a page starts with a 16-byte header ``mp_pgno u64, mp_pad u16, mp_flags u16, mp_lower u16,
mp_upper u16``. Pages 0 and 1 are meta pages holding ``MDB_meta`` at offset 16: ``mm_magic u32
(0xBEEFC0DE), mm_version u32, mm_address u64, mm_mapsize u64, mm_dbs[2]`` (the free-page table
and the main table, 48 bytes each: ``md_pad u32, md_flags u16, md_depth u16, md_branch_pages,
md_leaf_pages, md_overflow_pages, md_entries, md_root``, all u64 after the first three), then
``mm_last_pg u64, mm_txnid u64``. The committed meta is the one with the higher txnid; the page
size is the free table's ``md_pad``.

LMDB writes commit N's meta into page N % 2, so once a store has committed its meta pages hold
consecutive txnids (both are 0 only before the first commit; ``mdb_env_copy`` writes a copied
pair, a compacting one 0 and 1). Txnids further apart, or equal and not 0, mean one meta page
is damaged: LMDB would serve whichever says it is newer, perhaps an older commit, so the open
refuses the file. A reader may read the pages while a writer commits; it reads them again
before it refuses.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import attrs

from ..errors import StoreCorruptError, StoreFormatError, StorePermissionError

DATA_NAME = "data.mdb"
LMDB_LOCK_NAME = "lock.mdb"
OWNER_LOCK_NAME = "owner.lock"
MARKER_NAME = "ctxrt.format"
MARKER_TEMPORARY_NAME = MARKER_NAME + ".tmp"  # the marker as it is written, until it is renamed
STORE_FILE_NAMES = (DATA_NAME, LMDB_LOCK_NAME, OWNER_LOCK_NAME, MARKER_NAME, MARKER_TEMPORARY_NAME)  # all a store makes
MARKER_TEXT = "ctxrt store format {version}\n"

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1  # LMDB 0.9's on-disk format
PAGE_HEADER = 16
META_SIZE = 136
NO_PAGE = (1 << 64) - 1  # P_INVALID: an empty table's root
MAX_DEPTH = 32  # LMDB's cursor stack
MAX_PAGE_SIZE = 65536
META_READS = 6  # looks at a file a writer keeps changing before a finding stands

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA = 0x01, 0x02

_E = "<" if sys.byteorder == "little" else ">"
_U32 = struct.Struct(_E + "I")
_U64 = struct.Struct(_E + "Q")
_HEADER = struct.Struct(_E + "QHHHH")  # pgno, pad, flags, lower, upper
_DB = struct.Struct(_E + "IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META_HEAD = struct.Struct(_E + "IIQQ")  # magic, version, address, mapsize
_NODE = struct.Struct(_E + "HHHH")  # lo, hi, flags, key size; LMDB 0.9 swaps lo and hi on big-endian hosts


@attrs.frozen
class Table:
    """An ``MDB_db`` record: where one table's tree starts and what it holds."""

    flags: int
    depth: int
    entries: int
    root: int

    @classmethod
    def unpack(cls, data: bytes, offset: int = 0) -> Table:
        _pad, flags, depth, _branch, _leaf, _overflow, entries, root = _DB.unpack_from(data, offset)
        return cls(flags, depth, entries, root)


@attrs.frozen
class Meta:
    """The committed meta page of a data file, as LMDB would pick it."""

    page_size: int
    map_size: int
    last_page: int
    txnid: int
    free: Table
    main: Table

    @property
    def used_bytes(self) -> int:
        return (self.last_page + 1) * self.page_size

    @property
    def is_empty(self) -> bool:
        """No table was ever created: LMDB made the file, and nothing committed into it."""
        return self.main.root == NO_PAGE


class _NotLMDB(Exception):
    """The file doesn't start with an LMDB meta page (a foreign file, or a destroyed one)."""


def data_path(directory: Path) -> Path:
    return directory / DATA_NAME


def has_marker(directory: Path) -> bool:
    return (directory / MARKER_NAME).exists()


def marker_text(directory: Path) -> str | None:
    """What the format marker says, or None if it can't be read."""
    try:
        return (directory / MARKER_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def store_evidence(directory: Path) -> str | None:
    """The file that shows a store was opened here, or None: the format marker, or a lock file
    LMDB initialised (it does so in the same call that creates the data file; a lock file this
    package allocated ahead of LMDB is zeros until then)."""
    if (directory / MARKER_NAME).exists():
        return MARKER_NAME
    try:
        with open(directory / LMDB_LOCK_NAME, "rb") as lock:
            head = lock.read(4)
    except OSError:
        return None
    return LMDB_LOCK_NAME if len(head) == 4 and _U32.unpack(head)[0] == MAGIC else None


def write_marker(directory: Path, version: int) -> None:
    """Record, durably, that a ctxrt store lives here (after its first commit)."""
    target = directory / MARKER_NAME
    temporary = directory / MARKER_TEMPORARY_NAME
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, MARKER_TEXT.format(version=version).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def writer_holds_lock(directory: Path) -> bool | None:
    """Whether some process holds a writer's lock on the store (an open writer); None if this host
    can't tell.

    A writer locks ``owner.lock`` and ``data.mdb`` both; either counts, since ``owner.lock`` can be
    deleted or replaced under a running writer. Reads ``/proc/locks`` rather than trying a lock:
    even a shared ``flock`` taken for a moment would refuse a writer opening at that moment.
    """
    wanted = set()
    for name in (OWNER_LOCK_NAME, DATA_NAME):
        try:
            status = os.stat(directory / name)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        wanted.add(f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}")
    if not wanted:
        return False
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            table = locks.read()
    except OSError:
        return None
    return any("FLOCK" in fields and not wanted.isdisjoint(fields) for fields in map(str.split, table.splitlines()))


# -- reading the data file -------------------------------------------------------------------


def _read(fd: int, offset: int, length: int) -> bytes:
    return os.pread(fd, length, offset)


def _meta_at(raw: bytes, offset: int) -> tuple[int, int, Meta | None, int]:
    """(magic, version, meta or None if the magic or version is wrong, page-size field) of the
    meta page at ``offset`` in ``raw`` (the start of the file)."""
    if len(raw) < offset + PAGE_HEADER + META_SIZE:
        raise _NotLMDB("too short to hold a meta page")
    at = offset + PAGE_HEADER
    magic, version, _address, map_size = _META_HEAD.unpack_from(raw, at)
    free = Table.unpack(raw, at + _META_HEAD.size)
    page_size = _DB.unpack_from(raw, at + _META_HEAD.size)[0]
    main = Table.unpack(raw, at + _META_HEAD.size + _DB.size)
    last_page, txnid = struct.unpack_from(_E + "QQ", raw, at + _META_HEAD.size + 2 * _DB.size)
    if magic != MAGIC or version != DATA_VERSION:
        return magic, version, None, page_size
    return magic, version, Meta(page_size, map_size, last_page, txnid, free, main), page_size


T = TypeVar("T")


def read_meta(directory: Path) -> Meta:
    """Check the data file's meta pages, its size and its tables' root pages; the committed meta.

    Raises:
        StoreCorruptError: damaged meta pages (txnids not one commit apart among them), a file
            shorter than the pages in use, a root page that isn't a tree page.
        StoreFormatError: not an LMDB data file (and nothing shows a ctxrt store was here), or
            an LMDB data version this build doesn't read.
        FileNotFoundError: no data file.
        StorePermissionError: this user may not read the data file.
    """
    path = data_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError as exc:
        raise StorePermissionError(str(path), f"can't read the store's data file ({exc.strerror})", exc.errno) from None
    try:
        return _steady(directory, fd, lambda size, first, second: _check_metas(directory, fd, size, first, second))
    finally:
        os.close(fd)


def _steady(directory: Path, fd: int, look: Callable[[int, Meta, Meta], T],
            doubtful: Callable[[T], bool] | None = None) -> T:
    """``look(size, first, second)`` at the file's size and its two meta pages, once they are one
    commit apart. Damage found (txnids not one commit apart included), or a ``doubtful`` result,
    is looked at again if a writer in another process committed or grew the file meanwhile: it
    may have written a meta page during their read, reused a page the look read after them, or
    grown the file after its size was read. The same finding with no change between is the answer
    (after ``META_READS`` looks at most)."""
    for attempt in range(META_READS):
        first, second = _metas(directory, fd, os.fstat(fd).st_size)
        size = os.fstat(fd).st_size  # after the meta pages: a commit they show has grown the file by now
        seen = ((first.txnid, second.txnid), size)
        last = attempt + 1 == META_READS
        try:
            if not one_commit_apart(first.txnid, second.txnid):
                raise _corrupt(
                    directory,
                    f"meta page 0 records transaction {first.txnid} and meta page 1 transaction {second.txnid}, "
                    f"but LMDB writes them alternately, one commit apart: one meta page is damaged, so which "
                    f"commit is the last can't be told",
                )
            result = look(size, first, second)
        except (StoreCorruptError, struct.error) as exc:
            if not last and _moved(directory, fd, seen):
                continue
            if isinstance(exc, struct.error):  # a page that doesn't parse
                raise _corrupt(directory, f"a table's page can't be read: {exc}") from None
            raise
        if last or doubtful is None or not doubtful(result) or not _moved(directory, fd, seen):
            return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _moved(directory: Path, fd: int, seen: tuple[tuple[int, int], int]) -> bool:
    """Whether the meta pages' txnids or the file's size differ from ``seen``. Meta pages that
    don't read (a write seen half done, or damage the next look reports) count as a change."""
    try:
        size = os.fstat(fd).st_size
        first, second = _metas(directory, fd, size)
    except (StoreCorruptError, StoreFormatError, OSError, struct.error):
        return True
    return ((first.txnid, second.txnid), size) != seen


def _corrupt(directory: Path, what: str) -> StoreCorruptError:
    return StoreCorruptError(str(data_path(directory)), what)


def _check_metas(directory: Path, fd: int, size: int, first: Meta, second: Meta) -> Meta:
    meta = second if first.txnid < second.txnid else first
    if meta.last_page < 1:
        raise _corrupt(directory, f"the committed meta page records last page {meta.last_page}")
    if size < meta.used_bytes:
        _check_free_tail(directory, fd, size, meta)
    for name, table in (("the free-page table", meta.free), ("the main table", meta.main)):
        _check_root(directory, fd, size, meta, name, table)
    if meta.main.root != NO_PAGE:
        for name, table in _named_tables(directory, fd, meta):
            _check_root(directory, fd, size, meta, f"table {name!r}", table)
    return meta


def one_commit_apart(first: int, second: int) -> bool:
    """Whether two meta pages' txnids are ones LMDB writes: consecutive, or both 0 (no commit yet)."""
    return abs(first - second) == 1 or first == second == 0


def _metas(directory: Path, fd: int, size: int) -> tuple[Meta, Meta]:
    """The two meta pages, each checked on its own and against the other's page size.

    Both are read in one ``pread`` (as far as the largest page size reaches), so a writer
    committing in another process has the least time to write one between them.
    """
    path = data_path(directory)
    start = _read(fd, 0, MAX_PAGE_SIZE + PAGE_HEADER + META_SIZE)
    try:
        magic, version, first, page_size = _meta_at(start, 0)
        if first is None and magic != MAGIC:
            raise _NotLMDB(f"no LMDB magic number at the start (found 0x{magic:08x})")
    except _NotLMDB as exc:
        evidence = store_evidence(directory)
        if evidence is not None:
            raise _corrupt(directory, f"its first meta page is destroyed ({exc}), though {evidence} shows a "
                                      f"store lives here") from None
        raise StoreFormatError(f"{path} is not an LMDB data file, so not a ctxrt store ({exc})") from None
    if first is None:
        raise StoreFormatError(
            f"{path} is LMDB data version {version}; this build of LMDB reads version {DATA_VERSION} only"
        )
    if page_size < 512 or page_size > MAX_PAGE_SIZE or page_size & (page_size - 1):
        raise _corrupt(directory, f"meta page 0 records an impossible page size {page_size}")
    try:
        magic, version, second, _ = _meta_at(start, page_size)
    except _NotLMDB:
        raise _corrupt(directory, f"it is {size} bytes, too short to hold its second meta page") from None
    if second is None:
        raise _corrupt(directory, f"meta page 1 is damaged (magic 0x{magic:08x}, version {version})")
    if second.page_size != page_size:
        raise _corrupt(directory, f"the meta pages disagree on the page size ({page_size} vs {second.page_size})")
    return first, second


def _page(directory: Path, fd: int, size: int, meta: Meta, number: int, what: str) -> bytes:
    """Page ``number``, which must lie within the pages in use and within the file."""
    if not 2 <= number <= meta.last_page:
        raise _corrupt(directory, f"{what} points to page {number}, outside the pages in use (2..{meta.last_page})")
    offset = number * meta.page_size
    if offset + meta.page_size > size:
        raise _corrupt(directory, f"{what} is page {number}, past the end of the {size}-byte file (truncated)")
    page = _read(fd, offset, meta.page_size)
    stored, _pad, flags, lower, upper = _HEADER.unpack_from(page)
    if stored != number:
        raise _corrupt(directory, f"{what}, page {number}, is overwritten (it records page number {stored})")
    if flags & P_OVERFLOW:
        return page
    if flags & (P_BRANCH | P_LEAF) not in (P_BRANCH, P_LEAF) or not PAGE_HEADER <= lower <= upper <= meta.page_size:
        raise _corrupt(directory, f"{what}, page {number}, is not a tree page (flags 0x{flags:x})")
    return page


def _check_root(directory: Path, fd: int, size: int, meta: Meta, name: str, table: Table) -> None:
    if table.root == NO_PAGE:
        if table.entries or table.depth:
            raise _corrupt(directory, f"{name} has no root page but records {table.entries} entries")
        return
    if not 1 <= table.depth <= MAX_DEPTH:
        raise _corrupt(directory, f"{name} records an impossible depth {table.depth}")
    page = _page(directory, fd, size, meta, table.root, f"the root of {name}")
    is_leaf = _HEADER.unpack_from(page)[2] & P_LEAF
    if bool(is_leaf) != (table.depth == 1):
        raise _corrupt(directory, f"the root of {name}, page {table.root}, doesn't match the table's depth {table.depth}")


def _node(page: bytes, offset: int) -> tuple[int, int, int]:
    """A node's (low 32 bits of its size or child page, flags, key size)."""
    first, second, flags, key_size = _NODE.unpack_from(page, offset)
    low, high = (first, second) if _E == "<" else (second, first)
    return low | high << 16, flags, key_size


def _nodes(directory: Path, page: bytes, page_size: int, what: str) -> Iterator[int]:
    """The offsets of a tree page's nodes, each checked to lie within the page."""
    lower, upper = _HEADER.unpack_from(page)[3:5]
    count = (lower - PAGE_HEADER) // 2
    for pointer in struct.unpack_from(f"{_E}{count}H", page, PAGE_HEADER):
        if not upper <= pointer <= page_size - _NODE.size:
            raise _corrupt(directory, f"{what} holds a node outside the page (offset {pointer})")
        yield pointer


def _main_entries(directory: Path, fd: int, meta: Meta) -> Iterator[tuple[bytes, Table | None]]:
    """The main table's entries, (key, the named table it describes or None for a plain value),
    if it is one leaf page (a ctxrt store's always is: a handful of table names)."""
    if meta.main.root == NO_PAGE or meta.main.depth != 1:
        return
    page = _read(fd, meta.main.root * meta.page_size, meta.page_size)
    for pointer in _nodes(directory, page, meta.page_size, "the main table's root"):
        data_size, flags, key_size = _node(page, pointer)
        key_at = pointer + _NODE.size
        if key_at + key_size > meta.page_size:
            raise _corrupt(directory, f"the main table's entry at offset {pointer} runs off its page")
        key = page[key_at : key_at + key_size]
        if not flags & F_SUBDATA:
            yield key, None
            continue
        if key_at + key_size + _DB.size > meta.page_size or data_size != _DB.size:
            raise _corrupt(directory, f"the main table's entry at offset {pointer} runs off its page")
        yield key, Table.unpack(page, key_at + key_size)


def _named_tables(directory: Path, fd: int, meta: Meta) -> Iterator[tuple[str, Table]]:
    for key, table in _main_entries(directory, fd, meta):
        if table is not None:
            yield key.decode("utf-8", "backslashreplace"), table


@attrs.frozen
class RecordPlace:
    """Where one record of a named table lies in the data file: its key's first byte, and its
    value's (in the value's overflow pages if it has them)."""

    table: bytes
    key: bytes
    key_at: int
    value_at: int
    value_size: int


def record_places(directory: Path) -> Iterator[RecordPlace]:
    """Where each record of each named table lies in the data file, in key order, walked from the
    committed meta page with plain reads (what a test flips bits in). The store must be sound, and
    no writer may hold it (its pages move)."""
    for page in tree_pages(directory):
        if page.branch:
            continue
        for _index, pointer, data_size, flags, key in page.nodes:
            key_at = pointer + _NODE.size
            if flags & F_BIGDATA:
                value_at = _U64.unpack_from(page.data, key_at + len(key))[0] * page.size + PAGE_HEADER
            else:
                value_at = page.offset + key_at + len(key)
            yield RecordPlace(page.table, key, page.offset + key_at, value_at, data_size)


@attrs.frozen
class Separator:
    """A key of a branch page (not its first, which LMDB never compares): no record, so no seal
    covers it; where it lies in the data file. What a test flips bits in."""

    table: bytes
    page: int
    node: int
    key: bytes
    key_at: int


def separators(directory: Path) -> Iterator[Separator]:
    """Every separator key of every named table's branch pages, walked like ``record_places`` (a
    sound store no writer holds)."""
    for page in tree_pages(directory):
        if page.branch:
            for index, pointer, _child, _flags, key in page.nodes[1:]:
                yield Separator(page.table, page.number, index, key, page.offset + pointer + _NODE.size)


@attrs.frozen
class TreePage:
    """One page of a named table's B-tree as a walk from its root reaches it. Every key below it
    must lie in ``[low, high)`` (None: unbounded), the range its parents' separators give it."""

    table: bytes
    number: int
    size: int  # the page size
    data: bytes
    branch: bool
    nodes: tuple[tuple[int, int, int, int, bytes], ...]  # (index, offset in page, size or child, flags, key)
    low: bytes | None
    high: bytes | None
    parent: tuple[int, int] | None  # (branch page, node) that leads here; None for a root

    @property
    def offset(self) -> int:
        return self.number * self.size


def tree_pages(directory: Path) -> Iterator[TreePage]:
    """Every tree page of every named table, parents before children, read with plain reads from the
    committed meta page. ``StoreCorruptError`` for a page that isn't a tree page, a loop or a tree
    too deep; a caller walks a store whose structure is checked already (or one it made)."""
    fd = os.open(data_path(directory), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        meta = _check_metas(directory, fd, size, *_metas(directory, fd, size))
        tables = [(name, table) for name, table in _main_entries(directory, fd, meta) if table is not None]
        seen: set[int] = set()
        for name, table in tables:
            if table.root == NO_PAGE:
                continue
            stack: list[tuple[int, int, bytes | None, bytes | None, tuple[int, int] | None]] = [
                (table.root, 1, None, None, None)]
            while stack:
                number, depth, low, high, parent = stack.pop()
                if number in seen or depth > MAX_DEPTH:
                    raise _corrupt(directory, f"table {name!r} loops or runs too deep at page {number}")
                seen.add(number)
                data = _page(directory, fd, size, meta, number, f"a page of table {name!r}")
                nodes = tuple(_keyed_nodes(directory, data, meta.page_size, number))
                page = TreePage(name, number, meta.page_size, data, bool(_HEADER.unpack_from(data)[2] & P_BRANCH),
                                nodes, low, high, parent)
                yield page
                if page.branch:  # children last first, so the walk yields them in key order
                    bounds = [low, *(key for _, _, _, _, key in nodes[1:]), high]
                    for index, _, child, flags, _ in reversed(nodes):
                        stack.append((child | flags << 32, depth + 1, bounds[index], bounds[index + 1], (number, index)))
    finally:
        os.close(fd)


def _keyed_nodes(directory: Path, page: bytes, page_size: int, number: int) -> Iterator[tuple[int, int, int, int, bytes]]:
    for index, pointer in enumerate(_nodes(directory, page, page_size, f"page {number}")):
        data_size, flags, key_size = _node(page, pointer)
        key_at = pointer + _NODE.size
        if key_at + key_size > page_size:
            raise _corrupt(directory, f"page {number} holds a key that runs off the page (node {index})")
        yield index, pointer, data_size, flags, page[key_at : key_at + key_size]


def separator_problems(directory: Path) -> list[str]:
    """Where a named table's branch pages would send a search astray: a separator out of order or
    outside the range its parents give its page, or a leaf key outside its page's range. A
    separator is no record (no seal covers it), and a changed one sends a lookup into a
    neighbouring leaf whose rows are all sound. The structure must be sound (``page_problems``)."""
    problems = []
    for page in tree_pages(directory):
        where = f"table {page.table.decode('utf-8', 'backslashreplace')}: {'branch' if page.branch else 'leaf'} page {page.number}"
        page_keys = [key for _, _, _, _, key in page.nodes[1 if page.branch else 0 :]]
        for index, key in enumerate(page_keys, 1 if page.branch else 0):
            if page.low is not None and key < page.low or page.high is not None and key >= page.high:
                shown = f"[{page.low.hex() if page.low is not None else '-'}, {page.high.hex() if page.high is not None else '-'})"
                node, parent = page.parent or (None, None)  # bounds come from a parent: a root has none
                problems.append(f"{where} {'separator' if page.branch else 'key'} {index} ({key.hex()}) lies outside "
                                f"{shown}, the range node {parent} of branch page {node} and the separators above "
                                f"it give the page")
            elif page.branch and index > 1 and key <= page_keys[index - 2]:
                problems.append(f"{where} separator {index} ({key.hex()}) is not above the one before it")
    return problems


def foreign_entries(directory: Path, tables: Collection[bytes]) -> list[bytes]:
    """The main table's keys that aren't among ``tables`` (or are plain values), read from the file.

    Empty when the data file is missing, unreadable or damaged (the checks made under the owner
    lock say so), or holds only ``tables``. Lets an open refuse someone else's environment
    before it creates or extends a single file beside it.
    """
    try:
        fd = os.open(data_path(directory), os.O_RDONLY)
    except OSError:
        return []
    def look(size: int, first: Meta, second: Meta) -> list[bytes]:
        meta = _check_metas(directory, fd, size, first, second)
        if meta.main.root != NO_PAGE and meta.main.depth != 1:
            return [b"... (more entries than a ctxrt store's few tables)"]
        return [key for key, table in _main_entries(directory, fd, meta) if table is None or key not in tables]

    try:
        # A sound store read while its writer commits can show someone else's keys: look again then.
        return _steady(directory, fd, look, doubtful=bool)
    except (OSError, StoreCorruptError, StoreFormatError, struct.error):
        return []
    finally:
        os.close(fd)


def foreign_message(directory: Path | str, names: Sequence[bytes]) -> str:
    shown = ", ".join(repr(name) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"{directory} is not a ctxrt store: it is another LMDB environment, whose main table holds {shown}; "
            f"nothing was written to it")


def _check_free_tail(directory: Path, fd: int, size: int, meta: Meta) -> None:
    """A file shorter than the pages in use is sound only if every missing page is a free page.

    LMDB doesn't write a page it allocated and freed again in one transaction, so the newest
    pages can be absent from the file while its free-page table lists them. Any other missing
    page is one LMDB would read past the end of the file.
    """
    whole = size // meta.page_size
    missing = range(whole, meta.last_page + 1)
    try:
        free = _free_pages(directory, fd, size, meta)
    except StoreCorruptError:
        free = set()
    if any(page not in free for page in missing):
        raise _corrupt(
            directory,
            f"it is {size} bytes, but its meta page says pages up to {meta.last_page} are in use "
            f"({meta.used_bytes} bytes of {meta.page_size}-byte pages): truncated",
        )


def _free_pages(directory: Path, fd: int, size: int, meta: Meta) -> set[int]:
    """Every page number the free-page table lists (a tree keyed by txnid of page-number lists)."""
    free: set[int] = set()
    if meta.free.root == NO_PAGE:
        return free
    seen: set[int] = set()
    stack = [(meta.free.root, 1)]
    while stack:
        number, depth = stack.pop()
        if number in seen or depth > MAX_DEPTH:
            raise _corrupt(directory, f"the free-page table loops or runs too deep at page {number}")
        seen.add(number)
        page = _page(directory, fd, size, meta, number, "a page of the free-page table")
        flags = _HEADER.unpack_from(page)[2]
        for pointer in _nodes(directory, page, meta.page_size, f"free-page table page {number}"):
            data_size, node_flags, key_size = _node(page, pointer)
            if flags & P_BRANCH:
                stack.append((data_size | node_flags << 32, depth + 1))  # a branch node's child page
                continue
            data_at = pointer + _NODE.size + key_size
            if node_flags & F_BIGDATA:
                first = _U64.unpack_from(page, data_at)[0]
                overflow = _page(directory, fd, size, meta, first, "a free-page list")
                pages = -(-(PAGE_HEADER + data_size) // meta.page_size)
                data = overflow[PAGE_HEADER:] + _read(fd, (first + 1) * meta.page_size, (pages - 1) * meta.page_size)
            else:
                data = page[data_at : data_at + data_size]
            if len(data) < 8:
                raise _corrupt(directory, f"a free-page list in page {number} is cut short")
            count = _U64.unpack_from(data)[0]
            if 8 + count * 8 > len(data):
                raise _corrupt(directory, f"a free-page list in page {number} claims {count} pages it doesn't hold")
            free.update(struct.unpack_from(f"{_E}{count}Q", data, 8))
    return free


def page_problems(directory: Path) -> list[str]:
    """Every structural problem of the data file's pages, walked with plain reads by py-lmdb's
    pure-Python walker (it never maps the file, so damage can't crash this process), then, if
    there are none, every branch page's separators against the keys below them
    (``separator_problems``). About 10 ms per MB. Raises ``StoreCorruptError`` when the pages
    can't be walked at all, ``OSError`` when the file can't be read."""
    from lmdb import verify as structural

    try:
        problems = list(structural.verify(str(directory), subdir=True))
    except structural.VerifyError as exc:
        raise StoreCorruptError(str(directory / DATA_NAME), f"its pages can't be walked: {exc}") from None
    if problems:
        return problems  # a tree whose shape is damaged: its separators can't be told apart from it
    return separator_problems(directory)


def check_pages(directory: Path) -> None:
    """Refuse a store whose pages are damaged (``StoreCorruptError``), before LMDB reads them.

    Skipped while a writer holds the store: its pages move under a walk, and it is reading them
    soundly. A store not yet made has nothing to check."""
    if not (directory / DATA_NAME).exists() or writer_holds_lock(directory):
        return
    refuse_damaged_pages(directory)


def refuse_damaged_pages(directory: Path) -> None:
    """Walk every page of a store no other process writes; ``StoreCorruptError`` if one is damaged."""
    problems = page_problems(directory)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise StoreCorruptError(str(directory / DATA_NAME), "; ".join(problems[:3]) + more)
