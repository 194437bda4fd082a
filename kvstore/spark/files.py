"""A store's files as Spark sees them: through ``pyarrow.fs``, without LMDB.

The Spark data source (:mod:`kvstore.spark`) reads a store straight from its
files, on the driver (planning) and on executors (reading), so that the same
code reads a local disk, HDFS or S3 as the cluster sees them. This module is
that file layer. It imports neither pyspark nor LMDB, holds no lock and never
writes: it is safe to run next to a live writer.

A store, as laid out by :mod:`kvstore`::

    STORE/wal/         the log (segments, sparse indexes, DURABLE): wal.segment
    STORE/snapshots/   snap-{lsn:020d}/ directories: the snapshot package

What a reader may trust, and why:

* Only LSNs up to the durable LSN (``wal/DURABLE``) are read. Past it, the
  active segment may hold a record still being written; the reader stops as
  soon as it has the last LSN it wants and never parses further bytes.
* A segment holds LSNs from its name's first LSN up to the next segment's
  first LSN minus one (the newest: up to the durable LSN). A read that finds
  fewer entries than that (a segment deleted by retention or cut short) fails
  with :class:`LogGapError` naming the missing LSNs: never a silent gap.
* Framing, CRCs, headers and indexes are decoded by ``wal.record`` and
  ``wal.segment``; this module only finds files and hands them over.

Paths are plain local paths or URIs (``file:///data/store``,
``hdfs://nn/store``, ``s3://bucket/store``) resolved with
``pyarrow.fs.FileSystem.from_uri``. Objects here pickle as the URI only, and
resolve the file system again where they are unpickled (on an executor).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Any, Iterator

from snapshot.layout import parse_snapshot_dir_name
from wal.errors import CorruptionError, LogGapError, WalkvError
from wal.record import RecordReader
from wal.durable import DURABLE_NAME, decode_durable
from wal.segment import segment_first_lsn

WAL_DIR = "wal"
SNAPSHOTS_DIR = "snapshots"





def _pa_fs() -> Any:
    try:
        import pyarrow.fs as pafs
    except ImportError as exc:  # pragma: no cover - the spark extra brings pyarrow
        raise ImportError("walkv's Spark support needs pyarrow: pip install 'walkv[spark]'") from exc
    return pafs


def normalize_location(path: str) -> str:
    """A store location every process resolves the same way: a URI stays as
    it is (minus a trailing slash), a local path becomes absolute."""
    if not isinstance(path, str) or not path:
        raise ValueError("the store path must be a non-empty string (a local path or a URI)")
    if "://" in path:
        return path.rstrip("/") if not path.endswith(":///") else path
    return os.path.abspath(os.path.expanduser(path))


@dataclass(frozen=True)
class SegmentInfo:
    """One segment file: the LSNs it holds are ``first_lsn .. last_lsn``
    (``last_lsn`` is ``None`` for the newest segment, bounded by the durable LSN)."""

    first_lsn: int
    path: str
    size: int
    last_lsn: int | None


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
    """A store's files through ``pyarrow.fs``; pickles as its location."""

    def __init__(self, location: str) -> None:
        self.location = normalize_location(location)
        self._fs: Any = None
        self._root: str = ""

    # -- pickling: the URI travels, the file system is resolved again --------

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.location = state["location"]
        self._fs = None
        self._root = ""

    def __repr__(self) -> str:
        return f"StoreFiles({self.location!r})"

    def _resolve(self) -> None:
        pafs = _pa_fs()
        if "://" in self.location:
            try:
                self._fs, root = pafs.FileSystem.from_uri(self.location)
            except Exception as exc:  # pyarrow raises ArrowInvalid / OSError
                raise ValueError(f"cannot resolve store URI {self.location!r}: {exc}") from exc
        else:
            self._fs, root = pafs.LocalFileSystem(), self.location
        self._root = root.rstrip("/") or "/"

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._resolve()
        return self._fs

    @property
    def root(self) -> str:
        if self._fs is None:
            self._resolve()
        return self._root

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts]) if self.root != "/" else "/" + "/".join(parts)

    @property
    def wal_dir(self) -> str:
        return self.join(WAL_DIR)

    @property
    def snapshots_dir(self) -> str:
        return self.join(SNAPSHOTS_DIR)

    def display(self, path: str) -> str:
        """A path as the user gave the store (URI scheme kept), for messages."""
        if "://" in self.location and path.startswith(self.root):
            return self.location + path[len(self.root.rstrip("/")) :]
        return path

    # -- plain file access ---------------------------------------------------

    def open(self, path: str) -> Any:
        """A seekable binary file (pyarrow ``NativeFile``)."""
        return self.fs.open_input_file(path)

    def read_bytes(self, path: str) -> bytes | None:
        """A whole small file, or ``None`` when it does not exist."""
        try:
            with self.fs.open_input_file(path) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if not self.exists(path):
                return None
            raise WalkvError(f"cannot read {self.display(path)}: {exc}") from exc

    def exists(self, path: str) -> bool:
        pafs = _pa_fs()
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def listdir(self, path: str) -> list[tuple[str, str, int, bool]]:
        """``(name, path, size, is_dir)`` of a directory's entries; ``[]`` when
        the directory does not exist."""
        pafs = _pa_fs()
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except OSError as exc:
            raise WalkvError(f"cannot list {self.display(path)}: {exc}") from exc
        out = []
        for info in infos:
            out.append((info.base_name, info.path, info.size or 0, info.type == pafs.FileType.Directory))
        return out

    def check_store(self) -> None:
        """Fail clearly when the location is not a walkv store."""
        if not self.exists(self.wal_dir):
            raise ValueError(
                f"{self.location} is not a walkv store (no wal/ directory); "
                "give the directory passed to kvstore.open()"
            )

    # -- the log ---------------------------------------------------------------

    def durable_lsn(self) -> int:
        """The durable LSN the writer published in ``wal/DURABLE`` (0 when the
        log has never been written)."""
        lsn = None
        for _ in range(10):  # a read racing the writer's update fails its check: retry
            data = self.read_bytes(self.wal_dir + "/" + DURABLE_NAME)
            lsn = decode_durable(data) if data is not None else None
            if lsn is not None or data is None:
                break
        if lsn is None:
            if not self.list_segment_files():
                return 0
            raise CorruptionError(
                "the log has no readable DURABLE file, so a reader cannot tell which entries are durable",
                path=self.display(self.wal_dir + "/" + DURABLE_NAME),
                hint="open the store once with kvstore.open() (or `walkv verify STORE`) to publish it",
            )
        return lsn

    def list_segment_files(self) -> list[tuple[int, str, int]]:
        found = []
        for name, path, size, is_dir in self.listdir(self.wal_dir):
            first = segment_first_lsn(name)
            if first is not None and not is_dir:
                found.append((first, path, size))
        found.sort()
        return found

    def segments(self, durable: int) -> list[SegmentInfo]:
        """The segments holding LSNs ``<= durable``, oldest first, each with its
        LSN range; segments past the durable LSN (just rolled) are left out."""
        files = [f for f in self.list_segment_files() if f[0] <= durable]
        out = []
        for i, (first, path, size) in enumerate(files):
            last = files[i + 1][0] - 1 if i + 1 < len(files) else None
            out.append(SegmentInfo(first, path, size, last))
        return out

    def read_index(self, segment_path: str) -> Any:
        """The sparse index of a sealed segment (``wal.segment.SparseIndex``),
        or ``None`` when it is missing or damaged (then the segment is read
        from its start; the writer rebuilds the index)."""
        from wal import index as wseg

        path = wseg.index_path(segment_path)
        data = self.read_bytes(path)
        if data is None:
            return None
        import io

        try:
            records = list(RecordReader(io.BytesIO(data), path=path))
            if len(records) != 1:
                return None
            return wseg.decode_index(records[0], path)
        except CorruptionError:
            return None

    def store_id(self) -> str | None:
        """The store id from the newest segment's header (``None`` for a log
        with no segment yet)."""
        from wal import segment as wseg

        files = self.list_segment_files()
        if not files:
            return None
        _, path, _ = files[-1]
        try:
            with self.open(path) as f:
                header, _ = wseg.read_header(f, self.display(path))
        except FileNotFoundError:
            files = self.list_segment_files()
            if not files:
                return None
            with self.open(files[0][1]) as f:
                header, _ = wseg.read_header(f, self.display(files[0][1]))
        return header.store_id

    def plan_log(self, from_lsn: int, to_lsn: int, durable: int, max_bytes: int) -> list[LogSlice]:
        """Slices covering exactly LSNs ``from_lsn .. to_lsn`` (inclusive; empty
        when ``to_lsn < from_lsn``): one per segment, large sealed segments
        split at sparse-index points into pieces of about ``max_bytes``.

        Raises :class:`LogGapError` when the log no longer holds ``from_lsn``.
        """
        if to_lsn < from_lsn:
            return []
        if to_lsn > durable:
            raise ValueError(f"LSN {to_lsn} is past the durable LSN {durable} of {self.location}")
        segs = self.segments(durable)
        first_held = segs[0].first_lsn if segs else durable + 1
        if from_lsn < first_held:
            raise gap_error(self.location, from_lsn, min(to_lsn, first_held - 1), first_held)
        firsts = [s.first_lsn for s in segs]
        i = bisect.bisect_right(firsts, from_lsn) - 1
        slices: list[LogSlice] = []
        for seg in segs[i:]:
            if seg.first_lsn > to_lsn:
                break
            seg_last = seg.last_lsn if seg.last_lsn is not None else durable
            lo, hi = max(from_lsn, seg.first_lsn), min(to_lsn, seg_last)
            if hi < lo:
                continue
            slices.extend(self._split_segment(seg, lo, hi, max_bytes))
        return slices

    def _split_segment(self, seg: SegmentInfo, lo: int, hi: int, max_bytes: int) -> list[LogSlice]:
        index = self.read_index(seg.path) if seg.last_lsn is not None else None
        if index is None or not index.points:
            return [LogSlice(seg.path, 0, lo, hi, seg.size)]
        points = [p for p in index.points if p[0] <= hi]
        # The piece containing ``lo`` starts at the last point at or before it.
        j = bisect.bisect_right(points, (lo, 1 << 64)) - 1
        start_lsn, start_off = (lo, 0) if j < 0 else (lo, points[j][1])
        cuts: list[tuple[int, int]] = []  # (first lsn, start offset) of each piece
        cuts.append((start_lsn, start_off))
        for lsn, off in points[j + 1 :]:
            if lsn > hi:
                break
            if off - cuts[-1][1] >= max_bytes and lsn > cuts[-1][0]:
                cuts.append((lsn, off))
        end_off = index.data_end or seg.size
        out = []
        for k, (first, off) in enumerate(cuts):
            last = cuts[k + 1][0] - 1 if k + 1 < len(cuts) else hi
            nxt = cuts[k + 1][1] if k + 1 < len(cuts) else end_off
            out.append(LogSlice(seg.path, off, first, last, max(0, nxt - off)))
        return out

    # -- reading ---------------------------------------------------------------

    def iter_entries(self, piece: LogSlice) -> Iterator[Any]:
        """The entries ``piece.from_lsn .. piece.to_lsn`` (``wal.segment.Entry``),
        checked to be all there; stops right after ``to_lsn`` without reading
        further bytes (which may be a record still being written)."""
        from wal import segment as wseg

        expected = piece.from_lsn
        shown = self.display(piece.path)
        try:
            f = self.open(piece.path)
        except FileNotFoundError:
            raise gap_error(self.location, piece.from_lsn, piece.to_lsn, None) from None
        except OSError as exc:
            if not self.exists(piece.path):
                raise gap_error(self.location, piece.from_lsn, piece.to_lsn, None) from None
            raise WalkvError(f"cannot open {shown}: {exc}") from exc
        with f:
            if expected <= piece.to_lsn:
                for entry in wseg.iter_entries(f, shown, piece.start_offset, piece.from_lsn, piece.to_lsn):
                    if entry.lsn != expected:  # pragma: no cover - iter_entries checks order
                        raise CorruptionError(
                            f"expected LSN {expected}, found {entry.lsn}", path=shown, lsn=entry.lsn,
                            hint="run `walkv verify STORE`",
                        )
                    yield entry
                    expected += 1
                    if expected > piece.to_lsn:
                        return
        if expected <= piece.to_lsn:
            raise CorruptionError(
                f"segment ends at LSN {expected - 1} but the log says it holds LSNs up to {piece.to_lsn}",
                path=shown, lsn=expected,
                hint="the segment was cut or replaced while being read; rerun, and run `walkv verify STORE` if it persists",
            )

    # -- snapshots -------------------------------------------------------------

    def snapshot_dirs(self) -> list[tuple[int, str]]:
        """``(lsn, path)`` of every ``snap-*`` directory, oldest first (valid
        or not: :func:`kvstore.spark.snapshots` checks manifests)."""
        out = []
        for name, path, _, is_dir in self.listdir(self.snapshots_dir):
            lsn = parse_snapshot_dir_name(name)
            if lsn is not None and is_dir:
                out.append((lsn, path))
        out.sort()
        return out


def gap_error(location: str, first: int, last: int, first_held: int | None) -> LogGapError:
    held = f"; the log now starts at LSN {first_held}" if first_held is not None else ""
    return LogGapError(
        f"LSNs {first}..{last} are no longer in the log of {location} (retention deleted their "
        f"segments after a snapshot covered them){held}. Read table=snapshot and then the changes "
        f"after the snapshot's LSN, or restart the stream with a new checkpoint and startingLsn",
        first_missing=first,
        last_missing=last,
    )




__all__ = ["LogGapError", "LogSlice", "SegmentInfo", "StoreFiles", "gap_error", "normalize_location"]
