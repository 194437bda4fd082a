"""Archive retention: which snapshots and log objects an archive keeps.

A snapshot is kept when it is among the newest ``keep_snapshots`` or younger
than ``keep_seconds`` (either rule keeps it; the newest is always kept).
Everything older than the oldest kept snapshot goes, oldest first: each
snapshot's MANIFEST first (it stops being a snapshot at once), then its
chunks; then the log objects whose last LSN that snapshot covers, except the
last object of the chain (it records how far the archive reaches, so an
archiver resuming never ships the history again). What is left is the oldest
kept snapshot plus a contiguous log from it: every kept snapshot can be
restored and rolled forward to any later archived LSN.
"""

from __future__ import annotations

import logging
import time

import snapshot
from kvstore.archive.layout import SNAPSHOTS_DIR, WAL_DIR, log_object_name
from kvstore.archive.objects import chain, list_log_objects
from kvstore.archive.target import ArchiveTarget
from snapshot.layout import MANIFEST_NAME
from wal.errors import CorruptionError, SnapshotError

log = logging.getLogger("walkv.archive")


def archived_snapshot_lsns(target: ArchiveTarget, *, committed_only: bool = True) -> set[int]:
    """The LSNs of the archive's snapshot directories (with a MANIFEST, by default)."""
    out = set()
    for info in target.list(SNAPSHOTS_DIR):
        lsn = snapshot.parse_snapshot_dir_name(info.name)
        if lsn is None or not info.is_dir:
            continue
        if committed_only and not any(i.name == MANIFEST_NAME for i in target.list(SNAPSHOTS_DIR, info.name)):
            continue
        out.add(lsn)
    return out


def apply_retention(target: ArchiveTarget, keep_snapshots: int | None, keep_seconds: float | None) -> list[str]:
    """Delete what the rules above do not keep; return the deleted names."""
    snaps = []
    for lsn in sorted(archived_snapshot_lsns(target)):
        path = target.path(SNAPSHOTS_DIR, snapshot.snapshot_dir_name(lsn))
        try:
            snaps.append(snapshot.open(path, fs=target.fs))
        except (CorruptionError, SnapshotError) as e:
            log.warning("archive snapshot %s is unusable (%s)", target.display(path), target.scrub(str(e)))
    if not snaps:
        return []
    now_us = time.time() * 1e6
    kept = []
    for i, s in enumerate(snaps):
        newest_n = keep_snapshots is not None and i >= len(snaps) - keep_snapshots
        young = keep_seconds is not None and now_us - s.created_us <= keep_seconds * 1e6
        if newest_n or young or i == len(snaps) - 1:
            kept.append(s)
    oldest = kept[0].lsn
    deleted: list[str] = []
    for lsn in sorted(archived_snapshot_lsns(target, committed_only=False)):
        if lsn >= oldest:
            break
        name = snapshot.snapshot_dir_name(lsn)
        files = [i.name for i in target.list(SNAPSHOTS_DIR, name) if not i.is_dir]
        for f in sorted(files, key=lambda n: n != MANIFEST_NAME):  # MANIFEST first
            if snapshot.layout.check_chunk_name(f) is None or f == MANIFEST_NAME:
                target.delete(SNAPSHOTS_DIR, name, f)
        deleted.append(name)
        log.info("archive retention: deleted snapshot at LSN %d from %s", lsn, target.uri)
    objects = list_log_objects(target)
    last = chain(objects).objects[-1] if objects else None
    for o in objects:
        if o.last > oldest or o == last:
            continue
        target.delete(WAL_DIR, log_object_name(o.first, o.last))
        deleted.append(log_object_name(o.first, o.last))
    return deleted
