"""Reads of the state that know expiry and keyspaces (:class:`ExpiringReads`):
gets that find an expired key absent, the named keyspaces' gets, scans and
counts, views, and the reads of LMDB as a whole (the overlay flushed into it
first). :class:`kvstore.state.machine.State` has one and delegates to it; its
plain get of the default keyspace is :mod:`kvstore.state.reads`'s.

Expiry is read against a clock, :attr:`ExpiringReads.now_us` (the store sets its
own): a key whose TTL or lease ran out is absent to every read here before the
store's sweeper logs its deletion (:mod:`kvstore.state.expiry`). While no key has
an expiry, each read takes the plain path, which checks nothing.

Keyspaces never pass through the overlay (:meth:`kvstore.state.machine.State.apply`
writes their groups to LMDB at once), so their reads take a fresh read transaction,
begun after the keyspace's handle is opened, as LMDB requires.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from functools import partial
from itertools import islice
from typing import Any, Final

import lmdb

from kvstore.entry.codec import KEYSPACE_SECTION
from kvstore.entry.limits import DEFAULT_KEYSPACE, as_bytes
from kvstore.state.environment import Environment
from kvstore.state.expiry import Expiry
from kvstore.state.overlay import MISSING, Overlay
from kvstore.state.readers import ReadView, scan
from kvstore.state.reads import CachedReads, FreshReads, read_in
from kvstore.state.view import ABSENT, View

ALIVE_CHUNK: Final = 256
"""A scan checks the expiry of this many pairs per read transaction."""


def now_us() -> int:
    """Microseconds since the epoch, UTC: the clock expiry is read against by default."""
    return time.time_ns() // 1000


def _nothing() -> Generator[tuple[bytes, bytes], None, None]:
    yield from ()


class ExpiringReads:
    """The reads of one state machine that check expiry while a key has one,
    in any keyspace (see the module docstring). ``reads`` is the state's
    read path (cached read transactions, or fresh ones when opened
    read-only); ``flush`` writes the overlay to LMDB."""

    def __init__(self, env: Environment, overlay: Overlay, expiry: Expiry, reads: CachedReads | FreshReads,
                 flush: Callable[[], None], *, readonly: bool) -> None:
        self.lmdb = env
        self.overlay = overlay
        self.expiry = expiry
        self.reads = reads
        self.flush = flush
        self.readonly = readonly
        self.now_us: Callable[[], int] = now_us
        """The clock reads compare expiry instants with."""

    def expiring(self) -> bool:
        """Whether reads must check expiry: a key has one (a read-only open
        cannot tell, so it checks whenever the metadata exists)."""
        return self.expiry.keys > 0 or (self.readonly and self.expiry.present)

    # -- the default keyspace -------------------------------------------------------

    def get(self, key: object, default: bytes | None = None) -> bytes | None:
        """A get that finds a key expired at ``now_us()`` absent: the overlay
        first (a key written there has no expiry: writes with one go to LMDB,
        and the overlay's flush drops what LMDB held), then the key's value
        and its expiry from one LMDB read transaction."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        overlay = self.overlay
        v = overlay.active.get(key, MISSING)
        if v is MISSING:
            frozen = overlay.frozen
            if frozen is not None:
                v = frozen.get(key, MISSING)
        if v is not MISSING:
            return default if v is None else v  # type: ignore[return-value]  # bytes or None (deleted)
        found = self.reads.run(partial(self.expiry.value_if_alive, self.lmdb.data_db, DEFAULT_KEYSPACE, key,
                                       self.now_us))
        return default if found is None else found

    def get_many(self, keys: Iterable[object], default: bytes | None = None) -> list[bytes | None]:
        """:meth:`get` of each of ``keys``, in order."""
        return [self.get(k, default) for k in keys]

    def count(self) -> int:
        """The number of keys (expired ones not swept yet left out)."""
        return self.count_in(DEFAULT_KEYSPACE)

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """See :func:`kvstore.state.readers.scan` (which flushes the overlay
        before each snapshot it takes); expired keys left out."""
        pairs = scan(self.lmdb, self.flush, lo, hi, reverse)
        return self._alive_pairs(pairs) if self.expiring() else pairs

    def view(self, max_seconds: float) -> View:
        """A consistent view of the state (:class:`kvstore.state.view.View`): of
        LMDB, once the overlay is flushed into it."""
        self.flush()
        return View(self.lmdb, max_seconds, alive=self._alive_check(DEFAULT_KEYSPACE))

    def read_view(self) -> ReadView:
        """The state at one LSN, from one read transaction: ``.lsn``,
        ``.count``, ``.pairs()`` (see :class:`kvstore.state.readers.ReadView`),
        the overlay flushed first, and each keyspace's pairs as snapshot
        sections (``.sections()``). Use as a context manager; it holds off
        map growth while open."""
        self.flush()
        while True:
            epoch, dbs = self._keyspace_dbs()
            view = ReadView(self.lmdb, {KEYSPACE_SECTION + name: db for name, db in dbs.items()})
            if self.lmdb.keyspace_epoch == epoch:
                return view  # every keyspace in its snapshot has its handle (opened before it began)
            view.close()  # a keyspace was created meanwhile: again

    def read_expiry(self, fn: Callable[[lmdb.Transaction, Expiry], Any]) -> Any:
        """``fn(txn, expiry)`` in a fresh read transaction of LMDB (the
        overlay flushed first): what the store's TTL, lease and sweep
        questions read."""
        self.flush()
        return self.lmdb.read(partial(_call_with, fn, self.expiry))

    # -- keyspaces ("": the default one) ----------------------------------------------

    def get_in(self, keyspace: str, key: bytes, default: bytes | None = None) -> bytes | None:
        """``key``'s value in ``keyspace`` ("": the default one), or ``default``."""
        if not keyspace:
            return self.get(key, default) if self.expiring() else self.reads.get(key, default)
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return default
        if self.expiring():  # a fresh transaction: a cached one may predate the handle
            found = self.lmdb.read(partial(self.expiry.value_if_alive, db, keyspace, key, self.now_us))
            return default if found is None else found
        return self.reads.get_in(db, key, default)

    def get_many_in(self, keyspace: str, keys: Iterable[bytes], default: bytes | None = None
                    ) -> list[bytes | None]:
        """The values of ``keys`` in the named ``keyspace``, in order, from
        one read transaction (keyspaces never pass through the overlay)."""
        if not self.expiring():
            return read_in(self.lmdb, keyspace, keys, default)
        wanted = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return [default] * len(wanted)
        return self.lmdb.read(partial(self._values_if_alive, db, keyspace, wanted, default))

    def _values_if_alive(self, db: Any, keyspace: str, keys: list[bytes], default: bytes | None,
                         txn: lmdb.Transaction) -> list[bytes | None]:
        value_if_alive, clock = self.expiry.value_if_alive, self.now_us
        found = [value_if_alive(db, keyspace, k, clock, txn) for k in keys]
        return [default if v is None else v for v in found]

    def scan_in(self, keyspace: str, lo: bytes, hi: bytes | None, reverse: bool = False
                ) -> Generator[tuple[bytes, bytes], None, None]:
        """:meth:`scan` of the named ``keyspace`` (nothing when it does not exist)."""
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return _nothing()
        pairs = scan(self.lmdb, self.flush, lo, hi, reverse, db=db)
        return self._alive_pairs(pairs, keyspace) if self.expiring() else pairs

    def count_in(self, keyspace: str) -> int:
        """The number of keys in ``keyspace`` ("": the default one, the
        overlay flushed first), expired ones not swept yet left out."""
        if not keyspace:
            self.flush()
        db = self.lmdb.keyspace_db(keyspace)
        if db is None:
            return 0
        if not self.expiring():
            return self.lmdb.read(partial(_entries, db))
        return self.lmdb.read(partial(self._alive_entries, db, keyspace, self.now_us()))

    def _alive_entries(self, db: Any, keyspace: str, now: int, txn: lmdb.Transaction) -> int:
        return _entries(db, txn) - self.expiry.expired_keys(txn, now, keyspace)

    def view_in(self, keyspace: str, max_seconds: float) -> View:
        """:meth:`view` of the named ``keyspace``."""
        db = self.lmdb.keyspace_db(keyspace)
        return View(self.lmdb, max_seconds, db=ABSENT if db is None else db, alive=self._alive_check(keyspace))

    def keyspaces(self) -> list[str]:
        """The named keyspaces that hold at least one key, sorted."""
        return sorted(self._keyspace_dbs()[1])

    def _keyspace_dbs(self) -> tuple[int, dict[str, Any]]:
        """``(epoch, {name: handle})`` of the keyspaces that hold a key, the
        handles opened before the read that counted them."""
        env = self.lmdb
        epoch = env.keyspace_epoch
        dbs = {name: env.keyspace_db(name) for name in env.read(env.keyspace_names)}
        return epoch, dict(env.read(partial(_holding_keys, dbs)))

    # -- expiry checks ------------------------------------------------------------------

    def _alive_check(self, keyspace: str) -> Callable[[lmdb.Transaction, bytes], bool] | None:
        """A view's check that a key of ``keyspace`` is not expired (None: no key has an expiry)."""
        if not self.expiring():
            return None
        alive, clock = self.expiry.alive, self.now_us
        return lambda txn, key: alive(txn, keyspace, key, clock())

    def _alive_pairs(self, pairs: Iterator[tuple[bytes, bytes]], keyspace: str = DEFAULT_KEYSPACE
                     ) -> Generator[tuple[bytes, bytes], None, None]:
        """``pairs`` of ``keyspace`` without the keys expired when each chunk of them is checked."""
        while True:
            chunk = list(islice(pairs, ALIVE_CHUNK))
            if not chunk:
                return
            yield from self.lmdb.read(partial(self._alive_in, chunk, keyspace, self.now_us()))

    def _alive_in(self, pairs: list[tuple[bytes, bytes]], keyspace: str, now: int, txn: lmdb.Transaction
                  ) -> list[tuple[bytes, bytes]]:
        alive = self.expiry.alive
        return [kv for kv in pairs if alive(txn, keyspace, kv[0], now)]


def _call_with(fn: Callable[[lmdb.Transaction, Expiry], Any], expiry: Expiry, txn: lmdb.Transaction) -> Any:
    return fn(txn, expiry)


def _entries(db: Any, txn: lmdb.Transaction) -> int:
    return int(txn.stat(db)["entries"])


def _holding_keys(dbs: dict[str, Any], txn: lmdb.Transaction) -> list[tuple[str, Any]]:
    return [(n, db) for n, db in dbs.items() if db is not None and txn.stat(db)["entries"]]
