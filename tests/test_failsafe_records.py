"""A record that doesn't decode is StoreCorruptError naming it, on reads and writes alike (K7).

Determinism rules: a small store is built through the runtime, closed, and one record is
rewritten with raw py-lmdb and sealed (the pages and the record's checksum are sound; only
ctxrt's bytes are wrong, as a bug would write them: a changed bit is the seal's to find, in
test_failsafe_bits.py). Then the store is opened in this process: such damage can't crash LMDB,
only ctxrt's decoding, which must say what is damaged instead of raising a raw JSONDecodeError,
UnicodeDecodeError, KeyError or struct.error. ``verify_store`` must report the same record. A
``trio.fail_after`` guard bounds every test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
import trio

import ctxrt
from ctxrt.errors import StoreCorruptError
from ctxrt import Runtime, open_runtime
from ctxrt.testing import (
    AppendItem,
    Atomically,
    CreateBranch,
    EditItem,
    RegisterState,
    ScriptedModel,
    SetValue,
    keys,
    prepare_append,
    seals,
    verify_store,
)

Patch = Callable[[lmdb.Transaction, dict[bytes, object]], None]


async def build(store: Path) -> None:
    async with open_runtime(store) as rt:
        await rt.store.ask(RegisterState(name="log", kind="log"))
        await rt.store.ask(RegisterState(name="other", kind="log"))
        await rt.store.ask(RegisterState(name="prefs", kind="value"))
        await rt.store.ask(RegisterState(name="messages", kind="log"))
        for data in (b"one", b"two", b"three"):
            await rt.store.ask(AppendItem(state="log", branch="main", data=data))
        await rt.store.ask(SetValue(state="prefs", branch="main", value={"theme": "dark"}))
        data, blobs, _ = prepare_append("user", "hello")
        await rt.store.ask(AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs)))
        await rt.store.ask(CreateBranch(name="side"))


def patch(store: Path, change: Patch) -> None:
    """Make ``change`` with raw py-lmdb, then seal each record it wrote (every record whose seal
    doesn't match is taken whole as its unsealed value)."""
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            tables = {name: env.open_db(name, txn=txn, create=False) for name in keys.ALL_DBS}
            change(txn, tables)
            for table in tables.values():
                for key, value in list(txn.cursor(db=table)):
                    if not seals.intact(key, value):
                        txn.put(key, seals.seal(key, value), db=table)
    finally:
        env.close()


def state_number(txn: lmdb.Transaction, dbs: dict[bytes, object], name: str) -> int:
    return keys.decode_u32(txn.get(name.encode(), db=dbs[keys.DB_STATES])[:4])


def current_head(txn: lmdb.Transaction, dbs: dict[bytes, object], name: str) -> bytes:
    return keys.head_key(state_number(txn, dbs, name), 1, keys.MAX_U64)


def read_log(rt: Runtime, state: str = "log") -> list[bytes]:
    with rt.engine.reader() as txn:
        return [bytes(item.data) for item in rt.engine.log_items(txn, state, rt.engine.branch("main"))]


AT_OPEN: list[tuple[str, Patch, str]] = [
    ("branch row not JSON", lambda txn, dbs: txn.put(keys.encode_u32(2), b"\xee{not json", db=dbs[keys.DB_BRANCHES]),
     r"the row of branch 00000002 doesn't decode"),
    ("branch row missing a field", lambda txn, dbs: txn.put(keys.encode_u32(2), b'{"id": 2}', db=dbs[keys.DB_BRANCHES]),
     r"the row of branch 00000002 doesn't decode \(KeyError"),
    ("branch descends from nothing", lambda txn, dbs: txn.put(
        keys.encode_u32(2), b'{"id":2,"name":"side","parent":238,"fork":1,"lineage":[[238,1]],"created_ms":0,'
                            b'"deleted":false}', db=dbs[keys.DB_BRANCHES]),
     r"branch 2 \('side'\) descends from branch 238, which has no row"),
    ("state row with a bad kind", lambda txn, dbs: txn.put(b"log", keys.encode_u32(1) + b"?", db=dbs[keys.DB_STATES]),
     r"the row of state b'log' doesn't decode"),
    ("state name not UTF-8", lambda txn, dbs: txn.put(b"\xff\xfe", keys.encode_u32(9) + b"L", db=dbs[keys.DB_STATES]),
     r"the row of state b'\\xff\\xfe' doesn't decode"),
    ("head row cut short", lambda txn, dbs: txn.put(current_head(txn, dbs, "log"), b"\x00" * 7, db=dbs[keys.DB_ITEMS]),
     r"its branch, state or head rows can't be read: error\('unpack_from requires a buffer of at least 36 bytes"),
]


@pytest.mark.parametrize(("change", "what"), [case[1:] for case in AT_OPEN], ids=[case[0] for case in AT_OPEN])
@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "reader"])
async def test_a_record_the_open_reads_that_doesnt_decode_is_refused_naming_it(
    tmp_path: Path, change: Patch, what: str, readonly: bool
) -> None:
    """Branch, state and head rows are read at open: one that doesn't decode refuses the open with
    StoreCorruptError naming the data file and the record (K7)."""
    store = tmp_path / "store"
    with trio.fail_after(20):
        await build(store)
        patch(store, change)
        with pytest.raises(StoreCorruptError, match=rf"^store file {store / 'data.mdb'} is damaged: {what}") as refused:
            async with open_runtime(store, readonly=readonly):
                pytest.fail("a damaged store was opened")
    assert refused.value.path == str(store / "data.mdb")
    report = verify_store(store)
    assert report.status == "damaged", report.lines()


async def test_a_damaged_item_fails_only_the_reads_and_writes_that_touch_it(tmp_path: Path) -> None:
    """A log state with an item row cut short: reading it, or editing in it, raises StoreCorruptError for
    that caller alone; other states and other commands of the same batch carry on (K7)."""
    store = tmp_path / "store"

    with trio.fail_after(20):
        await build(store)
        async with open_runtime(store) as rt:  # find the row of item 1 and cut it short behind the runtime's back
            with rt.engine.reader() as txn:
                item = rt.engine.log_item(txn, "log", rt.engine.branch("main"), 1)
        assert item is not None and item.data == b"two"
        patch(store, lambda txn, dbs: txn.put(
            keys.item_key(state_number(txn, dbs, "log"), 1, item.ordinal, item.version), b"\x01", db=dbs[keys.DB_ITEMS]))
        async with open_runtime(store) as rt:
            with pytest.raises(StoreCorruptError, match=r"the items of 'log' on branch 'main' can't be read: error\("):
                read_log(rt)
            assert read_log(rt, "other") == []
            # A batch that touches the damaged state fails only there.
            results: list[object] = []

            async def send(command: object) -> None:
                try:
                    results.append(await rt.store.ask(command))
                except StoreCorruptError as exc:
                    results.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, EditItem(state="log", branch="main", item_sequence=item.sequence + 1,
                                                  data=b"edited"))
                nursery.start_soon(send, AppendItem(state="other", branch="main", data=b"fine"))
            refused = [result for result in results if isinstance(result, StoreCorruptError)]
            assert len(refused) == 1 and "EditItem met a record that doesn't decode" in str(refused[0])
            assert read_log(rt, "other") == [b"fine"]
            await rt.store.ask(Atomically(commands=(AppendItem(state="other", branch="main", data=b"still serving"),)))
            assert read_log(rt, "other") == [b"fine", b"still serving"]
    report = verify_store(store)
    assert report.status == "damaged"
    assert any("shorter than its 8-byte origin" in item.what for item in report.damage), report.lines()


async def test_a_value_that_doesnt_decode_is_store_corrupt_naming_it(tmp_path: Path) -> None:
    """A value row that isn't JSON raises StoreCorruptError naming the state and branch, not JSONDecodeError (K7)."""
    store = tmp_path / "store"
    with trio.fail_after(20):
        await build(store)

        def garble(txn: lmdb.Transaction, dbs: dict[bytes, object]) -> None:
            number = state_number(txn, dbs, "prefs")
            cursor = txn.cursor(db=dbs[keys.DB_ITEMS])
            assert cursor.set_range(keys.head_prefix(number, 1))
            cursor.put(cursor.key(), b"{\xff not json")

        patch(store, garble)
        async with open_runtime(store, readonly=True) as rt:
            with rt.engine.reader() as txn, pytest.raises(
                StoreCorruptError, match=r"the value of 'prefs' on branch 'main' can't be read: UnicodeDecodeError"
            ):
                rt.engine.get_value(txn, "prefs", rt.engine.branch("main"))
    assert any("doesn't decode" in item.what for item in verify_store(store).damage)


@pytest.mark.parametrize("damage", ["message not JSON", "blob bytes changed", "blob missing"])
async def test_verify_reports_damaged_messages_and_blobs(tmp_path: Path, damage: str) -> None:
    """verify decodes every stored message and checks every blob against its hash (K7)."""
    store = tmp_path / "store"
    with trio.fail_after(20):
        await build(store)
        async with open_runtime(store) as rt:
            picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                   "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}}
            data, blobs, _ = prepare_append("user", [picture])
            await rt.store.ask(AppendItem(state="messages", branch="main", data=data, blobs=tuple(blobs)))
        sha = bytes.fromhex(blobs[0][0])

        def change(txn: lmdb.Transaction, dbs: dict[bytes, object]) -> None:
            if damage == "blob bytes changed":
                txn.put(sha, b"image/png\x00not the picture", db=dbs[keys.DB_BLOBS])
            elif damage == "blob missing":
                txn.delete(sha, db=dbs[keys.DB_BLOBS])
            else:
                number = state_number(txn, dbs, "messages")
                cursor = txn.cursor(db=dbs[keys.DB_ITEMS])
                assert cursor.set_range(keys.item_key(number, 1, 0, 0))
                cursor.put(cursor.key(), cursor.value()[:8] + b'{"participant": "user", "content": [')

        patch(store, change)
    report = verify_store(store)
    assert report.status == "damaged" and report.exit_code == 1
    expected = {"message not JSON": "doesn't decode", "blob bytes changed": "don't hash to its key",
                "blob missing": "which is not stored"}[damage]
    assert any(expected in item.what for item in report.damage), report.lines()


class ImageAsker(ctxrt.Strategy):
    """Raw selection; each tick asks the model about the namespace's messages as stored, images and
    all (their bytes read back by the actor as the call goes out, M13)."""

    name = "image-asker"
    marks_compression_reads = True

    def __init__(self) -> None:
        self.outcomes: list[Any] = []

    def select(self, view: ctxrt.MessageView, budget: Any, options: ctxrt.SelectOptions) -> list[ctxrt.Entry]:
        return [ctxrt.Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]

    def next_unit(self, ctx: ctxrt.StrategyContext) -> ctxrt.Unit:
        return ctxrt.Unit("ask", 0)

    def request_for(self, unit: ctxrt.Unit, ctx: ctxrt.StrategyContext) -> ctxrt.ModelRequest:
        return ctxrt.ModelRequest("test-model", None, [ctxrt.CompiledMessage("user", m.content, (m.id,))
                                                       for m in ctx.view.get_all()], 16)

    def apply_unit(self, unit: ctxrt.Unit, outcome: Any, ctx: ctxrt.StrategyContext) -> bool:
        self.outcomes.append(outcome)
        return True


async def test_a_unit_whose_image_blob_is_damaged_fails_as_a_model_error_and_the_runtime_goes_on(
    tmp_path: Path,
) -> None:
    """K7, M13: a compression request whose image's stored bytes can't be read back (a damaged blob
    record) fails its unit as a non-retryable ModelError naming the blob; no model is asked, and
    the actor and the runtime go on serving (a compile of the image raises StoreCorruptError)."""
    store = tmp_path / "store"
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}}
    with trio.fail_after(20):
        async with open_runtime(store) as rt:
            await (await rt.open("ns")).add_message("user", [picture])
        data, blobs, _ = prepare_append("user", [picture])
        sha = bytes.fromhex(blobs[0][0])

        def damage(txn: lmdb.Transaction, dbs: dict[bytes, object]) -> None:
            txn.put(sha, b"\xff\xfe not a media type\x00bytes", db=dbs[keys.DB_BLOBS])

        patch(store, damage)
        strategy, model = ImageAsker(), ScriptedModel(lambda request: "seen")
        async with open_runtime(store, model=model) as rt:
            manager = await rt.open("ns", strategy=strategy)
            await manager.tick()
            [outcome] = strategy.outcomes
            assert isinstance(outcome, ctxrt.ModelError) and not outcome.retryable
            assert f"blob {blobs[0][0]} can't be read" in str(outcome) and model.requests == []
            await manager.add_message("user", "still served")
            with pytest.raises(StoreCorruptError, match=f"blob {blobs[0][0]} can't be read"):
                await manager.compile()  # a compile of the image names the damage to its caller
            other = await rt.open("other", isolate=True)  # a conversation of its own
            await other.add_message("user", "served too")
            assert len((await other.compile()).messages) == 1
