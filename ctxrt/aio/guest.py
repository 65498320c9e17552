"""One trio guest run per asyncio loop: what ``ctxrt.aio`` runs the trio runtime on.

The first ``ctxrt.aio`` runtime opened on a loop starts a trio run as a guest of that loop
(``trio.lowlevel.start_guest_run``); every runtime on the loop shares it, and it ends when the
last one closes. An asyncio task, the keeper, stands for the run on the loop: a loop's shutdown
(``asyncio.run`` cancelling what is left) cancels the keeper, which closes every runtime still
open and waits for the run to end, so no trio run outlives its loop.

Trio code runs on the loop's thread, between the loop's callbacks; only trio's wait for I/O
runs in a worker thread. So an asyncio caller hands a call to a new trio task directly
(``Nursery.start_soon`` from host code, which guest mode allows) and the trio task answers the
caller's future directly. What costs is waking trio when it is parked in its I/O thread (a
wake-up byte to that thread, then ``call_soon_threadsafe`` back): after each call a pump task
keeps trio runnable for ``LINGER_TICKS`` more of its scheduler passes, so a caller's next call,
made within them, finds trio awake (bench/results-aio.md has the figures).

Pitfalls of guest mode, and what this module does about each:

- The signal wake-up fd: asyncio (``add_signal_handler``) and uvloop need it, and trio would
  restore its own predecessor when its run ends, mid-program here. The run is started with
  ``host_uses_signal_set_wakeup_fd=True``: trio leaves it to the host.
- Ctrl-C: when the host left Python's default SIGINT handler in place, trio installs its own,
  which raises ``KeyboardInterrupt`` only in trio code. Wherever it lands in trio, the run stops
  (every runtime is closed, as a trio host's would be, L8) and the interrupt is raised on the
  loop as itself, out of ``run_until_complete``/``asyncio.run``. A step that would leave trio's
  bookkeeping half done (a worker listing itself idle and parking) runs with it deferred.
  ``asyncio.run``'s handler raises it (at a second Ctrl-C) wherever the main thread is, trio's
  protection aside: each step of asyncio code that wakes trio (stopping the run, leaving a held
  context, cancelling a call) runs with it deferred (``ctrl_c_deferred``), or a wake-up cut in
  half would leave a trio task waiting for it, and the loop's shutdown waiting for that task.
- A run that dies without unwinding its tasks (trio's bookkeeping broken): every call and held
  context still waiting is failed with ``RuntimeClosedError`` naming the cause, so no asyncio
  caller waits forever (H7).
- One guest run per thread: a loop whose thread already runs trio gets ``RuntimeError`` naming
  that; a second loop in another thread gets a run of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

import outcome
import trio

from ..errors import RuntimeClosedError
from ..manager import ContextManager

logger = logging.getLogger("ctxrt.aio")

T = TypeVar("T")

# How many scheduler passes trio stays runnable after a call answers: a caller's next call, made
# within them, needs no wake-up through trio's I/O thread. Each pass costs the loop one callback.
LINGER_TICKS = 3
# Parked worker tasks kept for later calls, at most: as many as calls were out at once, up to this.
MAX_IDLE_WORKERS = 256

_GUESTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Guest] = weakref.WeakKeyDictionary()
_NOTHING: Any = object()


def single(error: BaseException) -> BaseException:
    """An exception group's first leaf (the only one, for the groups ctxrt's calls raise), else
    ``error``: asyncio callers get ctxrt's own classes, never a group."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def _interrupt(result: outcome.Outcome[Any]) -> BaseException | None:
    """The KeyboardInterrupt (or SystemExit) a run ended with, wherever in its tasks it was raised."""
    if not isinstance(result, outcome.Error):
        return None
    error = result.error
    if isinstance(error, BaseExceptionGroup):
        found, _ = error.split((KeyboardInterrupt, SystemExit))
        return None if found is None else single(found)
    return error if isinstance(error, (KeyboardInterrupt, SystemExit)) else None


class LostCtrlC:
    """``sys.unraisablehook`` while a guest run lives on the main thread's loop. A
    ``KeyboardInterrupt`` trio's SIGINT handler raised inside a weakref callback or a ``__del__``
    (the garbage collector runs them wherever the main thread is, trio code included) is one
    Python drops, printing "Exception ignored": the host ran on as if Ctrl-C was never pressed
    (about 1 in 30 under a hand-run loop). The signal is raised again from a callback on that
    loop, outside trio code, where trio's handler defers it to its run, which stops as for any
    Ctrl-C."""

    def __init__(self) -> None:
        self.previous: Callable[[Any], None] = sys.unraisablehook
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, unraisable: Any) -> None:
        loop = self.loop
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(signal.raise_signal, signal.SIGINT)
        else:
            self.previous(unraisable)

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stand in for the hook while ``loop``'s run lives (signals reach only the main thread)."""
        if threading.current_thread() is threading.main_thread() and sys.unraisablehook is not self:
            self.previous, self.loop = sys.unraisablehook, loop
            sys.unraisablehook = self

    def unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is loop:
            self.loop = None
            if sys.unraisablehook is self:
                sys.unraisablehook = self.previous


_LOST_CTRL_C = LostCtrlC()


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold back the SIGINT handler's Python call (and so its ``KeyboardInterrupt``) for the
    block, then make it with what it would have had. For host code that wakes trio: asyncio's
    handler raises wherever the main thread is, and a wake-up cut in half (a trio ``Event`` set
    but its waiter not rescheduled, a task rescheduled but trio's tick not asked for) is lost for
    good: the flag says it happened, so no later call makes it again. Trio's own handler, given
    the frame, honours trio's protection as usual. Python runs signal handlers only in the main
    thread, so a loop in another thread has nothing to defer."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler) or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if caught:
            handler(*caught[0])


async def outlast_cancels(future: asyncio.Future[T]) -> T:
    """Wait for ``future`` whatever cancels the waiting task meanwhile; then re-raise the first
    cancel, if any. For the waits that must see trio's side finish: a cancelled caller's call
    unwinding, a runtime closing."""
    task = asyncio.current_task()
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            if not future.done() or (task is not None and task.cancelling()):
                cancelled = cancelled or exc
        except Exception:  # noqa: BLE001 - the future's own error: read below (an interrupt goes on)
            pass
    if cancelled is not None:
        raise cancelled
    return future.result()


def _settled(task: asyncio.Task[Any]) -> asyncio.Future[None]:
    """A future done (with None) once ``task`` is, however it ended."""
    future: asyncio.Future[None] = task.get_loop().create_future()

    def done(_: object) -> None:
        if not future.done():
            future.set_result(None)

    task.add_done_callback(done)
    return future


class Call:
    """One asyncio caller's call: what to await, the caller's future, the worker running it, and
    (once the caller was cancelled) the future that says the call has ended in trio."""

    __slots__ = ("function", "args", "kwargs", "future", "worker", "finished", "unwound")

    def __init__(self, future: asyncio.Future[Any], function: Callable[..., Awaitable[Any]], args: Any,
                 kwargs: Any) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.worker: Worker | None = None
        self.finished = False
        self.unwound: asyncio.Future[None] | None = None

    def answer(self, value: Any) -> bool:
        if self.future.cancelled():
            return False
        self.future.set_result(value)
        return True

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(single(error))

    def ended(self) -> None:
        self.finished = True
        if self.unwound is not None and not self.unwound.done():
            self.unwound.set_result(None)


class Worker:
    """A trio task that runs calls one after another, parked between them, inside a cancel scope
    of its own: cancelling a call cancels that scope, and the worker ends after that call."""

    __slots__ = ("scope", "call", "task")

    def __init__(self, call: Call) -> None:
        self.scope = trio.CancelScope()
        self.call: Call | None = call
        self.task: trio.lowlevel.Task | None = None
        call.worker = self


class Held(Generic[T]):
    """An async context manager of the trio API (a runtime, a subscription) held open by one trio
    task for an asyncio block: ``entered`` is its value or its error; ``exited`` what leaving it
    raised (None if nothing); ``during``, if given, runs with the value until the block leaves."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, factory: Callable[[], AbstractAsyncContextManager[T]],
        during: Callable[[T], Awaitable[None]] | None,
    ) -> None:
        self.factory = factory
        self.during = during
        self.entered: asyncio.Future[T] = loop.create_future()
        self.exited: asyncio.Future[BaseException | None] = loop.create_future()
        self.scope = trio.CancelScope()  # the whole hold: cancelled when the asyncio side gives up entering
        self.during_scope = trio.CancelScope()
        self.release = trio.Event()

    def leave(self) -> None:
        """From the asyncio block's exit: stop ``during`` and leave the context."""
        with ctrl_c_deferred():
            self.release.set()
            self.during_scope.cancel()

    def settle(self, error: BaseException | None) -> None:
        if not self.entered.done():
            self.entered.set_exception(error if error is not None else RuntimeClosedError("entering was cancelled"))
        if not self.exited.done():
            self.exited.set_result(error)


class Guest:
    """The trio guest run on one asyncio loop, shared by every ``ctxrt.aio`` runtime on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.stopping = False
        self.ready: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()
        self.keeper: asyncio.Task[None] | None = None
        self._gate: asyncio.Future[None] = loop.create_future()  # the keeper's own wait, done with the run
        self._stop = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._hot = 0
        self._parked: trio.Event | None = None
        self._idle: list[Worker] = []
        # What asyncio callers wait on, so a run that dies (of anything) answers every one of them.
        self._calls: set[Call] = set()
        self._held: set[Held[Any]] = set()
        self._host_raises_anywhere = False

    # -- the run ------------------------------------------------------------------------------

    def start(self) -> None:
        if trio.lowlevel.in_trio_run():
            raise RuntimeError(
                "ctxrt.aio can't start its trio guest run: this thread already runs trio (a trio.run, or a guest "
                "run another library started on this loop). From trio code, use ctxrt.open_runtime"
            )
        host_handler = signal.getsignal(signal.SIGINT)
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self._guarded(self.loop.call_soon_threadsafe),
            run_sync_soon_not_threadsafe=self._guarded(self.loop.call_soon),
            done_callback=self._done,
            host_uses_signal_set_wakeup_fd=True,
        )
        _LOST_CTRL_C.watch(self.loop)
        # Trio installs a SIGINT handler of its own when the host left Python's default in place: it
        # honours trio's protection, and puts the default back at the run's end (unseen by a step
        # deferring Ctrl-C). Else the host's handler (asyncio's) raises wherever the thread is.
        self._host_raises_anywhere = signal.getsignal(signal.SIGINT) is host_handler
        self.keeper = self.loop.create_task(self._keep(), name="ctxrt.aio trio guest run")

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._pump)
            self.ready.set_result(None)
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _guarded(self, schedule: Callable[[Callable[[], object]], object]) -> Callable[[Callable[[], object]], None]:
        """``schedule`` for trio's steps. A step that raises leaves the run frozen: trio never
        schedules its next step, nor calls ``_done``. Only a KeyboardInterrupt gets out of a step,
        raised by asyncio's own handler (``asyncio.run``'s, at a second Ctrl-C) wherever the main
        thread is; the run is then taken as ended by it, so no caller, keeper or loop shutdown
        waits for it, and the interrupt goes on out of the loop's run as asyncio means it to.

        Once the run is stopping, each step runs with the host's Ctrl-C deferred to its end (trio's
        own handler needs no help): an interrupt inside trio's own shutdown (its ``run_sync_soon``
        task, say) ended that task and left the run waiting on it for good, the loop's shutdown
        waiting on the run. A step costs the handler's swap then, a few microseconds, paid only by
        the last steps of a run."""

        def run_soon(step: Callable[[], object]) -> None:
            def guarded_step() -> None:
                try:
                    if self.stopping and self._host_raises_anywhere:
                        with ctrl_c_deferred():
                            step()
                    else:
                        step()
                except BaseException as exc:
                    self._done(outcome.Error(exc), raised=True)
                    raise

            schedule(guarded_step)

        return run_soon

    def _done(self, result: outcome.Outcome[Any], *, raised: bool = False) -> None:
        """The run ended with ``result`` (trio's done callback; or a step that raised, ``raised``)."""
        if self.finished.done():  # a step raised, and trio's own end came after all
            return
        self._nursery = None
        self.stopping = True
        _LOST_CTRL_C.unwatch(self.loop)
        if _GUESTS.get(self.loop) is self:
            del _GUESTS[self.loop]
        if not self.ready.done():
            self.ready.set_exception(RuntimeClosedError("ctxrt.aio's trio guest run stopped before it started"))
        self.finished.set_result(result)
        if not self._gate.done():
            self._gate.set_result(None)
        interrupt = _interrupt(result)
        if interrupt is not None:
            if not raised:  # else it is on its way out of the loop's run already
                # Out of the loop's run, to the host, as itself; from a callback queued behind the keeper's
                # wake-up, so the keeper has ended by then (a loop closed at once destroys no pending task).
                self.loop.call_soon(_raise, interrupt)
        elif isinstance(result, outcome.Error):
            logger.error("ctxrt.aio's trio guest run failed", exc_info=result.error)
        self._answer_the_stranded(result, interrupt)

    def _answer_the_stranded(self, result: outcome.Outcome[Any], interrupt: BaseException | None) -> None:
        """Fail every call and held context still waiting: a run that dies without unwinding its
        tasks (a broken trio run) would otherwise leave their asyncio callers waiting forever."""
        if not self._calls and not self._held:
            return
        if interrupt is not None:
            error = RuntimeClosedError(f"ctxrt.aio's trio guest run on this loop was interrupted "
                                       f"({type(interrupt).__name__}); its runtimes are closed")
        elif isinstance(result, outcome.Error):
            error = RuntimeClosedError(f"ctxrt.aio's trio guest run on this loop died of {result.error!r}; "
                                       "its runtimes are closed")
            error.__cause__ = result.error
        else:
            error = self.closed_error()
        futures: list[asyncio.Future[Any]] = []
        for call in list(self._calls):
            call.fail(error)
            call.ended()
            futures.append(call.future)
        for held in list(self._held):
            held.settle(error)
            futures.append(held.entered)
        for future in futures:  # a caller that is gone (its loop closing) leaves no "never retrieved" log
            if future.done() and not future.cancelled():
                future.exception()

    async def _keep(self) -> None:
        """Stands for the run on the loop until it ends; cancelled (the loop shutting down), it
        stops the run, closing every runtime still open, and waits for the end."""
        try:
            await self._gate
        except asyncio.CancelledError:
            self.stop()
            await outlast_cancels(self.finished)
            raise

    def stop(self) -> None:
        """End the run: every call and runtime still in it is cancelled (their callers hear
        ``RuntimeClosedError``), each runtime closing as on leaving its block."""
        with ctrl_c_deferred():
            if not self.stopping:
                self.stopping = True
                self._stop.set()

    def release(self) -> None:
        """A runtime on this run has closed; the last one ends the run."""
        self.users -= 1
        if self.users == 0:
            self.stop()

    async def wait_finished(self) -> None:
        """Until the run has ended and its keeper with it (cancels are outlasted, then re-raised)."""
        await outlast_cancels(self.finished)
        keeper = self.keeper
        if keeper is not None and keeper is not asyncio.current_task() and not keeper.done():
            await outlast_cancels(_settled(keeper))

    def closed_error(self) -> RuntimeClosedError:
        return RuntimeClosedError("ctxrt.aio's trio guest run on this loop has stopped (its runtimes are closed)")

    def _live(self) -> trio.Nursery:
        if self._nursery is None or self.stopping:
            raise self.closed_error()
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("a ctxrt.aio runtime was awaited from another event loop than the one that opened it; "
                               "open a runtime in each loop (each loop runs a trio guest run of its own)")
        return self._nursery

    # -- keeping trio awake between calls ---------------------------------------------------

    async def _pump(self) -> None:
        while True:
            if self._hot:
                self._hot -= 1
                await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                self._parked = trio.Event()
                await self._parked.wait()

    def _linger(self) -> None:
        if not LINGER_TICKS:
            return
        self._hot = LINGER_TICKS
        parked, self._parked = self._parked, None
        if parked is not None:
            parked.set()

    # -- calls ------------------------------------------------------------------------------

    async def call(self, function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await function(*args, **kwargs)`` in a trio task of this run, from an asyncio task.

        The call's error is raised as itself (a group of one as its leaf). If the asyncio caller
        is cancelled, the trio call is cancelled and the caller's ``CancelledError`` is raised once
        it has ended: the call is over, carried out whole or not at all as in trio (L4); a manager
        it made for nobody is closed.
        """
        nursery = self._live()
        call = Call(self.loop.create_future(), function, args, kwargs)
        self._calls.add(call)
        if self._idle:  # a parked worker: no task to spawn, no cancel scope to make
            worker = self._idle.pop()
            worker.call = call
            call.worker = worker
            assert worker.task is not None
            trio.lowlevel.reschedule(worker.task)
        else:
            nursery.start_soon(self._work, Worker(call), name="ctxrt.aio call")
        try:
            result: T = await call.future
            return result
        except asyncio.CancelledError:
            if call.future.cancelled():
                if not call.finished:  # else it ended (answering no one) before this handler ran
                    call.unwound = self.loop.create_future()
                    assert call.worker is not None
                    with ctrl_c_deferred():
                        call.worker.scope.cancel()
                    await outlast_cancels(call.unwound)
            elif call.future.exception() is None:  # answered as the cancel came: nobody will hold it
                await outlast_cancels(asyncio.ensure_future(self._discard_later(call.future.result())))
            raise
        finally:
            self._calls.discard(call)

    async def _work(self, worker: Worker) -> None:
        worker.task = trio.lowlevel.current_task()
        with worker.scope:
            while worker.call is not None:
                call, worker.call = worker.call, None
                await self._run(call)
                if worker.scope.cancel_called or len(self._idle) >= MAX_IDLE_WORKERS:
                    return
                await self._park(worker)

    @trio.lowlevel.enable_ki_protection
    async def _park(self, worker: Worker) -> None:
        """Idle ``worker`` until a call reschedules it. Ctrl-C is deferred (to the main task) from
        joining ``_idle`` to parking: a worker interrupted in between would stay listed while its
        task ends, and the next call would reschedule a dead task, breaking the trio run."""
        self._idle.append(worker)

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._idle.remove(worker)  # the run is stopping
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _run(self, call: Call) -> None:
        value = _NOTHING
        try:
            value = await call.function(*call.args, **call.kwargs)
        except Exception as exc:  # the call's own error, the caller's to handle
            call.fail(exc)
        except BaseException:  # cancelled (by its caller, or the run stopping), or Ctrl-C
            call.fail(self.closed_error())  # unless its caller, cancelled, is gone
            call.ended()
            raise
        finally:
            self._linger()
        if value is not _NOTHING and not call.answer(value):
            await _discard(value)
        call.ended()

    async def _discard_later(self, value: Any) -> None:
        if isinstance(value, ContextManager):
            with contextlib.suppress(RuntimeClosedError):  # the run stopped: its managers are closed already
                await self.call(value.aclose)

    # -- held contexts ----------------------------------------------------------------------

    def hold(
        self, factory: Callable[[], AbstractAsyncContextManager[T]], during: Callable[[T], Awaitable[None]] | None = None
    ) -> Held[T]:
        """Enter ``factory()`` in a trio task of this run and keep it open until ``Held.leave``."""
        held = Held(self.loop, factory, during)
        self._live().start_soon(self._hold, held, name="ctxrt.aio held context")
        self._held.add(held)
        held.exited.add_done_callback(lambda _: self._held.discard(held))
        return held

    async def _hold(self, held: Held[Any]) -> None:
        try:
            with held.scope:
                async with held.factory() as value:
                    # The asyncio side may have given up entering meanwhile: then leave at once,
                    # and still settle below (its caller waits for ``exited``).
                    if not held.entered.cancelled():
                        held.entered.set_result(value)
                        if held.during is not None:
                            with held.during_scope:
                                await held.during(value)
                        await held.release.wait()
        except Exception as exc:
            held.settle(single(exc))
            return
        except BaseException:
            held.settle(self.closed_error())
            raise
        held.settle(None)


def _raise(error: BaseException) -> None:
    raise error


async def _discard(value: Any) -> None:
    """A manager made for a caller that was cancelled meanwhile: closed, as if never made."""
    if isinstance(value, ContextManager):
        await value.aclose()


async def join(loop: asyncio.AbstractEventLoop) -> Guest:
    """The running guest run of ``loop``, started if there is none, with one more user; a run
    still stopping is waited for first. Release it with ``Guest.release`` and wait for
    ``Guest.wait_finished`` if that was the last user."""
    while True:
        guest = _GUESTS.get(loop)
        if guest is None:
            guest = Guest(loop)
            guest.start()
            _GUESTS[loop] = guest
        elif guest.stopping:
            await asyncio.shield(guest.finished)
            continue
        guest.users += 1
        try:
            await asyncio.shield(guest.ready)
        except BaseException:
            guest.release()
            if guest.users == 0:
                await guest.wait_finished()
            raise
        return guest


async def entered(held: Held[T]) -> T:
    """The held context's value, for the asyncio block's entry. Cancelled meanwhile, the trio
    task is cancelled and waited for (the context left), then the cancel raised."""
    try:
        return await held.entered
    except asyncio.CancelledError:
        with ctrl_c_deferred():
            held.scope.cancel()
        await outlast_cancels(held.exited)
        raise


async def left(held: Held[Any]) -> BaseException | None:
    """Leave the held context and wait until trio has left it; what leaving raised, or None."""
    if not held.exited.done():  # else its run has ended: there is no trio left to tell
        held.leave()
    return await outlast_cancels(held.exited)


async def each(channel: trio.abc.ReceiveChannel[T], deliver: Callable[[T], None]) -> None:
    """Trio side of a forwarded channel: each item to ``deliver``, in order, as it arrives."""
    async for item in channel:
        deliver(item)

