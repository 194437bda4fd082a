"""The snapshots of a parent directory: list, pick the newest, prune, clean up.

Only committed names (``snap-<20-digit LSN>``) are snapshots, and only those
whose manifest is valid (:func:`snapshot.open` succeeds) are listed. Deleting
is crash-safe (:mod:`snapshot.layout`): a snapshot is renamed away in one
step before its files are removed.

:func:`prune` and :func:`cleanup_incomplete` change the directory; call them
from the process that owns the store (the one holding its lock). A snapshot
being written is safe from both (its writer's flock protects it), but a
reader still iterating a pruned snapshot will fail.
"""

from __future__ import annotations

import logging
import os

from snapshot.layout import (
    dir_in_use,
    discard_dir,
    is_incomplete_name,
    is_tmp_name,
    parse_snapshot_dir_name,
    remove_tree,
)
from snapshot.manifest import SnapshotInfo
from snapshot.reader import Snapshot, open_snapshot
from wal.errors import CorruptionError, SnapshotError
from wal.fs import OS_FS, FileSystem
from wal.readfs import ReadFS

log = logging.getLogger("walkv.snapshot")


def _listdir(parent: str, fs: ReadFS) -> list[str]:
    """The names in ``parent`` (``[]`` when it does not exist)."""
    try:
        return [e.name for e in fs.list_dir(parent)]
    except OSError as e:
        raise SnapshotError(f"cannot list snapshots in {fs.display(parent)}: {e}") from e


def _committed(parent: str, fs: ReadFS) -> list[tuple[int, str]]:
    """``(lsn, directory name)`` of every committed name, oldest first."""
    found = []
    for name in _listdir(parent, fs):
        lsn = parse_snapshot_dir_name(name)
        if lsn is not None:
            found.append((lsn, name))
    found.sort()
    return found


def list_snapshots(parent: str | os.PathLike[str], *, fs: ReadFS = OS_FS) -> list[SnapshotInfo]:
    """The valid snapshots in ``parent``, oldest (lowest LSN) first, read
    through ``fs``.

    A snapshot whose manifest is missing or damaged, or whose chunk files are
    missing or the wrong size, is left out with a logged warning; chunk
    contents are not read (use :meth:`Snapshot.verify`). A missing ``parent``
    has no snapshots.
    """
    parent = os.fspath(parent)
    out = []
    for _, name in _committed(parent, fs):
        path = fs.join(parent, name)
        try:
            out.append(open_snapshot(path, fs=fs).info)
        except (CorruptionError, SnapshotError) as e:
            log.warning("ignoring unusable snapshot %s: %s", fs.display(path), e)
    return out


def newest(parent: str | os.PathLike[str], *, verify: bool = False, max_lsn: int | None = None,
           fs: ReadFS = OS_FS) -> Snapshot | None:
    """The newest usable snapshot in ``parent`` (at or before ``max_lsn`` when
    given), opened through ``fs``, or None if there is none.

    A newer snapshot that fails to open (or, with ``verify=True``, fails a
    full :meth:`Snapshot.verify`) is skipped with a logged warning, falling
    back to the next older one.
    """
    parent = os.fspath(parent)
    for lsn, name in reversed(_committed(parent, fs)):
        if max_lsn is not None and lsn > max_lsn:
            continue
        path = fs.join(parent, name)
        try:
            snap = open_snapshot(path, fs=fs)
            if verify:
                snap.verify()
            return snap
        except (CorruptionError, SnapshotError) as e:
            log.warning("snapshot %s is unusable (%s); falling back to an older snapshot", fs.display(path), e)
    return None


def cleanup_incomplete(parent: str | os.PathLike[str], *, fs: FileSystem | None = None) -> list[str]:
    """Remove what interrupted writes and deletes left in ``parent``
    (``.tmp-`` directories no live writer holds, and ``.del-`` directories).

    Committed snapshots, broken or not, are left alone (a damaged snapshot is
    evidence; :func:`prune` removes it once newer snapshots supersede it), and
    so is every name walkv does not use. Returns the removed paths.
    """
    parent = os.fspath(parent)
    fs = fs or OS_FS
    removed = []
    for name in sorted(_listdir(parent, fs)):
        if not is_incomplete_name(name):
            continue
        path = os.path.join(parent, name)
        if is_tmp_name(name) and dir_in_use(path):
            log.debug("leaving %s: a writer is filling it", path)
            continue
        try:
            remove_tree(fs, path)
        except OSError as e:
            raise SnapshotError(f"cannot remove the incomplete snapshot {path}: {e}") from e
        log.info("removed incomplete snapshot %s", path)
        removed.append(path)
    return removed


def prune(parent: str | os.PathLike[str], keep: int = 2, *, fs: FileSystem | None = None) -> list[str]:
    """Keep the newest ``keep`` valid snapshots in ``parent`` and delete every
    snapshot older than them (valid or broken), plus incomplete leftovers.

    Broken snapshots newer than the oldest kept one are left in place (they
    are skipped by :func:`newest` with a warning, and pruned once they fall
    behind). Each delete is crash-safe: one rename makes the snapshot stop
    existing before any file goes. Returns the removed paths.
    """
    if type(keep) is not int or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 (the store needs a snapshot), not {keep!r}")
    parent = os.fspath(parent)
    fs = fs or OS_FS
    valid = list_snapshots(parent, fs=fs)
    removed = cleanup_incomplete(parent, fs=fs)
    if not valid:
        return removed
    oldest_kept = valid[-keep:][0].lsn
    for lsn, name in _committed(parent, fs):
        if lsn >= oldest_kept:
            break
        path = os.path.join(parent, name)
        try:
            discard_dir(fs, parent, name, lsn)
        except OSError as e:
            raise SnapshotError(f"cannot delete snapshot {path}: {e}") from e
        log.info("pruned snapshot %s", path)
        removed.append(path)
    return removed
