"""Checking a whole log (:func:`verify`) and repairing a damaged one
(:func:`repair`).

:func:`repair` finds the first bad record (the strict check open and verify
make), then reads the whole log past damage (:mod:`wal.salvage`), decides
which LSNs the repaired log holds (:mod:`wal.repair_plan`) and makes it so
(:mod:`wal.repair_apply`). It keeps what it takes out: cut-off bytes and
whole segments go to ``.broken`` files next to the segments, so nothing is
destroyed that a person might still want to look at.

* Without a base (no snapshot), it cuts the log at its first bad record:
  the entries before it stay, everything after goes.
* ``base_lsn``, the LSN of the newest good snapshot, says that the writes
  up to it are held elsewhere: damage at or below it only drops the log
  before it (the log then starts after the damage, at ``base_lsn + 1`` at
  the latest, so that it continues the snapshot); damage after it is cut
  as above. Nothing a snapshot holds is lost.
* ``filler`` (salvage) keeps every intact entry after the damage too, and
  writes an entry with that payload for each lost LSN after the base, so
  that the log stays gap-free without renumbering anything.

Both read each segment with the record limit its header states. A record
over that limit whose fragments all have good checksums is not damage: it
was written whole, by something that allowed a larger record. :func:`repair`
refuses to cut it (:class:`~wal.errors.RecordOverLimitError`, "over the
limit this walkv reads") and :func:`verify` reports it without proposing a
cut: cutting would drop an acknowledged write.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from wal.durable import read_durable_lsn
from wal.errors import CorruptionError, Damage, RecordOverLimitError, WalkvError
from wal.fs import OS_FS, FileSystem
from wal.index import read_index
from wal.lock import DirectoryLock
from wal.progress import Progress
from wal.repair_apply import apply, dropped_bytes
from wal.repair_plan import plan
from wal.salvage import over_limit, scan_log
from wal.segment import SegmentFile, SegmentScan, index_path, list_segments, read_header, segment_name
from wal.timeline import ROOT, TimelineStart, fork_history, history_until, new_timeline
from wal.torn import is_torn
from wal.truncation import mark_truncate

__all__ = ["CutPoint", "RepairReport", "over_limit", "repair", "verify"]

log = logging.getLogger("walkv.wal")


LSNRange = tuple[int, int]


@dataclass
class RepairReport:
    """What :func:`repair` found and did. ``cut`` is False when the log was
    whole (nothing changed). ``path``, ``offset``, ``reason`` and ``kind``
    name the first bad record (``path`` is ``None`` when the log was whole
    but ended before the base). The repaired log holds
    ``first_lsn..last_good_lsn``; ``dropped`` is the LSNs taken out before
    it, whose writes the base (a snapshot at ``base_lsn``) holds; ``lost``
    the LSNs after the base whose writes are gone, ``filled`` those of them
    a filler entry now stands for (salvage)."""

    cut: bool
    path: str | None = None
    offset: int | None = None
    reason: str | None = None
    last_good_lsn: int | None = None
    broken_files: list[str] = field(default_factory=list)
    dropped_bytes: int = 0
    kind: Damage | None = None  # what is wrong at the cut
    first_lsn: int | None = None
    base_lsn: int = 0
    dropped: LSNRange | None = None
    lost: list[LSNRange] = field(default_factory=list)
    filled: list[LSNRange] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    timeline: TimelineStart | None = None
    """The timeline the repaired log goes on on, from the first LSN it lost
    or filled (:mod:`wal.timeline`; the next open of the log begins its
    segment), or None when no LSN a reader may have had changed."""


class CutPoint(NamedTuple):
    """Where :func:`repair` cuts a log: at its first bad record, in
    ``segments[segment]``, whose valid data ends at ``good_end`` (0: the
    whole file is bad). ``reason`` and ``kind`` say what is wrong there;
    ``store_id`` is the log's (for a segment that replaces a bad one)."""

    segment: int
    good_end: int
    last_good_lsn: int
    reason: str
    kind: Damage
    store_id: str | None


def _cut_point(segments: list[SegmentFile], progress: Progress | None) -> tuple[CutPoint | None, int]:
    """Scan every segment strictly; where the first bad record is (``None``:
    nowhere) and the last LSN read. A torn tail of the newest segment is not
    damage (open cuts it)."""
    store_id: str | None = None
    expected: int | None = None
    last_good = 0
    for i, seg in enumerate(segments):
        newest = i == len(segments) - 1
        with open(seg.path, "rb") as fh:
            try:
                header, header_end = read_header(fh, seg.path)
            except CorruptionError as e:
                return CutPoint(i, 0, last_good, e.reason, e.kind, store_id), last_good
            if store_id is None:
                store_id = header.store_id
            if header.store_id != store_id:
                return CutPoint(i, 0, last_good, "segment belongs to another store", Damage.HEADER, store_id), last_good
            if expected is not None and header.first_lsn != expected:
                return CutPoint(i, 0, last_good, f"LSNs {expected}..{header.first_lsn - 1} are missing",
                                Damage.SEQUENCE, store_id), last_good
            scan = SegmentScan(fh, seg.path, header_end, header.first_lsn)
            try:
                for _ in scan.entries():
                    pass
            except CorruptionError as e:
                last_good = (scan.next_lsn or header.first_lsn) - 1
                if e.kind is Damage.TOO_LARGE and e.offset is not None:
                    over = over_limit(seg.path, e.offset, header.max_record_bytes)
                    if over is not None:
                        raise over from None
                if not newest or e.kind is Damage.SEQUENCE or e.offset is None:
                    return CutPoint(i, scan.data_end, last_good, e.reason, e.kind, store_id), last_good
                f = OS_FS.open(seg.path, readonly=True)
                try:
                    torn, _ = is_torn(f, seg.path, e.offset, last_good + 1, header.max_record_bytes)
                finally:
                    f.close()
                if not torn:
                    return CutPoint(i, scan.data_end, last_good, e.reason, e.kind, store_id), last_good
                # else: a crash's torn tail, which open cuts: not damage
            last_good = (scan.next_lsn or header.first_lsn) - 1
            torn_tail = scan.torn_tail()
            if torn_tail is not None and not newest:
                return CutPoint(i, scan.data_end, last_good, torn_tail.reason, torn_tail.kind, store_id), last_good
            expected = last_good + 1
        if progress:
            progress(i + 1, len(segments))
    return None, last_good


def verify(directory: str, progress: Progress | None = None) -> list[str]:
    """Every CRC, header and LSN of every segment; returns the problems found
    (the first bad record and what lies after it, or a whole record over the
    limit this walkv reads), empty when all is well."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    segments = list_segments(directory)
    problems = []
    try:
        found, _ = _cut_point(segments, progress)
    except RecordOverLimitError as e:
        problems.append(str(e))
        found = None
    if found is not None:
        problems.append(f"{segments[found.segment].path}: offset {found.good_end}: {found.reason} "
                        f"(last good LSN {found.last_good_lsn})")
    for seg in segments:
        index = read_index(seg.path)
        if os.path.exists(index_path(seg.path)) and index is None:
            problems.append(f"{index_path(seg.path)}: damaged sparse index (rebuilt at next open)")
    return problems


def repair(directory: str, *, fs: FileSystem = OS_FS, dry_run: bool = False, lock: bool = True,
           base_lsn: int = 0, filler: bytes | None = None, store_id: str | None = None,
           before_change: Callable[[RepairReport], None] | None = None) -> RepairReport:
    """Repair the log in ``directory`` (module docstring): ``base_lsn`` is the
    LSN of the newest good snapshot (0: none), ``filler`` the payload of the
    entry that stands for each lost LSN after it (``None``: cut at the first
    bad record instead), ``store_id`` the store id for segments it writes
    when no segment header is readable; ``before_change(report)`` runs once
    the repair is decided and before any file changes (what depends on the
    log, made ready for it). Keeps what it takes out of the log
    in ``.broken`` files. Takes the log's lock (a writer holding it is
    :class:`LockedError`) unless the caller holds it (``lock=False``).
    Returns what it found (and, unless ``dry_run``, did). A whole record
    over the limit its segment states is never cut:
    :class:`RecordOverLimitError`, and nothing changes."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    if lock:
        with DirectoryLock(directory, f"the log at {directory}"):
            return repair(directory, fs=fs, dry_run=dry_run, lock=False, base_lsn=base_lsn, filler=filler,
                          store_id=store_id, before_change=before_change)
    segments = list_segments(directory, fs)
    found, last = _cut_point(segments, None)
    if not segments or (found is None and last >= base_lsn):
        return RepairReport(cut=False)
    scan = scan_log(segments)
    decided = plan(scan, base_lsn, filler is not None, read_durable_lsn(directory, fs))
    report = RepairReport(True, None, None, f"the log ends at LSN {last}, before the snapshot at LSN {base_lsn}",
                          decided.last, kind=Damage.SEQUENCE, first_lsn=decided.first, base_lsn=base_lsn,
                          dropped=decided.dropped, lost=decided.lost, filled=decided.filled)
    if found is not None:
        report.path, report.offset = segments[found.segment].path, found.good_end
        report.reason, report.kind = found.reason, found.kind
    if not decided.changes:
        raise CorruptionError(f"repair found damage but no way to remove it: {report.reason}", kind=report.kind
                              or Damage.CONTENT, path=report.path, offset=report.offset, lsn=decided.last + 1,
                              hint="nothing was changed; keep a copy of the log's files and report this")
    report.dropped_bytes = dropped_bytes(scan, decided)
    report.rewritten = [os.path.join(directory, segment_name(new.first)) for new in decided.new]
    if dry_run:
        return report
    if before_change is not None:
        before_change(report)
    sid = scan.store_id or store_id or uuid.uuid4().hex
    history = max((h.history for h in scan.headers if h is not None), key=len, default=ROOT)
    report.broken_files = apply(directory, scan, decided, fs, sid, filler or b"", history)
    changed = [r[0] for r in decided.lost + decided.filled]
    if changed:  # those LSNs will hold other entries than some reader may have had: a new timeline
        top = max(s.timeline for h in scan.headers if h is not None for s in h.history)
        report.timeline = new_timeline(history, min(changed), number=top + 1)
        mark_truncate(directory, decided.last, fs, fork_history(history_until(history, decided.last + 1),
                                                                report.timeline))
    log.warning("repair of %s: %s at %s offset %s; the log now holds LSNs %d..%d%s; kept what was taken out in %s",
                directory, report.reason, report.path, report.offset, decided.first, decided.last,
                f" (the snapshot at LSN {base_lsn} holds LSNs {decided.dropped[0]}..{decided.dropped[1]})"
                if decided.dropped else "", ", ".join(report.broken_files) or "-")
    return report
