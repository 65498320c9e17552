"""What a strategy selects and what it may spend: ``Entry``, ``Budget``, ``PreviewResult``.

A strategy's ``select`` returns entries within a budget, and its ``preview`` a preview result;
the namespace and the compile pipeline (``ctxrt.compile``) take them from there. These types
stand alone, below the pipeline, so that a strategy imports what it hands over without
importing how entries become a request (and ``non_negative_int``, the validator strategy
configs share with them, comes along).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from . import checks
from .content.blocks import Block

Relation = Literal["copy", "derived", "referenced"]


@attrs.frozen
class Entry:
    """One selected piece of context, before compile turns it into request messages.

    ``source_ids`` name the stored messages it carries (raw, for ``copy``) or summarises;
    ``summary_ids`` name the summaries a ``derived`` entry shows.
    """

    participant: str
    content: tuple[Block, ...]
    source_ids: tuple[str, ...] = ()
    relation: Relation = "copy"
    summary_ids: tuple[str, ...] = ()
    cache_marker: bool = False


def non_negative_int(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a non-negative int (not a bool), the field named in the error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative integer, got {checks.shown(value)}")


def _token_count(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # bool is an int to Python, but Budget(max_tokens=True) is a mistake, not one token.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Budget {attribute.name} must be an int (a number of tokens), "
                         f"not {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"Budget {attribute.name} must not be negative, got {checks.shown(value)}")


@attrs.frozen
class Budget:
    """What a compile may spend: strategies fit into ``usable`` tokens (P2).

    Raises:
        ValueError: ``max_tokens`` or ``reserve_for_response`` is not an int, is a bool or is
            negative (the message names the field), or ``max_tokens`` doesn't exceed
            ``reserve_for_response``, which would leave no room for any context.
    """

    max_tokens: int = attrs.field(default=100_000, validator=_token_count)
    reserve_for_response: int = attrs.field(default=4_000, validator=_token_count)

    def __attrs_post_init__(self) -> None:
        # A budget with no room compiles to an empty request, which looks like a bug elsewhere
        # (every message "dropped"); refusing it here says what is wrong where it was made.
        if self.max_tokens <= self.reserve_for_response:
            raise ValueError(
                f"Budget max_tokens {self.max_tokens:,} with reserve_for_response {self.reserve_for_response:,} "
                f"leaves no room for context: max_tokens must exceed reserve_for_response "
                f"(4,000 unless given); raise max_tokens or lower reserve_for_response"
            )

    @property
    def usable(self) -> int:
        return self.max_tokens - self.reserve_for_response



@attrs.frozen
class PreviewResult:
    fits: bool
    final_tokens: int
    budget_tokens: int
    head_tokens: int
    tail_tokens: int
    middle_tokens: int

