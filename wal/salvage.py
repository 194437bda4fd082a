"""What a damaged log still holds: every entry whose record is whole with
good checksums, found by a scan that goes on past damage (:func:`scan_log`),
for :func:`wal.repair` to plan from (:mod:`wal.repair_plan`).

The strict readers (:class:`wal.segment.SegmentScan`) stop at the first bad
record. This scan notes it as a :class:`Flaw`, finds the next good record
and goes on, so a repair knows exactly which LSNs are intact and which are
gone. The kept entries are :class:`Run` s: consecutive LSNs of one segment,
contiguous in its file.

Rules, and why:

* An entry counts only when its record is whole (every fragment's CRC-32C
  is good) and its LSN, which is in the entry header under that checksum,
  comes after the last one kept and before the first LSN of the next segment
  (by name). Nothing is renumbered: an entry's LSN is part of its
  checksummed bytes and of what watchers, replicas and the archive saw.
* Where two segments overlap, the later one (by name) wins: a repair that
  was interrupted leaves the segment it wrote beside the one it replaces,
  and a second repair must take the new one. The earlier one's entries
  from there on are ``superseded``, not damage.
* A segment of another store (its header's store id is not the one most
  segments carry) holds nothing of this log. A segment whose header is
  damaged is read with the record limit of the nearest readable segment
  before it, its LSNs bounded by its name.
* After damage the scan resynchronises: every later offset of the damaged
  block is tried as a record start (LevelDB's reader skips the rest of the
  block, and the records in it), then the following blocks. A candidate
  counts only when its checksum is good and its LSN fits: after the last
  kept, before the next segment, and no further than the bytes left could
  hold, so bytes inside a value that merely look like a record do not.
* In the newest segment a torn tail (:mod:`wal.torn`) or data after
  zero-filled space ends the scan, as open cuts them: they belong to a write
  that never completed. In a sealed segment (fsynced whole, cut to its data
  end) both are damage, and the scan goes on past them.
* A whole record over the limit its segment states is not damage: when it
  is the first problem, :class:`~wal.errors.RecordOverLimitError`, as
  repair never cuts it; after damage it is not read (the limit bounds
  every read), so it counts as lost.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

import wal.record as record
from wal.errors import CorruptionError, Damage, RecordOverLimitError
from wal.fs import OS_FS
from wal.progress import Progress
from wal.record import FIRST, FULL, HEADER_SIZE, LAST, MIDDLE
from wal.record_reader import RecordReader
from wal.segment import ENTRY_HEADER_SIZE, SegmentFile, SegmentHeader, list_segments, read_header
from wal.torn import is_torn
from wal.truncation import nonzero_end

_SMALLEST = HEADER_SIZE + ENTRY_HEADER_SIZE  # the fewest bytes an entry's record takes


class Run(NamedTuple):
    """Intact entries ``first..last`` of ``segments[segment]``, one after the
    other from record offset ``offset`` to ``end``, committed at
    ``first_us``..``last_us`` (unix microseconds)."""

    segment: int
    offset: int
    end: int
    first: int
    last: int
    first_us: int
    last_us: int


class Flaw(NamedTuple):
    """Damage in ``segments[segment]``: its bytes from ``offset`` (just after
    the last good record before it; 0: the segment's header) are not what
    walkv wrote. ``after`` is the last LSN kept before it, ``next_run`` the
    index of the first :class:`Run` after it."""

    segment: int
    offset: int
    after: int
    next_run: int
    reason: str
    kind: Damage


@dataclass
class LogScan:
    """What :func:`scan_log` found: the segments (oldest first), the header
    of each (``None``: damaged) and the offset after it, the record limit
    each is read with, the log's store id (``None``: no header is readable),
    the intact runs and the flaws, both in log order. ``superseded`` maps a
    segment to the offset from which its entries are the next segment's
    LSNs (an overlap, which the later segment wins: not damage, but not
    this segment's to keep)."""

    segments: list[SegmentFile]
    headers: list[SegmentHeader | None]
    header_ends: list[int]
    limits: list[int]
    store_id: str | None
    runs: list[Run] = field(default_factory=list)
    flaws: list[Flaw] = field(default_factory=list)
    superseded: dict[int, int] = field(default_factory=dict)

    @property
    def first_lsn(self) -> int:
        """The first LSN the log holds, by its first segment's name."""
        return self.segments[0].first_lsn if self.segments else 1

    @property
    def last_lsn(self) -> int:
        """The last intact LSN (``first_lsn - 1`` when none is)."""
        return self.runs[-1].last if self.runs else self.first_lsn - 1


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


def _headers(segments: list[SegmentFile]
             ) -> tuple[list[SegmentHeader | None], list[int], list[CorruptionError | None]]:
    headers: list[SegmentHeader | None] = []
    ends: list[int] = []
    errors: list[CorruptionError | None] = []
    for seg in segments:
        try:
            with open(seg.path, "rb") as fh:
                header, end = read_header(fh, seg.path)
        except CorruptionError as e:
            headers.append(None)
            ends.append(0)
            errors.append(e)
        else:
            headers.append(header)
            ends.append(end)
            errors.append(None)
    return headers, ends, errors


def _majority(headers: list[SegmentHeader | None]) -> str | None:
    """The store id most readable headers carry (a tie goes to the oldest)."""
    ids = [h.store_id for h in headers if h is not None]
    if not ids:
        return None
    counts = Counter(ids)
    return max(dict.fromkeys(ids), key=counts.__getitem__)


def log_store_id(directory: str) -> str | None:
    """The store id of a log whose headers may be damaged: the one most
    readable segment headers carry (``None`` when none is readable)."""
    return _majority(_headers(list_segments(directory))[0])


def _candidate(buf: bytes, j: int, lo: int, hi: int) -> bool:
    """Does a whole FULL or FIRST fragment at ``buf[j:]`` start an entry
    with an LSN in ``lo..hi-1``, its checksum good?"""
    crc, length, ftype = record.FRAGMENT_HEADER.unpack_from(buf, j)
    start = j + HEADER_SIZE
    if (ftype != FULL and ftype != FIRST) or length < ENTRY_HEADER_SIZE or start + length > len(buf):
        return False
    if not lo <= int.from_bytes(buf[start : start + 8], "little") < hi:
        return False
    return record.fragment_crc(ftype, buf[start : start + length]) == crc


def _resync(fh: BinaryIO, start: int, size: int, lo: int, hi: int | None, origin: int) -> int | None:
    """The offset after ``start`` of the first good record holding an entry
    with an LSN from ``lo`` on, below ``hi``, and no further past ``lo``
    than the entries the bytes from ``origin`` (where the lost ones begin)
    up to it could have held; ``None`` when there is none. Every offset is
    tried, a block at a time; only those whose type byte says FULL or FIRST
    are looked at."""
    pos = start + 1
    while pos <= size - _SMALLEST:
        block = pos - pos % record.BLOCK_SIZE
        fh.seek(block)
        buf = fh.read(record.BLOCK_SIZE)
        top = lo + (block + len(buf) - origin) // _SMALLEST + 1
        limit = top if hi is None else min(hi, top)
        last = len(buf) - _SMALLEST
        type_at = pos - block + 6  # a fragment's type is its 7th byte
        full, first = buf.find(b"\x01", type_at), buf.find(b"\x02", type_at)
        while full >= 0 or first >= 0:
            p = full if first < 0 or 0 <= full < first else first
            if p - 6 > last:
                break
            if _candidate(buf, p - 6, lo, limit):
                return block + p - 6
            if p == full:
                full = buf.find(b"\x01", p + 1)
            else:
                first = buf.find(b"\x02", p + 1)
        pos = block + record.BLOCK_SIZE
    return None


class _Scanner:
    """One pass over the segments, filling a :class:`LogScan`."""

    def __init__(self, scan: LogScan) -> None:
        self.scan = scan
        self.last = scan.first_lsn - 1  # the last LSN kept
        self.run: list[int] | None = None  # the run being extended, as Run's fields
        self.good_end = 0  # in the current segment: just after the last good record

    def close_run(self) -> None:
        if self.run is not None:
            self.scan.runs.append(Run(*self.run))
            self.run = None

    def flaw(self, i: int, offset: int, reason: str, kind: Damage) -> None:
        self.close_run()
        flaws = self.scan.flaws
        if flaws and flaws[-1][:4] == (i, offset, self.last, len(self.scan.runs)):
            return  # the same place: the first reason stands
        flaws.append(Flaw(i, offset, self.last, len(self.scan.runs), reason, kind))

    def keep(self, i: int, offset: int, end: int, lsn: int, ts: int) -> None:
        r = self.run
        if r is not None and lsn == r[4] + 1:
            r[2], r[4], r[6] = end, lsn, ts
        else:
            self.close_run()
            self.run = [i, offset, end, lsn, lsn, ts, ts]
        self.last = lsn
        self.good_end = end

    def segment(self, i: int, error: CorruptionError | None) -> None:
        scan = self.scan
        seg = scan.segments[i]
        header = scan.headers[i]
        self.close_run()
        if error is not None:
            self.flaw(i, 0, error.reason, error.kind)
        elif header is not None and header.store_id != scan.store_id:
            self.flaw(i, 0, f"segment belongs to another store ({header.store_id}, this log is {scan.store_id})",
                      Damage.HEADER)
            return
        newest = i == len(scan.segments) - 1
        hi = None if newest else scan.segments[i + 1].first_lsn
        size = os.path.getsize(seg.path)
        self.good_end = scan.header_ends[i]
        with open(seg.path, "rb") as fh:
            pos: int | None = self.good_end
            if header is None:
                pos = _resync(fh, 0, size, max(self.last + 1, seg.first_lsn), hi, 0)
            while pos is not None:
                pos = self._read(fh, i, pos, size, newest, hi)

    def _read(self, fh: BinaryIO, i: int, pos: int, size: int, newest: bool, hi: int | None) -> int | None:
        """Keep the good entries from record offset ``pos`` on, up to the end
        of the data or the next damage; return where to go on (``None``: the
        segment is done)."""
        path = self.scan.segments[i].path
        lowest = self.scan.segments[i].first_lsn
        limit = self.scan.limits[i]
        reader = RecordReader(fh, path=path, start_offset=pos, zeros_end=True, max_record_bytes=limit)
        try:
            for offset, payload in reader.records():
                if len(payload) < ENTRY_HEADER_SIZE:
                    raise CorruptionError("log entry shorter than its header", path=path, offset=offset)
                lsn = int.from_bytes(payload[:8], "little")
                if hi is not None and lsn >= hi:  # the next segment's LSNs: it wins the overlap
                    self.scan.superseded[i] = self.good_end
                    return None
                expected = max(self.last + 1, lowest)
                if lsn != expected:
                    if lsn < expected or lsn - expected > (offset - self.good_end) // _SMALLEST:
                        raise CorruptionError(f"LSN {lsn} does not follow LSN {expected - 1}",
                                              kind=Damage.SEQUENCE, path=path, offset=offset, lsn=lsn)
                    self.flaw(i, self.good_end, f"LSNs {expected}..{lsn - 1} are missing", Damage.SEQUENCE)
                self.keep(i, offset, reader.end_offset, lsn, int.from_bytes(payload[8:16], "little"))
        except CorruptionError as e:
            bad = e.offset if e.offset is not None else self.good_end
            if e.kind is Damage.TOO_LARGE and not self.scan.flaws:  # as the strict check: refused, never cut
                over = over_limit(path, bad, limit)
                if over is not None:
                    raise over from None
            if newest and e.kind is not Damage.SEQUENCE and e.offset is not None and self._torn(path, bad, limit):
                return None  # a crash's torn tail: open cuts it, it is not damage
            self.flaw(i, self.good_end, e.reason, e.kind)
            return _resync(fh, bad, size, max(self.last + 1, lowest), hi, self.good_end)
        if newest:
            return None  # the end of the data; a torn record or zeros and what follows are cut at open
        torn = reader.torn_tail
        end = torn[0] if torn is not None else max(reader.end_offset, self.good_end)
        if torn is None:
            f = OS_FS.open(path, readonly=True)
            try:
                if nonzero_end(f, end, size) == end:
                    return None  # the whole segment was read
            finally:
                f.close()
        self.flaw(i, self.good_end, torn[1] if torn else "data after zero-filled space in a sealed segment",
                  Damage.FRAMING)
        return _resync(fh, end, size, max(self.last + 1, lowest), hi, self.good_end)

    def _torn(self, path: str, bad: int, limit: int) -> bool:
        f = OS_FS.open(path, readonly=True)
        try:
            return is_torn(f, path, bad, self.last + 1, limit)[0]
        finally:
            f.close()


def scan_log(segments: list[SegmentFile], progress: Progress | None = None) -> LogScan:
    """Read every segment, going on past damage (module docstring)."""
    headers, ends, errors = _headers(segments)
    limits = []
    limit = record.DEFAULT_MAX_RECORD_BYTES
    for header in headers:
        if header is not None:
            limit = header.max_record_bytes
        limits.append(limit)
    scan = LogScan(segments, headers, ends, limits, _majority(headers))
    scanner = _Scanner(scan)
    for i in range(len(segments)):
        scanner.segment(i, errors[i])
        if progress:
            progress(i + 1, len(segments))
    scanner.close_run()
    return scan
