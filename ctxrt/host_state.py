"""Host state (M9): a host's own JSON state in the store, beside its conversation, branched with it.

A host state ``name`` is two of the store's states (named in ``namespace/states.py``): a value
(``get``/``set``) and an append log (``append``/``entries``). They are plain value and log states,
so a branch reads its parent's up to the fork point and only its own writes after, exactly as a
namespace's states do (K2, R1): nothing here branches anything. A write registers its state in
the batch that writes it, so reading a state nobody wrote is no error (None, no entries).
``message_writes`` is what ``ContextManager.add_message(host_state=...)`` commits in its
message's batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from . import checks
from .content.validation import _json_value
from .errors import BranchNotFoundError, StoreCorruptError
from .namespace import states
from .store.interface import StoreEngine
from .store.protocol import AppendItem, Atomically, RegisterState, SetValue
from .store.actor import StoreRef
from .store.records import BranchRow, encode_json


@attrs.frozen
class HostEntry:
    """One entry of a host state's log. ``sequence`` is the store sequence of its append: its
    identity, what ``entries(since=...)`` counts from, and a point ``create_branch`` can fork at."""

    sequence: int
    value: Any


def checked_json(value: object, path: str) -> Any:
    """A JSON-native copy of ``value`` (str keys, finite numbers), or ``MalformedContentError`` naming ``path``."""
    return _json_value(value, path)


def set_commands(name: str, branch: int, value: Any) -> tuple[RegisterState, SetValue]:
    state = states.host_value_state(name)
    return RegisterState(name=state, kind="value"), SetValue(state=state, branch=branch, value=value)


def message_writes(host_state: object, branch: int) -> tuple[Any, ...]:
    """The commands that set each ``{name: value}`` of ``add_message(host_state=...)``, committed
    before the message in its batch (so a fork at the message's id sees them). Checked here, before
    anything is sent: ``TypeError``, or ``MalformedContentError`` naming ``host_state[name]``."""
    if host_state is None:
        return ()
    if not isinstance(host_state, Mapping):
        raise TypeError(f"host_state must be a mapping of names to JSON values or None, "
                        f"not {type(host_state).__name__}")
    commands: list[Any] = []
    for name, value in host_state.items():
        checked = states.host_state_name(name, f"host_state[{name!r}]")
        commands += set_commands(checked, branch, checked_json(value, f"host_state[{checked!r}]"))
    return tuple(commands)


class HostState:
    """A host's named state on one branch: a JSON value and a log of JSON entries. Made by
    ``Runtime.host_state``; don't construct it. Reads are async like the runtime's other reads."""

    def __init__(
        self, name: str, row: BranchRow, engine: Callable[[], StoreEngine], store: Callable[[], StoreRef],
    ) -> None:
        self._name = name
        self._row = row
        self._engine = engine  # raises RuntimeClosedError once the runtime is closed
        self._store = store  # raises RuntimeClosedError, or ReadOnlyStoreError in a read-only runtime

    @property
    def name(self) -> str:
        return self._name

    @property
    def branch(self) -> str:
        return self._row.name

    def __repr__(self) -> str:
        return f"<HostState {self._name!r} on branch {self._row.name!r}>"

    async def get(self) -> Any:
        """The value last set on this branch (or on its parent up to the fork point); None if never set.

        Raises:
            BranchNotFoundError: the branch was deleted.
            RuntimeClosedError: the runtime is closed.
            StoreCorruptError: the stored value is damaged.
        """
        await trio.lowlevel.checkpoint()
        engine = self._live()
        state = states.host_value_state(self._name)
        return engine.read_value(state, self._row.id) if engine.has_state(state) else None

    async def set(self, value: Any) -> int:
        """Replace the value; returns the sequence of the write.

        Raises:
            MalformedContentError: ``value`` isn't JSON (naming the place within it); nothing is stored.
            BranchNotFoundError, ReadOnlyStoreError, RuntimeClosedError.
        """
        commands = set_commands(self._name, self._row.id, checked_json(value, "value"))
        return int((await self._store().ask(Atomically(commands=commands)))[-1].sequence)

    async def append(self, entry: Any) -> int:
        """Append ``entry`` to the log; returns its sequence (``HostEntry.sequence``).

        Raises:
            MalformedContentError: ``entry`` isn't JSON (naming the place within it); nothing is stored.
            BranchNotFoundError, ReadOnlyStoreError, RuntimeClosedError.
        """
        data = encode_json(checked_json(entry, "entry"), path="entry")
        state = states.host_log_state(self._name)
        commands = (RegisterState(name=state, kind="log"), AppendItem(state=state, branch=self._row.id, data=data))
        return int((await self._store().ask(Atomically(commands=commands)))[-1].sequence)

    async def entries(self, since: int | None = None) -> list[HostEntry]:
        """The log's entries in order, those appended after sequence ``since`` only if given (an
        entry's ``sequence``, or any store sequence: 0 is all of them).

        Raises:
            TypeError, ValueError: ``since`` isn't a non-negative integer or None.
            BranchNotFoundError, RuntimeClosedError.
            StoreCorruptError: an entry is damaged (it is named).
        """
        since = checks.optional_integer(since, "since", minimum=0)
        await trio.lowlevel.checkpoint()
        engine = self._live()
        state = states.host_log_state(self._name)
        if not engine.has_state(state):
            return []
        found = []
        for item in engine.read_items(state, self._row.id):
            if since is not None and item.sequence <= since:
                continue
            try:
                found.append(HostEntry(item.sequence, json.loads(item.data)))
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                raise StoreCorruptError(
                    engine.data_path, f"log state {state!r} item @{item.sequence} doesn't decode: {exc}") from None
        return found

    def _live(self) -> StoreEngine:
        engine = self._engine()
        if engine.branch_deleted(self._row.id):
            raise BranchNotFoundError(f"branch {self._row.name!r} was deleted")
        return engine
