"""Models: the ``Model`` protocol, ``AnthropicModel`` and the offline ``OfflineModel`` (DESIGN.md §9).

A call's data (``ModelRequest``, ``ModelResponse``, ``Usage``) is in ``ctxrt.models.model_types``, which
the strategies import with neither the SDK nor trio. This is the only module that imports ``anthropic`` (``openai_model`` the only one that imports
``openai``). SDK errors are translated here, once, into ``ModelError`` with ``retryable`` set;
nothing else in ctxrt sees an SDK type.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import trio

from ..content.blocks import Block, CompiledMessage, Document, Text, ToolResult
from ..errors import ModelError
from .model_types import ModelRequest, ModelResponse, Usage
from ..forms.wire import blocks_from_api, to_anthropic_messages

if TYPE_CHECKING:
    import anthropic


@runtime_checkable
class Model(Protocol):
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request``.

        Raises:
            ModelError: the call failed; ``retryable`` says whether trying again may help.
        """
        ...


def approx_tokens(chars: int) -> int:
    """A rough token count for ``chars`` characters of text (about 4 per token)."""
    return (chars + 3) // 4


def _block_text(block: Block) -> str:
    if isinstance(block, Text):
        return block.text
    if isinstance(block, ToolResult):
        if isinstance(block.content, str):
            return block.content
        return "\n".join(_block_text(inner) for inner in block.content)
    if isinstance(block, Document) and block.source.get("type") == "text":
        return str(block.source.get("data", ""))
    return ""  # images, tool calls and thinking carry no prose worth extracting


def _message_text(message: CompiledMessage) -> str:
    return "\n".join(filter(None, (_block_text(block) for block in message.content)))


def request_chars(request: ModelRequest) -> int:
    """Characters of text in ``request`` (system and messages), for usage estimates."""
    return len(request.system or "") + sum(len(_message_text(message)) for message in request.messages)


# --- AnthropicModel ------------------------------------------------------------------------

def _status_error_detail(body: object) -> tuple[str, str]:
    """(error type, message) from an Anthropic error body, as far as it has them."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return "error", json.dumps(body, default=str) if body is not None else "no error body"
    return str(error.get("type", "error")), str(error.get("message", ""))


def _anthropic() -> Any:
    """The SDK, imported on first use: it costs a second at import and only AnthropicModel needs it."""
    import anthropic

    return anthropic


def retryable_status(status: int) -> bool:
    """Whether trying again may help an HTTP error: the SDKs' own retry policy (request timeout,
    lock conflict, rate limit, any 5xx, 529 overloaded among them)."""
    return status in (408, 409, 429) or status >= 500


def _model_error(model: str, exc: anthropic.APIError, timeout_s: float) -> ModelError:
    anthropic = _anthropic()

    if isinstance(exc, anthropic.APITimeoutError):
        return ModelError(f"model {model!r}: no reply within {timeout_s} s (timed out, no HTTP status)", retryable=True)
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__ or exc
        return ModelError(f"model {model!r}: connection failed (no HTTP status): {cause!r}", retryable=True)
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        error_type, detail = _status_error_detail(exc.body)
        return ModelError(f"model {model!r}: HTTP {status} {error_type}: {detail}", retryable=retryable_status(status))
    return ModelError(f"model {model!r}: unusable response (no HTTP status): {exc}", retryable=False)


class SdkClientModel:
    """What a model over a provider's SDK client shares: closing the client if it made it.

    A subclass sets ``_client`` (with an async ``close()``), ``_owns_client`` and ``_closed``.
    """

    _client: Any
    _owns_client: bool
    _closed: bool

    async def aclose(self) -> None:
        """Close the client if this model built it. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owns_client:
                await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class AnthropicModel(SdkClientModel):
    """A ``Model`` over ``anthropic.AsyncAnthropic`` (the Messages API, non-streaming).

    ``client`` None builds one from the environment (``ANTHROPIC_API_KEY``; ``ModelError`` if no
    credentials are found); this model then owns it and ``aclose()`` closes it. A client passed
    in stays the caller's to close. The runtime that owns this model calls ``aclose()`` when it
    shuts down; it must be called, because the SDK cleans up an unclosed client only on asyncio.
    Works on trio as is (the SDK's httpx2/httpcore2 and anyio both support trio).

    ``max_retries`` is the SDK's retry count for retryable failures (its waits use
    ``anyio.sleep``, so they are trio checkpoints); ``timeout_s`` is the per-attempt HTTP timeout,
    used when a request sets none.
    """

    provider = "anthropic"  # gen_ai.provider.name in traces (ctxrt/tracing.py)

    def __init__(
        self, client: anthropic.AsyncAnthropic | None = None, *, max_retries: int = 2, timeout_s: float = 120.0
    ) -> None:
        anthropic = _anthropic()
        self._owns_client = client is None
        if client is None:
            client = anthropic.AsyncAnthropic(max_retries=max_retries, timeout=timeout_s)
            # Without this the SDK raises a bare TypeError on the first call.
            if not any(getattr(client, name, None) for name in ("api_key", "auth_token", "credentials")):
                message = "AnthropicModel: no Anthropic credentials found; set ANTHROPIC_API_KEY or pass client="
                raise ModelError(message)
        else:
            client = client.with_options(max_retries=max_retries)  # a copy sharing the caller's connections
        self._client = client
        self._timeout_s = timeout_s
        self._closed = False
        self.max_retries = max_retries

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request``; a "refusal" (or any) stop reason comes back as a response.

        Raises:
            ModelError: the call failed, with ``retryable`` True for rate limits (429), server
                errors (5xx, 529 overloaded), timeouts and connection failures, False for
                refusals of the request itself (400, 401, 403, 404, ...). The message names the
                model and the HTTP status.

        If cancelled, the request may still reach the API; its reply is dropped.
        """
        if self._closed:
            raise ModelError(f"model {request.model!r}: this AnthropicModel was closed")
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": to_anthropic_messages(request.messages, request.assistant),
        }  # no temperature: see ModelRequest
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = [dict(tool) for tool in request.tools]
        # Always explicit: the SDK refuses large non-streaming max_tokens when no timeout is given.
        timeout_s = self._timeout_s if request.timeout_s is None else request.timeout_s
        try:
            reply = await self._client.messages.create(**params, timeout=timeout_s)
        except _anthropic().APIError as exc:
            raise _model_error(request.model, exc, timeout_s) from exc
        except _anthropic().AnthropicError as exc:
            raise ModelError(f"model {request.model!r}: refused before sending (no HTTP status): {exc}") from exc
        content = blocks_from_api(reply.content)  # block types ctxrt doesn't keep are skipped
        # The Messages API counts cached input apart from input_tokens; Usage counts it in (GenAI conventions).
        read = reply.usage.cache_read_input_tokens or 0
        written = reply.usage.cache_creation_input_tokens or 0
        usage = Usage(reply.usage.input_tokens + read + written, reply.usage.output_tokens, read, written)
        return ModelResponse(content, reply.stop_reason or "unknown", usage)


# --- OfflineModel --------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"\w+")


def _sentences(text: str) -> list[str]:
    """The distinct sentences of ``text``, whitespace normalised, first occurrences in order."""
    sentences = (" ".join(part.split()) for part in _SENTENCE_END.split(text))
    return list(dict.fromkeys(sentence for sentence in sentences if sentence))


def _first_words(text: str, budget_chars: int) -> str:
    words = text.split()
    kept: list[str] = []
    used = 0
    for word in words:
        cost = len(word) + (1 if kept else 0)
        if used + cost > budget_chars:
            break
        kept.append(word)
        used += cost
    return " ".join(kept) if kept else words[0][:budget_chars] if words else ""


def extract_summary(text: str, budget_chars: int) -> str:
    """The sentences of ``text`` richest in rare words, in their original order, within ``budget_chars``.

    Never empty when ``text`` has a word: falls back to its first words (or the start of the first).
    """
    budget_chars = max(1, budget_chars)
    sentences = _sentences(text)
    words = [_WORD.findall(sentence.lower()) for sentence in sentences]
    document_frequency = Counter(word for sentence_words in words for word in set(sentence_words))
    count = len(sentences)

    def score(index: int) -> float:
        distinct = sorted(set(words[index]))  # sorted: float sums independent of hash order
        rarity = sum(math.log((1 + count) / document_frequency[word]) for word in distinct)
        return rarity / math.sqrt(1 + len(words[index]))

    scores = [score(index) for index in range(count)]
    chosen: list[int] = []
    used = 0
    for index in sorted(range(count), key=lambda i: (-scores[i], i)):
        cost = len(sentences[index]) + (1 if chosen else 0)
        if used + cost <= budget_chars:
            chosen.append(index)
            used += cost
    summary = " ".join(sentences[index] for index in sorted(chosen))
    return summary or _first_words(text, budget_chars)


_TRANSCRIPT = re.compile(r"<earlier_in_conversation>(.*?)</earlier_in_conversation>", re.S)
_SPEAKER = re.compile(r"^# (\S+)\n", re.M)


class OfflineModel:
    """A deterministic extractive summariser with no network, for demos and tests without a key.

    With two or more messages the last is taken as the instruction (compression requests end
    with it, spec T4) and what precedes it is summarised, or the transcript the instruction
    carries between ``<earlier_in_conversation>`` tags; with one message, that message is.
    The reply is the most informative sentences (rare words, kept in their original order) up
    to about ``max_tokens`` tokens (4 characters each). Same request, same bytes; never empty
    text for input with any words. Always ``stop_reason="end_turn"``; usage counts characters.
    """

    provider = "ctxrt.offline"  # gen_ai.provider.name in traces (ctxrt/tracing.py)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await trio.lowlevel.checkpoint()  # every async call is a checkpoint
        texts = [_message_text(message) for message in request.messages]
        framed = _TRANSCRIPT.search(texts[-1]) if texts else None
        if framed is not None:
            # A compression request carries its chunk as a transcript inside the instruction.
            source = _SPEAKER.sub(lambda m: f"{m.group(1).capitalize()}: ", framed.group(1))
        else:
            source = "\n".join(filter(None, texts[:-1])) if len(texts) > 1 else ""
        if not source.strip():
            source = "\n".join(filter(None, texts))
        summary = extract_summary(source, request.max_tokens * 4)
        usage = Usage(approx_tokens(request_chars(request)), approx_tokens(len(summary)))
        return ModelResponse((Text(summary),) if summary else (), "end_turn", usage)
