"""A sealed segment's sparse index (the ``.idx`` sidecar).

One :mod:`wal.record` record (so it is CRC-protected)::

    "<8sHHQQQI" magic b"WALKVIDX", version, flags, first LSN, last LSN,
    data end offset, point count; then count x "<QQ" (LSN, record offset)

A point is written about every :data:`INDEX_INTERVAL` bytes of log, so reading
from any LSN is a bisect over segments, a bisect over points and a scan of at
most a few KiB. An index is only a cache: a missing or bad one is rebuilt by
scanning its segment (:func:`scan_segment`).
"""

from __future__ import annotations

import bisect
import io
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from operator import lt
from typing import BinaryIO, Final, NamedTuple, overload

from wal.errors import REPAIR_HINT, CorruptionError, Damage
from wal.fs import OS_FS, FileSystem
from wal.readfs import ReadFS
from wal.record import RecordWriter
from wal.record_reader import RecordReader
from wal.segment import (
    SegmentHeader,
    SegmentScan,
    index_path,
    read_header,
)

INDEX_MAGIC = b"WALKVIDX"
INDEX_VERSION = 1
"""The index's own format version (segment format 2 left the index as it was)."""
INDEX_INTERVAL: Final = 4096  # (Final: the compiled segment writer reads it as a constant)

_INDEX_HEADER = struct.Struct("<8sHHQQQI")
_INDEX_POINT = struct.Struct("<QQ")


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

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
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


def encode_index(index: SparseIndex) -> bytes:
    head = _INDEX_HEADER.pack(
        INDEX_MAGIC, INDEX_VERSION, 0, index.first_lsn, index.last_lsn, index.data_end, len(index.points)
    )
    return head + b"".join(_INDEX_POINT.pack(lsn, off) for lsn, off in index.points)


def decode_index(payload: bytes, path: str) -> SparseIndex:
    if len(payload) < _INDEX_HEADER.size:
        raise CorruptionError("index too short", kind=Damage.HEADER, path=path, offset=0)
    magic, version, _flags, first, last, data_end, count = _INDEX_HEADER.unpack_from(payload)
    if magic != INDEX_MAGIC or version != INDEX_VERSION:
        raise CorruptionError("not a walkv segment index", kind=Damage.HEADER, path=path, offset=0)
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


def scan_segment(f: BinaryIO, path: str) -> tuple[SegmentHeader, SparseIndex]:
    """Read a whole sealed segment strictly and build its sparse index (a
    torn tail is corruption here: a sealed segment was fsynced whole)."""
    header, header_end = read_header(f, path)
    points: list[tuple[int, int]] = []
    last_point = -INDEX_INTERVAL
    scan = SegmentScan(f, path, header_end, header.first_lsn)
    for offset, entry in scan.entries():
        if offset - last_point >= INDEX_INTERVAL:
            points.append((entry.lsn, offset))
            last_point = offset
    torn = scan.torn_tail()
    if torn is not None:
        raise CorruptionError(f"sealed segment ends in a torn record: {torn.reason}", kind=Damage.FRAMING,
                              path=path, offset=torn.offset, hint=REPAIR_HINT)
    assert scan.next_lsn is not None  # the scan started with the header's first LSN
    return header, SparseIndex(header.first_lsn, scan.next_lsn - 1, scan.data_end, IndexPoints(points))
