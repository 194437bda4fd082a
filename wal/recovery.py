"""Opening a log directory after a clean close or a crash.

What open checks, and why it stops there:

* Sealed segments were fsynced and never written again, so open reads only
  their headers (store id, first LSN) and their index sidecars (last LSN; a
  missing or bad index is rebuilt by a strict scan). LSNs must run on without a
  gap from one segment to the next: a gap is a missing segment.
* The active (newest) segment is scanned from its last indexed point (the
  sidecar written at clean close) or its start. An invalid record there that
  is a torn tail (:mod:`wal.torn`) is cut: the bytes from the last whole
  record on are zeroed, so no stale fragment is ever read as data, and the
  dropped byte count is logged.
* Anything else is corruption: open refuses with :class:`CorruptionError`
  naming the file, offset and :func:`wal.repair`. With ``recovery="prefix"``
  open repairs instead: it keeps the longest valid prefix and logs what it
  dropped.
* Every segment is read with the record limit its own header states, not
  the opener's ``max_record_bytes``. When the opener's limit is higher than
  the active segment's, that segment is sealed (or, empty, replaced) and a
  new one begun whose header states it, so no record is ever written past
  the limit of the segment holding it.
* The newest segment's header holds the log's timeline history
  (:mod:`wal.timeline`); every older segment must have begun on a line it
  continues (each timeline its own header names is in that history). A
  segment of another history (copied in from a twin promoted with nobody
  coordinating, or from another store's backup) is corruption of kind
  ``TIMELINE``. A ``truncate_after`` that a crash
  interrupted is finished, and the new timeline it began is begun.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass

from wal.errors import REPAIR_HINT, CorruptionError, Damage
from wal.fs import OS_FS, FileSystem
from wal.index import INDEX_INTERVAL, SparseIndex, read_index, scan_segment, write_index
from wal.repair import over_limit, repair
from wal.segment import (
    SegmentFile,
    SegmentHeader,
    SegmentScan,
    index_path,
    list_segments,
    read_header,
)
from wal.segment_writer import ActiveSegment
from wal.timeline import ROOT, History, history_until, timeline_at
from wal.torn import is_torn
from wal.truncation import clear_truncate, cut_tail, finish_truncate

log = logging.getLogger("walkv.wal")


@dataclass
class SealedSegment:
    file: SegmentFile
    index: SparseIndex


@dataclass
class Recovered:
    store_id: str
    sealed: list[SealedSegment]
    active: ActiveSegment
    dropped_bytes: int = 0


def _clean_temp_files(directory: str, fs: FileSystem) -> None:
    for name in fs.listdir(directory):
        if name.endswith(".tmp"):
            fs.unlink(os.path.join(directory, name))


def _scan_active(path: str, header: SegmentHeader, start: int, expected: int
                 ) -> tuple[ActiveSegment, CorruptionError | None]:
    """Scan the active segment from ``start`` (a record offset holding LSN
    ``expected``). Returns the segment's state up to its last valid entry and
    the first problem (a torn tail or damage), if any."""
    with open(path, "rb") as fh:
        scan = SegmentScan(fh, path, start, expected)
        points: list[tuple[int, int]] = []
        last_point = -INDEX_INTERVAL
        problem: CorruptionError | None = None
        try:
            for offset, entry in scan.entries():
                if offset - last_point >= INDEX_INTERVAL:
                    points.append((entry.lsn, offset))
                    last_point = offset
        except CorruptionError as e:
            problem = e
        else:
            problem = scan.torn_tail()
    last_lsn = expected - 1 if scan.next_lsn is None else scan.next_lsn - 1
    seg = ActiveSegment(SegmentFile(header.first_lsn, path), header, scan.data_end, last_lsn, points, last_point)
    return seg, problem


def recover(directory: str, *, fs: FileSystem = OS_FS, mode: str = "strict", prealloc: int,
            max_record_bytes: int, start_lsn: int = 1, zeroed: bool = False, history: History = ROOT,
            store_id: str | None = None) -> Recovered:
    """Open-time recovery of a log directory (creating it, with its first
    entry to get ``start_lsn``, on ``history``'s last timeline and with
    ``store_id`` (default: a new one), when it holds no segment; a segment it
    creates is preallocated as :func:`wal.segment_writer.reserve` says,
    ``zeroed`` or not)."""
    if mode not in ("strict", "prefix"):
        raise ValueError(f"recovery must be 'strict' or 'prefix', not {mode!r}")
    fs.makedirs(directory)
    _clean_temp_files(directory, fs)
    fork = finish_truncate(directory, fs)
    segments = list_segments(directory, fs)
    if not segments:
        store_id = store_id or uuid.uuid4().hex
        return Recovered(store_id, [], ActiveSegment.create(directory, store_id, start_lsn, prealloc, fs,
                                                            max_record_bytes, zeroed=zeroed, history=history))
    try:
        rec = _recover_segments(directory, segments, fs)
    except CorruptionError as e:
        if mode != "prefix":
            raise
        report = repair(directory, fs=fs, lock=False)
        log.warning("recovery='prefix': %s; dropped %d bytes after LSN %s (kept in %s)",
                    e, report.dropped_bytes, report.last_good_lsn, ", ".join(report.broken_files) or "-")
        fork = finish_truncate(directory, fs)  # the timeline the repair began, if it changed an LSN
        rec = _recover_segments(directory, list_segments(directory, fs), fs)
    header = rec.active.header
    history = header.history
    if fork is not None:  # the timeline history an interrupted truncate_after began
        nxt = rec.active.last_lsn + 1
        if fork[-1].first_lsn > nxt:  # the log lost entries before the cut (a power loss of a log that did not
            # sync them): the new timeline begins at the first LSN the log will write again
            fork = (*history_until(fork[:-1], nxt), fork[-1]._replace(first_lsn=nxt))
        if history != fork:
            rec = begin_segment(directory, rec, fs, prealloc, max(max_record_bytes, header.max_record_bytes), zeroed,
                                fork, f"the log goes on on {fork[-1]}")
        clear_truncate(directory, fs)
        return rec
    if header.max_record_bytes < max_record_bytes:
        return begin_segment(directory, rec, fs, prealloc, max_record_bytes, zeroed, history,
                             f"records of up to {max_record_bytes} bytes (the last one allowed "
                             f"{header.max_record_bytes})")
    return rec


def begin_segment(directory: str, rec: Recovered, fs: FileSystem, prealloc: int, max_record_bytes: int,
                  zeroed: bool, history: History, why: str) -> Recovered:
    """Begin a new active segment whose header states ``max_record_bytes`` and
    ``history``: an empty active segment is replaced (atomically, by rename),
    a non-empty one sealed and followed by a new one."""
    active = rec.active
    first = active.last_lsn + 1
    if active.last_lsn >= active.file.first_lsn:
        active.open(fs, prealloc)
        try:
            index = active.seal(fs, lambda full: active.sync_full())
        finally:
            active.close()
        rec.sealed.append(SealedSegment(SegmentFile(active.file.first_lsn, active.file.path, active.data_end), index))
    log.info("%s: new segment from LSN %d: %s", directory, first, why)
    rec.active = ActiveSegment.create(directory, rec.store_id, first, prealloc, fs, max_record_bytes, zeroed=zeroed,
                                      history=history)
    return rec


def _recover_segments(directory: str, segments: list[SegmentFile], fs: FileSystem) -> Recovered:
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
            _check_timeline(seg_header, header, seg.path)
            index = read_index(seg.path)
            if index is None or index.first_lsn != seg.first_lsn or index.data_end > os.fstat(fh.fileno()).st_size:
                log.info("%s: rebuilding its sparse index", seg.path)
                _, index = scan_segment(fh, seg.path)
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
        expected, start = stale.points[-1]
    active, problem = _scan_active(newest.path, header, start, expected)
    if stale is not None:
        active.points = [p for p in stale.points if p[1] < start] + active.points
    if start != header_end and (problem is not None or active.last_lsn < expected):
        # The indexed point did not hold what it promised: rescan from the start.
        active, problem = _scan_active(newest.path, header, header_end, header.first_lsn)
    dropped = 0
    if problem is not None:
        bad_offset = problem.offset if problem.offset is not None else active.data_end
        if problem.kind is Damage.TOO_LARGE:
            over = over_limit(newest.path, bad_offset, header.max_record_bytes)
            if over is not None:  # whole: not damage, and not to be cut
                raise over
            raise CorruptionError(
                f"{problem.reason}: an entry larger than its segment header allows "
                f"({header.max_record_bytes} bytes); it is not a crash's torn tail", kind=Damage.TOO_LARGE,
                path=newest.path, offset=bad_offset, lsn=active.last_lsn + 1, hint=REPAIR_HINT,
            )
        f = fs.open(newest.path, readonly=True)
        try:
            torn, nxt = is_torn(f, newest.path, bad_offset, active.last_lsn + 1, header.max_record_bytes)
        finally:
            f.close()
        if not torn:
            raise CorruptionError(
                f"corrupt record in the active segment ({problem.reason}), followed by valid data at offset {nxt}",
                kind=problem.kind, path=newest.path, offset=bad_offset, lsn=active.last_lsn + 1, hint=REPAIR_HINT,
            )
        dropped = cut_tail(fs, newest.path, active.data_end, problem.reason)
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
            kind=Damage.HEADER, path=path, offset=0, hint="move the stray segment out of the log directory",
        )


def _check_timeline(seg: SegmentHeader, newest: SegmentHeader, path: str) -> None:
    """A sealed segment must have begun on the line the log's history (the
    newest segment's header) continues: every timeline its header names is
    in that history, beginning where it does (module docstring). A repair
    that fills may have placed a later fork before the segment's first LSN
    (its header still names the line as it was when the segment began)."""
    for start in seg.history:
        if start not in newest.history:
            there = timeline_at(newest.history, start.first_lsn)
            raise CorruptionError(
                f"segment begun on {start} (from LSN {start.first_lsn}), which the log's history (its newest "
                f"segment's header) does not hold: it has {there} there; the segment belongs to another "
                f"history of this store", kind=Damage.TIMELINE, path=path, offset=0, lsn=start.first_lsn,
                hint="move the stray segment out of the log directory")


def _check_follows(prev_last: int | None, first_lsn: int, path: str) -> None:
    if prev_last is not None and first_lsn != prev_last + 1:
        missing = f"LSNs {prev_last + 1}..{first_lsn - 1} are missing" if first_lsn > prev_last + 1 else (
            f"it overlaps the previous segment, which ends at LSN {prev_last}")
        raise CorruptionError(
            f"segment does not follow its predecessor: {missing}", kind=Damage.SEQUENCE, path=path, offset=0,
            lsn=first_lsn, hint=REPAIR_HINT,
        )
