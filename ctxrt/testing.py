"""Public test helpers: a scripted ``Model``, local Messages API and OpenAI API servers, and a
plain ``StrategyContext`` for testing a strategy's planning as synchronous code.

``ScriptedModel`` stands in for a model inside the runtime. The Messages API server speaks
enough of ``POST /v1/messages`` (non-streaming) over loopback HTTP/1.1 for the real
``anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test")`` to talk to it, so
``AnthropicModel`` is tested through the real SDK with no network and no mocks. It applies the
request rules of ``ctxrt.anthropic_rules`` (P8) and answers a body that breaks any with 400
``invalid_request_error`` listing them, before consulting its script. The OpenAI server does
the same for ``POST /v1/chat/completions`` and ``POST /v1/responses`` with the rules of
``ctxrt.openai_rules`` (P11), for ``openai.AsyncOpenAI(base_url=server.base_url, api_key="test")``
and ``OpenAIModel``. Both take the same scripts of ``ApiReply``.

The testing seam: ctxrt's own tests import the internals they need from here, never from the
modules that define them, so a module split or rename changes this list and not every test. It
re-exports, from where they live now: the store's commands (``AppendItem``, ``SetValue``, ...,
what ``Runtime.store.ask`` takes) and the records it reads back (``ItemAppended``, ``LogHead``,
...); the store's own opening without a runtime (``open_store``, ``close_store``,
``StoreHandle``, ``open_environments``) and its checker (``verify``, ``verify_store``, ``verify_in_child``);
the store actor without a runtime (``open_store_actor``, ``serve_store``, and ``execute``, one
command applied to a write batch); the durable store's writer thread (``WriterThread``, and ``GiveTurns``, the scheduler hook that hands it turns, driven
line by line under injected interrupts); a message's stored form (the module ``codec``); the store's
on-disk layout, for tests that read a store's bytes or damage them on purpose (the modules
``files``, ``keys`` and ``seals``, ``LOCK_NAME``, ``FORMAT_VERSION``) and the names of the
states a namespace keeps in it (the module ``states``, ``record_from_value``/``CorruptRecord``
for its reader record, and ``Holds``, its compression holds); the mailbox's message envelopes
(``Ask``, ``Reply``, ``Mailbox``); the reader views' listings (``ReaderListing``,
``FilteredListing``, ``MergedListing``, ``shared_reader_listing``); blob extraction
(``extract_blobs``, ``resolve_blobs``, and ``MediaCache``, where media bytes are read back,
M13); the slack a cache's table may hold beyond twice what is in use (``SLACK``, ``memos.outgrown``) and such a table (``IdMemo``); the slots' pure parts (``prepare_append``,
``SlotCache``, ``SlotRegistry``, ``ChangeLog``, ``FULL``); content as the API takes it, turned
into blocks (``blocks_from_content``); the audience rule of an edit (``hidden_by_edit``) and the
Messages API form of compiled messages (``to_anthropic_messages``); the token estimates
(``estimate_text``, ``estimate_blocks``, ..., and ``approx_tokens``, the scripted models'
count); and a throwaway PostgreSQL cluster (``Cluster``, ``ClusterError``,
``temporary_cluster``) with PgBouncer in front of it on demand (``start_pooler``, ``Pooler``), and a PostgreSQL
engine's writing session reset under its driver (``reset_writer_session``). These names are for tests: they carry no compatibility promise beyond
the public API's.
"""

from __future__ import annotations

import abc
import contextlib
import http
import inspect
import itertools
import json
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeAlias

import attrs
import trio

from . import openai_rules
from .anthropic_rules import violations
from .budget import Entry
from .content.blocks import Message, Text
from .models.model import request_chars
from .models.model_types import ModelRequest, ModelResponse, Usage
from .views import MessageView, StaticListing

# What a host may use (docs/api.md); the seam's re-exports below are not in it, so a star import
# brings only these.
__all__ = [
    "ApiReply", "MessagesApiServer", "MessagesScript", "OpenAIApiServer", "PlainContext", "Responder",
    "ScriptedModel", "open_messages_api_server", "open_openai_api_server", "serve_messages_api",
    "serve_openai_api",
]

# The testing seam (see the module docstring): re-exported from where each lives now.
from .channel_entries import channel_key as channel_key
from .content import codec as codec
from .content.blobs import extract_blobs as extract_blobs
from .content.blobs import resolve_blobs as resolve_blobs
from .content.blobs import MediaCache as MediaCache
from .content.blocks import hidden_by_edit as hidden_by_edit
from .request_ledger import body_digest as body_digest
from .asks import Ask as Ask
from .mailbox import Mailbox as Mailbox
from .asks import Reply as Reply
from .memos import SLACK as SLACK
from .memos import IdMemo as IdMemo
from .models.model import approx_tokens as approx_tokens
from .namespace import states as states
from .namespace.core import CorruptRecord as CorruptRecord
from .namespace.core import Holds as Holds
from .namespace.core import record_from_value as record_from_value
from .pgcluster import Cluster as Cluster
from .pgcluster import ClusterError as ClusterError
from .pgcluster import Pooler as Pooler
from .pgcluster import start_pooler as start_pooler
from .pgcluster import temporary_cluster as temporary_cluster
from .slots import FULL as FULL
from .slots import ChangeLog as ChangeLog
from .slots import SlotCache as SlotCache
from .slots import SlotRegistry as SlotRegistry
from .slots import prepare_append as prepare_append
from .store import files as files
from .store import keys as keys
from .store import seals as seals
from .store.actor import execute as execute
from .store.actor import open_store_actor as open_store_actor
from .store.actor import serve_store as serve_store
from .store.engine import FORMAT_VERSION as FORMAT_VERSION
from .store.environment import LOCK_NAME as LOCK_NAME
from .store.environment import StoreHandle as StoreHandle
from .store.environment import close_store as close_store
from .store.environment import open_environments as open_environments
from .store.environment import open_store as open_store
from .store.protocol import AppendItem as AppendItem
from .store.protocol import Atomically as Atomically
from .store.protocol import CreateBranch as CreateBranch
from .store.protocol import DeleteBranch as DeleteBranch
from .store.protocol import EditItem as EditItem
from .store.protocol import RegisterState as RegisterState
from .store.protocol import RemoveItems as RemoveItems
from .store.protocol import SetValue as SetValue
from .store.records import BranchRow as BranchRow
from .store.records import ItemAppended as ItemAppended
from .store.records import index_state as index_state
from .store.records import LogHead as LogHead
from .store.records import Operation as Operation
from .store.committer import GiveTurns as GiveTurns
from .store.writer import WriterThread as WriterThread
from .store.records import StateInfo as StateInfo
from .store.records import ValueSet as ValueSet
from .verification import verify as verify
from .verification import verify_in_child as verify_in_child
from .verification import verify_store as verify_store
from .content.tokens import estimate_block as estimate_block
from .content.tokens import estimate_blocks as estimate_blocks
from .content.tokens import estimate_message as estimate_message
from .content.tokens import estimate_text as estimate_text
from .content.validation import blocks_from_content as blocks_from_content
from .views import FilteredListing as FilteredListing
from .views import MergedListing as MergedListing
from .views import ReaderListing as ReaderListing
from .namespace.views import shared_reader_listing as shared_reader_listing
from .forms.wire import to_anthropic_messages as to_anthropic_messages

Responder: TypeAlias = Callable[[ModelRequest], "str | ModelResponse | Awaitable[str | ModelResponse]"]


class ScriptedModel:
    """A ``Model`` that answers with ``responder(request)`` and records every request.

    ``responder`` returns a ``str`` (one ``Text`` block, stop reason ``end_turn``) or a
    ``ModelResponse``; it may be async (to block on an event, say) and may raise (for example
    ``ModelError``) to simulate a failure. A request is recorded when it arrives, before
    ``delay_s`` passes, so cancelled and failed calls are recorded too.
    """

    def __init__(self, responder: Responder, *, delay_s: float = 0.0) -> None:
        self.responder = responder
        self.delay_s = delay_s
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        await trio.sleep(self.delay_s)  # a checkpoint even when 0, as every async call must be
        reply = self.responder(request)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, ModelResponse):
            return reply
        usage = Usage(approx_tokens(request_chars(request)), approx_tokens(len(reply)))
        return ModelResponse((Text(reply),), "end_turn", usage)


# The error "type" the Messages API sends with each status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@attrs.frozen(kw_only=True)
class ApiReply:
    """One scripted answer of the local Messages API server; build it with the class methods.

    A 200 reply carries ``content`` (Messages API block dicts) and ``stop_reason``; any other
    status carries the API's error shape (the Messages API's ``{"type": "error", "error": {"type",
    "message"}}``; OpenAI's ``{"error": {"message", "type", "param", "code"}}``, with
    ``error_code``). The OpenAI server sends the same reply in its own form (text as the
    message's content, tool_use as a tool call, a stop reason in OpenAI's words). The server
    waits ``delay_s`` before answering (to test timeouts).
    """

    status: int = 200
    content: tuple[Mapping[str, Any], ...] = ()
    stop_reason: str = "end_turn"
    error_type: str = ""
    error_message: str = ""
    error_code: str | None = None
    usage: tuple[int, int] | None = None
    cached: tuple[int, int] = (0, 0)  # input tokens read from, and written to, the prompt cache
    delay_s: float = 0.0
    headers: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def text(cls, text: str, *, stop_reason: str = "end_turn") -> ApiReply:
        return cls(content=({"type": "text", "text": text},), stop_reason=stop_reason)

    @classmethod
    def refusal(cls, text: str = "") -> ApiReply:
        content = ({"type": "text", "text": text},) if text else ()
        return cls(content=content, stop_reason="refusal")

    @classmethod
    def tool_use(
        cls, name: str, input: Mapping[str, Any], *, id: str = "toolu_test_1", text: str | None = None
    ) -> ApiReply:
        block = {"type": "tool_use", "id": id, "name": name, "input": dict(input)}
        content = ({"type": "text", "text": text}, block) if text else (block,)
        return cls(content=content, stop_reason="tool_use")

    @classmethod
    def error(
        cls, status: int, message: str | None = None, *, retry_after_s: float | None = None, code: str | None = None
    ) -> ApiReply:
        """An error reply; ``retry_after_s`` sends ``retry-after-ms`` so SDK retries wait that long;
        ``code`` is OpenAI's error code (``"insufficient_quota"``, say; the Messages API has none)."""
        error_type = _ERROR_TYPES.get(status, "api_error")
        headers = {} if retry_after_s is None else {"retry-after-ms": str(int(retry_after_s * 1000))}
        return cls(status=status, error_type=error_type, error_message=message or error_type, headers=headers,
                   error_code=code)

    def after(self, delay_s: float) -> ApiReply:
        """This reply, sent ``delay_s`` seconds after the request arrives."""
        return attrs.evolve(self, delay_s=delay_s)

    def with_usage(
        self, input_tokens: int, output_tokens: int, *, cache_read: int = 0, cache_creation: int = 0
    ) -> ApiReply:
        """This reply, reporting this usage (else a quarter of the request's and the reply's bytes);
        ``cache_read`` and ``cache_creation`` input tokens as each API reports them (the Messages
        API apart from ``input_tokens``, Chat Completions within ``prompt_tokens``)."""
        return attrs.evolve(self, usage=(input_tokens, output_tokens), cached=(cache_read, cache_creation))


# Either a function of the request's JSON body, or replies used in order.
MessagesScript: TypeAlias = "Callable[[dict[str, Any]], ApiReply] | Iterable[ApiReply]"


class _BadRequest(Exception):
    pass


@attrs.frozen
class _HttpRequest:
    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes


_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


async def _read_request(stream: trio.abc.ReceiveStream, buffer: bytearray) -> _HttpRequest | None:
    """Read one HTTP/1.1 request from ``stream``; None at a clean end of stream between requests."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > _MAX_HEAD:
            raise _BadRequest("request head too large")
        data = await stream.receive_some(65536)
        if not data:
            if buffer:
                raise _BadRequest("connection closed mid-request")
            return None
        buffer += data
    head = bytes(buffer[:end]).decode("latin-1")
    del buffer[: end + 4]
    request_line, *header_lines = head.split("\r\n")
    try:
        method, target, _version = request_line.split(" ")
        headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in header_lines)}
    except ValueError:
        raise _BadRequest(f"malformed request head: {request_line!r}") from None
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise _BadRequest("chunked request bodies are not supported")
    length = int(headers.get("content-length", "0"))
    if not 0 <= length <= _MAX_BODY:
        raise _BadRequest(f"bad content-length {length}")
    while len(buffer) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise _BadRequest("connection closed mid-body")
        buffer += data
    body = bytes(buffer[:length])
    del buffer[:length]
    return _HttpRequest(method, target, headers, body)


def _encode_response(status: int, body: Mapping[str, Any], headers: Mapping[str, str], *, close: bool) -> bytes:
    payload = json.dumps(body).encode()
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Overloaded" if status == 529 else "Unknown"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        f"connection: {'close' if close else 'keep-alive'}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class _LoopbackApi(abc.ABC):
    """What both local API servers share: HTTP/1.1 connections, the script, request ids; a
    subclass says which paths it serves, the rules it applies and the shape of its replies.

    ``requests`` holds the JSON bodies of the API's POSTs received, in order; ``connections``
    counts the TCP connections accepted (keep-alive reuses one), ``open_connections`` those not
    yet closed by either side (a client that was closed leaves none once the server has seen it).
    """

    script_name = "api"
    request_id_header = "request-id"

    def __init__(self, script: MessagesScript) -> None:
        self.base_url = ""
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.open_connections = 0
        self._respond: Callable[[dict[str, Any]], ApiReply]
        if callable(script):
            self._respond = script
        else:
            self._respond = partial(self._next_reply, iter(script))
        self._ids = itertools.count(1)

    def _next_reply(self, replies: Iterator[ApiReply], _body: dict[str, Any]) -> ApiReply:
        try:
            return next(replies)
        except StopIteration:
            # 400, not 500: a test that ran out of script should fail, not retry.
            count = len(self.requests) - 1
            return ApiReply.error(400, f"{self.script_name} script exhausted after {count} replies")

    @abc.abstractmethod
    def _error(self, error_type: str, message: str, code: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _paths(self) -> tuple[str, ...]: ...

    @abc.abstractmethod
    def _violations(self, path: str, body: dict[str, Any]) -> list[str]: ...

    @abc.abstractmethod
    def _reply(
        self, path: str, number: int, body: dict[str, Any], reply: ApiReply, usage: tuple[int, int]
    ) -> dict[str, Any]: ...

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open_connections += 1
        buffer = bytearray()
        try:
            await self._converse(stream, buffer)
        finally:
            self.open_connections -= 1

    async def _converse(self, stream: trio.SocketStream, buffer: bytearray) -> None:
        async with stream:
            # A client that goes away (e.g. timed out waiting for a slow reply) just ends the connection.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                try:
                    while (request := await _read_request(stream, buffer)) is not None:
                        close = request.headers.get("connection", "").lower() == "close"
                        status, body, headers = await self._answer(request)
                        await stream.send_all(_encode_response(status, body, headers, close=close))
                        if close:
                            return
                except _BadRequest as exc:
                    error = self._error("invalid_request_error", str(exc))
                    await stream.send_all(_encode_response(400, error, {}, close=True))

    async def _answer(self, request: _HttpRequest) -> tuple[int, dict[str, Any], Mapping[str, str]]:
        number = next(self._ids)
        headers = {self.request_id_header: f"req_test_{number}"}
        path = request.target.split("?")[0]
        if request.method != "POST" or path not in self._paths():
            return 404, self._error("not_found_error", f"{request.method} {request.target} is not served here"), headers
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            return 400, self._error("invalid_request_error", f"body is not JSON: {exc}"), headers
        if not isinstance(body, dict):
            return 400, self._error("invalid_request_error", "body is not a JSON object"), headers
        self.requests.append(body)
        broken = self._violations(path, body)
        if broken:  # refused as the API refuses it, before the script is asked
            return 400, self._error("invalid_request_error", "; ".join(broken)), headers
        reply = self._respond(body)
        await trio.sleep(reply.delay_s)
        headers.update(reply.headers)
        if reply.status != 200:
            return reply.status, self._error(reply.error_type, reply.error_message, reply.error_code), headers
        output_chars = sum(len(json.dumps(block)) for block in reply.content)
        usage = reply.usage or ((len(request.body) + 3) // 4, (output_chars + 3) // 4)
        return 200, self._reply(path, number, body, reply, usage), headers



class MessagesApiServer(_LoopbackApi):
    """A loopback Messages API server; see ``serve_messages_api`` and ``open_messages_api_server``.

    ``requests`` holds the JSON bodies of ``POST /v1/messages`` received, in order;
    ``connections`` counts the TCP connections accepted (keep-alive reuses one).
    """

    script_name = "messages"

    def _error(self, error_type: str, message: str, code: str | None = None) -> dict[str, Any]:
        return _error_body(error_type, message)

    def _paths(self) -> tuple[str, ...]:
        return ("/v1/messages",)

    def _violations(self, path: str, body: dict[str, Any]) -> list[str]:
        return violations(body)

    def _reply(
        self, path: str, number: int, body: dict[str, Any], reply: ApiReply, usage: tuple[int, int]
    ) -> dict[str, Any]:
        return {
            "id": f"msg_test_{number}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "unknown"),
            "content": [dict(block) for block in reply.content],
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1],
                      "cache_read_input_tokens": reply.cached[0], "cache_creation_input_tokens": reply.cached[1]},
        }


CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
# A scripted stop reason in Chat Completions' words (any other is sent as written).
_FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "refusal": "stop"}


class OpenAIApiServer(_LoopbackApi):
    """A loopback OpenAI API server (Chat Completions and Responses, non-streaming); see
    ``serve_openai_api`` and ``open_openai_api_server``. ``base_url`` ends in ``/v1``, as the
    ``openai`` SDK expects.

    ``requests`` holds the JSON bodies of ``POST /v1/chat/completions`` and ``POST /v1/responses``
    received, in order; ``connections`` counts the TCP connections accepted.
    """

    script_name = "openai"
    request_id_header = "x-request-id"

    def _error(self, error_type: str, message: str, code: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": error_type, "param": None, "code": code}}

    def _paths(self) -> tuple[str, ...]:
        return (CHAT_PATH, RESPONSES_PATH)

    def _violations(self, path: str, body: dict[str, Any]) -> list[str]:
        return openai_rules.violations(body, api="chat" if path == CHAT_PATH else "responses")

    def _reply(
        self, path: str, number: int, body: dict[str, Any], reply: ApiReply, usage: tuple[int, int]
    ) -> dict[str, Any]:
        texts = [str(block.get("text", "")) for block in reply.content if block.get("type") == "text"]
        calls = [block for block in reply.content if block.get("type") == "tool_use"]
        model = body.get("model", "unknown")
        if path == CHAT_PATH:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None, "refusal": None}
            if reply.stop_reason == "refusal":
                message.update(content=None, refusal="".join(texts) or "I can't help with that.")
            if calls:
                message["tool_calls"] = [
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": json.dumps(call["input"])}}
                    for call in calls
                ]
            return {
                "id": f"chatcmpl-test-{number}", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": _FINISH_REASONS.get(reply.stop_reason, reply.stop_reason)}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage),
                          "prompt_tokens_details": {"cached_tokens": reply.cached[0]}},
            }
        output: list[dict[str, Any]] = []
        parts: list[dict[str, Any]]
        if reply.stop_reason == "refusal":
            parts = [{"type": "refusal", "refusal": "".join(texts) or "I can't help with that."}]
        else:
            parts = [{"type": "output_text", "text": text, "annotations": []} for text in texts]
        if parts:
            output.append({"type": "message", "id": f"msg_test_{number}", "status": "completed",
                           "role": "assistant", "content": parts})
        output += [{"type": "function_call", "id": f"fc_test_{number}_{k}", "call_id": call["id"],
                    "name": call["name"], "arguments": json.dumps(call["input"]), "status": "completed"}
                   for k, call in enumerate(calls)]
        incomplete = reply.stop_reason == "max_tokens"
        response: dict[str, Any] = {
            "id": f"resp_test_{number}", "object": "response", "created_at": 0, "model": model,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None, "instructions": body.get("instructions"), "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage),
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        }
        return response


async def _serve(
    server: _LoopbackApi, host: str, port: int, path: str, task_status: trio.TaskStatus[Any]
) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server._handle_connection, port, host=host))
        bound_port = listeners[0].socket.getsockname()[1]
        server.base_url = f"http://{host}:{bound_port}{path}"
        task_status.started(server)


async def serve_messages_api(
    script: MessagesScript,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[MessagesApiServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Messages API subset on ``host:port`` (0: any free port) until cancelled.

    Use as ``server = await nursery.start(serve_messages_api, script)``; the started value is
    the ``MessagesApiServer`` with its ``base_url`` set. Cancelling stops it, slow replies
    included. A script function that raises crashes the server (it is a bug in the test).
    """
    await _serve(MessagesApiServer(script), host, port, "", task_status)


async def serve_openai_api(
    script: MessagesScript,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[OpenAIApiServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve Chat Completions and Responses on ``host:port`` until cancelled, as ``serve_messages_api``
    serves the Messages API; the started value is the ``OpenAIApiServer``."""
    await _serve(OpenAIApiServer(script), host, port, "/v1", task_status)


@asynccontextmanager
async def _running(serve: Callable[..., Awaitable[None]], script: MessagesScript) -> AsyncIterator[Any]:
    error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, script)
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
    if error is not None:
        raise error  # outside the except clause, so the group doesn't become its __context__


@asynccontextmanager
async def open_messages_api_server(script: MessagesScript) -> AsyncIterator[MessagesApiServer]:
    """A loopback Messages API server running for the duration of the ``async with`` block.

    An error raised in the block comes out as itself, not wrapped in an exception group.
    """
    async with _running(serve_messages_api, script) as server:
        yield server


@asynccontextmanager
async def open_openai_api_server(script: MessagesScript) -> AsyncIterator[OpenAIApiServer]:
    """A loopback OpenAI API server (Chat Completions and Responses) for the duration of the
    ``async with`` block; errors in the block come out unwrapped, as ``open_messages_api_server``'s."""
    async with _running(serve_openai_api, script) as server:
        yield server


class PlainContext:
    """A ``StrategyContext`` with no trio and no store: the view is a list of messages (append to
    ``messages`` in place), state lives in dicts, and writes apply at once. For testing a
    strategy's ``select``, ``next_unit``, ``request_for`` and ``apply_unit`` as plain code.

    ``floor`` is the highest ``mark_compression_read``; ``now`` returns ``clock`` (settable).
    """

    def __init__(
        self, messages: Iterable[Message] = (), *, namespace: str = "default", branch: str = "main",
        reader: str | None = None, system_prompt: str | None = None,
    ) -> None:
        self.messages: list[Message] = list(messages)
        self.namespace = namespace
        self.branch = branch
        self.reader = reader
        self.system_prompt = system_prompt
        self.tools: tuple[Mapping[str, Any], ...] = ()
        self.writes = True
        self.clock = 0.0
        self.holds = Holds()
        self.values: dict[str, Any] = {}
        self.logs: dict[str, list[Any]] = {}
        self.context: list[Entry] = []
        self.floor = 0
        self.view = MessageView(ReaderListing(StaticListing(self.messages), reader))

    def now(self) -> float:
        return self.clock

    def hold_floor(self) -> int | None:
        return self.holds.floor()

    def get_value(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def read_log(self, name: str) -> list[Any]:
        return list(self.logs.get(name, ()))

    def set_value(self, name: str, value: Any) -> None:
        self.values[name] = json.loads(json.dumps(value))  # stored as JSON, as a store would

    def append_log(self, name: str, value: Any) -> None:
        self.logs.setdefault(name, []).append(json.loads(json.dumps(value)))

    def append_context(self, entry: Entry) -> None:
        self.context.append(entry)

    def mark_compression_read(self, sequence: int) -> None:
        self.floor = max(self.floor, sequence)


def reset_writer_session(engine: Any) -> None:
    """Reset a PostgreSQL engine's writing session (``DISCARD ALL``) under its driver, as a pooler
    resetting a server connection would: the session forgets the prepared statements the driver
    still names (K16). Call between batches only (no write in flight)."""
    engine._writer.pgconn.exec_(b"DISCARD ALL")
