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
  framed in memory (:func:`~kvstore.archive.objects.encode_segment`), its
  header stating the history up to the timeline its entries are on.
* Both go under the timeline the caller says they are on
  (:func:`~kvstore.archive.layout.log_dir`), and only when the segment's own
  header agrees with the history the caller planned with: a fork between
  the plan and the read (a repair, a truncation) may have put another
  timeline's entries under the same name, and nothing is uploaded then
  (the caller plans again).
* A timeline's history object goes before its first log object.
* A snapshot goes chunk by chunk, each one's size and CRC-32C checked
  against its manifest first, the MANIFEST last.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable

import snapshot
from kvstore.archive.layout import (
    WAL_DIR,
    LogObject,
    TimelineId,
    encode_lineage,
    history_object_name,
    log_dir,
    log_object_name,
    snapshots_dir,
)
from kvstore.archive.objects import encode_segment, read_piece
from kvstore.archive.target import ArchiveTarget
from snapshot.layout import MANIFEST_NAME
from wal.crc import crc32c
from wal.errors import CorruptionError, Damage, LogGapError
from wal.fs import OS_FS
from wal.index import read_index
from wal.segment import SegmentFile, SegmentScan
from wal.timeline import History, extends, history_until

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

    def _add(self, objects: list[LogObject], first: int, last: int, tid: TimelineId) -> None:
        objects.append(LogObject(first, last, self.target.path(*log_dir(tid), log_object_name(first, last)),
                                 timeline=tid))
        objects.sort(key=lambda o: (o.first, -o.last, o.timeline))

    def lineage(self, store_id: str, lineage: History) -> None:
        """Upload the history object of ``lineage[-1]`` (its lineage)."""
        self._put(encode_lineage(store_id, lineage), WAL_DIR, history_object_name(TimelineId.of(lineage[-1])))
        log.info("archived the history of %s (from LSN %d)", lineage[-1], lineage[-1].first_lsn)

    def segment(self, store_id: str, seg: SegmentFile, last: int, objects: list[LogObject],
                history: History) -> bool:
        """Upload the sealed segment ``seg`` as LSNs ``seg.first_lsn..last``
        of store ``store_id``, all on the last timeline of ``history`` (the
        log's history as it was when the segment began); in ``objects``
        (the archive's log objects, sorted as listed) it replaces that
        timeline's pieces it covers, which are then deleted. False (nothing
        uploaded) when the segment's header states another history (module
        docstring)."""
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
        if scan.header.history != history:
            return False
        tid = TimelineId.of(history[-1])
        self._put(data[: scan.data_end], *log_dir(tid), log_object_name(seg.first_lsn, last))
        log.debug("archived segment %s as LSNs %d..%d of %s", seg.path, seg.first_lsn, last, tid)
        replaced = [o for o in objects if o.timeline == tid and seg.first_lsn <= o.first and o.last <= last]
        objects[:] = [o for o in objects if o not in replaced]
        self._add(objects, seg.first_lsn, last, tid)
        for o in replaced:  # the pieces it replaces: only once it is there
            if (o.first, o.last) != (seg.first_lsn, last):
                self.target.delete(*log_dir(tid), log_object_name(o.first, o.last))
        return True

    def piece(self, store_id: str, seg: SegmentFile, first: int, limit: int, objects: list[LogObject],
              history: History) -> int | None:
        """Upload LSNs ``first..`` (up to ``limit`` and :data:`PIECE_BYTES`,
        all on one timeline of ``history``, the log's) of ``seg`` as one
        piece, added to ``objects``; return its last LSN, or None (nothing
        uploaded) when the segment's header is not on ``history`` (module
        docstring). Reading resumes at the offset where the previous piece of
        the segment ended (the active segment has no index: without it every
        round would decode the segment from its start)."""
        resume = self._resume
        if resume is not None and resume[0] == seg.path and resume[1] == first:
            start = resume[2]
        else:
            index = read_index(seg.path)
            start = index.offset_for(first) if index is not None and index.first_lsn == seg.first_lsn else 0
        piece = read_piece(seg.path, first, limit, start, PIECE_BYTES)
        if not extends(piece.history, history):
            return None
        lineage = history_until(history, first)
        data, last = encode_segment(store_id, first, piece.entries, max_record_bytes=piece.max_record_bytes,
                                    history=lineage)
        tid = TimelineId.of(lineage[-1])
        self._put(data, *log_dir(tid), log_object_name(first, last))
        self._resume = (seg.path, last + 1, piece.end)
        log.debug("archived LSNs %d..%d of %s to %s", first, last, tid, self.target.uri)
        self._add(objects, first, last, tid)
        return last

    def snapshot(self, path: str, lsn: int, tid: TimelineId) -> None:
        """Upload the local snapshot at ``path`` (LSN ``lsn``, on timeline
        ``tid``): its chunks, then its MANIFEST. :class:`FileNotFoundError`
        when it was pruned meanwhile."""
        snap = snapshot.open(path)
        where = (*snapshots_dir(tid), snapshot.snapshot_dir_name(lsn))
        for c in snap.all_chunks:
            data = OS_FS.read_file(os.path.join(path, c.name))
            if data is None:
                raise FileNotFoundError(os.path.join(path, c.name))
            if len(data) != c.bytes or crc32c(data) != c.crc32c:
                raise CorruptionError("snapshot chunk does not match its manifest; not archived",
                                      kind=Damage.CHECKSUM, path=os.path.join(path, c.name), offset=0)
            self._put(data, *where, c.name)
        manifest = OS_FS.read_file(os.path.join(path, MANIFEST_NAME))
        if manifest is None:
            raise FileNotFoundError(os.path.join(path, MANIFEST_NAME))
        self._put(manifest, *where, MANIFEST_NAME)
        log.info("archived snapshot at LSN %d to %s", lsn, self.target.uri)
