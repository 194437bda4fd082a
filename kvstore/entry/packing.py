"""MessagePack, as walkv's entries are written (:mod:`kvstore.entry.codec`
states the format): which encoder runs, and a single put written out by hand.

Which encoder: msgspec's, when it is installed (the ``fast`` extra), else
msgpack's, which is always there and is also the decoder. Both write the same
bytes for every op (ints in their smallest form, bytes as bin, str as str,
lists and tuples as arrays; ``tests/test_codec_encoders.py`` holds them to
it); msgspec's takes a quarter of the time (a batch of 100,000 puts: 2.4 ms
instead of 9.6). The choice is made once, at import, as :mod:`wal.crc` makes
CRC-32C's.

A single put, the most common entry, is written out here instead
(:func:`put_bytes`): ``[[1, key, value]]`` is three fixed bytes and two bin
headers, and spelling them out costs a fraction of a call into either
encoder (``tests/test_batch.py`` holds the bytes equal to msgpack's at every
length boundary).
"""

from __future__ import annotations

import sys
from typing import Callable, Final

import msgpack

# msgpack's C Packer runs a pack of lists, ints and bytes without releasing the
# GIL and without calling back into Python, so one shared Packer is safe with
# the GIL. A free-threaded interpreter gets the stateless function.
if getattr(sys, "_is_gil_enabled", lambda: True)():
    msgpack_pack_ops = msgpack.Packer(use_bin_type=True, autoreset=True).pack
else:  # pragma: no cover - free-threaded CPython
    def msgpack_pack_ops(obj: object) -> bytes:
        return msgpack.packb(obj, use_bin_type=True)


def _fast_pack_ops() -> Callable[[object], bytes] | None:
    """msgspec's MessagePack encoder, when it is installed, else None. One
    encoder is shared: each call keeps its state on its own stack, so
    threads may share it."""
    try:
        import msgspec  # type: ignore[import-not-found,unused-ignore]  # optional: may not be installed
    except ImportError:
        return None
    encode: Callable[[object], bytes] = msgspec.msgpack.Encoder().encode
    return encode


pack_ops: Final[Callable[[object], bytes]] = _fast_pack_ops() or msgpack_pack_ops
"""A batch's payload from its ops (lists or tuples of the shapes
:mod:`kvstore.entry.codec` describes, already validated): msgspec's encoder when installed, else msgpack's."""


_BIN8: Final[tuple[bytes, ...]] = tuple(b"\xc4" + bytes((n,)) for n in range(0x100))
"""msgpack's bin8 headers, by length: most keys and values take one."""


def _bin_header(n: int) -> bytes:
    """msgpack's header of ``n`` bytes of binary (bin8, bin16 or bin32)."""
    if n < 0x100:
        return _BIN8[n]
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


# b"\x91\x93\x01" below: msgpack's [[1, ... (an array of one array of three, led by 1);
# a literal format is one allocation, compiled.

def put_bytes(key: bytes, value: bytes) -> bytes:
    """``pack_ops([[1, key, value]])``, written out."""
    return b"\x91\x93\x01%b%b%b%b" % (_bin_header(len(key)), key, _bin_header(len(value)), value)


def put_head(key: bytes, value_bytes: int) -> bytes:
    """:func:`put_bytes` of a value of ``value_bytes`` bytes, all but the value."""
    return b"\x91\x93\x01%b%b%b" % (_bin_header(len(key)), key, _bin_header(value_bytes))
