"""Cache breakpoints (P5): at most three on messages, the head window's end and the last ones.

Strategies mark where a cached prefix may end; the provider honours four breakpoints, one of
which is left for the host. This trimming is a pure rule over compiled messages, apart from
the pipeline that applies it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .content import CompiledMessage

MAX_MESSAGE_BREAKPOINTS = 3  # one of the provider's 4 is left for the host


def apply_cache_breakpoints(
    messages: Sequence[CompiledMessage], *, limit: int = MAX_MESSAGE_BREAKPOINTS, marked: list[int] | None = None
) -> list[CompiledMessage]:
    """Keep at most ``limit`` breakpoints: the first (the head window's end) and the last ones (P5)."""
    marked = [i for i, m in enumerate(messages) if m.cache_breakpoint] if marked is None else marked
    if len(marked) <= limit:
        return messages if isinstance(messages, list) else list(messages)
    keep = set(marked[:1] + marked[len(marked) - (limit - 1) :]) if limit > 0 else set()
    return [
        attrs.evolve(m, cache_breakpoint=False) if m.cache_breakpoint and i not in keep else m
        for i, m in enumerate(messages)
    ]
