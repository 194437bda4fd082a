"""Opening a log directory after a clean close or a crash, and repairing it.

What open checks, and why it stops there:

* Sealed segments were fsynced and never written again, so open reads only
  their headers (store id, first LSN) and their index sidecars (last LSN; a
  missing or bad index is rebuilt by a strict scan). LSNs must run on without a
  gap from one segment to the next: a gap is a missing segment.
* The active (newest) segment is scanned from its last indexed point (the
  sidecar written at clean close) or its start. An invalid record there is a
  *torn tail* (the normal result of a crash) when nothing valid follows it, or
  when its bytes include an all-zero 512-byte sector (a write that never
  reached the disk reads back as the preallocated zeros; etcd's rule). A torn
  tail is cut: the bytes from the last whole record on are zeroed, so no stale
  fragment is ever read as data, and the dropped byte count is logged.
* Anything else is corruption: open refuses with :class:`CorruptionError`
  naming the file, offset and :func:`repair`. With ``recovery="prefix"`` open
  repairs instead: it keeps the longest valid prefix and logs what it dropped.

:func:`repair` cuts the log at the first bad record. The cut-off bytes are kept
in ``<segment>.broken``; later segments are renamed ``<segment>.broken``.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Callable

from wal.errors import CorruptionError, WalkvError
from wal.fs import OS_FS, File, FileSystem
from wal.lock import DirectoryLock
from wal.truncation import cut_tail, finish_truncate, nonzero_end
from wal.record import _HEADER, BLOCK_SIZE, FIRST, FULL, HEADER_SIZE, RecordReader, fragment_crc
from wal.segment import (
    ENTRY_HEADER_SIZE,
    INDEX_INTERVAL,
    REPAIR_HINT,
    SegmentFile,
    SegmentHeader,
    SparseIndex,
    decode_entry,
    decode_header,
    index_path,
    list_segments,
    read_header,
    read_index,
    scan_segment,
    write_index,
    write_new_segment,
)

log = logging.getLogger("walkv.wal")

SECTOR = 512
_ZERO_SECTOR = bytes(SECTOR)


@dataclass
class SealedSegment:
    file: SegmentFile
    index: SparseIndex


@dataclass
class ActiveSegment:
    file: SegmentFile
    header: SegmentHeader
    data_end: int  # offset just after the last entry
    last_lsn: int  # first_lsn - 1 when empty
    points: list[tuple[int, int]] = field(default_factory=list)
    last_point: int = -INDEX_INTERVAL


@dataclass
class Recovered:
    store_id: str
    sealed: list[SealedSegment]
    active: ActiveSegment
    dropped_bytes: int = 0


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


def _clean_temp_files(directory: str, fs: FileSystem) -> None:
    for name in fs.listdir(directory):
        if name.endswith(".tmp"):
            fs.unlink(os.path.join(directory, name))


def _has_zero_sector(f: File, start: int, end: int) -> bool:
    first = (start + SECTOR - 1) // SECTOR * SECTOR
    data = f.pread(max(0, end - first), first)
    return any(data[i : i + SECTOR] == _ZERO_SECTOR for i in range(0, len(data) - SECTOR + 1, SECTOR))


_MAX_ENTRIES_PER_BLOCK = BLOCK_SIZE // (HEADER_SIZE + ENTRY_HEADER_SIZE) + 1


def _later_entry(payload: bytes, min_lsn: int) -> bool:
    """Does a (FULL or FIRST) fragment's payload start a log entry at or after
    ``min_lsn``? Bytes that merely look like a record (inside a value, say)
    do not carry the next LSNs."""
    if len(payload) < ENTRY_HEADER_SIZE:
        return False
    lsn = int.from_bytes(payload[:8], "little")
    return min_lsn <= lsn < min_lsn + _MAX_ENTRIES_PER_BLOCK


def _valid_record_after(path: str, start: int, min_lsn: int) -> int | None:
    """Offset of the first valid entry (a FULL or FIRST fragment holding an
    LSN from ``min_lsn`` on) after the bad record at ``start``, or ``None``.
    The bad header's length may be the damaged field, so every offset of the
    rest of its block is tried, then later blocks are read with
    resynchronisation (zeros read as padding)."""
    with open(path, "rb") as fh:
        block = start - start % BLOCK_SIZE
        fh.seek(block)
        buf = fh.read(BLOCK_SIZE)
        for j in range(start - block + 1, len(buf) - HEADER_SIZE + 1):
            crc, length, ftype = _HEADER.unpack_from(buf, j)
            if (ftype == FULL or ftype == FIRST) and j + HEADER_SIZE + length <= len(buf):
                payload = buf[j + HEADER_SIZE : j + HEADER_SIZE + length]
                if fragment_crc(ftype, payload) == crc and _later_entry(payload, min_lsn):
                    return block + j
        reader = RecordReader(fh, path=path, start_offset=block + BLOCK_SIZE, skip_corrupt=True)
        for offset, payload in reader.records():
            if _later_entry(payload, min_lsn):
                return offset
    return None


def _is_torn(f: File, path: str, bad_offset: int, min_lsn: int) -> tuple[bool, int | None]:
    """DESIGN section 4: an invalid record is a torn tail when no later entry
    follows it, or when its bytes include an all-zero 512-byte sector."""
    nxt = _valid_record_after(path, bad_offset, min_lsn)
    return nxt is None or _has_zero_sector(f, bad_offset, nxt), nxt


def _scan_active(path: str, header: SegmentHeader, start: int, expected: int,
                 max_record_bytes: int) -> tuple[ActiveSegment, tuple[int, str] | None]:
    """Scan the active segment from ``start`` (a record offset). Returns the
    segment's state and the first problem ``(offset, reason)``, if any."""
    seg = ActiveSegment(SegmentFile(header.first_lsn, path), header, start, expected - 1)
    with open(path, "rb") as fh:
        reader = RecordReader(fh, path=path, start_offset=start, zeros_end=True, max_record_bytes=max_record_bytes)
        try:
            for offset, payload in reader.records():
                if offset == 0:
                    continue
                entry = decode_entry(payload, path, offset)
                if entry.lsn != expected:
                    return seg, (offset, f"LSN {entry.lsn} does not follow LSN {expected - 1}")
                if offset - seg.last_point >= INDEX_INTERVAL:
                    seg.points.append((entry.lsn, offset))
                    seg.last_point = offset
                seg.data_end = reader.end_offset
                seg.last_lsn = expected
                expected += 1
        except CorruptionError as e:
            return seg, (e.offset if e.offset is not None else seg.data_end, e.reason)
        if reader.torn_tail is not None:
            return seg, reader.torn_tail
    return seg, None


def recover(directory: str, *, fs: FileSystem = OS_FS, mode: str = "strict", prealloc: int,
            max_record_bytes: int, start_lsn: int = 1) -> Recovered:
    """Open-time recovery of a log directory (creating it, with its first
    entry to get ``start_lsn``, when it holds no segment)."""
    if mode not in ("strict", "prefix"):
        raise ValueError(f"recovery must be 'strict' or 'prefix', not {mode!r}")
    fs.makedirs(directory)
    _clean_temp_files(directory, fs)
    finish_truncate(directory, fs)
    segments = list_segments(directory, fs)
    if not segments:
        store_id = uuid.uuid4().hex
        path, end = write_new_segment(directory, store_id, start_lsn, prealloc, fs)
        with open(path, "rb") as fh:
            header, _ = read_header(fh, path)
        return Recovered(store_id, [], ActiveSegment(SegmentFile(start_lsn, path), header, end, start_lsn - 1))
    try:
        return _recover_segments(directory, segments, fs, max_record_bytes)
    except CorruptionError as e:
        if mode != "prefix":
            raise
        report = repair(directory, fs=fs, lock=False)
        log.warning("recovery='prefix': %s; dropped %d bytes after LSN %s (kept in %s)",
                    e, report.dropped_bytes, report.last_good_lsn, ", ".join(report.broken_files) or "-")
        return _recover_segments(directory, list_segments(directory, fs), fs, max_record_bytes)


def _recover_segments(directory: str, segments: list[SegmentFile], fs: FileSystem,
                      max_record_bytes: int) -> Recovered:
    newest = segments[-1]
    with open(newest.path, "rb") as fh:
        header, header_end = read_header(fh, newest.path)
    store_id = _store_id(segments)
    _check_store(header, store_id, newest.path)
    sealed: list[SealedSegment] = []
    prev_last: int | None = None
    rebuilt = False
    for seg in segments[:-1]:
        with open(seg.path, "rb") as fh:
            seg_header, _ = read_header(fh, seg.path)
            _check_store(seg_header, store_id, seg.path)
            index = read_index(seg.path)
            if index is None or index.first_lsn != seg.first_lsn or index.data_end > os.fstat(fh.fileno()).st_size:
                log.info("%s: rebuilding its sparse index", seg.path)
                _, index = scan_segment(fh, seg.path, max_record_bytes=max_record_bytes)
                write_index(seg.path, index, fs)
                rebuilt = True
        _check_follows(prev_last, seg.first_lsn, seg.path)
        prev_last = index.last_lsn
        sealed.append(SealedSegment(seg, index))
    if rebuilt:
        fs.fsync_dir(directory)
    _check_follows(prev_last, header.first_lsn, newest.path)

    # The active segment: from its last indexed point when a clean close left one.
    start, expected = header_end, header.first_lsn
    stale = read_index(newest.path)
    if stale is not None and stale.first_lsn == header.first_lsn and stale.points:
        start_lsn, start = stale.points[-1]
        expected = start_lsn
    active, problem = _scan_active(newest.path, header, start, expected, max_record_bytes)
    if stale is not None:
        active.points = [p for p in stale.points if p[1] < start] + active.points
    if start != header_end and (problem is not None or active.last_lsn < expected):
        # The indexed point did not hold what it promised: rescan from the start.
        active, problem = _scan_active(newest.path, header, header_end, header.first_lsn, max_record_bytes)
    dropped = 0
    if problem is not None:
        bad_offset, reason = problem
        if reason.startswith("record over the limit"):
            raise CorruptionError(
                f"{reason}: an entry larger than this open's max_record_bytes", path=newest.path,
                offset=bad_offset, lsn=active.last_lsn + 1, hint="reopen with a larger max_record_bytes",
            )
        f = fs.open(newest.path, readonly=True)
        try:
            torn, nxt = _is_torn(f, newest.path, bad_offset, active.last_lsn + 1)
        finally:
            f.close()
        if not torn:
            raise CorruptionError(
                f"corrupt record in the active segment ({reason}), followed by valid data at offset {nxt}",
                path=newest.path, offset=bad_offset, lsn=active.last_lsn + 1, hint=REPAIR_HINT,
            )
        dropped = cut_tail(fs, newest.path, active.data_end, reason)
    else:
        # Bytes after the first zero header belong to a write that never fully
        # reached the disk (a hole in it reads as zeros): a torn tail too.
        dropped = cut_tail(fs, newest.path, active.data_end, "data after a zero-filled hole")
    if os.path.exists(index_path(newest.path)):
        fs.unlink(index_path(newest.path))  # the active segment's index lives in memory
    # Names a crashed writer created or renamed may not be durable yet
    # (a failed directory fsync, say): make them so before anything is
    # acknowledged on top of them.
    fs.fsync_dir(directory)
    return Recovered(store_id, sealed, active, dropped)


def _store_id(segments: list[SegmentFile]) -> str:
    """The store id most segments carry (a tie goes to the oldest segment),
    so that a stray segment is the one named, whichever its place."""
    ids = []
    for seg in segments:
        with open(seg.path, "rb") as fh:
            ids.append(read_header(fh, seg.path)[0].store_id)
    return max(dict.fromkeys(ids), key=ids.count)


def _check_store(header: SegmentHeader, store_id: str, path: str) -> None:
    if header.store_id != store_id:
        raise CorruptionError(
            f"segment belongs to another store ({header.store_id}, this log is {store_id})",
            path=path, offset=0, hint="move the stray segment out of the log directory",
        )


def _check_follows(prev_last: int | None, first_lsn: int, path: str) -> None:
    if prev_last is not None and first_lsn != prev_last + 1:
        missing = f"LSNs {prev_last + 1}..{first_lsn - 1} are missing" if first_lsn > prev_last + 1 else (
            f"it overlaps the previous segment, which ends at LSN {prev_last}")
        raise CorruptionError(
            f"segment does not follow its predecessor: {missing}", path=path, offset=0, lsn=first_lsn,
            hint=REPAIR_HINT,
        )


def _first_problem(segments: list[SegmentFile], progress: Callable[[int, int | None], None] | None
                   ) -> tuple[int, int, int, str, str | None] | None:
    """Scan every segment strictly. Returns ``(segment index, good_end,
    last_good_lsn, reason, store_id)`` of the first bad record, or ``None``."""
    store_id: str | None = None
    expected: int | None = None
    last_good = 0
    for i, seg in enumerate(segments):
        good_end = 0
        with open(seg.path, "rb") as fh:
            reader = RecordReader(fh, path=seg.path, start_offset=0, zeros_end=True)
            try:
                for offset, payload in reader.records():
                    if offset == 0:
                        header = decode_header(payload, seg.path)
                        if store_id is None:
                            store_id = header.store_id
                        if header.store_id != store_id:
                            return i, 0, last_good, "segment belongs to another store", store_id
                        if header.first_lsn != seg.first_lsn:
                            return i, 0, last_good, "header and file name disagree on the first LSN", store_id
                        if expected is not None and header.first_lsn != expected:
                            return i, 0, last_good, f"LSNs {expected}..{header.first_lsn - 1} are missing", store_id
                        expected = header.first_lsn
                        good_end = reader.end_offset
                        continue
                    entry = decode_entry(payload, seg.path, offset)
                    if entry.lsn != expected:
                        return i, good_end, last_good, f"LSN {entry.lsn} does not follow {last_good}", store_id
                    expected = entry.lsn + 1
                    last_good = entry.lsn
                    good_end = reader.end_offset
            except CorruptionError as e:
                if i == len(segments) - 1 and e.offset is not None and good_end > 0:
                    f = OS_FS.open(seg.path, readonly=True)
                    try:
                        torn, _ = _is_torn(f, seg.path, e.offset, last_good + 1)
                    finally:
                        f.close()
                    if not torn:
                        return i, good_end, last_good, e.reason, store_id
                    # else: a crash's torn tail, which open cuts: not damage
                else:
                    return i, good_end, last_good, e.reason, store_id
            if good_end == 0:
                return i, 0, last_good, "segment has no header record", store_id
            if reader.torn_tail is not None and i < len(segments) - 1:
                return i, good_end, last_good, reader.torn_tail[1], store_id
        if progress:
            progress(i + 1, len(segments))
    return None


def verify(directory: str, progress: Callable[[int, int | None], None] | None = None) -> list[str]:
    """Every CRC, header and LSN of every segment; returns the problems found
    (the first bad record and what lies after it), empty when all is well."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    segments = list_segments(directory)
    problems = []
    found = _first_problem(segments, progress)
    if found is not None:
        i, good_end, last_good, reason, _ = found
        problems.append(f"{segments[i].path}: offset {good_end}: {reason} (last good LSN {last_good})")
    for seg in segments:
        index = read_index(seg.path)
        if os.path.exists(index_path(seg.path)) and index is None:
            problems.append(f"{index_path(seg.path)}: damaged sparse index (rebuilt at next open)")
    return problems


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
    unless ``dry_run``, did)."""
    if not os.path.isdir(directory):
        raise WalkvError(f"{directory} is not a walkv log directory (it does not exist)")
    if lock:
        with DirectoryLock(directory, f"the log at {directory}"):
            return repair(directory, fs=fs, dry_run=dry_run, lock=False)
    segments = list_segments(directory, fs)
    found = _first_problem(segments, None)
    if found is None:
        return RepairReport(cut=False)
    i, good_end, last_good, reason, store_id = found
    bad = segments[i]
    report = RepairReport(True, bad.path, good_end, reason, last_good)
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
            write_new_segment(directory, store_id or uuid.uuid4().hex, first, 0, fs)
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
