"""Uploading one thing to an archive, each checked before it goes: a sealed
segment whole, a piece of the durable tail, a snapshot. What to upload and
when (the round, the thread, retries, the archived LSN) is the archiver's
(:mod:`kvstore.archive.shipper`); names, and why objects go in this order,
are :mod:`kvstore.archive.layout`'s.

* A sealed segment is read whole; its header (the store id) and every CRC
  and LSN are checked to hold exactly the LSNs its object is named for; it
  is uploaded up to its data end, then the pieces it covers are deleted
  (compaction), only once it is there.
* A piece is LSNs ``first..`` of one local segment, at most
  :data:`PIECE_BYTES` of payload, read from the offset where the previous
  piece of that segment ended (else from the sparse index's point) and
  framed in memory (:func:`~kvstore.archive.objects.encode_segment`).
* A snapshot goes chunk by chunk, each one's size and CRC-32C checked
  against its manifest first, the MANIFEST last.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable

import snapshot
from kvstore.archive.layout import SNAPSHOTS_DIR, WAL_DIR, LogObject, log_object_name
from kvstore.archive.objects import encode_segment, read_piece
from kvstore.archive.target import ArchiveTarget
from snapshot.layout import MANIFEST_NAME
from wal.crc import crc32c
from wal.errors import CorruptionError, Damage, LogGapError
from wal.fs import OS_FS
from wal.index import read_index
from wal.segment import SegmentFile, SegmentScan

log = logging.getLogger("walkv.archive")

PIECE_BYTES = 16 << 20
"""Largest tail piece (payload bytes) uploaded at once."""


class Uploader:
    """Uploads a store's segments, pieces and snapshots to ``target``;
    ``uploaded(size)`` is called after each object it put."""

    def __init__(self, target: ArchiveTarget, uploaded: Callable[[int], None]) -> None:
        self.target = target
        self._uploaded = uploaded
        self._resume: tuple[str, int, int] | None = None  # (segment, next LSN, its record offset)

    def _put(self, data: bytes, *names: str) -> None:
        self.target.put(data, *names)
        self._uploaded(len(data))

    def _add(self, objects: list[LogObject], first: int, last: int) -> None:
        objects.append(LogObject(first, last, self.target.path(WAL_DIR, log_object_name(first, last))))
        objects.sort(key=lambda o: (o.first, -o.last))

    def segment(self, store_id: str, seg: SegmentFile, last: int, objects: list[LogObject]) -> None:
        """Upload the sealed segment ``seg`` as LSNs ``seg.first_lsn..last``
        of store ``store_id``; in ``objects`` (the archive's log objects,
        sorted as listed) it replaces the pieces it covers, which are then
        deleted."""
        data = OS_FS.read_file(seg.path)
        if data is None:
            raise LogGapError(f"segment {seg.path} was deleted before it was archived",
                              first_missing=seg.first_lsn, last_missing=last)
        scan = SegmentScan(io.BytesIO(data), seg.path)
        n = 0
        for _ in scan.entries(seg.first_lsn, last):
            n += 1
        if scan.header is None or scan.header.store_id != store_id or n != last - seg.first_lsn + 1:
            raise CorruptionError(f"sealed segment does not hold LSNs {seg.first_lsn}..{last} of store "
                                  f"{store_id}; not archived", kind=Damage.SEQUENCE, path=seg.path,
                                  offset=scan.data_end, lsn=seg.first_lsn + n)
        self._put(data[: scan.data_end], WAL_DIR, log_object_name(seg.first_lsn, last))
        log.debug("archived segment %s as LSNs %d..%d", seg.path, seg.first_lsn, last)
        replaced = [o for o in objects if seg.first_lsn <= o.first and o.last <= last]
        objects[:] = [o for o in objects if o not in replaced]
        self._add(objects, seg.first_lsn, last)
        for o in replaced:  # the pieces it replaces: only once it is there
            if (o.first, o.last) != (seg.first_lsn, last):
                self.target.delete(WAL_DIR, log_object_name(o.first, o.last))

    def piece(self, store_id: str, seg: SegmentFile, first: int, limit: int, objects: list[LogObject]) -> int:
        """Upload LSNs ``first..`` (up to ``limit`` and :data:`PIECE_BYTES`)
        of ``seg`` as one piece, added to ``objects``; return its last LSN.
        Reading resumes at the offset where the previous piece of the segment
        ended (the active segment has no index: without it every round would
        decode the segment from its start)."""
        resume = self._resume
        if resume is not None and resume[0] == seg.path and resume[1] == first:
            start = resume[2]
        else:
            index = read_index(seg.path)
            start = index.offset_for(first) if index is not None and index.first_lsn == seg.first_lsn else 0
        piece = read_piece(seg.path, first, limit, start, PIECE_BYTES)
        data, last = encode_segment(store_id, first, piece.entries, max_record_bytes=piece.max_record_bytes)
        self._put(data, WAL_DIR, log_object_name(first, last))
        self._resume = (seg.path, last + 1, piece.end)
        log.debug("archived LSNs %d..%d to %s", first, last, self.target.uri)
        self._add(objects, first, last)
        return last

    def snapshot(self, path: str, lsn: int) -> None:
        """Upload the local snapshot at ``path`` (LSN ``lsn``): its chunks,
        then its MANIFEST. :class:`FileNotFoundError` when it was pruned meanwhile."""
        snap = snapshot.open(path)
        name = snapshot.snapshot_dir_name(lsn)
        for c in snap.all_chunks:
            data = OS_FS.read_file(os.path.join(path, c.name))
            if data is None:
                raise FileNotFoundError(os.path.join(path, c.name))
            if len(data) != c.bytes or crc32c(data) != c.crc32c:
                raise CorruptionError("snapshot chunk does not match its manifest; not archived",
                                      kind=Damage.CHECKSUM, path=os.path.join(path, c.name), offset=0)
            self._put(data, SNAPSHOTS_DIR, name, c.name)
        manifest = OS_FS.read_file(os.path.join(path, MANIFEST_NAME))
        if manifest is None:
            raise FileNotFoundError(os.path.join(path, MANIFEST_NAME))
        self._put(manifest, SNAPSHOTS_DIR, name, MANIFEST_NAME)
        log.info("archived snapshot at LSN %d to %s", lsn, self.target.uri)
