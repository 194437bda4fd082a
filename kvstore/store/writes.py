"""The write API of an open store (:class:`kvstore.KVStore`): puts,
deletes, range deletes, atomic batches, pre-encoded batches and conditional
writes. Every write is one log entry (one LSN) submitted through one path,
``_append(payload, ops)``: the operations travel with their payload through
the log to the state machine (``docs/architecture.md``, "The path of a put").
Durability on return is the store's sync mode (:mod:`kvstore.store.store`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from kvstore.entry.codec import (
    LARGE_VALUE_BYTES,
    MAX_KEY_BYTES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    _pack,
    as_bytes,
    check_key,
    check_range,
    check_value,
    parse,
    put_payload,
)
from kvstore.state.machine import Ops
from kvstore.store import txn
from kvstore.store.write_batch import WriteBatch
from wal.errors import ClosedError, ReadOnlyError
from wal.segment import Payload


class StoreWrites:
    """The writes of :class:`kvstore.KVStore` (a base class of it)."""

    path: str
    readonly: bool
    max_value_bytes: int
    _max_payload: int
    _closed: bool
    _append: Callable[[Payload, Ops], int]

    def _refuse_write(self, payload: Payload, ops: Ops) -> int:
        raise ReadOnlyError(f"the store {self.path} was opened with readonly=True; "
                            f"writes are refused")

    def put(self, key: bytes, value: bytes) -> int:
        """Set ``key`` to ``value``; return the write's LSN. Durable per the
        sync mode when it returns, and visible to every later read."""
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
            key = check_key(key)
        if type(value) is not bytes or len(value) > self.max_value_bytes:
            value = check_value(value, self.max_value_bytes)
        ops = [[OP_PUT, key, value]]
        if len(value) >= LARGE_VALUE_BYTES:  # logged as pieces: the value is never copied
            return self._append(put_payload(key, value), ops)
        return self._append(_pack(ops), ops)

    def delete(self, key: bytes) -> int:
        """Remove ``key`` (absent keys too: the delete is logged anyway);
        return the LSN."""
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
            key = check_key(key)
        ops = [[OP_DELETE, key]]
        return self._append(_pack(ops), ops)

    def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        """Remove every key with ``start <= key < end`` (None: unbounded), as
        one atomic write; return its LSN."""
        start, end = check_range(start, end)
        ops = [[OP_DELETE_RANGE, start, end]]
        return self._append(_pack(ops), ops)

    def batch(self) -> WriteBatch:
        """A batch of writes applied atomically as one log entry (one LSN)::

            with db.batch() as b:
                b.put(b"a", b"1"); b.delete(b"b"); b.delete_range(b"c", b"d")

        Committed when the ``with`` block ends normally (durable per the sync
        mode, then visible), discarded when it raises. ``b.lsn`` is the LSN.
        """
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self.readonly:
            self._refuse_write(b"", [])
        return WriteBatch(self._append, self.max_value_bytes, self._max_payload)

    def update(self, pairs: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> int | None:
        """Put every (key, value) of ``pairs`` (a mapping or an iterable of
        pairs) as ONE atomic batch; return its LSN (None if empty). The
        fastest way to load many pairs."""
        with self.batch() as b:
            b.update(pairs)
        return b.lsn

    def write(self, payload: bytes) -> int:
        """Append a pre-encoded batch payload (kvstore.entry.codec format) after
        validating it; return its LSN. For tools that copy batches. Not
        bytes-like: TypeError; not a valid batch: ValueError (nothing is
        written either way)."""
        payload = as_bytes(payload, "payload")
        return self._append(payload, parse(payload))

    def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """Set ``key`` to ``new`` only if its value is ``expected`` (None: only
        if it is absent), decided in log order (:mod:`kvstore.store.txn`).
        True when it was set; either way the attempt is durable (one LSN)."""
        return txn.compare_and_set(self._append, self.max_value_bytes, key, expected, new)

    def delete_if(self, key: bytes, expected: bytes) -> bool:
        """Delete ``key`` only if its value is ``expected``; True when deleted."""
        return txn.delete_if(self._append, self.max_value_bytes, key, expected)

    def transaction(self) -> txn.Transaction:
        """Conditions plus writes, applied atomically only if every condition
        holds in log order (:class:`kvstore.store.txn.Transaction`)."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self.readonly:
            self._refuse_write(b"", [])
        return txn.Transaction(self._append, self.max_value_bytes, self._max_payload)
