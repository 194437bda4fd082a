"""Cutting a log's files: zeroing what follows a point in a segment, dropping
the entries after an LSN (``truncate_after``: :func:`mark_truncate`, then
:func:`finish_truncate`, also at open, and :func:`clear_truncate`) and deleting old
segments (``truncate_before``: :func:`delete_segments`, once
:meth:`wal.segments.SegmentSet.drop_before` took them out of the open log),
each safe against a crash at any step.

* A cut zeroes bytes rather than shortening the file: the active segment is
  preallocated, and zeros read as the end of the data, so no stale fragment
  past the cut can ever be read as a record.
* ``truncate_after`` first makes a ``TRUNCATE`` marker naming the LSN durable
  (temp file, fsync, rename, directory fsync); the next open finishes an
  interrupted cut, which is idempotent and reads nothing past that LSN (a
  power loss may have zeroed some of those sectors and not others). The
  marker also states the timeline history the log goes on on after the cut
  (a second line: the history as JSON, :mod:`wal.timeline`), and is removed
  only once the segment that begins it exists: a crash between the cut and
  that segment must not let the log go on writing the cut LSNs again on the
  old timeline.
* Old segments go oldest first, each index before its segment, then one
  directory fsync: a crash leaves a gap-free suffix and no orphan index.
"""

from __future__ import annotations

import json
import logging
import os

from wal.errors import CorruptionError
from wal.failures import file_error
from wal.fs import OS_FS, File, FileSystem
from wal.index import read_index
from wal.segment import SegmentFile, SegmentScan, index_path, list_segments, read_header
from wal.timeline import History, history_from_json, history_to_json

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
            f.write_zeros(cut, end - cut)
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
    marker naming ``lsn`` (:func:`mark_truncate`) and removes it only when
    this has returned (:func:`finish_truncate`)."""
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


def finish_truncate(directory: str, fs: FileSystem = OS_FS) -> History | None:
    """Complete a ``truncate_after`` that a crash interrupted, if any; return
    the timeline history the log must go on on (the caller begins its
    segment, then calls :func:`clear_truncate`), or None."""
    marker = os.path.join(directory, TRUNCATE_MARKER)
    if not fs.exists(marker):
        return None
    with open(marker, "rb") as fh:
        text = fh.read().decode("ascii", "replace").strip()
    if not text:
        # Written by a walkv that did not rename it into place: its content never
        # landed, so the cut (which follows the marker's fsync) never began.
        clear_truncate(directory, fs)
        return None
    first, _, rest = text.partition("\n")
    try:
        if not first.isdigit():
            raise ValueError(first)
        history = history_from_json(json.loads(rest), TRUNCATE_MARKER) if rest.strip() else None
    except ValueError:
        raise CorruptionError(f"unreadable {TRUNCATE_MARKER} marker {text[:200]!r}", path=marker, offset=0,
                              hint="delete the marker if no truncate_after was running") from None
    cut_after(directory, int(first), fs)
    if history is None:
        clear_truncate(directory, fs)
    return history


def mark_truncate(directory: str, lsn: int, fs: FileSystem = OS_FS, history: History | None = None) -> None:
    """Make a ``TRUNCATE`` marker naming ``lsn`` (and the timeline ``history``
    the log goes on on) durable (temp file, fsync, rename, directory fsync):
    from here on a crash leaves the cut to the next open
    (:func:`finish_truncate`). :func:`cut_after` then cuts."""
    marker = os.path.join(directory, TRUNCATE_MARKER)
    text = str(lsn) if history is None else f"{lsn}\n{json.dumps(history_to_json(history))}"
    fs.write_file(marker + ".tmp", text.encode())
    fs.rename(marker + ".tmp", marker)
    fs.fsync_dir(directory)


def clear_truncate(directory: str, fs: FileSystem = OS_FS) -> None:
    """Remove the ``TRUNCATE`` marker, durably: the cut (and the segment of
    the timeline it began) is done."""
    fs.unlink(os.path.join(directory, TRUNCATE_MARKER))
    fs.fsync_dir(directory)
