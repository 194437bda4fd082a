"""The asyncio front: ``kvstore.open_async(path)``.

::

    async with kvstore.open_async(path, sync="always") as adb:
        lsn = await adb.put(b"k", b"v")      # durable (and applied) on return
        await adb.get(b"k")
        async with adb.batch() as b:
            b.put(b"a", b"1"); b.delete(b"b")

Durability is exactly the store's (:mod:`kvstore.store`): with
``sync="always"`` an awaited write has been fsynced and applied to LMDB.

How thousands of coroutines share each fsync without a thread each: a write
is queued with the log's non-blocking ``append_nowait`` and the coroutine
awaits a future. The log's committing thread writes and fsyncs the whole
queue as one group, applies it to LMDB, then calls one callback per entry;
the callback only appends ``(lsn, error)`` to a deque and, the first time
since the loop last drained it, schedules one wake-up of the event loop
(``call_soon_threadsafe``), so a group of N writes costs one cross-thread
wake-up, not N. The loop then resolves every finished future in one go.

Reads answer directly from LMDB on the event loop's thread (a read is a
few microseconds and never waits for the log). ``open`` and ``close`` run in
the default executor, since they may replay the log or fsync.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Iterator

from kvstore.batch import (
    MAX_KEY_BYTES,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    WriteBatch,
    _pack,
    check_key,
    check_range,
    check_value,
)
from kvstore.store import KVStore
from kvstore.txn import cas_outcome, decided
from kvstore.view import DEFAULT_MAX_VIEW_SECONDS, View
from kvstore.watch import AsyncWatcher
from wal.errors import ClosedError, ReadOnlyError


class AsyncKVStore:
    """A :class:`~kvstore.store.KVStore` driven from one asyncio event loop.

    Create with ``await kvstore.open_async(path)``. Writes must be awaited on
    the loop that opened the store. :attr:`store` is the underlying KVStore
    (its synchronous API may be used from other threads meanwhile).
    """

    def __init__(self, store: KVStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop
        self._pending: dict[int, asyncio.Future] = {}
        self._done: deque[tuple[int, BaseException | None]] = deque()
        self._wake_scheduled = False
        self._closing = False
        self._max_value = store.max_value_bytes
        log = store._log
        self._append_nowait = log.append_nowait if log is not None else self._refuse
        self._create_future = loop.create_future
        self._callback = self._on_durable

    # -- the completion path ---------------------------------------------------

    def _on_durable(self, lsn: int, error: BaseException | None) -> None:
        # On the log's committing thread: no per-entry cross-thread call.
        self._done.append((lsn, error))
        if not self._wake_scheduled:
            self._wake_scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed; nobody is waiting
                self._wake_scheduled = False

    def _drain(self) -> None:
        # On the loop: clear the flag first, so a callback that runs while we
        # drain either lands in this drain or schedules the next one.
        self._wake_scheduled = False
        done = self._done
        pending = self._pending
        while done:
            lsn, error = done.popleft()
            fut = pending.pop(lsn, None)
            if fut is None or fut.done():
                continue
            if error is None:
                fut.set_result(lsn)
            else:
                fut.set_exception(error)

    def _submit(self, payload: bytes, ops: list) -> asyncio.Future:
        fut = self._create_future()
        # No await between the append and the insert: _drain runs on this
        # same loop thread, so it cannot look the LSN up before it is there.
        lsn = self._append_nowait(payload, self._callback, ops)
        self._pending[lsn] = fut
        return fut

    def _refuse(self, payload: bytes, callback: object, ops: object) -> int:
        if self._closing:
            raise ClosedError(f"the store {self.store.path} is closed")
        raise ReadOnlyError(f"the store {self.store.path} was opened with "
                            f"readonly=True; writes are refused")

    # -- writes -------------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> "asyncio.Future[int]":
        """Set ``key``; the awaited result is the LSN, once durable and applied."""
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
            key = check_key(key)
        if type(value) is not bytes or len(value) > self._max_value:
            value = check_value(value, self._max_value)
        ops = [[OP_PUT, key, value]]
        return self._submit(_pack(ops), ops)

    def delete(self, key: bytes) -> "asyncio.Future[int]":
        if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
            key = check_key(key)
        ops = [[OP_DELETE, key]]
        return self._submit(_pack(ops), ops)

    def delete_range(self, start: bytes | None, end: bytes | None) -> "asyncio.Future[int]":
        start, end = check_range(start, end)
        ops = [[OP_DELETE_RANGE, start, end]]
        return self._submit(_pack(ops), ops)

    def batch(self) -> "AsyncWriteBatch":
        """``async with adb.batch() as b:`` collects ``b.put``/``b.delete``/
        ``b.delete_range`` (plain calls) and commits them atomically, one LSN,
        when the block ends normally (awaiting durability); nothing is written
        when it raises."""
        if self._closing:
            raise ClosedError(f"the store {self.store.path} is closed")
        return AsyncWriteBatch(self)

    async def compare_and_set(self, key: bytes, expected: bytes | None, new: bytes) -> bool:
        """As :meth:`KVStore.compare_and_set`: True when ``key`` was set,
        decided in log order (:mod:`kvstore.txn`)."""
        outcome = cas_outcome(self._max_value, key, expected, new)
        lsn = await self._submit(_pack(outcome), outcome)
        return decided(outcome, lsn) is None

    def watch(self, prefix: bytes | None = None, **options: Any) -> AsyncWatcher:
        """``async for change in adb.watch(...)``: :meth:`KVStore.watch`, its
        blocking waits run in a thread of the watcher's own."""
        return AsyncWatcher(self.store.watch(prefix, **options))

    # -- reads --------------------------------------------------------------

    async def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        return self.store.get(key, default)

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
        st["async_pending"] = len(self._pending)
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
        self._closing = True
        self._append_nowait = self._refuse
        await self._loop.run_in_executor(None, self.store.close)
        self._drain()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ClosedError("the store was closed before this write finished"))
        self._pending.clear()

    async def __aenter__(self) -> "AsyncKVStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncKVStore {self.store!r}>"


class AsyncWriteBatch(WriteBatch):
    """A :class:`~kvstore.batch.WriteBatch` committed with ``async with``."""

    __slots__ = ("_adb",)

    def __init__(self, adb: AsyncKVStore) -> None:
        super().__init__(self._refuse_sync_commit, adb._max_value, adb.store._max_payload)
        self._adb = adb

    @staticmethod
    def _refuse_sync_commit(payload: bytes, ops: list) -> int:
        raise TypeError("an async batch is committed by `async with` (or `await b.acommit()`)")

    async def acommit(self) -> int | None:
        """Commit: one log entry, awaited until durable and applied."""
        sealed = self._seal()
        if sealed is None:
            return None
        self.lsn = await self._adb._submit(sealed[0], sealed[1])
        return self.lsn

    async def __aenter__(self) -> "AsyncWriteBatch":
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if not self._done:
                await self.acommit()
        else:
            self.discard()


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
