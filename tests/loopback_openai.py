"""The local OpenAI API server of ``ctxrt.testing`` (a trio server) for asyncio tests: it runs in
a thread of its own, with its own trio run, while the test's asyncio loop drives a framework's
real ``openai`` client against it. Every body it receives is checked by ``ctxrt.openai_rules``;
one that breaks a rule is answered 400 before the script is asked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from ctxrt.testing import MessagesScript, OpenAIApiServer, open_openai_api_server


@contextmanager
def serving_openai_api(script: MessagesScript) -> Iterator[OpenAIApiServer]:
    """The server, serving on loopback for the block; its ``requests`` are the bodies received."""
    started = threading.Event()
    held: dict[str, Any] = {}

    async def serve() -> None:
        async with open_openai_api_server(script) as server:
            held["server"], held["token"] = server, trio.lowlevel.current_trio_token()
            held["stop"] = stop = trio.Event()
            started.set()
            await stop.wait()

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as error:  # seen by the test's thread below
            held["error"] = error
            started.set()

    thread = threading.Thread(target=run, name="loopback openai api", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if "error" in held or "server" not in held:
        raise RuntimeError("the loopback OpenAI server didn't start") from held.get("error")
    try:
        yield held["server"]
    finally:
        trio.from_thread.run_sync(held["stop"].set, trio_token=held["token"])
        thread.join(timeout=30)
