"""What a store has only in the process that writes it: :class:`StoreWriter`,
its lock, its log, its snapshots and its archiver.

Opening (:meth:`StoreWriter.open`), in this order, each step undone in reverse
when a later one fails:

1. ``STORE/LOCK`` (:class:`wal.lock.DirectoryLock`): one writing process per
   store; a second one gets :class:`~wal.errors.LockedError`. A replica
   directory (``STORE/REPLICA``) is refused: it is written by its replica.
2. The log (:func:`wal.open`), which takes its own lock and recovers its tail.
3. The LMDB state, trusted and replayed or rebuilt
   (:func:`kvstore.store.recovery.open_state`).
4. Snapshot directories an interrupted snapshot left are removed.

The archiver (``kvstore.open(path, archive=LOCATION)``) starts once the store
is open. Local log retention never deletes a segment the archive does not
hold yet: it is bounded by the archiver's archived LSN and by a sidecar's
(``walkv archive STORE URI`` in another process) published one
(``STORE/ARCHIVED``, :mod:`kvstore.archive.marker`), whichever is lower.

Log retention after each snapshot also keeps what a consumer still needs
(:mod:`kvstore.watch.consumers`): named subscriptions, live consumers in other
processes and the store's own watchers, up to ``max_retained_bytes``.

Closing (:meth:`StoreWriter.close`): the log first, so every write in flight
finishes; then LMDB is flushed and closed, and the clean close is recorded in
``lmdb/SESSION`` (the next open trusts LMDB as it is). When the log failed
(an fsync error, a full disk), LMDB is closed without a flush and no clean
close is recorded: the next open replays the log, which holds every
acknowledged write. Then the archiver makes one last round, so that after a
clean close with the archive reachable every acknowledged write is in the
archive; it is given ``archive_close_timeout`` seconds (an option of
``kvstore.open``, default :data:`ARCHIVE_CLOSE_TIMEOUT`), so that an object
store that does not answer cannot hold the close up. When that round fails
or runs out of time the close still succeeds, with one warning naming the
LSNs not shipped and why (the next open with the same ``archive=`` resumes
from what the archive holds). Last, the lock is released.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import snapshot
import wal
from kvstore.archive import Archiver
from kvstore.archive.marker import read_archived
from kvstore.archive.target import Location
from kvstore.entry.codec import decode
from kvstore.layout import LMDB_DIR, REPLICA_NAME, WAL_DIR
from kvstore.state import State, StateOptions
from kvstore.store import recovery, snapshots
from kvstore.watch import consumers
from snapshot.layout import discard_dir, parse_snapshot_dir_name
from wal.errors import ArchiveError, ReplicaError, SnapshotError, WalkvError
from wal.fs import FileSystem
from wal.hooks import LogHooks
from wal.lock import DirectoryLock
from wal.progress import Progress
from wal.timeline import History, TimelineStart

log = logging.getLogger("walkv.store")

ARCHIVE_CLOSE_TIMEOUT = 5.0
"""Seconds ``close()`` gives the archiver's last round (``archive_close_timeout``)."""



def snapshot_dirs_after(parent: str, lsn: int) -> list[tuple[int, str]]:
    """``(lsn, name)`` of the snapshot directories in ``parent`` past ``lsn``."""
    found = []
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        at = parse_snapshot_dir_name(name)
        if at is not None and at > lsn:
            found.append((at, name))
    return sorted(found)


class StoreWriter:
    """A store's lock, log, snapshots and archiver (module docstring). Use
    :meth:`open`."""

    def __init__(self, path: str, fs: FileSystem, lock: DirectoryLock, log: wal.Log,
                 snapshots_: snapshots.StoreSnapshots) -> None:
        self.path = path
        self.log = log
        self.snapshots = snapshots_
        self.max_retained_bytes = consumers.DEFAULT_MAX_RETAINED_BYTES
        self.archiver: Archiver | None = None
        self.archive_close_timeout = ARCHIVE_CLOSE_TIMEOUT
        self.auto: snapshots.AutoSnapshot | None = None
        self._fs = fs
        self._lock = lock

    @classmethod
    def open(cls, path: str, fs: FileSystem, options: StateOptions, snapshots_: snapshots.StoreSnapshots, *,
             progress: Progress | None, hooks: LogHooks, log_options: dict[str, Any]
             ) -> tuple[StoreWriter, recovery.Opened]:
        """Take the store at ``path`` as its writer and open its state (module
        docstring); on any failure let go of everything taken."""
        fs.makedirs(path)
        lock = DirectoryLock(path, f"the store {path}")
        try:
            if os.path.exists(os.path.join(path, REPLICA_NAME)):
                raise ReplicaError(f"{path} is a read replica (kvstore.replica): open it with "
                                   f"kvstore.open_replica, or promote() it to write to it")
            log_ = wal.open(os.path.join(path, WAL_DIR), hooks=hooks, fs=fs, **log_options)
            try:
                opened = recovery.open_state(path, os.path.join(path, LMDB_DIR), log_, fs=fs, options=options,
                                             progress=progress)
                try:
                    snapshot.cleanup_incomplete(snapshots_.parent, fs=fs)
                except BaseException:
                    opened.state.close(sync=False)
                    raise
            except BaseException:
                try:
                    log_.close()
                except WalkvError:
                    pass
                raise
        except BaseException:
            lock.release()
            raise
        return cls(path, fs, lock, log_, snapshots_), opened

    # -- the log's LSNs, history and appends (what :class:`~kvstore.store.readonly.ReadOnly` reads from files) --

    @property
    def last_lsn(self) -> int:
        return self.log.last_lsn

    @property
    def durable_lsn(self) -> int:
        return self.log.durable_lsn

    @property
    def history(self) -> History:
        return self.log.history

    @property
    def failure(self) -> WalkvError | None:
        return self.log.failure

    @staticmethod
    def applied_lsn(state: State) -> int:
        """What this process's reads see."""
        return state.applied_lsn

    def sync(self) -> int:
        return self.log.sync()

    def refuse_appends(self, error: WalkvError | None) -> None:
        self.log.refuse_appends(error)

    def append_replicated(self, entries: Sequence[wal.Entry]) -> int:
        """Another log's entries (a leader's), with their own LSNs, and the
        operations each carries (:meth:`wal.Log.append_replicated`)."""
        return self.log.append_replicated(entries, [decode(e.payload, e.lsn) for e in entries])

    def start_timeline(self, number: int | None, timeline: TimelineStart | None = None) -> TimelineStart:
        """The log goes on on a new timeline (:meth:`wal.Log.start_timeline`);
        LMDB's SESSION states the new history before any entry of it is
        applied (:mod:`kvstore.store.recovery`)."""
        start = self.log.start_timeline(number, timeline=timeline)
        self._record_history()
        return start

    def _record_history(self) -> None:
        recovery.write_session(os.path.join(self.path, LMDB_DIR), self.log.store_id, clean=False,
                               history=self.log.history, fs=self._fs)

    def discard_after(self, lsn: int, follow: History, state: State) -> int:
        """:meth:`kvstore.store.following.Following.discard_after`: when the state applied past
        ``lsn`` it is marked to be rebuilt at the next open (the caller
        reopens the store), snapshots past ``lsn`` go, then the log is cut and
        goes on on ``follow``'s line."""
        dropped = self.log.last_lsn - lsn
        if dropped < 0:
            return 0
        if dropped == 0:  # nothing to drop; a timeline begun here and never written on gives way to follow's line
            empty = self.log.history[-1]
            if self.log.truncate_after(lsn, follow=follow) is not None:
                self._record_history()
                log.warning("%s: gave up %s, begun at LSN %d and never written on, for its leader's line; it goes "
                            "on on %s", self.path, empty, lsn + 1, self.log.history[-1])
            return 0
        first = self.log.first_lsn
        bases = [at for at, _ in snapshot_dirs_after(self.snapshots.parent, -1) if first - 1 <= at <= lsn]
        if state.applied_lsn > lsn and first > 1 and not bases:
            raise SnapshotError(f"{self.path} cannot drop its entries after LSN {lsn}: its state applied them, and "
                                f"no snapshot at or before LSN {lsn} that its log (from LSN {first}) continues is "
                                "left to rebuild it from; build it again from its leader's snapshot")
        lmdb_dir = os.path.join(self.path, LMDB_DIR)
        if state.applied_lsn > lsn:  # before the cut: a crash from here on rebuilds it too
            recovery.write_session(lmdb_dir, self.log.store_id, clean=False, history=self.log.history, fs=self._fs,
                                   rebuild=f"LSNs after {lsn} were discarded (a fork: the leader's history left "
                                           f"this store's there)")
        for lsn_, name in snapshot_dirs_after(self.snapshots.parent, lsn):
            discard_dir(self._fs, self.snapshots.parent, name, lsn_)
        self.log.truncate_after(lsn, follow=follow)
        if state.applied_lsn <= lsn:
            self._record_history()
        log.warning("%s: discarded %d log entries after LSN %d that its leader's history does not hold "
                    "(written here, never acknowledged); it goes on on %s", self.path, dropped, lsn,
                    self.log.history[-1])
        return dropped

    def start_archiver(self, location: Location, *, interval: float, keep_snapshots: int | None,
                       keep_seconds: float | None, close_timeout: float = ARCHIVE_CLOSE_TIMEOUT) -> None:
        """Ship the store to ``location`` from a thread of this process;
        ``close_timeout``: seconds :meth:`close` gives its last round."""
        if not close_timeout >= 0:
            raise ValueError(f"archive_close_timeout must be >= 0 seconds, not {close_timeout!r}")
        self.archive_close_timeout = float(close_timeout)
        self.archiver = Archiver(self.path, location, interval=interval, keep_snapshots=keep_snapshots,
                                 keep_seconds=keep_seconds)
        self.archiver.start()

    def take_snapshots_every(self, take: Callable[[], object], every_bytes: int) -> None:
        """Call ``take`` in the background whenever ``every_bytes`` of log
        were written since the last snapshot (:class:`snapshots.AutoSnapshot`).
        At open, before the store binds its log hooks, which look once."""
        self.auto = snapshots.AutoSnapshot(take, self.path, every_bytes)

    def committed(self) -> None:
        """After each group (the log's committing thread): start an automatic
        snapshot when one is due."""
        if self.auto is not None:
            self.auto.poke(self.log.appended_bytes)

    # -- snapshots and the archive ----------------------------------------------

    def snapshot(self, state: State, watchers: Callable[[], list[int]], **options: Any) -> snapshot.SnapshotInfo:
        """Take a snapshot of ``state`` and apply retention, which keeps what
        the archive does not hold yet and what consumers still need: named
        subscriptions, live consumers in other processes and this process's
        ``watchers()`` (their next LSNs), up to ``max_retained_bytes``
        (:mod:`kvstore.watch.consumers`)."""
        def floor() -> int | None:
            archived = self.archived_lsn()
            floors = [] if archived is None else [archived + 1]
            needed = consumers.retention_floor(self.path, self.max_retained_bytes, watchers())
            if needed is not None:
                floors.append(needed)
            return min(floors) if floors else None
        return self.snapshots.take(state, self.log, floor, **options)

    def archived_lsn(self) -> int | None:
        """The highest LSN local log retention may delete (None: no archive
        bounds it): the in-process archiver's and a sidecar's, whichever is lower."""
        limits = [self.archiver.archived_lsn] if self.archiver is not None else []
        published = read_archived(self.path)
        if published is not None:
            limits.append(published)
        return min(limits) if limits else None

    def flush_archive(self, timeout: float | None) -> int:
        if self.archiver is None:
            raise ArchiveError(f"the store {self.path} was opened without archive=; there is no archive to flush")
        return self.archiver.flush(timeout)

    def wait_for_snapshots(self, timeout: float | None) -> None:
        if self.auto is not None:
            self.auto.join(timeout)

    def stats(self) -> dict[str, Any]:
        """The log's stats under ``"log"``, the archive's under ``"archive"``
        (no credentials; ``stopped``: it stopped for good, as after another
        archiver's lease or an archive of another store), snapshot counters."""
        out: dict[str, Any] = {
            "auto_snapshots": self.auto.taken if self.auto is not None else 0,
            "log_bytes_trimmed": self.snapshots.log_bytes_trimmed,
            "log": self.log.stats(),
        }
        if self.archiver is not None:
            out["archive"] = self.archiver.stats()
            out["archive"]["stopped"] = self.archiver.failed is not None
        return out

    # -- closing ---------------------------------------------------------------

    def close(self, state: State) -> None:
        """The log, then ``state``, then the archiver's last round, then the
        lock (module docstring). The caller waited for automatic snapshots."""
        clean = self.log.failure is None
        try:
            try:
                self.log.close()
            except WalkvError:
                clean = False
                raise
            finally:
                state.close(sync=clean)
            if clean:
                try:
                    recovery.write_session(os.path.join(self.path, LMDB_DIR), self.log.store_id, clean=True,
                                           history=self.log.history, fs=self._fs)
                except OSError as exc:
                    raise WalkvError(
                        f"closing {self.path}: could not record the clean close ({exc}); "
                        f"nothing is lost, the next open replays the log") from exc
        finally:
            if self.archiver is not None:  # after the log: it ships everything durable
                self._stop_archiver()
            self._lock.release()

    def _stop_archiver(self) -> None:
        assert self.archiver is not None
        archiver, durable = self.archiver, self.log.durable_lsn
        in_time = archiver.stop(self.archive_close_timeout)
        archived = archiver.archived_lsn
        if archived < durable or not in_time:
            late = "" if in_time else (f"the archive did not answer within archive_close_timeout="
                                       f"{self.archive_close_timeout:g} s; ")
            error = f"last error: {archiver.last_error}; " if archiver.last_error else ""
            lsns = f"LSNs {archived + 1}..{durable} were" if archived + 1 < durable else f"LSN {durable} was"
            what = f"{lsns} not shipped" if archived < durable else "its lease was not released (it expires)"
            log.warning("closed %s with the archive %s at LSN %d of %d durable: %s (%s%s"
                        "the next open with this archive ships the rest)", self.path, archiver.uri, archived,
                        durable, what, late, error)
