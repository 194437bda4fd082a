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
  LSN is covered by the *oldest kept* one. (DESIGN.md allows deleting up to
  the newest; keeping the log back to the oldest kept snapshot is what makes
  falling back past a damaged newest snapshot, and point-in-time restore to
  any LSN since the oldest kept snapshot, possible.)
* A rebuild (after a machine crash, or any sign of damage in LMDB) loads the
  newest snapshot that verifies and that the log still reaches back to, then
  replays the log after it.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

import lmdb

import snapshot
from kvstore.state import K_APPLIED, State
from wal.errors import ClosedError, CorruptionError, SnapshotError
from wal.segment import list_segments, read_durable_lsn

if TYPE_CHECKING:
    from kvstore.store import KVStore

log = logging.getLogger("walkv.snapshots")

SNAPSHOTS_DIR = "snapshots"
DEFAULT_KEEP = 2
Progress = Callable[[int, "int | None"], None]


def snapshots_dir(store_path: str) -> str:
    return os.path.join(store_path, SNAPSHOTS_DIR)


@contextmanager
def consistent_view(state: State) -> Iterator[tuple[int, Iterator[tuple[bytes, bytes]], int]]:
    """``(applied_lsn, pairs in key order, count)`` from one LMDB read
    transaction. While it is open the LMDB map cannot be grown (py-lmdb
    needs no live transaction for that), so a writer that fills the map
    meanwhile waits for the view to close."""
    state._enter()
    try:
        try:
            txn = state.env.begin(db=state._data)
        except lmdb.MapResizedError:
            state._gate.exit()
            state._adopt_mapsize()
            state._enter()
            txn = state.env.begin(db=state._data)
        try:
            raw = txn.get(K_APPLIED, db=state._main)
            applied = int.from_bytes(raw, "little") if raw else 0
            count = txn.stat(state._data)["entries"]
            yield applied, txn.cursor().iternext(keys=True, values=True), count
        finally:
            txn.abort()
    finally:
        state._gate.exit()


def take(db: "KVStore", *, chunk_bytes: int | None = None, progress: Progress | None = None,
         keep: int | None = None) -> snapshot.SnapshotInfo:
    """Write a snapshot of ``db`` at its applied LSN, then apply retention.
    Durable on return (the manifest and its directory are fsynced). When no
    write happened since the newest snapshot, that snapshot is returned."""
    if db.closed:
        raise ClosedError(f"the store {db.path} is closed")
    if db.readonly:
        raise SnapshotError(f"the store {db.path} is open read-only; snapshots are taken by its writer")
    parent = snapshots_dir(db.path)
    with _snapshot_lock(db):
        db.sync()  # the snapshot's LSN must be durable in the log
        state = db._state
        newest = snapshot.list_snapshots(parent)
        with consistent_view(state) as (lsn, pairs, count):
            if newest and newest[-1].lsn == lsn:
                info = newest[-1]
            else:
                options = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
                info = snapshot.write(parent, lsn, pairs, store_id=db.store_id, fs=db._fs,
                                      progress=progress, total=count, **options)
                log.info("snapshot of %s at LSN %d: %d keys in %s", db.path, lsn, info.count, info.path)
        retain(db, keep if keep is not None else db.keep_snapshots)
    return info


def retain(db: "KVStore", keep: int = DEFAULT_KEEP) -> int:
    """Keep the newest ``keep`` snapshots and the log back to the oldest of
    them; return the log bytes freed."""
    parent = snapshots_dir(db.path)
    snapshot.prune(parent, keep=keep, fs=db._fs)
    kept = snapshot.list_snapshots(parent)
    if not kept:
        return 0
    freed = db._log.truncate_before(kept[0].lsn + 1)
    if freed:
        log.info("log of %s trimmed below LSN %d: %d bytes freed", db.path, kept[0].lsn + 1, freed)
    db.log_bytes_trimmed += freed
    return freed


def rebuild_base(store_path: str) -> tuple[Iterator[tuple[bytes, bytes]], int] | None:
    """``(pairs, lsn)`` of the newest snapshot that verifies and that the log
    still reaches back to, or None when the store has no snapshot. Raises
    :class:`CorruptionError` when snapshots exist but none can be used with
    the log that is left."""
    parent = snapshots_dir(store_path)
    wal_dir = os.path.join(store_path, "wal")
    segments = list_segments(wal_dir) if os.path.isdir(wal_dir) else []
    log_first = segments[0].first_lsn if segments else 1
    log_last = read_durable_lsn(wal_dir)
    candidates = list(reversed(snapshot.list_snapshots(parent)))
    if not candidates:
        if log_first > 1:
            raise CorruptionError(
                f"the log starts at LSN {log_first} but there is no usable snapshot to start from",
                path=parent, hint="restore the snapshots directory from a backup, or `walkv restore` an older copy",
            )
        return None
    problems = []
    for info in candidates:
        if info.lsn + 1 < log_first:
            problems.append(f"{info.path}: the log no longer reaches back to LSN {info.lsn + 1}")
            continue
        if log_last is not None and info.lsn > log_last:
            problems.append(f"{info.path}: newer (LSN {info.lsn}) than the log's durable end (LSN {log_last})")
            continue
        try:
            snap = snapshot.open(info.path)
            snap.verify()
        except (CorruptionError, SnapshotError) as e:
            log.warning("snapshot %s is unusable (%s); falling back to an older one", info.path, e)
            problems.append(f"{info.path}: {e}")
            continue
        return iter(snap), snap.lsn
    raise CorruptionError(
        "no snapshot can rebuild the state: " + "; ".join(problems), path=parent,
        hint="`walkv verify STORE` lists the damage",
    )


def _snapshot_lock(db: "KVStore") -> threading.Lock:
    lock = db.__dict__.get("_snapshot_mutex")
    if lock is None:
        lock = db.__dict__.setdefault("_snapshot_mutex", threading.Lock())
    return lock


class AutoSnapshot:
    """Takes a snapshot in a background thread whenever ``every_bytes`` of log
    were written since the last one, so that the log stays bounded under
    steady writes. :meth:`poke` is cheap; the store calls it after each group."""

    def __init__(self, db: "KVStore", every_bytes: int) -> None:
        self.db = db
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
            take(self.db)
            self.taken += 1
        except ClosedError:
            pass
        except Exception as e:  # noqa: BLE001 - reported, and retried at the next threshold
            self.last_error = e
            log.warning("automatic snapshot of %s failed: %s", self.db.path, e)

    def join(self, timeout: float | None = None) -> None:
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
