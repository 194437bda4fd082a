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
from typing import Any, TypeVar

from kvstore.client import calls
from kvstore.client.calls import Call, ServerInfo
from kvstore.client.events import AsyncRemoteWatcher, Resumption
from kvstore.client.http import Cert, Verify
from kvstore.client.leader import FAILOVER_TIMEOUT, AsyncTransport, async_transport
from kvstore.store.aio_batch import AsyncTransaction, AsyncWriteBatch
from wal.errors import ClosedError

T = TypeVar("T")


class AsyncRemoteStore:
    """A store served over HTTP, for asyncio (module docstring). Create with
    ``await kvstore.connect_async(url)``."""

    def __init__(self, http: AsyncTransport, info: ServerInfo) -> None:
        self._http = http
        self.url = http.url
        self._closed = False
        self.store_id = info.store_id
        self.readonly = info.readonly
        self.max_value_bytes = info.max_value_bytes
        self._max_payload = info.max_payload_bytes

    async def _call(self, call: Call[T]) -> T:
        if self._closed:
            raise ClosedError(f"the connection to {self.url} is closed")
        return await calls.send_async(self._http, call)

    # -- writes --------------------------------------------------------------

    async def put(self, key: bytes, value: bytes) -> int:
        return await self._call(calls.put(key, value, self.max_value_bytes))

    async def delete(self, key: bytes) -> int:
        return await self._call(calls.delete(key))

    async def delete_range(self, start: bytes | None, end: bytes | None) -> int:
        return await self._call(calls.delete_range(start, end))

    async def _commit(self, payload: bytes, ops: list) -> int:
        return await self._call(calls.commit(ops))

    def batch(self) -> AsyncWriteBatch:
        return AsyncWriteBatch(self._commit, self.max_value_bytes, self._max_payload)

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self._commit, self.max_value_bytes, self._max_payload)

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

    # -- reads ---------------------------------------------------------------

    async def get(self, key: bytes, default: bytes | None = None, *, min_lsn: int | None = None) -> bytes | None:
        call = calls.get(key, default, min_lsn)
        return default if call is None else await self._call(call)

    async def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        return [value for call in calls.get_many(keys, default) for value in await self._call(call)]

    async def contains(self, key: bytes) -> bool:
        return await self.get(key) is not None

    async def count(self) -> int:
        return await self._call(calls.count())

    async def scan(self, start: bytes | None = None, stop: bytes | None = None, *, prefix: bytes | None = None,
                   reverse: bool = False, page: int = 1000) -> AsyncGenerator[tuple[bytes, bytes], None]:
        pages = calls.ScanPages(start, stop, prefix, reverse, page)
        while (call := pages.next()) is not None:
            for item in await self._call(call):
                yield item

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None, progress_every: float | None = None,
              on_gap: str = "error") -> AsyncRemoteWatcher:
        """As the sync client's; without ``from_lsn``, from after the server's
        durable LSN when the stream starts."""
        params = calls.watch_params(prefix, start, stop, timeout, progress_every, on_gap)
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
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncRemoteStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncRemoteStore {self.url}{' closed' if self._closed else ''}>"


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
