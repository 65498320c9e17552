"""``EventStream``: what ``ctxrt.aio``'s ``subscribe()`` yields, the asyncio side of the trio
subscription's channel. Its trio task delivers each event as the channel gives it; the stream
buffers them without bound, as the channel does, and ends when the channel has."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class EventStream(Generic[T]):
    """Events in the order the subscription delivers them, each once: ``async for event in
    stream`` (ends once the subscription has ended and every event was read), or ``await
    stream.receive()`` (``trio.EndOfChannel`` at the end, as the trio channel raises)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[T] = deque()
        self._ended = False
        self._waiters: list[asyncio.Future[None]] = []

    def deliver(self, item: T) -> None:
        """From the trio task, on the loop's thread."""
        self._items.append(item)
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def receive_nowait(self) -> T:
        """The next event. Raises ``trio.WouldBlock`` if none is buffered, ``trio.EndOfChannel``
        once the subscription has ended and every event was read."""
        if self._items:
            return self._items.popleft()
        if self._ended:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> T:
        """The next event, waiting for one. Raises ``trio.EndOfChannel`` at the end."""
        while not self._items and not self._ended:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
        return self.receive_nowait()

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
