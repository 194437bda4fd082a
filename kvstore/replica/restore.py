"""Restore: a new store built from a snapshot plus the log, up to any LSN.

``kvstore.restore(source, target, to_lsn=None)`` reads the source's files only
(no lock: the source may be open by its writer in another process, and only
its durable entries are read), and builds the target in a private temporary
directory that is renamed into place when it is whole:

0. the target is checked first (:func:`check_target`): missing, or an empty
   directory, else :class:`~wal.errors.WalkvError` naming it, whatever the
   source (a store, a snapshot or an archive);
1. pick the newest snapshot at or below ``to_lsn`` that verifies, belongs to
   the source's log (its store id; a snapshot of another store left at the
   same path is skipped with a warning naming both ids) and from which the
   log still reaches ``to_lsn`` (falling back to older ones);
2. bulk-load it into a new LMDB, then replay the source log's entries after
   it, up to ``to_lsn`` (point-in-time restore; default: the durable end);
3. give the target its own log, empty and continuing at ``to_lsn + 1``, and
   a snapshot at ``to_lsn``, so that it is a store like any other: it can be
   opened, written, and rebuilt after a machine crash of its own. When no
   log entry followed the local snapshot it started from, that snapshot's
   chunk files are copied (checked against their manifest as they are) and
   named the target's (:func:`snapshot.copy`; in a restore of 1M keys the
   copy took 0.15 s where encoding every pair again took 0.7 s of 1.86);
   otherwise the snapshot is written from the restored state, with every
   section a store's own snapshot has (:func:`~kvstore.store.snapshots.write_view`).

The target is a new store (a new store id): its history diverges from the
source's after ``to_lsn``. A snapshot directory given as the source restores
the snapshot's state (its LSN) unless ``to_lsn`` asks for a later one, which
its store's log then supplies.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Iterator, Protocol

import snapshot
import wal
from kvstore.archive.reader import time_to_us, us_to_text
from kvstore.layout import LMDB_DIR, REPLICA_NAME, SNAPSHOTS_DIR, WAL_DIR
from kvstore.store import recovery
from kvstore.store.snapshots import choose_base, write_view
from wal import Entry, list_segments, read_durable_lsn, read_log, read_store_id
from wal.errors import CorruptionError, Damage, ReplicaError, RestoreTimeError, SnapshotError, WalkvError
from wal.fs import OS_FS, file_in_the_way
from wal.progress import Progress
from wal.segment import read_newest_header
from wal.timeline import ROOT, History, fork_history, history_until, new_timeline


class OpenStore(Protocol):
    """An open store given as a restore's source (:class:`kvstore.KVStore`)."""

    @property
    def path(self) -> str: ...

log = logging.getLogger("walkv.restore")



@dataclass(frozen=True)
class RestoreInfo:
    path: str
    lsn: int  # the restored state is exactly the source's at this LSN
    snapshot_lsn: int  # the source snapshot it started from (0: none)
    replayed: int  # log entries applied after that snapshot
    count: int  # keys in the restored store
    seconds: float


class LogFiles:
    """The source log as :func:`kvstore.store.recovery.replay` reads it
    (:class:`kvstore.store.recovery.LogSource`): straight from the files, bounded at
    ``last_lsn``; no log at all when ``directory`` is ``None``."""

    def __init__(self, directory: str | None, first_lsn: int, last_lsn: int) -> None:
        self.directory = directory or ""
        self.first_lsn = first_lsn
        self.last_lsn = last_lsn

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *,
                     durable_only: bool = True) -> Iterator[Entry]:
        last = self.last_lsn if to_lsn is None else min(to_lsn, self.last_lsn)
        if not self.directory or from_lsn > last:
            return iter(())
        return read_log(self.directory, from_lsn, last, durable_only=durable_only)


def check_target(target: str) -> None:
    """Refuse a restore's ``target`` unless a new store can be built there:
    it must be missing (its parents are made) or an empty directory.

    :class:`~wal.errors.WalkvError`, for every kind of source: the argument
    is well formed (so not ``ValueError``, which walkv keeps for wrong
    arguments, exit 2), what stands in the way is the state of the file
    system when the restore runs (the same call works once the directory is
    emptied or another is named), and no narrower class of the hierarchy
    is about it (exit 1)."""
    blocker = file_in_the_way(target)
    if blocker is not None:
        what = "it is a file" if blocker == os.path.abspath(target) else f"{blocker} is a file"
        raise WalkvError(f"cannot restore into {target}: {what}, not a directory; restore builds a new "
                         "store in a new or empty directory: give another path")
    if os.path.isdir(target) and os.listdir(target):
        raise WalkvError(f"cannot restore into {target}: it exists and is not empty; restore builds a new "
                         "store in a new or empty directory: give another path")


def before_first_entry(source: str, t: datetime.datetime | float | int, first: Entry | None) -> RestoreTimeError:
    """The error for a ``to_time`` before ``first``, ``source``'s first entry."""
    asked = us_to_text(time_to_us(t))
    if first is None:
        return RestoreTimeError(
            f"nothing to restore at {asked}: {source} holds no entry yet; pass allow_empty=True "
            "(walkv restore --allow-empty) to build an empty store", first_lsn=None, first_time_us=None)
    return RestoreTimeError(
        f"nothing to restore at {asked}: it is before the first entry of {source} (LSN {first.lsn}, committed "
        f"at {us_to_text(first.timestamp_us)}); give a time at or after that one, or pass allow_empty=True "
        "(walkv restore --allow-empty) to build an empty store", first_lsn=first.lsn,
        first_time_us=first.timestamp_us)


def locate(source: str) -> tuple[str | None, list[str], int | None]:
    """``(log directory or None, snapshot directories newest first, the
    snapshot's LSN when ``source`` is one snapshot directory, else None)``."""
    lsn = snapshot.parse_snapshot_dir_name(os.path.basename(source))
    if os.path.isfile(os.path.join(source, snapshot.layout.MANIFEST_NAME)) or lsn is not None:
        parent = os.path.dirname(source)
        store = os.path.dirname(parent)
        wal_dir = os.path.join(store, WAL_DIR)
        has_log = os.path.basename(parent) == SNAPSHOTS_DIR and os.path.isdir(wal_dir)
        return (wal_dir if has_log else None), [source], lsn
    wal_dir = os.path.join(source, WAL_DIR)
    snaps = os.path.join(source, SNAPSHOTS_DIR)
    if not os.path.isdir(wal_dir) and not os.path.isdir(snaps):
        if os.path.isfile(os.path.join(source, REPLICA_NAME)):
            raise ReplicaError(f"{source} is a read replica, which keeps no log or snapshots to restore from: "
                               "restore from its source, or promote the replica first")
        raise WalkvError(f"{source} is neither a walkv store nor a snapshot directory")
    found = [i.path for i in reversed(snapshot.list_snapshots(snaps))]
    return (wal_dir if os.path.isdir(wal_dir) else None), found, None


def restore_store(source: str | os.PathLike[str] | OpenStore, target: str | os.PathLike[str],
            to_lsn: int | None = None, *, progress: Progress | None = None) -> RestoreInfo:
    """Build a new store at ``target`` equal to ``source`` at ``to_lsn``
    (default: its last durable LSN; for a snapshot directory, the
    snapshot's LSN). ``source`` is a store (path or open :class:`KVStore`)
    or one snapshot directory. ``target`` must not exist or be empty
    (:func:`check_target`). Durable on return."""
    t0 = time.monotonic()
    source = os.path.abspath(os.fspath(source) if isinstance(source, (str, os.PathLike)) else source.path)
    target = os.path.abspath(os.fspath(target))
    check_target(target)
    if to_lsn is not None and (not isinstance(to_lsn, int) or to_lsn < 0):
        raise ValueError(f"to_lsn must be a non-negative int, not {to_lsn!r}")
    wal_dir, snap_dirs, snap_lsn = locate(source)
    if to_lsn is None and snap_lsn is not None:
        to_lsn = snap_lsn  # a snapshot restores as it is, not its store's log after it
    segments = list_segments(wal_dir) if wal_dir else []
    log_first = segments[0].first_lsn if segments else 1
    log_last = 0
    if wal_dir:
        durable = read_durable_lsn(wal_dir)
        log_last = durable if durable is not None else max((e.lsn for e in read_log(wal_dir, log_first)),
                                                            default=log_first - 1)
    newest_snap = max((snapshot.parse_snapshot_dir_name(os.path.basename(p)) or 0 for p in snap_dirs), default=0)
    end = max(log_last, newest_snap if not wal_dir else 0)
    target_lsn = end if to_lsn is None else to_lsn
    if target_lsn > end:
        raise ValueError(f"cannot restore to LSN {target_lsn}: {source} is durable only up to LSN {end}")
    try:
        base = choose_base(snap_dirs, wal_dir, log_first, target_lsn, read_store_id(wal_dir) if wal_dir else None)
    except SnapshotError as e:
        raise SnapshotError(f"cannot restore to LSN {target_lsn}: {e}") from None
    header = read_newest_header(wal_dir) if wal_dir else None
    return build(target, LogFiles(wal_dir, log_first, target_lsn), base, target_lsn, source=source,
                 progress=progress, t0=t0, history=header.history if header is not None else ROOT)


def build(target: str, log_source: recovery.LogSource, base: snapshot.Snapshot | None, target_lsn: int, *,
          source: str, progress: Progress | None = None, t0: float | None = None,
          history: History = ROOT, store_id: str | None = None) -> RestoreInfo:
    """The second half of a restore, for any source (a store's files, an
    archive): ``base`` (None: an empty state) plus ``log_source``'s entries up
    to ``target_lsn``, into a new store at ``target`` (steps 2 and 3 of the
    module docstring). ``source`` names the source in messages, ``history``
    is the source's timeline history (the restored store's log goes on on a
    new timeline that forks from it after ``target_lsn``: wal.timeline).
    With ``store_id`` the target is that store, not a new one: a cluster
    node starting as its leader's follower, whose log goes on on the
    leader's line (no fork)."""
    t0 = time.monotonic() if t0 is None else t0
    check_target(target)
    base_lsn = base.lsn if base is not None else 0

    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.restoring-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    OS_FS.makedirs(tmp)
    try:
        lineage = history_until(history, target_lsn + 1 if store_id else target_lsn)
        if store_id is None:
            lineage = fork_history(lineage, new_timeline(history, target_lsn + 1))
        with wal.open(os.path.join(tmp, WAL_DIR), start_lsn=target_lsn + 1, history=lineage,
                      store_id=store_id) as new_log:
            store_id = new_log.store_id
            new_history = new_log.history
        lmdb_dir = os.path.join(tmp, LMDB_DIR)
        state = recovery.rebuild_state(
            lmdb_dir, log_source, store_id=store_id,
            base=base, base_lsn=base_lsn, progress=progress, history=new_history,
        )
        try:
            replayed = target_lsn - base_lsn
            with state.expiring_reads.read_view() as view:
                if view.lsn != target_lsn:
                    raise CorruptionError(f"restore reached LSN {view.lsn}, not {target_lsn}",
                                          kind=Damage.SEQUENCE, path=source, offset=0, lsn=view.lsn + 1)
                count = view.count
                snapshots_dir = os.path.join(tmp, SNAPSHOTS_DIR)
                if base is not None and base.lsn == target_lsn and base.fs is OS_FS:
                    snapshot.copy(base, snapshots_dir, store_id=store_id)  # the state is the base's: its files
                else:
                    write_view(state, view, snapshots_dir, store_id=store_id)
        finally:
            state.close(sync=True)
        recovery.write_session(lmdb_dir, store_id, clean=True, history=new_history)
        if os.path.isdir(target):
            os.rmdir(target)
        os.rename(tmp, target)
        OS_FS.fsync_dir(os.path.dirname(target))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info = RestoreInfo(target, target_lsn, base_lsn, replayed, count, time.monotonic() - t0)
    log.info("restored %s at LSN %d into %s (snapshot LSN %d + %d log entries, %d keys, %.2f s)",
             source, target_lsn, target, base_lsn, replayed, count, info.seconds)
    return info
