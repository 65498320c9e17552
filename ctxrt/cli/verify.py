"""``ctxrt verify``: walk every page and record of a store and report damage.

A directory is checked in a child process (a damaged file can crash whatever reads it; here only
the child), a postgresql:// store by a read of its tables. Its exit status is the report's own:
0 sound, 1 damaged, 2 not checked. It runs without trio.
"""

from __future__ import annotations

import argparse

import attrs

from .output import emit, out
from .stores import STORE_HELP
from .subcommand import Subcommand, seconds


def _options(verify: argparse.ArgumentParser) -> None:
    verify.add_argument("store", metavar="STORE", help=STORE_HELP)
    verify.add_argument("--timeout", type=seconds, default=600.0, metavar="SECONDS",
                        help="give up (exit 1) after this long (default: %(default)s)")


def _verify(args: argparse.Namespace) -> int:
    from ..verification import verify

    report = verify(args.store, timeout=args.timeout)
    if args.json:
        emit(attrs.asdict(report) | {"exit_code": report.exit_code})
        return report.exit_code
    out.print(f"{report.path}: {report.status} ({report.pages} pages, {report.records} records checked)",
              markup=False)
    for damage in report.damage:
        out.print(f"  damaged: {damage.place}: {damage.what}", markup=False)
    for note in report.notes:
        out.print(f"  note: {note}", markup=False)
    return report.exit_code


VERIFY = Subcommand(
    "verify", "walk every page and record of a store and report damage",
    "Check a store in a child process (a damaged file can crash whatever reads it; here only "
    "the child): the files, every page, then every record. Exit status 0: sound; 1: damaged; "
    "2: not checked (no store there, or not a ctxrt store). Never writes.",
    _options, _verify)
