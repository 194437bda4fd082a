"""Read replicas: a store's durable log applied to an LMDB state of its own.

::

    rep = kvstore.open_replica(source, "replica-dir")   # a store directory or an archive
    rep.get(k); rep.scan(...); rep.view(); rep.watch(...)
    rep.applied_lsn; rep.lag                             # Lag(lsns, seconds)
    rep.wait_for(lsn, timeout=5)                         # read-your-writes for a caller with an LSN
    db = rep.promote()                                   # the source is gone: a writable KVStore

What a replica shows. A thread follows the source's DURABLE log
(:mod:`kvstore.replica.source`) and applies new entries in groups, each
group ONE LMDB write transaction that also records the applied LSN (as a
store does, :meth:`kvstore.state.machine.State.apply`), so a read sees the source's
state as of some LSN it had: whole entries, never half a batch, never an
entry a crash of the source could take back. Conditional writes apply as the
log decided them (:mod:`kvstore.entry.conditions`).

A replica has its directory (:mod:`kvstore.replica.directory`: the
``REPLICA`` record, and the LMDB state it starts from, trusted or rebuilt),
the state it serves reads from (:class:`~kvstore.replica.served.ServedState`)
and a thread that follows the source.

Falling behind retention while running (:class:`~wal.errors.LogGapError`),
or a source whose history forked before what the replica applied
(:class:`~wal.errors.ForkedHistoryError`: the source was repaired, promoted
or failed over, :mod:`wal.timeline`): the replica builds a new LMDB beside
the old one (``lmdb.rebuild``) from the newest snapshot plus the log, while
reads go on serving the OLD state; then it swaps them (milliseconds; what
reads see meanwhile: :mod:`kvstore.replica.served`). ``rebuilds`` counts
them.

Histories are never mixed. :attr:`Replica.history` is the timeline history
the applied entries are on (its LMDB's SESSION states it,
:mod:`kvstore.store.recovery`). Before a group is applied, the source's
history is read before and after its entries are: when the two differ the
group is dropped and read again; when the source's history left the
replica's timeline at or before an LSN the replica applied, it rebuilds
(the warning names both timelines and the fork LSN). Only then is the new
history recorded, and the group applied.

Lag: :attr:`Replica.lag` is ``(lsns, seconds)``: how many durable LSNs of
the source it has not applied, and for how long it has not shown everything
the source had durable (0 when caught up; otherwise the time since the
moment it last had applied all the source had, which bounds from above how
stale its reads are).

Errors while following (the source unreadable, damaged, replaced by another
store) are logged once, kept in :attr:`Replica.last_error`, and retried with
backoff up to a second; reads go on serving what was applied;
:meth:`Replica.wait_for` names the error when it times out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Generator, Iterable, Sequence
from typing import Any, NamedTuple

from kvstore.entry.codec import decode
from kvstore.layout import LMDB_DIR, SNAPSHOTS_DIR
from kvstore.replica import directory
from kvstore.replica.promote import promote
from kvstore.replica.served import ServedState
from kvstore.replica.source import ReplicaSource, open_source
from kvstore.state import DEFAULT_MAP_SIZE, State, StateOptions, View
from kvstore.state.lookups import Lookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, scan_bounds
from kvstore.store import recovery
from kvstore.watch import watcher as watching
from wal.errors import (
    ClosedError,
    ForkedHistoryError,
    LogGapError,
    ReplicaError,
    ReplicaLagError,
    SourceGoneError,
    WalkvError,
)
from wal.fs import OS_FS
from wal.lock import DirectoryLock
from wal.timeline import History, check_follows

log = logging.getLogger("walkv.replica")

GROUP_ENTRIES = recovery.REPLAY_CHUNK_ENTRIES
GROUP_BYTES = recovery.REPLAY_CHUNK_BYTES
MAX_BACKOFF = 1.0


class Lag(NamedTuple):
    """How far a replica is behind its source's durable LSN."""

    lsns: int
    seconds: float


class Replica(Lookups):
    """A read replica (module docstring). Create with :func:`open_replica`."""

    def __init__(self, source: ReplicaSource, path: str | os.PathLike[str], *,
                 poll_interval: float | None = None, map_size: int = DEFAULT_MAP_SIZE,
                 max_readers: int = 1024) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.source = source
        self.poll_interval = source.poll_seconds if poll_interval is None else float(poll_interval)
        self._options = StateOptions(map_size, True, max_readers)
        self._lmdb_dir = os.path.join(self.path, LMDB_DIR)
        self._closed = True
        self.rebuilds = 0
        self.last_error: BaseException | None = None
        self._source_lsn = 0
        self._caught_up_at = time.time()
        self._applied = threading.Condition()  # notified after every group applied
        self._hub = watching.WatchHub()
        self._stop = threading.Event()
        directory.make(self.path)
        self._lock: DirectoryLock | None = DirectoryLock(self.path, f"the replica {self.path}")
        try:
            directory.claim(self.path, source)
            state, self.history = directory.starting_state(self.path, source, self._options)
            self._served = ServedState(state, self.path)
            self._hold = source.hold(self.applied_lsn + 1)  # the source's retention keeps what it has not read
        except BaseException:
            self._lock.release()
            raise
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="walkv-replica", daemon=True)
        self._thread.start()

    # -- following -------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        need_rebuild: str | None = None
        while not self._stop.is_set():
            try:
                if need_rebuild is not None:
                    self._rebuild_live(need_rebuild)
                    need_rebuild = None
                progressed = self._step()
            except LogGapError as gap:
                need_rebuild = f"the source's retention trimmed past it ({gap})"
                continue
            except ForkedHistoryError as fork:
                need_rebuild = str(fork)
                continue
            except _SourceBehind as behind:
                need_rebuild = str(behind)
                continue
            except ClosedError:
                if self._stop.is_set():
                    return
                raise
            except (WalkvError, OSError) as exc:
                self.source.reset()
                if self.last_error is None:
                    log.warning("replica %s cannot follow %s (retrying): %s", self.path, self.source.name, exc)
                self.last_error = exc
                backoff = min(max(backoff * 2, self.poll_interval, 0.01), MAX_BACKOFF)
                self._stop.wait(backoff)
                continue
            if self.last_error is not None:
                log.warning("replica %s follows %s again", self.path, self.source.name)
                self.last_error = None
            backoff = 0.0
            if not progressed:
                self._stop.wait(self.poll_interval)

    def _step(self) -> bool:
        """Apply one group of newly durable entries; False when there was none."""
        seen = time.time()
        durable = self.source.durable_lsn()
        state = self._served.current
        applied = state.applied_lsn
        self._source_lsn = durable
        if durable < applied:
            raise _SourceBehind(f"the source's durable LSN {durable} is before the replica's applied "
                                f"LSN {applied} (its log lost entries, or was repaired)")
        if durable == applied:
            self._note_applied(applied, durable, seen)
            return False
        last = min(durable, applied + GROUP_ENTRIES)
        before = self.source.history()
        if before != self.history:
            self._follow_history(before, applied)
        batches: list[Sequence[Sequence[Any]]] = []
        size = 0
        for entry in self.source.entries(applied + 1, last):
            batches.append(decode(entry.payload, entry.lsn))
            size += len(entry.payload)
            if size >= GROUP_BYTES:
                break
        if not batches:
            return False
        if self.source.history() != before:  # it forked while we read: read again on the new history
            return True
        check_follows(before, applied + len(batches), self.source.history(), what=f"the replica {self.path}",
                      source=self.source.name, hint="it rebuilds from a snapshot")
        state.apply(applied + 1, batches)
        self._note_applied(state.applied_lsn, durable, seen)
        if self._hold is not None:
            self._hold.move(state.applied_lsn + 1)
        return True

    def _follow_history(self, history: History, applied: int) -> None:
        """The source's history changed: refuse it when it forked at or before
        ``applied`` (:class:`~wal.errors.ForkedHistoryError`: the caller
        rebuilds), else record it (SESSION, before any entry of it is applied)."""
        check_follows(self.history, applied, history, what=f"the replica {self.path}", source=self.source.name,
                      hint="it rebuilds from the source's newest snapshot")
        recovery.write_session(self._lmdb_dir, self.source.store_id, clean=False, history=history)
        self.history = history

    def _note_applied(self, applied: int, durable: int, seen: float) -> None:
        if applied >= durable:
            self._caught_up_at = seen
        with self._applied:
            self._applied.notify_all()
        self._hub.committed()

    def _rebuild_live(self, reason: str) -> None:
        """Rebuild beside the served state, then swap (module docstring)."""
        log.warning("replica %s starts again from %s's newest snapshot: %s", self.path, self.source.name, reason)
        new_dir = os.path.join(self.path, directory.REBUILD_DIR)
        new, history = directory.rebuild(new_dir, self.source, self._options)
        new.close(sync=True)
        recovery.write_session(new_dir, self.source.store_id, clean=True, history=history)

        def replace() -> State:
            recovery.remove_state(self._lmdb_dir)
            OS_FS.rename(new_dir, self._lmdb_dir)
            OS_FS.fsync_dir(self.path)
            state = State(self._lmdb_dir, self._options)
            recovery.write_session(self._lmdb_dir, self.source.store_id, clean=False, history=history)
            return state
        state = self._served.swap(replace)
        self.history = history
        self.rebuilds += 1
        self._note_applied(state.applied_lsn, self._source_lsn, time.time())

    # -- reads (of the served state, across swaps) ----------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the replica {self.path} is closed")

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` as of :attr:`applied_lsn`, or ``default``."""
        return self._served.get(key, default)

    def get_many(self, keys: Iterable[bytes], default: bytes | None = None) -> list[bytes | None]:
        """The values of ``keys`` (:meth:`kvstore.KVStore.get_many`)."""
        self._check_open()
        keys = list(keys)
        return self._served.read(lambda s: s.get_many(keys, default))

    def __len__(self) -> int:
        self._check_open()
        return self._served.read(lambda s: s.expiring_reads.count())

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False) -> Generator[tuple[bytes, bytes], None, None]:
        """Like :meth:`kvstore.KVStore.scan` (each key once, in order, with a
        value it had at some moment during the scan)."""
        lo, hi = scan_bounds(start, stop, prefix)
        self._check_open()
        return self._served.scan(lo, hi, reverse)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """Several keys as of one LSN (:meth:`kvstore.KVStore.view`); closed
        by a rebuild's swap (:mod:`kvstore.replica.served`)."""
        self._check_open()
        return self._served.read(lambda s: s.expiring_reads.view(max_seconds))

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None,
              progress_every: float | None = None, on_gap: str = "error") -> watching.Watcher:
        """Changes in log order (:meth:`kvstore.KVStore.watch`), read from the
        source's log files and bounded by what this replica has applied, so
        a change is seen once the replica shows it. Replicas of a store
        directory only (an archive is not a log directory)."""
        self._check_open()
        if self.source.wal_dir is None or self.source.snapshots_dir is None:
            raise ReplicaError(f"the replica {self.path} follows {self.source.name}, not a store directory; "
                               "watch a replica of a store directory, or the store itself (a served one: "
                               "kvstore.connect(url).watch())")
        src = watching.Source(self.source.wal_dir, self.source.snapshots_dir, lambda: self.applied_lsn,
                              self._hub, polls=False)
        return watching.Watcher(src, prefix, start=start, stop=stop, from_lsn=from_lsn, timeout=timeout,
                                progress_every=progress_every, on_gap=on_gap)

    # -- LSNs, lag, waiting ------------------------------------------------------

    @property
    def store_id(self) -> str:
        """The store id of the source (and of this replica's state)."""
        return self.source.store_id

    @property
    def applied_lsn(self) -> int:
        """The source's LSN that reads show."""
        return self._served.current.applied_lsn

    @property
    def lag(self) -> Lag:
        """``(lsns, seconds)`` behind the source's durable LSN (module docstring)."""
        self._check_open()
        durable = self._source_lsn if self.source.wal_dir is None else self.source.durable_lsn()
        behind = max(0, durable - self.applied_lsn)
        return Lag(behind, max(0.0, time.time() - self._caught_up_at) if behind else 0.0)

    def wait_for(self, lsn: int, timeout: float | None = 5.0) -> int:
        """Block until the replica shows LSN ``lsn`` (then every write the
        source acknowledged with that LSN is visible); return the applied
        LSN. :class:`~wal.errors.ReplicaLagError` after ``timeout`` seconds
        (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._applied:
            while self.applied_lsn < lsn:
                self._check_open()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    applied = self.applied_lsn
                    why = f"; following fails: {self.last_error}" if self.last_error is not None else ""
                    raise ReplicaLagError(
                        f"the replica {self.path} reached LSN {applied}, not {lsn}, within {timeout} s "
                        f"(the source {self.source.name} is durable up to LSN {self._source_lsn}{why})",
                        applied_lsn=applied, target_lsn=lsn)
                self._applied.wait(1.0 if left is None else min(left, 1.0))
        return self.applied_lsn

    def stats(self) -> dict[str, Any]:
        """The replica's position, lag and the state machine's counters."""
        lag = self.lag
        out: dict[str, Any] = {"path": self.path, "source": self.source.name, "store_id": self.store_id,
                               "applied_lsn": self.applied_lsn, "source_durable_lsn": self._source_lsn,
                               "lag_lsns": lag.lsns, "lag_seconds": lag.seconds, "rebuilds": self.rebuilds,
                               "last_error": None if self.last_error is None else str(self.last_error)}
        out.update(self._served.read(lambda s: s.stats()))
        return out

    # -- promote, close ----------------------------------------------------------

    def promote(self, **options: Any) -> Any:
        """Make this replica a writable store (its source is gone); return
        the :class:`kvstore.KVStore` opened on it. See
        :func:`kvstore.replica.promote.promote`."""
        self._check_open()
        return promote(self, options)

    def catch_up(self) -> int:
        """Stop following and apply everything the source has durable now
        (for :meth:`promote`); return the applied LSN."""
        self._stop_following()
        while True:
            try:
                if not self._step():
                    return self.applied_lsn
            except (LogGapError, _SourceBehind, ForkedHistoryError) as exc:
                self._rebuild_live(str(exc))
            except SourceGoneError:  # its fence found it gone: what was applied is all there is
                return self.applied_lsn

    def _stop_following(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def detach(self) -> State:
        """For :meth:`promote`: release the directory (lock, watchers) and
        hand over the state; the replica is closed."""
        self._stop_following()
        self._closed = True
        self._hub.close()
        state = self._served.close()
        with self._applied:
            self._applied.notify_all()
        if self._hold is not None:
            self._hold.release()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        return state

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop following, flush LMDB, record a clean close, release the directory."""
        if self._closed:
            return
        state = self.detach()
        self.source.close()
        state.close(sync=True)
        recovery.write_session(self._lmdb_dir, self.source.store_id, clean=True, history=self.history)

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<Replica {self.path!r} closed>"
        return f"<Replica {self.path!r} of {self.source.name} at LSN {self.applied_lsn}>"


class _SourceBehind(WalkvError):
    """The source's durable LSN went back before what the replica applied."""


def open_replica(source: Any, path: str | os.PathLike[str], *, poll_interval: float | None = None,
                 map_size: int = DEFAULT_MAP_SIZE, max_readers: int = 1024, token: str | None = None,
                 verify: bool | str = True) -> Replica:
    """A replica of ``source`` (a store directory; an archive: a URI, a
    ``(filesystem, path)`` pair or a local archive directory; or a served
    store: an ``http://`` or ``https://`` URL, with the bearer ``token`` of a
    ``read`` role and ``verify``, TLS verification: True, False or a CA
    bundle's path) at ``path`` (created, or reopened). ``poll_interval``:
    seconds between looks at the source when it had nothing new (default:
    2 ms for a store, 10 ms for a server, 1 s for an archive)."""
    src = open_source(source, token=token, verify=verify,
                      download_dir=os.path.join(os.path.abspath(os.fspath(path)), SNAPSHOTS_DIR))
    try:
        return Replica(src, path, poll_interval=poll_interval, map_size=map_size, max_readers=max_readers)
    except BaseException:
        src.close()
        raise
