"""A store's log as the Spark source plans and reads it, without LMDB.

The Spark data source (:mod:`kvstore.spark`) reads a store straight from its
files, on the driver (planning) and on executors (reading), so that the same
code reads a local disk, HDFS or S3 as the cluster sees them. Files are
found and decoded by the readers of the ``wal`` package through the
read-only file seam (:mod:`wal.readfs`), at the paths
:class:`kvstore.layout.StoreLayout` gives; nothing here holds a lock or
writes, so it is safe next to a live writer. What is Spark's own:

* Only LSNs up to the durable LSN (``wal/DURABLE``) are read. Past it, the
  active segment may hold a record still being written; a read stops as
  soon as it has the last LSN it wants and never parses further bytes.
* The log is cut into :class:`LogSlice`\\ s, one input partition each: one per
  segment, large segments split at sparse-index points (the active one, up
  to the durable LSN, at points probed from block boundaries).
* Every planned segment's header must name the store id of the newest
  segment (the log's): a segment of another store is
  :class:`~wal.errors.CorruptionError`, never read as this store's. (The
  snapshot a read starts from is checked the same way:
  :mod:`kvstore.spark.snapshots`.)
* A segment holds LSNs from its name's first LSN up to the next segment's
  first LSN minus one (the newest: up to the durable LSN). A read that finds
  fewer entries (a segment deleted by retention or cut short) fails with
  :class:`~wal.errors.LogGapError` or :class:`~wal.errors.CorruptionError`
  naming the missing LSNs: never a silent gap.

A :class:`StoreFiles` pickles as the store's location (a local path or a
URI such as ``file:///data/store``, ``hdfs://nn/store``, ``s3://bucket/store``)
and resolves its file system again where it is unpickled (on an executor).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import wal
from kvstore.layout import WAL_DIR, StoreLayout
from wal.errors import CorruptionError, Damage, LogGapError, WalkvError
from wal.record import BLOCK_SIZE
from wal.segment import SegmentScan, read_newest_header
from wal.timeline import ROOT, History

_REREAD_HINT = "the segment was cut or replaced while being read; rerun, and run `walkv verify STORE` if it persists"


def normalize_location(path: str) -> str:
    """A store location every process resolves the same way: a URI stays as
    it is (minus a trailing slash), a local path becomes absolute."""
    if not isinstance(path, str) or not path:
        raise ValueError("the store path must be a non-empty string (a local path or a URI)")
    if "://" in path:
        return path.rstrip("/") if not path.endswith(":///") else path
    return os.path.abspath(os.path.expanduser(path))


@dataclass(frozen=True)
class LogSlice:
    """A contiguous run of LSNs inside one segment: the unit of one input
    partition. Reading starts at ``start_offset`` (0, or a sparse-index point
    at or before ``from_lsn``) and yields exactly ``from_lsn .. to_lsn``."""

    path: str
    start_offset: int
    from_lsn: int
    to_lsn: int
    approx_bytes: int = 0

    @property
    def count(self) -> int:
        return self.to_lsn - self.from_lsn + 1


class StoreFiles:
    """A store as the Spark source reads it: its location and, resolved from
    it when first used, its :class:`~kvstore.layout.StoreLayout`. Pickles as
    the location only."""

    def __init__(self, location: str) -> None:
        self.location = normalize_location(location)
        self._layout: StoreLayout | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.location = state["location"]
        self._layout = None

    def __repr__(self) -> str:
        return f"StoreFiles({self.display()!r})"

    @property
    def layout(self) -> StoreLayout:
        if self._layout is None:
            self._layout = StoreLayout.of(self.location)
        return self._layout

    def display(self, path: str | None = None) -> str:
        """``path`` (default: the store) as the user named it, for messages
        (a URI keeps its scheme, credentials redacted)."""
        return self.layout.display(path)

    def check_store(self) -> None:
        """Fail clearly when the location is not a walkv store."""
        layout = self.layout
        try:
            entries = layout.fs.list_dir(layout.root)
        except OSError as exc:
            raise WalkvError(f"cannot list {self.display()}: {exc}") from exc
        if not any(e.name == WAL_DIR and e.is_dir for e in entries):
            raise ValueError(
                f"{self.display()} is not a walkv store (no {WAL_DIR}/ directory); "
                "give the directory passed to kvstore.open()"
            )

    # -- the log ---------------------------------------------------------------

    def durable_lsn(self) -> int:
        """The durable LSN the writer published in ``wal/DURABLE`` (0 when the
        log has never been written)."""
        layout = self.layout
        lsn = wal.read_durable_lsn(layout.wal_dir, layout.fs)
        if lsn is not None:
            return lsn
        if not wal.list_segments(layout.wal_dir, layout.fs):
            return 0
        raise CorruptionError(
            "the log has no readable DURABLE file, so a reader cannot tell which entries are durable",
            kind=Damage.MISSING, path=self.display(layout.fs.join(layout.wal_dir, wal.DURABLE_NAME)), offset=0,
            hint="open the store once with kvstore.open() (or `walkv verify STORE`) to publish it",
        )

    def store_id(self) -> str | None:
        """The store id from the newest segment's header (``None`` for a log
        with no segment yet)."""
        return wal.read_store_id(self.layout.wal_dir, self.layout.fs)

    def history(self) -> History:
        """The log's timeline history (:mod:`wal.timeline`), as its newest
        segment states it (:data:`~wal.timeline.ROOT` while it has none)."""
        header = read_newest_header(self.layout.wal_dir, self.layout.fs)
        return ROOT if header is None else header.history

    def segments(self, durable: int) -> list[wal.SegmentFile]:
        """The segments holding LSNs ``<= durable``, oldest first; segments
        past the durable LSN (just rolled) are left out."""
        return [s for s in wal.list_segments(self.layout.wal_dir, self.layout.fs) if s.first_lsn <= durable]

    def first_held(self, durable: int) -> int:
        """The first LSN the log still holds (``durable + 1`` when it holds none)."""
        segs = self.segments(durable)
        return segs[0].first_lsn if segs else durable + 1

    def plan_log(self, from_lsn: int, to_lsn: int, durable: int, max_bytes: int,
                 min_pieces: int = 1, min_piece_bytes: int = BLOCK_SIZE) -> list[LogSlice]:
        """Slices covering exactly LSNs ``from_lsn .. to_lsn`` (inclusive; empty
        when ``to_lsn < from_lsn``): one per segment, segments larger than
        ``max_bytes`` split at sparse-index points into pieces of about
        ``max_bytes``, and smaller pieces still when that makes fewer than
        ``min_pieces`` (Kafka's ``minPartitions``), though none under about
        ``min_piece_bytes``. The active segment (it has no index file yet)
        and a sealed one whose index is missing are split at points found
        where they are needed (:meth:`_probe_points`).

        Raises :class:`~wal.errors.LogGapError` when the log no longer holds
        ``from_lsn``.
        """
        if to_lsn < from_lsn:
            return []
        if to_lsn > durable:
            raise ValueError(f"LSN {to_lsn} is past the durable LSN {durable} of {self.display()}")
        segs = self.segments(durable)
        first_held = segs[0].first_lsn if segs else durable + 1
        if from_lsn < first_held:
            raise self.gap_error(from_lsn, min(to_lsn, first_held - 1), first_held)
        i = bisect.bisect_right([s.first_lsn for s in segs], from_lsn) - 1
        planned = [k for k in range(i, len(segs)) if segs[k].first_lsn <= to_lsn]
        if min_pieces > 1 and planned:
            total = sum(segs[k].size for k in planned[:-1])
            newest = segs[planned[-1]]
            total += newest.size if planned[-1] + 1 < len(segs) else self._active_bytes(newest, durable)
            max_bytes = min(max_bytes, max(min_piece_bytes, -(-total // min_pieces)))
        slices: list[LogSlice] = []
        ours = self.store_id()
        for k in planned:
            seg = segs[k]
            self._check_segment_store(seg, ours)
            sealed = k + 1 < len(segs)
            seg_last = segs[k + 1].first_lsn - 1 if sealed else durable
            lo, hi = max(from_lsn, seg.first_lsn), min(to_lsn, seg_last)
            if hi >= lo:
                slices.extend(self._split_segment(seg, sealed, lo, hi, max_bytes))
        return slices

    def _check_segment_store(self, seg: wal.SegmentFile, ours: str | None) -> None:
        """A segment of another store (its header's id is not the log's) is damage."""
        fs = self.layout.fs
        try:
            with fs.open_input(seg.path) as f:
                theirs = wal.read_header(f, self.display(seg.path))[0].store_id
        except FileNotFoundError:
            return  # trimmed meanwhile: reading its slice reports the gap
        if ours is not None and theirs != ours:
            raise CorruptionError(
                f"segment belongs to another store ({theirs}; this log is {ours})", kind=Damage.HEADER,
                path=self.display(seg.path), offset=0, hint="run `walkv verify STORE`",
            )

    def _split_segment(self, seg: wal.SegmentFile, sealed: bool, lo: int, hi: int,
                       max_bytes: int) -> list[LogSlice]:
        if seg.size <= max_bytes:
            return [LogSlice(seg.path, 0, lo, hi, seg.size)]
        index = wal.read_index(seg.path, self.layout.fs) if sealed else None
        end_off, spacing = seg.size, max_bytes
        if index is not None and index.first_lsn == seg.first_lsn and index.points:
            points: list[tuple[int, int]] = [p for p in index.points if p[0] <= hi]
            end_off = index.data_end or seg.size
        else:
            points = self._probe_points(seg, lo, hi, max_bytes)
            spacing = 1  # probed about max_bytes apart already
        if not points:
            return [LogSlice(seg.path, 0, lo, hi, seg.size)]
        # The piece containing ``lo`` starts at the last point at or before it.
        j = bisect.bisect_right(points, (lo, 1 << 64)) - 1
        cuts = [(lo, 0 if j < 0 else points[j][1])]  # (first lsn, start offset) of each piece
        for lsn, off in points[j + 1 :]:
            if off - cuts[-1][1] >= spacing and lsn > cuts[-1][0]:
                cuts.append((lsn, off))
        out = []
        for k, (first, off) in enumerate(cuts):
            last = cuts[k + 1][0] - 1 if k + 1 < len(cuts) else hi
            nxt = cuts[k + 1][1] if k + 1 < len(cuts) else end_off
            out.append(LogSlice(seg.path, off, first, last, max(0, nxt - off)))
        return out

    def _probe_points(self, seg: wal.SegmentFile, lo: int, hi: int, step: int) -> list[tuple[int, int]]:
        """Points ``(lsn, record offset)`` of a segment without an index, about
        ``step`` bytes apart, of LSNs up to ``hi``: the first record that
        starts after each block boundary (a log reader resynchronises at any
        block boundary, :mod:`wal.record_reader`), one short read per point
        rather than a scan of the segment. A probe that finds no entry up to
        ``hi`` (the durable LSN: past it a record may be mid-write) or damage
        ends the probing; the last piece then reads on to ``hi``, checked
        as every piece is."""
        stride = -(-step // BLOCK_SIZE) * BLOCK_SIZE  # whole blocks, at least step
        points: list[tuple[int, int]] = []
        with self._open_probing(seg) as probe:
            for cut in range(stride, seg.size, stride):
                found = probe(cut, hi)
                if found is None:
                    break
                if found[0] < lo:
                    points = [found]  # the last point at or before lo, so far
                elif not points or found[0] > points[-1][0]:
                    points.append(found)
        return points

    def _active_bytes(self, seg: wal.SegmentFile, durable: int) -> int:
        """About how many bytes of the active segment hold LSNs up to
        ``durable`` (its file may be longer, preallocated): the block
        boundaries are bisected with probes."""
        first, last = 0, seg.size // BLOCK_SIZE
        with self._open_probing(seg) as probe:
            while first < last:
                mid = (first + last + 1) // 2
                if probe(mid * BLOCK_SIZE, durable) is not None:
                    first = mid
                else:
                    last = mid - 1
        return min(seg.size, (first + 1) * BLOCK_SIZE)

    @contextmanager
    def _open_probing(self, seg: wal.SegmentFile) -> Iterator[Callable[[int, int], tuple[int, int] | None]]:
        """A probe of ``seg``: ``probe(offset, hi)`` is ``(lsn, record
        offset)`` of the first entry that starts after block boundary
        ``offset``, or None when there is none up to LSN ``hi`` (nor when
        the bytes there are damaged, or the file is gone: reading the piece
        reports those)."""
        fs = self.layout.fs
        shown = self.display(seg.path)
        try:
            f = fs.open_input(seg.path)
        except OSError:
            yield lambda offset, hi: None
            return

        def probe(offset: int, hi: int) -> tuple[int, int] | None:
            try:
                found = next(iter(SegmentScan(f, shown, offset).entries(1, hi)), None)
            except CorruptionError:
                return None
            return None if found is None else (found[1].lsn, found[0])

        with f:
            yield probe

    def last_lsn_at(self, us: int, durable: int) -> int:
        """The last LSN committed at or before ``us`` (microseconds since the
        epoch), from the entries' commit times (which never decrease with the
        LSN): ``first_held - 1`` when the log's first entry is later. Reads the
        first entry of each segment, then one segment."""
        segs = self.segments(durable)
        first_held = segs[0].first_lsn if segs else durable + 1

        def first_ts(i: int) -> int:
            seg = segs[i]
            return next(iter(self.iter_slice(LogSlice(seg.path, 0, seg.first_lsn, seg.first_lsn)))).timestamp_us

        i = bisect.bisect_right(range(len(segs)), us, key=first_ts) - 1
        if i < 0:
            return first_held - 1
        last = segs[i + 1].first_lsn - 1 if i + 1 < len(segs) else durable
        found = segs[i].first_lsn
        for entry in self.iter_slice(LogSlice(segs[i].path, 0, segs[i].first_lsn, last)):
            if entry.timestamp_us > us:
                break
            found = entry.lsn
        return found

    def gap_error(self, first: int, last: int, first_held: int | None) -> LogGapError:
        """LSNs ``first .. last`` are gone from the log (retention deleted them)."""
        held = f"; the log now starts at LSN {first_held}" if first_held is not None else ""
        return LogGapError(
            f"LSNs {first}..{last} are no longer in the log of {self.display()} (retention deleted their "
            f"segments after a snapshot covered them){held}. Read table=snapshot and then the changes "
            f"after the snapshot's LSN, or restart the stream with a new checkpoint and startingLsn",
            first_missing=first,
            last_missing=last,
            first_available=first_held,
        )

    # -- reading (on executors) ------------------------------------------------

    def iter_slice(self, piece: LogSlice) -> Iterator[wal.Entry]:
        """The entries ``piece.from_lsn .. piece.to_lsn``, checked to be all
        there; stops right after ``to_lsn`` without reading further bytes
        (which may be a record still being written)."""
        fs = self.layout.fs
        shown = self.display(piece.path)
        try:
            f = fs.open_input(piece.path)
        except FileNotFoundError:
            raise self.gap_error(piece.from_lsn, piece.to_lsn, None) from None
        except OSError as exc:
            if self._missing(piece.path):
                raise self.gap_error(piece.from_lsn, piece.to_lsn, None) from None
            raise WalkvError(f"cannot open {shown}: {exc}") from exc
        expected = piece.from_lsn
        with f:
            for entry in wal.iter_entries(f, shown, piece.start_offset, piece.from_lsn, piece.to_lsn):
                if entry.lsn != expected:  # the slice started past from_lsn (a wrong index point)
                    raise CorruptionError(
                        f"expected LSN {expected}, found {entry.lsn}", kind=Damage.SEQUENCE, path=shown,
                        offset=piece.start_offset, lsn=entry.lsn, hint=_REREAD_HINT,
                    )
                yield entry
                expected += 1
                if expected > piece.to_lsn:
                    return
            ended = f.tell()
        raise CorruptionError(
            f"segment ends at LSN {expected - 1} but the log says it holds LSNs up to {piece.to_lsn}",
            kind=Damage.SEQUENCE, path=shown, offset=ended, lsn=expected, hint=_REREAD_HINT,
        )

    def _missing(self, path: str) -> bool:
        try:
            self.layout.fs.file_size(path)
        except FileNotFoundError:
            return True
        return False


__all__ = ["LogSlice", "StoreFiles", "normalize_location"]
