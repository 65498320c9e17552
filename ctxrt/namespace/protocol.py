"""What managers and the drain send a namespace actor and what it answers (the handle that sends it is
``ctxrt.namespace.ref``).

Commands are frozen attrs classes named as imperatives; each that a manager sends carries the
reader that manager compiles for, so the actor checks it in mailbox order (docs/behaviours.md C8).
Plain data with no event loop, as the machine that handles them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..compile.result import CompileResult
from ..compile.injections import Injection, MessageInjection
from ..budget import Budget, PreviewResult
from ..content.blocks import Block, Message
from ..errors import ManagerClosedError
from ..asks import Ask
from ..slots import SlotCache, SlotFigures
from ..store.protocol import AppendItem, Blob
from ..store.records import BranchRow, ItemAppended

if TYPE_CHECKING:
    from ..models.model import Model
    from ..strategies.base import Pin, RenderStats, Strategy, StrategyConfig
    from ..strategies.settings import ContextSettings
    from ..content.tokens import TokenEstimator


@attrs.frozen
class NamespaceConfig:
    """What the first open of a (branch, namespace) starts its actor with."""

    namespace: str
    slot: str
    auxiliary: tuple[str, ...]
    view_filter: Callable[[Message], bool] | None
    strategy: StrategyConfig | Strategy
    model: Model | None
    token_estimator: TokenEstimator | None = None  # None: the plain estimate (tokens.estimate_message)
    ledger: bool | None = None  # turn the request ledger on or off (Q2); None: as the branch records


# -- commands from managers ----------------------------------------------------------------


@attrs.frozen
class Attach(Ask["Attached"]):
    """Attach manager ``token``: claim an unclaimed namespace for ``reader`` (C1, C6, C13)."""

    token: int
    reader: str | None
    config: NamespaceConfig
    explicit_strategy: bool = False
    compiles_for_none: bool = False  # a manager moving here that compiles for no reader (C7)


@attrs.frozen
class Detach(Ask[None]):
    """Manager ``token`` left (closed or moved); the actor stops with its last manager."""

    token: int


@attrs.frozen
class Compile(Ask[CompileResult]):
    reader: str | None
    budget: Budget | None  # None: the namespace's default budget (its live settings), else Budget()
    injections: tuple[Injection, ...]
    message_injections: tuple[MessageInjection, ...]
    dry_run: bool
    strict: bool = False


@attrs.frozen
class Preview(Ask[PreviewResult | None]):
    reader: str | None
    budget: Budget
    message_injections: tuple[MessageInjection, ...]


@attrs.frozen
class Tick(Ask[bool]):
    """One unit of strategy work; answered True if it made progress."""

    reader: str | None


@attrs.frozen
class CheckReady(Ask[bool]):
    reader: str | None


@attrs.frozen
class Edit(Ask[None]):
    """Replace message ``message_id``'s content (validated by the manager), refusing a narrowing (D1-D5)."""

    reader: str | None
    message_id: str
    content: tuple[Block, ...]  # as the reader will see it, blobs resolved
    stored: tuple[Block, ...]  # as stored, media by reference
    blobs: tuple[Blob, ...]


@attrs.frozen
class Remove(Ask[None]):
    """Remove messages ``first_id`` through ``last_id`` with their context-log copies (D1: never refused)."""

    first_id: str
    last_id: str


@attrs.frozen
class SetStrategy(Ask[None]):
    reader: str | None
    config: StrategyConfig | Strategy


@attrs.frozen
class UpdateContextSettings(Ask["ContextSettings"]):
    """Change live settings (checked by the manager: ``settings.checked``), stored and in force
    from the next command on (T14)."""

    reader: str | None
    changes: Mapping[str, Any]


@attrs.frozen
class Fork(Ask[BranchRow]):
    """Check that manager ``reader`` may branch (C1, C3, C7, C12), then make branch ``name`` at the head."""

    reader: str | None
    name: str


@attrs.frozen
class Derive(Ask[tuple[BranchRow, str | None]]):
    """Check a derive (C11, C12, D6), then make branch ``name`` recording the child's reader (R2)."""

    reader: str | None
    name: str
    strategy: StrategyConfig | Strategy | None
    at_sequence: int | None


@attrs.frozen
class SearchSummaries:
    text: str | None
    regex: str | None
    levels: tuple[int, ...] | None
    limit: int
    include_merged: bool


@attrs.frozen
class GetSummary:
    summary_id: str


@attrs.frozen
class SummariesInRange:
    from_ms: int | None
    to_ms: int | None
    level: int | None


SummaryQuery = SearchSummaries | GetSummary | SummariesInRange


@attrs.frozen
class QuerySummaries(Ask[Any]):
    reader: str | None
    query: SummaryQuery


@attrs.frozen
class ResetHeadWindow(Ask[str]):
    reader: str | None
    text: str | None


@attrs.frozen
class AppendAndHold(Ask[ItemAppended]):
    """Append ``append`` (made and checked by the manager) and hold its message from compression
    until released or ``timeout_s`` (T5). Held from before it is written: no unit planned while
    it commits reads it. ``writes`` commit before it in its batch (``add_message(host_state=)``, M9)."""

    append: AppendItem
    timeout_s: float | None
    writes: tuple[Any, ...] = ()


@attrs.frozen
class Hold(Ask[None]):
    message_ids: tuple[str, ...]
    timeout_s: float | None


@attrs.frozen
class Release(Ask[None]):
    message_ids: tuple[str, ...]


@attrs.frozen
class SetSystemPrompt(Ask[None]):
    text: str


@attrs.frozen
class SetTools(Ask[None]):
    tools: tuple[Mapping[str, Any], ...]


@attrs.frozen
class ReportHealth(Ask["NamespaceHealth"]):
    pass


@attrs.frozen
class RetryQuarantined(Ask[list[str]]):
    reader: str | None


@attrs.frozen
class PinRange(Ask["Pin"]):
    reader: str | None
    first_id: str
    last_id: str
    name: str | None
    level: int | None


@attrs.frozen
class Unpin(Ask[bool]):
    reader: str | None
    pin_id: str


@attrs.frozen
class ListPins(Ask[list["Pin"]]):
    reader: str | None


@attrs.frozen
class Inspect(Ask["NamespaceSnapshot"]):
    """For tests and debugging (``ContextManager.inspect``): a snapshot of the actor's state."""


# The small reads a host's UI makes (M10), and what they answer.


@attrs.frozen
class CompressionHold:
    """A message held from compression (T5): its id, and the seconds left until the hold lapses
    (None: until released)."""

    message_id: str
    expires_in_s: float | None


@attrs.frozen
class CompileMetadata:
    """What a compile at a budget would show, found without building it: the stored messages it
    shows raw (in order), the summaries, and the estimated tokens of each (plain estimates)."""

    message_ids: tuple[str, ...]
    summary_ids: tuple[str, ...]
    raw_tokens: int
    summary_tokens: int

    @property
    def estimated_tokens(self) -> int:
        return self.raw_tokens + self.summary_tokens


@attrs.frozen
class ReportHolds(Ask[list[CompressionHold]]):
    pass


@attrs.frozen
class FindMaxSummaryLevel(Ask[int]):
    reader: str | None


@attrs.frozen
class SetAnchor(Ask[None]):
    reader: str | None
    message_id: str


@attrs.frozen
class ReportAnchor(Ask["str | None"]):
    reader: str | None


@attrs.frozen
class DescribeCompile(Ask[CompileMetadata]):
    reader: str | None
    budget: Budget


# -- messages from the runtime and the actor's own children --------------------------------


@attrs.frozen
class UnitDone(Ask[None]):
    """A model call came back (a response or the error it raised; or the ``StoreUnavailableError``
    that kept its images from being read back, so it was never sent), for the view epoch it began in."""

    epoch: int
    unit: Any
    outcome: Any
    latency_ms: float | None = None  # how long the model call took (the request ledger's, Q6)


@attrs.frozen
class SlotAppended:
    """From the store actor's publish step, while the strategy drains in the background: a
    message was appended to the own slot."""

    sequence: int


@attrs.frozen
class Retire:
    """Stop now (the branch was deleted, the runtime closes): what is queued is refused with ``error()``."""

    error: Callable[[], BaseException]


# -- results ---------------------------------------------------------------------------------


@attrs.frozen
class Attached:
    reader: str | None


@attrs.frozen
class NamespaceHealth:
    """What ``ContextManager.health()`` reports of the namespace actor."""

    namespace: str
    branch: str
    reader: str | None
    managers: int
    mailbox_depth: int
    in_flight_model_calls: int
    ready: bool
    quarantined: tuple[str, ...]
    narrowing_floor: int
    strategy_error: str | None
    pending_units: int = 0  # compression work queued
    compression_debt_tokens: int = 0  # tokens of the messages that work covers
    last_compile_ms: float | None = None  # how long the actor's last compile took
    waiting_for: str | None = None  # the store, while unreachable: its error (the strategy starts again after)


@attrs.frozen
class ListingFigures:
    """The reader listing a namespace's strategy reads, at one moment: its reader, whether it is the
    projection of one slot shared by every namespace reading that slot as that reader, and how many
    messages it has projected into the reader's view so far."""

    reader: str | None
    shared: bool
    slot: str  # the own slot, whose shared projection it is when ``shared``
    projected: int


@attrs.frozen
class NamespaceSnapshot:
    """The actor's state at one turn, for tests and debugging: copies, never the live objects (a
    strategy copied with its containers, the slot caches' and the listing's figures)."""

    strategy: Strategy
    record: Any
    floor: int
    epoch: int
    caches: tuple[SlotFigures, ...]
    reader_listing: ListingFigures
    model_timeout_s: float


@attrs.frozen
class NamespaceStatus:
    """What the actor publishes for readers outside its turns, replaced whole, never changed."""

    strategy_config: StrategyConfig | Strategy  # set_strategy's, once it ran
    slot: SlotCache | None = None  # the own slot's cache, for reads of messages as stored
    model_calls: int = 0  # model calls out
    render_stats: RenderStats | None = None  # what the last compile showed and left out
    settings: ContextSettings | None = None  # the live settings in force (T14)
    stats_compile_id: str | None = None  # the compile ``render_stats`` reports (its provenance's compile_id)


# -- the handle ------------------------------------------------------------------------------


class ActorRetired(Exception):
    """The actor stopped (its last manager left) before this attach got its turn; the caller
    starts a fresh one. Never reaches the public API."""


def refusal_for(error: Callable[[], BaseException], command: Any) -> BaseException:
    """The error ``command`` meets from an actor stopped with ``error``: an attach retries on a
    fresh actor (``ActorRetired``); anything else belonged to a manager the stop closed."""
    made = error()
    if isinstance(made, ActorRetired) and not isinstance(command, Attach):
        return stopped()
    return made


def stopped() -> BaseException:
    """The error a manager's command meets once its actor has stopped."""
    return ManagerClosedError("the namespace actor has stopped")

