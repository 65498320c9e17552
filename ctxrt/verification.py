"""Verify a store (K7), and what else the tools ask of a store without a runtime.

The store checks its records' seals and structure (``ctxrt.store.verify``, ``verify_postgres``)
and never decodes a message; here each log item of a message slot is decoded as the layers above
read it (``codec``) and the blobs it names are handed back for the store to look up (``blobs``);
and each message slot's stored channel index, where it covers the slot, is checked against the
slot's messages (``check_indexes``, K10): the first entry that differs is named; and each request
ledger's records are kept against earlier ones that are there and long enough (``check_ledgers``,
Q3), as ``requests()`` reads them.
``verify`` is what the CLI calls: a directory is walked in a child process (``verify_in_child``:
``python -m ctxrt.verification --stream PATH``), so a damaged file that makes LMDB abort or
raise SIGBUS kills only the child, whose death is reported as damage; a postgresql:// store is
read in this process (a damaged row can't crash it). ``verify_store`` walks a directory in THIS
process: use it only where a crash of this process is acceptable (the child itself).

The CLI and the demo ask here, not the engines: whether a store is there (``holds_store``), the
files a store makes (``STORE_FILE_NAMES``) and the errors its backend raises (``BACKEND_ERRORS``).
Exit status of ``python -m ctxrt.verification``: 0 sound, 1 damaged, 2 not checked (no store
there, or not a ctxrt store).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import channels
from .channel_entries import index_entries
from .content import blobs, codec
from .errors import StoreFormatError
from .namespace.states import is_host_log, is_ledger, is_slot
from .request_ledger import check_record, decode_record, header
from .slots import decode_stored
from .store.engine import BACKEND_ERRORS as BACKEND_ERRORS
from .store.environment import close_store, open_store
from .store.files import STORE_FILE_NAMES as STORE_FILE_NAMES
from .store.interface import StoreEngine
from .store.records import index_item, index_marker
from .store.urls import driver_missing, is_postgres_url
from .store.verify import VerifyReport, report_from_stream, walk_store


def check_item(state: str, data: bytes, origin: int, place: str) -> list[str]:
    """A log item as the layers above read it: in a message slot, a message (raises if it doesn't
    decode), and the blobs it refers to (sha-256 hex); in a host state's log, JSON (M9); in a
    request ledger, a request record (Q3); another
    state's item is its strategy's own."""
    if is_host_log(state):
        json.loads(data)  # raises if it doesn't decode, as HostState.entries would
        return []
    if is_ledger(state):
        check_record(data)  # raises if it isn't a request record, as ContextManager.requests would (Q3)
        return []
    if not is_slot(state):
        return []
    named: list[str] = []
    message = codec.message_from_json(data, sequence=origin, store=place)
    blobs.resolve_blobs(message.content, named.append)  # answers None: nothing is read, each ref named
    return named


def check_indexes(engine: StoreEngine) -> Iterator[tuple[str, str]]:
    """Per live branch, each message slot's channel index where it covers the slot (K10), against
    the entries its messages should have filed: the first that differs in each, as (place, what)."""
    states = engine.list_states()
    at = engine.last_sequence  # one moment for messages and index alike, whatever commits meanwhile
    for branch in engine.list_branches():
        for info in states:
            if info.kind != "log" or not is_slot(info.name):
                continue
            if engine.read_value(index_marker(info.name), branch.id, False, at=at) is not True:
                continue
            place = f"the channel index of {info.name!r} on branch {branch.name!r}"
            expected: dict[str, list[tuple[int, bytes]]] = {}
            for item in engine.read_items(info.name, branch.id, at=at):
                message = decode_stored(engine, item.data, item.sequence)
                for entry in index_entries(message.content, message.metadata, message.timestamp_ms):
                    expected.setdefault(entry.key, []).append((item.sequence, index_item(item.ordinal, entry.data)))
            stored = {key: [(item.sequence, item.data) for item in engine.read_items(state, branch.id, at=at)]
                      for key, state in channels.index_logs(engine, info.name)}
            for key in sorted(set(expected) | set(stored)):
                problem = _first_difference(expected.get(key, []), stored.get(key, []))
                if problem is not None:
                    yield place, problem
                    break


def check_ledgers(engine: StoreEngine) -> Iterator[tuple[str, str]]:
    """Per live branch, each request ledger's first record kept against one that is not before it
    or has fewer parts than it keeps (Q3): ``requests()`` would name it damaged. (Each record's own
    decoding is ``check_item``'s: one that doesn't decode is skipped here.)"""
    at = engine.last_sequence
    ledgers = [info.name for info in engine.list_states() if info.kind == "log" and is_ledger(info.name)]
    for branch in engine.list_branches():
        for state in ledgers:
            lengths: dict[str, int] = {}  # record id -> how many parts it has, base's included
            for item in engine.read_items(state, branch.id, at=at):
                try:
                    record_id, base, shared = header(item.data)
                    own = len(decode_record(item.data, alone=True)[0].parts)
                except ValueError:
                    continue
                if base is not None and lengths.get(base, -1) < shared.drop + shared.keep:
                    yield (f"request ledger {state!r} on branch {branch.name!r}",
                           f"record {record_id!r} @{item.sequence} is kept against {base!r}, which is "
                           f"{'not before it' if base not in lengths else 'shorter than it keeps'}")
                    break
                lengths[record_id] = own + (shared.keep if base is not None else 0)


def check_store(engine: StoreEngine) -> Iterator[tuple[str, str]]:
    """What is checked of the store as the engine reads it: the channel indexes, the ledgers."""
    yield from check_indexes(engine)
    yield from check_ledgers(engine)


def _first_difference(expected: list[tuple[int, bytes]], stored: list[tuple[int, bytes]]) -> str | None:
    for (want, data), (have, entry) in zip(expected, stored):
        if want != have:
            return (f"message {want} has no entry (the entry there is message {have}'s)" if want < have
                    else f"holds an entry for message {have}, which files none there")
        if data != entry:
            return f"the entry of message {want} is {entry!r}, not {data!r}"
    if len(expected) > len(stored):
        return f"message {expected[len(stored)][0]} has no entry"
    if len(stored) > len(expected):
        return f"holds an entry for message {stored[len(expected)][0]}, which files none there"
    return None


def verify(store: str, *, timeout: float | None = None) -> VerifyReport:
    """Walk ``store`` (a directory, in a child process; or a postgresql:// URL) and report what is
    damaged: a report, never raised.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` seconds passed (the child was killed).
        ImportError: a postgresql:// store and no psycopg.
    """
    if is_postgres_url(store):
        return verify_postgres(store)
    return verify_in_child(store, timeout=timeout)


def verify_postgres(url: str, *, emit: Callable[[dict[str, Any]], None] | None = None) -> VerifyReport:
    """Walk the store in the database at ``url`` and report what is damaged (a report, never raised)."""
    try:
        from .store.verify_postgres import walk_postgres
    except ImportError as exc:
        raise driver_missing(exc) from None
    return walk_postgres(url, check_item, emit=emit, check_engine=check_store)


def verify_store(path: str | os.PathLike[str], *, emit: Callable[[dict[str, Any]], None] | None = None) -> VerifyReport:
    """Walk the store at ``path`` in THIS process and report what is damaged.

    Reading a damaged store through LMDB can crash the process that reads it; call
    ``verify_in_child`` unless this process is expendable. Never writes to the store.
    """
    return walk_store(path, check_item, emit=emit, check_engine=check_store)


def verify_in_child(path: str | os.PathLike[str], *, timeout: float | None = None) -> VerifyReport:
    """Walk the store at ``path`` in a child process; its crash is reported as damage, never raised.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` seconds passed (the child was killed).
    """
    root = str(Path(__file__).resolve().parents[1])  # the directory ctxrt itself is imported from
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, (root, environment.get("PYTHONPATH"))))
    child = subprocess.run(
        [sys.executable, "-m", "ctxrt.verification", "--stream", os.fspath(path)],
        capture_output=True, timeout=timeout, env=environment, check=False,
    )
    return report_from_stream(os.fspath(path), child.stdout.decode("utf-8", "replace"),
                              child.stderr.decode("utf-8", "replace"), child.returncode)


def holds_store(store: str | os.PathLike[str]) -> bool:
    """Whether ``store`` already holds a ctxrt store: opened read-only and closed again. Raises
    what the open raises but ``StoreFormatError`` (no ctxrt store there: False)."""
    try:
        close_store(open_store(store, readonly=True))
    except StoreFormatError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxrt.verification", description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the store's directory")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--stream", action="store_true", help="print each finding as a JSON line as it is made")
    args = parser.parse_args(argv)

    def emit(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    report = verify_store(args.path, emit=emit if args.stream else None)
    if args.stream:
        emit({"report": report.to_json()})
    elif args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
