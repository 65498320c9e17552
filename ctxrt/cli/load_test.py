"""``ctxrt load-test``: concurrent opens, claims, adds, compiles and ticks, then the run's checks.

The load test itself is ``ctxrt.loadtest``; this module is its command: where the store goes (a
fresh directory or database, or a temporary one removed afterwards unless ``--keep``), the
progress bar, and the report as a table or JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.progress import TextColumn
from rich.table import Table

from ..errors import CtxrtError
from ..store.urls import is_postgres_url, redact
from ..verification import holds_store
from .output import emit, out, progress_bar
from .subcommand import Subcommand, in_trio, seconds, whole


class LoadTestStoreError(CtxrtError):
    """``load-test --store`` named a path that already holds something."""


class LoadTestFailed(CtxrtError):
    """The load test ran and a check failed: a lost message, a second claim, a leak or a deadlock."""


def _options(load: argparse.ArgumentParser) -> None:
    load.add_argument("--store", metavar="PATH|URL",
                      help="a new or empty directory for the store, or a postgresql:// URL of a database without "
                           "a ctxrt store, kept afterwards (default: a temporary store, removed afterwards unless "
                           "--keep)")
    load.add_argument("--keep", action="store_true", help="keep the temporary store and print where it is")
    load.add_argument("--namespaces", type=whole(1), default=50, metavar="N",
                      help="namespaces (default: %(default)s)")
    load.add_argument("--managers", type=whole(1), default=200, metavar="N",
                      help="concurrent managers (default: %(default)s)")
    load.add_argument("--readers", type=whole(1), default=5, metavar="N",
                      help="distinct readers (default: %(default)s)")
    load.add_argument("--duration", type=seconds, default=30.0, metavar="SECONDS",
                      help="how long to run (default: %(default)s)")


def _complaint(args: argparse.Namespace) -> str | None:
    if args.keep and args.store:
        return "--keep is for the temporary store; a --store is always kept"
    return None


async def _load_test(args: argparse.Namespace) -> int:
    from ..loadtest import report_json, run_load_test

    store: Path | str
    if args.store and is_postgres_url(args.store):
        store, scratch = args.store, None
        if holds_store(store):  # else no ctxrt store in that database yet: the run makes one
            raise LoadTestStoreError(f"load-test store {redact(args.store)} already holds a ctxrt store; the load test "
                                     f"needs a fresh one")
    elif args.store:
        store, scratch = Path(args.store), None
        if store.exists() and (not store.is_dir() or any(store.iterdir())):
            # The checks compare what was acknowledged with what the slot holds: it must start empty.
            raise LoadTestStoreError(f"load-test store {store} is not new or empty; the load test needs a fresh store")
    else:
        scratch = Path(tempfile.mkdtemp(prefix="ctxrt-load-"))
        store = scratch / "store"
    try:
        progress = progress_bar(TextColumn("{task.completed:.0f} of {task.total:.0f} s"), transient=True)
        with progress or contextlib.nullcontext():
            callback = None
            if progress is not None:
                task = progress.add_task("load test", total=args.duration, note="")
                callback = lambda elapsed, operations: progress.update(  # noqa: E731
                    task, completed=min(elapsed, args.duration), note=f"{operations:,} operations")
            report = await run_load_test(store, namespaces=args.namespaces, managers=args.managers,
                                         readers=args.readers, duration_s=args.duration, progress=callback)
    finally:
        kept = scratch is None or args.keep
        if scratch is not None and not args.keep:  # not kept
            shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
    if args.json:
        emit({**report_json(report), "store": str(store), "store_kept": kept})
    else:
        _load_table(report, args)
        if scratch is not None:
            out.print(f"store kept at {store}" if kept else "store removed (--keep keeps it)", markup=False)
    if not report.ok:
        raise LoadTestFailed("the load test's checks failed (see the report)")
    return 0


def _load_table(report: Any, args: argparse.Namespace) -> None:
    from ..loadtest import refusal_lines

    table = Table("operation", "count", "per second", "p50 ms", "p90 ms", "p99 ms", "max ms",
                  title=f"load test: {args.managers} managers, {args.namespaces} namespaces, {args.readers} readers, "
                        f"{report.seconds:.1f} s")
    for kind, count in sorted(report.operations.items()):
        lat = report.latencies_ms.get(kind, {})
        table.add_row(kind, str(count), f"{count / report.seconds:.0f}",
                      *(f"{lat.get(q, 0):.1f}" for q in ("p50", "p90", "p99", "max")))
    out.print(table)
    for line in refusal_lines(report.refusals) or ["no call was refused"]:
        out.print(line, markup=False)
    out.print(f"messages acknowledged {report.messages_acknowledged}, stored {report.messages_stored}; "
              f"claim conflicts: {report.claim_conflicts or 'none'}; actors left: {report.actors_left}; "
              f"deadlock: {report.deadlocked}", markup=False)
    out.print("[bold green]checks passed[/]" if report.ok else "[bold red]checks FAILED[/]")


LOAD_TEST = Subcommand(
    "load-test", "concurrent opens, claims, adds, compiles and ticks, then checks",
    "Managers open namespaces as readers and add, compile and tick concurrently, then the run "
    "checks: no lost message, one claim per namespace, no leaked actor, no deadlock. Exits 1 if a "
    "check fails.",
    _options, in_trio(_load_test), _complaint)
