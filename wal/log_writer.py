"""The I/O of an open log (:class:`LogWriter`): what the group commit's
leader does with each group, and what the operations holding the log
exclusively (sync, truncate_after, close) do to its files. Durability as
:mod:`wal.log` states it.

It owns the log's segments (:class:`wal.segments.SegmentSet`), how far they
are written and how far synced (``written`` and ``durable``: an LSN and the
offset just after it in the active segment), the ``DURABLE`` marker that
publishes the latter to other processes, the counters, and the checks that
the log's directory is still the one locked (:meth:`DirectoryLock.check`: at
each roll; with ``sync="always"`` after each group's fsync, before it is
acknowledged; otherwise at most every :data:`DIRECTORY_CHECK_US`
microseconds of groups). One thread at a time
writes through it; it changes what readers copy (the segments, the
positions) only under ``mutex``, the group commit's.

A group's sync, with ``sync="always"`` (:meth:`LogWriter.write_group`): the
hooks' ``stage`` is asked first, before the group is framed, whether the
layer above has work worth overlapping with its write and fsync (a bulk
write to its state). When it returned a :class:`~wal.hooks.Staged`, the
group is framed, written and fsynced on a helper thread while the leader
runs ``staged.run()`` (the ``pwritev`` and the fsync release the GIL; the
framing holds it), and the leader waits for the helper. The 12 MB
``pwritev`` of a batch of 100,000 puts took 10 ms before its LMDB write
could start; overlapped, such a batch commits in 26.5-30.1 ms instead of
30.1-36.1 (medians of 25 fresh stores, old and new alternating, AMD EPYC
VM, 2026-12-04). Only after the fsync returned, and the directory check
passed, is the group durable, published (``DURABLE``),
``staged.publish()``-ed, and handed to the hooks' ``commit``; if anything
failed, ``staged.abort()`` drops the staged work and the group fails (the
log with it). So staged work is never visible before its group is durable.
Every other group (``stage`` returned None: the single put, any small
group) is written and synced on the leader, with no thread.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from wal.durable import DurableMarker
from wal.errors import LogFailedError
from wal.flusher import BatchFlusher
from wal.fs import FileSystem
from wal.group import Group
from wal.hooks import LogHooks, Staged
from wal.lock import DirectoryLock
from wal.mutex import Mutex
from wal.segment import Payload
from wal.segment_writer import ActiveSegment, check_payload, gathered, round_block
from wal.segments import SegmentSet
from wal.stats import LogStats
from wal.timeline import ROOT, History, TimelineStart, fork_history
from wal.truncation import mark_truncate

PREALLOC_STEP: Final = 8 << 20  # the active segment grows by this much (at most) at a time
DIRECTORY_CHECK_US = 1_000_000  # sync="batch"/"none": groups check the directory at least this often
_time_ns: Final = time.time_ns


def _write_timed(active: ActiveSegment, first: int, payloads: list[Payload], timestamps: list[int]
                 ) -> tuple[int, bool]:
    """``payloads`` written with their own commit times: one write per run of
    equal times (a leader's group shares one), the bytes written and whether
    the file grew (any write did)."""
    written, grew, start = 0, False, 0
    while start < len(payloads):
        end = start + 1
        while end < len(payloads) and timestamps[end] == timestamps[start]:
            end += 1
        run = payloads[start:end]
        n, g = active.write_group(first + start, run, timestamps[start], gathered(run))
        written += n
        grew = grew or g
        start = end
    return written, grew


class LogWriter:
    """The writer of the log in ``directory``: opening it creates the
    directory, takes its lock (:class:`~wal.lock.DirectoryLock`, released
    if the rest fails) and recovers the segments; it then writes groups into
    them, rolling at ``segment_bytes`` and syncing as ``sync_mode`` says.
    ``hooks``: the layer above's (:mod:`wal.hooks`), called as the module
    docstring says."""

    def __init__(self, directory: str, fs: FileSystem, mutex: Mutex, *, recovery: str, sync_mode: str,
                 segment_bytes: int, sync_bytes: int, max_record_bytes: int, start_lsn: int,
                 hooks: LogHooks, history: History = ROOT, store_id: str | None = None) -> None:
        self.directory = directory
        self.fs = fs
        self.mutex = mutex
        self.sync_mode = sync_mode
        self._always = sync_mode == "always"
        self._directory_check_us = DIRECTORY_CHECK_US  # read at open (a test sets it to 0 first)
        self.segment_bytes = segment_bytes
        self.sync_bytes = sync_bytes
        self.prealloc_step = min(PREALLOC_STEP, round_block(segment_bytes))
        self.max_record_bytes = max_record_bytes
        self.start_lsn = start_lsn
        self._new_history = history
        self._new_store_id = store_id
        self.hooks = hooks
        self.flusher: BatchFlusher | None = None  # sync="batch": set by the log once its flusher runs
        self.stats = LogStats()
        self._unsynced_bytes = 0
        fs.makedirs(directory)
        self.lock = DirectoryLock(directory, f"the log at {directory}")
        try:
            self.files = self._open_segments(recovery)
            self.written = self.durable = self.files.end
            self._durable_marker = DurableMarker(directory)
            self.publish_durable()
        except BaseException:
            self.lock.release()
            raise
        self._checked_us = time.time_ns() // 1000  # when the directory was last found in place

    def _open_segments(self, recovery: str) -> SegmentSet:
        return SegmentSet.open(self.directory, fs=self.fs, recovery=recovery, prealloc=self.prealloc_step,
                               max_record_bytes=self.max_record_bytes, start_lsn=self.start_lsn,
                               zeroed=self._always, history=self._new_history, store_id=self._new_store_id)

    def publish_durable(self) -> None:
        self._durable_marker.publish(self.durable[0])

    def write_group(self, group: Group, timestamps: list[int] | None = None) -> None:
        """Frame, write and (when ``sync="always"``) sync one group, then hand
        it to the hooks' ``commit``. Called by the leader only, without the
        mutex (a staged group is framed, written and synced on a helper
        thread meanwhile, :meth:`_write_while`). ``timestamps``: the
        entries' own commit times (entries another log decided and timed,
        :meth:`wal.Log.append_replicated`: the hooks' ``prepare`` is not
        called for them); None: now, one clock read."""
        hooks = self.hooks
        prepared = hooks.prepare(group) if timestamps is None else None
        if prepared is not None:
            limit = self.max_record_bytes
            group = Group(group.first_lsn, [check_payload(p, limit) for p in prepared], group.contexts)
        first, payloads = group.first_lsn, group.payloads
        active = self.files.active
        now_us = _time_ns() // 1000
        if active.data_end >= self.segment_bytes and active.last_lsn >= active.file.first_lsn:
            self._roll(first)
            active = self.files.active
        elif not self._always and abs(now_us - self._checked_us) >= self._directory_check_us:
            self.lock.check()
            self._checked_us = now_us
        staged = hooks.stage(group) if self._always else None  # (before the write: module docstring)
        try:
            if staged is None:
                written, grew = self._write(active, first, payloads, now_us, timestamps)
                if self._always:
                    self.timed_sync(full=grew)
            else:
                written = self._write_while(staged, active, first, payloads, now_us, timestamps)
            lsn = first + len(payloads)
            if self._always:
                self.lock.check()  # after the fsync: acknowledged durable means in the store's files
                self.durable = self.written
                self._durable_marker.publish(lsn - 1)
        except BaseException:
            if staged is not None:
                staged.abort()
            raise
        if staged is not None:
            staged.publish()
        else:
            self._unsynced_bytes += written
            if self.flusher is not None and self._unsynced_bytes >= self.sync_bytes:
                with self.mutex:
                    self.flusher.poke()
        self.stats.group(len(payloads), written)
        hooks.commit(group)

    def _write(self, active: ActiveSegment, first: int, payloads: list[Payload], now_us: int,
               timestamps: list[int] | None) -> tuple[int, bool]:
        """Frame and write one group into ``active`` (at ``now_us``, or at
        the entries' own ``timestamps``) and record how far the log is
        written; the bytes written and whether the file grew."""
        if timestamps is None:
            result = active.write_group(first, payloads, now_us, gathered(payloads))
        else:
            result = _write_timed(active, first, payloads, timestamps)
        self.written = (first + len(payloads) - 1, active.data_end)
        return result

    def _write_while(self, staged: Staged, active: ActiveSegment, first: int, payloads: list[Payload],
                     now_us: int, timestamps: list[int] | None) -> int:
        """The group's framing, write and fsync on a helper thread while this
        one runs ``staged.run()``; returns the bytes written once both are
        done, raising the helper's error first (it fails the log), else the
        work's. A KeyboardInterrupt while this thread waits for the helper is
        kept until the helper is done (so ``written`` and the files say what
        it did before the log fails), then raised."""
        failed: list[BaseException] = []
        written: list[int] = []

        def write_and_sync() -> None:
            try:
                n, grew = self._write(active, first, payloads, now_us, timestamps)
                self.timed_sync(grew)
                written.append(n)
            except BaseException as exc:  # noqa: BLE001 - handed to the leader
                failed.append(exc)

        writer = threading.Thread(target=write_and_sync, name="walkv-write", daemon=True)
        writer.start()
        try:
            staged.run()
        finally:
            interrupt: BaseException | None = None
            while writer.is_alive():
                try:
                    writer.join()
                except BaseException as e:  # noqa: BLE001 - kept until the helper is done
                    interrupt = e
            if failed:
                raise failed[0]
            if interrupt is not None:
                raise interrupt
        return written[0]

    def timed_sync(self, full: bool = False) -> None:
        active = self.files.active
        self.stats.timed(active.sync_full if full else active.sync)
        self._unsynced_bytes = 0

    def _roll(self, first: int, history: History | None = None) -> None:
        """Seal the active segment (cut its zeros, fsync, write its index) and
        start a new one whose first LSN is ``first``, on ``history`` (default:
        the log's); an empty active segment is replaced instead (never in a
        directory that is not the one opened: :class:`StoreVanishedError`)."""
        self.lock.check()
        self._checked_us = time.time_ns() // 1000
        active = self.files.active
        index = active.seal(self.fs, self.timed_sync) if active.last_lsn >= active.file.first_lsn else None
        new = ActiveSegment.create(self.directory, self.files.store_id, first, self.prealloc_step, self.fs,
                                   self.max_record_bytes, zeroed=self._always,
                                   history=self.files.history if history is None else history)
        new.open(self.fs, self.prealloc_step, zeroed=self._always)
        with self.mutex:  # readers copy the segment list under it
            old = self.files.replace_active(index, new)
            self.written = self.durable = (first - 1, new.data_end)
        old.close()
        self.publish_durable()
        self.stats.rolls += 1

    # -- with the log held exclusively ---------------------------------------------

    def sync(self) -> None:
        """Make everything written durable and publish it."""
        target = self.written
        if self.durable[0] < target[0]:
            self.timed_sync()
            self.durable = target
            self.publish_durable()

    def finish(self) -> None:
        """Before closing: sync everything, write the active segment's index
        (so the next open scans little) and fsync the directory."""
        self.sync()
        self.files.active.write_index(self.fs)
        self.fs.fsync_dir(self.directory)

    def close_failed(self, error: OSError) -> LogFailedError:
        """What closing raises when :meth:`finish` failed with ``error``."""
        return LogFailedError(
            f"closing the log at {self.directory} failed: {error.strerror} "
            f"({error.filename or self.files.active.file.path}). "
            f"Entries up to LSN {self.durable[0]} are durable; those written after it may not be. "
            "The next open recovers the log."
        )

    def begin_timeline(self, start: TimelineStart) -> None:
        """Go on on timeline ``start``, which begins at the next LSN: a new
        segment whose header states the new history (:mod:`wal.timeline`)."""
        self._roll(start.first_lsn, fork_history(self.files.history, start))

    def cut_after(self, lsn: int, history: History | None) -> None:
        """Drop every entry after ``lsn`` and go on on timeline ``history``
        (when given), crash-safe: :func:`mark_truncate` first, then open the
        segments again, which finishes the cut and begins the timeline
        (:func:`wal.recovery.recover`); the log is frozen meanwhile."""
        if self.durable[0] > lsn:
            # (The offset bounds reads of the active segment; those stop at ``lsn`` anyway.)
            self.durable = (lsn, self.durable[1])
            self.publish_durable()
        mark_truncate(self.directory, lsn, self.fs, history)
        self.files.active.close()
        self.files = self._open_segments("strict")
        self.written = self.durable = self.files.end
        self.publish_durable()

    def close(self) -> None:
        """Close the files and release the lock (after :meth:`finish`, or
        after a failure)."""
        self.files.active.close()
        self._durable_marker.close()
        self.lock.release()
