"""A real SIGINT during a fork, raised in whatever task runs (trio.run without
restrict_keyboard_interrupt_to_checkpoints): after every number of task steps, the runtime stops
with KeyboardInterrupt; reopened, every branch holds exactly its parent's messages up to its fork
sequence plus its own (K2), and each compiles, for each reader, what a fresh read-only runtime does.

usage: python attack/sigint_fork.py MAX_STEPS
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

import trio

import ctxrt
from ctxrt import Budget, Text

BUDGET = Budget(max_tokens=100_000, reserve_for_response=0)
READERS = {"n0": None, "na": "alice"}


class Steps(trio.abc.Instrument):
    def __init__(self, at: int) -> None:
        self.left = at

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.left -= 1
        if self.left == 0:
            signal.raise_signal(signal.SIGINT)


async def setup(path: Path) -> None:
    async with ctxrt.open_runtime(path) as rt:
        m = await rt.open("na", view_reader="alice")
        for k in range(20):
            await m.add_message("user", [Text(f"m{k}"), Text(f"for alice {k}", audience=("alice",))] if k % 4 == 0
                                else f"m{k}")
        await rt.open("n0")


async def interrupted(path: Path, at: int) -> None:
    async with ctxrt.open_runtime(path) as rt:
        managers = [await rt.open("na", view_reader="alice") for _ in range(3)]
        for m in managers:
            await m.compile(BUDGET)
        trio.lowlevel.add_instrument(Steps(at))
        async with trio.open_nursery() as nursery:
            for i, m in enumerate(managers):
                nursery.start_soon(m.fork, f"s{at}-{i}")
            nursery.start_soon(managers[0].edit_message, "3", f"edit {at}")


def shape(result: ctxrt.CompileResult) -> object:
    return [(m.participant, m.content) for m in result.messages]


async def check(path: Path, at: int) -> int:
    async with ctxrt.open_runtime(path) as rt:
        branches = [b for b in await rt.list_branches() if b.name == "main" or b.name.startswith(f"s{at}-")]
        ours = {}
        for b in branches:
            for ns, reader in READERS.items():
                m = await rt.open(ns, branch=b.name, view_reader=reader)
                ours[(ns, b.name)] = shape(await m.compile(BUDGET))
                await m.aclose()
            if b.parent is not None:
                child = [x.sequence for x in await (await rt.open("n0", branch=b.name)).get_all_messages()]
                parent = rt.slots.cache("messages", rt.engine.branch(b.parent).id)
                upto = [x.sequence for x in parent.as_of(b.fork_sequence)]
                assert child[: len(upto)] == upto, (b, child, upto)
    async with ctxrt.open_runtime(path, readonly=True) as ro:
        for (ns, name), got in ours.items():
            m = await ro.open(ns, branch=name, view_reader=READERS[ns])
            assert shape(await m.compile(BUDGET)) == got, (ns, name)
    return len(branches)


def main() -> None:
    steps = int(sys.argv[1])
    interrupts = made = 0
    with tempfile.TemporaryDirectory(prefix="attfork-sigint-") as root:
        path = Path(root) / "store"
        trio.run(setup, path)
        for at in range(1, steps + 1):
            try:
                trio.run(interrupted, path, at)
            except KeyboardInterrupt:
                interrupts += 1
            branches = trio.run(check, path, at)
            made = made + branches - 1
    print("ok", {"rounds": steps, "interrupted": interrupts, "forks made": made})


main()
