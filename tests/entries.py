"""Log entry payloads for tests that write a store's log directly
(the format is :mod:`kvstore.entry.codec`'s)."""

from __future__ import annotations

from kvstore.entry.codec import OP_DELETE, OP_DELETE_RANGE, OP_PUT, encode


def encode_put(key: bytes, value: bytes) -> bytes:
    """The payload of a batch holding one put."""
    return encode([[OP_PUT, key, value]])


def encode_delete(key: bytes) -> bytes:
    return encode([[OP_DELETE, key]])


def encode_delete_range(start: bytes, end: bytes) -> bytes:
    return encode([[OP_DELETE_RANGE, start, end]])
