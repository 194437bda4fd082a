"""The archive, wired into the store and the public API.

* :func:`start_archiver`/:func:`stop_archiver`: the
  :class:`~kvstore.archive.Archiver` a store runs for itself
  (``kvstore.open(path, archive=LOCATION)``): started once the store is open,
  stopped by :meth:`~kvstore.KVStore.close` after its log is closed, with one
  last round, so that after a clean close (with the archive reachable) every
  acknowledged write is in the archive. When that last round fails (the
  object store is down) the close still succeeds, with a warning naming the
  lag; the next open with the same ``archive=`` resumes from what the
  archive holds (the local log keeps everything it does not hold yet).
* :func:`retention_limit`: the LSN local log retention may trim up to (its
  segments whose last LSN is above it stay): the in-process archiver's
  archived LSN, and a sidecar's published one (``STORE/ARCHIVED``,
  :mod:`kvstore.archived`), whichever is lower.
* :func:`restore`: ``kvstore.restore`` for any source: a store or snapshot
  directory (:func:`kvstore.restore.restore`), or an archive
  (:func:`~kvstore.archive.restore_from_archive`): a URI, a ``(filesystem,
  path)`` pair, or a local directory holding an ``ARCHIVE`` identity object.
  ``to_time`` works for both, from the log's commit timestamps.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

from kvstore.archive import Archiver, restore_from_archive
from kvstore.archive.layout import ARCHIVE_NAME
from kvstore.archive.reader import time_to_us
from kvstore.archive.target import Location
from kvstore.archived import read_archived
from kvstore.layout import StoreLayout
from kvstore.restore import Progress, RestoreInfo
from kvstore.restore import restore as restore_store
from wal import list_segments, read_durable_lsn, read_log
from wal.errors import LogGapError, WalkvError
from wal.fs import OS_FS

log = logging.getLogger("walkv.archive")


def start_archiver(store_path: str, location: Location, *, interval: float, keep_snapshots: int | None,
                   keep_seconds: float | None) -> Archiver:
    """The archiver of the store at ``store_path``, shipping in its thread."""
    archiver = Archiver(store_path, location, interval=interval, keep_snapshots=keep_snapshots,
                        keep_seconds=keep_seconds)
    archiver.start()
    return archiver


def stop_archiver(archiver: Archiver, durable_lsn: int) -> None:
    """Stop the store's archiver after one last round (the log is closed:
    nothing more becomes durable); warn when the archive is left behind."""
    archiver.stop()
    if archiver.archived_lsn < durable_lsn:
        why = f": {archiver.last_error}" if archiver.last_error else ""
        log.warning("closed %s with the archive %s at LSN %d of %d durable%s; the next open with this "
                    "archive ships the rest", archiver.layout.root, archiver.uri, archiver.archived_lsn,
                    durable_lsn, why)


def retention_limit(store_path: str, archiver: Archiver | None) -> int | None:
    """The highest LSN local log retention may delete (None: no archive
    bounds it)."""
    limits = [archiver.archived_lsn] if archiver is not None else []
    published = read_archived(store_path)
    if published is not None:
        limits.append(published)
    return min(limits) if limits else None


def archive_stats(archiver: Archiver) -> dict[str, Any]:
    """``db.stats()["archive"]``: the archiver's stats (no credentials) and
    whether it stopped for good (``failed``: another archiver's lease, an
    archive of another store)."""
    out = archiver.stats()
    out["stopped"] = archiver.failed is not None
    return out


# -- restore ---------------------------------------------------------------------------


def is_archive(source: object) -> bool:
    """Whether ``source`` names an archive rather than a store: a ``(filesystem,
    path)`` pair, a URI, or a local directory holding an ``ARCHIVE`` object."""
    if isinstance(source, tuple):
        return True
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    return "://" in text or os.path.isfile(os.path.join(text, ARCHIVE_NAME))


def lsn_at_time(store_path: str, t: datetime.datetime | float | int) -> int:
    """The last durable LSN of the store's log committed at or before ``t``
    (a datetime, naive ones taken as UTC, or unix seconds)."""
    us = time_to_us(t)
    wal_dir = StoreLayout(OS_FS, os.path.abspath(store_path)).wal_dir
    segments = list_segments(wal_dir)
    if not segments:
        raise WalkvError(f"{store_path} has no log to find a time in (no segment in {wal_dir})")
    first = segments[0].first_lsn
    found = first - 1
    for e in read_log(wal_dir, first, read_durable_lsn(wal_dir)):
        if e.timestamp_us > us:
            break
        found = e.lsn
    if found == first - 1 and first > 1:
        raise LogGapError(f"the log of {store_path} holds no entry committed at or before that time: it starts "
                          f"at LSN {first} (restore from an archive or an older snapshot)",
                          first_missing=1, last_missing=first - 1, first_available=first)
    return found


def restore(source: Any, target: str | os.PathLike[str], to_lsn: int | None = None, *,
            to_time: datetime.datetime | float | None = None, progress: Progress | None = None) -> RestoreInfo:
    """Build a new store at ``target`` (missing or empty) equal to ``source``
    at ``to_lsn``, or at the last LSN committed at or before ``to_time`` (a
    datetime or unix seconds), or at its end. ``source``: a store (path or
    open :class:`~kvstore.KVStore`), a snapshot directory, or an archive (a
    URI such as ``s3://bucket/prefix?...`` or ``file:///...``, a
    ``(filesystem, path)`` pair, or a local archive directory). Durable on
    return."""
    if to_lsn is not None and to_time is not None:
        raise ValueError("give to_lsn or to_time, not both")
    if is_archive(source):
        return restore_from_archive(source, target, to_lsn=to_lsn, to_time=to_time, progress=progress)
    if to_time is not None:
        path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source.path
        to_lsn = lsn_at_time(path, to_time)
    return restore_store(source, target, to_lsn, progress=progress)


__all__ = ["archive_stats", "is_archive", "lsn_at_time", "restore", "retention_limit", "start_archiver",
           "stop_archiver"]
