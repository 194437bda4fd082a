"""Reading an archive: its log as a chain of segments, its snapshots, a time
to an LSN, and a full check.

Everything is read through the read-only seam (:mod:`wal.readfs`) with the
``wal`` and ``snapshot`` readers, strictly: every CRC, every LSN, the store
id in every object's header. An archive object is read whole into memory
before it is scanned (one request, not one per 32 KiB block, on an object
store); objects are at most a segment, or a piece of at most
:data:`kvstore.archive.upload.PIECE_BYTES`.
"""

from __future__ import annotations

import bisect
import datetime
import io
import logging
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

import snapshot
from kvstore.archive.layout import (
    ARCHIVE_NAME,
    IDENTITY_HINT,
    LogObject,
    TimelineId,
    decode_identity,
    snapshots_dir,
)
from kvstore.archive.objects import Chain, lineage_chain, list_log_objects
from kvstore.archive.retention import archived_snapshots
from kvstore.archive.target import ArchiveTarget, Location
from kvstore.archive.timelines import ArchiveTimelines, TimelineChoice, parse_choice
from wal.errors import ArchiveError, CorruptionError, Damage, DamageReport, LogGapError, SnapshotError
from wal.fs import FileInfo, FileSystem
from wal.reader import entries_of
from wal.readfs import ReadFS
from wal.segment import Entry, EntryBatch, SegmentFile, SegmentScan, read_header
from wal.timeline import History, fork_point, timeline_at

log = logging.getLogger("walkv.archive")

ARCHIVE_HINT = ("the archive object is damaged: restore to an LSN before it (to_lsn), and archive the store "
                "again if its log still holds these LSNs")


class _ObjectFS:
    """The archive's seam for log objects: each opened whole into memory and
    its header checked (store id, first LSN as its name says)."""

    def __init__(self, target: ArchiveTarget, store_id: str, objects: dict[str, LogObject]) -> None:
        self.target = target
        self.store_id = store_id
        self.objects = objects

    def list_dir(self, path: str) -> list[FileInfo]:
        return self.target.fs.list_dir(path)

    def open_input(self, path: str) -> BinaryIO:
        if isinstance(self.target.fs, FileSystem) and os.path.islink(path):
            raise CorruptionError("archive object is a symlink, not a regular file (not followed)",
                                  kind=Damage.MISSING, path=self.display(path), offset=0, hint=ARCHIVE_HINT)
        data = self.target.fs.read_file(path)
        if data is None:
            raise FileNotFoundError(path)
        f = io.BytesIO(data)
        obj = self.objects.get(path)
        scan = SegmentScan(f, self.display(path))
        for _ in scan.entries(1, 0):  # decodes the header only
            pass
        if scan.header is None:
            raise CorruptionError("archive object has no segment header", kind=Damage.HEADER,
                                  path=self.display(path), offset=0, hint=ARCHIVE_HINT)
        if self.store_id and scan.header.store_id != self.store_id:
            raise CorruptionError(f"archive object belongs to store {scan.header.store_id}, not {self.store_id}",
                                  kind=Damage.HEADER, path=self.display(path), offset=0, hint=ARCHIVE_HINT)
        if obj is not None and scan.header.first_lsn != obj.first:
            raise CorruptionError(f"archive object's header says first LSN {scan.header.first_lsn}, its name "
                                  f"{obj.first}", kind=Damage.HEADER, path=self.display(path), offset=0,
                                  hint=ARCHIVE_HINT)
        if obj is not None and TimelineId.of(scan.header.timeline) != obj.timeline:
            raise CorruptionError(f"archive object's header puts its entries on {scan.header.timeline}, but it "
                                  f"lies among the objects of {obj.timeline}", kind=Damage.TIMELINE,
                                  path=self.display(path), offset=0, hint=ARCHIVE_HINT)
        f.seek(0)
        return f

    def read_file(self, path: str) -> bytes | None:
        return self.target.fs.read_file(path)

    def file_size(self, path: str) -> int:
        return self.target.fs.file_size(path)

    def join(self, base: str, *names: str) -> str:
        return self.target.fs.join(base, *names)

    def display(self, path: str) -> str:
        return self.target.display(path)


class ArchiveReader:
    """An archive opened for reading (any location :class:`ArchiveTarget` takes),
    along the lineage of one of its timelines: ``timeline`` (module
    :mod:`kvstore.archive.timelines`: None, the default, follows the latest).
    Every method but :meth:`log_objects` and :meth:`verify` (the whole
    archive) reads that lineage: each LSN from the objects of the timeline it
    puts there, never an object of another.

    A damaged ``ARCHIVE`` identity (or a missing one where log objects are)
    is :class:`CorruptionError`; with ``checking=True`` (for :meth:`verify`)
    it is :attr:`identity_damage` instead, the first problem verify reports,
    and the store id is read from the first log object's header ("" when
    none is readable: store ids are then not compared)."""

    def __init__(self, location: Location | ArchiveTarget, *, checking: bool = False,
                 timeline: TimelineChoice = None) -> None:
        self.target = location if isinstance(location, ArchiveTarget) else ArchiveTarget.open(location)
        self.choice = parse_choice(timeline)
        self.target.require_directory()
        self.identity_damage: DamageReport | None = None
        try:
            self.store_id = self._identity()
        except CorruptionError as e:
            if not checking:
                raise
            self.identity_damage = DamageReport.of(e)
            self.store_id = self._store_id_from_log()
        self.timelines = ArchiveTimelines(self.target, self.store_id)

    def _identity(self) -> str:
        shown = self.target.display(self.target.path(ARCHIVE_NAME))
        data = self.target.read(ARCHIVE_NAME)
        if data is not None:
            return decode_identity(data, shown)
        if not self.log_objects():
            raise ArchiveError(f"no walkv archive at {self.target.uri} (it has no {ARCHIVE_NAME} object)")
        raise CorruptionError("the archive identity is missing, yet the archive holds log objects",
                              kind=Damage.MISSING, path=shown, offset=0, hint=IDENTITY_HINT)

    def _store_id_from_log(self) -> str:
        for o in self.log_objects():
            try:
                with self.target.fs.open_input(o.path) as f:
                    return read_header(f, self.target.display(o.path))[0].store_id
            except (CorruptionError, OSError):
                continue
        return ""

    @property
    def uri(self) -> str:
        return self.target.uri

    @property
    def history(self) -> History:
        """The lineage this reader follows (:mod:`wal.timeline`): the chosen
        timeline's history, as its history object states it, looked up again
        at each call (the latest may change)."""
        return self.timelines.follow(self.choice)

    def log_objects(self) -> list[LogObject]:
        """Every log object of every timeline (by name), including those a
        whole segment replaced and those of other lineages."""
        return list_log_objects(self.target)

    def chain(self) -> Chain:
        """The followed lineage's chain of log objects (objects of a timeline
        the lineage leaves are cut where it leaves it: :func:`lineage_chain`)."""
        listed = self.timelines.listed()
        lineage = self.timelines.follow(self.choice, listed)
        objects = list_log_objects(self.target, [TimelineId.of(s) for s in lineage], listed=listed.infos)
        return lineage_chain(objects, lineage)

    def checked_chain(self, upto: int | None = None) -> Chain:
        """The chain, refusing (:class:`CorruptionError`) a gap at or before
        LSN ``upto`` (None: a gap anywhere); LSNs before a gap still read."""
        c = self.chain()
        if c.gap_after is not None and (upto is None or upto > c.last):
            raise CorruptionError(
                f"the archive's log is missing LSNs {c.last + 1}..{(c.next_first or 0) - 1} (no object holds them)",
                kind=Damage.MISSING, path=self.target.display(c.gap_after.path), offset=0, lsn=c.last + 1,
                hint=f"restore to LSN {c.last} or before (to_lsn), or archive the store again if its log still "
                     "holds the missing LSNs")
        return c

    def segments(self) -> list[SegmentFile]:
        """The chain as segment files: no overlap, no gap (a gap is
        :class:`CorruptionError`), from the first archived LSN to
        :attr:`last_lsn`; an object cut where the lineage leaves its timeline
        ends where the next one begins."""
        return [SegmentFile(o.first, o.path, o.size) for o in self.checked_chain().objects]

    @property
    def first_lsn(self) -> int:
        """The first LSN the archive's log holds (0: none)."""
        return self.chain().first

    @property
    def last_lsn(self) -> int:
        """The last LSN of the archive's contiguous log (0: none)."""
        return self.checked_chain().last

    def _fs(self, objects: list[LogObject]) -> ReadFS:
        return _ObjectFS(self.target, self.store_id, {o.path: o for o in objects})

    def read_entries(self, from_lsn: int | None = None, to_lsn: int | None = None) -> Iterator[Entry]:
        """Entries ``from_lsn..to_lsn`` (default: all) of the followed
        lineage, strictly checked; :class:`LogGapError` when ``from_lsn`` is
        before the archive's log, :class:`CorruptionError` when LSNs up to
        ``to_lsn`` are missing."""
        c = self.checked_chain(to_lsn)
        if not c.objects:
            return iter(())
        start = c.first if from_lsn is None else from_lsn
        if start < c.first:
            raise LogGapError(f"LSN {start} is not in the archive {self.uri}: its log starts at LSN {c.first}; "
                              "restore from a snapshot", first_missing=start, last_missing=c.first - 1,
                              first_available=c.first)
        last = c.last if to_lsn is None else min(to_lsn, c.last)
        if start > last:
            return iter(())
        return entries_of(self._batches(c.objects, start, last))

    def _batches(self, objects: list[LogObject], start: int, last: int) -> Iterator[EntryBatch]:
        """Entries ``start..last`` of the chain ``objects``, a block at a time:
        each object read up to its (chain) last LSN only, and each holding
        exactly the LSNs the chain takes from it."""
        fs = self._fs(objects)
        expected = start
        for o in objects:
            if o.last < expected:
                continue
            if o.first > last:
                break
            upto = min(o.last, last)
            shown = fs.display(o.path)
            with fs.open_input(o.path) as f:
                scan = SegmentScan(f, shown)
                for batch in scan.batches(expected, upto):
                    if batch.entries[0].lsn != expected:
                        raise CorruptionError(f"LSNs {expected}..{batch.entries[0].lsn - 1} are missing from the "
                                              "archive object", kind=Damage.SEQUENCE, path=shown,
                                              offset=batch.offsets[0], lsn=expected, hint=ARCHIVE_HINT)
                    yield batch
                    expected += len(batch.entries)
            if expected <= upto:
                raise CorruptionError(f"archive object ends at LSN {expected - 1}, its name says {o.last}",
                                      kind=Damage.SEQUENCE, path=shown, offset=scan.data_end, lsn=expected,
                                      hint=ARCHIVE_HINT)

    def snapshots(self) -> list[snapshot.Snapshot]:
        """The archive's committed snapshots on the followed lineage that
        open (manifest valid, chunks present), oldest first; a damaged one
        is left out with a warning."""
        lineage = self.history
        out = []
        for tid, lsn in sorted(archived_snapshots(self.target, [TimelineId.of(s) for s in lineage]),
                               key=lambda tl: tl[1]):
            if TimelineId.of(timeline_at(lineage, lsn)) != tid:
                continue  # on a timeline this lineage had left by then
            path = self.target.path(*snapshots_dir(tid), snapshot.snapshot_dir_name(lsn))
            try:
                out.append(snapshot.open(path, fs=self.target.fs))
            except (CorruptionError, SnapshotError) as e:
                log.warning("ignoring unusable archive snapshot %s: %s", self.target.display(path),
                            self.target.scrub(str(e)))
        return out

    def first_entry(self) -> Entry | None:
        """The first entry of the archive's log (None: it holds none); a gap
        after its first object does not matter here."""
        c = self.chain()
        return self._first_entry(c.objects[0]) if c.objects else None

    def _first_entry(self, o: LogObject) -> Entry | None:
        with self.target.fs.open_input(o.path) as f:  # ranged reads: the first block only
            for _, e in SegmentScan(f, self.target.display(o.path)).entries():
                return e
        return None

    def lsn_at_time(self, t: datetime.datetime | float | int) -> int:
        """The last LSN committed at or before ``t`` (a datetime, naive ones
        taken as UTC, or unix seconds), from the entries' commit timestamps;
        :class:`CorruptionError` when it may be in LSNs the archive is missing."""
        us = time_to_us(t)
        c = self.chain()
        if not c.objects:
            return 0
        objs = c.objects
        firsts: dict[int, int] = {}

        def first_ts(i: int) -> int:
            if i not in firsts:
                e = self._first_entry(objs[i])
                firsts[i] = e.timestamp_us if e is not None else 1 << 63
            return firsts[i]

        i = bisect.bisect_right(range(len(objs)), us, key=first_ts) - 1
        if i < 0:
            if c.first == 1:
                return 0
            raise LogGapError(f"the archive {self.uri} holds no entry committed at or before that time: its log "
                              f"starts at LSN {c.first}", first_missing=1, last_missing=c.first - 1,
                              first_available=c.first)
        found = objs[i].first
        for e in self.read_entries(objs[i].first, objs[i].last):
            if e.timestamp_us > us:
                break
            found = e.lsn
        if found == c.last:
            self.checked_chain(found + 1)  # the next LSN, missing, may be at or before t too
        return found

    def verify(self, progress: Callable[[int, int | None], None] | None = None) -> list[DamageReport]:
        """Check everything: the identity, every timeline's history object,
        every log object (header, store id, timeline, CRCs, exactly the LSNs
        its name says), the continuity of every timeline's lineage, every
        snapshot (manifest, chunks, checksums, store id). Returns the
        problems found (empty: all is well), each naming the object
        (``path``, as shown to people) and offset."""
        problems = [] if self.identity_damage is None else [self.identity_damage]
        listed = self.timelines.listed()
        lineages: dict[TimelineId, History] = {}
        for tid in sorted(listed.timelines):
            try:
                lineages[tid] = self.timelines.lineage(tid)
            except CorruptionError as e:
                problems.append(DamageReport.of(e))
        objects = list_log_objects(self.target, sorted(listed.timelines), listed=listed.infos)
        total = sum(o.size for o in objects)
        done = 0
        fs = self._fs(objects)
        for o in objects:
            problems += self._verify_object(fs, o, lineages.get(o.timeline))
            done += o.size
            if progress is not None:
                progress(done, total)
        for tid, lineage in lineages.items():
            c = lineage_chain(objects, lineage)
            if c.gap_after is not None:
                problems.append(DamageReport(self.target.display(c.gap_after.path), 0, c.last + 1, Damage.MISSING,
                                             f"LSNs {c.last + 1}..{(c.next_first or 0) - 1} of {tid}'s lineage are "
                                             "in no archive object"))
        for tid, lsn in sorted(archived_snapshots(self.target)):
            path = self.target.path(*snapshots_dir(tid), snapshot.snapshot_dir_name(lsn))
            shown = self.target.display(path)
            try:
                snap = snapshot.open(path, fs=self.target.fs)
                if snap.store_id not in (None, self.store_id) and self.store_id:
                    raise CorruptionError(f"snapshot belongs to store {snap.store_id}, not {self.store_id}",
                                          kind=Damage.HEADER, path=shown, offset=0)
                snap.verify()
            except CorruptionError as e:
                problems.append(DamageReport.of(e, shown))
            except SnapshotError as e:
                problems.append(DamageReport(shown, 0, lsn, Damage.CONTENT, self.target.scrub(str(e))))
        return problems

    def _verify_object(self, fs: ReadFS, o: LogObject, lineage: History | None) -> list[DamageReport]:
        """The problems of log object ``o`` (of a timeline whose lineage is
        ``lineage``; None: unknown, reported already)."""
        shown = self.target.display(o.path)
        try:
            with fs.open_input(o.path) as f:
                scan = SegmentScan(f, shown)
                expected = o.first
                for offset, e in scan.entries(o.first):
                    if e.lsn > o.last:
                        raise CorruptionError(f"object holds LSN {e.lsn}, past the {o.last} its name says",
                                              kind=Damage.SEQUENCE, path=shown, offset=offset, lsn=e.lsn)
                    expected = e.lsn + 1
                torn = scan.torn_tail()
                if torn is not None:
                    raise torn
                if expected != o.last + 1:
                    raise CorruptionError(f"object ends at LSN {expected - 1}, its name says {o.last} "
                                          "(truncated)", kind=Damage.SEQUENCE, path=shown,
                                          offset=scan.data_end, lsn=expected)
                header = scan.header
                if lineage is not None and header is not None and fork_point(header.history, o.first,
                                                                             lineage) is not None:
                    raise CorruptionError(f"object's header states another history than {o.timeline}'s lineage",
                                          kind=Damage.TIMELINE, path=shown, offset=0, lsn=o.first)
        except CorruptionError as e:
            return [DamageReport.of(e, shown)]
        except OSError as e:
            return [DamageReport(shown, 0, None, Damage.MISSING, self.target.scrub(str(e)))]
        return []


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def us_to_text(us: int) -> str:
    """A commit time (unix microseconds) as ISO 8601 UTC, to the microsecond
    (what ``walkv restore --to-time`` reads back)."""
    t = _EPOCH + datetime.timedelta(microseconds=us)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def time_to_us(t: datetime.datetime | float | int) -> int:
    if isinstance(t, datetime.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=datetime.timezone.utc)
        return (t - _EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"a time is a datetime or unix seconds, not {type(t).__name__}")
    return int(t * 1_000_000)
