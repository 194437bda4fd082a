"""Cutting a log: zeroing what follows a point in a segment, dropping the
entries after an LSN (``truncate_after``) and deleting old segments
(``truncate_before``), each safe against a crash at any step.

* A cut zeroes bytes rather than shortening the file: the active segment is
  preallocated, and zeros read as the end of the data, so no stale fragment
  past the cut can ever be read as a record.
* ``truncate_after`` first makes a ``TRUNCATE`` marker naming the LSN durable
  (temp file, fsync, rename, directory fsync); the next open finishes an
  interrupted cut, which is idempotent and reads nothing past that LSN (a
  power loss may have zeroed some of those sectors and not others).
* Old segments go oldest first, each index before its segment, then one
  directory fsync: a crash leaves a gap-free suffix and no orphan index.
"""

from __future__ import annotations

import itertools
import logging
import os

from wal.commit import GroupCommit
from wal.durable import DurableMarker
from wal.errors import CorruptionError, file_error
from wal.fs import OS_FS, File, FileSystem
from wal.index import SparseIndex, read_index
from wal.segment import SegmentFile, SegmentScan, index_path, list_segments, read_header
from wal.segment_writer import ActiveSegment

log = logging.getLogger("walkv.wal")

_CHUNK = 1 << 20


def nonzero_end(f: File, start: int, end: int) -> int:
    """Offset just past the last non-zero byte in ``[start, end)``, or ``start``."""
    last = start
    pos = start
    while pos < end:
        data = f.pread(min(_CHUNK, end - pos), pos)
        if not data:
            break
        stripped = data.rstrip(b"\x00")
        if stripped:
            last = pos + len(stripped)
        pos += len(data)
    return last


def cut_tail(fs: FileSystem, path: str, cut: int, reason: str) -> int:
    """Zero everything from ``cut`` to the last non-zero byte; return the count."""
    f = fs.open(path)
    try:
        end = nonzero_end(f, cut, f.size())
        if end > cut:
            f.preallocate(cut, end - cut)
            f.sync()
            log.warning("%s: cut a torn tail of %d bytes at offset %d (%s)", path, end - cut, cut, reason)
        return end - cut
    finally:
        f.close()


def delete_segments(directory: str, doomed: list[SegmentFile], fs: FileSystem = OS_FS) -> int:
    """Delete sealed segments (oldest first, each index before its segment,
    then one directory fsync), so that a crash leaves a gap-free suffix and
    no index without its segment. Returns the bytes freed."""
    freed = 0
    try:
        for seg in doomed:
            idx = index_path(seg.path)
            if os.path.exists(idx):
                freed += os.path.getsize(idx)
                fs.unlink(idx)
            freed += os.path.getsize(seg.path)
            fs.unlink(seg.path)
        fs.fsync_dir(directory)
    except OSError as e:
        raise file_error(e, "deleting old log segments (nothing the log still needs was touched; "
                            "what was not deleted is kept, and deleted by a truncate_before after the "
                            "next open)") from None
    return freed

TRUNCATE_MARKER = "TRUNCATE"


def _entry_end(path: str, lsn: int, start: int) -> int:
    """Offset just after entry ``lsn`` in a segment (``start`` when the
    segment's first LSN is ``lsn + 1``), scanning from record offset ``start``.
    Nothing after entry ``lsn`` is read: an interrupted cut may have left it
    half zeroed."""
    with open(path, "rb") as fh:
        scan = SegmentScan(fh, path, start)
        for _ in scan.entries(to_lsn=lsn):
            pass
        return scan.data_end


def cut_after(directory: str, lsn: int, fs: FileSystem = OS_FS) -> None:
    """Drop every entry after ``lsn``. Idempotent, so that recovery can finish
    it after a crash: :meth:`Log.truncate_after` first writes a ``TRUNCATE``
    marker naming ``lsn`` and removes it only when this has returned."""
    segments = list_segments(directory, fs)
    keep = max((i for i, s in enumerate(segments) if s.first_lsn <= lsn + 1), default=0)
    for seg in reversed(segments[keep + 1 :]):
        if os.path.exists(index_path(seg.path)):
            fs.unlink(index_path(seg.path))
        fs.unlink(seg.path)
    seg = segments[keep]
    with open(seg.path, "rb") as fh:
        _, header_end = read_header(fh, seg.path)
    index = read_index(seg.path)
    start = header_end
    if index is not None and index.first_lsn == seg.first_lsn:
        start = max((off for p_lsn, off in index.points if p_lsn <= lsn), default=header_end)
    if os.path.exists(index_path(seg.path)):
        fs.unlink(index_path(seg.path))
    end = _entry_end(seg.path, lsn, start)
    cut_tail(fs, seg.path, end, f"truncate_after({lsn})")
    f = fs.open(seg.path)
    try:
        f.sync(full=True)
    finally:
        f.close()
    fs.fsync_dir(directory)


def finish_truncate(directory: str, fs: FileSystem = OS_FS) -> None:
    """Complete a ``truncate_after`` that a crash interrupted, if any."""
    marker = os.path.join(directory, TRUNCATE_MARKER)
    if not fs.exists(marker):
        return
    with open(marker, "rb") as fh:
        text = fh.read().decode("ascii", "replace").strip()
    if not text:
        # Written by a walkv that did not rename it into place: its content never
        # landed, so the cut (which follows the marker's fsync) never began.
        fs.unlink(marker)
        fs.fsync_dir(directory)
        return
    if not text.isdigit():
        raise CorruptionError(f"unreadable {TRUNCATE_MARKER} marker {text!r}", path=marker, offset=0,
                              hint="delete the marker if no truncate_after was running")
    cut_after(directory, int(text), fs)
    fs.unlink(marker)
    fs.fsync_dir(directory)


class LogTruncation:
    """The truncations of :class:`wal.Log` (a base class of it), crash-safe
    as the module docstring says."""

    directory: str
    _fs: FileSystem
    _durable: tuple[int, int]
    _sealed: list[SegmentFile]
    _indexes: dict[int, SparseIndex]
    _first_lsn: int
    _active: ActiveSegment
    _durable_marker: DurableMarker
    _gc: GroupCommit

    def _refuse(self) -> None:
        raise NotImplementedError  # Log's

    def _publish_durable(self) -> None:
        raise NotImplementedError  # Log's

    def _open_state(self, recovery: str) -> None:
        raise NotImplementedError  # Log's

    def truncate_before(self, lsn: int) -> int:
        """Delete whole segments all of whose LSNs are below ``lsn`` (never the
        active one); return the bytes freed. Oldest first, index before
        segment, then a directory fsync: a crash leaves a gap-free suffix."""
        with self._gc.mutex:
            self._refuse()
            segments = self._sealed + [self._active.file]
            doomed = [seg for seg, nxt in itertools.pairwise(segments) if nxt.first_lsn <= lsn]
            if not doomed:
                return 0
            self._sealed = self._sealed[len(doomed):]
            for seg in doomed:
                del self._indexes[seg.first_lsn]
            self._first_lsn = segments[len(doomed)].first_lsn
        return delete_segments(self.directory, doomed, self._fs)

    def truncate_after(self, lsn: int) -> None:
        """Drop every entry after ``lsn``; the next append gets ``lsn + 1``.
        Crash-safe: a ``TRUNCATE`` marker is made durable first, and an
        interrupted truncation is finished by the next open."""
        if lsn < self._first_lsn - 1 or lsn < 0:
            raise ValueError(f"cannot truncate after LSN {lsn}: the log starts at LSN {self._first_lsn}")
        with self._gc.exclusive(freeze=True):
            if lsn >= self._gc.next_lsn - 1:
                return
            try:
                if self._durable[0] > lsn:
                    # (The offset bounds reads of the active segment; those stop at ``lsn`` anyway.)
                    self._durable = (lsn, self._durable[1])
                    self._publish_durable()
                marker = os.path.join(self.directory, TRUNCATE_MARKER)
                self._fs.write_file(marker + ".tmp", str(lsn).encode())
                self._fs.rename(marker + ".tmp", marker)
                self._fs.fsync_dir(self.directory)
                self._active.close()
                self._durable_marker.close()
                cut_after(self.directory, lsn, self._fs)
                self._fs.unlink(marker)
                self._fs.fsync_dir(self.directory)
                self._open_state("strict")
            except OSError as e:
                raise self._gc.fail(e, lsn + 1) from e
            self._gc.renumber(lsn + 1)
