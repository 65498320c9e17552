"""The ``ctxrt`` command (also ``python -m ctxrt``): the parser that wires in each subcommand, and
its entry points, ``main`` and ``run``.

``demo`` runs the main job; ``inspect``, ``messages``, ``compile`` and ``summaries`` open a store
read-only (they work while a host writes it); ``bench`` runs the benchmarks of a checkout;
``load-test`` drives concurrent opens, claims, adds, compiles and ticks. Each is a module of this
package; ``output``, ``exits``, ``subcommand`` and ``stores`` hold what they share.

Conventions, after well-liked Python CLIs: results go to stdout; errors and progress bars to
stderr. An error is one line (``ctxrt: error: ...``), never a traceback, whatever raised it
(a ctxrt error, LMDB refusing a damaged file, an OS error); ``CTXRT_TRACEBACK=1`` shows the
traceback instead. Exit status 0 on success, 1 when the command failed, 2 for a usage error
(a bad option or combination). With ``--json`` stdout holds only JSON, and an error is one JSON
object on stderr: ``{"error": "<type>", "message": "<text>"}``. Output is wrapped to the
terminal on a tty and never wrapped when piped.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import NoReturn

from .bench import BENCH
from .compile import COMPILE
from .demo import DEMO
from .exits import TRACEBACK_VARIABLE, UsageError, exit_status, ignore_interrupts
from .inspect import INSPECT
from .load_test import LOAD_TEST
from .messages import MESSAGES
from .output import LOG_LEVEL_VARIABLE, configure_logging
from .serve import SERVE
from .subcommand import Subcommand
from .summaries import SUMMARIES
from .verify import VERIFY

SUBCOMMANDS = (DEMO, INSPECT, MESSAGES, COMPILE, SUMMARIES, SERVE, VERIFY, BENCH, LOAD_TEST)  # --help's order

DESCRIPTION = """\
ctxrt: a context runtime for multi-agent LLM hosts. Run the demo, look inside
a store, dry-run a compile, or run the load test and the benchmarks."""

EPILOG = f"""\
Read-only commands (inspect, messages, compile, summaries, serve) work while a host writes the store.

output: results on stdout, errors and progress on stderr; no wrapping when piped.
  --json puts only JSON on stdout; an error is then one JSON object on stderr:
  {{"error": "<type>", "message": "<text>"}}.
exit status: 0 success, 1 failure (a missing or damaged store, a refused
  compile, a failed check), 2 usage error (a bad option or combination).
  Set {TRACEBACK_VARIABLE}=1 to see a traceback instead of the one-line error,
  {LOG_LEVEL_VARIABLE}=WARNING (or INFO, DEBUG) to see the runtime's log on stderr.

examples:
  ctxrt demo --messages 500
  ctxrt inspect demo-store
  ctxrt messages demo-store --tail 20
  ctxrt compile demo-store --namespace agents/ann --budget 20000 --json
  ctxrt serve demo-store
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its complaints raised (so main reports them, as JSON under --json)."""

    subcommands: dict[str, tuple[Subcommand, argparse.ArgumentParser]]

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, prog=self.prog, usage=self.format_usage())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctxrt")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def parser() -> _Parser:
    top = _Parser(prog="ctxrt", description=DESCRIPTION, epilog=EPILOG,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    top.add_argument("--json", action="store_true", dest="json_anywhere", help=argparse.SUPPRESS)
    commands = top.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    top.subcommands = {}
    for subcommand in SUBCOMMANDS:
        sub = commands.add_parser(subcommand.name, help=subcommand.summary, description=subcommand.description)
        sub.add_argument("--json", action="store_true",
                         help="print JSON on stdout; an error is a JSON object on stderr")
        subcommand.add_options(sub)
        top.subcommands[subcommand.name] = (subcommand, sub)
    return top


def run() -> NoReturn:
    """The ``ctxrt`` command's process: ``main()``, then exit with its status. A Ctrl-C after the
    command has done its work (while Python shuts down, when its default handler is back) would
    kill the process by its signal, with no line said: it is ignored from then on."""
    try:
        status = main()
    finally:  # argparse's --help and --version leave through SystemExit
        ignore_interrupts()
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv  # known even when parsing fails, so a usage error can be JSON too
    top = parser()
    configure_logging()
    return exit_status(partial(_run_command, top, argv), as_json=as_json)


def _run_command(top: _Parser, argv: list[str]) -> int:
    # argparse reports arguments left over by a subcommand from the top parser, under the top
    # usage; they are the subcommand's error, under its usage.
    args, stray = top.parse_known_args(argv)
    args.json = args.json or args.json_anywhere  # --json before the command works too
    subcommand, sub = top.subcommands[args.command]
    if stray:
        sub.error(f"unrecognized arguments: {' '.join(stray)}")
    # Rules across options, which argparse can't state: a usage error under the command's usage.
    if subcommand.complaint is not None and (complaint := subcommand.complaint(args)) is not None:
        sub.error(complaint)
    return subcommand.run(args)
