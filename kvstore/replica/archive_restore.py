"""Restore from an archive: a new store equal to the archived one at an LSN
or a time, along one lineage of its timelines (``timeline``: the latest by
default, as PostgreSQL's ``recovery_target_timeline``;
:mod:`kvstore.archive.timelines`).

The target LSN (or time) is one of that lineage: LSNs the lineage puts on an
older timeline are read from that timeline's objects, the rest from the
chosen one's, and only snapshots on the lineage are used. The restored
store's log goes on on a new timeline forked from the lineage after the
target (:func:`kvstore.replica.restore.build`). The newest archived snapshot at or before the target LSN that verifies and
from which the archive's log reaches the target (falling back to older ones;
none: the whole log, when it starts at LSN 1), plus the log objects up to the
target, built into a new store exactly as :func:`kvstore.restore` builds one
(:func:`kvstore.replica.restore.build`). Damage in an object the restore needs is
:class:`~wal.errors.CorruptionError` naming the object and offset; a target
before the damage restores.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Iterator

import snapshot
from kvstore.archive.layout import TimelineId
from kvstore.archive.reader import ARCHIVE_HINT, ArchiveReader
from kvstore.archive.target import ArchiveTarget, Location
from kvstore.archive.timelines import TimelineChoice
from kvstore.replica.restore import Progress, RestoreInfo, before_first_entry, build, check_target
from wal.errors import CorruptionError, SnapshotError
from wal.segment import Entry

log = logging.getLogger("walkv.archive")


class ArchiveLog:
    """An archive's log as :func:`kvstore.store.recovery.replay` reads it
    (:class:`kvstore.store.recovery.LogSource`), bounded at ``last_lsn``."""

    def __init__(self, reader: ArchiveReader, first_lsn: int, last_lsn: int) -> None:
        self.reader = reader
        self.directory = reader.uri
        self.first_lsn = first_lsn
        self.last_lsn = last_lsn

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *,
                     durable_only: bool = True) -> Iterator[Entry]:
        last = self.last_lsn if to_lsn is None else min(to_lsn, self.last_lsn)
        if from_lsn > last:
            return iter(())
        return self.reader.read_entries(from_lsn, last)


def choose_snapshot(reader: ArchiveReader, target_lsn: int, log_first: int) -> snapshot.Snapshot | None:
    """The newest archived snapshot to start a restore to ``target_lsn`` from
    (see the module docstring); None: replay the whole log."""
    problems = []
    for snap in reversed(reader.snapshots()):
        shown = reader.target.display(snap.path)
        if snap.lsn > target_lsn:
            continue
        if snap.store_id not in (None, reader.store_id):
            problems.append(f"{shown}: belongs to another store ({snap.store_id})")
            continue
        if snap.lsn != target_lsn and (log_first == 0 or snap.lsn + 1 < log_first):
            problems.append(f"{shown}: the archive's log starts at LSN {log_first}, after LSN {snap.lsn + 1}")
            continue
        try:
            snap.verify()
        except (CorruptionError, SnapshotError) as e:
            log.warning("archive snapshot %s is unusable (%s); falling back to an older one", shown,
                        reader.target.scrub(str(e)))
            problems.append(f"{shown}: {reader.target.scrub(str(e))}")
            continue
        return snap
    if log_first == 1 or target_lsn == 0:
        return None
    raise SnapshotError(f"cannot restore {reader.uri} to LSN {target_lsn}: no snapshot can be used"
                        + (": " + "; ".join(problems) if problems else
                           f": there is none, and the archive's log starts at LSN {log_first}"))


def restore_from_archive(location: Location | ArchiveTarget, target: str | os.PathLike[str], *,
                         to_lsn: int | None = None, to_time: datetime.datetime | float | None = None,
                         allow_empty: bool = False, progress: Progress | None = None,
                         timeline: TimelineChoice = None) -> RestoreInfo:
    """Build a new store at ``target`` (missing or empty, else
    :class:`~wal.errors.WalkvError`) equal to the archived store at
    ``to_lsn``, or at the last LSN committed at or before ``to_time`` (a
    datetime or unix seconds), or at the archive's last LSN, along the
    lineage of ``timeline`` (None or "latest": the highest; a number; "N:UID";
    module docstring). A ``to_time`` before the archive's first entry is
    :class:`~wal.errors.RestoreTimeError` unless ``allow_empty``. Durable on
    return."""
    t0 = time.monotonic()
    if to_lsn is not None and to_time is not None:
        raise ValueError("give to_lsn or to_time, not both")
    if to_lsn is not None and (isinstance(to_lsn, bool) or not isinstance(to_lsn, int) or to_lsn < 0):
        raise ValueError(f"to_lsn must be a non-negative int, not {to_lsn!r}")
    target = os.path.abspath(os.fspath(target))
    check_target(target)
    reader = ArchiveReader(location, timeline=timeline)
    lineage = reader.history  # chosen once: the objects read below are this lineage's
    reader.choice = TimelineId.of(lineage[-1])
    c = reader.chain()
    snaps_newest = max((s.lsn for s in reader.snapshots()), default=0)
    end = c.last if c.objects else snaps_newest
    if to_time is not None:
        target_lsn = reader.lsn_at_time(to_time)
        if target_lsn == 0 and not allow_empty:
            raise before_first_entry(reader.uri, to_time, reader.first_entry())
    else:
        target_lsn = end if to_lsn is None else to_lsn
    reader.checked_chain(None if to_lsn is None and to_time is None else target_lsn)
    if target_lsn > end:
        raise ValueError(f"cannot restore to LSN {target_lsn}: the archive {reader.uri} holds LSNs up to {end}")
    base = choose_snapshot(reader, target_lsn, c.first)
    try:
        return build(target, ArchiveLog(reader, c.first, target_lsn), base, target_lsn, source=reader.uri,
                     progress=progress, t0=t0, history=lineage)
    except CorruptionError as e:
        raise e.with_hint(ARCHIVE_HINT) from None
