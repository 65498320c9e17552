"""The Strategy protocol, the context a strategy is handed, units of compression work, and
capabilities (docs/api.md, Writing a strategy).

A strategy plans; it never awaits. The namespace actor calls it in its own task, hands it a
``StrategyContext`` whose writes are buffered and committed by the actor after the call
returns (marks first, in the same transaction), and makes the model calls a strategy's units
ask for in a child task, outside its mailbox order. So everything here is plain synchronous
code, testable without trio or a store (``ctxrt.testing.PlainContext``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import attrs

from .. import checks
from ..budget import Entry, non_negative_int
from ..content.blocks import Message, sequence_key
from ..memos import IdMemo

if TYPE_CHECKING:
    from ..budget import Budget, PreviewResult
    from ..errors import ModelError
    from ..models.model_types import ModelRequest, ModelResponse
    from ..views import MessageView, Window


class StrategyContext(Protocol):
    """A strategy's handle on its namespace for one view epoch.

    Reads see what is committed. Writes (``set_value``, ``append_log``, ``append_context``,
    ``mark_compression_read``) are buffered and committed by the namespace actor when the call
    that made them returns, together, the narrowing floor first; if that commit fails, the actor
    reloads the strategy with ``initialize`` from what is stored. ``writes`` is False where
    nothing will be committed (a dry run, a read-only runtime).
    """

    @property
    def namespace(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def reader(self) -> str | None: ...
    @property
    def view(self) -> MessageView: ...
    @property
    def system_prompt(self) -> str | None: ...
    @property
    def tools(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def writes(self) -> bool: ...

    def now(self) -> float:
        """The runtime's clock (trio's), for backoffs and holds."""
        ...

    def hold_floor(self) -> int | None:
        """The lowest sequence held from compression (it and everything after stay raw), or None."""
        ...

    def get_value(self, name: str, default: Any = None) -> Any: ...
    def read_log(self, name: str) -> list[Any]: ...
    def set_value(self, name: str, value: Any) -> None: ...
    def append_log(self, name: str, value: Any) -> None: ...

    def append_context(self, entry: Entry) -> None:
        """Append ``entry`` to the namespace's context log; edits then reach its ``copy`` sources (M5).

        Raises ``MalformedContentError`` for an entry that carries an audience (docs/behaviours.md B3).
        """
        ...

    def mark_compression_read(self, sequence: int) -> None:
        """Record that compression may read messages up to ``sequence``: committed before anything
        this call wrote, and before any request a unit makes (docs/behaviours.md D2). Never lowers
        the record; a namespace with no reader records nothing (D7)."""
        ...


@attrs.frozen
class SelectOptions:
    """What ``select`` is told besides the view and budget. ``dry_run`` commits nothing."""

    dry_run: bool = False
    context: StrategyContext | None = None
    # Refuse (OverBudgetError) rather than leave out history no shown summary covers.
    strict: bool = False


@attrs.frozen
class Unit:
    """One unit of compression work a strategy planned (``next_unit``).

    ``reaches`` is the newest store sequence its request reads: the actor raises the narrowing
    floor to it before ``request_for`` builds the request (D2). ``key`` names what it compresses
    (for logs and quarantine); ``work`` is the strategy's own description of it.
    """

    key: str
    reaches: int
    work: Any = attrs.field(default=None, eq=False)


@attrs.frozen
class UnitOutcome:
    """What a strategy made of a unit's reply, for the unit's trace span and the quarantine alarm
    (docs/behaviours.md T12, T13): the rung its request was made at (``half``: which half of a
    split), the ``result`` ("summary", "half", "fallback", "failure", "transient"), why the reply
    was not taken (``failure``), the rung tried next, the unit's counted failures and whether
    they quarantined it."""

    rung: str
    result: str
    half: int | None = None
    failure: str | None = None
    next_rung: str | None = None
    attempts: int = 0
    quarantined: bool = False


@attrs.frozen
class RenderStats:
    """What a strategy's last compile showed and left out (tokens are estimates; docs/api.md, Host controls).

    ``dropped_ids``: messages the compile left out that no summary it shows covers (compression
    debt that didn't fit), with ``dropped_reason``; a windowing strategy's older history, left out
    by design, is not counted. ``pending_units``: compression work queued when it compiled.
    """

    head_tokens: int = 0
    summary_tokens: int = 0
    middle_raw_tokens: int = 0
    tail_tokens: int = 0
    summaries: tuple[tuple[int, int], ...] = ()  # (level, how many shown)
    pending_units: int = 0
    dropped_ids: Sequence[str] = ()  # a tuple, or a lazy sequence equal to one
    dropped_reason: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.head_tokens + self.summary_tokens + self.middle_raw_tokens + self.tail_tokens


@attrs.frozen
class Backlog:
    """Compression work a strategy has queued: units, and the tokens of the messages they cover."""

    units: int = 0
    tokens: int = 0


class Strategy:
    """Base of every strategy (docs/api.md, Writing a strategy). The namespace actor owns one instance and calls it only
    from its own task.

    ``marks_compression_reads`` declares that the strategy marks what its compression reads
    (through ``mark_compression_read`` or a unit's ``reaches``) before reading it, or makes no
    such read. A manager with a reader refuses a strategy that doesn't (docs/behaviours.md D6).
    ``auto_tick``: the actor drains its units in the background as messages arrive (T8).
    ``keeps_memory``: it keeps what its compression built (summaries, chunks) in the actor's
    memory, so on a store other processes write (PostgreSQL) one process at a time serves the
    namespace: an open in another process raises ``ConfigConflictError`` while it does.
    """

    name: str = "strategy"
    marks_compression_reads: bool = False
    auto_tick: bool = False
    keeps_memory: bool = False

    def initialize(self, ctx: StrategyContext) -> None:
        """Load persisted state for ``ctx``'s branch; called at start, after a view change, and
        after a failed commit of this strategy's writes."""

    def on_new_message(self, message: Message, ctx: StrategyContext) -> None:
        """Called once per new message, with the reader's view of it (never for one it sees nothing of)."""

    def select(self, view: MessageView, budget: Budget, options: SelectOptions) -> list[Entry]:
        raise NotImplementedError

    def preview(self, view: MessageView, budget: Budget, options: SelectOptions) -> PreviewResult | None:
        return None

    def next_unit(self, ctx: StrategyContext) -> Unit | None:
        """The next unit of compression work, or None. May buffer bookkeeping writes (closed chunks)."""
        return None

    def request_for(self, unit: Unit, ctx: StrategyContext) -> ModelRequest:
        """The model request of ``unit``; called once the floor covers ``unit.reaches``."""
        raise NotImplementedError

    def apply_unit(self, unit: Unit, outcome: ModelResponse | ModelError, ctx: StrategyContext) -> bool:
        """Take a unit's reply (or the error its call raised); True if that was progress."""
        return False

    def is_ready(self) -> bool:
        return True

    def wake_at(self) -> float | None:
        """A clock time before which the drain shouldn't try again (a backoff), or None."""
        return None

    def unit_outcome(self, unit: Unit) -> UnitOutcome | None:
        """What the last ``apply_unit`` made of ``unit``'s reply, or None if the strategy doesn't say."""
        return None

    def quarantined(self) -> list[str]:
        """Keys of units that failed too often to be tried again without ``retry_quarantined``."""
        return []

    def retry_quarantined(self, ctx: StrategyContext) -> list[str]:
        """Put the quarantined units back in the queue (their failure counts reset); their keys."""
        return []

    def render_stats(self) -> RenderStats | None:
        """What the last ``select`` that wasn't a dry run showed and left out, or None."""
        return None

    def backlog(self, ctx: StrategyContext) -> Backlog:
        """The compression work queued now."""
        return Backlog()


# Validators of the bundled configs' fields: a bad value is refused where the config is made,
# naming the field.


def optional_text(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: None or a string."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{attribute.name} must be None or a string, got {value!r}")


def text(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a string that isn't empty (a model's or a participant's name)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {checks.shown(value)}")


def flag(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: True or False (a truthy string is a mistake, not a yes)."""
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be True or False, got {checks.shown(value)}")


def at_least(minimum: int) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: an int (not a bool) of at least ``minimum``."""

    def validate(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer of at least {minimum}, got {checks.shown(value)}")

    return validate


def optional_count(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: None or a non-negative int."""
    if value is not None:
        non_negative_int(_, attribute, value)


def optional_at_least(minimum: int) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: None or an int (not a bool) of at least ``minimum``."""
    check = at_least(minimum)

    def validate(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(_, attribute, value)

    return validate


def ratio(low: float, high: float) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: a real number (not a bool) in ``[low, high]``."""

    def validate(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be a number from {low} to {high}, got {checks.shown(value)}")

    return validate


def one_of(*choices: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: one of ``choices``."""

    def validate(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(map(repr, choices))}, got {checks.shown(value)}")

    return validate


def optional_callable(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: None or a callable."""
    if value is not None and not callable(value):
        raise ValueError(f"{attribute.name} must be None or a function, got {checks.shown(value)}")


@attrs.frozen
class Pin:
    """A range of messages kept raw (``level`` None) or shown at summary level ``level`` at most,
    whatever the budget pressure (docs/api.md, Host controls)."""

    id: str
    first_id: str
    last_id: str
    first_sequence: int
    last_sequence: int
    name: str | None = None
    level: int | None = None
    created_ms: int = 0


@runtime_checkable
class Pinning(Protocol):
    """A strategy that keeps pins (``ContextManager.pin_range``, ``unpin``, ``list_pins``)."""

    def pin_range(
        self, ctx: StrategyContext, first_id: str, last_id: str, *, name: str | None, level: int | None
    ) -> Pin:
        """Pin ``first_id``..``last_id``; raises ``MessageNotFoundError`` naming an id not in the
        view, ``ValueError`` when ``first_id`` comes after ``last_id``."""
        ...

    def unpin(self, ctx: StrategyContext, pin_id: str) -> bool: ...

    def list_pins(self) -> list[Pin]: ...


class StrategyConfig(Protocol):
    """What ``Runtime.open(strategy=...)``, ``derive`` and ``set_strategy`` take: a config whose
    ``create()`` makes the strategy (the bundled ones are frozen attrs classes, docs/api.md,
    Strategies). Those calls also take a ``Strategy`` instance as is."""

    def create(self) -> Strategy: ...


@runtime_checkable
class SummaryReader(Protocol):
    """A strategy that keeps summaries a manager can read (T6)."""

    def search_summaries(
        self, ctx: StrategyContext, *, text: str | None, regex: str | None, levels: Sequence[int] | None,
        limit: int, include_merged: bool,
    ) -> list[Any]: ...

    def get_summary(self, ctx: StrategyContext, summary_id: str) -> Any: ...

    def get_summaries_in_range(
        self, ctx: StrategyContext, *, from_ms: int | None, to_ms: int | None, level: int | None
    ) -> list[Any]: ...


@runtime_checkable
class HeadWindowReset(Protocol):
    """A strategy whose head window can restart at a topic-transition message (T6)."""

    transition_participant: str  # who the transition message is from

    def transition_unit(self, ctx: StrategyContext) -> Unit:
        """The unit whose reply becomes the transition summary (when the host gives no text)."""
        ...

    def transition_content(
        self, ctx: StrategyContext, text: str | None, outcome: ModelResponse | ModelError | None
    ) -> list[dict[str, Any]]:
        """The transition message's content from the host's ``text`` or the unit's ``outcome``.

        Raises ``ModelError`` when the outcome makes no summary.
        """
        ...

    def start_head_window(self, ctx: StrategyContext, message_id: str) -> None:
        """The head window starts at ``message_id`` from now on."""
        ...


class RawEntries:
    """The newest messages of a view with their cumulative token counts, kept across compiles and
    read back only as far as a budget needs (docs/behaviours.md L7); their ``copy`` entries are
    made only for the suffix a compile takes (``suffix``) and for appends (every suffix holds
    them): reading back doubles what it holds, so most of what it holds past the budget is never
    shown. The entries from ``_made`` on are all made, so a warm compile's suffix checks none.

    A warm compile extends them with what was appended (handing back the same ``Entry`` objects,
    which compile's memo keys on); a view edited or cut since replaces just the messages that
    changed (``MessageView.changes``), and starts over only when those can't be named.
    """

    def __init__(self) -> None:
        self._stamp: object = None
        self.messages: list[Message] = []
        self._entries: list[Entry | None] = []  # each message's entry, once a suffix needed it
        self._made = 0  # every entry from here on is made: a warm compile's suffix checks none of them
        self.totals: list[int] = [0]  # totals[i] = tokens of messages[:i]
        self.complete = False  # the messages are the whole view
        self._newest = -1  # sequence of the newest message taken
        self._pricing: object = None  # the view's pricing the totals were made with
        self._copies: IdMemo[Message, Entry] = IdMemo()  # the view's, as of the last ``cover``

    def cover(self, view: MessageView, tokens: int) -> None:
        """Hold the newest messages until they cost more than ``tokens`` or are all of the view.
        Decodes older messages only when the newest held fit in ``tokens``."""
        self._copies = view.copies
        window = view.window(1)
        if view.pricing != self._pricing or (window.stamp != self._stamp and not self._patched(view, window)):
            self._stamp, self.messages, self._entries, self.totals, self._made = window.stamp, [], [], [0], 0
            self.complete, self._newest, self._pricing = False, -1, view.pricing
            self._prepend(window.messages, window.complete, view)
        elif window.messages and window.messages[-1].sequence > self._newest:
            messages = window.messages
            fresh = messages[bisect_right(messages, self._newest, key=sequence_key) :]
            self.messages += fresh
            self._entries += [raw_entry(message, self._copies) for message in fresh]  # every suffix holds them
            total = self.totals[-1]
            for message in fresh:
                total += view.estimate_tokens(message)
                self.totals.append(total)
            self._newest = messages[-1].sequence
        while self.totals[-1] <= tokens and not self.complete:
            window = view.window(2 * len(self.messages) + 64)
            if window.stamp != self._stamp:
                return self.cover(view, tokens)  # rewritten as it read back: start over
            messages = window.messages
            oldest = self._oldest()
            self._prepend(messages[: bisect_left(messages, oldest, key=sequence_key)] if oldest is not None else messages,
                          window.complete, view)
        self._trim(tokens)

    def suffix(self, start: int) -> list[Entry]:
        """The ``copy`` entries of ``messages[start:]``, each made once (from the view's ``copies``)."""
        entries, messages, copies = self._entries, self.messages, self._copies
        for index in range(start, self._made):
            if entries[index] is None:
                entries[index] = raw_entry(messages[index], copies)
        self._made = min(self._made, start)
        return cast("list[Entry]", entries[start:])

    def _oldest(self) -> int | None:
        return self.messages[0].sequence if self.messages else None

    def _patched(self, view: MessageView, window: Window) -> bool:
        """Replace the messages changed since they were taken; False if the changes can't be named
        or ``window`` no longer holds them (the caller starts over)."""
        oldest = self._oldest()
        changes = None if oldest is None else view.changes(self._stamp)
        if changes is None or oldest is None:
            return False
        held = window.messages
        for low, high in changes:
            # Messages that are all of the view cover everything before them too: a message hidden
            # from the reader until then may have just come into view there.
            low, high = (low if self.complete else max(low, oldest)), min(high, self._newest)
            if low > high:
                continue  # appends not taken yet come after; an older change, outside what is held
            if not window.complete and (not held or held[0].sequence > low):
                return False
            fresh = held[bisect_left(held, low, key=sequence_key) : bisect_right(held, high, key=sequence_key)]
            start = bisect_left(self.messages, low, key=sequence_key)
            stop = bisect_right(self.messages, high, key=sequence_key)
            self.messages[start:stop] = fresh
            if self._made >= stop:  # below what the last suffixes held: made when a suffix needs them
                self._entries[start:stop] = [None] * len(fresh)
                self._made += len(fresh) - (stop - start)
            else:  # in what the last suffix held: made now, as appends are, so the next suffix checks none
                self._entries[start:stop] = [raw_entry(message, self._copies) for message in fresh]
                self._made = min(self._made, start)
            totals = self.totals
            made = list(accumulate((view.estimate_tokens(message) for message in fresh), initial=totals[start]))
            shift = made[-1] - totals[stop]
            self.totals = [*totals[:start], *made, *(total + shift for total in totals[stop + 1 :])]
            oldest = self._oldest()
            if oldest is None:
                return False
        self._stamp = window.stamp
        return True

    def _prepend(self, messages: Sequence[Message], complete: bool, view: MessageView) -> None:
        costs = [view.estimate_tokens(message) for message in messages]
        costs += [b - a for a, b in zip(self.totals, self.totals[1:])]
        self.messages = [*messages, *self.messages]
        self._entries = [*([None] * len(messages)), *self._entries]
        self._made += len(messages)
        self.totals = [0, *accumulate(costs)]
        if messages:
            self._newest = max(self._newest, messages[-1].sequence)
        self.complete = complete

    def _trim(self, tokens: int) -> None:
        """Drop messages far older than ``tokens`` reaches, once they are most of what is held (a
        long session appends to these for as long as the actor lives)."""
        start = self.suffix_start(tokens)
        if start > 4096 and start > 2 * (len(self.messages) - start):
            keep = max(0, start - 64)
            self.messages, self._entries = self.messages[keep:], self._entries[keep:]
            self._made = max(0, self._made - keep)
            base = self.totals[keep]
            self.totals = [total - base for total in self.totals[keep:]]
            self.complete = False

    def suffix_start(self, usable: int) -> int:
        """The start of the longest suffix of ``messages`` whose tokens fit ``usable``."""
        return bisect_left(self.totals, self.totals[-1] - usable)


def raw_entry(message: Message, copies: IdMemo[Message, Entry]) -> Entry:
    """A ``copy`` entry carrying ``message`` as it is in the view, the same entry for the same
    message from the view's ``copies`` (``MessageView.copies``): every namespace reading one slot's
    reader view hands compile the same entry, so what compile makes of it is made once (P16)."""
    entry = copies.get(message)
    if entry is None:
        entry = copies.put(message, copy_entry(message))
    return entry


def copy_entry(message: Message) -> Entry:
    """A new ``copy`` entry carrying ``message`` (``raw_entry`` hands back one a view holds)."""
    return Entry(message.participant, message.content, (message.id,), "copy")
