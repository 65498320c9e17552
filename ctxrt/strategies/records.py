"""Autobiographical memory's records: chunks, summaries and pins, and their stored forms.

What the strategy writes to its logs and values (``chunks``, ``summaries``, ``pins``) and how it
reads them back, as pure functions over plain data, so the stored formats are defined in one
place and a store written by an earlier version reads back the same (docs/architecture.md, Keys).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from .base import Pin

logger = logging.getLogger("ctxrt.autobiographical")


@attrs.frozen
class Summary:
    id: str
    level: int
    content: str
    tokens: int
    source_ids: tuple[str, ...]  # message ids for L1, child summary ids above
    first_sequence: int
    last_sequence: int
    first_id: str
    last_id: str
    created_ms: int
    parent_id: str | None = None
    phase: str | None = None  # Knowledge's dominant phase of an L1's chunk
    witnessed: bool = False  # written in the witnessed voice: its events came before the resident


@attrs.frozen
class SummaryMatch:
    summary: Summary
    matches: int


@attrs.frozen
class Chunk:
    id: str
    message_ids: tuple[str, ...]
    first_sequence: int
    last_sequence: int


def chunk_record(chunk: Chunk) -> dict[str, Any]:
    """A chunk as the ``chunks`` log stores it."""
    return {"id": chunk.id, "ids": list(chunk.message_ids), "first": chunk.first_sequence, "last": chunk.last_sequence}


def chunks_from(records: Sequence[Any], where: str = "the namespace") -> list[Chunk]:
    """The ``chunks`` log read back, in the order it was written, checked field by field.

    Raises:
        ValueError: a record this version can't read (``_unreadable``).
    """
    chunks = []
    for index, r in enumerate(records):
        try:
            chunk = Chunk(r["id"], tuple(r["ids"]), r["first"], r["last"])
        except (KeyError, TypeError):
            raise _unreadable("chunks", index, r, where) from None
        if not (isinstance(r["ids"], list) and chunk.message_ids and _texts(chunk.id, *chunk.message_ids)
                and _wholes(chunk.first_sequence, chunk.last_sequence)):
            raise _unreadable("chunks", index, r, where)
        chunks.append(chunk)
    return chunks


def _unreadable(log: str, index: int, record: Any, where: str) -> ValueError:
    """The error of a strategy log's record this version can't read (another version's, a host's
    bug): the log is the strategy's memory, so the strategy refuses to start rather than lose it."""
    return ValueError(f"the stored {log} record #{index} {record!r} of {where} can't be read; the namespace's "
                      f"memory is kept as it is: run it with another strategy (set_strategy) or use another branch")


def _texts(*values: Any) -> bool:
    return all(isinstance(value, str) for value in values)


def _wholes(*values: Any) -> bool:
    return all(type(value) is int for value in values)


def summary_record(summary: Summary) -> dict[str, Any]:
    """A summary as the ``summaries`` log stores it: its parent isn't stored (the parent's
    ``source_ids`` name its children)."""
    record = attrs.asdict(summary, recurse=False)
    record.pop("parent_id")
    record["source_ids"] = list(summary.source_ids)
    return record


def summaries_from(records: Sequence[Any], where: str = "the namespace") -> list[Summary]:
    """The ``summaries`` log read back, each with the parent that merged it (if any), checked field
    by field.

    Raises:
        ValueError: a record this version can't read (``_unreadable``).
    """
    for index, item in enumerate(records):
        if not _readable_summary(item):
            raise _unreadable("summaries", index, item, where)
    parents: dict[str, str] = {}
    for item in records:
        for source in item["source_ids"] if item["level"] > 1 else ():
            parents[source] = item["id"]
    return [
        Summary(
            item["id"], item["level"], item["content"], item["tokens"], tuple(item["source_ids"]),
            item["first_sequence"], item["last_sequence"], item["first_id"], item["last_id"], item["created_ms"],
            parents.get(item["id"]), item.get("phase"), item.get("witnessed") is True,
        )
        for item in records
    ]


def _readable_summary(item: Any) -> bool:
    """Whether a ``summaries`` record has the fields a summary takes, of their types."""
    try:
        sources, phase = item["source_ids"], item.get("phase")
        return (_texts(item["id"], item["content"], item["first_id"], item["last_id"])
                and _wholes(item["level"], item["tokens"], item["first_sequence"], item["last_sequence"],
                            item["created_ms"])
                and item["level"] >= 1 and isinstance(sources, list) and bool(sources) and _texts(*sources)
                and (phase is None or isinstance(phase, str)))
    except (KeyError, TypeError, AttributeError):
        return False


def pins_record(pins: Sequence[Pin], next_pin: int) -> dict[str, Any]:
    """Pins as the ``pins`` value stores them, with the number the next one takes."""
    return {"next": next_pin, "pins": [attrs.asdict(pin) for pin in pins]}


def pins_from(stored: Any, where: str = "the namespace") -> tuple[list[Pin], int]:
    """Pins as ``pins_record`` wrote them, checked field by field; a record this version can't read
    is logged, naming ``where`` (the namespace and branch), and ignored."""
    if stored is None:
        return [], 0
    try:
        pins = [Pin(**record) for record in stored["pins"]]
        next_pin = stored["next"]
        if type(next_pin) is not int or not all(map(_readable_pin, pins)):
            raise ValueError("a field of the wrong type")
        return pins, next_pin
    except (KeyError, TypeError, ValueError):
        logger.error("the stored pins %r of %s can't be read; starting with none", stored, where)
        return [], 0


def _readable_pin(pin: Pin) -> bool:
    """Whether a pin read back has the types its fields take."""
    return (_texts(pin.id, pin.first_id, pin.last_id) and _wholes(pin.first_sequence, pin.last_sequence, pin.created_ms)
            and (pin.name is None or isinstance(pin.name, str)) and (pin.level is None or _wholes(pin.level)))
