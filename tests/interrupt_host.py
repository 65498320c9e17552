"""The host that tests/test_interrupt.py interrupts with SIGINT (L8). Not a test module.

``python interrupt_host.py <store path>`` opens a runtime on the store and four namespaces
whose ``Autobiographical`` strategy compresses in the background (``auto_tick``) with
``OfflineModel``, and appends messages to them from four tasks without end. After each
acknowledged append it prints ``ack <namespace index> <line number>``; once every namespace
has asked its model for a summary, ``compressing``. What ``open_runtime`` raises is printed
as ``caught <what>`` (``KeyboardInterrupt``, or a group and what it holds) and raised on.
Each line is one ``os.write``, so no line is torn. ``run_host`` is the same host for a test
to run in its own process (cancelled from the test's scope, L9).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import trio

from ctxrt import Autobiographical, ModelRequest, ModelResponse, OfflineModel, Runtime, open_runtime

NAMESPACES = 4


def line(index: int, number: int) -> str:
    """The text of namespace ``index``'s message ``number``."""
    return f"line {number} of namespace {index}: " + "some words to compress " * 12


def write_line(text: str) -> None:
    os.write(1, (text + "\n").encode())


def described(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return f"{type(exc).__name__}[{', '.join(described(inner) for inner in exc.exceptions)}]"
    return type(exc).__name__


class Compressing:
    """OfflineModel for one namespace; says ``compressing`` once every namespace has asked."""

    def __init__(self, index: int, asked: set[int], say: Callable[[str], None]) -> None:
        self.index = index
        self.asked = asked
        self.say = say
        self.model = OfflineModel()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.index not in self.asked:
            self.asked.add(self.index)
            if len(self.asked) == NAMESPACES:
                self.say("compressing")
        return await self.model.complete(request)


async def append_forever(runtime: Runtime, index: int, asked: set[int], say: Callable[[str], None]) -> None:
    strategy = Autobiographical("offline", target_chunk_tokens=200, head_window_tokens=50, recent_window_tokens=400,
                                summary_target_tokens=60, auto_tick=True, merge_threshold=3)
    manager = await runtime.open(f"agents/n{index}", view_reader=f"n{index}", strategy=strategy,
                                 model=Compressing(index, asked, say))
    number = 0
    while True:
        await manager.add_message("user", line(index, number))
        say(f"ack {index} {number}")
        number += 1


async def run_host(store: str | os.PathLike[str], say: Callable[[str], None]) -> None:
    """The host: never returns; ``say`` hears its acks and ``compressing``."""
    asked: set[int] = set()
    async with open_runtime(store) as runtime, trio.open_nursery() as nursery:
        for index in range(NAMESPACES):
            nursery.start_soon(append_forever, runtime, index, asked, say)


async def main(store: str) -> None:
    try:
        await run_host(store, write_line)
    except BaseException as exc:
        write_line(f"caught {described(exc)}")
        raise


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
