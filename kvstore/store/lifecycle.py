"""Taking a store's files as their one writer, and letting them go.

Opening, in this order (each step undone, in reverse, when a later one fails):

1. ``STORE/LOCK`` (:class:`wal.lock.DirectoryLock`): one writing process per
   store; a second one gets :class:`~wal.errors.LockedError`. A replica
   directory (``STORE/REPLICA``) is refused: it is written by its replica.
2. The log (:func:`wal.open`), which takes its own lock and recovers its tail.
3. The LMDB state, trusted and replayed or rebuilt
   (:func:`kvstore.store.recovery.open_state`).
4. Snapshot directories an interrupted snapshot left are removed.

Closing (:func:`close_writer`): the log first, so every write in flight
finishes; then LMDB is flushed and closed, and the clean close is recorded in
``lmdb/SESSION`` (the next open trusts LMDB as it is). When the log failed
(an fsync error, a full disk), LMDB is closed without a flush and no clean
close is recorded: the next open replays the log, which holds every
acknowledged write.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import snapshot
import wal
from kvstore.layout import LMDB_DIR, REPLICA_NAME, WAL_DIR
from kvstore.state import State, StateOptions
from kvstore.store import recovery, snapshots
from wal.errors import ReplicaError, WalkvError
from wal.fs import FileSystem
from wal.lock import DirectoryLock

Progress = Callable[[int, "int | None"], None]


class WriterFiles(NamedTuple):
    """What :func:`open_writer` took, and what opening the state did."""

    lock: DirectoryLock
    log: wal.Log
    state: State
    replayed: int          # log entries replayed (or rebuilt from)
    rebuilt: str | None    # why LMDB was rebuilt (None: it was trusted)


def open_writer(path: str, fs: FileSystem, options: StateOptions, *, progress: Progress | None,
                on_commit: Callable[[wal.Group], None], on_prepare: Callable[[wal.Group], list[Any] | None],
                log_options: dict[str, Any]) -> WriterFiles:
    """Take the store at ``path`` as its writer (module docstring); on any
    failure let go of everything taken."""
    fs.makedirs(path)
    lock = DirectoryLock(path, f"the store {path}")
    try:
        if os.path.exists(os.path.join(path, REPLICA_NAME)):
            raise ReplicaError(f"{path} is a read replica (kvstore.replica): open it with "
                               f"kvstore.open_replica, or promote() it to write to it")
        log = wal.open(os.path.join(path, WAL_DIR), on_commit=on_commit, on_prepare=on_prepare, fs=fs,
                       **log_options)
        try:
            state, replayed, rebuilt = recovery.open_state(path, os.path.join(path, LMDB_DIR), log, fs=fs,
                                                           options=options, progress=progress)
            try:
                snapshot.cleanup_incomplete(snapshots.snapshots_dir(path), fs=fs)
            except BaseException:
                state.close(sync=False)
                raise
        except BaseException:
            try:
                log.close()
            except WalkvError:
                pass
            raise
    except BaseException:
        lock.release()
        raise
    return WriterFiles(lock, log, state, replayed, rebuilt)


def close_writer(path: str, log: wal.Log, state: State, fs: FileSystem) -> None:
    """Close the log, then the state, and record a clean close unless the
    log failed (module docstring). The caller releases the lock after."""
    clean = log.failure is None
    try:
        log.close()
    except WalkvError:
        clean = False
        raise
    finally:
        state.close(sync=clean)
    if clean:
        try:
            recovery.write_session(os.path.join(path, LMDB_DIR), log.store_id, clean=True, fs=fs)
        except OSError as exc:
            raise WalkvError(
                f"closing {path}: could not record the clean close ({exc}); "
                f"nothing is lost, the next open replays the log") from exc
