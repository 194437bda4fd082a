"""KVStore: the database users open. A write-ahead log plus an LMDB state machine.

The store's directory layout is :mod:`kvstore.layout`'s.

Durability, precisely. A write (put, delete, delete_range, a committed batch)
is one log entry with one LSN. It returns once the log acknowledged it, which
with ``sync="always"`` (default) means after an fsync that covers it; it was
also applied to the state machine before it returned, so the next read in any
thread of this process sees it. With ``sync="batch"`` or ``"none"`` it returns
once the entry reached the OS: safe against a crash of the process, not of the
machine (``sync()`` forces it to disk). LMDB's own writes are never fsynced on
the commit path; after a machine crash LMDB is rebuilt from the log
(kvstore/store/recovery.py).

Applied means: a group of fewer than 4,096 puts and deletes is applied to
the in-memory overlay (one dictionary operation per write), which reaches
LMDB in bulk within :data:`kvstore.state.overlay.FLUSH_SECONDS` (50 ms), or sooner
when the overlay is full, before a scan, view, count or snapshot, and at
close (:mod:`kvstore.state.overlay`); any other group, and every group when the
store is opened with ``overlay=False``, is written to LMDB in its own write
transaction before the write returns.

Writers: one process at a time (``STORE/LOCK``, then the log's own lock); a
second one gets :class:`LockedError`. Any number of threads in the writing
process may read and write. ``readonly=True`` opens beside a writer (or
none): it reads LMDB through LMDB's reader lock table and never writes,
replays or takes the store lock. It sees what the writer has written to LMDB:
every write acknowledged at least 50 ms (plus the time of one bulk write of
at most 16,384 keys) before, so it may be up to that far behind the writer's
own reads; every write acknowledged by then when the writer opened the store
with ``overlay=False``; with no writer running it sees
the state as the last writer left it (after a crash of that writer, possibly
without its last group, which the next read-write open replays). It refuses
to open a store whose last writer was on a machine that crashed since. A
reader that was open while a writer rebuilt LMDB (after a machine crash)
keeps reading the environment it opened: reopen it to see the new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, cast

import snapshot
import wal
from kvstore.archive import Archiver
from kvstore.archive.target import Location
from kvstore.entry import conditions
from kvstore.entry.codec import (
    DEFAULT_MAX_VALUE_BYTES,
    ENTRY_OVERHEAD,
    MAX_KEY_BYTES,
)
from kvstore.layout import LMDB_DIR, REPLICA_NAME, WAL_DIR
from kvstore.state.machine import DEFAULT_MAP_SIZE, Ops, State, StateOptions
from kvstore.store import archiving, recovery, snapshots
from kvstore.store.reads import StoreReads
from kvstore.store.writes import StoreWrites
from kvstore.watch import watcher as watching
from snapshot import SnapshotInfo
from wal.errors import ArchiveError, ClosedError, ReplicaError, SnapshotError, WalkvError
from wal.forkguard import forked_error, track
from wal.fs import OS_FS, FileSystem
from wal.lock import DirectoryLock
from wal.record import DEFAULT_MAX_RECORD_BYTES
from wal.segment import Payload

log = logging.getLogger("walkv.store")

Progress = Callable[[int, "int | None"], None]

class KVStore(StoreWrites, StoreReads):
    """An open store. Create with :func:`kvstore.open`.

    Thread-safe: any number of threads may read and write; concurrent writers
    share fsyncs (group commit). Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: str = "always",
                 segment_bytes: int = 64 << 20, readonly: bool = False,
                 map_size: int = DEFAULT_MAP_SIZE, writemap: bool = True,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 max_readers: int = 1024, overlay: bool = True,
                 keep_snapshots: int = snapshots.DEFAULT_KEEP,
                 snapshot_every_bytes: int | None = None,
                 snapshot_chunk_bytes: int | None = None,
                 progress: Progress | None = None, fs: FileSystem | None = None,
                 archive: Location | None = None, archive_interval: float = 1.0,
                 archive_keep_snapshots: int | None = None, archive_keep_seconds: float | None = None,
                 **log_options: Any) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.readonly = bool(readonly)
        self._fs = fs or OS_FS
        self._closed = True
        if type(keep_snapshots) is not int or keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be an int >= 1, not {keep_snapshots!r}")
        if max_record_bytes < 4096:
            raise ValueError(f"max_record_bytes must be at least 4096, not {max_record_bytes!r}")
        self.max_value_bytes = min(int(max_value_bytes), max_record_bytes - ENTRY_OVERHEAD - MAX_KEY_BYTES)
        if self.max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be positive, not {max_value_bytes!r}")
        if self.readonly and archive is not None:
            raise TypeError("a store opened with readonly=True does not archive; its writer does "
                            "(or run `walkv archive STORE URI` beside it)")
        self._archiver: Archiver | None = None
        if self.readonly and log_options:
            raise TypeError(f"readonly stores take no log options: {sorted(log_options)}")
        self.keep_snapshots = keep_snapshots
        self.snapshot_chunk_bytes = snapshot_chunk_bytes
        self.snapshot_lock = threading.Lock()  # one snapshot (and its retention) at a time
        self.log_bytes_trimmed = 0
        self._auto: snapshots.AutoSnapshot | None = None
        self._max_payload = max_record_bytes - ENTRY_OVERHEAD
        self._wal_dir = os.path.join(self.path, WAL_DIR)
        self._lmdb_dir = os.path.join(self.path, LMDB_DIR)
        self._log: wal.Log | None = None
        self._lock: DirectoryLock | None = None
        self.replayed = 0                 # log entries replayed (or rebuilt from) at open
        self.rebuilt: str | None = None   # why LMDB was rebuilt at open, if it was
        options = StateOptions(map_size, writemap, max_readers, overlay=bool(overlay))
        self._watch_hub = watching.WatchHub()  # wakes watchers, once per group commit
        t0 = time.monotonic()
        try:
            if self.readonly:
                self._state: State = recovery.open_readonly_state(self.path, self._lmdb_dir, options)
                self.max_record_bytes: int | None = None
                self._append: Callable[[Payload, Ops], int] = self._refuse_write
            else:
                self._open_writer(options, sync=sync, segment_bytes=segment_bytes,
                                  max_record_bytes=max_record_bytes, progress=progress, log_options=log_options)
                if snapshot_every_bytes:
                    self._auto = snapshots.AutoSnapshot(self.snapshot, self.path, int(snapshot_every_bytes))
        except OSError as exc:
            raise WalkvError(f"cannot open the store {self.path}: {exc}") from exc
        self.store_id: str | None = self._log.store_id if self._log is not None else self._state.store_id
        self.open_seconds = time.monotonic() - t0  # replay or rebuild included
        self._closed = False
        self._pid = os.getpid()
        track(self)
        if archive is not None:
            try:
                self._archiver = archiving.start_archiver(self.path, archive, interval=archive_interval,
                                                          keep_snapshots=archive_keep_snapshots,
                                                          keep_seconds=archive_keep_seconds)
            except BaseException:
                self.close()
                raise

    _forked = False

    def _after_fork_in_child(self) -> None:
        """In a forked child (:mod:`wal.forkguard`): writes and reads raise
        ForkedError (its log and LMDB refuse too), close() does nothing."""
        if self._closed:
            return
        self._forked = True
        self._append = self._refuse_forked
        self._lock = None  # the lock closed its inherited descriptor itself
        self.snapshot_lock = threading.Lock()  # a thread of the parent may have held it

    def _refuse_forked(self, payload: Payload, ops: Ops) -> int:
        raise forked_error(f"the store {self.path}", self._pid)

    # -- opening -------------------------------------------------------------

    def _open_writer(self, options: StateOptions, *, sync: str, segment_bytes: int, max_record_bytes: int,
                     progress: Progress | None, log_options: dict[str, Any]) -> None:
        """Take the store's lock, open the log, open (replay or rebuild) the
        state; on any failure let go of everything taken."""
        self._fs.makedirs(self.path)
        self._lock = DirectoryLock(self.path, f"the store {self.path}")
        if os.path.exists(os.path.join(self.path, REPLICA_NAME)):
            self._release_lock()
            raise ReplicaError(f"{self.path} is a read replica (kvstore.replica.replica): open it with "
                               f"kvstore.open_replica, or promote() it to write to it")
        try:
            self._log = wal.open(self._wal_dir, sync=sync, segment_bytes=segment_bytes,
                                 max_record_bytes=max_record_bytes,
                                 on_commit=self._on_commit, on_prepare=self._on_prepare, fs=self._fs,
                                 **log_options)
            try:
                opened = recovery.open_state(self.path, self._lmdb_dir, self._log, fs=self._fs,
                                             options=options, progress=progress)
                self._state, self.replayed, self.rebuilt = opened
                try:
                    snapshot.cleanup_incomplete(snapshots.snapshots_dir(self.path), fs=self._fs)
                except BaseException:
                    self._state.close(sync=False)
                    raise
            except BaseException:
                try:
                    self._log.close()
                except WalkvError:
                    pass
                raise
        except BaseException:
            self._release_lock()
            raise
        self.max_record_bytes = max_record_bytes
        self._append = self._log.append

    def _release_lock(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def _on_prepare(self, group: wal.Group) -> list[Payload] | None:
        # Called by the group's leader before it is written: decide its
        # conditional writes in log order and write the decisions into the log.
        return conditions.decide_group(group.payloads, group.contexts, self._state.get)

    def _on_commit(self, group: wal.Group) -> None:
        # Called by the log's committing thread for every group, after its
        # fsync and before any of its appenders is released. This store is
        # its log's one appender, and passes every entry's operations along.
        self._state.apply(group.first_lsn, cast("list[Ops]", group.contexts), group.payloads)
        self._watch_hub.committed()
        if self._auto is not None and self._log is not None:
            self._auto.poke(self._log.appended_bytes)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        """``del db[k]``: KeyError when ``k`` is absent (checked just before
        the delete is logged; a concurrent writer may race it)."""
        if self.get(key) is None:
            raise KeyError(key)
        self.delete(key)

    def watch(self, prefix: bytes | None = None, *, start: bytes | None = None, stop: bytes | None = None,
              from_lsn: int | None = None, timeout: float | None = None,
              progress_every: float | None = None, on_gap: str = "error") -> watching.Watcher:
        """Follow the store's durable changes in log order, from ``from_lsn``
        (default: only new ones), for keys under ``prefix`` and in
        ``[start, stop)``: an iterator (and context manager) of
        :class:`kvstore.watch.watcher.Change`. See :mod:`kvstore.watch.watcher`."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        source = watching.Source(self._wal_dir, snapshots.snapshots_dir(self.path), lambda: self.durable_lsn,
                                 self._watch_hub, polls=self._log is None)
        lo, hi = watching.key_bounds(prefix, start, stop)
        first = self.durable_lsn + 1 if from_lsn is None else from_lsn
        return watching.Watcher(source, lo, hi, first, timeout=timeout, progress_every=progress_every,
                             on_gap=on_gap)

    # -- LSNs, sync, stats, close ---------------------------------------------

    @property
    def last_lsn(self) -> int:
        """The last LSN written to the log."""
        if self._log is None:
            return wal.read_durable_lsn(self._wal_dir) or 0
        return self._log.last_lsn

    @property
    def durable_lsn(self) -> int:
        """The last LSN known to be on disk."""
        if self._log is None:
            return wal.read_durable_lsn(self._wal_dir) or 0
        return self._log.durable_lsn

    @property
    def applied_lsn(self) -> int:
        """The last LSN applied: what this process's reads see (read-only:
        what the writer has written to LMDB)."""
        if self.readonly and not self._closed:
            return self._state.read_meta_applied()
        return self._state.applied_lsn

    @property
    def closed(self) -> bool:
        return self._closed

    def snapshot(self, *, keep: int | None = None, progress: Progress | None = None,
                 chunk_bytes: int | None = None) -> SnapshotInfo:
        """Write a snapshot of the store at its applied LSN (``.lsn``,
        ``.path``), from one consistent LMDB view while writers go on; then
        keep the newest ``keep`` (default ``keep_snapshots``) snapshots and
        delete the log segments the oldest kept one covers. Durable on
        return; when nothing was written since the newest snapshot, that one
        is returned. ``chunk_bytes`` (default: the store's
        ``snapshot_chunk_bytes``) sizes the chunk files. See
        :mod:`kvstore.store.snapshots`."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self._log is None:
            raise SnapshotError(f"the store {self.path} is open read-only; snapshots are taken by its writer")
        parent = snapshots.snapshots_dir(self.path)
        with self.snapshot_lock:
            info = snapshots.take(self._state, self._log, parent, store_id=self._log.store_id, fs=self._fs,
                                  chunk_bytes=chunk_bytes or self.snapshot_chunk_bytes, progress=progress)
            self.log_bytes_trimmed += snapshots.retain(parent, self._log, keep or self.keep_snapshots, self._fs,
                                                       archiving.retention_limit(self.path, self._archiver))
        return info

    def list_snapshots(self) -> list[SnapshotInfo]:
        """The store's valid snapshots, oldest first."""
        return snapshot.list_snapshots(snapshots.snapshots_dir(self.path))

    def wait_for_snapshots(self, timeout: float | None = None) -> None:
        """Wait for an automatic snapshot in progress (``snapshot_every_bytes``)."""
        if self._auto is not None:
            self._auto.join(timeout)

    def sync(self) -> int:
        """Make every write so far durable (for ``sync="batch"``/``"none"``);
        return the durable LSN."""
        if self._log is None:
            if self._closed:
                raise ClosedError(f"the store {self.path} is closed")
            return self.durable_lsn
        return self._log.sync()

    def flush_archive(self, timeout: float | None = 30.0) -> int:
        """Return the archived LSN once every write durable when called is in
        the archive (``archive=`` at open); :class:`ArchiveLagError` naming the
        lag and the last error after ``timeout`` seconds."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        if self._archiver is None:
            raise ArchiveError(f"the store {self.path} was opened without archive=; there is no archive to flush")
        return self._archiver.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters and latencies of the open store: its LSNs, what open did,
        the state machine's counters (:meth:`kvstore.state.machine.State.stats`) and
        the log's under ``"log"`` (:meth:`wal.Log.stats`), the archive's
        under ``"archive"`` (with ``archive=``; its URI redacted). Counters are
        approximate under concurrent use."""
        if self._closed:
            raise ClosedError(f"the store {self.path} is closed")
        out: dict[str, Any] = {
            "path": self.path,
            "readonly": self.readonly,
            "last_lsn": self.last_lsn,
            "durable_lsn": self.durable_lsn,
            "applied_lsn": self.applied_lsn,
            "replayed_at_open": self.replayed,
            "rebuilt_at_open": self.rebuilt,
            "auto_snapshots": self._auto.taken if self._auto is not None else 0,
            "log_bytes_trimmed": self.log_bytes_trimmed,
            "open_seconds": self.open_seconds,
        }
        out.update(self._state.stats())
        if self._log is not None:
            out["log"] = self._log.stats()
        if self._archiver is not None:
            out["archive"] = archiving.archive_stats(self._archiver)
        return out

    def close(self) -> None:
        """Finish every write in flight, flush LMDB, record a clean close and
        release the store. Idempotent. In a process forked from the one that
        opened the store it does nothing (see :mod:`wal.forkguard`)."""
        if self._closed or self._forked:
            return
        self.wait_for_snapshots()
        self._closed = True
        self._watch_hub.close()
        if self._log is None:
            self._state.close(sync=False)
            return
        clean = self._log.failure is None  # a failed log: LMDB is left as it is, the next open replays
        try:
            try:
                self._log.close()
            except WalkvError:
                clean = False
                raise
            finally:
                self._state.close(sync=clean)
            if clean:
                try:
                    recovery.write_session(self._lmdb_dir, self._log.store_id, clean=True, fs=self._fs)
                except OSError as exc:
                    raise WalkvError(
                        f"closing {self.path}: could not record the clean close ({exc}); "
                        f"nothing is lost, the next open replays the log") from exc
        finally:
            if self._archiver is not None:  # after the log: it ships everything durable
                archiving.stop_archiver(self._archiver, self._log.durable_lsn)
            self._release_lock()

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<KVStore {self.path!r} closed>"
        mode = "readonly" if self.readonly else f"LSN {self.last_lsn}"
        return f"<KVStore {self.path!r} {mode}>"


def open(path: str | os.PathLike[str], sync: str = "always",  # noqa: A001
         segment_bytes: int = 64 << 20, readonly: bool = False, **options: object) -> KVStore:
    """Open (or create) the store at ``path``.

    Options: ``map_size`` (initial LMDB map, grown as needed), ``writemap``
    (default True), ``max_value_bytes``, ``max_record_bytes``, ``max_readers``,
    ``overlay`` (default True: small writes reach LMDB in bulk, up to 50 ms
    later, so ``readonly=True`` processes may lag that much; False: each
    group is written to LMDB before it returns),
    ``progress`` (callback(done, total) during replay), ``fs``, and the log's
    ``sync_interval``, ``sync_bytes``, ``recovery``.

    ``archive``: ship the log and snapshots to an archive (a URI pyarrow
    understands, ``s3://...``, ``file://...``, a local directory, or a
    ``(filesystem, path)`` pair) every ``archive_interval`` seconds, in a
    thread of this process; ``archive_keep_snapshots``/``archive_keep_seconds``:
    the archive's retention. See :mod:`kvstore.store.archiving`.
    """
    return KVStore(path, sync=sync, segment_bytes=segment_bytes, readonly=readonly,
                   **options)  # type: ignore[arg-type]

