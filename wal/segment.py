"""Segment files and their sparse indexes: the log's on-disk layout.

Directory (one log)::

    00000000000000000001.wal   segment holding LSNs 1.. (name: first LSN, 20 digits)
    00000000000000004097.wal   the next segment; only the newest is ever written
    00000000000000000001.idx   sparse index of a sealed segment (a sidecar)
    LOCK                       fcntl lock of the one writer (holds its pid)
    DURABLE                    the durable LSN, for readers in other processes

Segment (a file of :mod:`wal.record` records)::

    record 0   header: "<8sHH16sQQ" magic b"WALKVLOG", format version,
               flags (0), store id (16 bytes, a UUID), first LSN, creation
               time (unix microseconds)
    record n   entry:  "<QQ" LSN, commit timestamp (unix microseconds),
               then the entry's payload (opaque to the log)
    then       zeros up to the preallocated size (read as the end of data)

Rules, and why:

* The name and the header both carry the first LSN, and every entry carries its
  own LSN, so a renamed, missing or stale segment, or a segment from another
  store (store id), is detected rather than read as if it belonged.
* Segments are named, sorted and bisected by first LSN; LSNs are consecutive
  across segments, so segment ``i+1`` starts at the last LSN of ``i`` plus one.
* A sealed segment is never written again; it is cut to its data end when
  sealed. The active (newest) segment is preallocated with zeros ahead of the
  tail, so that an ``fdatasync`` after an append journals no size change.
* A new segment is written under a ``.tmp`` name and renamed, so a ``.wal``
  file always has a valid header.

Sparse index (``.idx``): one :mod:`wal.record` record (so it is CRC-protected)::

    "<8sHHQQQI" magic b"WALKVIDX", version, flags, first LSN, last LSN,
    data end offset, point count; then count x "<QQ" (LSN, record offset)

A point is written about every :data:`INDEX_INTERVAL` bytes of log, so reading
from any LSN is a bisect over segments, a bisect over points and a scan of at
most a few KiB. An index is only a cache: a missing or bad one is rebuilt by
scanning its segment.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import re
import struct
import sys
import time
import uuid
from array import array
from operator import lt
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple, Sequence

from wal.errors import CorruptionError, Damage, LogGapError
from wal.fs import OS_FS, FileSystem
from wal.readfs import ReadFS
from wal.record import BLOCK_SIZE, HEADER_SIZE, RecordReader, RecordWriter

SEGMENT_MAGIC = b"WALKVLOG"
INDEX_MAGIC = b"WALKVIDX"
FORMAT_VERSION = 1
INDEX_INTERVAL = 4096

_SEGMENT_HEADER = struct.Struct("<8sHH16sQQ")
_ENTRY_HEADER = struct.Struct("<QQ")
_INDEX_HEADER = struct.Struct("<8sHHQQQI")
_INDEX_POINT = struct.Struct("<QQ")
ENTRY_HEADER_SIZE = _ENTRY_HEADER.size
pack_entry_header = _ENTRY_HEADER.pack
_unpack_entry_header = _ENTRY_HEADER.unpack_from

_NAME = re.compile(r"^(\d{20})\.wal$")
REPAIR_HINT = "run `walkv repair STORE` (or wal.repair(DIR)) to cut the log at the first bad record"


class Entry(NamedTuple):
    lsn: int
    timestamp_us: int
    payload: bytes


class SegmentFile(NamedTuple):
    first_lsn: int
    path: str
    size: int = 0


class SegmentHeader(NamedTuple):
    version: int
    store_id: str
    first_lsn: int
    created_us: int


class IndexPoints(Sequence[tuple[int, int]]):
    """Sorted ``(lsn, record offset)`` pairs, kept in two ``array('Q')``: 16
    bytes a point rather than a tuple's ~120, since a log holds every sealed
    segment's index in memory (about 30 MB per GB of log as tuples)."""

    __slots__ = ("lsns", "offsets")

    def __init__(self, points: Iterable[tuple[int, int]] = ()) -> None:
        self.lsns = array("Q")
        self.offsets = array("Q")
        for lsn, off in points:
            self.lsns.append(lsn)
            self.offsets.append(off)

    def __len__(self) -> int:
        return len(self.lsns)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(zip(self.lsns[i], self.offsets[i]))
        return self.lsns[i], self.offsets[i]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.lsns, self.offsets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"IndexPoints({list(self)!r})"

    def offset_for(self, lsn: int) -> int | None:
        """The offset of the last point at or before ``lsn`` (None: none)."""
        i = bisect.bisect_right(self.lsns, lsn) - 1
        return self.offsets[i] if i >= 0 else None


class SparseIndex(NamedTuple):
    first_lsn: int
    last_lsn: int
    data_end: int
    points: IndexPoints  # (lsn, offset of that entry's record), sorted

    def offset_for(self, lsn: int) -> int:
        """The offset of the last indexed record at or before ``lsn`` (0: the
        segment's start)."""
        off = self.points.offset_for(lsn)
        return 0 if off is None else off


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}.wal"


def index_path(segment_path: str) -> str:
    return segment_path[: -len(".wal")] + ".idx"


def list_segments(directory: str, fs: ReadFS = OS_FS) -> list[SegmentFile]:
    """The segment files of a log directory, oldest first (``[]`` when the
    directory does not exist)."""
    found = []
    for info in fs.list_dir(directory):
        first = segment_first_lsn(info.name)
        if first is not None and not info.is_dir:
            found.append(SegmentFile(first, info.path, info.size))
    found.sort()
    return found


def find_segment(segments: list[SegmentFile], lsn: int) -> int:
    """Index of the segment that holds ``lsn`` (the last one starting at or
    before it), or -1 when ``lsn`` is before the first segment."""
    return bisect.bisect_right([s.first_lsn for s in segments], lsn) - 1


# -- header -----------------------------------------------------------------


def encode_header(store_id: str, first_lsn: int) -> bytes:
    return _SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, FORMAT_VERSION, 0, uuid.UUID(hex=store_id).bytes, first_lsn, time.time_ns() // 1000
    )


def decode_header(payload: bytes, path: str) -> SegmentHeader:
    if len(payload) != _SEGMENT_HEADER.size:
        raise CorruptionError("segment header has the wrong size", path=path, offset=0, hint=REPAIR_HINT)
    magic, version, _flags, sid, first_lsn, created = _SEGMENT_HEADER.unpack(payload)
    if magic != SEGMENT_MAGIC:
        raise CorruptionError("not a walkv log segment (bad magic)", path=path, offset=0, hint=REPAIR_HINT)
    if version != FORMAT_VERSION:
        raise CorruptionError(
            f"segment format version {version} is not supported (this walkv reads {FORMAT_VERSION})",
            path=path, offset=0, hint="upgrade walkv",
        )
    return SegmentHeader(version, uuid.UUID(bytes=sid).hex, first_lsn, created)


def read_header(f: BinaryIO, path: str) -> tuple[SegmentHeader, int]:
    """Read a segment's header record; return it and the offset after it."""
    reader = RecordReader(f, path=path, start_offset=0, zeros_end=True)
    for _, payload in reader.records():
        header = decode_header(payload, path)
        expected = _NAME.match(os.path.basename(path))
        if expected and int(expected.group(1)) != header.first_lsn:
            raise CorruptionError(
                f"segment header says first LSN {header.first_lsn} but the file name says {int(expected.group(1))}",
                path=path, offset=0, hint=REPAIR_HINT,
            )
        return header, reader.end_offset
    raise CorruptionError("segment has no header record", path=path, offset=0, hint=REPAIR_HINT)


def write_new_segment(
    directory: str, store_id: str, first_lsn: int, prealloc: int, fs: FileSystem = OS_FS
) -> tuple[str, int]:
    """Create a segment durably (temp name, header, zeros, fsync, rename, fsync
    directory). Returns its path and the offset after the header."""
    path = os.path.join(directory, segment_name(first_lsn))
    tmp = path + ".tmp"
    buf = io.BytesIO()
    RecordWriter(buf, 0).add_record(encode_header(store_id, first_lsn))
    data = buf.getvalue()
    end = len(data)
    f = fs.open(tmp, create=True)
    try:
        f.truncate(0)
        f.pwrite(data, 0)
        if prealloc > end:
            f.preallocate(end, prealloc - end)
        f.sync(full=True)
    finally:
        f.close()
    fs.rename(tmp, path)
    fs.fsync_dir(directory)
    return path, end


# -- entries ------------------------------------------------------------------


def decode_entry(payload: bytes, path: str | None, offset: int) -> Entry:
    if len(payload) < ENTRY_HEADER_SIZE:
        raise CorruptionError("log entry shorter than its header", path=path, offset=offset, hint=REPAIR_HINT)
    lsn, ts = _unpack_entry_header(payload)
    return Entry(lsn, ts, payload[ENTRY_HEADER_SIZE:])


def iter_entries(
    f: BinaryIO,
    path: str,
    start_offset: int = 0,
    from_lsn: int = 1,
    to_lsn: int | None = None,
    *,
    end_offset: int | None = None,
    max_record_bytes: int | None = None,
) -> Iterator[Entry]:
    """Entries of one segment file, strictly checked, from ``start_offset`` (0,
    or an offset from the sparse index). LSNs must be consecutive: a gap is
    corruption. Pure file reading: no lock, safe on any process or executor."""
    kwargs = {} if max_record_bytes is None else {"max_record_bytes": max_record_bytes}
    reader = RecordReader(f, path=path, start_offset=start_offset, end_offset=end_offset, zeros_end=True, **kwargs)
    expected = None
    for offset, payload in reader.records():
        if offset == 0:
            header = decode_header(payload, path)
            expected = header.first_lsn
            continue
        lsn, ts = _unpack_entry_header(payload) if len(payload) >= ENTRY_HEADER_SIZE else (None, 0)
        if lsn is None:
            raise CorruptionError("log entry shorter than its header", path=path, offset=offset, hint=REPAIR_HINT)
        if expected is not None and lsn != expected:
            raise CorruptionError(
                f"LSN {lsn} does not follow LSN {expected - 1}", path=path, offset=offset, lsn=lsn, hint=REPAIR_HINT
            )
        expected = lsn + 1
        if lsn < from_lsn:
            continue
        if to_lsn is not None and lsn > to_lsn:
            return
        yield Entry(lsn, ts, payload[ENTRY_HEADER_SIZE:])
        if lsn == to_lsn:
            return  # never parse past the last wanted entry: it may be mid-write


def read_segments(
    segments: list[SegmentFile],
    from_lsn: int,
    last: int | None,
    start_offset: Callable[[int, SegmentFile, int], int],
    *,
    active_end: int | None = None,
    max_record_bytes: int | None = None,
    fs: ReadFS = OS_FS,
) -> Iterator[Entry]:
    """Entries ``from_lsn..last`` (None: to the end) of consecutive segments,
    strictly checked, with no LSN missing. ``start_offset(i, segment, lsn)``
    gives the record offset to start reading segment ``i`` at (from a sparse
    index); ``active_end`` bounds the bytes read of the last segment (the
    durable part of a segment still being written)."""
    expected = from_lsn
    for i in range(max(0, find_segment(segments, from_lsn)), len(segments)):
        seg = segments[i]
        if last is not None and seg.first_lsn > last:
            return
        is_last = i == len(segments) - 1
        start = start_offset(i, seg, expected)
        try:
            fh = fs.open_input(seg.path)
        except FileNotFoundError:
            raise LogGapError(
                f"segment {fs.display(seg.path)} (LSNs from {seg.first_lsn}) was deleted while being read: a "
                "snapshot covered it and retention (truncate_before) removed it; read again from a snapshot",
                first_missing=expected, last_missing=(segments[i + 1].first_lsn - 1) if not is_last else expected,
            ) from None
        with fh:
            for entry in iter_entries(fh, fs.display(seg.path), start, expected, last, end_offset=active_end if is_last else None,
                                      max_record_bytes=max_record_bytes):
                if entry.lsn != expected:
                    raise CorruptionError(f"LSNs {expected}..{entry.lsn - 1} are missing from the log",
                                          path=seg.path, lsn=expected, hint=REPAIR_HINT)
                yield entry
                expected += 1
        if last is not None and expected > last:
            return
        nxt = segments[i + 1].first_lsn if not is_last else None
        if nxt is not None and expected < nxt:
            raise CorruptionError(
                f"LSNs {expected}..{nxt - 1} are missing from the log", path=seg.path, lsn=expected, hint=REPAIR_HINT
            )


def read_log(directory: str, from_lsn: int = 1, to_lsn: int | None = None, *,
             durable_only: bool = True, fs: ReadFS = OS_FS) -> Iterator[Entry]:
    """Entries of a log directory, read straight from its files: no lock, so
    safe beside a live writer (another process) and after it is gone. Reads up
    to the published durable LSN (``durable_only``; every valid entry when no
    ``DURABLE`` file exists). Raises :class:`LogGapError` when ``from_lsn`` is
    before the first segment (retention deleted it) and :class:`CorruptionError`
    when entries are missing in the middle. ``fs`` is the read-only file seam
    (:mod:`wal.readfs`) the files are read through."""
    segments = list_segments(directory, fs)
    if not segments:
        return
    if from_lsn < segments[0].first_lsn:
        first = segments[0].first_lsn
        raise LogGapError(
            f"LSN {from_lsn} is no longer in the log at {fs.display(directory)}: it starts at LSN "
            f"{first} (older segments were deleted after a snapshot covered them); read from a snapshot",
            first_missing=from_lsn, last_missing=first - 1, first_available=first,
        )
    limit = read_durable_lsn(directory, fs) if durable_only else None
    last = to_lsn if limit is None else (limit if to_lsn is None else min(to_lsn, limit))

    def start_offset(_i: int, seg: SegmentFile, lsn: int) -> int:
        index = read_index(seg.path, fs)
        return index.offset_for(lsn) if index is not None and index.first_lsn == seg.first_lsn else 0

    yield from read_segments(segments, from_lsn, last, start_offset, fs=fs)


def record_start(offset: int) -> int:
    """Where a record written at ``offset`` really starts (past a trailer)."""
    left = BLOCK_SIZE - offset % BLOCK_SIZE
    return offset + left if left < HEADER_SIZE else offset


# -- sparse index ---------------------------------------------------------------


def encode_index(index: SparseIndex) -> bytes:
    head = _INDEX_HEADER.pack(
        INDEX_MAGIC, FORMAT_VERSION, 0, index.first_lsn, index.last_lsn, index.data_end, len(index.points)
    )
    return head + b"".join(_INDEX_POINT.pack(lsn, off) for lsn, off in index.points)


def decode_index(payload: bytes, path: str) -> SparseIndex:
    if len(payload) < _INDEX_HEADER.size:
        raise CorruptionError("index too short", path=path, offset=0)
    magic, version, _flags, first, last, data_end, count = _INDEX_HEADER.unpack_from(payload)
    if magic != INDEX_MAGIC or version != FORMAT_VERSION:
        raise CorruptionError("not a walkv segment index", path=path, offset=0)
    if len(payload) != _INDEX_HEADER.size + count * _INDEX_POINT.size:
        raise CorruptionError("index point count does not match its size", path=path, offset=0)
    flat = array("Q", payload[_INDEX_HEADER.size :])
    if sys.byteorder != "little":
        flat.byteswap()
    points = IndexPoints()
    points.lsns, points.offsets = flat[0::2], flat[1::2]
    lsns, offsets = points.lsns, points.offsets
    if not (all(map(lt, lsns, lsns[1:])) and all(map(lt, offsets, offsets[1:]))) or (
        count and (lsns[0] < first or lsns[-1] > last or offsets[-1] >= data_end)
    ):
        raise CorruptionError("index points out of order or out of range", path=path, offset=0)
    return SparseIndex(first, last, data_end, points)


def read_index(path: str, fs: ReadFS = OS_FS) -> SparseIndex | None:
    """Load a segment's ``.idx`` sidecar (given the segment's or the index's
    path); ``None`` when it is missing or damaged (it is then rebuilt)."""
    if path.endswith(".wal"):
        path = index_path(path)
    try:
        data = fs.read_file(path)
        if data is None:
            return None
        records = list(RecordReader(io.BytesIO(data), path=path, max_record_bytes=64 << 20))
    except (OSError, CorruptionError):
        return None
    if len(records) != 1:
        return None
    try:
        return decode_index(records[0], path)
    except CorruptionError:
        return None


def write_index(segment_path: str, index: SparseIndex, fs: FileSystem = OS_FS) -> None:
    """Write the sidecar atomically (temp, fsync, rename; the caller fsyncs the directory)."""
    path = index_path(segment_path)
    buf = io.BytesIO()
    RecordWriter(buf, 0).add_record(encode_index(index))
    fs.write_file(path + ".tmp", buf.getvalue())
    fs.rename(path + ".tmp", path)


def scan_segment(f: BinaryIO, path: str, **kwargs: object) -> tuple[SegmentHeader, SparseIndex]:
    """Read a whole segment strictly and build its sparse index."""
    header, _ = read_header(f, path)
    points: list[tuple[int, int]] = []
    last_point = -INDEX_INTERVAL
    last_lsn = header.first_lsn - 1
    reader = RecordReader(f, path=path, start_offset=0, zeros_end=True, **kwargs)  # type: ignore[arg-type]
    expected = header.first_lsn
    for offset, payload in reader.records():
        if offset == 0:
            continue
        entry = decode_entry(payload, path, offset)
        if entry.lsn != expected:
            raise CorruptionError(
                f"LSN {entry.lsn} does not follow LSN {expected - 1}", path=path, offset=offset, lsn=entry.lsn,
                hint=REPAIR_HINT,
            )
        expected += 1
        if offset - last_point >= INDEX_INTERVAL:
            points.append((entry.lsn, offset))
            last_point = offset
        last_lsn = entry.lsn
    if reader.torn_tail is not None:
        off, why = reader.torn_tail
        raise CorruptionError(f"sealed segment ends in a torn record: {why}", path=path, offset=off, hint=REPAIR_HINT)
    return header, SparseIndex(header.first_lsn, last_lsn, reader.end_offset, IndexPoints(points))


# -- the durable LSN, shared with readers in other processes ---------------------

DURABLE_NAME = "DURABLE"
_DURABLE = struct.Struct("<QQ")  # durable LSN, its complement (a torn read shows as a mismatch)


def encode_durable(lsn: int) -> bytes:
    return _DURABLE.pack(lsn, lsn ^ 0xFFFFFFFFFFFFFFFF)


class DurableMarker:
    """The writer's side of ``DURABLE``: the file mapped in memory, so that
    publishing after each fsync is a 16-byte store, not a system call. It is
    written only after the fsync it reports, so whatever of it reaches the
    disk never overstates what is durable."""

    def __init__(self, directory: str) -> None:
        fd = os.open(os.path.join(directory, DURABLE_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _DURABLE.size)
            self._map = mmap.mmap(fd, _DURABLE.size)
        finally:
            os.close(fd)

    def publish(self, lsn: int) -> None:
        self._map[: _DURABLE.size] = encode_durable(lsn)

    def close(self) -> None:
        self._map.close()


def decode_durable(data: bytes) -> int | None:
    """The LSN in a ``DURABLE`` file's bytes, or ``None`` when they are not
    whole (a read racing the writer's update: read again)."""
    if len(data) != _DURABLE.size:
        return None
    lsn, check = _DURABLE.unpack(data)
    return lsn if check == lsn ^ 0xFFFFFFFFFFFFFFFF else None


def segment_first_lsn(name: str) -> int | None:
    """The first LSN a segment file name promises, or ``None`` for other names."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def read_durable_lsn(directory: str, fs: ReadFS = OS_FS) -> int | None:
    """The durable LSN published by the log's writer, or ``None`` when there is
    no (readable) ``DURABLE`` file. Entries up to it are fsynced; a reader in
    another process (a Spark job) reads no further."""
    for _ in range(10):  # a read racing the writer's update shows as a mismatch: retry
        try:
            data = fs.read_file(fs.join(directory, DURABLE_NAME))
        except OSError:
            return None
        if data is None or len(data) != _DURABLE.size:
            return None
        lsn = decode_durable(data)
        if lsn is not None:
            return lsn
    return None


def read_store_id(directory: str, fs: ReadFS = OS_FS) -> str | None:
    """The store id in the header of the log's newest segment (``None`` when
    the log has no segment yet)."""
    for _ in range(3):  # the newest segment may be rolled or trimmed while we look
        segments = list_segments(directory, fs)
        if not segments:
            return None
        path = segments[-1].path
        try:
            with fs.open_input(path) as f:
                return read_header(f, fs.display(path))[0].store_id
        except FileNotFoundError:
            continue
    raise CorruptionError("the log's segments keep vanishing while being read", kind=Damage.MISSING,
                          path=fs.display(directory), offset=0)
