"""Branching a manager: moving it to another branch's namespace actor, forking, branching at a
message, deriving a child, and the ``Derivation`` that records how a child was made.

``ContextManager`` keeps the public methods (``switch_branch``, ``fork``, ``branch_at``,
``derive``) and their contract; what they do past validating their arguments is here, as
functions of the registry and the namespace reference, so the rules of a move (attach to the
new branch first, then detach: a refusal leaves the manager where it was, C2) stand apart from
the manager's message and compile calls. Nothing here makes a manager: a derived child comes
back as a ``Child`` the manager wraps.
"""

from __future__ import annotations

import secrets
import time

import attrs

from .errors import MessageNotFoundError
from .models.model import Model
from .namespace.protocol import Derive, Detach, Fork
from .namespace.ref import NamespaceRef
from .namespace.registry import NamespaceRegistry, new_token
from .slots import SlotCache
from .store.protocol import CreateBranch
from .store.records import BranchRow
from .strategies.base import Strategy, StrategyConfig


@attrs.frozen
class Derivation:
    """How a derived manager was made; plain data, round-trips through JSON (R2)."""

    parent_branch: str
    branch: str
    namespace: str
    at_sequence: int | None
    reader: str | None
    isolate: bool
    auxiliary_views: tuple[str | None, ...]
    # The manager it was made from compiled through a view filter (a function, which no JSON
    # holds): a reopen is handed it again, or warns that the view widens.
    filtered: bool = False


@attrs.frozen
class Attachment:
    """A manager's place after a move or a derive: its namespace actor, its token there, its reader."""

    ref: NamespaceRef
    token: int
    reader: str | None


@attrs.frozen
class Child:
    """A derived child's attachment and how it was made, for the manager to wrap."""

    attachment: Attachment
    derivation: Derivation


def _now_ms() -> int:
    return int(time.time() * 1000)


async def attach_to(
    registry: NamespaceRegistry, ref: NamespaceRef, row: BranchRow, *, reader: str | None,
    explicit_reader: str | None,
) -> Attachment:
    """Attach a manager of ``ref`` to ``row``'s namespace actor with a fresh token, leaving it
    attached to ``ref`` too (a move's first half; a refusal raises before anything changed)."""
    config = attrs.evolve(ref.config, strategy=ref.status.strategy_config)  # set_strategy's, if it ran
    fresh = new_token()
    new_ref, resolved = await registry.attach(
        row, config, explicit_reader if explicit_reader is not None else reader, fresh,
        compiles_for_none=reader is None,
    )
    return Attachment(new_ref, fresh, resolved)


async def move(
    registry: NamespaceRegistry, ref: NamespaceRef, token: int, row: BranchRow, *, reader: str | None,
    explicit_reader: str | None,
) -> Attachment:
    """Attach to ``row``'s namespace actor, then detach ``token`` from ``ref`` (C2: a refusal
    raises before anything changed)."""
    attached = await attach_to(registry, ref, row, reader=reader, explicit_reader=explicit_reader)
    ref.tell(Detach(token))
    return attached


async def fork(ref: NamespaceRef, reader: str | None, name: str | None) -> tuple[str, BranchRow]:
    """Branch at the head (the namespace actor judges it first, C7, C12); the branch's name and row."""
    # The random part: concurrent forks (of other managers, or processes) in one millisecond differ.
    # No store read for it: on PostgreSQL the store's sequence is a round trip on the loop's thread,
    # waiting out any write in flight.
    name = name or f"fork-{_now_ms()}-{secrets.token_hex(4)}"
    row = await ref.ask(Fork(reader, name))
    return name, row


async def branch_at(
    registry: NamespaceRegistry, ref: NamespaceRef, slot: SlotCache, message_id: str, name: str | None,
) -> str:
    """Branch at ``message_id``'s sequence without moving; the branch's name."""
    message = slot.get(message_id)
    if message is None:
        raise MessageNotFoundError(f"no message {message_id!r} in slot {ref.config.slot!r} on branch "
                                   f"{ref.branch_name!r}")
    name = name or f"branch-{_now_ms()}-{message.sequence}-{secrets.token_hex(3)}"  # two at once differ, as fork's
    await registry.store_ref().ask(CreateBranch(name=name, from_branch=ref.branch_id, at_sequence=message.sequence))
    return name


async def derive(
    registry: NamespaceRegistry, ref: NamespaceRef, *, reader: str | None, branch: str,
    strategy: StrategyConfig | Strategy | None, at_sequence: int | None, model: Model | None, isolate: bool,
    auxiliary_views: tuple[str | None, ...],
) -> Child:
    """Make ``branch`` from ``ref``'s (the namespace actor judges and writes it, C11, C12) and
    attach a child to it."""
    row, child_reader = await ref.ask(Derive(reader, branch, strategy, at_sequence))
    config = attrs.evolve(
        ref.config, strategy=strategy if strategy is not None else ref.status.strategy_config,
        model=model if model is not None else ref.config.model,
    )
    token = new_token()
    child, resolved = await registry.attach(row, config, child_reader, token)
    derivation = Derivation(
        parent_branch=ref.branch_name, branch=branch, namespace=ref.namespace, at_sequence=at_sequence,
        reader=resolved, isolate=isolate, auxiliary_views=auxiliary_views,
        filtered=ref.config.view_filter is not None,
    )
    return Child(Attachment(child, token, resolved), derivation)
