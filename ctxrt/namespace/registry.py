"""The registry of a runtime's namespace actors, keyed by (branch incarnation, namespace).

It starts an actor for the first open of a key, attaches managers to it, forgets it when it
stops, and retires every actor of a branch when that branch is deleted (docs/behaviours.md L5).
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

from ..errors import (
    BranchNotFoundError,
    ManagerClosedError,
    ReadOnlyStoreError,
    RuntimeClosedError,
    StoreUnavailableError,
)
from ..mailbox import Reply
from ..slots import SlotRegistry
from ..store.actor import StoreRef
from ..request_ledger import RequestEncoder, encode_record
from ..store.interface import StoreEngine
from ..store.protocol import AppendItem, Atomically, BranchSwitched, RegisterState
from ..store.records import BranchRow
from . import states
from .actor import Services, serve_namespace
from .protocol import ActorRetired, Attach, Detach, NamespaceConfig
from .ref import NamespaceRef

logger = logging.getLogger("ctxrt.namespace")

_tokens = itertools.count(1)


def new_token() -> int:
    """A manager's identity in its actor's set of attached managers."""
    return next(_tokens)


@attrs.frozen
class NamespaceStatistics:
    """One live namespace actor, as ``Runtime.statistics()`` reports it."""

    namespace: str
    branch: str
    mailbox_depth: int
    in_flight_model_calls: int


class LedgerQueue:
    """The request records a runtime's managers made (``record_request``, Q1), waiting to commit in
    the batch of the next write that goes with them (a message's, or a flush), so a record costs no
    commit of its own; and each (branch, namespace)'s encoder, which keeps a record as what it adds
    to the last (``request_ledger.RequestEncoder``)."""

    def __init__(self) -> None:
        self.pending: list[AppendItem] = []
        self.encoders: dict[tuple[int, str], RequestEncoder] = {}
        self._wrote: list[tuple[RequestEncoder, str]] = []  # (encoder, record id) of each record waiting
        # A batch carrying records is out until it is answered; till then none other takes any, so
        # records are stored in the order they were made (Q11).
        self._out: trio.Event | None = None
        # The compiles this runtime's managers handed out, alive, by their raw bodies (a compile's
        # own, shared by what a host or an adapter derives from its result), with the (namespace,
        # branch, reader) each was for, which a relabelled provenance can't change: only those are
        # recorded, by that place's managers (Q4, Q9).
        self._compiled: dict[int, tuple[weakref.ref[Any], tuple[str, str, str | None]]] = {}
        # Opens that may switch a ledger on or off (``ledger=`` given): under way, and done. A flag read
        # on is trusted while none is under way and none finished since (``flag_known``).
        self.switching = 0
        self.switches = 0
        # The attaches of such opens cancelled after they were sent: their actors handle them all the
        # same (and may switch a flag then), so none is trusted until every one is answered.
        self.unsettled: list[Reply[Any]] = []

    def compiled(self, result: Any) -> None:
        """``result`` was compiled by one of this runtime's managers (``ContextManager.compile``)."""
        provenance, known = result.provenance, self._compiled
        key = id(provenance.raw_bodies)
        known[key] = (weakref.ref(provenance.raw_bodies, lambda _: known.pop(key, None)),
                      (provenance.namespace, provenance.branch, provenance.reader))

    def compiled_for(self, result: Any) -> tuple[str, str, str | None] | None:
        """The (namespace, branch, reader) ``result``, or the result it was derived from, was
        compiled for by this runtime's managers; None if another runtime compiled it."""
        bodies = result.provenance.raw_bodies
        found = self._compiled.get(id(bodies))
        return found[1] if found is not None and found[0]() is bodies else None

    def encoder(self, branch_id: int, namespace: str) -> RequestEncoder:
        found = self.encoders.get((branch_id, namespace))
        if found is None:  # not ``setdefault``: an encoder costs a few microseconds to make
            found = self.encoders[branch_id, namespace] = RequestEncoder()
        return found

    def flag_known(self, encoder: RequestEncoder, engine: StoreEngine) -> bool:
        """Whether ``encoder``'s ledger is known on without a read: it was read on since the last
        open that could switch it, none is under way (nor a cancelled one's attach unanswered),
        and no other process writes the store."""
        return encoder.on_at == self.switches and self._quiet() and not engine.shared

    def flag_read_on(self, encoder: RequestEncoder) -> None:
        if self._quiet():
            encoder.on_at = self.switches

    def _quiet(self) -> bool:
        if self.unsettled:
            self.unsettled = [reply for reply in self.unsettled if not reply.done]
        return not self.switching and not self.unsettled

    def keep(self, append: AppendItem) -> None:
        """Keep a record kept whole and by no encoder (a compression call's) waiting for the next batch."""
        self.pending.append(append)

    def add(self, encoder: RequestEncoder, record_id: str, append: AppendItem) -> None:
        """Keep ``encoder``'s record ``record_id`` (``append``) waiting for the next batch."""
        self.pending.append(append)
        self._wrote.append((encoder, record_id))
        encoder.wrote(record_id)

    def take(self, engine: StoreEngine) -> Taken:
        """The commands that commit what waits (each ledger's state registered first, unless the
        engine knows it), leaving none; a record of a branch deleted since is dropped with it (L5),
        or it would refuse the write it rides in. Until the batch is known committed (``landed``)
        or not (``lost``), no record is kept against one it took: it may fail, and a record must
        follow its base in the log. While an earlier batch carrying records is out, it takes none:
        they wait for the next (``commit`` waits for that one)."""
        if self._out is not None or not (self._wrote or self.pending):
            return NOTHING_TAKEN
        records = tuple(self._wrote)
        for encoder, record_id in records:
            encoder.flying(record_id)
        self._wrote = []
        pending, self.pending = self.pending, []
        deleted = engine.branch_deleted
        gone = {branch for branch in {int(append.branch) for append in pending} if deleted(branch)}
        if gone:
            pending = [append for append in pending if int(append.branch) not in gone]
        if not pending:
            return Taken((), records)
        known = engine.has_state
        states = [state for state in dict.fromkeys(append.state for append in pending) if not known(state)]
        self._out = trio.Event()
        return Taken((*(RegisterState(name=state, kind="log") for state in states), *pending), records)

    def landed(self, taken: Taken) -> None:
        """What ``taken`` took committed: a record may be kept against them."""
        for encoder, record_id in taken.records:
            encoder.landed(record_id)
        self._answered(taken)

    def lost(self, taken: Taken) -> None:
        """What ``taken`` took did not commit: the next record of their encoders is kept whole."""
        for encoder, record_id in taken.records:
            encoder.lost(record_id)
        self._answered(taken)

    def returned(self, taken: Taken) -> None:
        """The batch ``taken`` rode was refused for its own write (its branch deleted meanwhile),
        nothing of it committed: its records wait again, ahead of those made since, for the next
        (they were acknowledged: a refusal of another's write must not lose them, Q11)."""
        self.pending[:0] = [command for command in taken.commands if isinstance(command, AppendItem)]
        self._wrote[:0] = taken.records
        for encoder, record_id in taken.records:
            encoder.landed(record_id)  # waiting again: a valid base, as one never taken
        self._answered(taken)

    def _answered(self, taken: Taken) -> None:
        if taken.commands and self._out is not None:
            self._out.set()
            self._out = None

    @property
    def waiting(self) -> bool:
        """Whether records wait, or a batch carrying some is out (a close commits after it)."""
        return bool(self.pending) or self._out is not None

    @trio.lowlevel.enable_ki_protection  # Ctrl-C between taking the records and sending them would lose them
    async def commit(self, engine: StoreEngine, store: Callable[[], StoreRef]) -> None:
        """Commit the records waiting in a batch of their own, after the batch carrying records
        that is out, if one is. Sent whatever comes (``carry``): a cancel takes effect once it is
        answered."""
        retried = False
        while True:
            while self._out is not None:
                await self._out.wait()
            ref = store()  # refused (closed, read-only) before anything is taken
            taken = self.take(engine)
            if not taken.commands:
                self.landed(taken)
                await trio.lowlevel.checkpoint()
                return
            try:
                await self.carry(ref, Atomically(commands=taken.commands), taken)
            except BranchNotFoundError:
                # A record's branch deleted since it was taken: nothing committed, and they wait
                # again. Once more, that branch's records dropped (``take``), so it costs no other
                # branch's records (Q11).
                if retried:
                    raise
                retried = True
                continue
            await trio.lowlevel.checkpoint_if_cancelled()
            return

    async def carry(self, store: StoreRef, command: Any, taken: Taken) -> Any:
        """Send ``command``, which carries the records ``taken``, and settle them by its answer
        (``landed``, ``returned`` or ``lost``); what it answered, awaited shielded. Its callers run
        with Ctrl-C deferred, so in a task of the host's the send is theirs; but trio raises a
        deferred Ctrl-C at the main task's next wait, which may come before the send (the store's
        own), and records acknowledged to the host must not go with it: from the main task a
        system task sends them (a turn's carrying append costs it about 45 µs more), and a main
        task that leaves meanwhile loses only the answer."""
        if not _main_task():
            return await self._send(store, command, taken)
        answer: list[tuple[bool, Any]] = []
        done = trio.Event()

        async def send() -> None:
            try:
                answer.append((True, await self._send(store, command, taken)))
            except BaseException as exc:  # noqa: BLE001 - the caller, if still waiting, raises it
                answer.append((False, exc))
            finally:
                done.set()

        trio.lowlevel.spawn_system_task(send, name="ctxrt-ledger-carry")
        with trio.CancelScope(shield=True):
            await done.wait()
        ok, value = answer[0]
        if ok:
            return value
        raise value

    async def _send(self, store: StoreRef, command: Any, taken: Taken) -> Any:
        try:
            with trio.CancelScope(shield=True):
                result = await store.ask(command)
        except (BranchNotFoundError, BranchSwitched):  # nothing committed: the records wait again
            self.returned(taken)
            raise
        except BaseException:
            self.lost(taken)
            raise
        self.landed(taken)
        return result


def _main_task() -> bool:
    """Whether this is the task trio raises a deferred Ctrl-C in at its next wait: the host's main
    task (or a system task, which never gets one: the root task's children are both)."""
    return trio.lowlevel.current_task().parent_nursery.parent_task is trio.lowlevel.current_root_task()  # type: ignore[union-attr]  # a task's, never the root's


@attrs.frozen
class Taken:
    """A batch's share of the waiting records: its commands, and which encoder wrote each."""

    commands: tuple[Any, ...]
    records: tuple[tuple[RequestEncoder, str], ...]


# What a batch takes while no record waits (most appends): landed, lost or returned, it changes
# nothing, so an append that took it skips all three (``ContextManager.add_message``).
NOTHING_TAKEN = Taken((), ())


class NamespaceRegistry:
    """Every live namespace actor of one runtime."""

    def __init__(
        self, engine: StoreEngine, store: StoreRef | None, slots: SlotRegistry, model: Any, nursery: trio.Nursery,
        *, model_timeout_s: float, store_path: Path | str,
    ) -> None:
        self.engine = engine
        self.store_path = store_path  # the runtime's path, which its managers report
        self.store = store
        self.slots = slots
        self._nursery = nursery
        self._services = Services(engine, store, slots, model, self._forget, model_timeout_s, alarm=self._sound,
                                  keep_record=self._keep_record)
        self._refs: dict[tuple[int, str], NamespaceRef] = {}
        self._on_close: set[Callable[[], None]] = set()
        # Subscribers that asked for alarms, by (branch id, namespace): they outlive the actors.
        self._alarms: dict[tuple[int, str], list[Callable[[Any], None]]] = {}
        self.closed = False
        # Every manager of this runtime, for a switch of them all (R3); one leaves when collected.
        self.managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.switching = trio.Lock()  # one switch of many managers at a time
        self.ledger = LedgerQueue()

    async def commit_ledger(self) -> None:
        """Commit the request records waiting (Q1), if any: what ``requests`` reads and a close leaves."""
        await self.ledger.commit(self.engine, self.store_ref)

    def _keep_record(self, branch_id: int, namespace: str, record: Any) -> None:
        """A namespace's compression call (Q6): recorded now (its ``held`` say what its unit read),
        in line with the records waiting, and committed soon by itself (a model call is rare beside
        a turn's records), so the ledger keeps the order they were made in (Q11)."""
        if self.closed or self.store is None:
            return
        try:  # a query on PostgreSQL: run by the actor's loop, whose end the store's outage must not be
            sequence = self.engine.last_sequence
        except StoreUnavailableError as exc:
            logger.warning("%r: a compression call's request record is lost: %s", namespace, exc.reason)
            return
        record = attrs.evolve(record, sequence=sequence)
        self.ledger.keep(AppendItem(state=states.ledger_state(namespace), branch=branch_id, data=encode_record(record)))
        self._nursery.start_soon(self._commit_records)

    async def _commit_records(self) -> None:
        try:
            await self.commit_ledger()
        except Exception:  # noqa: BLE001 - it costs the records waiting, never the runtime
            logger.warning("the request records waiting could not commit", exc_info=True)

    def __len__(self) -> int:
        return len(self._refs)

    def __iter__(self) -> Iterator[NamespaceRef]:
        return iter(list(self._refs.values()))

    def store_ref(self) -> StoreRef:
        """The store actor's handle, for writes that need no namespace actor.

        Raises ``RuntimeClosedError`` once the runtime closed, ``ReadOnlyStoreError`` in a read-only one.
        """
        if self.closed:
            raise RuntimeClosedError("the runtime is closed")
        if self.store is None:
            standby = " on a hot standby (its primary takes the writes)" if getattr(self.engine, "standby", False) else ""
            raise ReadOnlyStoreError(f"the runtime was opened read-only{standby}; it refuses every write")
        return self.store

    def _forget(self, ref: NamespaceRef) -> None:
        key = (ref.branch_id, ref.namespace)
        if self._refs.get(key) is ref:
            del self._refs[key]
            # Its encoder holds the last request's messages: a namespace opened again keeps its next record whole.
            self.ledger.encoders.pop(key, None)

    async def attach(
        self, branch: BranchRow, config: NamespaceConfig, reader: str | None, token: int, *,
        compiles_for_none: bool = False, explicit_strategy: bool = False,
    ) -> tuple[NamespaceRef, str | None]:
        """Attach manager ``token`` to the actor of (``branch``, ``config.namespace``), starting it
        if none runs; returns its ref and the reader the manager compiles for.

        Raises what the actor's checks of the attach raise (``ReaderConflictError``,
        ``StrategyRefusedError``, ``ConfigConflictError``) before anything is written, and
        ``BranchNotFoundError`` for a deleted branch. If cancelled, the manager is not attached (a
        claim that committed stands).
        """
        if config.ledger is None:
            return await self._attach(branch, config, reader, token, compiles_for_none, explicit_strategy)
        self.ledger.switching += 1  # its actor may write the ledger flag: read afresh meanwhile, and after
        try:
            return await self._attach(branch, config, reader, token, compiles_for_none, explicit_strategy,
                                      switching=True)
        finally:
            self.ledger.switching -= 1
            self.ledger.switches += 1

    async def _attach(
        self, branch: BranchRow, config: NamespaceConfig, reader: str | None, token: int, compiles_for_none: bool,
        explicit_strategy: bool, *, switching: bool = False,
    ) -> tuple[NamespaceRef, str | None]:
        key = (branch.id, config.namespace)
        while True:
            if self.closed:
                raise RuntimeClosedError("the runtime is closed")
            if branch.deleted or self.engine.branch_deleted(branch.id):
                raise BranchNotFoundError(f"branch {branch.name!r} was deleted")
            ref = self._refs.get(key)
            if ref is None:  # the actor judges the attach, before it registers or writes anything (C2)
                ref = NamespaceRef(config, branch.id, branch.name)
                self._refs[key] = ref
                started: Reply[None] = Reply()
                self._nursery.start_soon(serve_namespace, self._services, ref, started)
                try:
                    await started.wait()  # cancelled here, the actor starts all the same
                except BaseException:
                    ref.tell(Detach(token))  # it stops at once unless another open attached first
                    raise
            command = Attach(token, reader, config, explicit_strategy, compiles_for_none)
            try:
                attached = await (self._ask_switching(ref, command) if switching else ref.ask(command))
            except ActorRetired:
                continue  # its last manager left while this waited: start a fresh one
            except ManagerClosedError as exc:
                raise self._refusal(exc) from None
            except BaseException:
                ref.tell(Detach(token))  # undoes the attach if it was handled before the cancel came
                raise
            return ref, attached.reader

    async def _ask_switching(self, ref: NamespaceRef, command: Attach) -> Any:
        """``ref.ask(command)`` for an attach that may switch the ledger flag: cancelled after it
        was sent (the actor handles it all the same), its reply is kept unsettled until answered."""
        await trio.lowlevel.checkpoint_if_cancelled()
        reply = await ref.mailbox.put(command)
        try:
            await reply.wait()
        finally:
            if not reply.done:
                self.ledger.unsettled.append(reply)
        await trio.lowlevel.checkpoint_if_cancelled()
        return reply.unwrap()

    def _refusal(self, error: BaseException) -> BaseException:
        """An open refused because the runtime closed meanwhile says so (``RuntimeClosedError``)."""
        if self.closed and isinstance(error, ManagerClosedError):
            return RuntimeClosedError("the runtime is closed")
        return error

    def retire_branch(self, branch_id: int, name: str) -> None:
        """Branch ``name`` (id ``branch_id``) was deleted: stop its actors at once; their managers
        raise ``BranchNotFoundError``."""
        error = lambda: BranchNotFoundError(f"branch {name!r} was deleted; its managers are retired")  # noqa: E731
        for key, ref in list(self._refs.items()):
            if key[0] == branch_id:
                del self._refs[key]
                ref.retire(error)

    def on_alarm(self, branch_id: int, namespace: str, deliver: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``deliver`` with each alarm the actor of (``branch_id``, ``namespace``) sounds from
        now on (a ``QuarantineAlarm``, T13); returns the cancel."""
        listeners = self._alarms.setdefault((branch_id, namespace), [])
        listeners.append(deliver)

        def cancel() -> None:
            if deliver in listeners:
                listeners.remove(deliver)
            if not listeners and self._alarms.get((branch_id, namespace)) is listeners:
                del self._alarms[(branch_id, namespace)]

        return cancel

    def _sound(self, branch_id: int, namespace: str, event: Any) -> None:
        for deliver in list(self._alarms.get((branch_id, namespace), ())):
            try:
                deliver(event)
            except Exception:  # one subscriber's failure is its own
                logger.exception("a subscriber of the alarms of %r failed", namespace)

    def on_close(self, end: Callable[[], None]) -> Callable[[], None]:
        """Call ``end`` when the runtime closes (a subscription's channel ends then); returns the cancel."""
        self._on_close.add(end)
        return lambda: self._on_close.discard(end)

    def close(self) -> None:
        """The runtime is closing: stop every actor; their managers raise ``ManagerClosedError``;
        every ``on_close`` callback runs."""
        self.closed = True
        ends, self._on_close = self._on_close, set()
        for end in ends:
            end()
        for ref in list(self._refs.values()):
            ref.retire(lambda ref=ref: ManagerClosedError(  # type: ignore[misc]  # mypy infers no type for a lambda default
                f"the runtime closed; the manager of namespace {ref.namespace!r} on branch {ref.branch_name!r} "
                f"is closed"))
        self._refs.clear()

    def statistics(self) -> tuple[NamespaceStatistics, ...]:
        return tuple(
            NamespaceStatistics(ref.namespace, ref.branch_name, ref.mailbox_depth, ref.status.model_calls)
            for ref in self._refs.values()
        )
