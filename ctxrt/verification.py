"""Verify a store (K7), and what else the tools ask of a store without a runtime.

The store checks its records' seals and structure (``ctxrt.store.verify``, ``verify_postgres``)
and never decodes a message; here each log item of a message slot is decoded as the layers above
read it (``codec``) and the blobs it names are handed back for the store to look up (``blobs``).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .content import blobs, codec
from .errors import StoreFormatError
from .namespace.states import is_host_log, is_ledger, is_slot
from .request_ledger import check_record
from .store.engine import BACKEND_ERRORS as BACKEND_ERRORS
from .store.environment import close_store, open_store
from .store.files import STORE_FILE_NAMES as STORE_FILE_NAMES
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
    return walk_postgres(url, check_item, emit=emit)


def verify_store(path: str | os.PathLike[str], *, emit: Callable[[dict[str, Any]], None] | None = None) -> VerifyReport:
    """Walk the store at ``path`` in THIS process and report what is damaged.

    Reading a damaged store through LMDB can crash the process that reads it; call
    ``verify_in_child`` unless this process is expendable. Never writes to the store.
    """
    return walk_store(path, check_item, emit=emit)


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
