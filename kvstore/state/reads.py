"""Reading keys: the two read paths a state (:class:`kvstore.state.machine.State`)
chooses between when it is opened.

* :class:`CachedReads` (read-write opens): a get looks in the overlay
  (:mod:`kvstore.state.overlay`; :meth:`CachedReads.get`, one dictionary
  look-up while only ``active`` holds writes), or, while the overlay is
  empty, not at all (:meth:`CachedReads.get_lmdb`, which the state uses
  then), then is one LMDB lookup in this thread's
  cached read transaction (:class:`kvstore.state.readers.Reader`), renewed
  only when a commit happened since (the environment's ``gen``), so reads
  take no lock. The writer holds readers out of LMDB for a moment
  (:class:`kvstore.state.readers.ReadGate`) to grow the map, drop idle
  threads' stale transactions, or close.
* :class:`FreshReads` (read-only opens, another process writes): a fresh
  read transaction per get, since there is no local commit counter to cache
  against, and no overlay.

Which of them a state's get is at each moment is :class:`GetSelection`'s.
Reads of LMDB as a whole (scans, views, counts) are the state's: they flush
the overlay first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Final, Protocol, TypeVar

import lmdb

from kvstore.entry.limits import MAX_KEY_BYTES, as_bytes
from kvstore.state.environment import Environment
from kvstore.state.lmdb_ops import read_error
from kvstore.state.overlay import MISSING, Overlay
from kvstore.state.readers import Reader, ReaderHandle


class Get(Protocol):
    """A get: the value of ``key``, or ``default``."""

    def __call__(self, key: object, default: bytes | None = None, /) -> bytes | None: ...


GetMany = Callable[..., "list[bytes | None]"]
"""A get_many: the values of ``keys`` (``default`` for absent ones), in order."""

GET_MANY_CHUNK: Final = 1024
"""Keys :meth:`CachedReads.get_many` looks up per pass (the writer waits at
most one pass to hold readers out)."""
_get_ident: Final = threading.get_ident
T = TypeVar("T")


class CachedReads:
    """Gets through the overlay and each thread's cached read transaction
    of ``env`` (see the module docstring)."""

    def __init__(self, env: Environment, overlay: Overlay) -> None:
        self._env = env
        self._overlay = overlay
        self._generation = env.generation
        self._local = threading.local()
        self._r0 = Reader()  # the last reading thread's reader (fast path)
        self._h0: ReaderHandle | None = None  # its handle: the environment tracks the reader while it lives

    def _reader(self) -> Reader:
        """This thread's reader (created and registered on first use), made
        the fast path's."""
        try:
            h = self._local.r
        except AttributeError:
            h = self._local.r = ReaderHandle(Reader(_get_ident()))
            self._env.register_reader(h)
        self._h0 = h
        self._r0 = r = h.reader
        return r

    def _renew(self, r: Reader) -> lmdb.Transaction:
        env = self._env
        gen = self._generation.value  # read before begin: never record a newer gen than the snapshot
        t = r.txn
        if t is not None:
            r.txn = None
            try:
                t.abort()
            except lmdb.Error:
                pass
        t = r.txn = env.env.begin(db=env.data_db)
        r.gen = gen
        return t

    def get(self, key: object, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` or ``default``; sees every group applied
        before it was called: in the overlay's active dictionary, its frozen
        one, or LMDB, looked at in that order (:mod:`kvstore.state.overlay` says
        why no write is missed between them)."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        overlay = self._overlay
        v = overlay.active.get(key, MISSING)
        if v is MISSING:
            frozen = overlay.frozen
            if frozen is None:
                return self.get_lmdb(key, default)
            v = frozen.get(key, MISSING)
            if v is MISSING:
                return self.get_lmdb(key, default)
        return default if v is None else v  # type: ignore[return-value]  # bytes or None (deleted)

    def get_lmdb(self, key: object, default: bytes | None = None) -> bytes | None:
        """:meth:`get` while the overlay is empty: one LMDB lookup in this
        thread's cached read transaction."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        r = self._r0
        if r.ident != _get_ident():
            r = self._reader()  # the last thread to read goes fast
        r.busy = True
        try:
            if r.gen == self._generation.value:
                # r.txn is set whenever r.gen matches; values are bytes (no buffers=True)
                return r.txn.get(key, default)  # type: ignore[union-attr,return-value]
        except lmdb.BadValsizeError:
            return default  # an empty or over-long key: no such key can exist
        except lmdb.Error:
            pass
        finally:
            r.busy = False
        return self._get_slow(r, key, default)

    def get_many(self, keys: Iterable[object], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (``default`` for absent ones), in order:
        each as :meth:`get` would return it, looked up in chunks of
        :data:`GET_MANY_CHUNK` keys, each chunk one pass through this
        thread's read transaction (one Python call per chunk, not per key).
        Not one snapshot across chunks: for that, a view."""
        wanted = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
        out: list[bytes | None] = []
        for i in range(0, len(wanted), GET_MANY_CHUNK):
            chunk = wanted[i:i + GET_MANY_CHUNK]
            overlay = self._overlay  # looked at before LMDB, as get() does
            if overlay.active or overlay.frozen is not None:
                out.extend(self.get(k, default) for k in chunk)
                continue
            r = self._r0
            if r.ident != _get_ident():
                r = self._reader()
            r.busy = True
            done = False  # no `continue` in the try: mypyc compiles none inside try/finally
            try:
                txn = r.txn if r.gen == self._generation.value else None
                if txn is not None:
                    get = txn.get
                    out.extend([get(k, default) for k in chunk])  # type: ignore[misc]  # bytes: no buffers=True
                    done = True
            except lmdb.Error:
                pass  # an empty or over-long key, a dead transaction: key by key below
            finally:
                r.busy = False
            if not done:
                out.extend(self.get(k, default) for k in chunk)
        return out

    def get_in(self, db: Any, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` in the keyspace database ``db`` (never in the
        overlay: keyspaces' groups are written to LMDB at once), through this
        thread's cached read transaction as :meth:`get`; a transaction begun
        before ``db`` was opened cannot see it, so any LMDB error renews it."""
        r = self._r0
        if r.ident != _get_ident():
            r = self._reader()
        r.busy = True
        try:
            if r.gen == self._generation.value:
                return r.txn.get(key, default, db)  # type: ignore[union-attr,return-value]
        except lmdb.BadValsizeError:
            return default
        except lmdb.Error:
            pass
        finally:
            r.busy = False
        return self._in_txn(r, partial(_lookup, key, default, db), renew=True)

    def run(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in this thread's cached read transaction (renewed when
        a commit happened since): several lookups from one snapshot."""
        r = self._r0
        if r.ident != _get_ident():
            r = self._reader()
        return self._in_txn(r, fn)

    def _get_slow(self, r: Reader, key: bytes, default: bytes | None) -> bytes | None:
        """A commit happened since this thread's last read, or a writer holds
        the gate, or the cached transaction died: renew it."""
        return self._in_txn(r, partial(_lookup, key, default, None))

    def _in_txn(self, r: Reader, fn: Callable[[lmdb.Transaction], T], renew: bool = False) -> T:
        """``fn(txn)`` in ``r``'s transaction, renewed if a commit happened
        since (``renew``: always, as a transaction may predate a keyspace's
        handle), announced by the reader's ``busy`` flag, as on the fast path."""
        env = self._env
        env.gate.announce(r)
        try:
            if env.closed:
                raise env.closed_error()
            txn = self._renew(r) if renew or r.gen != self._generation.value or r.txn is None else r.txn
            return fn(txn)
        except lmdb.Error as exc:
            if env.closed:
                raise env.closed_error() from None
            raise read_error(exc, env.path) from None
        finally:
            r.busy = False


def _lookup(key: bytes, default: bytes | None, db: Any, txn: lmdb.Transaction) -> bytes | None:
    try:
        return txn.get(key, default, db)  # type: ignore[return-value]  # bytes: walkv never sets buffers=True
    except lmdb.BadValsizeError:
        return default  # an empty or over-long key: no such key can exist


class FreshReads:
    """Gets of a read-only open: each in a fresh read transaction of ``env``
    (another process writes, so there is no commit counter to cache against)."""

    def __init__(self, env: Environment) -> None:
        self._env = env

    def get(self, key: object, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` or ``default``, as LMDB holds it now."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        env = self._env
        for attempt in (0, 1):
            env.enter_read()
            try:
                return self._plain_get(key, default)
            except lmdb.MapResizedError as exc:
                if attempt:
                    raise read_error(exc, env.path) from None
            finally:
                env.gate.exit()
            env.adopt_mapsize()  # the writer grew the map
        raise AssertionError("unreachable")

    def _plain_get(self, key: bytes, default: bytes | None) -> bytes | None:
        env = self._env
        try:
            txn = env.env.begin(db=env.data_db)
            try:
                v = txn.get(key)
            finally:
                txn.abort()
        except lmdb.BadValsizeError:
            return default
        except lmdb.MapResizedError:
            raise
        except lmdb.Error as exc:
            raise read_error(exc, env.path) from None
        return default if v is None else v

    def run(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in a fresh read transaction."""
        return self._env.read(fn)

    def get_many(self, keys: Iterable[object], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (``default`` for absent ones), in order,
        each as :meth:`get` returns it."""
        wanted = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
        return [self.get(k, default) for k in wanted]

    def get_in(self, db: Any, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` in the keyspace database ``db``, as LMDB holds it now."""
        return read_in_db(self._env, db, [key], default)[0]


def read_in(env: Environment, keyspace: str, keys: Iterable[bytes], default: bytes | None
            ) -> list[bytes | None]:
    """The values of ``keys`` (``default`` for absent ones) in the named
    ``keyspace``, from one fresh read transaction: a keyspace is never in the
    overlay (:meth:`kvstore.state.machine.State.apply` writes its groups to
    LMDB at once), and its handle is opened before the transaction begins,
    as LMDB requires."""
    keys = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
    db = env.keyspace_db(keyspace)
    if db is None:
        return [default] * len(keys)
    return read_in_db(env, db, keys, default)


def read_in_db(env: Environment, db: Any, keys: list[bytes], default: bytes | None) -> list[bytes | None]:
    """The values of ``keys`` (bytes) in the database ``db``, from one fresh read transaction."""
    def read(txn: lmdb.Transaction) -> list[bytes | None]:
        get = txn.get
        return [get(k, default, db) if 0 < len(k) <= MAX_KEY_BYTES else default  # type: ignore[misc]
                for k in keys]  # bytes: walkv never sets buffers=True
    return env.read(read)


class GetSelection:
    """Which get and get_many of the default keyspace a state serves, as it
    changes. :class:`~kvstore.state.machine.State` exposes the chosen pair as
    its ``get`` and ``get_many``, the functions themselves rather than State
    methods that call them, so that a get costs no extra Python call (the
    store calls ``state.get`` once per user get); ``publish(get, get_many)``
    sets them.

    * A read-write open's ``reads`` (:class:`CachedReads`): while the overlay
      is empty, :meth:`CachedReads.get_lmdb`, which does not look in it; while
      it holds writes, :meth:`CachedReads.get` (:meth:`overlay_occupied`).
      A read-only open's (:class:`FreshReads`): its get.
    * While a key has an expiry (``must_check()``), ``checking``, the pair
      that finds an expired key absent
      (:class:`kvstore.state.expiring_reads.ExpiringReads`), whatever the
      overlay holds (:meth:`expiry_changed`).

    Both switches publish under the overlay's ``lock`` (the overlay calls
    :meth:`overlay_occupied` holding it), so that neither is lost to the other.
    """

    def __init__(self, reads: CachedReads | FreshReads, checking: tuple[Get, GetMany], must_check: Callable[[], bool],
                 lock: Any, publish: Callable[[Get, GetMany], None]) -> None:
        self._reads = reads
        self._checking_pair = checking
        self._must_check = must_check
        self._lock = lock
        self._publish = publish
        self._plain_get: Get = reads.get if isinstance(reads, FreshReads) else reads.get_lmdb
        self._plain_get_many: GetMany = reads.get_many
        self.checking = False
        """Whether the state's get is the one that checks expiry."""
        publish(self._plain_get, self._plain_get_many)
        self.expiry_changed()

    def overlay_occupied(self, occupied: bool) -> None:
        """The overlay took its first write (``occupied``) or a flush left it
        empty (called under its lock, :mod:`kvstore.state.overlay`): gets look
        in it, or go straight to LMDB."""
        reads = self._reads
        assert isinstance(reads, CachedReads), "only a read-write open has an overlay"
        self._plain_get = reads.get if occupied else reads.get_lmdb
        if not self.checking:
            self._publish(self._plain_get, self._plain_get_many)

    def expiry_changed(self) -> None:
        """Serve the plain pair, or the one that checks expiry while a key has one."""
        checking = self._must_check()
        if checking == self.checking:
            return
        with self._lock:
            self.checking = checking
            if checking:
                self._publish(*self._checking_pair)
            else:
                self._publish(self._plain_get, self._plain_get_many)
