"""``StrategyContext``: what a strategy is handed to reach its namespace's state, model and view."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..store.protocol import AppendItem, RegisterState, SetValue
from ..strategies.base import Entry

if TYPE_CHECKING:
    from ..model import ModelRequest, ModelResponse
    from ..views import MessageView
    from .actor import NamespaceActor

logger = logging.getLogger("ctxrt.namespace")


class StaleEpochError(Exception):
    """The namespace's view changed (a claim, a strategy change) while this work was under way.

    Raised inside a strategy's work so it stops; the actor discards the work and logs it
    (spec/audience.md C9). Never reaches a caller of the public API.
    """


class StrategyContext:
    """A strategy's handle on its namespace for one view epoch.

    State ids are ``<namespace>/<strategy name>:<name>``. Every write checks the epoch first,
    so work begun for an older view writes nothing.
    """

    def __init__(self, actor: NamespaceActor, epoch: int, strategy_name: str) -> None:
        self._actor = actor
        self.epoch = epoch
        self.strategy_name = strategy_name

    # -- who and what -----------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self._actor.namespace

    @property
    def branch(self) -> str:
        return self._actor.branch

    @property
    def reader(self) -> str | None:
        return self._actor.reader

    @property
    def view(self) -> MessageView:
        return self._actor.view

    @property
    def model(self) -> Any:
        return self._actor.model

    @property
    def system_prompt(self) -> str | None:
        return self._actor.system_prompt

    @property
    def tools(self) -> Sequence[Mapping[str, Any]]:
        return self._actor.tools

    # -- epochs -----------------------------------------------------------------------------

    def is_current(self) -> bool:
        return self._actor.epoch == self.epoch and not self._actor.stopped

    def check_current(self) -> None:
        if not self.is_current():
            raise StaleEpochError(
                f"namespace {self.namespace!r} on branch {self.branch!r} changed its view (epoch "
                f"{self.epoch} -> {self._actor.epoch}); discarding work begun for the older view"
            )

    # -- holds ------------------------------------------------------------------------------

    def hold_floor(self) -> int | None:
        """The lowest sequence held from compression (it and everything after stay raw), or None."""
        return self._actor.hold_floor()

    # -- state ------------------------------------------------------------------------------

    def state_id(self, name: str) -> str:
        return f"{self.namespace}/{self.strategy_name}:{name}"

    async def _ensure(self, state: str, kind: str) -> None:
        if not self._actor.runtime.engine.has_state(state):
            await self._actor.runtime.store.ask(RegisterState(name=state, kind=kind))  # type: ignore[arg-type]

    def get_value(self, name: str, default: Any = None) -> Any:
        state = self.state_id(name)
        engine = self._actor.runtime.engine
        if not engine.has_state(state):
            return default
        with engine.reader() as txn:
            value, sequence = engine.get_value(txn, state, engine.branch(self.branch))
        return default if sequence == 0 else value

    @property
    def writes(self) -> bool:
        """False in a read-only runtime, where state writes are skipped (a dry run's approximation)."""
        return not self._actor.runtime.readonly

    async def set_value(self, name: str, value: Any) -> None:
        self.check_current()
        if not self.writes:
            return
        state = self.state_id(name)
        await self._ensure(state, "value")
        self.check_current()
        await self._actor.runtime.store.ask(SetValue(state=state, branch=self.branch, value=value))

    def read_log(self, name: str) -> list[Any]:
        """Every item of the strategy's log ``name`` on this branch, decoded from JSON."""
        import json

        state = self.state_id(name)
        engine = self._actor.runtime.engine
        if not engine.has_state(state):
            return []
        with engine.reader() as txn:
            return [json.loads(item.data) for item in engine.log_items(txn, state, engine.branch(self.branch))]

    async def append_log(self, name: str, value: Any) -> int:
        from ..store.engine import encode_json

        self.check_current()
        if not self.writes:
            return 0
        state = self.state_id(name)
        await self._ensure(state, "log")
        self.check_current()
        operation = await self._actor.runtime.store.ask(
            AppendItem(state=state, branch=self.branch, data=encode_json(value, path=state))
        )
        return operation.sequence

    # -- compression reads and model calls --------------------------------------------------

    async def mark_compression_read(self, sequence: int) -> None:
        """Record, BEFORE reading, that compression may read messages up to ``sequence``.

        Raises the store's error if the record can't be written; the strategy must then send
        no request (spec/audience.md D2, D4). Never lowers the record. A namespace that
        compiles for no reader records nothing (D7).
        """
        self.check_current()
        if self.writes:
            await self._actor.raise_floor(sequence)
        self.check_current()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the model outside the namespace's mailbox order, then rejoin it.

        Raises ``StaleEpochError`` if the view changed while the request was out: the reply
        belongs to an older view and is discarded (C9).
        """
        self.check_current()
        model = self.model
        if model is None:
            from ..errors import ModelError

            raise ModelError(f"namespace {self.namespace!r} has no model for compression", retryable=False)
        actor = self._actor
        actor.lock.release()
        try:
            with trio.fail_after(actor.model_timeout_s):
                response = await model.complete(request)
        except trio.TooSlowError:
            from ..errors import ModelError

            raise ModelError(
                f"model {request.model!r} gave no reply within {actor.model_timeout_s} s", retryable=True
            ) from None
        finally:
            with trio.CancelScope(shield=True):
                await actor.lock.acquire()
        self.check_current()
        return response

    # -- messages of its own ---------------------------------------------------------------

    async def add_message(self, participant: str, content: Any) -> str:
        """Append a message of the strategy's own (a topic transition, say) to the namespace's slot.

        Raises ``MalformedContentError`` for bad content, and the store's error if it refuses.
        """
        from ..slots import prepare_append

        self.check_current()
        data, blobs, appended = prepare_append(participant, content, origin=self._actor)
        operation = await self._actor.runtime.store.ask(
            AppendItem(state=self._actor.config.slot, branch=self.branch, data=data, blobs=tuple(blobs),
                       attachment=appended)
        )
        return str(operation.sequence)

    # -- the context log --------------------------------------------------------------------

    async def append_context(self, entry: Entry) -> int:
        """Append ``entry`` to the namespace's context log; edits then reach its ``copy`` sources (M5).

        Raises ``MalformedContentError`` for an entry that carries an audience: no view reads one
        there (spec/audience.md B3).
        """
        from .. import codec
        from ..errors import MalformedContentError

        place = codec.find_audience(entry.content, path="entry.content")
        if place is not None:
            raise MalformedContentError(place, "a context-log entry may not carry an audience: no view reads one there")
        self.check_current()
        data = codec.message_to_json(
            entry.participant, entry.content, {"source_ids": list(entry.source_ids), "relation": entry.relation}, 0, ()
        )
        operation = await self._actor.runtime.store.ask(
            AppendItem(state=self._actor.context_state, branch=self.branch, data=data)
        )
        return operation.sequence
