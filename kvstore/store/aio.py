"""The asyncio front: ``kvstore.open_async(path)``.

::

    async with kvstore.open_async(path, sync="always") as adb:
        lsn = await adb.put(b"k", b"v")      # durable (and applied) on return
        await adb.get(b"k")
        async with adb.batch() as b:
            b.put(b"a", b"1"); b.delete(b"b")

Durability is exactly the store's (:mod:`kvstore.store.store`): with
``sync="always"`` an awaited write has been fsynced and applied to LMDB.

How thousands of coroutines share each fsync without a thread each: a write
gets a future and joins the loop's current batch, and the batch goes to the log
as one run when every coroutine that was ready has had its turn; the log's
committing thread calls back once per run, and one wake-up of the loop
resolves every future of every finished run, the i-th with ``first_lsn + i``
(:mod:`kvstore.store.aio_writes`, which is compiled: the loop's thread is what
limits durable writes from many coroutines). A write's future is its own:
cancelling the task that awaits it drops only its result (the write was
handed over and is written), and an error reaches exactly the writes it
concerns.

Reads answer directly from LMDB on the event loop's thread (a read is a
few microseconds and never waits for the log). ``open`` and ``close`` run in
the default executor, since they may replay the log or fsync. Batches and
transactions: :mod:`kvstore.store.aio_batch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Iterator, TypeVar

from kvstore.entry.codec import (
    OP_DROP_KEYSPACE,
    check_keyspace,
    delete_entry,
    delete_range_entry,
    encode,
    in_keyspace,
    put_entry,
)
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, View
from kvstore.store.aio_batch import AsyncTransaction, AsyncWriteBatch
from kvstore.store.aio_writes import PendingWrites
from kvstore.store.expiring import lease_id_of
from kvstore.store.keyspace import keyspace_name
from kvstore.store.leases import Lease
from kvstore.store.store import KVStore
from kvstore.store.txn import cas_outcome, decided
from kvstore.watch.aio import AsyncWatcher
from wal.errors import ClosedError, ReadOnlyError
from wal.segment import Payload

Handle = TypeVar("Handle", AsyncWriteBatch, AsyncTransaction)


class AsyncKVStore:
    """A :class:`~kvstore.store.store.KVStore` driven from one asyncio event loop.

    Create with ``await kvstore.open_async(path)``. Writes must be awaited on
    the loop that opened the store. :attr:`store` is the underlying KVStore
    (its synchronous API may be used from other threads meanwhile).
    """

    def __init__(self, store: KVStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop
        self._closing = False
        self._max_value = store.max_value_bytes
        # Writes go to the store's log (None, read-only: every write refused).
        self._writes = PendingWrites(loop, store._log, self._max_value, self._refusal)
        self.submit = self._writes.submit
        """``submit(payload, ops)``: log one entry the caller built (in
        :mod:`kvstore.entry.codec`'s format; ``ops`` its operations, or a
        context such as a :class:`~kvstore.entry.conditions.Decided`); a
        future of its LSN, resolved once it is durable and applied, as every
        write here. For network faces that build their own entries
        (:mod:`kvstore.server.resp`); the compiled path, with no frame of its own."""

    def _submit(self, payload: Payload, ops: list) -> "asyncio.Future[int]":
        return self._writes.submit(payload, ops)

    def _refusal(self) -> BaseException:
        if self._closing:
            return ClosedError(f"the store {self.store.path} is closed")
        return ReadOnlyError(f"the store {self.store.path} was opened with "
                             f"readonly=True; writes are refused")

    # -- writes -------------------------------------------------------------

    def put(self, key: bytes, value: bytes, ttl: float | None = None,
            lease: Lease | int | None = None) -> "Awaitable[int]":
        """Set ``key``; the awaited result is the LSN, once durable and applied.
        ``ttl``/``lease`` as :meth:`KVStore.put` takes them."""
        if ttl is None and lease is None:
            return self._writes.put(key, value)
        payload, ops = self.store._expiring.put_entry(key, value, ttl, lease)
        return self._checked(payload, ops)

    async def _checked(self, payload: Payload, ops: list) -> int:
        """Submit, then raise LeaseNotFoundError if a lease it needed was not alive."""
        lsn = await self._submit(payload, ops)
        self.store._expiring.check(ops, lsn)
        return lsn

    async def ttl(self, key: bytes) -> float | None:
        """As :meth:`KVStore.ttl`."""
        return self.store.ttl(key)

    async def grant(self, ttl: float) -> Lease:
        """As :meth:`KVStore.grant` (the lease's own ``keepalive()`` and
        ``keep_alive()`` are the synchronous store's; from the loop, await
        :meth:`keepalive`)."""
        payload, ops, lease_id, ttl_us = self.store._expiring.grant_entry(ttl)
        await self._submit(payload, ops)
        return Lease(self.store, lease_id, ttl_us)

    async def keepalive(self, lease: Lease) -> float:
        """As :meth:`Lease.keepalive`, awaited on the loop."""
        payload, ops = self.store._expiring.keepalive_entry(lease.id, round(lease.granted_ttl * 1e6))
        await self._checked(payload, ops)
        return lease.granted_ttl

    async def revoke(self, lease: Lease | int) -> int:
        """As :meth:`KVStore.revoke`."""
        payload, ops = self.store._expiring.revoke_entry(lease_id_of(lease))
        return await self._checked(payload, ops)

    def delete(self, key: bytes) -> "asyncio.Future[int]":
        payload, ops = delete_entry(key)
        return self._submit(payload, ops)

    def delete_range(self, start: bytes | None, end: bytes | None) -> "asyncio.Future[int]":
        payload, ops = delete_range_entry(start, end)
        return self._submit(payload, ops)

    def batch(self, keyspace: str = "") -> AsyncWriteBatch:
        """``async with adb.batch() as b:`` collects ``b.put``/``b.delete``/
        ``b.delete_range`` (plain calls, each may name its ``keyspace=``) and
        commits them atomically, one LSN, when the block ends normally
        (awaiting durability); nothing is written when it raises.
        ``keyspace``: where writes that name none go."""
        return self._collect(AsyncWriteBatch, keyspace)

    def transaction(self, keyspace: str = "") -> AsyncTransaction:
        """``async with adb.transaction() as t:``: :meth:`KVStore.transaction`
        (``t.require``, ``t.put``, ... are plain calls), committed when the
        block ends normally, awaiting durability and the decision.
        ``keyspace``: where conditions and writes that name none go."""
        return self._collect(AsyncTransaction, keyspace)

    def _collect(self, kind: type[Handle], keyspace: str) -> Handle:
        """A new batch or transaction of ``kind``, committed through :meth:`_submit`."""
        if self._closing:
            raise ClosedError(f"the store {self.store.path} is closed")
        store = self.store
        return kind(self._writes.submit, self._max_value, store._max_payload, store._keyspaces.writable(keyspace),
                    store._keyspaces.writable, store._expiring)

    async def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes, keyspace: str = "") -> bool:
        """As :meth:`KVStore.compare_and_set`: True when ``key`` was set,
        decided in log order (:mod:`kvstore.store.txn`)."""
        outcome = cas_outcome(self._max_value, key, expected, new, self.store._keyspaces.writable(keyspace))
        lsn = await self._submit(encode(outcome), outcome)
        return decided(outcome, lsn) is None

    async def delete_if(self, key: bytes, expected: bytes) -> bool:
        """As :meth:`KVStore.delete_if`: True when ``key`` was deleted."""
        t = self.transaction()
        t.require(key, equals=expected)
        t.delete(key)
        return await t.acommit()

    # -- keyspaces (kvstore/store/keyspace.py) ---------------------------------

    def keyspace(self, name: str) -> "AsyncKeyspace":
        """The keyspace ``name``, with this front's API (:meth:`KVStore.keyspace`)."""
        return AsyncKeyspace(self, keyspace_name(name))

    async def keyspaces(self) -> list[str]:
        return self.store.keyspaces()

    def drop_keyspace(self, name: str) -> "asyncio.Future[int]":
        """Remove every key of keyspace ``name`` in one entry; the awaited result is its LSN."""
        ops = [[OP_DROP_KEYSPACE, check_keyspace(name, default_ok=False)]]
        return self._submit(encode(ops), ops)

    def _submit_in(self, keyspace: str, payload: Payload, ops: list) -> "asyncio.Future[int]":
        return self._submit(*in_keyspace(self.store._keyspaces.writable(keyspace), payload, ops))

    def watch(self, prefix: bytes | None = None, **options: Any) -> AsyncWatcher:
        """``async for change in adb.watch(...)``: :meth:`KVStore.watch`, its
        blocking waits run in a thread of the watcher's own."""
        return AsyncWatcher(self.store.watch(prefix, **options))

    # -- reads --------------------------------------------------------------

    async def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        return self.store.get(key, default)

    async def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        return self.store.get_many(keys, default)

    async def contains(self, key: bytes) -> bool:
        return self.store.get(key) is not None

    async def count(self) -> int:
        return len(self.store)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """A consistent read of several keys as of one LSN (``with
        adb.view() as v:`` or ``async with``); its reads answer directly, like
        :meth:`get`. See :meth:`kvstore.KVStore.view`."""
        return self.store.view(max_seconds)

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False
             ) -> Iterator[tuple[bytes, bytes]]:
        """As :meth:`KVStore.scan` (a plain iterator: each step reads LMDB
        directly, in microseconds)."""
        return self.store.scan(start, stop, prefix=prefix, reverse=reverse)

    # -- the rest -----------------------------------------------------------

    @property
    def last_lsn(self) -> int:
        return self.store.last_lsn

    @property
    def durable_lsn(self) -> int:
        return self.store.durable_lsn

    @property
    def applied_lsn(self) -> int:
        return self.store.applied_lsn

    def stats(self) -> dict:
        st = self.store.stats()
        st["async_pending"] = self._writes.pending
        return st

    async def sync(self) -> int:
        return await self._loop.run_in_executor(None, self.store.sync)

    async def flush_archive(self, timeout: float | None = 30.0) -> int:
        """:meth:`kvstore.KVStore.flush_archive`, in the default executor."""
        return await self._loop.run_in_executor(None, self.store.flush_archive, timeout)

    async def close(self) -> None:
        """Wait for every write in flight (each future resolves), then close
        the store."""
        if self._closing:
            return
        writes = self._writes
        writes.flush()  # what was asked for before close() goes to the log
        self._closing = True
        writes.refuse()
        await self._loop.run_in_executor(None, self.store.close)
        writes.drain()
        writes.fail_unfinished(ClosedError("the store was closed before this write finished"))

    async def __aenter__(self) -> "AsyncKVStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncKVStore {self.store!r}>"


class AsyncKeyspace:
    """A keyspace of an :class:`AsyncKVStore` (``adb.keyspace("users")``):
    :class:`kvstore.store.keyspace.Keyspace`'s API, writes awaited as the
    front's are, reads answered directly."""

    __slots__ = ("adb", "name", "_sync")

    def __init__(self, adb: AsyncKVStore, name: str) -> None:
        self.adb = adb
        self.name = name
        self._sync = adb.store.keyspace(name)  # its reads

    def put(self, key: bytes, value: bytes, ttl: float | None = None,
            lease: Lease | int | None = None) -> "Awaitable[int]":
        """As :meth:`AsyncKVStore.put`, in this keyspace."""
        if ttl is None and lease is None:
            return self.adb._submit_in(self.name, *put_entry(key, value, self.adb._max_value))
        keyspace = self.adb.store._keyspaces.writable(self.name)
        return self.adb._checked(*self.adb.store._expiring.put_entry(key, value, ttl, lease, keyspace))

    async def ttl(self, key: bytes) -> float | None:
        """As :meth:`kvstore.store.keyspace.Keyspace.ttl`."""
        return self._sync.ttl(key)

    def delete(self, key: bytes) -> "asyncio.Future[int]":
        return self.adb._submit_in(self.name, *delete_entry(key))

    def delete_range(self, start: bytes | None, end: bytes | None) -> "asyncio.Future[int]":
        return self.adb._submit_in(self.name, *delete_range_entry(start, end))

    def batch(self) -> AsyncWriteBatch:
        return self.adb.batch(self.name)

    async def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        return await self.adb.compare_and_set(key, expected, new, self.name)

    def drop(self) -> "asyncio.Future[int]":
        return self.adb.drop_keyspace(self.name)

    async def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        return self._sync.get(key, default)

    async def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        return self._sync.get_many(keys, default)

    async def count(self) -> int:
        return len(self._sync)

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        return self._sync.scan(start, stop, prefix=prefix, reverse=reverse)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        return self._sync.view(max_seconds)

    def watch(self, prefix: bytes | None = None, **options: Any) -> AsyncWatcher:
        return AsyncWatcher(self.adb.store.watch(prefix, keyspace=self.name, **options))


class _Opening:
    """What :func:`open_async` returns: awaitable, and an async context manager."""

    __slots__ = ("_args", "_kwargs", "_adb")

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self._args = args
        self._kwargs = kwargs
        self._adb: AsyncKVStore | None = None

    async def _open(self) -> AsyncKVStore:
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(None, lambda: KVStore(*self._args, **self._kwargs))
        return AsyncKVStore(store, loop)

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> AsyncKVStore:
        self._adb = await self._open()
        return self._adb

    async def __aexit__(self, *exc: Any) -> None:
        if self._adb is not None:
            await self._adb.close()


def open_async(path, sync: str = "always", **options: Any) -> _Opening:
    """Open the store at ``path`` for asyncio (options as :func:`kvstore.open`)::

        adb = await kvstore.open_async(path)
        async with kvstore.open_async(path) as adb: ...
    """
    return _Opening((path,), dict(sync=sync, **options))
