"""Slot caches: a slot's materialised messages on one branch, shared by a whole runtime.

In a writing runtime the store actor publishes every commit; a cache extends itself on appends
(O(1) each) and rebuilds its list once on an edit or a removal, so a read never reloads a slot
because a sibling appended (spec/slot-cache.md S1, S2, S4). A read-only runtime has no events:
it revalidates at each read from the slot's head (S3). ``CTXRT_CACHE_DIAG=1`` logs every reload
with its reason and every tail fill with its count (S5).

A cache holds media by reference (M13): what it decodes or is handed by an append keeps each
medium's sha256, media type and size, never its bytes; the registry's ``MediaCache`` reads them
back where a message leaves for a host (``SlotCache.public``, the events) or a compile.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from . import checks
from .channel_entries import index_entries
from .content import codec, validation
from .content.blobs import MediaCache, extract_blobs, holds_media, resolve_blobs, sized_refs
from .content.blocks import Block, Message, holds_audience, sequence_key
from .errors import MalformedContentError
from .events import Added, Edited, MessageEvent, Removed
from .memos import IdMemo
from .store.interface import StoreEngine
from .store.records import IndexEntry, ItemAppended, ItemEdited, ItemsRemoved, LogHead, Operation

logger = logging.getLogger("ctxrt.slots")
FULL = sys.maxsize  # a count that asks for every message


def _diagnostics() -> bool:
    return os.environ.get("CTXRT_CACHE_DIAG") == "1"


@attrs.frozen
class Appended:
    """What a writer attaches to its append so caches need not decode it."""

    participant: str
    content: tuple[Block, ...]  # blobs resolved: as the host wrote it
    metadata: Any
    timestamp_ms: int
    caused_by: tuple[str, ...]
    # As a slot cache holds it: media as references (M13); the content itself when it holds none.
    stored: tuple[Block, ...] = attrs.field(
        default=attrs.Factory(lambda self: self.content, takes_self=True), kw_only=True
    )

    def message(self, sequence: int) -> Message:
        """The message this append made, committed at ``sequence`` (its id), as a host is handed it."""
        return Message(str(sequence), sequence, self.participant, self.content, self.metadata, self.timestamp_ms,
                       self.caused_by)

    def held(self, sequence: int) -> Message:
        """The message this append made, as a slot cache holds it (its media as references)."""
        return Message(str(sequence), sequence, self.participant, self.stored, self.metadata, self.timestamp_ms,
                       self.caused_by)

    # Written with the item as its store flag, so a cache knows without reading every message
    # whether a reader's view must be projected (LogHead.flagged).
    audience: bool = attrs.field(
        kw_only=True, default=attrs.Factory(lambda self: holds_audience(self.content), takes_self=True)
    )
    # The entries the item files in its slot's channel index, in its own append or edit (K10).
    index: tuple[IndexEntry, ...] = attrs.field(
        kw_only=True, default=attrs.Factory(
            lambda self: index_entries(self.content, self.metadata, self.timestamp_ms), takes_self=True)
    )
    # Both are derived from the fields above: ``prepare_append`` passes what it knows without
    # looking (a string's one block has no audience; no metadata names no channel).


def prepare_append(
    participant: Any, content: Any, metadata: Any = None, caused_by: Any = (), timestamp_ms: Any = None,
) -> tuple[bytes, list[tuple[str, bytes, str]], Appended]:
    """Validate a new message and make what its append carries: stored bytes, blobs, decoded form.

    Raises ``MalformedContentError`` naming the place (M6, B1).
    """
    participant = validation.validate_participant(participant)
    blocks = validation.blocks_from_content(content)
    metadata = None if metadata is None else validation.validate_metadata(metadata)
    causes = () if type(caused_by) is tuple and not caused_by else _validate_caused_by(caused_by)
    timestamp = int(time.time() * 1000) if timestamp_ms is None else validation.validate_timestamp_ms(timestamp_ms)
    # A string is one text block: no media to take out.
    stored_blocks, blobs = (blocks, []) if type(content) is str else extract_blobs(blocks)
    data = codec.message_to_json(participant, stored_blocks, metadata, timestamp, causes)
    return data, blobs, Appended(
        participant, blocks, metadata, timestamp, causes, stored=stored_blocks,
        audience=False if type(content) is str else holds_audience(blocks),
        index=() if metadata is None else index_entries(blocks, metadata, timestamp),
    )


def _validate_caused_by(caused_by: Any) -> tuple[str, ...]:
    if isinstance(caused_by, (str, bytes)) or not isinstance(caused_by, Sequence):
        raise MalformedContentError("caused_by", f"must be a sequence of message ids, not {type(caused_by).__name__}")
    for index, item in enumerate(caused_by):
        if not isinstance(item, str) or not item:
            raise MalformedContentError(f"caused_by[{index}]", f"must be a non-empty message id string, not {item!r}")
        checks.text(item, f"caused_by[{index}]")  # a lone surrogate can't be stored
    return tuple(caused_by)



MIN_LOAD = 64  # the fewest older messages one load decodes
Change = tuple[int, int]  # the sequences (first, last) whose messages an edit or removal changed


class ChangeLog:
    """What a listing's last rewrites changed, by rewrite number: a consumer holding what it read at
    rewrite ``n`` asks for the changes since and patches just those, instead of starting over
    (an edit of one message costs one message, not the history). A change that can't be named (a
    reload) is None: the consumer starts over."""

    KEPT = 32  # a consumer further behind starts over

    def __init__(self, count: int = 0) -> None:
        self.count = count  # rewrites so far
        self._recent: list[Change | None] = []

    def add(self, change: Change | None) -> None:
        self.count += 1
        self._recent.append(change)
        if len(self._recent) > self.KEPT:
            del self._recent[0]

    def since(self, count: int) -> list[Change] | None:
        """The changes after rewrite ``count``, oldest first; None if any is unknown."""
        behind = self.count - count
        if behind < 0 or behind > len(self._recent):
            return None
        changes = self._recent[len(self._recent) - behind:]
        return None if None in changes else changes  # type: ignore[return-value]  # None was ruled out
# The operations that move a log's head (they carry the revision they followed). A tuple: an
# ``X | Y`` union is a new object at every isinstance, on the path of every append.
_LOG_WRITES = (ItemAppended, ItemEdited, ItemsRemoved)


@attrs.frozen
class SlotFigures:
    """A slot cache at one moment, as a copy (``SlotCache.figures``): which slot, how much of it is
    held, and what reading it has cost so far."""

    state: str
    branch_id: int
    length: int  # messages in the slot
    held: int  # of them, decoded and held
    revision: int
    rewrites: int
    may_hold_audience: bool
    stale: bool
    reloads: int
    tail_fills: int
    looks: int
    decoded: int


Seed = tuple[list[Message], LogHead, bool, bool, IdMemo[Message, Any]]
"""What a new branch's slot cache starts from (``SlotRegistry._seed``): its parent's held messages up
to the fork, the head, whether they may hold audience and media, and their copy entries."""


class SlotCache:
    """One (branch, slot)'s messages, in slot order (which is sequence order), decoded from the
    newest back only as far as something has asked (docs/behaviours.md L7).

    ``messages`` holds the newest ``len(messages)`` of the slot's ``length`` messages: it grows in
    place on appends and is replaced by a new list when older messages are decoded or on any other
    change; ``rewrites`` counts the changes other than appends and older loads, so a derived
    listing can tell "only appended since" from "rewritten since" in O(1). Older messages are read
    as of ``revision`` (a snapshot: nothing below the held suffix changes without a rewrite).
    """

    def __init__(
        self, engine: StoreEngine, state: str, branch_id: int, *, live: bool,
        seed: Seed | None = None, steps: Callable[[], int] | None = None,
        media: MediaCache | None = None,
    ) -> None:
        self.engine = engine
        # Where its messages' media bytes are read, when they leave the runtime (M13): the
        # registry's, shared by the runtime's caches; a cache made alone has its own.
        self.media = media_of(engine) if media is None else media
        self.state = state
        self.branch_id = branch_id
        self.live = live  # kept current by commit events (a writing runtime's cache)
        # On a shared store: how many task steps the loop has run. Reads within one step (no await
        # between them: a whole compile) are one snapshot, so the head is asked once per step.
        self._steps = steps
        self._looked_at = -1
        self.messages: list[Message] = []
        self._last_held = -1  # where ``_held`` last found one: readers ask in order, so next is likely
        self.length = 0
        self.changes = ChangeLog()
        self.revision = 0
        self.rewrite_revision = 0
        self.may_hold_audience = False
        # Whether a held message may hold media (a reference to read back for a host): until one
        # does, the public reads hand out the held messages themselves, whatever the slot's length.
        self.may_hold_media = False
        # Who hears of every append, after the commit (``listen``): the namespaces whose strategy
        # drains in the background. So an append costs O(1) plus those, however many namespaces
        # read the slot.
        self.listeners: list[Callable[[int], None]] = []
        self.users = 0  # namespace actors reading it; the registry drops it at zero
        self.stale = False  # a commit event failed to apply: reload at the next read, ignore events till then
        self.reloads = 0
        self.tail_fills = 0
        self.looks = 0  # head reads before a read (a read-only runtime's, a shared store's)
        self.decoded = 0  # messages decoded from the store so far (L7 is measured with it)
        # Per reader view, what every namespace reading this slot alone so shares (its projection,
        # its copy entries, what compiles make of them: ``namespace.views.ReaderCache``), kept while
        # a namespace's views hold it.
        self.readers: dict[str | None, object] = {}
        # What channel reads keep of this slot (``channels.ChannelReads``), made at the first.
        self.channel_reads: object = None
        # The copy entries of messages as stored, for every reader view above that sees one so (a
        # message no audience block touches is the same object in each): made once per message,
        # bounded by the messages held.
        self.copies: IdMemo[Message, Any] = IdMemo()
        if seed is None:
            self._reload("first read")
        else:
            # A new branch's slot as its parent's cache holds it up to the fork: no decode at all,
            # and the same messages' copy entries, so a fork's first compile makes none of them.
            self.messages, head, self.may_hold_audience, self.may_hold_media, self.copies = seed
            self.length = head.length
            self.revision, self.rewrite_revision = head.revision, head.rewrite_revision
            self.may_hold_audience = self.may_hold_audience or head.flagged is not False
            self.changes = ChangeLog(1)

    def figures(self) -> SlotFigures:
        """What the cache holds and has cost, now, as a frozen copy."""
        return SlotFigures(self.state, self.branch_id, self.length, len(self.messages), self.revision, self.rewrites,
                           self.may_hold_audience, self.stale, self.reloads, self.tail_fills, self.looks, self.decoded)

    @property
    def rewrites(self) -> int:
        """How many times the slot changed other than by appends and older loads."""
        return self.changes.count

    @property
    def complete(self) -> bool:
        """Whether every message of the slot is decoded."""
        return len(self.messages) == self.length

    @property
    def hears_every_write(self) -> bool:
        """Whether this process's commit events are every write to the slot (a writing runtime on a
        store no other process writes); else readers look at the head."""
        return self.live and not self.engine.shared

    # -- loading ----------------------------------------------------------------------------

    def decode(self, data: bytes, sequence: int) -> Message:
        """An item of this slot decoded as the cache holds it (media as references, M13), counted,
        and noted if it holds media (so ``public`` reads its bytes back for a host)."""
        self.decoded += 1
        message = decode_held(self.engine, data, sequence)
        if not self.may_hold_media and holds_media(message.content):
            self.may_hold_media = True
        return message

    def public(self, message: Message) -> Message:
        """``message`` (held, or decoded by this cache) as a host is handed it: its media read back
        as base64 (M13)."""
        return self.media.message(message) if self.may_hold_media else message

    def public_all(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """``public`` of each of ``messages`` (held ones), in O(1) but the copy while none holds media."""
        return tuple(map(self.media.message, messages)) if self.may_hold_media else tuple(messages)

    def held(self, sequence: int) -> Message | None:
        """The message appended at ``sequence`` if this cache holds it decoded (no store read)."""
        index = self._held(sequence)
        return None if index is None else self.messages[index]

    def as_of(self, revision: int, start: int = 0) -> list[Message]:
        """The slot's messages from index ``start`` as of ``revision`` (decoded afresh, not kept),
        as a host is handed them (their media as base64)."""
        items = self.engine.read_items(self.state, self.branch_id, at=revision, start=start)
        return [decode_stored(self.engine, item.data, item.sequence) for item in items]

    def head_now(self) -> LogHead:
        """The slot's head as the store has it now (the cache is left as it is)."""
        return self.engine.read_head(self.state, self.branch_id)

    def _reload(self, reason: str) -> None:
        """Start over from the slot's head: nothing is decoded until a read asks for it."""
        head = self.engine.read_head(self.state, self.branch_id)
        self.messages = []
        self.length = head.length
        self.revision, self.rewrite_revision = head.revision, head.rewrite_revision
        # The head says whether any item was written holding an audience (unknown for a head an
        # older ctxrt wrote: then assume one may).
        self.may_hold_audience = self.may_hold_audience or head.flagged is not False
        self.changes.add(None)
        self.reloads += 1
        if _diagnostics():
            logger.info("reload %s on branch %d: %s (%d messages)", self.state, self.branch_id, reason, self.length)

    def _load_older(self, count: int) -> None:
        """Decode up to ``count`` messages older than the held ones, as of ``revision``."""
        stop = self.length - len(self.messages)
        start = max(0, stop - count)
        items = self.engine.read_items(self.state, self.branch_id, at=self.revision, start=start, stop=stop)
        older = [self.decode(item.data, item.sequence) for item in items]
        if not self.may_hold_audience and holds_audience([b for m in older for b in m.content]):
            # An item stored without its flag (written below the slot layer): project from now on.
            self.may_hold_audience = True
            self.changes.add(None)
        self.messages = older + self.messages

    def _fresh(self) -> None:
        """Before a read: a stale cache reloads; a read-only one revalidates against the head (S3)."""
        if self.stale:
            self._reload("a commit event failed to apply")
            self.stale = False
        elif not self.live:  # no events: ask the head
            self._revalidate()
        elif not self.hears_every_write:  # events, but not every write's: ask the head once per task step
            step = None if self._steps is None else self._steps()
            if step is None or step != self._looked_at:
                self._revalidate()
                self._looked_at = -1 if step is None else step  # after it succeeded: a failed look is retried

    def suffix(self, count: int) -> list[Message]:
        """At least the newest ``count`` messages (all of them if the slot holds fewer), oldest
        first: a list the cache owns, immutable by contract. Decodes what isn't held yet, at least
        doubling what is, so reading back through a slot costs each message once."""
        self._fresh()
        return self._hold(count)

    def _hold(self, count: int) -> list[Message]:
        """``suffix`` without looking at the head again (one look per public read)."""
        missing = min(count, self.length) - len(self.messages)
        if missing > 0:
            self._load_older(max(missing, len(self.messages), MIN_LOAD))
        return self.messages

    def current(self) -> list[Message]:
        """Every message now (decoding whatever isn't held yet)."""
        return self.suffix(FULL)

    def newest_first(self) -> Iterator[Message]:
        """Every message, newest first, decoding older ones only as the walk reaches them. Read it
        without awaiting in between: the walk follows the cache as it was when it started."""
        self._fresh()  # once: later steps read back as of the same revision, so nothing repeats
        messages, index = self.messages, len(self.messages) - 1
        while True:
            while index >= 0:
                yield messages[index]
                index -= 1
            if len(messages) >= self.length:
                return
            held = len(messages)
            messages = self._hold(held + 1)
            index = len(messages) - held - 1

    def count(self) -> int:
        """How many messages the slot holds, decoding none."""
        self._fresh()
        return self.length

    def window(self, offset: int, limit: int) -> tuple[list[Message], int, int]:
        """(``limit`` messages from index ``offset`` (negative counts from the end), that start
        index, the slot's length), from one look at the head, decoding back to the start only."""
        self._fresh()
        total = self.length
        start = max(0, total + offset) if offset < 0 else min(offset, total)
        stop = min(total, start + max(0, limit))
        if start >= stop:
            return [], start, total
        messages = self._hold(total - start)
        held_from = total - len(messages)
        return messages[start - held_from : stop - held_from], start, total

    def _revalidate(self) -> None:
        self.looks += 1
        head, items = self.engine.read_tail(self.state, self.branch_id, self.length)  # one snapshot
        if head.revision == self.revision:
            return
        if head.rewrite_revision != self.rewrite_revision:
            reason = "rewritten since"
        elif head.length < self.length:
            reason = "length mismatch"
        else:
            # Only appends since: the new tail, read with the head (one range scan).
            for item in items:
                message = self.decode(item.data, item.sequence)
                self._push(message, holds_audience(message.content))
            self.revision = head.revision
            self.tail_fills += 1
            # Another process's appends are heard of here only: a namespace that drains in the
            # background wakes for them as for this process's own (T8). An append of this process
            # taken in so is not heard again at its event (``apply``).
            for item in items:
                for notify in self.listeners:
                    self._notify(notify, item.sequence)
            if _diagnostics():
                logger.info("tail fill %s on branch %d: %d appended", self.state, self.branch_id, len(items))
            return
        self._reload(reason)

    # -- events (writing runtime) -----------------------------------------------------------

    def _push(self, message: Message, audience: bool) -> None:
        self.messages.append(message)
        self.length += 1
        if audience:
            self.may_hold_audience = True

    def apply(self, operation: Operation) -> None:
        """Bring the cache up to date with one committed operation on its (branch, slot).

        Runs after the commit (L6): a subscriber that raises is logged and the others still run;
        if the cache itself can't take the operation, it reloads from the store at its next read.
        """
        # An append a look at the head took in before its event came: its listeners heard of it then.
        heard = isinstance(operation, ItemAppended) and not self.stale and operation.sequence <= self.revision
        if not self.stale:  # else the next read reloads everything, this operation included
            try:
                self._apply(operation)
            except Exception:
                self.stale = True
                logger.exception("slot cache %s on branch %d couldn't apply a commit; it reloads at its next read",
                                 self.state, self.branch_id)
        if isinstance(operation, ItemAppended) and not heard:
            # Heard of by a stale cache's listeners too: a namespace that drains in the background
            # reads (and so reloads) only once it hears of an append, and a cache gone stale
            # (it read a head ahead of a commit's event, on a shared store) left it idle for good.
            for notify in self.listeners:
                self._notify(notify, operation.sequence)

    def _apply(self, operation: Operation) -> None:
        if not isinstance(operation, _LOG_WRITES):
            return
        if operation.prior is not None and operation.sequence <= self.revision:
            return  # a look at the head (a shared store's, before a read) took it in before its event came
        if operation.prior is not None and operation.prior != self.revision:
            self.stale = True  # it missed a write (another process's, on a shared store): reload at the next read
        elif isinstance(operation, ItemAppended):
            self._appended(operation)
        elif isinstance(operation, ItemEdited):
            self._edited(operation)
        else:
            self._removed(operation)

    def _appended(self, operation: ItemAppended) -> None:
        appended: Appended | None = operation.attachment
        if appended is None:
            message = self.decode(operation.data, operation.sequence)
            audience = holds_audience(message.content)
        else:
            message = appended.held(operation.sequence)
            audience = appended.audience
            if message.content is not appended.content:
                self.media.keep(message, appended.message(operation.sequence))
                self.may_hold_media = True
        self._push(message, audience)
        self.revision = operation.sequence

    def _edited(self, operation: ItemEdited) -> None:
        self.revision = self.rewrite_revision = operation.sequence
        appended = operation.attachment
        content = appended.stored if appended is not None else self.decode(
            operation.data, operation.item_sequence
        ).content
        index = self._held(operation.item_sequence)
        if index is not None:
            messages = list(self.messages)
            messages[index] = attrs.evolve(messages[index], content=content)
            self.messages = messages
        elif self.complete or (self.messages and operation.item_sequence >= self.messages[0].sequence):
            self.stale = True  # reloaded at the next read, after the whole batch is published
            return
        # else older than the held suffix: it is read, edited, as of the new revision
        self.may_hold_audience = self.may_hold_audience or holds_audience(content)
        self.may_hold_media = self.may_hold_media or holds_media(content)
        self.changes.add((operation.item_sequence, operation.item_sequence))

    def _removed(self, operation: ItemsRemoved) -> None:
        self.revision = self.rewrite_revision = operation.sequence
        low, high = operation.from_sequence, operation.to_sequence
        self.messages = [m for m in self.messages if not low <= m.sequence <= high]
        self.length -= operation.count
        if self.length < len(self.messages):
            self.stale = True  # reloaded at the next read, after the whole batch is published
            return
        self.changes.add((low, high))

    def listen(self, notify: Callable[[int], None]) -> None:
        """Call ``notify`` with the sequence of every message appended from now on, after its commit
        (once, however often it is given), whether or not the cache could take it in."""
        if notify not in self.listeners:
            self.listeners.append(notify)

    def unlisten(self, notify: Callable[[int], None]) -> None:
        if notify in self.listeners:
            self.listeners.remove(notify)

    def _notify(self, notify: Callable[[int], None], sequence: int) -> None:
        try:
            notify(sequence)
        except Exception:  # one subscriber's failure is its own: the commit stands, the others hear of it
            logger.exception("a subscriber of slot %s on branch %d failed on message %d",
                             self.state, self.branch_id, sequence)

    # -- reads ------------------------------------------------------------------------------

    def _held(self, sequence: int) -> int | None:
        """The index in ``messages`` of the message appended at ``sequence``, if held."""
        messages = self.messages
        index = self._last_held + 1
        if not (index < len(messages) and messages[index].sequence == sequence):
            index = bisect_left(messages, sequence, key=sequence_key)
            if not (index < len(messages) and messages[index].sequence == sequence):
                return None
        self._last_held = index
        return index

    def get(self, message_id: str) -> Message | None:
        """The message, as held (media as references: ``public`` for a host), or None: read from
        the store, not decoded into the cache, when it is older than what the cache holds."""
        sequence = parse_id(message_id)
        if sequence is None:
            return None
        self._fresh()
        if self.complete or (self.messages and sequence >= self.messages[0].sequence):
            index = self._held(sequence)
            return None if index is None else self.messages[index]
        item = self.engine.read_item(self.state, self.branch_id, sequence, at=self.revision)
        return None if item is None else self.decode(item.data, item.sequence)


def decode_stored(engine: StoreEngine, data: bytes, sequence: int) -> Message:
    """A stored message decoded with its blobs put back, as a host is handed it (blobs are
    content-addressed and never change, so they are read apart from the item)."""
    message = codec.message_from_json(data, sequence=sequence, store=engine.data_path)
    resolved = resolve_blobs(message.content, engine.read_blob)
    return message if resolved is message.content else attrs.evolve(message, content=resolved)


def media_of(engine: StoreEngine) -> MediaCache:
    """A media cache reading ``engine``'s blobs (through its ``read_blob`` as it is at each read)."""
    return MediaCache(lambda sha256: engine.read_blob(sha256))


def decode_held(engine: StoreEngine, data: bytes, sequence: int) -> Message:
    """A stored message decoded as a slot cache holds it: its media left as references (M13)."""
    message = codec.message_from_json(data, sequence=sequence, store=engine.data_path)
    sized = sized_refs(message.content, engine.read_blob)
    return message if sized is message.content else attrs.evolve(message, content=sized)



def parse_id(message_id: object) -> int | None:
    """A message id's sequence, or None if it isn't one: an id is its sequence in decimal, with no
    leading zero ("002" names nothing, or it would be a second name of "2")."""
    if (isinstance(message_id, str) and message_id.isdigit() and message_id.isascii() and len(message_id) <= 20
            and message_id[0] != "0"):
        return int(message_id)  # a sequence is at most 20 digits (a u64); a longer "id" names nothing
    return None


class SlotRegistry:
    """Every slot cache of one runtime, keyed by (state, branch id), fed by commit events."""

    def __init__(self, engine: StoreEngine, *, live: bool, steps: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.live = live
        self.steps = steps  # the loop's task-step count, for caches of a shared store (SlotCache)
        self._caches: dict[tuple[str, int], SlotCache] = {}
        self._watchers: dict[tuple[str, int], list[Callable[[MessageEvent], None]]] = {}
        self._ends: dict[Callable[[MessageEvent], None], Callable[[], None]] = {}
        self.media = media_of(engine)  # every cache's: blobs are the whole store's

    def __len__(self) -> int:
        return len(self._caches)

    def caches(self) -> list[SlotCache]:
        """Every cache held now."""
        return list(self._caches.values())

    def cache(self, state: str, branch_id: int) -> SlotCache:
        key = (state, branch_id)
        cache = self._caches.get(key)
        if cache is None:
            seed = self._seed(state, branch_id)
            cache = self._caches[key] = SlotCache(self.engine, state, branch_id, live=self.live, seed=seed,
                                                  steps=self.steps, media=self.media)
        return cache

    def acquire(self, state: str, branch_id: int) -> SlotCache:
        """The (branch, slot)'s cache for a namespace actor that reads it until ``release``."""
        cache = self.cache(state, branch_id)
        cache.users += 1
        return cache

    def release(self, cache: SlotCache) -> None:
        """An actor stopped reading ``cache``; the last one out drops it (a fork's slot isn't kept forever)."""
        cache.users -= 1
        if cache.users <= 0 and self._caches.get((cache.state, cache.branch_id)) is cache:
            del self._caches[(cache.state, cache.branch_id)]

    def _seed(self, state: str, branch_id: int) -> Seed | None:
        """What the parent's cache holds up to the fork, when it is exactly this branch's newest."""
        if not self.live or self.engine.shared:  # on a shared store the parent's cache may be behind
            return None
        row = self.engine.branch_by_id(branch_id)
        if row.parent is None or row.fork_sequence is None:
            return None
        parent = self._caches.get((state, row.parent))
        if parent is None or parent.stale or parent.rewrite_revision > row.fork_sequence:
            return None  # rewritten since the fork: what it holds is not what the child saw
        head = self.engine.read_head(state, branch_id)
        if head.revision > row.fork_sequence:
            return None  # the branch wrote its own since
        held = bisect_right(parent.messages, row.fork_sequence, key=sequence_key)
        before = parent.length - len(parent.messages)  # messages older than the parent holds
        if before + held != head.length:
            return None
        taken = parent.messages[:held]
        # The parent's entries, bounded by what the fork holds as any table is where it grows
        # (``memos.outgrown``): a branch at an old message keeps no entry of the messages past it
        # alive. A whole dict copied and cut only when outgrown: a fork at the head cuts none.
        copies = parent.copies.copy()
        copies.bound(held, taken)
        return taken, head, parent.may_hold_audience, parent.may_hold_media, copies

    def drop_branch(self, branch_id: int) -> None:
        """A deleted branch's caches go (their actors were retired; a later branch of the name is another)."""
        for key in [key for key in self._caches if key[1] == branch_id]:
            del self._caches[key]
        for key in [key for key in self._watchers if key[1] == branch_id]:  # their subscriptions end
            for deliver in self._watchers.pop(key):
                end = self._ends.pop(deliver, None)
                if end is not None:
                    end()

    def publish(self, operations: Sequence[Operation]) -> None:
        for operation in operations:
            state = getattr(operation, "state", None)
            if state is None:
                continue
            key = (state, operation.branch)  # type: ignore[union-attr]  # an operation with a state has a branch
            cache = self._caches.get(key)
            watchers = self._watchers.get(key)
            if not watchers:
                if cache is not None:
                    cache.apply(operation)
                continue
            # What an edit replaced is known only before the cache applies it; the rest after, so the
            # event carries the message the cache holds (decoded once), its media read back (M13).
            previous = cache.held(operation.item_sequence) if isinstance(operation, ItemEdited) and cache else None
            if cache is not None:
                cache.apply(operation)
            try:
                event = self._event(operation, cache, previous)
            except Exception:
                logger.exception("couldn't describe commit %r to the subscribers of %s", operation, key)
                event = None
            if event is None:
                continue
            for deliver in list(watchers):
                try:
                    deliver(event)
                except Exception:  # one subscriber's failure is its own
                    logger.exception("a subscriber of %s failed", key)

    def watch(
        self, state: str, branch_id: int, deliver: Callable[[MessageEvent], None], end: Callable[[], None],
    ) -> Callable[[], None]:
        """Call ``deliver`` with every change committed to (state, branch) from now on, in commit
        order, from the store actor's publish step (a writing runtime), and ``end`` if the branch
        is deleted; returns the unwatch."""
        watchers = self._watchers.setdefault((state, branch_id), [])
        watchers.append(deliver)
        self._ends[deliver] = end

        def unwatch() -> None:
            if deliver in watchers:
                watchers.remove(deliver)
            self._ends.pop(deliver, None)

        return unwatch

    def _event(self, operation: Operation, cache: SlotCache | None, previous: Message | None) -> MessageEvent | None:
        engine = self.engine
        if isinstance(operation, ItemAppended | ItemEdited):
            sequence = operation.sequence if isinstance(operation, ItemAppended) else operation.item_sequence
            appended: Appended | None = operation.attachment
            held = cache.held(sequence) if cache is not None and not cache.stale else None
            if held is None and isinstance(operation, ItemAppended) and appended is not None:
                return Added(appended.message(sequence))  # the host's own content: nothing to read
            message = decode_stored(engine, operation.data, sequence) if held is None else self.media.message(held)
            if isinstance(operation, ItemAppended):
                return Added(message)
            return Edited(message, None if previous is None else self.media.message(previous))
        if isinstance(operation, ItemsRemoved):
            # The ids removed: the visible items in the range just before the removal.
            items = engine.read_items_appended(operation.state, operation.branch, operation.from_sequence,
                                               operation.to_sequence, at=operation.sequence - 1)
            return Removed(tuple(str(item.sequence) for item in items)) if items else None
        return None
