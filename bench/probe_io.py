"""What the probes (``bench/*_probe.py``) share: their messages, their JSON replies, their fill.

A probe runs as a script with ``PYTHONPATH`` naming the ctxrt it measures, an older one included,
so this module imports no ctxrt: it drives whatever manager the probe hands it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

CONCURRENCY = 500  # concurrent appends while a probe builds its store


def text(n: int) -> str:
    return f"resident message {n:07d}: the quick brown fox jumps over the lazy dog"


def reply(value: Any) -> None:
    """One JSON line on stdout, the probe's only output."""
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def fill(manager: Any, count: int) -> None:
    """``count`` user messages into ``manager``'s slot, ``CONCURRENCY`` appends at a time."""
    for first in range(0, count, CONCURRENCY):
        async with trio.open_nursery() as nursery:
            for n in range(first, min(count, first + CONCURRENCY)):
                nursery.start_soon(manager.add_message, "user", text(n))
