"""The archive, wired into the store: the archiver a store runs for itself.

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
  :mod:`kvstore.archive.marker`), whichever is lower.

Restoring from an archive is :mod:`kvstore.replica.point_in_time`'s.
"""

from __future__ import annotations

import logging
from typing import Any

from kvstore.archive import Archiver
from kvstore.archive.marker import read_archived
from kvstore.archive.target import Location

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


__all__ = ["archive_stats", "retention_limit", "start_archiver", "stop_archiver"]
