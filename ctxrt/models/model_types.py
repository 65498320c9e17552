"""A model call's data: ``ModelRequest``, ``ModelResponse`` and its ``Usage`` (DESIGN.md §9).

Plain attrs values, importing no SDK and no event loop, so the pure cores (the strategies that
plan compression requests, the namespace drain) can make and read them; ``ctxrt.models.model`` holds
the ``Model`` protocol and the models that answer them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..content.blocks import Block, CompiledMessage, Text

DEFAULT_ASSISTANT = frozenset({"Claude", "assistant"})


def _names(value: str | Iterable[str]) -> frozenset[str]:
    return frozenset({value}) if isinstance(value, str) else frozenset(value)


# Named converters rather than ``converter=tuple``: mypy's attrs plugin can't bind the builtin's
# type variable, so the fields' ``__init__`` parameters would be untyped.
def _messages(value: Iterable[CompiledMessage]) -> tuple[CompiledMessage, ...]:
    return tuple(value)


def _tools(value: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


def _blocks(value: Iterable[Block]) -> tuple[Block, ...]:
    return tuple(value)


@attrs.frozen
class ModelRequest:
    """One model call: ``messages`` by participant; those named in ``assistant`` speak as "assistant".

    ``tools`` are Messages API tool definitions. ``temperature`` None means the model's default;
    ``AnthropicModel`` never sends it, because the API version SDK 2.x sends (2026-10-21)
    answers any sampling parameter with a 400.
    ``timeout_s`` None means the model's own default.
    """

    model: str
    system: str | None
    messages: tuple[CompiledMessage, ...] = attrs.field(converter=_messages)
    max_tokens: int
    temperature: float | None = None
    assistant: frozenset[str] = attrs.field(default=DEFAULT_ASSISTANT, kw_only=True, converter=_names)
    tools: tuple[Mapping[str, Any], ...] = attrs.field(default=(), kw_only=True, converter=_tools)
    timeout_s: float | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Usage:
    """What a model reported a call cost. ``input_tokens`` counts every input token, those the
    provider's prompt cache served (``cache_read_input_tokens``) or wrote
    (``cache_creation_input_tokens``) included, as the OpenTelemetry GenAI conventions count them."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


@attrs.frozen
class ModelResponse:
    """A model's reply. ``stop_reason`` is passed through as sent ("end_turn", "refusal", ...)."""

    content: tuple[Block, ...] = attrs.field(converter=_blocks)
    stop_reason: str
    usage: Usage

    @property
    def text(self) -> str:
        """The text blocks joined, in order."""
        return "".join(block.text for block in self.content if isinstance(block, Text))
