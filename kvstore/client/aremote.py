"""The asyncio client: ``kvstore.connect_async(url)``, an :class:`AsyncRemoteStore`
with :class:`~kvstore.store.aio.AsyncKVStore`'s API over HTTP (httpx.AsyncClient)::

    async with kvstore.connect_async("http://127.0.0.1:7379", token=TOKEN) as db:
        lsn = await db.put(b"k", b"v"); await db.get(b"k")
        async with db.batch() as b: b.put(b"a", b"1")
        async with db.transaction() as t: t.require(b"a", equals=b"1"); t.put(b"a", b"2")
        async for key, value in db.scan(prefix=b"a"): ...
        async for change in db.watch(b"a", from_lsn=lsn): ...

Batches and transactions are the asyncio front's own classes
(:class:`~kvstore.store.aio_batch.AsyncWriteBatch`, :class:`~kvstore.store.aio_batch.AsyncTransaction`),
committed through the server; errors, durability and retries as the sync
client's (:mod:`kvstore.client.remote`). Where the embedded front answers
without awaiting (``scan``, the LSN properties), a network client must
await: ``scan`` is an async iterator and the LSNs come from ``await
db.bounds()``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from typing import Any, NoReturn, TypeVar

from kvstore.client import batches, calls
from kvstore.client.batches import RemoteExpiry
from kvstore.client.calls import Call, ServerInfo
from kvstore.client.events import AsyncRemoteWatcher, Resumption
from kvstore.client.http import Cert, Verify
from kvstore.client.leader import FAILOVER_TIMEOUT, AsyncTransport, async_transport
from kvstore.client.remote import not_remotely
from kvstore.store.aio_batch import AsyncTransaction, AsyncWriteBatch
from kvstore.store.keyspace import keyspace_name
from kvstore.store.leases import Lease
from wal.errors import ClosedError

T = TypeVar("T")


class _AwaitedLease:
    """The owner of the asyncio client's leases: their blocking methods
    would stall the loop, so they say what to await instead."""

    def _keepalive(self, lease_id: int, ttl_us: int) -> float:
        not_remotely("lease.keepalive() of the asyncio client", "await db.keepalive(lease)")

    def _lease_ttl(self, lease_id: int) -> float | None:
        not_remotely("lease.ttl() of the asyncio client", "await db.lease_ttl(lease)")

    def revoke(self, lease: Lease | int) -> int:
        not_remotely("lease.revoke() of the asyncio client", "await db.revoke(lease)")


_AWAITED = _AwaitedLease()


class AsyncRemoteStore:
    """A store served over HTTP, for asyncio (module docstring). Create with
    ``await kvstore.connect_async(url)``."""

    def __init__(self, http: AsyncTransport, info: ServerInfo, keyspace: str = "") -> None:
        self._http = http
        self.url = http.url
        self._closed = False
        self._info = info
        self._keyspace = keyspace
        self.store_id = info.store_id
        self.readonly = info.readonly
        self.max_value_bytes = info.max_value_bytes
        self._max_payload = info.max_payload_bytes
        self._expiry = RemoteExpiry(info.max_value_bytes)

    async def _call(self, call: Call[T]) -> T:
        if self._closed or self._http.closed:
            raise ClosedError(f"the connection to {self.url} is closed")
        return await calls.send_async(self._http, call)

    # -- writes --------------------------------------------------------------

    async def put(self, key: bytes, value: bytes, ttl: float | None = None, lease: Any = None) -> int:
        return await self._call(calls.put(key, value, self.max_value_bytes, ttl, lease, self._keyspace))

    async def delete(self, key: bytes) -> int:
        return await self._call(calls.delete(key, self._keyspace))

    async def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        return await self._call(calls.delete_range(start, end, self._keyspace))

    async def _commit(self, payload: bytes, ops: list) -> int:
        return await self._call(batches.commit(ops, self._info))

    def batch(self) -> AsyncWriteBatch:
        return AsyncWriteBatch(self._commit, self.max_value_bytes, self._max_payload, self._keyspace,
                               expiring=self._expiry)  # type: ignore[arg-type]

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self._commit, self.max_value_bytes, self._max_payload, self._keyspace,
                                expiring=self._expiry)  # type: ignore[arg-type]

    async def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        t = self.transaction()
        if expected is None:
            t.require(key, absent=True)
        else:
            t.require(key, equals=expected)
        t.put(key, new)
        return await t.acommit()

    async def delete_if(self, key: bytes, expected: bytes) -> bool:
        t = self.transaction()
        t.require(key, equals=expected)
        t.delete(key)
        return await t.acommit()

    # -- keyspaces, expiry -----------------------------------------------------

    def keyspace(self, name: str) -> "AsyncRemoteStore":
        """The keyspace ``name``: this client's API over its keys (sharing its connections)."""
        return AsyncRemoteStore(self._http, self._info, keyspace_name(name))

    async def keyspaces(self) -> list[str]:
        return await self._call(calls.keyspaces())

    async def drop_keyspace(self, name: str) -> int:
        return await self._call(calls.drop_keyspace(name))

    async def ttl(self, key: bytes) -> float | None:
        return await self._call(calls.ttl(key, self._keyspace))

    async def grant(self, ttl: float) -> Lease:
        """A new lease (await :meth:`keepalive`, :meth:`revoke`, :meth:`lease_ttl` with it)."""
        lease_id, ttl_us = await self._call(calls.grant(ttl))
        return Lease(_AWAITED, lease_id, ttl_us)

    async def keepalive(self, lease: Lease) -> float:
        await self._call(calls.keepalive(lease))
        return lease.granted_ttl

    async def lease_ttl(self, lease: Lease | int) -> float | None:
        """Seconds the lease has left (LeaseNotFoundError when it is not alive)."""
        return (await self._call(calls.lease(lease)))["ttl"]

    async def revoke(self, lease: Lease | int) -> int:
        return await self._call(calls.revoke(lease))

    def view(self, max_seconds: float = 0.0) -> NoReturn:
        not_remotely("view()", "a view holds a read transaction of the server's LMDB open across calls")

    # -- reads ---------------------------------------------------------------

    async def get(self, key: bytes, default: bytes | None = None, *, min_lsn: int | None = None) -> bytes | None:
        call = calls.get(key, default, min_lsn, self._keyspace)
        return default if call is None else await self._call(call)

    async def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        many = calls.ManyGets(keys, default, self._keyspace, self._info)
        while (call := many.next()) is not None:
            await self._call(call)
        return many.values

    async def contains(self, key: bytes) -> bool:
        return await self.get(key) is not None

    async def count(self) -> int:
        return await self._call(calls.count(self._keyspace))

    async def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
                   reverse: bool = False, page: int = 1000) -> AsyncGenerator[tuple[bytes, bytes], None]:
        pages = calls.ScanPages(start, stop, prefix, reverse, page, self._keyspace)
        while (call := pages.next()) is not None:
            for item in await self._call(call):
                yield item

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error", keyspace: str | None = "") -> AsyncRemoteWatcher:
        """As the sync client's; without ``from_lsn``, from after the server's
        durable LSN when the stream starts. A keyspace's handle watches its
        keyspace; the store's, ``keyspace`` (None: every one)."""
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, on_gap,
                                    self._keyspace or keyspace)
        return AsyncRemoteWatcher(self._http, "/v1/watch", Resumption(from_lsn, params))

    # -- the rest ------------------------------------------------------------

    async def bounds(self) -> dict[str, Any]:
        """``{"first_lsn", "durable_lsn", "applied_lsn", "last_lsn", "store_id"}`` of the server's log."""
        return await self._call(calls.bounds())

    async def stats(self) -> dict[str, Any]:
        return await self._call(calls.stats())

    async def snapshot(self) -> dict[str, Any]:
        return await self._call(calls.snapshot())

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._keyspace:  # a keyspace's handle shares its store's connections
                await self._http.aclose()

    async def __aenter__(self) -> "AsyncRemoteStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        space = f" keyspace {self._keyspace!r}" if self._keyspace else ""
        return f"<AsyncRemoteStore {self.url}{space}{' closed' if self._closed else ''}>"


class _Connecting:
    """What :func:`connect_async` returns: awaitable, and an async context manager."""

    def __init__(self, url: str | list[str], options: dict[str, Any]) -> None:
        self._url = url
        self._options = options
        self._db: AsyncRemoteStore | None = None

    async def _connect(self) -> AsyncRemoteStore:
        http = async_transport(self._url, **self._options)
        try:
            info = await calls.send_async(http, calls.info())
        except BaseException:
            await http.aclose()
            raise
        return AsyncRemoteStore(http, info)

    def __await__(self):
        return self._connect().__await__()

    async def __aenter__(self) -> AsyncRemoteStore:
        self._db = await self._connect()
        return self._db

    async def __aexit__(self, *exc: object) -> None:
        if self._db is not None:
            await self._db.close()


def connect_async(url: str | list[str], *, token: str | None = None, timeout: float = 10.0, verify: Verify = True,
                  cert: Cert = None, max_connections: int = 100, reads: str = "leader",
                  failover_timeout: float = FAILOVER_TIMEOUT) -> _Connecting:
    """``db = await kvstore.connect_async(url)`` or ``async with kvstore.connect_async(url) as db:``;
    a list of URLs is a cluster's nodes (as :func:`kvstore.client.remote.connect`)."""
    return _Connecting(url, dict(token=token, timeout=timeout, verify=verify, cert=cert,
                                 max_connections=max_connections, reads=reads, failover_timeout=failover_timeout))
