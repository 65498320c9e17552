"""The two hosts a contract test runs under: trio (``ctxrt.open_runtime``) and asyncio
(``ctxrt.aio.open_runtime``). Not a test module.

A test body is one async function written against the public API only; ``host.run`` runs it in
a fresh event loop of its kind (``trio.run`` or ``asyncio.run``, guarded by a timeout), and the
few things the two libraries spell differently (a yield to the loop, concurrent calls, a caller
cancelled after k loop passes) are the host's methods. The ``host`` fixture gives each test both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio

import ctxrt
import ctxrt.aio

T = TypeVar("T")
GUARD_S = 60
Outcome = tuple[str, Any]  # ("returned", value), ("raised", a CtxrtError) or ("cancelled", None)


class TrioHost:
    name = "trio"
    open_runtime = staticmethod(ctxrt.open_runtime)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async def guarded() -> T:
            with trio.fail_after(GUARD_S):
                return await fn(*args)

        return trio.run(guarded)

    async def checkpoint(self) -> None:
        await trio.lowlevel.checkpoint()

    async def gather(self, *calls: Callable[[], Awaitable[Any]]) -> list[Any]:
        results: list[Any] = [None] * len(calls)

        async def one(index: int) -> None:
            results[index] = await calls[index]()

        async with trio.open_nursery() as nursery:
            for index in range(len(calls)):
                nursery.start_soon(one, index)
        return results

    async def cancelled_after(self, passes: int, fn: Callable[..., Awaitable[Any]], *args: Any) -> Outcome:
        """``fn(*args)`` in a cancel scope a sibling cancels after ``passes`` checkpoints of its own."""
        found: list[Outcome] = []
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                try:
                    found.append(("returned", await fn(*args)))
                except ctxrt.CtxrtError as exc:
                    found.append(("raised", exc))

        async def cancel() -> None:
            for _ in range(passes):
                await trio.lowlevel.checkpoint()
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            nursery.start_soon(cancel)
        return found[0] if found else ("cancelled", None)


class AsyncioHost:
    name = "asyncio"
    open_runtime = staticmethod(ctxrt.aio.open_runtime)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        async def guarded() -> T:
            async with asyncio.timeout(GUARD_S):
                return await fn(*args)

        return asyncio.run(guarded())

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

    async def gather(self, *calls: Callable[[], Awaitable[Any]]) -> list[Any]:
        return list(await asyncio.gather(*(call() for call in calls)))

    async def cancelled_after(self, passes: int, fn: Callable[..., Awaitable[Any]], *args: Any) -> Outcome:
        """``fn(*args)`` in a task cancelled after ``passes`` passes of the loop (0: before it starts)."""

        async def call() -> Outcome:
            try:
                return ("returned", await fn(*args))
            except ctxrt.CtxrtError as exc:
                return ("raised", exc)

        task = asyncio.ensure_future(call())
        for _ in range(passes):
            await asyncio.sleep(0)
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled():
                return ("cancelled", None)
            raise


Host = TrioHost | AsyncioHost
HOSTS: dict[str, Host] = {"trio": TrioHost(), "asyncio": AsyncioHost()}


@pytest.fixture(params=sorted(HOSTS))
def host(request: pytest.FixtureRequest) -> Host:
    return HOSTS[request.param]
