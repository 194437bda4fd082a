"""Following a log directory's files from an LSN, for watchers.

:class:`LogTail` reads entries straight from the segment files (through the
read-only seam, :mod:`wal.readfs`), up to a bound the caller gives (the
durable LSN: entries after it may be mid-write), and remembers where it
stopped: the segment it is in stays open and the next read starts at the
byte after the last entry, so following a busy log costs one read of the new
bytes per wake-up, not a listing and an index lookup. It holds no entry in
memory between reads; it never needs the writer's memory.

Across segment rolls it lists the directory again and opens the segment that
starts at the next LSN. When that segment is gone (retention deleted it after
a snapshot covered it) or ``from_lsn`` is older than the oldest segment, it
raises :class:`~wal.errors.LogGapError` naming the first LSN available. The
segment it holds open stays readable after it is deleted (an open file
handle), so retention only matters at a roll.

Timelines (:mod:`wal.timeline`): :attr:`LogTail.history` is the log's history
as its newest segment stated it just before the tail opened the segment it
reads (a fork changes course only at a segment it creates, so the entries of
an open segment are on it). At each roll the log's history is read again and
must agree with it up to the last LSN read: when the log forked before that
LSN (a repair cut, a truncation), what the tail read past the fork was of a
history the log left, and it raises :class:`~wal.errors.ForkedHistoryError`
naming both timelines and the fork LSN, rather than go on with the other
history's entries, or report the LSNs it no longer finds as damage.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from wal.errors import REPAIR_HINT, CorruptionError, Damage, LogGapError
from wal.fs import OS_FS
from wal.index import read_index
from wal.readfs import ReadFS
from wal.segment import Entry, SegmentFile, SegmentScan, find_segment, list_segments, read_newest_header
from wal.timeline import ROOT, History, check_follows


def log_history(directory: str, fs: ReadFS = OS_FS) -> History:
    """The timeline history of the log at ``directory`` now, as its newest
    segment states it (:data:`~wal.timeline.ROOT` while it has none)."""
    header = read_newest_header(directory, fs)
    return ROOT if header is None else header.history


def _gap(directory: str, lsn: int, segments: list[SegmentFile], fs: ReadFS) -> LogGapError:
    first = segments[0].first_lsn if segments else None
    where = f"it starts at LSN {first}" if first is not None else "it holds no segment"
    return LogGapError(
        f"LSN {lsn} is no longer in the log at {fs.display(directory)}: {where} (older segments were "
        f"deleted after a snapshot covered them); watch from LSN {first} or from a snapshot "
        f"(on_gap='snapshot')",
        first_missing=lsn, last_missing=(first - 1) if first is not None else lsn, first_available=first)


class LogTail:
    """Entries of the log at ``directory`` from ``from_lsn`` on, read in
    steps (:meth:`read`). Not thread-safe: one consumer."""

    def __init__(self, directory: str, from_lsn: int, *, fs: ReadFS = OS_FS) -> None:
        self.directory = directory
        self.next_lsn = from_lsn
        self._fs = fs
        self._fh: BinaryIO | None = None
        self._shown = ""
        self._offset = 0
        self._expected: int | None = None
        self.history: History = log_history(self.directory, self._fs)
        """The history the entries read are on (module docstring)."""
        segments = list_segments(directory, fs)
        i = find_segment(segments, from_lsn)
        if i < 0:
            raise _gap(directory, from_lsn, segments, fs)
        seg = segments[i]
        index = read_index(seg.path, fs)
        offset = index.offset_for(from_lsn) if index is not None and index.first_lsn == seg.first_lsn else 0
        self._open(seg, offset, segments)

    def _open(self, seg: SegmentFile, offset: int, segments: list[SegmentFile]) -> None:
        try:
            fh = self._fs.open_input(seg.path)
        except FileNotFoundError:
            raise _gap(self.directory, self.next_lsn, list_segments(self.directory, self._fs), self._fs) from None
        self.close()
        self._fh = fh
        self._shown = self._fs.display(seg.path)
        self._offset = offset
        self._expected = seg.first_lsn if offset == 0 else None

    def read(self, last: int) -> Iterator[Entry]:
        """The entries ``next_lsn..last`` (``last`` must be durable). Stopping
        early is fine: the next read goes on after the last entry yielded."""
        while self.next_lsn <= last:
            fh = self._fh
            if fh is None:
                raise ValueError("this log tail is closed")
            scan = SegmentScan(fh, self._shown, self._offset, self._expected)  # bounded by its header's limit
            for _, entry in scan.entries(self.next_lsn, last):
                self._offset = scan.data_end
                self._expected = self.next_lsn = entry.lsn + 1
                yield entry
            self._offset = scan.data_end
            if scan.next_lsn is not None:
                self._expected = scan.next_lsn
            if self.next_lsn > last:
                return
            self._roll()

    def _roll(self) -> None:
        """The open segment ended before ``next_lsn``: open the next one, on
        a history that goes on from what was read (module docstring)."""
        lsn = self.next_lsn
        history = log_history(self.directory, self._fs)
        check_follows(self.history, lsn - 1, history, what=f"a reader of {self._fs.display(self.directory)}",
                      source="the log", hint="what it read after that LSN is not in the log any more: read again "
                                             "from the LSN after it")
        self.history = history
        segments = list_segments(self.directory, self._fs)
        for seg in segments:
            if seg.first_lsn == lsn:
                self._open(seg, 0, segments)
                return
        if not segments or segments[0].first_lsn > lsn:
            raise _gap(self.directory, lsn, segments, self._fs)
        raise CorruptionError(f"LSN {lsn} is durable but neither in {self._shown} (which ends at "
                              f"LSN {lsn - 1}) nor at the start of a later segment",
                              kind=Damage.SEQUENCE, path=self._shown, offset=self._offset, lsn=lsn,
                              hint=REPAIR_HINT)

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
