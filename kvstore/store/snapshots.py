"""Snapshots of a store: taking one, retention, and the base a rebuild starts from.

The snapshot files themselves are the :mod:`snapshot` package's; this module
is what ties them to a store's LMDB state and log.

* A snapshot is read from one LMDB read transaction, together with the
  applied LSN stored in that same transaction, so it is exactly the state at
  that LSN while writers go on. The log is synced first, so every entry the
  snapshot covers is durable in the log too: a snapshot never claims an LSN
  that a machine crash could take back.
* Retention, once the new snapshot is durable: keep the newest
  ``keep_snapshots`` valid snapshots, and delete the log segments whose every
  LSN is covered by the *oldest kept* one. (Deleting up to the newest would
  free more, but keeping the log back to the oldest kept snapshot is what
  makes falling back past a damaged newest snapshot, and point-in-time
  restore to any LSN since the oldest kept snapshot, possible.)
* :class:`StoreSnapshots` is the writer's: it takes one snapshot at a time.
* A rebuild (after a machine crash, or any sign of damage in LMDB) loads the
  newest snapshot that verifies and that the log still reaches back to, then
  replays the log after it.
* Only snapshots of this store count: a snapshot whose manifest names
  another store id (left in ``snapshots/`` by a store deleted and made again
  at the same path) is skipped with a logged warning naming both ids, by
  rebuilds, restore (:func:`choose_base`), retention and the "nothing new"
  check of :func:`take`; retention never deletes it, nor trims the log for it.
* A snapshot is never written for a store whose directory vanished under its
  writer: the log's directory is checked (:meth:`wal.Log.check_directory`)
  before anything is created and again just before the commit, and the
  ``snapshots/`` directory is created only inside an existing store.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import snapshot
import wal
from kvstore.layout import SNAPSHOTS_DIR, WAL_DIR
from kvstore.state.machine import State
from kvstore.state.readers import ReadView
from kvstore.store.groups import group_start
from wal import list_segments, read_durable_lsn
from wal.errors import ClosedError, CorruptionError, Damage, SnapshotError
from wal.failures import file_error
from wal.fs import FileSystem
from wal.progress import Progress

log_ = logging.getLogger("walkv.snapshots")
_warned_foreign: set[str] = set()

DEFAULT_KEEP = 2


def snapshots_dir(store_path: str) -> str:
    return os.path.join(store_path, SNAPSHOTS_DIR)


class StoreSnapshots:
    """The snapshots a store's writer takes: one at a time, each followed by
    retention (the newest ``keep`` kept, the log back to the oldest of them,
    and never past what an archive or a consumer still needs);
    ``log_bytes_trimmed`` counts what retention freed."""

    def __init__(self, store_path: str, fs: FileSystem, *, keep: int, chunk_bytes: int | None) -> None:
        if type(keep) is not int or keep < 1:
            raise ValueError(f"keep_snapshots must be an int >= 1, not {keep!r}")
        self.parent = snapshots_dir(store_path)
        self.keep = keep
        self.chunk_bytes = chunk_bytes
        self.log_bytes_trimmed = 0
        self._fs = fs
        self._lock = threading.Lock()  # one snapshot (and its retention) at a time

    def take(self, state: State, log: wal.Log, floor: Callable[[], int | None], *, keep: int | None = None,
             chunk_bytes: int | None = None, progress: Progress | None = None) -> snapshot.SnapshotInfo:
        """:func:`take`, then :func:`retain`, never trimming the log at or
        after ``floor()`` (the lowest LSN the archive or a consumer still
        needs; None: nothing does)."""
        with self._lock:
            info = take(state, log, self.parent, store_id=log.store_id, fs=self._fs,
                        chunk_bytes=chunk_bytes or self.chunk_bytes, progress=progress)
            self.log_bytes_trimmed += retain(self.parent, log, keep or self.keep, self._fs, floor())
        return info


def own_snapshots(parent: str, store_id: str | None) -> list[snapshot.SnapshotInfo]:
    """The valid snapshots in ``parent`` (oldest first) that belong to the
    store ``store_id`` (or name no store); the others are left out with a
    warning naming both ids (once per snapshot)."""
    out = []
    for info in snapshot.list_snapshots(parent):
        if store_id is None or info.store_id in (None, store_id):
            out.append(info)
        else:
            _warn_foreign(info.path, info.store_id, store_id)
    return out


def _warn_foreign(path: str, theirs: str | None, ours: str) -> None:
    if path not in _warned_foreign:
        _warned_foreign.add(path)
        log_.warning("ignoring snapshot %s: it belongs to store %s, not to this store %s (left by a store "
                     "that was deleted or replaced at the same path?)", path, theirs, ours)


def take(state: State, log: wal.Log, parent: str, *, store_id: str, fs: FileSystem,
         chunk_bytes: int | None = None, progress: Progress | None = None) -> snapshot.SnapshotInfo:
    """Write a snapshot of ``state`` at its applied LSN into ``parent``.
    Durable on return (the manifest and its directory are fsynced). When no
    write happened since the newest snapshot of this store, that snapshot is
    returned. Raises :class:`~wal.errors.StoreVanishedError` (creating
    nothing) when the store's directory was deleted or replaced under it.
    Its record limit follows the log's (a value the store took fits a
    record; a larger one, from an open with a higher limit, raises it).
    The caller holds the store's snapshot lock."""
    log.check_directory()
    try:
        fs.mkdir(parent)  # inside the store, which must still be there: never recreated
        fs.fsync_dir(os.path.dirname(parent))
    except FileExistsError:
        pass
    except OSError as e:
        raise file_error(e, f"taking a snapshot of {os.path.dirname(parent)}") from None
    newest = own_snapshots(parent, store_id)

    def before_commit() -> None:
        # Every pair was read: release the view before waiting for the log. A
        # group's leader may be growing LMDB's map, which waits for open views;
        # log.sync() waits for that leader: holding the view would deadlock.
        scan.end()  # (while the view still holds the map in place)
        view.close()
        log.check_directory()
        _make_durable(log, lsn)

    with state.expiring_reads.read_view() as view, state.lmdb.sequential_scan() as scan:
        lsn = view.lsn
        if newest and newest[-1].lsn == lsn:
            return newest[-1]
        _move_foreign_aside(parent, lsn, store_id, fs)
        info = write_view(state, view, parent, store_id=store_id, fs=fs, progress=progress,
                          before_commit=before_commit, chunk_bytes=chunk_bytes or snapshot.DEFAULT_CHUNK_BYTES,
                          max_record_bytes=max(log.max_record_bytes, snapshot.MAX_RECORD_BYTES))
    log_.info("snapshot of %s at LSN %d: %d keys in %s", os.path.dirname(parent), lsn, info.count, info.path)
    return info


def write_view(state: State, view: ReadView, parent: str, *, store_id: str | None,
               **options: Any) -> snapshot.SnapshotInfo:
    """Write the snapshot of ``state`` at ``view``'s LSN into ``parent``
    (:func:`snapshot.write`, with ``options``; durable on return): the
    default keyspace, and a section for each named keyspace ("ks:<name>"),
    for the expiry metadata ("ttl:...", "lease:...") and for the staged
    groups ("groups"); the last two are bookkeeping (the snapshot's count
    of keys leaves them out). Every snapshot of a store's state holds all
    of them: one without the expiry sections would rebuild its keys as
    never expiring. ``view`` stays open (its owner closes it, or
    ``before_commit`` does)."""
    bookkeeping = {name: view.db_pairs(db) for name, db in view.run(state.expiry.sections).items()}
    bookkeeping.update((name, view.db_pairs(db)) for name, db in view.run(state.groups.sections).items())
    return snapshot.write(parent, view.lsn, view.db_pairs(None), sections={**view.sections(), **bookkeeping},
                          bookkeeping=bookkeeping.keys(), store_id=store_id, total=view.count, **options)


def _move_foreign_aside(parent: str, lsn: int, store_id: str, fs: FileSystem) -> None:
    """Another store's snapshot at the name this store's snapshot at ``lsn``
    needs is renamed to ``foreign-<its store id>-snap-<lsn>`` (a name walkv
    never reads or deletes), with a warning."""
    name = snapshot.snapshot_dir_name(lsn)
    path = os.path.join(parent, name)
    try:
        theirs = snapshot.open(path).store_id
    except (CorruptionError, SnapshotError):
        return  # none there, or a damaged one: snapshot.write reports it
    if theirs in (None, store_id):
        return
    aside = os.path.join(parent, f"foreign-{theirs}-{name}")
    fs.rename(path, aside)
    fs.fsync_dir(parent)
    log_.warning("moved snapshot %s of store %s aside to %s: this store %s writes its own snapshot at LSN %d",
                 path, theirs, aside, store_id, lsn)


def _make_durable(log: wal.Log, lsn: int) -> None:
    """With sync="batch" or "none" the state may be ahead of the durable log:
    a snapshot must never claim an LSN that a machine crash could take back
    (the log would hand it out again). Runs after the view is released."""
    if log.durable_lsn < lsn:
        log.sync()


def retain(parent: str, log: wal.Log, keep: int, fs: FileSystem, floor: int | None = None) -> int:
    """Keep the newest ``keep`` snapshots of this store and the log back to
    the oldest of them; return the log bytes freed. Snapshots of another
    store at or after that one are left alone and do not count. A segment
    holding ``floor`` or any later LSN is kept too (``floor``: the lowest LSN
    the archive does not hold yet, or a consumer has not read yet): the local
    log never loses what they need."""
    own = own_snapshots(parent, log.store_id)
    if not own:
        snapshot.cleanup_incomplete(parent, fs=fs)
        return 0
    oldest = own[-keep:][0].lsn
    # prune keeps the newest N valid snapshots: N = those (of any store) from ``oldest`` on.
    snapshot.prune(parent, keep=sum(1 for s in snapshot.list_snapshots(parent) if s.lsn >= oldest), fs=fs)
    kept = own_snapshots(parent, log.store_id)
    if not kept:
        return 0
    below = kept[0].lsn + 1
    if floor is not None and floor < below:
        log_.debug("log of %s kept from LSN %d: the archive or a consumer needs it", os.path.dirname(parent),
                   floor)
        below = floor
    below = group_start(log, below)  # a reader from there reads a staged group back from its parts
    freed = log.truncate_before(below)
    if freed:
        log_.info("log of %s trimmed below LSN %d: %d bytes freed", os.path.dirname(parent), below, freed)
    return freed


def choose_base(snapshot_dirs: list[str], wal_dir: str | None, log_first: int, target: int | None,
                store_id: str | None = None) -> snapshot.Snapshot | None:
    """The newest snapshot (of ``snapshot_dirs``, newest first) whose files
    are whole (:meth:`snapshot.Snapshot.verify_checksums`: their sizes and
    CRCs are the manifest's; their records are checked by the load that
    reads them, so a snapshot whose writer wrote a bad record is a
    CorruptionError of the load, not passed over), is at or below
    ``target`` (None: any) and from which the log reaches it;
    ``None`` when none is and the log starts at LSN 1 (replay it all).
    Used by rebuilds and by restore. Raises :class:`SnapshotError` naming
    what was wrong with each candidate otherwise."""
    problems = []
    for path in snapshot_dirs:
        try:
            snap = snapshot.open(path)
        except (CorruptionError, SnapshotError) as e:
            problems.append(f"{path}: {e}")
            continue
        if target is not None and snap.lsn > target:
            continue
        if store_id is not None and snap.store_id not in (None, store_id):
            _warn_foreign(path, snap.store_id, store_id)
            problems.append(f"{path}: belongs to store {snap.store_id}, not to {store_id}")
            continue
        if snap.lsn != target and (wal_dir is None or snap.lsn + 1 < log_first):
            problems.append(f"{path}: the log no longer reaches back to LSN {snap.lsn + 1}")
            continue
        try:
            snap.verify_checksums()  # the load checks every record as it reads it
        except (CorruptionError, SnapshotError) as e:
            log_.warning("snapshot %s is unusable (%s); falling back to an older one", path, e)
            problems.append(f"{path}: {e}")
            continue
        return snap
    if wal_dir is not None and log_first == 1:
        if problems:
            log_.warning("no usable snapshot (%s); replaying the whole log instead", "; ".join(problems))
        return None
    raise SnapshotError(
        "no snapshot can be used" + (f" up to LSN {target}" if target is not None else "")
        + (": " + "; ".join(problems) if problems else ": there is none, and the log does not start at LSN 1")
    )


def rebuild_base(store_path: str, store_id: str | None = None
                 ) -> tuple[snapshot.Snapshot, int] | None:
    """``(snapshot, lsn)`` of the snapshot a rebuild of the store's LMDB starts
    from (see :func:`choose_base`), or None: replay the whole log."""
    wal_dir = os.path.join(store_path, WAL_DIR)
    segments = list_segments(wal_dir) if os.path.isdir(wal_dir) else []
    candidates = [i.path for i in reversed(snapshot.list_snapshots(snapshots_dir(store_path)))]
    try:
        snap = choose_base(candidates, wal_dir, segments[0].first_lsn if segments else 1,
                           read_durable_lsn(wal_dir), store_id)
    except SnapshotError as e:
        raise CorruptionError(f"cannot rebuild the state: {e}", kind=Damage.MISSING,
                              path=snapshots_dir(store_path), offset=0, hint="`walkv verify STORE` lists the damage") from None
    return None if snap is None else (snap, snap.lsn)


class AutoSnapshot:
    """Calls ``take`` (the store's snapshot method) in a background thread
    whenever ``every_bytes`` of log were written since the last one, so that
    the log stays bounded under steady writes. :meth:`poke` is cheap; the
    store calls it after each group."""

    def __init__(self, take: Callable[[], object], name: str, every_bytes: int) -> None:
        self._take = take
        self.name = name
        self.every_bytes = every_bytes
        self._mark = 0
        self._thread: threading.Thread | None = None
        self.taken = 0
        self.last_error: BaseException | None = None

    def poke(self, appended_bytes: int) -> None:
        if appended_bytes - self._mark < self.every_bytes:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._mark = appended_bytes
        self._thread = threading.Thread(target=self._run, name="walkv-auto-snapshot", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._take()
            self.taken += 1
        except ClosedError:
            pass
        except Exception as e:  # noqa: BLE001 - reported, and retried at the next threshold
            self.last_error = e
            log_.warning("automatic snapshot of %s failed: %s", self.name, e)

    def join(self, timeout: float | None = None) -> None:
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
