"""Media kept once, apart from the messages that hold it (docs/behaviours.md M4, M13).

``extract_blobs`` swaps each base64 media source (an image's, a document's, audio, video or a
generated image's; top level or nested in a tool_result) for a ``blob_ref`` naming its sha256,
media type and size, and returns each distinct blob to store once; ``resolve_blobs`` puts the
base64 back on read. Neither knows the storage form nor the store: the store hands in a lookup,
so the same walk serves the LMDB and PostgreSQL engines and verify.

Slot caches hold media as those references (M13): planning needs a medium's kind, size and token
figure, never its bytes. ``MediaCache`` reads the bytes where they leave the runtime (a compile's
messages and bodies, a message handed to a host), and keeps them, bounded, so a warm compile
reads none again.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..memos import IdMemo
from .blocks import MEDIA_TYPES, Block, Message, ToolResult
from .validation import decode_base64


def holds_media(blocks: Sequence[Block]) -> bool:
    """Whether ``blocks`` may hold media: a media block, or a tool result (which may nest one)."""
    for block in blocks:
        kind = type(block)
        if kind in _MEDIA or kind is ToolResult:
            return True
    return False


_MEDIA = frozenset(MEDIA_TYPES)  # a set lookup: this runs on every message written
_MEDIA_OR_RESULT = (*MEDIA_TYPES, ToolResult)


def extract_blobs(
    blocks: Sequence[Block], *, path: str = "content"
) -> tuple[tuple[Block, ...], list[tuple[str, bytes, str]]]:
    """Blocks with base64 media replaced by ``blob_ref`` sources, and each distinct blob (sha256 hex, bytes, media_type)."""
    blobs: dict[str, tuple[str, bytes, str]] = {}

    def swap(block: Block, where: str) -> Block:
        if isinstance(block, MEDIA_TYPES):
            source = block.source
            if source.get("type") != "base64":
                return block
            raw = decode_base64(source["data"], f"{where}.source.data")
            digest = hashlib.sha256(raw).hexdigest()
            blobs.setdefault(digest, (digest, raw, source["media_type"]))
            ref = {"type": "blob_ref", "sha256": digest, "media_type": source["media_type"], "size": len(raw)}
            return attrs.evolve(block, source=ref)
        if type(block) is ToolResult and not isinstance(block.content, str) and holds_media(block.content):
            nested = tuple(swap(b, f"{where}.content[{i}]") for i, b in enumerate(block.content))
            return attrs.evolve(block, content=nested)
        return block

    if not holds_media(blocks):
        return tuple(blocks), []
    out = tuple(swap(b, f"{path}[{i}]") for i, b in enumerate(blocks))
    return out, list(blobs.values())


def request_bytes(source: Mapping[str, Any]) -> int:
    """How many characters a media source's data takes in a request: its base64 text, or what a
    reference's bytes encode to (stored base64 is canonical, so the two agree); 0 for a URL or a
    reference stored before references carried their size."""
    if source.get("type") == "base64":
        data = source.get("data")
        return len(data) if isinstance(data, str) else 0
    size = source.get("size") if source.get("type") == "blob_ref" else None
    return 4 * -(-size // 3) if type(size) is int else 0


def _public_ref(source: Mapping[str, Any]) -> dict[str, Any]:
    # A missing blob's reference, as a host has always seen it: without the size the cache uses.
    return {"type": "blob_ref", "sha256": source["sha256"], "media_type": source["media_type"]}


def _filled(block: Block, text_of: Callable[[str], str | None]) -> Block:
    # A module-level helper, not a closure: a self-referencing closure is a reference cycle that
    # would keep ``text_of`` (and the read transaction it holds) alive until a GC pass.
    if isinstance(block, MEDIA_TYPES):
        source = block.source
        if source.get("type") != "blob_ref":
            return block
        data = text_of(source["sha256"])
        if data is None:  # block_to_api renders it as a notice rather than fail the whole read
            return block if "size" not in source else attrs.evolve(block, source=_public_ref(source))
        return attrs.evolve(
            block, source={"type": "base64", "media_type": source["media_type"], "data": data}
        )
    if type(block) is ToolResult and not isinstance(block.content, str) and holds_media(block.content):
        return attrs.evolve(block, content=tuple(_filled(b, text_of) for b in block.content))
    return block


def _text_reader(get_blob: Callable[[str], tuple[bytes, str] | None]) -> Callable[[str], str | None]:
    def text_of(sha256: str) -> str | None:
        found = get_blob(sha256)
        return None if found is None else base64.b64encode(found[0]).decode("ascii")
    return text_of


def resolve_blobs(
    blocks: Sequence[Block], get_blob: Callable[[str], tuple[bytes, str] | None]
) -> tuple[Block, ...]:
    """Blocks with ``blob_ref`` sources put back as base64; a missing blob leaves its ref in place."""
    if not holds_media(blocks):
        return tuple(blocks)
    text_of = _text_reader(get_blob)
    return tuple(_filled(b, text_of) for b in blocks)


def _sized(block: Block, get_blob: Callable[[str], tuple[bytes, str] | None]) -> Block:
    if isinstance(block, MEDIA_TYPES):
        source = block.source
        if source.get("type") != "blob_ref" or "size" in source:
            return block
        found = get_blob(source["sha256"])
        return block if found is None else attrs.evolve(block, source={**source, "size": len(found[0])})
    if type(block) is ToolResult and not isinstance(block.content, str) and holds_media(block.content):
        return attrs.evolve(block, content=tuple(_sized(b, get_blob) for b in block.content))
    return block


def sized_refs(
    blocks: Sequence[Block], get_blob: Callable[[str], tuple[bytes, str] | None]
) -> tuple[Block, ...]:
    """Blocks as a slot cache holds them: references as stored, each given its size if it was
    stored without one (by a ctxrt before M13: the blob is read once for it, as every read did then)."""
    if not holds_media(blocks):
        return tuple(blocks)
    return tuple(_sized(b, get_blob) for b in blocks)


MEDIA_CACHE_CHARS = 64 << 20  # base64 characters a MediaCache holds, its newest-used blobs


class MediaCache:
    """Blobs as base64 text by sha256, read from the store on first use and kept, the most
    recently used first to stay, up to ``limit`` characters (blobs differ a thousandfold in size,
    so the bound is in characters, not entries). Owned by a runtime's slot registry: one per
    runtime, never process-wide. ``reads`` counts the blobs read from the store (a test's seam:
    M13 says a ``compile_metadata`` reads none). A block or message once read back is kept by the
    held one's identity (``memos``), so reading it again costs a lookup, not a copy; those tables
    go whenever a text does (what they hold holds the texts)."""

    def __init__(self, get_blob: Callable[[str], tuple[bytes, str] | None], limit: int = MEDIA_CACHE_CHARS) -> None:
        self._get_blob = get_blob
        self._texts: dict[str, str] = {}
        self._chars = 0
        self.limit = limit
        self.reads = 0
        self._made: IdMemo[Block, Block] = IdMemo()
        self._messages: IdMemo[Message, Message] = IdMemo()

    def __len__(self) -> int:
        return len(self._texts)

    def text(self, sha256: str) -> str | None:
        """The blob's base64 text, or None if the store has no such blob."""
        found = self._texts.pop(sha256, None)
        if found is None:
            self.reads += 1
            blob = self._get_blob(sha256)
            if blob is None:
                return None
            found = base64.b64encode(blob[0]).decode("ascii")
            self._chars += len(found)
        self._texts[sha256] = found  # the newest used, last
        self._trim()
        return found

    def keep(self, held: Message, written: Message) -> None:
        """Keep what a host just wrote (``written``) as what ``held`` (the same message, as a cache
        holds it) and its blocks are read back as, and its media's base64 under their digests:
        the likeliest next read, and the host's own message is what it wrote."""
        self._messages.put(held, written)
        self._messages.bound(len(self._texts))
        self._keep(written.content, held.content)

    def _keep(self, blocks: Sequence[Block], held: Sequence[Block]) -> None:
        for block, ref in zip(blocks, held):
            if block is not ref:
                self._made.put(ref, block)
                self._made.bound(len(self._texts))
            if isinstance(block, MEDIA_TYPES) and block is not ref:
                source, digest = block.source, ref.source.get("sha256")  # type: ignore[union-attr]
                if digest is not None and digest not in self._texts and isinstance(source.get("data"), str):
                    self._texts[digest] = source["data"]
                    self._chars += len(source["data"])
            elif type(block) is ToolResult and type(ref) is ToolResult and block is not ref:
                if not isinstance(block.content, str) and not isinstance(ref.content, str):
                    self._keep(block.content, ref.content)
        self._trim()

    def _trim(self) -> None:
        while self._chars > self.limit and len(self._texts) > 1:
            oldest = next(iter(self._texts))
            self._chars -= len(self._texts.pop(oldest))
            self._made, self._messages = IdMemo(), IdMemo()

    def resolve(self, blocks: Sequence[Block]) -> tuple[Block, ...]:
        """``blocks`` with their references put back as base64 (``resolve_blobs``, through this cache);
        the same tuple when they hold none."""
        if not holds_media(blocks):
            return blocks if type(blocks) is tuple else tuple(blocks)
        return tuple(self._public(b) if isinstance(b, _MEDIA_OR_RESULT) else b for b in blocks)

    def _public(self, block: Block) -> Block:
        made = self._made.get(block)
        if made is None:
            made = self._made.put(block, _filled(block, self.text))
            self._made.bound(len(self._texts))
        return made

    def message(self, message: Message) -> Message:
        """``message`` as a host is handed it: its media as base64 (the same object if it holds none)."""
        made = self._messages.get(message)
        if made is None:
            content = message.content
            resolved = self.resolve(content)
            if resolved is content:
                return message
            made = self._messages.put(message, attrs.evolve(message, content=resolved))
            self._messages.bound(len(self._texts))
        return made
