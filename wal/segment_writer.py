"""The active (newest) segment: the only file the log writes.

Rules, and why:

* A new segment is written under a ``.tmp`` name, fsynced and renamed, then
  the directory fsynced, so a ``.wal`` file always has a valid header.
* The active segment is preallocated ahead of its tail (in steps), so that
  an ``fdatasync`` after an append journals no size change; the preallocated
  space reads as zeros, which read as the end of the data. A log that fsyncs
  every group writes the zeros out; the others reserve the space with
  ``fallocate`` (:func:`reserve` says why).
* A group of entries is framed in memory and written with one ``pwrite``
  (a large one, :data:`GATHER_BYTES` or more, or one holding a payload given
  as pieces, is framed as views into its payloads and written with
  ``pwritev``, so a 64 MiB value is never copied to be logged); an index point is taken about every :data:`~wal.index.INDEX_INTERVAL` bytes as
  entries pass, so the index of a segment costs no second pass.
* Sealing cuts the file to its data end, fsyncs it and writes its index
  sidecar; a sealed segment is never written again.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Final, cast

from wal.errors import RecordTooLargeError
from wal.fs import OS_FS, File, FileSystem
from wal.index import INDEX_INTERVAL, IndexPoints, SparseIndex, write_index
from wal.record import (
    BLOCK_SIZE,
    DEFAULT_MAX_RECORD_BYTES,
    HEADER_SIZE,
    RecordWriter,
    frame,
    frame_into,
    frame_pieces,
)
from wal.segment import (
    ENTRY_HEADER_SIZE,
    FORMAT_VERSION,
    Payload,
    SegmentFile,
    SegmentHeader,
    encode_header,
    pack_entry_header,
    payload_size,
    segment_name,
)
from wal.timeline import ROOT, History

GATHER_BYTES: Final = 1 << 20
"""A group this large (or holding a payload given as pieces) is written
without being copied into one buffer."""
_BYTES_ONLY: Final = {bytes}

def check_payload(payload: object, max_record_bytes: int) -> Payload:
    """``payload`` as the log writes it (bytes, or a tuple of bytes: pieces
    logged without being joined), or :class:`RecordTooLargeError` when its
    entry would not fit in ``max_record_bytes``."""
    if type(payload) is tuple and all(type(p) is bytes for p in payload):
        payload = cast("tuple[bytes, ...]", payload)
    elif type(payload) is not bytes:
        if not isinstance(payload, (bytearray, memoryview)):
            raise TypeError(f"log payload must be bytes (or a tuple of bytes), not {type(payload).__name__}")
        payload = bytes(payload)
    size, limit = payload_size(payload), max_record_bytes - ENTRY_HEADER_SIZE
    if size > limit:
        raise RecordTooLargeError(f"log entry of {size} bytes is over the limit of {limit} bytes "
                                  f"(max_record_bytes={max_record_bytes}); nothing was written")
    return payload


def gathered(payloads: list[Payload]) -> bool:
    """Is a group written from views into its payloads (large, or pieces)?"""
    if len(payloads) == 1:
        p = payloads[0]
        return type(p) is not bytes or len(p) >= GATHER_BYTES
    return set(map(type, payloads)) != _BYTES_ONLY or sum(map(len, payloads)) >= GATHER_BYTES


def reserve(f: File, offset: int, length: int, zeroed: bool) -> None:
    """Preallocate ``[offset, offset+length)`` of the active segment: zeros
    written out when ``zeroed`` (a log that fsyncs every group), else
    ``fallocate``'s unwritten extents (:meth:`wal.fs.File.preallocate`).

    Why it depends on the sync mode (measured, ext4): a small ``pwrite`` over
    written zeros costs 1.0 us, over unwritten extents 0.4 us (a non-durable
    append costs 1.3 us in all); but an ``fdatasync`` after a write into
    unwritten extents also journals their conversion: 160 -> 230 us for
    2-16 KiB groups, the bulk of a durable append."""
    if zeroed:
        f.write_zeros(offset, length)
    else:
        f.preallocate(offset, length)


def round_block(n: int) -> int:
    """``n`` rounded up to a whole record block."""
    return (n + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE


def record_start(offset: int) -> int:
    """Where a record written at ``offset`` really starts (past a trailer)."""
    left = BLOCK_SIZE - offset % BLOCK_SIZE
    return offset + left if left < HEADER_SIZE else offset


def write_new_segment(
    directory: str, store_id: str, first_lsn: int, prealloc: int, fs: FileSystem = OS_FS,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, *, zeroed: bool = False, history: History = ROOT,
) -> tuple[str, int]:
    """Create a segment durably (temp name, header, preallocated space, fsync,
    rename, fsync directory), its header stating ``max_record_bytes`` and the
    log's timeline ``history``; the space written as zeros when ``zeroed``
    (see :func:`reserve`). An empty segment of the same name is replaced in
    one step (the rename). Returns its path and the offset after the header."""
    path = os.path.join(directory, segment_name(first_lsn))
    tmp = path + ".tmp"
    buf = io.BytesIO()
    RecordWriter(buf, 0).add_record(encode_header(store_id, first_lsn, max_record_bytes, history))
    data = buf.getvalue()
    end = len(data)
    f = fs.open(tmp, create=True)
    try:
        f.truncate(0)
        f.pwrite(data, 0)
        if prealloc > end:
            reserve(f, end, prealloc - end, zeroed)
        f.sync(full=True)
    finally:
        f.close()
    fs.rename(tmp, path)
    fs.fsync_dir(directory)
    return path, end


class ActiveSegment:
    """The active segment's state (what recovery found, then what the log
    wrote) and, once :meth:`open`, its file.

    ``data_end`` is the offset just after the last entry, ``last_lsn`` its LSN
    (``first_lsn - 1`` when empty), ``points`` the index points so far.
    """

    def __init__(self, file: SegmentFile, header: SegmentHeader, data_end: int, last_lsn: int,
                 points: list[tuple[int, int]] | None = None, last_point: int = -INDEX_INTERVAL) -> None:
        self.file = file
        self.header = header
        self.data_end = data_end
        self.last_lsn = last_lsn
        self.points: list[tuple[int, int]] = [] if points is None else points
        self.last_point = last_point
        self._f: File | None = None
        self._prealloc_end = 0
        self._prealloc_step = 0
        self._zeroed = False

    @classmethod
    def create(cls, directory: str, store_id: str, first_lsn: int, prealloc: int,
               fs: FileSystem = OS_FS, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, *,
               zeroed: bool = False, history: History = ROOT) -> ActiveSegment:
        """A new, empty segment whose first LSN is ``first_lsn``, for records
        of at most ``max_record_bytes``, on the last timeline of ``history``
        (``zeroed``: see :func:`reserve`)."""
        path, end = write_new_segment(directory, store_id, first_lsn, prealloc, fs, max_record_bytes, zeroed=zeroed,
                                      history=history)
        header = SegmentHeader(FORMAT_VERSION, store_id, first_lsn, time.time_ns() // 1000, max_record_bytes,
                               history)
        return cls(SegmentFile(first_lsn, path), header, end, first_lsn - 1)

    @property
    def file_handle(self) -> File:
        if self._f is None:
            raise RuntimeError(f"{self.file.path} is not open for writing")
        return self._f

    def open(self, fs: FileSystem, prealloc_step: int, *, zeroed: bool = False) -> None:
        """Open the file for appending, preallocating ``prealloc_step`` bytes
        at a time (``zeroed``: see :func:`reserve`)."""
        self._f = fs.open(self.file.path)
        self._prealloc_end = self._f.size()
        self._prealloc_step = prealloc_step
        self._zeroed = zeroed

    def close(self) -> None:
        if self._f is not None:
            self._f.close()

    def sync(self) -> None:
        """``fdatasync``: enough while the file's size has not changed."""
        self.file_handle.sync(full=False)

    def sync_full(self) -> None:
        """``fsync``: the file's size (or the file) is new."""
        self.file_handle.sync(full=True)

    def write_group(self, first: int, payloads: list[Payload], timestamp_us: int, gather: bool = False
                    ) -> tuple[int, bool]:
        """Frame entries ``first, first+1, ...`` after the last one and write
        them with one ``pwrite`` (``pwritev`` of views into the payloads when
        ``gather``: the caller's choice for large groups and pieces). Returns
        the bytes written and whether the file grew (its size changed: the
        next sync must be a full fsync)."""
        if gather:
            return self._write_gathered(first, payloads, timestamp_us)
        f = self.file_handle
        off = start = self.data_end
        last_point = self.last_point
        plain = cast("list[bytes]", payloads)  # pieces are always gathered
        if len(plain) == 1 and off - last_point < INDEX_INTERVAL:  # one append, no index point
            data, off = frame(pack_entry_header(first, timestamp_us) + plain[0], off)
            lsn = first + 1
        else:
            points = self.points
            lsn = first
            parts: list[bytes | memoryview] = []
            for payload in plain:
                if off - last_point >= INDEX_INTERVAL:
                    rec = record_start(off)
                    points.append((lsn, rec))
                    last_point = rec
                off = frame_into(parts, pack_entry_header(lsn, timestamp_us) + payload, off)
                lsn += 1
            self.last_point = last_point
            data = b"".join(parts)
        grew = off > self._prealloc_end
        if grew:
            self._grow(off)
        f.pwrite(data, start)
        self.data_end = off
        self.last_lsn = lsn - 1
        return off - start, grew

    def _write_gathered(self, first: int, payloads: list[Payload], timestamp_us: int) -> tuple[int, bool]:
        f = self.file_handle
        off = start = self.data_end
        last_point = self.last_point
        points = self.points
        parts: list[bytes | memoryview] = []
        lsn = first
        for payload in payloads:
            if off - last_point >= INDEX_INTERVAL:
                rec = record_start(off)
                points.append((lsn, rec))
                last_point = rec
            head = pack_entry_header(lsn, timestamp_us)
            off = frame_pieces(parts, (head, payload) if type(payload) is bytes else (head, *payload), off)
            lsn += 1
        self.last_point = last_point
        grew = self._grow(off)
        f.pwritev(parts, start)
        self.data_end = off
        self.last_lsn = lsn - 1
        return off - start, grew

    def _grow(self, off: int) -> bool:
        """Preallocate past ``off`` when the file must grow; whether it did.
        Only past ``off``: the group about to be written fills everything
        before it (a 12 MiB group into an 8 MiB preallocation wrote 4 MiB of
        zeros only to overwrite them)."""
        if off <= self._prealloc_end:
            return False
        new_end = round_block(max(off, self._prealloc_end + self._prealloc_step))
        if new_end > off:
            reserve(self.file_handle, off, new_end - off, self._zeroed)
        self._prealloc_end = new_end
        return True

    def index(self) -> SparseIndex:
        """The sparse index of what is written so far."""
        return SparseIndex(self.file.first_lsn, self.last_lsn, self.data_end, IndexPoints(self.points))

    def write_index(self, fs: FileSystem) -> SparseIndex:
        """Write the index sidecar (so the next open scans little); the caller
        fsyncs the directory."""
        index = self.index()
        write_index(self.file.path, index, fs)
        return index

    def seal(self, fs: FileSystem, sync: Callable[[bool], None]) -> SparseIndex:
        """Cut the preallocated zeros, make the file durable with ``sync(full)``
        and write its index; return the index. The file stays open (the
        caller closes it once the next segment is active).

        Once synced, its pages leave the page cache
        (:meth:`~wal.fs.File.drop_cached`): a sealed segment is read again
        only by a reader catching up (a replica, the archiver, Spark), while
        the state machine beside the log is read at every get, and a log
        that grows by gigabytes would otherwise push the state's pages out
        of the cache (at 50M keys, 5.7 GB of log against a 6.3 GB LMDB map:
        gets and puts went to the disk). Only the active segment stays
        cached, where readers tailing the log find it."""
        f = self.file_handle
        f.truncate(self.data_end)
        sync(True)
        f.drop_cached()
        return self.write_index(fs)
