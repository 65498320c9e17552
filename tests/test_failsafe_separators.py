"""A flipped bit in a branch page's separator key can't hide a message or misdirect a write, and
never passes verify where a read saw it (K7).

A separator is no record: no seal covers it. A changed one sends LMDB's search for a key into a
neighbouring leaf, whose rows are all sound, so before the reads checked where a search landed, a
message read as absent (a log head read older than it is) and ``ctxrt verify`` called the store
sound. Each case flips one bit of one separator of a small store (one branch page over a dozen
leaves), in place, then, in a forked child (LMDB may abort a process on bad pages): opens the
store read-only and reads every message by id and whole, on both branches; edits three messages
through a writer on a copy and reads them back; runs ``verify_store``; opens with
``check_pages=True``. Every read returns what the sound store returns (the edit applied) or
raises ``StoreCorruptError``; a store a read saw damaged is never verified sound nor opened by a
checked open. The bit is put back after each case.

The bounded form flips three bits of each separator (``cases``); ``CTXRT_SOAK=1`` flips every bit
of every separator.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ctxrt
from ctxrt.errors import StoreCorruptError
from ctxrt.testing import files, keys, verify_in_child, verify_store
from failsafe_child import run_forked
from support import flip

MESSAGES = 150
EDITED = (0, MESSAGES // 2, MESSAGES - 1)  # the messages the writer edits, by index
CHILD_S = 60  # a child that takes longer is hung: SIGALRM ends it


async def build(store: Path) -> list[str]:
    """Enough messages for a branch page, some edited and one removed, and a fork with its own."""
    async with ctxrt.open_runtime(store, durability="os") as rt:
        main = await rt.open("a")
        ids = [await main.add_message("user", f"message {i} " + "word " * 10) for i in range(MESSAGES)]
        for i in range(0, MESSAGES, 7):
            await main.edit_message(ids[i], f"message {i}, edited")
        await main.remove_message(ids[3])
        await main.fork("side")
        side = await rt.open("a", branch="side")
        ids.append(await side.add_message("user", "on the side"))
    return ids


def shown(outcome: Any) -> Any:
    """A read's result as JSON: messages by their repr, StoreCorruptError as "corrupt"."""
    if isinstance(outcome, StoreCorruptError):
        return "corrupt"
    if isinstance(outcome, (list, tuple)):
        return [repr(item) for item in outcome]
    return repr(outcome)


async def attempt(read: Callable[[], Any]) -> Any:
    """What ``read`` returned, or "corrupt", or the other error it raised (always a wrong outcome)."""
    try:
        return shown(await read())
    except StoreCorruptError as exc:
        return shown(exc)
    except Exception as exc:  # noqa: BLE001 - any other error is a finding of the case
        return f"error {type(exc).__name__}: {exc}"


async def reads(store: Path, ids: list[str]) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}

    async def read_all() -> None:
        async with ctxrt.open_runtime(store, readonly=True) as rt:
            for branch in ("main", "side"):
                manager = await rt.open("a", branch=branch)
                outcomes[f"{branch} all"] = await attempt(manager.get_all_messages)
                for message_id in ids:
                    outcomes[f"{branch} {message_id}"] = await attempt(lambda: manager.get_message(message_id))

    outcomes["open"] = await attempt(read_all)
    return outcomes


async def writes(store: Path, ids: list[str]) -> Any:
    """Edit three messages through a writer; what the branch then holds (or "corrupt")."""

    async def edit() -> Any:
        async with ctxrt.open_runtime(store, durability="os") as rt:
            manager = await rt.open("a")
            for index in EDITED:
                await manager.edit_message(ids[index], f"message {index}, edited by the writer")
            return await manager.get_all_messages()

    return await attempt(edit)


async def checked_open(store: Path) -> str:
    async def read() -> str:
        async with ctxrt.open_runtime(store, readonly=True, check_pages=True) as rt:
            await (await rt.open("a")).get_all_messages()
        return "opened"

    outcome = await attempt(read)
    return "refused" if outcome == "corrupt" else "opened" if outcome == repr("opened") else outcome


def examine(store: Path, copy: Path, ids: list[str]) -> dict[str, Any]:
    """Every outcome of one case, from a forked child."""

    def work() -> str:
        signal.alarm(CHILD_S)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(store, copy)
        found = {"reads": trio.run(reads, store, ids), "verify": verify_store(store).status,
                 "checked": trio.run(checked_open, store), "writes": trio.run(writes, copy, ids)}
        return "ok " + json.dumps(found)

    answer = run_forked(work)
    assert answer.startswith("ok "), answer
    result: dict[str, Any] = json.loads(answer[3:])
    return result


def cases(separators: list[files.Separator], exhaustive: bool) -> list[tuple[files.Separator, int, int]]:
    """(separator, byte, bit) for each flip: every bit of every byte, or, bounded, two of the four
    low bits of the ordinal's low byte (a flip moves the separator among its neighbours' keys, so a
    search for a key near it lands one leaf off) and one bit of the branch id (a flip sends searches
    past every key of the branch), turned round from separator to separator."""
    if exhaustive:
        return [(separator, index, bit) for separator in separators
                for index in range(len(separator.key)) for bit in range(8)]
    low, branch = keys.ITEM_PREFIX.size - 1, keys.PREFIX.size - 4
    chosen = []
    for number, separator in enumerate(separators):
        chosen += [(separator, low, number % 4), (separator, low, (number + 2) % 4),
                   (separator, branch + number % 4, number * 3 % 8)]
    return chosen


@pytest.mark.soak  # make soak: every bit of every separator
def test_a_flipped_bit_in_a_separator_key_never_hides_a_message_nor_passes_verify(
    tmp_path: Path, soak_scale: Callable[[int, int], int]
) -> None:
    """K7: flip a bit of a branch page's separator key: each read returns what the sound store
    returns or raises StoreCorruptError, a writer's edits land on the right messages or are
    refused, and a store any read saw damaged is verified damaged and refused by check_pages."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    ids = trio.run(build, store)
    separators = list(files.separators(store))
    assert len({separator.page for separator in separators}) == 1 and len(separators) >= 8, separators
    sound = examine(store, copy, ids)
    assert sound["verify"] == "sound" and sound["checked"] == "opened"
    assert "corrupt" not in sound["reads"].values() and sound["writes"] != "corrupt", sound
    silent, damaged = [], 0
    for separator, index, bit in cases(separators, exhaustive=bool(soak_scale(0, 1))):
        case = f"separator {separator.node} ({separator.key.hex()}), bit {bit} of byte {index}"
        flip(store / files.DATA_NAME, separator.key_at + index, bit)
        try:
            found = examine(store, copy, ids)
        finally:
            flip(store / files.DATA_NAME, separator.key_at + index, bit)
        wrong = [what for what, outcome in found["reads"].items()
                 if outcome not in ("corrupt", sound["reads"].get(what))]
        if found["writes"] not in ("corrupt", sound["writes"]):
            wrong.append("writes")
        saw = "corrupt" in found["reads"].values() or found["writes"] == "corrupt"
        if wrong or saw and (found["verify"] == "sound" or found["checked"] == "opened"):
            silent.append((case, wrong, found["verify"], found["checked"]))
        damaged += saw
    assert not silent, (len(silent), silent[:5])
    assert damaged, "no flip was seen by a read: the premise failed"


def test_verify_and_check_pages_refuse_a_separator_that_does_not_bound_the_keys_below_it(tmp_path: Path) -> None:
    """K7: a separator raised past the first keys of the leaf it leads to, still in order with its
    neighbours (so py-lmdb's structural walk finds nothing): ``ctxrt verify`` reports the store
    damaged, naming the table, page and separator, and an open with check_pages=True refuses it."""
    from lmdb import verify as structural

    store = tmp_path / "store"
    trio.run(build, store)
    separators = list(files.separators(store))
    before, raised, after = separators[3:6]
    key = raised.key[:-8] + ((int.from_bytes(raised.key[-8:], "big") + int.from_bytes(after.key[-8:], "big")) // 2
                             ).to_bytes(8, "big")  # halfway to the next one
    assert before.key < raised.key < key < after.key
    with open(store / files.DATA_NAME, "r+b") as file:
        file.seek(raised.key_at)
        file.write(key)
    assert structural.verify(str(store), subdir=True) == []  # the premise: only the bounds show it
    report = verify_in_child(store)
    assert report.status == "damaged", report
    # The first key below the raised separator now lies below it: the finding names both places.
    assert any(item.what.startswith("table items: leaf page ") and
               f"the range node {raised.node} of branch page {raised.page} " in item.what
               for item in report.damage), report.damage

    def open_checked() -> str:
        return trio.run(checked_open, store)

    assert run_forked(open_checked) == "refused"
