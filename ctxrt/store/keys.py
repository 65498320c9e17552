"""Key codecs and sub-database names. Pure and property-tested.

All integers are big-endian, so byte order is numeric order and one cursor range scan walks
a (state, branch) prefix in ordinal then sequence order.
"""

from __future__ import annotations

import struct

DB_META = b"meta"
DB_BRANCHES = b"branches"  # branch id (u32) -> branch row JSON
DB_BRANCH_NAMES = b"branch_names"  # name utf-8 -> branch id (u32)
DB_STATES = b"states"  # state name utf-8 -> state number (u32) + kind byte
# (state u32, branch u32, ordinal u64, seq u64) -> origin seq u64 + item bytes; the ordinal
# HEAD_ORDINAL holds the state's versioned heads on that branch instead. Heads sit right after
# the newest items in key order, so an append dirties one leaf page of one table.
DB_ITEMS = b"items"
DB_BLOBS = b"blobs"  # sha-256 (32 bytes) -> media type + NUL + bytes
ALL_DBS = (DB_META, DB_BRANCHES, DB_BRANCH_NAMES, DB_STATES, DB_ITEMS, DB_BLOBS)

META_FORMAT = b"format"
META_NEXT_BRANCH = b"next_branch"
META_NEXT_STATE = b"next_state"
META_MOVING = b"moving"  # while a store moves to format 3: (table number u8, last key sealed)

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
PREFIX = struct.Struct(">II")  # (state, branch)
ITEM_KEY = struct.Struct(">IIQQ")  # (state, branch, ordinal, seq)
ITEM_PREFIX = struct.Struct(">IIQ")  # (state, branch, ordinal)

MAX_U32 = (1 << 32) - 1
MAX_U64 = (1 << 64) - 1
HEAD_ORDINAL = MAX_U64  # the ordinal under which a (state, branch) keeps its versioned heads


def encode_u32(value: int) -> bytes:
    return U32.pack(value)


def decode_u32(data: bytes) -> int:
    value: int = U32.unpack(data)[0]
    return value


def encode_u64(value: int) -> bytes:
    return U64.pack(value)


def decode_u64(data: bytes) -> int:
    value: int = U64.unpack(data)[0]
    return value


def state_branch_prefix(state: int, branch: int) -> bytes:
    return PREFIX.pack(state, branch)


def head_key(state: int, branch: int, seq: int) -> bytes:
    return ITEM_KEY.pack(state, branch, HEAD_ORDINAL, seq)


def head_prefix(state: int, branch: int) -> bytes:
    return ITEM_PREFIX.pack(state, branch, HEAD_ORDINAL)


def decode_head_key(key: bytes) -> tuple[int, int, int]:
    state, branch, _, seq = ITEM_KEY.unpack(key)
    return state, branch, seq


def item_key(state: int, branch: int, ordinal: int, seq: int) -> bytes:
    return ITEM_KEY.pack(state, branch, ordinal, seq)


def decode_item_key(key: bytes) -> tuple[int, int, int, int]:
    return ITEM_KEY.unpack(key)


def item_prefix(state: int, branch: int, ordinal: int) -> bytes:
    return ITEM_PREFIX.pack(state, branch, ordinal)
