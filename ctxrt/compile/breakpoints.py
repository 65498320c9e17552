"""Cache breakpoints (P5): at most three on messages, the head window's end and the last ones.

Strategies mark where a cached prefix may end; the provider honours four breakpoints, one of
which is left for the host. This trimming is a pure rule over compiled messages, apart from
the pipeline that applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..content.blocks import CompiledMessage

MAX_MESSAGE_BREAKPOINTS = 3  # one of the provider's 4 is left for the host


def unmarked(message: CompiledMessage) -> CompiledMessage:
    """``message`` without its breakpoint."""
    return attrs.evolve(message, cache_breakpoint=False)


def apply_cache_breakpoints(
    messages: Sequence[CompiledMessage], *, limit: int = MAX_MESSAGE_BREAKPOINTS, marked: list[int] | None = None,
    strip: Callable[[CompiledMessage], CompiledMessage] = unmarked,
) -> list[CompiledMessage]:
    """Keep at most ``limit`` breakpoints: the first (the head window's end) and the last ones (P5).

    ``marked`` lists where the breakpoints are, when known; ``strip`` makes a message's unmarked
    twin (a memo's hands back the same twin each time, so a compile's unchanged messages stay the
    same objects). The rest of the list is copied as it is."""
    marked = [i for i, m in enumerate(messages) if m.cache_breakpoint] if marked is None else marked
    if len(marked) <= limit:
        return messages if isinstance(messages, list) else list(messages)
    keep = set(marked[:1] + marked[len(marked) - (limit - 1) :]) if limit > 0 else set()
    out = list(messages)
    for i in marked:
        if i not in keep and out[i].cache_breakpoint:
            out[i] = strip(out[i])
    return out
