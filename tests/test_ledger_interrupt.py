"""Ctrl-C at each line of an append that carries request records, and of a read that commits
them (``requests()``), or raised in a namespace actor, loses no record ``record_request``
returned (Q11, L8).

A record waits in the runtime and commits in the batch of the next append (Q1); the append takes
it from the queue before it sends. A real SIGINT at each line of ``add_message`` and of
``requests`` in turn (a trace function raises it there), called from the host's main task or from
a task of its own: the host ends in a bare ``KeyboardInterrupt``, and the record is in the store
after, with the message the host was told was stored. (Found by the attack on the write path:
a SIGINT between taking the records and sending them dropped them, and trio delivers a deferred
Ctrl-C at the main task's next wait, the send's own included.)
"""

from __future__ import annotations

import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt import Budget


def lines(function: Any) -> list[int]:
    code = function.__code__
    return sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})


def interrupted(path: Path, method: str, line: int, in_main: bool) -> tuple[bool, str, str | None, str | None]:
    """Run a host that records a request, then calls ``method`` with a SIGINT raised at ``line`` of
    it: whether the signal was sent, how the host ended, the record's id and the appended message's."""
    code = getattr(ctxrt.ContextManager, method).__code__
    fired: list[bool] = []
    armed = False

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line and armed and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)
        return local

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    record_id: str | None = None
    message_id: str | None = None

    async def call(manager: ctxrt.ContextManager) -> None:
        nonlocal armed, message_id
        armed = True
        previous = sys.gettrace()
        sys.settrace(trace)
        try:
            if method == "add_message":
                message_id = await manager.add_message("assistant", "the reply")
            else:
                await manager.requests()
        finally:
            sys.settrace(previous)
            armed = False

    async def host() -> None:
        nonlocal record_id
        async with ctxrt.open_runtime(path) as rt:
            manager = await rt.open("ann", isolate=True, ledger=True)
            await manager.add_message("user", "a question")
            result = await manager.compile(Budget(max_tokens=20_000))
            record_id = (await manager.record_request(result, form="anthropic")).id
            if in_main:
                await call(manager)
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, manager)

    try:
        trio.run(host)
        ended = "returned"
    except KeyboardInterrupt:
        ended = "KeyboardInterrupt"
    except BaseException as exc:  # noqa: BLE001 - the assertion names it
        ended = repr(exc)
    return bool(fired), ended, record_id, message_id


async def stored(path: Path) -> tuple[set[str], set[str]]:
    async with ctxrt.open_runtime(path, readonly=True) as rt:
        manager = await rt.open("ann", isolate=True)
        records = {record.id for record in await manager.requests(limit=100)}
        messages = {message.id for message in await manager.get_all_messages()}
    return records, messages


@pytest.mark.parametrize("in_main", [True, False], ids=["main task", "own task"])
@pytest.mark.parametrize("method", ["add_message", "requests"])
def test_ctrl_c_at_any_line_of_an_append_or_a_read_that_commits_request_records_keeps_every_record(
    tmp_path: Path, method: str, in_main: bool,
) -> None:
    """Q11, L8: a SIGINT at each line of ``add_message`` (which takes the waiting record into its
    batch) and of ``requests`` (which commits it first) ends the host in a bare KeyboardInterrupt,
    and the record ``record_request`` returned is stored, as is the message if its id was returned."""
    sent = 0
    for line in lines(getattr(ctxrt.ContextManager, method)):
        path = tmp_path / f"{line}"
        fired, ended, record_id, message_id = interrupted(path, method, line, in_main)
        if not fired:
            continue
        sent += 1
        assert ended == "KeyboardInterrupt", f"line {line}: {ended}"
        records, messages = trio.run(stored, path)
        assert record_id in records, f"SIGINT at line {line} of {method} lost the record"
        if message_id is not None:
            assert message_id in messages
    assert sent >= 5


class InterruptingEstimator:
    """A host's token estimator, which runs in its namespace's actor: once armed, its next
    estimate raises a real SIGINT there (trio raises KeyboardInterrupt in that task)."""

    def __init__(self) -> None:
        self.armed = False

    def estimate(self, message: ctxrt.Message) -> int:
        if self.armed:
            self.armed = False
            signal.raise_signal(signal.SIGINT)
        return 10

    def observe(self, model: str, estimated: int, actual: int) -> None:
        return None


def test_ctrl_c_raised_in_a_namespace_actor_keeps_the_request_records_waiting(tmp_path: Path) -> None:
    """Q1, L8: a Ctrl-C that trio raises in a namespace actor (here in a host's estimator, during
    bob's compile) cancels the runtime's own tasks; the store actor still commits ann's waiting
    record at the close (it stopped with them, and the record was lost, with an error logged)."""
    estimator = InterruptingEstimator()
    record_id = None

    async def host() -> None:
        nonlocal record_id
        async with ctxrt.open_runtime(tmp_path / "store") as rt:
            ann = await rt.open("ann", isolate=True, ledger=True)
            bob = await rt.open("bob", isolate=True, token_estimator=estimator)
            await ann.add_message("user", "a question")
            await bob.add_message("user", "a line for bob")
            result = await ann.compile(Budget(max_tokens=20_000))
            record_id = (await ann.record_request(result, form="anthropic")).id
            estimator.armed = True
            await bob.compile(Budget(max_tokens=20_000))

    with pytest.raises(KeyboardInterrupt):
        trio.run(host)
    assert not estimator.armed, "the estimator never ran armed"

    async def records() -> set[str]:
        async with ctxrt.open_runtime(tmp_path / "store", readonly=True) as rt:
            ann = await rt.open("ann", isolate=True)
            return {record.id for record in await ann.requests()}

    assert record_id in trio.run(records)
