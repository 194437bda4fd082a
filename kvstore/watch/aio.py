"""A watcher for asyncio: ``async for change in adb.watch(...)``
(:class:`AsyncWatcher`), around a blocking :class:`~kvstore.watch.watcher.Watcher`
or a named :class:`~kvstore.watch.subscription.Subscription`, whose blocking
steps run on a thread of their own."""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kvstore.watch.watcher import Change


class Changes(Protocol):
    """What :class:`AsyncWatcher` drives: a :class:`~kvstore.watch.watcher.Watcher`, or a named
    subscription (:class:`kvstore.watch.subscription.Subscription`)."""

    def __next__(self) -> Change: ...

    def close(self) -> None: ...


class AsyncWatcher:
    """``async for change in adb.watch(...)``: a
    :class:`~kvstore.watch.watcher.Watcher` (or any :class:`Changes`) whose
    blocking steps run on a thread of its own (never a busy poll on the
    loop, and a slow watcher does not hold the default executor).
    ``async with`` it, or :meth:`aclose` it, to stop."""

    def __init__(self, watcher: Changes) -> None:
        self.watcher = watcher
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walkv-watch")
        # Dropped without aclose() (a bare ``async for`` left by break or an
        # error): stop the watcher, so that its thread ends.
        self._finalizer = weakref.finalize(self, _stop, watcher, self._pool)

    def __aiter__(self) -> "AsyncWatcher":
        return self

    async def __anext__(self) -> Change:
        if not self._finalizer.alive:  # closed (or ended): the iteration is over, as for the sync watcher
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        try:
            change = await loop.run_in_executor(self._pool, next, self.watcher, None)
        except asyncio.CancelledError:  # the consuming task was cancelled: nobody will ask again
            self._finalizer()
            raise
        if change is None:
            self._finalizer()
            raise StopAsyncIteration
        return change

    async def aclose(self) -> None:
        self._finalizer()

    async def __aenter__(self) -> "AsyncWatcher":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _stop(watcher: Changes, pool: ThreadPoolExecutor) -> None:
    watcher.close()  # a next() blocked in the pool's thread returns promptly
    pool.shutdown(wait=False)
