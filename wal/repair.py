"""Checking a whole log (:func:`verify`) and cutting it at its first bad
record (:func:`repair`).

:func:`repair` keeps what it cuts: the cut-off bytes of the bad segment go to
``<segment>.broken``, and later segments are renamed ``<segment>.broken``, so
nothing is destroyed that a person might still want to look at.

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

from wal.errors import CorruptionError, Damage, RecordOverLimitError, WalkvError
from wal.fs import OS_FS, FileSystem
from wal.index import read_index
from wal.lock import DirectoryLock
from wal.record import DEFAULT_MAX_RECORD_BYTES, FIRST, FULL, LAST, MIDDLE
from wal.record_reader import RecordReader
from wal.segment import SegmentFile, SegmentScan, index_path, list_segments, read_header
from wal.segment_writer import write_new_segment
from wal.torn import is_torn
from wal.truncation import nonzero_end

log = logging.getLogger("walkv.wal")

Progress = Callable[[int, "int | None"], None]


@dataclass
class RepairReport:
    """What :func:`repair` found and did. ``cut`` is False when the log was whole."""

    cut: bool
    path: str | None = None
    offset: int | None = None
    reason: str | None = None
    last_good_lsn: int | None = None
    broken_files: list[str] = field(default_factory=list)
    dropped_bytes: int = 0
    kind: Damage | None = None  # what is wrong at the cut


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


def _whole_record_size(path: str, offset: int) -> int | None:
    """The payload size of the record at ``offset`` when every fragment of
    it is there with a good checksum (a FULL, or FIRST, MIDDLE..., LAST);
    ``None`` when it is damaged or cut short. Reads one block at a time,
    whatever the record's size."""
    size = 0
    with open(path, "rb") as fh:
        for i, frag in enumerate(RecordReader(fh, path=path, start_offset=offset, zeros_end=True).fragments()):
            if frag.problem is not None:
                return None
            if i == 0:
                if frag.offset != offset or frag.type not in (FULL, FIRST):
                    return None
                if frag.type == FULL:
                    return frag.length
            elif frag.type not in (MIDDLE, LAST):
                return None
            size += frag.length
            if frag.type == LAST:
                return size
    return None


def over_limit(path: str, offset: int, limit: int) -> RecordOverLimitError | None:
    """The error for a whole record over its segment's limit at ``offset``
    (``None``: the record is damaged, which is for repair to cut)."""
    size = _whole_record_size(path, offset)
    if size is None or size <= limit:
        return None
    return RecordOverLimitError(
        f"the record at offset {offset} of {path} is whole (its checksums are good) but {size} bytes, over the "
        f"limit this walkv reads from that segment ({limit} bytes, as its header states): it is not damage, "
        "so it is not cut. Read it with the walkv that wrote it",
        path=path, offset=offset, size=size, limit=limit)


def _cut_point(segments: list[SegmentFile], progress: Progress | None) -> CutPoint | None:
    """Scan every segment strictly; where the first bad record is, or
    ``None``. A torn tail of the newest segment is not damage (open cuts it)."""
    store_id: str | None = None
    expected: int | None = None
    last_good = 0
    for i, seg in enumerate(segments):
        newest = i == len(segments) - 1
        with open(seg.path, "rb") as fh:
            try:
                header, header_end = read_header(fh, seg.path)
            except CorruptionError as e:
                return CutPoint(i, 0, last_good, e.reason, e.kind, store_id)
            if store_id is None:
                store_id = header.store_id
            if header.store_id != store_id:
                return CutPoint(i, 0, last_good, "segment belongs to another store", Damage.HEADER, store_id)
            if expected is not None and header.first_lsn != expected:
                return CutPoint(i, 0, last_good, f"LSNs {expected}..{header.first_lsn - 1} are missing",
                                Damage.SEQUENCE, store_id)
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
                    return CutPoint(i, scan.data_end, last_good, e.reason, e.kind, store_id)
                f = OS_FS.open(seg.path, readonly=True)
                try:
                    torn, _ = is_torn(f, seg.path, e.offset, last_good + 1, header.max_record_bytes)
                finally:
                    f.close()
                if not torn:
                    return CutPoint(i, scan.data_end, last_good, e.reason, e.kind, store_id)
                # else: a crash's torn tail, which open cuts: not damage
            last_good = (scan.next_lsn or header.first_lsn) - 1
            torn_tail = scan.torn_tail()
            if torn_tail is not None and not newest:
                return CutPoint(i, scan.data_end, last_good, torn_tail.reason, torn_tail.kind, store_id)
            expected = last_good + 1
        if progress:
            progress(i + 1, len(segments))
    return None


def verify(directory: str, progress: Progress | None = None) -> list[str]:
    """Every CRC, header and LSN of every segment; returns the problems found
    (the first bad record and what lies after it, or a whole record over the
    limit this walkv reads), empty when all is well."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    segments = list_segments(directory)
    problems = []
    try:
        found = _cut_point(segments, progress)
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


def _limit_before(segments: list[SegmentFile], i: int) -> int:
    """The record limit for a segment replacing ``segments[i]``: the one the
    nearest readable segment before it states (the default when none)."""
    for seg in reversed(segments[:i]):
        try:
            with open(seg.path, "rb") as fh:
                return read_header(fh, seg.path)[0].max_record_bytes
        except (OSError, CorruptionError):
            continue
    return DEFAULT_MAX_RECORD_BYTES


def _broken_name(path: str) -> str:
    """``<path>.broken``, or ``.broken-2``, ``-3``...: never over the evidence
    an earlier repair kept."""
    name, n = path + ".broken", 1
    while os.path.exists(name):
        n += 1
        name = f"{path}.broken-{n}"
    return name


def repair(directory: str, *, fs: FileSystem = OS_FS, dry_run: bool = False, lock: bool = True) -> RepairReport:
    """Cut the log at its first bad record, keeping what was cut in ``.broken``
    files. Takes the log's lock (a writer holding it is :class:`LockedError`)
    unless the caller holds it (``lock=False``). Returns what it found (and,
    unless ``dry_run``, did). A whole record over the limit its segment
    states is never cut: :class:`RecordOverLimitError`, and nothing changes."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    if lock:
        with DirectoryLock(directory, f"the log at {directory}"):
            return repair(directory, fs=fs, dry_run=dry_run, lock=False)
    segments = list_segments(directory, fs)
    found = _cut_point(segments, None)
    if found is None:
        return RepairReport(cut=False)
    i, good_end, last_good, reason, kind, store_id = found
    bad = segments[i]
    report = RepairReport(True, bad.path, good_end, reason, last_good, kind=kind)
    later = segments[i + 1 :]
    report.dropped_bytes = sum(os.path.getsize(s.path) for s in later)
    if dry_run:
        f = fs.open(bad.path, readonly=True)
        try:
            report.dropped_bytes += nonzero_end(f, good_end, f.size()) - good_end
        finally:
            f.close()
        return report
    for seg in reversed(later):  # newest first: what remains is always a prefix
        kept = _broken_name(seg.path)
        fs.rename(seg.path, kept)
        report.broken_files.append(kept)
        if os.path.exists(index_path(seg.path)):
            fs.unlink(index_path(seg.path))
    f = fs.open(bad.path)
    try:
        end = nonzero_end(f, good_end, f.size())
        if good_end == 0:
            f.close()
            kept = _broken_name(bad.path)
            fs.rename(bad.path, kept)
            report.broken_files.append(kept)
            report.dropped_bytes += end
            first = last_good + 1 if i > 0 else bad.first_lsn
            write_new_segment(directory, store_id or uuid.uuid4().hex, first, 0, fs, _limit_before(segments, i))
        elif end > good_end:
            kept = _broken_name(bad.path)
            fs.write_file(kept, f.pread(end - good_end, good_end))
            report.broken_files.append(kept)
            report.dropped_bytes += end - good_end
            f.preallocate(good_end, end - good_end)
            f.sync()
    finally:
        f.close()
    if os.path.exists(index_path(bad.path)):
        fs.unlink(index_path(bad.path))
    fs.fsync_dir(directory)
    log.warning("repair: cut %s at offset %d (%s); last good LSN %d; kept the cut bytes in %s",
                bad.path, good_end, reason, last_good, ", ".join(report.broken_files))
    return report
