"""A real SIGINT at each awaiting line of ctxrt a host runs, and each line of the namespace
actor's loop, in turn, in a trio host, an ``asyncio.run`` host and a host running its asyncio
loop by hand (L8, H4).

How: a first run of the host, traced, lists every line of ctxrt's source that awaits (``await``,
``async with``, ``async for``), and every line of ``namespace/actor.py``, in the order the host
first reaches them. Then, for each such line
in turn, a fresh host on a fresh store runs traced until it first reaches that line, and the trace
function sends the process a real SIGINT there: trio's handler (or asyncio's, under
``asyncio.run``) acts at that very point. Each run must end in a bare ``KeyboardInterrupt`` (no
``TrioInternalError``, no ``ManagerClosedError``, no group), with every acknowledged append stored
and the store sound. The host's workload reaches most of the manager's API: appends, compiles,
edits, removals, pins, holds, a fork and a switch back, a derive, and background compression.

``make test`` runs every line of ``mailbox.py`` (where a reply's setup and its wait once let an
interrupt in between, breaking the trio run) and a seeded sample of the rest; ``make soak`` every
line. (An interrupt in the actor's loop between taking an effect and carrying it out was once
replaced by the runtime's cancel: ``ManagerClosedError`` out of ``open_runtime``.) ``CTXRT_INTERRUPT_SEED`` replays a sample.
"""

from __future__ import annotations

import asyncio
import linecache
import os
import random
import signal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.aio
from ctxrt import Autobiographical, Budget, OfflineModel, Passthrough
from ctxrt.testing import verify_store

ROOT = str(Path(ctxrt.__file__).parent) + os.sep
AWAITING = ("await ", "async with ", "async for ")
ACKS_BEFORE_STOP = 120  # a run's length: every operation of the cycle below, three times
SAMPLE = 6  # lines per host in `make test`, besides mailbox.py's
GUARD_S = 30
ACTOR = os.sep.join(("", "namespace", "actor.py"))

Site = tuple[str, int]


class Acks:
    """What the host was told is stored: (branch, message id) per append, less what it removed."""

    def __init__(self) -> None:
        self.stored: set[tuple[str, str]] = set()
        self.count = 0


def line(index: int, number: int) -> str:
    return f"line {number} of namespace {index}: " + "some words to compress " * 12


def memory() -> Autobiographical:
    return Autobiographical("offline", target_chunk_tokens=200, head_window_tokens=50, recent_window_tokens=400,
                            summary_target_tokens=60, auto_tick=True, merge_threshold=3)


async def step(manager: Any, index: int, number: int, acks: Acks) -> None:
    """One append and one compile, and every so often one more of the manager's calls."""
    message_id = await manager.add_message("user", line(index, number))
    acks.stored.add((manager.branch, message_id))
    acks.count += 1
    await manager.compile(Budget(20_000, 1_000))
    match number % 40:
        case 3:
            await manager.get_message(message_id)
            await manager.query_messages(participant="user", limit=3)
            await manager.message_count()
        case 5:
            await manager.edit_message(message_id, line(index, number) + " (edited)")
        case 7:
            pin = await manager.pin_range(message_id, message_id)
            await manager.unpin(pin.id)
        case 9:
            await manager.hold_compression([message_id])
            await manager.release_compression([message_id])
        case 11:
            await manager.health()
            await manager.search_summaries(text="words", limit=3)
        case 13:
            await manager.fork()
        case 17:
            await manager.switch_branch("main")
        case 19:
            derived = await manager.derive(branch=f"derived-{index}-{number}", strategy=Passthrough())
            await derived.compile(Budget(20_000, 1_000))
            await derived.aclose()
        case 23:
            await manager.list_branches()
        case 29:
            acks.stored.discard((manager.branch, message_id))
            await manager.remove_message(message_id)


async def resident(index: int, manager: Any, acks: Acks) -> None:
    """One namespace's steps until the run has acknowledged ``ACKS_BEFORE_STOP`` appends in all."""
    number = 0
    while acks.count < ACKS_BEFORE_STOP:
        await step(manager, index, number, acks)
        number += 1


async def trio_host(path: Path, acks: Acks) -> None:
    async with ctxrt.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/n{index}", view_reader=f"n{index}", strategy=memory(),
                                       model=OfflineModel()) for index in range(2)]
        async with trio.open_nursery() as nursery:
            for index, manager in enumerate(managers):
                nursery.start_soon(resident, index, manager, acks)


async def asyncio_host(path: Path, acks: Acks) -> None:
    async with ctxrt.aio.open_runtime(path) as runtime:
        managers = [await runtime.open(f"agents/n{index}", view_reader=f"n{index}", strategy=memory(),
                                       model=OfflineModel()) for index in range(2)]
        await asyncio.gather(*(resident(index, manager, acks) for index, manager in enumerate(managers)))


def run_host(how: str, path: Path, acks: Acks) -> None:
    if how == "trio":
        trio.run(_guarded_trio, path, acks)
    elif how == "asyncio.run":
        asyncio.run(_guarded_asyncio(path, acks))
    else:
        loop = asyncio.new_event_loop()
        loop.call_later(GUARD_S, loop.stop)  # holds even where a broken trio run would strand the callers
        try:
            loop.run_until_complete(asyncio_host(path, acks))
        finally:
            loop.close()


async def _guarded_trio(path: Path, acks: Acks) -> None:
    with trio.fail_after(GUARD_S):
        await trio_host(path, acks)


async def _guarded_asyncio(path: Path, acks: Acks) -> None:
    # In the host's own task: asyncio.wait_for's task in between drops a cancel that comes just as
    # the host finishes, and with it asyncio.run's Ctrl-C.
    async with asyncio.timeout(GUARD_S):
        await asyncio_host(path, acks)


def traced(trace: Callable[[types.FrameType, str, Any], Any], run: Callable[[], None]) -> None:
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(previous)


def swept(filename: str, lineno: int) -> bool:
    """Whether the sweep interrupts at this line: an awaiting line anywhere, and every line of the
    namespace actor's loop (an effect taken off its queue and not yet carried out once let an
    interrupt be replaced by the cancel it caused). Not a bare ``try:``: Python compiles it to an
    instruction outside the handler it opens, which a real signal never interrupts, but a trace
    function's does (and then escapes the ``with`` around it, breaking trio's cancel scopes)."""
    text = linecache.getline(filename, lineno)
    if text.strip() == "try:":
        return False
    return filename.endswith(ACTOR) or any(word in text for word in AWAITING)


def discover(how: str, path: Path) -> list[Site]:
    """The lines of ctxrt's source the sweep interrupts at that the host reaches, in the order it
    first reaches them."""
    sites: dict[Site, None] = {}

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not filename.startswith(ROOT):
            return None
        if event == "line":
            site = (filename, frame.f_lineno)
            if site not in sites and swept(*site):
                sites[site] = None
        return trace

    traced(trace, lambda: run_host(how, path, Acks()))
    return list(sites)


def interrupt_at(how: str, site: Site, path: Path) -> tuple[BaseException | None, bool, Acks]:
    """Run the host until it first reaches ``site``, and SIGINT the process there; what the host's
    run raised, whether the signal was sent, and what was acknowledged."""
    sent = False
    acks = Acks()

    def trace(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal sent
        if sent or not frame.f_code.co_filename.startswith(ROOT):
            return None
        if event == "line" and (frame.f_code.co_filename, frame.f_lineno) == site:
            sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return trace

    raised: BaseException | None = None
    try:
        traced(trace, lambda: run_host(how, path, acks))
    except BaseException as exc:  # noqa: BLE001 - what the host's run raised is what is checked
        raised = exc
    return raised, sent, acks


async def stored(path: Path, acks: Acks) -> list[tuple[str, str]]:
    """The acknowledged appends the store doesn't hold."""
    lost = []
    async with ctxrt.open_runtime(path, readonly=True) as runtime:
        for branch in sorted({branch for branch, _ in acks.stored}):
            reader = await runtime.open("sweep-check", branch=branch)
            for message_branch, message_id in sorted(acks.stored):
                if message_branch == branch and await reader.get_message(message_id) is None:
                    lost.append((branch, message_id))
    return lost


def chosen(sites: list[Site], soak: bool) -> tuple[list[Site], int | None]:
    if soak:
        return sites, None
    seed = int(os.environ.get("CTXRT_INTERRUPT_SEED") or random.randrange(1 << 32))
    mailbox = [site for site in sites if site[0].endswith(f"{os.sep}mailbox.py")]
    rest = [site for site in sites if site not in mailbox]
    return mailbox + random.Random(seed).sample(rest, min(SAMPLE, len(rest))), seed


@pytest.mark.soak
@pytest.mark.parametrize("how", ["trio", "asyncio.run", "run_until_complete"])
def test_ctrl_c_at_any_awaiting_line_of_ctxrt_ends_the_host_in_a_bare_keyboard_interrupt(
    tmp_path: Path, how: str, soak_scale: Callable[[int, int], int]
) -> None:
    """A real SIGINT at each awaiting line ctxrt runs, in turn: the host's run ends in a bare
    KeyboardInterrupt (never TrioInternalError, ManagerClosedError or a group), every acknowledged
    append is stored and the store is sound (L8, H4). A Ctrl-C between a reply recording its
    waiting task and parking once broke the trio run at mailbox.py's wait (and hung a loop run by
    hand, H4)."""
    sites = discover(how, tmp_path / "discover")
    assert any(site[0].endswith(f"{os.sep}mailbox.py") for site in sites), "the host never waited on a reply"
    sample, seed = chosen(sites, soak=soak_scale(0, 1) == 1)
    unreached = []
    for number, site in enumerate(sample):
        where = f"{site[0].removeprefix(ROOT)}:{site[1]} ({how}, seed {seed})"
        path = tmp_path / f"store{number}"
        raised, sent, acks = interrupt_at(how, site, path)
        if not sent:  # a line only some runs reach (a model call cancelled, say): the run ended whole
            assert raised is None, f"{where}, never reached: {raised!r}"
            unreached.append(where)
            continue
        assert type(raised) is KeyboardInterrupt, f"{where}: {raised!r}"
        del raised  # its traceback holds the host's frames
        assert not trio.lowlevel.in_trio_run(), where
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, where
        if not (path / "data.mdb").exists():  # interrupted before the store was made
            assert not acks.stored, where
            continue
        report = verify_store(path)
        assert report.status == "sound", f"{where}: {report}"
        lost = trio.run(stored, path, acks)
        assert not lost, f"{where}: acknowledged appends lost: {lost[:5]}"
    assert len(unreached) <= len(sample) // 10, f"lines the host no longer reaches: {unreached}"
