"""The data every contender gets: 16-byte keys, 100-byte values and payloads.

Values are slices of one random buffer, so they do not compress (LevelDB and
RocksDB compress blocks with Snappy; constant values would flatter them), and
are deterministic within a run so that every contender writes the same bytes.
"""

from __future__ import annotations

import os
import random
import struct

KEY_BYTES = 16
VALUE_BYTES = 100

_POOL = os.urandom(1 << 16)
_POOL_SPAN = len(_POOL) - VALUE_BYTES
_KEY = struct.Struct(">QQ")


def key(i: int, prefix: int = 0) -> bytes:
    """The ``i``-th 16-byte key of stream ``prefix`` (big-endian, so keys of
    one stream sort in ``i`` order)."""
    return _KEY.pack(prefix, i)


def value(i: int) -> bytes:
    """A 100-byte, incompressible value, the same for the same ``i``."""
    start = (i * 7919) % _POOL_SPAN
    return _POOL[start : start + VALUE_BYTES]


def payload(i: int = 0) -> bytes:
    """A 100-byte log payload (the log workloads' unit of data)."""
    return value(i)


def keys(n: int, prefix: int = 0) -> list[bytes]:
    return [_KEY.pack(prefix, i) for i in range(n)]


def items(n: int, prefix: int = 0) -> list[tuple[bytes, bytes]]:
    return [(key(i, prefix), value(i)) for i in range(n)]


def shuffled(n: int) -> list[int]:
    """0..n-1 in one fixed random order (the same for every contender)."""
    order = list(range(n))
    random.Random(1).shuffle(order)
    return order


def payloads(n: int) -> list[bytes]:
    return [value(i) for i in range(n)]
