"""Where a command reads and writes keys: :class:`StateView`, the state as
it is now (a read on the event loop), and :class:`EntryView`, the state at
one log entry's place in the log (a write the writer decides, on the group's
leader: :class:`kvstore.entry.conditions.Decided`).

A command's view function takes either and cannot tell them apart, so each
command is written once and means the same standalone or inside MULTI/EXEC.
What a view offers: ``get``, ``ttl_us`` (a key's remaining time, None when it
has no expiry), and, on an entry view only, ``put``, ``delete``, ``flush``,
``select``, whose ops become the entry's (:attr:`EntryView.ops`, in
:mod:`kvstore.entry.codec`'s format, each write seen by the reads after it).

Keys are Redis's (any bytes) checked against walkv's (1 to 511 bytes):
reading a key walkv cannot hold finds nothing, writing one is an error.
SELECT's database ``n`` is walkv's keyspace named ``"n"``, database 0 the
default keyspace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kvstore.entry.codec import (
    END_OF_KEYS,
    MAX_KEY_BYTES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_DROP_KEYSPACE,
    OP_KEYSPACE,
    OP_PUT,
    OP_PUT_EXPIRING,
)
from kvstore.entry.conditions import GroupSoFar, Meta
from kvstore.server.resp.replies import RespError

DATABASES = 16
"""SELECT's databases, 0..15 (Redis's default ``databases``)."""


def keyspace_of(db: int) -> str:
    """The walkv keyspace of database ``db``."""
    return "" if db == 0 else str(db)


def walkv_key(key: bytes) -> bytes:
    """``key`` when walkv can hold it, else RespError (a write of it)."""
    if 0 < len(key) <= MAX_KEY_BYTES:
        return key
    raise RespError(f"ERR walkv keys are 1 to {MAX_KEY_BYTES} bytes, not {len(key)}")


def holdable(key: bytes) -> bool:
    return 0 < len(key) <= MAX_KEY_BYTES


class Reads(Protocol):
    """A keyspace's reads (:class:`kvstore.KVStore` or its :class:`~kvstore.store.keyspace.Keyspace`)."""

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None: ...
    def ttl(self, key: bytes) -> float | None: ...
    def __len__(self) -> int: ...
    def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]: ...


class KeyView(Protocol):
    """What a command's view function reads and writes (module docstring)."""

    db: int

    def now_us(self) -> int: ...
    def get(self, key: bytes) -> bytes | None: ...
    def ttl_us(self, key: bytes) -> int | None: ...
    def put(self, key: bytes, value: bytes, *, ttl_of: bytes | None = None, at_us: int | None = None) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def flush(self) -> None: ...
    def select(self, db: int) -> None: ...


class StateView:
    """The state now, of database ``db``: reads only (a read command on the loop)."""

    def __init__(self, db: int, reads: Reads, now_us: Callable[[], int]) -> None:
        self.db = db
        self.reads = reads
        self.now_us = now_us

    def get(self, key: bytes) -> bytes | None:
        return self.reads.get(key) if 0 < len(key) <= MAX_KEY_BYTES else None

    def ttl_us(self, key: bytes) -> int | None:
        seconds = self.reads.ttl(key) if holdable(key) else None
        return None if seconds is None else max(1, round(seconds * 1e6))

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a read command wrote: it must be a decided write (kvstore.server.resp.table)")

    put = delete = flush = select = _read_only


class EntryView:
    """The state at one entry's place in the log (``so_far``, on the group's
    leader) of database ``db``, and the entry's ops so far (:attr:`ops`).
    ``max_value``: the store's value limit."""

    def __init__(self, so_far: GroupSoFar, db: int, now_us: Callable[[], int], max_value: int) -> None:
        self._so_far = GroupSoFar(so_far.get, so_far.meta)  # the ops below, over the state before them
        self.db = db
        self._keyspace = keyspace_of(db)
        self.now_us = now_us
        self._max_value = max_value
        self.ops: list[list] = []
        self._at = ""  # the keyspace of the ops so far (an entry starts in the default one)

    def select(self, db: int) -> None:
        self.db = db
        self._keyspace = keyspace_of(db)

    def get(self, key: bytes) -> bytes | None:
        return self._so_far.get(self._keyspace, key) if 0 < len(key) <= MAX_KEY_BYTES else None

    def meta(self, key: bytes) -> Meta | None:
        """``key``'s TTL or lease (None: it has none, or is absent: an
        expired key's TTL is not carried over to a new value)."""
        if self.get(key) is None:
            return None
        return self._so_far.meta(self._keyspace, key)

    def ttl_us(self, key: bytes) -> int | None:
        """The time left of a key's TTL (None also for a key under a lease:
        the entry view does not read leases)."""
        meta = self.meta(key) if holdable(key) else None
        if meta is None or meta[0] != OP_PUT_EXPIRING:
            return None
        return max(1, meta[1] - self.now_us())

    def put(self, key: bytes, value: bytes, *, ttl_of: bytes | None = None, at_us: int | None = None) -> None:
        """Set ``key``: with the TTL or lease key ``ttl_of`` has (itself, to
        keep its own; RENAME's source), expiring at ``at_us``, or else with
        none (as Redis's SET drops a TTL)."""
        key = walkv_key(key)
        if len(value) > self._max_value:
            raise RespError(f"ERR string exceeds maximum allowed size (this store's values are at most "
                            f"{self._max_value} bytes)")
        if at_us is not None:
            self._write([OP_PUT_EXPIRING, key, value, at_us])
            return
        meta = self.meta(ttl_of) if ttl_of is not None else None
        self._write([OP_PUT, key, value] if meta is None else [meta[0], key, value, meta[1]])

    def delete(self, key: bytes) -> None:
        self._write([OP_DELETE, walkv_key(key)])

    def flush(self) -> None:
        """FLUSHDB: every key of the database goes (a named keyspace is dropped, one op)."""
        if self._keyspace:
            self._write([OP_DROP_KEYSPACE, self._keyspace])
        else:
            self._write([OP_DELETE_RANGE, b"", END_OF_KEYS])

    def _write(self, op: list) -> None:
        if self._keyspace != self._at:
            self._at = self._keyspace
            self.ops.append([OP_KEYSPACE, self._at])
        self.ops.append(op)
        self._so_far.write([[OP_KEYSPACE, self._keyspace], op])
