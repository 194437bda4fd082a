"""Carrying out a repair's :class:`~wal.repair_plan.RepairPlan` on the files
(:func:`apply`), and measuring what it takes out of the log
(:func:`dropped_bytes`).

Nothing is destroyed: every byte the log loses goes to a ``.broken`` file
next to the segments (``<segment>.broken``, or ``.broken-2``... when an
earlier repair's evidence is there), which ``walkv inspect`` reads.

The steps, in this order, so that a crash at any point leaves files from
which a second repair reaches the same log (and open refuses anything in
between as damage, naming the repair):

1. Each new segment (a rewritten one, or an empty one to write in) is
   written whole under a ``.tmp`` name and fsynced (open deletes ``.tmp``
   files).
2. A segment that a new one replaces under the same name is copied to its
   ``.broken`` file (fsynced, then renamed into place); its sparse index is
   deleted.
3. The new segments are renamed into place, replacing same-named ones in
   one step; the directory is fsynced. A new segment with a later first LSN
   than the one it replaces now overlaps it, and the later one wins
   (:mod:`wal.salvage`), so a second repair drops the old one.
4. Cuts: the bytes after the last kept entry are copied to ``.broken`` and
   zeroed (the newest segment) or truncated (a sealed one).
5. Dropped segments, and those replaced under another name, are renamed to
   ``.broken``: those after the repaired log newest first and those before
   it oldest first, so what is left is always one run of segments.
6. ``DURABLE`` says the repaired log's last LSN (every entry of it is
   durable), so that readers in other processes and restore read no
   further.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from wal.durable import DURABLE_NAME, encode_durable
from wal.fs import OS_FS, FileSystem
from wal.record import frame
from wal.record_reader import RecordReader
from wal.repair_plan import Filler, NewSegment, RepairPlan
from wal.salvage import LogScan, Run
from wal.segment import encode_header, index_path, pack_entry_header, segment_name
from wal.timeline import History, history_until
from wal.truncation import nonzero_end

_CHUNK = 1 << 20


def broken_name(path: str) -> str:
    """``<path>.broken``, or ``.broken-2``, ``-3``...: never over the evidence
    an earlier repair kept."""
    name, n = path + ".broken", 1
    while os.path.exists(name):
        n += 1
        name = f"{path}.broken-{n}"
    return name


def _entries(path: str, run: Run, limit: int) -> Iterator[bytes]:
    """The entry records' payloads of ``run``'s entries ``first..last``, one
    at a time (a run may be a whole segment)."""
    with open(path, "rb") as fh:
        reader = RecordReader(fh, path=path, start_offset=run.offset, zeros_end=True, max_record_bytes=limit)
        for _, payload in reader.records():
            lsn = int.from_bytes(payload[:8], "little")
            if lsn >= run.first:
                yield payload
            if lsn >= run.last:
                return


class _Writer:
    """Frames records into a new file, a chunk at a time."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.f = fs.open(path, create=True)
        self.f.truncate(0)
        self.offset = 0
        self.start = 0
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, payload: bytes) -> None:
        data, self.offset = frame(payload, self.offset)
        self.parts.append(data)
        self.size += len(data)
        if self.size >= _CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            self.f.pwrite(b"".join(self.parts), self.start)
            self.start, self.parts, self.size = self.offset, [], 0

    def close(self) -> None:
        try:
            self.flush()
            self.f.sync(full=True)
        finally:
            self.f.close()


def _write_segment(fs: FileSystem, path: str, scan: LogScan, new: NewSegment, store_id: str, filler: bytes,
                   history: History) -> None:
    w = _Writer(fs, path)
    try:
        w.add(encode_header(store_id, new.first, new.limit, history_until(history, new.first)))
        for item in new.items:
            if isinstance(item, Filler):
                for lsn in range(item.first, item.last + 1):
                    w.add(pack_entry_header(lsn, item.timestamp_us) + filler)
            else:
                for payload in _entries(scan.segments[item.segment].path, item, new.limit):
                    w.add(payload)
    finally:
        w.close()


def _copy(fs: FileSystem, src: str, start: int, end: int) -> str:
    """Copy ``src``'s bytes ``start..end`` durably to its ``.broken`` name."""
    dst = broken_name(src)
    out = fs.open(dst + ".tmp", create=True)
    try:
        out.truncate(0)
        with open(src, "rb") as fh:
            fh.seek(start)
            pos = 0
            while pos < end - start:
                data = fh.read(min(_CHUNK, end - start - pos))
                if not data:
                    break
                out.pwrite(data, pos)
                pos += len(data)
        out.sync(full=True)
    finally:
        out.close()
    fs.rename(dst + ".tmp", dst)
    return dst


def _unlink_index(fs: FileSystem, path: str) -> None:
    if os.path.exists(index_path(path)):
        fs.unlink(index_path(path))


def _cut_end(fs: FileSystem, path: str, offset: int) -> int:
    f = fs.open(path, readonly=True)
    try:
        return nonzero_end(f, offset, f.size())
    finally:
        f.close()


def dropped_bytes(scan: LogScan, plan: RepairPlan) -> int:
    """The bytes of the old segments that are not in the repaired log."""
    total = 0
    for i, offset in plan.cut:
        total += _cut_end(OS_FS, scan.segments[i].path, offset) - offset
    for i in plan.drop:
        total += os.path.getsize(scan.segments[i].path)
    for new in plan.new:
        if new.replaces is not None:
            path = scan.segments[new.replaces].path
            kept = sum(r.end - r.offset for r in new.items if isinstance(r, Run))
            total += max(0, _cut_end(OS_FS, path, 0) - scan.header_ends[new.replaces] - kept)
    return total


def apply(directory: str, scan: LogScan, plan: RepairPlan, fs: FileSystem, store_id: str, filler: bytes,
          history: History) -> list[str]:
    """Carry out ``plan`` (module docstring); ``filler`` is the payload of a
    filler entry, ``history`` the log's timeline history (each new segment's
    header states it as it was at the segment's first LSN). Returns the
    ``.broken`` files written."""
    segments = scan.segments
    broken: list[str] = []
    named = [(new, os.path.join(directory, segment_name(new.first))) for new in plan.new]
    for new, path in named:  # 1
        _write_segment(fs, path + ".tmp", scan, new, store_id, filler, history)
    moved = []  # replaced under another name: renamed to .broken in step 5
    for new, path in named:  # 2
        if new.replaces is None:
            continue
        old = segments[new.replaces].path
        if old == path:
            broken.append(_copy(fs, old, 0, _cut_end(fs, old, 0)))
        else:
            moved.append(new.replaces)
        _unlink_index(fs, old)
    fs.fsync_dir(directory)
    for _, path in named:  # 3
        fs.rename(path + ".tmp", path)
    fs.fsync_dir(directory)
    for i, offset in plan.cut:  # 4
        path = segments[i].path
        end = _cut_end(fs, path, offset)
        if end > offset:
            broken.append(_copy(fs, path, offset, end))
            f = fs.open(path)
            try:
                if i < len(segments) - 1:
                    f.truncate(offset)  # sealed: its file ends at its data
                else:
                    f.write_zeros(offset, end - offset)  # zeros read as the end of the data
                f.sync(full=True)
            finally:
                f.close()
        _unlink_index(fs, path)
    after = sorted((i for i in plan.drop if segments[i].first_lsn > plan.last), reverse=True)
    before = sorted([*(i for i in plan.drop if segments[i].first_lsn <= plan.last), *moved])
    for i in after + before:  # 5
        path = segments[i].path
        kept = broken_name(path)
        _unlink_index(fs, path)
        fs.rename(path, kept)
        broken.append(kept)
    fs.fsync_dir(directory)
    marker = os.path.join(directory, DURABLE_NAME)  # 6
    fs.write_file(marker + ".tmp", encode_durable(plan.last))
    fs.rename(marker + ".tmp", marker)
    fs.fsync_dir(directory)
    return broken

