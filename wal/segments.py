"""The files of an open log: :class:`SegmentSet` owns the sealed segments
(oldest first) with their sparse indexes, the first LSN they hold, and the
active segment being written.

The log's writer (:class:`wal.log_writer.LogWriter`) has one. It changes
only under the log's mutex (the group commit's): a roll by the group's
leader (:meth:`SegmentSet.replace_active`), ``truncate_before``
(:meth:`SegmentSet.drop_before`); ``truncate_after`` replaces the whole set
with one opened again. Readers copy it under the mutex
(:meth:`SegmentSet.copy`) and read the copy without it
(:class:`wal.reader.SegmentView`). The files on disk are opened by
:func:`wal.recovery.recover` and deleted or cut by :mod:`wal.truncation`.
"""

from __future__ import annotations

import itertools

from wal.fs import FileSystem
from wal.index import SparseIndex
from wal.reader import SegmentView
from wal.recovery import recover
from wal.segment import SegmentFile
from wal.segment_writer import ActiveSegment
from wal.timeline import ROOT, History


class SegmentSet:
    """The segments of one open log. ``store_id`` is the id their headers
    carry; ``dropped_bytes`` what opening them cut (a torn tail)."""

    def __init__(self, store_id: str, sealed: list[SegmentFile], indexes: dict[int, SparseIndex],
                 active: ActiveSegment, dropped_bytes: int = 0) -> None:
        self.store_id = store_id
        self.dropped_bytes = dropped_bytes
        self.sealed = sealed
        self.indexes = indexes
        self.active = active
        self.first_lsn = sealed[0].first_lsn if sealed else active.file.first_lsn

    @classmethod
    def open(cls, directory: str, *, fs: FileSystem, recovery: str, prealloc: int, max_record_bytes: int,
             start_lsn: int, zeroed: bool = False, history: History = ROOT, store_id: str | None = None
             ) -> SegmentSet:
        """Recover the log in ``directory`` (:func:`wal.recovery.recover`;
        ``start_lsn``, ``history`` and ``store_id`` are a new log's) and open
        its active segment for writing, synced (what a crashed process left in
        the page cache is made durable before anything is built on it)."""
        rec = recover(directory, fs=fs, mode=recovery, prealloc=prealloc, max_record_bytes=max_record_bytes,
                      start_lsn=start_lsn, zeroed=zeroed, history=history, store_id=store_id)
        rec.active.open(fs, prealloc, zeroed=zeroed)
        rec.active.sync_full()
        return cls(rec.store_id, [s.file for s in rec.sealed], {s.file.first_lsn: s.index for s in rec.sealed},
                   rec.active, rec.dropped_bytes)

    @property
    def end(self) -> tuple[int, int]:
        """The last LSN written and the offset just after it in the active segment."""
        return self.active.last_lsn, self.active.data_end

    @property
    def history(self) -> History:
        """The log's timeline history (:mod:`wal.timeline`): the active segment's header states it."""
        return self.active.header.history

    @property
    def count(self) -> int:
        """The number of segments, the active one included."""
        return len(self.sealed) + 1

    def copy(self) -> SegmentView:
        """With the mutex held: what a reader needs, copied so that it can
        read without the mutex while the log rolls or truncates."""
        return SegmentView(self.sealed + [self.active.file], dict(self.indexes), list(self.active.points),
                           self.first_lsn)

    def replace_active(self, index: SparseIndex | None, new: ActiveSegment) -> ActiveSegment:
        """With the mutex held: the active segment was sealed with ``index``
        (None: it was empty, and ``new`` replaced its file); ``new`` is the
        active one from now on. Returns the old one (for the caller to close
        once the mutex is released)."""
        old = self.active
        if index is not None:
            self.sealed.append(old.file)
            self.indexes[old.file.first_lsn] = index
        elif not self.sealed:
            self.first_lsn = new.file.first_lsn
        self.active = new
        return old

    def drop_before(self, lsn: int) -> list[SegmentFile]:
        """With the mutex held: take out the sealed segments all of whose LSNs
        are below ``lsn`` (never the active one) and return them, oldest
        first, for :func:`wal.truncation.delete_segments` to delete."""
        segments = self.sealed + [self.active.file]
        doomed = [seg for seg, nxt in itertools.pairwise(segments) if nxt.first_lsn <= lsn]
        if doomed:
            self.sealed = self.sealed[len(doomed):]
            for seg in doomed:
                del self.indexes[seg.first_lsn]
            self.first_lsn = segments[len(doomed)].first_lsn
        return doomed
