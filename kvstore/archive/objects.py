"""An archive's log objects: listing them, chaining them by LSN (along a
lineage of timelines), reading a piece's entries from a local segment and
building one.

Rules (see :mod:`kvstore.archive.layout`): a listing gives each object's LSN
range and timeline from its name alone; a chain starts at the lowest first
LSN and at each step takes the longest object starting where it stands (a
whole segment over the pieces it replaced); anything not on the chain is
redundant. Along a lineage (:func:`lineage_chain`) each LSN comes from the
objects of the timeline the lineage puts it on, an object of a timeline the
lineage leaves being cut (``last``) where it leaves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvstore.archive.layout import (
    ROOT_TIMELINE,
    WAL_DIR,
    LogObject,
    TimelineId,
    log_dir,
    log_object_name,
    parse_log_object_name,
    parse_timeline_name,
)
from kvstore.archive.target import ArchiveTarget
from wal.errors import CorruptionError, Damage, LogGapError, RecordTooLargeError
from wal.fs import OS_FS, FileInfo
from wal.record import DEFAULT_MAX_RECORD_BYTES, frame_into
from wal.segment import Entry, SegmentScan, encode_header, pack_entry_header
from wal.timeline import ROOT, History


def list_log_objects(target: ArchiveTarget, timelines: Iterable[TimelineId] | None = None, *,
                     listed: list[FileInfo] | None = None) -> list[LogObject]:
    """The log objects (by name) of ``timelines`` (None: of every timeline
    with a directory in ``wal/``), by first LSN then longest first. Other
    names are ignored; paths are built from the parsed numbers. ``listed``:
    the listing of ``wal/`` when the caller has it."""
    if timelines is None:
        listed = target.list(WAL_DIR) if listed is None else listed
        found = (parse_timeline_name(i.name) for i in listed if i.is_dir)
        tids = [ROOT_TIMELINE, *sorted(t for t in found if t is not None)]
    else:
        tids = sorted(set(timelines))
    out = []
    for tid in tids:
        where = log_dir(tid)
        infos = listed if tid == ROOT_TIMELINE and listed is not None else target.list(*where)
        for info in infos:
            rng = parse_log_object_name(info.name)
            if rng is None or info.is_dir:
                continue
            first, last = rng
            out.append(LogObject(first, last, target.path(*where, log_object_name(first, last)), info.size, tid))
    out.sort(key=lambda o: (o.first, -o.last, o.timeline))
    return out


class Chain(NamedTuple):
    """Objects covering ``first..last`` with no LSN missing, oldest first;
    ``gap_after`` is the object after which LSNs are missing (and
    ``next_first`` where objects resume), when objects lie beyond a gap."""

    objects: list[LogObject]
    gap_after: LogObject | None = None
    next_first: int | None = None

    @property
    def first(self) -> int:
        return self.objects[0].first if self.objects else 0

    @property
    def last(self) -> int:
        return self.objects[-1].last if self.objects else 0


def chain(objects: list[LogObject], start: int | None = None) -> Chain:
    """The chain of ``objects`` (sorted as :func:`list_log_objects` returns
    them) from ``start`` (default: the lowest first LSN)."""
    if not objects:
        return Chain([])
    by_first: dict[int, LogObject] = {}
    for o in objects:
        if o.first not in by_first or o.last > by_first[o.first].last:
            by_first[o.first] = o
    n = objects[0].first if start is None else start
    out: list[LogObject] = []
    while n in by_first:
        o = by_first[n]
        out.append(o)
        n = o.last + 1
    later = [o.first for o in objects if o.first > n]
    if later:
        return Chain(out, out[-1] if out else None, min(later))
    return Chain(out)


def lineage_chain(objects: list[LogObject], lineage: History) -> Chain:
    """The chain of ``objects`` along ``lineage`` (module docstring): each
    timeline's objects within the LSNs the lineage puts on it, the last one
    of a timeline it leaves cut where it leaves it. An object of a timeline
    starting before that timeline begins is not its own (verify names it)."""
    spans = {TimelineId.of(s): (s.first_lsn, nxt.first_lsn - 1 if nxt is not None else None)
             for s, nxt in zip(lineage, [*lineage[1:], None])}
    on = []
    for o in objects:
        span = spans.get(o.timeline)
        if span is None or o.first < span[0] or (span[1] is not None and o.first > span[1]):
            continue
        on.append(o if span[1] is None or o.last <= span[1] else o._replace(last=span[1]))
    on.sort(key=lambda o: (o.first, -o.last))
    return chain(on)


def encode_segment(store_id: str, first_lsn: int, entries: Iterable[Entry], *,
                   max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, history: History = ROOT) -> tuple[bytes, int]:
    """A segment file holding ``entries`` (consecutive from ``first_lsn``),
    and its last LSN: the bytes of a tail piece. Its header states
    ``max_record_bytes`` (a piece of a segment states that segment's limit)
    and ``history`` (the timelines up to the one its entries are on); an
    entry over the limit raises :class:`~wal.errors.RecordTooLargeError`.
    Framed in memory and joined once (the group commit's way)."""
    parts: list[bytes | memoryview] = []
    offset = frame_into(parts, encode_header(store_id, first_lsn, max_record_bytes, history), 0)
    last = first_lsn - 1
    pack = pack_entry_header
    for lsn, ts, payload in entries:
        record = pack(lsn, ts) + payload
        if len(record) > max_record_bytes:
            raise RecordTooLargeError(f"log entry {lsn} is a record of {len(record)} bytes, over the limit of "
                                      f"{max_record_bytes} bytes of the segment it would go to")
        offset = frame_into(parts, record, offset)
        last = lsn
    return b"".join(parts), last


class Piece(NamedTuple):
    """Entries read for a tail piece: ``end`` is the offset just after the
    last one's record in its segment (where the next piece starts reading),
    ``max_record_bytes`` the segment's record limit (the piece states it),
    ``history`` the timeline history its header states."""

    entries: list[Entry]
    end: int
    max_record_bytes: int
    history: History = ROOT


def read_piece(path: str, first: int, limit: int, start: int, max_bytes: int) -> Piece:
    """Entries ``first..limit`` of the local segment at ``path`` (durable:
    the caller bounds ``limit``), at most ``max_bytes`` of payload but at
    least one, read from record offset ``start`` (0, an index point, or
    where the previous piece ended)."""
    entries: list[Entry] = []
    size = 0
    try:
        fh = OS_FS.open_input(path)
    except FileNotFoundError:
        raise LogGapError(f"segment {path} was deleted before LSN {first} was archived",
                          first_missing=first, last_missing=limit) from None
    with fh:
        scan = SegmentScan(fh, path, start)
        for offset, e in scan.entries(first, limit):
            if not entries and e.lsn != first:
                raise CorruptionError(f"LSN {e.lsn} where LSN {first} should be; not archived",
                                      kind=Damage.SEQUENCE, path=path, offset=offset, lsn=first)
            entries.append(e)
            size += len(e.payload)
            if size >= max_bytes:
                break
    if not entries:
        raise CorruptionError(f"segment {path} has no entry {first} although it is durable; not archived",
                              kind=Damage.SEQUENCE, path=path, offset=scan.data_end, lsn=first)
    if scan.header is None:
        return Piece(entries, scan.data_end, DEFAULT_MAX_RECORD_BYTES)
    return Piece(entries, scan.data_end, scan.header.max_record_bytes, scan.header.history)
