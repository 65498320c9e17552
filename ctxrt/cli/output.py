"""Where the ``ctxrt`` command's output goes: results on stdout, errors, progress and the log on stderr.

The two consoles (wrapped on a tty, never when piped), the JSON printer behind every ``--json``,
the progress bar and the runtime's log: every command writes through these, so they stand alone,
below the commands, and the conventions hold for each the same way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

LOG_LEVEL_VARIABLE = "CTXRT_LOG_LEVEL"
UNWRAPPED_WIDTH = 100_000  # "never wrap" for rich, which always lays text out to some width


# What a terminal acts on rather than shows: the control characters but newline and tab (an escape
# sequence in a stored message could clear the screen or retitle the window), and the bidi
# overrides (which reorder what follows them on the line).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on shown as its escape (``\\x1b``)."""
    return _CONTROLS.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


class _Console(Console):
    """rich's console, with a closed stdout reported as BrokenPipeError, and stored text (a message,
    a name) shown, never acted on: every string it renders, table cells included, goes through
    ``printable`` (rich itself drops only a few controls, and passes escape sequences through)."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text), **options)

    def on_broken_pipe(self) -> None:
        # rich exits with status 1 here; a reader that stopped early (`| head`) is no failure,
        # so main handles it like any other BrokenPipeError.
        raise BrokenPipeError


def _console(*, stderr: bool) -> Console:
    """A console that wraps to the terminal on a tty, and not at all when piped or redirected."""
    console = _Console(stderr=stderr)
    if console.is_terminal:
        return console
    # Off a tty rich falls back to 80 columns (or $COLUMNS) and wraps there, which breaks
    # grep, cut and every line-based tool; a width nothing reaches lays each line out whole.
    return _Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


out = _console(stderr=False)
err = _console(stderr=True)


def jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return {key: jsonable(item) for key, item in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def emit(data: Any) -> None:
    print(json.dumps(jsonable(data), indent=2, ensure_ascii=False, default=str))


def progress_bar(done: ProgressColumn, *, transient: bool) -> Progress | None:
    """A progress bar on stderr, or None when stderr is not a terminal (logs want no bars)."""
    if not err.is_terminal:
        return None
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), done, TimeElapsedColumn(),
                    TextColumn("{task.fields[note]}"), console=err, transient=transient)


def configure_logging() -> None:
    """The runtime's log on stderr at CTXRT_LOG_LEVEL; off by default.

    Each command reports its outcome itself (the demo counts failed compression requests, for
    one); the log would repeat it line by line: a failing model logs every attempt.
    """
    level = os.environ.get(LOG_LEVEL_VARIABLE, "").upper()
    logger = logging.getLogger("ctxrt")
    logger.propagate = False
    if level in logging.getLevelNamesMapping():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ctxrt: %(levelname)s: %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level)
    else:
        logger.addHandler(logging.NullHandler())  # also keeps logging's last-resort handler quiet
