"""Passthrough: everything if it fits, else the longest suffix that fits; never a gap (T1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .base import Entry, SelectOptions, Strategy

if TYPE_CHECKING:
    from ..compile import Budget, PreviewResult
    from ..views import MessageView


def raw_entry(message) -> Entry:  # type: ignore[no-untyped-def]
    return Entry(message.participant, message.content, (message.id,), "copy")


def newest_suffix(messages, view: MessageView, usable: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(start index, tokens) of the longest suffix of ``messages`` that fits ``usable`` tokens."""
    total = 0
    start = len(messages)
    for index in range(len(messages) - 1, -1, -1):
        cost = view.estimate_tokens(messages[index])
        if total + cost > usable:
            break
        total += cost
        start = index
    return start, total


class PassthroughStrategy(Strategy):
    name = "passthrough"
    marks_compression_reads = True  # it reads nothing for compression

    async def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        messages = view.get_all()
        start, _ = newest_suffix(messages, view, budget.usable)
        return [raw_entry(message) for message in messages[start:]]

    async def preview(self, view: MessageView, budget: Budget, options: SelectOptions) -> PreviewResult:
        from ..compile import PreviewResult

        messages = view.get_all()
        total = sum(view.estimate_tokens(m) for m in messages)
        start, kept = newest_suffix(messages, view, budget.usable)
        return PreviewResult(
            fits=total <= budget.usable, final_tokens=kept, budget_tokens=budget.usable, head_tokens=0,
            tail_tokens=kept, middle_tokens=0,
        )


@attrs.frozen
class Passthrough:
    """Config of ``PassthroughStrategy`` (API.md §Strategies)."""

    def create(self) -> PassthroughStrategy:
        return PassthroughStrategy()
