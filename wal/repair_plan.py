"""What :func:`wal.repair` makes of a damaged log (:func:`plan`): which LSNs
the repaired log holds, and what becomes of each segment file, from what
:func:`wal.salvage.scan_log` found. Nothing here touches a file.

The repaired log holds LSNs ``first..last``, consecutive and gap-free,
each one an intact entry of the old log or (salvage) a filler standing in
for a lost one. ``base`` is the LSN of the newest good snapshot (0: none):
every write up to it is in that snapshot, so

* damage at or below the base does not matter for the state: the log
  restarts after the last such damage (``first`` is the first intact LSN
  after it, never past ``base + 1``: the log must continue the snapshot).
  What it held before ``first`` is ``dropped`` (moved to ``.broken``
  files): the snapshot holds its writes. A log that ends before the base
  (an older repair cut it there) restarts at ``base + 1``, empty.
* damage after the base is cut at the first bad record, as a repair always
  did: ``last`` is the LSN before it. With ``salvage`` every intact entry
  after it is kept too, and each lost LSN in between gets a filler entry
  (an entry that changes nothing), because LSNs are never renumbered: each
  entry's LSN is inside its checksummed bytes, and watchers, replicas and
  the archive know entries by it. Fillers never stand at or below the base:
  a rebuild from an older snapshot would replay them in place of writes
  the state needs.

``lost`` names the LSNs after the base whose writes are gone (up to the
highest LSN the log is known to have held: its newest intact entry, or the
``DURABLE`` marker), ``filled`` those that got fillers.

Each segment file is kept as it is, cut in place (today's cut: the bytes
after its last kept entry go to a ``.broken`` file), dropped (renamed to
``.broken``), or rewritten: a new segment holding copies of its kept
entries and the fillers among them, named by its first LSN, the old file
kept as ``.broken``. A segment's LSNs are those from its name up to the
next segment's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from wal.salvage import LogScan, Run


class Filler(NamedTuple):
    """Filler entries for the lost LSNs ``first..last``, with the commit time
    of the last intact entry before them (the first after, when none is)."""

    first: int
    last: int
    timestamp_us: int


class NewSegment(NamedTuple):
    """A segment :func:`wal.repair` writes: LSNs from ``first`` on, the
    ``items`` in LSN order (runs clipped to the LSNs kept, and fillers; none:
    an empty segment to write the next entries in), records of at most
    ``limit`` bytes; it replaces ``segments[replaces]`` (``None``: none)."""

    first: int
    replaces: int | None
    items: list[Run | Filler]
    limit: int


@dataclass
class RepairPlan:
    """What :func:`plan` decided (module docstring). ``keep`` and ``drop``
    are segment indexes, ``cut`` ``(segment, offset)`` pairs, ``new`` the
    segments to write (an empty one after the kept ones too, when the
    newest segment goes and the last one left was sealed, or nothing is left)."""

    base: int
    first: int
    last: int
    keep: list[int] = field(default_factory=list)
    cut: list[tuple[int, int]] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)
    new: list[NewSegment] = field(default_factory=list)
    dropped: tuple[int, int] | None = None
    lost: list[tuple[int, int]] = field(default_factory=list)
    filled: list[tuple[int, int]] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.cut or self.drop or self.new)


def _ranges(lsns: list[int]) -> list[tuple[int, int]]:
    """Sorted LSNs as ``(first, last)`` ranges of consecutive ones."""
    out: list[tuple[int, int]] = []
    for lsn in lsns:
        if out and out[-1][1] == lsn - 1:
            out[-1] = (out[-1][0], lsn)
        else:
            out.append((lsn, lsn))
    return out


def _boundaries(scan: LogScan) -> list[tuple[int, int | None, bool]]:
    """For each gap between runs (and before the first, after the last):
    the last intact LSN before it, the first after (``None``: none), and
    whether anything is wrong there (a flaw, or LSNs missing)."""
    runs = scan.runs
    flawed = {f.next_run for f in scan.flaws}
    out = []
    for k in range(len(runs) + 1):
        a = runs[k - 1].last if k else scan.first_lsn - 1
        b = runs[k].first if k < len(runs) else None
        out.append((a, b, k in flawed or (b is not None and b != a + 1)))
    return out


def plan(scan: LogScan, base: int = 0, salvage: bool = False, durable: int | None = None) -> RepairPlan:
    """The repaired log and what becomes of each segment (module docstring).
    ``durable`` is the log's ``DURABLE`` marker (``None``: none), for
    naming the LSNs lost past the last intact entry."""
    bounds = _boundaries(scan)
    first = scan.first_lsn
    for a, b, bad in bounds:
        if bad and a < base:
            first = max(first, base + 1 if b is None else min(b, base + 1))
    if scan.last_lsn < base:
        first = max(first, base + 1)
    last = scan.last_lsn
    if not salvage:
        for a, b, bad in bounds:
            if bad and (b is None or b > first):
                last = a
                break
    last = max(last, first - 1)
    p = RepairPlan(base, first, last)
    if first > scan.first_lsn:
        p.dropped = (scan.first_lsn, first - 1)
    _segments(scan, p, salvage)
    high = max(scan.last_lsn, durable or 0)
    gone = [lsn for item in _fillers(p) for lsn in range(item.first, item.last + 1)]
    p.filled = _ranges(gone)
    p.lost = _ranges(gone + list(range(max(last, base) + 1, high + 1)))
    return p


def _fillers(p: RepairPlan) -> list[Filler]:
    return [item for seg in p.new for item in seg.items if isinstance(item, Filler)]


def _timestamp(runs: list[Run], lsn: int) -> int:
    """The commit time of the last intact entry before ``lsn`` (the first
    after it when there is none before)."""
    before = [r.last_us for r in runs if r.last < lsn]
    if before:
        return before[-1]
    return next((r.first_us for r in runs if r.first > lsn), 0)


def _items(scan: LogScan, i: int, lo: int, hi: int, salvage: bool) -> list[Run | Filler]:
    """Segment ``i``'s entries ``lo..hi``: its runs, clipped, and (salvage)
    fillers for the LSNs between them."""
    items: list[Run | Filler] = []
    at = lo
    for r in scan.runs:
        if r.segment != i or r.last < lo or r.first > hi:
            continue
        clipped = r._replace(first=max(r.first, lo), last=min(r.last, hi))
        if clipped.first > at and salvage:
            items.append(Filler(at, clipped.first - 1, _timestamp(scan.runs, at)))
        items.append(clipped)
        at = clipped.last + 1
    if at <= hi and salvage:
        items.append(Filler(at, hi, _timestamp(scan.runs, at)))
    return items


def _segments(scan: LogScan, p: RepairPlan, salvage: bool) -> None:
    """Decide each segment's fate (module docstring)."""
    segments = scan.segments
    n = len(segments)
    out: list[tuple[str, int]] = []  # what stays, in order: ("keep"|"cut"|"new", segment)
    for i, seg in enumerate(segments):
        top = segments[i + 1].first_lsn - 1 if i + 1 < n else None
        lo = max(p.first, seg.first_lsn)
        hi = p.last if top is None else min(p.last, top)
        header_end = scan.header_ends[i]
        runs = [r for r in scan.runs if r.segment == i]
        damaged = any(f.segment == i for f in scan.flaws) or i in scan.superseded
        header = scan.headers[i]
        readable = header is not None and header.store_id == scan.store_id
        if lo > hi:
            if readable and lo == seg.first_lsn == p.last + 1 and (damaged or not runs):
                # the log goes on here: keep the header, as the (empty) segment written next
                if damaged:
                    p.cut.append((i, header_end))
                else:
                    p.keep.append(i)
                out.append(("next", i))
            else:
                p.drop.append(i)
            continue
        head = runs[0] if runs else None
        if readable and head is not None and head.offset == header_end and head.first == lo == seg.first_lsn \
                and head.last == hi:
            if damaged or len(runs) > 1:
                p.cut.append((i, head.end))
                out.append(("cut", i))
            else:
                p.keep.append(i)
                out.append(("keep", i))
            continue
        items = _items(scan, i, lo, hi, salvage)
        p.new.append(NewSegment(lo, i, items, scan.limits[i]))
        out.append(("new", i))
    if not out or (out[-1][0] == "keep" and out[-1][1] != n - 1):
        # nothing is left, or the last segment left is sealed: an empty one to write in
        start = p.last + 1
        at = next((i for i in p.drop if segments[i].first_lsn == start), None)
        limit = scan.limits[out[-1][1]] if out else scan.limits[at if at is not None else 0] if n else 0
        if at is not None:
            p.drop.remove(at)
        p.new.append(NewSegment(start, at, [], limit))
