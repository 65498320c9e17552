"""The compression policy: the decisions that tell one memory strategy from another (where its
chunks close, what its instruction adds, what phase an L1 records, how L1s share a compile's
budget), as a frozen value the autobiographical strategy is made with.

Apart from the strategy so a variant (Knowledge, docs/behaviours.md T7) is the same strategy
with another policy, and each decision is a plain function that can be tested by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..content.blocks import Message
from .chunking import ChunkRule, closes_at_target
from .selection import Chooser, choose


def no_phase(chunk: Sequence[Message]) -> str | None:
    return None


def no_detail(chunk: Sequence[Message]) -> str | None:
    return None


@attrs.frozen
class CompressionPolicy:
    """``name`` names the strategy, and prefixes its stored state's keys (``autobio:chunks``);
    ``chunk_rule`` makes the rule of one chunking walk from ``target_chunk_tokens``;
    ``instruction_detail`` is what a chunk's instruction adds (None: nothing); ``phase_of_chunk``
    is the phase its L1 records; ``choose_l1`` picks the L1 summaries a compile shows."""

    name: str
    chunk_rule: Callable[[int], ChunkRule] = closes_at_target
    instruction_detail: Callable[[Sequence[Message]], str | None] = no_detail
    phase_of_chunk: Callable[[Sequence[Message]], str | None] = no_phase
    choose_l1: Chooser = choose


AUTOBIOGRAPHICAL = CompressionPolicy("autobio")
