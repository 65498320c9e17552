"""``ctxrt summaries``: every summary a namespace stores on a branch, merged ones included.

Read from the strategy states of the namespace (Autobiographical's and Knowledge's) on a
read-only open.
"""

from __future__ import annotations

import argparse
import json

from rich.markup import escape

from ..namespace import states
from .output import emit, out
from .stores import STORE_HELP, open_readonly, require_namespace
from .subcommand import Subcommand, in_trio


def _options(summaries: argparse.ArgumentParser) -> None:
    summaries.add_argument("store", metavar="STORE", help=STORE_HELP)
    summaries.add_argument("--namespace", required=True, help="the namespace (`inspect` lists them)")
    summaries.add_argument("--branch", default="main", help="the branch (default: %(default)s)")


async def _summaries(args: argparse.Namespace) -> int:
    async with open_readonly(args.store) as runtime:
        namespace = await require_namespace(runtime, args)
        engine = runtime.engine
        found = []
        row = engine.branch(args.branch)
        for name in ("autobio", "knowledge"):
            state = states.strategy_state(namespace, name, "summaries")
            found += [json.loads(item.data) for item in engine.read_log(state, row.id)]
    if args.json:
        emit(found)
        return 0
    if not found:
        out.print(f"namespace {namespace!r} on {args.branch} keeps no summaries", markup=False)
    for summary in found:
        out.print(f"[bold]{escape(summary['id'])}[/] (L{summary['level']}, {summary['tokens']} tokens, message ids "
                  f"{summary['first_id']}..{summary['last_id']}): {escape(summary['content'][:240])}")
    return 0


SUMMARIES = Subcommand(
    "summaries", "a namespace's summaries",
    "Every summary a namespace stores on a branch, merged ones included. Opens the store "
    "read-only.",
    _options, in_trio(_summaries))
