"""``OpenAIModel`` (P12), driven through the real ``openai.AsyncOpenAI`` pointed at the loopback
OpenAI server of ``ctxrt.testing`` (no network, no mock of the SDK), which refuses any request
that breaks the Chat Completions rules (P11). These tests use the real clock under a
``trio.fail_after`` guard; SDK retries are off (``max_retries=0``) unless a test is about them,
and then the server asks for a 10 ms wait.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

import ctxrt
from ctxrt import CompiledMessage, ModelRequest, ModelResponse, OpenAIModel, Text, ToolUse
from ctxrt.errors import ModelError
from ctxrt.openai_rules import violations
from ctxrt.testing import ApiReply, MessagesScript, open_openai_api_server

GUARD_S = 10


def said(participant: str, *texts: str) -> CompiledMessage:
    return CompiledMessage(participant, tuple(Text(text) for text in texts))


def request(**overrides: object) -> ModelRequest:
    fields: dict[str, object] = {
        "model": "gpt-test",
        "system": "You summarise.",
        "messages": (said("alice", "Hello there."),),
        "max_tokens": 256,
    }
    fields.update(overrides)
    return ModelRequest(**fields)  # type: ignore[arg-type]


async def complete_via_server(
    script: MessagesScript, model_request: ModelRequest, **options: Any
) -> tuple[ModelResponse, list[dict[str, Any]]]:
    """Run one ``complete`` through the real SDK against a scripted server."""
    options.setdefault("max_retries", 0)
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server(script) as server:
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test") as client:
                model = OpenAIModel(client, **options)
                return await model.complete(model_request), server.requests


async def error_via_server(script: MessagesScript, model_request: ModelRequest, **options: Any) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await complete_via_server(script, model_request, **options)
    return caught.value


# --- requests and replies ------------------------------------------------------------------------


async def test_a_text_reply_round_trips_and_the_request_is_a_valid_chat_completions_body() -> None:
    """P12: the system prompt leads, participants map as to_openai_chat maps them, max_completion_tokens
    is sent, temperature only when set; a "stop" reply comes back as end_turn text with usage."""
    model_request = request(messages=(said("alice", "The pump failed."), said("Claude", "Which pump?"),
                                      said("bob", "Pump two.")), max_tokens=300)
    response, [body] = await complete_via_server([ApiReply.text("Pump two failed.")], model_request)
    assert response == ModelResponse((Text("Pump two failed."),), "end_turn", response.usage)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert body == {
        "model": "gpt-test",
        "max_completion_tokens": 300,
        "messages": [
            {"role": "system", "content": "You summarise."},
            {"role": "user", "content": "The pump failed.", "name": "alice"},
            {"role": "assistant", "content": "Which pump?"},
            {"role": "user", "content": "Pump two.", "name": "bob"},
        ],
    }
    assert violations(body) == []
    _, [warm] = await complete_via_server([ApiReply.text("ok")], request(temperature=0.2))
    assert warm["temperature"] == 0.2


async def test_a_server_that_wants_max_tokens_and_a_developer_role_gets_them() -> None:
    """P12: ``max_tokens_field`` and ``system_role`` choose the names a server expects."""
    _, [body] = await complete_via_server([ApiReply.text("ok")], request(), max_tokens_field="max_tokens",
                                          system_role="developer")
    assert body["max_tokens"] == 256 and "max_completion_tokens" not in body
    assert body["messages"][0] == {"role": "developer", "content": "You summarise."}


async def test_alternate_roles_sends_a_merge_request_as_alternating_turns() -> None:
    """P12: a merge request's run of assistant summaries goes as one assistant turn after a user one, for
    servers whose chat templates refuse two assistant turns in a row."""
    messages = (said("Claude", "first memory"), said("Claude", "second memory"), said("Context Manager", "merge"))
    _, [body] = await complete_via_server([ApiReply.text("ok")], request(messages=messages), alternate_roles=True)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][2]["content"] == "first memory\n\nsecond memory"


async def test_tools_go_as_function_tools_and_a_call_comes_back_under_the_tools_own_name() -> None:
    """P12: a Messages API tool named mcpl:search is sent as mcpl_search; the model's call of it comes back
    as a ToolUse named mcpl:search with its arguments, stop reason tool_use."""
    tool = {"name": "mcpl:search", "description": "Search", "input_schema": {"type": "object"}}
    reply = ApiReply.tool_use("mcpl_search", {"q": "pump"}, id="call_1", text="Checking.")
    response, [body] = await complete_via_server([reply], request(tools=(tool,)))
    assert body["tools"] == [{"type": "function", "function": {
        "name": "mcpl_search", "description": "Search", "parameters": {"type": "object"}}}]
    assert response.content == (Text("Checking."), ToolUse("call_1", "mcpl:search", {"q": "pump"}))
    assert response.stop_reason == "tool_use"


@pytest.mark.parametrize(("reply", "stop_reason", "text"), [
    (ApiReply.text("cut sh", stop_reason="max_tokens"), "max_tokens", "cut sh"),
    (ApiReply.refusal("I can't summarise that."), "refusal", "I can't summarise that."),
])
async def test_finish_reasons_come_back_in_the_messages_api_words(reply: ApiReply, stop_reason: str, text: str) -> None:
    """P12: "length" is max_tokens and a refusal is refusal, so a strategy keeps neither as a summary (T4)."""
    response, _ = await complete_via_server([reply], request())
    assert (response.stop_reason, response.text) == (stop_reason, text)


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error_type"), [(429, "rate_limit_error"), (500, "api_error"), (503, "api_error")])
async def test_rate_limits_and_server_errors_are_retryable(status: int, error_type: str) -> None:
    """P12, L2: 429 and 5xx become ModelError(retryable=True) naming the model and HTTP status."""
    error = await error_via_server([ApiReply.error(status, "try later")], request())
    assert error.retryable is True
    assert re.fullmatch(rf"model 'gpt-test': HTTP {status} {error_type}: try later", str(error))
    assert isinstance(error.__cause__, openai.APIStatusError)


async def test_a_429_for_exhausted_quota_is_not_retryable() -> None:
    """P12: insufficient_quota is a 429 that waiting doesn't cure; the message names the code."""
    error = await error_via_server([ApiReply.error(429, "out of credit", code="insufficient_quota")], request())
    assert error.retryable is False
    assert str(error) == "model 'gpt-test': HTTP 429 rate_limit_error (insufficient_quota): out of credit"


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_refused_requests_are_not_retryable(status: int) -> None:
    """P12: 400, 401, 403 and 404 become ModelError(retryable=False) naming the model and HTTP status."""
    error = await error_via_server([ApiReply.error(status, "no")], request())
    assert error.retryable is False
    assert str(error).startswith(f"model 'gpt-test': HTTP {status} ")


async def test_a_reply_slower_than_the_timeout_is_a_retryable_error() -> None:
    """P12, L2: a reply slower than ``timeout_s`` becomes ModelError(retryable=True), with no HTTP status."""
    error = await error_via_server([ApiReply.text("late").after(30)], request(timeout_s=0.2))
    assert error.retryable is True
    assert str(error) == "model 'gpt-test': no reply within 0.2 s (timed out, no HTTP status)"


async def test_connection_refused_is_a_retryable_error() -> None:
    """P12: a server that refuses connections gives ModelError(retryable=True) with no HTTP status."""
    with trio.socket.socket() as sock:  # bind then close: a loopback port with nobody listening
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with trio.fail_after(GUARD_S):
        async with OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", api_key="test", max_retries=0) as model:
            with pytest.raises(ModelError, match=r"^model 'gpt-test': connection failed \(no HTTP status\)") as caught:
                await model.complete(request())
    assert caught.value.retryable is True


async def test_sdk_retries_run_on_trio() -> None:
    """P12: with retries on, the SDK waits (anyio.sleep on trio) and retries a 429 and a 500 into a success."""
    script = [ApiReply.error(429, retry_after_s=0.01), ApiReply.error(500, retry_after_s=0.01), ApiReply.text("ok")]
    response, seen = await complete_via_server(script, request(), max_retries=2)
    assert response.text == "ok" and len(seen) == 3


async def test_a_cancelled_call_leaves_the_model_usable() -> None:
    """P12, L3: cancelling a call mid-request leaves the model usable for the next one."""
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server([ApiReply.text("late").after(30), ApiReply.text("next")]) as server:
            async with OpenAIModel(base_url=server.base_url, api_key="test", max_retries=0) as model:
                with trio.move_on_after(0.2):
                    await model.complete(request())
                assert (await model.complete(request())).text == "next"


# --- clients ---------------------------------------------------------------------------------------


async def test_a_model_built_from_the_environment_owns_and_closes_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """P12: with no client, one is built from OPENAI_API_KEY and OPENAI_BASE_URL; leaving closes it and
    later calls fail."""
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server([ApiReply.text("ok")]) as server:
            monkeypatch.setenv("OPENAI_API_KEY", "test")
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            async with OpenAIModel(max_retries=0) as model:
                assert (await model.complete(request())).text == "ok"
            with pytest.raises(ModelError, match=r"^model 'gpt-test': this OpenAIModel was closed$"):
                await model.complete(request())


async def test_a_passed_client_stays_open_and_needs_no_base_url_beside_it() -> None:
    """P12: aclose leaves the caller's client open; base_url or api_key beside a client is refused."""
    async with openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="test") as client:
        model = OpenAIModel(client)
        await model.aclose()
        assert not client.is_closed()
        with pytest.raises(ValueError, match="give base_url and api_key to the client"):
            OpenAIModel(client, base_url="http://127.0.0.1:9/v1")


def test_a_model_without_credentials_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """P12: no key anywhere raises ModelError at once, saying what to set."""
    for name in list(os.environ):
        if name.startswith("OPENAI_"):
            monkeypatch.delenv(name)
    with pytest.raises(ModelError, match=r"^OpenAIModel: no OpenAI credentials found; set OPENAI_API_KEY"):
        OpenAIModel()
    with pytest.raises(ValueError, match="max_tokens_field"):
        OpenAIModel(api_key="x", max_tokens_field="tokens")  # type: ignore[arg-type]


async def test_the_local_server_answers_responses_calls_and_unknown_paths_as_openai_does() -> None:
    """P11: the server speaks the Responses form too (a scripted tool_use is a function_call item the SDK
    parses) and answers a path it doesn't serve with a 404 the SDK raises as NotFoundError."""
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server([ApiReply.tool_use("look", {"q": 1}, id="call_9")]) as server:
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client:
                response = await client.responses.create(model="m", input="hi")
                with pytest.raises(openai.NotFoundError):
                    await client.models.list()
    [item] = response.output
    assert (item.type, item.call_id, item.name, item.arguments) == ("function_call", "call_9", "look", '{"q": 1}')  # type: ignore[union-attr]
    assert server.requests == [{"model": "m", "input": "hi"}]


# --- through the runtime -----------------------------------------------------------------------------


async def test_an_autobiographical_namespace_compresses_through_openai_model_and_calibrates(tmp_path: Path) -> None:
    """P12, T4: end to end on a local server: Autobiographical's compression requests go out as valid Chat
    Completions bodies, the replies become summaries the compile shows, each reply's prompt_tokens reach
    the CalibratedEstimator (10,000 reported against a few hundred estimated: the factor climbs toward
    its cap of 4, 30% of the way per report), and leaving the runtime closes the model."""
    strategy = ctxrt.Autobiographical("gpt-test", target_chunk_tokens=40, recent_window_tokens=0, l1_holdback_chunks=0)
    with trio.fail_after(GUARD_S):
        async with open_openai_api_server(lambda body: ApiReply.text("They talked it over.").with_usage(10_000, 5)) as server:
            model = OpenAIModel(base_url=server.base_url, api_key="test", max_retries=0)
            async with ctxrt.open_runtime(tmp_path / "store", model=model, durability="os") as rt:
                estimator = ctxrt.CalibratedEstimator()
                m = await rt.open("diary", strategy=strategy, token_estimator=estimator)
                for i in range(40):
                    await m.add_message("user" if i % 2 else "Claude", f"<m{i:05d}> we talked it over".ljust(29, "."))
                await m.wait_ready()
                result = await m.compile(ctxrt.Budget(max_tokens=100_000, reserve_for_response=0))
            with pytest.raises(ModelError, match="was closed"):
                await model.complete(request())
    assert len(server.requests) >= 3
    assert all(violations(body) == [] for body in server.requests)
    assert any(source.kind == "summary" for sources in result.provenance.messages for source in sources)
    assert "They talked it over." in str(result.to_openai_chat(assistant="Claude"))
    assert estimator.factors["gpt-test"] == pytest.approx(4 - 3 * 0.7 ** len(server.requests))


def _completion(message: Any = None, **over: Any) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": "a summary"} if message is None else message,
              "finish_reason": "stop"}
    return json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}, **over}).encode()


@pytest.mark.parametrize(("body", "retryable"), [
    (b'{"id": "c", "choices": [', True),  # cut short
    (b"<html>a gateway page</html>", True),
    (b"", True),
    (b"[]", False),
    (_completion({"role": "assistant", "content": 5}), False),
    (_completion(None, choices=[{"index": 0, "message": None, "finish_reason": "stop"}]), False),
], ids=["cut short", "html", "empty", "a list", "content a number", "message null"])
async def test_a_200_reply_that_is_no_chat_completion_is_a_model_error(body: bytes, retryable: bool) -> None:
    """P12 (from a host-style attack): a 200 whose body isn't JSON, or isn't a chat completion, raises
    ModelError through the real SDK (retryable when the body isn't JSON at all: a proxy's page, a cut
    reply), never the SDK's JSONDecodeError, AttributeError or a Text holding a number."""

    async def answer(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        await stream.send_all(head.encode() + body)
        await stream.aclose()

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, answer, 0)
            port = listeners[0].socket.getsockname()[1]
            async with OpenAIModel(base_url=f"http://127.0.0.1:{port}/v1", api_key="test", max_retries=0) as model:
                with pytest.raises(ModelError, match=r"^model 'gpt-test': unusable response") as caught:
                    await model.complete(request())
            nursery.cancel_scope.cancel()
    assert caught.value.retryable is retryable
