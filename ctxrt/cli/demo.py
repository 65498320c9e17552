"""``ctxrt demo``: the multi-resident demo, its table of what each reader's compile holds, and the
commands to look inside the store it leaves.

The demo itself is ``ctxrt.demo``; this module is its command: the options, the progress bar,
the report as a table or JSON, and how to run ctxrt again from where the user is.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import MofNCompleteColumn
from rich.table import Table

from ..errors import CtxrtError
from .output import emit, jsonable, out, progress_bar
from .subcommand import Subcommand, in_trio, whole


class DemoFailed(CtxrtError):
    """The demo ran but didn't show what it is for: a privacy leak, or no summaries."""


def _options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--store", default="demo-store", metavar="PATH",
                      help="where to put the store (default: %(default)s). A new or empty directory, or one an "
                           "earlier demo made, which is replaced; anything else is refused, never deleted")
    demo.add_argument("--messages", type=whole(1), default=2000, metavar="N",
                      help="turns the residents write, a message each; the tool calls among them add a "
                           "result message each (default: %(default)s)")


async def _demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    store = Path(args.store)
    progress = progress_bar(MofNCompleteColumn(), transient=args.json)
    with progress or contextlib.nullcontext():
        callback = None
        if progress is not None:
            task = progress.add_task("residents talking", total=args.messages, note="")
            callback = lambda done, total: progress.update(task, completed=done)  # noqa: E731
        report = await run_demo(store, messages=args.messages, progress=callback)
    hint = f"{invocation()} inspect {shlex.quote(str(store))}"
    serve_hint = f"{invocation()} serve {shlex.quote(str(store))}"
    if args.json:
        emit({**jsonable(report), "private": report.private, "ok": report.ok, "problems": report.problems,
              "inspect_command": hint, "serve_command": serve_hint})
    else:
        _demo_table(report, hint)
        out.print(f"see what each resident saw, in a browser: {serve_hint}", markup=False)
    if report.problems:
        raise DemoFailed("; ".join(report.problems))
    return 0


def _demo_table(report: Any, hint: str) -> None:
    table = Table(title=f"What each reader's compile holds ({report.messages:,} turns written, "
                        f"model: {escape(report.model)})")
    for column in ("reader", "branch", "msgs stored", "msgs sent raw", "summaries stored", "summaries sent",
                   "head", "middle", "recent", "own", "leaks"):
        table.add_column(column, justify="left" if column in ("reader", "branch", "summaries stored") else "right")
    for row in report.readers:
        levels = ", ".join(f"L{level}: {count}" for level, count in row.summaries_per_level.items()) or "none"
        table.add_row(row.reader, row.branch, str(row.stored_messages), str(row.raw_messages), levels,
                      str(row.summaries_used), str(row.head_tokens), str(row.summary_tokens),
                      str(row.recent_tokens), str(row.audience_blocks_seen),
                      "none" if not row.foreign_markers else escape(", ".join(row.foreign_markers[:3])))
    out.print(table)
    out.print("msgs stored: messages in the shared slot on the reader's branch; summaries stored: by the reader's "
              "namespace on that branch, per level, merged ones included (both as `inspect` counts them)", markup=False)
    out.print("msgs sent raw / summaries sent: those of them this reader's compile sends; head / middle / recent: "
              "its tokens in the head window, the summarised middle and the recent window", markup=False)
    out.print("own: audience lines for this reader in its compile; leaks: lines for another reader (none expected)",
              markup=False)
    out.print(f"msgs stored on main ({report.written:,}) is more than the {report.messages:,} turns: each of the "
              f"{report.tool_cycles} tool cycles is two messages, a call and its result; the fork and the derived "
              f"branch each add one line of their own", markup=False)
    out.print(f"compression requests: {report.model_requests} ({report.model_failures} failed); "
              f"fork: {report.fork}; derived: {report.derived}", markup=False)
    if report.sample is not None:
        _demo_sample(report.sample)
    if report.private:
        out.print("[bold green]privacy check passed[/]: no compile, summary or model request held another "
                  "reader's lines")
    else:
        out.print("[bold red]privacy check FAILED[/]")
    out.print(f"store left at {report.store}; look inside with: {hint}", markup=False)


def _demo_sample(sample: Any) -> None:
    """One turn as two readers' requests carry it, side by side, and a summary one of them sends."""
    table = Table(title=f"Message {sample.message_id} in one turn's request", show_lines=True)
    table.add_column(f"as {sample.reader}'s request carries it", overflow="fold")
    table.add_column(f"as {sample.other}'s request carries it", overflow="fold")
    table.add_row(escape("\n".join(sample.as_reader)), escape("\n".join(sample.as_other)))
    out.print(table)
    out.print(f"the line meant for {sample.reader} alone is in {sample.reader}'s request and not in "
              f"{sample.other}'s", markup=False)
    if sample.summary_id is not None:
        opening = " ".join(sample.summary_text.split())
        opening = opening if len(opening) <= 300 else opening[:300] + " ..."
        out.print(f"a summary {sample.reader}'s request sends instead of older messages ({sample.summary_id}, "
                  f"{sample.summary_covers}): {opening}", markup=False)


def invocation() -> str:
    """How to run ctxrt again from here, as a shell command that works as printed."""
    script = Path(sys.executable).parent / "ctxrt"  # the script this interpreter's install made
    on_path = shutil.which("ctxrt")
    if script.is_file() and on_path and Path(on_path).resolve() == script.resolve():
        return "ctxrt"
    if script.is_file():
        return shlex.quote(relative(script))
    return f"{shlex.quote(relative(Path(sys.executable)))} -m ctxrt"


def relative(path: Path) -> str:
    """``path`` as the shell finds it from the current directory: relative when under it."""
    try:
        shown = str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
    return shown if os.sep in shown else f".{os.sep}{shown}"  # a bare name would be looked up on PATH


DEMO = Subcommand(
    "demo", "run the multi-resident demo on the embedded store",
    "Three residents share one slot; compression, a fork and a derive run; each reader's compile "
    "is checked for another reader's lines. 2,000 turns take a few seconds offline (longer "
    "with a real model: ANTHROPIC_API_KEY set, CTXRT_DEMO_MODEL picks it). Exits 1 if the privacy "
    "check fails or compression made no summaries.",
    _options, in_trio(_demo))
