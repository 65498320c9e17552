"""``Ledger``: which framework messages a slot holds, by identity, so an adapter writes each once;
and ``record_compiled``, which keeps each request an adapter compiles in its namespace's request
ledger (Q6) when that is on.

The pieces of the adapters' shared rules that wait (they read the slot and write through a
manager); the rest, synchronous, is in ``blocks``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .. import CompileResult, EmptyRequestError, LedgerOffError, aio
from .blocks import KEYS, TOOL, Block, Writes, answers, calls_alone


async def record_compiled(manager: aio.ContextManager, result: CompileResult, form: str, agent: str) -> None:
    """Keep the request ``result`` makes (``form``, ``agent`` speaking as the assistant) in the
    namespace's request ledger, when the namespace keeps one (``rt.open(..., ledger=True)``, Q6):
    the body before the adapter turns it into its framework's types. Nothing when it keeps none,
    or when there is nothing to send."""
    try:
        await manager.record_request(result, form=form, options={"assistant": agent})
    except (LedgerOffError, EmptyRequestError):
        pass


class Ledger:
    """Which framework messages a slot holds, by identity (``Entry.key``), read from the ``KEYS``
    metadata of the slot's messages: every writer's, so a message a framework hands over again,
    to this adapter or to another agent's over the same slot, is written once, across restarts.

    Made lazily per adapter: the first ``record`` reads the slot's keys, later ones only what
    was written since (the slot's newest messages, by sequence). With ``group``, a metadata key,
    it also keeps the keys of the stored messages by that key's value (``grouped``).
    """

    def __init__(self, manager: aio.ContextManager, *, group: str | None = None) -> None:
        self.manager = manager
        self.group = group
        self._ids: dict[str, str] = {}  # key -> the id of the stored message holding it
        self._keys: dict[str, list[str]] = {}  # stored message id -> its keys
        self._groups: dict[str, dict[str, list[str]]] = {}  # group value -> stored message id -> its keys
        self._read = -1  # the newest sequence whose keys are read
        self._lock: asyncio.Lock | None = None

    def slot_id(self, key: str) -> str | None:
        """The stored message holding the framework message ``key``, if written."""
        return self._ids.get(key)

    def keys(self, message_id: str) -> Sequence[str]:
        """The keys the stored message ``message_id`` holds (read or written so far)."""
        return self._keys.get(message_id, [])

    def grouped(self, value: str) -> Mapping[str, list[str]]:
        """The stored messages whose ``group`` metadata is ``value`` (read or written so far), each
        with the keys it holds."""
        return self._groups.get(value, {})

    def _note(self, message_id: str, keys: Sequence[str], metadata: Mapping[str, Any]) -> None:
        self._ids.update(dict.fromkeys(keys, message_id))
        self._keys[message_id] = list(keys)
        value = metadata.get(self.group) if self.group is not None else None
        if isinstance(value, str):
            self._groups.setdefault(value, {})[message_id] = list(keys)

    async def catch_up(self) -> None:
        """Reads the keys of the messages stored since the last read, through any manager."""
        size = 32
        while True:
            window = await self.manager.get_message_window(-size, size)
            if window.start_index == 0 or window.messages[0].sequence <= self._read:
                break
            size *= 4
        for message in window.messages:
            if message.sequence > self._read:
                metadata = message.metadata or {}
                keys = metadata.get(KEYS)
                self._note(message.id, [str(key) for key in keys] if isinstance(keys, list) else [], metadata)
                self._read = message.sequence

    async def record(self, keys: Sequence[str], writes: Callable[[int], Writes], metadata: Mapping[str, Any], *,
                     hold_calls: bool = False, held: Collection[str] = (),
                     also: Mapping[str, Sequence[str]] | None = None) -> None:
        """Writes the framework messages the slot doesn't hold, in order: ``keys[i]`` is message
        ``i``'s identity, ``writes(i)`` what it writes (asked only of those not held, all of them
        before the first write, so content refused refuses the batch). ``held`` names keys the
        slot holds though no stored message lists them (written before ``KEYS`` existed). A ``TOOL`` write of
        results is joined to the write of the calls they answer (``paired``); with
        ``hold_calls``, a trailing message of calls alone is left for a later record, to be
        written with its results. Each stored message carries ``metadata`` and the keys of the
        messages it completes (with the keys ``also`` gives for each, another name of it). Records of one ledger take turns, so two at once write nothing
        twice."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self.catch_up()
            fresh = [(i, writes(i)) for i, key in enumerate(keys) if key not in self._ids and key not in held]
            if hold_calls and fresh and fresh[-1][1] and calls_alone(fresh[-1][1][-1][1]):
                fresh.pop()
            planned: list[tuple[str, list[Block], list[str]]] = []  # each write with the keys it completes
            for i, written in fresh:
                for n, (participant, content) in enumerate(written):
                    done = [keys[i], *(also or {}).get(keys[i], ())] if n == len(written) - 1 else []
                    if participant == TOOL and planned and answers(planned[-1][1], content):
                        last = planned[-1]
                        planned[-1] = (last[0], [*last[1], *content], last[2] + done)
                    else:
                        planned.append((participant, list(content), done))
            for participant, content, done in planned:
                message_id = await self.manager.add_message(participant, content, metadata={**metadata, KEYS: done})
                self._note(message_id, done, metadata)
                self._read = max(self._read, int(message_id))
