"""Reading entries across segments: from a live log (:class:`SegmentView`, a
copy of its segment list that :meth:`wal.Log.read` reads) or straight from a
directory's files (:func:`read_log`: no lock, safe beside a writer in another
process and after it is gone); both through :func:`read_segments`'s loop."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from operator import attrgetter
from typing import Final

from wal.durable import read_durable_lsn
from wal.errors import REPAIR_HINT, CorruptionError, Damage, LogGapError
from wal.fs import OS_FS
from wal.index import SparseIndex, read_index
from wal.readfs import ReadFS
from wal.segment import Entry, EntryBatch, SegmentFile, SegmentScan, find_segment, list_segments


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
    return entries_of(_read_batches(segments, from_lsn, last, start_offset, active_end, fs))


def entries_of(batches: Iterable[EntryBatch]) -> Iterator[Entry]:
    """The entries of ``batches``, one by one (with no Python step per
    entry: the hot path of replay)."""
    return chain.from_iterable(map(_ENTRIES, batches))


_ENTRIES: Final = attrgetter("entries")


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
    return entries_of(_log_batches(directory, from_lsn, to_lsn, durable_only, fs))


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


class SegmentView:
    """A live log's segments as one reader sees them: copied under the log's
    mutex (:meth:`wal.segments.SegmentSet.copy`: the segment list, the sealed
    ones' sparse indexes, the active one's index points so far, the first LSN
    held), then read without it, so the writer may roll or truncate meanwhile."""

    def __init__(self, segments: list[SegmentFile], indexes: dict[int, SparseIndex],
                 active_points: list[tuple[int, int]], first_lsn: int) -> None:
        self.segments = segments
        self.indexes = indexes
        self.active_points = active_points
        self.first_lsn = first_lsn

    def batches(self, from_lsn: int, to_lsn: int | None, limit: tuple[int, int], directory: str
                ) -> Iterator[EntryBatch]:
        """Entries ``from_lsn..to_lsn`` (None: to the end), a block at a
        time, up to ``limit``: the last LSN to read and the offset in the
        active segment just after it."""
        if from_lsn < 1:
            raise ValueError(f"LSNs start at 1; cannot read from LSN {from_lsn}")
        first_held = self.first_lsn
        if from_lsn < first_held:
            raise LogGapError(
                f"LSN {from_lsn} is no longer in the log at {directory} (it starts at LSN {first_held}; "
                "older entries were truncated after a snapshot covered them)",
                first_missing=from_lsn, last_missing=first_held - 1, first_available=first_held,
            )
        limit_lsn, limit_off = limit
        last = limit_lsn if to_lsn is None else min(to_lsn, limit_lsn)
        if from_lsn > last:
            return iter(())
        return _read_batches(self.segments, from_lsn, last, self._start_offset, limit_off, OS_FS)

    def _start_offset(self, i: int, seg: SegmentFile, lsn: int) -> int:
        if i < len(self.segments) - 1:
            return self.indexes[seg.first_lsn].offset_for(lsn)
        points = self.active_points
        j = bisect.bisect_right(points, (lsn, 1 << 64)) - 1
        return points[j][1] if j >= 0 else 0
