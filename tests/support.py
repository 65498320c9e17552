"""Helpers shared by test modules (fixtures live in conftest.py)."""

from collections.abc import Sequence
from typing import Any

import trio

from ctxrt.content import Message
from ctxrt.runtime import Runtime
from ctxrt.store import keys
from ctxrt.views import Window


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
