"""Archive retention: which snapshots and log objects an archive keeps.

Snapshots. One is kept when it is among the newest ``keep_snapshots`` or
younger than ``keep_seconds`` (either rule keeps it; the newest is always
kept), "newest" by when it was taken (along one timeline, the LSN order).
Every snapshot taken before the oldest kept one goes, oldest first: each
one's MANIFEST first (it stops being a snapshot at once), then its chunks.

Log objects, lineage by lineage (a timeline's lineage: the timelines that
lead to it, :mod:`wal.timeline`):

* a lineage on which a kept snapshot lies keeps the objects it reads after
  the oldest such snapshot, so that every kept snapshot can be restored and
  rolled forward, along each lineage it lies on, to any later LSN archived
  there; and from the first part of a staged group that such a snapshot
  splits (``reads_from``: :func:`kvstore.entry.groups.group_start`), so that a
  reader of the log after the snapshot (Spark, a watcher) reads the group
  back from its parts, as the store's own retention keeps them;
* the latest lineage (the highest timeline number) keeps everything it reads
  when no kept snapshot lies on it (what it wrote since its fork is newer
  than every snapshot), and always its last object: how far the archive
  reaches, so that an archiver resuming never ships again;
* an object one lineage keeps makes every lineage that reads it keep what it
  reads after it too, so that what is left of each lineage is one
  contiguous run (an island before a gap would read as damage);
* everything else goes: objects the kept snapshots cover, and an old branch
  (the timeline a fork left, a deposed writer's) on which no kept snapshot
  lies, a restore target older than what retention keeps.

History objects are never deleted: a few hundred bytes each, and what
fences an older writer's archiver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import snapshot
from kvstore.archive.layout import (
    ROOT_TIMELINE,
    SNAPSHOTS_DIR,
    LogObject,
    TimelineId,
    log_dir,
    log_object_name,
    parse_timeline_name,
    snapshots_dir,
)
from kvstore.archive.objects import lineage_chain, list_log_objects
from kvstore.archive.target import ArchiveTarget
from kvstore.archive.timelines import ArchiveTimelines
from snapshot.layout import MANIFEST_NAME
from wal.errors import CorruptionError, SnapshotError
from wal.timeline import timeline_at

log = logging.getLogger("walkv.archive")

ReadsFrom = Callable[[TimelineId, int], int]
"""``reads_from(timeline, lsn)``: the first LSN a reader of the log after the
snapshot at ``lsn`` on ``timeline`` needs (``lsn + 1``, or the first part of
a staged group the snapshot splits)."""


def archived_snapshots(target: ArchiveTarget, timelines: Iterable[TimelineId] | None = None, *,
                       committed_only: bool = True) -> set[tuple[TimelineId, int]]:
    """``(timeline, LSN)`` of the archive's snapshot directories on
    ``timelines`` (None: every one; with a MANIFEST, by default)."""
    if timelines is None:
        found = (parse_timeline_name(i.name) for i in target.list(SNAPSHOTS_DIR) if i.is_dir)
        timelines = [ROOT_TIMELINE, *(t for t in found if t is not None)]
    out = set()
    for tid in timelines:
        where = snapshots_dir(tid)
        for info in target.list(*where):
            lsn = snapshot.parse_snapshot_dir_name(info.name)
            if lsn is None or not info.is_dir:
                continue
            if committed_only and not any(i.name == MANIFEST_NAME for i in target.list(*where, info.name)):
                continue
            out.add((tid, lsn))
    return out


def apply_retention(target: ArchiveTarget, store_id: str, keep_snapshots: int | None,
                    keep_seconds: float | None, reads_from: ReadsFrom | None = None) -> list[str]:
    """Delete what the rules above do not keep; return the deleted names.
    ``reads_from`` (None: the LSN after each snapshot) says where a reader
    after a kept snapshot starts."""
    snaps = []
    for tid, lsn in archived_snapshots(target):
        path = target.path(*snapshots_dir(tid), snapshot.snapshot_dir_name(lsn))
        try:
            snaps.append((tid, snapshot.open(path, fs=target.fs)))
        except (CorruptionError, SnapshotError) as e:
            log.warning("archive snapshot %s is unusable (%s)", target.display(path), target.scrub(str(e)))
    if not snaps:
        return []
    snaps.sort(key=lambda ts: (ts[1].created_us, ts[1].lsn))
    now_us = time.time() * 1e6
    kept = []
    for i, (tid, s) in enumerate(snaps):
        newest_n = keep_snapshots is not None and i >= len(snaps) - keep_snapshots
        young = keep_seconds is not None and now_us - s.created_us <= keep_seconds * 1e6
        if newest_n or young or i == len(snaps) - 1:
            kept.append((tid, s.lsn))
    older = [(tid, s.lsn) for tid, s in snaps[: next(i for i, (t, s) in enumerate(snaps) if (t, s.lsn) in kept)]]
    usable = {(tid, s.lsn) for tid, s in snaps}
    floor = min(lsn for _, lsn in kept)  # a snapshot half uploaded or unusable below it goes too
    older += [tl for tl in archived_snapshots(target, committed_only=False) if tl not in usable and tl[1] < floor]
    deleted: list[str] = []
    for tid, lsn in sorted(older, key=lambda tl: tl[1]):
        where = (*snapshots_dir(tid), snapshot.snapshot_dir_name(lsn))
        files = [i.name for i in target.list(*where) if not i.is_dir]
        for f in sorted(files, key=lambda n: n != MANIFEST_NAME):  # MANIFEST first
            if snapshot.layout.check_chunk_name(f) is None or f == MANIFEST_NAME:
                target.delete(*where, f)
        deleted.append("/".join(where))
        log.info("archive retention: deleted snapshot at LSN %d (%s) from %s", lsn, tid, target.uri)
    return deleted + _delete_log_objects(target, store_id, kept, reads_from or _next_lsn)


def _next_lsn(timeline: TimelineId, lsn: int) -> int:
    return lsn + 1


def _delete_log_objects(target: ArchiveTarget, store_id: str, kept: list[tuple[TimelineId, int]],
                        reads_from: ReadsFrom) -> list[str]:
    """Delete the log objects no lineage keeps (module docstring). A timeline
    whose lineage is unknown (its history object is missing or damaged)
    keeps all its objects. ``kept``: each kept snapshot's timeline and LSN;
    ``reads_from`` is asked about the oldest one on each lineage only (a
    group that a later snapshot splits and that starts before the oldest
    one splits the oldest one too)."""
    timelines = ArchiveTimelines(target, store_id)
    listed = timelines.listed()
    lineages: dict[TimelineId, dict[TimelineId, tuple[int, int | None]]] = {}  # each one's spans
    bound: dict[TimelineId, int | None] = {}  # each lineage keeps what it reads from this LSN on
    unknown = set()
    top = max(t.timeline for t in listed.timelines)
    for tid in listed.timelines:
        try:
            lineage = timelines.lineage(tid)
        except CorruptionError as e:
            log.warning("archive retention keeps every object of %s: %s", tid, target.scrub(str(e)))
            unknown.add(tid)
            continue
        lineages[tid] = {TimelineId.of(s): (s.first_lsn, None if nxt is None else nxt.first_lsn - 1)
                         for s, nxt in zip(lineage, [*lineage[1:], None])}
        oldest = min(((t, lsn) for t, lsn in kept if TimelineId.of(timeline_at(lineage, lsn)) == t),
                     key=lambda tl: tl[1], default=None)  # the oldest kept snapshot on this lineage
        bound[tid] = reads_from(*oldest) if oldest else 1 if tid.timeline == top else None

    def read_to(tid: TimelineId, o: LogObject) -> int | None:
        """The last LSN lineage ``tid`` reads of ``o`` (None: none)."""
        span = lineages[tid].get(o.timeline)
        if span is None or o.first < span[0] or (span[1] is not None and o.first > span[1]):
            return None
        return o.last if span[1] is None else min(o.last, span[1])

    objects = list_log_objects(target, sorted(listed.timelines), listed=listed.infos)
    keep = {o for o in objects if o.timeline in unknown}
    for tid in lineages:
        if tid.timeline == top:  # the end of the current history: where an archiver resumes
            keep.update(lineage_chain(objects, timelines.lineage(tid)).objects[-1:])
    keep = {o for o in objects if any(o.path == k.path for k in keep)}  # the chain's may be cut: the listed one
    changed = True
    while changed:  # an object one lineage keeps makes every lineage that reads it keep what follows it there
        changed = False
        for o in objects:
            if o not in keep and any(b is not None and (read_to(t, o) or 0) >= b for t, b in bound.items()):
                keep.add(o)
                changed = True
        for t, b in bound.items():
            low = min((o.first for o in keep if read_to(t, o) is not None), default=None)
            if low is not None and (b is None or low < b):
                bound[t] = low
                changed = True
    deleted = []
    for o in objects:
        if o not in keep:
            target.delete(*log_dir(o.timeline), log_object_name(o.first, o.last))
            deleted.append("/".join((*log_dir(o.timeline), log_object_name(o.first, o.last))))
    return deleted


__all__ = ["ReadsFrom", "apply_retention", "archived_snapshots"]
