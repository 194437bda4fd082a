"""The read side of the LMDB state machine (kvstore/state/machine.py): concurrency and scans.

One thread at a time writes; any number of threads read. Each reading thread
keeps one cached read transaction (:class:`Reader`). Growing the map, closing,
and dropping idle threads' stale read transactions need every reader out of
LMDB for a moment: :class:`ReadGate` gives the writer that moment with no lock
on the read path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from itertools import islice
from typing import Any, Final, Protocol, TypeVar, final

import lmdb
from mypy_extensions import mypyc_attr

from kvstore.state.lmdb_ops import position, read_error
from wal.errors import ClosedError
from wal.forkguard import Refusing

SCAN_HOLD_SECONDS = 0.5
"""A scan renews its read transaction between chunks once it is older than
this (see :func:`scan`)."""
_monotonic: Final = time.monotonic
T = TypeVar("T")


class ReadGate:
    """Readers run concurrently; the writer can wait for a moment when no
    reader is inside LMDB (to remap, sweep stale transactions, or close).

    A reader announces itself, then checks :attr:`blocking`; the writer sets
    :attr:`blocking`, then waits until no reader is announced. Either the
    writer sees the reader or the reader sees the flag (Dekker's handshake;
    the GIL orders the steps), so there is no lock on the read path. A reader
    that sees the flag steps back and waits on the writer's mutex.

    Readers announce themselves in one of two ways: a thread's cached
    :class:`Reader` sets its ``busy`` flag (the get fast path: two field
    stores), anything else appends to :attr:`active` (atomic under the GIL).
    The get fast path does not even read :attr:`blocking`: ``on_block`` sets
    the environment's :class:`Generation` to a value no cached transaction
    carries, so the one comparison the fast path makes anyway sends it to the
    slow path.
    """

    __slots__ = ("active", "blocking", "_mutex", "_readers", "_on_block", "_on_release")

    def __init__(self, readers, on_block, on_release) -> None:
        self.active: list[None] = []
        self.blocking = False
        self._mutex = threading.Lock()
        self._readers = readers  # () -> list of registered Reader
        self._on_block = on_block
        self._on_release = on_release

    def enter(self) -> None:
        active = self.active
        while True:
            active.append(None)
            if not self.blocking:
                return
            active.pop()
            with self._mutex:
                pass

    def exit(self) -> None:
        self.active.pop()

    def wait(self) -> None:
        """A reader saw :attr:`blocking`: wait for the writer to finish."""
        with self._mutex:
            pass

    def announce(self, reader: Any) -> None:
        """Set ``reader.busy`` (a :class:`Reader`'s or a view's) once no
        writer is waiting for readers to leave; the caller clears it when it
        leaves LMDB."""
        while True:
            reader.busy = True
            if not self.blocking:
                return
            reader.busy = False
            self.wait()

    def acquire_exclusive(self, *, cached_only: bool = False) -> None:
        """Wait until no reader is inside LMDB and keep new ones out.
        ``cached_only``: wait only for users of the threads' cached
        transactions (what a sweep touches), not for scans and snapshot
        views, which may take long."""
        self._mutex.acquire()
        self.blocking = True
        self._on_block()
        readers = self._readers()  # taken after the flag: later ones see it
        active = () if cached_only else self.active
        spins = 0
        while active or any(r.busy for r in readers):
            spins += 1
            time.sleep(0 if spins < 100 else 0.0005)

    def release_exclusive(self) -> None:
        self._on_release()
        self.blocking = False
        self._mutex.release()


class ReadSource(Protocol):
    """What readers need of the LMDB environment they read
    (:class:`kvstore.state.environment.Environment`)."""

    path: str
    env: lmdb.Environment
    data_db: Any
    gate: ReadGate | Refusing  # Refusing in a forked child (wal.forkguard)
    map_gen: int

    @property
    def closed(self) -> bool: ...

    def enter_read(self) -> None:
        """Pass the gate (ClosedError when closed)."""

    def adopt_mapsize(self) -> None:
        """Take up the map size another thread grew LMDB to."""

    def applied_in(self, txn: lmdb.Transaction) -> int:
        """The applied LSN ``txn`` sees."""
        ...

    @property
    def views_allowed(self) -> threading.Event:
        """Cleared while a remap waits for open views (new views wait)."""
        ...

    def register_view(self, view: Any) -> None:
        """Track an open :class:`kvstore.state.view.View` (closed with the environment)."""


def begin_in_gate(state: ReadSource) -> lmdb.Transaction:
    """A read transaction, the gate entered (``state.enter_read()``); when
    another process grew the map, adopt its size (leaving the gate for it)
    and begin again."""
    try:
        return state.env.begin(db=state.data_db)
    except lmdb.MapResizedError:
        state.gate.exit()
        state.adopt_mapsize()
        state.enter_read()
        return state.env.begin(db=state.data_db)


@final
class Generation:
    """The environment's commit counter: bumped after every commit and remap,
    and set to a value no cached transaction carries while a writer holds
    the gate or the process forked. A thread's cached read transaction is
    current while its reader's ``gen`` equals it. A compiled class, so the
    get fast path reads it as a C field."""

    def __init__(self) -> None:
        self.value = 0


@final
class Reader:
    """One thread's cached read transaction (``txn``, current while ``gen``
    equals the environment's :class:`Generation`), announced by ``busy``
    while the thread is inside LMDB. Compiled: a get reads and writes these
    fields without a dictionary."""

    def __init__(self, ident: int = -1) -> None:
        self.txn: lmdb.Transaction | None = None
        self.gen = -1
        self.busy = False
        self.ident = ident


@mypyc_attr(native_class=False)  # compiled classes take no weak references
class ReaderHandle:
    """What a thread keeps of its :class:`Reader` (in a thread-local), and
    what the environment holds weakly: when the thread ends, the handle goes,
    the environment forgets the reader, and its transaction is aborted."""

    __slots__ = ("reader", "__weakref__")

    def __init__(self, reader: Reader) -> None:
        self.reader = reader


def scan(state: ReadSource, flush: Callable[[], None], lo: bytes, hi: bytes | None, reverse: bool = False,
         *, db: Any = None) -> Generator[tuple[bytes, bytes], None, None]:
    """Yield (key, value) for ``lo <= key < hi`` (``hi`` None: no bound;
    bounds of any length), ascending or descending, of the database ``db``
    (a keyspace's; None: ``data``, the default keyspace).

    Each snapshot is taken after ``flush()`` wrote the overlay
    (:mod:`kvstore.state.overlay`) to LMDB, so it holds every write applied before it.
    The scan reads in chunks (16 pairs, doubling up to 1024), leaving LMDB
    between chunks so that it never blocks the writer. It starts in one read
    transaction (one snapshot, taken at the first ``next()``) and goes on in
    a newer one, from the key after the last one it yielded, when the map
    was grown meanwhile or when its transaction is older than
    ``SCAN_HOLD_SECONDS`` at the start of a chunk (an open read transaction
    keeps LMDB from reusing every page freed since, so a slow consumer must
    not pin one for long); its transaction is released as soon as the last
    chunk is read. So: each key is yielded at most once, in order, with a
    value it had at some moment during the scan, and a scan that takes less
    than ``SCAN_HOLD_SECONDS`` (and meets no map growth) is one snapshot; a
    longer one is not. For one consistent read of several keys use
    :meth:`kvstore.KVStore.view`.
    """
    txn = None
    it = None
    last: bytes | None = None
    gen = -1
    n = 16
    since = 0.0
    try:
        while True:
            renew = gen != state.map_gen or txn is None or _monotonic() - since > SCAN_HOLD_SECONDS
            if renew:
                flush()  # a new snapshot sees every write applied so far
            state.enter_read()
            try:
                if renew or txn is None or gen != state.map_gen:
                    if txn is not None:
                        try:
                            txn.abort()
                        except lmdb.Error:
                            pass
                    try:
                        txn = state.env.begin(db=state.data_db)
                    except lmdb.MapResizedError:
                        state.gate.exit()
                        state.adopt_mapsize()
                        state.gate.enter()
                        txn = state.env.begin(db=state.data_db)
                    gen = state.map_gen
                    since = _monotonic()
                    it = position(txn.cursor(db), lo, hi, last, reverse)
                chunk = list(islice(it, n)) if it is not None else []
                if len(chunk) < n:  # the last chunk: let go of the snapshot now
                    it = None
                    txn.abort()
                    txn = None
            except lmdb.Error as exc:
                raise read_error(exc, state.path) from None
            finally:
                state.gate.exit()
            if not chunk:
                return
            if reverse:
                for kv in chunk:
                    if kv[0] < lo:
                        return
                    yield kv
            elif hi is None:
                yield from chunk
            else:
                for kv in chunk:
                    if kv[0] >= hi:
                        return
                    yield kv
            if len(chunk) < n:
                return
            last = chunk[-1][0]
            if n < 1024:
                n *= 2
    finally:
        if txn is not None and not state.closed:
            state.gate.enter()
            try:
                txn.abort()
            except lmdb.Error:
                pass
            finally:
                state.gate.exit()


class ReadView:
    """The state at one LSN, from one LMDB read transaction: :attr:`lsn`
    (the applied LSN, read in that same transaction), :attr:`count` (keys,
    of every keyspace), :meth:`pairs` (the default keyspace's) and
    :meth:`sections` (the other keyspaces', as snapshot sections). Create
    with :meth:`kvstore.state.expiring_reads.ExpiringReads.read_view`.

    While it is open the LMDB map cannot be grown (py-lmdb needs no live
    transaction for that), so a writer that fills the map meanwhile waits
    for it: :meth:`pairs` therefore releases the view (its transaction and
    its place in the read gate) as soon as the pairs are exhausted or the
    iterator is closed, and :meth:`close` (or leaving the ``with`` block)
    releases it in any case (with sections, only the ``with`` block does).
    Closing twice is harmless. ``sections`` maps section names to the
    databases they are read from, each opened before this view began.
    """

    __slots__ = ("_open", "_state", "_txn", "_sections", "count", "lsn")

    def __init__(self, state: ReadSource, sections: dict[str, Any] | None = None) -> None:
        self._state = state
        self._open = False
        self._sections = sections or {}
        state.enter_read()
        txn = None
        try:
            txn = begin_in_gate(state)
            self.lsn = state.applied_in(txn)
            self.count = sum(txn.stat(db)["entries"] for db in (state.data_db, *self._sections.values()))
        except BaseException as exc:
            if txn is not None:
                txn.abort()
            state.gate.exit()
            if isinstance(exc, lmdb.Error):
                raise read_error(exc, state.path) from None
            raise
        self._txn = txn
        self._open = True

    def pairs(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of the default keyspace in key order; without
        sections the view closes when they end (or when this iterator is closed)."""
        try:
            yield from self.db_pairs(None)
        finally:
            if not self._sections:
                self.close()

    def sections(self) -> dict[str, Iterator[tuple[bytes, bytes]]]:
        """Each section's (key, value) pairs in key order, from this view's
        transaction (read them before the view closes)."""
        return {name: self.db_pairs(db) for name, db in sorted(self._sections.items())}

    def run(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """``fn(txn)`` in the view's transaction (while it is open)."""
        if not self._open:
            raise ClosedError("this read view is closed")
        return fn(self._txn)

    def db_pairs(self, db: Any) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of the named database ``db`` (None: the default
        keyspace's), in key order, from the view's transaction; the view
        stays open (close it)."""
        if not self._open:
            return
        try:
            yield from self._txn.cursor(db=db).iternext(keys=True, values=True)  # type: ignore[misc]
        except lmdb.Error as exc:
            raise read_error(exc, self._state.path) from None

    def close(self) -> None:
        """Release the transaction and the read gate."""
        if self._open:
            self._open = False
            try:
                self._txn.abort()
            finally:
                self._state.gate.exit()

    def __enter__(self) -> ReadView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
