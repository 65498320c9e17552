"""The namespace machine with no store at all: no LMDB, no PostgreSQL, no event loop.

What the machine reads of the store comes in with each message (``Inputs.store``); here it is a
few dicts (``MemoryStore``), and the commits it asks for are applied to them by the test, which
plays the loop's part: it answers ``Acquire`` with an empty slot cache seeded in memory (over an
engine that has nothing to read) and the lease effects with what the test decides the engine
said. So claims, reader checks, compression marks and the lease's outcomes are checked here as
pure decisions. Their end-to-end forms over real stores are in tests/test_namespace_machine.py
and tests/test_namespace_actor.py. Each test cites the behaviour it checks (docs/behaviours.md).
That the machine's import closure reaches no event loop, store engine or model SDK is checked
with every pure core's in tests/test_layers.py.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any, cast

import ctxrt
from ctxrt import Message
from ctxrt.errors import UnknownStateError, ValueConflictError
from ctxrt.namespace.core import Place
from ctxrt.namespace.effects import (
    Acquire,
    Acquired,
    Answer,
    CheckLease,
    Commit,
    Committed,
    Effect,
    Inputs,
    LeaseAnswer,
    ReleaseLease,
    Stop,
    TakeLease,
)
from ctxrt.namespace.lease import Lease
from ctxrt.namespace.machine import NamespaceMachine
from ctxrt.namespace.protocol import Attach, Compile, NamespaceConfig, QuerySummaries, SearchSummaries, SetStrategy
from ctxrt.store.interface import StoreEngine
from ctxrt.store.batch import ANY
from ctxrt.store.records import Item
from ctxrt.testing import Atomically, IdMemo, LogHead, RegisterState, Reply, SetValue, SlotCache, states

BIG = ctxrt.Budget(max_tokens=200_000, reserve_for_response=0)
BRANCH = 1


class MemoryStore:
    """The store's committed state as dicts: what the machine reads (``StoreReads``), and the few
    commands these tests' handlers send, applied as the store would (a claim decided in it)."""

    shared = False

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.names: set[str] = set()
        self.sequence = 0

    # -- StoreReads -----------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        return self.sequence

    def read_value(self, state: str, branch_id: int, default: Any = None) -> Any:
        return self.values.get(state, default)

    def read_log(self, state: str, branch_id: int) -> list[Item]:
        return []

    def read_message(self, slot: str, branch_id: int, sequence: int) -> tuple[Message, int] | None:
        return None

    def context_entries(self, namespace: str, branch_id: int) -> list[Message]:
        return []

    def state_names(self) -> list[str]:
        return sorted(self.names)

    def has_state(self, name: str) -> bool:
        return name in self.names

    def check_state(self, name: str) -> None:
        if name not in self.names:
            raise UnknownStateError(name)

    def seen_now(self, caches: Sequence[SlotCache]) -> int:
        return self.sequence

    # -- the store actor's part -------------------------------------------------------------------

    def apply(self, command: Any) -> Any:
        self.sequence += 1
        match command:
            case Atomically():
                return tuple(self.apply(inner) for inner in command.commands)
            case RegisterState():
                self.names.add(command.name)
                return None
            case SetValue():
                stored = self.values.get(command.state)
                if command.expect is not ANY and stored != command.expect:
                    raise ValueConflictError(command.state, stored)
                if command.rising and isinstance(stored, int) and stored >= command.value:
                    return None
                self.values[command.state] = command.value
                return None
        raise AssertionError(f"not a command these tests send: {command!r}")


class Remembering(ctxrt.Strategy):
    """Passthrough that keeps its memory in the process (so it holds the lease) and writes a
    counter at every compile (a strategy write)."""

    name = "remembering"
    marks_compression_reads = True
    keeps_memory = True

    def __init__(self) -> None:
        self.count = 0

    def select(self, view: Any, budget: Any, options: Any) -> list[ctxrt.Entry]:
        self.count += 1
        if options.context is not None:
            options.context.set_value("count", self.count)
        return [ctxrt.Entry(m.participant, m.content, (m.id,)) for m in view.get_all()]


class Unmarking(ctxrt.Strategy):
    """A host's strategy that doesn't declare it marks what its compression reads."""

    name = "unmarking"

    def select(self, view: Any, budget: Any, options: Any) -> list[ctxrt.Entry]:
        return []


class Pure:
    """One machine, the loop played by hand over a ``MemoryStore``. Commits wait in ``commits``
    until ``settle()``; lease effects are answered with ``lease`` (held or not, or an error)."""

    def __init__(self, strategy: Any = None, *, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore()
        self.config = NamespaceConfig("ns", "messages", (), None, strategy or ctxrt.Passthrough(), None)
        place = Place("ns", "main")
        self.machine = NamespaceMachine(self.config, place, BRANCH, Lease(place, readonly=False), writes=True,
                                        model_timeout_s=1.0)
        self.effects: list[Effect] = []
        self.commits: list[Commit] = []
        self.lease: LeaseAnswer = LeaseAnswer(True)
        self.tokens = iter(range(1, 1000))
        # An engine with nothing to read: the slot cache below is seeded, so a read of it would fail.
        self.engine = cast(StoreEngine, types.SimpleNamespace(shared=False, data_path=":memory:"))

    def tell(self, message: Any, reply: Reply[Any] | None = None) -> None:
        effects = self.machine.handle(message, Inputs(0.0, self.store), reply)
        self.effects += effects
        for effect in effects:
            match effect:
                case Answer():
                    effect.reply.resolve(effect.ok, effect.value)
                case Commit():
                    self.commits.append(effect)
                case Acquire():
                    seed = ([], LogHead(), False, False, IdMemo())  # a slot cache's seed: no message, no entry
                    self.tell(Acquired([SlotCache(self.engine, name, BRANCH, live=True, seed=seed)
                                        for name in effect.slots]))
                case TakeLease() | CheckLease():
                    self.tell(self.lease)
                case ReleaseLease() if not effect.at_stop:
                    self.tell(LeaseAnswer(False))

    def ask(self, command: Any) -> Reply[Any]:
        reply: Reply[Any] = Reply()
        self.tell(command, reply)
        self.settle()
        return reply

    def settle(self) -> None:
        while self.commits:
            commit = self.commits.pop(0)
            try:
                outcome: tuple[bool, Any] = (True, self.store.apply(commit.command))
            except Exception as exc:  # noqa: BLE001 - the machine's to judge
                outcome = (False, exc)
            self.tell(Committed(commit.token, *outcome))

    def attach(self, reader: str | None = None, **options: Any) -> Reply[Any]:
        return self.ask(Attach(next(self.tokens), reader, self.config, **options))

    def effect_types(self) -> set[type]:
        return {type(effect) for effect in self.effects}


def value(reply: Reply[Any]) -> Any:
    assert reply.done, "not answered"
    return reply.unwrap()


def refused(reply: Reply[Any], kind: type[BaseException], match: str = "") -> BaseException:
    assert reply.done and not reply.ok, (reply.done, reply.value)
    assert isinstance(reply.value, kind) and match in str(reply.value), reply.value
    return reply.value


# -- claims and reader checks ------------------------------------------------------------------------


def test_a_first_attach_registers_the_states_and_claims_the_namespace_in_the_store() -> None:
    """C1: the first attach for a reader records it, decided in the store (a claim written only
    where none is stored)."""
    ns = Pure()
    assert value(ns.attach("ann")).reader == "ann"
    assert ns.store.values[states.reader_state("ns")] == "ann"
    assert {states.reader_state("ns"), states.floor_state("ns"), states.config_state("ns")} <= ns.store.names
    claims = [c.command for c in ns.effects if isinstance(c, Commit) and isinstance(c.command, SetValue)
              and c.command.state == states.reader_state("ns")]
    assert [claim.expect for claim in claims] == [None]


def test_an_attach_for_another_reader_than_the_stored_claim_is_refused_and_writes_nothing() -> None:
    """C1, C2: the store records bob; an attach for ann is refused with ReaderConflictError before
    anything is written or read from the slots."""
    store = MemoryStore()
    store.values[states.reader_state("ns")] = "bob"
    ns = Pure(store=store)
    refused(ns.attach("ann"), ctxrt.ReaderConflictError)
    assert not ns.commits and Commit not in ns.effect_types() and Acquire not in ns.effect_types()
    assert Stop in ns.effect_types()  # refused with no manager attached: the actor ends
    assert value(Pure(store=store).attach("bob")).reader == "bob"


def test_a_claim_another_process_wrote_first_refuses_the_attach() -> None:
    """C1, K4: the claim is decided in the store: another writer's claim lands between the attach's
    read and its write, and the conditional write refuses this one."""
    ns = Pure()
    reply: Reply[Any] = Reply()
    ns.tell(Attach(next(ns.tokens), "ann", ns.config), reply)
    ns.store.values[states.reader_state("ns")] = "bob"  # before the attach's commits land
    ns.settle()
    refused(reply, ctxrt.ReaderConflictError)
    assert ns.store.values[states.reader_state("ns")] == "bob"


def test_a_compile_for_another_reader_is_refused_at_the_read_time_check() -> None:
    """C8, C10: every request is checked against the record: a compile or a summary read for
    another reader than the claim is refused; the claim's own reader compiles."""
    ns = Pure()
    value(ns.attach("ann"))
    refused(ns.ask(Compile("bob", BIG, (), (), False)), ctxrt.ReaderConflictError)
    refused(ns.ask(QuerySummaries("bob", SearchSummaries("x", None, None, 10, False))), ctxrt.ReaderConflictError)
    assert value(ns.ask(Compile("ann", BIG, (), (), False))).messages == []


# -- compression marks -------------------------------------------------------------------------------


def test_a_reader_refuses_a_strategy_that_does_not_mark_what_its_compression_reads() -> None:
    """D6: a namespace with a reader refuses, before anything is written, a strategy that doesn't
    declare ``marks_compression_reads``, at the first attach and at set_strategy."""
    ns = Pure(Unmarking())
    refused(ns.attach("ann"), ctxrt.StrategyRefusedError, "marks_compression_reads")
    assert Commit not in ns.effect_types()
    ns = Pure()
    value(ns.attach("ann"))
    refused(ns.ask(SetStrategy("ann", Unmarking())), ctxrt.StrategyRefusedError, "marks_compression_reads")
    assert ns.machine.strategy.name == "passthrough" and Stop not in ns.effect_types()


# -- the lease's outcomes ------------------------------------------------------------------------------


def test_a_strategy_that_keeps_its_memory_takes_the_lease_and_is_refused_when_another_process_holds_it() -> None:
    """K4: a namespace whose strategy keeps its memory is served by one process at a time: the first
    attach asks for the lease; refused, the attach fails with ConfigConflictError and nothing of
    its slots is read; granted, it serves."""
    ns = Pure(Remembering())
    ns.lease = LeaseAnswer(False)
    refused(ns.attach("ann"), ctxrt.ConfigConflictError, "served by another process")
    assert TakeLease in ns.effect_types() and Acquire not in ns.effect_types()
    ns = Pure(Remembering(), store=ns.store)
    assert value(ns.attach("ann")).reader == "ann"
    assert TakeLease in ns.effect_types() and Acquire in ns.effect_types()


def test_a_lease_lost_before_a_strategy_write_refuses_it_and_stops_without_committing() -> None:
    """K4: the lease went with a lost connection: the look before the compile's strategy write says
    so; the write isn't sent, the machine stops, and what comes after is refused with
    ConfigConflictError."""
    ns = Pure(Remembering())
    value(ns.attach("ann"))
    ns.effects.clear()
    ns.lease = LeaseAnswer(False)
    reply: Reply[Any] = Reply()
    ns.tell(Compile("ann", BIG, (), (), False), reply)
    assert CheckLease in ns.effect_types() and not ns.commits
    assert any(isinstance(effect, Stop) for effect in ns.effects)
    assert states.strategy_state("ns", "remembering", "count") not in ns.store.values
    assert value(reply).messages == []  # a compile's bookkeeping that can't commit costs it nothing (P1)
    refused(ns.ask(Compile("ann", BIG, (), (), False)), ctxrt.ConfigConflictError, "lost its lease")


def test_a_store_unreachable_when_the_lease_is_looked_at_fails_that_write_and_the_machine_goes_on() -> None:
    """L10, C5: the look at the lease raises StoreUnavailableError: the strategy write fails as its
    commit would, the strategy waits for the store, and the machine doesn't stop."""
    ns = Pure(Remembering())
    value(ns.attach("ann"))
    ns.effects.clear()
    ns.lease = LeaseAnswer(False, ctxrt.StoreUnavailableError("memory:", "the server is down"))
    value(ns.ask(Compile("ann", BIG, (), (), False)))  # the compile goes on; its bookkeeping waits (P1, D4)
    assert not any(isinstance(effect, Stop) for effect in ns.effects) and not ns.commits
    assert ns.machine.waiting is not None
    ns.lease = LeaseAnswer(True)
    value(ns.ask(Compile("ann", BIG, (), (), False)))
    assert ns.store.values[states.strategy_state("ns", "remembering", "count")] >= 1
