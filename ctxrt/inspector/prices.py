"""A price table for the request history (``ctxrt serve --prices FILE``): each model's US
dollars per million tokens, so a recorded request's usage can be priced. No web framework here.

The file is JSON: ``{"MODEL": {"input": 3.0, "output": 15.0, "cache_read": 0.3,
"cache_creation": 3.75}}``; ``cache_read`` and ``cache_creation`` default to ``input``'s price.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

FIELDS = ("input", "output", "cache_read", "cache_creation")


@attrs.frozen
class Price:
    """One model's dollars per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_creation: float

    def cost(self, input_tokens: int | None, output_tokens: int | None, cache_read_tokens: int | None,
             cache_creation_tokens: int | None) -> float | None:
        """A request's cost in dollars, or None when its input or output tokens weren't reported.
        ``input_tokens`` counts the cache's reads and writes too (as ``ctxrt.Usage`` does), so
        those are taken out of it and priced at their own rates."""
        if input_tokens is None or output_tokens is None:
            return None
        read, written = cache_read_tokens or 0, cache_creation_tokens or 0
        fresh = max(0, input_tokens - read - written)
        return (fresh * self.input + read * self.cache_read + written * self.cache_creation
                + output_tokens * self.output) / 1_000_000


def parse_prices(data: Any) -> dict[str, Price]:
    """A price table from the file's decoded JSON. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError("a price table is a JSON object: model name to its prices")
    table = {}
    for model, prices in data.items():
        if not isinstance(prices, Mapping):
            raise ValueError(f"{model!r}: expected an object of prices ({', '.join(FIELDS)}), got {prices!r}")
        unknown = sorted(set(prices) - set(FIELDS))
        if unknown:
            raise ValueError(f"{model!r}: unknown price(s) {unknown}; known: {', '.join(FIELDS)}")
        for name in ("input", "output"):
            if name not in prices:
                raise ValueError(f"{model!r}: no {name!r} price (dollars per million tokens)")
        for name, value in prices.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise ValueError(f"{model!r}: {name!r} must be a non-negative number, not {value!r}")
        table[str(model)] = Price(float(prices["input"]), float(prices["output"]),
                                  float(prices.get("cache_read", prices["input"])),
                                  float(prices.get("cache_creation", prices["input"])))
    return table


def read_prices(path: str | Path) -> dict[str, Price]:
    """The price table in the JSON file ``path``. Raises ``ValueError`` naming the file and what
    is wrong (unreadable, not JSON, not a table)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: can't read a price table: {exc}") from None
    try:
        return parse_prices(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
