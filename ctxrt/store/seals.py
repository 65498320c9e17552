"""Record seals (LMDB store format 3): every record's value ends in 4 bytes, the CRC-32 of its key
and value, so a changed bit anywhere in a record's key or value is found when the record is read
(K7). Pure: no backend here.

A CRC-32 (zlib's: reflected, final XOR) followed by its own little-endian bytes always checks to
one constant, so a seal is checked with one pass over the sealed bytes and no slicing. CRC-32
finds every flipped bit, and every burst of flipped bits up to 32 long.
"""

from __future__ import annotations

import struct
import zlib

SIZE = 4
_SEAL = struct.Struct("<I")
_RESIDUE = 0x2144DF1C  # zlib.crc32(data + crc32(data) as 4 little-endian bytes), for any data

_crc32 = zlib.crc32


def seal(key: bytes, value: bytes) -> bytes:
    """``value`` followed by its seal: the CRC-32 of ``key`` and ``value``."""
    return value + _SEAL.pack(_crc32(value, _crc32(key)))


def intact(key: bytes, sealed: bytes) -> bool:
    """Whether ``sealed`` ends in the seal of ``key`` and the bytes before it."""
    return len(sealed) >= SIZE and _crc32(sealed, _crc32(key)) == _RESIDUE
