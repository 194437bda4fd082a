"""The read API of an open store (:class:`kvstore.KVStore`): get, the
dict-like face, scans and consistent views, all served by the LMDB state
machine (:class:`kvstore.state.machine.State`). What a read sees is stated on each
method and in :mod:`kvstore.store.store`."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator

from kvstore.state.machine import State
from kvstore.state.readers import Lookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, View, scan_bounds
from wal.errors import ClosedError


class StoreReads(Lookups):
    """The reads of :class:`kvstore.KVStore` (a base class of it)."""

    path: str
    _state: State
    _closed: bool

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key``, or ``default``. Sees every write that returned
        before it was called (in any thread). After :meth:`close`:
        :class:`ClosedError`."""
        return self._state.get(key, default)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (``default`` for absent ones), in order,
        each as :meth:`get` would return it: the fast way to read many keys
        (one Python call per 1,024 keys, not one per key). Not one snapshot:
        for that, :meth:`view`."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        return self._state.get_many(keys, default)

    def __len__(self) -> int:
        """The number of keys (LMDB keeps the count; O(1))."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        return self._state.count()

    def __iter__(self) -> Iterator[bytes]:
        for k, _v in self.scan():
            yield k

    def keys(self) -> Iterator[bytes]:
        return iter(self)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return self.scan()

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """Yield ``(key, value)`` pairs in key order (descending when
        ``reverse``), with range() semantics: ``start <= key < stop``, and
        ``key.startswith(prefix)`` when a prefix is given (all three combine).

        Each key comes once, in order, with a value it had at some moment
        during the scan. A scan that takes under half a second is one LMDB
        snapshot taken at the first ``next()``; a longer one (or one that
        meets a growth of LMDB's map) goes on from a newer snapshot after the
        last key yielded, so that it never pins old pages for long (see
        :func:`kvstore.state.readers.scan`). For several keys as of one LSN use
        :meth:`view`. Close the iterator (or exhaust it) promptly: a paused
        one still holds its snapshot.
        """
        lo, hi = scan_bounds(start, stop, prefix)
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        return self._state.scan(lo, hi, reverse)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """A consistent read of several keys: everything as of one LSN::

            with db.view() as v:
                v.get(b"a"), v[b"b"], b"c" in v, len(v), v.lsn
                for key, value in v.scan(prefix=b"user/"): ...

        One LMDB read transaction, safe beside writers and growth of the
        map; on read-only stores too. Bounded lifetime: an open view pins
        LMDB's pages and holds off growth of the map, so once older than
        ``max_seconds`` it is closed and raises
        :class:`~kvstore.ViewExpiredError`; a writer that must grow the map
        waits for younger views. After the ``with`` block: ClosedError. See
        :mod:`kvstore.state.view`."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        return self._state.view(max_seconds)
