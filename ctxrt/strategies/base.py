"""The Strategy protocol, its context, and the entries a strategy selects (DESIGN.md §7)."""

from __future__ import annotations

from typing import Literal

import attrs

from ..content import Block

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
