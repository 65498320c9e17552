"""Token estimates, content-class aware (docs/behaviours.md P2).

Prose runs about 2.9 characters per token and dense text (code, JSON, non-Latin scripts) about
2.3; a flat chars/4 under-priced real prompts 1.7-1.9x. Every strategy plans with these figures,
so planning and emission agree. Lengths are Python code points (the reference counted UTF-16
units; the two differ only for characters outside the BMP).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .blocks import (
    Audio,
    Block,
    Document,
    GeneratedImage,
    Image,
    Message,
    RedactedThinking,
    Text,
    Thinking,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
)
from .notes import attempt_note, media_note, notice_note

PROSE_CHARS_PER_TOKEN = 2.9
DENSE_CHARS_PER_TOKEN = 2.3
DENSE_SAMPLE_CHARS = 2000
DENSE_FRACTION = 0.12
SIGNATURE_CHARS_PER_TOKEN = 3.3
REDACTED_CHARS_PER_TOKEN = 6
REDACTED_DEFAULT_TOKENS = 600
TOOL_USE_OVERHEAD_TOKENS = 20
IMAGE_TOKEN_ESTIMATE = 1600
DOCUMENT_TOKEN_ESTIMATE = 1000
AUDIO_VIDEO_TOKEN_ESTIMATE = 1000  # the reference's; at least what the note sent in its place costs

_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _round_half_up(x: float) -> int:
    # The reference used JS Math.round; Python's round() would round halves to even.
    return math.floor(x + 0.5)


_DENSE = re.compile(r'[{}\[\]":_/=`]|[^\x00-\x7f]')  # the dense ASCII marks, or any non-ASCII character


def _dense_count(sample: str) -> int:
    return len(_DENSE.findall(sample))  # one C pass: ten str.count calls cost twice as much


def estimate_text(text: str) -> int:
    """ceil(len / 2.9) for prose, ceil(len / 2.3) when over 12% of the first 2000 chars are dense."""
    if not text:
        return 0
    sample = text[:DENSE_SAMPLE_CHARS]
    dense = _dense_count(sample) > DENSE_FRACTION * len(sample)
    return math.ceil(len(text) / (DENSE_CHARS_PER_TOKEN if dense else PROSE_CHARS_PER_TOKEN))


def estimate_block(block: Block) -> int:
    """The estimate for one block; blob refs cost what their media costs. A tool attempt or
    notice costs the note every request form sends in its place (``notes``); audio and video the
    larger of that note and a flat 1,000."""
    if type(block) is Text:
        return estimate_text(block.text)
    if type(block) is ToolUse:
        return math.ceil(len(_compact_json(block.input)) / DENSE_CHARS_PER_TOKEN) + TOOL_USE_OVERHEAD_TOKENS
    if type(block) is ToolResult:
        content = block.content
        if isinstance(content, str):
            return math.ceil(len(content) / DENSE_CHARS_PER_TOKEN)
        return sum(estimate_block(b) for b in content) if content else 0
    if type(block) is Thinking:
        tokens = estimate_text(block.thinking)
        if block.signature:
            tokens = max(tokens, _round_half_up(len(block.signature) / SIGNATURE_CHARS_PER_TOKEN))
        return tokens
    if type(block) is RedactedThinking:
        data = block.data
        return _round_half_up(len(data) / REDACTED_CHARS_PER_TOKEN) if data else REDACTED_DEFAULT_TOKENS
    if type(block) is Image or type(block) is GeneratedImage:
        # A host's own figure wins (it knows the image's size, or what its provider charged).
        return IMAGE_TOKEN_ESTIMATE if block.token_estimate is None else block.token_estimate
    if type(block) is Document:
        return DOCUMENT_TOKEN_ESTIMATE
    if type(block) is Audio or type(block) is Video:
        return max(AUDIO_VIDEO_TOKEN_ESTIMATE, estimate_text(media_note(block)))
    if type(block) is ToolAttempt:
        return estimate_text(attempt_note(block))
    if type(block) is ToolNotice:
        return estimate_text(notice_note(block))
    raise TypeError(f"not a content block: {block!r}")


def estimate_blocks(blocks: Iterable[Block]) -> int:
    """The sum of the blocks' estimates (rounded per block, as the reference does)."""
    return sum(estimate_block(b) for b in blocks)


def estimate_message(msg: Message) -> int:
    """The estimate of a message's content, memoised on the message (messages are immutable)."""
    tokens = msg._tokens
    if tokens < 0:
        tokens = estimate_blocks(msg.content)
        object.__setattr__(msg, "_tokens", tokens)  # a memo, not part of the frozen message's identity
    return tokens


@runtime_checkable
class TokenEstimator(Protocol):
    """What a namespace prices messages with (``Runtime.open(token_estimator=...)``).

    ``estimate`` must be cheap and stable between ``observe`` calls; ``observe`` hears, after each
    compression request the namespace's model answered, the model's name, the plain estimate of
    the request and the ``input_tokens`` the model reported. ``estimate`` sees a message as stored:
    each medium's source a ``blob_ref`` (sha256, media type, size), with no ``data`` (M13).
    """

    def estimate(self, message: Message) -> int: ...

    def observe(self, model: str, estimated: int, actual: int) -> None: ...


MIN_FACTOR, MAX_FACTOR = 0.25, 4.0  # a calibration outside this says the report is wrong, not the estimate
CALIBRATION_WEIGHT = 0.3  # each observation moves the factor this far toward what it saw


class CalibratedEstimator:
    """The plain estimate times a factor learnt from the usage the model reports, per model.

    Each observation moves the model's factor ``CALIBRATION_WEIGHT`` of the way toward
    ``actual / estimated`` (clamped to [0.25, 4]); ``estimate`` uses the factor of ``model`` if
    given, else of the model observed last. A namespace actor stores ``to_json()`` with the
    namespace after each observation and restores it when it starts.
    """

    def __init__(self, model: str | None = None) -> None:
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a model name or None, not {type(model).__name__}")
        self.model = model
        self.factors: dict[str, float] = {}
        self._last: str | None = None
        self.version = 0  # rises whenever its estimates may change, for anyone keeping priced counts

    @property
    def factor(self) -> float:
        name = self.model if self.model is not None else self._last
        return self.factors.get(name, 1.0) if name is not None else 1.0

    def estimate(self, message: Message) -> int:
        return round(estimate_message(message) * self.factor)

    def observe(self, model: str, estimated: int, actual: int) -> None:
        if estimated <= 0 or actual <= 0:
            return
        ratio = min(MAX_FACTOR, max(MIN_FACTOR, actual / estimated))
        old = self.factors.get(model, 1.0)
        self.factors[model] = old + CALIBRATION_WEIGHT * (ratio - old)
        self._last = model
        self.version += 1

    def to_json(self) -> dict[str, Any]:
        return {"factors": dict(self.factors), "last": self._last}

    def restore(self, data: Any) -> None:
        """Take what ``to_json`` gave; anything else (damage, another version's) leaves it as is."""
        if not isinstance(data, dict) or not isinstance(data.get("factors"), dict):
            return
        factors = {name: float(value) for name, value in data["factors"].items()
                   if isinstance(name, str) and isinstance(value, (int, float)) and not isinstance(value, bool)
                   and MIN_FACTOR <= value <= MAX_FACTOR}
        self.factors = factors
        last = data.get("last")
        self._last = last if isinstance(last, str) else None
        self.version += 1

    def __repr__(self) -> str:
        return f"CalibratedEstimator(model={self.model!r}, factors={self.factors!r})"
