"""Helpers shared by test modules (fixtures live in conftest.py)."""

import inspect
import struct
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from ctxrt import Message, Runtime, Window
from ctxrt.testing import Atomically, EditItem, files, keys


POLL_S = 0.005


async def wait_until(condition: Callable[[], bool | Awaitable[bool]]) -> None:
    """Return once ``condition()`` holds, asking again every ``POLL_S``; the caller's
    ``trio.fail_after`` bounds the wait. For what has no event to wait on (a log record, a request
    the background drain sent): the wait ends when the condition holds, never after a set time."""
    while True:
        held = condition()
        if await held if inspect.isawaitable(held) else held:
            return
        await trio.sleep(POLL_S)


@attrs.frozen
class EditGate:
    """Edits' commits held at the store's door: ``entered`` is set when one arrives, and each waits
    there until ``opened`` is set; every other command passes."""

    entered: trio.Event = attrs.Factory(trio.Event)
    opened: trio.Event = attrs.Factory(trio.Event)


def hold_edits(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> EditGate:
    """Hold ``rt``'s edit commits (``EditItem`` in an ``Atomically``) until the gate opens."""
    gate, ask = EditGate(), rt.store.ask

    async def held(command: Any) -> Any:
        if isinstance(command, Atomically) and any(isinstance(c, EditItem) for c in command.commands):
            gate.entered.set()
            await gate.opened.wait()
        return await ask(command)

    monkeypatch.setattr(rt.store, "ask", held)
    return gate


def dump(rt: Runtime) -> dict[str, Any]:
    """Every LMDB table, raw, plus what the engine caches: equal dumps mean an unchanged store."""
    engine = rt.engine
    with engine.reader() as txn:
        tables = {
            name.decode(): [(bytes(k), bytes(v)) for k, v in txn.cursor(db=engine.dbs[name])] for name in keys.ALL_DBS
        }
    return {
        "tables": tables,
        "branches": engine.list_branches(),
        "states": engine.list_states(),
        "last_sequence": engine.last_sequence,
    }


def flip(data: Path, offset: int, bit: int) -> None:
    """Flip one bit of a file in place, as bit rot would (flip it again to put it back)."""
    with open(data, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ (1 << bit)]))


class LineReader:
    """Lines from a child's stdout, one ``await next_line()`` at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next_line(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError(f"the child closed its stdout; unread: {self._buffer!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


class FakeSlot:
    """A slot cache's listing without LMDB: appends grow it; anything else replaces the list and
    moves the stamp. Like a slot cache, it holds only the newest messages some window asked for
    (docs/behaviours.md L7), so derived listings are exercised reading back as they go."""

    def __init__(self, messages: Sequence[Message] = (), *, audience: bool = False) -> None:
        self.messages = list(messages)
        self.rewrites = 1
        self.audience = audience
        self.held_from = len(self.messages)  # messages[held_from:] are held

    def window(self, count: int) -> Window:
        self.held_from = max(0, min(self.held_from, len(self.messages) - count))
        return Window(self.messages[self.held_from :], self.held_from == 0, self.rewrites)

    def may_hold_audience(self) -> bool:
        return self.audience

    def changes(self, stamp: object) -> None:
        return None  # names no change: derived listings start over after a rewrite

    def append(self, *messages: Message) -> None:
        self.messages.extend(messages)

    def rewrite(self, messages: list[Message]) -> None:
        self.messages, self.held_from = messages, len(messages)
        self.rewrites += 1

    def replace(self, index: int, new: Message) -> None:
        self.rewrite([new if i == index else m for i, m in enumerate(self.messages)])


class PostgresSchema:
    """A schema of its own in a test database, for one example of a stateful test: ``url`` points
    the runtime's connections at it (libpq's ``options``); ``drop`` removes it and all it holds."""

    def __init__(self, database_url: str) -> None:
        import uuid

        import psycopg

        self.database_url = database_url
        self.name = f"s{uuid.uuid4().hex[:12]}"
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.name}")
        self.url = f"{database_url}{'&' if '?' in database_url else '?'}options=-csearch_path%3D{self.name}"

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {self.name} CASCADE")


# Damage to an LMDB store's main table, made while a read-only runtime has it open (K7).

# md_root of the main table in a meta page: after the page header, magic, version, address, map
# size and the free table's record (LMDB writes them in the host's byte order).
MAIN_ROOT_AT = 16 + 24 + 48 + 40


def rename_items_table(data: bytearray, meta: files.Meta) -> None:
    """The items table's name in the main table changes: LMDB finds no such table (MDB_BAD_DBI)."""
    at = data.index(b"items", meta.main.root * meta.page_size)
    data[at + 4] = ord("z")


def clear_items_table_flags(data: bytearray, meta: files.Meta) -> None:
    """The items table's entry in the main table loses its flags (MDB_INCOMPATIBLE)."""
    at = data.index(b"items", meta.main.root * meta.page_size)
    data[at - 4] = 0  # the node's flags, before its key size and key


def point_main_root_past_the_pages(data: bytearray, meta: files.Meta) -> None:
    """Both meta pages name a main table root past the pages in use: the search a cursor makes as
    it opens fails, and LMDB says so only at the cursor's first read (MDB_BAD_TXN)."""
    for page in (0, 1):
        struct.pack_into("=Q", data, page * meta.page_size + MAIN_ROOT_AT, meta.last_page + 1)


def damage(store: Path, change: Callable[[bytearray, files.Meta], None]) -> None:
    """Apply ``change`` to the store's data file in place (a reader's map sees it at once)."""
    meta = files.read_meta(store)
    path = files.data_path(store)
    data = bytearray(path.read_bytes())
    change(data, meta)
    path.write_bytes(bytes(data))


def line_of(path: str, function: str, text: str) -> int:
    """The line (1-based) of the first line holding ``text`` in ``function`` of the source file ``path``."""
    with open(path) as source:
        lines = source.read().splitlines()
    start = next(number for number, line in enumerate(lines) if f"def {function}(" in line)
    for number in range(start, len(lines)):
        if text in lines[number]:
            return number + 1
    raise AssertionError(f"{path}'s {function} no longer holds {text!r}: update the test")


def at_line(path: str, line: int, reached: Callable[[], None]) -> Callable[..., Any]:
    """A trace function (``sys.settrace``, ``threading.settrace``) that calls ``reached()`` each
    time a frame of the source file ``path`` reaches ``line``; other files' frames aren't traced."""

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != path:
            return None if event == "call" else trace
        if event == "line" and frame.f_lineno == line:
            reached()
        return trace

    return trace
