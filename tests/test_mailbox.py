"""The one mailbox both actors use: typed asks, one reply, back-pressure, one close path.

Real trio tasks on a bare ``Mailbox``; the actors' own behaviour over it is tested in
tests/test_store_actor.py and tests/test_namespace_actor.py. Determinism: no sleeps, only
``wait_all_tasks_blocked`` and a ``fail_after`` guard.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import linecache
import os
import signal
import sys
import types
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from ctxrt.testing import Ask, Mailbox


@attrs.frozen
class Double(Ask[int]):
    number: int


class Closed(Exception):
    pass


def mailbox(capacity: int = 2) -> Mailbox:
    return Mailbox(capacity, lambda command: Closed(f"closed before {command!r}"))


async def serve(box: Mailbox, seen: list[Any]) -> None:
    async for command, reply in box:
        seen.append(command)
        if reply is not None:
            if isinstance(command, Double):
                reply.resolve(True, command.number * 2)
            else:
                reply.resolve(False, ValueError(f"not a command: {command!r}"))


async def test_an_ask_returns_what_the_actor_answers_or_raises_its_refusal() -> None:
    """``ask(Double(n))`` returns the int the actor answered; an answer that is an error is raised."""
    box = mailbox()
    seen: list[Any] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, box, seen)
            assert await box.ask(Double(21)) == 42
            with pytest.raises(ValueError, match="not a command"):
                await box.ask("nonsense")  # type: ignore[arg-type]
            box.close()
    assert seen == [Double(21), "nonsense"]
    assert box.statistics().unanswered == 0 and box.statistics().received == 2


@contextlib.asynccontextmanager
async def _waiting_for_room(capacity: int, asks: int) -> AsyncIterator[tuple[trio.Nursery, Mailbox, list[int]]]:
    """A mailbox of ``capacity`` and ``asks`` asks of ``Double(0)``, ``Double(1)``, ..., each
    started once the one before is queued or waits for room (their answers go to the list), with
    the nursery they run in."""
    box = mailbox(capacity=capacity)
    answers: list[int] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for n in range(asks):
                nursery.start_soon(_append, answers, box.ask(Double(n)))
                await trio.testing.wait_all_tasks_blocked()
            assert box.depth == capacity and box.statistics().senders_waiting == asks - capacity
            yield nursery, box, answers


async def test_asks_wait_for_room_and_tells_never_do() -> None:
    """Once ``capacity`` envelopes are queued an ask waits until the actor takes one; a tell goes in at
    once whatever the mailbox holds."""
    async with _waiting_for_room(2, 3) as (nursery, box, answers):
        box.tell("a tell")
        assert box.depth == 3
        seen: list[Any] = []
        nursery.start_soon(serve, box, seen)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(answers) == [0, 2, 4] and len(seen) == 4
        box.close()


async def test_a_batch_takes_what_is_queued_up_to_a_count_or_a_weight_and_makes_room() -> None:
    """K9 (group commit): ``receive_queued`` moves queued envelopes, oldest first, until the batch holds
    ``most`` or their weight reaches ``budget`` (the one reaching it included); an ask waiting for
    room sends once the batch took some."""
    async with _waiting_for_room(4, 5) as (_, box, answers):
        taken: list[Any] = []
        box.receive_queued(taken, 3, lambda command: command.number, 100)  # the count stops it
        assert [command for command, _ in taken] == [Double(0), Double(1), Double(2)]
        await trio.testing.wait_all_tasks_blocked()
        assert box.depth == 2 and box.statistics().senders_waiting == 0  # the fifth ask sent
        heavy: list[Any] = []
        box.receive_queued(heavy, 10, lambda command: 10 * command.number, 30)  # Double(3) weighs 30: it stops
        assert [command for command, _ in heavy] == [Double(3)] and box.depth == 1
        assert box.statistics().received == 4
        for command, reply in taken + heavy:
            reply.resolve(True, command.number * 2)
        rest: list[Any] = []
        box.receive_queued(rest, 10, lambda command: 0, 1)
        for command, reply in rest:
            reply.resolve(True, command.number * 2)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(answers) == [0, 2, 4, 6, 8] and box.depth == 0
        box.close()


async def _append(answers: list[int], call: Awaitable[int]) -> None:
    answers.append(await call)


async def test_close_refuses_later_sends_and_the_notice_comes_before_what_is_queued() -> None:
    """After ``close(refusal, notice)`` an ask raises the refusal and a tell is dropped; the actor takes
    the notice first, then what was queued, then sees the end; ``drain`` answers what is left."""
    box = mailbox()
    queued: list[Any] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async def ask_queued() -> None:
                with pytest.raises(Closed, match="drained"):
                    await box.ask(Double(1))
                queued.append("refused")

            nursery.start_soon(ask_queued)
            await trio.testing.wait_all_tasks_blocked()
            box.close(lambda command: Closed(f"retired: {command!r}"), notice="stop now")
            with pytest.raises(Closed, match="retired: Double"):
                await box.ask(Double(2))
            box.tell("dropped")
            assert box.receive_nowait() == ("stop now", None)
            box.drain(lambda command: Closed("drained"))
            with pytest.raises(trio.EndOfChannel):
                await box.receive()
    assert queued == ["refused"]


async def test_a_cancelled_ask_loses_only_its_answer_and_one_cancelled_already_sends_nothing() -> None:
    """An ask cancelled while it waits leaves its command queued for the actor (its answer is dropped);
    an ask whose caller is cancelled already sends nothing."""
    box = mailbox()
    seen: list[Any] = []
    with trio.fail_after(5):
        with trio.CancelScope() as already:
            already.cancel()
            await box.ask(Double(1))
        assert box.depth == 0
        async with trio.open_nursery() as nursery:
            waiting = trio.CancelScope()

            async def ask() -> None:
                with waiting:
                    await box.ask(Double(5))

            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            waiting.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert waiting.cancelled_caught and box.depth == 1
            nursery.start_soon(serve, box, seen)
            await trio.testing.wait_all_tasks_blocked()
            box.close()
    assert seen == [Double(5)] and box.statistics().unanswered == 0


def _doubled(handled: list[Any]) -> Any:
    """An ``alone`` option: the actor's handling of a ``Double``, run in the caller's task."""

    async def alone(command: Double) -> tuple[bool, Any]:
        handled.append(command)
        return True, command.number * 2

    return alone


async def test_a_lone_ask_runs_the_alone_option_in_its_own_task_and_callers_together_go_to_the_actor() -> None:
    """``ask(command, alone=...)``: a caller that finds nobody else asking and nothing unanswered runs
    ``alone`` itself (the actor receives nothing); callers that arrive together all send theirs, so
    the actor can handle them as one group; a caller cancelled already does neither."""
    box = mailbox(capacity=10)
    seen: list[Any] = []
    handled: list[Any] = []
    with trio.fail_after(5):
        assert await box.ask(Double(4), alone=_doubled(handled)) == 8
        assert handled == [Double(4)] and box.statistics().received == 0
        with trio.CancelScope() as already:
            already.cancel()
            await box.ask(Double(9), alone=_doubled(handled))
        assert handled == [Double(4)] and box.depth == 0
        answers: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, box, seen)
            for n in range(3):
                nursery.start_soon(_append, answers, box.ask(Double(n), alone=_doubled(handled)))
            await trio.testing.wait_all_tasks_blocked()
            box.close()
    assert sorted(answers) == [0, 2, 4] and sorted(seen, key=lambda command: command.number) == [
        Double(0), Double(1), Double(2)]
    assert handled == [Double(4)]


async def test_a_lone_step_that_waits_sends_others_to_the_actor_and_one_that_declines_sends_its_own() -> None:
    """``alone`` may wait (a commit handed to a writer thread): callers arriving while it runs go to
    the actor rather than wait their turn at it; a step that answers None (it can't be done alone
    now) sends the caller's command to the actor instead."""
    box = mailbox(capacity=10)
    seen: list[Any] = []
    released = trio.Event()
    started = trio.Event()

    async def slow(command: Double) -> tuple[bool, Any]:
        started.set()
        await released.wait()
        return True, command.number * 2

    async def declines(command: Double) -> None:
        return None

    answers: list[int] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, box, seen)
            nursery.start_soon(_append, answers, box.ask(Double(1), alone=slow))
            await started.wait()
            nursery.start_soon(_append, answers, box.ask(Double(2), alone=slow))
            await trio.testing.wait_all_tasks_blocked()
            assert seen == [Double(2)] and answers == [4]  # the second went to the actor, not to slow
            released.set()
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(answers) == [2, 4]
            assert await box.ask(Double(3), alone=declines) == 6 and seen == [Double(2), Double(3)]
            box.close()


async def test_a_caller_answered_but_not_yet_back_sends_the_next_lone_ask_to_the_actor() -> None:
    """A caller whose answer came but whose task hasn't run since is still asking (it most often
    asks again at once): a caller arriving then sends its command to the actor, so the two meet
    there, rather than running ``alone`` behind a schedule point of its own."""
    box = mailbox(capacity=10)
    seen: list[Any] = []
    handled: list[Any] = []
    answers: list[int] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_append, answers, box.ask(Double(1)))
            await trio.testing.wait_all_tasks_blocked()
            _, reply = box.receive_nowait()  # the actor's step: the first caller answered, not yet run
            assert reply is not None
            reply.resolve(True, 2)
            nursery.start_soon(serve, box, seen)
            assert await box.ask(Double(2), alone=_doubled(handled)) == 4
            assert handled == [] and seen == [Double(2)] and answers == [2]
            assert await box.ask(Double(3), alone=_doubled(handled)) == 6  # nobody else asking now: alone
            assert handled == [Double(3)] and seen == [Double(2)]
            box.close()


def _ask_lines() -> list[int]:
    """The lines of ``Mailbox.ask`` that run, but a bare ``try:`` (a real signal never interrupts
    it; a trace function's would escape the block it opens)."""
    code = Mailbox.ask.__code__
    found = sorted({number for _, number in dis.findlinestarts(code) if number is not None and number > code.co_firstlineno})
    return [number for number in found if linecache.getline(code.co_filename, number).strip() != "try:"]


async def _ask_every_way(box: Mailbox, handled: list[Any]) -> None:
    """Asks that reach every line of ``ask``: alone (answered, refused, declined), one the actor
    refuses, three at once (through the actor), and one to a closed mailbox; twice."""

    async def refuses(command: Double) -> tuple[bool, Any]:
        return False, Closed("refused alone")

    async def declines(command: Double) -> None:
        return None

    closed = mailbox()
    closed.close()
    for _ in range(2):
        assert await box.ask(Double(1), alone=_doubled(handled)) == 2
        with pytest.raises(Closed):
            await box.ask(Double(1), alone=refuses)
        assert await box.ask(Double(2), alone=declines) == 4
        with pytest.raises(ValueError):
            await box.ask("not a command")  # type: ignore[arg-type]  # the actor refuses it
        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(functools.partial(box.ask, Double(n), alone=_doubled(handled)))
        with pytest.raises(Closed):
            await closed.ask(Double(3))


@pytest.mark.parametrize("number", _ask_lines())
def test_a_ctrl_c_at_any_line_of_ask_leaves_the_next_lone_caller_alone(number: int) -> None:
    """L8, K9: a real SIGINT at a line of ``Mailbox.ask``, in a run where callers ask alone and
    together: the run ends in the interrupt, and in a later run (the actor answering what was left
    queued) a lone caller still runs ``alone``: the interrupted caller is not counted as asking."""
    box = mailbox(capacity=10)
    handled: list[Any] = []
    sent = False

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal sent
        if sent or frame.f_code is not Mailbox.ask.__code__:
            return None
        if event == "line" and frame.f_lineno == number:
            sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return trace

    async def interrupted() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, box, [])
            await _ask_every_way(box, handled)
            nursery.cancel_scope.cancel()

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        with pytest.raises(BaseException) as raised:  # a group of interrupts, from the run's nurseries
            trio.run(interrupted)
    finally:
        sys.settrace(previous)
    assert sent and (isinstance(raised.value, KeyboardInterrupt) or raised.value.split(KeyboardInterrupt)[1] is None)

    async def later() -> None:
        seen: list[Any] = []
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve, box, seen)
                await trio.testing.wait_all_tasks_blocked()  # what the interrupted run left queued, answered
                received, alone = box.statistics().received, len(handled)
                assert await box.ask(Double(7), alone=_doubled(handled)) == 14
                assert handled[alone:] == [Double(7)] and box.statistics().received == received
                box.close()

    trio.run(later)
