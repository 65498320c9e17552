"""How a ``ctxrt`` command ends: its exit status and the one line that says why.

0 on success (a reader that closed the pipe early included), 1 with ``ctxrt: error: ...`` for
anything that failed, whatever raised it, 2 with the usage for a bad option, 130 with
``ctxrt: interrupted`` for Ctrl-C, and under ``--json`` that line as a JSON object on stderr.
Every command ends through here, and its Ctrl-C rule (later interrupts ignored, so none kills the
process before its line) is one rule for all, so it stands alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator

from ..errors import CtxrtError
from ..verification import BACKEND_ERRORS
from .output import printable

TRACEBACK_VARIABLE = "CTXRT_TRACEBACK"


class UsageError(Exception):
    """A bad option, value or combination: reported with the command's usage, exit status 2."""

    def __init__(self, message: str, *, prog: str = "ctxrt", usage: str = "") -> None:
        self.prog = prog
        self.usage = usage
        super().__init__(message)


def exit_status(work: Callable[[], int], *, as_json: bool) -> int:
    """``work()``'s status, or the status for what it raised, after saying it in one line."""
    try:
        return work()
    except UsageError as exc:
        if not as_json:
            sys.stderr.write(exc.usage)
        _report("UsageError", f"{exc.prog}: error: {exc}" if not as_json else str(exc), as_json)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, whatever was running (the runtime raises it as itself, L8)
        return _interrupted(as_json)
    except BaseExceptionGroup as group:
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in _leaves(group)):  # a second Ctrl-C as trio closed
            return _interrupted(as_json)
        raise
    except Exception as exc:  # the edge: one line for anything, unless asked for the traceback
        if all(isinstance(leaf, BrokenPipeError) for leaf in _leaves(exc)):
            # Piped into `head` and the like: the reader stopped, which is fine. Point stdout at
            # devnull so the interpreter's final flush doesn't fail too.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if os.environ.get(TRACEBACK_VARIABLE) == "1":
            raise
        kind, message = _describe(exc)
        _report(kind, message if as_json else f"ctxrt: error: {message}", as_json)
        return 1


def ignore_interrupts() -> None:
    """Ctrl-C from here on does nothing: once the command has its outcome, Python's default
    handler (back after trio.run) would kill the process by its signal, with no line said."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupted(as_json: bool) -> int:
    """Ctrl-C: later ones are ignored (trio has put Python's handler back, and another would
    kill the process before its one line), then the line and status 130."""
    ignore_interrupts()
    _report("KeyboardInterrupt", "interrupted" if as_json else "ctxrt: interrupted", as_json)
    return 130


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _describe(exc: BaseException) -> tuple[str, str]:
    """An error's type name and a one-line message saying what failed."""
    leaves = list(_leaves(exc))
    first = leaves[0]
    if isinstance(first, BACKEND_ERRORS):
        kind = type(first).__name__
        message = f"the store can't be read (damaged, or not a ctxrt store): {first}"
    elif isinstance(first, (CtxrtError, OSError)):
        kind, message = type(first).__name__, str(first)
    else:  # not an error ctxrt means to raise: say what it was, and how to see where
        kind = type(first).__name__
        message = f"{kind}: {first} (set {TRACEBACK_VARIABLE}=1 to see the traceback)"
    if len(leaves) > 1:
        message += f" (and {len(leaves) - 1} more error{'s' if len(leaves) > 2 else ''})"
    return kind, " ".join(message.split())  # one line, whatever the message held


def _report(kind: str, message: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": kind, "message": message}, ensure_ascii=False), file=sys.stderr)
    else:
        print(printable(message), file=sys.stderr)
