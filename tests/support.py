"""Helpers shared by test modules (fixtures live in conftest.py)."""

from typing import Any

import trio

from ctxrt.runtime import Runtime
from ctxrt.store import keys


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
