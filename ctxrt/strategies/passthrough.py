"""Passthrough: everything if it fits, else the longest suffix that fits; never a gap (T1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ..budget import Entry, PreviewResult
from .base import RawEntries, RenderStats, SelectOptions, Strategy

if TYPE_CHECKING:
    from ..budget import Budget
    from ..views import MessageView


class PassthroughStrategy(Strategy):
    name = "passthrough"
    marks_compression_reads = True  # it reads nothing for compression

    def __init__(self) -> None:
        self._raw = RawEntries()
        self._stats: RenderStats | None = None

    def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        raw = self._raw
        raw.cover(view, budget.usable)  # the newest messages, back to where the budget ends
        start = raw.suffix_start(budget.usable)
        if not options.dry_run:
            self._stats = RenderStats(tail_tokens=raw.totals[-1] - raw.totals[start])
        return raw.suffix(start)

    def render_stats(self) -> RenderStats | None:
        return self._stats

    def preview(self, view: MessageView, budget: Budget, options: SelectOptions) -> PreviewResult:
        raw = self._raw
        raw.cover(view, budget.usable)
        total = raw.totals[-1]
        kept = total - raw.totals[raw.suffix_start(budget.usable)]
        return PreviewResult(
            fits=raw.complete and total <= budget.usable, final_tokens=kept, budget_tokens=budget.usable, head_tokens=0,
            tail_tokens=kept, middle_tokens=0,
        )


@attrs.frozen
class Passthrough:
    """Config of ``PassthroughStrategy`` (docs/api.md, Strategies)."""

    def create(self) -> PassthroughStrategy:
        return PassthroughStrategy()
