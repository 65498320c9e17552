"""WindowedPassthrough: a persisted anchor; re-anchors coarsely only on overflow (T2).

Between overflows the anchor never moves, so the prompt is a byte-stable prefix plus appends,
which keeps a provider's prompt cache warm; the anchor message and the tail carry cache breakpoints (P9).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from ..budget import Entry, non_negative_int
from ..content.blocks import Message, ToolResult, ToolUse, has_block, sequence_key
from ..errors import MessageNotFoundError, OverBudgetError
from .base import (
    RenderStats,
    SelectOptions,
    Strategy,
    StrategyContext,
    optional_count,
)
from .kept_window import KeptWindow
from .live import MIB, LiveMemo, apply_live_policy_at
from .shaping import entry_of, shape, shaped_entry

if TYPE_CHECKING:
    from ..budget import Budget
    from ..views import MessageView


MIN_WINDOW = 64  # messages read back at first



def _fraction(_: object, __: object, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(f"re_anchor_fraction must be in (0, 1], got {value!r}")


class WindowedPassthroughStrategy(Strategy):
    name = "windowed"
    marks_compression_reads = True  # it reads nothing for compression

    def __init__(self, config: WindowedPassthrough) -> None:
        self.config = config
        self.anchor = 0
        self._stats: RenderStats | None = None
        self._live_memo: LiveMemo = {}
        self._kept: KeptWindow | None = None

    def render_stats(self) -> RenderStats | None:
        return self._stats

    def initialize(self, ctx: StrategyContext) -> None:
        self.anchor = self._stored_anchor(ctx)

    def _stored_anchor(self, ctx: StrategyContext | None) -> int:
        anchor = self.anchor if ctx is None else ctx.get_value("anchor", 0)
        return anchor if isinstance(anchor, int) and not isinstance(anchor, bool) else 0

    def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        # The stored anchor is the truth: a compile cancelled around its write, or a dry run, never
        # leaves a window in memory that a restart wouldn't reproduce.
        anchor = self._stored_anchor(options.context)
        usable = budget.usable
        newest = view.window(1)
        if not newest.messages:
            if not options.dry_run:
                self._stats = RenderStats()  # nothing shown: not what the last compile showed
            return []
        if anchor > newest.messages[-1].sequence:
            anchor = 0  # a persisted anchor past the head (another branch's) starts over
        kept = self._kept
        if kept is None or kept.anchor != anchor or not kept.follow(view, newest) or kept.totals[-1] > usable:
            kept = self._build(view, anchor, usable, options)
        if not options.dry_run:
            self._stats = RenderStats(tail_tokens=kept.totals[-1])
        # P9: the anchor (the window's first message) carries a cache breakpoint, so the prefix
        # up to it is byte-stable, and cached, from one re-anchor to the next; so does the tail
        # (the newest message), so the next compile reads everything up to this one's tail from
        # the provider's cache: between re-anchors a compile only appends. Only the entries
        # holding images or tool blocks can change under the live policy.
        marked = kept.marked()
        if not kept.live:  # nothing the live policy could change: no copy of the window
            return marked
        return apply_live_policy_at(marked, kept.live, kept.depth_after, self.config, self._live_memo)

    def _build(self, view: MessageView, anchor: int, usable: int, options: SelectOptions) -> KeptWindow:
        """The window read afresh from ``anchor``, re-anchored if it overflows ``usable``."""
        cap = self.config.max_message_tokens
        price = view.estimate_tokens
        messages, start, overflow = self._from_anchor(view, anchor, usable, cap)
        shaped = [shape(message, cap, price) for message in messages[start:]]
        if overflow or sum(cost for _, cost in shaped) > usable:
            newest = shape(messages[-1], cap, price)[1]
            if newest > usable and not options.dry_run:
                raise OverBudgetError(
                    f"Windowed passthrough: the newest message alone but {newest} tokens still exceed hard "
                    f"budget {usable}",
                    budget=usable, actual=newest,
                )
            start = self._re_anchor(messages, usable, cap, price)
            anchor = messages[start].sequence
            if not options.dry_run:
                self._persist(options.context, anchor)
            shaped = [shape(message, cap, price) for message in messages[start:]]
        copies = view.copies  # the listing's: a kept window follows views of that listing only
        kept = KeptWindow(anchor, lambda message, price: shaped_entry(message, cap, price, copies), view,
                          view.window(1), messages[start:],
                          [(entry_of(message, made, copies), cost)
                           for message, (made, cost) in zip(messages[start:], shaped)])
        # A dry run's re-anchor isn't stored: the next compile starts from the stored anchor.
        self._kept = kept if anchor == self._stored_anchor(options.context) or not options.dry_run else None
        return kept

    @staticmethod
    def _from_anchor(view: MessageView, anchor: int, usable: int, cap: int) -> tuple[Sequence[Message], int, bool]:
        """The newest messages back to the anchor, its index among them, and whether they overflow
        the budget before reaching it: read back from the newest only until one of those is known
        (L7), so a first compile of a long slot decodes what the budget holds, not the slot."""
        window = view.window(MIN_WINDOW)
        while True:
            messages = window.messages
            if not messages:
                return messages, 0, False
            start = bisect_left(messages, anchor, key=sequence_key)
            if start > 0 or window.complete:
                return messages, start, False
            if sum(shape(message, cap, view.estimate_tokens)[1] for message in messages) > usable:
                return messages, 0, True
            window = view.window(2 * len(messages))

    def set_anchor(self, ctx: StrategyContext, message_id: str) -> None:
        """Anchor the window at ``message_id`` (stored; a later overflow re-anchors as ever).

        Raises ``MessageNotFoundError`` for a message not in the view."""
        found = ctx.view.get(message_id)
        if found is None:
            raise MessageNotFoundError(f"no message {message_id!r} in the view of {ctx.namespace!r} to anchor at")
        self._persist(ctx, found.sequence)

    def anchor_id(self, ctx: StrategyContext) -> str | None:
        """The id of the message the stored window starts at (None: from the oldest, never anchored)."""
        anchor = self._stored_anchor(ctx)
        return str(anchor) if anchor else None

    def _persist(self, ctx: StrategyContext | None, anchor: int) -> None:
        if ctx is not None:
            ctx.set_value("anchor", anchor)
        self.anchor = anchor

    def _re_anchor(
        self, messages: Sequence[Message], usable: int, cap: int, price: Callable[[Message], int]
    ) -> int:
        target = self.config.re_anchor_fraction * usable
        total = 0
        start = len(messages) - 1
        for index in range(len(messages) - 1, -1, -1):
            cost = shape(messages[index], cap, price)[1]
            if total + cost > target and index < len(messages) - 1:
                break
            total += cost
            start = index
        # Retreat one message rather than cut a tool pair at the window's edge (P4).
        if start > 0 and has_block(messages[start], ToolResult) and has_block(messages[start - 1], ToolUse):
            if total + shape(messages[start - 1], cap, price)[1] <= usable:
                start -= 1
        return start


@attrs.frozen
class WindowedPassthrough:
    """Config of ``WindowedPassthroughStrategy`` (docs/api.md, Strategies)."""

    re_anchor_fraction: float = attrs.field(default=0.5, validator=_fraction)
    max_message_tokens: int = attrs.field(default=0, validator=non_negative_int)
    # What stays live (strategies/live.py): the newest images within the count, bytes and depth,
    # the newest tool results, tool inputs up to a size; the rest become short text.
    max_live_images: int = attrs.field(default=6, validator=non_negative_int)
    max_live_image_bytes: int = attrs.field(default=20 * MIB, validator=non_negative_int)
    image_strip_depth_tokens: int = attrs.field(default=30_000, validator=non_negative_int)
    tool_result_max_last_n: int | None = attrs.field(default=None, validator=optional_count)
    tool_use_input_max_tokens: int = attrs.field(default=0, validator=non_negative_int)

    def create(self) -> WindowedPassthroughStrategy:
        return WindowedPassthroughStrategy(self)
