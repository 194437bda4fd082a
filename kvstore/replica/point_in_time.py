"""``kvstore.restore``: a new store from any source, at an LSN or a time.

The source is a store or snapshot directory (:func:`kvstore.replica.restore.restore_store`)
or an archive (:func:`kvstore.replica.archive_restore.restore_from_archive`): a
URI, a ``(filesystem, path)`` pair, or a local directory holding an ``ARCHIVE``
identity object. ``to_time`` works for both, from the log's commit timestamps.

A ``to_time`` before the source's first entry is
:class:`~wal.errors.RestoreTimeError` naming that entry's commit time (an
empty store is built only with ``allow_empty=True``), as Litestream refuses
a timestamp before its first backup.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from kvstore.archive.layout import ARCHIVE_NAME
from kvstore.archive.reader import time_to_us
from kvstore.archive.timelines import TimelineChoice
from kvstore.replica.archive_restore import restore_from_archive
from kvstore.replica.restore import Progress, RestoreInfo, before_first_entry, check_target, locate, restore_store
from wal import Entry, list_segments, read_durable_lsn, read_log
from wal.errors import LogGapError, WalkvError


def is_archive(source: object) -> bool:
    """Whether ``source`` names an archive rather than a store: a ``(filesystem,
    path)`` pair, a URI, or a local directory holding an ``ARCHIVE`` object."""
    if isinstance(source, tuple):
        return True
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    return "://" in text or os.path.isfile(os.path.join(text, ARCHIVE_NAME))


def _log_of(source_path: str) -> str:
    """The log directory of a store, or of the store a snapshot directory is in."""
    wal_dir = locate(os.path.abspath(source_path))[0]
    if wal_dir is None or not list_segments(wal_dir):
        raise WalkvError(f"{source_path} has no log to find a time in (no segment in "
                         f"{wal_dir or os.path.join(source_path, 'wal')})")
    return wal_dir


def lsn_at_time(store_path: str, t: datetime.datetime | float | int) -> int:
    """The last durable LSN of the store's log (a snapshot directory: its
    store's) committed at or before ``t`` (a datetime, naive ones taken as
    UTC, or unix seconds); 0 when the log starts at LSN 1 after ``t``."""
    us = time_to_us(t)
    wal_dir = _log_of(store_path)
    first = list_segments(wal_dir)[0].first_lsn
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


def first_entry(store_path: str) -> Entry | None:
    """The first durable entry of the store's log (None: it holds none)."""
    wal_dir = _log_of(store_path)
    for e in read_log(wal_dir, list_segments(wal_dir)[0].first_lsn, read_durable_lsn(wal_dir)):
        return e
    return None


def restore(source: Any, target: str | os.PathLike[str], to_lsn: int | None = None, *,
            to_time: datetime.datetime | float | None = None, allow_empty: bool = False,
            progress: Progress | None = None, timeline: TimelineChoice = None) -> RestoreInfo:
    """Build a new store at ``target`` (missing or empty) equal to ``source``
    at ``to_lsn``, or at the last LSN committed at or before ``to_time`` (a
    datetime or unix seconds), or at its end (a snapshot directory: at its
    LSN). ``source``: a store (path or open :class:`~kvstore.KVStore`), a
    snapshot directory, or an archive (a URI such as
    ``s3://bucket/prefix?...`` or ``file:///...``, a ``(filesystem, path)``
    pair, or a local archive directory). A ``to_time`` before the source's
    first entry is :class:`~wal.errors.RestoreTimeError` unless
    ``allow_empty`` (then the store is empty). ``timeline`` chooses which of
    an archive's timelines' lineage to follow (default: the latest;
    :mod:`kvstore.archive.timelines`); a store's log holds one lineage, its
    own, so it is for archives only. Durable on return."""
    if to_lsn is not None and to_time is not None:
        raise ValueError("give to_lsn or to_time, not both")
    check_target(os.fspath(target))
    if is_archive(source):
        return restore_from_archive(source, target, to_lsn=to_lsn, to_time=to_time, allow_empty=allow_empty,
                                    progress=progress, timeline=timeline)
    if timeline is not None:
        raise ValueError("timeline= chooses among an archive's timelines; a store's log holds only its own "
                         "history (restore from its archive to follow another timeline)")
    if to_time is not None:
        path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source.path
        to_lsn = lsn_at_time(path, to_time)
        if to_lsn == 0 and not allow_empty:
            raise before_first_entry(path, to_time, first_entry(path))
    return restore_store(source, target, to_lsn, progress=progress)


__all__ = ["first_entry", "is_archive", "lsn_at_time", "restore"]
