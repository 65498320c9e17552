"""The asyncio front: ``open_runtime``, ``Runtime`` and ``ContextManager`` derived from the trio API.

Each class is made from its trio class at import, member by member: a coroutine method becomes
one that awaits the trio method in a trio task of the loop's guest run (``guest.Guest.call``); an
``@asynccontextmanager`` method (``subscribe``) one whose block is held open by a trio task; a
plain method or a property passes straight through (trio code runs on the loop's thread, so a
sync call from asyncio needs no hop). Signatures and docstrings are the trio ones
(``functools.wraps``), so the front can't drift from the API it fronts; a member of any other
kind stops the import. The front holds only the public trio objects: it never reaches the actors.

Type checkers see the trio classes themselves (the same methods, awaited the same way).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import sniffio
import trio

from .. import host_state as trio_host_state
from .. import manager as trio_manager
from .. import runtime as trio_runtime
from .guest import Guest, each, entered, join, left, logger
from .stream import EventStream


class Front:
    """A trio object's asyncio handle. Attributes the trio object sets on itself (``path``,
    ``readonly``, ``model``, ``derivation``) read through."""

    def __init__(self, guest: Guest, wrapped: Any) -> None:
        self._guest = guest
        self._trio = wrapped

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._trio, name)

    def __repr__(self) -> str:
        return f"<ctxrt.aio front of {self._trio!r}>"


class ManagerFront(Front):
    """``async with manager:`` closes it on leaving, as the trio manager does."""

    async def __aenter__(self) -> ManagerFront:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    if TYPE_CHECKING:
        async def aclose(self) -> None: ...


def fronted(guest: Guest, value: Any) -> Any:
    """A call's result for the asyncio caller: a trio manager or host state gets its front; the rest is plain data."""
    if isinstance(value, trio_manager.ContextManager):
        return _ManagerFront(guest, value)
    if isinstance(value, trio_host_state.HostState):
        return _HostStateFront(guest, value)
    return value


class Subscription:
    """The block of a trio ``@asynccontextmanager`` method, held open by a trio task while the
    asyncio block runs; a channel it yields is forwarded into an ``EventStream``."""

    def __init__(self, guest: Guest, factory: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._guest = guest
        self._factory = factory
        self._held: Any = None

    async def __aenter__(self) -> Any:
        stream: EventStream[Any] = EventStream(self._guest.loop)

        async def forward(value: Any) -> None:
            if not isinstance(value, trio.abc.ReceiveChannel):
                return
            try:
                await each(value, stream.deliver)
            finally:
                stream.end()

        self._held = self._guest.hold(self._factory, forward)
        value = await entered(self._held)
        return stream if isinstance(value, trio.abc.ReceiveChannel) else fronted(self._guest, value)

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        error = await left(self._held)
        if error is not None and exc is None:
            raise error
        return False


def _is_context(member: Any) -> bool:
    return callable(member) and inspect.isasyncgenfunction(inspect.unwrap(member))


def _as_front(member: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    method = functools.wraps(member)(method)
    method.__module__ = __name__.rpartition(".")[0]
    return method


def _awaited(name: str, member: Callable[..., Any]) -> Callable[..., Any]:
    async def method(self: Front, *args: Any, **kwargs: Any) -> Any:
        return fronted(self._guest, await self._guest.call(getattr(self._trio, name), *args, **kwargs))

    return _as_front(member, method)


def _held(name: str, member: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Front, *args: Any, **kwargs: Any) -> Subscription:
        return Subscription(self._guest, functools.partial(getattr(self._trio, name), *args, **kwargs))

    return _as_front(member, method)


def _passed(name: str, member: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Front, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._trio, name)(*args, **kwargs)

    return _as_front(member, method)


def _read(name: str, member: property) -> property:
    return property(lambda self: getattr(self._trio, name), doc=member.__doc__)


def derive(trio_class: type, base: type[Front]) -> type[Front]:
    """``trio_class``'s asyncio front: each public member of it, by kind (see the module's doc)."""
    members: dict[str, Any] = {"__doc__": trio_class.__doc__, "__module__": __name__.rpartition(".")[0]}
    for name, member in vars(trio_class).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            members[name] = _read(name, member)
        elif inspect.iscoroutinefunction(member):
            members[name] = _awaited(name, member)
        elif _is_context(member):
            members[name] = _held(name, member)
        elif inspect.isfunction(member):
            members[name] = _passed(name, member)
        else:
            raise TypeError(f"ctxrt.aio has no front for {trio_class.__name__}.{name} ({type(member).__name__})")
    return type(trio_class.__name__, (base,), members)


_RuntimeFront: Any = derive(trio_runtime.Runtime, Front)
_ManagerFront: Any = derive(trio_manager.ContextManager, ManagerFront)
_HostStateFront: Any = derive(trio_host_state.HostState, Front)


class RuntimeBlock:
    """What ``ctxrt.aio.open_runtime(...)`` returns: ``async with`` it in an asyncio task."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._opener = functools.partial(trio_runtime.open_runtime, *args, **kwargs)
        self._guest: Guest | None = None
        self._held: Any = None

    async def __aenter__(self) -> Any:
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = None
        if library != "asyncio":
            raise RuntimeError(
                f"ctxrt.aio.open_runtime is for asyncio code, but it was awaited "
                f"{'under ' + library if library else 'outside any async library'}; from trio, use ctxrt.open_runtime"
            )
        guest = await join(asyncio.get_running_loop())
        try:
            self._held = guest.hold(self._opener)
            runtime = await entered(self._held)
        except BaseException:
            await _leave(guest)
            raise
        self._guest = guest
        return _RuntimeFront(guest, runtime)

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        guest = self._guest
        assert guest is not None, "the block was not entered"
        try:
            error = await left(self._held)
        finally:
            await _leave(guest)
        if error is not None:
            if exc is None:
                raise error
            # The block's own error goes on (as in trio, where both would make a group); this one is logged.
            logger.error("closing the runtime, on leaving a block that raised %r, also raised:", exc, exc_info=error)
        return False


async def _leave(guest: Guest) -> None:
    guest.release()
    if guest.users == 0:
        await guest.wait_finished()


def _open_runtime(*args: Any, **kwargs: Any) -> RuntimeBlock:
    return RuntimeBlock(args, kwargs)


_open_runtime = functools.wraps(trio_runtime.open_runtime)(_open_runtime)
_open_runtime.__module__ = __name__.rpartition(".")[0]
_open_runtime.__doc__ = (
    "The trio ``open_runtime``, for asyncio code: ``async with ctxrt.aio.open_runtime(path) as rt:``.\n\n"
    "The runtime runs in the loop's trio guest run (started by the first runtime opened on the loop, ended\n"
    "with the last one closed). Every method of the runtime and its managers is awaited from asyncio with\n"
    "the trio API's parameters, results and errors (a group of one raised as its leaf); a cancelled\n"
    "asyncio caller cancels its call, as a cancel scope would. An error raised in the block comes out as\n"
    "itself; if closing the runtime raises too, that is logged on the ``ctxrt.aio`` logger. Ctrl-C comes out\n"
    "of the loop as ``KeyboardInterrupt``, wherever it landed. The trio documentation follows.\n\n"
    + (trio_runtime.open_runtime.__doc__ or "")
)

if TYPE_CHECKING:
    from ..host_state import HostState as HostState
    from ..manager import ContextManager as ContextManager
    from ..runtime import Runtime as Runtime
    from ..runtime import open_runtime as open_runtime
else:
    Runtime = _RuntimeFront
    ContextManager = _ManagerFront
    HostState = _HostStateFront
    open_runtime = _open_runtime
