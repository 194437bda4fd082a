"""The read side of the LMDB state machine: cached per-thread read
transactions, gets, consistent views and scans (:class:`StateReads`, which
:class:`kvstore.state.machine.State` extends with the writer's side).

A get is one LMDB lookup in this thread's cached read transaction
(:class:`kvstore.state.readers.Reader`), renewed only when a commit happened since
(``gen``), so reads take no lock. The writer holds readers out of LMDB for a
moment (:class:`kvstore.state.readers.ReadGate`) to grow the map, drop idle threads'
stale transactions, or close. Read-only opens (another process writes) take a
fresh transaction per get: :class:`kvstore.state.machine.ReadOnlyState`.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

import lmdb

from kvstore.entry.codec import as_bytes
from kvstore.state.lmdb_ops import read_error
from kvstore.state.overlay import MISSING, Overlay
from kvstore.state.readers import Reader, ReadGate, ReadView
from kvstore.state.readers import scan as _scan
from kvstore.state.view import View
from wal.errors import ClosedError, ForkedError
from wal.forkguard import Refusing, forked_error, keep_forever

K_APPLIED = b"walkv.applied"
GET_MANY_CHUNK = 1024
"""Keys :meth:`StateReads.get_many` looks up per pass (the writer waits at
most one pass to hold readers out)."""
_U64 = struct.Struct("<Q")
_get_ident = threading.get_ident
T = TypeVar("T")


class StateReads:
    """The read side of one LMDB environment (see the module docstring).
    Subclasses open ``env`` and set ``main_db`` and ``data_db``."""

    env: lmdb.Environment
    main_db: Any
    data_db: Any
    readonly: bool

    def __init__(self, path: str) -> None:
        self.path = path
        self._closed = False
        self.gen = 0              # bumped after every commit and remap
        self.map_gen = 0          # bumped whenever open transactions die
        self._local = threading.local()
        self._readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self._views: weakref.WeakSet[View] = weakref.WeakSet()
        self.views_allowed = threading.Event()  # cleared while a remap waits for views
        self.views_allowed.set()
        self.dead_gets = 0
        self.gate = ReadGate(self._reader_list, self._on_block, self._on_release)
        self._held_gen = 0
        self._r0 = Reader(None)  # the last reading thread's reader (fast path)
        self._pid = os.getpid()
        self._forked = False  # State.__init__ tracks it (wal.forkguard) once env is open
        self.overlay = Overlay()  # applied, not yet in LMDB (kvstore/state/overlay.py)

    def flush(self) -> None:
        """Write what the overlay holds to LMDB (:meth:`kvstore.state.machine.State.flush`);
        reads of LMDB as a whole call it first."""

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): LMDB must not be used
        across fork, so every read and write raises ForkedError (the get
        fast path misses on ``gen``, every other path passes the gate) and
        close() does nothing. Nothing to do if it was closed before the fork."""
        if self._closed:
            return
        self._forked = True
        self._closed = True
        self.overlay = Overlay()  # the parent's writes are not this process's to read
        self.gen = -7  # no cached transaction carries it
        self.gate = Refusing(f"the LMDB environment {self.path}", self._pid)  # type: ignore[assignment]
        keep_forever(self.env, self.path, self._pid)

    def adopt_mapsize(self) -> None:
        """Read-only: another process grew the map; adopt its size."""
        gate = self.gate
        self.exclusive_without_views()
        try:
            self.env.set_mapsize(0)
            self.map_gen += 1
        finally:
            gate.release_exclusive()

    def _reader_list(self) -> list[Reader | View]:
        """Whatever may be inside LMDB: the gate waits for their ``busy``."""
        with self._readers_lock:
            return [*self._readers, *self._views]

    # -- consistent views (kvstore/state/view.py) -----------------------------------

    def view(self, max_seconds: float) -> View:
        """A consistent view of the state (:class:`kvstore.state.view.View`): of
        LMDB, once the overlay is flushed into it."""
        self.flush()
        return View(self, max_seconds)

    def register_view(self, view: View) -> None:
        with self._readers_lock:
            self._views.add(view)

    def _open_views(self) -> list[View]:
        with self._readers_lock:
            return [v for v in self._views if v.open]

    def _close_views(self, *, every: bool) -> bool:
        """With the gate held exclusively: close expired views (``every``:
        all of them, the store is closing) and views of this thread (it is
        the one that would wait for them); True if other views stay open."""
        me = threading.get_ident()
        left = False
        for v in self._open_views():
            if every:
                v.kill(self._closed_error())
            elif v.expired:
                v.kill(v._expired())
            elif v.owner == me:
                v.kill(v._expired(": LMDB's map had to grow while it was open in the thread that wrote"))
            else:
                left = True
        return left

    def exclusive_without_views(self) -> None:
        """Hold the gate exclusively with no view open (to remap): close
        expired views and this thread's, wait for the others to close or
        expire (see :mod:`kvstore.state.view`)."""
        gate = self.gate
        delay = 0.0005
        self.views_allowed.clear()  # no new view until then: a stream of views would starve it
        try:
            while True:
                gate.acquire_exclusive()
                if not self._close_views(every=False):
                    return
                gate.release_exclusive()
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        finally:
            self.views_allowed.set()  # new ones wait at the gate until the remap ends

    def expire_views(self) -> None:
        """Close views over their time limit (the writer's periodic sweep),
        so that a forgotten view pins pages for a bounded time."""
        if not any(v.expired for v in self._open_views()):
            return
        gate = self.gate
        gate.acquire_exclusive(cached_only=True)
        try:
            for v in self._open_views():
                if v.expired:
                    v.kill(v._expired())
        finally:
            gate.release_exclusive()

    def _sweep(self) -> None:
        """Drop cached read transactions older than the newest commit, so an
        idle reading thread does not pin old pages."""
        with self._readers_lock:
            readers = list(self._readers)
        gen = self.gen
        if not any(r.txn is not None and r.gen != gen for r in readers):
            return
        gate = self.gate
        gate.acquire_exclusive(cached_only=True)
        try:
            for r in readers:
                if r.txn is not None and r.gen != gen:
                    try:
                        r.txn.abort()
                    except lmdb.Error:
                        pass
                    r.txn = None
                    r.gen = -1
        finally:
            gate.release_exclusive()

    # -- reading ------------------------------------------------------------

    def _on_block(self) -> None:
        # A writer wants LMDB to itself: no cached transaction matches -2.
        self._held_gen = self.gen
        self.gen = -2

    def _on_release(self) -> None:
        # Every cached transaction predates what the writer did: renew.
        self.gen = self._held_gen + 1

    def _reader(self) -> Reader:
        """This thread's reader (created and registered on first use)."""
        try:
            return self._local.r
        except AttributeError:
            pass
        r = Reader(self, _get_ident())
        self._local.r = r
        with self._readers_lock:
            self._readers.add(r)
        return r

    def _renew(self, r: Reader) -> lmdb.Transaction:
        gen = self.gen  # read before begin: never record a newer gen than the snapshot
        t = r.txn
        if t is not None:
            r.txn = None
            try:
                t.abort()
            except lmdb.Error:
                pass
        t = r.txn = self.env.begin(db=self.data_db)
        r.gen = gen
        return t

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` or ``default``; sees every group applied
        before it was called: in the overlay's active dictionary, its frozen
        one, or LMDB, looked at in that order (:mod:`kvstore.state.overlay` says
        why no write is missed between them)."""
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
        r = self._r0
        if r.ident != _get_ident():
            r = self._r0 = self._reader()  # the last thread to read goes fast
        r.busy = True
        try:
            if r.gen == self.gen:
                r.gets += 1
                # r.txn is set whenever r.gen matches; values are bytes (no buffers=True)
                return r.txn.get(key, default)  # type: ignore[union-attr,return-value]
        except lmdb.BadValsizeError:
            return default  # an empty or over-long key: no such key can exist
        except lmdb.Error:
            pass
        finally:
            r.busy = False
        return self._get_slow(r, key, default)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (``default`` for absent ones), in order:
        each as :meth:`get` would return it, looked up in chunks of
        :data:`GET_MANY_CHUNK` keys, each chunk one pass through this
        thread's read transaction (one Python call per chunk, not per key).
        Not one snapshot across chunks: for that, a view."""
        keys = [k if type(k) is bytes else as_bytes(k, "key") for k in keys]
        if self.readonly:
            return [self.get(k, default) for k in keys]
        out: list[bytes | None] = []
        for i in range(0, len(keys), GET_MANY_CHUNK):
            chunk = keys[i:i + GET_MANY_CHUNK]
            overlay = self.overlay  # looked at before LMDB, as get() does
            if overlay.active or overlay.frozen is not None:
                out.extend(self.get(k, default) for k in chunk)
                continue
            r = self._r0
            if r.ident != _get_ident():
                r = self._r0 = self._reader()
            r.busy = True
            try:
                txn = r.txn if r.gen == self.gen else None
                if txn is not None:
                    get = txn.get
                    out.extend([get(k, default) for k in chunk])  # type: ignore[misc]  # bytes: no buffers=True
                    r.gets += len(chunk)
                    continue
            except lmdb.Error:
                pass  # an empty or over-long key, a dead transaction: key by key below
            finally:
                r.busy = False
            out.extend(self.get(k, default) for k in chunk)
        return out

    def _get_slow(self, r: Reader, key: bytes, default: bytes | None) -> bytes | None:
        """A commit happened since this thread's last read, or a writer holds
        the gate, or the cached transaction died: renew it (announced by the
        reader's ``busy`` flag, as on the fast path)."""
        self.gate.announce(r)
        try:
            if self._closed:
                raise self._closed_error()
            txn = self._renew(r) if r.gen != self.gen or r.txn is None else r.txn
            r.gets += 1
            return txn.get(key, default)  # type: ignore[return-value]  # bytes: walkv never sets buffers=True
        except lmdb.BadValsizeError:
            return default
        except lmdb.Error as exc:
            if self._closed:
                raise self._closed_error() from None
            raise read_error(exc, self.path) from None
        finally:
            r.busy = False

    def _plain_get(self, key: bytes, default: bytes | None) -> bytes | None:
        try:
            txn = self.env.begin(db=self.data_db)
            try:
                v = txn.get(key)
            finally:
                txn.abort()
        except lmdb.BadValsizeError:
            return default
        except lmdb.MapResizedError:
            raise
        except lmdb.Error as exc:
            raise read_error(exc, self.path) from None
        return default if v is None else v

    def _get_uncached(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """Read-only opens: a fresh read transaction per get (another process
        writes, so there is no commit counter to cache against)."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        for attempt in (0, 1):
            self.enter_read()
            try:
                return self._plain_get(key, default)
            except lmdb.MapResizedError as exc:
                if attempt:
                    raise read_error(exc, self.path) from None
            finally:
                self.gate.exit()
            self.adopt_mapsize()  # the writer grew the map
        raise AssertionError("unreachable")

    @property
    def gets(self) -> int:
        with self._readers_lock:
            return self.dead_gets + sum(r.gets for r in self._readers)

    def enter_read(self) -> None:
        gate = self.gate
        gate.enter()
        if self._closed:
            gate.exit()
            raise self._closed_error()

    def _read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in a fresh read transaction, inside the gate."""
        for attempt in (0, 1):
            self.enter_read()
            try:
                try:
                    with self.env.begin(db=self.data_db) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    if attempt:
                        raise
                except lmdb.Error as exc:
                    raise read_error(exc, self.path) from None
            finally:
                self.gate.exit()
            self.adopt_mapsize()
        raise AssertionError("unreachable")

    def read_meta_applied(self) -> int:
        """The applied LSN as LMDB holds it now (read-only opens: the
        writer's progress)."""
        return self._read(self.applied_in)

    def applied_in(self, txn: lmdb.Transaction) -> int:
        """The applied LSN recorded in ``txn``'s snapshot of LMDB."""
        v = txn.get(K_APPLIED, db=self.main_db)
        return _U64.unpack(v)[0] if v and len(v) == 8 else 0

    def read_view(self) -> ReadView:
        """The state at one LSN, from one read transaction: ``.lsn``,
        ``.count``, ``.pairs()`` (see :class:`kvstore.state.readers.ReadView`),
        the overlay flushed first. Use as a context manager; it holds off
        map growth while open."""
        self.flush()
        return ReadView(self)

    def count(self) -> int:
        self.flush()
        data = self.data_db
        return self._read(lambda txn: txn.stat(data)["entries"])

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """See :func:`kvstore.state.readers.scan` (which flushes the overlay
        before each snapshot it takes)."""
        return _scan(self, lo, hi, reverse)

    # -- lifecycle ----------------------------------------------------------

    def _closed_error(self) -> ClosedError | ForkedError:
        if self._forked:
            return forked_error(f"the LMDB environment {self.path}", self._pid)
        return ClosedError(f"the store {os.path.dirname(self.path)} is closed")

    @property
    def closed(self) -> bool:
        return self._closed
