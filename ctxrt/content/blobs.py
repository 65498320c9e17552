"""Media kept once, apart from the messages that hold it (docs/behaviours.md M4).

``extract_blobs`` swaps each base64 media source (an image's, a document's, audio, video or a
generated image's; top level or nested in a tool_result) for a ``blob_ref`` naming its sha256, and returns each distinct blob to store once;
``resolve_blobs`` puts the base64 back on read. Neither knows the storage form nor the store: the
store hands in a lookup, so the same walk serves the LMDB and PostgreSQL engines and verify.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Sequence

import attrs

from .blocks import MEDIA_TYPES, Block, ToolResult
from .validation import decode_base64


def _has_media(blocks: Sequence[Block]) -> bool:
    for block in blocks:
        kind = type(block)
        if kind in _MEDIA or kind is ToolResult:
            return True
    return False


_MEDIA = frozenset(MEDIA_TYPES)  # a set lookup: this runs on every message written


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
            ref = {"type": "blob_ref", "sha256": digest, "media_type": source["media_type"]}
            return attrs.evolve(block, source=ref)
        if type(block) is ToolResult and not isinstance(block.content, str) and _has_media(block.content):
            nested = tuple(swap(b, f"{where}.content[{i}]") for i, b in enumerate(block.content))
            return attrs.evolve(block, content=nested)
        return block

    if not _has_media(blocks):
        return tuple(blocks), []
    out = tuple(swap(b, f"{path}[{i}]") for i, b in enumerate(blocks))
    return out, list(blobs.values())


def _filled(block: Block, get_blob: Callable[[str], tuple[bytes, str] | None]) -> Block:
    # A module-level helper, not a closure: a self-referencing closure is a reference cycle that
    # would keep ``get_blob`` (and the read transaction it holds) alive until a GC pass.
    if isinstance(block, MEDIA_TYPES):
        source = block.source
        if source.get("type") != "blob_ref":
            return block
        found = get_blob(source["sha256"])
        if found is None:
            return block  # block_to_api renders it as a notice rather than fail the whole read
        data = base64.b64encode(found[0]).decode("ascii")
        return attrs.evolve(
            block, source={"type": "base64", "media_type": source["media_type"], "data": data}
        )
    if type(block) is ToolResult and not isinstance(block.content, str) and _has_media(block.content):
        return attrs.evolve(block, content=tuple(_filled(b, get_blob) for b in block.content))
    return block


def resolve_blobs(
    blocks: Sequence[Block], get_blob: Callable[[str], tuple[bytes, str] | None]
) -> tuple[Block, ...]:
    """Blocks with ``blob_ref`` sources put back as base64; a missing blob leaves its ref in place."""
    if not _has_media(blocks):
        return tuple(blocks)
    return tuple(_filled(b, get_blob) for b in blocks)

