"""Opening a store: the file checks, the LMDB environment, the owner lock, the process registry.

LMDB forbids opening one environment twice in a process (closing either copy drops the other's
locks), so every runtime in this process on the same real path shares one ``Environment`` and
one ``Engine``; the last to close closes it. The exclusive ``flock`` on ``owner.lock`` inside
the store's directory is what refuses a second writing runtime, in this process or another.
Open order doesn't matter: a writer joining read-only runtimes of this process reopens their
shared environment writable, and when it leaves they keep reading.

Before LMDB maps a data file, ``files.read_meta`` checks it (K7): a truncated, emptied or
overwritten file, or a foreign one, is refused with ``StoreCorruptError`` or
``StoreFormatError``, by writers and read-only runtimes alike, and nothing is written to it
(someone else's environment is recognised from its file before any file is made beside it).
A read-only open that meets a store a writer is still creating (its owner lock held, its
first transaction not yet committed) waits for it, up to ``FIRST_OPEN_WAIT_S``.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Literal

import attrs
import lmdb

from ..errors import (
    StoreCorruptError,
    StoreFormatError,
    StoreFullError,
    StoreLockedError,
    StorePermissionError,
)
from . import files, keys
from .engine import FORMAT_VERSION, Engine
from .interface import StoreEngine
from .urls import driver_missing, is_postgres_url

LOCK_NAME = files.OWNER_LOCK_NAME
FIRST_OPEN_WAIT_S = 5.0
MAX_READERS = 512
# LMDB 0.9 (64-bit) sizes lock.mdb as one MDB_txninfo (192 bytes) plus a 64-byte MDB_reader per
# reader after the first, and maps it shared. A write through that map into a hole of a sparse
# file on a full disk is a SIGBUS, so every open allocates the file's blocks first.
LOCK_FILE_BYTES = 192 + (MAX_READERS - 1) * 64
Durability = Literal["sync", "os"]

logger = logging.getLogger("ctxrt.store")

_PERMISSION_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
# What a writer keeps in owner.lock: open while it has the store open (_take_owner_lock).
_OPEN_MARK, _CLOSED_MARK = b"open  \n", b"closed\n"
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


@attrs.define(eq=False)
class _Shared:
    env: lmdb.Environment
    engine: Engine
    writable: bool  # the environment was opened for writing (a writer of this process opened it)
    durability: Durability
    users: int = 0


@attrs.define(eq=False)
class StoreHandle:
    """One runtime's hold on a store: the shared engine, plus the owner lock if it writes."""

    path: Path | str  # a directory, or a database URL without its password
    engine: StoreEngine
    readonly: bool
    durability: Durability
    _key: str
    _lock_fd: int | None
    _data_fd: int | None = None  # a writer's lock on data.mdb itself (see _lock_data)
    closed: bool = False


_REGISTRY: dict[str, _Shared] = {}


def open_environments() -> list[str]:
    """The LMDB environments this process holds open (their directories' keys), for a check that
    every open was closed: a failed or closed open leaves none behind."""
    return sorted(_REGISTRY)


def open_store(
    path: str | os.PathLike[str], *, readonly: bool = False, durability: Durability = "sync", map_size: int = 1 << 36
) -> StoreHandle:
    """Open (creating unless ``readonly``) the store at ``path``.

    Raises:
        StoreLockedError: another runtime (in any process) writes this store.
        StoreFormatError: the path is not a ctxrt store (a foreign LMDB environment included),
            or records a format this version can't read.
        StoreCorruptError: the store's files are damaged (truncated, emptied, overwritten).
        StorePermissionError: this user may not open the store as asked (a writer on a store
            it may only read, a read-only runtime that can't use LMDB's lock file).
        StoreFullError: the disk has no room for LMDB's files.
        FileNotFoundError: ``readonly`` and nothing is there.
        ValueError: an unknown ``durability``.
        StoreUnavailableError: a ``postgresql://`` store's server refused the connection, or has
            no such database (named by its URL, never with its password).
    """
    if durability not in ("sync", "os"):
        raise ValueError(f"durability must be 'sync' or 'os', not {durability!r}")
    if is_postgres_url(path):
        return _open_postgres(str(path), readonly, durability)
    directory = Path(path)
    if readonly:
        return _open_reader(directory, durability, map_size)
    return _open_writer(directory, durability, map_size)


def close_store(handle: StoreHandle) -> None:
    """Release ``handle``; the last user of the environment syncs and closes it. Idempotent."""
    if handle.closed:
        return
    handle.closed = True
    if not isinstance(handle.engine, Engine):  # PostgreSQL: its own connections; every acknowledged write committed
        handle.engine.close()
        return
    shared = _REGISTRY[handle._key]
    shared.users -= 1
    if not handle.readonly and shared.engine.stop_writer is not None:  # the writer's own, never a reader's
        shared.engine.stop_writer()
        shared.engine.stop_writer = None
    try:
        if not handle.readonly:
            try:
                shared.env.sync(True)
            except lmdb.Error as exc:  # a full or failing disk: every acknowledged write was already durable
                logger.warning("flushing %s at close failed: %s", handle.path, exc)
            else:
                assert handle._lock_fd is not None  # a writer holds the owner lock
                _clear_open_mark(handle._lock_fd)
            if shared.users > 0:
                shared.engine.become_reader()  # another process may write it now
        if shared.users == 0:
            del _REGISTRY[handle._key]
            shared.env.close()
    finally:
        for fd in (handle._lock_fd, handle._data_fd):
            if fd is not None:
                os.close(fd)


def _open_postgres(url: str, readonly: bool, durability: Durability) -> StoreHandle:
    """A store in a PostgreSQL database: each runtime has its own engine and connections, and
    any number of processes write it (no owner lock: the database orders the writers)."""
    try:
        from .postgres import (
            PostgresEngine,  # psycopg is an optional dependency (ctxrt[postgres])
        )
    except ImportError as exc:
        raise driver_missing(exc) from None
    engine = PostgresEngine(url, synchronous=durability == "sync", create=not readonly)
    return StoreHandle(engine.data_path, engine, readonly, durability, engine.data_path, None)


# -- writers ------------------------------------------------------------------------------------


def _refuse_foreign(directory: Path) -> None:
    """Someone else's LMDB environment is refused before a file is created or extended beside it."""
    foreign = files.foreign_entries(directory, keys.ALL_DBS)
    if foreign:
        raise StoreFormatError(files.foreign_message(directory, foreign))


def _open_writer(directory: Path, durability: Durability, map_size: int) -> StoreHandle:
    _refuse_foreign(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _PERMISSION_ERRNOS:
            raise StorePermissionError(str(directory), f"can't create the store's directory ({exc.strerror})",
                                       exc.errno) from None
        raise
    lock_fd, left_open = _take_owner_lock(directory, durability)
    data_fd: int | None = None
    try:
        data_fd = _lock_data(directory)  # None for a store not made yet: taken once LMDB made it
        key = os.path.realpath(directory)
        shared = _REGISTRY.get(key)
        if shared is None:
            new = _check_files_for_writer(directory)
            if left_open and not new:
                _walk_pages_left_open(directory)
            created = {name for name in (files.DATA_NAME, files.LMDB_LOCK_NAME) if not (directory / name).exists()}
            try:
                env = _open_env(directory, readonly=False, durability=durability, map_size=map_size)
                try:
                    engine = Engine(env, readonly=False)
                except BaseException:
                    env.close()
                    raise
            except BaseException:
                if new:
                    _undo_first_open(directory, created)
                raise
            shared = _Shared(env, engine, writable=True, durability=durability)
            _REGISTRY[key] = shared
        elif not shared.writable or shared.durability != durability:
            if left_open:
                _walk_pages_left_open(directory)
            _reopen_for_writer(shared, directory, durability, map_size)
        else:
            shared.engine.become_writer(shared.env)
        shared.users += 1
        if data_fd is None:  # a store this open made: another writer made it too, only in a race
            try:
                data_fd = _lock_data(directory)
            except BaseException:
                shared.users -= 1
                if shared.users == 0:
                    del _REGISTRY[key]
                    shared.env.close()
                raise
    except BaseException:
        if not left_open:  # the store is as this open found it: closed cleanly
            _clear_open_mark(lock_fd)
        os.close(lock_fd)
        if data_fd is not None:
            os.close(data_fd)
        raise
    if files.marker_text(directory) != files.MARKER_TEXT.format(version=FORMAT_VERSION):
        try:
            files.write_marker(directory, FORMAT_VERSION)
        except OSError as exc:  # the store works without it; it only helps tell damage from a new store
            logger.warning("couldn't write the format marker in %s: %s", directory, exc)
    return StoreHandle(directory, shared.engine, False, durability, key, lock_fd, data_fd)


def _lock_data(directory: Path) -> int | None:
    """Lock ``data.mdb`` itself for this writer (None if it doesn't exist yet).

    The owner lock's file can be deleted while its writer runs (an operator clearing a "stale"
    lock after a crash), and a second writer would then lock a new file of that name and write
    beside the first, losing acknowledged writes; the data file can't be replaced under a live
    writer, so its lock holds. A flock, not LMDB's own POSIX locks, which closing any descriptor
    of the file would drop."""
    path = directory / files.DATA_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise StorePermissionError(str(path), f"can't read the store's data file to lock it for writing "
                                              f"({exc.strerror})", exc.errno) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(str(directory / LOCK_NAME), f"another runtime writes {path}; its owner lock "
                                                           f"was deleted or replaced under it") from None
    return fd


def _take_owner_lock(directory: Path, durability: Durability) -> tuple[int, bool]:
    """Take the owner lock; its descriptor, and whether the store's last writer left it open.

    A writer marks the lock file while it has the store open and clears the mark when it closes
    the store cleanly: a mark found here was left by a writer that died (killed, crashed, aborted
    on a damaged page) or lost its machine, or by a copy of the store taken while its writer ran.
    Under durability "os" the mark is forced to disk before the writer can commit: LMDB's
    unflushed pages are what a power loss can leave damaged. Under "sync" a power loss leaves
    LMDB's file sound, so the mark needn't outlive one (a process's death keeps it anyway).
    """
    lock_path = directory / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno in _PERMISSION_ERRNOS:
            raise StorePermissionError(
                str(lock_path), f"can't open the owner lock to write the store ({exc.strerror}); "
                f"readonly=True may still read it", exc.errno,
            ) from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(str(lock_path)) from None
    try:
        left_open = os.pread(fd, len(_OPEN_MARK), 0) == _OPEN_MARK
        # In place, the same length each time: once written, the mark needs no new disk block.
        os.pwrite(fd, _OPEN_MARK, 0)
        if durability == "os":
            os.fsync(fd)
    except OSError as exc:  # a full or failing disk: the store opens, as it would without the mark
        logger.warning("couldn't mark %s open in its owner lock: %s", directory, exc)
    return fd, left_open


def _clear_open_mark(lock_fd: int) -> None:
    """Say the store was left closed (not forced to disk: a mark that outlives a crash costs only a walk)."""
    try:
        os.pwrite(lock_fd, _CLOSED_MARK, 0)
    except OSError as exc:
        logger.warning("couldn't clear the owner lock's open mark: %s", exc)


def _walk_pages_left_open(directory: Path) -> None:
    """A store its last writer left open may hold pages a crash or a power loss damaged, which
    LMDB would trust: walk every page first, and refuse it (``StoreCorruptError``) if one is."""
    logger.warning("%s: its last writer didn't close it; checking every page before opening it", directory)
    files.refuse_damaged_pages(directory)


def _check_files_for_writer(directory: Path) -> bool:
    """Refuse a damaged or foreign data file before LMDB maps (or recreates) it; True for a new store."""
    data = files.data_path(directory)
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        size = None
    if not size:  # missing or empty: a new store, unless something shows one lived here
        evidence = files.store_evidence(directory)
        if evidence is not None:
            state = "missing" if size is None else "empty (0 bytes)"
            raise StoreCorruptError(
                str(data), f"it is {state}, though {evidence} shows a store lives here; refusing to start "
                f"a new store over it (move the directory aside to start afresh)"
            )
        return True
    meta = files.read_meta(directory)
    if meta.is_empty and files.has_marker(directory):
        raise StoreCorruptError(str(data), f"it holds no tables, though {files.MARKER_NAME} shows a store lives here")
    return meta.is_empty


def _undo_first_open(directory: Path, created: set[str]) -> None:
    """A first open failed (a full disk, say): remove the empty files it made, which would
    otherwise look like the remains of a store and refuse the next open."""
    data = files.data_path(directory)
    try:
        if files.DATA_NAME in created and data.exists() and data.stat().st_size == 0:
            data.unlink()
        if files.LMDB_LOCK_NAME in created and not data.exists():
            (directory / files.LMDB_LOCK_NAME).unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("couldn't remove what a failed first open of %s left: %s", directory, exc)


def _reopen_for_writer(shared: _Shared, directory: Path, durability: Durability, map_size: int) -> None:
    """Reopen the environment read-only runtimes of this process share, for this writer.

    Nothing holds a transaction across an ``await``, so at this (synchronous) moment none is
    open; closing invalidates only handles the engine reopens.
    """
    shared.env.close()
    try:
        env = _open_env(directory, readonly=False, durability=durability, map_size=map_size)
        shared.engine.become_writer(env)
    except BaseException:
        # Give the read-only runtimes their environment back.
        shared.env = _open_env(directory, readonly=not shared.writable, durability=shared.durability,
                               map_size=map_size)
        shared.engine.env = shared.env
        shared.engine.dbs = {name: shared.env.open_db(name, create=False) for name in keys.ALL_DBS}
        shared.engine.become_reader()
        raise
    shared.env = env
    shared.writable = True
    shared.durability = durability


# -- read-only runtimes -------------------------------------------------------------------------


def _open_reader(directory: Path, durability: Durability, map_size: int) -> StoreHandle:
    key = os.path.realpath(directory)
    shared = _REGISTRY.get(key)
    if shared is None:
        env, engine = _open_reader_waiting(directory, durability, map_size)
        shared = _Shared(env, engine, writable=False, durability=durability)
        _REGISTRY[key] = shared
    else:
        shared.engine.reload()
    shared.users += 1
    return StoreHandle(directory, shared.engine, True, durability, key, None)


def _open_reader_waiting(directory: Path, durability: Durability, map_size: int) -> tuple[lmdb.Environment, Engine]:
    """Open read-only; while a writer holds the lock of a store it hasn't finished creating, wait."""
    deadline = time.monotonic() + FIRST_OPEN_WAIT_S
    delay = 0.005
    while True:
        established = files.has_marker(directory)
        try:
            return _open_reader_once(directory, durability, map_size)
        except (FileNotFoundError, StoreFormatError, StoreCorruptError):
            # A store that had committed its first transaction before this attempt looked has its
            # marker: its errors are real. One that got it during the attempt is worth a retry.
            if established or time.monotonic() >= deadline:
                raise
            writing = files.writer_holds_lock(directory)
            if files.has_marker(directory):  # looked at after the lock: a writer that let go had written it
                continue
            if writing is False:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _open_reader_once(directory: Path, durability: Durability, map_size: int) -> tuple[lmdb.Environment, Engine]:
    data = files.data_path(directory)
    try:
        size = data.stat().st_size
    except FileNotFoundError:
        size = None
    if not size:
        evidence = files.store_evidence(directory)
        state = "missing" if size is None else "empty (0 bytes)"
        if evidence is not None:
            raise StoreCorruptError(str(data), f"it is {state}, though {evidence} shows a store lives here")
        if size is None:
            raise FileNotFoundError(f"no ctxrt store at {directory} (no data.mdb)")
        raise StoreFormatError(f"{directory} is not a ctxrt store ({data.name} is empty)")
    meta = files.read_meta(directory)
    if meta.is_empty:
        if files.has_marker(directory):
            raise StoreCorruptError(str(data), f"it holds no tables, though {files.MARKER_NAME} shows a store lives here")
        raise StoreFormatError(f"{directory} is not a ctxrt store (no ctxrt tables)")
    _refuse_foreign(directory)
    env = _open_env(directory, readonly=True, durability=durability, map_size=map_size)
    try:
        engine = Engine(env, readonly=True)
    except BaseException:
        env.close()
        raise
    return env, engine


# -- the LMDB environment -----------------------------------------------------------------------


def _allocate_lock_file(directory: Path) -> None:
    """Give LMDB's lock file real blocks before LMDB maps it (a hole written through a map on a
    full disk is a SIGBUS). Where it can't be opened for writing, LMDB says why itself."""
    path = directory / files.LMDB_LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, max(os.fstat(fd).st_size, LOCK_FILE_BYTES))
    except OSError as exc:
        if exc.errno in _SPACE_ERRNOS:
            raise StoreFullError(str(path), f"the disk has no room for LMDB's lock file ({exc.strerror})") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


def _open_env(directory: Path, *, readonly: bool, durability: Durability, map_size: int) -> lmdb.Environment:
    _allocate_lock_file(directory)
    try:
        return lmdb.open(
            str(directory),
            map_size=map_size,
            max_dbs=len(keys.ALL_DBS) + 2,
            readonly=readonly,
            sync=durability == "sync",
            metasync=True,
            writemap=False,
            max_readers=MAX_READERS,
            subdir=True,
        )
    except (lmdb.InvalidError, lmdb.VersionMismatchError) as exc:  # files.read_meta checks first; LMDB agrees
        evidence = files.store_evidence(directory)
        if evidence is not None and isinstance(exc, lmdb.InvalidError):
            raise StoreCorruptError(str(files.data_path(directory)), f"LMDB refuses it: {exc}") from None
        raise StoreFormatError(f"{directory} is not a ctxrt store LMDB can read: {exc}") from None
    except lmdb.Error as exc:
        code = getattr(exc, "code", 0)
        if code in _PERMISSION_ERRNOS:
            raise _permission_refusal(directory, readonly, code) from None
        if code in _SPACE_ERRNOS:
            raise StoreFullError(str(files.data_path(directory)), f"the disk can't take LMDB's files "
                                 f"({os.strerror(code)})") from None
        raise


def _permission_refusal(directory: Path, readonly: bool, code: int) -> StorePermissionError:
    """Name the file LMDB couldn't open: it needs the data file (read, or read-write to write)
    and its lock file (read-write, which a read-only runtime needs too, except on a read-only
    filesystem)."""
    reason = os.strerror(code)
    wanted = ((files.LMDB_LOCK_NAME, os.O_RDWR), (files.DATA_NAME, os.O_RDONLY if readonly else os.O_RDWR))
    for name, flags in wanted:
        path = directory / name
        try:
            os.close(os.open(path, flags | (os.O_CREAT if name == files.LMDB_LOCK_NAME else 0), 0o644))
        except OSError as exc:
            reason = exc.strerror or reason
            if readonly:
                hint = "a read-only runtime needs to write LMDB's lock file (its reader table)"
            else:
                hint = "a writer needs to write the store's files; readonly=True may still read it"
            return StorePermissionError(str(path), f"can't open it ({reason}): {hint}", code)
    mode = "read" if readonly else "write"
    return StorePermissionError(str(directory), f"LMDB can't open the store to {mode} it ({reason})", code)
