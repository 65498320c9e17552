"""What a ``ctxrt`` subcommand declares, and the option types the subcommands share.

Each subcommand's module states one ``Subcommand``: its name and help, its options, the rule
across them argparse can't state, and what runs it; the parser in ``ctxrt.cli`` wires them in.
The value types (a whole number from some minimum, a positive number of seconds) and the trio
run of an async command are the same for all, so they live here once, below the commands.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

import attrs
import trio


@attrs.frozen
class Subcommand:
    """One subcommand: its name and help, its options, what runs it, and its usage rule.

    ``complaint`` says what is wrong with a combination of options (a usage error), or None.
    """

    name: str
    summary: str
    description: str
    add_options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    complaint: Callable[[argparse.Namespace], str | None] | None = None


def in_trio(handler: Callable[[argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    """``handler`` run by trio, as a subcommand's ``run``."""

    def run(args: argparse.Namespace) -> int:
        # Ctrl-C is raised in the command's own task at an await, never inside an actor's step.
        return trio.run(handler, args, restrict_keyboard_interrupt_to_checkpoints=True)

    return run


def whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be {maximum} or less, got {value}")
        return value

    return parse


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
