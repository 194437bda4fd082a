"""The overlay: writes applied to the state machine but not yet to LMDB.

LevelDB keeps recent writes in a memtable and writes them out in bulk; the
overlay is that idea for the LMDB state machine. A small group of puts and
deletes is *applied* by recording each key's newest value (``None``: deleted)
in a dictionary: one dictionary operation per write instead of an LMDB write
transaction per group. The dictionary is written to LMDB later, in one write
transaction with one ``putmulti`` call (a *flush*), that also records the
highest LSN it covers as LMDB's applied LSN.

Two dictionaries, as LevelDB's memtable and immutable memtable: ``active``
takes new writes; a flush swaps it for an empty one (``frozen``, the old
one, is what it writes) so writers go on while LMDB is written. A read looks
in ``active``, then ``frozen``, then LMDB (and only in LMDB while both are
empty: ``on_occupied(True)`` is called, under :attr:`Overlay.lock`, when the
first write goes into an empty overlay, before that write is applied, and
``on_occupied(False)`` once a flush left it empty again, so a state can
switch its get to the LMDB-only path and back, and a get pays nothing for an
empty overlay); a flush clears ``frozen`` only
after LMDB's commit and the read counter's bump (``gen``), so a read that
misses both dictionaries renews its LMDB transaction and finds the value
there (:meth:`kvstore.state.reads.CachedReads.get`).

When a flush happens, and why:

* the overlay holds :data:`MAX_KEYS` keys or :data:`MAX_BYTES` bytes of
  values (memory stays bounded by settings, not by the store's size);
* :data:`FLUSH_SECONDS` after its first write: so a read-only process beside
  the writer, which reads LMDB only, sees every acknowledged write at most
  that long (plus :data:`HANDOFF_SECONDS` and one flush) after it returned,
  and a process crash leaves at most that much to replay. A background
  thread keeps the time, but the flush is handed to the applying thread
  (``add`` returns True once it is due) and the background thread flushes
  only if no write came within :data:`HANDOFF_SECONDS`: py-lmdb lets go of
  the GIL around every key it writes, so a flush in a second thread while
  the writer runs trades the GIL once per key, a futex wake and a context
  switch each (measured: a third of a writer's time at 200k puts/s);
* before anything that reads LMDB as a whole (a scan, a view, a count, a
  snapshot, stats) and before a group that is not plain puts and deletes
  (a range delete, a big batch), which is applied with the flush in one
  transaction; at close.

What it saves is the write transaction per group (begin, the applied LSN,
commit: ~6 us, several GIL hand-offs), not LMDB's copy-on-write of each leaf
page a write touches: random keys over a large store touch a different 4 KiB
leaf each, whether they share a transaction or not; keys that share leaves
(sequential, hot) gain the most. The store opened with ``overlay=False``
applies every group in its own transaction instead.

Durability is the log's: the overlay only delays LMDB, which is a cache of
the log either way (:mod:`kvstore.store.recovery` replays from LMDB's applied LSN).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, final

from wal.mutex import Mutex, condition

log = logging.getLogger("walkv.state")

MAX_KEYS = 16384
"""Keys the overlay holds before it is flushed."""
MAX_BYTES: Final = 1 << 20
"""Bytes of values the overlay holds before it is flushed. Small, because
what it holds is what a reopen after a crash must find room for in LMDB (a
disk that filled up with the overlay full needs about twice this freed), and
a flush of 1 MiB already spreads a write transaction's cost over thousands
of small writes."""
FLUSH_SECONDS = 0.05
"""A write waits at most this long in the overlay before a flush is due."""
HANDOFF_SECONDS = 0.002
"""How long a due flush waits for the applying thread (its next write) to
do it, before the background thread does it itself (the writer is idle)."""
MISSING: Final = object()
"""What a lookup in the overlay returns for a key it does not hold."""

Values = dict[bytes, "bytes | None"]


@final
class Overlay:
    """The two dictionaries, their LSNs and the flushing thread of one state.

    ``add`` is called by the one applying thread; ``freeze``/``thaw`` by a
    flush, under :attr:`flush_lock` (one flush at a time); reads use
    :attr:`active` and :attr:`frozen` without a lock. Compiled, so its
    owner registers it with :mod:`wal.forkguard` (``track(overlay, owner)``).
    """

    def __init__(self, on_occupied: Callable[[bool], None] | None = None) -> None:
        self.active: Values = {}
        self.frozen: Values | None = None
        self.lsn = 0          # the highest LSN in ``active`` (when it is not empty)
        self.bytes = 0        # bytes of values in ``active``
        self.lock = Mutex()        # add vs freeze
        self.flush_lock = Mutex()  # one flush (LMDB write) at a time
        self._wake = condition(self.lock)
        self._since = 0.0
        self.due = False      # FLUSH_SECONDS passed: the next add asks its caller to flush
        self._applier: threading.Thread | None = None
        self._stopping = False
        self.flushes = 0
        self._on_occupied = on_occupied

    def add(self, ops: Sequence[Sequence[Any]], last_lsn: int) -> bool:
        """Record puts and deletes (``[1, key, value]`` / ``[2, key]``, in
        order) that end at ``last_lsn``; True when the overlay is now full,
        or a flush is due, and the caller should flush it."""
        size = 0
        with self.lock:  # (a Mutex: compiled, C calls, wal/mutex.py)
            active = self.active
            if not active:
                self._occupied()
            for op in ops:
                if op[0] == 1:
                    value: bytes = op[2]
                    active[op[1]] = value
                    size += len(value)
                else:
                    active[op[1]] = None
            self.lsn = last_lsn
            self.bytes += size
            return len(active) >= MAX_KEYS or self.bytes >= MAX_BYTES or self.due

    def set(self, key: bytes, value: bytes | None, lsn: int) -> bool:
        """:meth:`add` of one put of ``value`` (None: a delete) at ``lsn``,
        the common group, without a list of ops to walk."""
        with self.lock:
            active = self.active
            if not active:
                self._occupied()
            active[key] = value
            self.lsn = lsn
            if value is not None:
                self.bytes += len(value)
            return len(active) >= MAX_KEYS or self.bytes >= MAX_BYTES or self.due

    def _occupied(self) -> None:
        """With :attr:`lock` held, before the first write into an empty ``active``."""
        self._since = time.monotonic()
        self._wake.notify()
        if self.frozen is None and self._on_occupied is not None:
            self._on_occupied(True)

    def freeze(self) -> tuple[Values, int] | None:
        """With :attr:`flush_lock` held: make ``active`` the frozen
        dictionary (to be written to LMDB) and start an empty one; return it
        and its highest LSN, or None when there is nothing to flush."""
        with self.lock:
            frozen = self.active
            if not frozen:
                return None
            self.frozen = frozen
            self.active = {}
            self.bytes = 0
            self.due = False
            return frozen, self.lsn

    def thaw(self) -> None:
        """With :attr:`flush_lock` held: the frozen dictionary is in LMDB."""
        with self.lock:
            self.frozen = None
            self.flushes += 1
            if not self.active and self._on_occupied is not None:
                self._on_occupied(False)

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): hold nothing. The
        parent's writes are not this process's to read (a get goes on to
        LMDB, which refuses), and a flush finds nothing to write, so it takes
        no lock (another thread may have held one at the fork)."""
        self.active = {}
        self.frozen = None
        self.bytes = 0
        if self._on_occupied is not None:
            self._on_occupied(False)

    def __len__(self) -> int:
        frozen = self.frozen
        return len(self.active) + (len(frozen) if frozen is not None else 0)

    # -- the flushing thread ---------------------------------------------------

    def start(self, flush: Callable[[], None]) -> None:
        """Have ``flush()`` run :data:`FLUSH_SECONDS` after each first write
        into an empty overlay (by the next write, or by a daemon thread when
        none comes; see the module docstring), until :meth:`stop`."""
        self._applier = threading.Thread(target=self._run, args=(flush,), name="walkv-apply", daemon=True)
        self._applier.start()

    def _run(self, flush: Callable[[], None]) -> None:
        with self.lock:
            while not self._stopping:
                if not self.active:
                    self._wake.wait()
                    continue
                left = self._since + FLUSH_SECONDS - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                if not self.due:  # hand it to the writer first (a flush resets due)
                    self.due = True
                    self._wake.wait(HANDOFF_SECONDS)
                    continue
                self.lock.release()
                try:
                    flush()
                except Exception:  # recorded by the state; the next write reports it
                    log.exception("flushing the overlay to LMDB failed")
                    return
                finally:
                    self.lock.acquire()

    def stop(self) -> None:
        """Stop the thread (what it holds is flushed by whoever closes)."""
        with self.lock:
            self._stopping = True
            self._wake.notify()
        t = self._applier
        if t is not None and t is not threading.current_thread():
            t.join()
