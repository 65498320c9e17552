"""The apply loop both engines run a batch's commands with, in the batch's one transaction: an
append unnested (it checks all it can be refused for before it writes; its heads are written
once), every other command in a nested scope of its own, so a refused command is rolled back
alone and its caller told why while the others commit; one ``(ok, result or error)`` per command.
What a nested scope is (an LMDB child transaction, a PostgreSQL savepoint) and which errors
refuse a command are each engine's own (``Nesting``); the order of the steps, the batch's own
savepoints and the signal to run the batch again nested (``Unsafe``) are here once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..errors import CtxrtError, StoreCorruptError
from .batch import Batch

# Decoding errors, damage whichever engine meets them, never the caller's mistake (JSONDecodeError
# and UnicodeDecodeError are ValueErrors too): an engine tells the caller ``damaged_record``.
UNDECODABLE = (struct.error, UnicodeDecodeError, json.JSONDecodeError)
# The caller's mistakes: the command is refused and its caller told.
MISTAKES = (CtxrtError, TypeError, ValueError)


class Unsafe(Exception):
    """An unnested command failed after it had written: the engine begins the batch again, nested."""


class Nesting(Protocol):
    """An engine's part of running one batch's commands."""

    # What refuses an unnested command, and a nested one (its caller is told; the others commit).
    refusals: tuple[type[BaseException], ...]
    nested_refusals: tuple[type[BaseException], ...]

    def refusal(self, command: Any, exc: BaseException) -> BaseException:
        """What the caller of ``command``, refused with ``exc``, is told."""

    def begin(self, number: int) -> None:
        """Begin the nested scope of the batch's command ``number``."""

    def settle(self) -> None:
        """Write what the command left unwritten, within its scope (a row it can't write refuses it)."""

    def keep(self) -> None:
        """End the scope, keeping what the command wrote."""

    def undo(self, exc: BaseException) -> BaseException:
        """Roll the scope back after ``exc`` refused its command; the error that refused it."""

    def abandon(self) -> None:
        """End the scope as the whole batch fails (an error that refuses no single command)."""


def run_commands(
    batch: Batch, commands: Sequence[Any], execute: Callable[[Any, Any], Any], unnested: Callable[[Any], bool] | None,
    nesting: Nesting,
) -> list[tuple[bool, Any]]:
    """Run ``execute(batch, command)`` for each command; each one's ``(ok, result or error)``.

    ``unnested(command)`` True marks a command that runs without a nested scope; should one
    raise after it began writing, this raises ``Unsafe`` (the engine aborts the attempt and runs
    the batch again with ``unnested`` None). The heads the unnested appends moved are written
    before each nested command and at the end.
    """
    results: list[tuple[bool, Any]] = []
    for number, command in enumerate(commands):
        if unnested is not None and unnested(command):
            batch.defer_heads = True
            try:
                value = execute(batch, command)
            except nesting.refusals as exc:
                if batch.wrote:
                    raise Unsafe from exc
                results.append((False, nesting.refusal(command, exc)))
            else:
                results.append((True, value))
            finally:
                batch.defer_heads = batch.wrote = False
            continue
        batch.flush_heads()  # a nested command reads heads from the transaction
        nesting.begin(number)
        saved = batch.savepoint()
        try:
            value = execute(batch, command)
            nesting.settle()
        except nesting.nested_refusals as exc:
            cause = nesting.undo(exc)
            batch.restore(saved)
            results.append((False, nesting.refusal(command, cause)))
        except BaseException:
            nesting.abandon()
            raise
        else:
            nesting.keep()
            results.append((True, value))
    batch.flush_heads()
    return results


def damaged_record(data_path: str, command: Any, exc: BaseException) -> StoreCorruptError:
    """What the caller of ``command`` is told when it met a stored record that doesn't decode."""
    return StoreCorruptError(data_path, f"{type(command).__name__} met a record that doesn't decode: {exc!r}")
