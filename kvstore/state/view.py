"""A consistent read of several keys: ``with db.view() as v:``.

::

    with db.view() as v:            # one LMDB read transaction: one LSN
        a, b = v.get(b"a"), v[b"b"]
        for key, value in v.scan(prefix=b"user/"): ...
        v.lsn, len(v), b"c" in v

Everything a view returns is the state as of one applied LSN (:attr:`View.lsn`),
however many writers commit meanwhile, as with plyvel's snapshots: a view
is one LMDB read transaction, taken when it is opened.

Its lifetime is bounded, because an open read transaction has a cost:
LMDB cannot reuse any page freed after it began (the file grows while it
is held), and growing LMDB's map needs every transaction of the process
closed, so a writer that fills the map waits for open views. A view is
therefore closed for good once it is older than ``max_seconds`` (default
60): its next use raises :class:`ViewExpiredError`, and a writer that must
grow the map, or the writer's once-a-second sweep, closes it then. A writer
waits for younger views (up to their ``max_seconds``) before growing the
map, except views of its own thread, which it closes at once (their thread
is the one waiting); meanwhile new views wait for the growth. Keep views
short, open one per consistent read, and do not open a second view while
holding one (it may wait for a growth that waits for the first).

Thread-safety: a view is meant for the thread that opened it. Closing the
store closes its views (then :class:`ClosedError`), as does leaving the
``with`` block. In a forked child a view raises :class:`ForkedError`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from itertools import islice
from typing import Any, Final

import lmdb
from mypy_extensions import mypyc_attr

from kvstore.entry.limits import as_bytes
from kvstore.state.lmdb_ops import position, read_error
from kvstore.state.lookups import Lookups
from kvstore.state.readers import ReadSource, begin_in_gate
from wal.errors import ClosedError, ViewExpiredError, WalkvError

DEFAULT_MAX_VIEW_SECONDS: Final = 60.0
ABSENT: Final = object()
"""The ``db`` of a view of a keyspace that does not exist."""
_monotonic = time.monotonic
_CHUNK: Final = 256


def _prefix_end(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string starting with
    ``prefix`` (None: there is none, the prefix is all 0xff)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        return None
    return p[:-1] + bytes((p[-1] + 1,))


def scan_bounds(start: object, stop: object, prefix: object) -> tuple[bytes, bytes | None]:
    """``(lo, hi)`` of a scan with range() semantics, ``start <= key <
    stop``, narrowed to keys starting with ``prefix``."""
    lo = b"" if start is None else as_bytes(start, "start")
    hi = None if stop is None else as_bytes(stop, "stop")
    if prefix is not None:
        prefix = as_bytes(prefix, "prefix")
        if prefix > lo:
            lo = prefix
        pend = _prefix_end(prefix)
        if pend is not None and (hi is None or pend < hi):
            hi = pend
    return lo, hi


@mypyc_attr(native_class=False)  # the environment holds views weakly: compiled classes take no weak references
class View(Lookups):
    """One consistent read of the store (see the module docstring). Create
    with :meth:`kvstore.KVStore.view`. :attr:`lsn` is the applied LSN it
    sees: every write up to it, none after. ``db``: the database it reads
    (a keyspace's, opened before the view; None: ``data``, the default
    keyspace; :data:`ABSENT`: a keyspace that does not exist, read as empty)."""

    __slots__ = ("_state", "_txn", "_error", "busy", "lsn", "_count", "opened", "max_seconds",
                 "owner", "_db", "_alive", "__weakref__")

    def __init__(self, state: ReadSource, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS, db: Any = None, *,
                 alive: Callable[[lmdb.Transaction, bytes], bool] | None = None) -> None:
        """``alive(txn, key)``: whether a key present is not expired (None:
        no key has an expiry; :mod:`kvstore.state.expiry`)."""
        if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or max_seconds <= 0:
            raise ValueError(f"max_seconds must be a positive number, not {max_seconds!r}")
        self._state = state
        self._txn: lmdb.Transaction | None = None
        self._error: WalkvError = ClosedError("this view was closed (its with-block ended); take a new one")
        self.busy = False
        self.max_seconds = float(max_seconds)
        self.owner = threading.get_ident()
        self._db = db
        self._alive = alive
        state.views_allowed.wait()  # a remap waiting for views goes first
        state.enter_read()
        try:
            txn = begin_in_gate(state)
            try:
                self.lsn = state.applied_in(txn)
                self._count = 0 if db is ABSENT else txn.stat(db or state.data_db)["entries"]
            except BaseException:
                txn.abort()
                raise
            self._txn = txn
            self.opened = _monotonic()
            state.register_view(self)  # inside the gate: no remap can miss it
        except lmdb.Error as exc:
            raise read_error(exc, state.path) from None
        finally:
            state.gate.exit()

    # -- the handshake with the writer (kvstore.state.readers.ReadGate) ------------

    def _enter(self) -> lmdb.Transaction:
        self._state.gate.announce(self)
        txn = self._txn
        if txn is None:
            self.busy = False
            raise self._error
        if _monotonic() - self.opened > self.max_seconds:
            self._end(txn, self._expired())
            self.busy = False
            raise self._error
        return txn

    def _end(self, txn: lmdb.Transaction, error: WalkvError) -> None:
        self._txn = None
        self._error = error
        try:
            txn.abort()
        except lmdb.Error:
            pass

    def _expired(self, why: str = "") -> ViewExpiredError:
        age = _monotonic() - self.opened
        return ViewExpiredError(
            f"this view of {self._state.path} (LSN {self.lsn}) was opened {age:.1f} s ago "
            f"and is closed{why or f': it is over its limit of max_seconds={self.max_seconds:g}'}. "
            f"An open view pins LMDB's pages and holds off growth of the map; take a new view "
            f"for each consistent read and keep it short.")

    def kill(self, error: WalkvError) -> None:
        """Close from the writer's side: only with the read gate held
        exclusively (the view is not inside LMDB)."""
        if self._txn is not None:
            self._end(self._txn, error)

    @property
    def expired(self) -> bool:
        return _monotonic() - self.opened > self.max_seconds

    @property
    def open(self) -> bool:
        return self._txn is not None

    # -- reading ------------------------------------------------------------

    def get(self, key: object, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` as of :attr:`lsn`, or ``default``."""
        if type(key) is not bytes:
            key = as_bytes(key, "key")
        txn = self._enter()
        try:
            if self._db is ABSENT:
                return default
            v = txn.get(key, None, self._db)
            if v is None or (self._alive is not None and not self._alive(txn, key)):
                return default
            return v  # type: ignore[return-value]  # bytes: never buffers=True
        except lmdb.BadValsizeError:
            return default
        except lmdb.Error as exc:
            raise read_error(exc, self._state.path) from None
        finally:
            self.busy = False

    def __len__(self) -> int:
        """The number of keys as of :attr:`lsn`."""
        self._enter()
        self.busy = False
        return self._count

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False
             ) -> Generator[tuple[bytes, bytes], None, None]:
        """``(key, value)`` pairs as of :attr:`lsn`, in key order (descending
        when ``reverse``), with :meth:`kvstore.KVStore.scan`'s bounds."""
        lo, hi = scan_bounds(start, stop, prefix)
        return self._scan(lo, hi, reverse)

    def _scan(self, lo: bytes, hi: bytes | None, reverse: bool) -> Generator[tuple[bytes, bytes], None, None]:
        it = None
        first = True
        while True:
            txn = self._enter()
            try:
                if first:
                    first = False
                    it = None if self._db is ABSENT else position(txn.cursor(self._db), lo, hi, None, reverse)
                chunk = list(islice(it, _CHUNK)) if it is not None else []
                n = len(chunk)
                alive = self._alive
                if alive is not None:
                    chunk = [kv for kv in chunk if alive(txn, kv[0])]
            except lmdb.Error as exc:
                raise read_error(exc, self._state.path) from None
            finally:
                self.busy = False
            for kv in chunk:
                if (kv[0] < lo) if reverse else (hi is not None and kv[0] >= hi):
                    return
                yield kv
            if n < _CHUNK:
                return

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Let go of the view's read transaction. Idempotent."""
        if self._txn is None:
            return
        if self._state.closed:  # the store closed it (or this is a forked child)
            self._txn = None
            return
        self._state.gate.announce(self)
        try:
            if self._txn is not None:
                self._end(self._txn, ClosedError("this view was closed (its with-block ended); "
                                                 "take a new one"))
        finally:
            self.busy = False

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> View:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<walkv View LSN {self.lsn} {'open' if self._txn is not None else 'closed'}>"
