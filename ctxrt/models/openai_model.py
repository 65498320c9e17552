"""``OpenAIModel``: compression through the ``openai`` SDK's Chat Completions, against OpenAI or
any OpenAI-compatible endpoint (vLLM, llama.cpp's server, Ollama, a hosted one) (docs/behaviours.md P12).

The only module that imports ``openai``, and only when an ``OpenAIModel`` is made: ``openai`` is
an optional dependency (``pip install 'ctxrt[openai]'``). SDK errors become ``ModelError`` here,
once, with ``retryable`` set as ``AnthropicModel`` sets it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..content.blocks import Block, Text, ToolUse
from ..errors import ModelError
from .model import SdkClientModel, retryable_status
from .model_types import ModelRequest, ModelResponse, Usage
from ..forms.openai_wire import SystemRole, chat_tools, check_system_role, to_chat_messages
from ..forms.wire import api_tool_name

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletion

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
# Chat Completions' finish reasons in the Messages API's words, which ModelResponse uses (a
# strategy keeps a reply as a summary only on "end_turn", T4). Others are passed through.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# A 429 that retrying can't cure: the account is out of credit.
NOT_RETRYABLE_CODES = frozenset({"insufficient_quota"})


def _openai() -> Any:
    """The SDK, imported on first use: it is optional, and only OpenAIModel needs it."""
    try:
        import openai
    except ImportError as exc:
        raise ModelError("OpenAIModel needs the openai package: pip install 'ctxrt[openai]'") from exc
    return openai


def _status_error_detail(body: object) -> tuple[str, str, str | None]:
    """(error type, message, code) from an OpenAI error body (the SDK hands over its "error"
    object), as far as it has them."""
    if not isinstance(body, Mapping):
        return "error", str(body) if body is not None else "no error body", None
    code = body.get("code")
    return str(body.get("type") or "error"), str(body.get("message", "")), str(code) if code else None


def _model_error(model: str, exc: openai.APIError, timeout_s: float) -> ModelError:
    openai = _openai()
    if isinstance(exc, openai.APITimeoutError):
        return ModelError(f"model {model!r}: no reply within {timeout_s} s (timed out, no HTTP status)", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return ModelError(f"model {model!r}: connection failed (no HTTP status): {cause!r}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        error_type, detail, code = _status_error_detail(exc.body)
        retryable = retryable_status(status) and code not in NOT_RETRYABLE_CODES
        shown_code = f" ({code})" if code else ""
        return ModelError(f"model {model!r}: HTTP {status} {error_type}{shown_code}: {detail}", retryable=retryable)
    return ModelError(f"model {model!r}: unusable response (no HTTP status): {exc}", retryable=False)


def _arguments(text: str | None) -> dict[str, Any]:
    """A call's arguments as an object; text that isn't a JSON object gives {} (as a Messages API
    tool_use with a non-object input does)."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _response(reply: ChatCompletion, request: ModelRequest) -> ModelResponse:
    """The reply as a ``ModelResponse``; ``ModelError`` (not retryable) for one that holds no choice,
    ``TypeError`` for fields of the wrong types."""
    if not reply.choices:
        raise ModelError(f"model {request.model!r}: unusable response (no HTTP status): the reply holds no choice")
    choice = reply.choices[0]
    message = choice.message
    names = {api_tool_name(str(tool.get("name", ""))): str(tool.get("name", "")) for tool in request.tools}
    content: list[Block] = []
    for text in (message.content, message.refusal):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"a message's content or refusal is {type(text).__name__}, not text")
        if text:
            content.append(Text(text))
    for call in message.tool_calls or ():
        if call.type == "function":
            name, call_id = call.function.name, call.id
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise TypeError("a tool call's id or name isn't text")
            content.append(ToolUse(call_id, names.get(name, name), _arguments(call.function.arguments)))
    stop_reason = "refusal" if message.refusal else STOP_REASONS.get(choice.finish_reason, choice.finish_reason)
    usage = reply.usage
    details = usage.prompt_tokens_details if usage else None
    cached = (details.cached_tokens or 0) if details is not None else 0  # prompt_tokens counts them in
    counts = (usage.prompt_tokens, usage.completion_tokens, cached) if usage else (0, 0, 0)
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
        counts = (0, 0, 0)  # a server that reports no usable usage: calibration ignores (0, 0)
    return ModelResponse(content, stop_reason if isinstance(stop_reason, str) and stop_reason else "unknown",
                         Usage(*counts))


class OpenAIModel(SdkClientModel):
    """A ``Model`` over ``openai.AsyncOpenAI``'s Chat Completions (non-streaming).

    ``client`` None builds one with ``base_url`` and ``api_key`` (each None: the SDK's
    environment, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``; ``ModelError`` if no credentials
    are found: for a local server that checks none, pass any ``api_key``); this model then owns
    it and ``aclose()`` closes it. A client passed in stays the caller's to close (``base_url``
    and ``api_key`` are then the client's business). Works on trio as is (the SDK's httpx2 and
    anyio support trio).

    ``max_retries`` and ``timeout_s`` are as ``AnthropicModel``'s. ``system_role`` is the role
    the request's system prompt is sent with ("developer" for OpenAI's reasoning models);
    ``max_tokens_field`` names the reply limit ("max_tokens" for a server that doesn't know
    ``max_completion_tokens``); ``alternate_roles`` merges runs of one role and opens with a user
    turn, for servers whose chat templates refuse anything else (``to_openai_chat``'s option).
    """

    provider = "openai"  # gen_ai.provider.name in traces (ctxrt/tracing.py)

    def __init__(
        self,
        client: openai.AsyncOpenAI | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout_s: float = 120.0,
        system_role: SystemRole = "system",
        max_tokens_field: MaxTokensField = "max_completion_tokens",
        alternate_roles: bool = False,
    ) -> None:
        check_system_role(system_role)
        if max_tokens_field not in ("max_completion_tokens", "max_tokens"):
            raise ValueError("max_tokens_field must be 'max_completion_tokens' or 'max_tokens', "
                             f"not {max_tokens_field!r}")
        openai = _openai()
        self._owns_client = client is None
        if client is None:
            try:
                client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries,
                                            timeout=timeout_s)
            except openai.OpenAIError as exc:
                raise ModelError("OpenAIModel: no OpenAI credentials found; set OPENAI_API_KEY or pass api_key= "
                                 "(any string for a local server that checks none) or client=") from exc
        elif base_url is not None or api_key is not None:
            raise ValueError("OpenAIModel: give base_url and api_key to the client you pass, not beside it")
        else:
            client = client.with_options(max_retries=max_retries)  # a copy sharing the caller's connections
        self._client = client
        self._timeout_s = timeout_s
        self._closed = False
        self.max_retries = max_retries
        self.system_role: SystemRole = system_role
        self.max_tokens_field: MaxTokensField = max_tokens_field
        self.alternate_roles = alternate_roles

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` as a Chat Completions request; any finish reason comes back as a response,
        in the Messages API's words ("stop" as "end_turn", "length" as "max_tokens", "tool_calls"
        as "tool_use", "content_filter" and a refusal as "refusal").

        The request's messages go as ``to_openai_chat`` sends a compile's (P10); its tools as
        function tools, names rewritten as calls are, and a call's name comes back as the tool
        was named. ``temperature`` is sent when the request sets one. ``usage`` is the reply's
        ``prompt_tokens`` and ``completion_tokens`` (0 and 0 when the server reports none, which
        a ``CalibratedEstimator`` ignores).

        Raises:
            ModelError: the call failed, with ``retryable`` True for rate limits (429, but for
                ``insufficient_quota``), 408, 409, server errors (5xx), timeouts and connection
                failures, False for refusals of the request itself (400, 401, 403, 404, ...) and
                replies with no choice. The message names the model and the HTTP status.

        If cancelled, the request may still reach the server; its reply is dropped.
        """
        if self._closed:
            raise ModelError(f"model {request.model!r}: this OpenAIModel was closed")
        messages, _, _ = to_chat_messages(request.messages, request.assistant, system=request.system,
                                          system_role=self.system_role, alternate_roles=self.alternate_roles)
        params: dict[str, Any] = {"model": request.model, "messages": messages,
                                  self.max_tokens_field: request.max_tokens}
        if request.temperature is not None:
            params["temperature"] = request.temperature
        tools = chat_tools(request.tools)
        if tools:
            params["tools"] = tools
        timeout_s = self._timeout_s if request.timeout_s is None else request.timeout_s
        openai = _openai()
        try:
            reply: ChatCompletion = await self._client.chat.completions.create(**params, timeout=timeout_s)
        except openai.APIError as exc:
            raise _model_error(request.model, exc, timeout_s) from exc
        except openai.OpenAIError as exc:
            raise ModelError(f"model {request.model!r}: refused before sending (no HTTP status): {exc}") from exc
        except ValueError as exc:  # a 200 whose body isn't JSON (a proxy's page, a cut reply): may pass
            raise ModelError(f"model {request.model!r}: unusable response (no HTTP status): its body isn't JSON "
                             f"({exc})", retryable=True) from exc
        try:
            return _response(reply, request)
        except (AttributeError, TypeError, ValueError) as exc:  # the SDK builds replies without checking them
            raise ModelError(f"model {request.model!r}: unusable response (no HTTP status): not a chat completion "
                             f"({exc})") from exc
