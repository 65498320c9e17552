"""Opening a store: the LMDB environment, the owner lock, and the process-wide registry.

LMDB forbids opening one environment twice in a process (closing either copy drops the other's
locks), so every runtime in this process on the same real path shares one ``Environment`` and
one ``Engine``; the last to close closes it. The exclusive ``flock`` on ``owner.lock`` inside
the store's directory is what refuses a second writing runtime, in this process or another.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Literal

import attrs
import lmdb

from ..errors import StoreFormatError, StoreLockedError
from . import keys
from .engine import Engine

LOCK_NAME = "owner.lock"
Durability = Literal["sync", "os"]


@attrs.define(eq=False)
class _Shared:
    env: lmdb.Environment
    engine: Engine
    readonly_env: bool
    users: int = 0


@attrs.define(eq=False)
class StoreHandle:
    """One runtime's hold on a store: the shared engine, plus the owner lock if it writes."""

    path: Path
    engine: Engine
    readonly: bool
    durability: Durability
    _key: str
    _lock_fd: int | None
    closed: bool = False


_REGISTRY: dict[str, _Shared] = {}


def _take_owner_lock(directory: Path) -> int:
    lock_path = directory / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(str(lock_path)) from None
    return fd


def open_store(
    path: str | os.PathLike[str], *, readonly: bool = False, durability: Durability = "sync", map_size: int = 1 << 36
) -> StoreHandle:
    """Open (creating unless ``readonly``) the store at ``path``.

    Raises:
        StoreLockedError: another runtime (in any process) writes this store.
        StoreFormatError: the path is not a ctxrt store, or records a format this version can't read.
        FileNotFoundError: ``readonly`` and nothing is there.
        ValueError: an unknown ``durability``.
    """
    if durability not in ("sync", "os"):
        raise ValueError(f"durability must be 'sync' or 'os', not {durability!r}")
    directory = Path(path)
    if readonly:
        if not (directory / "data.mdb").exists():
            raise FileNotFoundError(f"no ctxrt store at {directory} (no data.mdb)")
    else:
        directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    lock_fd = None if readonly else _take_owner_lock(directory)
    try:
        shared = _REGISTRY.get(key)
        if shared is not None and shared.readonly_env and not readonly:
            raise StoreLockedError(
                str(directory / LOCK_NAME),
                "a read-only runtime in this process opened the store first; open the writer before readers",
            )
        if shared is None:
            env = lmdb.open(
                str(directory),
                map_size=map_size,
                max_dbs=len(keys.ALL_DBS) + 2,
                readonly=readonly,
                sync=durability == "sync",
                metasync=True,
                writemap=False,
                max_readers=512,
                subdir=True,
            )
            try:
                engine = Engine(env, readonly=readonly)
            except BaseException:
                env.close()
                raise
            shared = _Shared(env, engine, readonly_env=readonly)
            _REGISTRY[key] = shared
        shared.users += 1
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    if readonly:
        shared.engine.reload()
    return StoreHandle(directory, shared.engine, readonly, durability, key, lock_fd)


def close_store(handle: StoreHandle) -> None:
    """Release ``handle``; the last user of the environment syncs and closes it. Idempotent."""
    if handle.closed:
        return
    handle.closed = True
    shared = _REGISTRY[handle._key]
    shared.users -= 1
    try:
        if not handle.readonly:
            shared.env.sync(True)
        if shared.users == 0:
            del _REGISTRY[handle._key]
            shared.env.close()
    finally:
        if handle._lock_fd is not None:
            os.close(handle._lock_fd)

