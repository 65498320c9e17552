"""A FastAPI app on ctxrt.aio: residents as routes over one shared conversation (docs/asyncio.md).

    pip install 'ctxrt[asgi]'
    CTXRT_STORE=team-store uvicorn examples.asgi_residents:app

Its store is ``CTXRT_STORE``, else ``asgi-store`` in the working directory (git-ignored in a
checkout): a server's conversation outlives a restart, so a restart adds to it.

Each resident ``{name}`` has a namespace of its own, ``residents/{name}``, and is its reader; all
of them read and write the one shared slot. The lifespan opens the runtime for the server's
life; a request awaits the runtime from asyncio like any other library.

- ``POST /residents/{name}/messages`` with ``{"text": ..., "for": ["bob"], "participant": "user"}``
  (``for`` and ``participant`` optional) appends a message written by ``name``; a line with
  ``for`` reaches only the residents it names. Answers ``{"id": ...}`` once the write is durable.
- ``GET /residents/{name}/context?max_tokens=20000`` compiles the conversation for ``name``'s
  reader and answers the Messages API request body (``to_anthropic``) to send for it.
  ``max_tokens`` includes the 4,000 kept for the reply, so it must be more than that.

ctxrt's refusals become HTTP answers: a malformed name or content, or a ``max_tokens`` that
leaves no room, 422; another reader's namespace 409; nothing to send yet 404.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

import ctxrt
import ctxrt.aio


class Residents:
    """One manager per resident, opened on its first request and kept for the server's life."""

    def __init__(self, runtime: ctxrt.aio.Runtime) -> None:
        self.runtime = runtime
        self.managers: dict[str, ctxrt.aio.ContextManager] = {}

    async def manager(self, name: str) -> ctxrt.aio.ContextManager:
        manager = self.managers.get(name)
        if manager is None:
            # Requests for a new resident may open it at once: the first kept wins, the others close.
            opened = await self.runtime.open(f"residents/{name}", view_reader=name)
            manager = self.managers.setdefault(name, opened)
            if manager is not opened:
                await opened.aclose()
        return manager


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    store = os.environ.get("CTXRT_STORE", "asgi-store")
    async with ctxrt.aio.open_runtime(store) as runtime:
        app.state.residents = Residents(runtime)
        yield


app = FastAPI(title="ctxrt residents", lifespan=lifespan)


class NewMessage(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    text: str
    participant: str = "user"
    audience: list[str] | None = Field(default=None, alias="for")


@app.post("/residents/{name}/messages")
async def add_message(name: str, message: NewMessage, request: Request) -> dict[str, str]:
    manager = await request.app.state.residents.manager(name)
    block: dict[str, Any] = {"type": "text", "text": message.text}
    if message.audience:
        block["audience"] = message.audience
    message_id = await manager.add_message(message.participant, [block], metadata={"author": name})
    return {"id": message_id}


RESERVE = 4_000  # tokens kept for the reply (Budget's default), stated so the query can be checked


@app.get("/residents/{name}/context")
async def context(name: str, request: Request,
                  max_tokens: Annotated[int, Query(gt=RESERVE)] = 20_000) -> dict[str, Any]:
    # Budget refuses max_tokens <= its reserve with a ValueError, which would be a 500: FastAPI's
    # check above answers 422 first, naming the parameter.
    manager = await request.app.state.residents.manager(name)
    result = await manager.compile(ctxrt.Budget(max_tokens=max_tokens, reserve_for_response=RESERVE))
    return result.to_anthropic(assistant=name, system=f"You are {name}, one of several residents.")


def refused(status: int) -> Any:
    async def answer(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"error": type(error).__name__, "detail": str(error)}, status_code=status)

    return answer


app.add_exception_handler(ctxrt.MalformedContentError, refused(422))
app.add_exception_handler(ctxrt.ReaderConflictError, refused(409))
app.add_exception_handler(ctxrt.EmptyRequestError, refused(404))
