"""ctxrt.aio's trio guest run (issue 23, item 2-3): one per asyncio loop, shared, ended with the last
runtime, waited for by the loop's shutdown; cancellation both ways; Ctrl-C reaching the host.

Determinism rules: every test runs real ``asyncio`` loops (plain sync tests, outside pytest-trio's
loop) over real LMDB stores in temp dirs; waits are on events and futures, bounded by
``asyncio.timeout`` guards, never on the clock; the interrupted hosts are real child processes
sent a real SIGINT once they have acknowledged appends.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
import trio
import uvloop

import ctxrt
import ctxrt.aio
import ctxrt.aio.guest
from ctxrt.testing import WriterThread
from ctxrt.testing import ScriptedModel, verify_store

GUARD_S = 60
HOST_SCRIPT = Path(__file__).with_name("aio_interrupt_host.py")
SMALL = ctxrt.Autobiographical("m", target_chunk_tokens=40, recent_window_tokens=40, head_window_tokens=0)


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {"asyncio": None, "uvloop": uvloop.new_event_loop}


def run(main: Any, loop: str = "asyncio") -> Any:
    """``asyncio.run`` (on uvloop if ``loop`` says so) with a guard, recording what the loop's
    exception handler heard (a task destroyed pending, an exception never retrieved): the tests
    expect nothing."""
    heard: list[dict[str, Any]] = []

    async def guarded() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: heard.append(context))
        async with asyncio.timeout(GUARD_S):
            return await main()

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # trio's "guest run got abandoned" among them
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            result = runner.run(guarded())
        gc.collect()
    assert heard == [], heard
    return result


async def stored_texts(path: Path) -> list[str]:
    """The shared slot's texts, read by a trio runtime (which also shows the store's lock is free)."""
    async with ctxrt.open_runtime(path) as runtime:
        manager = await runtime.open("reader")
        return [message.content[0].text for message in await manager.get_all_messages()]


async def stored_ids(path: Path) -> list[str]:
    """The shared slot's message ids, read by a trio runtime."""
    async with ctxrt.open_runtime(path) as runtime:
        manager = await runtime.open("reader")
        return [message.id for message in await manager.get_all_messages()]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_runtime_on_a_loop_shares_one_guest_run_that_ends_with_the_last(tmp_path: Path, loop: str) -> None:
    """The first runtime opened on a loop starts the trio guest run, a second one joins it, and the
    run ends when the last closes, before its block's exit returns (H2)."""

    async def main() -> list[bool]:
        running = [trio.lowlevel.in_trio_run()]
        async with ctxrt.aio.open_runtime(tmp_path / "one") as one:
            running.append(trio.lowlevel.in_trio_run())
            async with ctxrt.aio.open_runtime(tmp_path / "two") as two:
                await one.open("a")
                await two.open("b")
            running.append(trio.lowlevel.in_trio_run())  # the first runtime still holds it
        running.append(trio.lowlevel.in_trio_run())
        return running

    assert run(main, loop) == [False, True, True, False]


def test_two_loops_in_two_threads_each_serve_their_own_runtime(tmp_path: Path) -> None:
    """Two asyncio loops in two threads, each with a runtime on its own store, write and compile at
    the same time; each reads back exactly its own messages, and a manager awaited from the other
    loop is refused with a RuntimeError saying so (H2)."""
    results: dict[str, list[str]] = {}
    failures: list[BaseException] = []
    both_open = threading.Barrier(2, timeout=GUARD_S)
    managers: dict[str, Any] = {}

    def thread(name: str) -> None:
        async def main() -> None:
            async with ctxrt.aio.open_runtime(tmp_path / name, durability="os") as rt:
                manager = managers[name] = await rt.open("agents/ann", view_reader="ann")
                await asyncio.to_thread(both_open.wait)
                other = managers["right" if name == "left" else "left"]
                with pytest.raises(RuntimeError, match="another event loop"):  # not through another loop's run
                    await other.message_count()
                for number in range(40):
                    await manager.add_message("user", f"{name} {number}")
                    await manager.compile(ctxrt.Budget(max_tokens=20_000))
                results[name] = [m.content[0].text for m in await manager.get_all_messages()]

        try:
            run(main)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=thread, args=(name,)) for name in ("left", "right")]
    for each in threads:
        each.start()
    for each in threads:
        each.join(GUARD_S)
    assert not failures, failures
    assert results == {name: [f"{name} {n}" for n in range(40)] for name in ("left", "right")}


def test_a_runtime_reopened_many_times_on_one_loop_leaks_no_thread_or_task(tmp_path: Path) -> None:
    """A runtime opened, used and closed 30 times on one loop (each a guest run of its own): the
    thread count stays what it was after the first, no asyncio task is left, and nothing is
    abandoned or destroyed pending (H2)."""

    async def main() -> tuple[int, int, int]:
        counts = []
        for round_ in range(30):
            async with ctxrt.aio.open_runtime(tmp_path / "store", durability="os") as rt:
                manager = await rt.open("agents/ann")
                await manager.add_message("user", f"round {round_}")
            counts.append(threading.active_count())
        return counts[0], max(counts), len(asyncio.all_tasks())

    first, most, tasks = run(main)
    assert most <= first and tasks == 1
    assert trio.run(stored_texts, tmp_path / "store") == [f"round {n}" for n in range(30)]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_loops_shutdown_closes_a_runtime_left_open_and_waits_for_the_guest_run(tmp_path: Path, loop: str) -> None:
    """A runtime held open by a task that never finishes: when ``asyncio.run``'s main returns, the
    loop's shutdown cancels that task, the runtime closes, the guest run ends before the loop
    does (no task destroyed pending, no run abandoned), and every acknowledged message is stored (H2)."""
    acknowledged: list[str] = []

    async def main() -> None:
        opened = asyncio.Event()

        async def resident() -> None:
            async with ctxrt.aio.open_runtime(tmp_path / "store") as rt:
                manager = await rt.open("agents/ann")
                for number in range(5):
                    await manager.add_message("user", f"left open {number}")
                    acknowledged.append(f"left open {number}")
                opened.set()
                await asyncio.Event().wait()  # forever: only the loop's shutdown ends it

        asyncio.get_running_loop().create_task(resident())
        await opened.wait()

    run(main, loop)
    assert not trio.lowlevel.in_trio_run()
    assert trio.run(stored_texts, tmp_path / "store") == acknowledged


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_hosts_signal_handlers_keep_working_while_a_runtime_is_open_and_after(tmp_path: Path, loop: str) -> None:
    """asyncio's ``add_signal_handler`` (which owns ``signal.set_wakeup_fd``, as uvloop does) still
    delivers signals while a ctxrt.aio runtime is open and after its guest run ended: trio is told
    the host owns the wake-up fd, so it neither takes it nor puts back a stale one (H2)."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        heard: asyncio.Queue[str] = asyncio.Queue()
        loop.add_signal_handler(signal.SIGUSR1, heard.put_nowait, "usr1")
        try:
            async with ctxrt.aio.open_runtime(tmp_path / "store") as rt:
                await (await rt.open("agents/ann")).add_message("user", "open")
                os.kill(os.getpid(), signal.SIGUSR1)
                during = await heard.get()
            os.kill(os.getpid(), signal.SIGUSR1)
            after = await heard.get()
            return [during, after]
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    assert run(main, loop) == ["usr1", "usr1"]


def test_a_cancelled_asyncio_caller_cancels_its_trio_call_and_the_runtime_keeps_serving(tmp_path: Path) -> None:
    """An asyncio task awaiting ``tick()`` while the model's reply is held back is cancelled: its
    CancelledError arrives with the reply still held (the trio call was cancelled, not waited
    out), the runtime serves the next calls, and the unit still runs to its end once the model
    answers (L4, H3)."""

    async def main() -> None:
        release = trio.Event()

        async def reply(request: ctxrt.ModelRequest) -> str:
            await release.wait()
            return "a summary"

        model = ScriptedModel(reply)
        async with ctxrt.aio.open_runtime(tmp_path / "store", durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", strategy=SMALL, model=model)
            for number in range(12):
                await ann.add_message("user", f"message {number} with some words to summarise later on")
            ticking = asyncio.ensure_future(ann.tick())
            while not model.requests:
                await asyncio.sleep(0)
            ticking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ticking
            assert not release.is_set()
            message_id = await ann.add_message("user", "served after the cancel")
            compiled = await ann.compile(ctxrt.Budget(max_tokens=100_000))
            assert message_id in {source.id for sources in compiled.provenance.messages for source in sources}
            release.set()  # a trio Event, set from asyncio: the guest run shares the thread
            await ann.wait_ready()
            assert (await ann.health()).ready
            assert any("a summary" in repr(m) for m in (await ann.compile(ctxrt.Budget(max_tokens=100_000))).messages)

    run(main)


def test_a_caller_cancelled_as_its_call_ends_is_never_left_waiting(tmp_path: Path) -> None:
    """Calls cancelled after every count of loop passes from 0 to 8, 40 times each: the cancel
    lands before, during and just as the trio call ends, and each caller is done within the guard,
    cancelled or answered (H3)."""

    async def main() -> set[tuple[int, str]]:
        seen = set()
        async with ctxrt.aio.open_runtime(tmp_path / "store", durability="os") as rt:
            manager = await rt.open("agents/ann")
            await manager.add_message("user", "one")
            for passes in range(9):
                for _ in range(40):
                    counting = asyncio.ensure_future(manager.message_count())
                    for _ in range(passes):
                        await asyncio.sleep(0)
                    counting.cancel()
                    async with asyncio.timeout(GUARD_S / 4):
                        await asyncio.wait([counting])
                    seen.add((passes, "cancelled" if counting.cancelled() else "answered"))
        return seen

    seen = run(main)
    assert (0, "cancelled") in seen and (8, "answered") in seen


def test_a_caller_cancelled_while_entering_a_runtime_or_a_subscription_is_never_left_waiting(tmp_path: Path) -> None:
    """H2, H3 (from a host-style attack): a task cancelled after every count of loop passes from 0
    to 20 while it enters ``open_runtime`` (then opens and writes), or enters ``subscribe()``, is done
    within the guard; before, a cancel at one pass left it waiting for ever (and "Task was destroyed
    but it is pending" at the loop's end)."""

    async def enter_runtime(k: int) -> None:
        async with ctxrt.aio.open_runtime(tmp_path / f"store-{k}", durability="os") as rt:
            await (await rt.open("x")).add_message("user", "in the block")

    async def main() -> set[str]:
        seen = set()
        async with ctxrt.aio.open_runtime(tmp_path / "subscribed", durability="os") as rt:
            manager = await rt.open("agents/ann")

            async def enter_subscription() -> None:
                async with manager.subscribe() as events:
                    await manager.add_message("user", "heard")
                    await events.receive()

            for passes in range(21):
                for enter in (lambda: enter_runtime(passes), enter_subscription):  # noqa: B023 - this pass's
                    task = asyncio.ensure_future(enter())
                    for _ in range(passes):
                        await asyncio.sleep(0)
                    task.cancel()
                    async with asyncio.timeout(GUARD_S / 4):
                        await asyncio.wait([task])
                    seen.add("cancelled" if task.cancelled() else "done")
        return seen

    assert "cancelled" in run(main)


def test_a_call_waiting_when_its_runtime_closes_is_answered_with_the_trio_error(tmp_path: Path) -> None:
    """A task awaiting ``tick()`` (its model holding the reply) while the runtime's block exits in
    another task is answered with the error a trio caller gets (a CtxrtError), not cancelled and not
    left waiting (H3)."""

    async def main() -> BaseException:
        held = trio.Event()

        async def reply(request: ctxrt.ModelRequest) -> str:
            await held.wait()
            return "never"

        model = ScriptedModel(reply)
        async with ctxrt.aio.open_runtime(tmp_path / "store", durability="os") as rt:
            ann = await rt.open("agents/ann", view_reader="ann", strategy=SMALL, model=model)
            for number in range(12):
                await ann.add_message("user", f"message {number} with some words to summarise later on")
            ticking = asyncio.ensure_future(ann.tick())
            while not model.requests:
                await asyncio.sleep(0)
        try:
            await ticking
        except ctxrt.CtxrtError as exc:
            return exc
        raise AssertionError("tick returned although its runtime closed")

    assert isinstance(run(main), (ctxrt.ManagerClosedError, ctxrt.RuntimeClosedError))


def test_ctxrt_aio_under_trio_names_the_trio_entry_point(tmp_path: Path) -> None:
    """ctxrt.aio.open_runtime awaited from trio raises a RuntimeError pointing at ctxrt.open_runtime (H1)."""

    async def main() -> None:
        async with ctxrt.aio.open_runtime(tmp_path / "store"):
            pass

    with pytest.raises(RuntimeError, match=r"from trio, use ctxrt\.open_runtime"):
        trio.run(main)
    assert not (tmp_path / "store").exists()


class Interrupting:
    """A model that presses Ctrl-C on its own process from inside the trio guest run."""

    async def complete(self, request: ctxrt.ModelRequest) -> ctxrt.ModelResponse:
        os.kill(os.getpid(), signal.SIGINT)
        await trio.sleep_forever()
        raise AssertionError("not reached")


async def _interrupted(path: Path, acknowledged: list[str], heard: list[dict[str, Any]]) -> None:
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: heard.append(context))
    async with ctxrt.aio.open_runtime(path) as rt:
        ann = await rt.open("agents/ann", view_reader="ann", strategy=SMALL, model=Interrupting())
        for number in range(12):
            text = f"message {number} with some words to summarise later on"
            await ann.add_message("user", text)
            acknowledged.append(text)
        await ann.wait_ready()


@pytest.mark.parametrize("how", ["asyncio.run", "run_until_complete"])
def test_ctrl_c_in_the_guest_run_reaches_the_asyncio_host_as_keyboard_interrupt(tmp_path: Path, how: str) -> None:
    """Ctrl-C pressed while trio code runs (a namespace actor's model call) comes out of the loop's
    run as a bare KeyboardInterrupt: under ``asyncio.run`` through asyncio's own handler; under a
    loop run by hand, where trio's handler delivers it only into trio code, through the guest run's
    end, the guest's own task ended too. Every runtime is closed by then and each acknowledged
    append stored (H4)."""
    acknowledged: list[str] = []
    heard: list[dict[str, Any]] = []
    with pytest.raises(KeyboardInterrupt) as raised:
        if how == "asyncio.run":
            asyncio.run(_interrupted(tmp_path / "store", acknowledged, heard))
        else:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(_interrupted(tmp_path / "store", acknowledged, heard))
            finally:
                loop.close()  # at once: what is left pending now is destroyed pending
    assert type(raised.value) is KeyboardInterrupt
    del raised  # its traceback holds the loop's last frames
    gc.collect()
    ours = [context for context in heard if "ctxrt.aio" in repr(context.get("task"))]
    assert ours == [], ours  # the guest's task had ended (the host's own is the host's to end)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not trio.lowlevel.in_trio_run()
    assert trio.run(stored_texts, tmp_path / "store") == acknowledged  # closed: its lock is free


GUEST_SOURCE = Path(ctxrt.aio.guest.__file__)


def interrupt_at_line(count: int) -> Callable[[types.FrameType, str, Any], Any]:
    """A trace function that sends this process a real SIGINT at the ``count``-th line the guest
    module (ctxrt/aio/guest.py) runs, once: trio's handler then acts at that very point."""
    seen = 0

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if frame.f_code.co_filename != str(GUEST_SOURCE):
            return None
        if event == "line":
            seen += 1
            if seen == count:
                os.kill(os.getpid(), signal.SIGINT)
        return trace

    return trace


async def _appending(path: Path, trace: Callable[[types.FrameType, str, Any], Any]) -> None:
    async with ctxrt.aio.open_runtime(path) as rt:
        managers = [await rt.open(f"agents/n{index}", view_reader=f"n{index}") for index in range(2)]
        for manager in managers:  # every call's trio worker has been spawned and parked once
            await manager.add_message("user", "warm-up")

        async def append(manager: ctxrt.aio.ContextManager) -> None:
            while True:
                await manager.add_message("user", "more")

        sys.settrace(trace)
        await asyncio.gather(*(append(manager) for manager in managers))


@pytest.mark.soak
def test_ctrl_c_at_any_line_of_the_guest_run_ends_a_loop_run_by_hand_with_keyboard_interrupt(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """A real SIGINT at each line in turn that ctxrt.aio's guest module runs while two asyncio
    tasks append (trio's handler, so it lands in trio code or is deferred to the run's main task):
    each time the loop's run ends with a bare KeyboardInterrupt and the trio run with it (H4). A
    parked worker interrupted between being listed idle and parking once broke the trio run
    (TrioInternalError) and hung the callers."""
    for count in range(1, soak_scale(160, 600) + 1):
        store = tmp_path / f"store{count}"
        loop = asyncio.new_event_loop()
        previous = sys.gettrace()
        loop.call_later(GUARD_S, loop.stop)  # a guard that holds even when a close waits on a broken run
        try:
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(_appending(store, interrupt_at_line(count)))
        finally:
            sys.settrace(previous)
            loop.close()
        assert not trio.lowlevel.in_trio_run(), count
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, count
    assert verify_store(store).status == "sound"


def interrupt_host_process(store: Path, how: str, acks: int, again_after_s: float | None = None) -> tuple[str, str, int]:
    """Run ``aio_interrupt_host.py`` (``how``: how it runs its loop) on ``store``, send it a real
    SIGINT once it has acknowledged ``acks`` appends (and another ``again_after_s`` later, if
    given); its stdout, stderr and exit status."""
    child = subprocess.Popen([sys.executable, str(HOST_SCRIPT), how, str(store)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    lines: list[str] = []
    try:
        while sum(line.startswith("ack") for line in lines) < acks:
            ready, _, _ = select.select([child.stdout], [], [], GUARD_S)
            assert ready, "the host stopped acknowledging"
            lines.append(child.stdout.readline().decode().strip())
            assert lines[-1], child.stderr.read().decode()
        child.send_signal(signal.SIGINT)
        if again_after_s is not None:
            time.sleep(again_after_s)
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        rest, errors = child.communicate(timeout=GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return "\n".join(lines) + "\n" + rest.decode(), errors.decode(), child.returncode


def acknowledged_and_stored(store: Path, output: str) -> None:
    """The store verifies sound and holds every append the host's output acknowledged."""
    assert verify_store(store).status == "sound"
    acknowledged = set(re.findall(r"^ack (\d+)$", output, re.MULTILINE))
    assert acknowledged <= set(trio.run(stored_ids, store))


@pytest.mark.parametrize("how", ["asyncio.run", "run_until_complete"])
def test_sigint_to_an_asyncio_host_process_ends_it_with_keyboard_interrupt_and_a_sound_store(
    tmp_path: Path, how: str
) -> None:
    """A real SIGINT to a child process whose asyncio tasks append through ctxrt.aio: the host's
    loop ends with KeyboardInterrupt, the store verifies sound, and every acknowledged append is
    stored (H4)."""
    output, errors, status = interrupt_host_process(tmp_path / "store", how, 40)
    assert "caught KeyboardInterrupt" in output, errors[-2000:]
    assert status != 0
    acknowledged_and_stored(tmp_path / "store", output)


def test_a_guest_run_that_dies_answers_every_waiting_caller_with_an_error_that_says_so(tmp_path: Path) -> None:
    """A trio run that dies without unwinding its tasks (here a model breaks trio's bookkeeping: it
    reschedules its own task, which then ends, so the run dies of TrioInternalError) answers every
    asyncio caller still waiting, a call and the runtime's block exit alike, with RuntimeClosedError
    naming what it died of; a loop run by hand returns instead of waiting forever (H7). In a child
    process: a dead run can't close its store, which stays open until the process ends."""
    child = subprocess.run([sys.executable, str(DYING_HOST), str(tmp_path / "store")], capture_output=True,
                           timeout=GUARD_S * 2, check=False)
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    assert child.stdout.decode().splitlines() == ["RuntimeClosedError caused by TrioInternalError"], child.stdout


DYING_HOST = Path(__file__).with_name("aio_dying_host.py")


@pytest.mark.soak
def test_a_second_ctrl_c_under_asyncio_run_ends_the_host_and_leaves_its_store_sound(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """Two real SIGINTs 1-10 ms apart into an asyncio.run host appending from four tasks: asyncio's
    handler cancels the main task at the first and raises KeyboardInterrupt wherever the second
    lands, inside ctxrt's cleanup included. The process ends (it once hung closing its store under
    a transaction the writer thread still held), the store verifies sound, and every acknowledged
    append is stored (H4). The seed is in every failure message."""
    seed = int(os.environ.get("CTXRT_INTERRUPT_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    for round_ in range(soak_scale(2, 40)):
        store = tmp_path / f"store{round_}"
        try:
            output, _, _ = interrupt_host_process(store, "asyncio.run", rng.randrange(20, 400), rng.uniform(0.001, 0.01))
            acknowledged_and_stored(store, output)
        except BaseException as exc:
            exc.add_note(f"round {round_}, seed {seed}")
            raise


def interrupt_in_first_call(code: types.CodeType, count: int, raise_it: bool) -> Callable[..., Any]:
    """A trace function for the first call of ``code``: at the ``count``-th line it and what it
    calls run, a KeyboardInterrupt there (``raise_it``), or a real SIGINT to this process (whose
    Python handler then acts at that very point). ``lines`` on it: how many lines that call ran."""
    depth = 0
    done = False

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal depth, done
        if done or (depth == 0 and frame.f_code is not code):
            return None
        if event == "call":
            depth += 1
        elif event == "return":
            depth -= 1
            done = depth == 0
        elif event == "line":
            trace.lines += 1  # type: ignore[attr-defined]
            if trace.lines == count:  # type: ignore[attr-defined]
                if raise_it:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGINT)
        return trace

    trace.lines = 0  # type: ignore[attr-defined]
    return trace


def traced(trace: Callable[..., Any], function: Callable[[], Any]) -> Any:
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return function()
    finally:
        sys.settrace(previous)


def test_a_writer_stop_cut_short_by_ctrl_c_at_any_line_and_made_again_ends_the_threads_transaction(
    tmp_path: Path,
) -> None:
    """The store's writer thread holds a write transaction between batches; a second Ctrl-C under
    ``asyncio.run`` may cut its stop short at any line, and the store's close stops it again. For a
    KeyboardInterrupt at each line in turn of the first stop (Python's threading included: one
    raised inside ``Thread.is_alive`` marks a thread still running as stopped), the second stop
    ends the thread's transaction and the thread, so the environment closes (it hung closing under
    the transaction; H4)."""
    count = 0
    while True:
        count += 1
        env = lmdb.open(str(tmp_path / f"env{count}"), map_size=1 << 20)
        writer = WriterThread(env)
        writer.start()
        writer.begin()  # the thread holds the next batch's transaction, as between batches
        trace = interrupt_in_first_call(WriterThread.stop.__code__, count, raise_it=True)
        try:
            traced(trace, writer.stop)
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
        writer.stop()
        # Another thread's write transaction begins only once the writer thread's has ended.
        other = threading.Thread(target=lambda: env.begin(write=True).abort())
        other.start()
        other.join(GUARD_S)
        assert not other.is_alive(), f"the writer thread still holds its transaction (interrupt at line {count})"
        env.close()
        if not interrupted:
            break
    assert count > 10  # the sweep reached the thread's join


async def _closing_at_a_second_ctrl_c(path: Path, trace: Callable[..., Any]) -> None:
    async with ctxrt.aio.open_runtime(path) as rt:
        manager = await rt.open("agents/a", view_reader="a")
        await manager.add_message("user", "kept")
        sys.settrace(trace)
        os.kill(os.getpid(), signal.SIGINT)  # asyncio's handler: the first Ctrl-C cancels this task
        await asyncio.Event().wait()


def _second_ctrl_c_while_stopping(store: Path, count: int) -> int:
    """One round: the second Ctrl-C at the ``count``-th line of the guest run's stop (none at 0);
    how many lines that stop ran."""
    trace = interrupt_in_first_call(ctxrt.aio.guest.Guest.stop.__code__, count, raise_it=False)
    previous = sys.gettrace()
    try:
        with pytest.raises(KeyboardInterrupt):
            with asyncio.Runner() as runner:
                # A guard that holds even when the shutdown waits on a run nobody wakes.
                runner.get_loop().call_later(GUARD_S, runner.get_loop().stop)
                runner.run(_closing_at_a_second_ctrl_c(store, trace))
    finally:
        sys.settrace(previous)
    assert not trio.lowlevel.in_trio_run(), count
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, count
    assert trio.run(stored_texts, store) == ["kept"], count  # closed: its lock is free
    return int(trace.lines)  # type: ignore[attr-defined]


@pytest.mark.soak
def test_a_second_ctrl_c_at_any_line_of_stopping_the_guest_run_still_ends_the_loop_and_the_run(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """Under ``asyncio.run``, a first Ctrl-C cancels the main task, which closes its runtime and so
    stops the guest run; a second real SIGINT at each line in turn of that stop (trio's wake-up of
    the run included; every 5th line in ``make test``) comes out of the loop's run as
    KeyboardInterrupt, and the loop's shutdown still ends the trio run and closes the store. A stop
    cut in half once left trio waiting for a wake-up nobody would make again, and the shutdown
    waiting for trio (H4)."""
    lines = _second_ctrl_c_while_stopping(tmp_path / "store", 0)
    assert lines > 10, lines  # the sweep reaches trio's wake-up of the run
    for count in range(1, lines + 1, soak_scale(5, 1)):
        _second_ctrl_c_while_stopping(tmp_path / f"store{count}", count)


def test_a_wait_for_a_commit_cut_short_by_ctrl_c_at_any_line_leaves_the_writer_usable(tmp_path: Path) -> None:
    """The loop waits for the writer thread's commit (its turns); a KeyboardInterrupt at each line
    in turn of that wait, one raised just after it took the thread's token among them, may be
    swallowed (trio disables the instrument it landed in) and the store go on: the commit still
    lands, ``landed`` returns, and the writer stops. Taking a token then lost its count, and the
    loop blocked for a turn that had ended (H4)."""
    count = missed = reached = 0
    while missed < 3:  # past the wait's last line: a wait whose commit already ended runs fewer lines
        count += 1
        env = lmdb.open(str(tmp_path / f"env{count}"), map_size=1 << 20)
        writer = WriterThread(env)
        writer.start()
        writer.begin().put(b"key", b"value")
        outcomes: list[object] = []

        def commit_and_land() -> None:
            writer.commit()
            try:
                traced(interrupt_in_first_call(WriterThread.wait.__code__, count, raise_it=True),
                       lambda: writer.wait(GUARD_S))
            except KeyboardInterrupt:
                outcomes.append("interrupted")
            ready, _, _ = select.select([writer.ready], [], [], GUARD_S)
            assert ready
            outcomes.append(writer.landed())
            writer.stop()

        thread = threading.Thread(target=commit_and_land)  # a hang fails the test instead
        thread.start()
        thread.join(GUARD_S)
        assert not thread.is_alive(), f"the loop waits for a turn that ended (interrupt at line {count})"
        assert outcomes[-1] is None, outcomes
        with env.begin() as txn:
            assert txn.get(b"key") == b"value"
        env.close()
        missed = 0 if "interrupted" in outcomes else missed + 1
        reached = count if "interrupted" in outcomes else reached
    assert reached > 5


def test_a_ctrl_c_python_drops_in_a_weakref_callback_still_stops_the_loops_run(tmp_path: Path) -> None:
    """H4: a hand-run loop (trio's SIGINT handler in place): a Ctrl-C whose handler runs inside a
    weakref callback fired in trio code raises there, where Python drops it ("Exception
    ignored"); the guest run raises it again outside trio code, so the loop's run ends with
    KeyboardInterrupt rather than running on (before: "ran on", about 1 Ctrl-C in 30)."""
    script = Path(__file__).with_name("aio_lost_ctrl_c_host.py")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(ctxrt.__file__).parent.parent)})
    assert done.stdout.splitlines()[:2] == ["caught KeyboardInterrupt", "hook restored True"], done.stdout + done.stderr
