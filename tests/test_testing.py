"""Tests for ``ctxrt.testing``.

ScriptedModel tests are pure trio and use ``autojump_clock`` where time passes. Server tests use
real loopback sockets (port 0), so they run on the real clock under a ``trio.fail_after`` guard;
a few speak raw HTTP/1.1 to pin the wire behaviour, the rest use the real AsyncAnthropic.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
import trio
import trio.testing

from ctxrt import CompiledMessage, ModelRequest, ModelResponse, Text, Usage
from ctxrt.errors import ModelError
from ctxrt.testing import (
    ApiReply,
    MessagesApiServer,
    ScriptedModel,
    open_messages_api_server,
    serve_messages_api,
)
from support import wait_until

GUARD_S = 10
# The smallest body the server's request rules (P8) accept.
_VALID = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()


def request(text: str) -> ModelRequest:
    return ModelRequest("claude-test", None, (CompiledMessage("alice", (Text(text),)),), 100)


# --- ScriptedModel -------------------------------------------------------------------------------


async def test_scripted_model_records_requests_in_order_and_wraps_text_replies() -> None:
    """Each request is recorded in order; a str reply becomes one Text block with stop reason end_turn."""
    model = ScriptedModel(lambda req: f"seen {len(req.messages)}")
    first = await model.complete(request("one"))
    await model.complete(request("two"))
    assert [req.messages[0].content[0] for req in model.requests] == [Text("one"), Text("two")]
    assert first.content == (Text("seen 1"),)
    assert first.stop_reason == "end_turn"
    assert first.usage.output_tokens == 2


async def test_scripted_model_passes_model_responses_through() -> None:
    """A responder returning a ModelResponse gets exactly that back (e.g. a refusal)."""
    refusal = ModelResponse((), "refusal", Usage(1, 0))
    assert await ScriptedModel(lambda req: refusal).complete(request("x")) is refusal


async def test_scripted_model_raises_what_the_responder_raises_and_still_records() -> None:
    """A responder that raises ModelError simulates a failed call; the request is recorded (spec L2)."""

    def fail(req: ModelRequest) -> str:
        raise ModelError("model 'claude-test': HTTP 529 overloaded_error: busy", retryable=True)

    model = ScriptedModel(fail)
    with pytest.raises(ModelError, match=r"^model 'claude-test': HTTP 529 overloaded_error: busy$") as caught:
        await model.complete(request("x"))
    assert caught.value.retryable is True
    assert len(model.requests) == 1


async def test_scripted_model_awaits_an_async_responder() -> None:
    """An async responder is awaited, so a test can hold a call open until it sets an event."""
    release = trio.Event()

    async def wait_then_answer(req: ModelRequest) -> str:
        await release.wait()
        return "done"

    model = ScriptedModel(wait_then_answer)
    async with trio.open_nursery() as nursery:
        results: list[str] = []

        async def call() -> None:
            results.append((await model.complete(request("x"))).text)

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert len(model.requests) == 1 and results == []
        release.set()
    assert results == ["done"]


async def test_scripted_model_delay_is_cancellable_and_recorded(autojump_clock: trio.testing.MockClock) -> None:
    """With ``delay_s`` the call takes that long; a call cancelled during the delay is still recorded."""
    model = ScriptedModel(lambda req: "late", delay_s=60)
    with trio.move_on_after(1) as scope:
        await model.complete(request("cancelled"))
    assert scope.cancelled_caught
    start = trio.current_time()
    assert (await model.complete(request("waited"))).text == "late"
    assert trio.current_time() - start == pytest.approx(60)
    assert len(model.requests) == 2


# --- the Messages API server: raw HTTP ----------------------------------------------------------


async def http_exchange(
    stream: trio.SocketStream, method: str, target: str, body: bytes, *, close: bool = False
) -> tuple[int, dict[str, str], Any]:
    """Send one HTTP/1.1 request on ``stream`` and read its Content-Length framed JSON response."""
    head = f"{method} {target} HTTP/1.1\r\nhost: test\r\ncontent-length: {len(body)}\r\n"
    head += "connection: close\r\n" if close else ""
    await stream.send_all(head.encode() + b"\r\n" + body)
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += await stream.receive_some(65536)
    raw_head, rest = buffer.split(b"\r\n\r\n", 1)
    status_line, *header_lines = raw_head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in header_lines)}
    while len(rest) < int(headers["content-length"]):
        rest += await stream.receive_some(65536)
    return int(status_line.split()[1]), headers, json.loads(rest)


def port_of(server: MessagesApiServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


async def test_server_keeps_the_connection_alive_between_requests() -> None:
    """Two requests on one connection each get a complete Messages API reply."""
    body = json.dumps({"model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([ApiReply.text("a"), ApiReply.text("b")]) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port_of(server)) as stream:
                status_a, headers_a, reply_a = await http_exchange(stream, "POST", "/v1/messages", body)
                status_b, _headers_b, reply_b = await http_exchange(stream, "POST", "/v1/messages", body)
    assert (status_a, status_b) == (200, 200)
    assert headers_a["connection"] == "keep-alive"
    assert reply_a == {
        "id": "msg_test_1",
        "type": "message",
        "role": "assistant",
        "model": "m1",
        "content": [{"type": "text", "text": "a"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": reply_a["usage"]["input_tokens"], "output_tokens": 8,
                  "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    }
    assert reply_b["content"] == [{"type": "text", "text": "b"}]
    assert server.connections == 1
    assert server.requests == [json.loads(body)] * 2


async def test_server_sends_anthropic_error_shapes() -> None:
    """An error reply has the Anthropic error JSON, its status, a request id and any retry-after header."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([ApiReply.error(429, "slow down", retry_after_s=1.5)]) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port_of(server)) as stream:
                status, headers, reply = await http_exchange(stream, "POST", "/v1/messages", _VALID, close=True)
    assert status == 429
    assert reply == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert headers["retry-after-ms"] == "1500"
    assert headers["request-id"] == "req_test_1"
    assert headers["connection"] == "close"


async def test_server_refuses_unknown_paths_and_bad_json_without_using_the_script() -> None:
    """Other paths get 404 and a non-JSON body gets 400; neither is recorded nor consumes a reply."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([ApiReply.text("unused")]) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port_of(server)) as stream:
                missing = await http_exchange(stream, "GET", "/v1/models", b"")
                bad = await http_exchange(stream, "POST", "/v1/messages", b"{not json")
    assert missing[0] == 404 and missing[2]["error"]["type"] == "not_found_error"
    assert bad[0] == 400 and bad[2]["error"]["type"] == "invalid_request_error"
    assert server.requests == []


async def test_server_answers_400_once_the_script_runs_out() -> None:
    """A request beyond the scripted replies gets a non-retryable 400 saying the script is exhausted."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([]) as server:
            async with await trio.open_tcp_stream("127.0.0.1", port_of(server)) as stream:
                status, _headers, reply = await http_exchange(stream, "POST", "/v1/messages", _VALID)
    assert status == 400
    assert reply["error"]["message"] == "messages script exhausted after 0 replies"


async def test_server_script_function_sees_each_request_body() -> None:
    """A script function is called with each request's JSON body."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server(lambda body: ApiReply.text(body["model"])) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
                message = await client.messages.create(model="echo-me", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "echo-me"  # type: ignore[union-attr]


async def test_server_stops_promptly_with_a_slow_reply_pending() -> None:
    """Leaving the block cancels a reply still sleeping and closes the listener."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([ApiReply.text("never").after(3600)]) as server:
            stream = await trio.open_tcp_stream("127.0.0.1", port_of(server))
            await stream.send_all(b"POST /v1/messages HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(_VALID), _VALID))
            await wait_until(lambda: bool(server.requests))
        assert await stream.receive_some(1) == b""  # the server closed its side
        await stream.aclose()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port_of(server))


async def test_server_block_errors_come_out_unwrapped() -> None:
    """An exception raised inside the block propagates as itself, not inside an exception group."""
    with trio.fail_after(GUARD_S), pytest.raises(KeyError, match="boom"):
        async with open_messages_api_server([]):
            raise KeyError("boom")


async def test_server_can_be_started_in_a_nursery(nursery: trio.Nursery) -> None:
    """``nursery.start(serve_messages_api, script)`` returns the running server."""
    server = await nursery.start(serve_messages_api, [ApiReply.text("hi")])
    assert server.base_url.startswith("http://127.0.0.1:")
    with trio.fail_after(GUARD_S):
        async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
            message = await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "hi"  # type: ignore[union-attr]


# --- the Messages API server: the real SDK parses every reply kind -----------------------------


async def test_real_sdk_parses_text_tool_use_and_refusal_replies() -> None:
    """AsyncAnthropic parses the server's text, tool_use and refusal replies into its Message type."""
    script = [ApiReply.text("hello"), ApiReply.tool_use("lookup", {"q": 1}, id="toolu_9"), ApiReply.refusal("no")]
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server(script) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
                messages = [
                    await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
                    for _ in script
                ]
    text, tool, refusal = messages
    assert (text.role, text.stop_reason) == ("assistant", "end_turn")
    assert text.content[0].model_dump(exclude_none=True) == {"type": "text", "text": "hello"}
    assert tool.stop_reason == "tool_use"
    assert tool.content[0].model_dump(exclude_none=True) == {
        "type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"q": 1}
    }
    assert refusal.stop_reason == "refusal"
    assert text.usage.output_tokens > 0


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, anthropic.BadRequestError),
        (429, anthropic.RateLimitError),
        (500, anthropic.InternalServerError),
        (529, anthropic.InternalServerError),
    ],
)
async def test_real_sdk_raises_its_own_error_classes_for_scripted_errors(status: int, error_class: type) -> None:
    """The SDK turns the server's error replies into its own status error classes."""
    with trio.fail_after(GUARD_S):
        async with open_messages_api_server([ApiReply.error(status, "scripted")]) as server:
            async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0) as client:
                with pytest.raises(error_class) as caught:
                    await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == status
