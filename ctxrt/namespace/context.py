"""``ActorContext``: the ``StrategyContext`` a namespace actor hands its strategy for one view epoch.

Reads go to the store's committed state; writes are buffered here and committed by the actor
when the strategy's call returns (strategies/base.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..content import codec, validation
from ..budget import Entry
from ..errors import MalformedContentError
from ..store.protocol import AppendItem, SetValue
from ..store.records import encode_json
from ..views import MessageView
from . import states
from .core import Holds, Place
from .effects import StoreReads


@attrs.define
class Settings:
    """A namespace's live settings, set by its managers (``set_system_prompt``, ``set_tool_definitions``)."""

    system_prompt: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()


class ActorContext:
    """One view epoch's handle on a namespace, for its strategy. Used only in the actor's task."""

    def __init__(
        self, *, place: Place, branch_id: int, reader: str | None, view: MessageView, store: Callable[[], StoreReads],
        strategy_name: str, writes: bool, holds: Holds, settings: Settings, clock: Callable[[], float],
    ) -> None:
        self._place = place
        self._branch_id = branch_id
        self._reader = reader
        self._view = view
        self._store = store  # the store as it came with the message being handled
        self._strategy_name = strategy_name
        self._writes = writes
        self._holds = holds
        self._settings = settings
        self._clock = clock
        self._pending: list[AppendItem | SetValue] = []
        self._mark = 0

    # -- who and what -----------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self._place.namespace

    @property
    def branch(self) -> str:
        return self._place.branch

    @property
    def reader(self) -> str | None:
        return self._reader

    @property
    def view(self) -> MessageView:
        return self._view

    @property
    def system_prompt(self) -> str | None:
        return self._settings.system_prompt

    @property
    def tools(self) -> Sequence[Mapping[str, Any]]:
        return self._settings.tools

    @property
    def writes(self) -> bool:
        return self._writes

    def now(self) -> float:
        return self._clock()

    def hold_floor(self) -> int | None:
        return self._holds.floor()

    # -- state ------------------------------------------------------------------------------

    def _state(self, name: str) -> str:
        return states.strategy_state(self._place.namespace, self._strategy_name, name)

    def get_value(self, name: str, default: Any = None) -> Any:
        return self._store().read_value(self._state(name), self._branch_id, default)

    def read_log(self, name: str) -> list[Any]:
        return [json.loads(item.data) for item in self._store().read_log(self._state(name), self._branch_id)]

    def set_value(self, name: str, value: Any) -> None:
        if self._writes:
            state = self._state(name)
            encode_json(value, path=state)  # refuse what can't be stored now, naming it, not at commit
            self._pending.append(SetValue(state=state, branch=self._branch_id, value=value))

    def append_log(self, name: str, value: Any) -> None:
        if self._writes:
            state = self._state(name)
            self._pending.append(AppendItem(state=state, branch=self._branch_id, data=encode_json(value, path=state)))

    def append_context(self, entry: Entry) -> None:
        place = validation.find_audience(entry.content, path="entry.content")
        if place is not None:
            raise MalformedContentError(place, "a context-log entry may not carry an audience: no view reads one there")
        if self._writes:
            data = codec.message_to_json(
                entry.participant, entry.content, {"source_ids": list(entry.source_ids), "relation": entry.relation},
                0, (),
            )
            self._pending.append(
                AppendItem(state=states.context_state(self._place.namespace), branch=self._branch_id, data=data)
            )

    def mark_compression_read(self, sequence: int) -> None:
        self._mark = max(self._mark, sequence)

    # -- for the actor ----------------------------------------------------------------------

    def take(self) -> tuple[int, list[AppendItem | SetValue]]:
        """The highest mark and the writes buffered since the last take."""
        mark, pending = self._mark, self._pending
        self._mark, self._pending = 0, []
        return mark, pending
