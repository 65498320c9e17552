"""A flipped bit anywhere in a stored record is refused, never read back as other data (K7).

Determinism rules: one small store is built through the public API (messages, one holding an
image, so a blob, and one long enough for an overflow page; an edit and a removal; values written more than once; a fork with a message of
its own and an edit of a message it inherited), closed, and its records located in the data file
(``files.record_places``). Each case flips one bit of one record's key or value in place, as bit
rot would (the record keeps its slot in its page), then reads through the public API in a
read-only runtime (every message, each by id, and a compile, on both branches) and runs
``verify_store``, both in this process: a changed record's bytes can't crash LMDB. Each read
must raise ``StoreCorruptError`` naming the record or return exactly what the sound store
returns, and verify must name the record. The bit is put back after each case.

The bounded form flips one bit in each of 8 bytes of every record's key and 12 of its value (every
byte of a shorter one), spread from its first byte to its last and turned round from record to
record, so the items table's records between them reach every byte of an item key; the bit and the
bytes by rule, never random. ``CTXRT_SOAK=1`` flips every bit of every byte. A ``trio.fail_after``
guard bounds the test.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
import ctxrt.testing
from ctxrt.errors import StoreCorruptError
from ctxrt import open_runtime
from ctxrt.testing import files, keys, verify_store
from support import flip

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
PAGE = 4096
BROKEN = "fails its checksum: a bit of its key or value changed"
Outcomes = dict[tuple[Any, ...], Any]


async def build(store: Path) -> list[str]:
    """A small store with a record of every kind; the ids of every message either branch shows."""
    async with open_runtime(store) as rt:
        main = await rt.open("a", strategy=ctxrt.WindowedPassthrough())
        ids = [await main.add_message("user", f"message {i}{'3' if i == 1 else ''}") for i in range(4)]
        ids.append(await main.add_message("user", "long " * 450))  # past half a page: an overflow page
        ids.append(await main.add_message("assistant", [
            {"type": "text", "text": "a picture"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ]))
        await main.edit_message(ids[1], "message 123")
        await main.remove_message(ids[2])
        await main.set_strategy(ctxrt.Passthrough())  # the namespace's strategy value, written again
        await main.fork("side")
        side = await rt.open("a", branch="side")
        ids.append(await side.add_message("user", "on the side"))
        await side.edit_message(ids[3], "message 3, edited on the side")
        await main.add_message("user", "after the fork")
        ids.append((await main.get_all_messages())[-1].id)
    return ids


async def read_all(store: Path, ids: list[str]) -> Outcomes:
    """Each public read's result, or the StoreCorruptError it raised, by what was read."""
    outcomes: Outcomes = {}

    async def attempt(what: tuple[Any, ...], read: Callable[[], Awaitable[Any]]) -> Any:
        try:
            outcomes[what] = await read()
        except StoreCorruptError as exc:
            outcomes[what] = exc
        return outcomes[what]

    async def reads() -> None:
        async with open_runtime(store, readonly=True) as rt:
            for branch in ("main", "side"):
                try:
                    manager = await rt.open("a", branch=branch)
                except StoreCorruptError as exc:
                    outcomes[branch, "open"] = exc
                    continue
                await attempt((branch, "all"), manager.get_all_messages)
                for message_id in ids:
                    await attempt((branch, message_id), lambda: manager.get_message(message_id))
                await attempt((branch, "compile"), lambda: _compiled(manager))

    await attempt(("open",), reads)
    return outcomes


async def _compiled(manager: ctxrt.ContextManager) -> list[Any]:
    return (await manager.compile(dry_run=True)).messages


# The bounded form's bytes per key and per value of each record (all of a shorter one).
KEY_BYTES = 8
VALUE_BYTES = 12


def sample(size: int, count: int, phase: int) -> list[int]:
    """``count`` byte indexes spread evenly over ``size`` bytes, the first and the last among them;
    ``phase`` turns the ones between round, so records of one layout (a table's keys, its values)
    reach different bytes and, between them, every byte."""
    if size <= count:
        return list(range(size))
    inner = size - 2
    return sorted({0, size - 1, *(1 + (i * inner // (count - 2) + phase) % inner for i in range(count - 2))})


def cases(places: list[files.RecordPlace], exhaustive: bool) -> list[tuple[files.RecordPlace, str, int, int]]:
    """(record, "key" or "value", byte offset in the file, bit) for each flip."""
    chosen = []
    for number, place in enumerate(places):
        for part, start, size, count in (("key", place.key_at, len(place.key), KEY_BYTES),
                                         ("value", place.value_at, place.value_size, VALUE_BYTES)):
            for index in range(size) if exhaustive else sample(size, count, number):
                for bit in range(8) if exhaustive else ((index * 5 + len(chosen)) % 8,):
                    chosen.append((place, part, start + index, bit))
    return chosen


@pytest.mark.soak
async def test_a_flipped_bit_in_any_record_is_refused_naming_it_or_reads_as_it_was(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """K7: flip a bit of a record's key or value ("message 123" becomes "message 133"): every
    public read refuses with StoreCorruptError naming the record, or returns exactly what it
    returned before; verify reports the record. None reads back as different data."""
    store = tmp_path / "store"
    data = store / files.DATA_NAME
    with trio.fail_after(soak_scale(600, 7200)):
        ids = await build(store)
        sound = await read_all(store, ids)
        assert not any(isinstance(outcome, StoreCorruptError) for outcome in sound), sound
        assert verify_store(store).status == "sound"
        async with open_runtime(store, readonly=True) as rt:  # to name records as the errors should
            named = {(place.table, place.key): rt.engine.describe_row(place.table, place.key)
                     for place in files.record_places(store)}
        places = list(files.record_places(store))
        assert {place.table for place in places} == set(keys.ALL_DBS)
        assert any(place.value_at // PAGE != place.key_at // PAGE for place in places)  # an overflow page
        refused = 0
        for place, part, offset, bit in cases(places, exhaustive=bool(soak_scale(0, 1))):
            flip(data, offset, bit)
            try:
                case = f"{named[place.table, place.key]}: bit {bit} of byte {offset - place.key_at if part == 'key' else offset - place.value_at} of its {part}"
                outcomes = await read_all(store, ids)
                report = verify_store(store)
            finally:
                flip(data, offset, bit)
            for what, outcome in outcomes.items():
                if isinstance(outcome, StoreCorruptError):
                    refused += 1
                    assert outcome.path == str(data) and BROKEN in outcome.what, (case, what, outcome)
                    if part == "value":
                        assert outcome.what == f"{named[place.table, place.key]} {BROKEN}", (case, what, outcome)
                else:
                    assert outcome == sound[what], (case, what, outcome)
            # A record the open reads refuses verify's read-only open: that finding names it in its text.
            findings = [f"{item.place} {item.what}" for item in report.damage]
            assert report.status == "damaged" and any(BROKEN in finding for finding in findings), (case, findings)
            if part == "value":
                assert any(f"{named[place.table, place.key]} {BROKEN}" in finding for finding in findings), (case, findings)
        assert refused, "no flip was refused: the premise failed"


async def test_a_damaged_summary_record_is_store_corrupt_error_naming_it_not_a_refused_strategy(
    tmp_path: Path,
) -> None:
    """K7 (from a host-style attack): a flipped bit in an Autobiographical summary record, which
    the strategy reads as it starts, makes compile and search_summaries raise StoreCorruptError
    naming the record (before: StrategyRefusedError, advising set_strategy(), which can't mend it)."""
    store = tmp_path / "store"
    strategy = ctxrt.Autobiographical("m", target_chunk_tokens=40, recent_window_tokens=0, l1_holdback_chunks=0)
    with trio.fail_after(60):
        async with open_runtime(store, model=ctxrt.testing.ScriptedModel(lambda r: "a summary " * 8)) as rt:
            ann = await rt.open("ann", strategy=strategy)
            for i in range(12):
                await ann.add_message("user", f"line {i} " + "words " * 12)
            await ann.wait_ready()
            assert await ann.search_summaries()
            places = list(files.record_places(store))
            named = {(place.table, place.key): rt.engine.describe_row(place.table, place.key) for place in places}
        summary = next(place for place in places if "summaries" in named[place.table, place.key])
        flip(store / files.DATA_NAME, summary.value_at + 2, 3)
        async with open_runtime(store, readonly=True) as rt:
            manager = await rt.open("ann", strategy=strategy)
            for call in (manager.compile, manager.search_summaries, manager.is_ready, manager.wait_ready):
                with pytest.raises(StoreCorruptError, match="summaries") as caught:
                    await call()
                assert "fails its checksum" in str(caught.value)
