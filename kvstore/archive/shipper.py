"""The archiver: ships a store's durable log and its snapshots to an archive.

``Archiver(store_path, location)`` reads only the store's files (the log's
segments through :class:`wal.segment.SegmentScan`, bounded by the ``DURABLE``
marker, so only what the writer fsynced is ever shipped; snapshots through :mod:`snapshot`), so it
runs in the writer's process or as a sidecar (``walkv archive STORE URI``)
and produces the same archive either way. Layout and rules:
:mod:`kvstore.archive.layout`.

Each :meth:`Archiver.ship_once`, under the writer's lease (each upload,
and what it checks first: :mod:`kvstore.archive.upload`), along the log's
timeline history as its newest segment states it (:mod:`wal.timeline`):

0. fencing: when the archive holds a newer timeline whose lineage left the
   log's history after LSN ``F`` (:meth:`ArchiveTimelines.fence`), LSNs up to
   ``F`` are shipped and the archiver stops with
   :class:`~wal.errors.ArchiveFencedError`;
1. every sealed local segment the archive's chain (along the log's history)
   reaches, and on which no timeline begins, is uploaded whole, then the
   pieces it covers are deleted (compaction);
2. the durable tail after the archived LSN is uploaded as pieces, each within
   one local segment and one timeline; each object goes under the timeline
   the history puts its LSNs on, that timeline's history object first. So
   after a repair, a promote or a failover the new entries go under the new
   timeline and the old timeline's objects stay (an older restore target);
3. local snapshots newer than the archive's newest on the log's history, at
   or below the archived LSN, are uploaded under the timeline their LSN is
   on (a store's snapshots are on its log's history: a repair or a fork
   keeps none past the LSN where the history changed course);
4. retention (``keep_snapshots``, ``keep_seconds``): the archive's snapshots
   older than the oldest kept one are deleted (MANIFEST first), then the log
   objects no lineage of a kept snapshot reads (:mod:`kvstore.archive.retention`).

While the log's ``TRUNCATE`` marker exists (a repair or a truncation is under
way: :mod:`wal.truncation`), nothing is shipped: LSNs past the cut may be
about to change timeline. A round whose reads meet a history other than the
one it began with (a fork meanwhile) uploads nothing more; the next round
plans again.

Durability: when :meth:`ship_once` or :meth:`flush` returns LSN ``n``, every
entry up to ``n`` (along the log's history) is in objects that are whole and
(on a local target) fsynced. Resuming: the archived LSN is recomputed from a
listing (the end of the chain along the log's history), so a restart after a
kill at any point uploads again at most what was in flight, under the same
names (an object is never half there). After a fork the archived LSN may go
back (to the fork LSN: the new timeline's entries are not archived yet).

Errors (the object store down, 500s, refused connections, requests that
timed out: :class:`~wal.errors.ArchiveUnavailableError`) are retried by the
thread with exponential backoff up to ``max_backoff`` seconds, logged once per
change of state (failing, recovered) and kept in :meth:`Archiver.stats`.
Another archiver's live lease, an archive of another store, or a fence,
stops the thread (``failed``): retrying cannot help.

Stopping (:meth:`Archiver.stop`) makes one last round and releases the
lease, within ``timeout`` seconds when given: an object store that does not
answer by then is left to the daemon threads still waiting on it (each
request ends within its own timeout, :mod:`wal.readfs`; the lease expires on
its own), and ``stop`` returns False so that the caller can say what was not
shipped.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import snapshot
from kvstore.archive.layout import (
    ARCHIVE_NAME,
    ROOT_TIMELINE,
    WAL_DIR,
    LogObject,
    TimelineId,
    decode_identity,
    encode_identity,
    timeline_name,
)
from kvstore.archive.lease import DEFAULT_LEASE_SECONDS, ArchiverLeaseHolder
from kvstore.archive.objects import Chain, lineage_chain, list_log_objects
from kvstore.archive.reader import ArchiveReader
from kvstore.archive.retention import apply_retention, archived_snapshots
from kvstore.archive.target import ArchiveTarget, Location
from kvstore.archive.timelines import ArchiveTimelines, Fence, Listed
from kvstore.archive.upload import Uploader
from kvstore.entry.codec import decode
from kvstore.entry.groups import Ops, group_start
from kvstore.layout import StoreLayout
from wal.durable import read_durable_lsn
from wal.errors import (
    ArchiveError,
    ArchiveFencedError,
    ArchiveLagError,
    ArchiveUnavailableError,
    CorruptionError,
    LockedError,
    LogGapError,
    WalkvError,
)
from wal.fs import OS_FS
from wal.segment import list_segments, read_newest_header, read_store_id
from wal.timeline import ROOT, History, history_until, timeline_at
from wal.truncation import TRUNCATE_MARKER

log = logging.getLogger("walkv.archive")


class Archiver:
    """Ships the store at ``store_path`` to the archive at ``location`` (see
    the module docstring). ``interval``: seconds between shipping rounds of
    the thread. ``keep_snapshots``/``keep_seconds``: archive retention (None:
    keep everything). ``on_archived(lsn)`` is called (in the shipping
    thread) whenever the archived LSN is known or grows (the sidecar
    publishes it in ``STORE/ARCHIVED``: :mod:`kvstore.archive.marker`)."""

    def __init__(self, store_path: str | os.PathLike[str], location: Location, *, interval: float = 1.0,
                 keep_snapshots: int | None = None, keep_seconds: float | None = None,
                 max_backoff: float = 10.0, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 on_archived: Callable[[int], None] | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        if keep_snapshots is not None and (type(keep_snapshots) is not int or keep_snapshots < 1):
            raise ValueError(f"keep_snapshots must be an int >= 1 or None, not {keep_snapshots!r}")
        self.layout = StoreLayout(OS_FS, os.path.abspath(os.fspath(store_path)))
        self.target = ArchiveTarget.open(location)
        if not self.target.writable:
            raise TypeError(f"cannot write to the archive {self.target.uri}")
        self.interval = interval
        self.keep_snapshots = keep_snapshots
        self.keep_seconds = keep_seconds
        self.max_backoff = max(max_backoff, interval)
        self._lease = ArchiverLeaseHolder(self.target, lease_seconds)
        self._uploader = Uploader(self.target, self._count_upload)
        self._store_id: str | None = None
        self._ship_lock = threading.Lock()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failed: BaseException | None = None
        self._archived = 0
        self._archive_first = 0
        self._durable = 0
        self._seen: collections.deque[tuple[int, float]] = collections.deque()
        self._snapshots: set[tuple[TimelineId, int]] | None = None
        self._timelines: ArchiveTimelines | None = None
        self._history: History = ROOT  # the log's, as the last round found it
        self._retention_due = True
        self.uploads = 0
        self.bytes = 0
        self.errors = 0
        self.last_error: str | None = None
        self._failing = False
        self._on_archived = on_archived

    def __repr__(self) -> str:
        return f"<Archiver {self.layout.root} -> {self.target.uri} archived={self._archived}>"

    @property
    def uri(self) -> str:
        """The archive's location, credentials redacted."""
        return self.target.uri

    @property
    def archived_lsn(self) -> int:
        """Every durable entry up to this LSN is in the archive (what local
        log retention is bounded by)."""
        return self._archived

    # -- one round ------------------------------------------------------------------

    def ship_once(self) -> int:
        """Ship what is durable now (see the module docstring); return the
        archived LSN after it. Raises what failed (the thread retries)."""
        with self._ship_lock:
            self._prepare()
            self._lease.renew()
            durable = read_durable_lsn(self.layout.wal_dir)
            if durable is not None:
                self._note_durable(durable)
                if self._ship_log(durable):
                    self._ship_snapshots()
            if self._retention_due and (self.keep_snapshots is not None or self.keep_seconds is not None):
                assert self._store_id is not None
                apply_retention(self.target, self._store_id, self.keep_snapshots, self.keep_seconds,
                                self._reads_from)
                self._retention_due = False
                self._archive_first = 0  # recomputed from the next listing
            return self._archived

    def _prepare(self) -> None:
        if self._store_id is not None:
            return
        store_id = read_store_id(self.layout.wal_dir)
        if store_id is None:
            raise WalkvError(f"{self.layout.root} has no log to archive (no segment in {self.layout.wal_dir})")
        data = self.target.read(ARCHIVE_NAME)
        if data is None:
            self._lease.acquire()
            self.target.put(encode_identity(store_id), ARCHIVE_NAME)
            log.info("archive %s created for store %s", self.target.uri, store_id)
        else:
            try:
                other = decode_identity(data, self.target.display(self.target.path(ARCHIVE_NAME)))
            except CorruptionError as e:  # no retry mends it: the archiver stops, as for another store's
                raise ArchiveError(f"{e}; not archiving {self.layout.root} there") from e
            if other != store_id:
                raise ArchiveError(
                    f"the archive {self.target.uri} belongs to another store ({other}), not to "
                    f"{self.layout.root} ({store_id}); archive each store to its own prefix")
            self._lease.acquire()
        self.target.remove_temps(WAL_DIR)
        self._timelines = timelines = ArchiveTimelines(self.target, store_id)
        listed = timelines.listed()
        for tid in listed.directories:
            self.target.remove_temps(WAL_DIR, timeline_name(tid))
        self._store_id = store_id
        header = read_newest_header(self.layout.wal_dir)
        self._history = ROOT if header is None else header.history
        c = self._chain(self._history, listed)[1]
        self._archived = c.last
        self._archive_first = c.first
        if self._on_archived is not None:
            self._on_archived(self._archived)
        self._notify()

    def _chain(self, history: History, listed: Listed) -> tuple[list[LogObject], Chain]:
        """The archive's log objects of ``history``'s timelines, and their chain along it."""
        objects = list_log_objects(self.target, [TimelineId.of(s) for s in history], listed=listed.infos)
        return objects, lineage_chain(objects, history)

    def _note_durable(self, durable: int) -> None:
        now = time.monotonic()
        if durable > self._durable:
            self._seen.append((durable, now))
            self._durable = durable

    def _count_upload(self, size: int) -> None:
        self.uploads += 1
        self.bytes += size

    def _ship_log(self, durable: int) -> bool:
        """Ship the log up to ``durable`` (module docstring); False when the
        round stopped early: a fork under way or met."""
        assert self._store_id is not None and self._timelines is not None
        wal_dir = self.layout.wal_dir
        if os.path.exists(os.path.join(wal_dir, TRUNCATE_MARKER)):
            return False
        header = read_newest_header(wal_dir)
        segments = list_segments(wal_dir)
        if header is None or not segments:
            return False
        history = header.history
        listed = self._timelines.listed()
        objects, c = self._chain(history, listed)
        if history != self._history:
            self._history = history
            self._snapshots = None
            if c.last < self._archived:  # a fork: the new timeline's LSNs are not archived yet
                self._archived = c.last
                if self._on_archived is not None:
                    self._on_archived(c.last)  # so that local retention keeps them
        fence = self._timelines.fence(history, durable, listed)
        if fence is not None:
            durable = min(durable, fence.fork_lsn)  # what both histories share may go; nothing after it
        if c.objects:
            nxt = c.last + 1
            if nxt < segments[0].first_lsn:
                raise LogGapError(
                    f"the archive {self.target.uri} holds LSNs up to {c.last}, but the log of "
                    f"{self.layout.root} now starts at LSN {segments[0].first_lsn}: LSNs {nxt}.."
                    f"{segments[0].first_lsn - 1} were deleted locally before they were archived",
                    first_missing=nxt, last_missing=segments[0].first_lsn - 1,
                    first_available=segments[0].first_lsn)
        else:
            nxt = segments[0].first_lsn
        self._archive_first = c.first or nxt
        for i, seg in enumerate(segments):
            if self._stopping and threading.current_thread() is self._thread:
                break
            sealed = i + 1 < len(segments)
            seg_last = segments[i + 1].first_lsn - 1 if sealed else durable
            if seg_last < seg.first_lsn or seg_last < self._archive_first:
                continue
            if seg.first_lsn > nxt:
                break  # segments are consecutive: never leave a gap behind
            tid = TimelineId.of(timeline_at(history, seg.first_lsn))
            one_timeline = not any(seg.first_lsn < s.first_lsn <= seg_last for s in history)
            if sealed and seg_last <= durable and one_timeline and not any(
                    o.timeline == tid and o.first == seg.first_lsn and o.last >= seg_last for o in objects):
                self._begin_timeline(history, seg.first_lsn, listed)
                if not self._uploader.segment(self._store_id, seg, seg_last, objects,
                                              history_until(history, seg.first_lsn)):
                    return False
                self._set_archived(lineage_chain(objects, history).last)
                nxt = max(nxt, seg_last + 1)
            while nxt <= min(seg_last, durable):
                at = timeline_at(history, nxt)
                limit = min([seg_last, durable] + [s.first_lsn - 1 for s in history if s.first_lsn > nxt])
                later = [o.first for o in objects if o.timeline == TimelineId.of(at) and o.first > nxt]
                if later:
                    limit = min(limit, min(later) - 1)
                self._begin_timeline(history, nxt, listed)
                last = self._uploader.piece(self._store_id, seg, nxt, limit, objects, history)
                if last is None:
                    return False
                nxt = max(last + 1, lineage_chain(objects, history).last + 1)
                self._set_archived(lineage_chain(objects, history).last)
        self._set_archived(lineage_chain(objects, history).last)
        if fence is not None and (read_durable_lsn(wal_dir) or 0) > fence.fork_lsn:
            raise self._fenced(fence)
        return True

    def _begin_timeline(self, history: History, lsn: int, listed: Listed) -> None:
        """Before the first object of the timeline ``lsn`` is on: its history object (layout)."""
        assert self._store_id is not None
        lineage = history_until(history, lsn)
        tid = TimelineId.of(lineage[-1])
        if tid != ROOT_TIMELINE and tid not in listed.histories:
            self._uploader.lineage(self._store_id, lineage)
            listed.histories.add(tid)

    def _fenced(self, fence: Fence) -> ArchiveFencedError:
        return ArchiveFencedError(
            f"the archive {self.target.uri} holds a newer history of this store: its {fence.theirs} (from LSN "
            f"{fence.fork_lsn + 1}) left {fence.mine}, which the log of {self.layout.root} holds past LSN "
            f"{fence.fork_lsn}. A newer writer (a promoted replica, an elected leader) archives the store, so "
            f"this archiver stops after LSN {fence.fork_lsn} rather than put the two histories side by side; "
            "if this store is no longer the writer, rejoin it as a replica of the new one; if it is to be a "
            "store of its own, archive it to another prefix", mine=fence.mine, theirs=fence.theirs,
            fork_lsn=fence.fork_lsn)

    def _reads_from(self, timeline: TimelineId, lsn: int) -> int:
        """Where a reader after the archive's snapshot at ``lsn`` on
        ``timeline`` starts (:data:`kvstore.archive.retention.ReadsFrom`): the
        next LSN, or the first part of a staged group the snapshot splits, as
        the archive's own log says around it. An archive that no longer holds
        that LSN, or holds it damaged, keeps what it kept before (a warning)."""
        reader = ArchiveReader(self.target, timeline=timeline)

        def read_back(first: int, last: int) -> Iterator[tuple[int, Ops]]:
            return ((e.lsn, decode(e.payload, e.lsn)) for e in reader.read_entries(first, last))
        try:
            return group_start(lsn + 1, read_back, reader.first_lsn)
        except (LogGapError, CorruptionError) as e:
            log.warning("archive retention: where a reader after the snapshot at LSN %d (%s) starts is not "
                        "known (%s); the log is kept from LSN %d", lsn, timeline, self.target.scrub(str(e)), lsn + 1)
            return lsn + 1

    def _set_archived(self, lsn: int) -> None:
        if lsn > self._archived:
            self._archived = lsn
            while self._seen and self._seen[0][0] <= lsn:
                self._seen.popleft()
            self._recovered()  # before anyone waiting on the archived LSN wakes
            if self._on_archived is not None:
                self._on_archived(lsn)
            self._notify()

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("archiving to %s works again; archived LSN %d", self.uri, self._archived)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _ship_snapshots(self) -> None:
        assert self._store_id is not None
        history = self._history
        if self._snapshots is None:
            self._snapshots = archived_snapshots(self.target, [TimelineId.of(s) for s in history])
        newest = max((lsn for tid, lsn in self._snapshots if TimelineId.of(timeline_at(history, lsn)) == tid),
                     default=-1)
        for info in snapshot.list_snapshots(self.layout.snapshots_dir):
            if info.lsn <= newest or info.lsn > self._archived or info.store_id not in (None, self._store_id):
                continue
            tid = TimelineId.of(timeline_at(history, info.lsn))
            try:
                self._uploader.snapshot(info.path, info.lsn, tid)
            except FileNotFoundError:
                log.debug("snapshot %s was pruned while being archived; skipped", info.path)
                continue
            self._snapshots.add((tid, info.lsn))
            self._retention_due = True

    # -- the thread -----------------------------------------------------------------

    def start(self) -> None:
        """Ship every ``interval`` seconds in a daemon thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="walkv-archiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = self.interval
        while not self._stopping:
            try:
                self.ship_once()
            except ArchiveUnavailableError as e:  # the object store down or slow: retried
                self._record_error(e)
                delay = min(delay * 2, self.max_backoff)
            except (LockedError, ArchiveError) as e:
                self.failed = e
                self._record_error(e)
                log.error("archiving %s stopped: %s", self.layout.root, self.last_error)
                self._notify()
                return
            except Exception as e:  # noqa: BLE001 - an object store fails in many ways; retried
                self._record_error(e)
                delay = min(delay * 2, self.max_backoff)
            else:
                self._recovered()
                delay = self.interval
            self._wake.wait(delay if self._failing else self.interval)
            self._wake.clear()

    def _record_error(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = self.target.scrub(f"{type(e).__name__}: {e}")
        if not self._failing:
            self._failing = True
            log.warning("archiving %s to %s failed (retrying with backoff): %s", self.layout.root, self.uri,
                        self.last_error)
        self._notify()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread, make one last round (when the archive is
        reachable) and release the lease; True when that was done within
        ``timeout`` seconds (None: no limit), False when the object store
        did not answer by then (module docstring)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stopping = True
        self._wake.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                return False  # still in a request: it ends within its own timeout, then the thread
        if deadline is None:
            self._last_round()
            return True
        last = threading.Thread(target=self._last_round, name="walkv-archiver-last", daemon=True)
        last.start()
        last.join(max(0.0, deadline - time.monotonic()))
        return not last.is_alive()

    def _last_round(self) -> None:
        if self.failed is None:
            try:
                self.ship_once()
            except Exception as e:  # noqa: BLE001 - reported; the next start resumes
                self._record_error(e)
        try:
            self._lease.release()
        except Exception as e:  # noqa: BLE001 - the lease expires on its own
            log.debug("could not release the lease on %s: %s", self.uri, self.target.scrub(str(e)))

    def flush(self, timeout: float | None = None) -> int:
        """Return once every entry durable when called is archived (its LSN);
        raise :class:`ArchiveLagError` naming the lag after ``timeout`` seconds."""
        target = read_durable_lsn(self.layout.wal_dir) or 0
        deadline = None if timeout is None else time.monotonic() + timeout
        running = self._thread is not None and self._thread.is_alive()
        while self._archived < target:
            if self.failed is not None:
                raise self.failed
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                err = f"; last error: {self.last_error}" if self.last_error else ""
                raise ArchiveLagError(
                    f"the archive {self.uri} holds LSN {self._archived}; LSN {target} was durable when "
                    f"flush was called: {target - self._archived} entries behind after {timeout} s{err}",
                    archived_lsn=self._archived, target_lsn=target)
            if running:
                self._wake.set()
                with self._cond:
                    self._cond.wait(0.2 if left is None else min(left, 0.2))
            else:
                try:
                    self.ship_once()
                except ArchiveUnavailableError as e:  # retried until the deadline
                    self._record_error(e)
                    time.sleep(min(0.2, left) if left is not None else 0.2)
                except (LockedError, ArchiveError):
                    raise
                except Exception as e:  # noqa: BLE001 - retried until the deadline
                    self._record_error(e)
                    time.sleep(min(0.2, left) if left is not None else 0.2)
        return self._archived

    def stats(self) -> dict[str, Any]:
        """What the archive holds and how far behind it is (no credentials)."""
        durable = max(self._durable, read_durable_lsn(self.layout.wal_dir) or 0)
        lag_seconds = time.monotonic() - self._seen[0][1] if self._seen and durable > self._archived else 0.0
        return {"uri": self.uri, "archived_lsn": self._archived, "durable_lsn": durable,
                "lag_lsns": max(0, durable - self._archived), "lag_seconds": lag_seconds,
                "errors": self.errors, "last_error": self.last_error, "failing": self._failing,
                "uploads": self.uploads, "bytes": self.bytes}
