"""Reading entries across segments, from a live log (:class:`LogReading`, the
reads of :class:`wal.Log`) or straight from a directory's files
(:func:`read_log`: no lock, safe beside a writer in another process and after
it is gone)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from itertools import chain
from operator import attrgetter, itemgetter

from wal.commit import GroupCommit
from wal.durable import read_durable_lsn
from wal.errors import REPAIR_HINT, ClosedError, CorruptionError, Damage, LogGapError
from wal.fs import OS_FS
from wal.index import SparseIndex, read_index
from wal.readfs import ReadFS
from wal.segment import Entry, EntryBatch, SegmentFile, SegmentScan, find_segment, list_segments
from wal.segment_writer import ActiveSegment


def read_segments(
    segments: list[SegmentFile],
    from_lsn: int,
    last: int | None,
    start_offset: Callable[[int, SegmentFile, int], int],
    *,
    active_end: int | None = None,
    fs: ReadFS = OS_FS,
) -> Iterator[Entry]:
    """Entries ``from_lsn..last`` (None: to the end) of consecutive segments,
    strictly checked, with no LSN missing (a missing one is corruption, named
    at the offset where it should have been). ``start_offset(i, segment,
    lsn)`` gives the record offset to start reading segment ``i`` at (from a
    sparse index); ``active_end`` bounds the bytes read of the last segment
    (the durable part of a segment still being written). Each segment's
    records are bounded by the limit its own header states."""
    batches = _read_batches(segments, from_lsn, last, start_offset, active_end, fs)
    return chain.from_iterable(map(_ENTRIES, batches))  # no step per entry: the hot path of replay


_ENTRIES = attrgetter("entries")


def _read_batches(segments: list[SegmentFile], from_lsn: int, last: int | None,
                  start_offset: Callable[[int, SegmentFile, int], int], active_end: int | None,
                  fs: ReadFS) -> Iterator[EntryBatch]:
    """:func:`read_segments`, a block of entries at a time."""
    expected = from_lsn
    for i in range(max(0, find_segment(segments, from_lsn)), len(segments)):
        seg = segments[i]
        if last is not None and seg.first_lsn > last:
            return
        is_last = i == len(segments) - 1
        shown = fs.display(seg.path)
        start = start_offset(i, seg, expected)
        try:
            fh = fs.open_input(seg.path)
        except FileNotFoundError:
            raise LogGapError(
                f"segment {shown} (LSNs from {seg.first_lsn}) was deleted while being read: a "
                "snapshot covered it and retention (truncate_before) removed it; read again from a snapshot",
                first_missing=expected, last_missing=(segments[i + 1].first_lsn - 1) if not is_last else expected,
            ) from None
        with fh:
            scan = SegmentScan(fh, shown, start, end_offset=active_end if is_last else None)
            for batch in scan.batches(expected, last):
                lsn = batch.entries[0].lsn  # the scan checked that the rest follow it
                if lsn != expected:
                    raise CorruptionError(f"LSNs {expected}..{lsn - 1} are missing from the log",
                                          kind=Damage.SEQUENCE, path=shown, offset=batch.offsets[0], lsn=expected,
                                          hint=REPAIR_HINT)
                yield batch
                expected += len(batch.entries)
        if last is not None and expected > last:
            return
        nxt = segments[i + 1].first_lsn if not is_last else None
        if nxt is not None and expected < nxt:
            raise CorruptionError(f"LSNs {expected}..{nxt - 1} are missing from the log", kind=Damage.SEQUENCE,
                                  path=shown, offset=scan.data_end, lsn=expected, hint=REPAIR_HINT)


def read_log(directory: str, from_lsn: int = 1, to_lsn: int | None = None, *,
             durable_only: bool = True, fs: ReadFS = OS_FS) -> Iterator[Entry]:
    """Entries of a log directory, read straight from its files: no lock, so
    safe beside a live writer (another process) and after it is gone. Reads up
    to the published durable LSN (``durable_only``; every valid entry when no
    ``DURABLE`` file exists). Raises :class:`LogGapError` when ``from_lsn`` is
    before the first segment (retention deleted it) and :class:`CorruptionError`
    when entries are missing in the middle. ``fs`` is the read-only file seam
    (:mod:`wal.readfs`) the files are read through."""
    return chain.from_iterable(map(_ENTRIES, _log_batches(directory, from_lsn, to_lsn, durable_only, fs)))


def _log_batches(directory: str, from_lsn: int, to_lsn: int | None, durable_only: bool,
                 fs: ReadFS) -> Iterator[EntryBatch]:
    """:func:`read_log`, a block of entries at a time."""
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

    yield from _read_batches(segments, from_lsn, last, start_offset, None, fs)


_LSN_AND_PAYLOAD = itemgetter(0, 2)


class LogReading:
    """The reads of :class:`wal.Log` (a base class of it): a consistent copy
    of the segment list is taken under the group commit's mutex, then read
    without it."""

    directory: str
    _closed: bool
    _durable: tuple[int, int]
    _written: tuple[int, int]
    _sealed: list[SegmentFile]
    _indexes: dict[int, SparseIndex]
    _first_lsn: int
    _active: ActiveSegment
    _gc: GroupCommit

    def read(self, from_lsn: int = 1, to_lsn: int | None = None, *, durable_only: bool = True
             ) -> Iterator[tuple[int, bytes]]:
        """Yield ``(lsn, payload)`` from ``from_lsn`` to ``to_lsn`` (inclusive),
        up to the durable LSN (or everything written, ``durable_only=False``)."""
        return map(_LSN_AND_PAYLOAD, self.read_entries(from_lsn, to_lsn, durable_only=durable_only))

    def read_entries(self, from_lsn: int = 1, to_lsn: int | None = None, *, durable_only: bool = True
                     ) -> Iterator[Entry]:
        """As :meth:`read`, yielding :class:`wal.Entry` (lsn, timestamp_us, payload)."""
        return chain.from_iterable(map(_ENTRIES, self._read_batches(from_lsn, to_lsn, durable_only)))

    def _read_batches(self, from_lsn: int, to_lsn: int | None, durable_only: bool) -> Iterator[EntryBatch]:
        """:meth:`read_entries`, a block of entries at a time."""
        with self._gc.mutex:
            if self._closed:
                raise ClosedError(f"the log at {self.directory} is closed")
            limit_lsn, limit_off = self._durable if durable_only else self._written
            segments = self._sealed + [self._active.file]
            indexes = dict(self._indexes)
            active_points = list(self._active.points)
            first_held = self._first_lsn
        if from_lsn < 1:
            raise ValueError(f"LSNs start at 1; cannot read from LSN {from_lsn}")
        if from_lsn < first_held:
            raise LogGapError(
                f"LSN {from_lsn} is no longer in the log at {self.directory} (it starts at LSN {first_held}; "
                "older entries were truncated after a snapshot covered them)",
                first_missing=from_lsn, last_missing=first_held - 1, first_available=first_held,
            )
        last = limit_lsn if to_lsn is None else min(to_lsn, limit_lsn)
        if from_lsn > last:
            return

        def start_offset(i: int, seg: SegmentFile, lsn: int) -> int:
            if i < len(segments) - 1:
                return indexes[seg.first_lsn].offset_for(lsn)
            j = bisect.bisect_right(active_points, (lsn, 1 << 64)) - 1
            return active_points[j][1] if j >= 0 else 0

        yield from _read_batches(segments, from_lsn, last, start_offset, limit_off, OS_FS)
