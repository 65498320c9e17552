"""The FastAPI example (examples/asgi_residents.py) served by uvicorn, driven by 100 concurrent
HTTP clients (issue 23, item 5; H6).

Determinism rules: uvicorn runs as a real child process on a loopback socket the test binds
(``--fd``), over a real LMDB store in a temp dir; the clients are real HTTP clients (httpx2) in
one asyncio loop; every wait is bounded by a guard; the server is stopped with SIGINT, as a
terminal would, and must close its store on the way out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

import ctxrt

ROOT = Path(__file__).resolve().parent.parent
RESIDENTS = [f"r{index}" for index in range(10)]
CLIENTS = 100
MESSAGES = 2  # per client: one for everyone, one for another resident
GUARD_S = 120
FOR = re.compile(r"for:(r\d+)")


def line(client: int, number: int, audience: list[str] | None) -> str:
    return f"client {client} line {number}" + (f" for:{audience[0]}" if audience else "")


async def drive(base_url: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """100 clients, each writing as one resident (some lines for another) and compiling for it:
    the acknowledged ids with their texts, and each context's text with the resident it is for."""
    acknowledged: dict[str, str] = {}
    contexts: list[tuple[str, str]] = []
    limits = httpx2.Limits(max_connections=CLIENTS)
    async with httpx2.AsyncClient(base_url=base_url, limits=limits, timeout=GUARD_S) as http:

        async def client(index: int) -> None:
            name = RESIDENTS[index % len(RESIDENTS)]
            for number in range(MESSAGES):
                audience = [RESIDENTS[(index + number) % len(RESIDENTS)]] if number % 2 else None
                text = line(index, number, audience)
                reply = await http.post(f"/residents/{name}/messages", json={"text": text, "for": audience})
                assert reply.status_code == 200, reply.text
                acknowledged[reply.json()["id"]] = text
                context = await http.get(f"/residents/{name}/context", params={"max_tokens": 200_000})
                assert context.status_code == 200, context.text
                contexts.append((name, context.text))

        async with asyncio.timeout(GUARD_S):
            await asyncio.gather(*(client(index) for index in range(CLIENTS)))
        malformed = await http.post("/residents/bad%00name/messages", json={"text": "x"})
        assert malformed.status_code == 422, malformed.text
    return acknowledged, contexts


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_fastapi_example_serves_100_concurrent_clients_losing_and_leaking_nothing(tmp_path: Path, loop: str) -> None:
    """Every message the app acknowledged is stored with its text; each resident's namespace
    records that resident as its one reader; no context a resident was sent holds a line meant for
    another; a malformed name is a 422; and SIGINT stops the server cleanly, its store closed, on
    asyncio's loop and on uvloop (H6)."""
    store = tmp_path / "store"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.asgi_residents:app", "--fd", str(listener.fileno()),
         "--log-level", "warning", "--loop", loop],
        cwd=ROOT, pass_fds=[listener.fileno()], env={**os.environ, "CTXRT_STORE": str(store)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    listener.close()
    try:
        acknowledged, contexts = asyncio.run(drive(f"http://127.0.0.1:{port}"))
        server.send_signal(signal.SIGINT)
        _, errors = server.communicate(timeout=GUARD_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, errors.decode()[-3000:]
    assert len(acknowledged) == CLIENTS * MESSAGES

    for name, text in contexts:
        leaked = {other for other in FOR.findall(text) if other != name}
        assert not leaked, f"{name}'s context holds lines for {leaked}"
        assert '"audience"' not in text
    assert any(name in FOR.findall(text) for name, text in contexts)  # lines for a resident do reach it

    async def check() -> None:
        async with ctxrt.open_runtime(store) as runtime:  # the server closed it: the lock is free
            stored = {m.id: m.content[0].text for m in await (await runtime.open("checker")).get_all_messages()}
            readers = {info.namespace: info.reader for info in await runtime.list_namespaces()}
        assert {i: stored.get(i) for i in acknowledged} == acknowledged
        assert {ns: r for ns, r in readers.items() if ns.startswith("residents/")} == {
            f"residents/{name}": name for name in RESIDENTS}

    trio.run(check)




def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("asgi_residents", ROOT / "examples" / "asgi_residents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fastapi_examples_refusals_are_4xx_never_500(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A max_tokens with no room after the reply's reserve (a ValueError from Budget, a 500
    before), a malformed name: 422; a resident with nothing to send yet: 404."""
    from starlette.testclient import TestClient

    monkeypatch.setenv("CTXRT_STORE", str(tmp_path / "store"))
    with TestClient(load_example().app) as http:
        assert http.get("/residents/ann/context").status_code == 404  # an empty conversation
        assert http.post("/residents/ann/messages", json={"text": "hello"}).status_code == 200
        for max_tokens in (4_000, 1, 0, -5):
            reply = http.get("/residents/ann/context", params={"max_tokens": max_tokens})
            assert reply.status_code == 422, (max_tokens, reply.text)
            assert "max_tokens" in reply.text
        assert http.get("/residents/ann/context", params={"max_tokens": 5_000}).status_code == 200
        assert http.post("/residents/bad%00name/messages", json={"text": "x"}).status_code == 422
