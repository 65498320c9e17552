"""The reader views a namespace actor keeps over its slot caches, and what it hands its strategy.

``ReaderViews`` is one epoch's set: the listing in the reader's view (shared with other
namespaces when one slot is read as is), the ``MessageView`` strategies read through (its guard
kills it once the epoch moves, C8), the raw-body lookup compiles judge bodies by, and compile's
memo. ``build_views`` makes a fresh set whenever the reader record, the strategy or the store's
reachability changes. ``flush_new`` and ``seen_now`` keep track of what the strategy has been
handed (A4). They stand apart from the machine as plain functions of the caches and the store:
nothing here decides when a view is rebuilt, only how.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..content import codec
from ..budget import Entry
from ..compile.pipeline import CompileMemo, ViewShare
from ..content.blocks import Message
from ..memos import IdMemo, LayeredMemo
from ..slots import SlotCache
from ..store.interface import StoreEngine
from ..strategies.base import Strategy
from ..content.tokens import TokenEstimator, estimate_message
from ..views import (
    FilteredListing,
    MergedListing,
    MessageView,
    ReaderListing,
    SlotListing,
    reader_view_of,
)
from . import states
from .context import ActorContext


@attrs.frozen
class ReaderViews:
    """One epoch's views. ``shared``: the listing is the slot's shared projection for the reader,
    whose ``ReaderCache`` they hold (``held``, with its slot cache) until ``release_views``."""

    listing: Any
    shared: bool
    view: MessageView
    raw_body: Callable[[str], Message | None]
    memo: CompileMemo
    held: tuple[SlotCache, ReaderCache] | None = None


def build_views(
    caches: Sequence[SlotCache], reader: str | None, *, view_filter: Any, estimator: TokenEstimator | None,
    guard: Callable[[], None], pricing: Callable[[], object],
) -> ReaderViews:
    """The views of ``caches`` (the own slot first) for ``reader``; ``guard`` runs before every read
    through the view, ``pricing`` says what the view's estimates are priced by. Views of one slot
    as it is hold its reader's cache: the caller gives them to ``release_views`` once done."""
    listings = [SlotListing(cache) for cache in caches]
    merged = listings[0] if len(listings) == 1 else MergedListing(listings)
    filtered = merged if view_filter is None else FilteredListing(merged, view_filter)
    shared = filtered is listings[0]
    copies: IdMemo[Message, Entry] | None = None
    own: ReaderCache | None = None
    if shared:  # one slot as it is: its reader's projection, and what compiles make in it, are shared
        own = reader_cache(caches[0], reader)
        listing: Any = own.listing
        memo = CompileMemo(own.compiled)
        copies = own.copies
    else:
        listing = ReaderListing(filtered, reader)
        memo = CompileMemo()  # a new memo: entries of another view never reused
    # Raw bodies are judged in the reader's view of the messages as stored, filter or not: with
    # a filter, one message at a time (compile's memo keeps each), not a second projection.
    raw_body: Callable[[str], Message | None]
    if view_filter is None:
        raw_body = MessageView(listing).get
    else:
        stored = MessageView(merged)
        raw_body = lambda message_id: (
            None if (found := stored.get(message_id)) is None else reader_view_of(found, reader)
        )
    view = MessageView(listing, guard=guard, estimate=estimate_message if estimator is None else _checked(estimator),
                       pricing=pricing, copies=copies)
    if own is None:
        return ReaderViews(listing, shared, view, raw_body, memo)
    own.users += 1  # last: nothing above raises, so every count taken is one ``release_views`` gives back
    return ReaderViews(listing, shared, view, raw_body, memo, (caches[0], own))


def release_views(views: ReaderViews) -> None:
    """``views`` are done with (rebuilt for a new epoch, or their actor stopped): their hold on the
    reader's cache goes, and the last hold's release drops that cache from its slot cache. Once per
    ``build_views``."""
    if views.held is not None:
        cache, own = views.held
        own.users -= 1
        if own.users <= 0 and cache.readers.get(own.listing.reader) is own:
            del cache.readers[own.listing.reader]
            if not cache.readers:  # no reader view left to share the slot's copy entries
                cache.copies.bound(0)


@attrs.define(eq=False)
class ReaderCache:
    """What every namespace actor reading one slot as ``reader`` (no filter) shares, kept on the
    slot cache while the views of one of them hold it (``build_views``): the reader's projection of
    the slot (each message projected once per slot and reader view, not once per namespace), each
    message's ``copy`` entry (``MessageView.copies``: the slot's own for a message the reader sees
    as stored) and what compiles make of its messages (P17).
    ``users``: the views holding it; the last to let go drops it (P17: shared while any of them
    holds it; a host that keeps opening and closing namespaces for new readers keeps none of theirs)."""

    listing: ReaderListing
    compiled: ViewShare
    copies: IdMemo[Message, Entry]
    users: int = 0


def reader_cache(cache: SlotCache, reader: str | None) -> ReaderCache:
    """``reader``'s cache of ``cache``, made on first use (kept while views hold it)."""
    found = cache.readers.get(reader)
    if not isinstance(found, ReaderCache):
        listing = ReaderListing(SlotListing(cache), reader)
        # A message holding no audience block is every reader's view of it as stored (the same
        # object): its copy entry is the slot's, one for every reader view.
        as_stored: Callable[[Message], bool] = lambda message: cache.held(message.sequence) is message
        copies: IdMemo[Message, Entry] = LayeredMemo(cache.copies, as_stored, lambda: cache.messages)
        found = cache.readers[reader] = ReaderCache(listing, ViewShare(listing.changes), copies)
    return found


def shared_reader_listing(cache: SlotCache, reader: str | None) -> ReaderListing:
    """``reader``'s view of one slot, shared by every namespace actor that reads just that slot as ``reader``."""
    return reader_cache(cache, reader).listing


def flush_new(strategy: Strategy, view: MessageView, seen: int, ctx: ActorContext) -> int:
    """Hand ``strategy`` each message after ``seen``, in the reader's view (A4); the new ``seen``."""
    pending = view.after(seen)
    for message in pending:
        strategy.on_new_message(message, ctx)
    return max(seen, pending[-1].sequence) if pending else seen


def seen_now(engine: StoreEngine, caches: Sequence[SlotCache]) -> int:
    """The sequence up to which a strategy that just read ``caches`` has been handed the view. On a
    shared store other processes append at any time: what the caches held when it read them, not
    the store's now."""
    if engine.shared:
        for cache in caches:  # each looked at in this step (no await since the strategy read them)
            cache.count()
        return max((cache.revision for cache in caches), default=0)
    return engine.last_sequence


def context_entries(engine: StoreEngine, namespace: str, branch_id: int) -> list[Message]:
    """The namespace's context log on the branch, decoded (what edits and removals propagate to, M5)."""
    items = engine.read_log(states.context_state(namespace), branch_id)
    return [codec.message_from_json(item.data, sequence=item.sequence, store=engine.data_path) for item in items]


def _checked(estimator: TokenEstimator) -> Callable[[Message], int]:
    """A host's estimator, its answers checked: a negative or non-int estimate would let any
    compile 'fit' (or fail deep inside a strategy), so it is refused where it was given."""
    estimate = estimator.estimate

    def checked(message: Message) -> int:
        tokens = estimate(message)
        if type(tokens) is not int or tokens < 0:
            raise TypeError(f"token_estimator {estimator!r} estimated message {message.id} at {tokens!r}: "
                            f"an estimate must be a non-negative int")
        return tokens

    return checked
